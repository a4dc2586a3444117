//! Thin wrappers of the libc calls the store makes on descriptors and paths.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use super::{FsError, FsResult, XattrReply};

/// Turn a libc return value into a result (`-1` means errno).
pub(super) fn cvt<T: PartialEq + From<i8>>(r: T) -> FsResult<T> {
    if r == T::from(-1) {
        Err(FsError::last())
    } else {
        Ok(r)
    }
}

pub(super) fn cstr(name: &OsStr) -> FsResult<CString> {
    CString::new(name.as_bytes()).map_err(|_| FsError(libc::EINVAL))
}

pub(super) fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL")
}

pub(super) fn fstatat(dirfd: RawFd, name: &CStr, flags: i32) -> FsResult<libc::stat> {
    Ok(nix::sys::stat::fstatat(
        Some(dirfd),
        name,
        nix::fcntl::AtFlags::from_bits_retain(flags),
    )?)
}

pub(super) fn fstat_fd(fd: RawFd) -> FsResult<libc::stat> {
    fstatat(fd, c"", libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW)
}

pub(super) fn open_path_at(dirfd: RawFd, name: &CStr) -> FsResult<OwnedFd> {
    // SAFETY: openat under the caller's directory descriptor with a NUL-terminated name;
    // checked by cvt.
    let fd = cvt(unsafe {
        libc::openat(
            dirfd,
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: openat just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn xattr_reply(mut buf: Vec<u8>, len: usize, size: u32) -> XattrReply {
    if size == 0 {
        XattrReply::Size(len as u32)
    } else {
        buf.truncate(len);
        XattrReply::Data(buf)
    }
}

/// Flags for opening the backing file: `O_DIRECT` is dropped because daemon-side buffers
/// are not aligned (in passthrough mode the kernel opens the backing file with the
/// caller's own flags), and `O_NOCTTY`/`O_EXCL` are not meaningful on a re-open.
/// `O_APPEND` is dropped too: the kernel sends every write with the offset it means, and
/// `pwrite` on an `O_APPEND` descriptor ignores its offset, so a shared mapping's dirty
/// page written back through the handle would land at the end of the file. A write the
/// caller made with `O_APPEND` is appended per call instead ([`Store::write`]).
///
/// [`Store::write`]: super::Store::write
pub(super) fn backing_flags(flags: i32) -> i32 {
    flags & !(libc::O_DIRECT | libc::O_NOCTTY | libc::O_APPEND)
}
