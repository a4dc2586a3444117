//! The fence across hosts when a host is paused or killed past its lease (issue 22, items
//! 1 and 2; docs/multi-host.md "The safety argument"): a descriptor the giver opened for
//! writing on host A before B's transfer was acknowledged must never write afterwards.
//!
//! Two hosts on one machine share one kernel: B's transfer would see A's descriptor through
//! the kernel (the backing file is open for writing: `handoff_in_flight`), which two
//! machines cannot. So each host here has its own copy of the workspace (as two machines
//! sharing a synced directory would), and the tests read A's copy to see whether A's
//! descriptor wrote.

use crate::coherent;
use crate::common;

use coherent::*;
use common::clock::ClockShim;
use common::etcd::Etcd;
use common::hosts::Daemon;
use common::netns::Net;
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

/// How a host is started beyond the defaults.
#[derive(Default)]
struct Opts<'a> {
    /// Run in this namespace (its link to etcd can be cut).
    net: Option<(&'a Net, usize)>,
    env: Vec<(String, String)>,
    args: Vec<&'a str>,
}

impl Host {
    fn start(base: &Path, name: &str, url: &str, passthrough: bool) -> Host {
        Host::start_with(base, name, url, passthrough, Opts::default())
    }

    fn start_with(base: &Path, name: &str, url: &str, passthrough: bool, o: Opts) -> Host {
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
        let mut cmd = match o.net {
            Some((net, k)) => net.command(k, BIN),
            None => Command::new(BIN),
        };
        cmd.envs(o.env).args(o.args);
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

/// Hosts A and B, one etcd. Dropped in order: hosts, etcd, namespaces.
struct Pair {
    a: Host,
    b: Host,
    etcd: Etcd,
    _net: Option<Net>,
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
            _net: None,
            _dir: dir,
        }
    }

    /// [`Pair::new`] with each host in a network namespace of its own, reaching etcd over
    /// its own link, as two machines would.
    fn apart() -> Pair {
        let net = Net::new(&["a", "b"]);
        let etcd = Etcd::start_listening(1, &net.etcd_ip);
        let url = etcd.url_via(&net.etcd_ip);
        let dir = tempfile::Builder::new()
            .prefix("coherent-mhf-")
            .tempdir()
            .unwrap();
        let base = dir.path().canonicalize().unwrap();
        let start = |name: &str, k: usize| {
            let o = Opts {
                net: Some((&net, k)),
                ..Opts::default()
            };
            Host::start_with(&base, name, &url, true, o)
        };
        let (a, b) = (start("A", 0), start("B", 1));
        Pair {
            a,
            b,
            etcd,
            _net: Some(net),
            _dir: dir,
        }
    }
}

/// alice reads the file on B (a hold on its version there) and hands it to bob; the
/// answer comes only once A has applied it or A's lease has ended.
fn hand_on_from_b(p: &Pair) {
    hand_on_from(&p.b);
}

/// [`hand_on_from_b`] from host `b`.
fn hand_on_from(b: &Host) {
    touch_session(b, "bob");
    sh_ok(b, Some("alice"), &format!("cat {FILE} >/dev/null"));
    let r = transfer(b, "alice", "bob", &[FILE]);
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

/// The same with alice's descriptor opened under another name and renamed over the file
/// (an editor's save that keeps its descriptor): at each write the check follows the
/// file to the name it has now, so back under a new lease the write is refused as one
/// opened under the handed name is (checked against the old name alone, it landed).
#[test]
fn a_paused_host_refuses_a_descriptor_renamed_over_the_handed_file() {
    let p = Pair::new(true);
    touch_session(&p.a, "alice");
    sh_ok(&p.a, Some("alice"), &format!("cp {FILE} side.md"));
    let mut w = HeldWriter::open(&p.a, "alice", "side.md").expect("alice opens side.md");
    sh_ok(&p.a, Some("alice"), &format!("mv side.md {FILE}"));
    p.a.signal(libc::SIGSTOP);
    hand_on_from_b(&p);
    p.a.signal(libc::SIGCONT);
    // A is back under a new lease, the record taken in: now only the name decides.
    let back = wait_until(TIMEOUT, || {
        confirmed(&p.a) && live_record(&p.a, FILE).is_some()
    });
    assert!(back, "A did not come back:\n{}", p.a.log());
    assert_eq!(
        w.write("alice writes after the handoff"),
        Err(libc::EACCES),
        "the renamed descriptor on A after B's acknowledged transfer"
    );
    assert_eq!(w.write("and again"), Err(libc::EACCES));
    drop(w);
    assert_eq!(p.a.backing_text(), ORIGINAL, "bytes landed on A");
    assert!(
        events_of(&p.a, "commit", FILE, Some("alice"))
            .iter()
            .all(|c| c["op"] == "rename"),
        "a commit of alice's writes on A"
    );
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

/// Issue 30 item 2: host A's machine sleeps (its monotonic clock stops, etcd's does not)
/// while alice holds the file open for writing there; B's transfer waits A's lease out and
/// is acknowledged; A wakes with its link to etcd still down. A must not count the lease
/// it had as still running for the time it slept: every write through the held
/// descriptor is refused (`coordinator_unavailable`) from the moment A runs again, all
/// the while the link stays down, and nothing lands in A's copy.
#[test]
fn a_host_waking_from_suspend_refuses_the_held_descriptor() {
    let net = Net::new(&["a"]);
    let etcd = Etcd::start_listening(1, &net.etcd_ip);
    let dir = tempfile::Builder::new()
        .prefix("coherent-mhf-")
        .tempdir()
        .unwrap();
    let base = dir.path().canonicalize().unwrap();
    let mut shim = ClockShim::build(&base);
    let a = Host::start_with(
        &base,
        "A",
        &etcd.url_via(&net.etcd_ip),
        false,
        Opts {
            net: Some((&net, 0)),
            env: shim.env(),
            ..Opts::default()
        },
    );
    let b = Host::start(&base, "B", etcd.url(), false);
    touch_session(&a, "alice");
    let mut w = HeldWriter::open(&a, "alice", FILE).expect("alice opens the file for writing");
    // A sleeps through B's acknowledged transfer (which waits A's lease out), and wakes
    // with its link down: as a laptop opened on another network.
    shim.suspend(a.daemon.pid(), || {
        hand_on_from(&b);
        net.cut(0);
    });
    // Every write of the held descriptor while the link stays down (the issue's run
    // admitted 25 over 6 s).
    let end = std::time::Instant::now() + std::time::Duration::from_secs(6);
    let mut n = 0;
    while std::time::Instant::now() < end {
        let r = w.write(&format!("alice writes after the handoff {n}"));
        assert_eq!(
            r,
            Err(libc::EACCES),
            "write {n} of the held descriptor after A woke ({:?} since)\n{}",
            end.elapsed(),
            a.log()
        );
        n += 1;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(a.backing_text(), ORIGINAL, "bytes landed on A");
    net.heal(0);
    let denied = await_events(&a, "denied", FILE, Some("alice"), 1);
    assert_eq!(
        denied.first().map(|d| d["reason"].clone()),
        Some("coordinator_unavailable".into()),
        "A's log: {denied:?}\n{}",
        a.log()
    );
    // Back: a fresh open by the giver is fenced, the old descriptor stays refused.
    let fenced = wait_until(TIMEOUT, || {
        sh(&a, Some("alice"), &format!("echo again >> {FILE}")).denied()
            && events_of(&a, "denied", FILE, Some("alice"))
                .last()
                .is_some_and(|d| d["reason"] == "fenced")
    });
    assert!(fenced, "a new open by the giver on A is not fenced");
    assert_eq!(w.write("and again"), Err(libc::EACCES));
    drop(w);
    assert_eq!(a.backing_text(), ORIGINAL, "bytes landed on A");
}

/// Issue 30 item 3: a path's epoch never repeats. While A was stopped past its lease, the
/// file was handed on from B, the successor's write ended the record and B evicted it
/// (`--evict-after 1s`): the path has no key again, as before the transfer. Back under a
/// new lease, A must still refuse the descriptor alice opened before all of it.
#[test]
fn a_descriptor_from_before_an_evicted_record_cannot_write() {
    let dir = tempfile::Builder::new()
        .prefix("coherent-mhf-")
        .tempdir()
        .unwrap();
    let base = dir.path().canonicalize().unwrap();
    let etcd = Etcd::start(1);
    let evict = || Opts {
        args: vec!["--evict-after", "1s"],
        ..Opts::default()
    };
    let a = Host::start_with(&base, "A", etcd.url(), true, evict());
    let b = Host::start_with(&base, "B", etcd.url(), true, evict());
    touch_session(&a, "alice");
    let mut w = HeldWriter::open(&a, "alice", FILE).expect("alice opens the file for writing");
    a.signal(libc::SIGSTOP);
    hand_on_from(&b);
    sh_ok(&b, Some("bob"), &format!("echo bob >> {FILE}"));
    let evicted = await_events(&b, "evict", FILE, None, 1);
    assert_eq!(evicted.len(), 1, "B evicts the ended record:\n{}", b.log());
    a.signal(libc::SIGCONT);
    // A is back under a new lease and has taken the eviction in.
    let back = wait_until(TIMEOUT, || confirmed(&a) && records(&a, FILE).is_empty());
    assert!(back, "A did not come back:\n{}", a.log());
    assert_eq!(
        w.write("alice writes over bob"),
        Err(libc::EACCES),
        "a descriptor from before the record was made, ended and evicted"
    );
    assert_eq!(a.backing_text(), ORIGINAL, "bytes landed on A");
    let denied = await_events(&a, "denied", FILE, Some("alice"), 1);
    assert_eq!(
        denied.last().map(|d| d["reason"].clone()),
        Some("coordinator_unavailable".into()),
        "{denied:?}"
    );
}

/// Issue 30 item 3: eviction is not one host's wall clock. A's clock is two days ahead;
/// with `--evict-after 1h`, an ended record made on B an instant ago is not evicted by A
/// (nor anywhere): A would have at its next maintenance round (every 5 s), which this
/// test waits out twice.
#[test]
fn a_host_with_its_clock_ahead_evicts_nobodys_records() {
    let dir = tempfile::Builder::new()
        .prefix("coherent-mhf-")
        .tempdir()
        .unwrap();
    let base = dir.path().canonicalize().unwrap();
    let etcd = Etcd::start(1);
    let shim = ClockShim::build(&base);
    shim.shift_wall_clock(2 * 24 * 3600);
    let a = Host::start_with(
        &base,
        "A",
        etcd.url(),
        true,
        Opts {
            env: shim.env(),
            args: vec!["--evict-after", "1h"],
            ..Opts::default()
        },
    );
    let b = Host::start_with(
        &base,
        "B",
        etcd.url(),
        true,
        Opts {
            args: vec!["--evict-after", "1h"],
            ..Opts::default()
        },
    );
    hand_on_from(&b);
    verb_ok(&b, "alice", &["withdraw", FILE]);
    let seen = wait_until(TIMEOUT, || {
        record(&a, FILE).is_some_and(|r| r["status"] == "withdrawn")
    });
    assert!(seen, "A took the ended record in:\n{}", a.log());
    // Two of A's maintenance rounds: on the wall clock alone A would evict at the first.
    std::thread::sleep(std::time::Duration::from_secs(11));
    for h in [&a, &b] {
        assert!(
            events_of(h, "evict", FILE, None).is_empty(),
            "an evict in {}'s log:\n{}",
            h.daemon.mnt.display(),
            a.log()
        );
        assert_eq!(
            record(h, FILE).map(|r| r["status"].clone()),
            Some("withdrawn".into()),
            "the ended record on {}",
            h.daemon.mnt.display()
        );
    }
}

/// What one try to map the file came to, in a python child: `ok` or the errno's name,
/// for `open_flags`/`mmap` arguments given as python expressions.
const MAP_TRY: &str = r#"
import errno, mmap, os, sys
fd = os.open(sys.argv[1], eval(sys.argv[2]))
try:
    m = mmap.mmap(fd, 0, flags=eval(sys.argv[3]), prot=eval(sys.argv[4]))
    if eval(sys.argv[4]) & mmap.PROT_WRITE:
        m[0:1] = b"M"
        m.flush()
    m.close()
    print("ok")
except OSError as e:
    print(errno.errorcode[e.errno])
"#;

fn map_try(h: &Host, who: Option<&str>, open: &str, flags: &str, prot: &str) -> String {
    let cmd = format!(
        "python3 -c '{}' {FILE} '{open}' '{flags}' '{prot}'",
        MAP_TRY.replace('\'', "\"")
    );
    let r = sh(h, who, &cmd);
    assert!(r.ok(), "{cmd}: {}", r.show());
    r.out.trim().to_string()
}

/// Issue 30 item 4: a shared writable mapping's dirty pages are written back through
/// whichever writable handle of the file the kernel picks, so a giver's pages could land
/// as another session's write. On a multi-host volume an agent's write handle of a tracked
/// file is opened without page cache (`FOPEN_DIRECT_IO`), and the kernel refuses to map
/// it shared (`ENODEV`); private mappings, read-only shared ones and plain writes work,
/// and unattributed processes (never givers) map as before.
#[test]
fn an_agent_cannot_map_a_tracked_file_shared_and_writable_on_a_multi_host_volume() {
    let dir = tempfile::Builder::new()
        .prefix("coherent-mhf-")
        .tempdir()
        .unwrap();
    let base = dir.path().canonicalize().unwrap();
    let etcd = Etcd::start(1);
    let a = Host::start(&base, "A", etcd.url(), true);
    let (rdwr, rdonly) = ("os.O_RDWR", "os.O_RDONLY");
    let (shared, private) = ("mmap.MAP_SHARED", "mmap.MAP_PRIVATE");
    let (rw, r) = ("mmap.PROT_READ|mmap.PROT_WRITE", "mmap.PROT_READ");
    assert_eq!(
        map_try(&a, Some("alice"), rdwr, shared, rw),
        "ENODEV",
        "alice's shared writable mapping"
    );
    assert_eq!(a.backing_text(), ORIGINAL, "bytes landed on A");
    assert_eq!(
        map_try(&a, Some("alice"), rdwr, private, rw),
        "ok",
        "a private one"
    );
    assert_eq!(
        map_try(&a, Some("alice"), rdonly, shared, r),
        "ok",
        "read-only"
    );
    assert_eq!(
        a.backing_text(),
        ORIGINAL,
        "a private mapping wrote through"
    );
    // Plain writes through such a handle work, and a descriptor that read the file before
    // (its pages cached) reads what they wrote.
    let coherent_read = r#"
import os
r = os.open("h.md", os.O_RDONLY)
os.read(r, 100)
w = os.open("h.md", os.O_WRONLY)
os.pwrite(w, b"NEW", 0)
print(os.pread(r, 3, 0).decode())
os.close(w)
"#;
    let out = sh_ok(
        &a,
        Some("alice"),
        &format!("python3 -c '{}'", coherent_read.replace('\'', "\"")),
    );
    assert_eq!(out.trim(), "NEW", "a read after the direct write");
    assert!(
        a.backing_text().starts_with("NEWginal"),
        "{}",
        a.backing_text()
    );
    assert_eq!(
        map_try(&a, None, rdwr, shared, rw),
        "ok",
        "an unattributed process"
    );
    assert!(
        a.backing_text().starts_with("MEW"),
        "its mapping wrote back"
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
    // The content is judged off the request threads: the line follows the read.
    assert!(
        wait_until(TIMEOUT, || p.b.log().contains("its content is the same")),
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
    // B's copy as it was is simply not caught up (its stamp is the one it had). A sync
    // that runs again from a copy still at v1 gives it a new stamp with v1's bytes: judged
    // by content, behind.
    let v1 = p.b.backing.join(".v1");
    std::fs::write(&v1, ORIGINAL).unwrap();
    std::fs::rename(&v1, p.b.backing.join(FILE)).unwrap();
    assert_eq!(sh_ok(&p.b, Some("carol"), &format!("cat {FILE}")), ORIGINAL);
    fenced_on(&p.b, "B", "bob", "alice", 2);
    assert!(
        wait_until(TIMEOUT, || p.b.log().contains("behind, not a change")),
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

#[test]
fn a_copy_put_back_to_a_handed_versions_bytes_is_a_change_not_a_lag() {
    let p = Pair::apart();
    sync(&p.a, &p.b);
    touch_session(&p.b, "bob");
    sh_ok(&p.a, Some("alice"), &format!("cat {FILE} >/dev/null"));
    transfer(&p.a, "alice", "bob", &[FILE]);
    sh_ok(
        &p.a,
        Some("bob"),
        &format!("cat {FILE} >/dev/null; echo bob >> {FILE}"),
    );
    transfer(&p.a, "bob", "alice", &[FILE]);
    // B's copy catches up with v2 and says so.
    sync(&p.a, &p.b);
    sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
    assert!(
        wait_until(TIMEOUT, || p.b.log().contains("its content is the same")),
        "B did not judge its copy caught up:\n{}",
        p.b.log()
    );
    fenced_on(&p.b, "B", "bob", "alice", 2);
    // v1's bytes put back on B (a revert, or a sync from a copy that lags): bob's v2 is
    // erased there, which is a change, not a copy behind.
    std::fs::write(p.b.backing.join(FILE), ORIGINAL).unwrap();
    sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
    let ev = await_events(&p.b, "external_change", FILE, None, 1);
    assert!(!ev.is_empty(), "B did not count the revert:\n{}", p.b.log());
    assert!(!p.b.log().contains("behind, not a change"), "{}", p.b.log());
    for (name, h) in [("B", &p.b), ("A", &p.a)] {
        let ended = wait_until(TIMEOUT, || {
            record(h, FILE).is_some_and(|r| r["status"] == "overtaken" && r["live"] == false)
        });
        assert!(ended, "{name}: {:?}", record(h, FILE));
        assert_eq!(record(h, FILE).unwrap()["counterparty"], "external");
    }
}

/// Host `h`'s record of `name`: live and pending, no change counted there, alice's append
/// through `h` refused `fenced`.
fn alice_fenced_on(h: &Host, host: &str, name: &str) {
    let rec = live_record(h, name)
        .unwrap_or_else(|| panic!("{host}: the record of {name} ended: {:?}", record(h, name)));
    assert_eq!(rec["status"], "pending", "{host}: {rec}");
    assert!(
        events_of(h, "external_change", name, None).is_empty(),
        "{host} counted a change of {name} behind its back:\n{}",
        h.log()
    );
    let before = events_of(h, "denied", name, Some("alice")).len();
    let r = sh(h, Some("alice"), &format!("echo EVIL >> {name}"));
    assert!(r.denied(), "alice on {host}, {name}: {}", r.show());
    let d = await_events(h, "denied", name, Some("alice"), before + 1);
    assert_eq!(d[before]["reason"], "fenced", "{host}: {}", d[before]);
}

/// Issue 39 item 1, the first handoff after an edit: alice edits two files through B and
/// hands them to bob there, before the sync reaches A. Neither of A's copies holds a
/// version any host fingerprinted (the edit was the first version with a record). A
/// looked at one of them before the edit (its stamp is of the older version) and never at
/// the other: both are copies that lag, and no read on A ends either record. Once the sync
/// arrives they are caught up; a real change on A's copy after that ends the record.
#[test]
fn the_first_handoff_after_an_edit_survives_a_read_of_a_copy_that_lags() {
    let p = Pair::apart();
    touch_session(&p.b, "bob");
    const SEEN: &str = FILE;
    const UNSEEN: &str = "g.md";
    for h in [&p.a, &p.b] {
        std::fs::write(h.backing.join(UNSEEN), ORIGINAL).unwrap();
    }
    sh_ok(&p.a, None, &format!("cat {SEEN} >/dev/null"));
    sh_ok(
        &p.b,
        Some("alice"),
        &format!("echo edited >> {SEEN}; echo edited >> {UNSEEN}; cat {SEEN} {UNSEEN} >/dev/null"),
    );
    transfer(&p.b, "alice", "bob", &[SEEN, UNSEEN]);
    for name in [SEEN, UNSEEN] {
        assert!(
            wait_until(TIMEOUT, || live_record(&p.a, name).is_some()),
            "A never learned of {name}'s transfer"
        );
    }
    // Reads on A of its lagging copies, by anyone, a listing and a stat.
    sh_ok(
        &p.a,
        None,
        &format!("ls -l; cat {SEEN} {UNSEEN} >/dev/null"),
    );
    assert_eq!(sh_ok(&p.a, Some("bob"), &format!("cat {UNSEEN}")), ORIGINAL);
    sh_ok(
        &p.a,
        Some("carol"),
        &format!("stat {SEEN} {UNSEEN} >/dev/null"),
    );
    for name in [SEEN, UNSEEN] {
        alice_fenced_on(&p.a, "A", name);
        alice_fenced_on(&p.b, "B", name);
    }
    // The sync arrives (B's bytes in a new file renamed over A's): caught up, no change.
    for name in [SEEN, UNSEEN] {
        let tmp = p.a.backing.join(format!(".{name}.sync"));
        std::fs::copy(p.b.backing.join(name), &tmp).unwrap();
        std::fs::rename(&tmp, p.a.backing.join(name)).unwrap();
        assert_eq!(
            sh_ok(&p.a, None, &format!("cat {name}")),
            format!("{ORIGINAL}edited\n")
        );
        alice_fenced_on(&p.a, "A", name);
    }
    // A real change of A's copy behind its volume now ends the record on both hosts.
    std::fs::write(p.a.backing.join(UNSEEN), "rewritten behind A's back\n").unwrap();
    sh_ok(&p.a, None, &format!("cat {UNSEEN} >/dev/null"));
    await_events(&p.a, "external_change", UNSEEN, None, 1);
    for h in [&p.a, &p.b] {
        assert!(
            wait_until(TIMEOUT, || record(h, UNSEEN)
                .is_some_and(|r| r["status"] == "overtaken" && r["live"] == false)),
            "{:?}",
            record(h, UNSEEN)
        );
    }
}

/// A transfer from host `h` that another host refuses: its copy holds a version the
/// giver never saw. The answer is `handoff_not_held` naming that host, and no record
/// stays live anywhere.
fn transfer_not_held(h: &Host, giver: &str, to: &str, over: &str, others: &[&Host]) {
    let (code, v) = cli_json(h, Some(giver), &["transfer", "--to", to, FILE]);
    assert_eq!(code, Some(2), "{v}");
    assert_eq!(v["reason"], "handoff_not_held", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("host {over}")),
        "{v}"
    );
    for o in others.iter().chain([&h]) {
        assert!(
            wait_until(TIMEOUT, || live_record(*o, FILE).is_none()),
            "a record stayed live: {:?}",
            record(*o, FILE)
        );
    }
}

/// Issue 39 item 2: alice commits through A (a file never handed on: the commit is A's
/// alone), and before the sync carries it to B she reads B's older copy there and hands
/// it on. She never saw her own newer version from B: as one host refuses a giver whose
/// view is not the current version, the transfer is refused (`handoff_not_held`, naming
/// A) and undone. A's commit stays alice's, never a change behind A's back, and is the
/// version after the one B handed (counted again once B's state met it).
#[test]
fn a_transfer_over_another_hosts_unsynced_commit_is_not_held_and_the_commit_stays_its_own() {
    let p = Pair::apart();
    touch_session(&p.b, "bob");
    sh_ok(&p.a, Some("alice"), &format!("echo 'alice on A' >> {FILE}"));
    sh_ok(&p.b, Some("alice"), &format!("cat {FILE} >/dev/null"));
    transfer_not_held(&p.b, "alice", "bob", "A", &[&p.a]);
    let ours: Vec<_> = events_of(&p.a, "external_change", FILE, None)
        .into_iter()
        .filter(|e| e["host"] == "A")
        .collect();
    assert!(
        ours.is_empty(),
        "A counted its own commit as a change: {ours:?}"
    );
    let commits = events_of(&p.a, "commit", FILE, Some("alice"));
    assert!(
        commits
            .iter()
            .all(|c| c["host"] == "A" && c["version"] == 2),
        "{commits:?}"
    );
    let w = await_events(&p.a, "withdraw", FILE, Some("alice"), 1);
    assert_eq!(w[0]["reason"], "handoff_not_held", "{}", w[0]);
    // Nothing is fenced: alice's next write lands on A, and B's copy is untouched.
    for _ in 0..3 {
        sh_ok(
            &p.a,
            None,
            &format!("cat {FILE} >/dev/null; ls -l >/dev/null"),
        );
    }
    sh_ok(
        &p.a,
        Some("alice"),
        &format!("echo 'alice again' >> {FILE}"),
    );
    assert_eq!(
        p.a.backing_text(),
        format!("{ORIGINAL}alice on A\nalice again\n")
    );
    assert_eq!(
        std::fs::read_to_string(p.b.backing.join(FILE)).unwrap(),
        ORIGINAL
    );
}

/// The race a seeded lag run found (issue 39): two hosts count the same version of a
/// file, each its own content (alice's commit through A; a change found on B's copy),
/// and carol hands B's on from B. A's copy holds a version carol never saw: her transfer
/// is refused `handoff_not_held`, and A counts its copy again as the version after B's,
/// alice's. Once a sync brings alice's bytes to B, carol reads them there and hands them
/// on: acknowledged, and fenced on both hosts (A's copy holds what she handed).
#[test]
fn two_hosts_that_counted_one_version_apart_hand_neither_on_as_the_newest() {
    let p = Pair::apart();
    touch_session(&p.b, "bob");
    // Both hosts look at v1 first.
    sh_ok(&p.a, None, &format!("cat {FILE} >/dev/null"));
    sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
    sh_ok(&p.a, Some("alice"), &format!("echo 'alice on A' >> {FILE}"));
    std::fs::write(p.b.backing.join(FILE), "changed on B's copy\n").unwrap();
    sh_ok(&p.b, Some("carol"), &format!("cat {FILE} >/dev/null"));
    await_events(&p.b, "external_change", FILE, None, 1);
    assert_eq!(version(&p.a, FILE), Some(2));
    assert_eq!(version(&p.b, FILE), Some(2));
    transfer_not_held(&p.b, "carol", "bob", "A", &[&p.a]);
    let a = await_events(&p.a, "commit", FILE, Some("alice"), 2);
    assert_eq!(a[1]["version"], 3, "A counted alice's copy again: {}", a[1]);
    assert!(
        events_of(&p.a, "external_change", FILE, None)
            .iter()
            .all(|e| e["host"] != "A"),
        "A counted its own copy as a change behind its back"
    );
    sync(&p.a, &p.b);
    sh_ok(&p.b, Some("carol"), &format!("cat {FILE} >/dev/null"));
    let rec = transfer(&p.b, "carol", "bob", &[FILE]);
    let v = rec["records"][0]["version_at_transfer"].as_u64().unwrap();
    for (h, name) in [(&p.a, "A"), (&p.b, "B")] {
        assert!(
            wait_until(TIMEOUT, || live_record(h, FILE).is_some()),
            "{name} never took in the transfer"
        );
        sh_ok(h, None, &format!("cat {FILE} >/dev/null"));
        let rec = live_record(h, FILE)
            .unwrap_or_else(|| panic!("{name}: the record ended: {:?}", record(h, FILE)));
        assert_eq!(rec["version_at_transfer"], v, "{name}: {rec}");
        let before = events_of(h, "denied", FILE, Some("carol")).len();
        let r = sh(h, Some("carol"), &format!("echo EVIL >> {FILE}"));
        assert!(r.denied(), "carol on {name}: {}", r.show());
        let d = await_events(h, "denied", FILE, Some("carol"), before + 1);
        assert_eq!(d[before]["reason"], "fenced", "{name}: {}", d[before]);
    }
}

/// Issue 39, a copy that reaches a version between: bob writes v2 and v3 through B and
/// hands the file back to alice at v3 (no transfer was made at v2). A's copy, still at v1,
/// gets v2's bytes from a sync: it lags (A took v2's fingerprint in as it was published),
/// and bob stays fenced on both hosts; v3's bytes then are the copy caught up.
#[test]
fn a_copy_that_reaches_a_version_between_two_transfers_lags() {
    let p = Pair::apart();
    touch_session(&p.b, "bob");
    sh_ok(&p.a, Some("alice"), &format!("cat {FILE} >/dev/null"));
    transfer(&p.a, "alice", "bob", &[FILE]);
    let snapshots = p.b.backing.join(".v");
    std::fs::create_dir(&snapshots).unwrap();
    for v in [2u64, 3] {
        sh_ok(&p.b, Some("bob"), &format!("echo 'bob v{v}' >> {FILE}"));
        std::fs::copy(p.b.backing.join(FILE), snapshots.join(format!("v{v}"))).unwrap();
        assert!(
            wait_until(TIMEOUT, || version(&p.a, FILE) == Some(v)),
            "A never took in v{v}"
        );
    }
    sh_ok(&p.b, Some("bob"), &format!("cat {FILE} >/dev/null"));
    transfer(&p.b, "bob", "alice", &[FILE]);
    assert!(wait_until(TIMEOUT, || live_record(&p.a, FILE).is_some()));
    for v in [2u64, 3] {
        let tmp = p.a.backing.join(format!(".{FILE}.sync"));
        std::fs::copy(snapshots.join(format!("v{v}")), &tmp).unwrap();
        std::fs::rename(&tmp, p.a.backing.join(FILE)).unwrap();
        sh_ok(&p.a, None, &format!("cat {FILE} >/dev/null"));
        let rec = live_record(&p.a, FILE)
            .unwrap_or_else(|| panic!("v{v} on A ended the record: {:?}", record(&p.a, FILE)));
        assert_eq!(rec["giver"], "bob", "{rec}");
        let ours: Vec<_> = events_of(&p.a, "external_change", FILE, None)
            .into_iter()
            .filter(|e| e["host"] == "A")
            .collect();
        assert!(
            ours.is_empty(),
            "A counted v{v}'s bytes as a change: {ours:?}"
        );
        let r = sh(&p.a, Some("bob"), &format!("echo EVIL >> {FILE}"));
        assert!(r.denied(), "bob on A with v{v}'s bytes: {}", r.show());
    }
}

/// A copy this host already looked at, which a sync then brings to a version another host
/// made before the file's first transfer: A's history names those versions, and A
/// publishes their fingerprints with the transfer, so on B they are behind (a lag), not a
/// change that would end the live record.
#[test]
fn a_copy_that_reaches_a_version_made_before_the_first_transfer_lags() {
    let p = Pair::apart();
    touch_session(&p.b, "bob");
    // B has looked at its copy (the original bytes) before anything happened on A.
    sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
    // alice edits twice through A; the file has never been handed on.
    let snapshots = p.a.backing.join(".v");
    std::fs::create_dir(&snapshots).unwrap();
    for n in [1, 2] {
        sh_ok(
            &p.a,
            Some("alice"),
            &format!("echo 'alice edit {n}' >> {FILE}"),
        );
        std::fs::copy(p.a.backing.join(FILE), snapshots.join(format!("e{n}"))).unwrap();
    }
    transfer(&p.a, "alice", "bob", &[FILE]);
    assert!(wait_until(TIMEOUT, || live_record(&p.b, FILE).is_some()));
    // B looks again (its copy still the original: unchanged), then the sync brings it
    // alice's first edit, then her second (the version handed on), each by replace.
    sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
    for n in [1, 2] {
        let tmp = p.b.backing.join(format!(".{FILE}.sync"));
        std::fs::copy(snapshots.join(format!("e{n}")), &tmp).unwrap();
        std::fs::rename(&tmp, p.b.backing.join(FILE)).unwrap();
        sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
        let rec = live_record(&p.b, FILE)
            .unwrap_or_else(|| panic!("edit {n} on B ended the record: {:?}", record(&p.b, FILE)));
        assert_eq!(rec["giver"], "alice", "{rec}");
        let ours: Vec<_> = events_of(&p.b, "external_change", FILE, None)
            .into_iter()
            .filter(|e| e["host"] == "B")
            .collect();
        assert!(ours.is_empty(), "B counted edit {n} as a change: {ours:?}");
        let r = sh(&p.b, Some("alice"), &format!("echo EVIL >> {FILE}"));
        assert!(r.denied(), "alice on B with edit {n}'s bytes: {}", r.show());
    }
}

/// Issue 39 item 5 across hosts: B's copy reaches A by a sync that replaces the file (a
/// temporary file renamed over it, as rsync does), and the successor appends through A's
/// mount right after it (no wait, and half a second: within the kernel's entry cache
/// time). The append lands in the file the name now denotes, never in the orphan; the
/// giver stays fenced on A throughout.
#[test]
fn a_write_right_after_a_sync_replaced_the_file_lands_in_the_new_file() {
    let p = Pair::apart();
    touch_session(&p.b, "bob");
    // Each copy looked at through its mount (the kernel caches the name's entry).
    sh_ok(&p.b, None, &format!("cat {FILE} >/dev/null"));
    sh_ok(&p.a, Some("alice"), &format!("cat {FILE} >/dev/null"));
    transfer(&p.a, "alice", "bob", &[FILE]);
    assert!(wait_until(TIMEOUT, || live_record(&p.b, FILE).is_some()));
    // A sync tool runs after the commit it carries has reached the other host through
    // the coordinator (milliseconds; a sync takes longer). Before that, the bytes it brings
    // are no version known there (docs/multi-host.md#copies).
    let replace = |from: &Host, to: &Host| {
        let v = version(from, FILE);
        assert!(
            wait_until(TIMEOUT, || version(to, FILE) == v),
            "the other host never learned of v{v:?}"
        );
        let tmp = to.backing.join(format!(".{FILE}.sync"));
        std::fs::copy(from.backing.join(FILE), &tmp).unwrap();
        std::fs::rename(&tmp, to.backing.join(FILE)).unwrap();
    };
    let mut want = ORIGINAL.to_string();
    for (round, delay_ms) in [0u64, 500, 0, 500].into_iter().enumerate() {
        // bob writes on B; the sync carries B's copy to A by replace.
        let line = format!("bob on B {round}");
        sh_ok(&p.b, Some("bob"), &format!("echo '{line}' >> {FILE}"));
        want.push_str(&format!("{line}\n"));
        sh_ok(&p.a, None, &format!("cat {FILE} >/dev/null"));
        replace(&p.b, &p.a);
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let line = format!("bob on A {round}");
        sh_ok(&p.a, Some("bob"), &format!("echo '{line}' >> {FILE}"));
        want.push_str(&format!("{line}\n"));
        assert_eq!(
            p.a.backing_text(),
            want,
            "round {round} ({delay_ms} ms after the replace): bob's append through A went to \
             the orphaned file"
        );
        replace(&p.a, &p.b);
        assert_eq!(sh_ok(&p.b, None, &format!("cat {FILE}")), want);
    }
    // bob committed on both hosts; alice, whose transfer bob's first write completed,
    // was never fenced by a record that ended early: nothing counted as external.
    for (name, h) in [("B", &p.b), ("A", &p.a)] {
        let ev: Vec<_> = events_of(h, "external_change", FILE, None)
            .into_iter()
            .filter(|e| e["host"] == name)
            .collect();
        assert!(
            ev.is_empty(),
            "{name} counted a change behind its back: {ev:?}\nevents: {}\n{}",
            events(h)
                .iter()
                .map(|e| format!(
                    "{} {} {} v{}",
                    e["host"], e["event"], e["session"], e["version"]
                ))
                .collect::<Vec<_>>()
                .join("; "),
            h.log()
        );
    }
}

/// Issue 39 item 4: alice holds a write descriptor on A of a file the engine does not
/// know as hers (opened under an untracked name, then moved to the handed name; or a
/// tracked file renamed to it; or mapped shared and writable while untracked). A transfer
/// of that file on B is in flight on A: undone and refused `handoff_in_flight`, as one
/// host refuses it, and nothing of alice's lands after an acknowledgement. Once the
/// descriptor is closed, the transfer is acknowledged.
#[test]
fn a_descriptor_held_under_another_name_keeps_a_transfer_on_the_other_host_in_flight() {
    let p = Pair::apart();
    touch_session(&p.b, "bob");
    sh_ok(&p.a, None, "mkdir ign && echo 'ign/' > .coherentignore");
    // The third way in: a shared writable mapping made while the file was untracked, its
    // descriptor closed (the mapping keeps the file open).
    for (opened_as, name, mapped) in [
        ("ign/u.md", "t.md", false),
        ("x.md", "t2.md", false),
        ("ign/m.md", "t3.md", true),
    ] {
        let setup = format!("echo draft > {opened_as}");
        sh_ok(&p.a, Some("alice"), &setup);
        let mut w = HeldWriter::open(&p.a, "alice", opened_as).expect("alice opens for writing");
        if mapped {
            assert_eq!(w.call("map"), Ok(0), "alice maps {opened_as}");
            assert_eq!(w.call("closefd"), Ok(0));
        }
        sh_ok(&p.a, Some("alice"), &format!("mv {opened_as} {name}"));
        std::fs::copy(p.a.backing.join(name), p.b.backing.join(name)).unwrap();
        sh_ok(&p.b, Some("alice"), &format!("cat {name} >/dev/null"));
        let (code, r) = cli_json(&p.b, Some("alice"), &["transfer", "--to", "bob", name]);
        assert_ne!(
            code,
            Some(0),
            "{opened_as}: the transfer was acknowledged: {r}"
        );
        assert_eq!(r["reason"], "handoff_in_flight", "{opened_as}: {r}");
        assert!(
            r["message"]
                .as_str()
                .is_some_and(|m| m.contains("open for writing on another host")),
            "{r}"
        );
        for h in [&p.a, &p.b] {
            assert!(
                wait_until(TIMEOUT, || live_record(h, name).is_none()),
                "{opened_as}: a live record of {name}: {:?}",
                live_record(h, name)
            );
        }
        // The descriptor was never fenced: no handoff happened.
        if mapped {
            assert_eq!(w.call("unmap"), Ok(0));
        } else {
            assert!(w.write("alice's line").is_ok());
        }
        drop(w);
        // Once B's copy holds what alice's descriptor wrote on A, she may hand it on from
        // B (before that, A's copy holds a version she never saw there: not held).
        sh_ok(&p.a, None, &format!("cat {name} >/dev/null"));
        std::fs::copy(p.a.backing.join(name), p.b.backing.join(name)).unwrap();
        sh_ok(&p.b, Some("alice"), &format!("cat {name} >/dev/null"));
        let r = transfer(&p.b, "alice", "bob", &[name]);
        assert_eq!(r["records"][0]["status"], "pending", "{opened_as}: {r}");
    }
}

/// Where an `O_APPEND` file's data lands on a multi-host volume, where the daemon serves
/// every read and write: an agent's appends through its direct-I/O write handles (no
/// shared mapping there: see above), and an unattributed process's mapped page of an
/// `O_APPEND` file (page cache, written back through the daemon), each as natively
/// (tests/data/append_probe.py, as tests/volume/data_path.rs runs it on one host).
#[test]
fn appends_and_mappings_land_as_natively_on_a_multi_host_volume() {
    const PROBE: &str = include_str!("../data/append_probe.py");
    let dir = tempfile::Builder::new()
        .prefix("coherent-mhf-")
        .tempdir()
        .unwrap();
    let base = dir.path().canonicalize().unwrap();
    std::fs::write(base.join("probe.py"), PROBE).unwrap();
    let probe = base.join("probe.py");
    let run = |d: &Path, behind: &Path, nomap: bool| {
        let mut c = Command::new("python3");
        c.arg(&probe).arg(d).arg(behind);
        if nomap {
            c.arg("nomap");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let native = base.join("native");
    std::fs::create_dir_all(native.join("m")).unwrap();
    std::fs::create_dir_all(native.join("n")).unwrap();
    let (want, want_nomap) = (
        run(&native.join("m"), &native.join("m"), false),
        run(&native.join("n"), &native.join("n"), true),
    );
    assert!(want.starts_with("mapped X123456789\n"), "{want}");
    let etcd = Etcd::start(1);
    let a = Host::start(&base, "A", etcd.url(), true);
    assert!(
        a.log().contains("a multi-host volume checks every write"),
        "{}",
        a.log()
    );
    for d in ["u", "alice"] {
        std::fs::create_dir(a.backing.join(d)).unwrap();
    }
    let cmd = |d: &str, nomap: bool| {
        format!(
            "python3 {} {} {}{}",
            probe.display(),
            a.at(d).display(),
            a.backing.join(d).display(),
            if nomap { " nomap" } else { "" }
        )
    };
    let got = sh(&a, None, &cmd("u", false));
    assert!(got.ok(), "{}\n{}", got.show(), a.log());
    assert_eq!(got.out, want, "unattributed; log:\n{}", a.log());
    let got = sh(&a, Some("alice"), &cmd("alice", true));
    assert!(got.ok(), "{}\n{}", got.show(), a.log());
    assert_eq!(got.out, want_nomap, "alice; log:\n{}", a.log());
}
