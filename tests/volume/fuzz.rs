//! The differential fuzzer: the same seeded random sequence of ~50 kinds of file-system
//! operation (opens with every flag that matters, reads and writes through descriptors
//! and mappings, truncates, fallocate, renames, links, modes, owners, times, xattrs,
//! listings, FIFOs, `O_TMPFILE`, a plain user's credentials, the umask) runs on a native
//! directory and through a real mount; every result (return value, errno, bytes) must be
//! the same, and after each sequence the whole tree (names, types, modes, owners, link
//! counts, sizes, contents, symlink targets, xattrs) seen through the mount and in its
//! backing directory must match the native one. Where it may not, tests/data/fuzz-allow.txt
//! says why, entry by entry. A failing sequence is shrunk to a minimal reproducer, which
//! the failure prints.
//!
//! Modes: the default mount (passthrough), `--no-passthrough` (the daemon serves the
//! data), in place (mounted over its backing directory) — each with the fuzzer as an agent
//! session — and an unattributed caller beside a live agent session (`--no-passthrough`).
//! The operations run in a worker process (this binary, `fuzz::worker`), so that it can be
//! an agent (`COHERENT_SESSION` is read from its environment) and may set its own umask.
//!
//! `COHERENT_FUZZ_OPS` operations per mode (default 10,000: a second or two per mode),
//! `COHERENT_FUZZ_SEED` the first seed (one sequence per seed, counting up),
//! `COHERENT_FUZZ_SEQ` operations per sequence (default 150). scripts/fuzz.sh runs it long.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::rng::Rng;
use common::{users, Mount};

/// Descriptor slots a sequence juggles.
const SLOTS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Root,
    /// coh-u1, by this thread's fs uid/gid (which drops the fs capabilities, as a plain
    /// user has none).
    U1,
}

#[derive(Debug, Clone)]
enum Op {
    Open {
        slot: usize,
        p: String,
        flags: i32,
        mode: u32,
    },
    Close {
        slot: usize,
    },
    Dup {
        slot: usize,
        to: usize,
    },
    Read {
        slot: usize,
        len: usize,
    },
    Write {
        slot: usize,
        len: usize,
        byte: u8,
    },
    Pread {
        slot: usize,
        off: i64,
        len: usize,
    },
    Pwrite {
        slot: usize,
        off: i64,
        len: usize,
        byte: u8,
    },
    /// `pwritev2(RWF_APPEND)`.
    PwriteAppend {
        slot: usize,
        len: usize,
        byte: u8,
    },
    Lseek {
        slot: usize,
        off: i64,
        whence: i32,
    },
    Ftruncate {
        slot: usize,
        len: i64,
    },
    Truncate {
        p: String,
        len: i64,
    },
    Fallocate {
        slot: usize,
        mode: i32,
        off: i64,
        len: i64,
    },
    Fsync {
        slot: usize,
        data: bool,
    },
    /// Store through a shared mapping, then `msync`.
    MmapWrite {
        slot: usize,
        off: usize,
        len: usize,
        byte: u8,
    },
    MmapRead {
        slot: usize,
        off: usize,
        len: usize,
    },
    /// `fcntl(F_SETFL)` with `O_APPEND` on or off.
    SetAppend {
        slot: usize,
        on: bool,
    },
    Fstat {
        slot: usize,
    },
    Fchmod {
        slot: usize,
        mode: u32,
    },
    Fchown {
        slot: usize,
        uid: u32,
        gid: u32,
    },
    Futimens {
        slot: usize,
        mtime: i64,
    },
    Fsetxattr {
        slot: usize,
        name: String,
        len: usize,
    },
    Fgetxattr {
        slot: usize,
        name: String,
    },
    CopyRange {
        from: usize,
        to: usize,
        off_in: i64,
        off_out: i64,
        len: usize,
    },
    Stat {
        p: String,
    },
    Lstat {
        p: String,
    },
    /// The mtime: exact when set in the past by `utimensat`, else only "recent".
    Mtime {
        p: String,
    },
    Chmod {
        p: String,
        mode: u32,
    },
    Chown {
        p: String,
        uid: u32,
        gid: u32,
        follow: bool,
    },
    Utimens {
        p: String,
        mtime: i64,
        follow: bool,
    },
    Access {
        p: String,
        mode: i32,
    },
    Readdir {
        p: String,
    },
    ReadFile {
        p: String,
    },
    Rename {
        a: String,
        b: String,
        flags: u32,
    },
    Link {
        a: String,
        b: String,
    },
    Unlink {
        p: String,
    },
    Symlink {
        target: String,
        p: String,
    },
    Readlink {
        p: String,
    },
    Mkdir {
        p: String,
        mode: u32,
    },
    Rmdir {
        p: String,
    },
    Mkfifo {
        p: String,
        mode: u32,
    },
    Setxattr {
        p: String,
        name: String,
        len: usize,
        flags: i32,
    },
    Getxattr {
        p: String,
        name: String,
    },
    Listxattr {
        p: String,
    },
    Removexattr {
        p: String,
        name: String,
    },
    /// An unnamed file in `dir`, written and closed.
    Tmpfile {
        dir: String,
        mode: u32,
    },
    Fsyncdir {
        p: String,
    },
    As {
        who: Who,
    },
    Umask {
        mask: u32,
    },
}

impl Op {
    /// The name the allow-list uses.
    fn kind(&self) -> String {
        match self {
            Op::SetAppend { on: false, .. } => return "SetAppend@off".into(),
            // chown(f, -1, -1): changes no owner, only (maybe) the set-ID bits.
            Op::Chown {
                uid: NONE,
                gid: NONE,
                ..
            } => return "Chown@keep".into(),
            Op::Fchown {
                uid: NONE,
                gid: NONE,
                ..
            } => return "Fchown@keep".into(),
            Op::Lseek {
                whence: libc::SEEK_DATA,
                ..
            } => return "SeekData".into(),
            Op::Lseek {
                whence: libc::SEEK_HOLE,
                ..
            } => return "SeekHole".into(),
            _ => {}
        }
        let s = format!("{self:?}");
        s.split([' ', '{', '(']).next().unwrap_or("").to_string()
    }

    /// Can the operation change the tree (so that a divergence allowed for it may leave
    /// the two trees different)?
    fn mutates(&self) -> bool {
        !matches!(
            self,
            Op::Read { .. }
                | Op::Pread { .. }
                | Op::Lseek { .. }
                | Op::MmapRead { .. }
                | Op::Fstat { .. }
                | Op::Fgetxattr { .. }
                | Op::Stat { .. }
                | Op::Lstat { .. }
                | Op::Mtime { .. }
                | Op::Access { .. }
                | Op::Readdir { .. }
                | Op::ReadFile { .. }
                | Op::Readlink { .. }
                | Op::Getxattr { .. }
                | Op::Listxattr { .. }
                | Op::Tmpfile { .. }
                | Op::Fsyncdir { .. }
                | Op::Fsync { .. }
                | Op::Close { .. }
                | Op::Dup { .. }
                | Op::As { .. }
                | Op::Umask { .. }
        )
    }
}

/// The ids chown picks from.
struct Ids {
    u1: (u32, u32),
    shared: u32,
}

const NONE: u32 = u32::MAX;

fn rel_path(r: &mut Rng, known: &[String]) -> String {
    if !known.is_empty() && r.below(10) < 6 {
        let base = r.pick(known).clone();
        return if r.below(5) == 0 {
            format!("{base}/{}", r.pick(&["a", "b", "c"]))
        } else {
            base
        };
    }
    let depth = *r.pick(&[1, 1, 1, 2, 2, 3]);
    (0..depth)
        .map(|_| *r.pick(&["a", "b", "c", "d", "e"]))
        .collect::<Vec<_>>()
        .join("/")
}

fn gen(r: &mut Rng, known: &[String], ids: &Ids) -> Op {
    let p = rel_path(r, known);
    let slot = r.below(SLOTS);
    let byte = r.below(256) as u8;
    let off = *r.pick(&[0i64, 1, 100, 4095, 4096, 8192, 65536, 200_000]);
    let len = *r.pick(&[0usize, 1, 10, 4096, 5000, 10_000]);
    let mode = *r.pick(&[
        0o644, 0o600, 0o755, 0o700, 0o4755, 0o2755, 0o2745, 0o6755, 0o1777, 0o000, 0o666,
    ]);
    let xname = format!("user.{}", r.pick(&["x", "y", "z"]));
    let (uid, gid) = *r.pick(&[
        (NONE, NONE),
        (NONE, NONE),
        (0, 0),
        (ids.u1.0, NONE),
        (NONE, ids.u1.1),
        (NONE, ids.shared),
        (ids.u1.0, ids.u1.1),
    ]);
    let mtime = 1_000_000_000 + r.below(1000) as i64;
    match r.below(200) {
        0..=21 => {
            let acc = *r.pick(&[libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR, libc::O_RDWR]);
            let mut flags = acc;
            for (f, odds) in [
                (libc::O_CREAT, 2),
                (libc::O_EXCL, 6),
                (libc::O_TRUNC, 5),
                (libc::O_APPEND, 4),
                (libc::O_DIRECTORY, 15),
                (libc::O_NOFOLLOW, 10),
            ] {
                if r.below(odds) == 0 {
                    flags |= f;
                }
            }
            Op::Open {
                slot,
                p,
                flags,
                mode,
            }
        }
        22..=29 => Op::Close { slot },
        30..=31 => Op::Dup {
            slot,
            to: r.below(SLOTS),
        },
        32..=37 => Op::Read {
            slot,
            len: *r.pick(&[1, 10, 4096, 100_000]),
        },
        38..=47 => Op::Write { slot, len, byte },
        48..=52 => Op::Pread {
            slot,
            off,
            len: *r.pick(&[1, 10, 4096, 100_000]),
        },
        53..=62 => Op::Pwrite {
            slot,
            off,
            len,
            byte,
        },
        63..=64 => Op::PwriteAppend { slot, len, byte },
        65..=68 => Op::Lseek {
            slot,
            off,
            whence: *r.pick(&[
                libc::SEEK_SET,
                libc::SEEK_CUR,
                libc::SEEK_END,
                libc::SEEK_DATA,
                libc::SEEK_HOLE,
            ]),
        },
        69..=72 => Op::Ftruncate {
            slot,
            len: *r.pick(&[0, 1, 5000, 100_000]),
        },
        73..=75 => Op::Truncate {
            p,
            len: *r.pick(&[0, 1, 5000, 100_000]),
        },
        76..=79 => Op::Fallocate {
            slot,
            mode: *r.pick(&[
                0,
                libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_ZERO_RANGE,
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_COLLAPSE_RANGE,
                libc::FALLOC_FL_INSERT_RANGE,
            ]),
            off: *r.pick(&[0, 1, 4096, 8192]),
            len: *r.pick(&[1, 4096, 5000, 8192]),
        },
        80..=81 => Op::Fsync {
            slot,
            data: r.below(2) == 0,
        },
        82..=87 => Op::MmapWrite {
            slot,
            off: *r.pick(&[0, 1, 4095, 4096, 5000]),
            len: *r.pick(&[1, 10, 4096]),
            byte,
        },
        88..=89 => Op::MmapRead {
            slot,
            off: *r.pick(&[0, 1, 4096]),
            len: *r.pick(&[1, 10, 8192]),
        },
        90..=92 => Op::SetAppend {
            slot,
            on: r.below(2) == 0,
        },
        93..=95 => Op::Fstat { slot },
        96..=97 => Op::Fchmod { slot, mode },
        98..=99 => Op::Fchown { slot, uid, gid },
        100 => Op::Futimens { slot, mtime },
        101 => Op::Fsetxattr {
            slot,
            name: xname,
            len: r.below(30),
        },
        102 => Op::Fgetxattr { slot, name: xname },
        103..=104 => Op::CopyRange {
            from: slot,
            to: r.below(SLOTS),
            off_in: *r.pick(&[0, 1, 4096]),
            off_out: *r.pick(&[0, 10, 4096, 100_000]),
            len: *r.pick(&[1, 100, 10_000]),
        },
        105..=109 => Op::Stat { p },
        110..=112 => Op::Lstat { p },
        113..=114 => Op::Mtime { p },
        115..=118 => Op::Chmod { p, mode },
        119..=122 => Op::Chown {
            p,
            uid,
            gid,
            follow: r.below(3) != 0,
        },
        123..=124 => Op::Utimens {
            p,
            mtime,
            follow: r.below(3) != 0,
        },
        125..=126 => Op::Access {
            p,
            mode: *r.pick(&[libc::F_OK, libc::R_OK, libc::W_OK, libc::X_OK]),
        },
        127..=130 => Op::Readdir { p },
        131..=134 => Op::ReadFile { p },
        135..=143 => Op::Rename {
            a: p,
            b: rel_path(r, known),
            flags: *r.pick(&[0, 0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE]),
        },
        144..=147 => Op::Link {
            a: p,
            b: rel_path(r, known),
        },
        148..=154 => Op::Unlink { p },
        155..=157 => Op::Symlink {
            target: rel_path(r, known),
            p,
        },
        158..=159 => Op::Readlink { p },
        160..=168 => Op::Mkdir {
            p,
            mode: *r.pick(&[0o755, 0o700, 0o777, 0o2775, 0o1777]),
        },
        169..=172 => Op::Rmdir { p },
        173..=174 => Op::Mkfifo {
            p,
            mode: *r.pick(&[0o644, 0o600, 0o2755]),
        },
        175..=180 => Op::Setxattr {
            p,
            name: xname,
            len: r.below(40),
            flags: *r.pick(&[0, 0, libc::XATTR_CREATE, libc::XATTR_REPLACE]),
        },
        181..=183 => Op::Getxattr { p, name: xname },
        184..=185 => Op::Listxattr { p },
        186..=188 => Op::Removexattr { p, name: xname },
        189 => Op::Tmpfile {
            dir: if r.below(2) == 0 { ".".to_string() } else { p },
            mode: *r.pick(&[0o600, 0o644]),
        },
        190 => Op::Fsyncdir { p },
        191..=194 => Op::As {
            who: *r.pick(&[Who::Root, Who::U1]),
        },
        _ => Op::Umask {
            mask: *r.pick(&[0o022, 0o077, 0o002, 0o000]),
        },
    }
}

/// What an operation answered: its value, or its errno.
type Res = Result<String, i32>;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ck(r: i64) -> Result<i64, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn hash(d: &[u8]) -> String {
    let h = d.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    format!("{}b:{h:x}", d.len())
}

/// One side of the comparison: a directory and the descriptors opened in it.
struct Side {
    root: PathBuf,
    fds: [i32; SLOTS],
}

impl Side {
    fn new(root: PathBuf) -> Side {
        Side {
            root,
            fds: [-1; SLOTS],
        }
    }

    fn c(&self, rel: &str) -> CString {
        CString::new(self.root.join(rel).as_os_str().as_bytes()).unwrap()
    }

    fn fd(&self, slot: usize) -> Result<i32, i32> {
        match self.fds[slot] {
            -1 => Err(libc::EBADF),
            fd => Ok(fd),
        }
    }

    fn close_all(&mut self) {
        for fd in &mut self.fds {
            if *fd >= 0 {
                unsafe { libc::close(*fd) };
                *fd = -1;
            }
        }
    }

    fn set(&mut self, slot: usize, fd: i32) {
        if self.fds[slot] >= 0 {
            unsafe { libc::close(self.fds[slot]) };
        }
        self.fds[slot] = fd;
    }

    fn apply(&mut self, op: &Op, ids: &Ids) -> Res {
        let ok = |r: i64| ck(r).map(|n| n.to_string());
        let unit = |r: i32| ck(r as i64).map(|_| String::new());
        unsafe {
            match op {
                Op::Open {
                    slot,
                    p,
                    flags,
                    mode,
                } => {
                    // O_NONBLOCK: a FIFO must not block the run.
                    let fl = flags | libc::O_CLOEXEC | libc::O_NONBLOCK;
                    let fd = libc::open(self.c(p).as_ptr(), fl, *mode);
                    ck(fd as i64)?;
                    self.set(*slot, fd);
                    Ok(String::new())
                }
                Op::Close { slot } => {
                    let fd = self.fd(*slot)?;
                    self.fds[*slot] = -1;
                    unit(libc::close(fd))
                }
                Op::Dup { slot, to } => {
                    let fd = self.fd(*slot)?;
                    if slot == to {
                        return Ok(String::new());
                    }
                    let d = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
                    ck(d as i64)?;
                    self.set(*to, d);
                    Ok(String::new())
                }
                Op::Read { slot, len } => {
                    let fd = self.fd(*slot)?;
                    let mut b = vec![0u8; *len];
                    let n = ck(libc::read(fd, b.as_mut_ptr().cast(), *len) as i64)?;
                    Ok(hash(&b[..n as usize]))
                }
                Op::Write { slot, len, byte } => {
                    let fd = self.fd(*slot)?;
                    let b = vec![*byte; *len];
                    ok(libc::write(fd, b.as_ptr().cast(), *len) as i64)
                }
                Op::Pread { slot, off, len } => {
                    let fd = self.fd(*slot)?;
                    let mut b = vec![0u8; *len];
                    let n = ck(libc::pread(fd, b.as_mut_ptr().cast(), *len, *off) as i64)?;
                    Ok(hash(&b[..n as usize]))
                }
                Op::Pwrite {
                    slot,
                    off,
                    len,
                    byte,
                } => {
                    let fd = self.fd(*slot)?;
                    let b = vec![*byte; *len];
                    ok(libc::pwrite(fd, b.as_ptr().cast(), *len, *off) as i64)
                }
                Op::PwriteAppend { slot, len, byte } => {
                    let fd = self.fd(*slot)?;
                    let b = vec![*byte; *len];
                    let iov = libc::iovec {
                        iov_base: b.as_ptr() as *mut _,
                        iov_len: *len,
                    };
                    ok(libc::pwritev2(fd, &iov, 1, -1, libc::RWF_APPEND) as i64)
                }
                Op::Lseek { slot, off, whence } => {
                    let fd = self.fd(*slot)?;
                    ok(libc::lseek(fd, *off, *whence))
                }
                Op::Ftruncate { slot, len } => unit(libc::ftruncate(self.fd(*slot)?, *len)),
                Op::Truncate { p, len } => unit(libc::truncate(self.c(p).as_ptr(), *len)),
                Op::Fallocate {
                    slot,
                    mode,
                    off,
                    len,
                } => unit(libc::fallocate(self.fd(*slot)?, *mode, *off, *len)),
                Op::Fsync { slot, data } => {
                    let fd = self.fd(*slot)?;
                    unit(if *data {
                        libc::fdatasync(fd)
                    } else {
                        libc::fsync(fd)
                    })
                }
                Op::MmapWrite {
                    slot,
                    off,
                    len,
                    byte,
                } => self.mapped(*slot, *off, *len, Some(*byte)),
                Op::MmapRead { slot, off, len } => self.mapped(*slot, *off, *len, None),
                Op::SetAppend { slot, on } => {
                    let fd = self.fd(*slot)?;
                    let fl = ck(libc::fcntl(fd, libc::F_GETFL) as i64)? as i32;
                    let fl = if *on {
                        fl | libc::O_APPEND
                    } else {
                        fl & !libc::O_APPEND
                    };
                    unit(libc::fcntl(fd, libc::F_SETFL, fl))
                }
                Op::Fstat { slot } => {
                    let mut st: libc::stat = std::mem::zeroed();
                    ck(libc::fstat(self.fd(*slot)?, &mut st) as i64)?;
                    Ok(stat_text(&st))
                }
                Op::Fchmod { slot, mode } => unit(libc::fchmod(self.fd(*slot)?, *mode)),
                Op::Fchown { slot, uid, gid } => unit(libc::fchown(self.fd(*slot)?, *uid, *gid)),
                Op::Futimens { slot, mtime } => {
                    let t = times(*mtime);
                    unit(libc::futimens(self.fd(*slot)?, t.as_ptr()))
                }
                Op::Fsetxattr { slot, name, len } => {
                    let n = CString::new(name.as_str()).unwrap();
                    let v = vec![b'f'; *len];
                    let fd = self.fd(*slot)?;
                    unit(libc::fsetxattr(fd, n.as_ptr(), v.as_ptr().cast(), *len, 0))
                }
                Op::Fgetxattr { slot, name } => {
                    let n = CString::new(name.as_str()).unwrap();
                    let mut v = vec![0u8; 256];
                    let fd = self.fd(*slot)?;
                    let r = libc::fgetxattr(fd, n.as_ptr(), v.as_mut_ptr().cast(), v.len());
                    let r = ck(r as i64)?;
                    Ok(hash(&v[..r as usize]))
                }
                Op::CopyRange {
                    from,
                    to,
                    off_in,
                    off_out,
                    len,
                } => {
                    let (a, b) = (self.fd(*from)?, self.fd(*to)?);
                    let (mut oi, mut oo) = (*off_in, *off_out);
                    ok(libc::copy_file_range(a, &mut oi, b, &mut oo, *len, 0) as i64)
                }
                Op::Stat { p } | Op::Lstat { p } => {
                    let mut st: libc::stat = std::mem::zeroed();
                    let r = if matches!(op, Op::Stat { .. }) {
                        libc::stat(self.c(p).as_ptr(), &mut st)
                    } else {
                        libc::lstat(self.c(p).as_ptr(), &mut st)
                    };
                    ck(r as i64)?;
                    Ok(stat_text(&st))
                }
                Op::Mtime { p } => {
                    let mut st: libc::stat = std::mem::zeroed();
                    ck(libc::lstat(self.c(p).as_ptr(), &mut st) as i64)?;
                    Ok(if st.st_mtime < 1_500_000_000 {
                        format!("{}.{}", st.st_mtime, st.st_mtime_nsec)
                    } else {
                        "recent".into()
                    })
                }
                Op::Chmod { p, mode } => unit(libc::chmod(self.c(p).as_ptr(), *mode)),
                Op::Chown {
                    p,
                    uid,
                    gid,
                    follow,
                } => unit(if *follow {
                    libc::chown(self.c(p).as_ptr(), *uid, *gid)
                } else {
                    libc::lchown(self.c(p).as_ptr(), *uid, *gid)
                }),
                Op::Utimens { p, mtime, follow } => {
                    let t = times(*mtime);
                    let fl = if *follow {
                        0
                    } else {
                        libc::AT_SYMLINK_NOFOLLOW
                    };
                    let c = self.c(p);
                    unit(libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), fl))
                }
                Op::Access { p, mode } => unit(libc::access(self.c(p).as_ptr(), *mode)),
                Op::Readdir { p } => {
                    let rd = std::fs::read_dir(self.root.join(p))
                        .map_err(|e| e.raw_os_error().unwrap_or(0))?;
                    let mut names = Vec::new();
                    for e in rd {
                        let e = e.map_err(|e| e.raw_os_error().unwrap_or(0))?;
                        let ft = e.file_type().map_err(|e| e.raw_os_error().unwrap_or(0))?;
                        names.push(format!("{}:{}", e.file_name().to_string_lossy(), kind(&ft)));
                    }
                    names.sort();
                    Ok(names.join(","))
                }
                Op::ReadFile { p } => {
                    let fd = libc::open(
                        self.c(p).as_ptr(),
                        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK,
                    );
                    ck(fd as i64)?;
                    let mut out = Vec::new();
                    let mut b = vec![0u8; 65536];
                    let r = loop {
                        let n = libc::read(fd, b.as_mut_ptr().cast(), b.len());
                        if n < 0 {
                            break Err(errno());
                        }
                        if n == 0 {
                            break Ok(hash(&out));
                        }
                        out.extend_from_slice(&b[..n as usize]);
                    };
                    libc::close(fd);
                    r
                }
                Op::Rename { a, b, flags } => unit(libc::renameat2(
                    libc::AT_FDCWD,
                    self.c(a).as_ptr(),
                    libc::AT_FDCWD,
                    self.c(b).as_ptr(),
                    *flags,
                )),
                Op::Link { a, b } => unit(libc::link(self.c(a).as_ptr(), self.c(b).as_ptr())),
                Op::Unlink { p } => unit(libc::unlink(self.c(p).as_ptr())),
                Op::Symlink { target, p } => {
                    let t = CString::new(target.as_str()).unwrap();
                    unit(libc::symlink(t.as_ptr(), self.c(p).as_ptr()))
                }
                Op::Readlink { p } => {
                    let mut b = vec![0u8; 4096];
                    let c = self.c(p);
                    let n = ck(libc::readlink(c.as_ptr(), b.as_mut_ptr().cast(), b.len()) as i64)?;
                    Ok(String::from_utf8_lossy(&b[..n as usize]).into_owned())
                }
                Op::Mkdir { p, mode } => unit(libc::mkdir(self.c(p).as_ptr(), *mode)),
                Op::Rmdir { p } => unit(libc::rmdir(self.c(p).as_ptr())),
                Op::Mkfifo { p, mode } => unit(libc::mkfifo(self.c(p).as_ptr(), *mode)),
                Op::Setxattr {
                    p,
                    name,
                    len,
                    flags,
                } => {
                    let n = CString::new(name.as_str()).unwrap();
                    let v = vec![b'v'; *len];
                    let c = self.c(p);
                    unit(libc::setxattr(
                        c.as_ptr(),
                        n.as_ptr(),
                        v.as_ptr().cast(),
                        *len,
                        *flags,
                    ))
                }
                Op::Getxattr { p, name } => {
                    let n = CString::new(name.as_str()).unwrap();
                    let mut v = vec![0u8; 256];
                    let c = self.c(p);
                    let r = libc::getxattr(c.as_ptr(), n.as_ptr(), v.as_mut_ptr().cast(), v.len());
                    let r = ck(r as i64)?;
                    Ok(hash(&v[..r as usize]))
                }
                Op::Listxattr { p } => {
                    let mut v = vec![0u8; 4096];
                    let c = self.c(p);
                    let n = ck(libc::listxattr(c.as_ptr(), v.as_mut_ptr().cast(), v.len()) as i64)?;
                    Ok(user_names(&v[..n as usize]).join(","))
                }
                Op::Removexattr { p, name } => {
                    let n = CString::new(name.as_str()).unwrap();
                    unit(libc::removexattr(self.c(p).as_ptr(), n.as_ptr()))
                }
                Op::Tmpfile { dir, mode } => {
                    let fl = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC;
                    let fd = libc::open(self.c(dir).as_ptr(), fl, *mode);
                    ck(fd as i64)?;
                    let n = libc::write(fd, b"tmp".as_ptr().cast(), 3);
                    let e = errno();
                    libc::close(fd);
                    if n < 0 {
                        Err(e)
                    } else {
                        Ok(n.to_string())
                    }
                }
                Op::Fsyncdir { p } => {
                    let fl = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
                    let fd = libc::open(self.c(p).as_ptr(), fl);
                    ck(fd as i64)?;
                    let r = libc::fsync(fd);
                    let e = errno();
                    libc::close(fd);
                    if r < 0 {
                        Err(e)
                    } else {
                        Ok(String::new())
                    }
                }
                // Credentials and the umask are the process's, set once for both sides.
                Op::As { .. } | Op::Umask { .. } => {
                    let _ = ids;
                    Ok(String::new())
                }
            }
        }
    }

    /// `@dir` or `@fifo` when the op works on a descriptor (of this side) of one: the
    /// allow-list may name an op on those alone.
    fn slot_type(&self, op: &Op) -> &'static str {
        let slot = match op {
            Op::Read { slot, .. }
            | Op::Write { slot, .. }
            | Op::Pread { slot, .. }
            | Op::Pwrite { slot, .. }
            | Op::PwriteAppend { slot, .. }
            | Op::Lseek { slot, .. }
            | Op::Ftruncate { slot, .. }
            | Op::Fallocate { slot, .. }
            | Op::Fsync { slot, .. }
            | Op::MmapWrite { slot, .. }
            | Op::MmapRead { slot, .. }
            | Op::Fstat { slot }
            | Op::Fchmod { slot, .. }
            | Op::Fchown { slot, .. }
            | Op::Futimens { slot, .. }
            | Op::Fsetxattr { slot, .. }
            | Op::Fgetxattr { slot, .. } => *slot,
            Op::Mtime { p } | Op::Lstat { p } => {
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                if unsafe { libc::lstat(self.c(p).as_ptr(), &mut st) } < 0 {
                    return "";
                }
                return match st.st_mode & libc::S_IFMT {
                    libc::S_IFIFO => "@fifo",
                    _ => "",
                };
            }
            _ => return "",
        };
        let Ok(fd) = self.fd(slot) else { return "" };
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } < 0 {
            return "";
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => "@dir",
            libc::S_IFIFO => "@fifo",
            _ => "",
        }
    }

    /// A shared mapping of [off, off+len) clipped to the file (a page past the end would be
    /// SIGBUS); with `byte`, a store there and an `msync`.
    fn mapped(&self, slot: usize, off: usize, len: usize, byte: Option<u8>) -> Res {
        let fd = self.fd(slot)?;
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            ck(libc::fstat(fd, &mut st) as i64)?;
            let size = st.st_size as usize;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG || off >= size {
                return Ok("past the end".into());
            }
            let end = (off + len).min(size);
            let prot = match byte {
                Some(_) => libc::PROT_READ | libc::PROT_WRITE,
                None => libc::PROT_READ,
            };
            let m = libc::mmap(std::ptr::null_mut(), end, prot, libc::MAP_SHARED, fd, 0);
            if m == libc::MAP_FAILED {
                return Err(errno());
            }
            let s = std::slice::from_raw_parts_mut(m as *mut u8, end);
            let r = match byte {
                Some(b) => {
                    s[off..end].fill(b);
                    if libc::msync(m, end, libc::MS_SYNC) < 0 {
                        Err(errno())
                    } else {
                        Ok((end - off).to_string())
                    }
                }
                None => Ok(hash(&s[off..end])),
            };
            libc::munmap(m, end);
            r
        }
    }
}

fn times(mtime: i64) -> [libc::timespec; 2] {
    let at = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_OMIT,
    };
    [
        at,
        libc::timespec {
            tv_sec: mtime,
            tv_nsec: 0,
        },
    ]
}

fn stat_text(st: &libc::stat) -> String {
    let size = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        0 // a directory's size is its filesystem's business
    } else {
        st.st_size
    };
    format!(
        "mode={:o} uid={} gid={} nlink={} size={size}",
        st.st_mode, st.st_uid, st.st_gid, st.st_nlink
    )
}

fn kind(ft: &std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "d"
    } else if ft.is_symlink() {
        "l"
    } else if ft.is_fifo() {
        "p"
    } else {
        "f"
    }
}

/// The `user.*` names of a listxattr buffer (not `user.coherent.*`, which the coherence
/// layer computes), sorted.
fn user_names(buf: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = buf
        .split(|&b| b == 0)
        .filter(|s| s.starts_with(b"user.") && !s.starts_with(b"user.coherent."))
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    v.sort();
    v
}

/// Everything under `root` that must match.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(root.join(&rel)) else {
            out.insert(rel, "unreadable".into());
            continue;
        };
        for e in rd {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let p = root.join(&r);
            let md = std::fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let mut desc = format!(
                "{} mode={:o} uid={} gid={} nlink={}",
                kind(&ft),
                md.mode(),
                md.uid(),
                md.gid(),
                md.nlink()
            );
            if ft.is_symlink() {
                desc += &format!(" -> {}", std::fs::read_link(&p).unwrap().display());
            } else if ft.is_file() {
                let data = std::fs::read(&p).unwrap();
                desc += &format!(" size={} {}", md.len(), hash(&data));
            } else if ft.is_dir() {
                stack.push(r.clone());
            }
            if !ft.is_symlink() {
                desc += &format!(" xattrs={:?}", xattrs(&p));
            }
            out.insert(r, desc);
        }
    }
    out
}

fn xattrs(p: &Path) -> Vec<(String, String)> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return vec![];
    }
    user_names(&buf[..n as usize])
        .into_iter()
        .map(|name| {
            let cn = CString::new(name.as_str()).unwrap();
            let mut v = vec![0u8; 4096];
            let n =
                unsafe { libc::getxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
            v.truncate(n.max(0) as usize);
            (name, hash(&v))
        })
        .collect()
}

/// One entry of the allow-list: a divergence of `op` where native answered `native` and
/// the mount `mount` (`ok`: any value; `*`: anything; else an errno name), in `modes`.
#[derive(Debug)]
struct Allow {
    op: String,
    native: String,
    mount: String,
    modes: Vec<String>,
    reason: String,
}

const ALLOW: &str = include_str!("../data/fuzz-allow.txt");

fn allow_list() -> Vec<Allow> {
    ALLOW
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.splitn(5, char::is_whitespace).collect();
            assert!(
                f.len() == 5 && !f[4].trim().is_empty(),
                "fuzz-allow.txt: `{l}`: want `OP NATIVE MOUNT MODES REASON`"
            );
            Allow {
                op: f[0].into(),
                native: f[1].into(),
                mount: f[2].into(),
                modes: f[3].split(',').map(String::from).collect(),
                reason: f[4].trim().into(),
            }
        })
        .collect()
}

fn errno_name(e: i32) -> &'static str {
    match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EBADF => "EBADF",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EXDEV => "EXDEV",
        libc::ENXIO => "ENXIO",
        libc::EAGAIN => "EAGAIN",
        libc::ENODEV => "ENODEV",
        libc::ESPIPE => "ESPIPE",
        libc::EFBIG => "EFBIG",
        libc::ERANGE => "ERANGE",
        libc::ETXTBSY => "ETXTBSY",
        libc::EBUSY => "EBUSY",
        libc::ENOSYS => "ENOSYS",
        libc::EIO => "EIO",
        libc::ENOSPC => "ENOSPC",
        _ => "E?",
    }
}

fn matches(pat: &str, r: &Res) -> bool {
    match (pat, r) {
        ("*", _) => true,
        ("ok", Ok(_)) => true,
        (name, Err(e)) => errno_name(*e) == name,
        _ => false,
    }
}

fn allowed<'a>(
    list: &'a [Allow],
    mode: &str,
    kind: &str,
    want: &Res,
    got: &Res,
) -> Option<&'a Allow> {
    let plain = kind.split('@').next().unwrap_or(kind);
    list.iter().find(|a| {
        (a.op == kind || a.op == plain)
            && (a.modes.iter().any(|m| m == "*" || m == mode))
            && matches(&a.native, want)
            && matches(&a.mount, got)
    })
}

fn show(r: &Res) -> String {
    match r {
        Ok(v) => format!("Ok({v:?})"),
        Err(e) => format!("Err({})", errno_name(*e)),
    }
}

/// Credentials and umask of this process for an op that sets them.
fn become_who(who: Who, ids: &Ids) {
    let (uid, gid) = match who {
        Who::Root => (0, 0),
        Who::U1 => ids.u1,
    };
    // fsgid first: once the fs uid is not root, the fs gid may not be changed freely.
    unsafe {
        libc::setfsuid(0);
        libc::setfsgid(gid);
        libc::setfsuid(uid);
    }
}

/// What a run of `ops` found: the first divergence not on the allow-list (with the op's
/// index, or None for the trees), and how many divergences the list allowed.
struct Outcome {
    bad: Option<(Option<usize>, String)>,
    /// The last op's kind and both results, when they differed.
    last: Option<(String, Res, Res)>,
    allowed: Vec<String>,
    cut: bool,
}

/// The environment of one run: where the native and mounted trees go.
struct Env {
    mode: String,
    native_base: PathBuf,
    mount_base: PathBuf,
    backing_base: Option<PathBuf>,
    ids: Ids,
    allow: Vec<Allow>,
    runs: std::cell::Cell<u64>,
}

impl Env {
    /// Run `ops` on fresh directories of each side.
    fn run(&self, ops: &[Op]) -> Outcome {
        let n = self.runs.get();
        self.runs.set(n + 1);
        let sub = format!("r{n}");
        let native = self.native_base.join(&sub);
        let mounted = self.mount_base.join(&sub);
        for d in [&native, &mounted] {
            std::fs::create_dir(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let (mut a, mut b) = (Side::new(native.clone()), Side::new(mounted.clone()));
        become_who(Who::Root, &self.ids);
        unsafe { libc::umask(0o022) };
        let mut out = Outcome {
            bad: None,
            last: None,
            allowed: Vec::new(),
            cut: false,
        };
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::As { who } => become_who(*who, &self.ids),
                Op::Umask { mask } => unsafe {
                    libc::umask(*mask);
                },
                _ => {}
            }
            let kind = format!("{}{}", op.kind(), a.slot_type(op));
            let want = a.apply(op, &self.ids);
            let got = b.apply(op, &self.ids);
            if let (Op::SetAppend { .. }, Ok(_), Some(al)) = (op, &want, self.closing(&kind)) {
                // What the descriptor does from here is known to differ: it goes, and its
                // duplicates (which share its flags) with it.
                out.allowed.push(format!("{kind} (closed): {}", al.reason));
                a.close_all();
                b.close_all();
                continue;
            }
            if want == got {
                continue;
            }
            out.last = Some((kind.clone(), want.clone(), got.clone()));
            match allowed(&self.allow, &self.mode, &kind, &want, &got) {
                Some(al) => {
                    out.allowed.push(format!(
                        "{kind} (e.g. {} / {}): {}",
                        show(&want),
                        show(&got),
                        al.reason
                    ));
                    // A slot one side opened and the other did not: close it on both.
                    for s in 0..SLOTS {
                        if (a.fds[s] < 0) != (b.fds[s] < 0) {
                            a.set(s, -1);
                            b.set(s, -1);
                        }
                    }
                    if op.mutates() {
                        out.cut = true;
                        break;
                    }
                }
                None => {
                    out.bad = Some((
                        Some(i),
                        format!("op {i} {op:?}: native {} mount {}", show(&want), show(&got)),
                    ));
                    break;
                }
            }
        }
        become_who(Who::Root, &self.ids);
        a.close_all();
        b.close_all();
        if out.bad.is_none() && !out.cut {
            let want = snapshot(&native);
            let views = [
                Some(mounted.clone()),
                self.backing_base.as_ref().map(|b| b.join(&sub)),
            ];
            for (view, root) in ["mount", "backing"].iter().zip(views.iter().flatten()) {
                let got = snapshot(root);
                if got != want {
                    out.bad = Some((
                        None,
                        format!("trees differ ({view}):\n{}", tree_diff(&want, &got)),
                    ));
                    break;
                }
            }
        }
        let _ = std::fs::remove_dir_all(&native);
        let _ = std::fs::remove_dir_all(&mounted);
        out
    }

    /// The entry (`MOUNT` = `close`) that says what a descriptor does after `kind` in
    /// this mode is known to differ from native.
    fn closing(&self, kind: &str) -> Option<&Allow> {
        self.allow.iter().find(|a| {
            a.mount == "close"
                && a.op == kind
                && a.modes.iter().any(|m| m == "*" || *m == self.mode)
        })
    }

    /// The shortest sublist of `ops` (greedy chunk removal) that still fails.
    fn shrink(&self, mut ops: Vec<Op>) -> Vec<Op> {
        let fails = |o: &[Op]| self.run(o).bad.is_some();
        let mut chunk = ops.len().div_ceil(2).max(1);
        let mut tries = 0;
        loop {
            let mut i = 0;
            let mut removed = false;
            while i < ops.len() && tries < 3000 {
                let mut cand = ops.clone();
                cand.drain(i..(i + chunk).min(ops.len()));
                tries += 1;
                if fails(&cand) {
                    ops = cand;
                    removed = true;
                } else {
                    i += chunk;
                }
            }
            if chunk == 1 && !removed || tries >= 3000 {
                return ops;
            }
            if !removed {
                chunk = chunk.div_ceil(2);
            }
        }
    }
}

fn tree_diff(a: &BTreeMap<PathBuf, String>, b: &BTreeMap<PathBuf, String>) -> String {
    let mut out = String::new();
    for k in a
        .keys()
        .chain(b.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (x, y) = (a.get(k), b.get(k));
        if x != y {
            out += &format!(
                "  {}: native {x:?}\n  {}: mount  {y:?}\n",
                k.display(),
                k.display()
            );
        }
    }
    out
}

fn env_num(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|s| s.parse().ok())
}

/// The worker: runs in its own process (see the module's doc), started by [`fuzz`].
#[test]
#[ignore = "run by the fuzz_* tests in a process of its own"]
fn worker() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset: run by fuzz_*"));
    let total = env_num("COHERENT_FUZZ_OPS").unwrap_or(10_000);
    let per_seq = env_num("COHERENT_FUZZ_SEQ").unwrap_or(150).max(1);
    let first = env_num("COHERENT_FUZZ_SEED");
    let mode = var("FUZZ_MODE");
    let native = tempfile::tempdir().unwrap();
    std::fs::set_permissions(native.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let u1 = users::u1();
    let env = Env {
        mode: mode.clone(),
        native_base: native.path().to_path_buf(),
        mount_base: PathBuf::from(var("FUZZ_MNT")),
        backing_base: std::env::var("FUZZ_BACKING").ok().map(PathBuf::from),
        ids: Ids {
            u1: (u1.uid, u1.gid),
            shared: users::shared_gid(),
        },
        allow: allow_list(),
        runs: Default::default(),
    };
    if mode == "passthrough_hp" {
        // The list is what is checked there.
        let mut env = env;
        return reproduce(&mut env, &allow_list());
    }
    let salt: u64 = mode
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))
        << 32;
    let seqs = total.div_ceil(per_seq);
    let (mut ops_run, mut allowed, mut cut) =
        (0u64, BTreeMap::<String, (u64, String)>::new(), 0u64);
    for s in 0..seqs {
        let seed = first.map_or(0x5eed_0000 + s + salt, |f| f + s);
        let mut rng = Rng(seed);
        let mut known: Vec<String> = Vec::new();
        let mut ops = Vec::new();
        for _ in 0..per_seq {
            let op = gen(&mut rng, &known, &env.ids);
            match &op {
                Op::Open { p, flags, .. } if flags & libc::O_CREAT != 0 => known.push(p.clone()),
                Op::Mkdir { p, .. } | Op::Symlink { p, .. } | Op::Mkfifo { p, .. } => {
                    known.push(p.clone())
                }
                Op::Rename { b, .. } | Op::Link { b, .. } => known.push(b.clone()),
                _ => {}
            }
            ops.push(op);
        }
        let out = env.run(&ops);
        ops_run += per_seq;
        cut += out.cut as u64;
        // Counted by op and entry; the first values seen kept as the example.
        for a in &out.allowed {
            let key = match (a.split_once(" (e.g. "), a.split_once("): ")) {
                (Some((kind, _)), Some((_, reason))) => format!("{kind}: {reason}"),
                _ => a.clone(),
            };
            let e = allowed.entry(key).or_insert((0, a.clone()));
            e.0 += 1;
        }
        if let Some((at, what)) = out.bad {
            let upto = at.map_or(ops.len(), |i| i + 1);
            let small = env.shrink(ops[..upto].to_vec());
            let again = env.run(&small).bad.map(|b| b.1).unwrap_or_default();
            panic!(
                "fuzz ({mode}): divergence in the sequence of seed {seed} \
                 (replay: COHERENT_FUZZ_SEED={seed} COHERENT_FUZZ_OPS={per_seq}):\n{what}\n\
                 shrunk to {} of {upto} operations:\n{}\n-> {again}",
                small.len(),
                small
                    .iter()
                    .enumerate()
                    .map(|(i, o)| format!("  {i}: {o:?}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    println!("fuzz ({mode}): {ops_run} operations in {seqs} sequences, {cut} cut short by an allowed divergence");
    for (_, (n, example)) in allowed {
        println!("  allowed {n}x: {example}");
    }
}

/// The allow-list's entries that claim a limit FUSE itself has, each with a sequence
/// that shows it. On a plain passthrough FUSE filesystem (libfuse's passthrough_hp) each
/// must diverge from native at its last operation, as its entry says.
fn reproducers() -> Vec<(&'static str, Vec<Op>)> {
    let f = |slot| Op::Open {
        slot,
        p: "f".into(),
        flags: libc::O_RDWR | libc::O_CREAT,
        mode: 0o644,
    };
    let d = |slot| Op::Open {
        slot,
        p: "d".into(),
        flags: libc::O_RDONLY | libc::O_DIRECTORY,
        mode: 0,
    };
    let mkdir = || Op::Mkdir {
        p: "d".into(),
        mode: 0o755,
    };
    let data = Op::Pwrite {
        slot: 0,
        off: 0,
        len: 16384,
        byte: b'a',
    };
    let fallocate = |mode| Op::Fallocate {
        slot: 0,
        mode,
        off: 4096,
        len: 4096,
    };
    let seek = |whence| Op::Lseek {
        slot: 0,
        off: 4096,
        whence,
    };
    // A hole before data: SEEK_DATA answers the data's block natively; through a plain
    // passthrough FUSE filesystem it may answer a hole as data (passthrough_hp 3.14 has no
    // lseek: the kernel answers the offset asked for).
    let hole = vec![
        f(0),
        Op::Ftruncate {
            slot: 0,
            len: 13192,
        },
        Op::Pwrite {
            slot: 0,
            off: 12000,
            len: 1,
            byte: b'a',
        },
        Op::Lseek {
            slot: 0,
            off: 4095,
            whence: libc::SEEK_DATA,
        },
    ];
    let fifo = vec![
        Op::Mkfifo {
            p: "p".into(),
            mode: 0o644,
        },
        Op::Open {
            slot: 0,
            p: "p".into(),
            flags: libc::O_RDWR,
            mode: 0,
        },
        Op::Utimens {
            p: "p".into(),
            mtime: 1_000_000_000,
            follow: true,
        },
        Op::Write {
            slot: 0,
            len: 10,
            byte: b'a',
        },
        Op::Mtime { p: "p".into() },
    ];
    vec![
        ("Mtime@fifo", fifo),
        ("SeekData", hole),
        (
            "Fallocate",
            vec![
                f(0),
                data.clone(),
                fallocate(libc::FALLOC_FL_COLLAPSE_RANGE),
            ],
        ),
        (
            "Fallocate",
            vec![f(0), data, fallocate(libc::FALLOC_FL_INSERT_RANGE)],
        ),
        ("Lseek@dir", vec![mkdir(), d(0), seek(libc::SEEK_END)]),
        (
            "Read@dir",
            vec![
                mkdir(),
                d(0),
                seek(libc::SEEK_HOLE),
                Op::Read { slot: 0, len: 100 },
            ],
        ),
    ]
}

/// The worker's part of [`shared_limits_on_passthrough_hp`]: each reproducer diverges at
/// its last operation, and the entry it stands for allows that divergence.
fn reproduce(env: &mut Env, list: &[Allow]) {
    for (entry, ops) in reproducers() {
        // Every divergence counts but those of the other entries (a read of a directory
        // diverges after its seek did).
        env.allow = allow_list();
        env.allow.retain(|a| a.op != entry);
        let claimed = list.iter().find(|a| a.op == entry);
        let claimed = claimed.unwrap_or_else(|| panic!("no allow-list entry {entry}"));
        assert!(claimed.reason.contains("passthrough_hp"), "{claimed:?}");
        let out = env.run(&ops);
        let last = ops.len() - 1;
        match (out.bad, out.last) {
            (Some((Some(i), what)), Some((kind, want, got)))
                if i == last
                    && allowed(list, "passthrough_hp", &kind, &want, &got)
                        .is_some_and(|a| a.op == entry) =>
            {
                println!("reproduced {entry}: {what}")
            }
            (bad, _) => panic!("{entry}: {ops:?} on passthrough_hp: {bad:?}"),
        }
    }
}

/// Run the worker as `session` (None: unattributed) against the tree `top` (with its
/// backing directory, if it has one of its own); its output.
fn worker_on(mode: &str, top: &Path, backing: Option<PathBuf>, session: Option<&str>) -> String {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "fuzz::worker",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("FUZZ_MODE", mode)
    .env("FUZZ_MNT", top)
    .env_remove("COHERENT_SESSION");
    if let Some(b) = backing {
        c.env("FUZZ_BACKING", b);
    }
    if let Some(s) = session {
        c.env("COHERENT_SESSION", s);
    }
    let o = common::run_timeout(&mut c, Duration::from_secs(6 * 3600));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.contains("1 passed"),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr),
    );
    out
}

/// libfuse's passthrough_hp (no cache: as with the daemon, every write reaches it), the
/// plain passthrough FUSE filesystem the allow-list's shared limits are reproduced on. Its
/// path comes in `COHERENT_CREF` (scripts/fuzz.sh builds it with scripts/cref.sh).
#[test]
#[ignore = "needs libfuse's passthrough_hp in COHERENT_CREF: scripts/fuzz.sh builds it"]
fn shared_limits_on_passthrough_hp() {
    let bin = std::env::var("COHERENT_CREF")
        .expect("COHERENT_CREF: the path of passthrough_hp (scripts/cref.sh prints it)");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let mut cmd = Command::new(bin);
    cmd.args(["--nocache", "--foreground"]).arg(&src).arg(&mnt);
    let d = common::hosts::Daemon::spawn(cmd, &mnt, &dir.path().join("log"));
    let top = mnt.join("fuzz");
    std::fs::create_dir(&top).unwrap();
    std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = worker_on("passthrough_hp", &top, None, None);
    let found: Vec<&str> = out.lines().filter(|l| l.contains("reproduced ")).collect();
    assert_eq!(found.len(), reproducers().len(), "{out}\n{}", d.log());
    eprintln!("{}", found.join("\n"));
}

/// Run the worker as `session` (None: unattributed) against `m`.
fn fuzz(mode: &str, m: &Mount, session: Option<&str>) {
    // coh-u1 must reach the trees: the mount's temporary parent is root's and private.
    let base = m.mnt.parent().unwrap();
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let top = m.path("fuzz");
    std::fs::create_dir(&top).unwrap();
    std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o755)).unwrap();
    let backing = (m.backing != m.mnt).then(|| m.backing_path("fuzz"));
    let out = worker_on(mode, &top, backing, session);
    let report: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("fuzz (") || l.starts_with("  allowed"))
        .collect();
    eprintln!("{}", report.join("\n"));
}

/// The fuzzer holds the data path and the attribute rules to native, so its mounts run
/// with `--stale off`: root and coh-u1 are two sessions, and the stale guard refusing one's
/// overwrite of the other's newer version is the volume's rule, not a divergence
/// (tests/nomount/inproc_decisions.rs and tests/mounted/enforce_stale.rs own it).
fn fuzz_mount() -> common::Builder {
    Mount::builder().args(["--stale", "off"])
}

#[test]
fn fuzz_passthrough() {
    fuzz("passthrough", &fuzz_mount().start(), Some("fuzz"));
}

#[test]
fn fuzz_daemon() {
    fuzz(
        "daemon",
        &fuzz_mount().passthrough(false).start(),
        Some("fuzz"),
    );
}

#[test]
fn fuzz_in_place() {
    fuzz("in-place", &fuzz_mount().in_place().start(), Some("fuzz"));
}

/// An unattributed caller while an agent session writes files of its own beside it.
#[test]
fn fuzz_unattributed_beside_an_agent() {
    /// The agent's shell, killed however the test ends.
    struct Agent(std::process::Child);
    impl Drop for Agent {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let m = fuzz_mount().passthrough(false).start();
    let _agent = Agent(
        Command::new("sh")
            .args([
                "-c",
                "mkdir -p agent; i=0; while :; do i=$((i+1)); echo $i > agent/f$((i % 8)); \
             sleep 0.02; done",
            ])
            .current_dir(&m.mnt)
            .env("COHERENT_SESSION", "beside")
            .spawn()
            .unwrap(),
    );
    assert!(common::wait_until(Duration::from_secs(10), || m
        .path("agent/f1")
        .exists()));
    fuzz("unattributed", &m, None);
    let names = crate::coherent::session_names(&m);
    assert!(
        names.iter().any(|n| n == "beside"),
        "no agent session beside: {names:?}"
    );
}
