//! Record locks (`fcntl` F_SETLK/F_SETLKW/F_GETLK, classic and open-file-description
//! locks alike) carried out on the backing file, so a lock taken through the mount
//! conflicts with one taken by a process on the backing directory, through another mount
//! of it, or on another host sharing it (docs/locks.md).
//!
//! The kernel names a lock's owner by an opaque id: a process's file table for classic
//! locks, the open file for OFD locks. Each owner gets an open file description of its own
//! on the backing file and its locks are taken there as OFD locks. So two owners conflict
//! exactly as they would on a local filesystem, an owner's locks merge and split as the
//! kernel's do, and a lock of any process elsewhere on the backing file conflicts with
//! them. The daemon's own process holds no classic lock, which would merge across owners.
//!
//! An owner's locks end when the kernel says its process closed a descriptor of the file
//! (FLUSH carries the owner), and in any case when the last open file it locked through is
//! released: the description is closed then, and the backing kernel drops its locks.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use parking_lot::Mutex;

use super::router::Node;
use super::Fs;
use crate::store::{FsError, FsResult, Handle};

/// The kernel's `OFFSET_MAX`: a lock that runs to the end of the file, whatever its size.
const TO_EOF: u64 = i64::MAX as u64;

/// One lock as FUSE states it: bytes `start..=end`, `typ` one of F_RDLCK, F_WRLCK,
/// F_UNLCK, and the holder's pid (answers of `getlk` only; 0 when the holder is an open
/// file description or a process the caller cannot see).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockSpan {
    pub start: u64,
    pub end: u64,
    pub typ: i32,
    pub pid: u32,
}

impl LockSpan {
    fn to_flock(self) -> FsResult<libc::flock> {
        if self.end < self.start || self.start > TO_EOF {
            return Err(FsError(libc::EINVAL));
        }
        let len = if self.end >= TO_EOF {
            0
        } else {
            (self.end - self.start + 1) as i64
        };
        // SAFETY: `flock` is plain data; all zero is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = self.typ as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = self.start as i64;
        fl.l_len = len;
        // OFD locks require l_pid 0.
        fl.l_pid = 0;
        Ok(fl)
    }

    fn from_flock(fl: &libc::flock) -> LockSpan {
        let start = fl.l_start.max(0) as u64;
        let end = if fl.l_len == 0 {
            TO_EOF
        } else {
            start.saturating_add(fl.l_len as u64 - 1).min(TO_EOF)
        };
        LockSpan {
            start,
            end,
            typ: fl.l_type as i32,
            // An OFD lock's holder has no pid (-1).
            pid: fl.l_pid.max(0) as u32,
        }
    }
}

/// The open file description of one lock owner on one file.
struct Owner {
    fd: Arc<OwnedFd>,
    /// The open files (FUSE handles) the owner locked through; it goes with the last.
    fhs: Vec<u64>,
}

/// The lock owners of the mount: (inode, owner id) to the owner's description.
#[derive(Default)]
pub struct Locks {
    owners: Mutex<HashMap<(u64, u64), Owner>>,
    /// Inodes a lock was ever asked for on through this mount. An open of one asks for a
    /// FLUSH at every close (see [`Locks::wants_flush`]).
    locked: Mutex<HashSet<u64>>,
}

/// Where a blocking lock's answer goes (from another thread, once the wait ends).
pub type LockDone = Box<dyn FnOnce(FsResult<()>) + Send>;

impl Locks {
    /// F_GETLK: the first lock that would conflict with `want`, or `want` with F_UNLCK.
    pub fn get(&self, h: &Handle, fh: u64, owner: u64, want: LockSpan) -> FsResult<LockSpan> {
        let fd = self.owner_fd(h, fh, owner)?;
        let mut fl = want.to_flock()?;
        ofd_fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl)?;
        if fl.l_type as i32 == libc::F_UNLCK {
            return Ok(LockSpan {
                typ: libc::F_UNLCK,
                pid: 0,
                ..want
            });
        }
        Ok(LockSpan::from_flock(&fl))
    }

    /// F_SETLK (`wait` false) or F_SETLKW. A lock that must wait is waited for on a thread
    /// of its own, so the daemon's request threads stay free for the unlock that ends the
    /// wait; `done` gets the answer then.
    pub fn set(
        self: &Arc<Self>,
        h: &Handle,
        fh: u64,
        owner: u64,
        span: LockSpan,
        wait: bool,
        done: LockDone,
    ) {
        let fd = match self.owner_fd(h, fh, owner) {
            Ok(fd) => fd,
            Err(e) => return done(Err(e)),
        };
        if span.typ != libc::F_UNLCK {
            self.locked.lock().insert(h.ino);
        }
        let mut fl = match span.to_flock() {
            Ok(fl) => fl,
            Err(e) => return done(Err(e)),
        };
        match ofd_fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) {
            Err(FsError(e)) if wait && (e == libc::EAGAIN || e == libc::EACCES) => {}
            r => return done(r),
        }
        let (locks, ino) = (self.clone(), h.ino);
        let spawned = std::thread::Builder::new()
            .name("lock-wait".into())
            .spawn(move || {
                let r = ofd_fcntl(fd.as_raw_fd(), libc::F_OFD_SETLKW, &mut fl);
                // The owner's files may all have been released while it waited (its
                // process died): the lock must not outlive them.
                if r.is_ok() && !locks.is_current(ino, owner, &fd) {
                    fl.l_type = libc::F_UNLCK as libc::c_short;
                    let _ = ofd_fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut fl);
                    return done(Err(FsError(libc::EINTR)));
                }
                done(r)
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start a thread to wait for a lock: {e}");
        }
    }

    /// Should an open of `ino` ask the kernel for a FLUSH at each close, though nothing
    /// else needs one (a read-only open)? A process's classic locks end at its close of
    /// any descriptor of the file, and FLUSH is the kernel's only word of that close: a
    /// file once locked through the mount gets it (a FLUSH at every read-only close of
    /// every file would cost a read-heavy tool 13-28 %, docs/locks.md).
    pub fn wants_flush(&self, ino: u64) -> bool {
        self.locked.lock().contains(&ino)
    }

    /// FLUSH: a process closed a descriptor of the file; its classic locks on it end.
    pub fn unlock_owner(&self, ino: u64, owner: u64) {
        let fd = match self.owners.lock().get(&(ino, owner)) {
            Some(o) => o.fd.clone(),
            None => return,
        };
        let mut fl = LockSpan {
            start: 0,
            end: TO_EOF,
            typ: libc::F_UNLCK,
            pid: 0,
        }
        .to_flock()
        .expect("a whole-file span is valid");
        if let Err(FsError(e)) = ofd_fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) {
            tracing::warn!("unlocking inode {ino} at close failed: errno {e}");
        }
    }

    /// RELEASE of open file `fh`: owners that locked through no other open file go, and
    /// closing their descriptions drops their locks.
    pub fn release(&self, fh: u64) {
        let mut gone = Vec::new();
        {
            let mut owners = self.owners.lock();
            if owners.is_empty() {
                return;
            }
            owners.retain(|_, o| {
                o.fhs.retain(|&f| f != fh);
                if o.fhs.is_empty() {
                    gone.push(o.fd.clone());
                    false
                } else {
                    true
                }
            });
        }
        // Closed outside the table's lock (a close may take a while on a network
        // filesystem); a wait still running keeps its own reference.
        drop(gone);
    }

    /// Owners that hold a description now (for `status` and tests of cleanup).
    pub fn owners(&self) -> usize {
        self.owners.lock().len()
    }

    fn is_current(&self, ino: u64, owner: u64, fd: &Arc<OwnedFd>) -> bool {
        self.owners
            .lock()
            .get(&(ino, owner))
            .is_some_and(|o| Arc::ptr_eq(&o.fd, fd))
    }

    /// The owner's description of the file of `h`, opened on first use.
    fn owner_fd(&self, h: &Handle, fh: u64, owner: u64) -> FsResult<Arc<OwnedFd>> {
        let mut owners = self.owners.lock();
        if let Some(o) = owners.get_mut(&(h.ino, owner)) {
            if !o.fhs.contains(&fh) {
                o.fhs.push(fh);
            }
            return Ok(o.fd.clone());
        }
        let fd = Arc::new(reopen(&h.file)?);
        owners.insert(
            (h.ino, owner),
            Owner {
                fd: fd.clone(),
                fhs: vec![fh],
            },
        );
        Ok(fd)
    }
}

/// A new open file description of the file `f` is open on. Read-write when the daemon may
/// (a write lock needs a writable description, a read lock a readable one, and one owner
/// may take both), else with the access mode of `f`, which the kernel checked the lock
/// against already.
fn reopen(f: &File) -> FsResult<OwnedFd> {
    let path = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).expect("no NUL");
    let open = |mode: i32| {
        // SAFETY: `path` is a valid C string; the descriptor returned is owned here.
        let fd = unsafe { libc::open(path.as_ptr(), mode | libc::O_CLOEXEC | libc::O_NOCTTY) };
        if fd < 0 {
            Err(FsError::last())
        } else {
            // SAFETY: `fd` was just opened and nothing else owns it.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }
    };
    open(libc::O_RDWR).or_else(|_| {
        // SAFETY: F_GETFL only reads the descriptor's flags.
        let fl = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
        if fl < 0 {
            return Err(FsError::last());
        }
        open(fl & libc::O_ACCMODE)
    })
}

fn ofd_fcntl(fd: RawFd, cmd: i32, fl: &mut libc::flock) -> FsResult<()> {
    loop {
        // SAFETY: `fl` is a valid, exclusively borrowed `struct flock`.
        if unsafe { libc::fcntl(fd, cmd, fl as *mut libc::flock) } == 0 {
            return Ok(());
        }
        let e = FsError::last();
        if e.0 != libc::EINTR {
            return Err(e);
        }
    }
}

impl Fs {
    /// The open backing file a lock request of `fh` on `ino` acts on. Files of the
    /// `.coherent/` tree take no locks (ENOLCK), nor does anything but an open file of
    /// `ino` (the kernel keeps directories' locks itself).
    /// Is `ino` a backing file's node (whose open files may carry record locks)?
    pub fn is_backing(&self, ino: u64) -> bool {
        matches!(self.router.node(ino), Node::Backing(_))
    }

    pub fn lock_target(&self, ino: u64, fh: u64) -> FsResult<Arc<Handle>> {
        match self.router.node(ino) {
            Node::Pseudo(_) => Err(FsError(libc::ENOLCK)),
            Node::Backing(ino) => match self.store.handle(fh) {
                Ok(h) if h.ino == ino => Ok(h),
                _ => Err(FsError(libc::ENOLCK)),
            },
        }
    }

    /// Whether `ino` is a SQLite WAL index (`*-shm`). Opened through the daemon (not
    /// passthrough), its shared mapping would live in this mount's page cache, which no
    /// other mount, host or process on the backing directory sees: WAL's readers and
    /// writers would disagree and acknowledged commits be lost. The FUSE glue opens it so
    /// that the mapping fails (ENODEV: SQLite says "disk I/O error") instead.
    pub fn is_wal_index(&self, ino: u64) -> bool {
        self.store
            .path_of(ino)
            .and_then(|p| {
                p.file_name()
                    .map(|n| n.as_encoded_bytes().ends_with(b"-shm"))
            })
            .unwrap_or(false)
    }
}
