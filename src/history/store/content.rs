//! A file's bytes: read with `pread`, hashed (BLAKE3) and copied into a blob.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use super::fd::fstat;

pub use crate::coherence::hex32::encode as hex;

/// Reads all of `fd` from offset 0 with `pread` (its file offset untouched) into `f`.
pub(super) fn each_chunk(fd: BorrowedFd<'_>, mut f: impl FnMut(&[u8])) -> io::Result<u64> {
    each_chunk_while(fd, |b| {
        f(b);
        true
    })
}

/// Fills `buf` from `fd` at `off` with `pread` (its file offset untouched), as far as the
/// file goes: the number of bytes read, fewer than asked only at the end of the file.
pub(super) fn pread_full(fd: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut done = 0usize;
    while done < buf.len() {
        // SAFETY: a valid descriptor and the rest of a buffer we own.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    Ok(done)
}

/// The bytes of a file `fd` that a stat said is `size` long, read straight into the
/// buffer returned (no chunk buffer to fill and copy out of). One byte more is asked for,
/// so a file that grew meanwhile comes back longer than `size`.
pub(super) fn read_small(fd: BorrowedFd<'_>, size: u64) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize + 1];
    let n = pread_full(fd, &mut buf, 0)?;
    buf.truncate(n);
    Ok(buf)
}

/// As [`each_chunk`], stopping early when `f` says false; the bytes read either way.
fn each_chunk_while(fd: BorrowedFd<'_>, mut f: impl FnMut(&[u8]) -> bool) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = pread_full(fd, &mut buf, off)?;
        if n == 0 {
            return Ok(off);
        }
        off += n as u64;
        if !f(&buf[..n]) || n < buf.len() {
            return Ok(off);
        }
    }
}

/// How much of a large file is hashed between two looks at whether it is still there.
const RECHECK: u64 = 64 << 20;

/// The digest of the large file `fd` while it stays as `stat` saw it (looked at every
/// [`RECHECK`] bytes), None once it changed or lost its last name: the descriptor held for
/// hashing pins the file's blocks, and an `rm` of a huge file must free them now, not
/// after a read to its end for a digest of bytes that are gone.
pub(super) fn digest_while_unmoved(fd: BorrowedFd<'_>, stat: &libc::stat) -> Option<[u8; 32]> {
    let unmoved = || fstat(fd).is_ok_and(|now| same(stat, &now) && now.st_nlink > 0);
    if !unmoved() {
        return None;
    }
    let mut h = blake3::Hasher::new();
    let (mut since, mut moved) = (0u64, false);
    let n = each_chunk_while(fd, |b| {
        h.update(b);
        since += b.len() as u64;
        if since >= RECHECK {
            since = 0;
            moved = !unmoved();
        }
        !moved
    })
    .ok()?;
    (!moved && n == stat.st_size as u64 && unmoved()).then(|| *h.finalize().as_bytes())
}

pub(super) fn digest_of(fd: BorrowedFd<'_>) -> io::Result<([u8; 32], u64)> {
    let mut h = blake3::Hasher::new();
    let n = each_chunk(fd, |b| {
        h.update(b);
    })?;
    Ok((*h.finalize().as_bytes(), n))
}

/// Same file, same content as far as a stat tells (inode, size, mtime, ctime).
pub(super) fn same(a: &libc::stat, b: &libc::stat) -> bool {
    (
        a.st_ino,
        a.st_size,
        a.st_mtime,
        a.st_mtime_nsec,
        a.st_ctime,
        a.st_ctime_nsec,
    ) == (
        b.st_ino,
        b.st_size,
        b.st_mtime,
        b.st_mtime_nsec,
        b.st_ctime,
        b.st_ctime_nsec,
    )
}

/// Copies all of `src` into the empty `dst`: a reflink, else `copy_file_range`, else read
/// and write.
pub(super) fn copy_into(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    size: u64,
    no_reflink: &AtomicBool,
) -> io::Result<()> {
    if !no_reflink.load(Ordering::Relaxed) {
        // SAFETY: FICLONE between two valid descriptors; it changes only dst.
        if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE as _, src.as_raw_fd()) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP | libc::EXDEV | libc::EINVAL | libc::ENOTTY)
        ) {
            no_reflink.store(true, Ordering::Relaxed);
        }
    }
    let (mut off_in, mut off_out): (libc::loff_t, libc::loff_t) = (0, 0);
    let mut fallback = false;
    while (off_in as u64) < size {
        let left = (size - off_in as u64).min(1 << 30) as usize;
        // SAFETY: valid descriptors and offsets we own (the files' offsets are untouched).
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                left,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EXDEV | libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP) => {
                    fallback = true;
                    break;
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            break; // the file shrank: the stat check after the copy sees it
        }
    }
    if !fallback {
        return Ok(());
    }
    // SAFETY: a valid descriptor.
    if unsafe { libc::ftruncate(dst.as_raw_fd(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = File::from(dst.try_clone_to_owned()?);
    let mut err = None;
    each_chunk(src, |b| {
        if err.is_none() {
            if let Err(e) = out.write_all(b) {
                err = Some(e);
            }
        }
    })?;
    err.map_or(Ok(()), Err)
}
