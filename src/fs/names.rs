//! `impl Fs` for the namespace: lookups, attributes and the calls that make, remove or
//! rename names (each a write route through the policy).

use std::ffi::OsStr;
use std::path::Path;

use super::killpriv::KillRule;
use super::router::Node;
use super::{AttrOut, Entry, Fs, WriteRoute};
use crate::store::{Caller, FsError, FsResult, SetAttr};

impl Fs {
    pub fn lookup(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<Entry> {
        match (
            self.router.node(parent),
            self.lookup_attr(caller, parent, name),
        ) {
            // Cache the miss too: create storms, PATH/include-path searches and repeated
            // `stat`s of absent names then stay in the kernel. Names made through the
            // mount replace the negative entry at once (the kernel does that for its own
            // create/mkdir/link/rename); names made directly in the backing directory
            // show up within TTL, like changed attributes. Not under `.coherent/`, whose
            // names come and go with the volume's state.
            (Node::Backing(_), Err(FsError(libc::ENOENT))) => Ok(Entry {
                attr: None,
                ttl: self.ttl,
            }),
            (_, r) => self.entry(r),
        }
    }

    pub fn forget(&self, ino: u64, nlookup: u64) {
        match self.router.node(ino) {
            Node::Pseudo(ino) => {
                if let Some(p) = &self.pseudo {
                    p.forget(ino, nlookup)
                }
            }
            Node::Backing(ino) => self.store.forget(ino, nlookup),
        }
    }

    pub fn getattr(&self, caller: &Caller, ino: u64) -> FsResult<AttrOut> {
        self.attr_out(match self.router.node(ino) {
            Node::Pseudo(ino) => self.pseudo()?.getattr(caller, ino),
            Node::Backing(ino) => self.store.getattr(ino),
        })
    }

    /// Any setattr: a write route (unless it changes nothing). `fh` is the handle the
    /// kernel named, if any.
    pub fn setattr(
        &self,
        caller: &Caller,
        ino: u64,
        set: &SetAttr,
        fh: Option<u64>,
    ) -> FsResult<AttrOut> {
        self.attr_out(match self.router.node(ino) {
            // Pseudo files ignore truncation (`echo > ctl`); nothing else may change.
            Node::Pseudo(ino) => {
                if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() {
                    Err(FsError(libc::EPERM))
                } else {
                    self.pseudo()?.getattr(caller, ino)
                }
            }
            Node::Backing(ino) => {
                let path = self.store.path_of(ino);
                let route = WriteRoute::Setattr {
                    ino,
                    path: path.as_deref(),
                    set,
                };
                // Nothing to set: the kernel's own check on a write (or a `chown(f, -1,
                // -1)`) found privileges to remove and left that to us (killpriv.rs). It
                // is a mode change all the same, decided as one: a fenced giver may not
                // strip the handed file's set-user-ID bit or capabilities.
                // The chown rule serves both: the kernel sends the empty setattr of a write
                // only for a caller without CAP_FSETID on a regular file, where the two
                // rules agree.
                if *set == SetAttr::default() {
                    return self.attr_out(self.guarded(caller, &route, || {
                        self.may_kill_privs(caller, ino)?;
                        self.kill_privs(caller, ino, KillRule::Chown)?;
                        self.store.getattr(ino)
                    }));
                }
                // A truncate through a handle (ftruncate) is also a write of that handle.
                if let (Some(fh), Some(_)) = (fh, set.size) {
                    self.handle_write_allowed(fh)?;
                }
                // A plain user's chown or truncate removes privileges (killpriv.rs); a
                // chown by the file's old group, so before it.
                let plain = caller.uid != 0;
                let chown = plain && (set.uid.is_some() || set.gid.is_some());
                self.guarded(caller, &route, || {
                    if chown {
                        self.kill_privs(caller, ino, KillRule::Chown)?;
                    }
                    let a = self.store.setattr(ino, set, fh)?;
                    if plain && set.size.is_some() {
                        self.kill_privs(caller, ino, KillRule::Write)?;
                        return self.store.getattr(ino);
                    }
                    Ok(a)
                })
            }
        })
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        match self.router.node(ino) {
            Node::Pseudo(_) => Err(FsError(libc::ENOENT)),
            Node::Backing(ino) => self.store.readlink(ino),
        }
    }

    /// `mknod` of `mode` as the kernel sends it with POSIX ACLs (unmasked) and the
    /// caller's `umask`, which the backing filesystem applies unless a default ACL of the
    /// parent takes its place (docs/permissions.md). A mode already masked comes with
    /// umask 0. The same holds for [`Fs::mkdir`] and [`Fs::create`].
    pub fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> FsResult<Entry> {
        self.refuse_pseudo(&[], &[(parent, name)], libc::EACCES)?;
        let path = self.store.child_path(parent, name);
        let route = WriteRoute::Mknod {
            path: path.as_deref(),
            mode,
            rdev,
        };
        self.entry(self.guarded(caller, &route, || {
            self.store.mknod(caller, parent, name, mode, umask, rdev)
        }))
    }

    /// `mkdir` of an unmasked `mode` with the caller's `umask` (see [`Fs::mknod`]).
    pub fn mkdir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> FsResult<Entry> {
        self.refuse_pseudo(&[], &[(parent, name)], libc::EEXIST)?;
        let path = self.store.child_path(parent, name);
        let route = WriteRoute::Mkdir {
            path: path.as_deref(),
            mode,
        };
        self.entry(self.guarded(caller, &route, || {
            self.store.mkdir(caller, parent, name, mode, umask)
        }))
    }

    pub fn unlink(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<()> {
        self.refuse_pseudo(&[], &[(parent, name)], libc::EACCES)?;
        let path = self.store.child_path(parent, name);
        let route = WriteRoute::Unlink {
            path: path.as_deref(),
        };
        self.guarded(caller, &route, || self.store.unlink(parent, name))
    }

    pub fn rmdir(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<()> {
        self.refuse_pseudo(&[], &[(parent, name)], libc::EACCES)?;
        let path = self.store.child_path(parent, name);
        let route = WriteRoute::Rmdir {
            path: path.as_deref(),
        };
        self.guarded(caller, &route, || self.store.rmdir(parent, name))
    }

    pub fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        target: &Path,
    ) -> FsResult<Entry> {
        self.refuse_pseudo(&[], &[(parent, name)], libc::EEXIST)?;
        let path = self.store.child_path(parent, name);
        let route = WriteRoute::Symlink {
            path: path.as_deref(),
            target,
        };
        self.entry(self.guarded(caller, &route, || {
            self.store.symlink(caller, parent, name, target)
        }))
    }

    /// `rename(2)` with `RENAME_*` flags.
    pub fn rename(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        self.refuse_pseudo(
            &[parent, newparent],
            &[(parent, name), (newparent, newname)],
            libc::EACCES,
        )?;
        let from = self.store.child_path(parent, name);
        let to = self.store.child_path(newparent, newname);
        let route = WriteRoute::Rename {
            from: from.as_deref(),
            to: to.as_deref(),
            flags,
        };
        self.guarded(caller, &route, || {
            self.store.rename(parent, name, newparent, newname, flags)
        })
    }

    pub fn link(
        &self,
        caller: &Caller,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> FsResult<Entry> {
        self.refuse_pseudo(&[ino, newparent], &[(newparent, newname)], libc::EACCES)?;
        let from = self.store.path_of(ino);
        let to = self.store.child_path(newparent, newname);
        let route = WriteRoute::Link {
            from: from.as_deref(),
            to: to.as_deref(),
        };
        self.entry(self.guarded(caller, &route, || self.store.link(ino, newparent, newname)))
    }
}
