//! Counters of the requests that reached the daemon (logged at unmount and on SIGUSR1):
//! the FUSE adapter counts every request by opcode, [`Fs`](super::Fs) the data requests
//! that reached a backing file.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of requests that reached the daemon (logged at unmount and on SIGUSR1):
/// data requests (with passthrough active they stay at 0 for regular files) and every
/// request by opcode, the round trips an operation costs.
#[derive(Debug)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    ops: [AtomicU64; Op::ALL.len()],
}

/// The FUSE requests the daemon answers, for [`Counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Create,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Fallocate,
    Lseek,
    CopyFileRange,
    Ioctl,
    Getlk,
    Setlk,
}

impl Op {
    pub const ALL: [Op; 36] = [
        Op::Lookup,
        Op::Forget,
        Op::Getattr,
        Op::Setattr,
        Op::Readlink,
        Op::Mknod,
        Op::Mkdir,
        Op::Unlink,
        Op::Rmdir,
        Op::Symlink,
        Op::Rename,
        Op::Link,
        Op::Open,
        Op::Create,
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Release,
        Op::Fsync,
        Op::Opendir,
        Op::Readdir,
        Op::Readdirplus,
        Op::Releasedir,
        Op::Fsyncdir,
        Op::Statfs,
        Op::Setxattr,
        Op::Getxattr,
        Op::Listxattr,
        Op::Removexattr,
        Op::Access,
        Op::Fallocate,
        Op::Lseek,
        Op::CopyFileRange,
        Op::Ioctl,
        Op::Getlk,
        Op::Setlk,
    ];

    pub fn name(self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            ops: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Counters {
    pub fn count(&self, op: Op) {
        self.ops[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests served of `op` so far.
    pub fn served(&self, op: Op) -> u64 {
        self.ops[op as usize].load(Ordering::Relaxed)
    }

    /// `name=count` for every opcode served at least once, e.g. `lookup=12 getattr=3`.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = Op::ALL
            .iter()
            .filter(|&&op| self.served(op) > 0)
            .map(|&op| format!("{}={}", op.name(), self.served(op)))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(" ")
        }
    }
}
