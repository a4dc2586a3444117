//! The registry of open write handles: the one index of them. An open for write that
//! acquired a hold registers its [`WriteHandle`] here and the store keeps only its key
//! ([`HandleState`]) in the open file's handle; flush, release and each checked write
//! find it by that key; a transfer asks here which handles are still open.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::handle::WriteHandle;
use super::liveness::holds_open;
use crate::identity::Session;
use crate::request_timeout::Started;
use crate::store::HandleState;

/// The write handles open now, from their open to their release.
#[derive(Default)]
pub(super) struct Handles {
    open: Mutex<Registry>,
    /// Signalled whenever a write handle is released.
    released: Condvar,
}

#[derive(Default)]
struct Registry {
    by_key: HashMap<u64, Arc<WriteHandle>>,
    /// Multi-host: the write handles that took no hold (an untracked path), by key: the
    /// file's backing inode and the session. Another host's transfer of the file once it
    /// is tracked under some name finds them here.
    unheld: HashMap<u64, (u64, String)>,
    next: u64,
}

impl Handles {
    /// Registers `w`; its key goes into the open file's handle.
    pub(super) fn insert(&self, w: Arc<WriteHandle>) -> HandleState {
        let mut r = self.open.lock();
        r.next += 1;
        let key = r.next;
        r.by_key.insert(key, w);
        HandleState(key)
    }

    /// Registers a write handle of `session` that took no hold, on the file of backing
    /// inode `ino`; its key goes into the open file's handle.
    pub(super) fn insert_unheld(&self, ino: u64, session: &str) -> HandleState {
        let mut r = self.open.lock();
        r.next += 1;
        let key = r.next;
        r.unheld.insert(key, (ino, session.to_string()));
        HandleState(key)
    }

    /// Is `key` a handle registered by [`Handles::insert_unheld`]?
    pub(super) fn is_unheld(&self, key: &HandleState) -> bool {
        self.open.lock().unheld.contains_key(&key.0)
    }

    /// Has `session` a write handle open on the file of backing inode `ino`, under any
    /// name, held or not?
    pub(super) fn writes_inode(&self, session: &str, ino: u64) -> bool {
        let r = self.open.lock();
        r.by_key
            .values()
            .any(|w| w.ino == ino && w.session.name == session)
            || r.unheld.values().any(|(i, s)| *i == ino && s == session)
    }

    /// The write handle of an open file (None: a handle the policy keeps nothing for).
    pub(super) fn get(&self, key: Option<&HandleState>) -> Option<Arc<WriteHandle>> {
        self.open.lock().by_key.get(&key?.0).cloned()
    }

    /// The handle is released: forget it and wake a transfer waiting for it.
    pub(super) fn remove(&self, key: Option<&HandleState>) {
        if let Some(k) = key {
            let mut r = self.open.lock();
            r.by_key.remove(&k.0);
            r.unheld.remove(&k.0);
        }
        self.released.notify_all();
    }

    /// Is a write handle open on any of `names`, or on the file `ino` under whatever name
    /// it was opened by?
    pub(super) fn open_on(&self, names: &[String], ino: Option<u64>) -> bool {
        let r = self.open.lock();
        r.by_key
            .values()
            .any(|w| names.contains(&w.path) || Some(w.ino) == ino)
            || r.unheld.values().any(|(i, _)| Some(*i) == ino)
    }

    /// A transfer was refused because write handles of `s` on `paths` are open. If each
    /// of them is about to be released (flushed, and its opener no longer has the file
    /// open under `mountpoint`), wait until they are, at most `wait` (and within the budget
    /// of the request that `started` then). True: there was something to wait for and it
    /// is gone (try again).
    pub(super) fn wait_for_releases(
        &self,
        s: &Session,
        paths: &[String],
        mountpoint: &Path,
        wait: Duration,
        started: Started,
    ) -> bool {
        let mine = |w: &WriteHandle| w.session.name == s.name && paths.contains(&w.path);
        let pending: Vec<Arc<WriteHandle>> = self
            .open
            .lock()
            .by_key
            .values()
            .filter(|w| mine(w))
            .cloned()
            .collect();
        if pending.is_empty() {
            return false;
        }
        for w in &pending {
            if !w.flushed() || holds_open(w.pid, &mountpoint.join(&w.path)) {
                return false;
            }
        }
        let deadline = started.deadline(wait);
        let mut open = self.open.lock();
        while open.by_key.values().any(|w| mine(w)) {
            if self.released.wait_until(&mut open, deadline).timed_out() {
                return !open.by_key.values().any(|w| mine(w));
            }
        }
        true
    }
}
