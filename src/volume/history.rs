//! The volume's side of the history (docs/history.md): at each commit of a tracked regular
//! file its content goes to the store before the engine counts the commit, and the index
//! line, with the version counted, right after; before the first write of a version the
//! store has not kept (a file the volume found, or changed behind its back), that content
//! is kept first as `base`, so the version before any session's change can be put back.

use std::os::fd::AsFd;
use std::path::Path;

use std::sync::Arc;

use crate::coherence::{CommitOp, Engine, Print, Timestamp, OLDER_PRINTS};
use crate::fs::WriteRoute;
use crate::history::{Entry, Kept};
use crate::identity::Session;
use crate::store::Backing;

use super::workspace::rel;

fn op_name(op: CommitOp) -> String {
    serde_json::to_value(op)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "write".into())
}

/// The content history of the volume's writes (docs/history.md): what a write is about to
/// replace is kept before it goes. None of it when the history is off.
pub(super) struct History {
    backing: Backing,
    engine: Arc<Engine>,
    store: Option<Arc<crate::history::Store>>,
}

impl History {
    pub(super) fn new(
        backing: Backing,
        engine: Arc<Engine>,
        store: Option<Arc<crate::history::Store>>,
    ) -> Self {
        History {
            backing,
            engine,
            store,
        }
    }

    /// The history's store (None: off), for the `history` verbs and the upkeep.
    pub(super) fn store(&self) -> Option<&Arc<crate::history::Store>> {
        self.store.as_ref()
    }

    /// The fingerprints of the versions of `p` before `below` the history kept (the newest
    /// few), for a transfer on several hosts to publish.
    pub(super) fn older_prints(&self, p: &str, below: u64) -> Vec<(u64, Print)> {
        let Some(store) = &self.store else {
            return Vec::new();
        };
        store
            .digests(p, below, OLDER_PRINTS)
            .into_iter()
            .map(|(v, size, digest)| (v, Print { size, digest }))
            .collect()
    }

    /// The backing file `p` open for reading, with its stat, if it is a regular file.
    fn open_backing(&self, p: &str) -> Option<(std::os::fd::OwnedFd, libc::stat)> {
        // O_NOATIME: keeping a version is not a use of the file (a read would move an atime
        // set by utimes, xfstests generic/258); refused (EPERM) when we do not own it.
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        let open = |f| crate::beneath::open_beneath(self.backing.fd(), Path::new(p), f, 0);
        let fd = match open(flags | libc::O_NOATIME) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(flags),
            r => r,
        }
        .ok()?;
        // SAFETY: an all-zero stat is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a stat buffer we own.
        if unsafe { libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut st) } != 0 {
            return None;
        }
        (st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some((fd, st))
    }

    /// The content of `fd` (the backing file `p`) taken into the store.
    fn keep(&self, p: &str, fd: std::os::fd::OwnedFd) -> Option<Kept> {
        match self.store.as_ref()?.keep_fd(fd.as_fd()) {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(path = %crate::names::display_name(p), "history: cannot keep a version: {e}");
                None
            }
        }
    }

    fn history_record(
        &self,
        p: &str,
        session: &str,
        op: String,
        version: u64,
        kept: Option<Kept>,
        now: Timestamp,
    ) {
        let Some(h) = self.store.as_ref() else {
            return;
        };
        h.record(Entry {
            path: p.to_string(),
            version,
            session: session.to_string(),
            ts: now.0,
            op,
            digest: kept.map(|k| crate::history::store_hex(&k.digest)),
            size: kept.map_or(0, |k| k.size),
            kept: kept.is_some_and(|k| k.stored),
            from: None,
        });
    }

    /// A commit of `p` by `s` (`commit` counts it and returns the version): the content
    /// kept first, the version recorded after. A removal (`unlink`, a rename away) records
    /// no content.
    pub(super) fn with_history(
        &self,
        p: &str,
        s: &Session,
        op: CommitOp,
        now: Timestamp,
        commit: impl FnOnce() -> u64,
    ) -> u64 {
        if self.store.is_none() {
            return commit();
        }
        let removes = matches!(op, CommitOp::Unlink | CommitOp::RenameAway);
        let h = self.store.as_ref().expect("checked");
        let opened = if removes { None } else { self.open_backing(p) };
        let kept = match opened {
            Some((fd, st)) if st.st_size as u64 > h.limits().max_file => {
                // Over the size limit: recorded by digest only, hashed off this request.
                let v = commit();
                h.record_large_later(
                    fd,
                    st,
                    Entry {
                        path: p.to_string(),
                        version: v,
                        session: s.name.clone(),
                        ts: now.0,
                        op: op_name(op),
                        digest: None,
                        size: st.st_size as u64,
                        kept: false,
                        from: None,
                    },
                );
                return v;
            }
            Some((fd, _)) => self.keep(p, fd),
            None => None,
        };
        let v = commit();
        self.history_record(p, &s.name, op_name(op), v, kept, now);
        v
    }

    /// Before a write route the volume permitted: the current content of each existing
    /// tracked file it may change, if the store does not have that version yet.
    pub(super) fn history_before(&self, route: &WriteRoute<'_>) {
        let Some(h) = self.store.as_ref() else {
            return;
        };
        let base = |path: Option<&Path>| {
            let Some(p) = rel(path) else { return };
            let Some(v) = self.engine.version(p) else {
                return;
            };
            if h.has(p, v) {
                return;
            }
            // A file over the size limit could not be put back anyway: no base.
            let Some((fd, st)) = self.open_backing(p) else {
                return;
            };
            if st.st_size as u64 > h.limits().max_file {
                return;
            }
            if let Some(k) = self.keep(p, fd) {
                self.history_record(p, "", "base".into(), v, Some(k), Timestamp::now());
            }
        };
        match *route {
            WriteRoute::Open { path, .. } | WriteRoute::Unlink { path } => base(path),
            WriteRoute::Setattr { path, set, .. } if set.size.is_some() => base(path),
            WriteRoute::Rename { from, to, .. } => {
                base(from);
                base(to);
            }
            _ => {}
        }
    }

    /// A directory renamed through the volume: its history moves with it.
    pub(super) fn history_moved_dir(&self, from: &str, to: &str, now: Timestamp) {
        if let Some(h) = &self.store {
            h.rename_dir(from, to, now.0);
        }
    }

    /// The source of a file rename through the volume: a removal at the version the engine
    /// counts for it (the current one plus one), recorded before the rename counts it.
    pub(super) fn history_moved(&self, p: &str, s: &Session, now: Timestamp) {
        if self.store.is_none() {
            return;
        }
        if let Some(v) = self.engine.version(p) {
            self.history_record(p, &s.name, "rename_away".into(), v + 1, None, now);
        }
    }
}
