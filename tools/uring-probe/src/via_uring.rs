//! The toy tree over FUSE-over-io_uring (FUSE_IO_URING_CMD_REGISTER /
//! COMMIT_AND_FETCH), through the fractal-fuse crate.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use fractal_fuse::abi::FOPEN_PASSTHROUGH;
use fractal_fuse::{
    EIO, ENOENT, FileAttr, FileHandleId, FileType, Filesystem, FsResult, InodeId, MountOptions,
    ReplyAttr, ReplyEntry, ReplyInit, ReplyOpen, Request, Session, SessionShutdownHandle,
    Timestamp,
};

use crate::model::{self, Counters, Kind, Op, Tree};

const TTL: Duration = Duration::ZERO;

struct Fs {
    tree: Tree,
    counters: Arc<Counters>,
    backing: File,
    fuse_fd: Arc<OwnedFd>,
    backing_id: Mutex<Option<i32>>,
}

fn attr(tree: &Tree, ino: u64) -> Option<FileAttr> {
    let (mode, size, nlink) = match tree.kind(ino)? {
        Kind::Dir => (FileType::Directory.to_mode() | 0o755, 0, 2),
        Kind::File => (FileType::RegularFile.to_mode() | 0o644, model::FILE_SIZE, 1),
    };
    let t = Timestamp::new(0, 0);
    Some(FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: t,
        mtime: t,
        ctime: t,
        mode,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
    })
}

impl Filesystem for Fs {
    async fn init(&self, _req: Request) -> FsResult<ReplyInit> {
        // Every ring entry owns a max_write payload buffer; keep them small.
        Ok(ReplyInit {
            max_write: 128 * 1024,
            ..ReplyInit::default()
        })
    }

    async fn lookup(&self, _req: Request, parent: InodeId, name: &OsStr) -> FsResult<ReplyEntry> {
        self.counters.hit(Op::Lookup);
        let a = self
            .tree
            .lookup(parent.0, name.as_bytes())
            .and_then(|i| attr(&self.tree, i))
            .ok_or(ENOENT)?;
        Ok(ReplyEntry {
            ttl: TTL,
            attr: a,
            generation: 0,
        })
    }

    async fn getattr(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: Option<FileHandleId>,
        _flags: u32,
    ) -> FsResult<ReplyAttr> {
        self.counters.hit(Op::Getattr);
        let a = attr(&self.tree, inode.0).ok_or(ENOENT)?;
        Ok(ReplyAttr { ttl: TTL, attr: a })
    }

    async fn open(&self, _req: Request, inode: InodeId, _flags: u32) -> FsResult<ReplyOpen> {
        self.counters.hit(Op::Open);
        if inode.0 != self.tree.passthrough_ino() {
            return Ok(ReplyOpen {
                fh: FileHandleId(0),
                flags: 0,
                backing_id: 0,
            });
        }
        // The backing-id ioctl goes to the /dev/fuse fd, as on the classic transport.
        let mut slot = self.backing_id.lock().unwrap();
        let id = match *slot {
            Some(id) => id,
            None => {
                let id = backing_open(self.fuse_fd.as_raw_fd(), self.backing.as_raw_fd()).map_err(
                    |e| {
                        eprintln!("uring: backing open failed: {e}");
                        EIO
                    },
                )?;
                *slot = Some(id);
                id
            }
        };
        Ok(ReplyOpen {
            fh: FileHandleId(0),
            flags: FOPEN_PASSTHROUGH,
            backing_id: id,
        })
    }

    async fn read(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: FileHandleId,
        offset: u64,
        buf: &mut [u8],
    ) -> FsResult<usize> {
        self.counters.hit(Op::Read);
        let data = model::content(inode.0, offset, buf.len());
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    async fn flush(
        &self,
        _req: Request,
        _inode: InodeId,
        _fh: FileHandleId,
        _lock_owner: u64,
    ) -> FsResult<()> {
        self.counters.hit(Op::Flush);
        Ok(())
    }

    async fn release(
        &self,
        _req: Request,
        _inode: InodeId,
        _fh: FileHandleId,
        _flags: u32,
        _lock_owner: u64,
        _flush: bool,
        _flock_release: bool,
    ) -> FsResult<()> {
        self.counters.hit(Op::Release);
        Ok(())
    }
}

/// `struct fuse_backing_map` of the kernel's uapi.
#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// FUSE_DEV_IOC_BACKING_OPEN is `_IOW(229, 1, struct fuse_backing_map)`.
/// fractal-fuse 0.6.1's `passthrough::fuse_backing_open` encodes it as
/// `_IOWR`, which the kernel rejects with ENOTTY, so the probe issues it itself.
const FUSE_DEV_IOC_BACKING_OPEN: libc::c_ulong =
    (1 << 30) | ((std::mem::size_of::<BackingMap>() as libc::c_ulong) << 16) | (229 << 8) | 1;

fn backing_open(fuse_fd: i32, backing_fd: i32) -> std::io::Result<i32> {
    let map = BackingMap {
        fd: backing_fd,
        flags: 0,
        padding: 0,
    };
    let id = unsafe {
        libc::ioctl(
            fuse_fd,
            FUSE_DEV_IOC_BACKING_OPEN,
            &map as *const BackingMap,
        )
    };
    if id < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(id)
    }
}

pub struct Mounted {
    mnt: PathBuf,
    shutdown: SessionShutdownHandle,
    done: mpsc::Receiver<std::io::Result<()>>,
}

impl Mounted {
    /// Stop the workers (the session unmounts itself when they are gone);
    /// if they do not stop in time, detach the mount so nothing is left behind.
    pub fn unmount(self) -> std::io::Result<()> {
        self.shutdown.shutdown();
        let r = match self.done.recv_timeout(Duration::from_secs(10)) {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::other(
                "fractal-fuse session did not stop within 10 s",
            )),
        };
        // A failed session may leave its mount behind (fusermount3 -u can find it busy).
        if is_mounted(&self.mnt) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.mnt)
                .status();
        }
        r
    }
}

fn is_mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy();
    std::fs::read_to_string("/proc/self/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(&*want)))
        .unwrap_or(false)
}

pub fn mount(
    mnt: &Path,
    files: u64,
    workers: usize,
    queue_depth: u16,
    backing: File,
    counters: Arc<Counters>,
) -> std::io::Result<Mounted> {
    let opts = MountOptions::new()
        .fs_name("uring-probe-uring")
        .passthrough(true);
    let session = Session::new(mnt.to_path_buf(), opts)?
        .with_queue_depth(queue_depth)
        .with_worker_count(workers);
    let fs = Fs {
        tree: Tree { files },
        counters,
        backing,
        fuse_fd: session.fuse_fd(),
        backing_id: Mutex::new(None),
    };
    let shutdown = session.shutdown_handle();
    let (tx, done) = mpsc::channel();
    thread::Builder::new()
        .name("uring-session".into())
        .spawn(move || {
            let _ = tx.send(session.run(fs));
        })?;
    Ok(Mounted {
        mnt: mnt.to_path_buf(),
        shutdown,
        done,
    })
}
