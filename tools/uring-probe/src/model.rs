//! The toy tree both transports serve, and the daemon-side request counter.
//!
//! Root (inode 1) holds `f0..f{n-1}` (inodes 2..) with fixed content and one
//! file `pt` whose opens are answered with FUSE passthrough to a real file, so
//! a probe can tell whether passthrough works over a transport: its reads must
//! never reach the daemon.

use std::sync::atomic::{AtomicU64, Ordering};

pub const ROOT: u64 = 1;
pub const FILE_SIZE: u64 = 4096;

/// The requests the workload causes, counted where the daemon answers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Open,
    Read,
    Flush,
    Release,
    Other,
}

pub const OPS: [Op; 7] = [
    Op::Lookup,
    Op::Getattr,
    Op::Open,
    Op::Read,
    Op::Flush,
    Op::Release,
    Op::Other,
];

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Open => "open",
            Op::Read => "read",
            Op::Flush => "flush",
            Op::Release => "release",
            Op::Other => "other",
        }
    }
}

#[derive(Default)]
pub struct Counters([AtomicU64; 7]);

impl Counters {
    pub fn hit(&self, op: Op) {
        self.0[op as usize].fetch_add(1, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> [u64; 7] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

pub struct Tree {
    pub files: u64,
}

impl Tree {
    pub fn passthrough_ino(&self) -> u64 {
        self.files + 2
    }

    /// The inode a name in the root resolves to.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Option<u64> {
        if parent != ROOT {
            return None;
        }
        if name == b"pt" {
            return Some(self.passthrough_ino());
        }
        let i: u64 = std::str::from_utf8(name.strip_prefix(b"f")?)
            .ok()?
            .parse()
            .ok()?;
        (i < self.files).then_some(i + 2)
    }

    pub fn kind(&self, ino: u64) -> Option<Kind> {
        match ino {
            ROOT => Some(Kind::Dir),
            i if i >= 2 && i <= self.passthrough_ino() => Some(Kind::File),
            _ => None,
        }
    }
}

/// The bytes of a served file at an offset (a pattern derived from the inode).
pub fn content(ino: u64, offset: u64, len: usize) -> Vec<u8> {
    let end = FILE_SIZE.min(offset + len as u64);
    (offset..end).map(|o| byte_at(ino, o)).collect()
}

pub fn byte_at(ino: u64, offset: u64) -> u8 {
    (ino.wrapping_mul(31).wrapping_add(offset) % 251) as u8
}
