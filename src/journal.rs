//! The state log and snapshots (docs/design.md#state-log): durability and recovery of the
//! engine. The files and their formats, group commit, failure and shedding are described
//! there.
//!
//! The layers, each in its own file, none of them using this facade: `format.rs` (the
//! files and their headers), `error.rs`, `options.rs`, `file.rs` (file I/O behind
//! [`StateIo`], which tests make fail), `dir.rs` (the private, locked directory),
//! `replay.rs` (reading a snapshot and the log), `recover.rs` (choosing and repairing what
//! to recover from), `log.rs` (append, flusher, poison, durability wait) and `snapshot.rs`
//! (snapshots, compaction, upkeep). This file opens them together and serves reads of
//! the log.
//!
//! Lock order: `Snapshots::one` → the engine's locks → `written` → `buf` → `durable`.
//! `append` (called under engine locks) takes only `buf`.

mod dir;
mod error;
mod file;
mod format;
mod log;
mod options;
mod recover;
mod replay;
mod snapshot;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::coherence::{Config, Engine, Event, EventSink, Timestamp};
pub use dir::private_file;
use dir::{lock_dir, prepare_dir};
use error::io_err;
pub use error::JournalError;
pub use file::{DiskIo, LogFile, NewFile, StateIo};
// For the volume's own state file, written the journal's way.
pub(crate) use file::replace_durably;
pub use format::{LOCK, LOG, SNAPSHOT};
use log::{flusher, Shared};
pub use log::{BUFFER_WARN, RETRY_EVERY};
pub use options::{JournalOptions, BUFFER_LIMIT};
use recover::recover;
pub use replay::{replay_log, Damage};
use snapshot::Snapshots;

/// The journal: an [`EventSink`] writing `events.log`, plus snapshots and recovery.
pub struct Journal {
    shared: Arc<Shared>,
    flusher: Mutex<Option<std::thread::JoinHandle<()>>>,
    snapshots: Snapshots,
    tap: std::sync::OnceLock<Arc<dyn Tap>>,
    _lock: File,
}

/// What `open` found.
pub struct Opened {
    pub engine: Arc<Engine>,
    pub journal: Arc<Journal>,
    /// Damage found and repaired (log cut mid-line, corrupt snapshot, ...).
    pub warnings: Vec<String>,
    pub from_snapshot: bool,
    /// Events replayed from the log (after the snapshot).
    pub replayed: u64,
}

/// Sees each event the engine appends before the journal writes it (the coordinator: it
/// names the host and feeds other hosts). A step's events never pass here: the step keeps
/// them and writes them with [`Journal::append_kept`] once they are agreed.
pub trait Tap: Send + Sync {
    /// Called with engine locks held: must not block.
    fn on_append(&self, ev: &mut Event);
}

impl EventSink for Journal {
    fn append(&self, ev: &mut Event) {
        if let Some(t) = self.tap.get() {
            t.on_append(ev);
        }
        self.append_kept(ev);
    }

    fn wait_durable(&self, seq: u64) {
        if *self.shared.durable.lock() >= seq {
            return;
        }
        // Concurrent callers serialise on `written`, so one fsync covers them all.
        self.shared.flush_or_poison();
    }
}

impl Journal {
    /// Sets the tap (once, before the volume serves requests).
    pub fn set_tap(&self, tap: Arc<dyn Tap>) {
        let _ = self.tap.set(tap);
    }

    /// Writes `ev` (assigning its seq) past the tap: an event a step kept, or another
    /// host's.
    pub fn append_kept(&self, ev: &mut Event) {
        self.shared.append(ev);
    }
}

impl Journal {
    /// Opens (creating) the state directory: locks it, recovers the engine from it (see
    /// `recover`), and starts the flusher. The engine's events go to the returned journal.
    pub fn open(dir: &Path, config: Config, opts: JournalOptions) -> Result<Opened, JournalError> {
        prepare_dir(dir)?;
        let lock = lock_dir(dir)?;
        let log_path = dir.join(LOG);
        let file = opts
            .io
            .open_log(&log_path)
            .map_err(io_err(format!("open {}", log_path.display())))?;
        let shared = Arc::new(Shared::new(dir.to_path_buf(), opts.clone(), file));
        let journal = Arc::new(Journal {
            shared: shared.clone(),
            flusher: Mutex::new(None),
            snapshots: Snapshots::new(shared.clone()),
            tap: std::sync::OnceLock::new(),
            _lock: lock,
        });
        let r = recover(dir, config, journal.clone(), &*opts.io)?;
        shared.start_at(r.seq, r.replayed, r.len, r.base, r.hdr);
        let s2 = shared.clone();
        let handle = std::thread::Builder::new()
            .name("coherent-journal".into())
            .spawn(move || flusher(s2))
            .map_err(io_err("spawn flusher"))?;
        *journal.flusher.lock() = Some(handle);
        Ok(Opened {
            engine: Arc::new(r.engine),
            journal,
            warnings: r.warnings,
            from_snapshot: r.from_snapshot,
            replayed: r.replayed,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// `events.log` (its first line is a header after a compaction: read events through
    /// [`Journal::read_log`]).
    pub fn log_path(&self) -> PathBuf {
        self.shared.dir.join(LOG)
    }

    /// The logical end of the whole events written to the log so far: it only grows,
    /// across compactions too.
    pub fn log_len(&self) -> u64 {
        let w = self.shared.written.lock();
        w.logical(w.len)
    }

    /// The logical offset of the oldest event still in the log (0 until a compaction).
    pub fn log_base(&self) -> u64 {
        self.shared.written.lock().base
    }

    /// Reads up to `max` bytes of the log from logical `offset` (never past `log_len`, so
    /// only whole lines): what `.coherent/events` serves; `tail -f` follows as `log_len`
    /// grows. An offset below [`Journal::log_base`] (compacted away) reads from the base.
    ///
    /// A reader that reads on sequentially must then go on from the base, not from its own
    /// offset plus what it got: see [`Journal::read_log_from`].
    pub fn read_log(&self, offset: u64, max: usize) -> io::Result<Vec<u8>> {
        self.read_log_from(offset, max).map(|(_, b)| b)
    }

    /// [`Journal::read_log`], also returning the logical offset the bytes start at (the
    /// base when `offset` was below it): a sequential reader of `.coherent/events` that
    /// started below the base keeps the difference and adds it to its later offsets, so it
    /// reads each event once.
    pub fn read_log_from(&self, offset: u64, max: usize) -> io::Result<(u64, Vec<u8>)> {
        let (f, start, file_off, left) = {
            let w = self.shared.written.lock();
            let start = offset.max(w.base);
            let end = w.logical(w.len);
            if start >= end {
                return Ok((start, Vec::new()));
            }
            // The same open file as the writer's, so a compaction cannot swap it under us.
            (w.file.clone(), start, start - w.base + w.hdr, end - start)
        };
        let n = left.min(max as u64) as usize;
        let mut buf = vec![0u8; n];
        f.read_exact_at(&mut buf, file_off)?;
        Ok((start, buf))
    }

    /// Writes and fsyncs every event appended so far.
    pub fn flush(&self) -> io::Result<()> {
        self.shared.flush()
    }

    /// Writes the events appended so far to the log without waiting for an fsync, so a
    /// reader of the log sees them at once (a denied call answers after this). Does
    /// nothing while the journal is failing: the flusher writes them when it can.
    pub fn write_out(&self) -> io::Result<()> {
        if self.is_poisoned() {
            return Ok(());
        }
        self.shared.write_pending().map(drop)
    }

    /// Seq of the last durable event.
    pub fn durable_seq(&self) -> u64 {
        *self.shared.durable.lock()
    }

    /// Whether a write or fsync of the log failed (events are no longer durable).
    pub fn is_poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::SeqCst) || self.is_shedding()
    }

    /// Whether the journal is past its bound (docs/design.md#state-log): events are not being
    /// kept, so nothing that needs a durable record may go on.
    pub fn is_shedding(&self) -> bool {
        self.shared.mode.load(Ordering::SeqCst) != log::NORMAL
    }

    /// Writes a snapshot of `engine` (which must be the engine writing to this journal).
    pub fn checkpoint(&self, engine: &Engine) -> io::Result<()> {
        self.snapshots.checkpoint(engine)
    }

    /// Compacts: drops the tombstones nothing refers to, writes a snapshot, and replaces
    /// the log with the events after it. Returns the number of tombstones dropped.
    pub fn compact(&self, engine: &Engine) -> io::Result<usize> {
        self.snapshots.compact(engine)
    }

    /// Periodic upkeep for the mount (e.g. every few seconds): evicts ended records
    /// (`evict_after`), compacts once the log holds `compact_bytes` of events, and else
    /// writes a snapshot once `snapshot_every` events have accumulated. Returns the number
    /// of records evicted.
    pub fn maintain(&self, engine: &Engine, now: Timestamp) -> io::Result<usize> {
        self.maintain_with(engine, now, &|_| true)
    }

    /// [`Journal::maintain`] evicting only the paths `may_evict` allows.
    pub fn maintain_with(
        &self,
        engine: &Engine,
        now: Timestamp,
        may_evict: &dyn Fn(&str) -> bool,
    ) -> io::Result<usize> {
        self.snapshots.maintain_with(engine, now, may_evict)
    }

    /// (bytes of events kept in memory, events not kept, the bound): for `status`.
    pub fn backlog(&self) -> (usize, u64, usize) {
        let b = self.shared.buf.lock();
        (b.bytes.len(), b.shed, self.shared.opts.buffer_limit)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _b = self.shared.buf.lock();
            self.shared.wake.notify_all();
        }
        if let Some(h) = self.flusher.lock().take() {
            let _ = h.join();
        }
        self.shared.flush_or_poison();
    }
}
