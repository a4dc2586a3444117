//! Changes of names in the backing directory: nodes created as the caller, removed,
//! renamed and linked, and what the inode table learns of each.

use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use super::sys::{backing_flags, cstr, cvt, fstatat};
use super::{creds, umask, Attr, Caller, FsError, FsResult, Handle, Store};

impl Store {
    /// Run `f` with the caller's fs uid/gid and groups (so new files are theirs and the
    /// backing filesystem checks their permissions), then look the new `name` up.
    fn create_node(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        f: impl FnOnce(RawFd, &CStr) -> FsResult<()>,
    ) -> FsResult<Attr> {
        if self.is_hidden(parent, name) {
            return Err(FsError(libc::EEXIST));
        }
        let (_, dir_fd) = self.node_fd(parent)?;
        let c = cstr(name)?;
        {
            let _as = creds::AsCaller::enter(caller);
            f(dir_fd.as_raw_fd(), &c)?;
        }
        self.lookup(parent, name)
    }

    /// `mknod` of `mode` (unmasked) with the caller's `umask` (see `umask`).
    pub fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> FsResult<Attr> {
        self.create_node(caller, parent, name, |d, n| {
            umask::with_umask(mode, umask, |mode| {
                // SAFETY: mknodat under the directory descriptor `d` with the NUL-terminated
                // name `n`.
                cvt(unsafe { libc::mknodat(d, n.as_ptr(), mode, rdev as libc::dev_t) })
            })
            .map(drop)
        })
    }

    /// `mkdir` of `mode` (unmasked) with the caller's `umask` (see `umask`).
    pub fn mkdir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> FsResult<Attr> {
        self.create_node(caller, parent, name, |d, n| {
            umask::with_umask(mode, umask, |mode| {
                // SAFETY: mkdirat under the directory descriptor `d` with the NUL-terminated
                // name `n`.
                cvt(unsafe { libc::mkdirat(d, n.as_ptr(), mode) })
            })
            .map(drop)
        })
    }

    pub fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        target: &Path,
    ) -> FsResult<Attr> {
        let t = cstr(target.as_os_str())?;
        self.create_node(caller, parent, name, |d, n| {
            // SAFETY: symlinkat with NUL-terminated target and name under the directory
            // descriptor `d`.
            cvt(unsafe { libc::symlinkat(t.as_ptr(), d, n.as_ptr()) }).map(drop)
        })
    }

    /// Create and open a regular file of `mode` (unmasked) with the caller's `umask` (see
    /// `umask`); counts one lookup and returns a handle id.
    pub fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> FsResult<(Attr, u64, Arc<Handle>)> {
        if self.is_hidden(parent, name) {
            return Err(FsError(libc::EACCES));
        }
        let (_, dir_fd) = self.node_fd(parent)?;
        let c = cstr(name)?;
        let fd = {
            let _as = creds::AsCaller::enter(caller);
            umask::with_umask(mode, umask, |mode| {
                // SAFETY: openat under a directory descriptor we hold with a NUL-terminated
                // name; checked by cvt.
                cvt(unsafe {
                    libc::openat(
                        dir_fd.as_raw_fd(),
                        c.as_ptr(),
                        backing_flags(flags) | libc::O_CREAT | libc::O_CLOEXEC,
                        mode,
                    )
                })
            })?
        };
        // SAFETY: openat just returned this descriptor and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        let attr = self.lookup(parent, name)?;
        let (fh, h) = self.add_handle(attr.ino, file, flags)?;
        Ok((attr, fh, h))
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.remove(parent, name, 0)
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.remove(parent, name, libc::AT_REMOVEDIR)
    }

    fn remove(&self, parent: u64, name: &OsStr, flags: i32) -> FsResult<()> {
        if self.is_hidden(parent, name) {
            return Err(FsError(libc::EACCES));
        }
        let (_, dir_fd) = self.node_fd(parent)?;
        let c = cstr(name)?;
        let victim = fstatat(dir_fd.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW).ok();
        let held = victim.and_then(|st| self.known_fd((st.st_dev, st.st_ino)));
        // SAFETY: unlinkat under a directory descriptor we hold with a NUL-terminated name.
        cvt(unsafe { libc::unlinkat(dir_fd.as_raw_fd(), c.as_ptr(), flags) })?;
        if let Some(st) = victim {
            self.orphan((st.st_dev, st.st_ino), held);
            self.unname((st.st_dev, st.st_ino), parent, name);
        }
        Ok(())
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        if self.is_hidden(parent, name) || self.is_hidden(newparent, newname) {
            return Err(FsError(libc::EACCES));
        }
        let (_, d1_fd) = self.node_fd(parent)?;
        let (_, d2_fd) = self.node_fd(newparent)?;
        let c1 = cstr(name)?;
        let c2 = cstr(newname)?;
        // The node a plain rename replaces loses its name.
        let replaced = if flags & libc::RENAME_EXCHANGE == 0 {
            fstatat(d2_fd.as_raw_fd(), &c2, libc::AT_SYMLINK_NOFOLLOW).ok()
        } else {
            None
        };
        let held = replaced.and_then(|st| self.known_fd((st.st_dev, st.st_ino)));
        // SAFETY: renameat2 under directory descriptors we hold with NUL-terminated names.
        cvt(unsafe {
            libc::renameat2(
                d1_fd.as_raw_fd(),
                c1.as_ptr(),
                d2_fd.as_raw_fd(),
                c2.as_ptr(),
                flags,
            )
        })?;
        if let Some(st) = replaced {
            self.orphan((st.st_dev, st.st_ino), held);
            self.unname((st.st_dev, st.st_ino), newparent, newname);
        }
        self.relink(newparent, newname);
        if flags & libc::RENAME_EXCHANGE != 0 {
            self.relink(parent, name);
        }
        Ok(())
    }

    /// Hard-link `ino` as `newname` under `newparent`; counts one lookup.
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> FsResult<Attr> {
        if self.is_hidden(newparent, newname) {
            return Err(FsError(libc::EEXIST));
        }
        let (_, node_fd) = self.node_fd(ino)?;
        let (_, dir_fd) = self.node_fd(newparent)?;
        let c = cstr(newname)?;
        // SAFETY: linkat with AT_EMPTY_PATH from a descriptor we hold to a NUL-terminated name
        // under another.
        cvt(unsafe {
            libc::linkat(
                node_fd.as_raw_fd(),
                c"".as_ptr(),
                dir_fd.as_raw_fd(),
                c.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        })?;
        self.lookup(newparent, newname)
    }
}
