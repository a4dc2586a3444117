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
mod data;
mod killpriv;
mod locks;
mod names;
mod policy;
mod pseudo;
mod router;
mod xattrs;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use crate::store::HandleState;
pub use counters::{Counters, Op};
pub use locks::{LockDone, LockSpan, Locks};
pub use policy::{open_writes, HandleInfo, NoPolicy, OpenInfo, Permit, Policy, WriteRoute};
pub use pseudo::{PseudoFs, ReadDone};
use router::{Node, Router};

use crate::store::{
    Attr, Caller, DirEntry, FsError, FsResult, Handle, Kind, StatFs, Store, ROOT_INO,
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
        let path = self.store.path_of(h.ino);
        self.policy
            .before_handle_write(h.state.get(), path.as_deref())
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

    pub fn access(&self, caller: &Caller, ino: u64, mask: i32) -> FsResult<()> {
        match self.router.node(ino) {
            Node::Pseudo(_) => Ok(()),
            Node::Backing(ino) => self.store.access(caller, ino, mask),
        }
    }
}
