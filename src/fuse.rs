//! The `fuser` glue: decodes each FUSE request into a call of [`Fs`] and encodes its
//! answer (`reply.*`), with one error path (`reply::answer`). Besides, it owns what only FUSE
//! has: the negotiation at init, the backing ids of FUSE passthrough and the request
//! counters. The policy, the routing of `.coherent/` and the cache decisions are [`Fs`]'s.
//!
//! Regular files are opened in FUSE passthrough mode when the kernel allows it (reads and
//! writes never reach the daemon, and the kernel updates the size and drops the cached
//! times itself); otherwise data goes through the daemon in requests of up to 1 MiB.
//! Record (`fcntl`) locks are taken on the backing file (`FUSE_POSIX_LOCKS`, [`Locks`]),
//! so they hold against processes outside the mount and other mounts or hosts of the same
//! directory; BSD (`flock`) locks stay the kernel's, between the processes of this host
//! (docs/locks.md). Cache policy: docs/cache.md.

mod backing;
mod convert;
mod init;
mod inval;
mod reply;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, FileHandle, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use backing::Backings;
use convert::{caller, file_attr, file_type, negative_attr, set_time};
pub use inval::Inval;
use reply::{answer, attr, empty, empty_dir, entry, fopen_flags, xattr, OpenBacking};

pub use crate::fs::{Counters, FsOptions, Op, IN_PLACE_TTL, TTL};
use crate::fs::{Fs, LockDone, LockSpan, Locks, Opened};
use crate::request_timeout::Started;
use crate::store::{Caller, FsError, FsResult, SetAttr};

/// Largest read/write request through the daemon.
pub const MAX_IO: u32 = 1 << 20;

/// The `fuser::Filesystem` of `coherent-mount`: [`Fs`] behind FUSE.
pub struct CoherentFs {
    fs: Fs,
    backings: Backings,
    /// Record locks, held on the backing files.
    locks: Arc<Locks>,
    pub counters: Arc<Counters>,
    /// Set by the mount once the session exists.
    pub inval: Arc<Inval>,
}

impl CoherentFs {
    pub fn new(fs: Fs) -> Self {
        CoherentFs {
            counters: fs.counters().clone(),
            fs,
            backings: Backings::default(),
            locks: Arc::default(),
            inval: Arc::default(),
        }
    }

    pub fn fs(&self) -> &Fs {
        &self.fs
    }

    /// Every request: count it, and note who sent it and when it began (what it may block
    /// on is bounded from then: [`crate::request_timeout`]).
    fn begin(&self, op: Op, req: &Request) -> Caller {
        self.counters.count(op);
        caller(req, Started::now())
    }

    /// The open flags of a file whose data goes through the daemon: a SQLite WAL index
    /// is not mapped shared (fs/locks.rs).
    fn through_daemon(&self, ino: u64, fopen: FopenFlags) -> FopenFlags {
        if self.fs.is_wal_index(ino) {
            fopen | FopenFlags::FOPEN_DIRECT_IO
        } else {
            fopen
        }
    }

    /// The backing id for an opened backing file, when passthrough is in use.
    fn passthrough_of(&self, o: &Opened, reply: &impl OpenBacking) -> Option<Arc<BackingId>> {
        let h = o.handle.as_ref()?;
        let was = self.backings.active();
        let id = self.backings.id(h, || reply.open_backing(&h.file));
        if was && !self.backings.active() {
            // Given up for the rest of the mount: `status` must not say passthrough.
            self.fs.set_data_mode(
                "through the daemon (registering a passthrough backing file failed; see the log)",
            );
        }
        id
    }
}

impl Filesystem for CoherentFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.negotiate(config)
    }

    fn destroy(&mut self) {
        tracing::info!(
            "daemon served {} reads and {} writes of file data; requests: {}",
            self.counters.reads.load(Ordering::Relaxed),
            self.counters.writes.load(Ordering::Relaxed),
            self.counters.summary()
        );
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let c = self.begin(Op::Lookup, req);
        answer(Op::Lookup, self.fs.lookup(&c, parent.0, name), reply, entry)
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.counters.count(Op::Forget);
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let c = self.begin(Op::Getattr, req);
        answer(Op::Getattr, self.fs.getattr(&c, ino.0), reply, attr)
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let c = self.begin(Op::Setattr, req);
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        let r = self.fs.setattr(&c, ino.0, &set, fh.map(|f| f.0));
        answer(Op::Setattr, r, reply, attr)
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.begin(Op::Readlink, req);
        answer(Op::Readlink, self.fs.readlink(ino.0), reply, |r, d| {
            r.data(&d)
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let c = self.begin(Op::Mknod, req);
        let r = self.fs.mknod(&c, parent.0, name, mode, umask, rdev);
        answer(Op::Mknod, r, reply, entry)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let c = self.begin(Op::Mkdir, req);
        let r = self.fs.mkdir(&c, parent.0, name, mode, umask);
        answer(Op::Mkdir, r, reply, entry)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = self.begin(Op::Unlink, req);
        answer(Op::Unlink, self.fs.unlink(&c, parent.0, name), reply, empty)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = self.begin(Op::Rmdir, req);
        answer(Op::Rmdir, self.fs.rmdir(&c, parent.0, name), reply, empty)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let c = self.begin(Op::Symlink, req);
        let r = self.fs.symlink(&c, parent.0, link_name, target);
        answer(Op::Symlink, r, reply, entry)
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let c = self.begin(Op::Rename, req);
        let r = self
            .fs
            .rename(&c, parent.0, name, newparent.0, newname, flags.bits());
        answer(Op::Rename, r, reply, empty)
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let c = self.begin(Op::Link, req);
        let r = self.fs.link(&c, ino.0, newparent.0, newname);
        answer(Op::Link, r, reply, entry)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let c = self.begin(Op::Open, req);
        answer(
            Op::Open,
            self.fs.open(&c, ino.0, flags.0),
            reply,
            |reply, mut o| {
                if o.fopen.attrs_changed {
                    self.inval.attrs(ino.0);
                }
                // Record locks end at a close, which only a FLUSH tells.
                o.fopen.noflush &= !self.locks.wants_flush(ino.0);
                let (fh, fopen) = (FileHandle(o.fh), fopen_flags(o.fopen));
                match self.passthrough_of(&o, &reply) {
                    Some(id) => reply.opened_passthrough(fh, fopen, &id),
                    None => reply.opened(fh, self.through_daemon(ino.0, fopen)),
                }
            },
        )
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let c = self.begin(Op::Create, req);
        let r = self.fs.create(&c, parent.0, name, mode, umask, flags);
        answer(Op::Create, r, reply, |reply, made| {
            let (o, ttl) = (made.opened, made.entry.ttl);
            let fa = made
                .entry
                .attr
                .map_or_else(negative_attr, |a| file_attr(&a));
            let (fh, fopen) = (FileHandle(o.fh), fopen_flags(o.fopen));
            match self.passthrough_of(&o, &reply) {
                Some(id) => reply.created_passthrough(&ttl, &fa, Generation(0), fh, fopen, &id),
                None => {
                    let fopen = self.through_daemon(fa.ino.0, fopen);
                    reply.created(&ttl, &fa, Generation(0), fh, fopen)
                }
            }
        })
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let c = self.begin(Op::Read, req);
        // May be answered later from another thread (a pending `wait` on ctl).
        let done = Box::new(move |r: FsResult<Vec<u8>>| {
            answer(Op::Read, r, reply, |reply, d| reply.data(&d))
        });
        self.fs.read(&c, ino.0, fh.0, offset, size, done)
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let c = self.begin(Op::Write, req);
        // `flags` are the caller's file flags at the time of the write (fcntl may have
        // changed them since the open); a page written back from the cache (a shared
        // mapping's) carries none, and goes where its offset says.
        let cached = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let how = crate::fs::WriteFlags {
            kill_privs: write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID),
            append: flags.0 & libc::O_APPEND != 0 && !cached,
        };
        let r = self.fs.write_flagged(&c, ino.0, fh.0, offset, data, how);
        answer(Op::Write, r, reply, |reply, n| reply.written(n))
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let c = self.begin(Op::Flush, req);
        // A close by the owner's process ends its record locks on the file (POSIX).
        self.locks.unlock_owner(ino.0, lock_owner.0);
        answer(
            Op::Flush,
            self.fs.flush(&c, ino.0, fh.0),
            reply,
            |reply, changed| {
                if changed {
                    self.inval.attrs(ino.0);
                }
                reply.ok()
            },
        )
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let c = self.begin(Op::Release, req);
        // The locks first: another process may be asking about them right now (an open
        // file's OFD locks end only here), and the policy's work at a release takes time.
        if self.fs.is_backing(ino.0) {
            self.locks.release(fh.0);
        }
        if self.fs.release(&c, ino.0, fh.0) == Some(true) {
            self.inval.attrs(ino.0);
        }
        reply.ok()
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        self.begin(Op::Getlk, req);
        let want = LockSpan {
            start,
            end,
            typ,
            pid,
        };
        let r = (self.fs.lock_target(ino.0, fh.0))
            .and_then(|h| self.locks.get(&h, fh.0, lock_owner.0, want));
        answer(Op::Getlk, r, reply, |reply, l| {
            reply.locked(l.start, l.end, l.typ, l.pid)
        })
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Setlk, req);
        let span = LockSpan {
            start,
            end,
            typ,
            pid,
        };
        // Answered later from a thread of its own when the lock must be waited for. A lock
        // taken drops the cached pages first: reads under it must see the holder's writes.
        let inval = self.inval.clone();
        let done: LockDone = Box::new(move |r: FsResult<()>| {
            if r.is_ok() && typ != libc::F_UNLCK {
                inval.data(ino.0);
            }
            answer(Op::Setlk, r, reply, empty)
        });
        match self.fs.lock_target(ino.0, fh.0) {
            Ok(h) => self.locks.set(&h, fh.0, lock_owner.0, span, sleep, done),
            Err(e) => done(Err(e)),
        }
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Fsync, req);
        answer(Op::Fsync, self.fs.fsync(fh.0, datasync), reply, empty)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let c = self.begin(Op::Opendir, req);
        answer(Op::Opendir, self.fs.opendir(&c, ino.0), reply, |r, o| {
            r.opened(FileHandle(o.fh), fopen_flags(o.fopen))
        })
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let c = self.begin(Op::Readdir, req);
        let r = self.fs.readdir(&c, ino.0, fh.0, offset);
        answer(Op::Readdir, r, reply, |mut reply, entries| {
            for (i, (n, e)) in entries.into_iter().enumerate() {
                let ino_hint = if n != 0 { n } else { e.d_ino.max(1) };
                let next = offset + i as u64 + 1;
                if reply.add(INodeNo(ino_hint), next, file_type(e.kind), &e.name) {
                    break;
                }
            }
            reply.ok()
        })
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let c = self.begin(Op::Readdirplus, req);
        let r = self
            .fs
            .readdirplus(&c, ino.0, fh.0, offset, |next, name, a| {
                let ino = INodeNo(a.attr.ino);
                reply.add(ino, next, name, &a.ttl, &file_attr(&a.attr), Generation(0))
            });
        answer(Op::Readdirplus, r, reply, empty_dir)
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Releasedir, req);
        self.fs.releasedir(ino.0, fh.0);
        reply.ok()
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Fsyncdir, req);
        answer(
            Op::Fsyncdir,
            self.fs.fsyncdir(ino.0, fh.0, datasync),
            reply,
            empty,
        )
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.begin(Op::Statfs, req);
        answer(Op::Statfs, self.fs.statfs(ino.0), reply, |r, s| {
            r.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            )
        })
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let c = self.begin(Op::Setxattr, req);
        let r = self.fs.setxattr(&c, ino.0, name, value, flags);
        answer(Op::Setxattr, r, reply, empty)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let c = self.begin(Op::Getxattr, req);
        answer(
            Op::Getxattr,
            self.fs.getxattr(&c, ino.0, name, size),
            reply,
            xattr,
        )
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let c = self.begin(Op::Listxattr, req);
        answer(
            Op::Listxattr,
            self.fs.listxattr(&c, ino.0, size),
            reply,
            xattr,
        )
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = self.begin(Op::Removexattr, req);
        let r = self.fs.removexattr(&c, ino.0, name);
        answer(Op::Removexattr, r, reply, empty)
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let c = self.begin(Op::Access, req);
        answer(
            Op::Access,
            self.fs.access(&c, ino.0, mask.bits()),
            reply,
            empty,
        )
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Fallocate, req);
        let r = self.fs.fallocate(fh.0, offset, length, mode);
        answer(Op::Fallocate, r, reply, empty)
    }

    fn lseek(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.begin(Op::Lseek, req);
        answer(
            Op::Lseek,
            self.fs.lseek(fh.0, offset, whence),
            reply,
            |r, o| r.offset(o),
        )
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.begin(Op::CopyFileRange, req);
        let (i, o, f) = (fh_in.0, fh_out.0, flags.bits() as u32);
        let r = self.fs.copy_file_range(i, offset_in, o, offset_out, len, f);
        answer(Op::CopyFileRange, r, reply, |r, n| {
            r.written(n.min(u32::MAX as u64) as u32)
        })
    }

    /// No file of the volume has ioctls: every one is answered `ENOTTY`, as a regular
    /// file answers a terminal check (Python's `isatty` at every open asks), without the
    /// warning per call that `fuser`'s default logs.
    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.begin(Op::Ioctl, req);
        answer(Op::Ioctl, Err(FsError(libc::ENOTTY)), reply, |_, ()| {})
    }
}
