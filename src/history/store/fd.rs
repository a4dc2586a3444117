//! Descriptors in the history directory: opened without following symlinks, and the
//! private directories themselves checked for owner and mode.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

pub(super) fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

pub(super) fn openat(
    dir: BorrowedFd<'_>,
    name: &str,
    flags: i32,
    mode: u32,
) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat returned a descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat buffer we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// A private directory `name` in `parent`, made if missing: refused unless it is a real
/// directory (not a symlink), owned by this daemon's user and open to nobody else.
pub(super) fn private_dir(parent: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    if unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    let fd = openat(parent, name, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot open the history directory {name} (a symlink?): {e}"),
        )
    })?;
    let st = fstat(fd_b(&fd))?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me || st.st_mode & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the history directory {name} is owned by uid {} with mode {:o}; it must be \
                 this daemon's (uid {me}) and 0700: fix it or remove it",
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(fd)
}

pub(super) fn fd_b(fd: &OwnedFd) -> BorrowedFd<'_> {
    std::os::fd::AsFd::as_fd(fd)
}
