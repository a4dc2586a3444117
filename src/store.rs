//! The backing directory: an inode store of `O_PATH` handles keyed by (dev, ino), open
//! file and directory handles, and every filesystem operation performed against the
//! backing directory (docs/design.md#speed to #layout).
//!
//! No FUSE types here: callers pass plain inode numbers, names and libc flags, and get
//! plain Rust values back or an [`FsError`] carrying the errno.
//!
//! Inode numbers (the kernel's node ids, and what `stat` shows) are the backing files'
//! own, with the device folded in (`inos`): a file keeps its number for its life, across
//! forgets, remounts and restarts. The root's node id is 1 whatever its number. Numbers
//! with [`VIRTUAL_INO_BIT`] set are reserved for virtual nodes served elsewhere
//! (`.coherent/`).
//! Each inode remembers the (parent, name) it was last looked up, created or renamed
//! under, so a workspace-relative path can be named for every operation.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

mod attrs;
mod backing;
mod creds;
mod dirs;
mod files;
mod handles;
mod inos;
mod named;
mod namespace;
mod paths;
mod print;
mod probe;
mod sys;
mod types;
mod umask;
mod xattrs;

pub use backing::Backing;
use handles::{handle_at, open_handle, FdCache, FileHandle, HandleOf};
pub use print::{fingerprint_at, has_content, Fingerprint};
pub use probe::{lstat_at, open_for_writing, PathStat};
use sys::{cstr, cvt, fstat_fd, fstatat, open_path_at};
pub use types::*;
pub use xattrs::is_posix_acl;

/// The inode number of the mount root.
pub const ROOT_INO: u64 = 1;
/// Inode numbers with this bit set are never the store's: they are reserved for the
/// pseudo tree (`.coherent/`), which `fs::router` tells apart.
pub const VIRTUAL_INO_BIT: u64 = 1 << 63;

/// Not one of the store's inode numbers (the store never allocates these).
fn reserved(ino: u64) -> bool {
    ino & VIRTUAL_INO_BIT != 0
}

struct Inode {
    key: (u64, u64),
    kind: Kind,
    /// The backing file's handle, when its filesystem has them and it is on the root's
    /// mount: its descriptor is re-opened from it on demand.
    handle: Option<FileHandle>,
    /// A descriptor held for the node's whole life: the root, nodes on another mount, and
    /// nodes without a handle that lost their last name (they cannot be re-resolved).
    pinned: Mutex<Option<Arc<OwnedFd>>>,
    state: Mutex<InodeState>,
}

struct InodeState {
    /// Kernel lookup count; the inode is dropped when it reaches 0.
    refs: u64,
    /// The (parent, name) this inode was last seen under; None for the root.
    link: Option<(u64, OsString)>,
    /// Other (parent, name)s it was seen under before (hard links; some may be gone):
    /// when `link` is removed while the file keeps a name, one of these that still
    /// names it takes over, so the path of an open through another name is never the
    /// removed one.
    others: Vec<(u64, OsString)>,
}

/// At most this many earlier names are remembered per inode.
const OTHER_NAMES: usize = 16;

impl InodeState {
    /// Point the inode to (parent, name), remembering the name it had.
    fn set_link(&mut self, parent: u64, name: &OsStr) {
        if self
            .link
            .as_ref()
            .is_some_and(|(p, n)| *p == parent && n == name)
        {
            return;
        }
        self.others.retain(|(p, n)| !(*p == parent && n == name));
        if let Some(old) = self.link.replace((parent, name.to_owned())) {
            if self.others.len() >= OTHER_NAMES {
                self.others.remove(0);
            }
            self.others.push(old);
        }
    }
}

/// What the policy keeps about one open file, in the file's handle: its key in the
/// policy's own registry of open handles (typed there; the store only carries it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandleState(pub u64);

/// What the FUSE glue keeps about one open file (its passthrough registration).
pub type KernelState = Arc<dyn std::any::Any + Send + Sync>;

/// An open regular file (or anything else opened through `open`): the one state of an
/// open file. The layers above keep theirs here too, so it lives and goes with the handle.
pub struct Handle {
    pub ino: u64,
    pub file: File,
    /// The open flags the kernel sent.
    pub flags: i32,
    /// Stamp at open or the last flush.
    pub stamp: Mutex<Stamp>,
    /// The policy's state of this open file (set at open; none: it keeps nothing).
    pub state: std::sync::OnceLock<HandleState>,
    /// The kernel's registration of the file for FUSE passthrough, if any (set by the
    /// FUSE glue at open, dropped with the handle).
    pub kernel: std::sync::OnceLock<KernelState>,
}

/// An open directory: a snapshot of its entries, refreshed when read from offset 0.
pub struct DirHandle {
    pub ino: u64,
    file: File,
    entries: Mutex<Vec<DirEntry>>,
}

#[derive(Default)]
struct Tables {
    inodes: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<(u64, u64), u64>,
}

/// The backing directory and everything open in it.
pub struct Store {
    tables: RwLock<Tables>,
    /// Number of inodes held (root included), readable without the lock.
    live: Arc<AtomicU64>,
    /// The numbers of backing files (docs/design.md#identity).
    inos: inos::Inos,
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    dirs: RwLock<HashMap<u64, Arc<DirHandle>>>,
    next_fh: AtomicU64,
    /// The bounded set of open `O_PATH` descriptors of nodes that are not pinned.
    fds: FdCache,
    /// A plain descriptor of the root for `open_by_handle_at` (which does not take an
    /// `O_PATH` one), and the root's mount id; None when the filesystem has no handles.
    mount: Option<(File, i32)>,
    /// A name at the root that is never shown from the backing directory (the virtual
    /// `.coherent`): lookups, readdir and creations of it are answered elsewhere.
    hidden: Option<OsString>,
    /// Of several names of one file, the kind a request by inode is attributed to (the
    /// volume prefers a tracked name to an ignored one): see [`Store::path_of`].
    prefer: std::sync::OnceLock<NamePreference>,
    /// The root descriptor (the one pinned by the root inode), lent to the layers above.
    backing: Backing,
}

/// Which names of a file with several [`Store::path_of`] prefers.
pub type NamePreference = Box<dyn Fn(&Path) -> bool + Send + Sync>;

impl Store {
    /// Open the backing directory (already opened by the caller, e.g. before mounting over
    /// it) as the root of a new store.
    pub fn new(root: OwnedFd, hidden: Option<OsString>) -> FsResult<Store> {
        let st = fstat_fd(root.as_raw_fd())?;
        if Kind::from_mode(st.st_mode) != Kind::Dir {
            return Err(FsError(libc::ENOTDIR));
        }
        let key = (st.st_dev, st.st_ino);
        let mount = match handle_at(root.as_raw_fd(), c"")? {
            HandleOf::Handle(h, mount_id) => {
                // SAFETY: openat of "." under a directory descriptor we hold, with a
                // NUL-terminated C literal; the result is checked by cvt.
                let fd = cvt(unsafe {
                    libc::openat(
                        root.as_raw_fd(),
                        c".".as_ptr(),
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                })?;
                // SAFETY: openat just returned this descriptor and nothing else owns it.
                let m = unsafe { File::from_raw_fd(fd) };
                // open_by_handle_at needs CAP_DAC_READ_SEARCH: without it, resolve by name.
                match open_handle(m.as_raw_fd(), &h) {
                    Ok(_) => Some((m, mount_id)),
                    Err(e) => {
                        tracing::info!("no file handles ({e}): nodes are re-resolved by name");
                        None
                    }
                }
            }
            HandleOf::Unsupported => None,
        };
        let root = Arc::new(root);
        let backing = Backing::new(root.clone());
        let mut t = Tables::default();
        t.inodes.insert(
            ROOT_INO,
            Arc::new(Inode {
                key,
                kind: Kind::Dir,
                handle: None,
                pinned: Mutex::new(Some(root)),
                state: Mutex::new(InodeState {
                    refs: u64::MAX / 2,
                    link: None,
                    others: Vec::new(),
                }),
            }),
        );
        t.by_key.insert(key, ROOT_INO);
        Ok(Store {
            tables: RwLock::new(t),
            live: Arc::new(AtomicU64::new(1)),
            inos: inos::Inos::new(key),
            handles: RwLock::new(HashMap::new()),
            dirs: RwLock::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            fds: FdCache::new(handles::default_capacity()),
            mount,
            hidden,
            prefer: std::sync::OnceLock::new(),
            backing,
        })
    }

    /// The backing directory, for the layers above (the store's own root descriptor).
    pub fn backing(&self) -> Backing {
        self.backing.clone()
    }

    /// Open `path` with `O_PATH` (for the in-place mount, before mounting over it).
    pub fn open_root(path: &Path) -> FsResult<OwnedFd> {
        let c = cstr(path.as_os_str())?;
        // SAFETY: open of a NUL-terminated path; the result is checked by cvt.
        let fd = cvt(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: open just returned this descriptor and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn inode(&self, ino: u64) -> FsResult<Arc<Inode>> {
        if reserved(ino) {
            return Err(FsError(libc::ENOENT));
        }
        self.tables
            .read()
            .inodes
            .get(&ino)
            .cloned()
            .ok_or(FsError(libc::ESTALE))
    }

    /// Is `name` under `parent` the hidden name?
    pub fn is_hidden(&self, parent: u64, name: &OsStr) -> bool {
        parent == ROOT_INO && self.hidden.as_deref() == Some(name)
    }

    /// The number of inodes currently referenced by the kernel (root included).
    pub fn inode_count(&self) -> usize {
        self.tables.read().inodes.len()
    }

    /// A live view of the inode count (for diagnostics from another thread).
    pub fn inode_gauge(&self) -> Arc<AtomicU64> {
        self.live.clone()
    }

    /// The node `ino` and an open `O_PATH` descriptor of it: pinned, cached, or re-opened
    /// (from its handle, else by its (parent, name) checked against its (dev, ino)).
    fn node_fd(&self, ino: u64) -> FsResult<(Arc<Inode>, Arc<OwnedFd>)> {
        self.node_fd_depth(ino, 0)
    }

    fn node_fd_depth(&self, ino: u64, depth: u32) -> FsResult<(Arc<Inode>, Arc<OwnedFd>)> {
        let node = self.inode(ino)?;
        let pinned = node.pinned.lock().clone();
        if let Some(fd) = pinned {
            return Ok((node, fd));
        }
        if let Some(fd) = self.fds.get(ino) {
            return Ok((node, fd));
        }
        let fd = match (&node.handle, &self.mount) {
            (Some(h), Some((m, _))) => open_handle(m.as_raw_fd(), h)?,
            _ => {
                // Re-resolution: the parent chain is held by the kernel's dentries.
                let link = node.state.lock().link.clone();
                let (parent, name) = link.ok_or(FsError(libc::ESTALE))?;
                if depth > 4096 {
                    return Err(FsError(libc::ELOOP));
                }
                let (_, dir) = self.node_fd_depth(parent, depth + 1)?;
                let fd = open_path_at(dir.as_raw_fd(), &cstr(&name)?)?;
                let st = fstat_fd(fd.as_raw_fd())?;
                if (st.st_dev, st.st_ino) != node.key {
                    return Err(FsError(libc::ESTALE));
                }
                fd
            }
        };
        let fd = Arc::new(fd);
        self.fds.put(ino, fd.clone());
        Ok((node, fd))
    }

    /// Register (or find) the node behind `fd` (whose handle is `handle`) and count one
    /// kernel lookup. `pin`: keep `fd` for the node's life instead of caching it.
    fn remember(
        &self,
        fd: OwnedFd,
        handle: Option<FileHandle>,
        pin: bool,
        st: &libc::stat,
        parent: u64,
        name: &OsStr,
    ) -> Attr {
        let key = (st.st_dev, st.st_ino);
        let mut t = self.tables.write();
        if let Some(attr) = Self::count_known(&t, st, handle.as_ref(), parent, name) {
            return attr;
        }
        let ino = self
            .inos
            .stable(key)
            .filter(|i| *i != ROOT_INO)
            .unwrap_or_else(|| self.inos.spare());
        // A node at that number already is a file whose inode number the backing
        // filesystem gave again (the old one is gone: its handle no longer opens). The
        // number is the new file's now; the kernel's references to the old one are
        // counted on (its forgets arrive for this number) and reach the new file, as a
        // reused inode number natively does through an old name looked up again.
        let refs = match t.inodes.remove(&ino) {
            Some(old) => {
                if t.by_key.get(&old.key) == Some(&ino) {
                    t.by_key.remove(&old.key);
                }
                self.fds.remove(ino);
                let r = old.state.lock().refs;
                r + 1
            }
            None => {
                self.live.fetch_add(1, Ordering::Relaxed);
                1
            }
        };
        t.by_key.insert(key, ino);
        let fd = Arc::new(fd);
        t.inodes.insert(
            ino,
            Arc::new(Inode {
                key,
                kind: Kind::from_mode(st.st_mode),
                handle,
                pinned: Mutex::new(pin.then(|| fd.clone())),
                state: Mutex::new(InodeState {
                    refs,
                    link: Some((parent, name.to_owned())),
                    others: Vec::new(),
                }),
            }),
        );
        if !pin {
            self.fds.put(ino, fd);
        }
        Attr::from_stat(ino, st)
    }

    /// Count one more lookup of an inode we already hold. With handles, the handle must
    /// match (a reused inode number has another); without, the node is the one at that
    /// (dev, ino) now.
    fn count_known(
        t: &Tables,
        st: &libc::stat,
        handle: Option<&FileHandle>,
        parent: u64,
        name: &OsStr,
    ) -> Option<Attr> {
        let ino = *t.by_key.get(&(st.st_dev, st.st_ino))?;
        let node = &t.inodes[&ino];
        if ino != ROOT_INO && node.handle.as_ref() != handle {
            return None;
        }
        let mut s = node.state.lock();
        s.refs += 1;
        if ino != ROOT_INO {
            s.set_link(parent, name);
        }
        Some(Attr::from_stat(ino, st))
    }

    /// Look `name` up under `parent`, counting one kernel lookup on success.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        if self.is_hidden(parent, name) {
            return Err(FsError(libc::ENOENT));
        }
        let (_, dir) = self.node_fd(parent)?;
        let c = cstr(name)?;
        let st = fstatat(dir.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW)?;
        let handle = match &self.mount {
            Some((_, root_mount)) => match handle_at(dir.as_raw_fd(), &c)? {
                HandleOf::Handle(h, m) if m == *root_mount => Some(h),
                // Another mount below the root: no mount fd for it, so hold its descriptor.
                _ => None,
            },
            None => None,
        };
        // Known already (the common case: the kernel revalidating after the TTL).
        if let Some(attr) =
            Self::count_known(&self.tables.read(), &st, handle.as_ref(), parent, name)
        {
            return Ok(attr);
        }
        // New: a descriptor, then stat through it, so the key and the descriptor agree.
        let (fd, handle) = match handle {
            Some(h) => (
                open_handle(self.mount.as_ref().expect("handles").0.as_raw_fd(), &h)?,
                Some(h),
            ),
            None => (open_path_at(dir.as_raw_fd(), &c)?, None),
        };
        let st = fstat_fd(fd.as_raw_fd())?;
        let pin = self.mount.is_some() && handle.is_none();
        Ok(self.remember(fd, handle, pin, &st, parent, name))
    }

    /// Drop `n` kernel lookups of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO || reserved(ino) {
            return;
        }
        let mut t = self.tables.write();
        let gone = match t.inodes.get(&ino) {
            Some(node) => {
                let mut s = node.state.lock();
                s.refs = s.refs.saturating_sub(n);
                s.refs == 0
            }
            None => false,
        };
        if gone {
            if let Some(node) = t.inodes.remove(&ino) {
                self.live.fetch_sub(1, Ordering::Relaxed);
                self.fds.remove(ino);
                if t.by_key.get(&node.key) == Some(&ino) {
                    t.by_key.remove(&node.key);
                }
                // After a big tree is gone (rm -rf, a build's clean), give the memory back.
                if t.inodes.capacity() > 4096 && t.inodes.len() < t.inodes.capacity() / 8 {
                    t.inodes.shrink_to_fit();
                    t.by_key.shrink_to_fit();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
