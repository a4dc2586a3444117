//! Differential test (in the style of mountpoint-s3's reftests): the same seeded random
//! sequence of operations is applied to a plain directory and, through the mount, to
//! another; every operation must give the same result (errno included), and after each
//! sequence both trees must match (names, types, sizes, modes, link counts, contents,
//! symlink targets, xattrs).
//!
//! `COHERENT_REFTEST_OPS` sets the number of operations per data mode (default 2000),
//! `COHERENT_REFTEST_SEED` replays one seed (printed on failure).

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::Mount;

/// xorshift64*: small, seedable, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

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
            value: vec![b'v'; r.below(40) as usize],
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
        // user.coherent.* are computed by the coherence layer (DESIGN.md §7), not stored.
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

fn run(passthrough: bool) {
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
    let m = Mount::new(passthrough);
    let (mut ok, mut ops, mut entries) = (0usize, 0usize, 0usize);
    for s in 0..seqs {
        let seed = fixed.unwrap_or(0x5eed_0000 + s as u64 + if passthrough { 0 } else { 1 << 32 });
        let reference = tempfile::tempdir().unwrap();
        let sub = format!("seq{s}");
        fs::create_dir(m.path(&sub)).unwrap();
        let sut = m.path(&sub);
        let mut rng = Rng(seed | 1);
        let mut log = Vec::new();
        let mut known: Vec<String> = Vec::new();
        for i in 0..PER_SEQ {
            let op = gen(&mut rng, &known);
            let want = apply(reference.path(), &op);
            let got = apply(&sut, &op);
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
            assert_eq!(
                got,
                want,
                "op {i} {op:?} differs (passthrough={passthrough}); replay with \
                 COHERENT_REFTEST_SEED={seed}\nhistory:\n{}",
                log.join("\n")
            );
        }
        let (a, b) = (snapshot(reference.path()), snapshot(&sut));
        assert_eq!(
            b,
            a,
            "trees differ after seed {seed} (passthrough={passthrough}); replay with \
             COHERENT_REFTEST_SEED={seed}\nhistory:\n{}",
            log.join("\n")
        );
        // The mount shows what is in its backing directory, too.
        assert_eq!(snapshot(&m.backing_path(&sub)), a);
        entries += a.len();
    }
    // The sequences must exercise real work, not only errors on empty trees.
    eprintln!("reftest: {ops} ops, {ok} succeeded, {entries} entries compared");
    assert!(ok * 5 > ops, "only {ok} of {ops} operations succeeded");
    assert!(entries > seqs * 5, "trees too small: {entries} entries");
}

#[test]
fn reftest_passthrough() {
    run(true);
}

#[test]
fn reftest_daemon() {
    run(false);
}
