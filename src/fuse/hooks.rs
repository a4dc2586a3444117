//! The points where the coherence layer plugs into the filesystem (issue 4).
//!
//! The adapter calls these around every write route of DESIGN.md §6, at every open,
//! flush and release, for xattr reads, and for every operation on a virtual node (inode
//! numbers with [`VIRTUAL_INO_BIT`](crate::passthrough::VIRTUAL_INO_BIT) set). The
//! default implementations do nothing: every write is allowed, tokens are 0, no xattr is
//! computed and no virtual node exists.
//!
//! Paths are workspace-relative (`""` is the root) and `None` only when the kernel refers
//! to a node whose name the store no longer knows (it was removed behind our back).
//!
//! Virtual routing: when [`Hooks::virtual_root_name`] returns a name (`.coherent`), that
//! name at the root is never taken from the backing directory (a backing entry of that
//! name is hidden, and creating, renaming or removing it is refused); its lookup goes to
//! [`Hooks::virtual_lookup`] with parent [`ROOT_INO`](crate::passthrough::ROOT_INO), and
//! every later request on a virtual inode goes to the `virtual_*` methods.

use std::ffi::{OsStr, OsString};
use std::path::Path;

pub use crate::coherence::Permit;
use crate::passthrough::{Attr, Caller, DirEntry, FsError, FsResult, SetAttr, Stamp};

/// The answer to a read, given later (see [`Hooks::virtual_read_deferred`]).
pub type ReadDone = Box<dyn FnOnce(FsResult<Vec<u8>>) + Send>;

/// A write route of DESIGN.md §6, with the path(s) involved.
#[derive(Debug, Clone, Copy)]
pub enum WriteRoute<'a> {
    /// `open` of an existing file with `O_WRONLY`, `O_RDWR`, `O_TRUNC` or `O_APPEND`.
    Open {
        ino: u64,
        path: Option<&'a Path>,
        flags: i32,
    },
    /// `create` (open with `O_CREAT` of a name that did not exist).
    Create {
        path: Option<&'a Path>,
        flags: i32,
        mode: u32,
    },
    /// `truncate`/`chmod`/`chown`/`utimes`: any setattr.
    Setattr {
        ino: u64,
        path: Option<&'a Path>,
        set: &'a SetAttr,
    },
    /// `rename(from, to)` with `RENAME_*` flags (`RENAME_EXCHANGE` moves both).
    Rename {
        from: Option<&'a Path>,
        to: Option<&'a Path>,
        flags: u32,
    },
    Unlink {
        path: Option<&'a Path>,
    },
    Rmdir {
        path: Option<&'a Path>,
    },
    /// A hard link `to` of the existing `from`.
    Link {
        from: Option<&'a Path>,
        to: Option<&'a Path>,
    },
    Symlink {
        path: Option<&'a Path>,
        target: &'a Path,
    },
    Mknod {
        path: Option<&'a Path>,
        mode: u32,
        rdev: u32,
    },
    Mkdir {
        path: Option<&'a Path>,
        mode: u32,
    },
    Setxattr {
        path: Option<&'a Path>,
        name: &'a OsStr,
    },
    Removexattr {
        path: Option<&'a Path>,
        name: &'a OsStr,
    },
}

/// What the `on_open` hook is told about a new handle.
#[derive(Debug, Clone, Copy)]
pub struct OpenInfo<'a> {
    pub ino: u64,
    pub path: Option<&'a Path>,
    pub flags: i32,
    /// The handle came from `create` (the file did not exist before).
    pub created: bool,
    /// The backing file's stamp right after opening.
    pub stamp: Stamp,
}

/// What the flush and release hooks are told about a handle.
#[derive(Debug, Clone, Copy)]
pub struct HandleInfo<'a> {
    pub ino: u64,
    pub path: Option<&'a Path>,
    pub flags: i32,
    /// The value `on_open` returned for this handle.
    pub token: u64,
    /// The stamp at open, or at the previous flush of this handle.
    pub before: Stamp,
    /// The stamp now.
    pub now: Stamp,
}

impl HandleInfo<'_> {
    /// Did the backing file change since `before`?
    pub fn changed(&self) -> bool {
        self.before != self.now
    }

    /// Did its content change since `before` (a write moves the mtime or the size)? A
    /// change of the ctime alone (`futimens` of the atime as `touch -a` does, `fchmod`,
    /// xattrs, another name linked or removed) is not a commit (DESIGN.md §5).
    pub fn content_changed(&self) -> bool {
        self.before.ino != self.now.ino
            || self.before.mtime != self.now.mtime
            || self.before.size != self.now.size
    }
}

/// Does an open with these flags write (a write route of §6)?
pub fn open_writes(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_TRUNC | libc::O_APPEND) != 0
}

/// The enforcement and virtual-node interface of the mount. All methods have no-op
/// defaults.
#[allow(unused_variables)]
pub trait Hooks: Send + Sync + 'static {
    /// Before a write route reaches the backing directory; `Err` refuses it with that
    /// errno. The permit (if any) is handed back to exactly one of `after_write` or, for
    /// an open or create that succeeded, `on_open`.
    fn before_write(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
    ) -> Result<Option<Permit>, FsError> {
        Ok(None)
    }
    /// After a write route was tried (only if `before_write` allowed it), with the
    /// permit it gave. Not called for an open or create that succeeded (`on_open` is).
    fn after_write(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
        permit: Option<Permit>,
        outcome: Result<(), FsError>,
    ) {
    }
    /// At every successful open or create of a backing file (read or write), with the
    /// permit `before_write` gave (None for a read-only open). The value is stored in the
    /// handle and given back at flush and release; 0 means the handle carries no state,
    /// and then it is opened with `FOPEN_NOFLUSH` (no `on_flush` for it). `Err` fails the open (the backing file
    /// is closed again; a created file stays created).
    fn on_open(
        &self,
        caller: &Caller,
        open: &OpenInfo<'_>,
        permit: Option<Permit>,
    ) -> Result<u64, FsError> {
        Ok(0)
    }
    /// At each `close(2)` of a descriptor of the handle (there may be several).
    fn on_flush(&self, caller: &Caller, handle: &HandleInfo<'_>) {}
    /// Must [`Hooks::on_flush`] be called? When false, files are opened with
    /// `FOPEN_NOFLUSH` and the kernel sends no FLUSH at `close` (one or two round trips
    /// less per file written). Anything that implements `on_flush` keeps the default.
    fn wants_flush(&self) -> bool {
        true
    }
    /// When the last reference to the handle goes away (`caller.pid` may be 0).
    fn on_release(&self, caller: &Caller, handle: &HandleInfo<'_>) {}

    /// A computed xattr: `Some` answers the request, `None` passes it to the backing file.
    fn getxattr(
        &self,
        caller: &Caller,
        ino: u64,
        path: Option<&Path>,
        name: &OsStr,
    ) -> Option<FsResult<Vec<u8>>> {
        None
    }
    /// Extra names listed by listxattr (computed xattrs).
    fn listxattr(&self, caller: &Caller, ino: u64, path: Option<&Path>) -> Vec<OsString> {
        Vec::new()
    }

    /// The name at the root served virtually (and hidden from the backing directory).
    fn virtual_root_name(&self) -> Option<OsString> {
        None
    }

    /// Of the names of a file with several (hard links), is `path` one to attribute a
    /// request by inode to? (The volume prefers tracked names.)
    fn prefers_name(&self, path: &Path) -> bool {
        true
    }
    /// Look `name` up under `parent` (the root, for the root name, or a virtual dir).
    /// Each success counts one kernel lookup, given back through `virtual_forget`.
    fn virtual_lookup(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<Attr> {
        Err(FsError(libc::ENOENT))
    }
    fn virtual_forget(&self, ino: u64, nlookup: u64) {}
    fn virtual_getattr(&self, caller: &Caller, ino: u64) -> FsResult<Attr> {
        Err(FsError(libc::ENOENT))
    }
    /// Entries of a virtual directory (without `.` and `..`), each with its inode number.
    fn virtual_readdir(&self, caller: &Caller, ino: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        Err(FsError(libc::ENOENT))
    }
    /// Open a virtual file; the token is given back on read, write and release. Virtual
    /// files are opened with direct I/O (no page cache, sizes need not be exact).
    fn virtual_open(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<u64> {
        Err(FsError(libc::ENOENT))
    }
    fn virtual_read(
        &self,
        caller: &Caller,
        ino: u64,
        token: u64,
        offset: u64,
        size: u32,
    ) -> FsResult<Vec<u8>> {
        Err(FsError(libc::EBADF))
    }
    /// A read that may be answered later, from another thread (a `wait` request on
    /// `ctl` answers when its record changes, without holding a FUSE worker thread):
    /// `done` is called exactly once. The default answers at once with `virtual_read`.
    fn virtual_read_deferred(
        &self,
        caller: &Caller,
        ino: u64,
        token: u64,
        offset: u64,
        size: u32,
        done: ReadDone,
    ) {
        done(self.virtual_read(caller, ino, token, offset, size))
    }
    fn virtual_write(
        &self,
        caller: &Caller,
        ino: u64,
        token: u64,
        offset: u64,
        data: &[u8],
    ) -> FsResult<u32> {
        Err(FsError(libc::EBADF))
    }
    fn virtual_release(&self, ino: u64, token: u64) {}
}

/// The hooks of a plain passthrough volume: nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHooks;

impl Hooks for NoHooks {
    fn wants_flush(&self) -> bool {
        false
    }
}
