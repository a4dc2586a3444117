//! Issue 20 in process (tests/common/inproc.rs): the handoff table of
//! docs/design.md#handoff row by row through `.coherent/ctl` and writes through the
//! filesystem type with the real volume policy. While a record is live its status follows
//! the latest event, and the three ways out the deny text names (the successor writes it,
//! declines it, the giver withdraws it) work whatever that status is.

use crate::coherent;
use crate::common;

use coherent::check_deny_text;
use common::inproc::{Agent, InProc};
use serde_json::Value;

const APPEND: i32 = libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT;

/// The sessions of a table: alice gives, bob is the successor, carol a bystander.
struct Cast {
    f: InProc,
    alice: Agent,
    bob: Agent,
    carol: Agent,
}

/// alice creates plan.md (v1) and hands it to `to`; bob and carol are known.
fn handed_to(to: &str) -> Cast {
    let c = Cast {
        f: InProc::new(),
        alice: Agent::new("alice"),
        bob: Agent::new("bob"),
        carol: Agent::new("carol"),
    };
    c.f.ctl(&c.bob, "register").unwrap();
    c.f.ctl(&c.carol, "register").unwrap();
    c.f.write(&c.alice, "plan.md", APPEND, Some(b"plan\n"))
        .unwrap();
    verb_ok(&c.f, &c.alice, &format!("transfer --to {to} plan.md"));
    c
}

fn handed() -> Cast {
    handed_to("bob")
}

/// `: >> plan.md` as `a`: an open for write closed unchanged (an acquire, no commit).
fn acquires(f: &InProc, a: &Agent) {
    assert_eq!(f.write(a, "plan.md", APPEND, None), Ok(()));
}

/// `echo WHO >> plan.md` as `a`.
fn writes(f: &InProc, a: &Agent, who: &str) {
    let line = format!("{who}\n");
    assert_eq!(f.write(a, "plan.md", APPEND, Some(line.as_bytes())), Ok(()));
}

fn fenced(c: &Cast) -> bool {
    c.f.write(&c.alice, "plan.md", APPEND, Some(b"alice\n")) == Err(libc::EACCES)
}

/// A verb written to `ctl` by `a` that must succeed; returns the reply.
fn verb_ok(f: &InProc, a: &Agent, req: &str) -> Value {
    let (r, v) = f.ctl_reply(a, req);
    assert_eq!(r, Ok(()), "{req}: {v}");
    v
}

/// A verb that must be refused with `reason` (the `ctl` write fails `EACCES`); returns
/// the reply.
fn refused(f: &InProc, a: &Agent, req: &str, reason: &str) -> Value {
    let (r, v) = f.ctl_reply(a, req);
    assert_eq!(
        (r, v["reason"].as_str()),
        (Err(libc::EACCES), Some(reason)),
        "{req}: {v}"
    );
    v
}

fn rec(c: &Cast) -> Value {
    c.f.record(&c.alice, "plan.md")
        .expect("a record of plan.md")
}

fn rec0(reply: &Value) -> Value {
    reply["records"][0].clone()
}

/// The failing scenario of the issue: a bystander's acquire overtakes the record and it
/// stays live; the giver's withdraw ends it and lifts the fence.
#[test]
fn overtaken_the_givers_withdraw_lifts_the_fence() {
    let c = handed();
    acquires(&c.f, &c.carol);
    let r = rec(&c);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"overtaken".into(), &true.into())
    );
    assert!(fenced(&c));
    let r = rec0(&verb_ok(&c.f, &c.alice, "withdraw plan.md"));
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"withdrawn".into(), &false.into())
    );
    assert_eq!(r["counterparty"], Value::Null, "{r}");
    writes(&c.f, &c.alice, "alice");
}

#[test]
fn overtaken_the_successors_decline_lifts_the_fence() {
    let c = handed();
    acquires(&c.f, &c.carol);
    let r = rec0(&verb_ok(&c.f, &c.bob, "decline plan.md"));
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"declined".into(), &false.into())
    );
    writes(&c.f, &c.alice, "alice");
}

/// After an overtake the successor's acquire relabels the record `completed` (counterparty
/// cleared); the fence stays until the version moves, and the successor's commit moves it.
#[test]
fn overtaken_the_successors_acquire_completes_it_and_its_commit_ends_it() {
    let c = handed();
    let f = &c.f;
    acquires(f, &c.carol);
    acquires(f, &c.bob);
    let r = rec(&c);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"completed".into(), &true.into())
    );
    assert_eq!(r["counterparty"], Value::Null, "{r}");
    assert!(fenced(&c));
    assert!(f
        .events_of("completed", "bob")
        .iter()
        .any(|e| e["path"] == "plan.md"));
    // overtaken again by carol, then bob commits: completed, and the fence lifts
    acquires(f, &c.carol);
    assert_eq!(rec(&c)["status"], "overtaken");
    writes(f, &c.bob, "bob");
    let r = rec(&c);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"completed".into(), &false.into())
    );
    // the fence lifted; alice has not read bob's version: a late giver, refused
    // `stale_view` until she reads it
    let before = f.events_written("denied", "alice").len();
    assert_eq!(
        f.write(&c.alice, "plan.md", APPEND, Some(b"alice\n")),
        Err(libc::EACCES)
    );
    let d = f.events_written("denied", "alice");
    match d.get(before..) {
        Some([d]) if d["reason"] == "stale_view" && d["path"] == "plan.md" => {}
        other => panic!("denied events {other:?}, want one: stale_view on plan.md"),
    }
    f.read(&c.alice, "plan.md").unwrap();
    writes(f, &c.alice, "alice");
}

/// `accept` of a completed live record answers it unchanged (no second event); decline
/// and withdraw of it succeed.
#[test]
fn completed_accept_again_changes_nothing_decline_and_withdraw_work() {
    for end in ["decline", "withdraw"] {
        let c = handed();
        let f = &c.f;
        let r = rec0(&verb_ok(f, &c.bob, "accept plan.md"));
        assert_eq!(
            (&r["status"], &r["live"]),
            (&"completed".into(), &true.into())
        );
        let again = verb_ok(f, &c.bob, "accept plan.md");
        assert_eq!(rec0(&again)["status"], "completed", "{again}");
        assert_eq!(f.events_on("accept", "plan.md").len(), 1);
        // The accept reply names decline as a way out: it works.
        let (who, want) = match end {
            "decline" => (&c.bob, "declined"),
            _ => (&c.alice, "withdrawn"),
        };
        let r = rec0(&verb_ok(f, who, &format!("{end} plan.md")));
        assert_eq!((&r["status"], &r["live"]), (&want.into(), &false.into()));
        writes(f, &c.alice, "alice");
    }
}

/// After an `accept`, a bystander's acquire relabels the record `overtaken` with its
/// counterparty; its commit ends it.
#[test]
fn completed_a_bystanders_acquire_and_commit_overtake_it() {
    let c = handed();
    verb_ok(&c.f, &c.bob, "accept plan.md");
    acquires(&c.f, &c.carol);
    let r = rec(&c);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"overtaken".into(), &true.into())
    );
    assert_eq!(r["counterparty"], "carol", "{r}");
    assert!(fenced(&c));
    writes(&c.f, &c.carol, "carol");
    let r = rec(&c);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"overtaken".into(), &false.into())
    );
    writes(&c.f, &c.alice, "alice");
}

/// A verb on a record that is no longer live answers `handoff_not_live` with its status;
/// an exact re-send of a transfer whose record ended answers `handoff_ended`.
#[test]
fn a_record_no_longer_live_answers_handoff_not_live_with_its_status() {
    let c = handed();
    writes(&c.f, &c.carol, "carol"); // overtaken, and the version moved
    for (who, verb) in [
        (&c.bob, "accept"),
        (&c.bob, "decline"),
        (&c.alice, "withdraw"),
    ] {
        let v = refused(&c.f, who, &format!("{verb} plan.md"), "handoff_not_live");
        assert_eq!(v["status"], "overtaken", "{verb}: {v}");
    }

    let c = handed();
    verb_ok(&c.f, &c.alice, "withdraw plan.md");
    c.f.read(&c.alice, "plan.md").unwrap();
    let req = "transfer --to bob plan.md";
    let v = refused(&c.f, &c.alice, req, "handoff_ended");
    assert_eq!(v["status"], "withdrawn", "{v}");
    let v = refused(&c.f, &c.bob, "decline plan.md", "handoff_not_live");
    assert_eq!(v["status"], "withdrawn", "{v}");
}

/// `--to any`: the first accept claims the offer; once claimed it can be declined and
/// withdrawn; a bystander's acquire before the claim leaves it open.
#[test]
fn an_offer_claimed_then_declined_lifts_the_fence() {
    let c = handed_to("any");
    refused(&c.f, &c.bob, "decline plan.md", "handoff_not_successor");
    acquires(&c.f, &c.carol);
    let inbox = c.f.read_surface(&c.bob, "inbox");
    assert!(inbox.contains("plan.md"), "still open: {inbox}");
    let r = rec0(&verb_ok(&c.f, &c.bob, "accept plan.md"));
    assert_eq!(r["claimed_by"], "bob", "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    let r = rec0(&verb_ok(&c.f, &c.bob, "decline plan.md"));
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"declined".into(), &false.into())
    );
    writes(&c.f, &c.alice, "alice");

    let c = handed_to("any");
    verb_ok(&c.f, &c.bob, "accept plan.md");
    let r = rec0(&verb_ok(&c.f, &c.alice, "withdraw plan.md"));
    assert_eq!(r["status"], "withdrawn", "{r}");
    writes(&c.f, &c.alice, "alice");
}

/// The deny text stays byte-identical across retries of the same refusal, whatever the
/// live status in between (its time is on a line of its own), and names the three ways out.
#[test]
fn the_deny_text_is_byte_identical_across_retries() {
    let c = handed();
    let first_line = || c.f.why(&c.alice).lines().next().unwrap_or("").to_string();
    let mut texts = Vec::new();
    for step in 0..3 {
        match step {
            1 => acquires(&c.f, &c.carol),
            2 => {
                verb_ok(&c.f, &c.bob, "accept plan.md");
            }
            _ => {}
        }
        for _ in 0..2 {
            assert!(fenced(&c));
            texts.push(first_line());
        }
    }
    assert!(texts.windows(2).all(|w| w[0] == w[1]), "{texts:#?}");
    if let Some(e) = check_deny_text(&texts[0], "plan.md", "bob", 1) {
        panic!("{e}");
    }
    // and each way it names works now
    verb_ok(&c.f, &c.bob, "decline plan.md");
    writes(&c.f, &c.alice, "alice");
}

/// Rows "someone reads it" and "nothing happens": no status changes, the fence stays
/// (every hook of a read runs before the read returns, so nothing is left to wait for).
#[test]
fn reads_change_no_status_and_the_fence_stays() {
    let c = handed();
    for who in [&c.carol, &c.bob, &c.alice] {
        c.f.read(who, "plan.md").unwrap();
    }
    let r = rec(&c);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"pending".into(), &true.into())
    );
    assert!(fenced(&c));
    // In any live status.
    verb_ok(&c.f, &c.bob, "accept plan.md");
    c.f.read(&c.carol, "plan.md").unwrap();
    assert_eq!(rec(&c)["status"], "completed");
    acquires(&c.f, &c.carol);
    c.f.read(&c.bob, "plan.md").unwrap();
    assert_eq!(rec(&c)["status"], "overtaken");
    assert!(fenced(&c));
}
