//! `wait PATH [UNTIL]` and offers to anyone on a real mount (docs/design.md#handoff,
//! docs/design.md#control-surface): `coherent wait` returns when the successor acts, times out with
//! the status, is refused without a record; pending waits park no FUSE thread; a killed waiter is
//! let go; two sessions racing to claim an offer: one wins.

use crate::coherent;
use crate::common;

use coherent::*;
use common::{wait_child, wait_until, Mount};
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `coherent ARGS` as `who` in the mount root, started in the background.
fn spawn_cli(m: &impl Root, who: &str, args: &[&str]) -> Child {
    let mut c = Command::new(CLI);
    c.args(args).current_dir(m.root());
    for t in TAGS {
        c.env_remove(t);
    }
    c.env("COHERENT_SESSION", who)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn coherent")
}

/// Wait for `child` to exit; its exit code and stdout.
fn finish(mut child: Child, within: Duration) -> (Option<i32>, String, String) {
    let st = wait_child(&mut child, within);
    if st.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the process did not exit within {within:?}");
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Wait until the daemon's log says `n` waits are pending in all.
fn await_pending(m: &Vol, n: usize) {
    let ok = wait_until(SETTLE, || m.log().matches("wait pending").count() >= n);
    assert!(ok, "{n} waits never pending; log:\n{}", m.log());
}

/// A mount (daemon log at debug, few request threads) where alice wrote plan.md and
/// bob and carol are known.
fn setup() -> Vol {
    let m = mount_with(
        Mount::builder()
            .args(["--threads", "2"])
            .env("RUST_LOG", "debug"),
    );
    sh_ok(&m, Some("alice"), "echo draft > plan.md");
    touch_session(&m, "bob");
    touch_session(&m, "carol");
    m
}

#[test]
fn a_wait_returns_when_the_successor_writes() {
    let m = setup();
    transfer(&m, "alice", "bob", &["plan.md"]);
    let w = spawn_cli(
        &m,
        "alice",
        &[
            "--json",
            "wait",
            "plan.md",
            "--until",
            "completed",
            "--timeout",
            "25",
        ],
    );
    await_pending(&m, 1);
    // the waiter's exit is seen by a thread of its own, so its time is not the end of
    // bob's command
    let reaper = std::thread::spawn(move || {
        let r = finish(w, Duration::from_secs(20));
        (r, Instant::now())
    });
    let start = Instant::now();
    sh_ok(&m, Some("bob"), "echo done >> plan.md");
    let bob_took = start.elapsed();
    let ((code, out, err), exited) = reaper.join().unwrap();
    eprintln!(
        "bob's `echo >>` took {bob_took:?}; the wait exited {:?} after it started",
        exited - start
    );
    assert_eq!(code, Some(0), "{out} {err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["reached"], true, "{v}");
    // docs/design.md#handoff: the successor's open for write already makes it `completed` (the
    // record may still be live then: the commit comes at bob's close).
    assert_eq!(v["record"]["status"], "completed", "{v}");
    let r = record(&m, "plan.md").unwrap();
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"completed".into(), &false.into())
    );
}

#[test]
fn a_wait_for_an_accept_and_the_human_line() {
    let m = setup();
    transfer(&m, "alice", "bob", &["plan.md"]);
    let w = spawn_cli(&m, "alice", &["wait", "plan.md", "--until", "accepted"]);
    await_pending(&m, 1);
    verb_ok(&m, "bob", &["accept", "plan.md"]);
    let (code, out, err) = finish(w, Duration::from_secs(20));
    assert_eq!(code, Some(0), "{out} {err}");
    assert!(out.contains("accepted reached"), "{out}");
}

#[test]
fn a_wait_times_out_with_exit_1_and_prints_the_status() {
    let m = setup();
    transfer(&m, "alice", "bob", &["plan.md"]);
    let t = Instant::now();
    let r = cli(&m, Some("alice"), &["wait", "plan.md", "--timeout", "1"]);
    eprintln!("timed out after {:?}", t.elapsed());
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(r.out.contains("pending"), "{}", r.show());
    assert!(r.err.contains("timed out"), "{}", r.show());
    // a timeout of 0 answers at once, not reached
    let (errno, v) = ctl(&m, Some("alice"), "wait plan.md ended --timeout 0");
    assert_eq!(errno, 0, "{v}");
    assert_eq!(v["reached"], false, "{v}");
    assert_eq!(v["record"]["status"], "pending", "{v}");
}

#[test]
fn wait_refusals_carry_reason_and_errno() {
    let m = setup();
    sh_ok(&m, Some("alice"), "echo x > plain.md");
    // no record: exit 2 and the reason
    let (code, v) = cli_json(&m, Some("alice"), &["wait", "plain.md", "--timeout", "5"]);
    assert_eq!(code, Some(2), "{v}");
    assert_eq!(v["reason"], "handoff_not_live", "{v}");
    let (errno, v) = ctl(&m, Some("alice"), "wait plain.md");
    assert_eq!(
        (errno, v["reason"].as_str()),
        (libc::EACCES, Some("handoff_not_live"))
    );
    let (errno, v) = ctl(&m, Some("alice"), "wait missing.md");
    assert_eq!(
        (errno, v["reason"].as_str()),
        (libc::ENOENT, Some("no_such_path"))
    );
    // an untracked path has no record and never will
    sh_ok(
        &m,
        Some("alice"),
        "echo '*.log' > .gitignore; echo x > a.log",
    );
    let (errno, v) = ctl(&m, Some("alice"), "wait a.log");
    assert_eq!(v["reason"], "not_tracked", "{v}");
    assert_ne!(errno, 0, "{v}");
    let (errno, v) = ctl(&m, Some("alice"), "wait ../outside");
    assert_eq!(
        (errno, v["reason"].as_str()),
        (libc::EINVAL, Some("bad_request"))
    );
    let (errno, v) = ctl(&m, Some("alice"), "wait plan.md soon");
    assert_eq!(
        (errno, v["reason"].as_str()),
        (libc::EINVAL, Some("bad_request"))
    );
    // a record that ended declined can never complete: refused at once
    transfer(&m, "alice", "bob", &["plan.md"]);
    verb_ok(&m, "bob", &["decline", "plan.md"]);
    let (code, v) = cli_json(
        &m,
        Some("alice"),
        &["wait", "plan.md", "--until", "completed"],
    );
    assert_eq!(code, Some(2), "{v}");
    assert_eq!(
        (v["reason"].as_str(), v["status"].as_str()),
        (Some("handoff_ended"), Some("declined"))
    );
    // ... and it has ended
    let (code, v) = cli_json(&m, Some("alice"), &["wait", "plan.md"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["record"]["status"], "declined");
}

#[test]
fn six_pending_waits_park_no_request_thread() {
    let m = setup();
    transfer(&m, "alice", "bob", &["plan.md"]);
    let waits: Vec<Child> = (0..6)
        .map(|_| spawn_cli(&m, "alice", &["wait", "plan.md", "--timeout", "25"]))
        .collect();
    await_pending(&m, 6);
    // the mount (2 request threads) still serves: lookups, reads, ctl requests
    let t = Instant::now();
    let out = sh_ok(
        &m,
        Some("carol"),
        "ls -a; cat plan.md; cat .coherent/status >/dev/null",
    );
    assert!(out.contains("plan.md") && out.contains("draft"), "{out}");
    let st = cli(&m, Some("carol"), &["status", "plan.md"]);
    assert!(st.ok(), "{}", st.show());
    eprintln!(
        "ls, cat and status with 6 waits pending took {:?}",
        t.elapsed()
    );
    verb_ok(&m, "bob", &["accept", "plan.md"]);
    for w in waits {
        let (code, out, err) = finish(w, Duration::from_secs(20));
        assert_eq!(code, Some(0), "{out} {err}");
    }
}

#[test]
fn a_killed_waiter_is_let_go() {
    let m = setup();
    transfer(&m, "alice", "bob", &["plan.md"]);
    let mut w = spawn_cli(&m, "alice", &["wait", "plan.md", "--timeout", "25"]);
    await_pending(&m, 1);
    let t = Instant::now();
    // SAFETY: a pid of our own child.
    unsafe { libc::kill(w.id() as i32, libc::SIGKILL) };
    let st = wait_child(&mut w, Duration::from_secs(5));
    eprintln!("the killed waiter exited after {:?}", t.elapsed());
    assert!(st.is_some(), "a killed waiter stays stuck in its read");
    // the mount still answers
    assert!(cli(&m, Some("carol"), &["status"]).ok());
}

#[test]
fn two_sessions_race_to_claim_an_offer_and_one_wins() {
    let m = setup();
    touch_session(&m, "dave");
    transfer(&m, "alice", "any", &["plan.md"]);
    // in every inbox but the giver's
    assert!(inbox(&m, Some("bob")).contains("plan.md"));
    assert!(inbox(&m, Some("carol")).contains("plan.md"));
    assert!(!inbox(&m, Some("alice")).contains("plan.md"));
    // the giver is fenced from the offer on
    assert!(sh(&m, Some("alice"), "echo again >> plan.md").denied());
    let r = cli(&m, Some("bob"), &["decline", "plan.md"]);
    assert_eq!(r.code, Some(2), "{}", r.show());
    let w = spawn_cli(
        &m,
        "alice",
        &["--json", "wait", "plan.md", "--until", "accepted"],
    );
    await_pending(&m, 1);
    let racers: Vec<(String, Child)> = ["bob", "carol"]
        .iter()
        .map(|who| {
            (
                who.to_string(),
                spawn_cli(&m, who, &["--json", "accept", "plan.md"]),
            )
        })
        .collect();
    let results: Vec<(String, Option<i32>, Value)> = racers
        .into_iter()
        .map(|(who, c)| {
            let (code, out, _) = finish(c, Duration::from_secs(20));
            (
                who,
                code,
                serde_json::from_str(out.trim()).unwrap_or(Value::Null),
            )
        })
        .collect();
    let winners: Vec<&String> = results
        .iter()
        .filter(|(_, c, _)| *c == Some(0))
        .map(|(w, _, _)| w)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let loser = results.iter().find(|(_, c, _)| *c != Some(0)).unwrap();
    assert_eq!(loser.1, Some(2), "{results:?}");
    assert_eq!(loser.2["reason"], "handoff_not_successor", "{results:?}");
    let winner = winners[0].as_str();
    // a third claim through ctl: refused with EACCES
    let (errno, v) = ctl(&m, Some("dave"), "accept plan.md");
    assert_eq!(
        (errno, v["reason"].as_str()),
        (libc::EACCES, Some("handoff_not_successor"))
    );
    // the waiting giver learns who claimed it
    let (code, out, err) = finish(w, Duration::from_secs(20));
    assert_eq!(code, Some(0), "{out} {err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["record"]["claimed_by"], winner, "{v}");
    // the log and the status say who claimed it
    let claims: Vec<Value> = events_of(&m, "accept", "plan.md", Some(winner));
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["claimed"], true);
    let rec = live_record(&m, "plan.md").expect("live");
    assert_eq!(
        (rec["successor"].as_str(), rec["claimed_by"].as_str()),
        (Some(winner), Some(winner))
    );
    // still fenced until the winner writes
    assert!(sh(&m, Some("alice"), "echo again >> plan.md").denied());
    sh_ok(&m, Some(winner), "echo mine >> plan.md");
    wait_until(SETTLE, || live_record(&m, "plan.md").is_none());
    // the fence lifted; alice writes once she has read the winner's version (before, she
    // is a late giver)
    sh_refused(
        &m,
        "alice",
        "echo again >> plan.md",
        "plan.md",
        "stale_view",
    );
    assert!(sh(
        &m,
        Some("alice"),
        "cat plan.md >/dev/null && echo again >> plan.md"
    )
    .ok());
}
