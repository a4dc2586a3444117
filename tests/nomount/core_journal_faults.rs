//! What the journal does when its files cannot be written (docs/design.md#state-log),
//! with the faults injected through its file I/O ([`StateIo`]).
//!
//! The log: a full disk (`ENOSPC`), a write error (`EIO`), a failed fsync and a torn
//! write. In every case no torn record stays in the log, the journal is failing (verbs
//! answer `io_error`) and nothing it had is durable twice or lost: once the fault clears,
//! the next flush writes every event, once, in order.
//!
//! Snapshots and compaction: a failed write, fsync, rename into place or directory fsync.
//! A crash at that moment (the state directory as it is, opened anew) recovers every
//! acknowledged event and brings back no record that was retired.

use crate::core_common;
use coherent::coherence::*;
use coherent::journal::*;
use core_common::*;
use parking_lot::Mutex;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Appends fail with `ENOSPC`, writing nothing.
    Full,
    /// Appends write half their bytes, then fail with `EIO`.
    Torn,
    /// Like `Torn`, and the file cannot be cut back either (until the fault clears).
    TornStuck,
    /// `fdatasync` fails with `EIO` (what it covered may not be on disk).
    Fsync,
    /// Writing a file that replaces another (snapshot, compacted log) fails with
    /// `ENOSPC` after half its bytes.
    NewWrite,
    /// Its fsync fails with `EIO`.
    NewFsync,
    /// Renaming it into place fails with `EIO`.
    Rename,
    /// The directory fsync after the rename fails with `EIO`.
    DirFsync,
}

/// The state directory on disk, with the fault of the moment.
#[derive(Debug, Clone)]
struct Faulty {
    fault: Arc<Mutex<Fault>>,
    /// The faults of a replacing file hit only the one of this name (None: any).
    only: Option<&'static str>,
    /// The name last renamed into place (the directory fsync that follows is its).
    renamed: Arc<Mutex<String>>,
}

impl Faulty {
    fn new(only: Option<&'static str>) -> Faulty {
        Faulty {
            fault: Arc::new(Mutex::new(Fault::None)),
            only,
            renamed: Arc::default(),
        }
    }
    fn set(&self, fault: Fault) {
        *self.fault.lock() = fault;
    }
    /// The fault of the moment if it hits the file `name` (`None` when it does not).
    fn on(&self, name: &str) -> Fault {
        match self.only {
            Some(only) if !name.starts_with(only) => Fault::None,
            _ => *self.fault.lock(),
        }
    }
}

fn name_of(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

struct FaultyFile {
    file: Arc<dyn LogFile>,
    fault: Arc<Mutex<Fault>>,
}

struct FaultyNew {
    file: Box<dyn NewFile>,
    /// The fault for this file, as it was when it was created.
    fault: Fault,
}

impl StateIo for Faulty {
    fn open_log(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        Ok(Arc::new(FaultyFile {
            file: DiskIo.open_log(path)?,
            fault: self.fault.clone(),
        }))
    }
    fn create(&self, path: &Path) -> io::Result<Box<dyn NewFile>> {
        Ok(Box::new(FaultyNew {
            file: DiskIo.create(path)?,
            fault: self.on(&name_of(path)),
        }))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        *self.renamed.lock() = name_of(to);
        match self.on(&name_of(to)) {
            Fault::Rename => Err(err(libc::EIO)),
            _ => DiskIo.rename(from, to),
        }
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        match self.on(&self.renamed.lock()) {
            Fault::DirFsync => Err(err(libc::EIO)),
            _ => DiskIo.sync_dir(dir),
        }
    }
}

impl NewFile for FaultyNew {
    fn write_part(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.fault {
            Fault::NewWrite => {
                self.file.write_part(&bytes[..bytes.len() / 2])?;
                Err(err(libc::ENOSPC))
            }
            _ => self.file.write_part(bytes),
        }
    }
    fn sync_all(&mut self) -> io::Result<()> {
        match self.fault {
            Fault::NewFsync => Err(err(libc::EIO)),
            _ => self.file.sync_all(),
        }
    }
}

fn err(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

impl LogFile for FaultyFile {
    fn append(&self, bytes: &[u8]) -> io::Result<()> {
        match *self.fault.lock() {
            Fault::Full => Err(err(libc::ENOSPC)),
            Fault::Torn | Fault::TornStuck => {
                self.file.append(&bytes[..bytes.len() / 2])?;
                Err(err(libc::EIO))
            }
            _ => self.file.append(bytes),
        }
    }
    fn sync_data(&self) -> io::Result<()> {
        match *self.fault.lock() {
            Fault::Fsync => Err(err(libc::EIO)),
            _ => self.file.sync_data(),
        }
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        match *self.fault.lock() {
            Fault::TornStuck => Err(err(libc::EIO)),
            _ => self.file.set_len(len),
        }
    }
    fn size(&self) -> io::Result<u64> {
        self.file.size()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
}

/// The seqs of the log's lines; panics on a line that is not a whole event.
fn seqs_on_disk(dir: &Path) -> Vec<u64> {
    let log = std::fs::read(dir.join(LOG)).unwrap();
    assert!(log.is_empty() || log.ends_with(b"\n"), "a torn record");
    log.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_slice::<serde_json::Value>(l).expect("a whole event")["seq"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

/// `n` new sessions seen: one event each.
fn events(e: &Engine, from: usize, n: usize) {
    for i in from..from + n {
        e.session_seen(&sess(&format!("s{i}")), Timestamp(T0 + i as i64));
    }
}

fn survives(fault: Fault) {
    let dir = tempfile::tempdir().unwrap();
    let io = Faulty::new(None);
    let opts = JournalOptions {
        // The flusher stays out of the way (it retries every RETRY_EVERY while failing).
        flush_interval: Duration::from_secs(3600),
        io: Arc::new(io.clone()),
        ..JournalOptions::default()
    };
    let o = Journal::open(dir.path(), Config::default(), opts).unwrap();
    events(&o.engine, 0, 5);
    o.journal.flush().unwrap();
    assert_eq!(seqs_on_disk(dir.path()), [1, 2, 3, 4, 5]);

    io.set(fault);
    events(&o.engine, 5, 5);
    let e = o.journal.flush().unwrap_err();
    assert!(e.raw_os_error().is_some(), "{fault:?}: {e}");
    assert!(
        o.journal.is_poisoned(),
        "{fault:?}: verbs must answer io_error"
    );
    assert_eq!(o.journal.durable_seq(), 5, "{fault:?}");
    // Nothing is written while failing, and a write-out does not try.
    o.journal.write_out().unwrap();
    if fault != Fault::TornStuck {
        assert_eq!(seqs_on_disk(dir.path()), [1, 2, 3, 4, 5], "{fault:?}");
    }
    // Appends go on into memory meanwhile.
    events(&o.engine, 10, 2);

    // A verb waits for its event: the first flush that succeeds writes everything and
    // the journal works again.
    io.set(Fault::None);
    o.journal.wait_durable(12);
    assert!(!o.journal.is_poisoned(), "{fault:?}");
    assert_eq!(o.journal.durable_seq(), 12);
    let want: Vec<u64> = (1..=12).collect();
    assert_eq!(
        seqs_on_disk(dir.path()),
        want,
        "{fault:?}: every event once, in order"
    );
    drop(o);
    let again = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
    assert_eq!(again.replayed, 12, "{fault:?}");
    assert!(again.warnings.is_empty(), "{fault:?}: {:?}", again.warnings);
}

#[test]
fn a_full_disk_keeps_the_events_and_writes_them_when_it_clears() {
    survives(Fault::Full);
}

#[test]
fn a_write_error_after_half_a_record_leaves_no_torn_record() {
    survives(Fault::Torn);
}

#[test]
fn a_torn_record_that_cannot_be_cut_at_once_is_cut_before_the_next_append() {
    survives(Fault::TornStuck);
}

#[test]
fn a_failed_fsync_writes_what_it_covered_again() {
    survives(Fault::Fsync);
}

/// The state directory as a crash would leave it now: its files, copied while the journal
/// still holds them, opened anew. Every event acknowledged (`acked`) is there, and the
/// state is the live one's up to the last event on disk: a retired record stays retired.
fn crash_now(dir: &Path, live: &Engine, acked: u64, what: &str) -> (Opened, tempfile::TempDir) {
    let image = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), image.path().join(e.file_name())).unwrap();
        }
    }
    let o = Journal::open(image.path(), Config::default(), JournalOptions::default())
        .unwrap_or_else(|e| panic!("{what}: the crash image does not open: {e}"));
    assert!(
        !o.engine.has_live_record("retired.md"),
        "{what}: the withdrawn transfer came back"
    );
    assert!(
        o.engine.last_seq() >= acked,
        "{what}: recovered up to seq {}, but {acked} was acknowledged ({:?})",
        o.engine.last_seq(),
        o.warnings
    );
    assert!(
        o.engine.has_live_record("handed.md"),
        "{what}: a live transfer was lost"
    );
    if o.engine.last_seq() == live.last_seq() {
        assert_eq!(o.engine.durable_state(), live.durable_state(), "{what}");
    }
    // The journal opened on the image is dropped before it (tuple order).
    (o, image)
}

/// A history with a live transfer (`handed.md`), a withdrawn one (`retired.md`) and
/// tombstones for a compaction to drop, all durable, with a good snapshot in the middle.
fn history(o: &Opened) {
    let (a, b) = (sess("alice"), sess("bob"));
    let t = |n: i64| Timestamp(T0 + n);
    o.engine.register(&b, t(0)).unwrap();
    for (i, p) in ["handed.md", "retired.md"].into_iter().enumerate() {
        o.engine
            .commit(&a, p, CommitOp::Write, stamp(i as u64 + 1), t(1));
        o.engine.open_read(&a, p, t(1));
        o.engine
            .transfer(&a, &paths(&[p]), "bob", None, t(2))
            .unwrap();
    }
    o.journal.checkpoint(&o.engine).unwrap();
    o.engine
        .withdraw(&a, &paths(&["retired.md"]), t(3))
        .unwrap();
    for i in 0..50 {
        let p = format!("churn/f{i}");
        o.engine
            .commit(&a, &p, CommitOp::Write, stamp(i + 10), t(4));
        o.engine.commit(&a, &p, CommitOp::Unlink, None, t(5));
    }
    o.journal.flush().unwrap();
    assert!(!o.engine.has_live_record("retired.md"));
    assert!(o.engine.has_live_record("handed.md"));
}

/// A snapshot, or the log a compaction writes after its snapshot, fails at `fault`.
fn replacing_survives(fault: Fault, compact: bool) {
    let what = format!(
        "{fault:?} in a {}",
        if compact { "compaction" } else { "snapshot" }
    );
    let dir = tempfile::tempdir().unwrap();
    let io = Faulty::new(Some(if compact { LOG } else { SNAPSHOT }));
    let opts = JournalOptions {
        flush_interval: Duration::from_secs(3600),
        io: Arc::new(io.clone()),
        ..JournalOptions::default()
    };
    let o = Journal::open(dir.path(), Config::default(), opts).unwrap();
    history(&o);
    let acked = o.journal.durable_seq();
    assert_eq!(acked, o.engine.last_seq());

    io.set(fault);
    let e = if compact {
        o.journal.compact(&o.engine).map(drop)
    } else {
        o.journal.checkpoint(&o.engine)
    }
    .expect_err(&what);
    let want = if fault == Fault::NewWrite {
        libc::ENOSPC
    } else {
        libc::EIO
    };
    assert_eq!(e.raw_os_error(), Some(want), "{what}: {e}");
    // A partial temporary would keep a full disk full.
    for tmp in [format!("{SNAPSHOT}.tmp"), format!("{LOG}.tmp")] {
        assert!(!dir.path().join(&tmp).exists(), "{what}: {tmp} left behind");
    }
    assert_eq!(o.journal.durable_seq(), acked, "{what}");
    drop(crash_now(dir.path(), &o.engine, acked, &what));

    // Events go on while the fault lasts; none is acknowledged before it is durable.
    o.engine.commit(
        &sess("alice"),
        "after.md",
        CommitOp::Write,
        stamp(99),
        Timestamp(T0 + 9),
    );
    let last = o.engine.last_seq();
    o.journal.wait_durable(last);
    if fault == Fault::DirFsync && compact {
        // The new log's name may not survive a crash until the directory is fsynced.
        assert_eq!(
            o.journal.durable_seq(),
            acked,
            "{what}: acknowledged too early"
        );
        assert!(
            o.journal.is_poisoned(),
            "{what}: verbs must answer io_error"
        );
    } else {
        assert_eq!(o.journal.durable_seq(), last, "{what}");
        assert!(!o.journal.is_poisoned(), "{what}");
    }
    drop(crash_now(
        dir.path(),
        &o.engine,
        o.journal.durable_seq(),
        &what,
    ));

    // Once the fault clears everything is durable, and the next snapshot or compaction
    // goes through.
    io.set(Fault::None);
    o.journal.wait_durable(last);
    assert_eq!(o.journal.durable_seq(), last, "{what}");
    assert!(!o.journal.is_poisoned(), "{what}");
    drop(crash_now(dir.path(), &o.engine, last, &what));
    if compact {
        o.journal.compact(&o.engine).unwrap();
    } else {
        o.journal.checkpoint(&o.engine).unwrap();
    }
    let (again, _image) = crash_now(dir.path(), &o.engine, last, &what);
    assert_eq!(again.engine.last_seq(), last, "{what}");
    assert!(again.from_snapshot, "{what}: {:?}", again.warnings);
    assert!(again.warnings.is_empty(), "{what}: {:?}", again.warnings);
}

#[test]
fn a_snapshot_that_cannot_be_written_keeps_the_old_one() {
    replacing_survives(Fault::NewWrite, false);
}

#[test]
fn a_snapshot_whose_fsync_fails_is_not_put_in_place() {
    replacing_survives(Fault::NewFsync, false);
}

#[test]
fn a_snapshot_that_cannot_be_renamed_into_place_keeps_the_old_one() {
    replacing_survives(Fault::Rename, false);
}

#[test]
fn a_snapshot_whose_directory_fsync_fails_loses_nothing() {
    replacing_survives(Fault::DirFsync, false);
}

#[test]
fn a_compaction_that_cannot_write_its_log_keeps_the_old_log() {
    replacing_survives(Fault::NewWrite, true);
}

#[test]
fn a_compaction_whose_fsync_fails_keeps_the_old_log() {
    replacing_survives(Fault::NewFsync, true);
}

#[test]
fn a_compaction_that_cannot_rename_its_log_keeps_the_old_log() {
    replacing_survives(Fault::Rename, true);
}

#[test]
fn a_compaction_whose_directory_fsync_fails_follows_the_new_log_and_waits_for_it() {
    replacing_survives(Fault::DirFsync, true);
}
