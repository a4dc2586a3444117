//! The kernel's FUSE request timeout never kills the mount (docs/install.md, docs/control.md,
//! docs/multi-host.md): on Linux 6.15+ a request unanswered past
//! `fs.fuse.default_request_timeout` aborts the whole connection. With it at 5 s, a
//! `coherent wait` of 20 s is asked again in steps the kernel lets through, and a verb
//! while etcd is stopped answers `coordinator_unavailable` in time; the mount answers
//! throughout and the daemon lives.
//!
//! The sysctl is global to the host, so every test that sets it is in this binary (with
//! `doctor`'s), one at a time (`common::fuse_sysctl_turn`), and it is set only while the test's mount is made: the connection
//! keeps the timeout it got at `FUSE_INIT`, and mounts of anything else on the host (tests
//! running alongside) are left as they were.

use crate::coherent;
use crate::common;

use coherent::*;
use common::etcd::Etcd;
use common::{is_mounted, wait_until, Builder, Mount};
use std::time::{Duration, Instant};

const DEFAULT_SYSCTL: &str = "/proc/sys/fs/fuse/default_request_timeout";

/// What the daemon may hold a request under a timeout of `secs` (half of it:
/// src/request_timeout.rs).
fn budget(secs: u32) -> Duration {
    Duration::from_millis(u64::from(secs) * 500)
}

/// A sysctl set for as long as this lives; the old value is written back on drop, also
/// when the test panics.
struct Sysctl {
    path: &'static str,
    old: String,
}

impl Sysctl {
    fn set(path: &'static str, value: u32) -> Sysctl {
        let old = std::fs::read_to_string(path).unwrap_or_else(|e| {
            panic!(
                "{path}: {e}. This test needs Linux 6.15+ (the FUSE request timeout) and \
                 root; it is what it is about, so it does not skip"
            )
        });
        std::fs::write(path, format!("{value}\n")).unwrap_or_else(|e| panic!("{path}: {e}"));
        Sysctl { path, old }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(self.path, &self.old) {
            eprintln!(
                "could not restore {} to {:?}: {e}; set it back by hand",
                self.path,
                self.old.trim()
            );
        }
    }
}

/// `b` mounted with a FUSE connection that got a `secs` request timeout: the sysctl is
/// set around the mount and put back once the mount has answered a request (so
/// `FUSE_INIT`, which fixes the connection's timeout, is done).
pub(crate) fn mount_under_timeout(secs: u32, b: Builder) -> Vol {
    let m = {
        let _set = Sysctl::set(DEFAULT_SYSCTL, secs);
        let m = mount_with(b);
        std::fs::metadata(m.path(".coherent/whoami")).expect("the new mount answers");
        m
    };
    let said = format!("the kernel aborts this mount if a request waits over {secs} s");
    assert!(
        m.log().contains(&said),
        "the daemon did not read the timeout at mount; log:\n{}",
        m.log()
    );
    m
}

/// The daemon runs (not exited, not a zombie) and the mount answers a stat and an
/// unattributed write.
pub(crate) fn assert_alive(m: &Vol) {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", m.pid())).unwrap_or_default();
    let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
    assert!(
        matches!(state, Some(s) if s != "Z" && s != "X"),
        "the daemon is gone ({stat:?}); log:\n{}",
        m.log()
    );
    assert!(is_mounted(&m.mnt), "not mounted any more");
    std::fs::metadata(m.path("p.md"))
        .unwrap_or_else(|e| panic!("stat through the mount: {e}; log:\n{}", m.log()));
    let w = sh(m, None, "echo alive >> free.txt");
    assert!(w.ok(), "a write through the mount: {}", w.show());
}

#[test]
fn a_wait_past_the_timeout_is_asked_again_and_the_mount_lives() {
    let _one = common::fuse_sysctl_turn();
    let m = mount_under_timeout(
        5,
        Mount::builder()
            .args(["--threads", "2"])
            .env("RUST_LOG", "debug"),
    );
    sh_ok(&m, Some("alice"), "echo draft > p.md");
    touch_session(&m, "bob");
    touch_session(&m, "carol");
    transfer(&m, "alice", "bob", &["p.md"]);

    let ((r, took), bystander) = std::thread::scope(|sc| {
        let waiter = sc.spawn(|| {
            let t = Instant::now();
            let r = cli(
                &m,
                Some("alice"),
                &["--json", "wait", "p.md", "--timeout", "20"],
            );
            (r, t.elapsed())
        });
        // Past the timeout and still waiting (asked a third time, or 15 s, whichever
        // comes first), a bystander writes and the mount answers.
        let asked = || m.log().matches("wait pending").count();
        wait_until(Duration::from_secs(15), || asked() >= 3);
        let w = sh(&m, Some("carol"), "echo mine >> notes.md");
        (waiter.join().unwrap(), w)
    });
    let asked = m.log().matches("wait pending").count();
    eprintln!("wait took {took:?}, asked {asked} times");
    assert!(
        bystander.ok(),
        "a bystander's write mid-wait: {}",
        bystander.show()
    );
    assert_alive(&m);

    // Timed out (exit 1) with the status of the record as it stands: the kernel never cut
    // the wait off.
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(r.err.contains("timed out after 20 s"), "{}", r.show());
    assert!(r.out.contains("\"pending\""), "{}", r.show());
    let rec = record(&m, "p.md").expect("the record");
    assert_eq!(
        (&rec["status"], &rec["live"]),
        (&"pending".into(), &true.into())
    );
    assert!(
        took >= Duration::from_secs(20) && took < Duration::from_secs(20) + budget(5) * 2,
        "the wait took {took:?}"
    );
    // No request held past the budget: 20 s in steps of at most 2.5 s.
    assert!(asked >= 8, "asked only {asked} times in {took:?}");
    assert_alive(&m);

    // The MCP `wait` tool asks again the same way, and times out as a tool result.
    let before = asked;
    let call = |id: &str, method: &str, params: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":"{id}","method":"{method}","params":{params}}}"#)
    };
    let lines = [
        call(
            "init",
            "initialize",
            r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}"#,
        ),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(),
        call(
            "w",
            "tools/call",
            r#"{"name":"wait","arguments":{"path":"p.md","timeout_s":8}}"#,
        ),
    ];
    // stdin stays open past the call's 8 s, so the server answers it.
    let script = format!(
        "{{ printf '%s\\n' '{}'; sleep 12; }} | {CLI} mcp",
        lines.join("' '")
    );
    let t = Instant::now();
    let out = sh(&m, Some("alice"), &script);
    let took = t.elapsed();
    let reply = out
        .out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["id"] == "w")
        .unwrap_or_else(|| panic!("no answer to the wait call: {}", out.show()));
    let text = reply["result"]["content"][0]["text"].as_str().unwrap_or("");
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    assert!(
        text.starts_with("timeout: p.md did not become ended within 8 s"),
        "{reply}"
    );
    let asked = m.log().matches("wait pending").count() - before;
    eprintln!("the MCP session ({took:?}, its stdin held open 12 s) asked {asked} times");
    assert!(asked >= 4, "the MCP wait asked only {asked} times in 8 s");
    assert_alive(&m);
}

/// Stops etcd member `k` now and lets it go on when dropped (also when the test panics).
struct Stopped<'a>(&'a Etcd, usize);

impl<'a> Stopped<'a> {
    fn new(e: &'a Etcd, k: usize) -> Self {
        e.signal_member(k, libc::SIGSTOP);
        Stopped(e, k)
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.signal_member(self.1, libc::SIGCONT);
    }
}

/// `coherent --json transfer --to bob FILE` as alice: exit code, reply, how long.
fn timed_transfer(m: &impl Root, file: &str) -> (Option<i32>, serde_json::Value, Duration) {
    let t = Instant::now();
    let (code, v) = cli_json(m, Some("alice"), &["transfer", "--to", "bob", file]);
    (code, v, t.elapsed())
}

#[test]
fn a_verb_while_etcd_is_stopped_answers_in_time_and_the_mount_lives() {
    let _one = common::fuse_sysctl_turn();
    let etcd = Etcd::start(1);
    // 3 s: its budget (1.5 s) is well under the 3 s a step gave etcd before.
    let m = mount_under_timeout(
        3,
        Mount::builder().args(["--coordinator", etcd.url(), "--host-id", "A"]),
    );
    let files: Vec<String> = (0..40).map(|i| format!("f{i}.md")).collect();
    sh_ok(
        &m,
        Some("alice"),
        &format!(
            "echo draft > p.md; for f in {}; do echo x > $f; done",
            files.join(" ")
        ),
    );
    touch_session(&m, "bob");
    transfer(&m, "alice", "bob", &["p.md"]);

    let stopped = Stopped::new(&etcd, 1);
    let since = Instant::now();
    // Stopped for longer than the timeout (and than one 15 s round of the kernel's
    // check): each verb answers in time, the first ones after the last answer etcd gave,
    // later ones with the link known down. One at a time: writes of `ctl` queue on its
    // inode lock in the kernel, before they are FUSE requests.
    let mut n = 0;
    while since.elapsed() < Duration::from_secs(20) {
        let (code, v, took) = timed_transfer(&m, &files[n % files.len()]);
        n += 1;
        assert_eq!(code, Some(2), "{v}");
        assert_eq!(v["reason"], "coordinator_unavailable", "{v}");
        assert!(
            took < budget(3) + Duration::from_secs(1),
            "verb {n} took {took:?} with etcd stopped: {v}"
        );
        assert_alive(&m);
        // Pace the verbs across the outage (its length is the point, not an event).
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("{n} verbs while etcd was stopped for {:?}", since.elapsed());
    drop(stopped);

    // etcd is back: the same volume agrees again.
    let mut last = (None, serde_json::Value::Null);
    let back = wait_until(Duration::from_secs(30), || {
        last = cli_json(&m, Some("alice"), &["transfer", "--to", "bob", "f0.md"]);
        last.0 == Some(0)
    });
    assert!(
        back,
        "no transfer after etcd came back: {last:?}; log:\n{}",
        m.log()
    );
    assert_alive(&m);
}

#[test]
fn a_transfer_waiting_for_a_stopped_host_answers_in_time_and_the_mount_lives() {
    let _one = common::fuse_sysctl_turn();
    let etcd = Etcd::start(1);
    let host = |id: &str| {
        [
            "--coordinator",
            etcd.url(),
            "--host-id",
            id,
            "--coordinator-ttl",
            "30",
        ]
        .map(str::to_string)
    };
    // Host A under the timeout; host B over the same backing directory, stopped below
    // for less than its 30 s lease: A's transfer waits for B to apply it (docs/multi-host.md).
    let a = mount_under_timeout(5, Mount::builder().args(host("A")));
    let dir = tempfile::tempdir().unwrap();
    let (bmnt, bstate) = (dir.path().join("mnt-b"), dir.path().join("state-b"));
    std::fs::create_dir(&bmnt).unwrap();
    let mut cmd = std::process::Command::new(common::BIN);
    cmd.arg(&a.backing)
        .arg(&bmnt)
        .arg("--state-dir")
        .arg(&bstate)
        .args(host("B"));
    let b = common::hosts::Daemon::spawn(cmd, &bmnt, &dir.path().join("daemon-b.log"));
    sh_ok(&a, Some("alice"), "echo draft > p.md");
    touch_session(&a, "bob");

    b.signal(libc::SIGSTOP);
    let since = Instant::now();
    // Not acknowledged while B may not have applied it: each request is answered in time,
    // recorded (`pending`) but refused, and so is the same transfer sent again.
    for round in 0..2 {
        let t = Instant::now();
        let (errno, v) = ctl(&a, Some("alice"), "transfer --to bob p.md");
        let took = t.elapsed();
        assert_eq!(errno, libc::EIO, "round {round}: {v}");
        assert_eq!(v["reason"], "coordinator_unavailable", "round {round}: {v}");
        assert_eq!(v["status"], "pending", "round {round}: {v}");
        assert!(
            v["message"]
                .as_str()
                .is_some_and(|t| t.contains("host(s) B")),
            "round {round}: {v}"
        );
        assert!(
            took < budget(5) + Duration::from_secs(1),
            "round {round}: the transfer took {took:?}: {v}"
        );
        assert_alive(&a);
    }
    // `coherent transfer` sends it again until B confirms it: B stays stopped past the
    // timeout (and a 15 s round of the kernel's check), then runs again.
    let ((code, v), done, resumed) = std::thread::scope(|sc| {
        let cli = sc.spawn(|| {
            let r = cli_json(&a, Some("alice"), &["transfer", "--to", "bob", "p.md"]);
            (r, Instant::now())
        });
        while since.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(500));
            assert_alive(&a);
        }
        b.signal(libc::SIGCONT);
        let resumed = Instant::now();
        let (r, done) = cli.join().unwrap();
        (r, done, resumed)
    });
    eprintln!(
        "coherent transfer acknowledged {:?} after B ran again",
        done.saturating_duration_since(resumed)
    );
    assert_eq!(code, Some(0), "{v}; log:\n{}", a.log());
    assert_eq!(v["records"][0]["live"], true, "{v}");
    assert!(done >= resumed, "acknowledged while B was stopped: {v}");
    assert_alive(&a);
}
