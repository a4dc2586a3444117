//! The handoff table of docs/design.md#handoff end to end on a real mount, each scenario twice:
//! through the `coherent` CLI and through plain-line writes to `.coherent/ctl`. Then every refusal
//! code of docs/design.md#handoff with its CLI exit code (2) and the errno of its ctl write
//! (docs/design.md#control-surface).

use crate::coherent;
use crate::common;

use coherent::*;
use common::Mount;
use serde_json::{json, Value};

/// How a verb reaches the volume.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Chan {
    /// `coherent --json VERB ...` (exit 0 done, 2 refused).
    Cli,
    /// One plain-line `write(2)` to `.coherent/ctl`, reply read back on the same descriptor.
    Ctl,
    /// The same with the JSON form of the request.
    CtlJson,
}

#[derive(Debug)]
struct Answer {
    ok: bool,
    reason: Option<String>,
    reply: Value,
    /// CLI exit code, or the errno of the ctl write (0 when it succeeded).
    code: i32,
}

/// A single-quoted plain-line argument (literal inside quotes, docs/design.md#control-surface).
fn q(s: &str) -> String {
    assert!(!s.contains('\''), "no single quote in test values");
    format!("'{s}'")
}

/// Send `req` (the JSON form) as `who` on `chan`.
fn verb(m: &Mount, chan: Chan, who: Who, req: &Value) -> Answer {
    let name = req["verb"].as_str().unwrap();
    let paths: Vec<String> = req["paths"]
        .as_array()
        .map(|a| a.iter().map(|p| p.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    let to = req["to"].as_str();
    let note = req["note"].as_str();
    match chan {
        Chan::Cli => {
            let mut args: Vec<String> = vec!["--json".into(), name.into()];
            if let Some(t) = to {
                args.extend(["--to".into(), t.into()]);
            }
            if let Some(n) = note {
                args.extend(["--note".into(), n.into()]);
            }
            args.extend(paths);
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let r = cli(m, who, &a);
            let reply: Value = serde_json::from_str(r.out.trim()).unwrap_or(Value::Null);
            Answer {
                ok: r.code == Some(0),
                reason: reply["reason"].as_str().map(String::from),
                reply,
                code: r.code.unwrap_or(-1),
            }
        }
        Chan::Ctl | Chan::CtlJson => {
            let line = if chan == Chan::CtlJson {
                req.to_string()
            } else {
                let mut l = name.to_string();
                if let Some(t) = to {
                    l += &format!(" --to {}", q(t));
                }
                if let Some(n) = note {
                    l += &format!(" --note {}", q(n));
                }
                for p in &paths {
                    l += &format!(" {}", q(p));
                }
                l + "\n"
            };
            let (errno, reply) = ctl(m, who, &line);
            Answer {
                ok: errno == 0,
                reason: reply["reason"].as_str().map(String::from),
                reply,
                code: errno,
            }
        }
    }
}

fn transfer_req(path: &str, to: &str, note: Option<&str>) -> Value {
    let mut v = json!({"verb": "transfer", "paths": [path], "to": to});
    if let Some(n) = note {
        v["note"] = n.into();
    }
    v
}

fn path_req(verb: &str, path: &str) -> Value {
    json!({"verb": verb, "paths": [path]})
}

/// A verb that must succeed (a transfer is retried while the giver's last close is still
/// in flight: FUSE RELEASE is asynchronous).
fn ok(m: &Mount, chan: Chan, who: &str, req: &Value) -> Value {
    let mut a = verb(m, chan, Some(who), req);
    let end = std::time::Instant::now() + SETTLE;
    while a.reason.as_deref() == Some("handoff_in_flight") && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(20));
        a = verb(m, chan, Some(who), req);
    }
    assert!(a.ok, "{chan:?} {who} {req}: {a:?}");
    a.reply
}

/// A verb that must be refused with `reason`: CLI exit 2, or the ctl write failing with
/// `errno`; the reply names the reason either way.
fn refused(m: &Mount, chan: Chan, who: Who, req: &Value, reason: &str, errno: i32) {
    let a = verb(m, chan, who, req);
    let want_code = if chan == Chan::Cli { 2 } else { errno };
    assert!(
        !a.ok && a.code == want_code && a.reason.as_deref() == Some(reason),
        "{chan:?} {who:?} {req}: want {reason} ({want_code}), got {a:?}"
    );
}

fn denied(m: &Mount, who: &str, path: &str) -> bool {
    sh_refused(m, who, &format!("echo {who} >> {path}"), path, "fenced").denied()
}

fn writes(m: &Mount, who: &str, path: &str) {
    sh_ok(m, Some(who), &format!("echo {who} >> {path}"));
}

/// alice creates plan.md (v1, her commit); bob and carol are known.
fn setup() -> Vol {
    let m = mount(true);
    touch_session(&m, "bob");
    touch_session(&m, "carol");
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    assert_eq!(version(&m, "plan.md"), Some(1));
    m
}

fn rec0(reply: &Value) -> Value {
    reply["records"][0].clone()
}

fn completed_by_the_successors_write(chan: Chan) {
    let m = setup();
    let reply = ok(
        &m,
        chan,
        "alice",
        &transfer_req("plan.md", "bob", Some("please review the plan")),
    );
    let r = rec0(&reply);
    assert_eq!(r["path"], "plan.md", "{reply}");
    assert_eq!(r["giver"], "alice", "{reply}");
    assert_eq!(r["successor"], "bob", "{reply}");
    assert_eq!(r["successor_agent"], agent_of("bob"), "{reply}");
    assert_eq!(r["version_at_transfer"], 1, "{reply}");
    assert_eq!(r["hold"], "M", "{reply}");
    assert_eq!(r["status"], "pending", "{reply}");
    assert_eq!(r["live"], true, "{reply}");
    assert_eq!(r["note"], "please review the plan", "{reply}");
    assert_eq!(events_of(&m, "transfer", "plan.md", Some("alice")).len(), 1);

    assert!(denied(&m, "alice", "plan.md"));
    if let Some(e) = check_deny_text(&why(&m, Some("alice")), "plan.md", "bob", 1) {
        panic!("{e}");
    }
    for (who, role) in [
        ("alice", "giver"),
        ("bob", "successor"),
        ("carol", "bystander"),
    ] {
        let h = handoff(&m, Some(who), "plan.md")
            .unwrap_or_else(|| panic!("no user.coherent.handoff for {who}"));
        assert_eq!(h["role"], role, "{who}: {h}");
        assert_eq!(h["status"], "pending", "{h}");
    }
    let inbox_bob = inbox(&m, Some("bob"));
    assert!(
        inbox_bob.contains("plan.md") && inbox_bob.contains("please review the plan"),
        "{inbox_bob}"
    );
    assert!(!inbox(&m, Some("carol")).contains("plan.md"));

    sh_ok(&m, Some("bob"), "cat plan.md >/dev/null");
    assert!(!await_events(&m, "handoff_seen", "plan.md", Some("bob"), 1).is_empty());
    writes(&m, "bob", "plan.md");
    assert_eq!(version(&m, "plan.md"), Some(2));
    let r = record(&m, "plan.md").unwrap();
    assert_eq!(
        (&r["status"], &r["live"]),
        (&json!("completed"), &json!(false))
    );
    assert!(!await_events(&m, "completed", "plan.md", None, 1).is_empty());
    assert!(handoff(&m, Some("alice"), "plan.md").is_none());
    // the version moved: the fence is gone; alice has not read bob's version, so she is
    // a late giver (refused `stale_view`) until she reads it
    sh_refused(
        &m,
        "alice",
        "echo alice >> plan.md",
        "plan.md",
        "stale_view",
    );
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    writes(&m, "alice", "plan.md");
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\nbob\nalice\n"
    );
}

fn accept_keeps_the_fence_until_the_version_moves(chan: Chan) {
    let m = setup();
    ok(&m, chan, "alice", &transfer_req("plan.md", "bob", None));
    let r = rec0(&ok(&m, chan, "bob", &path_req("accept", "plan.md")));
    assert_eq!(
        (&r["status"], &r["live"]),
        (&json!("completed"), &json!(true))
    );
    assert!(!events_of(&m, "accept", "plan.md", Some("bob")).is_empty());
    assert!(
        denied(&m, "alice", "plan.md"),
        "accepted: alice stays fenced"
    );
    assert_eq!(version(&m, "plan.md"), Some(1));
    writes(&m, "bob", "plan.md");
    assert_eq!(version(&m, "plan.md"), Some(2));
    // the fence lifted; a late giver until alice reads bob's version
    sh_refused(
        &m,
        "alice",
        "echo alice >> plan.md",
        "plan.md",
        "stale_view",
    );
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    writes(&m, "alice", "plan.md");
}

fn decline_lifts_the_fence_and_ends_the_handoff(chan: Chan) {
    let m = setup();
    ok(&m, chan, "alice", &transfer_req("plan.md", "bob", None));
    let r = rec0(&ok(&m, chan, "bob", &path_req("decline", "plan.md")));
    assert_eq!(
        (&r["status"], &r["live"]),
        (&json!("declined"), &json!(false))
    );
    assert!(!events_of(&m, "decline", "plan.md", Some("bob")).is_empty());
    // the giver gave her hold up with the transfer: she reads the file again (S at v1);
    // the same transfer at the same version is still refused until the version moves
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    refused(
        &m,
        chan,
        Some("alice"),
        &transfer_req("plan.md", "bob", None),
        "handoff_ended",
        libc::EACCES,
    );
    writes(&m, "alice", "plan.md");
    assert_eq!(version(&m, "plan.md"), Some(2));
    let r = rec0(&ok(
        &m,
        chan,
        "alice",
        &transfer_req("plan.md", "bob", None),
    ));
    assert_eq!(
        (&r["version_at_transfer"], &r["live"]),
        (&json!(2), &json!(true))
    );
}

fn withdraw_lifts_the_fence(chan: Chan) {
    let m = setup();
    ok(&m, chan, "alice", &transfer_req("plan.md", "bob", None));
    assert!(denied(&m, "alice", "plan.md"));
    let r = rec0(&ok(&m, chan, "alice", &path_req("withdraw", "plan.md")));
    assert_eq!(
        (&r["status"], &r["live"]),
        (&json!("withdrawn"), &json!(false))
    );
    assert!(!events_of(&m, "withdraw", "plan.md", Some("alice")).is_empty());
    assert!(inbox(&m, Some("bob")).find("plan.md").is_none());
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    refused(
        &m,
        chan,
        Some("alice"),
        &transfer_req("plan.md", "bob", None),
        "handoff_ended",
        libc::EACCES,
    );
    writes(&m, "alice", "plan.md");
    assert_eq!(version(&m, "plan.md"), Some(2));
}

fn a_bystander_overtakes(chan: Chan) {
    let m = setup();
    ok(&m, chan, "alice", &transfer_req("plan.md", "bob", None));
    // an acquire without a commit: overtaken, still live (the version has not moved)
    let mut h = hold_open(&m, Some("carol"), "plan.md", true).expect("carol opens for write");
    let r = record(&m, "plan.md").unwrap();
    assert_eq!(r["status"], "overtaken", "{r}");
    assert_eq!(r["counterparty"], "carol", "{r}");
    assert_eq!(r["live"], true, "{r}");
    assert!(
        denied(&m, "alice", "plan.md"),
        "overtaken but live: still fenced"
    );
    h.close();
    writes(&m, "carol", "plan.md");
    let r = record(&m, "plan.md").unwrap();
    assert_eq!(
        (&r["status"], &r["live"]),
        (&json!("overtaken"), &json!(false))
    );
    assert_eq!(r["counterparty"], "carol", "{r}");
    let ev = await_events(&m, "overtaken", "plan.md", None, 1);
    assert!(
        ev.iter().any(|e| e["counterparty"] == "carol"),
        "overtaken events: {ev:?}"
    );
    writes(&m, "alice", "plan.md");
}

fn in_flight_while_the_giver_holds_a_write_descriptor(chan: Chan) {
    let m = setup();
    let mut h = hold_open(&m, Some("alice"), "plan.md", true).expect("alice opens for write");
    refused(
        &m,
        chan,
        Some("alice"),
        &transfer_req("plan.md", "bob", None),
        "handoff_in_flight",
        libc::EBUSY,
    );
    assert!(record(&m, "plan.md").is_none());
    h.close();
    ok(&m, chan, "alice", &transfer_req("plan.md", "bob", None));
    assert!(denied(&m, "alice", "plan.md"));
}

/// The same with a shell that holds the file on a descriptor (`exec 3>>plan.md`).
fn in_flight_while_a_shell_of_the_giver_holds_fd_3(chan: Chan) {
    let m = setup();
    let mut h = hold_shell(&m, Some("alice"), "plan.md").expect("exec 3>>plan.md");
    refused(
        &m,
        chan,
        Some("alice"),
        &transfer_req("plan.md", "bob", None),
        "handoff_in_flight",
        libc::EBUSY,
    );
    // the same shell closes fd 3 and lives on: a release, and the transfer goes through
    h.close();
    ok(&m, chan, "alice", &transfer_req("plan.md", "bob", None));
    assert!(denied(&m, "alice", "plan.md"));
}

fn sending_the_same_transfer_again_changes_nothing(chan: Chan) {
    let m = setup();
    let first = rec0(&ok(
        &m,
        chan,
        "alice",
        &transfer_req("plan.md", "bob", None),
    ));
    let again = rec0(&ok(
        &m,
        chan,
        "alice",
        &transfer_req("plan.md", "bob", None),
    ));
    assert_eq!(first["created"], again["created"], "{first} / {again}");
    assert_eq!(again["status"], "pending");
    assert_eq!(again["live"], true);
    assert_eq!(events_of(&m, "transfer", "plan.md", None).len(), 1);
    assert_eq!(records(&m, "plan.md").len(), 1);
}

fn a_transfer_to_another_successor_supersedes(chan: Chan) {
    let m = setup();
    ok(&m, chan, "alice", &transfer_req("plan.md", "bob", None));
    let r = rec0(&ok(
        &m,
        chan,
        "alice",
        &transfer_req("plan.md", "carol", None),
    ));
    assert_eq!(
        (&r["successor"], &r["live"]),
        (&json!("carol"), &json!(true))
    );
    let all = records(&m, "plan.md");
    let old = all
        .iter()
        .find(|r| r["successor"] == "bob")
        .expect("bob's record");
    assert_eq!(
        (&old["status"], &old["live"]),
        (&json!("superseded"), &json!(false))
    );
    assert!(!events_of(&m, "superseded", "plan.md", None).is_empty());
    assert!(denied(&m, "alice", "plan.md"));
    if let Some(e) = check_deny_text(&why(&m, Some("alice")), "plan.md", "carol", 1) {
        panic!("{e}");
    }
    assert!(!inbox(&m, Some("bob")).contains("plan.md"));
    assert!(inbox(&m, Some("carol")).contains("plan.md"));
}

/// Every refusal code of docs/design.md#handoff with its errno (docs/design.md#control-surface).
fn every_refusal(chan: Chan) {
    let m = setup();
    let t = |p: &str, to: &str| transfer_req(p, to, None);
    refused(
        &m,
        chan,
        Some("alice"),
        &t("plan.md", "alice"),
        "handoff_to_self",
        libc::EACCES,
    );
    refused(
        &m,
        chan,
        Some("alice"),
        &t("plan.md", "nobody"),
        "handoff_successor_unknown",
        libc::ESRCH,
    );
    refused(
        &m,
        chan,
        Some("alice"),
        &t("plan.md", "bad\u{1}name"),
        "handoff_successor_malformed",
        libc::EINVAL,
    );
    refused(
        &m,
        chan,
        Some("alice"),
        &t("missing.md", "bob"),
        "no_such_path",
        libc::ENOENT,
    );
    refused(
        &m,
        chan,
        None,
        &t("plan.md", "bob"),
        "unattributed",
        libc::EACCES,
    );
    let big = "x".repeat(70 * 1024);
    refused(
        &m,
        chan,
        Some("alice"),
        &transfer_req("plan.md", "bob", Some(&big)),
        "bad_request",
        libc::EINVAL,
    );
    // nothing of the above changed anything
    assert!(record(&m, "plan.md").is_none());
    assert_eq!(version(&m, "plan.md"), Some(1));

    // not held: alice made old.md v1, bob committed v2 since (alice holds I)
    sh_ok(&m, Some("alice"), "echo old > old.md");
    writes(&m, "bob", "old.md");
    refused(
        &m,
        chan,
        Some("alice"),
        &t("old.md", "carol"),
        "handoff_not_held",
        libc::EACCES,
    );

    // in flight: alice has busy.md open for writing
    sh_ok(&m, Some("alice"), "echo busy > busy.md");
    let h = hold_open(&m, Some("alice"), "busy.md", true).unwrap();
    refused(
        &m,
        chan,
        Some("alice"),
        &t("busy.md", "bob"),
        "handoff_in_flight",
        libc::EBUSY,
    );
    drop(h);

    // a live record alice -> bob on plan.md
    ok(&m, chan, "alice", &t("plan.md", "bob"));
    sh_ok(&m, Some("carol"), "cat plan.md >/dev/null");
    refused(
        &m,
        chan,
        Some("carol"),
        &t("plan.md", "bob"),
        "handoff_other_holder",
        libc::EACCES,
    );
    refused(
        &m,
        chan,
        Some("carol"),
        &path_req("accept", "plan.md"),
        "handoff_not_successor",
        libc::EACCES,
    );
    refused(
        &m,
        chan,
        Some("carol"),
        &path_req("decline", "plan.md"),
        "handoff_not_successor",
        libc::EACCES,
    );
    refused(
        &m,
        chan,
        Some("bob"),
        &path_req("withdraw", "plan.md"),
        "handoff_not_giver",
        libc::EACCES,
    );

    // ended by decline: not live any more, and the same transfer is handoff_ended
    ok(&m, chan, "bob", &path_req("decline", "plan.md"));
    refused(
        &m,
        chan,
        Some("bob"),
        &path_req("accept", "plan.md"),
        "handoff_not_live",
        libc::EACCES,
    );
    refused(
        &m,
        chan,
        Some("alice"),
        &path_req("withdraw", "plan.md"),
        "handoff_not_live",
        libc::EACCES,
    );
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    refused(
        &m,
        chan,
        Some("alice"),
        &t("plan.md", "bob"),
        "handoff_ended",
        libc::EACCES,
    );

    // every refusal above left the log without a transfer beyond the one made
    assert_eq!(events_of(&m, "transfer", "plan.md", None).len(), 1);
}

macro_rules! per_channel {
    ($($name:ident),* $(,)?) => {
        mod cli {
            $( #[test] fn $name() { super::$name(super::Chan::Cli) } )*
        }
        mod ctl {
            $( #[test] fn $name() { super::$name(super::Chan::Ctl) } )*
        }
    };
}

per_channel!(
    completed_by_the_successors_write,
    accept_keeps_the_fence_until_the_version_moves,
    decline_lifts_the_fence_and_ends_the_handoff,
    withdraw_lifts_the_fence,
    a_bystander_overtakes,
    in_flight_while_the_giver_holds_a_write_descriptor,
    in_flight_while_a_shell_of_the_giver_holds_fd_3,
    sending_the_same_transfer_again_changes_nothing,
    a_transfer_to_another_successor_supersedes,
    every_refusal,
);

#[test]
fn every_refusal_json_requests() {
    every_refusal(Chan::CtlJson);
}

const ECHO_TRANSFER: &str = "bash -c \"echo 'transfer --to bob plan.md' > .coherent/ctl\"";

/// `echo '...' > .coherent/ctl` reports failure by itself: the shell's redirection fails
/// with the errno's text.
#[test]
fn echo_to_ctl_fails_by_itself() {
    let m = setup();
    let cases = [
        ("transfer --to alice plan.md", "Permission denied"),
        ("transfer --to nobody plan.md", "No such process"),
        ("transfer --to bob missing.md", "No such file or directory"),
        ("frobnicate plan.md", "Invalid argument"),
    ];
    for (line, text) in cases {
        let r = sh(
            &m,
            Some("alice"),
            &format!("bash -c \"echo '{line}' > .coherent/ctl\""),
        );
        assert!(
            !r.ok() && r.err.contains(text),
            "`{line}`: want {text:?}, got {}",
            r.show()
        );
    }
    let mut h = hold_open(&m, Some("alice"), "plan.md", true).unwrap();
    let r = sh(&m, Some("alice"), ECHO_TRANSFER);
    assert!(r.err.contains("Device or resource busy"), "{}", r.show());
    h.close();
    let mut last = sh(&m, Some("alice"), ECHO_TRANSFER);
    common::wait_until(SETTLE, || {
        last = sh(&m, Some("alice"), ECHO_TRANSFER);
        !last.err.contains("busy")
    });
    assert!(last.ok(), "{}", last.show());
    assert!(live_record(&m, "plan.md").is_some());
}

/// The CLI's human lines name the file, the other session (name and short id), the
/// version and what to do next; a refusal prints the reason and exits 2.
#[test]
fn cli_human_lines() {
    let m = setup();
    let r = cli(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    for w in [
        "plan.md",
        "bob",
        &short_of("bob"),
        "v1",
        "coherent withdraw plan.md",
    ] {
        assert!(r.out.contains(w), "transfer line lacks {w:?}: {}", r.out);
    }
    let r = cli(&m, Some("carol"), &["accept", "plan.md"]);
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(r.err.contains("handoff_not_successor"), "{}", r.show());
    let r = cli(&m, Some("bob"), &["accept", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    for w in ["plan.md", "alice", &short_of("alice"), "v1"] {
        assert!(r.out.contains(w), "accept line lacks {w:?}: {}", r.out);
    }
    let r = cli(&m, Some("bob"), &["--json", "status", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    let st = r.json();
    assert_eq!(st["status"]["version"], 1, "{st}");
    assert_eq!(st["status"]["live"][0]["status"], "completed", "{st}");
}

/// `--evict-after`: an ended record goes away after it (event `evict`), which also ends
/// `handoff_ended`; a live record never does (no timer ends a handoff or lifts a fence).
#[test]
fn ended_records_are_evicted_live_ones_never() {
    let m = mount_with(Mount::builder().args(["--evict-after", "1s"]));
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "echo p > plan.md && echo k > kept.md");
    transfer(&m, "alice", "bob", &["plan.md", "kept.md"]);
    verb_ok(&m, "bob", &["decline", "plan.md"]);
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    let (code, v) = cli_json(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]);
    assert_eq!(
        (code, v["reason"].as_str()),
        (Some(2), Some("handoff_ended")),
        "{v}"
    );
    let ev = wait_event(&m, std::time::Duration::from_secs(30), |e| {
        e["event"] == "evict" && e["path"] == "plan.md"
    });
    assert!(ev.is_some(), "the declined record was never evicted");
    assert!(
        records(&m, "plan.md").is_empty(),
        "{:?}",
        records(&m, "plan.md")
    );
    // evicted: the same transfer at the same version is allowed again
    transfer(&m, "alice", "bob", &["plan.md"]);
    // the live record of kept.md outlived the eviction and still fences alice
    assert!(events_of(&m, "evict", "kept.md", None).is_empty());
    let r = live_record(&m, "kept.md").expect("kept.md still live");
    assert_eq!(r["status"], "pending", "{r}");
    assert!(denied(&m, "alice", "kept.md"));
}

/// A shell of the giver that was running before the transfer (an agent's persistent shell)
/// is fenced after it, in itself and in its children, and free again after a withdraw.
#[test]
fn a_shell_started_before_the_transfer_is_fenced_after_it() {
    let m = setup();
    let mut sh_a = LiveShell::start(&m, Some("alice"));
    assert_eq!(sh_a.run("echo before >> plan.md"), 0);
    assert_eq!(sh_a.run("cat plan.md"), 0);
    transfer(&m, "alice", "bob", &["plan.md"]);
    assert_ne!(sh_a.run("echo after >> plan.md"), 0, "builtin redirection");
    assert_ne!(sh_a.run("sh -c 'echo after >> plan.md'"), 0, "child");
    assert_ne!(sh_a.run("rm -f plan.md"), 0, "rm");
    assert_eq!(sh_a.run("cat plan.md"), 0, "reads stay allowed");
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\nbefore\n"
    );
    verb_ok(&m, "alice", &["withdraw", "plan.md"]);
    assert_eq!(sh_a.run("echo after >> plan.md"), 0);
}

/// The CLI turns paths into mount-relative ones from any directory of the volume.
#[test]
fn cli_paths_are_relative_to_the_current_directory() {
    let m = setup();
    sh_ok(
        &m,
        Some("alice"),
        "mkdir -p sub/deep && echo x > sub/deep/x.md",
    );
    let mut c = std::process::Command::new(CLI);
    c.args(["--json", "transfer", "--to", "bob", "x.md", "../../plan.md"]);
    let r = run_in(
        &m.path("sub/deep"),
        &[("COHERENT_SESSION", "alice")],
        &mut c,
    );
    assert!(r.ok(), "{}", r.show());
    let paths: Vec<String> = r.json()["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, ["sub/deep/x.md", "plan.md"]);
    assert!(live_record(&m, "sub/deep/x.md").is_some());
    sh_refused(
        &m,
        "alice",
        "cd sub/deep && echo no >> x.md",
        "sub/deep/x.md",
        "fenced",
    );
    if let Some(e) = check_deny_text(&why(&m, Some("alice")), "sub/deep/x.md", "bob", 1) {
        panic!("{e}");
    }
    // a path outside the volume is not one of its files
    let mut c = std::process::Command::new(CLI);
    c.args(["transfer", "--to", "bob", "/etc/hostname"]);
    let r = run_in(&m.mnt, &[("COHERENT_SESSION", "alice")], &mut c);
    // the CLI finds the volume from the path: there is none (exit 4,
    // docs/design.md#control-surface)
    assert_eq!(r.code, Some(4), "{}", r.show());
    assert!(r.err.contains("no coherent volume here"), "{}", r.show());
}

/// A fenced giver cannot reach the handed file's bytes through a new hard link
/// (docs/design.md#problem: a giver must not write the file again). docs/design.md#write-routes
/// names `link` creating P; the mount also fences `link` with P as the source (findings, 13:22),
/// which this guards.
#[test]
fn a_fenced_giver_cannot_hard_link_the_handed_file() {
    let m = setup();
    transfer(&m, "alice", "bob", &["plan.md"]);
    sh_refused(
        &m,
        "alice",
        "ln plan.md alias.md && echo evil >> alias.md",
        "plan.md",
        "fenced",
    );
    assert!(!m.path("alias.md").exists());
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\n"
    );
    assert_eq!(version(&m, "plan.md"), Some(1));
    assert!(live_record(&m, "plan.md").is_some());
    // others may link it
    sh_ok(&m, Some("carol"), "ln plan.md alias.md");
}

/// Renaming the directory around a handed file moves its record with it: the giver cannot
/// shake the fence off by moving the directory.
#[test]
fn the_fence_follows_a_directory_rename() {
    let m = setup();
    sh_ok(&m, Some("alice"), "mkdir d && echo x > d/plan.md");
    transfer(&m, "alice", "bob", &["d/plan.md"]);
    // the giver may not move it (a rename of the handed file, docs/design.md#write-routes); a
    // bystander may
    sh_refused(&m, "alice", "mv d e", "d/plan.md", "fenced");
    sh_ok(&m, Some("carol"), "mv d e");
    let p = "e/plan.md";
    sh_refused(&m, "alice", &format!("echo no >> {p}"), p, "fenced");
    assert_eq!(std::fs::read_to_string(m.path(p)).unwrap(), "x\n");
    let rec = live_record(&m, p).unwrap_or_else(|| panic!("no live record at {p}"));
    assert_eq!(rec["successor"], "bob", "{rec}");
    let h = handoff(&m, Some("bob"), p).expect("handoff xattr at the new path");
    assert_eq!(h["role"], "successor", "{h}");
    if let Some(e) = check_deny_text(&why(&m, Some("alice")), p, "bob", 1) {
        panic!("{e}");
    }
}

/// A write handle whose file a sync replaced by a rename in the backing directory writes an
/// orphan: its close counts nothing for the name, which now denotes another file. alice
/// hands `h.md` to carol; bob (a bystander) holds it open and writes; the sync puts back
/// the bytes alice handed on; bob closes. No commit by bob: the record stays live and
/// alice stays fenced (counted, bob's commit would have overtaken the record).
#[test]
fn the_close_of_a_handle_on_a_replaced_file_counts_nothing_for_its_name() {
    for passthrough in [true, false] {
        close_of_a_handle_on_a_replaced_file(passthrough);
    }
}

fn close_of_a_handle_on_a_replaced_file(passthrough: bool) {
    let m = mount(passthrough);
    sh_ok(&m, Some("alice"), "echo handed > h.md");
    touch_session(&m, "carol");
    transfer(&m, "alice", "carol", &["h.md"]);
    let mut bob = HeldWriter::open(&m, "bob", "h.md").expect("bob opens h.md");
    bob.write("bob line").unwrap();
    let tmp = m.backing_path(".h.md.sync");
    std::fs::write(&tmp, "handed\n").unwrap();
    std::fs::rename(&tmp, m.backing_path("h.md")).unwrap();
    assert_eq!(bob.ask("close", SETTLE), coherent::Answer::Ok);
    drop(bob);
    // The RELEASE comes after the close returns: wait for what it logged (a `release`,
    // a `reclaim` when bob's process was gone by then, or the commit it must not make).
    let ended = wait_event(&m, SETTLE, |e| {
        ["release", "reclaim", "commit"].contains(&e["event"].as_str().unwrap_or(""))
            && e["path"] == "h.md"
            && e["session"] == "bob"
    });
    assert!(
        ended.is_some(),
        "bob's close never reached the volume: {:?}",
        events(&m)
    );
    let commits = events_of(&m, "commit", "h.md", Some("bob"));
    assert!(
        commits.is_empty(),
        "bob's close of the orphan counted: {commits:?}"
    );
    let r = live_record(&m, "h.md")
        .unwrap_or_else(|| panic!("bob's close ended the record: {:?}", record(&m, "h.md")));
    assert_eq!(r["giver"], "alice", "{r}");
    sh_refused(&m, "alice", "echo late >> h.md", "h.md", "fenced");
    assert_eq!(version(&m, "h.md"), Some(1));
    assert_eq!(
        std::fs::read_to_string(m.backing_path("h.md")).unwrap(),
        "handed\n"
    );
}

/// Closes `w` (held by `who`) and waits for the commit of `path` its RELEASE makes (the
/// RELEASE comes after the close returned).
fn close_committing(m: &Vol, mut w: HeldWriter, who: &str, path: &str) {
    let before = events_of(m, "commit", path, Some(who)).len();
    assert_eq!(w.ask("close", SETTLE), coherent::Answer::Ok);
    drop(w);
    let c = await_events(m, "commit", path, Some(who), before + 1);
    assert!(c.len() > before, "{who}'s close committed nothing");
}

/// A giver's write descriptor opened under another name and then renamed over the handed
/// path (an editor's save that keeps its descriptor) is in flight, even while another
/// session also holds the file open for writing (then the kernel's "open for writing"
/// cannot tell the two apart): the transfer is refused `handoff_in_flight` until the
/// giver closes it, and then acknowledged.
#[test]
fn a_givers_descriptor_under_another_name_is_in_flight_beside_another_writer() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "echo v1 > h.md && cp h.md side.md");
    let mut alice = HeldWriter::open(&m, "alice", "side.md").expect("alice opens side.md");
    sh_ok(&m, Some("alice"), "mv side.md h.md");
    let carol = HeldWriter::open(&m, "carol", "h.md").expect("carol opens h.md");
    let (code, v) = cli_json(&m, Some("alice"), &["transfer", "--to", "bob", "h.md"]);
    assert_eq!(
        (code, v["reason"].as_str()),
        (Some(2), Some("handoff_in_flight")),
        "{v}"
    );
    assert!(live_record(&m, "h.md").is_none());
    // Her descriptor writes h.md's file: nobody else's work is at stake yet.
    alice.write("alice through side.md").unwrap();
    // Its close commits what it wrote, as h.md's.
    close_committing(&m, alice, "alice", "h.md");
    sh_ok(&m, Some("alice"), "cat h.md >/dev/null");
    transfer(&m, "alice", "bob", &["h.md"]);
    drop(carol);
}

/// The other way round: a bystander's descriptor opened under another name and renamed
/// over the path reserves nothing. The volume knows it as its own handle on that file (by
/// its inode), so the kernel's "open for writing" is no unseen writer, and alice's transfer
/// is acknowledged; the bystander's later writes overtake it as any bystander's do.
#[test]
fn a_bystanders_descriptor_under_another_name_reserves_nothing() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(&m, Some("carol"), "echo v1 > h.md && cp h.md side.md");
    let mut carol = HeldWriter::open(&m, "carol", "side.md").expect("carol opens side.md");
    sh_ok(&m, Some("carol"), "mv side.md h.md");
    sh_ok(&m, Some("alice"), "cat h.md >/dev/null");
    transfer(&m, "alice", "bob", &["h.md"]);
    carol.write("carol through side.md").unwrap();
    close_committing(&m, carol, "carol", "h.md");
    let r = record(&m, "h.md").expect("the record");
    assert_eq!(
        (r["status"].as_str(), r["counterparty"].as_str()),
        (Some("overtaken"), Some("carol")),
        "{r}"
    );
}
