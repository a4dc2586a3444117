//! The caller's umask for one create, on this thread only (docs/permissions.md).
//!
//! With POSIX ACLs negotiated the kernel leaves the umask to the filesystem: it sends
//! the mode unmasked and the caller's umask beside it. A native create applies the umask
//! only when the parent directory has no default ACL (a default ACL replaces it), and
//! only the backing filesystem knows which case holds at the moment of the create. So
//! the create runs with the caller's umask as the thread's own and the backing
//! filesystem decides, exactly as for the caller's own `open(O_CREAT)` or `mkdir`.
//!
//! The umask lives in the `fs_struct`, which all threads of a process share: a thread
//! unshares it (`unshare(CLONE_FS)`, no privilege needed) the first time it creates
//! something, and puts the daemon's umask (0) back after each create.

use std::cell::Cell;

use nix::sys::stat::{umask, Mode};

thread_local! {
    /// This thread has its own `fs_struct` (and so its own umask).
    static OWN_FS: Cell<bool> = const { Cell::new(false) };
}

/// While alive, this thread's umask is the caller's.
pub(super) struct WithUmask {
    old: Mode,
}

impl WithUmask {
    /// Set `mask` as this thread's umask; `None` when the thread cannot have a umask of
    /// its own (the caller then masks the mode itself, which can only give less).
    pub(super) fn enter(mask: u32) -> Option<WithUmask> {
        if !OWN_FS.with(Cell::get) {
            // SAFETY: unshare(CLONE_FS) only copies this thread's cwd, root and umask.
            if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
                return None;
            }
            OWN_FS.with(|o| o.set(true));
        }
        // The thread's fs_struct is its own now: this umask is the thread's alone.
        let old = umask(Mode::from_bits_truncate((mask & 0o777) as libc::mode_t));
        Some(WithUmask { old })
    }
}

impl Drop for WithUmask {
    fn drop(&mut self) {
        umask(self.old);
    }
}

/// Run `f` with `mode` and the caller's `mask` as this thread's umask. Where the thread
/// cannot have its own umask, the mode is masked here instead: a default ACL on the
/// parent can then only give less than a native create would, never more.
pub(super) fn with_umask<T>(mode: u32, mask: u32, f: impl FnOnce(u32) -> T) -> T {
    match WithUmask::enter(mask) {
        Some(_guard) => f(mode),
        None => {
            tracing::warn!("cannot give this thread its own umask: masking the mode instead");
            f(mode & !(mask & 0o777))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> u32 {
        // Read the umask by setting it and putting it back.
        let m = umask(Mode::empty());
        umask(m);
        m.bits()
    }

    #[test]
    fn the_mask_is_this_threads_alone_and_put_back() {
        use std::sync::mpsc::channel;
        let before = current();
        let (inside_tx, inside_rx) = channel();
        let (done_tx, done_rx) = channel::<()>();
        let t = std::thread::spawn(move || {
            with_umask(0o666, 0o027, |mode| {
                assert_eq!(mode, 0o666, "the backing filesystem applies the umask");
                assert_eq!(current(), 0o027);
                inside_tx.send(()).unwrap();
                done_rx.recv().unwrap();
            });
            current()
        });
        inside_rx.recv().unwrap();
        // This thread shares the process's fs_struct, which the other one left.
        assert_eq!(current(), before);
        done_tx.send(()).unwrap();
        assert_eq!(t.join().unwrap(), before, "put back after the create");
    }
}
