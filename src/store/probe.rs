//! Questions asked of a workspace path beneath the backing root, with no inode of the
//! store: what is there, and whether the file is open for writing on this host.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::sys::fstatat;
use super::Stamp;

/// What the backing directory holds at a path, a final symlink not followed.
#[derive(Debug, Clone, Copy)]
pub struct PathStat {
    pub stamp: Stamp,
    pub dir: bool,
    /// The number of names of the file (`st_nlink`).
    pub nlink: u64,
}

/// `fstatat` of the workspace-relative `rel` beneath the backing directory `root` (for
/// the policy's view of a path, which has no inode of the store): None when nothing is
/// there (or the name cannot be asked for).
pub fn lstat_at(root: std::os::fd::BorrowedFd<'_>, rel: &str) -> Option<PathStat> {
    let c = CString::new(rel).ok()?;
    let st = fstatat(root.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW).ok()?;
    Some(PathStat {
        stamp: Stamp::from_stat(&st),
        dir: st.st_mode & libc::S_IFMT == libc::S_IFDIR,
        nlink: st.st_nlink,
    })
}

/// Is the file at `rel` (beneath `root`) open for writing anywhere on this host: by any
/// process, through any mount of it, or by the kernel itself for a FUSE passthrough
/// descriptor whose daemon is gone? Asked by taking a read lease on it and giving it back
/// at once: the kernel grants none while the inode is open for writing (`EAGAIN`).
/// `Some(false)` for a symlink or nothing there; `None` when it cannot be told (a
/// filesystem without leases, `fs.leases-enable=0`, a caller without `CAP_LEASE` who
/// does not own the file).
pub fn open_for_writing(root: std::os::fd::BorrowedFd<'_>, rel: &str) -> Option<bool> {
    let c = CString::new(rel).ok()?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: a valid directory descriptor and a NUL-terminated path.
    let fd = unsafe { libc::openat(root.as_raw_fd(), c.as_ptr(), flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        return matches!(e, Some(libc::ELOOP | libc::ENOENT)).then_some(false);
    }
    // SAFETY: openat returned a descriptor that nothing else owns.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fcntl on a descriptor we own.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
    if r == 0 {
        // SAFETY: as above; the lease goes with the descriptor anyway.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
        return Some(false);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN | libc::EBUSY) => Some(true),
        _ => None,
    }
}
