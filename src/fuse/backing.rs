//! The backing ids of FUSE passthrough: registered with the kernel, one per inode while
//! any handle of it is open (the kernel requires all passthrough opens of an inode to
//! share a backing file).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use fuser::BackingId;
use parking_lot::Mutex;

#[derive(Default)]
struct Ids {
    by_ino: HashMap<u64, Weak<BackingId>>,
    by_fh: HashMap<u64, Arc<BackingId>>,
}

/// The registry, and whether passthrough is in use.
#[derive(Default)]
pub(super) struct Backings {
    active: AtomicBool,
    ids: Mutex<Ids>,
}

impl Backings {
    /// Is passthrough in use (negotiated at init and not given up since)?
    pub(super) fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Passthrough was negotiated at init.
    pub(super) fn activate(&self) {
        self.active.store(true, Ordering::Relaxed)
    }

    /// Register (or reuse) the backing id of `ino` for handle `fh`. On failure
    /// passthrough is given up for the rest of the mount.
    pub(super) fn id(
        &self,
        ino: u64,
        fh: u64,
        open: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if !self.active() {
            return None;
        }
        let mut b = self.ids.lock();
        let id = match b.by_ino.get(&ino).and_then(Weak::upgrade) {
            Some(id) => id,
            None => match open() {
                Ok(id) => {
                    let id = Arc::new(id);
                    b.by_ino.insert(ino, Arc::downgrade(&id));
                    id
                }
                Err(e) => {
                    if self.active.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            "data mode: falling back to reads and writes through the daemon \
                             (registering a passthrough backing file failed: {e})"
                        );
                    }
                    return None;
                }
            },
        };
        b.by_fh.insert(fh, id.clone());
        Some(id)
    }

    /// Handle `fh` was released.
    pub(super) fn release(&self, fh: u64) {
        let mut b = self.ids.lock();
        if let Some(id) = b.by_fh.remove(&fh) {
            drop(id);
            if b.by_ino.len() > 1024 {
                b.by_ino.retain(|_, w| w.strong_count() > 0);
            }
        }
    }
}
