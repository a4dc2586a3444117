//! Plain types of the filesystem layer: the errno error, callers, attributes, stamps.

use std::ffi::OsString;
use std::io;

use crate::request_timeout::Started;

/// The one error type of the filesystem layer: an errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsError(pub i32);

impl FsError {
    pub fn errno(self) -> i32 {
        self.0
    }
    pub fn last() -> Self {
        FsError::from(io::Error::last_os_error())
    }
}

impl From<io::Error> for FsError {
    fn from(e: io::Error) -> Self {
        FsError(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<nix::errno::Errno> for FsError {
    fn from(e: nix::errno::Errno) -> Self {
        FsError(e as i32)
    }
}

impl std::fmt::Display for FsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for FsError {}

pub type FsResult<T> = Result<T, FsError>;

/// Who made a request: the calling thread's id (FUSE reports the thread, not the
/// process: map it to its process through `/proc/PID/status` `Tgid:` when needed; 0 when
/// the kernel sends no caller, e.g. on some releases) and its fs uid/gid; and when the
/// request began, which bounds what it may wait for. One per request: a `Caller` kept for
/// a later request would cut that one's waits short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub started: Started,
}

/// A file's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl Kind {
    pub fn from_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => Kind::File,
        }
    }
    pub(super) fn from_dtype(t: u8) -> Option<Kind> {
        Some(match t {
            libc::DT_DIR => Kind::Dir,
            libc::DT_LNK => Kind::Symlink,
            libc::DT_FIFO => Kind::Fifo,
            libc::DT_SOCK => Kind::Socket,
            libc::DT_CHR => Kind::CharDev,
            libc::DT_BLK => Kind::BlockDev,
            libc::DT_REG => Kind::File,
            _ => return None,
        })
    }
}

/// A timestamp as (seconds, nanoseconds) since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

/// File attributes as the mount reports them (`ino`: the node's number, see `inos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    /// Permission bits, including setuid/setgid/sticky.
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    pub(super) fn from_stat(ino: u64, st: &libc::stat) -> Attr {
        Attr {
            ino,
            kind: Kind::from_mode(st.st_mode),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: Time {
                sec: st.st_atime,
                nsec: st.st_atime_nsec as u32,
            },
            mtime: Time {
                sec: st.st_mtime,
                nsec: st.st_mtime_nsec as u32,
            },
            ctime: Time {
                sec: st.st_ctime,
                nsec: st.st_ctime_nsec as u32,
            },
            rdev: st.st_rdev as u32,
            // The backing file's, as tools size buffers (and xattrs) from it.
            blksize: st.st_blksize as u32,
        }
    }
}

/// The change stamp of a backing file (docs/design.md#versions): a handle committed a change when
/// the stamp at flush/release differs from the one at open (or the last flush).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    pub ino: u64,
    pub ctime: Time,
    pub mtime: Time,
    pub size: u64,
}

impl Stamp {
    pub(crate) fn from_stat(st: &libc::stat) -> Stamp {
        Stamp {
            ino: st.st_ino,
            ctime: Time {
                sec: st.st_ctime,
                nsec: st.st_ctime_nsec as u32,
            },
            mtime: Time {
                sec: st.st_mtime,
                nsec: st.st_mtime_nsec as u32,
            },
            size: st.st_size as u64,
        }
    }
}

/// A time to set with setattr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Time),
}

/// The changes of one setattr (None = leave as is, i.e. `UTIME_OMIT` for times).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: OsString,
    pub kind: Kind,
    /// The number a plain readdir shows (`d_ino`): the entry's `st_ino` (a mount point's
    /// is the covered directory's, as natively).
    pub d_ino: u64,
}

/// Filesystem statistics.
#[derive(Debug, Clone, Copy)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// The answer to a getxattr/listxattr: the data, or (for size 0) only its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}
