//! Differential test (in the style of mountpoint-s3's reftests): the same seeded random
//! sequence of operations is applied to a plain directory and, through the mount, to
//! another; every operation must give the same result (errno included), and after each
//! sequence both trees must match (names, types, sizes, modes, link counts, contents,
//! symlink targets, xattrs). The same runs against the filesystem type [`Fs`] itself, with
//! no mount: the test then resolves paths (and follows symlinks) as the kernel would. It
//! does so twice: with the no-op policy, and with the real volume policy (the in-process
//! harness, tests/common/inproc.rs) and an agent session as the caller, so nothing the
//! policy does around a route changes what the route does.
//!
//! `COHERENT_REFTEST_OPS` sets the number of operations per data mode (default 2000),
//! `COHERENT_REFTEST_SEED` replays one seed (printed on failure).

use crate::common;

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use coherent::fs::{Entry, Fs, FsOptions, NoPolicy};
use coherent::request_timeout::Started;
use coherent::store::{Caller, FsError, FsResult, Kind, SetAttr, Store, ROOT_INO};
use common::inproc::{Agent, InProc};
use common::rng::Rng;
use common::Mount;

#[derive(Debug, Clone)]
enum Op {
    Create {
        p: String,
        excl: bool,
        mode: u32,
    },
    Write {
        p: String,
        off: u64,
        len: usize,
        byte: u8,
        append: bool,
    },
    Truncate {
        p: String,
        len: u64,
    },
    Read {
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
    Mkdir {
        p: String,
        mode: u32,
    },
    Rmdir {
        p: String,
    },
    Symlink {
        target: String,
        p: String,
    },
    Chmod {
        p: String,
        mode: u32,
    },
    Setxattr {
        p: String,
        name: String,
        value: Vec<u8>,
        flags: i32,
    },
    Removexattr {
        p: String,
        name: String,
    },
}

/// A path: mostly one that was created earlier in the sequence, otherwise a
/// fresh one (shallow ones more often, so that parents exist).
fn rel_path(r: &mut Rng, known: &[String]) -> String {
    if !known.is_empty() && r.below(10) < 7 {
        let base = r.pick(known).clone();
        return if r.below(4) == 0 {
            format!("{base}/{}", r.pick(&["a", "b", "c", "d"]))
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

fn gen(r: &mut Rng, known: &[String]) -> Op {
    let p = rel_path(r, known);
    match r.below(100) {
        0..=14 => Op::Create {
            p,
            excl: r.below(3) == 0,
            mode: *r.pick(&[0o644, 0o600, 0o755, 0o640]),
        },
        15..=34 => Op::Write {
            p,
            off: *r.pick(&[0, 1, 100, 4095, 4096, 65536, 200_000]),
            len: *r.pick(&[0, 1, 10, 4096, 10_000]),
            byte: r.below(256) as u8,
            append: r.below(4) == 0,
        },
        35..=41 => Op::Truncate {
            p,
            len: *r.pick(&[0, 1, 5000, 100_000]),
        },
        42..=49 => Op::Read { p },
        50..=59 => Op::Rename {
            a: p,
            b: rel_path(r, known),
            flags: *r.pick(&[0, 0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE]),
        },
        60..=64 => Op::Link {
            a: p,
            b: rel_path(r, known),
        },
        65..=72 => Op::Unlink { p },
        73..=82 => Op::Mkdir {
            p,
            mode: *r.pick(&[0o755, 0o700, 0o775]),
        },
        83..=87 => Op::Rmdir { p },
        88..=90 => Op::Symlink {
            target: rel_path(r, known),
            p,
        },
        91..=94 => Op::Chmod {
            p,
            mode: *r.pick(&[0o644, 0o600, 0o755, 0o4755, 0o1777, 0o700]),
        },
        95..=98 => Op::Setxattr {
            p,
            name: format!("user.{}", r.pick(&["x", "y", "z"])),
            value: vec![b'v'; r.below(40)],
            flags: *r.pick(&[0, 0, libc::XATTR_CREATE, libc::XATTR_REPLACE]),
        },
        _ => Op::Removexattr {
            p,
            name: format!("user.{}", r.pick(&["x", "y"])),
        },
    }
}

fn cpath(root: &Path, rel: &str) -> CString {
    CString::new(root.join(rel).as_os_str().as_bytes()).unwrap()
}

fn check(r: libc::c_int) -> Result<(), i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(())
    }
}

/// Apply `op` under `root`; the result is what must match (errno, or data read).
fn apply(root: &Path, op: &Op) -> Result<Vec<u8>, i32> {
    unsafe {
        match op {
            Op::Create { p, excl, mode } => {
                let fl = libc::O_CREAT | libc::O_WRONLY | if *excl { libc::O_EXCL } else { 0 };
                let fd = libc::open(cpath(root, p).as_ptr(), fl | libc::O_CLOEXEC, *mode);
                check(fd)?;
                check(libc::close(fd)).map(|_| vec![])
            }
            Op::Write {
                p,
                off,
                len,
                byte,
                append,
            } => {
                let fl = libc::O_WRONLY | if *append { libc::O_APPEND } else { 0 };
                let fd = libc::open(cpath(root, p).as_ptr(), fl | libc::O_CLOEXEC);
                check(fd)?;
                let buf = vec![*byte; *len];
                let n = if *append {
                    libc::write(fd, buf.as_ptr().cast(), buf.len())
                } else {
                    libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), *off as i64)
                };
                let e = check(n as i32);
                libc::close(fd);
                e.map(|_| (n as u64).to_le_bytes().to_vec())
            }
            Op::Truncate { p, len } => {
                check(libc::truncate(cpath(root, p).as_ptr(), *len as i64)).map(|_| vec![])
            }
            Op::Read { p } => fs::read(root.join(p)).map_err(|e| e.raw_os_error().unwrap()),
            Op::Rename { a, b, flags } => check(libc::renameat2(
                libc::AT_FDCWD,
                cpath(root, a).as_ptr(),
                libc::AT_FDCWD,
                cpath(root, b).as_ptr(),
                *flags,
            ))
            .map(|_| vec![]),
            Op::Link { a, b } => {
                check(libc::link(cpath(root, a).as_ptr(), cpath(root, b).as_ptr())).map(|_| vec![])
            }
            Op::Unlink { p } => check(libc::unlink(cpath(root, p).as_ptr())).map(|_| vec![]),
            Op::Mkdir { p, mode } => {
                check(libc::mkdir(cpath(root, p).as_ptr(), *mode)).map(|_| vec![])
            }
            Op::Rmdir { p } => check(libc::rmdir(cpath(root, p).as_ptr())).map(|_| vec![]),
            Op::Symlink { target, p } => {
                let t = CString::new(target.as_str()).unwrap();
                check(libc::symlink(t.as_ptr(), cpath(root, p).as_ptr())).map(|_| vec![])
            }
            Op::Chmod { p, mode } => {
                check(libc::chmod(cpath(root, p).as_ptr(), *mode)).map(|_| vec![])
            }
            Op::Setxattr {
                p,
                name,
                value,
                flags,
            } => {
                let n = CString::new(name.as_str()).unwrap();
                check(libc::setxattr(
                    cpath(root, p).as_ptr(),
                    n.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    *flags,
                ))
                .map(|_| vec![])
            }
            Op::Removexattr { p, name } => {
                let n = CString::new(name.as_str()).unwrap();
                check(libc::removexattr(cpath(root, p).as_ptr(), n.as_ptr())).map(|_| vec![])
            }
        }
    }
}

/// Symlinks followed in one path resolution before `ELOOP` (the kernel's limit).
const MAX_LINKS: u32 = 40;

/// [`apply`] through [`Fs`] with no mount: the path walk the kernel would do (lookups from
/// `top`, symlinks followed), then the requests it would send. Every lookup is given back
/// at the end, as the kernel's forgets would. Creates get this process's umask, as the
/// kernel would hand it (the reference tree is made natively under it).
struct Direct<'a> {
    fs: &'a Fs,
    top: u64,
    /// Who sends the requests (each request gets its own start: [`Direct::caller`]).
    who: Caller,
    looked: std::cell::RefCell<Vec<u64>>,
}

impl Direct<'_> {
    /// The caller of a request beginning now.
    fn caller(&self) -> Caller {
        Caller {
            started: Started::now(),
            ..self.who
        }
    }

    fn lookup(&self, dir: u64, name: &OsStr) -> Result<(u64, Kind), i32> {
        let e = self
            .fs
            .lookup(&self.caller(), dir, name)
            .map_err(FsError::errno)?;
        let a = e.attr.ok_or(libc::ENOENT)?;
        self.looked.borrow_mut().push(a.ino);
        Ok((a.ino, a.kind))
    }

    /// The directory holding the last name of `p` (from `dir`), and that name.
    fn parent<'p>(&self, dir: u64, p: &'p str, links: &mut u32) -> Result<(u64, &'p str), i32> {
        let (head, last) = p.rsplit_once('/').unwrap_or(("", p));
        let mut at = dir;
        for part in head.split('/').filter(|x| !x.is_empty()) {
            at = self.follow(at, part, links)?;
            if self
                .fs
                .getattr(&self.caller(), at)
                .map_err(FsError::errno)?
                .attr
                .kind
                != Kind::Dir
            {
                return Err(libc::ENOTDIR);
            }
        }
        Ok((at, last))
    }

    /// `name` in `dir`, following symlinks.
    fn follow(&self, dir: u64, name: &str, links: &mut u32) -> Result<u64, i32> {
        let (ino, kind) = self.lookup(dir, OsStr::new(name))?;
        if kind != Kind::Symlink {
            return Ok(ino);
        }
        *links += 1;
        if *links > MAX_LINKS {
            return Err(libc::ELOOP);
        }
        let target = self.fs.readlink(ino).map_err(FsError::errno)?;
        self.resolve(dir, &String::from_utf8(target).unwrap(), links)
    }

    fn resolve(&self, dir: u64, p: &str, links: &mut u32) -> Result<u64, i32> {
        let (d, last) = self.parent(dir, p, links)?;
        self.follow(d, last, links)
    }

    /// The node `p` names, symlinks followed (`open`, `truncate`, `chmod`, xattrs).
    fn node(&self, p: &str) -> Result<u64, i32> {
        self.resolve(self.top, p, &mut 0)
    }

    /// The parent and last name of `p`, the last not followed (`unlink`, `rename`, ...).
    fn at<'p>(&self, p: &'p str) -> Result<(u64, &'p str), i32> {
        self.parent(self.top, p, &mut 0)
    }

    /// `open(2)`, following a final symlink, creating the name it leads to with
    /// `O_CREAT`; then `f` with the open handle, which is closed after.
    fn open<T>(
        &self,
        p: &str,
        flags: i32,
        mode: u32,
        f: impl FnOnce(u64, u64) -> Result<T, i32>,
    ) -> Result<T, i32> {
        let c = &self.caller();
        let (mut dir, mut name) = self.at(p).map(|(d, n)| (d, n.to_string()))?;
        let mut links = 0;
        let ino = loop {
            match self.lookup(dir, OsStr::new(&name)) {
                Err(libc::ENOENT) if flags & libc::O_CREAT != 0 => {
                    let made = self.fs.create(
                        c,
                        dir,
                        OsStr::new(&name),
                        mode,
                        common::process_umask(),
                        flags,
                    );
                    let made = made.map_err(FsError::errno)?;
                    let ino = made.entry.attr.unwrap().ino;
                    self.looked.borrow_mut().push(ino);
                    return self.close_after(ino, made.opened.fh, f);
                }
                Err(e) => return Err(e),
                Ok(_) if flags & libc::O_EXCL != 0 => return Err(libc::EEXIST),
                Ok((ino, Kind::Symlink)) => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(libc::ELOOP);
                    }
                    let t = String::from_utf8(self.fs.readlink(ino).unwrap()).unwrap();
                    (dir, name) = self
                        .parent(dir, &t, &mut links)
                        .map(|(d, n)| (d, n.to_string()))?;
                }
                Ok((ino, _)) => break ino,
            }
        };
        let o = self
            .fs
            .open(c, ino, flags & !(libc::O_CREAT | libc::O_EXCL));
        let o = o.map_err(FsError::errno)?;
        self.close_after(ino, o.fh, f)
    }

    fn close_after<T>(
        &self,
        ino: u64,
        fh: u64,
        f: impl FnOnce(u64, u64) -> Result<T, i32>,
    ) -> Result<T, i32> {
        let r = f(ino, fh);
        self.fs.flush(&self.caller(), ino, fh).unwrap();
        self.fs.release(&self.caller(), ino, fh);
        r
    }

    fn read_all(&self, ino: u64, fh: u64) -> Result<Vec<u8>, i32> {
        let mut out = Vec::new();
        loop {
            let (tx, rx) = std::sync::mpsc::channel();
            let done = Box::new(move |r| tx.send(r).unwrap());
            self.fs
                .read(&self.caller(), ino, fh, out.len() as u64, 1 << 16, done);
            let chunk = rx.recv().unwrap().map_err(FsError::errno)?;
            if chunk.is_empty() {
                return Ok(out);
            }
            out.extend(chunk);
        }
    }

    fn apply(&self, op: &Op) -> Result<Vec<u8>, i32> {
        let r = self.apply_op(op);
        for ino in self.looked.borrow_mut().drain(..) {
            self.fs.forget(ino, 1);
        }
        r
    }

    /// A name made: its lookup is counted (and given back at the end of the operation).
    fn made(&self, e: FsResult<Entry>) -> Result<Vec<u8>, i32> {
        let e = e.map_err(FsError::errno)?;
        self.looked.borrow_mut().extend(e.attr.map(|a| a.ino));
        Ok(vec![])
    }

    /// A setattr of the node `p` names (symlinks followed).
    fn setattr(&self, p: &str, set: SetAttr) -> Result<Vec<u8>, i32> {
        let ino = self.node(p)?;
        let r = self.fs.setattr(&self.caller(), ino, &set, None);
        r.map(|_| vec![]).map_err(FsError::errno)
    }

    fn apply_op(&self, op: &Op) -> Result<Vec<u8>, i32> {
        let (fs, c) = (self.fs, &self.caller());
        let name = |n: &str| OsStr::new(n).to_owned();
        let errno = FsError::errno;
        match op {
            Op::Create { p, excl, mode } => {
                let fl = libc::O_CREAT | libc::O_WRONLY | if *excl { libc::O_EXCL } else { 0 };
                self.open(p, fl, *mode, |_, _| Ok(vec![]))
            }
            Op::Write {
                p,
                off,
                len,
                byte,
                append,
            } => {
                let fl = libc::O_WRONLY | if *append { libc::O_APPEND } else { 0 };
                self.open(p, fl, 0, |ino, fh| {
                    let at = if *append {
                        fs.getattr(c, ino).map_err(errno)?.attr.size
                    } else {
                        *off
                    };
                    let n = fs
                        .write(c, ino, fh, at, &vec![*byte; *len])
                        .map_err(errno)?;
                    Ok((n as u64).to_le_bytes().to_vec())
                })
            }
            Op::Truncate { p, len } => self.setattr(
                p,
                SetAttr {
                    size: Some(*len),
                    ..SetAttr::default()
                },
            ),
            Op::Read { p } => self.open(p, libc::O_RDONLY, 0, |ino, fh| self.read_all(ino, fh)),
            Op::Rename { a, b, flags } => {
                let ((d1, n1), (d2, n2)) = (self.at(a)?, self.at(b)?);
                let r = fs.rename(c, d1, &name(n1), d2, &name(n2), *flags);
                r.map(|_| vec![]).map_err(errno)
            }
            Op::Link { a, b } => {
                let (d, n) = self.at(a)?;
                let (from, _) = self.lookup(d, &name(n))?;
                let (d2, n2) = self.at(b)?;
                self.made(fs.link(c, from, d2, &name(n2)))
            }
            Op::Unlink { p } => {
                let (d, n) = self.at(p)?;
                fs.unlink(c, d, &name(n)).map(|_| vec![]).map_err(errno)
            }
            Op::Mkdir { p, mode } => {
                let (d, n) = self.at(p)?;
                self.made(fs.mkdir(c, d, &name(n), *mode, common::process_umask()))
            }
            Op::Rmdir { p } => {
                let (d, n) = self.at(p)?;
                fs.rmdir(c, d, &name(n)).map(|_| vec![]).map_err(errno)
            }
            Op::Symlink { target, p } => {
                let (d, n) = self.at(p)?;
                self.made(fs.symlink(c, d, &name(n), Path::new(target)))
            }
            Op::Chmod { p, mode } => self.setattr(
                p,
                SetAttr {
                    mode: Some(*mode),
                    ..SetAttr::default()
                },
            ),
            Op::Setxattr {
                p,
                name: x,
                value,
                flags,
            } => {
                let ino = self.node(p)?;
                let r = fs.setxattr(c, ino, &name(x), value, *flags);
                r.map(|_| vec![]).map_err(errno)
            }
            Op::Removexattr { p, name: x } => {
                let ino = self.node(p)?;
                fs.removexattr(c, ino, &name(x))
                    .map(|_| vec![])
                    .map_err(errno)
            }
        }
    }
}

/// A comparable description of everything under `root`.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let p = root.join(&r);
            let md = fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let mut desc = format!(
                "mode={:o} nlink={}",
                md.mode(),
                if ft.is_dir() { 0 } else { md.nlink() }
            );
            if ft.is_symlink() {
                desc += &format!(" -> {}", fs::read_link(&p).unwrap().display());
            } else if ft.is_file() {
                let data = fs::read(&p).unwrap();
                desc += &format!(" size={} hash={:x}", md.len(), fnv(&data));
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

fn fnv(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn xattrs(p: &Path) -> Vec<(String, Vec<u8>)> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return vec![];
    }
    buf.truncate(n as usize);
    let mut out: Vec<(String, Vec<u8>)> = buf
        .split(|&b| b == 0)
        // user.coherent.* are computed by the coherence layer (docs/design.md#control-surface), not
        // stored.
        .filter(|s| s.starts_with(b"user.") && !s.starts_with(b"user.coherent."))
        .map(|name| {
            let cn = CString::new(name).unwrap();
            let mut v = vec![0u8; 4096];
            let n =
                unsafe { libc::getxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
            v.truncate(n.max(0) as usize);
            (String::from_utf8_lossy(name).into_owned(), v)
        })
        .collect();
    out.sort();
    out
}

/// Where the operations go: through a mount (with or without FUSE passthrough), or
/// straight to the filesystem type.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sut {
    Mount {
        passthrough: bool,
    },
    /// The filesystem type; `policy`: with the real volume policy (else the no-op one).
    Direct {
        policy: bool,
    },
}

fn run(sut: Sut) {
    let total: usize = std::env::var("COHERENT_REFTEST_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let fixed: Option<u64> = std::env::var("COHERENT_REFTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    const PER_SEQ: usize = 200;
    let seqs = if fixed.is_some() {
        1
    } else {
        total.div_ceil(PER_SEQ)
    };
    // The filesystem type with no mount works on its own backing directory.
    let direct_dir = tempfile::tempdir().unwrap();
    let m = match sut {
        Sut::Mount { passthrough } => Some(Mount::new(passthrough)),
        Sut::Direct { .. } => None,
    };
    let plain = Fs::new(
        Store::open_root(direct_dir.path()).unwrap(),
        std::sync::Arc::new(NoPolicy),
        None,
        FsOptions::default(),
    )
    .unwrap();
    let mut caller = Caller {
        pid: std::process::id(),
        uid: 0,
        gid: 0,
        started: Started::now(),
    };
    // With the volume policy the caller is an agent's process, so every write is decided,
    // tracked and counted for a session.
    let (volume, agent) = match sut {
        Sut::Direct { policy: true } => (Some(InProc::new()), Some(Agent::new("ref"))),
        _ => (None, None),
    };
    let (fs, direct_root) = match (&volume, &agent) {
        (Some(v), Some(a)) => {
            caller = a.caller();
            (&v.fs, v.backing.clone())
        }
        _ => (&plain, direct_dir.path().to_path_buf()),
    };
    let (mut ok, mut ops, mut entries) = (0usize, 0usize, 0usize);
    // Writes of data that succeeded: each one a handle that changed its file.
    let mut writes = 0usize;
    for s in 0..seqs {
        let salt = match sut {
            Sut::Mount { passthrough: true } => 0,
            Sut::Mount { passthrough: false } => 1 << 32,
            Sut::Direct { policy: false } => 2 << 32,
            Sut::Direct { policy: true } => 3 << 32,
        };
        let seed = fixed.unwrap_or(0x5eed_0000 + s as u64 + salt);
        let reference = tempfile::tempdir().unwrap();
        let sub = format!("seq{s}");
        let (sut_root, backing) = match &m {
            Some(m) => (m.path(&sub), m.backing_path(&sub)),
            None => (direct_root.join(&sub), direct_root.join(&sub)),
        };
        fs::create_dir(&sut_root).unwrap();
        let direct = Direct {
            fs,
            top: match sut {
                Sut::Direct { .. } => {
                    let e = fs
                        .lookup(
                            &Caller {
                                started: Started::now(),
                                ..caller
                            },
                            ROOT_INO,
                            OsStr::new(&sub),
                        )
                        .unwrap();
                    e.attr.unwrap().ino
                }
                Sut::Mount { .. } => ROOT_INO, // unused
            },
            who: caller,
            looked: Default::default(),
        };
        let mut rng = Rng(seed);
        let mut log = Vec::new();
        let mut known: Vec<String> = Vec::new();
        for i in 0..PER_SEQ {
            let op = gen(&mut rng, &known);
            let want = apply(reference.path(), &op);
            let got = match sut {
                Sut::Mount { .. } => apply(&sut_root, &op),
                Sut::Direct { .. } => direct.apply(&op),
            };
            log.push(format!("{i}: {op:?} -> {want:?}"));
            if want.is_ok() {
                match &op {
                    Op::Create { p, .. } | Op::Mkdir { p, .. } | Op::Symlink { p, .. } => {
                        known.push(p.clone())
                    }
                    Op::Rename { b, .. } | Op::Link { b, .. } => known.push(b.clone()),
                    _ => {}
                }
            }
            ops += 1;
            ok += want.is_ok() as usize;
            if matches!(op, Op::Write { len, .. } if len > 0) && want.is_ok() {
                writes += 1;
            }
            assert_eq!(
                got,
                want,
                "op {i} {op:?} differs ({sut:?}); replay with \
                 COHERENT_REFTEST_SEED={seed}\nhistory:\n{}",
                log.join("\n")
            );
        }
        let (a, b) = (snapshot(reference.path()), snapshot(&sut_root));
        assert_eq!(
            b,
            a,
            "trees differ after seed {seed} ({sut:?}); replay with \
             COHERENT_REFTEST_SEED={seed}\nhistory:\n{}",
            log.join("\n")
        );
        // The mount shows what is in its backing directory, too.
        assert_eq!(snapshot(&backing), a);
        entries += a.len();
    }
    // The sequences must exercise real work, not only errors on empty trees.
    eprintln!("reftest: {ops} ops, {ok} succeeded, {entries} entries compared");
    assert!(ok * 5 > ops, "only {ok} of {ops} operations succeeded");
    assert!(entries > seqs * 5, "trees too small: {entries} entries");
    if let (Some(v), Some(_)) = (&volume, &agent) {
        // The policy was there: every write of data through a handle was committed (a
        // create on a handle commits too), and nothing was refused.
        let commits = v.events_of("commit", "ref");
        let by_handle = commits.iter().filter(|e| e["op"] == "write").count();
        assert!(
            by_handle >= writes && writes > seqs,
            "{by_handle} commits by a write handle for {writes} writes of data"
        );
        assert!(v.events_of("denied", "ref").is_empty());
    }
}

#[test]
fn reftest_passthrough() {
    run(Sut::Mount { passthrough: true });
}

#[test]
fn reftest_daemon() {
    run(Sut::Mount { passthrough: false });
}

#[test]
fn reftest_filesystem_type() {
    run(Sut::Direct { policy: false });
}

/// The filesystem type with the volume policy coherent-mount wires (no mount).
#[test]
fn reftest_filesystem_type_with_the_volume_policy() {
    run(Sut::Direct { policy: true });
}
