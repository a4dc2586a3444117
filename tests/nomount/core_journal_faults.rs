//! What the journal does when its log cannot be written (docs/design.md#state-log): a
//! full disk (`ENOSPC`), a write error (`EIO`), a failed fsync and a torn write, injected
//! through its file I/O ([`LogIo`]). In every case no torn record stays in the log, the
//! journal is failing (verbs answer `io_error`) and nothing it had is durable twice or
//! lost: once the fault clears, the next flush writes every event, once, in order.

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
}

/// The log on disk, with the fault of the moment.
#[derive(Debug, Clone)]
struct Faulty(Arc<Mutex<Fault>>);

struct FaultyFile {
    file: Arc<dyn LogFile>,
    fault: Arc<Mutex<Fault>>,
}

impl LogIo for Faulty {
    fn open_log(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        Ok(Arc::new(FaultyFile {
            file: DiskIo.open_log(path)?,
            fault: self.0.clone(),
        }))
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
            Fault::None | Fault::Fsync => self.file.append(bytes),
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
    let io = Faulty(Arc::new(Mutex::new(Fault::None)));
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

    *io.0.lock() = fault;
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
    *io.0.lock() = Fault::None;
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
