//! The filesystem, with no FUSE in it: methods take plain arguments (caller, inode, name,
//! flags) and return plain results ([`Entry`], [`AttrOut`], [`Opened`], ...).
//!
//! [`Fs`] owns the sequence of every write route (docs/design.md#write-routes): the
//! [`Policy`] decides ([`Policy::before_write`]), the [`Store`] operates, the policy
//! counts ([`Policy::after_write`]) or, for an open or create that succeeded, hears of the
//! new handle ([`Policy::on_open`]); a handle the policy refuses is released again. The
//! `router` sends requests on the `.coherent/` tree to the [`PseudoFs`] backend.
//!
//! Cache policy (docs/cache.md): entries, attributes and failed lookups are cached for
//! [`FsOptions::ttl`]; nodes of the pseudo tree for 0 (their size and mtime move). Long
//! and with cached listings in place ([`IN_PLACE_TTL`]), short over a separate backing
//! directory ([`TTL`]). See docs/cache.md for why.

mod counters;
mod killpriv;
use killpriv::KillRule;
mod locks;
mod policy;
mod pseudo;
mod router;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub use crate::store::HandleState;
pub use counters::{Counters, Op};
pub use locks::{LockDone, LockSpan, Locks};
pub use policy::{open_writes, HandleInfo, NoPolicy, OpenInfo, Permit, Policy, WriteRoute};
pub use pseudo::{PseudoFs, ReadDone};
use router::{Node, Router};

use crate::store::{
    Attr, Caller, DirEntry, FsError, FsResult, Handle, Kind, SetAttr, StatFs, Store, XattrReply,
    ROOT_INO,
};

/// Entry and attribute cache time with a separate backing directory: how late a change
/// made there may be seen through the mount (see docs/cache.md).
pub const TTL: Duration = Duration::from_secs(1);
/// Entry and attribute cache time of an in-place mount, where every change goes through
/// the daemon (and so through the kernel's cache).
pub const IN_PLACE_TTL: Duration = Duration::from_secs(24 * 3600);

/// Options of the filesystem.
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

/// A name's attributes and how long they may be cached; `attr` None is a negative entry
/// (no such name, and that may be cached too).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub attr: Option<Attr>,
    pub ttl: Duration,
}

/// A node's attributes and how long they may be cached.
#[derive(Debug, Clone, Copy)]
pub struct AttrOut {
    pub attr: Attr,
    pub ttl: Duration,
}

/// What the kernel says of a write besides its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteFlags {
    /// `FUSE_WRITE_KILL_SUIDGID`: the caller has no `CAP_FSETID` (killpriv.rs).
    pub kill_privs: bool,
    /// A write the caller made with `O_APPEND` (not a page written back from the cache):
    /// it goes at the end of the file whatever the offset says.
    pub append: bool,
}

/// How the kernel is to treat an open handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fopen {
    /// No page cache (files of the pseudo tree; an agent's write handle of a tracked file
    /// on a multi-host volume, so it cannot be mapped shared).
    pub direct_io: bool,
    /// No FLUSH at `close` (the policy has nothing to learn from it).
    pub noflush: bool,
    /// Keep the directory listing across opendirs.
    pub cache_dir: bool,
    /// Not a flag of the reply: the open changed the file's attributes (removed its
    /// privileges), so the kernel's cached ones must go.
    pub attrs_changed: bool,
}

/// An open file or directory.
pub struct Opened {
    pub fh: u64,
    pub fopen: Fopen,
    /// The backing file (None in the pseudo tree), for FUSE passthrough.
    pub handle: Option<Arc<Handle>>,
}

/// The answer to a create: the new name and its open handle.
pub struct Created {
    pub entry: Entry,
    pub opened: Opened,
}

/// The filesystem: the backing [`Store`], the [`Policy`] and the `.coherent/` backend.
pub struct Fs {
    store: Store,
    policy: Arc<dyn Policy>,
    pseudo: Option<Arc<dyn PseudoFs>>,
    router: Router,
    /// The open flags of every regular open (no FLUSH when the policy wants none).
    noflush: bool,
    cache_dirs: bool,
    ttl: Duration,
    passthrough: bool,
    /// The policy checks every write through a handle (and so no passthrough).
    sees_writes: bool,
    counters: Arc<Counters>,
}

impl Fs {
    /// A filesystem over the backing directory `root` (an `O_PATH` descriptor, opened
    /// before mounting). Leaves the process umask alone: every create sets the caller's
    /// umask on its own thread for the call ([`Fs::mknod`], docs/permissions.md).
    pub fn new(
        root: std::os::fd::OwnedFd,
        policy: Arc<dyn Policy>,
        pseudo: Option<Arc<dyn PseudoFs>>,
        opts: FsOptions,
    ) -> FsResult<Self> {
        let name = pseudo.as_ref().map(|p| p.root_name());
        Ok(Fs::over(Store::new(root, name)?, policy, pseudo, opts))
    }

    /// A filesystem over a store opened already (the policy may then use the store's
    /// backing directory, [`Store::backing`]). The store hides the pseudo tree's root name.
    pub fn over(
        store: Store,
        policy: Arc<dyn Policy>,
        pseudo: Option<Arc<dyn PseudoFs>>,
        opts: FsOptions,
    ) -> Self {
        let name = pseudo.as_ref().map(|p| p.root_name());
        let p = policy.clone();
        store.set_name_preference(Box::new(move |path| p.prefers_name(path)));
        Fs {
            store,
            noflush: !policy.wants_flush(),
            sees_writes: policy.sees_every_write(),
            policy,
            pseudo,
            router: Router::new(name),
            cache_dirs: opts.cache_dirs,
            ttl: opts.ttl,
            passthrough: opts.passthrough,
            counters: Arc::new(Counters::default()),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Tell the pseudo tree how file data flows (see [`PseudoFs::set_data_mode`]).
    pub fn set_data_mode(&self, mode: &str) {
        if let Some(p) = &self.pseudo {
            p.set_data_mode(mode);
        }
    }

    /// Were FUSE passthrough opens asked for?
    pub fn wants_passthrough(&self) -> bool {
        self.passthrough
    }

    /// Must the daemon see every write through a handle (the policy checks each one, so
    /// nothing may go through FUSE passthrough)?
    pub fn sees_every_write(&self) -> bool {
        self.sees_writes
    }

    /// A write through handle `fh`, asked of the policy first when it checks each one.
    fn handle_write_allowed(&self, fh: u64) -> FsResult<()> {
        if !self.sees_writes {
            return Ok(());
        }
        let h = self.store.handle(fh)?;
        self.policy.before_handle_write(h.state.get())
    }

    /// The pseudo backend of a node the router sent there (`ENOENT` if there is none).
    fn pseudo(&self) -> FsResult<&dyn PseudoFs> {
        self.pseudo.as_deref().ok_or(FsError(libc::ENOENT))
    }

    /// The cache time of a node's entry and attributes: 0 in the pseudo tree, whose
    /// sizes and mtimes move (`.coherent/events` grows; `tail -f` polls its size).
    fn ttl_of(&self, ino: u64) -> Duration {
        match self.router.node(ino) {
            Node::Pseudo(_) => Duration::ZERO,
            Node::Backing(_) => self.ttl,
        }
    }

    fn entry(&self, r: FsResult<Attr>) -> FsResult<Entry> {
        r.map(|a| Entry {
            attr: Some(a),
            ttl: self.ttl_of(a.ino),
        })
    }

    fn attr_out(&self, r: FsResult<Attr>) -> FsResult<AttrOut> {
        r.map(|a| AttrOut {
            attr: a,
            ttl: self.ttl_of(a.ino),
        })
    }

    /// Run a write route through the policy: decide (may refuse), operate, count.
    fn guarded<T>(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
        op: impl FnOnce() -> FsResult<T>,
    ) -> FsResult<T> {
        let permit = self.policy.before_write(caller, route)?;
        let r = op();
        self.policy
            .after_write(caller, route, permit, r.as_ref().map(drop).map_err(|e| *e));
        r
    }

    /// An open or create: a failed operation is counted with the permit, a handle that
    /// was made goes to the policy's `on_open` with it and is released again if that
    /// refuses.
    fn opened(
        &self,
        caller: &Caller,
        route: Option<&WriteRoute<'_>>,
        permit: Option<Permit>,
        made: FsResult<(u64, Arc<Handle>)>,
        created: bool,
    ) -> FsResult<Opened> {
        let (fh, h) = match made {
            Ok(x) => x,
            Err(e) => {
                if let Some(route) = route {
                    self.policy.after_write(caller, route, permit, Err(e));
                }
                return Err(e);
            }
        };
        let path = self.store.path_of(h.ino);
        let info = OpenInfo {
            ino: h.ino,
            path: path.as_deref(),
            flags: h.flags,
            created,
            stamp: *h.stamp.lock(),
        };
        let state = match self.policy.on_open(caller, &info, permit) {
            Ok(st) => st,
            Err(e) => {
                self.store.release(fh);
                return Err(e);
            }
        };
        let stateless = state.as_ref().is_none_or(|st| !self.policy.flushes(st));
        let direct_io = state.as_ref().is_some_and(|st| self.policy.direct_io(st));
        if let Some(st) = state {
            let _ = h.state.set(st);
        }
        // A handle the policy keeps no state for (an untracked path, say) or an open
        // that changes nothing has nothing to tell at FLUSH: spare the round trip at
        // every close.
        let noflush = stateless || self.noflush || (!created && !open_writes(h.flags));
        Ok(Opened {
            fh,
            fopen: Fopen {
                noflush,
                direct_io,
                ..Fopen::default()
            },
            handle: Some(h),
        })
    }

    fn handle_info<'a>(&self, h: &'a Handle, path: Option<&'a Path>) -> HandleInfo<'a> {
        let now = Store::stamp(h).unwrap_or_default();
        let before = std::mem::replace(&mut *h.stamp.lock(), now);
        HandleInfo {
            ino: h.ino,
            path,
            flags: h.flags,
            state: h.state.get(),
            before,
            now,
        }
    }

    /// Refuse a name-making route on a name of the pseudo tree with `errno`.
    fn refuse_pseudo(&self, inos: &[u64], names: &[(u64, &OsStr)], errno: i32) -> FsResult<()> {
        if self.router.any_pseudo(inos, names) {
            Err(FsError(errno))
        } else {
            Ok(())
        }
    }

    fn lookup_attr(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<Attr> {
        match self.router.child(parent, name) {
            Node::Pseudo(parent) => self.pseudo()?.lookup(caller, parent, name),
            Node::Backing(parent) => self.store.lookup(parent, name),
        }
    }

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

    pub fn opendir(&self, caller: &Caller, ino: u64) -> FsResult<Opened> {
        match self.router.node(ino) {
            Node::Pseudo(ino) => match self.pseudo()?.getattr(caller, ino) {
                Ok(a) if a.kind == Kind::Dir => Ok(Opened {
                    fh: 0,
                    fopen: Fopen::default(),
                    handle: None,
                }),
                Ok(_) => Err(FsError(libc::ENOTDIR)),
                Err(e) => Err(e),
            },
            Node::Backing(ino) => Ok(Opened {
                fh: self.store.opendir(ino)?,
                fopen: Fopen {
                    cache_dir: self.cache_dirs,
                    ..Fopen::default()
                },
                handle: None,
            }),
        }
    }

    /// Directory entries from `offset` (index); the pseudo tree's root is not among them.
    /// Each is (inode number or 0 if unknown, entry).
    pub fn readdir(
        &self,
        caller: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
    ) -> FsResult<Vec<(u64, DirEntry)>> {
        if let Node::Pseudo(ino) = self.router.node(ino) {
            let dot = |name: &str, ino: u64| {
                (
                    ino,
                    DirEntry {
                        name: name.into(),
                        kind: Kind::Dir,
                        d_ino: ino,
                    },
                )
            };
            let mut all = vec![dot(".", ino), dot("..", ROOT_INO)];
            all.extend(self.pseudo()?.readdir(caller, ino)?);
            return Ok(all.into_iter().skip(offset as usize).collect());
        }
        // The pseudo tree's root is reachable by name but never listed (as `.zfs` with
        // snapdir=hidden): `ls -a`, `find`, `git add -A`, `rg` and `tar` never see it.
        let (entries, _total) = self.store.readdir(fh, offset)?;
        Ok(entries.into_iter().map(|e| (0, e)).collect())
    }

    /// [`Fs::readdir`] with each entry's attributes, given to `add` with the offset of
    /// the next entry until it answers "full". Each entry but `.` and `..` counts a lookup
    /// (the kernel does not count those two), given back here for the entry that did not
    /// fit. Entries removed since the listing are left out.
    pub fn readdirplus(
        &self,
        caller: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(u64, &OsStr, &AttrOut) -> bool,
    ) -> FsResult<()> {
        for (i, (_, e)) in self
            .readdir(caller, ino, fh, offset)?
            .into_iter()
            .enumerate()
        {
            let next = offset + i as u64 + 1;
            let dots = matches!(e.name.as_bytes(), b"." | b"..");
            let attr = if dots {
                self.getattr(caller, ino)
            } else {
                self.attr_out(self.lookup_attr(caller, ino, &e.name))
            };
            let Ok(attr) = attr else { continue };
            if add(next, &e.name, &attr) {
                if !dots {
                    self.forget(attr.attr.ino, 1);
                }
                break;
            }
        }
        Ok(())
    }

    pub fn releasedir(&self, ino: u64, fh: u64) {
        if let Node::Backing(_) = self.router.node(ino) {
            self.store.releasedir(fh);
        }
    }

    pub fn fsyncdir(&self, ino: u64, fh: u64, datasync: bool) -> FsResult<()> {
        match self.router.node(ino) {
            Node::Pseudo(_) => Ok(()),
            Node::Backing(_) => self.store.fsyncdir(fh, datasync),
        }
    }

    /// The statistics of the backing filesystem (also asked of a node of the pseudo tree).
    pub fn statfs(&self, ino: u64) -> FsResult<StatFs> {
        match self.router.node(ino) {
            Node::Pseudo(_) => self.store.statfs(ROOT_INO),
            Node::Backing(ino) => self.store.statfs(ino),
        }
    }

    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        self.refuse_pseudo(&[ino], &[], libc::EPERM)?;
        let path = self.store.path_of(ino);
        let route = WriteRoute::Setxattr {
            path: path.as_deref(),
            name,
        };
        self.guarded(caller, &route, || {
            self.store.setxattr(caller, ino, name, value, flags)
        })
    }

    pub fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<()> {
        self.refuse_pseudo(&[ino], &[], libc::EPERM)?;
        let path = self.store.path_of(ino);
        let route = WriteRoute::Removexattr {
            path: path.as_deref(),
            name,
        };
        self.guarded(caller, &route, || self.store.removexattr(caller, ino, name))
    }

    /// An xattr's value (`size` 0: only its length): computed by the policy, or the
    /// backing file's.
    pub fn getxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        size: u32,
    ) -> FsResult<XattrReply> {
        self.refuse_pseudo(&[ino], &[], libc::ENODATA)?;
        let path = self.store.path_of(ino);
        match self.policy.getxattr(caller, ino, path.as_deref(), name) {
            Some(Ok(v)) => sized(v, size),
            Some(Err(e)) => Err(e),
            None => self.store.getxattr(ino, name, size),
        }
    }

    /// The xattr names of a node: the backing file's, then the policy's computed ones.
    pub fn listxattr(&self, caller: &Caller, ino: u64, size: u32) -> FsResult<XattrReply> {
        if let Node::Pseudo(_) = self.router.node(ino) {
            return Ok(XattrReply::Size(0));
        }
        let path = self.store.path_of(ino);
        let extra = self.policy.listxattr(caller, ino, path.as_deref());
        if extra.is_empty() {
            return self.store.listxattr(ino, size);
        }
        // Merge: read the backing list in full, append the computed names.
        let mut list = match self.store.listxattr(ino, 0)? {
            XattrReply::Size(n) if n > 0 => match self.store.listxattr(ino, n)? {
                XattrReply::Data(d) => d,
                XattrReply::Size(_) => Vec::new(),
            },
            _ => Vec::new(),
        };
        for n in extra {
            list.extend_from_slice(n.as_bytes());
            list.push(0);
        }
        sized(list, size)
    }

    pub fn access(&self, caller: &Caller, ino: u64, mask: i32) -> FsResult<()> {
        match self.router.node(ino) {
            Node::Pseudo(_) => Ok(()),
            Node::Backing(ino) => self.store.access(caller, ino, mask),
        }
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

/// An xattr answer of `v` for a buffer of `size` bytes (0: only the length).
fn sized(v: Vec<u8>, size: u32) -> FsResult<XattrReply> {
    if size == 0 {
        Ok(XattrReply::Size(v.len() as u32))
    } else if v.len() > size as usize {
        Err(FsError(libc::ERANGE))
    } else {
        Ok(XattrReply::Data(v))
    }
}
