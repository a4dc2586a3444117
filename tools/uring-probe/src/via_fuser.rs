//! The toy tree over fuser 0.18's blocking /dev/fuse transport (what the project uses).

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    BackingId, Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEmpty,
    ReplyEntry, ReplyOpen, Request,
};

use crate::model::{self, Counters, Kind, Op, Tree};

const TTL: Duration = Duration::ZERO;

struct Fs {
    tree: Tree,
    counters: Arc<Counters>,
    backing: File,
    backing_id: Mutex<Option<BackingId>>,
}

fn attr(tree: &Tree, ino: u64) -> Option<FileAttr> {
    let (kind, perm, size) = match tree.kind(ino)? {
        Kind::Dir => (FileType::Directory, 0o755, 0),
        Kind::File => (FileType::RegularFile, 0o644, model::FILE_SIZE),
    };
    Some(FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    })
}

impl fuser::Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok() {
            let _ = config.set_max_stack_depth(1);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.counters.hit(Op::Lookup);
        match self
            .tree
            .lookup(parent.0, name.as_bytes())
            .and_then(|i| attr(&self.tree, i))
        {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.counters.hit(Op::Getattr);
        match attr(&self.tree, ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.counters.hit(Op::Open);
        if ino.0 != self.tree.passthrough_ino() {
            return reply.opened(FileHandle(0), FopenFlags::empty());
        }
        // One backing id for the file, registered at its first open and reused.
        let mut slot = self.backing_id.lock().unwrap();
        if slot.is_none() {
            match reply.open_backing(&self.backing) {
                Ok(id) => *slot = Some(id),
                Err(e) => {
                    eprintln!("fuser: backing open failed: {e}");
                    return reply.error(Errno::EIO);
                }
            }
        }
        reply.opened_passthrough(FileHandle(0), FopenFlags::empty(), slot.as_ref().unwrap());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.counters.hit(Op::Read);
        reply.data(&model::content(ino.0, offset, size as usize));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.counters.hit(Op::Flush);
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.counters.hit(Op::Release);
        reply.ok();
    }
}

pub struct Mounted(fuser::BackgroundSession);

impl Mounted {
    pub fn unmount(self) -> std::io::Result<()> {
        self.0.umount_and_join()
    }
}

pub fn mount(
    mnt: &Path,
    files: u64,
    threads: usize,
    backing: File,
    counters: Arc<Counters>,
) -> std::io::Result<Mounted> {
    let fs = Fs {
        tree: Tree { files },
        counters,
        backing,
        backing_id: Mutex::new(None),
    };
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("uring-probe-fuser".into())];
    config.n_threads = Some(threads);
    config.clone_fd = true;
    let session = fuser::Session::new(fs, mnt, &config)?;
    Ok(Mounted(session.spawn()?))
}
