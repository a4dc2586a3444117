//! The state log and snapshots (docs/design.md#state-log): durability and recovery of the engine.
//!
//! State directory layout:
//! - `lock`: held with `flock(LOCK_EX)` by the daemon using the directory; holds its pid;
//! - `events.log`: one JSON event per line (the docs/design.md#state-log schema), `seq` 1, 2, 3,
//!   ... with no gap. Offsets in the log are *logical*: they never go back. After a compaction the
//!   file starts with a header line `{"log_base":B,"seq":S}`: its first event (seq S + 1) is at
//!   logical offset B; a log without one starts at logical offset 0, seq 1;
//! - `snapshot.json`: a compacted state. Line 1 is a header
//!   `{"format":1,"seq":N,"log_offset":O,"len":L,"fnv":H}`; then L bytes of the
//!   [`DurableState`](crate::coherence::DurableState) as JSON whose FNV-1a 64 is H. It equals the log's first N events,
//!   which end at logical offset O. Written to `snapshot.json.tmp`, fsynced, renamed,
//!   and the directory fsynced;
//! - compaction (once the log holds `compact_bytes` of events): drop unreferenced
//!   tombstones, write a snapshot, then write the events after it to `events.log.tmp`
//!   under a header with their base, fsync and rename it over `events.log`. A crash at any
//!   point leaves a snapshot and a log that agree;
//! - `events.log.damaged-OFFSET`: bytes cut off a damaged log at recovery, kept for a human.
//!
//! Appends go to a memory buffer (with the engine's locks held, so the log order is the
//! application order). A flusher thread writes and fsyncs the buffer every
//! `flush_interval` (group commit) while there is something to write, and sleeps until the
//! next append when everything is on disk; a verb calls `wait_durable`, which flushes at
//! once and returns when its event is on disk. Concurrent waiters share one fsync.
//!
//! Lock order: `checkpointing` → the engine's locks → `written` → `buf` → `durable`.
//! `append` (called under engine locks) takes only `buf`.
//!
//! A failed write or fsync (ENOSPC, EIO) never leaves a torn record: the log is cut back
//! to its last fsynced length and the bytes written since go back to the front of the
//! memory buffer. The journal is then *failing* ([`Journal::is_poisoned`]: the volume
//! answers verbs `io_error`) and the flusher retries every [`RETRY_EVERY`]; the first
//! write and fsync that succeed write everything buffered meanwhile, in order, and verbs
//! work again.
//!
//! The buffer is bounded during an outage ([`JournalOptions::buffer_limit`]). Past the
//! bound the journal *sheds*: further events still change the engine's state but are not
//! kept (the log would have a gap there), and the volume fails closed on what needs a
//! durable record (verbs; writes to paths with live records) while bystanders go on.
//! Once the disk takes writes again the buffered events are written, then a snapshot of
//! the whole state (taken at a barrier, with events after it held back until the snapshot
//! is on disk) covers the events not kept, and the log goes on after it: the log and the
//! snapshot agree again and nothing of the state is lost.
//!
//! Private state: the directory is 0700 and every file in it 0600 whatever the umask;
//! `open` refuses a directory that another user owns or that group or others can write.
//!
//! The layers, each in its own file: `format.rs` (the files and their headers), `dir.rs`
//! (the private, locked directory), `replay.rs` (recovery), `log.rs` (append, flusher,
//! poison, durability wait), `snapshot.rs` (snapshots, compaction, upkeep) and `file.rs`
//! (the log's file I/O behind [`LogIo`], which tests make fail). This file opens them
//! together and serves reads of the log.

mod dir;
mod file;
mod format;
mod log;
mod replay;
mod snapshot;

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::coherence::{Config, Engine, Event, EventSink};
pub use dir::private_file;
use dir::{io_err, lock_dir, prepare_dir};
pub use file::{DiskIo, LogFile, LogIo};
use format::read_log_header;
pub use format::{LOCK, LOG, SNAPSHOT};
use log::{flusher, Buf, Shared, Written};
pub use log::{BUFFER_LIMIT, BUFFER_WARN, RETRY_EVERY};
use replay::read_snapshot;
pub use replay::{replay_log, Damage};

/// Tuning.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    /// Group-commit window of the background flusher.
    pub flush_interval: Duration,
    /// Write a snapshot (at the next `maintain`) after this many events.
    pub snapshot_every: u64,
    /// Compact (at the next `maintain`) once the log file holds this many bytes of events.
    pub compact_bytes: u64,
    /// Bytes of events kept in memory while the log cannot be written, past which the
    /// journal sheds (see the module doc).
    pub buffer_limit: usize,
    /// How the log file is opened and written (tests make it fail).
    pub io: Arc<dyn LogIo>,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            flush_interval: Duration::from_millis(5),
            snapshot_every: 100_000,
            compact_bytes: 8 << 20,
            buffer_limit: BUFFER_LIMIT,
            io: Arc::new(DiskIo),
        }
    }
}

#[derive(Debug)]
pub enum JournalError {
    /// Another process holds the state directory.
    Locked {
        dir: PathBuf,
        pid: Option<u32>,
    },
    Io {
        what: String,
        err: io::Error,
    },
    /// The state directory is not private (another owner, or writable by others).
    NotPrivate {
        dir: PathBuf,
        why: String,
    },
    /// The coordinator (`--coordinator`) could not be reached at start.
    Coordinator(String),
    /// Another user could change what the state directory's path names (a directory of
    /// theirs on the way): `why` names the component.
    UnsafePath {
        dir: PathBuf,
        why: String,
    },
}

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalError::Locked {
                dir,
                pid: Some(pid),
            } => write!(
                f,
                "state directory {} is in use by another coherent-mount (pid {pid})",
                dir.display()
            ),
            JournalError::Locked { dir, pid: None } => write!(
                f,
                "state directory {} is in use by another coherent-mount",
                dir.display()
            ),
            JournalError::Io { what, err } => write!(f, "{what}: {err}"),
            JournalError::NotPrivate { dir, why } => write!(
                f,
                "state directory {} {why}: anyone who can write it can rewrite the volume's \
                 records; make it yours and private (`chown $(id -u) DIR && chmod 700 DIR`) \
                 or choose another with --state-dir",
                dir.display()
            ),
            JournalError::Coordinator(why) => f.write_str(why),
            JournalError::UnsafePath { dir, why } => write!(
                f,
                "refusing the state directory {}: {why}; choose one on a path only root or \
                 this daemon's user can change (--state-dir)",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for JournalError {}

/// The journal: an [`EventSink`] writing `events.log`, plus snapshots and recovery.
pub struct Journal {
    shared: Arc<Shared>,
    flusher: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// One snapshot at a time (taken before any engine lock).
    checkpointing: Mutex<()>,
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
    /// Opens (creating) the state directory: locks it, loads the snapshot (falling back to
    /// the full log if it is unusable), replays the log tail into a new engine, cuts a
    /// damaged tail off the log (kept aside as `events.log.damaged-OFFSET`), and starts the
    /// flusher. The engine's events go to the returned journal.
    pub fn open(dir: &Path, config: Config, opts: JournalOptions) -> Result<Opened, JournalError> {
        prepare_dir(dir)?;
        let lock = lock_dir(dir)?;
        let mut warnings = Vec::new();
        let log_path = dir.join(LOG);
        let log_len = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        let (base, base_seq, hdr) = match read_log_header(&log_path) {
            Ok(Some((h, n))) => (h.log_base, h.seq, n),
            Ok(None) => (0, 0, 0),
            Err(e) => return Err(io_err(format!("read the header of {}", log_path.display()))(e)),
        };
        // The logical end of the log, and a logical offset's place in the file.
        let log_end = log_len.max(hdr) - hdr + base;
        let file_off = |logical: u64| logical - base + hdr;

        let mut snap = match read_snapshot(dir) {
            Ok(s) => s,
            Err(why) => {
                warnings.push(format!(
                    "{}: unusable ({why}); rebuilding from the whole log",
                    dir.join(SNAPSHOT).display()
                ));
                None
            }
        };
        if let Some((h, _)) = &snap {
            if h.log_offset > log_end {
                warnings.push(format!(
                    "{} is ahead of the log (offset {} > {log_end}); rebuilding from the whole log",
                    SNAPSHOT, h.log_offset
                ));
                snap = None;
            } else if h.log_offset < base {
                warnings.push(format!(
                    "{} is older than the log (offset {} < {base}); rebuilding from the log",
                    SNAPSHOT, h.log_offset
                ));
                snap = None;
            }
        }

        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            opts: opts.clone(),
            buf: Mutex::new(Buf {
                next_seq: 0,
                bytes: Vec::new(),
                last_seq: 0,
                since_snapshot: 0,
                shed: 0,
                idle: false,
            }),
            written: Mutex::new(Written {
                file: opts
                    .io
                    .open_log(&log_path)
                    .map_err(io_err(format!("open {}", log_path.display())))?,
                len: 0,
                seq: 0,
                synced_len: 0,
                synced_seq: 0,
                unsynced: Vec::new(),
                cuts: 0,
                compactions: 0,
                base,
                hdr,
            }),
            durable: Mutex::new(0),
            durable_cv: Condvar::new(),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            warned_buffer: AtomicBool::new(false),
            mode: std::sync::atomic::AtomicU8::new(log::NORMAL),
        });
        let journal = Arc::new(Journal {
            shared: shared.clone(),
            flusher: Mutex::new(None),
            checkpointing: Mutex::new(()),
            tap: std::sync::OnceLock::new(),
            _lock: lock,
        });
        let sink: Arc<dyn EventSink> = journal.clone();

        let replay = |engine: &Engine, offset: u64, after: u64| {
            replay_log(&log_path, offset, after, |ev| engine.replay(ev))
                .map_err(io_err(format!("read {}", log_path.display())))
        };
        let (engine, from_snapshot, (n, seq, good, warn)) = match snap {
            Some((h, st)) => {
                let engine = Engine::from_state(config.clone(), st, sink.clone());
                let r = replay(&engine, file_off(h.log_offset), h.seq)?;
                // A snapshot whose offset does not start the next event is unusable.
                // (A cut right after the snapshot's offset is an interrupted append.)
                if r.0 == 0 && r.3.as_ref().is_some_and(|d| !d.cut) && h.log_offset < log_end {
                    warnings.push(format!(
                        "{SNAPSHOT} does not match the log at offset {}; rebuilding from the whole log",
                        h.log_offset
                    ));
                    let engine = Engine::new(config, sink.clone());
                    let r = replay(&engine, hdr, base_seq)?;
                    (engine, false, r)
                } else {
                    (engine, true, r)
                }
            }
            None => {
                let engine = Engine::new(config, sink.clone());
                let r = replay(&engine, hdr, base_seq)?;
                (engine, false, r)
            }
        };
        if !from_snapshot && base > 0 {
            // Should not happen (a compacted log always has its snapshot): say what is lost.
            let w = format!(
                "{LOG} was compacted at seq {base_seq} and no usable {SNAPSHOT} covers it: \
                 versions and records before that event are lost"
            );
            tracing::error!("{w}");
            warnings.push(w);
        }
        if let Some(w) = warn {
            tracing::warn!("{}", w.message);
            warnings.push(w.message);
        }
        if !from_snapshot && dir.join(SNAPSHOT).exists() {
            // Set the unusable snapshot aside so the next start does not trip on it again.
            std::fs::rename(dir.join(SNAPSHOT), dir.join(format!("{SNAPSHOT}.bad")))
                .map_err(io_err("set the bad snapshot aside"))?;
        }
        if good < log_len {
            // Keep the damaged bytes for a human, then cut them off so appends follow the
            // last good event.
            let mut f = dir::open_private(&log_path).map_err(io_err("reopen log"))?;
            f.seek(SeekFrom::Start(good)).map_err(io_err("seek log"))?;
            let mut tail = Vec::new();
            f.read_to_end(&mut tail).map_err(io_err("read log tail"))?;
            let aside = dir.join(format!("{LOG}.damaged-{good}"));
            // Kept if there is room: a full disk must not stop the mount.
            if let Err(e) = private_file()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&aside)
                .and_then(|mut f| f.write_all(&tail))
            {
                let w = format!("{}: cannot keep the damaged tail: {e}", aside.display());
                tracing::warn!("{w}");
                warnings.push(w);
            }
            let f = OpenOptions::new()
                .write(true)
                .open(&log_path)
                .map_err(io_err("open log"))?;
            f.set_len(good).map_err(io_err("truncate log"))?;
            f.sync_all().map_err(io_err("fsync log"))?;
        }
        {
            let mut b = shared.buf.lock();
            b.next_seq = seq;
            b.last_seq = seq;
            b.since_snapshot = n;
            let mut w = shared.written.lock();
            w.len = good;
            w.seq = seq;
            w.synced_len = good;
            w.synced_seq = seq;
            *shared.durable.lock() = seq;
        }
        let engine = Arc::new(engine);
        let s2 = shared.clone();
        let handle = std::thread::Builder::new()
            .name("coherent-journal".into())
            .spawn(move || flusher(s2))
            .map_err(io_err("spawn flusher"))?;
        *journal.flusher.lock() = Some(handle);
        Ok(Opened {
            engine,
            journal,
            warnings,
            from_snapshot,
            replayed: n,
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

    /// Whether the journal is past its bound (see the module doc): events are not being
    /// kept, so nothing that needs a durable record may go on.
    pub fn is_shedding(&self) -> bool {
        self.shared.mode.load(Ordering::SeqCst) != log::NORMAL
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
