//! The fence across hosts when a host is paused or killed past its lease (issue 22, items
//! 1 and 2; docs/multi-host.md "The safety argument"): a descriptor the giver opened for
//! writing on host A before B's transfer was acknowledged must never write afterwards.
//!
//! Two hosts on one machine share one kernel: B's transfer would see A's descriptor through
//! the kernel (the backing file is open for writing: `handoff_in_flight`), which two
//! machines cannot. So each host here has its own copy of the workspace (as two machines
//! sharing a synced directory would), and the tests read A's copy to see whether A's
//! descriptor wrote.

#[path = "common/coherent.rs"]
mod coherent;
mod common;

use coherent::*;
use common::etcd::Etcd;
use common::hosts::Daemon;
use common::{wait_until, BIN, TIMEOUT};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The lease of both hosts (`--coordinator-ttl`).
const TTL: &str = "3s";
const FILE: &str = "h.md";
const ORIGINAL: &str = "original text\n";

/// One host: a daemon with its own workspace copy, mount point and state directory.
struct Host {
    backing: PathBuf,
    daemon: Daemon,
}

impl Host {
    fn start(base: &Path, name: &str, url: &str, passthrough: bool) -> Host {
        let (mnt, state, backing) = (
            base.join(format!("mnt-{name}")),
            base.join(format!("state-{name}")),
            base.join(format!("backing-{name}")),
        );
        for d in [&mnt, &state, &backing] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(backing.join(FILE), ORIGINAL).unwrap();
        let log = base.join(format!("daemon-{name}.log"));
        let mut cmd = Command::new(BIN);
        cmd.arg(&backing)
            .arg(&mnt)
            .arg("--state-dir")
            .arg(&state)
            .args(["--coordinator", url, "--host-id", name])
            .args(["--coordinator-ttl", TTL]);
        if !passthrough {
            cmd.arg("--no-passthrough");
        }
        Host {
            daemon: Daemon::spawn(cmd, &mnt, &log),
            backing,
        }
    }

    fn signal(&self, sig: i32) {
        self.daemon.signal(sig);
    }

    /// What A's copy of the file holds (read beside the mount, never through it).
    fn backing_text(&self) -> String {
        std::fs::read_to_string(self.backing.join(FILE)).unwrap()
    }

    fn log(&self) -> String {
        self.daemon.log()
    }

    /// `kill -9` the daemon; its mount is left dead (unmounted lazily, so descriptors
    /// opened through it stay open in their processes).
    fn kill9(&mut self) {
        self.daemon.kill9();
    }
}

impl Root for Host {
    fn root(&self) -> &Path {
        &self.daemon.mnt
    }
}

/// Hosts A and B, one etcd. Dropped in order: hosts, then etcd.
struct Pair {
    a: Host,
    b: Host,
    etcd: Etcd,
    _dir: tempfile::TempDir,
}

impl Pair {
    fn new(passthrough: bool) -> Pair {
        let etcd = Etcd::start(1);
        let dir = tempfile::Builder::new()
            .prefix("coherent-mhf-")
            .tempdir()
            .unwrap();
        let base = dir.path().canonicalize().unwrap();
        let a = Host::start(&base, "A", etcd.url(), passthrough);
        let b = Host::start(&base, "B", etcd.url(), passthrough);
        Pair {
            a,
            b,
            etcd,
            _dir: dir,
        }
    }
}

/// alice reads the file on B (a hold on its version there) and hands it to bob; the
/// answer comes only once A has applied it or A's lease has ended.
fn hand_on_from_b(p: &Pair) {
    touch_session(&p.b, "bob");
    sh_ok(&p.b, Some("alice"), &format!("cat {FILE} >/dev/null"));
    let r = transfer(&p.b, "alice", "bob", &[FILE]);
    assert_eq!(r["records"][0]["status"], "pending", "{r}");
}

/// Issue 22 item 1: A's daemon is stopped past its lease while alice holds the file open
/// for writing there; B's transfer waits A's lease out and is acknowledged; once A runs
/// again, the held descriptor's write is refused and nothing lands.
fn paused_host_refuses_the_held_descriptor(passthrough: bool) {
    let p = Pair::new(passthrough);
    // Known on both hosts before A stops (a claim needs etcd and A).
    touch_session(&p.a, "alice");
    let mut w = HeldWriter::open(&p.a, "alice", FILE).expect("alice opens the file for writing");
    p.a.signal(libc::SIGSTOP);
    // Acknowledged only once A's lease has ended in etcd: waiting it out is the point.
    hand_on_from_b(&p);
    p.a.signal(libc::SIGCONT);
    let r = w.write("alice writes after the handoff");
    assert_eq!(
        r,
        Err(libc::EACCES),
        "the held descriptor on A after B's acknowledged transfer (passthrough {passthrough})"
    );
    assert_eq!(p.a.backing_text(), ORIGINAL, "bytes landed on A");
    // Once A is back, its log says why, and a fresh open is fenced as usual.
    let denied = await_events(&p.a, "denied", FILE, Some("alice"), 1);
    assert_eq!(
        denied.first().map(|d| d["reason"].clone()),
        Some("coordinator_unavailable".into()),
        "A's log: {denied:?}\n{}",
        p.a.log()
    );
    let fenced = wait_until(TIMEOUT, || {
        sh(&p.a, Some("alice"), &format!("echo again >> {FILE}")).denied()
            && events_of(&p.a, "denied", FILE, Some("alice"))
                .last()
                .is_some_and(|d| d["reason"] == "fenced")
    });
    assert!(fenced, "a new open by the giver on A is not fenced");
    // Later writes through the old descriptor stay refused; its close commits nothing.
    assert_eq!(w.write("and again"), Err(libc::EACCES));
    drop(w);
    assert_eq!(p.a.backing_text(), ORIGINAL, "bytes landed on A");
    assert!(
        events_of(&p.a, "commit", FILE, Some("alice")).is_empty(),
        "a commit of alice on A"
    );
}

#[test]
fn a_paused_host_refuses_a_descriptor_held_across_the_handoff() {
    paused_host_refuses_the_held_descriptor(true);
}

#[test]
fn a_paused_host_refuses_a_descriptor_held_across_the_handoff_without_passthrough() {
    paused_host_refuses_the_held_descriptor(false);
}

/// Issue 22 item 2: A's daemon is killed while alice holds the file open for writing
/// there; B's transfer waits A's lease out and is acknowledged; alice's old descriptor
/// must not write (no passthrough on a multi-host volume: the kernel has no daemon to ask
/// and answers ENOTCONN).
#[test]
fn a_killed_host_leaves_no_descriptor_that_writes() {
    let mut p = Pair::new(true);
    touch_session(&p.a, "alice");
    let mut w = HeldWriter::open(&p.a, "alice", FILE).expect("alice opens the file for writing");
    p.a.kill9();
    hand_on_from_b(&p);
    let r = w.write("alice writes after the handoff");
    assert!(
        r.is_err(),
        "the held descriptor of a dead daemon wrote {r:?} bytes"
    );
    drop(w);
    assert_eq!(p.a.backing_text(), ORIGINAL, "bytes landed on A");
}

/// Is A's lease confirmed again (`coherent status`: `coordinator.confirmed`)?
fn confirmed(h: &Host) -> bool {
    let (_, v) = cli_json(h, None, &["status"]);
    v["status"]["coordinator"]["confirmed"] == true
}

/// The epoch half of the check: while A was paused past its lease, the file was handed on
/// and the successor's write ended the record (nothing fences alice any more). Back under
/// a new lease, A must still refuse the descriptor alice opened before: the file moved on
/// without A, and its write would land on the successor's work.
#[test]
fn a_descriptor_from_an_earlier_lease_cannot_write_over_the_successors_work() {
    let p = Pair::new(true);
    touch_session(&p.a, "alice");
    let mut w = HeldWriter::open(&p.a, "alice", FILE).expect("alice opens the file for writing");
    p.a.signal(libc::SIGSTOP);
    hand_on_from_b(&p);
    sh_ok(&p.b, Some("bob"), &format!("echo bob >> {FILE}"));
    p.a.signal(libc::SIGCONT);
    // A is back: a new lease, and the record's end taken in.
    let back = wait_until(TIMEOUT, || {
        confirmed(&p.a)
            && record(&p.a, FILE).is_some_and(|r| r["status"] == "completed" && r["live"] == false)
    });
    assert!(back, "A did not come back:\n{}", p.a.log());
    assert_eq!(
        w.write("alice writes over bob"),
        Err(libc::EACCES),
        "a descriptor from before A lost its lease"
    );
    assert_eq!(w.truncate(0), Err(libc::EACCES), "ftruncate through it");
    assert_eq!(p.a.backing_text(), ORIGINAL, "bytes landed on A");
    let denied = await_events(&p.a, "denied", FILE, Some("alice"), 1);
    assert_eq!(
        denied.last().map(|d| d["reason"].clone()),
        Some("coordinator_unavailable".into()),
        "{denied:?}"
    );
    let why = why(&p.a, Some("alice"));
    assert!(why.contains("open") && why.contains(FILE), "why: {why}");
}

/// The check refuses only what may have been handed on: a descriptor that lives across a
/// new lease of its host (etcd went away and came back) writes on when the path did not
/// change elsewhere meanwhile, its own commits included.
#[test]
fn a_descriptor_writes_on_across_a_new_lease_when_only_it_changed_the_file() {
    let p = Pair::new(true);
    touch_session(&p.a, "bob");
    sh_ok(&p.a, Some("alice"), &format!("cat {FILE} >/dev/null"));
    transfer(&p.a, "alice", "bob", &[FILE]);
    // The successor writes through one descriptor and commits (the path's epoch moves).
    let mut w = HeldWriter::open(&p.a, "bob", FILE).expect("bob opens the file for writing");
    assert!(w.write("bob 1").is_ok());
    w.flush();
    assert_eq!(
        record(&p.a, FILE).map(|r| r["status"].clone()),
        Some("completed".into())
    );
    // A new lease: the link breaks and is made again.
    p.etcd.stop();
    let down = wait_until(TIMEOUT, || {
        let (_, v) = cli_json(&p.a, None, &["status"]);
        v["status"]["coordinator"]["connected"] == false
    });
    assert!(down, "A still connected with etcd stopped");
    p.etcd.restart();
    assert!(
        wait_until(TIMEOUT, || confirmed(&p.a)),
        "A did not come back:\n{}",
        p.a.log()
    );
    assert_eq!(
        w.write("bob 2"),
        Ok(6),
        "bob's descriptor after A's new lease:\n{}",
        p.a.log()
    );
}

/// Issue 30 item 1: each host on its own copy, kept in step as a sync would (`cp
/// --preserve=all`: the same bytes and mtime, another inode and ctime). What hosts share
/// is the version and the content's fingerprint, never a stamp
/// (docs/multi-host.md#copies), so a read on the other copy is no change.
fn sync(from: &Host, to: &Host) {
    let st = Command::new("cp")
        .arg("--preserve=all")
        .arg(from.backing.join(FILE))
        .arg(to.backing.join(FILE))
        .status()
        .unwrap();
    assert!(st.success(), "cp --preserve=all");
}

/// The record of the file on host `h`: live and pending, no change counted there, and the
/// giver's append through `h` refused (`fenced`).
fn fenced_on(h: &Host, name: &str, giver: &str, successor: &str, v: u64) {
    let rec = live_record(h, FILE)
        .unwrap_or_else(|| panic!("{name}: the record ended: {:?}", record(h, FILE)));
    assert_eq!(rec["status"], "pending", "{name}: {rec}");
    assert_eq!(rec["version_at_transfer"], v, "{name}: {rec}");
    assert!(
        events_of(h, "external_change", FILE, None).is_empty(),
        "{name} counted a change behind its back:\n{}",
        h.log()
    );
    let before = events_of(h, "denied", FILE, Some(giver)).len();
    let r = sh(h, Some(giver), &format!("echo EVIL >> {FILE}"));
    assert!(r.denied(), "{giver} on {name}: {}", r.show());
    let d = await_events(h, "denied", FILE, Some(giver), before + 1);
    assert_eq!(d[before]["reason"], "fenced", "{name}: {}", d[before]);
    if let Some(bad) = check_deny_text(&why(h, Some(giver)), FILE, successor, v) {
        panic!("{name}: {bad}");
    }
}

#[test]
fn a_read_on_another_hosts_copy_never_ends_a_record() {
    let p = Pair::new(true);
    sync(&p.a, &p.b);
    touch_session(&p.b, "bob");
    sh_ok(&p.a, Some("alice"), &format!("cat {FILE} >/dev/null"));
    transfer(&p.a, "alice", "bob", &[FILE]);
    // Plain reads on B's copy (its own inode and ctime), by anyone, and a stat.
    assert_eq!(sh_ok(&p.b, None, &format!("cat {FILE}")), ORIGINAL);
    sh_ok(
        &p.b,
        Some("bob"),
        &format!("cat {FILE} >/dev/null; stat {FILE} >/dev/null"),
    );
    sh_ok(&p.a, None, &format!("cat {FILE} >/dev/null"));
    fenced_on(&p.b, "B", "alice", "bob", 1);
    fenced_on(&p.a, "A", "alice", "bob", 1);
    // The sync runs again (a new inode on B, same bytes), and a metadata-only change
    // on B's copy: still no change.
    sync(&p.a, &p.b);
    let b = p.b.backing.join(FILE).display().to_string();
    sh_ok(
        &p.b,
        None,
        &format!("touch -a {b}; chmod $(stat -c %a {b}) {b}"),
    );
    sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
    fenced_on(&p.b, "B", "alice", "bob", 1);
    fenced_on(&p.a, "A", "alice", "bob", 1);
    assert_eq!(p.a.backing_text(), ORIGINAL);
    assert!(
        p.b.log().contains("its content is the same"),
        "no restamp line in B's log:\n{}",
        p.b.log()
    );
}

#[test]
fn a_copy_that_lags_behind_is_behind_and_a_real_change_on_a_copy_ends_the_record() {
    let p = Pair::new(true);
    sync(&p.a, &p.b);
    touch_session(&p.b, "bob");
    sh_ok(&p.a, Some("alice"), &format!("cat {FILE} >/dev/null"));
    transfer(&p.a, "alice", "bob", &[FILE]);
    sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
    // The successor writes on A (v2) and hands it back to alice there; B's sync has not
    // brought v2 yet: B's copy holds v1's content, which is behind, not a change.
    sh_ok(
        &p.a,
        Some("bob"),
        &format!("cat {FILE} >/dev/null; echo bob >> {FILE}"),
    );
    transfer(&p.a, "bob", "alice", &[FILE]);
    assert_eq!(sh_ok(&p.b, Some("carol"), &format!("cat {FILE}")), ORIGINAL);
    fenced_on(&p.b, "B", "bob", "alice", 2);
    fenced_on(&p.a, "A", "bob", "alice", 2);
    assert!(
        p.b.log().contains("behind, not a change"),
        "no lag line in B's log:\n{}",
        p.b.log()
    );
    // The sync arrives: B's copy caught up, still no change.
    sync(&p.a, &p.b);
    assert_eq!(
        sh_ok(&p.b, None, &format!("cat {FILE}")),
        format!("{ORIGINAL}bob\n")
    );
    fenced_on(&p.b, "B", "bob", "alice", 2);
    // A real change of B's copy behind its volume (same size, other bytes, the mtime put
    // back): counted on B, and the record ends on both hosts.
    let b = p.b.backing.join(FILE).display().to_string();
    sh_ok(
        &p.b,
        None,
        &format!(
            "t=$(stat -c %y {b}); printf 'ORIGINAL TEXT\\nBOB\\n' > {b}; touch -m -d \"$t\" {b}"
        ),
    );
    sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
    let ev = await_events(&p.b, "external_change", FILE, None, 1);
    assert!(!ev.is_empty(), "B did not count the change:\n{}", p.b.log());
    for (name, h) in [("B", &p.b), ("A", &p.a)] {
        let ended = wait_until(TIMEOUT, || {
            record(h, FILE).is_some_and(|r| r["status"] == "overtaken" && r["live"] == false)
        });
        assert!(ended, "{name}: {:?}", record(h, FILE));
        assert_eq!(record(h, FILE).unwrap()["counterparty"], "external");
    }
}
