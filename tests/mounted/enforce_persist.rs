//! Ending holds and surviving restarts on a real mount: a killed session's write hold is
//! reclaimed (`reclaim`, not `release`, docs/design.md#holds); versions and live records survive a
//! clean stop (SIGTERM) and a crash (`kill -9`) of the daemon (docs/design.md#state-log).

use crate::coherent;
use crate::common;

use coherent::*;

fn on(e: &serde_json::Value, event: &str, path: &str, session: &str) -> bool {
    e["event"] == event && e["path"] == path && e["session"] == session
}

// Session names are host-wide (liveness looks at every process of a session), so the
// reclaim tests use names no other test process runs under.

#[test]
fn a_killed_sessions_write_hold_is_reclaimed() {
    let m = mount(true);
    let (dan, erin) = (unique("dan1"), unique("erin"));
    sh_ok(&m, Some("alice"), "echo a > f");
    let h = hold_open(&m, Some(&dan), "f", true).expect("dan opens f for write");
    assert!(
        wait_event(&m, SETTLE, |e| on(e, "acquire", "f", &dan)).is_some(),
        "no acquire event for dan"
    );
    h.kill9();
    let got = wait_event(&m, SETTLE, |e| on(e, "reclaim", "f", &dan));
    assert!(
        got.is_some(),
        "no reclaim event for dan within {SETTLE:?}; dan's events: {:?}; log:\n{}",
        events(&m)
            .iter()
            .filter(|e| e["session"] == dan.as_str())
            .collect::<Vec<_>>(),
        m.log()
    );
    assert!(
        events_of(&m, "release", "f", Some(&dan)).is_empty(),
        "a dead session's hold ended as a release"
    );
    assert_eq!(version(&m, "f"), Some(1), "nothing was written");

    // the other way round: a clean close is a release, never a reclaim
    let mut h = hold_open(&m, Some(&erin), "f", true).expect("erin opens f for write");
    h.close();
    assert!(
        wait_event(&m, SETTLE, |e| on(e, "release", "f", &erin)).is_some(),
        "no release event for erin"
    );
    h.exit();
    assert!(events_of(&m, "reclaim", "f", Some(&erin)).is_empty());
}

/// A process that closes its write descriptor itself and exits right after has released
/// the hold, it did not die holding it: `release`, even though the daemon sees the FUSE
/// RELEASE only after the process is gone.
#[test]
fn a_close_then_a_quick_exit_is_a_release() {
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo a > f");
    let mut wrong = Vec::new();
    for (i, cmd) in [
        ": >> f",
        "exec 3>>f; exec 3>&-",
        "python3 -S -c \"open('f','a').close()\"",
    ]
    .iter()
    .enumerate()
    {
        let who = unique(&format!("quick{i}"));
        sh_ok(&m, Some(&who), cmd);
        let e = wait_event(&m, SETTLE, |e| {
            (e["event"] == "release" || e["event"] == "reclaim") && e["session"] == who.as_str()
        });
        match e {
            Some(e) if e["event"] == "release" => {}
            other => wrong.push(format!("`{cmd}`: {other:?}")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_reclaim_waits_for_the_sessions_last_process() {
    let m = mount(true);
    let dan = unique("dan2");
    sh_ok(&m, Some("alice"), "echo a > f");
    // two processes of dan: the writer dies, but another process of the session lives on
    let keep = hold_open(&m, Some(&dan), "f", false).expect("dan reads f");
    let h = hold_open(&m, Some(&dan), "f", true).expect("dan opens f for write");
    assert!(wait_event(&m, SETTLE, |e| on(e, "acquire", "f", &dan)).is_some());
    h.kill9();
    // the write handle is gone but dan is alive: its hold ends as a release, not a reclaim
    // (the daemon sees the RELEASE asynchronously: wait for either event)
    let ended = wait_event(&m, SETTLE, |e| {
        (e["event"] == "release" || e["event"] == "reclaim") && e["path"] == "f"
    });
    let e = ended.expect("neither release nor reclaim after the writer died");
    assert_eq!(
        e["event"], "release",
        "dan still has a live process, yet its hold was reclaimed: {e}"
    );
    keep.exit();
}

/// Make a workspace with history: plan.md at v2 handed alice -> bob, other.md v1.
fn history(m: &Remount) {
    touch_session(m, "bob");
    sh_ok(
        m,
        Some("alice"),
        "echo 1 > plan.md && echo 2 >> plan.md && echo o > other.md",
    );
    transfer(m, "alice", "bob", &["plan.md"]);
    assert_eq!(version(m, "plan.md"), Some(2));
    sh_refused(m, "alice", "echo no >> plan.md", "plan.md", "fenced");
}

/// After a restart: same versions, the record live, the giver fenced, the successor free.
fn survived(m: &Remount) {
    assert_eq!(version(m, "plan.md"), Some(2), "versions after restart");
    assert_eq!(version(m, "other.md"), Some(1), "versions after restart");
    let st = status(m);
    let live = st["live"].as_array().cloned().unwrap_or_default();
    let r = live
        .iter()
        .find(|r| r["path"] == "plan.md")
        .unwrap_or_else(|| panic!("no live record after restart: {st}"));
    assert_eq!(
        (&r["giver"], &r["successor"], &r["version_at_transfer"]),
        (&"alice".into(), &"bob".into(), &2.into()),
        "{r}"
    );
    sh_refused(m, "alice", "echo no >> plan.md", "plan.md", "fenced");
    if let Some(e) = check_deny_text(&why(m, Some("alice")), "plan.md", "bob", 2) {
        panic!("{e}");
    }
    assert_eq!(std::fs::read_to_string(m.at("plan.md")).unwrap(), "1\n2\n");
    // other sessions write as before; versions go on from the stored ones
    sh_ok(m, Some("carol"), "echo c >> other.md");
    assert_eq!(version(m, "other.md"), Some(2));
}

fn restart_keeps_the_state(sig: i32) {
    let dir = tempfile::Builder::new()
        .prefix("coherent-persist-")
        .tempdir()
        .unwrap();
    let base = dir.path().canonicalize().unwrap();
    let mut m = Remount::start(&base, &[]);
    history(&m);
    m.stop_with(sig);
    drop(m);
    let m = Remount::start(&base, &[]);
    survived(&m);
    // after a restart nobody has a view: alice must read before handing on again
    let r = cli(&m, Some("alice"), &["withdraw", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    let (code, v) = cli_json(&m, Some("alice"), &["transfer", "--to", "bob", "other.md"]);
    assert_eq!(
        (code, v["reason"].as_str()),
        (Some(2), Some("handoff_not_held")),
        "{v}"
    );
    sh_ok(&m, Some("alice"), "cat other.md >/dev/null");
    transfer(&m, "alice", "bob", &["other.md"]);
    sh_ok(&m, Some("bob"), "echo b >> plan.md");
    assert_eq!(version(&m, "plan.md"), Some(3));
}

#[test]
fn a_clean_stop_keeps_versions_and_records() {
    restart_keeps_the_state(libc::SIGTERM);
}

#[test]
fn a_crash_keeps_versions_and_records() {
    restart_keeps_the_state(libc::SIGKILL);
}

#[test]
fn ended_records_and_the_log_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let mut m = Remount::start(&base, &[]);
    history(&m);
    sh_ok(&m, Some("bob"), "echo b >> plan.md");
    let before = events(&m);
    m.stop_with(libc::SIGTERM);
    drop(m);
    let m = Remount::start(&base, &[]);
    let st = status(&m);
    let ended = st["ended"].as_array().cloned().unwrap_or_default();
    assert!(
        ended
            .iter()
            .any(|r| r["path"] == "plan.md" && r["status"] == "completed"),
        "{st}"
    );
    assert_eq!(version(&m, "plan.md"), Some(3));
    // alice handed it on; she reads the successor's version before she writes again (a
    // late giver's write is refused while she has an older view)
    sh_ok(
        &m,
        Some("alice"),
        "cat plan.md >/dev/null && echo a >> plan.md",
    );
    // the log goes on: old events are still there, seq keeps growing
    await_events(&m, "commit", "plan.md", Some("alice"), 3);
    let after = events(&m);
    let last_before = before.last().unwrap()["seq"].as_u64().unwrap();
    assert!(after.iter().any(|e| e["seq"] == last_before));
    assert!(after.last().unwrap()["seq"].as_u64().unwrap() > last_before);
}

/// A write descriptor opened through the volume before its daemon was killed keeps
/// writing the backing file (FUSE passthrough holds it open in the kernel). After the
/// remount no transfer of that file is acknowledged while it is open (`handoff_in_flight`,
/// EBUSY on ctl), and one is once it is closed.
#[test]
fn a_descriptor_from_before_a_kill_9_keeps_a_transfer_in_flight() {
    let dir = tempfile::Builder::new()
        .prefix("coherent-stale-fd-")
        .tempdir()
        .unwrap();
    let base = dir.path().canonicalize().unwrap();
    let mut m = Remount::start(&base, &[]);
    // Logged when the daemon answers INIT, which may come after the mount is listed.
    assert!(
        common::wait_until(common::TIMEOUT, || m
            .log()
            .contains("data mode: passthrough")),
        "{}",
        m.log()
    );
    let alice = unique("alice-fd");
    sh_ok(&m, Some(&alice), "echo plan > plan.md");
    const PY: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
print('ready', flush=True)
for line in sys.stdin:
    try:
        n = os.write(fd, line.encode())
        print('wrote', n, flush=True)
    except OSError as e:
        print('errno', e.errno, flush=True)
"#;
    let mut holder = python()
        .arg("-c")
        .arg(PY)
        .arg(m.mnt.join("plan.md"))
        .env_remove("CLAUDE_CODE_SESSION_ID")
        .env("COHERENT_SESSION", &alice)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut input = holder.stdin.take().unwrap();
    let mut line = String::new();
    use std::io::{BufRead, Write};
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    m.stop_with(libc::SIGKILL);
    drop(m);
    let m = Remount::start(&base, &[]);
    assert!(cli(&m, Some("bob-fd"), &["register"]).ok());
    sh_ok(&m, Some(&alice), "cat plan.md >/dev/null");
    let (code, v) = cli_json(&m, Some(&alice), &["transfer", "--to", "bob-fd", "plan.md"]);
    assert_eq!(
        (code, v["reason"].as_str()),
        (Some(2), Some("handoff_in_flight")),
        "{v}"
    );
    assert!(v.to_string().contains("does not see"), "{v}");
    assert!(live_record(&m, "plan.md").is_none(), "no record was made");
    // The hazard is real: the old descriptor still writes the file.
    writeln!(input, "late").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "wrote 5");
    assert_eq!(
        std::fs::read_to_string(m.backing.join("plan.md")).unwrap(),
        "plan\nlate\n"
    );
    // Closed: the transfer goes through.
    drop(input);
    assert!(holder.wait().unwrap().success());
    sh_ok(&m, Some(&alice), "cat plan.md >/dev/null");
    transfer(&m, &alice, "bob-fd", &["plan.md"]);
    assert!(live_record(&m, "plan.md").is_some());
}

/// A giver that writes and hands on at once, the way agents do: the write handle's close
/// reaches the daemon, and the backing file is closed, a moment after the shell goes on.
/// The transfer waits for that close and is never taken for an unseen writer.
#[test]
fn write_then_transfer_at_once_is_never_an_unseen_writer() {
    let m = mount(true);
    let giver = unique("quick-giver");
    assert!(cli(&m, Some("quick-taker"), &["register"]).ok());
    for i in 0..60 {
        let r = sh(
            &m,
            Some(&giver),
            &format!(
                "echo {i} >> q.md && {CLI} transfer --to quick-taker q.md && {CLI} withdraw q.md"
            ),
        );
        assert!(r.ok(), "round {i}: {}", r.show());
    }
}

/// The kernel says the file is open for writing while a bystander holds it open through
/// the volume: that is a handle the volume sees, and it reserves nothing, so the giver's
/// transfer is acknowledged all the same.
#[test]
fn a_bystanders_open_write_handle_does_not_hold_up_a_transfer() {
    let m = mount(true);
    let (giver, by) = (unique("by-giver"), unique("by-stander"));
    assert!(cli(&m, Some("by-taker"), &["register"]).ok());
    sh_ok(&m, Some(&giver), "echo plan > b.md");
    let mut h = hold_open(&m, Some(&by), "b.md", true).expect("the bystander opens b.md");
    assert!(
        wait_event(&m, SETTLE, |e| e["event"] == "acquire"
            && e["session"] == by.as_str())
        .is_some(),
        "no acquire by the bystander"
    );
    let (code, v) = cli_json(&m, Some(&giver), &["transfer", "--to", "by-taker", "b.md"]);
    assert_eq!(code, Some(0), "{v}");
    h.close();
}
