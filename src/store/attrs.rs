//! A node's attributes: stat, setattr, a symlink's target, the filesystem's counts, and
//! `access(2)` from the mode bits.

use std::os::fd::AsRawFd;

use super::sys::{cvt, fstat_fd, proc_path};
use super::{
    creds, Attr, Caller, FsError, FsResult, Kind, SetAttr, SetTime, StatFs, Store, ROOT_INO,
};

impl Store {
    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let (_, node_fd) = self.node_fd(ino)?;
        let st = fstat_fd(node_fd.as_raw_fd())?;
        // The root's node id is 1, but `stat` shows its own number (the kernel takes the
        // inode number from the attributes, the node id from the entry).
        let shown = match ino {
            ROOT_INO => self.inos.stable((st.st_dev, st.st_ino)).unwrap_or(ROOT_INO),
            _ => ino,
        };
        Ok(Attr::from_stat(shown, &st))
    }

    /// Apply `set`; `fh` is the open handle the change came through, if any.
    pub fn setattr(&self, ino: u64, set: &SetAttr, fh: Option<u64>) -> FsResult<Attr> {
        let (node, node_fd) = self.node_fd(ino)?;
        let handle = fh.and_then(|fh| self.handle(fh).ok());
        let fd = node_fd.as_raw_fd();
        let path = proc_path(fd);
        if let Some(mode) = set.mode {
            if node.kind == Kind::Symlink {
                return Err(FsError(libc::EOPNOTSUPP));
            }
            // SAFETY: chmod of a NUL-terminated /proc/self/fd path of a descriptor we hold.
            cvt(unsafe { libc::chmod(path.as_ptr(), mode & 0o7777) })?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            let uid = set.uid.unwrap_or(u32::MAX);
            let gid = set.gid.unwrap_or(u32::MAX);
            // SAFETY: fchownat with AT_EMPTY_PATH on a descriptor we hold and an empty C
            // literal.
            cvt(unsafe {
                libc::fchownat(
                    fd,
                    c"".as_ptr(),
                    uid,
                    gid,
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
        }
        if let Some(size) = set.size {
            match &handle {
                Some(h) if h.flags & libc::O_ACCMODE != libc::O_RDONLY => {
                    nix::unistd::ftruncate(&h.file, size as libc::off_t)?;
                }
                _ => {
                    if node.kind == Kind::Dir {
                        return Err(FsError(libc::EISDIR));
                    }
                    // SAFETY: truncate of a NUL-terminated /proc/self/fd path of a descriptor
                    // we hold.
                    cvt(unsafe { libc::truncate(path.as_ptr(), size as libc::off_t) })?;
                }
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let ts = |t: Option<SetTime>| match t {
                None => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                Some(SetTime::Now) => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
                Some(SetTime::At(t)) => libc::timespec {
                    tv_sec: t.sec,
                    tv_nsec: t.nsec as i64,
                },
            };
            let times = [ts(set.atime), ts(set.mtime)];
            // SAFETY: utimensat reads the two timespecs of `times`, which outlives the call.
            cvt(unsafe {
                libc::utimensat(
                    fd,
                    c"".as_ptr(),
                    times.as_ptr(),
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
        }
        self.getattr(ino)
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let (_, node_fd) = self.node_fd(ino)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: readlinkat writes at most buf.len() bytes into `buf`.
        let n = cvt(unsafe {
            libc::readlinkat(
                node_fd.as_raw_fd(),
                c"".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })?;
        buf.truncate(n as usize);
        Ok(buf)
    }

    pub fn statfs(&self, ino: u64) -> FsResult<StatFs> {
        let (_, node_fd) = self.node_fd(ino)?;
        let s = nix::sys::statvfs::fstatvfs(&node_fd)?;
        Ok(StatFs {
            blocks: s.blocks(),
            bfree: s.blocks_free(),
            bavail: s.blocks_available(),
            files: s.files(),
            ffree: s.files_free(),
            bsize: s.block_size() as u32,
            namelen: s.name_max() as u32,
            frsize: s.fragment_size() as u32,
        })
    }

    /// `access(2)` for the caller, from the mode bits. The kernel sends ACCESS only when it
    /// does not check permissions itself, which with POSIX ACLs negotiated it always does
    /// (docs/permissions.md): this serves a kernel that does not offer them.
    pub fn access(&self, caller: &Caller, ino: u64, mask: i32) -> FsResult<()> {
        let attr = self.getattr(ino)?;
        if mask == libc::F_OK {
            return Ok(());
        }
        let perm = attr.perm as i32;
        if caller.uid == 0 {
            // Root may do anything except execute a file with no x bit at all.
            if mask & libc::X_OK != 0 && attr.kind != Kind::Dir && perm & 0o111 == 0 {
                return Err(FsError(libc::EACCES));
            }
            return Ok(());
        }
        let bits = if caller.uid == attr.uid {
            (perm >> 6) & 7
        } else if caller.gid == attr.gid || creds::groups_of(caller.pid).contains(&attr.gid) {
            (perm >> 3) & 7
        } else {
            perm & 7
        };
        if mask & bits == mask & 7 {
            Ok(())
        } else {
            Err(FsError(libc::EACCES))
        }
    }
}
