//! Open files: opening a node, the registry of open handles, and the data calls made
//! through a handle (read, write, fsync, fallocate, lseek, copy_file_range).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::sys::{backing_flags, cvt, fstat_fd, proc_path};
use super::{FsError, FsResult, Handle, Kind, Stamp, Store};

impl Store {
    /// Is the node open for writing through the mount (a handle of ours)?
    pub fn has_write_handle(&self, ino: u64) -> bool {
        self.handles
            .read()
            .values()
            .any(|h| h.ino == ino && h.flags & libc::O_ACCMODE != libc::O_RDONLY)
    }

    pub(super) fn add_handle(
        &self,
        ino: u64,
        file: File,
        flags: i32,
    ) -> FsResult<(u64, Arc<Handle>)> {
        let st = fstat_fd(file.as_raw_fd())?;
        let h = Arc::new(Handle {
            ino,
            file,
            flags,
            state: std::sync::OnceLock::new(),
            kernel: std::sync::OnceLock::new(),
            stamp: Mutex::new(Stamp::from_stat(&st)),
        });
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.write().insert(fh, h.clone());
        Ok((fh, h))
    }

    /// Open `ino` with the kernel's `flags`; returns the handle id.
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<(u64, Arc<Handle>)> {
        let (node, node_fd) = self.node_fd(ino)?;
        if node.kind == Kind::Symlink {
            return Err(FsError(libc::ELOOP));
        }
        let path = proc_path(node_fd.as_raw_fd());
        // SAFETY: open of a NUL-terminated /proc/self/fd path; the result is checked by cvt.
        let fd = cvt(unsafe {
            libc::open(
                path.as_ptr(),
                // The node is known not to be a symlink, and the reopen goes through the
                // /proc/self/fd magic link: O_NOFOLLOW would make that fail with ELOOP.
                (backing_flags(flags) & !(libc::O_CREAT | libc::O_NOFOLLOW)) | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: open just returned this descriptor and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        self.add_handle(ino, file, flags)
    }

    pub fn handle(&self, fh: u64) -> FsResult<Arc<Handle>> {
        self.handles
            .read()
            .get(&fh)
            .cloned()
            .ok_or(FsError(libc::EBADF))
    }

    /// The current stamp of an open handle's backing file.
    pub fn stamp(h: &Handle) -> FsResult<Stamp> {
        Ok(Stamp::from_stat(&fstat_fd(h.file.as_raw_fd())?))
    }

    pub fn release(&self, fh: u64) -> Option<Arc<Handle>> {
        self.handles.write().remove(&fh)
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let h = self.handle(fh)?;
        let mut buf = vec![0u8; size as usize];
        let mut done = 0usize;
        // Fill the whole request unless EOF: the kernel treats a short read as EOF.
        while done < buf.len() {
            // SAFETY: pread writes at most buf.len() - done bytes, which is what is left of
            // `buf` at `done`.
            let n = cvt(unsafe {
                libc::pread(
                    h.file.as_raw_fd(),
                    buf[done..].as_mut_ptr().cast(),
                    buf.len() - done,
                    (offset + done as u64) as libc::off_t,
                )
            })?;
            if n == 0 {
                break;
            }
            done += n as usize;
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// Write `data` at `offset`, or, with `append`, at the end of the file as it is at the
    /// time of the write (`RWF_APPEND`: atomic against every other writer of the backing
    /// file, as `O_APPEND` is natively, even when the kernel's idea of the size is stale).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8], append: bool) -> FsResult<u32> {
        let h = self.handle(fh)?;
        let flags = if append { libc::RWF_APPEND } else { 0 };
        let mut done = 0usize;
        while done < data.len() {
            let iov = libc::iovec {
                iov_base: data[done..].as_ptr() as *mut libc::c_void,
                iov_len: data.len() - done,
            };
            // SAFETY: pwritev2 reads at most iov_len bytes from iov_base, which is what is
            // left of `data` at `done`; `iov` outlives the call.
            let n = cvt(unsafe {
                libc::pwritev2(
                    h.file.as_raw_fd(),
                    &iov,
                    1,
                    (offset + done as u64) as libc::off_t,
                    flags,
                )
            })?;
            done += n as usize;
        }
        Ok(done as u32)
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.handle(fh)?;
        let fd = h.file.as_raw_fd();
        Ok(if datasync {
            nix::unistd::fdatasync(fd)
        } else {
            nix::unistd::fsync(fd)
        }?)
    }

    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        let h = self.handle(fh)?;
        // SAFETY: fallocate on a descriptor the handle keeps open; no memory is passed.
        cvt(unsafe {
            libc::fallocate(
                h.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        })
        .map(drop)
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        let h = self.handle(fh)?;
        // SAFETY: lseek on a descriptor the handle keeps open; no memory is passed.
        cvt(unsafe { libc::lseek(h.file.as_raw_fd(), offset, whence) })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> FsResult<u64> {
        let hi = self.handle(fh_in)?;
        let ho = self.handle(fh_out)?;
        let mut oi = off_in as libc::off64_t;
        let mut oo = off_out as libc::off64_t;
        // SAFETY: copy_file_range between descriptors the handles keep open, updating the two
        // offsets we own.
        let n = cvt(unsafe {
            libc::copy_file_range(
                hi.file.as_raw_fd(),
                &mut oi,
                ho.file.as_raw_fd(),
                &mut oo,
                len as usize,
                flags,
            )
        })?;
        Ok(n as u64)
    }
}
