//! A thin adapter from `fuser` callbacks to the [`Store`] and the [`Hooks`].
//!
//! Cache policy (docs/cache.md): the kernel caches entries, attributes and failed lookups
//! (negative entries) for [`FsOptions::ttl`]. In an in-place mount the daemon is the only
//! path to the files, so the kernel's cache cannot go stale and the TTL is long
//! ([`IN_PLACE_TTL`]) and directory listings are cached too (`FOPEN_CACHE_DIR` and
//! `FOPEN_KEEP_CACHE` on opendir; the kernel drops a listing when a change through the
//! mount touches the directory). With a separate backing directory, agents and humans
//! also change it behind the volume's back, so the TTL is short ([`TTL`], 1 s) and
//! listings are read afresh at each opendir: an external change is seen within that
//! bound. No ctl verb changes a file, name or attribute (the computed `user.coherent.*`
//! attributes are extended attributes, which the kernel never caches), so there is
//! nothing for the daemon to invalidate. No `FOPEN_KEEP_CACHE` on files, no writeback
//! cache: the page cache of a file opened through the daemon is dropped at each open, so
//! an external write is seen by the next open. Regular files are opened in FUSE
//! passthrough mode when the kernel allows it (reads and writes never reach the daemon,
//! and the kernel updates the size and drops the cached times itself); otherwise data goes
//! through the daemon in requests of up to 1 MiB.
//!
//! POSIX (`fcntl`) and BSD (`flock`) locks are left to the kernel (we do not ask for
//! `FUSE_POSIX_LOCKS`/`FUSE_FLOCK_LOCKS`), so they behave as on a local filesystem
//! between the processes of this host.

mod convert;
pub mod hooks;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use convert::{
    caller, fail, file_attr, file_type, has_cap_sys_admin, negative_attr, set_time, xattr_answer,
};
pub use hooks::{open_writes, HandleInfo, Hooks, NoHooks, OpenInfo, Permit, ReadDone, WriteRoute};

use crate::passthrough::{
    is_virtual, Attr, Caller, DirEntry, FsError, FsResult, Kind, SetAttr, Store, XattrReply,
    ROOT_INO,
};

/// Entry and attribute cache time with a separate backing directory: how late a change
/// made there may be seen through the mount (see the module doc).
pub const TTL: Duration = Duration::from_secs(1);
/// Entry and attribute cache time of an in-place mount, where every change goes through
/// the daemon (and so through the kernel's cache).
pub const IN_PLACE_TTL: Duration = Duration::from_secs(24 * 3600);

/// Largest read/write request through the daemon.
pub const MAX_IO: u32 = 1 << 20;

/// Backing ids registered with the kernel: one per inode while any handle of it is open
/// (the kernel requires all passthrough opens of an inode to share a backing file).
#[derive(Default)]
struct Backing {
    by_ino: HashMap<u64, Weak<BackingId>>,
    by_fh: HashMap<u64, Arc<BackingId>>,
}

/// Counters of requests that reached the daemon (logged at unmount and on SIGUSR1):
/// data requests (with passthrough active they stay at 0 for regular files) and every
/// request by opcode, the round trips an operation costs.
#[derive(Debug)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    ops: [AtomicU64; Op::ALL.len()],
}

/// The FUSE requests the daemon answers, for [`Counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Create,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Fallocate,
    Lseek,
    CopyFileRange,
}

impl Op {
    pub const ALL: [Op; 33] = [
        Op::Lookup,
        Op::Forget,
        Op::Getattr,
        Op::Setattr,
        Op::Readlink,
        Op::Mknod,
        Op::Mkdir,
        Op::Unlink,
        Op::Rmdir,
        Op::Symlink,
        Op::Rename,
        Op::Link,
        Op::Open,
        Op::Create,
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Release,
        Op::Fsync,
        Op::Opendir,
        Op::Readdir,
        Op::Readdirplus,
        Op::Releasedir,
        Op::Fsyncdir,
        Op::Statfs,
        Op::Setxattr,
        Op::Getxattr,
        Op::Listxattr,
        Op::Removexattr,
        Op::Access,
        Op::Fallocate,
        Op::Lseek,
        Op::CopyFileRange,
    ];

    pub fn name(self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            ops: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Counters {
    fn count(&self, op: Op) {
        self.ops[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests served of `op` so far.
    pub fn served(&self, op: Op) -> u64 {
        self.ops[op as usize].load(Ordering::Relaxed)
    }

    /// `name=count` for every opcode served at least once, e.g. `lookup=12 getattr=3`.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = Op::ALL
            .iter()
            .filter(|&&op| self.served(op) > 0)
            .map(|&op| format!("{}={}", op.name(), self.served(op)))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(" ")
        }
    }
}

/// Options of the adapter.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Try FUSE passthrough for regular files.
    pub passthrough: bool,
    /// How long the kernel may cache entries, attributes and negative entries.
    pub ttl: Duration,
    /// Let the kernel cache directory listings across opendirs (only sound when nothing
    /// changes the backing directory behind the volume's back).
    pub cache_dirs: bool,
}

impl FsOptions {
    /// The cache policy of a mount: long and with cached listings in place, [`TTL`]
    /// over a separate backing directory.
    pub fn for_mount(in_place: bool) -> Self {
        FsOptions {
            passthrough: true,
            ttl: if in_place { IN_PLACE_TTL } else { TTL },
            cache_dirs: in_place,
        }
    }
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions::for_mount(false)
    }
}

/// The `fuser::Filesystem` of `coherent-mount`.
pub struct CoherentFs {
    store: Store,
    hooks: Arc<dyn Hooks>,
    virtual_name: Option<OsString>,
    want_passthrough: bool,
    passthrough: AtomicBool,
    backing: Mutex<Backing>,
    /// Open flags for every regular open (`FOPEN_NOFLUSH` when no hook wants FLUSH).
    fopen: FopenFlags,
    /// Open flags of an opendir (the listing cache, when allowed).
    fopen_dir: FopenFlags,
    ttl: Duration,
    pub counters: Arc<Counters>,
}

impl CoherentFs {
    /// A volume over the backing directory `root` (an `O_PATH` descriptor, opened before
    /// mounting). Sets the process umask to 0: modes from the kernel are already masked.
    pub fn new(
        root: std::os::fd::OwnedFd,
        hooks: Arc<dyn Hooks>,
        opts: FsOptions,
    ) -> FsResult<Self> {
        unsafe { libc::umask(0) };
        let virtual_name = hooks.virtual_root_name();
        let hooks_want_flush = hooks.wants_flush();
        let store = Store::new(root, virtual_name.clone())?;
        let h = hooks.clone();
        store.set_name_preference(Box::new(move |p| h.prefers_name(p)));
        Ok(CoherentFs {
            store,
            hooks,
            virtual_name,
            want_passthrough: opts.passthrough,
            passthrough: AtomicBool::new(false),
            backing: Mutex::new(Backing::default()),
            fopen: if hooks_want_flush {
                FopenFlags::empty()
            } else {
                FopenFlags::FOPEN_NOFLUSH
            },
            fopen_dir: if opts.cache_dirs {
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
            } else {
                FopenFlags::empty()
            },
            ttl: opts.ttl,
            counters: Arc::new(Counters::default()),
        })
    }

    /// The cache time of a node's entry and attributes: 0 for virtual nodes, whose size
    /// and mtime move (`.coherent/events` grows; `tail -f` polls its size).
    fn ttl_of(&self, ino: u64) -> &Duration {
        const ZERO: Duration = Duration::ZERO;
        if is_virtual(ino) {
            &ZERO
        } else {
            &self.ttl
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Is passthrough in use (negotiated at init and not given up since)?
    pub fn passthrough_active(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    fn is_virtual_name(&self, parent: u64, name: &OsStr) -> bool {
        parent == ROOT_INO && self.virtual_name.as_deref() == Some(name)
    }

    /// Run a write route through the hooks: before (may refuse), the operation, after.
    fn guarded<T>(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
        op: impl FnOnce() -> FsResult<T>,
    ) -> FsResult<T> {
        let permit = self.hooks.before_write(caller, route)?;
        let r = op();
        self.hooks
            .after_write(caller, route, permit, r.as_ref().map(drop).map_err(|e| *e));
        r
    }

    /// An open or create for write through the hooks: before (may refuse), the
    /// operation; a failure goes to `after_write`, a success returns the permit for
    /// `opened`.
    fn guarded_open<T>(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
        op: impl FnOnce() -> FsResult<T>,
    ) -> FsResult<(T, Option<Permit>)> {
        let permit = self.hooks.before_write(caller, route)?;
        match op() {
            Ok(x) => Ok((x, permit)),
            Err(e) => {
                self.hooks.after_write(caller, route, permit, Err(e));
                Err(e)
            }
        }
    }

    /// Tell the hooks about a new handle and store its token; on refusal, close it.
    fn opened(
        &self,
        caller: &Caller,
        fh: u64,
        created: bool,
        permit: Option<Permit>,
    ) -> FsResult<()> {
        let h = self.store.handle(fh)?;
        let path = self.store.path_of(h.ino);
        let info = OpenInfo {
            ino: h.ino,
            path: path.as_deref(),
            flags: h.flags,
            created,
            stamp: *h.stamp.lock(),
        };
        match self.hooks.on_open(caller, &info, permit) {
            Ok(token) => {
                h.token.store(token, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.store.release(fh);
                Err(e)
            }
        }
    }

    /// Open flags of a handle that may write: no FLUSH when the hooks keep no state for
    /// it (token 0: an untracked path, say), since `on_flush` would have nothing to do.
    fn fopen_of(&self, h: &crate::passthrough::Handle) -> FopenFlags {
        if h.token.load(Ordering::Relaxed) == 0 {
            FopenFlags::FOPEN_NOFLUSH
        } else {
            self.fopen
        }
    }

    /// Register (or reuse) the backing id of `ino` for handle `fh`. On failure
    /// passthrough is given up for the rest of the mount.
    fn backing_id(
        &self,
        ino: u64,
        fh: u64,
        open: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if !self.passthrough_active() {
            return None;
        }
        let mut b = self.backing.lock();
        let id = match b.by_ino.get(&ino).and_then(Weak::upgrade) {
            Some(id) => id,
            None => match open() {
                Ok(id) => {
                    let id = Arc::new(id);
                    b.by_ino.insert(ino, Arc::downgrade(&id));
                    id
                }
                Err(e) => {
                    if self.passthrough.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            "data mode: falling back to reads and writes through the daemon \
                             (registering a passthrough backing file failed: {e})"
                        );
                    }
                    return None;
                }
            },
        };
        b.by_fh.insert(fh, id.clone());
        Some(id)
    }

    fn drop_backing(&self, fh: u64) {
        let mut b = self.backing.lock();
        if let Some(id) = b.by_fh.remove(&fh) {
            drop(id);
            if b.by_ino.len() > 1024 {
                b.by_ino.retain(|_, w| w.strong_count() > 0);
            }
        }
    }

    fn handle_info<'a>(
        &self,
        h: &crate::passthrough::Handle,
        path: Option<&'a Path>,
    ) -> HandleInfo<'a> {
        let now = Store::stamp(h).unwrap_or_default();
        let before = std::mem::replace(&mut *h.stamp.lock(), now);
        HandleInfo {
            ino: h.ino,
            path,
            flags: h.flags,
            token: h.token.load(Ordering::Relaxed),
            before,
            now,
        }
    }

    fn entry_reply(&self, op: &str, r: FsResult<Attr>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(self.ttl_of(a.ino), &file_attr(&a), Generation(0)),
            Err(e) => reply.error(fail(op, e)),
        }
    }

    fn lookup_any(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<Attr> {
        if is_virtual(parent) || self.is_virtual_name(parent, name) {
            self.hooks.virtual_lookup(caller, parent, name)
        } else {
            self.store.lookup(parent, name)
        }
    }

    fn forget_any(&self, ino: u64, n: u64) {
        if is_virtual(ino) {
            self.hooks.virtual_forget(ino, n)
        } else {
            self.store.forget(ino, n)
        }
    }

    /// Directory entries from `offset` (index). Each is (inode number or 0 if unknown,
    /// entry). The virtual root entry (`.coherent`) is not listed (§7: reachable by name
    /// only, as ZFS hides `.zfs`, so `ls -a`, `find`, `git add -A`, `rg` and `tar` of the
    /// workspace never see it).
    fn dir_entries(
        &self,
        caller: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
    ) -> FsResult<Vec<(u64, DirEntry)>> {
        if is_virtual(ino) {
            let mut all = vec![
                (
                    ino,
                    DirEntry {
                        name: ".".into(),
                        kind: Kind::Dir,
                        backing_ino: ino,
                    },
                ),
                (
                    ROOT_INO,
                    DirEntry {
                        name: "..".into(),
                        kind: Kind::Dir,
                        backing_ino: ROOT_INO,
                    },
                ),
            ];
            all.extend(self.hooks.virtual_readdir(caller, ino)?);
            return Ok(all.into_iter().skip(offset as usize).collect());
        }
        let (entries, _) = self.store.readdir(fh, offset)?;
        Ok(entries.into_iter().map(|e| (0, e)).collect())
    }
}

/// Answer a request that returns nothing but success or an errno.
fn empty_reply(op: &str, r: FsResult<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(fail(op, e)),
    }
}

impl Filesystem for CoherentFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for flag in [
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_ASYNC_DIO,
        ] {
            let _ = config.add_capabilities(flag);
        }
        let _ = config.set_max_write(MAX_IO);
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        let mode = if !self.want_passthrough {
            "through the daemon (--no-passthrough)".to_string()
        } else if !has_cap_sys_admin() {
            "through the daemon (FUSE passthrough needs CAP_SYS_ADMIN)".to_string()
        } else {
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                Ok(()) => {
                    // Allow a backing directory on a stacked filesystem (e.g. overlayfs).
                    if config.set_max_stack_depth(2).is_err() {
                        let _ = config.set_max_stack_depth(1);
                    }
                    self.passthrough.store(true, Ordering::Relaxed);
                    "passthrough (reads and writes of regular files go straight to the backing files)"
                        .to_string()
                }
                Err(_) => {
                    "through the daemon (the kernel does not offer FUSE passthrough, needs 6.9+)"
                        .to_string()
                }
            }
        };
        tracing::info!("data mode: {mode}");
        Ok(())
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
        self.counters.count(Op::Lookup);
        let c = caller(req);
        match self.lookup_any(&c, parent.0, name) {
            // Cache the miss too: create storms, PATH/include-path searches and
            // repeated `stat`s of absent names then stay in the kernel. Names made
            // through the mount replace the negative entry at once (the kernel does
            // that for its own create/mkdir/link/rename); names made directly in
            // the backing directory show up within TTL, like changed attributes.
            // Not under `.coherent/`, whose names come and go with the volume's state.
            Err(FsError(libc::ENOENT)) if !is_virtual(parent.0) => {
                reply.entry(&self.ttl, &negative_attr(), Generation(0))
            }
            r => self.entry_reply("lookup", r, reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.counters.count(Op::Forget);
        self.forget_any(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.counters.count(Op::Getattr);
        let r = if is_virtual(ino.0) {
            self.hooks.virtual_getattr(&caller(req), ino.0)
        } else {
            self.store.getattr(ino.0)
        };
        match r {
            Ok(a) => reply.attr(self.ttl_of(a.ino), &file_attr(&a)),
            Err(e) => reply.error(fail("getattr", e)),
        }
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
        self.counters.count(Op::Setattr);
        let c = caller(req);
        let ino = ino.0;
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        let r = if is_virtual(ino) {
            // Virtual files ignore truncation (`echo > ctl`); nothing else may change.
            if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() {
                Err(FsError(libc::EPERM))
            } else {
                self.hooks.virtual_getattr(&c, ino)
            }
        } else if set == SetAttr::default() {
            self.store.getattr(ino)
        } else {
            let path = self.store.path_of(ino);
            let route = WriteRoute::Setattr {
                ino,
                path: path.as_deref(),
                set: &set,
            };
            self.guarded(&c, &route, || {
                self.store.setattr(ino, &set, fh.map(|f| f.0))
            })
        };
        match r {
            Ok(a) => reply.attr(self.ttl_of(a.ino), &file_attr(&a)),
            Err(e) => reply.error(fail("setattr", e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.counters.count(Op::Readlink);
        match self.store.readlink(ino.0) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(fail("readlink", e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.counters.count(Op::Mknod);
        let c = caller(req);
        if is_virtual(parent.0) || self.is_virtual_name(parent.0, name) {
            return reply.error(Errno::EACCES);
        }
        let path = self.store.child_path(parent.0, name);
        let route = WriteRoute::Mknod {
            path: path.as_deref(),
            mode,
            rdev,
        };
        let r = self.guarded(&c, &route, || {
            self.store.mknod(&c, parent.0, name, mode, rdev)
        });
        self.entry_reply("mknod", r, reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.counters.count(Op::Mkdir);
        let c = caller(req);
        if is_virtual(parent.0) || self.is_virtual_name(parent.0, name) {
            return reply.error(Errno::EEXIST);
        }
        let path = self.store.child_path(parent.0, name);
        let route = WriteRoute::Mkdir {
            path: path.as_deref(),
            mode,
        };
        let r = self.guarded(&c, &route, || self.store.mkdir(&c, parent.0, name, mode));
        self.entry_reply("mkdir", r, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counters.count(Op::Unlink);
        let c = caller(req);
        if is_virtual(parent.0) || self.is_virtual_name(parent.0, name) {
            return reply.error(Errno::EACCES);
        }
        let path = self.store.child_path(parent.0, name);
        let route = WriteRoute::Unlink {
            path: path.as_deref(),
        };
        empty_reply(
            "unlink",
            self.guarded(&c, &route, || self.store.unlink(parent.0, name)),
            reply,
        )
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counters.count(Op::Rmdir);
        let c = caller(req);
        if is_virtual(parent.0) || self.is_virtual_name(parent.0, name) {
            return reply.error(Errno::EACCES);
        }
        let path = self.store.child_path(parent.0, name);
        let route = WriteRoute::Rmdir {
            path: path.as_deref(),
        };
        empty_reply(
            "rmdir",
            self.guarded(&c, &route, || self.store.rmdir(parent.0, name)),
            reply,
        )
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.counters.count(Op::Symlink);
        let c = caller(req);
        if is_virtual(parent.0) || self.is_virtual_name(parent.0, link_name) {
            return reply.error(Errno::EEXIST);
        }
        let path = self.store.child_path(parent.0, link_name);
        let route = WriteRoute::Symlink {
            path: path.as_deref(),
            target,
        };
        let r = self.guarded(&c, &route, || {
            self.store.symlink(&c, parent.0, link_name, target)
        });
        self.entry_reply("symlink", r, reply)
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
        self.counters.count(Op::Rename);
        let c = caller(req);
        if is_virtual(parent.0)
            || is_virtual(newparent.0)
            || self.is_virtual_name(parent.0, name)
            || self.is_virtual_name(newparent.0, newname)
        {
            return reply.error(Errno::EACCES);
        }
        let from = self.store.child_path(parent.0, name);
        let to = self.store.child_path(newparent.0, newname);
        let route = WriteRoute::Rename {
            from: from.as_deref(),
            to: to.as_deref(),
            flags: flags.bits(),
        };
        empty_reply(
            "rename",
            self.guarded(&c, &route, || {
                self.store
                    .rename(parent.0, name, newparent.0, newname, flags.bits())
            }),
            reply,
        )
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.counters.count(Op::Link);
        let c = caller(req);
        if is_virtual(ino.0)
            || is_virtual(newparent.0)
            || self.is_virtual_name(newparent.0, newname)
        {
            return reply.error(Errno::EACCES);
        }
        let from = self.store.path_of(ino.0);
        let to = self.store.child_path(newparent.0, newname);
        let route = WriteRoute::Link {
            from: from.as_deref(),
            to: to.as_deref(),
        };
        let r = self.guarded(&c, &route, || self.store.link(ino.0, newparent.0, newname));
        self.entry_reply("link", r, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.counters.count(Op::Open);
        let c = caller(req);
        let (ino, flags) = (ino.0, flags.0);
        if is_virtual(ino) {
            return match self.hooks.virtual_open(&c, ino, flags) {
                Ok(t) => reply.opened(FileHandle(t), FopenFlags::FOPEN_DIRECT_IO),
                Err(e) => reply.error(fail("open", e)),
            };
        }
        let r = if open_writes(flags) {
            let path = self.store.path_of(ino);
            let route = WriteRoute::Open {
                ino,
                path: path.as_deref(),
                flags,
            };
            self.guarded_open(&c, &route, || self.store.open(ino, flags))
        } else {
            self.store.open(ino, flags).map(|x| (x, None))
        };
        let fh =
            match r.and_then(|((fh, _), permit)| self.opened(&c, fh, false, permit).map(|()| fh)) {
                Ok(fh) => fh,
                Err(e) => return reply.error(fail("open", e)),
            };
        let h = match self.store.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(fail("open", e)),
        };
        // A read-only handle changes nothing, so no hook has anything to learn from its
        // FLUSH: spare the round trip at every close.
        let fopen = if open_writes(flags) {
            self.fopen_of(&h)
        } else {
            FopenFlags::FOPEN_NOFLUSH
        };
        match self.backing_id(ino, fh, || reply.open_backing(&h.file)) {
            Some(id) => reply.opened_passthrough(FileHandle(fh), fopen, &id),
            None => reply.opened(FileHandle(fh), fopen),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.counters.count(Op::Create);
        let c = caller(req);
        if is_virtual(parent.0) || self.is_virtual_name(parent.0, name) {
            return reply.error(Errno::EACCES);
        }
        let path = self.store.child_path(parent.0, name);
        let route = WriteRoute::Create {
            path: path.as_deref(),
            flags,
            mode,
        };
        let r = self.guarded_open(&c, &route, || {
            self.store.create(&c, parent.0, name, mode, flags)
        });
        let ((attr, fh, h), permit) = match r {
            Ok(x) => x,
            Err(e) => return reply.error(fail("create", e)),
        };
        if let Err(e) = self.opened(&c, fh, true, permit) {
            self.store.forget(attr.ino, 1);
            return reply.error(fail("create", e));
        }
        let fa = file_attr(&attr);
        let fopen = self.fopen_of(&h);
        match self.backing_id(attr.ino, fh, || reply.open_backing(&h.file)) {
            Some(id) => {
                reply.created_passthrough(&self.ttl, &fa, Generation(0), FileHandle(fh), fopen, &id)
            }
            None => reply.created(&self.ttl, &fa, Generation(0), FileHandle(fh), fopen),
        }
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
        self.counters.count(Op::Read);
        if is_virtual(ino.0) {
            // May be answered later from another thread (a pending `wait` on ctl).
            let done = Box::new(move |r: FsResult<Vec<u8>>| match r {
                Ok(d) => reply.data(&d),
                Err(e) => reply.error(fail("read", e)),
            });
            return self
                .hooks
                .virtual_read_deferred(&caller(req), ino.0, fh.0, offset, size, done);
        }
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        match self.store.read(fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(fail("read", e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.counters.count(Op::Write);
        let r = if is_virtual(ino.0) {
            self.hooks
                .virtual_write(&caller(req), ino.0, fh.0, offset, data)
        } else {
            self.counters.writes.fetch_add(1, Ordering::Relaxed);
            self.store.write(fh.0, offset, data)
        };
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(fail("write", e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.counters.count(Op::Flush);
        if is_virtual(ino.0) {
            return reply.ok();
        }
        match self.store.handle(fh.0) {
            Ok(h) => {
                let path = self.store.path_of(h.ino);
                let info = self.handle_info(&h, path.as_deref());
                self.hooks.on_flush(&caller(req), &info);
                reply.ok()
            }
            Err(e) => reply.error(fail("flush", e)),
        }
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
        self.counters.count(Op::Release);
        if is_virtual(ino.0) {
            self.hooks.virtual_release(ino.0, fh.0);
            return reply.ok();
        }
        self.drop_backing(fh.0);
        if let Some(h) = self.store.release(fh.0) {
            let path = self.store.path_of(h.ino);
            let info = self.handle_info(&h, path.as_deref());
            self.hooks.on_release(&caller(req), &info);
        }
        reply.ok()
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.counters.count(Op::Fsync);
        empty_reply("fsync", self.store.fsync(fh.0, datasync), reply)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.counters.count(Op::Opendir);
        if is_virtual(ino.0) {
            return match self.hooks.virtual_getattr(&caller(req), ino.0) {
                Ok(a) if a.kind == Kind::Dir => reply.opened(FileHandle(0), FopenFlags::empty()),
                Ok(_) => reply.error(Errno::ENOTDIR),
                Err(e) => reply.error(fail("opendir", e)),
            };
        }
        match self.store.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), self.fopen_dir),
            Err(e) => reply.error(fail("opendir", e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.counters.count(Op::Readdir);
        let entries = match self.dir_entries(&caller(req), ino.0, fh.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(fail("readdir", e)),
        };
        for (i, (n, e)) in entries.into_iter().enumerate() {
            let ino_hint = if n != 0 { n } else { e.backing_ino.max(1) };
            let next = offset + i as u64 + 1;
            if reply.add(INodeNo(ino_hint), next, file_type(e.kind), &e.name) {
                break;
            }
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.counters.count(Op::Readdirplus);
        let c = caller(req);
        let dir = ino.0;
        let entries = match self.dir_entries(&c, dir, fh.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(fail("readdirplus", e)),
        };
        for (i, (_, e)) in entries.into_iter().enumerate() {
            let next = offset + i as u64 + 1;
            let dots = matches!(e.name.as_bytes(), b"." | b"..");
            // `.` and `..` are not looked up (the kernel does not count them).
            let attr = if dots {
                let a = if is_virtual(dir) {
                    self.hooks.virtual_getattr(&c, dir)
                } else {
                    self.store.getattr(dir)
                };
                match a {
                    Ok(a) => a,
                    Err(_) => continue,
                }
            } else {
                match self.lookup_any(&c, dir, &e.name) {
                    Ok(a) => a,
                    Err(_) => continue, // removed since the listing
                }
            };
            let fa = file_attr(&attr);
            if reply.add(
                INodeNo(attr.ino),
                next,
                &e.name,
                self.ttl_of(attr.ino),
                &fa,
                Generation(0),
            ) {
                if !dots {
                    self.forget_any(attr.ino, 1);
                }
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.counters.count(Op::Releasedir);
        if !is_virtual(ino.0) {
            self.store.releasedir(fh.0);
        }
        reply.ok()
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.counters.count(Op::Fsyncdir);
        if is_virtual(ino.0) {
            return reply.ok();
        }
        empty_reply("fsyncdir", self.store.fsyncdir(fh.0, datasync), reply)
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.counters.count(Op::Statfs);
        match self.store.statfs(ino.0) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(fail("statfs", e)),
        }
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
        self.counters.count(Op::Setxattr);
        if is_virtual(ino.0) {
            return reply.error(Errno::EPERM);
        }
        let c = caller(req);
        let path = self.store.path_of(ino.0);
        let route = WriteRoute::Setxattr {
            path: path.as_deref(),
            name,
        };
        empty_reply(
            "setxattr",
            self.guarded(&c, &route, || {
                self.store.setxattr(ino.0, name, value, flags)
            }),
            reply,
        )
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.counters.count(Op::Getxattr);
        if is_virtual(ino.0) {
            return reply.error(Errno::ENODATA);
        }
        let c = caller(req);
        let path = self.store.path_of(ino.0);
        let r = match self.hooks.getxattr(&c, ino.0, path.as_deref(), name) {
            Some(Ok(v)) => {
                if size == 0 {
                    Ok(XattrReply::Size(v.len() as u32))
                } else if v.len() > size as usize {
                    Err(FsError(libc::ERANGE))
                } else {
                    Ok(XattrReply::Data(v))
                }
            }
            Some(Err(e)) => Err(e),
            None => self.store.getxattr(ino.0, name, size),
        };
        xattr_answer(r, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.counters.count(Op::Listxattr);
        if is_virtual(ino.0) {
            return reply.size(0);
        }
        let c = caller(req);
        let path = self.store.path_of(ino.0);
        let extra = self.hooks.listxattr(&c, ino.0, path.as_deref());
        if extra.is_empty() {
            return xattr_answer(self.store.listxattr(ino.0, size), reply);
        }
        // Merge: read the backing list in full, append the computed names.
        let mut list = match self.store.listxattr(ino.0, 0) {
            Ok(XattrReply::Size(n)) if n > 0 => match self.store.listxattr(ino.0, n) {
                Ok(XattrReply::Data(d)) => d,
                Ok(XattrReply::Size(_)) => Vec::new(),
                Err(e) => return reply.error(fail("listxattr", e)),
            },
            Ok(_) => Vec::new(),
            Err(e) => return reply.error(fail("listxattr", e)),
        };
        for n in extra {
            list.extend_from_slice(n.as_bytes());
            list.push(0);
        }
        if size == 0 {
            reply.size(list.len() as u32)
        } else if list.len() > size as usize {
            reply.error(Errno::ERANGE)
        } else {
            reply.data(&list)
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counters.count(Op::Removexattr);
        if is_virtual(ino.0) {
            return reply.error(Errno::EPERM);
        }
        let c = caller(req);
        let path = self.store.path_of(ino.0);
        let route = WriteRoute::Removexattr {
            path: path.as_deref(),
            name,
        };
        empty_reply(
            "removexattr",
            self.guarded(&c, &route, || self.store.removexattr(ino.0, name)),
            reply,
        )
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.counters.count(Op::Access);
        if is_virtual(ino.0) {
            return reply.ok();
        }
        empty_reply(
            "access",
            self.store.access(&caller(req), ino.0, mask.bits()),
            reply,
        )
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.counters.count(Op::Fallocate);
        empty_reply(
            "fallocate",
            self.store.fallocate(fh.0, offset, length, mode),
            reply,
        )
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.counters.count(Op::Lseek);
        match self.store.lseek(fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(fail("lseek", e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
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
        self.counters.count(Op::CopyFileRange);
        match self.store.copy_file_range(
            fh_in.0,
            offset_in,
            fh_out.0,
            offset_out,
            len,
            flags.bits() as u32,
        ) {
            Ok(n) => reply.written(n.min(u32::MAX as u64) as u32),
            Err(e) => reply.error(fail("copy_file_range", e)),
        }
    }
}
