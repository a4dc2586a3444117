//! The state log and snapshots (DESIGN.md §8): durability and recovery of the engine.
//!
//! State directory layout:
//! - `lock`: held with `flock(LOCK_EX)` by the daemon using the directory; holds its pid;
//! - `events.log`: one JSON event per line (the §8 schema), `seq` 1, 2, 3, ... with no gap.
//!   Offsets in the log are *logical*: they never go back. After a compaction the file
//!   starts with a header line `{"log_base":B,"seq":S}`: its first event (seq S + 1) is at
//!   logical offset B; a log without one starts at logical offset 0, seq 1;
//! - `snapshot.json`: a compacted state. Line 1 is a header
//!   `{"format":1,"seq":N,"log_offset":O,"len":L,"fnv":H}`; then L bytes of the
//!   [`DurableState`] as JSON whose FNV-1a 64 is H. It equals the log's first N events,
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
//! `flush_interval` (group commit); a verb calls `wait_durable`, which flushes at once and
//! returns when its event is on disk. Concurrent waiters share one fsync.
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

use crate::coherence::{Config, DurableState, Engine, Event, EventSink, Timestamp};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

pub const LOG: &str = "events.log";
pub const SNAPSHOT: &str = "snapshot.json";
pub const LOCK: &str = "lock";

/// How often a failing journal tries to write again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Buffered bytes during an outage past which a warning is logged (once).
pub const BUFFER_WARN: usize = 64 << 20;
/// Default of [`JournalOptions::buffer_limit`].
pub const BUFFER_LIMIT: usize = 64 << 20;

/// How the journal keeps events (see the module doc).
const NORMAL: u8 = 0;
/// Past the bound during an outage: events are not kept until a snapshot covers them.
const SHED: u8 = 1;
/// A snapshot covering the events not kept is being written: events after its barrier
/// are buffered but not written until it is on disk.
const HOLD: u8 = 2;

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
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            flush_interval: Duration::from_millis(5),
            snapshot_every: 100_000,
            compact_bytes: 8 << 20,
            buffer_limit: BUFFER_LIMIT,
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
        }
    }
}

impl std::error::Error for JournalError {}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> JournalError {
    let what = what.into();
    move |err| JournalError::Io { what, err }
}

struct Buf {
    next_seq: u64,
    bytes: Vec<u8>,
    /// Seq of the last event in `bytes` (or written before).
    last_seq: u64,
    since_snapshot: u64,
    /// Events not kept since the journal began shedding.
    shed: u64,
}

struct Written {
    file: File,
    len: u64,
    seq: u64,
    /// Length and seq at the last successful fsync: what a failure cuts back to.
    synced_len: u64,
    synced_seq: u64,
    /// Bytes written after `synced_len` (put back in the buffer if a write fails).
    unsynced: Vec<u8>,
    /// Number of cut-backs so far: an fsync that straddles one proves nothing.
    cuts: u64,
    /// Number of compactions so far: an fsync that straddles one was of the old file.
    compactions: u64,
    /// The logical offset of the file's first event and the length of its header line:
    /// `len`, `synced_len` are file offsets, logical = file - hdr + base.
    base: u64,
    hdr: u64,
}

impl Written {
    fn logical(&self, file_off: u64) -> u64 {
        file_off - self.hdr + self.base
    }
}

/// The first line of a compacted log.
#[derive(serde::Serialize, serde::Deserialize)]
struct LogHeader {
    log_base: u64,
    seq: u64,
}

/// The header of the log at `path`, with its length in bytes (None: a log from offset 0).
fn read_log_header(path: &Path) -> io::Result<Option<(LogHeader, u64)>> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut head = vec![0u8; 256];
    let mut n = 0;
    while n < head.len() {
        let k = f.read(&mut head[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    head.truncate(n);
    if !head.starts_with(b"{\"log_base\"") {
        return Ok(None);
    }
    let Some(nl) = head.iter().position(|&b| b == b'\n') else {
        return Err(io::Error::other("log header line cut short"));
    };
    let h: LogHeader = serde_json::from_slice(&head[..nl]).map_err(io::Error::other)?;
    Ok(Some((h, nl as u64 + 1)))
}

struct Shared {
    dir: PathBuf,
    opts: JournalOptions,
    buf: Mutex<Buf>,
    /// Held by whoever moves bytes from `buf` to the file: keeps them in order.
    written: Mutex<Written>,
    durable: Mutex<u64>,
    durable_cv: Condvar,
    wake: Condvar,
    stop: AtomicBool,
    /// A write or fsync failed and has not succeeded since (verbs are refused).
    poisoned: AtomicBool,
    warned_buffer: AtomicBool,
    /// [`NORMAL`], [`SHED`] or [`HOLD`].
    mode: std::sync::atomic::AtomicU8,
}

impl Shared {
    /// Moves the buffer to the file (no fsync). Returns (last seq written, log length).
    fn write_pending(&self) -> io::Result<(u64, u64)> {
        let mut w = self.written.lock();
        if self.mode.load(Ordering::SeqCst) == HOLD {
            // Held back until the snapshot covering the events not kept is on disk.
            return Ok((w.seq, w.len));
        }
        let (bytes, last) = {
            let mut b = self.buf.lock();
            (std::mem::take(&mut b.bytes), b.last_seq)
        };
        if !bytes.is_empty() {
            if let Err(e) = w.file.write_all(&bytes) {
                self.cut_back(&mut w, bytes, &e);
                return Err(e);
            }
            w.len += bytes.len() as u64;
            w.seq = last;
            w.unsynced.extend_from_slice(&bytes);
        }
        Ok((w.seq, w.len))
    }

    /// After a failed write or fsync: cut the log back to its last fsynced length (no torn
    /// record stays) and put everything written since, then `failed`, back at the front
    /// of the buffer, to be written again in order.
    /// The journal is failing from here on (until a flush succeeds), which also makes the
    /// next flush check the file's length before it appends.
    fn cut_back(&self, w: &mut Written, failed: Vec<u8>, why: &io::Error) {
        self.failing(why);
        let mut again = std::mem::take(&mut w.unsynced);
        again.extend_from_slice(&failed);
        if let Err(e) = w.file.set_len(w.synced_len) {
            // Retried with the next write (`ensure_cut`): the length is what matters.
            tracing::warn!("state log {}: cannot cut back yet: {e}", self.dir.display());
        }
        w.len = w.synced_len;
        w.seq = w.synced_seq;
        w.cuts += 1;
        let mut b = self.buf.lock();
        again.extend_from_slice(&b.bytes);
        b.bytes = again;
        if b.bytes.len() > BUFFER_WARN && !self.warned_buffer.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "state log {}: {} MiB of events buffered in memory until the log can be written",
                self.dir.display(),
                b.bytes.len() >> 20
            );
        }
    }

    /// Writes and fsyncs everything appended so far.
    fn flush(&self) -> io::Result<()> {
        if self.poisoned.load(Ordering::SeqCst) {
            // The file may still be longer than its last whole fsynced record.
            let w = self.written.lock();
            if w.file.metadata()?.len() != w.len {
                w.file.set_len(w.len)?;
            }
        }
        let (seq, len) = self.write_pending()?;
        if *self.durable.lock() >= seq {
            return Ok(());
        }
        // fsync outside the write lock so appends and writes go on meanwhile.
        let (fd, cuts, compactions) = {
            let w = self.written.lock();
            (w.file.try_clone()?, w.cuts, w.compactions)
        };
        if let Err(e) = fd.sync_data() {
            // What the failed fsync covered may not be on disk: write it all again.
            let mut w = self.written.lock();
            self.cut_back(&mut w, Vec::new(), &e);
            return Err(e);
        }
        {
            let mut w = self.written.lock();
            // Everything up to `len` is on disk (a cut_back since would have lowered it).
            if w.cuts != cuts {
                return Err(io::Error::other("the log was cut back during an fsync"));
            }
            // A compaction meanwhile fsynced a new file holding all of it.
            if w.compactions == compactions && w.synced_len < len && len <= w.len {
                let n = (len - w.synced_len) as usize;
                w.unsynced.drain(..n);
                w.synced_len = len;
                w.synced_seq = seq;
            }
        }
        let mut d = self.durable.lock();
        if *d < seq {
            *d = seq;
        }
        self.durable_cv.notify_all();
        Ok(())
    }

    fn flush_or_poison(&self) {
        match self.flush() {
            Ok(()) => {
                if self.poisoned.swap(false, Ordering::SeqCst) {
                    self.warned_buffer.store(false, Ordering::SeqCst);
                    if self.mode.load(Ordering::SeqCst) == NORMAL {
                        tracing::warn!(
                            "state log {}: writable again; every buffered event is on disk",
                            self.dir.display()
                        );
                    } else {
                        tracing::warn!(
                            "state log {}: writable again; the buffered events are on disk, \
                             and a snapshot will cover those not kept",
                            self.dir.display()
                        );
                    }
                }
            }
            Err(e) => {
                self.failing(&e);
                self.durable_cv.notify_all();
            }
        }
    }

    /// Marks the journal failing (verbs refused), saying so once per outage.
    fn failing(&self, e: &io::Error) {
        if !self.poisoned.swap(true, Ordering::SeqCst) {
            tracing::error!(
                "state log {}: {e}; verbs are refused (io_error) until it can be \
                 written again (retrying every {}s, events are kept in memory)",
                self.dir.display(),
                RETRY_EVERY.as_secs()
            );
        }
    }
}

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

/// Sees each event before the journal writes it (the coordinator: it names the host,
/// feeds other hosts, and keeps back the events of a step until the step is published).
pub trait Tap: Send + Sync {
    /// `false`: the tap keeps the event; it is written later with [`Journal::append_kept`].
    /// Called with engine locks held: must not block.
    fn on_append(&self, ev: &mut Event) -> bool;
}

impl EventSink for Journal {
    fn append(&self, ev: &mut Event) {
        if let Some(t) = self.tap.get() {
            if !t.on_append(ev) {
                return;
            }
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

    /// Writes `ev` (assigning its seq) past the tap: an event a tap kept, or another
    /// host's.
    pub fn append_kept(&self, ev: &mut Event) {
        let mut b = self.shared.buf.lock();
        b.next_seq += 1;
        ev.seq = b.next_seq;
        b.last_seq = ev.seq;
        b.since_snapshot += 1;
        let sh = &self.shared;
        let mode = sh.mode.load(Ordering::SeqCst);
        if mode == SHED {
            b.shed += 1;
            return;
        }
        if mode == NORMAL
            && b.bytes.len() >= sh.opts.buffer_limit
            && sh.poisoned.load(Ordering::SeqCst)
        {
            sh.mode.store(SHED, Ordering::SeqCst);
            b.shed = 1;
            tracing::error!(
                "state log {}: {} KiB of events kept in memory while the log cannot be \
                 written (the bound): further events are not kept until the disk takes \
                 writes again and a snapshot covers them; verbs and writes to handed files \
                 are refused meanwhile, other writes go on",
                sh.dir.display(),
                b.bytes.len() >> 10
            );
            return;
        }
        serde_json::to_writer(&mut b.bytes, &*ev).expect("events serialize");
        b.bytes.push(b'\n');
    }

    /// Whether the journal is past its bound (see the module doc): events are not being
    /// kept, so nothing that needs a durable record may go on.
    pub fn is_shedding(&self) -> bool {
        self.shared.mode.load(Ordering::SeqCst) != NORMAL
    }

    /// (bytes of events kept in memory, events not kept, the bound): for `status`.
    pub fn backlog(&self) -> (usize, u64, usize) {
        let b = self.shared.buf.lock();
        (b.bytes.len(), b.shed, self.shared.opts.buffer_limit)
    }
}

fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SnapHeader {
    format: u32,
    seq: u64,
    log_offset: u64,
    len: u64,
    fnv: u64,
}

/// Options for a file of the state directory: created 0600 whatever the umask (the daemon
/// runs with umask 0). Every file written there goes through this.
pub fn private_file() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600);
    o
}

/// Makes `dir` (creating it 0700) the daemon's private state directory: refuses one that
/// another user owns or group or others can write (they could rewrite the records),
/// tightens it to 0700 and its files to 0600, and removes the temporaries an interrupted
/// snapshot or compaction left (they are never needed and may fill the disk).
fn prepare_dir(dir: &Path) -> Result<(), JournalError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(format!("create {}", dir.display())))?;
    let md = std::fs::metadata(dir).map_err(io_err(format!("stat {}", dir.display())))?;
    let me = unsafe { libc::geteuid() };
    let not_private = |why: String| JournalError::NotPrivate {
        dir: dir.to_path_buf(),
        why,
    };
    if md.uid() != me {
        return Err(not_private(format!(
            "is owned by uid {}, not {me}",
            md.uid()
        )));
    }
    if md.mode() & 0o022 != 0 {
        return Err(not_private(format!(
            "can be written by {} (mode {:o})",
            if md.mode() & 0o002 != 0 {
                "anyone"
            } else {
                "its group"
            },
            md.mode() & 0o7777
        )));
    }
    if md.mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(format!("chmod 700 {}", dir.display())))?;
    }
    for tmp in [format!("{SNAPSHOT}.tmp"), format!("{LOG}.tmp")] {
        match std::fs::remove_file(dir.join(&tmp)) {
            Ok(()) => tracing::info!("removed {tmp} left by an interrupted write"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("remove {tmp}"))(e)),
        }
    }
    let entries = std::fs::read_dir(dir).map_err(io_err(format!("list {}", dir.display())))?;
    for e in entries.flatten() {
        let Ok(md) = e.metadata() else { continue };
        if md.is_file() && md.mode() & 0o077 != 0 {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o600))
                .map_err(io_err(format!("chmod 600 {}", e.path().display())))?;
        }
    }
    Ok(())
}

fn lock_dir(dir: &Path) -> Result<File, JournalError> {
    let path = dir.join(LOCK);
    let mut f = private_file()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err(format!("open {}", path.display())))?;
    // SAFETY: flock on a valid open descriptor.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        return Err(JournalError::Locked {
            dir: dir.to_path_buf(),
            pid: s.trim().parse().ok(),
        });
    }
    // The pid is for a human (and the `Locked` message): a full disk must not stop a mount.
    if let Err(e) = f
        .set_len(0)
        .and_then(|()| f.write_all(format!("{}\n", std::process::id()).as_bytes()))
    {
        tracing::warn!("{}: cannot record the pid: {e}", path.display());
    }
    Ok(f)
}

/// Reads and checks `snapshot.json`. Err: why it cannot be used.
fn read_snapshot(dir: &Path) -> Result<Option<(SnapHeader, DurableState)>, String> {
    let data = match std::fs::read(dir.join(SNAPSHOT)) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let nl = data
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no header line")?;
    let h: SnapHeader =
        serde_json::from_slice(&data[..nl]).map_err(|e| format!("bad header: {e}"))?;
    let body = &data[nl + 1..];
    if h.format != 1 || body.len() as u64 != h.len || fnv64(body) != h.fnv {
        return Err("checksum or length mismatch".into());
    }
    let st: DurableState = serde_json::from_slice(body).map_err(|e| format!("bad body: {e}"))?;
    if st.seq != h.seq {
        return Err("seq mismatch".into());
    }
    Ok(Some((h, st)))
}

/// Damage found by [`replay_log`].
#[derive(Debug, Clone)]
pub struct Damage {
    /// The log ends in a partial line (an interrupted append), not in a bad one.
    pub cut: bool,
    pub message: String,
}

/// Replays `events.log` from `offset` (expecting seq `after + 1` first) into `apply`.
/// Stops at the first incomplete or invalid line. Returns (events applied, last seq,
/// offset of the end of the last good line, warning if damage was found).
///
/// Parsing dominates recovery, so it is pipelined: this thread reads blocks of whole
/// lines and hands them to parser threads, and applies the parsed blocks in log order
/// while the next ones are being parsed.
pub fn replay_log(
    path: &Path,
    offset: u64,
    after: u64,
    apply: impl FnMut(&Event),
) -> io::Result<(u64, u64, u64, Option<Damage>)> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, after, 0, None)),
        Err(e) => return Err(e),
    };
    f.seek(SeekFrom::Start(offset))?;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    std::thread::scope(|sc| {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..threads {
            let queue = queue.clone();
            sc.spawn(move || loop {
                // The guard ends with the statement: one parser waits, the others queue.
                let job = queue.lock().recv();
                let Ok((bytes, back)) = job else { break };
                // The reader may have stopped (damage found): nobody to tell.
                let _ = back.send(parse_block(&bytes));
            });
        }
        // `jobs` is dropped when `feed` returns, however it returns: the parsers end.
        feed(path, &mut f, offset, after, threads, jobs, apply)
    })
}

/// A block of whole lines to parse, and where to send the result.
type Job = (Vec<u8>, mpsc::SyncSender<Parsed>);
/// Each line's length (with its newline) and its event.
type Parsed = Vec<(usize, Result<Event, String>)>;

/// The reading and applying side of [`replay_log`].
fn feed(
    path: &Path,
    f: &mut File,
    offset: u64,
    after: u64,
    threads: usize,
    jobs: mpsc::Sender<Job>,
    mut apply: impl FnMut(&Event),
) -> io::Result<(u64, u64, u64, Option<Damage>)> {
    // Blocks of about 1 MiB (no bigger than what is left: small logs, tests); a few in
    // flight keep every parser busy.
    let left = f.metadata()?.len().saturating_sub(offset) as usize;
    let block_len = left.clamp(4096, 1 << 20);
    let in_flight = threads * 2;
    let (mut n, mut seq, mut good) = (0u64, after, offset);
    let warn = |what: String, seq: u64, cut: bool| {
        Some(Damage {
            cut,
            message: format!(
                "{}: {what}; recovered the {seq} events before it",
                path.display()
            ),
        })
    };
    let mut pending: VecDeque<mpsc::Receiver<Parsed>> = VecDeque::new();
    let mut carry: Vec<u8> = Vec::new();
    let mut eof = false;
    loop {
        while !eof && pending.len() < in_flight {
            let mut data = std::mem::take(&mut carry);
            // Read until the block holds a whole line (a line may be longer than a block).
            let whole = loop {
                let target = data.len() + block_len;
                while !eof && data.len() < target {
                    let old = data.len();
                    data.resize(target, 0);
                    let got = f.read(&mut data[old..])?;
                    data.truncate(old + got);
                    eof = got == 0;
                }
                let whole = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                if whole > 0 || eof {
                    break whole;
                }
            };
            carry = data.split_off(whole);
            if whole > 0 {
                let (back, result) = mpsc::sync_channel(1);
                if jobs.send((data, back)).is_err() {
                    return Err(io::Error::other("log parser threads ended"));
                }
                pending.push_back(result);
            }
        }
        let Some(result) = pending.pop_front() else {
            // Everything read and applied; what is left is a line cut short.
            let w = (!carry.is_empty()).then(|| {
                warn(
                    format!(
                        "cut in the middle of an event at byte {good} ({} bytes dropped)",
                        carry.len()
                    ),
                    seq,
                    true,
                )
            });
            return Ok((n, seq, good, w.flatten()));
        };
        let parsed = result
            .recv()
            .map_err(|_| io::Error::other("a log parser thread failed"))?;
        for (len, parsed) in parsed {
            match parsed {
                Ok(ev) if ev.seq == seq + 1 => {
                    apply(&ev);
                    seq = ev.seq;
                    n += 1;
                    good += len as u64;
                }
                Ok(ev) => {
                    let w = format!(
                        "event at byte {good} has seq {} where {} was expected",
                        ev.seq,
                        seq + 1
                    );
                    return Ok((n, seq, good, warn(w, seq, false)));
                }
                Err(e) => {
                    return Ok((
                        n,
                        seq,
                        good,
                        warn(format!("unreadable event at byte {good} ({e})"), seq, false),
                    ))
                }
            }
        }
    }
}

/// Parses the newline-terminated lines of `bytes`, stopping at the first bad one (nothing
/// after it is used anyway).
fn parse_block(bytes: &[u8]) -> Parsed {
    let mut out = Vec::with_capacity(bytes.len() / 200 + 1);
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        let r = serde_json::from_slice::<Event>(&line[..line.len() - 1]).map_err(|e| e.to_string());
        let bad = r.is_err();
        out.push((line.len(), r));
        if bad {
            break;
        }
    }
    out
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
            }),
            written: Mutex::new(Written {
                file: private_file()
                    .create(true)
                    .read(true)
                    .append(true)
                    .open(&log_path)
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
            mode: std::sync::atomic::AtomicU8::new(NORMAL),
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
            let mut f = File::open(&log_path).map_err(io_err("reopen log"))?;
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
            (
                w.file.try_clone()?,
                start,
                start - w.base + w.hdr,
                end - start,
            )
        };
        let n = left.min(max as u64) as usize;
        let mut buf = vec![0u8; n];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, file_off)?;
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

    /// Whether a write or fsync of the log failed (events are no longer durable), or the
    /// journal is past its bound and no snapshot covers the events not kept yet.
    pub fn is_poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::SeqCst) || self.is_shedding()
    }

    /// Writes a snapshot of `engine` (which must be the engine writing to this journal).
    pub fn checkpoint(&self, engine: &Engine) -> io::Result<()> {
        let _one = self.checkpointing.lock();
        self.checkpoint_locked(engine).map(drop)
    }

    /// [`Journal::checkpoint`] with `checkpointing` held; returns the snapshot's seq and
    /// logical log offset.
    fn checkpoint_locked(&self, engine: &Engine) -> io::Result<(u64, u64)> {
        let sh = &self.shared;
        // Shedding: at the barrier (no event can be appended), write what was kept and
        // hold back what comes after until this snapshot covers the events not kept.
        let resync = sh.mode.load(Ordering::SeqCst) == SHED;
        let (state, pos) = engine.durable_state_with(|| {
            let r = sh.write_pending();
            if resync && r.is_ok() {
                sh.mode.store(HOLD, Ordering::SeqCst);
                let last = sh.buf.lock().last_seq;
                sh.written.lock().seq = last;
            }
            r.map(|(_, len)| (sh.written.lock().seq, len))
        });
        let r = self.write_snapshot(&state, pos);
        if resync && sh.mode.load(Ordering::SeqCst) == HOLD {
            self.end_hold(&state, r.is_ok());
        }
        r
    }

    /// The end of a snapshot taken while shedding: on success the held events are
    /// written after it and events are kept again; on failure the journal sheds again
    /// (the next snapshot covers the held events too).
    fn end_hold(&self, state: &DurableState, ok: bool) {
        let sh = &self.shared;
        let mut b = sh.buf.lock();
        if ok {
            let shed = std::mem::take(&mut b.shed);
            sh.mode.store(NORMAL, Ordering::SeqCst);
            drop(b);
            let mut d = sh.durable.lock();
            if *d < state.seq {
                *d = state.seq;
            }
            sh.durable_cv.notify_all();
            drop(d);
            tracing::warn!(
                "state log {}: a snapshot at seq {} covers the {shed} event(s) not kept while \
                 the log could not be written; events are kept again",
                sh.dir.display(),
                state.seq
            );
            sh.wake.notify_all();
        } else {
            b.shed += b.bytes.len() as u64 / 150 + 1;
            b.bytes.clear();
            sh.mode.store(SHED, Ordering::SeqCst);
        }
    }

    /// Writes the snapshot of `state`, taken at log position `pos` (the last seq written
    /// and the log file's length then).
    fn write_snapshot(
        &self,
        state: &DurableState,
        pos: io::Result<(u64, u64)>,
    ) -> io::Result<(u64, u64)> {
        let (seq, file_len) = pos?;
        debug_assert_eq!(seq, state.seq);
        // Only a compaction moves the base, and it holds `checkpointing` too.
        let offset = self.shared.written.lock().logical(file_len);
        self.shared.flush()?;
        let body = serde_json::to_vec(&state).map_err(io::Error::other)?;
        let header = SnapHeader {
            format: 1,
            seq: state.seq,
            log_offset: offset,
            len: body.len() as u64,
            fnv: fnv64(&body),
        };
        let dir = &self.shared.dir;
        let tmp = dir.join(format!("{SNAPSHOT}.tmp"));
        let written = (|| {
            let mut f = private_file()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            serde_json::to_writer(&mut f, &header).map_err(io::Error::other)?;
            f.write_all(b"\n")?;
            f.write_all(&body)?;
            f.sync_all()
        })();
        if let Err(e) = written {
            // A partial temporary must not keep the disk full.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, dir.join(SNAPSHOT))?;
        File::open(dir)?.sync_all()?;
        self.shared.buf.lock().since_snapshot = 0;
        Ok((state.seq, offset))
    }

    /// Compacts: drops the tombstones nothing refers to, writes a snapshot, and replaces
    /// the log with the events after it (under a header giving their logical base).
    /// Returns the number of tombstones dropped. On an error the old log stays, whole.
    pub fn compact(&self, engine: &Engine) -> io::Result<usize> {
        let _one = self.checkpointing.lock();
        let dropped = engine.evict_tombstones();
        let (seq, offset) = self.checkpoint_locked(engine)?;
        let dir = &self.shared.dir;
        let tmp = dir.join(format!("{LOG}.tmp"));
        // Appends go on into the buffer meanwhile; writes to the file wait.
        let mut w = self.shared.written.lock();
        let from = offset - w.base + w.hdr;
        let mut tail = vec![0u8; (w.len - from) as usize];
        std::os::unix::fs::FileExt::read_exact_at(&w.file, &mut tail, from)?;
        let mut header = serde_json::to_vec(&LogHeader {
            log_base: offset,
            seq,
        })
        .map_err(io::Error::other)?;
        header.push(b'\n');
        let written = (|| {
            let mut f = private_file()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(&header)?;
            f.write_all(&tail)?;
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, dir.join(LOG))?;
        File::open(dir)?.sync_all()?;
        w.file = private_file().read(true).append(true).open(dir.join(LOG))?;
        w.base = offset;
        w.hdr = header.len() as u64;
        w.len = w.hdr + tail.len() as u64;
        // The new file is fsynced whole.
        w.synced_len = w.len;
        w.synced_seq = w.seq;
        w.unsynced.clear();
        w.compactions += 1;
        let seq = w.seq;
        drop(w);
        let mut d = self.shared.durable.lock();
        if *d < seq {
            *d = seq;
        }
        self.shared.durable_cv.notify_all();
        tracing::debug!("compacted the state log at offset {offset}; {dropped} tombstones dropped");
        // The dropped state was many small allocations: hand the freed pages back to the
        // system, or the daemon's RSS keeps its high-water mark.
        #[cfg(target_env = "gnu")]
        unsafe {
            libc::malloc_trim(0);
        }
        Ok(dropped)
    }

    /// Periodic upkeep for the mount (e.g. every few seconds): evicts ended records
    /// (`evict_after`), compacts once the log holds `compact_bytes` of events, and else
    /// writes a snapshot once `snapshot_every` events have accumulated. Returns the number
    /// of records evicted.
    pub fn maintain(&self, engine: &Engine, now: Timestamp) -> io::Result<usize> {
        let n = engine.evict(now);
        engine.prune();
        if self.shared.mode.load(Ordering::SeqCst) == SHED {
            // Past the bound: a snapshot covers the events not kept, once the disk takes it.
            return self.checkpoint(engine).map(|_| n);
        }
        let bytes = {
            let w = self.shared.written.lock();
            w.len - w.hdr
        };
        if bytes >= self.shared.opts.compact_bytes {
            self.compact(engine)?;
        } else if self.shared.buf.lock().since_snapshot >= self.shared.opts.snapshot_every {
            self.checkpoint(engine)?;
        }
        Ok(n)
    }
}

fn flusher(s: Arc<Shared>) {
    loop {
        {
            let mut b = s.buf.lock();
            if s.stop.load(Ordering::SeqCst) {
                break;
            }
            let wait = if s.poisoned.load(Ordering::SeqCst) {
                RETRY_EVERY
            } else {
                s.opts.flush_interval
            };
            s.wake.wait_for(&mut b, wait);
        }
        s.flush_or_poison();
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
