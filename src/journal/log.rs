//! The log: appends into a memory buffer (under the engine's locks, so the log order is
//! the application order), a flusher that writes and fsyncs it (group commit), the wait
//! for durability, and what a failed write or fsync does (cut back, keep, poison, retry).

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::file::LogFile;
use super::format::LOG;
use super::options::JournalOptions;
use crate::coherence::Event;

/// How often a failing journal tries to write again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Buffered bytes during an outage past which a warning is logged (once).
pub const BUFFER_WARN: usize = 64 << 20;

/// How the journal keeps events (docs/design.md#state-log).
pub(super) const NORMAL: u8 = 0;
/// Past the bound during an outage: events are not kept until a snapshot covers them.
pub(super) const SHED: u8 = 1;
/// A snapshot covering the events not kept is being written: events after its barrier
/// are buffered but not written until it is on disk.
pub(super) const HOLD: u8 = 2;

pub(super) struct Buf {
    pub(super) next_seq: u64,
    pub(super) bytes: Vec<u8>,
    /// Seq of the last event in `bytes` (or written before).
    pub(super) last_seq: u64,
    pub(super) since_snapshot: u64,
    /// Events not kept since the journal began shedding.
    pub(super) shed: u64,
    /// The flusher sleeps until the next append (nothing to write or sync).
    pub(super) idle: bool,
}

pub(super) struct Written {
    pub(super) file: Arc<dyn LogFile>,
    pub(super) len: u64,
    pub(super) seq: u64,
    /// Length and seq at the last successful fsync: what a failure cuts back to.
    pub(super) synced_len: u64,
    pub(super) synced_seq: u64,
    /// Bytes written after `synced_len` (put back in the buffer if a write fails).
    pub(super) unsynced: Vec<u8>,
    /// Number of cut-backs so far: an fsync that straddles one proves nothing.
    pub(super) cuts: u64,
    /// Number of compactions so far: an fsync that straddles one was of the old file.
    pub(super) compactions: u64,
    /// The logical offset of the file's first event and the length of its header line:
    /// `len`, `synced_len` are file offsets, logical = file - hdr + base.
    pub(super) base: u64,
    pub(super) hdr: u64,
    /// A compaction renamed a new log into place but the directory fsync failed: nothing
    /// written since is durable (a crash may bring the old name back) until one succeeds.
    pub(super) dir_unsynced: bool,
    /// A compaction renamed a new log into place but could not open it: `file` is the
    /// old, unlinked one, and nothing is written until the new one is open.
    pub(super) reopen: bool,
}

impl Written {
    pub(super) fn logical(&self, file_off: u64) -> u64 {
        file_off - self.hdr + self.base
    }
}

pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) opts: JournalOptions,
    pub(super) buf: Mutex<Buf>,
    /// Held by whoever moves bytes from `buf` to the file: keeps them in order.
    pub(super) written: Mutex<Written>,
    pub(super) durable: Mutex<u64>,
    pub(super) durable_cv: Condvar,
    pub(super) wake: Condvar,
    pub(super) stop: AtomicBool,
    /// A write or fsync failed and has not succeeded since (verbs are refused).
    pub(super) poisoned: AtomicBool,
    pub(super) warned_buffer: AtomicBool,
    /// [`NORMAL`], [`SHED`] or [`HOLD`].
    pub(super) mode: AtomicU8,
}

impl Shared {
    /// A journal over the log file `file`, positioned by [`Shared::start_at`].
    pub(super) fn new(dir: PathBuf, opts: JournalOptions, file: Arc<dyn LogFile>) -> Shared {
        Shared {
            dir,
            opts,
            buf: Mutex::new(Buf {
                next_seq: 0,
                bytes: Vec::new(),
                last_seq: 0,
                since_snapshot: 0,
                shed: 0,
                idle: false,
            }),
            written: Mutex::new(Written {
                file,
                len: 0,
                seq: 0,
                synced_len: 0,
                synced_seq: 0,
                unsynced: Vec::new(),
                cuts: 0,
                compactions: 0,
                base: 0,
                hdr: 0,
                dir_unsynced: false,
                reopen: false,
            }),
            durable: Mutex::new(0),
            durable_cv: Condvar::new(),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            warned_buffer: AtomicBool::new(false),
            mode: AtomicU8::new(NORMAL),
        }
    }

    /// Positions the journal after recovery: the log file holds whole events up to file
    /// offset `len` (logical base `base`, header `hdr` bytes), the last of them `seq`,
    /// `since_snapshot` of them after the snapshot.
    pub(super) fn start_at(&self, seq: u64, since_snapshot: u64, len: u64, base: u64, hdr: u64) {
        let mut b = self.buf.lock();
        b.next_seq = seq;
        b.last_seq = seq;
        b.since_snapshot = since_snapshot;
        let mut w = self.written.lock();
        w.len = len;
        w.seq = seq;
        w.synced_len = len;
        w.synced_seq = seq;
        w.base = base;
        w.hdr = hdr;
        *self.durable.lock() = seq;
    }

    /// Opens the log a compaction renamed into place, if that failed before.
    fn follow_rename(&self, w: &mut Written) -> io::Result<()> {
        if w.reopen {
            let f = self
                .opts
                .io
                .open_log(&self.dir.join(LOG))
                .inspect_err(|e| {
                    self.failing(e);
                })?;
            w.file = f;
            w.reopen = false;
        }
        Ok(())
    }

    /// Moves the buffer to the file (no fsync). Returns (last seq written, log length).
    pub(super) fn write_pending(&self) -> io::Result<(u64, u64)> {
        let mut w = self.written.lock();
        if self.mode.load(Ordering::SeqCst) == HOLD {
            // Held back until the snapshot covering the events not kept is on disk.
            return Ok((w.seq, w.len));
        }
        self.follow_rename(&mut w)?;
        let (bytes, last) = {
            let mut b = self.buf.lock();
            (std::mem::take(&mut b.bytes), b.last_seq)
        };
        if !bytes.is_empty() {
            if let Err(e) = w.file.append(&bytes) {
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
    pub(super) fn cut_back(&self, w: &mut Written, failed: Vec<u8>, why: &io::Error) {
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
    pub(super) fn flush(&self) -> io::Result<()> {
        if self.poisoned.load(Ordering::SeqCst) {
            // The file may still be longer than its last whole fsynced record.
            let mut w = self.written.lock();
            self.follow_rename(&mut w)?;
            if w.file.size()? != w.len {
                w.file.set_len(w.len)?;
            }
        }
        let (seq, len) = self.write_pending()?;
        if *self.durable.lock() >= seq {
            return Ok(());
        }
        // fsync outside the write lock so appends and writes go on meanwhile.
        let (fd, cuts, compactions, dir_unsynced) = {
            let w = self.written.lock();
            (w.file.clone(), w.cuts, w.compactions, w.dir_unsynced)
        };
        if let Err(e) = fd.sync_data() {
            // What the failed fsync covered may not be on disk: write it all again.
            let mut w = self.written.lock();
            self.cut_back(&mut w, Vec::new(), &e);
            return Err(e);
        }
        if dir_unsynced {
            // The file is on disk; its name is not until the directory is.
            self.opts.io.sync_dir(&self.dir)?;
        }
        {
            let mut w = self.written.lock();
            // Everything up to `len` is on disk (a cut_back since would have lowered it).
            if w.cuts != cuts {
                return Err(io::Error::other("the log was cut back during an fsync"));
            }
            if w.compactions == compactions {
                w.dir_unsynced &= !dir_unsynced;
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

    pub(super) fn flush_or_poison(&self) {
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
    pub(super) fn failing(&self, e: &io::Error) {
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

impl Shared {
    /// Appends `ev` to the buffer, assigning its seq.
    pub(super) fn append(&self, ev: &mut Event) {
        let mut b = self.buf.lock();
        if b.idle {
            // Once per group commit at most: the flusher sleeps only when all is durable.
            b.idle = false;
            self.wake.notify_one();
        }
        b.next_seq += 1;
        ev.seq = b.next_seq;
        b.last_seq = ev.seq;
        b.since_snapshot += 1;
        let mode = self.mode.load(Ordering::SeqCst);
        if mode == SHED {
            b.shed += 1;
            return;
        }
        if mode == NORMAL
            && b.bytes.len() >= self.opts.buffer_limit
            && self.poisoned.load(Ordering::SeqCst)
        {
            self.mode.store(SHED, Ordering::SeqCst);
            b.shed = 1;
            tracing::error!(
                "state log {}: {} KiB of events kept in memory while the log cannot be \
                 written (the bound): further events are not kept until the disk takes \
                 writes again and a snapshot covers them; verbs and writes to handed files \
                 are refused meanwhile, other writes go on",
                self.dir.display(),
                b.bytes.len() >> 10
            );
            return;
        }
        serde_json::to_writer(&mut b.bytes, &*ev).expect("events serialize");
        b.bytes.push(b'\n');
    }
}

pub(super) fn flusher(s: Arc<Shared>) {
    loop {
        {
            let mut b = s.buf.lock();
            if s.stop.load(Ordering::SeqCst) {
                break;
            }
            let poisoned = s.poisoned.load(Ordering::SeqCst);
            if !poisoned
                && s.mode.load(Ordering::SeqCst) == NORMAL
                && b.bytes.is_empty()
                && *s.durable.lock() >= b.last_seq
            {
                // Everything is on disk: sleep until an append rather than waking every
                // `flush_interval` (200 times a second) in an idle mount. Any wake-up
                // looks again from the top.
                b.idle = true;
                s.wake.wait(&mut b);
                b.idle = false;
                continue;
            }
            let wait = if poisoned {
                RETRY_EVERY
            } else {
                s.opts.flush_interval
            };
            s.wake.wait_for(&mut b, wait);
        }
        s.flush_or_poison();
    }
}
