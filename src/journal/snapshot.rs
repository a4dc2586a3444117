//! Snapshots and compaction: the engine's durable state written beside the log (tmp,
//! fsync, rename, fsync the directory), the log replaced by its tail past a snapshot, and
//! the periodic upkeep that decides when.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::file::{replace_durably, Replaced};
use super::format::{fnv64, LogHeader, SnapHeader, LOG, SNAPSHOT};
use super::log::{Shared, HOLD, NORMAL, SHED};
use crate::coherence::{DurableState, Engine, Timestamp};

/// The snapshots and compactions of one journal, one at a time (the lock is taken before
/// any engine lock).
pub(super) struct Snapshots {
    shared: Arc<Shared>,
    one: Mutex<()>,
}

impl Snapshots {
    pub(super) fn new(shared: Arc<Shared>) -> Snapshots {
        Snapshots {
            shared,
            one: Mutex::new(()),
        }
    }

    /// Writes a snapshot of `engine` (which must be the engine writing to this journal).
    pub(super) fn checkpoint(&self, engine: &Engine) -> io::Result<()> {
        let _one = self.one.lock();
        self.checkpoint_locked(engine).map(drop)
    }

    /// [`Snapshots::checkpoint`] with `one` held; returns the snapshot's seq and
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
        // Only a compaction moves the base, and it holds `one` too.
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
        let mut head = serde_json::to_vec(&header).map_err(io::Error::other)?;
        head.push(b'\n');
        replace_durably(
            &*self.shared.opts.io,
            &self.shared.dir,
            SNAPSHOT,
            &[&head, &body],
        )?;
        self.shared.buf.lock().since_snapshot = 0;
        Ok((state.seq, offset))
    }

    /// Compacts: drops the tombstones nothing refers to, writes a snapshot, and replaces
    /// the log with the events after it (under a header giving their logical base).
    /// Returns the number of tombstones dropped. On an error before the rename the old
    /// log stays, whole; after it the writer follows the new log, and what it writes is
    /// not durable until the directory fsync succeeds.
    pub(super) fn compact(&self, engine: &Engine) -> io::Result<usize> {
        let _one = self.one.lock();
        let dropped = engine.evict_tombstones();
        let (seq, offset) = self.checkpoint_locked(engine)?;
        let dir = &self.shared.dir;
        // Appends go on into the buffer meanwhile; writes to the file wait.
        let mut w = self.shared.written.lock();
        let from = offset - w.base + w.hdr;
        let mut tail = vec![0u8; (w.len - from) as usize];
        w.file.read_exact_at(&mut tail, from)?;
        let mut header = serde_json::to_vec(&LogHeader {
            log_base: offset,
            seq,
        })
        .map_err(io::Error::other)?;
        header.push(b'\n');
        let io = &*self.shared.opts.io;
        let dir_failed = match replace_durably(io, dir, LOG, &[&header, &tail]) {
            Ok(()) => None,
            Err(Replaced::NotRenamed(e)) => return Err(e),
            Err(Replaced::DirNotSynced(e)) => Some(e),
        };
        // The name is the new log from here: the writer follows it whatever fails next,
        // or what it writes goes to the old, unlinked file and is lost.
        let reopen_failed = match io.open_log(&dir.join(LOG)) {
            Ok(f) => {
                w.file = f;
                None
            }
            Err(e) => {
                w.reopen = true;
                Some(e)
            }
        };
        w.base = offset;
        w.hdr = header.len() as u64;
        w.len = w.hdr + tail.len() as u64;
        // The new file is fsynced whole.
        w.synced_len = w.len;
        w.synced_seq = w.seq;
        w.unsynced.clear();
        w.compactions += 1;
        w.dir_unsynced = dir_failed.is_some();
        let seq = w.seq;
        drop(w);
        if let Some(e) = dir_failed.or(reopen_failed) {
            // Fail closed: verbs wait until the flusher gets the log durable again.
            self.shared.failing(&e);
            return Err(e);
        }
        let mut d = self.shared.durable.lock();
        if *d < seq {
            *d = seq;
        }
        self.shared.durable_cv.notify_all();
        drop(d);
        tracing::debug!("compacted the state log at offset {offset}; {dropped} tombstones dropped");
        // The dropped state was many small allocations: hand the freed pages back to the
        // system, or the daemon's RSS keeps its high-water mark.
        // SAFETY: malloc_trim only returns free heap pages to the system; it has no
        // preconditions.
        #[cfg(target_env = "gnu")]
        unsafe {
            libc::malloc_trim(0);
        }
        Ok(dropped)
    }

    /// Periodic upkeep: evicts the ended records `may_evict` allows, compacts once the log
    /// holds `compact_bytes` of events, and else writes a snapshot once `snapshot_every`
    /// events have accumulated. Returns the number of records evicted.
    pub(super) fn maintain_with(
        &self,
        engine: &Engine,
        now: Timestamp,
        may_evict: &dyn Fn(&str) -> bool,
    ) -> io::Result<usize> {
        let n = engine.evict_if(now, may_evict);
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
