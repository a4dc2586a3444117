//! Open directories: a snapshot of a directory's entries per handle, with the numbers
//! the mount shows for them (`d_ino`).

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::sys::{cstr, cvt, fstat_fd, fstatat};
use super::{DirEntry, DirHandle, FsError, FsResult, Kind, Store};

impl Store {
    /// The number of the node at backing (dev, ino), if there is one.
    fn known_number(&self, dev: u64, ino: u64) -> Option<u64> {
        self.tables.read().by_key.get(&(dev, ino)).copied()
    }

    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        let (_, node_fd) = self.node_fd(ino)?;
        // SAFETY: openat of "." under a descriptor we hold; the result is checked by cvt.
        let fd = cvt(unsafe {
            libc::openat(
                node_fd.as_raw_fd(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: openat just returned this descriptor and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.write().insert(
            fh,
            Arc::new(DirHandle {
                ino,
                file,
                entries: Mutex::new(Vec::new()),
            }),
        );
        Ok(fh)
    }

    /// Entries of an open directory from index `offset` (`.` and `..` included, the
    /// hidden name excluded). Offset 0 re-reads the directory.
    /// Also returns the total number of entries.
    pub fn readdir(&self, fh: u64, offset: u64) -> FsResult<(Vec<DirEntry>, usize)> {
        let d = self
            .dirs
            .read()
            .get(&fh)
            .cloned()
            .ok_or(FsError(libc::EBADF))?;
        let mut entries = d.entries.lock();
        if offset == 0 || entries.is_empty() {
            *entries = self.list_dir(&d)?;
        }
        let total = entries.len();
        Ok((
            entries.iter().skip(offset as usize).cloned().collect(),
            total,
        ))
    }

    fn list_dir(&self, d: &DirHandle) -> FsResult<Vec<DirEntry>> {
        // SAFETY: openat of "." under the handle's descriptor; the result is checked by cvt.
        let dup = cvt(unsafe {
            libc::openat(
                d.file.as_raw_fd(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        let dev = fstat_fd(d.file.as_raw_fd())?.st_dev;
        let mut dir = nix::dir::Dir::from_fd(dup)?;
        let mut out = Vec::new();
        for e in dir.iter() {
            let e = e?;
            let name = OsStr::from_bytes(e.file_name().to_bytes());
            if self.is_hidden(d.ino, name) {
                continue;
            }
            let kind = match e.file_type() {
                Some(t) => Kind::from_dtype(match t {
                    nix::dir::Type::Directory => libc::DT_DIR,
                    nix::dir::Type::Symlink => libc::DT_LNK,
                    nix::dir::Type::Fifo => libc::DT_FIFO,
                    nix::dir::Type::Socket => libc::DT_SOCK,
                    nix::dir::Type::CharacterDevice => libc::DT_CHR,
                    nix::dir::Type::BlockDevice => libc::DT_BLK,
                    nix::dir::Type::File => libc::DT_REG,
                }),
                None => None,
            };
            let kind = match kind {
                Some(k) => k,
                None => {
                    let c = cstr(name)?;
                    match fstatat(d.file.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW) {
                        Ok(st) => Kind::from_mode(st.st_mode),
                        Err(_) => continue,
                    }
                }
            };
            out.push(DirEntry {
                name: name.to_owned(),
                kind,
                d_ino: match self.inos.entry(dev, e.ino()) {
                    // No stable number: the one its node has, if the kernel knows it.
                    0 => self.known_number(dev, e.ino()).unwrap_or(e.ino()),
                    n => n,
                },
            });
        }
        // Stable order: `.` and `..` first, as most filesystems do.
        out.sort_by_key(|e| match e.name.as_bytes() {
            b"." => 0,
            b".." => 1,
            _ => 2,
        });
        Ok(out)
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.write().remove(&fh);
    }

    pub fn fsyncdir(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let d = self
            .dirs
            .read()
            .get(&fh)
            .cloned()
            .ok_or(FsError(libc::EBADF))?;
        let fd = d.file.as_raw_fd();
        Ok(if datasync {
            nix::unistd::fdatasync(fd)
        } else {
            nix::unistd::fsync(fd)
        }?)
    }
}
