//! `impl Fs` for file data: open and create (decided before the backing file is
//! touched), read, write, flush, release and the other calls on a handle.

use std::ffi::OsStr;
use std::sync::atomic::Ordering;

use super::killpriv::KillRule;
use super::router::Node;
use super::{open_writes, Created, Entry, Fopen, Fs, Opened, ReadDone, WriteFlags, WriteRoute};
use crate::store::{Caller, FsResult};

impl Fs {
    /// `open(2)` of an existing node. An open that writes is decided before the backing
    /// file is opened, so a refused `> plan.md` truncates nothing.
    pub fn open(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<Opened> {
        let ino = match self.router.node(ino) {
            Node::Pseudo(ino) => {
                // No FLUSH: the pseudo tree acts on each write and at release, and
                // nothing is committed at close (Fs::flush has nothing to do there).
                return Ok(Opened {
                    fh: self.pseudo()?.open(caller, ino, flags)?,
                    fopen: Fopen {
                        direct_io: true,
                        noflush: true,
                        ..Fopen::default()
                    },
                    handle: None,
                });
            }
            Node::Backing(ino) => ino,
        };
        // A name replaced in the backing directory (a sync's rename) is opened as what it
        // denotes now, never as the orphan the kernel's cached entry still points to.
        self.store.still_named(ino)?;
        if !open_writes(flags) {
            return self.opened(caller, None, None, self.store.open(ino, flags), false);
        }
        let path = self.store.path_of(ino);
        let route = WriteRoute::Open {
            ino,
            path: path.as_deref(),
            flags,
        };
        let permit = self.policy.before_write(caller, &route)?;
        let mut made = self.store.open(ino, flags);
        // A plain user's `O_TRUNC` removes privileges (killpriv.rs).
        let mut changed = false;
        if let (Ok((fh, _)), true) = (&made, flags & libc::O_TRUNC != 0 && caller.uid != 0) {
            match self.kill_privs(caller, ino, KillRule::Write) {
                Ok(c) => changed = c,
                Err(e) => {
                    self.store.release(*fh);
                    made = Err(e);
                }
            }
        }
        let mut o = self.opened(caller, Some(&route), permit, made, false)?;
        o.fopen.attrs_changed = changed;
        Ok(o)
    }

    /// `open(2)` with `O_CREAT` of a name that did not exist: an unmasked `mode` with the
    /// caller's `umask` (see [`Fs::mknod`]).
    pub fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> FsResult<Created> {
        self.refuse_pseudo(&[], &[(parent, name)], libc::EACCES)?;
        let path = self.store.child_path(parent, name);
        let route = WriteRoute::Create {
            path: path.as_deref(),
            flags,
            mode,
        };
        let permit = self.policy.before_write(caller, &route)?;
        let (attr, made) = match self.store.create(caller, parent, name, mode, umask, flags) {
            Ok((attr, fh, h)) => (Some(attr), Ok((fh, h))),
            Err(e) => (None, Err(e)),
        };
        match self.opened(caller, Some(&route), permit, made, true) {
            Ok(opened) => Ok(Created {
                entry: Entry {
                    attr,
                    ttl: self.ttl,
                },
                opened,
            }),
            Err(e) => {
                if let Some(a) = attr {
                    self.store.forget(a.ino, 1);
                }
                Err(e)
            }
        }
    }

    /// A read: answered through `done`, maybe later from another thread (a pending
    /// `wait` on `ctl`).
    pub fn read(&self, caller: &Caller, ino: u64, fh: u64, offset: u64, size: u32, done: ReadDone) {
        match self.router.node(ino) {
            Node::Pseudo(_) => match self.pseudo() {
                Ok(p) => p.read(caller, fh, offset, size, done),
                Err(e) => done(Err(e)),
            },
            Node::Backing(_) => {
                self.counters.reads.fetch_add(1, Ordering::Relaxed);
                done(self.store.read(fh, offset, size))
            }
        }
    }

    pub fn write(
        &self,
        caller: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
    ) -> FsResult<u32> {
        self.write_flagged(caller, ino, fh, offset, data, WriteFlags::default())
    }

    /// A write with what the kernel says of it (see [`WriteFlags`]).
    pub fn write_flagged(
        &self,
        caller: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        flags: WriteFlags,
    ) -> FsResult<u32> {
        match self.router.node(ino) {
            Node::Pseudo(_) => self.pseudo()?.write(caller, fh, data),
            Node::Backing(ino) => {
                self.counters.writes.fetch_add(1, Ordering::Relaxed);
                self.handle_write_allowed(fh)?;
                let n = self.store.write(fh, offset, data, flags.append)?;
                // The kernel flags a write by a caller without CAP_FSETID (killpriv.rs).
                if flags.kill_privs {
                    self.kill_privs(caller, ino, KillRule::Write)?;
                }
                Ok(n)
            }
        }
    }

    /// At each `close(2)` of a descriptor of the handle.
    /// True when the backing file's content changed since the handle's open or last
    /// flush: the kernel's cached attributes may not know it (a shared mapping's writes
    /// go to the backing file directly under passthrough), so the caller drops them.
    pub fn flush(&self, caller: &Caller, ino: u64, fh: u64) -> FsResult<bool> {
        if let Node::Pseudo(_) = self.router.node(ino) {
            return Ok(false);
        }
        let h = self.store.handle(fh)?;
        let path = self.store.path_of(h.ino);
        let info = self.handle_info(&h, path.as_deref());
        self.policy.on_flush(caller, &info);
        Ok(info.content_changed())
    }

    /// When the last reference to the handle goes away. Some when it was a backing
    /// file's (whatever it kept, its passthrough registration too, goes with it), with
    /// whether its content changed since the last flush, as [`Fs::flush`] says.
    pub fn release(&self, caller: &Caller, ino: u64, fh: u64) -> Option<bool> {
        match self.router.node(ino) {
            Node::Pseudo(_) => {
                if let Some(p) = &self.pseudo {
                    p.release(fh);
                }
                None
            }
            Node::Backing(_) => {
                let mut changed = false;
                if let Some(h) = self.store.release(fh) {
                    let path = self.store.path_of(h.ino);
                    let info = self.handle_info(&h, path.as_deref());
                    changed = info.content_changed();
                    self.policy.on_release(caller, &info);
                }
                Some(changed)
            }
        }
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        self.store.fsync(fh, datasync)
    }

    pub fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        self.handle_write_allowed(fh)?;
        self.store.fallocate(fh, offset, length, mode)
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        self.store.lseek(fh, offset, whence)
    }

    pub fn copy_file_range(
        &self,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
        flags: u32,
    ) -> FsResult<u64> {
        self.handle_write_allowed(fh_out)?;
        self.store
            .copy_file_range(fh_in, offset_in, fh_out, offset_out, len, flags)
    }
}
