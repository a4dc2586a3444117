//! Telling the kernel to drop what it cached of an inode when the daemon changed it without
//! a reply that carries the new attributes: an `O_TRUNC` open by a plain user removes
//! set-user-ID and set-group-ID (src/fs/killpriv.rs), and an open's reply has no
//! attributes; without this the kernel would show (and exec by) the old mode until the
//! entry's TTL ran out, 24 h in place.

use std::sync::OnceLock;

use fuser::{INodeNo, Notifier};

/// The session's notifier, set once the session exists (after the filesystem is made).
#[derive(Default)]
pub struct Inval(OnceLock<Notifier>);

impl Inval {
    pub fn set(&self, n: Notifier) {
        let _ = self.0.set(n);
    }

    /// Drop the kernel's cached attributes of `ino` (not its page cache: offset < 0).
    pub(super) fn attrs(&self, ino: u64) {
        if let Some(n) = self.0.get() {
            match n.inval_inode(INodeNo(ino), -1, 0) {
                // The kernel forgot the inode already: nothing cached to drop.
                Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                    tracing::warn!("cannot drop the cached attributes of inode {ino}: {e}")
                }
                _ => {}
            }
        }
    }

    /// Drop the kernel's cached attributes and pages of `ino`: a lock was just taken on it,
    /// and whoever held the lock before (a process on the backing directory, another mount
    /// or host) may have changed the file, which this mount's cache cannot know.
    pub(super) fn data(&self, ino: u64) {
        if let Some(n) = self.0.get() {
            match n.inval_inode(INodeNo(ino), 0, 0) {
                Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                    tracing::warn!("cannot drop the cached pages of inode {ino}: {e}")
                }
                _ => {}
            }
        }
    }
}
