//! Telling the writer (docs/design.md#handoff, docs/design.md#control-surface,
//! docs/design.md#state-log): `.coherent/why` shows the latest refusal or stale write with its time
//! and versions, and `no refusal` when there is none; a `denied` event and a verb's events are in
//! `.coherent/events` when the call returns (each read once, right after the call, in the same
//! shell: no retry loop).

use crate::coherent;
use crate::common;

use coherent::*;
use common::Mount;

/// `cmd`'s exit code and the lines of `.coherent/events` naming `event` on `path`, read
/// right after `cmd` returned by the same shell with its builtins (no fork in between).
fn count_after(m: &Vol, who: &str, cmd: &str, event: &str, path: &str) -> (i32, usize) {
    let script = format!(
        "{cmd}; rc=$?; n=0; while IFS= read -r l; do case $l in \
         *'\"event\":\"{event}\"'*'\"path\":\"{path}\"'*) n=$((n+1));; esac; \
         done < .coherent/events; echo $rc; echo $n"
    );
    let r = sh(m, Some(who), &script);
    assert!(r.ok(), "{script}: {}", r.show());
    let mut lines = r.out.lines();
    let rc = lines.next().unwrap_or("").trim().parse().unwrap();
    let n = lines.next().unwrap_or("0").trim().parse().unwrap();
    (rc, n)
}

#[test]
fn why_says_no_refusal_then_the_latest_one_with_its_time() {
    let m = mount(true);
    let fresh = why(&m, Some("alice"));
    assert!(fresh.starts_with("no refusal"), "{fresh:?}");
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    transfer(&m, "alice", "bob", &["plan.md"]);
    let r = sh(&m, Some("alice"), "echo more >> plan.md");
    assert!(r.denied(), "{}", r.show());
    let w = why(&m, Some("alice"));
    if let Some(e) = check_deny_text(&w, "plan.md", "bob", 1) {
        panic!("{e}");
    }
    let when = w
        .lines()
        .find_map(|l| l.strip_prefix("(at ").and_then(|l| l.strip_suffix(')')))
        .unwrap_or_else(|| panic!("no time in {w:?}"));
    assert!(
        chrono_like(when),
        "the time is not RFC 3339: {when:?} in {w:?}"
    );
    // A later refusal (a verb) replaces it.
    let (code, v) = cli_json(
        &m,
        Some("alice"),
        &["transfer", "--to", "nobody-here", "plan.md"],
    );
    assert_eq!(code, Some(2), "{v}");
    let w2 = why(&m, Some("alice"));
    assert!(
        !w2.contains("you handed plan.md"),
        "an old refusal stayed: {w2:?}"
    );
    assert!(w2.contains("nobody-here"), "{w2:?}");
    // Another session never refused still has none.
    assert!(why(&m, Some("bob")).starts_with("no refusal"));
}

/// `2026-12-01T03:43:16.551Z` and the like.
fn chrono_like(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && s.ends_with('Z')
}

#[test]
fn a_stale_writer_under_warn_is_told_with_both_versions() {
    let m = mount_with(Mount::builder().args(["--stale", "warn"]));
    sh_ok(&m, Some("alice"), "echo one > doc.md");
    sh_ok(&m, Some("bob"), "cat doc.md >/dev/null");
    sh_ok(&m, Some("alice"), "echo two > doc.md");
    assert_eq!(await_committed_version(&m, "doc.md", 2), Some(2));
    // bob saw v1; his write goes on, and he is told.
    sh_ok(&m, Some("bob"), "echo three >> doc.md");
    let w = why(&m, Some("bob"));
    assert!(
        w.contains("stale write") && w.contains("doc.md is at v2") && w.contains("last saw v1"),
        "{w:?}"
    );
    assert!(w.contains("(at "), "{w:?}");
    // The why text is set at the open; the event reaches the log with its group commit.
    assert_eq!(
        await_events(&m, "stale_write", "doc.md", Some("bob"), 1).len(),
        1
    );
}

#[test]
fn a_denied_event_is_in_the_log_when_the_call_returns() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    transfer(&m, "alice", "bob", &["plan.md"]);
    // The shell's own opens first (builtins: the read follows within microseconds).
    for (i, cmd) in [
        "printf x >> plan.md",
        "command : > plan.md",
        "printf y > plan.md",
        "mv plan.md gone.md",
        "rm plan.md",
        "truncate -s 0 plan.md",
    ]
    .iter()
    .enumerate()
    {
        let (rc, n) = count_after(
            &m,
            "alice",
            &format!("{cmd} 2>/dev/null"),
            "denied",
            "plan.md",
        );
        assert_ne!(rc, 0, "`{cmd}` was allowed");
        assert_eq!(
            n,
            i + 1,
            "after `{cmd}` returned the log held {n} denied event(s)"
        );
    }
}

#[test]
fn a_verbs_events_are_in_the_log_when_it_returns() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && cat plan.md > /dev/null",
    );
    // Retried only while the write handle is in flight; then read once.
    let v = transfer(&m, "alice", "bob", &["plan.md"]);
    assert_eq!(v["records"][0]["status"], "pending", "{v}");
    let (rc, n) = count_after(
        &m,
        "bob",
        &format!("{CLI} accept plan.md >/dev/null"),
        "accept",
        "plan.md",
    );
    assert_eq!(rc, 0);
    assert_eq!(
        n, 1,
        "the accept event was not in the log when the verb returned"
    );
}

#[test]
fn handoff_seen_is_in_the_log_when_the_successors_open_returns() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && cat plan.md > /dev/null",
    );
    transfer(&m, "alice", "bob", &["plan.md"]);
    // The shell's own open for read (a builtin redirection), then the log at once.
    let (rc, n) = count_after(
        &m,
        "bob",
        "exec 3< plan.md; exec 3<&-",
        "handoff_seen",
        "plan.md",
    );
    assert_eq!(rc, 0);
    assert_eq!(
        n, 1,
        "handoff_seen was not in the log when the open returned"
    );
}
