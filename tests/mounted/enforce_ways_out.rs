//! Issue 20 on a real mount: the handoff table of DESIGN.md §5 row by row through the
//! `coherent` CLI. While a record is live its status follows the latest event, and the
//! three ways out the deny text names (the successor writes it, declines it, the giver
//! withdraws it) work whatever that status is.

use crate::coherent;

use coherent::*;
use serde_json::Value;

/// alice creates plan.md (v1) and hands it to `to`; bob and carol are known.
fn handed_to(to: &str) -> Vol {
    let m = mount(true);
    touch_session(&m, "bob");
    touch_session(&m, "carol");
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    transfer(&m, "alice", to, &["plan.md"]);
    m
}

fn handed() -> Vol {
    handed_to("bob")
}

/// `: >> plan.md` as `who`: an open for write closed unchanged (an acquire, no commit).
fn acquires(m: &Vol, who: &str) {
    sh_ok(m, Some(who), ": >> plan.md");
    // The RELEASE reaches the daemon after the shell's close returns.
    await_events(m, "release", "plan.md", Some(who), 1);
}

fn writes(m: &Vol, who: &str) {
    sh_ok(m, Some(who), &format!("echo {who} >> plan.md"));
}

fn fenced(m: &Vol) -> bool {
    sh(m, Some("alice"), "echo alice >> plan.md").denied()
}

/// A CLI verb that must be refused with `reason` (exit 2); returns the reply.
fn refused(m: &Vol, who: &str, args: &[&str], reason: &str) -> Value {
    let (code, v) = cli_json(m, Some(who), args);
    assert_eq!(code, Some(2), "{who} coherent {args:?}: {v}");
    assert_eq!(v["reason"], reason, "{who} coherent {args:?}: {v}");
    v
}

fn rec(m: &Vol) -> Value {
    record(m, "plan.md").expect("a record of plan.md")
}

fn rec0(reply: &Value) -> Value {
    reply["records"][0].clone()
}

/// The failing scenario of the issue: a bystander's acquire overtakes the record and it
/// stays live; the giver's withdraw ends it and lifts the fence.
#[test]
fn overtaken_the_givers_withdraw_lifts_the_fence() {
    let m = handed();
    acquires(&m, "carol");
    let r = rec(&m);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"overtaken".into(), &true.into())
    );
    assert!(fenced(&m));
    let r = rec0(&verb_ok(&m, "alice", &["withdraw", "plan.md"]));
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"withdrawn".into(), &false.into())
    );
    assert_eq!(r["counterparty"], Value::Null, "{r}");
    writes(&m, "alice");
}

#[test]
fn overtaken_the_successors_decline_lifts_the_fence() {
    let m = handed();
    acquires(&m, "carol");
    let r = rec0(&verb_ok(&m, "bob", &["decline", "plan.md"]));
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"declined".into(), &false.into())
    );
    writes(&m, "alice");
}

/// After an overtake the successor's acquire relabels the record `completed` (counterparty
/// cleared); the fence stays until the version moves, and the successor's commit moves it.
#[test]
fn overtaken_the_successors_acquire_completes_it_and_its_commit_ends_it() {
    let m = handed();
    acquires(&m, "carol");
    acquires(&m, "bob");
    let r = rec(&m);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"completed".into(), &true.into())
    );
    assert_eq!(r["counterparty"], Value::Null, "{r}");
    assert!(fenced(&m));
    assert!(!events_of(&m, "completed", "plan.md", Some("bob")).is_empty());
    // overtaken again by carol, then bob commits: completed, and the fence lifts
    acquires(&m, "carol");
    assert_eq!(rec(&m)["status"], "overtaken");
    writes(&m, "bob");
    let r = rec(&m);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"completed".into(), &false.into())
    );
    // the fence lifted; alice has not read bob's version: a late giver, refused
    // `stale_view` until she reads it
    sh_refused(
        &m,
        "alice",
        "echo alice >> plan.md",
        "plan.md",
        "stale_view",
    );
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    writes(&m, "alice");
}

/// `accept` of a completed live record answers it unchanged (no second event); decline
/// and withdraw of it succeed.
#[test]
fn completed_accept_again_changes_nothing_decline_and_withdraw_work() {
    for end in ["decline", "withdraw"] {
        let m = handed();
        let r = rec0(&verb_ok(&m, "bob", &["accept", "plan.md"]));
        assert_eq!(
            (&r["status"], &r["live"]),
            (&"completed".into(), &true.into())
        );
        let again = verb_ok(&m, "bob", &["accept", "plan.md"]);
        assert_eq!(rec0(&again)["status"], "completed", "{again}");
        assert_eq!(events_of(&m, "accept", "plan.md", None).len(), 1);
        // The accept reply names decline as a way out: it works.
        let (who, want) = match end {
            "decline" => ("bob", "declined"),
            _ => ("alice", "withdrawn"),
        };
        let r = rec0(&verb_ok(&m, who, &[end, "plan.md"]));
        assert_eq!((&r["status"], &r["live"]), (&want.into(), &false.into()));
        writes(&m, "alice");
    }
}

/// After an `accept`, a bystander's acquire relabels the record `overtaken` with its
/// counterparty; its commit ends it.
#[test]
fn completed_a_bystanders_acquire_and_commit_overtake_it() {
    let m = handed();
    verb_ok(&m, "bob", &["accept", "plan.md"]);
    acquires(&m, "carol");
    let r = rec(&m);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"overtaken".into(), &true.into())
    );
    assert_eq!(r["counterparty"], "carol", "{r}");
    assert!(fenced(&m));
    writes(&m, "carol");
    let r = rec(&m);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"overtaken".into(), &false.into())
    );
    writes(&m, "alice");
}

/// A verb on a record that is no longer live answers `handoff_not_live` with its status;
/// an exact re-send of a transfer whose record ended answers `handoff_ended`.
#[test]
fn a_record_no_longer_live_answers_handoff_not_live_with_its_status() {
    let m = handed();
    writes(&m, "carol"); // overtaken, and the version moved
    for (who, verb) in [("bob", "accept"), ("bob", "decline"), ("alice", "withdraw")] {
        let v = refused(&m, who, &[verb, "plan.md"], "handoff_not_live");
        assert_eq!(v["status"], "overtaken", "{verb}: {v}");
    }
    let (errno, v) = ctl(&m, Some("bob"), "decline plan.md\n");
    assert_eq!(
        (errno, v["reason"].as_str(), v["status"].as_str()),
        (libc::EACCES, Some("handoff_not_live"), Some("overtaken"))
    );

    let m = handed();
    verb_ok(&m, "alice", &["withdraw", "plan.md"]);
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    let v = refused(
        &m,
        "alice",
        &["transfer", "--to", "bob", "plan.md"],
        "handoff_ended",
    );
    assert_eq!(v["status"], "withdrawn", "{v}");
    let v = refused(&m, "bob", &["decline", "plan.md"], "handoff_not_live");
    assert_eq!(v["status"], "withdrawn", "{v}");
}

/// `--to any`: the first accept claims the offer; once claimed it can be declined and
/// withdrawn; a bystander's acquire before the claim leaves it open.
#[test]
fn an_offer_claimed_then_declined_lifts_the_fence() {
    let m = handed_to("any");
    refused(&m, "bob", &["decline", "plan.md"], "handoff_not_successor");
    acquires(&m, "carol");
    assert!(inbox(&m, Some("bob")).contains("plan.md"), "still open");
    let r = rec0(&verb_ok(&m, "bob", &["accept", "plan.md"]));
    assert_eq!(r["claimed_by"], "bob", "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    let r = rec0(&verb_ok(&m, "bob", &["decline", "plan.md"]));
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"declined".into(), &false.into())
    );
    writes(&m, "alice");

    let m = handed_to("any");
    verb_ok(&m, "bob", &["accept", "plan.md"]);
    let r = rec0(&verb_ok(&m, "alice", &["withdraw", "plan.md"]));
    assert_eq!(r["status"], "withdrawn", "{r}");
    writes(&m, "alice");
}

/// The deny text stays byte-identical across retries of the same refusal, whatever the
/// live status in between (its time is on a line of its own), and names the three ways out.
#[test]
fn the_deny_text_is_byte_identical_across_retries() {
    let m = handed();
    let first_line = |m: &Vol| {
        why(m, Some("alice"))
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    };
    let mut texts = Vec::new();
    for step in 0..3 {
        match step {
            1 => acquires(&m, "carol"),
            2 => {
                verb_ok(&m, "bob", &["accept", "plan.md"]);
            }
            _ => {}
        }
        for _ in 0..2 {
            assert!(fenced(&m));
            texts.push(first_line(&m));
        }
    }
    assert!(texts.windows(2).all(|w| w[0] == w[1]), "{texts:#?}");
    if let Some(e) = check_deny_text(&texts[0], "plan.md", "bob", 1) {
        panic!("{e}");
    }
    // and each way it names works now
    verb_ok(&m, "bob", &["decline", "plan.md"]);
    writes(&m, "alice");
}

/// Rows "someone reads it" and "nothing happens": no status changes, the fence stays.
#[test]
fn reads_change_no_status_and_the_fence_stays() {
    let m = handed();
    for who in ["carol", "bob", "alice"] {
        sh_ok(&m, Some(who), "cat plan.md >/dev/null");
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let r = rec(&m);
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"pending".into(), &true.into())
    );
    assert!(fenced(&m));
    // In any live status.
    verb_ok(&m, "bob", &["accept", "plan.md"]);
    sh_ok(&m, Some("carol"), "cat plan.md >/dev/null");
    assert_eq!(rec(&m)["status"], "completed");
    acquires(&m, "carol");
    sh_ok(&m, Some("bob"), "cat plan.md >/dev/null");
    assert_eq!(rec(&m)["status"], "overtaken");
    assert!(fenced(&m));
}
