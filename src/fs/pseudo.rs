//! A backend of computed nodes beside the backing directory: the `.coherent/` tree
//! (docs/design.md#control-surface), in the manner of a pseudo filesystem.
//!
//! The [`router`](super::router) sends every request on an inode of this backend
//! (numbers with [`VIRTUAL_INO_BIT`](crate::store::VIRTUAL_INO_BIT) set) here, and
//! the lookup of [`PseudoFs::root_name`] at the root. The backend knows nothing of FUSE
//! nor of the backing directory.

use std::ffi::{OsStr, OsString};

use crate::store::{Attr, Caller, DirEntry, FsResult};

/// The answer to a read, given later (see [`PseudoFs::read`]).
pub type ReadDone = Box<dyn FnOnce(FsResult<Vec<u8>>) + Send>;

/// A tree of computed nodes mounted at one name of the root.
pub trait PseudoFs: Send + Sync + 'static {
    /// The name at the root this tree is mounted at (a backing entry of that name is
    /// hidden, and creating, renaming or removing it is refused).
    fn root_name(&self) -> OsString;
    /// Look `name` up under `parent` (the root, for the root name, or a directory of the
    /// tree). Each success counts one kernel lookup, given back through `forget`.
    fn lookup(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<Attr>;
    fn forget(&self, ino: u64, nlookup: u64);
    fn getattr(&self, caller: &Caller, ino: u64) -> FsResult<Attr>;
    /// Entries of a directory (without `.` and `..`), each with its inode number.
    fn readdir(&self, caller: &Caller, ino: u64) -> FsResult<Vec<(u64, DirEntry)>>;
    /// Open a file; the token is given back on read, write and release. Files of the
    /// tree are opened with direct I/O (no page cache, sizes need not be exact).
    fn open(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<u64>;
    /// A read that may be answered later, from another thread (a `wait` request on
    /// `ctl` answers when its record changes, without holding a FUSE worker thread):
    /// `done` is called exactly once.
    fn read(&self, caller: &Caller, token: u64, offset: u64, size: u32, done: ReadDone);
    fn write(&self, caller: &Caller, token: u64, data: &[u8]) -> FsResult<u32>;
    fn release(&self, token: u64);
    /// How file data flows (passthrough or through the daemon, and why), once the kernel
    /// has said what it offers: shown in `status` (`coherent doctor` reads it).
    fn set_data_mode(&self, _mode: &str) {}
}
