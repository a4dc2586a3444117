//! Conversions between `fuser` types and the plain types of the store, in one place
//! (errnos included).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo, Request, TimeOrNow};

use crate::request_timeout::Started;
use crate::store::{Attr, Caller, FsError, Kind, SetTime, Time};

/// The one place an [`FsError`] becomes a FUSE errno.
pub(super) fn errno(e: FsError) -> Errno {
    Errno::from_i32(e.errno())
}

/// The one place an adapter failure is logged, then answered with its errno: `op` is the
/// FUSE request. Answers a caller meets in normal use (`ENOENT`, `EACCES`, `EEXIST`, ...)
/// at debug level; failures of the volume itself (`EIO`, `ENOMEM`, `EBADF`, `EFAULT`) at
/// warn.
pub(super) fn fail(op: &str, e: FsError) -> Errno {
    match e.errno() {
        libc::EIO | libc::ENOMEM | libc::EBADF | libc::EFAULT => {
            tracing::warn!(
                op,
                errno = e.errno(),
                "request failed: {}",
                std::io::Error::from_raw_os_error(e.errno())
            )
        }
        n => tracing::debug!(op, errno = n, "request refused"),
    }
    errno(e)
}

pub(super) fn caller(req: &Request, started: Started) -> Caller {
    Caller {
        pid: req.pid(),
        uid: req.uid(),
        gid: req.gid(),
        started,
    }
}

pub(super) fn system_time(t: Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

pub(super) fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(st) => SetTime::At(match st.duration_since(UNIX_EPOCH) {
            Ok(d) => Time {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = d.subsec_nanos();
                if nsec > 0 {
                    sec -= 1;
                    nsec = 1_000_000_000 - nsec;
                }
                Time { sec, nsec }
            }
        }),
    }
}

pub(super) fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

pub(super) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.ctime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The attributes of a negative entry: inode 0 tells the kernel "no such name, and
/// remember that for the entry TTL" (a plain ENOENT is not cached at all).
pub(super) fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// Does this process hold CAP_SYS_ADMIN (needed to register passthrough backing files)?
pub(super) fn has_cap_sys_admin() -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 21) != 0) // bit 21: CAP_SYS_ADMIN
}
