//! Resolving a path given in a request beneath the backing root, never following a
//! symlink out of it (docs/design.md#control-surface: "a path that leaves the root, lexically or
//! through a symlink, is `bad_request`, the same answer whether the host path exists or not").
//!
//! The kernel does the walk: `openat2(2)` with `RESOLVE_BENEATH` refuses (`EXDEV`) an
//! absolute symlink or a `..` that would climb above the root *when it meets it*, before
//! it looks up anything past it, so whether the host path exists never changes the answer.
//! `RESOLVE_NO_MAGICLINKS` keeps `/proc/self/fd/N`-style links out too. Nothing here
//! allocates per path beyond the returned descriptor: a query leaves no trace.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Where a relative path lands.
#[derive(Debug)]
pub enum Resolved {
    /// Inside the root and it exists: an `O_PATH` descriptor of the name itself (a final
    /// symlink is not followed: the path names the link). `real` is the path relative to
    /// the root with no symlink in it, when the request's path went through a symlink to a
    /// directory inside the root (None: the request's path is already that path).
    /// `parent`: the directory the name is in, open, and the name, so the same file is
    /// asked about again with one name looked up, not a walk from the root (None for a
    /// path that ends in `.`, `..` or `/`).
    Inside {
        fd: OwnedFd,
        real: Option<String>,
        parent: Option<Parent>,
    },
    /// Inside the root (as far as the walk got) and it does not exist.
    Missing,
    /// The path leaves the root, lexically or through a symlink.
    Outside,
}

/// The directory a resolved name is in (an `O_PATH` descriptor) and the name in it.
#[derive(Debug)]
pub struct Parent {
    pub dir: OwnedFd,
    pub name: String,
}

/// `openat2(2)` of `rel` beneath `root`: `flags` are `open(2)` flags, `resolve` is
/// `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` plus `extra`. Retries the `EAGAIN` the kernel
/// answers when a concurrent rename raced a `..` walk.
pub fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: i32,
    extra: u64,
) -> io::Result<OwnedFd> {
    let c = CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is a plain C struct of integers, for which all zeroes is valid (and
    // required for the fields we do not set).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | extra;
    for _ in 0..16 {
        // SAFETY: openat2 with a valid dirfd, a NUL-terminated path and a properly sized
        // open_how; the returned descriptor is owned below.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor nobody else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// Does `rel` leave the root lexically (absolute, or more `..` than components before
/// them)? Checked before any lookup, so `missing/../../x` is outside, not missing.
pub fn leaves_lexically(rel: &str) -> bool {
    if rel.starts_with('/') {
        return true;
    }
    let mut depth = 0usize;
    for comp in rel.split('/') {
        match comp {
            "" | "." => {}
            ".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return true,
            },
            _ => depth += 1,
        }
    }
    false
}

fn outcome(r: io::Result<OwnedFd>) -> io::Result<Result<OwnedFd, Resolved>> {
    match r {
        Ok(fd) => Ok(Ok(fd)),
        Err(e) => match e.raw_os_error() {
            Some(libc::EXDEV) => Ok(Err(Resolved::Outside)),
            // A missing component, or a file where a directory should be: nothing there.
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => Ok(Err(Resolved::Missing)),
            _ => Err(e),
        },
    }
}

/// Resolve `rel` (relative to `root`) without leaving the root. A final symlink names
/// itself; an intermediate symlink is followed only while it stays beneath the root.
/// The walk goes to the parent directory, then looks the last name up in it, so the
/// result carries the [`Parent`].
pub fn resolve(root: BorrowedFd<'_>, rel: &str) -> io::Result<Resolved> {
    if leaves_lexically(rel) {
        return Ok(Resolved::Outside);
    }
    let trimmed = rel.trim_end_matches('/');
    let (parent, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if rel.ends_with('/') || matches!(name, "" | "." | "..") {
        return resolve_whole(root, rel, parent, name);
    }
    // The parent with no symlink at all first: the common case, and then the path is
    // already real.
    let (dir, real) = match outcome(open_dir(root, parent, libc::RESOLVE_NO_SYMLINKS)) {
        Ok(Ok(dir)) => (dir, None),
        Ok(Err(r)) => return Ok(r),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            // An intermediate symlink: followed, beneath the root.
            let dir = match outcome(open_dir(root, parent, 0))? {
                Ok(dir) => dir,
                Err(r) => return Ok(r),
            };
            let real = match relative_to(root, dir.as_fd())?.as_str() {
                "" => name.to_string(),
                p => format!("{p}/{name}"),
            };
            (dir, Some(real))
        }
        Err(e) => return Err(e),
    };
    let flags = libc::O_PATH | libc::O_NOFOLLOW;
    let one = libc::RESOLVE_NO_SYMLINKS;
    let fd = match outcome(open_beneath(dir.as_fd(), Path::new(name), flags, one))? {
        Ok(fd) => fd,
        Err(r) => return Ok(r),
    };
    let parent = Some(Parent {
        dir,
        name: name.to_string(),
    });
    Ok(Resolved::Inside { fd, real, parent })
}

/// The directory `parent` beneath `root` (the root itself for ""), as an `O_PATH`
/// descriptor.
fn open_dir(root: BorrowedFd<'_>, parent: &str, extra: u64) -> io::Result<OwnedFd> {
    if parent.is_empty() {
        return root.try_clone_to_owned();
    }
    let flags = libc::O_PATH | libc::O_DIRECTORY;
    open_beneath(root, Path::new(parent), flags, extra)
}

/// [`resolve`] of a path whose last name is `.`, `..` or empty (it ends in `/`): the
/// whole path walked at once, with no [`Parent`].
fn resolve_whole(
    root: BorrowedFd<'_>,
    rel: &str,
    parent: &str,
    name: &str,
) -> io::Result<Resolved> {
    let flags = libc::O_PATH | libc::O_NOFOLLOW;
    let whole = |extra| open_beneath(root, Path::new(rel), flags, extra);
    match outcome(whole(libc::RESOLVE_NO_SYMLINKS)) {
        Ok(Ok(fd)) => {
            return Ok(Resolved::Inside {
                fd,
                real: None,
                parent: None,
            })
        }
        Ok(Err(r)) => return Ok(r),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {}
        Err(e) => return Err(e),
    }
    let fd = match outcome(whole(0))? {
        Ok(fd) => fd,
        Err(r) => return Ok(r),
    };
    // The real path: the real parent directory's path under the root, plus the last name.
    let real_parent = if parent.is_empty() {
        String::new()
    } else {
        match outcome(open_dir(root, parent, 0))? {
            Ok(pfd) => relative_to(root, pfd.as_fd())?,
            Err(r) => return Ok(r),
        }
    };
    let real = match (real_parent.as_str(), name) {
        (p, "." | "..") | (p, "") => p.to_string(),
        ("", n) => n.to_string(),
        (p, n) => format!("{p}/{n}"),
    };
    Ok(Resolved::Inside {
        fd,
        real: Some(real),
        parent: None,
    })
}

/// The path of directory `dir` relative to directory `root`, from the kernel's names of
/// both descriptors (`/proc/self/fd`); both live in the same mount, so the names agree.
fn relative_to(root: BorrowedFd<'_>, dir: BorrowedFd<'_>) -> io::Result<String> {
    let name = |fd: BorrowedFd<'_>| {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map(|p| p.into_os_string().into_string().unwrap_or_default())
    };
    let (r, d) = (name(root)?, name(dir)?);
    let rest = if r == "/" {
        d.strip_prefix('/')
    } else {
        d.strip_prefix(&r).and_then(|x| {
            if x.is_empty() {
                Some(x)
            } else {
                x.strip_prefix('/')
            }
        })
    };
    rest.map(str::to_owned)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not under the root"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn lexical() {
        for p in ["/etc", "..", "a/../..", "a/b/../../../c", "./.."] {
            assert!(leaves_lexically(p), "{p}");
        }
        for p in ["a", "a/..", "a/./b/../c", ".", "a/b/.."] {
            assert!(!leaves_lexically(p), "{p}");
        }
    }

    /// A root with: `f`, `sub/g`, `alias -> sub`, `up -> ..`, links to `/root` (a host
    /// directory that exists), to `/root/.bashrc` (exists) and to `/root/no-such-file`,
    /// a relative escape `rel -> ../../../../../../root`, and `dangling -> nothere`.
    fn tree() -> (tempfile::TempDir, OwnedFd) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("root");
        std::fs::create_dir_all(p.join("sub")).unwrap();
        std::fs::write(p.join("f"), "f").unwrap();
        std::fs::write(p.join("sub/g"), "g").unwrap();
        symlink("sub", p.join("alias")).unwrap();
        symlink("..", p.join("up")).unwrap();
        symlink("/root", p.join("to-root")).unwrap();
        symlink("/root/.bashrc", p.join("to-bashrc")).unwrap();
        symlink("/root/no-such-file", p.join("to-missing")).unwrap();
        symlink("../../../../../../root", p.join("rel")).unwrap();
        symlink("nothere", p.join("dangling")).unwrap();
        let fd = std::fs::File::open(&p).unwrap().into();
        (d, fd)
    }

    fn kind(root: &OwnedFd, rel: &str) -> String {
        let r = resolve(root.as_fd(), rel).unwrap();
        if let Resolved::Inside {
            fd,
            parent: Some(p),
            ..
        } = &r
        {
            // The parent and name lead to the file the walk found.
            let c = CString::new(p.name.as_str()).unwrap();
            let at = nix::sys::stat::fstatat(
                Some(p.dir.as_raw_fd()),
                c.as_c_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .unwrap();
            let st = nix::sys::stat::fstat(fd.as_raw_fd()).unwrap();
            assert_eq!((at.st_dev, at.st_ino), (st.st_dev, st.st_ino), "{rel}");
            assert!(!p.name.contains('/'), "{rel}: {}", p.name);
        }
        match r {
            Resolved::Inside { real: None, .. } => "inside".into(),
            Resolved::Inside { real: Some(r), .. } => format!("inside as {r}"),
            Resolved::Missing => "missing".into(),
            Resolved::Outside => "outside".into(),
        }
    }

    #[test]
    fn inside_missing_outside() {
        assert!(
            Path::new("/root/.bashrc").exists(),
            "the test needs a host file"
        );
        let (_d, root) = tree();
        let cases = [
            ("f", "inside"),
            ("sub/g", "inside"),
            ("sub/./g", "inside"),
            ("sub/../f", "inside"),
            ("nope", "missing"),
            ("sub/nope", "missing"),
            ("nodir/x", "missing"),
            ("f/x", "missing"),
            // A final symlink names the link itself, wherever it points.
            ("to-root", "inside"),
            ("to-missing", "inside"),
            ("dangling", "inside"),
            ("alias", "inside"),
            // Through a symlink that stays inside: the real path.
            ("alias/g", "inside as sub/g"),
            ("alias/nope", "missing"),
            ("alias/../f", "inside as f"),
            ("dangling/x", "missing"),
            // Out: the same answer whether the host path exists or not.
            ("to-root/.bashrc", "outside"),
            ("to-root/no-such-file", "outside"),
            ("to-root/no-such-dir/x", "outside"),
            ("to-bashrc/x", "outside"),
            ("to-missing/x", "outside"),
            ("rel/.bashrc", "outside"),
            ("rel/no-such-file", "outside"),
            ("up/root/f", "outside"),
            ("up/nothing", "outside"),
            ("..", "outside"),
            ("../root/f", "outside"),
            ("nodir/../../x", "outside"),
            ("/root/.bashrc", "outside"),
            ("/root/no-such-file", "outside"),
        ];
        for (rel, want) in cases {
            assert_eq!(kind(&root, rel), want, "{rel}");
        }
    }

    #[test]
    fn resolving_leaks_no_descriptor() {
        let (_d, root) = tree();
        let count = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        // Warm up whatever the test harness opens lazily.
        kind(&root, "alias/g");
        let before = count();
        for _ in 0..200 {
            for rel in ["to-root/.bashrc", "alias/g", "nope", "f", "up/x"] {
                let _ = kind(&root, rel);
            }
        }
        // Other test threads may open files meanwhile: allow a little slack, not 1000.
        assert!(count() < before + 20, "{before} -> {}", count());
    }
}
