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
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

mod backing;
mod creds;
mod handles;
mod inos;
mod named;
mod print;
mod sys;
mod types;
mod umask;

pub use backing::Backing;
use handles::{handle_at, open_handle, FdCache, FileHandle, HandleOf};
pub use print::{fingerprint_at, has_content, Fingerprint};
use sys::{backing_flags, cstr, cvt, fstat_fd, fstatat, open_path_at, proc_path, xattr_reply};
pub use types::*;

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

/// Where the xattr calls reach a node: its descriptor's magic link (followed), or a
/// symlink's name under its parent (for the `l*` calls, which do not follow it).
enum Xattr {
    Fd(CString),
    Link(CString),
}

type GetXattr = unsafe extern "C" fn(
    *const libc::c_char,
    *const libc::c_char,
    *mut libc::c_void,
    usize,
) -> isize;
type ListXattr = unsafe extern "C" fn(*const libc::c_char, *mut libc::c_char, usize) -> isize;
type SetXattr = unsafe extern "C" fn(
    *const libc::c_char,
    *const libc::c_char,
    *const libc::c_void,
    usize,
    libc::c_int,
) -> libc::c_int;
type RemoveXattr = unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> libc::c_int;

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

/// What the backing directory holds at a path, a final symlink not followed.
#[derive(Debug, Clone, Copy)]
pub struct PathStat {
    pub stamp: Stamp,
    pub dir: bool,
    /// The number of names of the file (`st_nlink`).
    pub nlink: u64,
}

/// `fstatat` of the workspace-relative `rel` beneath the backing directory `root` (for
/// the policy's view of a path, which has no inode of the store): None when nothing is
/// there (or the name cannot be asked for).
pub fn lstat_at(root: std::os::fd::BorrowedFd<'_>, rel: &str) -> Option<PathStat> {
    let c = CString::new(rel).ok()?;
    let st = fstatat(root.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW).ok()?;
    Some(PathStat {
        stamp: Stamp::from_stat(&st),
        dir: st.st_mode & libc::S_IFMT == libc::S_IFDIR,
        nlink: st.st_nlink,
    })
}

/// Is the file at `rel` (beneath `root`) open for writing anywhere on this host: by any
/// process, through any mount of it, or by the kernel itself for a FUSE passthrough
/// descriptor whose daemon is gone? Asked by taking a read lease on it and giving it back
/// at once: the kernel grants none while the inode is open for writing (`EAGAIN`).
/// `Some(false)` for a symlink or nothing there; `None` when it cannot be told (a
/// filesystem without leases, `fs.leases-enable=0`, a caller without `CAP_LEASE` who
/// does not own the file).
pub fn open_for_writing(root: std::os::fd::BorrowedFd<'_>, rel: &str) -> Option<bool> {
    let c = CString::new(rel).ok()?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: a valid directory descriptor and a NUL-terminated path.
    let fd = unsafe { libc::openat(root.as_raw_fd(), c.as_ptr(), flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        return matches!(e, Some(libc::ELOOP | libc::ENOENT)).then_some(false);
    }
    // SAFETY: openat returned a descriptor that nothing else owns.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fcntl on a descriptor we own.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
    if r == 0 {
        // SAFETY: as above; the lease goes with the descriptor anyway.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
        return Some(false);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN | libc::EBUSY) => Some(true),
        _ => None,
    }
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

    /// Set once which names [`Store::path_of`] prefers.
    pub fn set_name_preference(&self, f: NamePreference) {
        let _ = self.prefer.set(f);
    }

    /// The workspace-relative path of `ino` ("" for the root): the name it was last seen
    /// under, unless that name is not preferred (see [`Store::set_name_preference`]) and
    /// another name it was seen under, still its name, is.
    pub fn path_of(&self, ino: u64) -> Option<PathBuf> {
        let p = self.last_path_of(ino)?;
        let Some(prefer) = self.prefer.get() else {
            return Some(p);
        };
        let (key, others) = {
            let t = self.tables.read();
            let node = t.inodes.get(&ino)?;
            let st = node.state.lock();
            if st.others.is_empty() {
                return Some(p);
            }
            (node.key, st.others.clone())
        };
        if prefer(&p) {
            return Some(p);
        }
        for (parent, name) in others.iter().rev() {
            if !self.names(*parent, name, key) {
                continue;
            }
            if let Some(q) = self.last_path_of(*parent).map(|d| d.join(name)) {
                if prefer(&q) {
                    return Some(q);
                }
            }
        }
        Some(p)
    }

    /// Does (parent, name) name the file at `key` in the backing directory now?
    fn names(&self, parent: u64, name: &OsStr, key: (u64, u64)) -> bool {
        let Ok((_, dir)) = self.node_fd(parent) else {
            return false;
        };
        let Ok(c) = cstr(name) else { return false };
        fstatat(dir.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| (st.st_dev, st.st_ino) == key)
    }

    /// The workspace-relative path `ino` was last seen under ("" for the root).
    fn last_path_of(&self, ino: u64) -> Option<PathBuf> {
        let t = self.tables.read();
        let mut names: Vec<OsString> = Vec::new();
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == ROOT_INO {
                let mut p = PathBuf::new();
                for n in names.iter().rev() {
                    p.push(n);
                }
                return Some(p);
            }
            let node = t.inodes.get(&cur)?;
            let st = node.state.lock();
            let (parent, name) = st.link.as_ref()?;
            names.push(name.clone());
            cur = *parent;
        }
        None
    }

    /// The workspace-relative path of `name` under `parent`.
    pub fn child_path(&self, parent: u64, name: &OsStr) -> Option<PathBuf> {
        self.path_of(parent).map(|p| p.join(name))
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

    /// Is the node open for writing through the mount (a handle of ours)?
    pub fn has_write_handle(&self, ino: u64) -> bool {
        self.handles
            .read()
            .values()
            .any(|h| h.ino == ino && h.flags & libc::O_ACCMODE != libc::O_RDONLY)
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

    /// `mknod` of `mode` (unmasked) with the caller's `umask` (see [`umask`]).
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

    /// `mkdir` of `mode` (unmasked) with the caller's `umask` (see [`umask`]).
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
    /// [`umask`]); counts one lookup and returns a handle id.
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

    fn add_handle(&self, ino: u64, file: File, flags: i32) -> FsResult<(u64, Arc<Handle>)> {
        let st = fstat_fd(file.as_raw_fd())?;
        let h = Arc::new(Handle {
            ino,
            file,
            flags,
            state: std::sync::OnceLock::new(),
            kernel: std::sync::OnceLock::new(),
            stamp: Mutex::new(Stamp::from_stat(&st)),
        });
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.write().insert(fh, h.clone());
        Ok((fh, h))
    }

    /// Open `ino` with the kernel's `flags`; returns the handle id.
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<(u64, Arc<Handle>)> {
        let (node, node_fd) = self.node_fd(ino)?;
        if node.kind == Kind::Symlink {
            return Err(FsError(libc::ELOOP));
        }
        let path = proc_path(node_fd.as_raw_fd());
        // SAFETY: open of a NUL-terminated /proc/self/fd path; the result is checked by cvt.
        let fd = cvt(unsafe {
            libc::open(
                path.as_ptr(),
                // The node is known not to be a symlink, and the reopen goes through the
                // /proc/self/fd magic link: O_NOFOLLOW would make that fail with ELOOP.
                (backing_flags(flags) & !(libc::O_CREAT | libc::O_NOFOLLOW)) | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: open just returned this descriptor and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        self.add_handle(ino, file, flags)
    }

    pub fn handle(&self, fh: u64) -> FsResult<Arc<Handle>> {
        self.handles
            .read()
            .get(&fh)
            .cloned()
            .ok_or(FsError(libc::EBADF))
    }

    /// The current stamp of an open handle's backing file.
    pub fn stamp(h: &Handle) -> FsResult<Stamp> {
        Ok(Stamp::from_stat(&fstat_fd(h.file.as_raw_fd())?))
    }

    pub fn release(&self, fh: u64) -> Option<Arc<Handle>> {
        self.handles.write().remove(&fh)
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let h = self.handle(fh)?;
        let mut buf = vec![0u8; size as usize];
        let mut done = 0usize;
        // Fill the whole request unless EOF: the kernel treats a short read as EOF.
        while done < buf.len() {
            // SAFETY: pread writes at most buf.len() - done bytes, which is what is left of
            // `buf` at `done`.
            let n = cvt(unsafe {
                libc::pread(
                    h.file.as_raw_fd(),
                    buf[done..].as_mut_ptr().cast(),
                    buf.len() - done,
                    (offset + done as u64) as libc::off_t,
                )
            })?;
            if n == 0 {
                break;
            }
            done += n as usize;
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// Write `data` at `offset`, or, with `append`, at the end of the file as it is at the
    /// time of the write (`RWF_APPEND`: atomic against every other writer of the backing
    /// file, as `O_APPEND` is natively, even when the kernel's idea of the size is stale).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8], append: bool) -> FsResult<u32> {
        let h = self.handle(fh)?;
        let flags = if append { libc::RWF_APPEND } else { 0 };
        let mut done = 0usize;
        while done < data.len() {
            let iov = libc::iovec {
                iov_base: data[done..].as_ptr() as *mut libc::c_void,
                iov_len: data.len() - done,
            };
            // SAFETY: pwritev2 reads at most iov_len bytes from iov_base, which is what is
            // left of `data` at `done`; `iov` outlives the call.
            let n = cvt(unsafe {
                libc::pwritev2(
                    h.file.as_raw_fd(),
                    &iov,
                    1,
                    (offset + done as u64) as libc::off_t,
                    flags,
                )
            })?;
            done += n as usize;
        }
        Ok(done as u32)
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.handle(fh)?;
        let fd = h.file.as_raw_fd();
        Ok(if datasync {
            nix::unistd::fdatasync(fd)
        } else {
            nix::unistd::fsync(fd)
        }?)
    }

    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        let h = self.handle(fh)?;
        // SAFETY: fallocate on a descriptor the handle keeps open; no memory is passed.
        cvt(unsafe {
            libc::fallocate(
                h.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        })
        .map(drop)
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        let h = self.handle(fh)?;
        // SAFETY: lseek on a descriptor the handle keeps open; no memory is passed.
        cvt(unsafe { libc::lseek(h.file.as_raw_fd(), offset, whence) })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> FsResult<u64> {
        let hi = self.handle(fh_in)?;
        let ho = self.handle(fh_out)?;
        let mut oi = off_in as libc::off64_t;
        let mut oo = off_out as libc::off64_t;
        // SAFETY: copy_file_range between descriptors the handles keep open, updating the two
        // offsets we own.
        let n = cvt(unsafe {
            libc::copy_file_range(
                hi.file.as_raw_fd(),
                &mut oi,
                ho.file.as_raw_fd(),
                &mut oo,
                len as usize,
                flags,
            )
        })?;
        Ok(n as u64)
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

    /// The node at `key` lost the name (parent, name) but may have others: if that was
    /// its current name, an earlier name that still names it (checked in the backing
    /// directory) takes over. Without one it keeps the old name.
    fn unname(&self, key: (u64, u64), parent: u64, name: &OsStr) {
        let Some(ino) = self.tables.read().by_key.get(&key).copied() else {
            return;
        };
        let Ok(node) = self.inode(ino) else { return };
        let others = {
            let mut st = node.state.lock();
            st.others.retain(|(p, n)| !(*p == parent && n == name));
            match &st.link {
                Some((p, n)) if *p == parent && n == name => st.others.clone(),
                _ => return,
            }
        };
        for (p, n) in others.iter().rev() {
            if self.names(*p, n, key) {
                let mut st = node.state.lock();
                if st
                    .link
                    .as_ref()
                    .is_some_and(|(lp, ln)| *lp == parent && ln == name)
                {
                    st.others.retain(|(q, m)| !(q == p && m == n));
                    st.link = Some((*p, n.clone()));
                }
                return;
            }
        }
    }

    /// A node lost a name: once it has no name left (a removed file still open, a file
    /// replaced by a rename), it has no path any more ([`Store::path_of`] is `None`), so
    /// nothing done through an old handle is attributed to whatever now has that name.
    ///
    /// `held` is the node's descriptor taken before the name went: a node with no name
    /// left keeps it pinned, as it can no longer be re-resolved by name.
    fn orphan(&self, key: (u64, u64), held: Option<Arc<OwnedFd>>) {
        let Some(ino) = self.tables.read().by_key.get(&key).copied() else {
            return;
        };
        if ino == ROOT_INO {
            return;
        }
        let Ok(node) = self.inode(ino) else { return };
        let fd = match held.clone() {
            Some(fd) => Ok(fd),
            None => self.node_fd(ino).map(|(_, fd)| fd),
        };
        let gone = match fd.and_then(|fd| fstat_fd(fd.as_raw_fd())) {
            Ok(st) => st.st_nlink == 0 || node.kind == Kind::Dir,
            Err(_) => true,
        };
        if gone {
            node.state.lock().link = None;
            if let Some(fd) = held {
                *node.pinned.lock() = Some(fd);
                self.fds.remove(ino);
            }
        }
    }

    /// The descriptor of the node we know at `key`, if any, to pin if it loses its last
    /// name: without handles it could not be re-resolved, and with them its inode number
    /// could be given to a new file while the kernel still knows the old one (a current
    /// directory, say), which would then show the new file's attributes under its number.
    /// With handles only a descriptor at hand is taken (pinned or cached: a node the
    /// kernel used lately, as a current directory is), so a removal costs no
    /// `open_by_handle_at`.
    fn known_fd(&self, key: (u64, u64)) -> Option<Arc<OwnedFd>> {
        let ino = *self.tables.read().by_key.get(&key)?;
        if self.mount.is_some() {
            let node = self.inode(ino).ok()?;
            let pinned = node.pinned.lock().clone();
            return pinned.or_else(|| self.fds.get(ino));
        }
        self.node_fd(ino).ok().map(|(_, fd)| fd)
    }

    /// The number of the node at backing (dev, ino), if there is one.
    fn known_number(&self, dev: u64, ino: u64) -> Option<u64> {
        self.tables.read().by_key.get(&(dev, ino)).copied()
    }

    /// Point the inode now found at (parent, name) to that name.
    fn relink(&self, parent: u64, name: &OsStr) {
        let Ok((_, dir_fd)) = self.node_fd(parent) else {
            return;
        };
        let Ok(c) = cstr(name) else { return };
        let Ok(st) = fstatat(dir_fd.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW) else {
            return;
        };
        let t = self.tables.read();
        if let Some(ino) = t.by_key.get(&(st.st_dev, st.st_ino)) {
            if *ino != ROOT_INO {
                t.inodes[ino].state.lock().set_link(parent, name);
            }
        }
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

    /// A path that reaches the node itself for the xattr calls (which do not accept
    /// `O_PATH` descriptors). Symlinks have no user xattrs on Linux.
    /// The descriptor returned keeps the path valid.
    /// The path the xattr calls take for `ino`, and what keeps it valid. A symlink's
    /// xattrs (`trusted.*`, `security.*`) are reached by its name under its parent's
    /// descriptor with the `l*` calls, which do not follow it (the magic link of its own
    /// `O_PATH` descriptor would be followed, to the target); the name is checked to be
    /// the node's first. Calls on `Xattr::Link` paths must be the `l*` ones.
    fn xattr_target(&self, ino: u64) -> FsResult<(Arc<Inode>, Xattr, Arc<OwnedFd>)> {
        let (node, node_fd) = self.node_fd(ino)?;
        if node.kind != Kind::Symlink {
            let p = proc_path(node_fd.as_raw_fd());
            return Ok((node, Xattr::Fd(p), node_fd));
        }
        let (parent, name) = node
            .state
            .lock()
            .link
            .clone()
            .ok_or(FsError(libc::ESTALE))?;
        let (_, dir) = self.node_fd(parent)?;
        let mut p = proc_path(dir.as_raw_fd()).into_bytes();
        p.push(b'/');
        p.extend_from_slice(name.as_bytes());
        let p = CString::new(p).map_err(|_| FsError(libc::EINVAL))?;
        let st = fstatat(dir.as_raw_fd(), &cstr(&name)?, libc::AT_SYMLINK_NOFOLLOW)?;
        if (st.st_dev, st.st_ino) != node.key {
            return Err(FsError(libc::ESTALE));
        }
        Ok((node, Xattr::Link(p), dir))
    }

    /// Get an xattr; `size` 0 asks for the length only (returned as an empty vec + len).
    ///
    /// The kernel asks for `system.posix_acl_access` to check permissions (POSIX ACLs are
    /// negotiated): a backing filesystem without ACL support has no ACLs, and its answer
    /// `EOPNOTSUPP` would fail every check, so it is `ENODATA` (no ACL: the mode decides).
    pub fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> FsResult<XattrReply> {
        let (_, p, _fd) = self.xattr_target(ino)?;
        let n = cstr(name)?;
        let mut buf = vec![0u8; size as usize];
        let (call, p) = match &p {
            Xattr::Fd(p) => (libc::getxattr as GetXattr, p),
            Xattr::Link(p) => (libc::lgetxattr as GetXattr, p),
        };
        // SAFETY: getxattr writes at most buf.len() bytes into `buf`; both names are
        // NUL-terminated.
        let r = cvt(unsafe { call(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) });
        match r {
            Err(FsError(libc::EOPNOTSUPP)) if is_posix_acl(name) => Err(FsError(libc::ENODATA)),
            r => Ok(xattr_reply(buf, r? as usize, size)),
        }
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> FsResult<XattrReply> {
        let (_, p, _fd) = self.xattr_target(ino)?;
        let mut buf = vec![0u8; size as usize];
        let (call, p) = match &p {
            Xattr::Fd(p) => (libc::listxattr as ListXattr, p),
            Xattr::Link(p) => (libc::llistxattr as ListXattr, p),
        };
        // SAFETY: listxattr writes at most buf.len() bytes into `buf`; the path is
        // NUL-terminated.
        let r = cvt(unsafe { call(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
        Ok(xattr_reply(buf, r as usize, size))
    }

    /// Set an xattr. A POSIX ACL is set as the caller (see [`acl_as_caller`]).
    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        let (_, p, _fd) = self.xattr_target(ino)?;
        let n = cstr(name)?;
        let _as = acl_as_caller(caller, name);
        let (call, p) = match &p {
            Xattr::Fd(p) => (libc::setxattr as SetXattr, p),
            Xattr::Link(p) => (libc::lsetxattr as SetXattr, p),
        };
        // SAFETY: setxattr reads value.len() bytes of `value`; both names are NUL-terminated.
        cvt(unsafe {
            call(
                p.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        })
        .map(drop)
    }

    /// Remove an xattr. A POSIX ACL is removed as the caller (see [`acl_as_caller`]).
    pub fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<()> {
        let (_, p, _fd) = self.xattr_target(ino)?;
        let n = cstr(name)?;
        let _as = acl_as_caller(caller, name);
        let (call, p) = match &p {
            Xattr::Fd(p) => (libc::removexattr as RemoveXattr, p),
            Xattr::Link(p) => (libc::lremovexattr as RemoveXattr, p),
        };
        // SAFETY: removexattr with a NUL-terminated path and name.
        cvt(unsafe { call(p.as_ptr(), n.as_ptr()) }).map(drop)
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

/// The two xattrs that hold POSIX ACLs.
pub fn is_posix_acl(name: &OsStr) -> bool {
    matches!(
        name.as_bytes(),
        b"system.posix_acl_access" | b"system.posix_acl_default"
    )
}

/// A POSIX ACL is set or removed with the caller's fs uid, gid and groups: the backing
/// filesystem then decides as for the caller's own `setfacl` (only the owner may, and
/// setting an access ACL clears set-group-ID when the caller is not in the file's group,
/// which it never does for root). Other xattrs are set as the daemon: the kernel has
/// checked them for the caller already.
fn acl_as_caller(caller: &Caller, name: &OsStr) -> Option<creds::AsCaller> {
    is_posix_acl(name).then(|| creds::AsCaller::enter(caller))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let fd = Store::open_root(d.path()).unwrap();
        (d, Store::new(fd, Some(".coherent".into())).unwrap())
    }

    /// A request of root beginning now.
    fn root() -> Caller {
        Caller {
            pid: 0,
            uid: 0,
            gid: 0,
            started: crate::request_timeout::Started::now(),
        }
    }

    #[test]
    fn lookup_counts_and_paths_follow_renames() {
        let (d, s) = store();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/f"), b"x").unwrap();
        let a = s.lookup(ROOT_INO, OsStr::new("a")).unwrap();
        let f = s.lookup(a.ino, OsStr::new("f")).unwrap();
        assert_eq!(s.lookup(a.ino, OsStr::new("f")).unwrap().ino, f.ino);
        assert_eq!(s.path_of(f.ino).unwrap(), Path::new("a/f"));
        s.rename(a.ino, OsStr::new("f"), ROOT_INO, OsStr::new("g"), 0)
            .unwrap();
        assert_eq!(s.path_of(f.ino).unwrap(), Path::new("g"));
        s.forget(f.ino, 1);
        assert!(s.getattr(f.ino).is_ok());
        s.forget(f.ino, 1);
        assert_eq!(s.getattr(f.ino), Err(FsError(libc::ESTALE)));
        assert_eq!(s.inode_count(), 2);
    }

    #[test]
    fn removed_and_replaced_nodes_lose_their_path() {
        let (d, s) = store();
        for n in ["a", "b", "c"] {
            std::fs::write(d.path().join(n), n).unwrap();
        }
        let a = s.lookup(ROOT_INO, OsStr::new("a")).unwrap();
        let b = s.lookup(ROOT_INO, OsStr::new("b")).unwrap();
        let c = s.lookup(ROOT_INO, OsStr::new("c")).unwrap();
        std::fs::hard_link(d.path().join("c"), d.path().join("c2")).unwrap();
        s.unlink(ROOT_INO, OsStr::new("a")).unwrap();
        assert_eq!(s.path_of(a.ino), None, "removed");
        s.rename(ROOT_INO, OsStr::new("c"), ROOT_INO, OsStr::new("b"), 0)
            .unwrap();
        assert_eq!(s.path_of(b.ino), None, "replaced by the rename");
        assert_eq!(s.path_of(c.ino).unwrap(), Path::new("b"));
        // A node with another name left keeps its last known one.
        std::fs::hard_link(d.path().join("b"), d.path().join("b3")).unwrap();
        s.unlink(ROOT_INO, OsStr::new("c2")).unwrap();
        assert_eq!(s.path_of(c.ino).unwrap(), Path::new("b"));
        // ... and when that one is removed, another name it was seen under takes over.
        s.lookup(ROOT_INO, OsStr::new("b3")).unwrap();
        assert_eq!(s.path_of(c.ino).unwrap(), Path::new("b3"));
        s.lookup(ROOT_INO, OsStr::new("b")).unwrap();
        assert_eq!(s.path_of(c.ino).unwrap(), Path::new("b"));
        s.unlink(ROOT_INO, OsStr::new("b")).unwrap();
        assert_eq!(
            s.path_of(c.ino).unwrap(),
            Path::new("b3"),
            "not the removed name"
        );
    }

    /// A store holding at most 8 descriptors; `handles` false: re-resolution by name.
    fn small_store(handles: bool) -> (tempfile::TempDir, Store) {
        let (d, mut s) = store();
        s.fds = FdCache::new(8);
        if !handles {
            s.mount = None;
        }
        (d, s)
    }

    fn bounded_descriptors(handles: bool) {
        let (d, s) = small_store(handles);
        assert_eq!(s.mount.is_some(), handles);
        let sub = s
            .mkdir(&root(), ROOT_INO, OsStr::new("sub"), 0o755, 0)
            .unwrap();
        let mut inos = Vec::new();
        for i in 0..300 {
            let name = format!("f{i}");
            let (a, fh, _) = s
                .create(
                    &root(),
                    sub.ino,
                    OsStr::new(&name),
                    0o644,
                    0,
                    libc::O_WRONLY,
                )
                .unwrap();
            s.write(fh, 0, name.as_bytes(), false).unwrap();
            s.release(fh);
            inos.push(a.ino);
        }
        assert!(s.fds.len() <= 8, "{} descriptors cached", s.fds.len());
        // Every node still answers, re-opened on demand, after its descriptor was evicted.
        for (i, ino) in inos.iter().enumerate() {
            let a = s.getattr(*ino).unwrap();
            assert_eq!(a.size, format!("f{i}").len() as u64);
            let (fh, _) = s.open(*ino, libc::O_RDONLY).unwrap();
            assert_eq!(s.read(fh, 0, 16).unwrap(), format!("f{i}").as_bytes());
            s.release(fh);
        }
        assert!(s.fds.len() <= 8);
        // Renamed behind a cold cache: still the same node under its new name.
        s.rename(sub.ino, OsStr::new("f7"), ROOT_INO, OsStr::new("g7"), 0)
            .unwrap();
        for ino in &inos[100..120] {
            s.getattr(*ino).unwrap();
        }
        assert_eq!(s.getattr(inos[7]).unwrap().size, 2);
        // Removed and still referenced: the node keeps answering from its pinned descriptor.
        let (fh, _) = s.open(inos[9], libc::O_RDONLY).unwrap();
        s.unlink(sub.ino, OsStr::new("f9")).unwrap();
        for ino in &inos[120..140] {
            s.getattr(*ino).unwrap();
        }
        assert_eq!(s.getattr(inos[9]).unwrap().nlink, 0);
        s.release(fh);
        // Replaced behind the volume's back with a new file: never reached through the old
        // node (a stale handle, or a (dev, ino) that no longer matches).
        for ino in &inos[140..160] {
            s.getattr(*ino).unwrap();
        }
        std::fs::remove_file(d.path().join("sub/f11")).unwrap();
        std::fs::write(d.path().join("sub/f11"), b"another").unwrap();
        match s.getattr(inos[11]) {
            Err(e) => assert_eq!(e, FsError(libc::ESTALE)),
            // By name, a reused inode number at the same name cannot be told apart (the
            // known limit of the fallback); with handles the generation tells.
            Ok(a) => assert!(!handles, "old node reached a new file: {a:?}"),
        }
        let again = s.lookup(sub.ino, OsStr::new("f11")).unwrap();
        // The new file's number is its own inode number (docs/posix.md#identity).
        let new_ino = std::fs::symlink_metadata(d.path().join("sub/f11")).unwrap();
        assert_eq!(again.ino, std::os::unix::fs::MetadataExt::ino(&new_ino));
        assert_eq!(again.size, 7);
    }

    /// A node whose file is gone and whose inode number came back for a new file (as
    /// ext4 does) is told apart by its handle: the number is the new file's now, and the
    /// kernel's references to the old one are counted on (its forgets come for it).
    #[test]
    fn a_reused_inode_number_goes_to_the_new_file() {
        let (d, s) = small_store(true);
        std::fs::write(d.path().join("f"), b"new").unwrap();
        let st = fstatat(
            s.node_fd(ROOT_INO).unwrap().1.as_raw_fd(),
            c"f",
            libc::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
        let stale = FileHandle::from_parts(1, vec![0; 8]);
        {
            let mut t = s.tables.write();
            t.inodes.insert(
                st.st_ino,
                Arc::new(Inode {
                    key: (st.st_dev, st.st_ino),
                    kind: Kind::File,
                    handle: Some(stale),
                    pinned: Mutex::new(None),
                    state: Mutex::new(InodeState {
                        refs: 1,
                        link: Some((ROOT_INO, "old".into())),
                        others: Vec::new(),
                    }),
                }),
            );
            t.by_key.insert((st.st_dev, st.st_ino), st.st_ino);
            s.live.fetch_add(1, Ordering::Relaxed);
        }
        let a = s.lookup(ROOT_INO, OsStr::new("f")).unwrap();
        assert_eq!(a.ino, st.st_ino);
        assert_eq!(a.size, 3, "the new file's attributes");
        assert_eq!(s.path_of(a.ino).unwrap(), Path::new("f"));
        assert_eq!(s.inode_count(), 2, "one node for the number");
        // The old reference's forget leaves the new one's.
        s.forget(st.st_ino, 1);
        assert_eq!(s.getattr(st.st_ino).unwrap().size, 3);
        s.forget(st.st_ino, 1);
        assert_eq!(s.inode_count(), 1);
    }

    #[test]
    fn bounded_descriptors_with_handles() {
        bounded_descriptors(true);
    }

    #[test]
    fn bounded_descriptors_by_name() {
        bounded_descriptors(false);
    }

    #[test]
    fn hidden_name_is_not_visible() {
        let (d, s) = store();
        std::fs::create_dir(d.path().join(".coherent")).unwrap();
        assert_eq!(
            s.lookup(ROOT_INO, OsStr::new(".coherent")),
            Err(FsError(libc::ENOENT))
        );
        let fh = s.opendir(ROOT_INO).unwrap();
        let names: Vec<_> = s
            .readdir(fh, 0)
            .unwrap()
            .0
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec![OsString::from("."), OsString::from("..")]);
        assert_eq!(
            s.mkdir(&root(), ROOT_INO, OsStr::new(".coherent"), 0o755, 0),
            Err(FsError(libc::EEXIST))
        );
    }
}
