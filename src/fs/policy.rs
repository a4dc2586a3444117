//! The policy of the filesystem: the points where the coherence layer plugs in.
//!
//! [`Fs`](super::Fs) calls these around every write route of
//! [docs/design.md#write-routes](../../docs/design.md#write-routes), at every open, flush
//! and release of a backing file, and for xattr reads. The default implementations do
//! nothing: every write is allowed, no handle keeps state and no xattr is computed. The
//! `.coherent/` tree is not a policy but a backend of its own ([`super::PseudoFs`]).
//!
//! Paths are workspace-relative (`""` is the root) and `None` only when the kernel refers
//! to a node whose name the store no longer knows (it was removed behind our back).

use std::ffi::{OsStr, OsString};
use std::path::Path;

pub use crate::coherence::Permit;
use crate::store::{Caller, FsError, FsResult, HandleState, SetAttr, Stamp};

/// A write route (docs/design.md#write-routes), with the path(s) involved.
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
    /// The state `on_open` returned for this handle.
    pub state: Option<&'a HandleState>,
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
    /// xattrs, another name linked or removed) is not a commit (docs/design.md#handoff).
    pub fn content_changed(&self) -> bool {
        self.before.ino != self.now.ino
            || self.before.mtime != self.now.mtime
            || self.before.size != self.now.size
    }
}

/// Does an open with these flags write (a write route)?
pub fn open_writes(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_TRUNC | libc::O_APPEND) != 0
}

/// The write, open, flush, release and xattr policy of the filesystem. All methods have
/// no-op defaults.
#[allow(unused_variables)]
pub trait Policy: Send + Sync + 'static {
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
    /// permit `before_write` gave (None for a read-only open). The state is kept in the
    /// file's handle and given back at flush and release; a handle with none is opened
    /// with `FOPEN_NOFLUSH` (no `on_flush` for it). `Err` fails the open (the backing file
    /// is closed again; a created file stays created).
    fn on_open(
        &self,
        caller: &Caller,
        open: &OpenInfo<'_>,
        permit: Option<Permit>,
    ) -> Result<Option<HandleState>, FsError> {
        Ok(None)
    }
    /// Must the handle `on_open` kept `state` for be opened with `FOPEN_DIRECT_IO`? The
    /// kernel then refuses a shared `mmap` of it (`ENODEV`), so no dirty page of it can be
    /// written back later through another handle of the file.
    fn direct_io(&self, state: &HandleState) -> bool {
        false
    }
    /// Has [`Policy::on_flush`] anything to do for the handle `on_open` kept `state` for?
    /// When false it is opened with `FOPEN_NOFLUSH`, as a handle with no state is.
    fn flushes(&self, state: &HandleState) -> bool {
        true
    }
    /// At each `close(2)` of a descriptor of the handle (there may be several).
    fn on_flush(&self, caller: &Caller, handle: &HandleInfo<'_>) {}
    /// Must [`Policy::on_flush`] be called? When false, files are opened with
    /// `FOPEN_NOFLUSH` and the kernel sends no FLUSH at `close` (one or two round trips
    /// less per file written). Anything that implements `on_flush` keeps the default.
    fn wants_flush(&self) -> bool {
        true
    }
    /// Must every write through an open handle reach [`Policy::before_handle_write`]?
    /// When true, no open goes through FUSE passthrough (the kernel would write the
    /// backing file without asking the daemon).
    fn sees_every_write(&self) -> bool {
        false
    }
    /// Before data or a size change reaches the backing file through an open handle
    /// (`write`, `fallocate`, `copy_file_range` into it, a truncate naming it), with the
    /// state `on_open` returned and the path its file has now (renamed since the open, it
    /// is not the one opened); `Err` refuses it with that errno. Called only when
    /// [`Policy::sees_every_write`].
    fn before_handle_write(
        &self,
        state: Option<&HandleState>,
        path: Option<&Path>,
    ) -> Result<(), FsError> {
        Ok(())
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

    /// Of the names of a file with several (hard links), is `path` one to attribute a
    /// request by inode to? (The volume prefers tracked names.)
    fn prefers_name(&self, path: &Path) -> bool {
        true
    }
}

/// The policy of a plain passthrough volume: nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPolicy;

impl Policy for NoPolicy {
    fn wants_flush(&self) -> bool {
        false
    }
}
