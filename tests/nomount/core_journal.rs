//! The journal: durability, snapshots, recovery from cut logs and corrupt snapshots, the
//! directory lock.

use crate::core_common;
use coherent::coherence::*;
use coherent::journal::*;
use core_common::*;
use proptest::prelude::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Opens the journal in `dir`. A journal of this process just closed there may still be
/// locked for an instant: another test's child process holds a copy of the lock's
/// descriptor between its fork and exec (seen once in a full run).
fn open(dir: &Path) -> Opened {
    open_with(dir, JournalOptions::default())
}

/// [`open`] with these options.
fn open_with(dir: &Path, opts: JournalOptions) -> Opened {
    let end = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match Journal::open(dir, Config::default(), opts.clone()) {
            Ok(o) => return o,
            Err(JournalError::Locked { pid: Some(p), .. })
                if p == std::process::id() && std::time::Instant::now() < end =>
            {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Drives a varied history into `e`: commits, transfers, accepts, declines, overtaken,
/// renames, tombstones, evictions.
fn history(e: &Engine, rounds: usize) {
    let names = ["alice", "bob", "carol", "dave"];
    let ss: Vec<_> = names.iter().map(|n| sess(n)).collect();
    let t = std::cell::Cell::new(T0);
    let tick = || {
        t.set(t.get() + 1000);
        Timestamp(t.get())
    };
    for s in &ss {
        e.register(s, tick()).unwrap();
    }
    for i in 0..rounds {
        let p = format!("dir{}/f{}.md", i % 3, i % 5);
        let (a, b, c) = (&ss[i % 4], &ss[(i + 1) % 4], &ss[(i + 2) % 4]);
        let _ = e.acquire(a, &p, tick());
        e.commit(a, &p, CommitOp::Write, stamp(i as u64), tick());
        e.close_write(a, &p, true, tick());
        e.open_read(a, &p, tick());
        let _ = e.transfer(
            a,
            std::slice::from_ref(&p),
            &b.name,
            Some(format!("note {i}")),
            tick(),
        );
        match i % 5 {
            0 => {
                let _ = e.accept(b, std::slice::from_ref(&p), tick());
            }
            1 => {
                let _ = e.decline(b, std::slice::from_ref(&p), tick());
            }
            2 => {
                let _ = e.acquire(c, &p, tick());
                e.close_write(c, &p, false, tick());
            }
            3 => {
                let _ = e.withdraw(a, std::slice::from_ref(&p), tick());
                e.commit(a, &p, CommitOp::Unlink, None, tick());
            }
            _ => {
                e.rename(c, &p, &format!("{p}.moved"), false, stamp(7), tick());
            }
        }
        if i % 7 == 6 {
            e.evict(Timestamp(t.get() + 48 * 3600 * 1000));
        }
        if i % 11 == 10 {
            e.rename(
                b,
                &format!("dir{}", i % 3),
                &format!("dir{}x", i % 3),
                true,
                None,
                tick(),
            );
            e.rename(
                b,
                &format!("dir{}x", i % 3),
                &format!("dir{}", i % 3),
                true,
                None,
                tick(),
            );
        }
    }
}

#[test]
fn state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let o = open(dir.path());
        assert!(o.warnings.is_empty());
        history(&o.engine, 40);
        o.engine.durable_state()
    };
    assert!(before.seq > 100);
    assert!(!before.records.is_empty());
    let o = open(dir.path());
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert_eq!(o.engine.durable_state(), before);
    // Numbering continues.
    let s = sess("erin");
    o.engine.session_seen(&s, Timestamp(T0));
    assert_eq!(o.engine.last_seq(), before.seq + 1);
}

#[test]
fn a_verb_is_durable_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let opts = JournalOptions {
        flush_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let o = Journal::open(dir.path(), Config::default(), opts).unwrap();
    let (a, b) = (sess("alice"), sess("bob"));
    o.engine.register(&b, Timestamp(T0)).unwrap();
    o.engine
        .commit(&a, "p", CommitOp::Write, stamp(1), Timestamp(T0));
    o.engine.open_read(&a, "p", Timestamp(T0));
    o.engine
        .transfer(&a, &paths(&["p"]), "bob", None, Timestamp(T0))
        .unwrap();
    // Without waiting for the (hour-long) flush interval, the transfer is in the file.
    let log = std::fs::read_to_string(dir.path().join(LOG)).unwrap();
    let last: Event = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last.event, EventKind::Transfer);
    assert_eq!(o.journal.durable_seq(), last.seq);
    // A commit alone is not waited for; flush makes it durable.
    o.engine
        .commit(&b, "q", CommitOp::Write, stamp(2), Timestamp(T0));
    o.journal.flush().unwrap();
    assert_eq!(o.journal.durable_seq(), o.engine.last_seq());
    // The follower view of the log.
    let all = o.journal.read_log(0, 1 << 20).unwrap();
    assert_eq!(all.len() as u64, o.journal.log_len());
    assert!(o
        .journal
        .read_log(o.journal.log_len(), 100)
        .unwrap()
        .is_empty());
    let tail = o.journal.read_log(o.journal.log_len() - 10, 100).unwrap();
    assert!(tail.ends_with(b"\n"));
}

#[test]
fn group_commit_flushes_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let o = open(dir.path());
    let a = sess("alice");
    for i in 0..100 {
        o.engine.commit(
            &a,
            &format!("f{i}"),
            CommitOp::Write,
            stamp(i),
            Timestamp(T0),
        );
    }
    let all_durable = |what: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while o.journal.durable_seq() < o.engine.last_seq() {
            assert!(
                std::time::Instant::now() < deadline,
                "flusher never flushed {what}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    all_durable("the burst");
    // With everything on disk the flusher sleeps until an append: each later event must
    // wake it (no verb waits for these).
    for i in 0..3 {
        o.engine
            .commit(&a, "late", CommitOp::Write, stamp(1000 + i), Timestamp(T0));
        all_durable("an event appended while it was idle");
    }
}

#[test]
fn the_state_directory_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let o = open(dir.path());
    match Journal::open(dir.path(), Config::default(), JournalOptions::default()) {
        Err(e @ JournalError::Locked { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("pid {}", std::process::id())),
                "{msg}"
            );
        }
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("two journals share one directory"),
    }
    drop(o);
    open(dir.path());
}

#[test]
fn snapshot_plus_tail_rebuilds_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let opts = JournalOptions {
        snapshot_every: 50,
        ..Default::default()
    };
    let before = {
        let o = Journal::open(dir.path(), Config::default(), opts.clone()).unwrap();
        history(&o.engine, 20);
        o.journal.maintain(&o.engine, Timestamp(T0)).unwrap();
        assert!(dir.path().join(SNAPSHOT).exists());
        history(&o.engine, 15);
        o.engine.durable_state()
    };
    let o = Journal::open(dir.path(), Config::default(), opts).unwrap();
    assert!(o.from_snapshot);
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert!(o.replayed > 0 && o.replayed < before.seq);
    assert_eq!(o.engine.durable_state(), before);
}

#[test]
fn a_corrupt_snapshot_falls_back_to_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let o = open(dir.path());
        history(&o.engine, 20);
        o.journal.checkpoint(&o.engine).unwrap();
        history(&o.engine, 5);
        o.engine.durable_state()
    };
    let snap = dir.path().join(SNAPSHOT);
    let mut bytes = std::fs::read(&snap).unwrap();
    // Flip one digit inside the body: still valid JSON, wrong checksum.
    let i = bytes.iter().rposition(|b| b.is_ascii_digit()).unwrap();
    bytes[i] = if bytes[i] == b'1' { b'2' } else { b'1' };
    std::fs::write(&snap, &bytes).unwrap();
    let o = open(dir.path());
    assert!(!o.from_snapshot);
    assert!(
        o.warnings.iter().any(|w| w.contains("unusable")),
        "{:?}",
        o.warnings
    );
    assert_eq!(o.engine.durable_state(), before);
    drop(o);
    std::fs::write(&snap, b"garbage").unwrap();
    let o = open(dir.path());
    assert!(!o.from_snapshot);
    assert_eq!(o.engine.durable_state(), before);
}

/// The state the complete lines of `log[..cut]` rebuild, computed without the journal.
fn prefix_state(log: &[u8], cut: usize) -> DurableState {
    let e = Engine::new(Config::default(), Arc::new(MemorySink::discarding()));
    let end = log[..cut]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    for line in log[..end].split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        e.replay(&serde_json::from_slice::<Event>(line).unwrap());
    }
    e.durable_state()
}

fn cut_and_check(src: &Path, log: &[u8], cut: usize, with_snapshot: bool) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(LOG), &log[..cut]).unwrap();
    if with_snapshot {
        std::fs::copy(src.join(SNAPSHOT), dir.path().join(SNAPSHOT)).unwrap();
    }
    let at_boundary = cut == 0 || log[cut - 1] == b'\n';
    let expected = prefix_state(log, cut);
    let got = {
        let o = open(dir.path());
        assert_eq!(
            o.warnings.iter().any(|w| w.contains("cut in the middle")),
            !at_boundary,
            "cut {cut}: {:?}",
            o.warnings
        );
        let st = o.engine.durable_state();
        assert_eq!(st, expected, "cut at {cut}");
        // Appending after recovery continues a clean log.
        o.engine.session_seen(&sess("zed"), Timestamp(T0));
        o.engine.durable_state()
    };
    let o = open(dir.path());
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert_eq!(o.engine.durable_state(), got);
    if !at_boundary {
        assert!(std::fs::read_dir(dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("events.log.damaged-")));
    }
}

fn recorded_history() -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    {
        let o = open(dir.path());
        history(&o.engine, 12);
        o.journal.checkpoint(&o.engine).unwrap();
        history(&o.engine, 6);
    }
    let log = std::fs::read(dir.path().join(LOG)).unwrap();
    (dir, log)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_log_cut_anywhere_recovers_its_complete_prefix(frac in 0.0f64..=1.0, snap in any::<bool>()) {
        thread_local! {
            static HIST: (tempfile::TempDir, Vec<u8>) = recorded_history();
        }
        HIST.with(|(dir, log)| {
            let cut = ((log.len() as f64) * frac) as usize;
            cut_and_check(dir.path(), log, cut.min(log.len()), snap);
        });
    }
}

#[test]
fn a_damaged_line_in_the_middle_stops_recovery_there() {
    let (_dir, log) = recorded_history();
    let lines: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i + 1)
        .collect();
    let start = lines[lines.len() / 2];
    let mut bad = log.clone();
    bad[start + 2] = b'#';
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(LOG), &bad).unwrap();
    let o = open(dir.path());
    assert!(
        o.warnings.iter().any(|w| w.contains("unreadable")),
        "{:?}",
        o.warnings
    );
    assert_eq!(o.engine.durable_state(), prefix_state(&log, start));
}

#[test]
fn after_a_restart_no_session_has_a_view() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (sess("alice"), sess("bob"));
    {
        let o = open(dir.path());
        o.engine.register(&b, Timestamp(T0)).unwrap();
        o.engine.acquire(&a, "p", Timestamp(T0)).unwrap();
        o.engine
            .commit(&a, "p", CommitOp::Write, stamp(1), Timestamp(T0));
        o.engine.close_write(&a, "p", true, Timestamp(T0));
        assert_eq!(o.engine.hold(&a, "p"), Some((Hold::M, Some(1))));
    }
    let o = open(dir.path());
    assert_eq!(o.engine.version("p"), Some(1));
    assert_eq!(o.engine.hold(&a, "p"), None);
    let err = o
        .engine
        .transfer(&a, &paths(&["p"]), "bob", None, Timestamp(T0))
        .unwrap_err();
    assert_eq!(err.reason, coherent::error::Reason::HandoffNotHeld);
    o.engine.open_read(&a, "p", Timestamp(T0));
    o.engine
        .transfer(&a, &paths(&["p"]), "bob", None, Timestamp(T0))
        .unwrap();
}

/// A small tmpfs mounted for one test (the journal's state directory on a disk that fills).
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn new(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let st = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs (the tests run as root)");
        SmallDisk { dir }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    /// Fill the disk with `name`; returns its size.
    fn fill(&self, name: &str) -> u64 {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path().join(name)).unwrap();
        let block = vec![0u8; 4096];
        let mut n = 0u64;
        loop {
            match f.write(&block) {
                Ok(k) => n += k as u64,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                    return n;
                }
            }
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Every line of the log is a whole event, numbered 1, 2, 3, ...
fn whole_events(log: &Path) -> u64 {
    let text = std::fs::read_to_string(log).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "torn last line");
    let mut seq = 0;
    for line in text.lines() {
        let ev: Event = serde_json::from_str(line).expect("a whole event");
        assert_eq!(ev.seq, seq + 1);
        seq = ev.seq;
    }
    seq
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_full_disk_stops_the_journal_and_it_recovers_by_itself() {
    let disk = SmallDisk::new("256k");
    let state = disk.path().join("state");
    let o = open(&state);
    let (a, b) = (sess("alice"), sess("bob"));
    o.engine.register(&b, Timestamp(T0)).unwrap();
    o.engine
        .commit(&a, "p", CommitOp::Write, stamp(1), Timestamp(T0));
    o.engine.open_read(&a, "p", Timestamp(T0));
    o.engine
        .transfer(
            &a,
            &paths(&["p"]),
            "bob",
            Some("before".into()),
            Timestamp(T0),
        )
        .unwrap();
    assert!(!o.journal.is_poisoned());
    let acked = o.journal.durable_seq();
    assert_eq!(acked, o.engine.last_seq());

    disk.fill("filler");
    // Events while the disk is full: the flusher fails, the journal stops.
    for i in 0..300 {
        o.engine.commit(
            &a,
            &format!("busy/f{i}"),
            CommitOp::Write,
            stamp(i + 10),
            Timestamp(T0 + 1),
        );
    }
    o.engine.open_read(&a, "q", Timestamp(T0 + 2));
    o.engine
        .commit(&a, "q", CommitOp::Write, stamp(5), Timestamp(T0 + 2));
    let r = o
        .engine
        .transfer(&a, &paths(&["q"]), "bob", None, Timestamp(T0 + 3));
    assert!(r.is_ok(), "{r:?}");
    assert!(o.journal.is_poisoned(), "a verb on a full disk must fail");
    assert!(o.journal.durable_seq() < o.engine.last_seq());
    // The log holds only whole events, however far the failed write got.
    let on_disk = whole_events(&state.join(LOG));
    assert!(on_disk >= acked && on_disk < o.engine.last_seq());

    // Space comes back: the journal writes what it kept and verbs work, no restart.
    std::fs::remove_file(disk.path().join("filler")).unwrap();
    wait_for("the journal to recover", || !o.journal.is_poisoned());
    wait_for("every event durable", || {
        o.journal.durable_seq() == o.engine.last_seq()
    });
    o.engine
        .transfer(&a, &paths(&["busy/f1"]), "bob", None, Timestamp(T0 + 4))
        .unwrap();
    assert!(!o.journal.is_poisoned());
    assert_eq!(o.journal.durable_seq(), o.engine.last_seq());
    assert_eq!(whole_events(&state.join(LOG)), o.engine.last_seq());

    // Nothing lost: a restart rebuilds exactly this state.
    let before = o.engine.durable_state();
    drop(o);
    let o = open(&state);
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert_eq!(o.engine.durable_state(), before);
}

#[test]
fn a_leftover_snapshot_temporary_never_blocks_a_mount() {
    let disk = SmallDisk::new("256k");
    let state = disk.path().join("state");
    {
        let o = open(&state);
        history(&o.engine, 5);
        o.journal.checkpoint(&o.engine).unwrap();
    }
    // An interrupted snapshot that filled the disk.
    disk.fill("state/snapshot.json.tmp");
    let o = open(&state);
    assert!(!state.join("snapshot.json.tmp").exists());
    assert!(o.from_snapshot);
    history(&o.engine, 5);
    o.journal.flush().unwrap();
    o.journal.checkpoint(&o.engine).unwrap();
    assert!(!o.journal.is_poisoned());
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The daemon runs with umask 0 (modes from the kernel are already masked): the check
/// runs in a process of its own (this binary, this test alone), as umask is process-wide.
#[test]
fn the_state_directory_is_private_whatever_the_umask() {
    let out = crate::common::run_alone(module_path!(), "private_state_under_umask_0", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "run by the_state_directory_is_private_whatever_the_umask in its own process"]
fn private_state_under_umask_0() {
    use std::os::unix::fs::PermissionsExt;
    let old = unsafe { libc::umask(0) };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("a/state");
    {
        let o = open(&state);
        history(&o.engine, 5);
        o.journal.checkpoint(&o.engine).unwrap();
        // A damaged tail kept aside at the next open is private too.
        drop(o);
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(state.join(LOG))
            .unwrap();
        f.write_all(b"{\"torn").unwrap();
    }
    let o = open(&state);
    assert_eq!(o.warnings.len(), 1, "{:?}", o.warnings);
    assert_eq!(mode(&state), 0o700);
    let mut files = 0;
    for e in std::fs::read_dir(&state).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode(&p), 0o600, "{}", p.display());
        files += 1;
    }
    assert!(files >= 4, "lock, log, snapshot, damaged tail: {files}");
    drop(o);

    // An existing directory others can read is tightened; one they can write is refused.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(state.join(LOG), std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(open(&state));
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join(LOG)), 0o600);
    for bad in [0o770, 0o707, 0o777] {
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(bad)).unwrap();
        match Journal::open(&state, Config::default(), JournalOptions::default()) {
            Err(e @ JournalError::NotPrivate { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("chmod 700"), "{msg}");
                assert!(msg.contains(&format!("{bad:o}")), "{msg}");
            }
            Err(e) => panic!("unexpected {e}"),
            Ok(_) => panic!("opened a state directory mode {bad:o}"),
        }
    }
    unsafe { libc::umask(old) };
}

/// Every line of `bytes` as an event.
fn events_in(bytes: &[u8]) -> Vec<Event> {
    assert!(bytes.is_empty() || bytes.ends_with(b"\n"));
    std::str::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("an event"))
        .collect()
}

#[test]
fn compaction_bounds_the_log_and_followers_keep_following() {
    let dir = tempfile::tempdir().unwrap();
    let opts = JournalOptions {
        compact_bytes: 64 << 10,
        ..Default::default()
    };
    let o = Journal::open(dir.path(), Config::default(), opts.clone()).unwrap();
    let (a, b) = (sess("alice"), sess("bob"));
    o.engine.register(&b, Timestamp(T0)).unwrap();
    o.engine
        .commit(&a, "kept.md", CommitOp::Write, stamp(1), Timestamp(T0));
    o.engine.open_read(&a, "kept.md", Timestamp(T0));
    o.engine
        .transfer(&a, &paths(&["kept.md"]), "bob", None, Timestamp(T0))
        .unwrap();
    // Files created and removed: tombstones, and a log past the bound.
    let churn = |from: u64, to: u64| {
        for i in from..to {
            let p = format!("churn/f{i}");
            o.engine
                .commit(&a, &p, CommitOp::Write, stamp(i + 10), Timestamp(T0 + 1));
            o.engine
                .commit(&a, &p, CommitOp::Unlink, None, Timestamp(T0 + 2));
        }
        o.journal.flush().unwrap();
    };
    churn(0, 1000);
    // A follower reads everything so far.
    let first = o.journal.read_log(0, 1 << 30).unwrap();
    let mut pos = first.len() as u64;
    let mut seen = events_in(&first);
    assert_eq!(pos, o.journal.log_len());
    let file_before = std::fs::metadata(dir.path().join(LOG)).unwrap().len();
    assert!(file_before >= opts.compact_bytes, "{file_before}");
    assert!(o.engine.durable_state().paths.contains_key("churn/f0"));

    o.journal.maintain(&o.engine, Timestamp(T0 + 3)).unwrap();
    // Compacted: the file is small, the logical length did not move, tombstones are gone,
    // the live record stays.
    let file_after = std::fs::metadata(dir.path().join(LOG)).unwrap().len();
    assert!(file_after < 200, "{file_after}");
    assert_eq!(o.journal.log_len(), pos);
    assert_eq!(o.journal.log_base(), pos);
    let st = o.engine.durable_state();
    assert!(
        !st.paths.keys().any(|p| p.starts_with("churn/")),
        "tombstones left"
    );
    assert!(st.paths.contains_key("kept.md"));
    assert!(st.records.iter().any(|r| r.path == "kept.md"));

    // The follower goes on from where it was: the next events, no gap, no repeat.
    churn(1000, 1010);
    let more = o.journal.read_log(pos, 1 << 30).unwrap();
    pos += more.len() as u64;
    seen.extend(events_in(&more));
    assert_eq!(pos, o.journal.log_len());
    for (i, ev) in seen.iter().enumerate() {
        assert_eq!(ev.seq, i as u64 + 1);
    }
    assert_eq!(seen.last().unwrap().seq, o.engine.last_seq());
    // A reader from 0 starts at the base: the first event after the compaction.
    let from0 = events_in(&o.journal.read_log(0, 1 << 30).unwrap());
    assert_eq!(from0.first().unwrap().seq, st.seq + 1);
    let (start, bytes) = o.journal.read_log_from(10, 1 << 30).unwrap();
    assert_eq!(start, o.journal.log_base());
    assert_eq!(events_in(&bytes), from0);

    // A restart rebuilds the same state, and the offsets go on.
    let before = o.engine.durable_state();
    drop(o);
    std::fs::write(
        dir.path().join("events.log.tmp"),
        b"an interrupted compaction",
    )
    .unwrap();
    let o = Journal::open(dir.path(), Config::default(), opts).unwrap();
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert!(o.from_snapshot);
    assert!(!dir.path().join("events.log.tmp").exists());
    assert_eq!(o.engine.durable_state(), before);
    assert_eq!(o.journal.log_len(), pos);
    o.engine
        .commit(&a, "after", CommitOp::Write, stamp(3), Timestamp(T0 + 4));
    o.journal.flush().unwrap();
    let last = events_in(&o.journal.read_log(pos, 1 << 20).unwrap());
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].seq, before.seq + 1);
    // A second compaction, then a restart: still the same.
    o.journal.compact(&o.engine).unwrap();
    let before = o.engine.durable_state();
    drop(o);
    let o = open(dir.path());
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert_eq!(o.engine.durable_state(), before);
}

/// Issue 20: the memory kept while the disk is full is bounded. Past the bound the journal
/// sheds (events change the state but are not kept, verbs fail); once the disk takes
/// writes again a snapshot covers what was not kept, events are kept again, and a
/// restart rebuilds exactly the state: nothing lost, memory bounded meanwhile.
#[test]
fn past_its_bound_the_journal_sheds_and_a_snapshot_covers_it_after_the_outage() {
    let disk = SmallDisk::new("256k");
    let state = disk.path().join("state");
    let opts = JournalOptions {
        buffer_limit: 8 << 10,
        ..Default::default()
    };
    let o = open_with(&state, opts.clone());
    let (a, b) = (sess("alice"), sess("bob"));
    o.engine.register(&b, Timestamp(T0)).unwrap();
    o.engine
        .commit(&a, "p", CommitOp::Write, stamp(1), Timestamp(T0));
    assert!(!o.journal.is_shedding());

    disk.fill("filler");
    // The bound holds once the journal knows the disk is full. Find that first, an event
    // at a time (the log's last page may still take a few): a burst before it would be
    // kept whole for as long as the flusher is not scheduled, and on a busy machine that
    // was most of the 2000 events, too many to fit beside the snapshot afterwards.
    let probes = std::cell::Cell::new(0u64);
    wait_for("the journal to fail", || {
        let i = probes.get();
        probes.set(i + 1);
        o.engine.commit(
            &a,
            &format!("probe/f{i}"),
            CommitOp::Write,
            stamp(i + 10_000),
            Timestamp(T0 + 1),
        );
        o.journal.is_poisoned()
    });
    for i in 0..2000 {
        o.engine.commit(
            &a,
            &format!("busy/f{i}"),
            CommitOp::Write,
            stamp(i + 10),
            Timestamp(T0 + 1),
        );
    }
    assert!(
        o.journal.is_shedding(),
        "2000 events are past an 8 KiB bound"
    );
    let (bytes, shed, limit) = o.journal.backlog();
    // What was kept when the bound was reached, and the one event that reached it.
    assert!(
        bytes < limit + (4 << 10),
        "kept {bytes} bytes, bound {limit}"
    );
    assert!(shed > 1000, "{shed} events not kept");
    // From here on the memory kept does not grow, however many events come.
    for i in 0..500 {
        o.engine.commit(
            &b,
            &format!("more/f{i}"),
            CommitOp::Write,
            stamp(i + 3000),
            Timestamp(T0 + 1),
        );
    }
    assert_eq!(o.journal.backlog(), (bytes, shed + 500, limit));
    // A verb needs a durable record: refused while shedding (the volume checks this).
    assert!(o.journal.is_poisoned());
    // Maintenance cannot snapshot on a full disk; it stays shedding.
    let _ = o.journal.maintain(&o.engine, Timestamp(T0 + 2));
    assert!(o.journal.is_shedding());

    std::fs::remove_file(disk.path().join("filler")).unwrap();
    wait_for("the snapshot covering the shed events", || {
        let _ = o.journal.maintain(&o.engine, Timestamp(T0 + 3));
        !o.journal.is_shedding() && !o.journal.is_poisoned()
    });
    // Events are kept again.
    o.engine
        .commit(&a, "after", CommitOp::Write, stamp(5000), Timestamp(T0 + 4));
    o.journal.flush().unwrap();
    assert_eq!(o.journal.durable_seq(), o.engine.last_seq());
    let before = o.engine.durable_state();
    drop(o);
    let o = open_with(&state, opts);
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert_eq!(o.engine.durable_state(), before);
    assert_eq!(o.engine.version("busy/f1999"), Some(1));
    assert_eq!(o.engine.version("after"), Some(1));
}

/// With a coordinator the log keeps the other hosts' events with their etcd revision; a
/// restarted host resumes reading them after the newest one, whether the log or a
/// snapshot holds it (and a gap named counts as read).
#[test]
fn the_other_hosts_revision_survives_a_restart_from_the_log_and_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let opts = JournalOptions {
        snapshot_every: 50,
        ..Default::default()
    };
    let config = || Config {
        host: Some("B".into()),
        ..Config::default()
    };
    let theirs = |o: &Opened, rev: i64| {
        let mut ev = Event::new(EventKind::Transfer, Timestamp(T0), Some("p.md"), None);
        ev.host = Some("A".into());
        ev.rev = Some(rev);
        o.journal.append_kept(&mut ev);
        o.engine.note_peer_rev(rev);
    };
    {
        let o = Journal::open(dir.path(), config(), opts.clone()).unwrap();
        theirs(&o, 41);
        theirs(&o, 40); // out of order never lowers it
        o.journal.flush().unwrap();
    }
    let o = Journal::open(dir.path(), config(), opts.clone()).unwrap();
    assert_eq!(o.engine.peer_rev(), 41, "from the log");
    // Their events change nothing here: this host's state comes from the coordinator.
    assert!(o.engine.durable_state().paths.is_empty());
    let mut gap = Event::new(EventKind::EventsMissed, Timestamp(T0), None, None);
    gap.from_rev = Some(42);
    gap.rev = Some(99);
    o.journal.append_kept(&mut gap);
    o.engine.note_peer_rev(99);
    history(&o.engine, 10);
    o.journal.maintain(&o.engine, Timestamp(T0)).unwrap();
    assert!(dir.path().join(SNAPSHOT).exists());
    drop(o);
    let o = Journal::open(dir.path(), config(), opts).unwrap();
    assert!(o.from_snapshot);
    assert_eq!(o.engine.peer_rev(), 99, "from the snapshot");
}
