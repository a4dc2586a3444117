//! The backing ids of FUSE passthrough: registered with the kernel, one per inode while
//! any handle of it is open (the kernel requires all passthrough opens of an inode to
//! share a backing file). Each open handle keeps its id (in the store's handle, so it goes
//! with the handle); this registry finds the id an inode already has.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use fuser::BackingId;
use parking_lot::Mutex;

use crate::store::Handle;

/// The registry, and whether passthrough is in use.
#[derive(Default)]
pub(super) struct Backings {
    active: AtomicBool,
    by_ino: Mutex<HashMap<u64, Weak<BackingId>>>,
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

    /// The backing id of the open file `h` (registered, or the one its inode has), kept in
    /// `h` until it is released. On failure passthrough is given up for the rest of the
    /// mount.
    pub(super) fn id(
        &self,
        h: &Handle,
        open: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if !self.active() {
            return None;
        }
        let mut by_ino = self.by_ino.lock();
        let id = match by_ino.get(&h.ino).and_then(Weak::upgrade) {
            Some(id) => id,
            None => match open() {
                Ok(id) => {
                    let id = Arc::new(id);
                    if by_ino.len() > 1024 {
                        by_ino.retain(|_, w| w.strong_count() > 0);
                    }
                    by_ino.insert(h.ino, Arc::downgrade(&id));
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
        let _ = h.kernel.set(id.clone());
        Some(id)
    }
}
