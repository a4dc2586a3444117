//! Permission checks made as the caller, the way the kernel would make them
//! (docs/design.md#handoff, docs/design.md#control-surface, docs/design.md#trust): may this uid,
//! with these groups, open a path for writing, or look it up?
//!
//! The daemon runs as root, so it cannot ask the question of itself. Instead this thread
//! takes the caller's fsuid, fsgid and supplementary groups for the duration of one check
//! (the raw syscalls are per-thread; glibc's wrappers would change every thread) and lets
//! the kernel walk the path and run `faccessat2(..., AT_EACCESS)`: mode bits, POSIX ACLs,
//! read-only mounts and immutable files all count, exactly as for the caller's own `open`.
//! A non-zero fsuid also drops the filesystem capabilities (CAP_DAC_OVERRIDE, ...), which
//! come back when fsuid returns to 0. Root (uid 0) may do anything.
//!
//! Paths are resolved beneath the root ([`crate::beneath`]): a symlink out of it answers
//! `EXDEV`, never a check of a host path.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

use crate::beneath::open_beneath;

/// A caller as the permission checks see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Who {
    pub fn root() -> Who {
        Who {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    /// The caller of a FUSE request: its fs uid and gid, and the supplementary groups of
    /// thread `tid` from `/proc/TID/status` (none when the task is gone: the check then
    /// counts only uid and gid, which can only deny more).
    pub fn of_task(tid: u32, uid: u32, gid: u32) -> Who {
        Who {
            uid,
            gid,
            groups: groups_of(tid),
        }
    }

    /// User `uid` as the user database has it (primary group and supplementary groups,
    /// as a login would get them); None when the database has no such user.
    pub fn of_user(uid: u32) -> Option<Who> {
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: passwd is a plain C struct of integers and pointers, for which all zeroes is
        // valid.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: getpwuid_r into a zeroed passwd and a buffer of the length given.
        let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
        if r != 0 || out.is_null() {
            return None;
        }
        let gid = pw.pw_gid;
        let mut groups = vec![0 as libc::gid_t; 256];
        let mut n = groups.len() as libc::c_int;
        // SAFETY: pw_name is a NUL-terminated string inside `buf`; the group buffer has
        // `n` entries.
        let r = unsafe { libc::getgrouplist(pw.pw_name, gid, groups.as_mut_ptr(), &mut n) };
        groups.truncate(if r < 0 { 0 } else { n.max(0) as usize });
        Some(Who { uid, gid, groups })
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// The `Groups:` line of a `/proc/PID/status` text (None when there is none).
pub fn parse_groups(status: &[u8]) -> Option<Vec<u32>> {
    let text = std::str::from_utf8(status).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(
        line.split_ascii_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect(),
    )
}

/// The supplementary groups of task `tid` (empty when it cannot be read).
pub fn groups_of(tid: u32) -> Vec<u32> {
    std::fs::read(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| parse_groups(&s))
        .unwrap_or_default()
}

/// While alive, this thread's fsuid, fsgid and supplementary groups are `who`'s.
pub struct AsUser {
    /// The thread's own fsuid, fsgid and groups, to put back (None: nothing changed).
    saved: Option<(i64, i64, Vec<libc::gid_t>)>,
}

impl AsUser {
    pub fn enter(who: &Who) -> AsUser {
        if who.uid == 0 && who.gid == 0 {
            return AsUser { saved: None };
        }
        let mut saved = vec![0 as libc::gid_t; 256];
        // SAFETY: getgroups into a buffer of the length given.
        let n = unsafe { libc::getgroups(saved.len() as i32, saved.as_mut_ptr()) };
        saved.truncate(n.max(0) as usize);
        // SAFETY: raw per-thread credential syscalls with valid arguments; setfsuid and
        // setfsgid return the previous value.
        let (uid, gid) = unsafe {
            libc::syscall(libc::SYS_setgroups, who.groups.len(), who.groups.as_ptr());
            let gid = libc::syscall(libc::SYS_setfsgid, who.gid);
            let uid = libc::syscall(libc::SYS_setfsuid, who.uid);
            (uid, gid)
        };
        AsUser {
            saved: Some((uid, gid, saved)),
        }
    }
}

impl Drop for AsUser {
    fn drop(&mut self) {
        if let Some((uid, gid, groups)) = &self.saved {
            // fsuid back to 0 also restores the filesystem capabilities.
            // SAFETY: as in `enter`, with the values saved there.
            unsafe {
                libc::syscall(libc::SYS_setfsuid, *uid);
                libc::syscall(libc::SYS_setfsgid, *gid);
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
            }
        }
    }
}

/// Is an error a "no" from a permission check (rather than a failure to check)?
fn is_denial(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) | Some(libc::ETXTBSY)
    )
}

/// `faccessat2(fd, "", mode, AT_EACCESS | AT_EMPTY_PATH)`: the check on the file itself.
fn access_fd(fd: BorrowedFd<'_>, mode: i32) -> io::Result<()> {
    // SAFETY: faccessat2 on a valid descriptor with an empty NUL-terminated path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            mode,
            libc::AT_EACCESS | libc::AT_EMPTY_PATH,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Turn a check into a yes/no; errors that are not denials stay errors.
fn verdict(r: io::Result<()>) -> io::Result<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if is_denial(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Could `who` open `rel` (relative to `root`) for writing? Search permission on every
/// directory on the way and write permission on the file, as the kernel decides it
/// (mode, ACL, read-only mount, immutable flag). A symlink's path names the link (as the
/// engine keys it): writing it means replacing the name, i.e. write and search
/// permission on its parent directory.
///
/// Errors: `ENOENT`/`ENOTDIR` (nothing there), `EXDEV` (leaves the root), others from the
/// walk. A denial is `Ok(false)`, never an error.
pub fn may_write(root: BorrowedFd<'_>, rel: &Path, who: &Who) -> io::Result<bool> {
    if who.is_root() {
        return Ok(true);
    }
    let _as = AsUser::enter(who);
    let fd = match open_beneath(root, rel, libc::O_PATH | libc::O_NOFOLLOW, 0) {
        Ok(fd) => fd,
        Err(e) if is_denial(&e) => return Ok(false),
        Err(e) => return Err(e),
    };
    may_write_found(fd.as_fd(), || may_replace(root, rel))
}

/// Could the caller (credentials already switched) write the file `fd` was opened on?
/// For a symlink, `replace` answers: may it replace the name in its directory.
fn may_write_found(
    fd: BorrowedFd<'_>,
    replace: impl FnOnce() -> io::Result<bool>,
) -> io::Result<bool> {
    let st = nix::sys::stat::fstat(fd.as_raw_fd())?;
    if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return replace();
    }
    verdict(access_fd(fd, libc::W_OK))
}

/// What one walk as a caller finds about a path: may it look the name up, and may it
/// write the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// [`may_look_up`]'s answer.
    pub looks_up: bool,
    /// [`may_write`]'s answer when the caller may look the name up (None: it cannot be
    /// told, e.g. nothing is there; also None when it may not look it up).
    pub writes: Option<bool>,
}

/// [`may_look_up`] and [`may_write`] of `rel` for `who` with one walk as it: to the
/// parent directory, then the last name looked up in it.
pub fn look_up_and_write(root: BorrowedFd<'_>, rel: &Path, who: &Who) -> Access {
    let Some(name) = rel.file_name().filter(|_| !who.is_root()) else {
        // Root, or a path ending in `..`: the two questions asked on their own.
        let looks_up = may_look_up(root, rel, who);
        let writes = looks_up.then(|| may_write(root, rel, who).ok()).flatten();
        return Access { looks_up, writes };
    };
    let no = Access {
        looks_up: false,
        writes: None,
    };
    let _as = AsUser::enter(who);
    let Ok(dir) = open_beneath(root, parent_of(rel), libc::O_PATH | libc::O_DIRECTORY, 0) else {
        return no;
    };
    if access_fd(dir.as_fd(), libc::X_OK).is_err() {
        return no;
    }
    let writes = match open_beneath(
        dir.as_fd(),
        Path::new(name),
        libc::O_PATH | libc::O_NOFOLLOW,
        0,
    ) {
        Ok(fd) => may_write_found(fd.as_fd(), || {
            verdict(access_fd(dir.as_fd(), libc::W_OK | libc::X_OK))
        })
        .ok(),
        Err(e) if is_denial(&e) => Some(false),
        Err(_) => None,
    };
    Access {
        looks_up: true,
        writes,
    }
}

/// Write and search permission on the parent of `rel` (credentials already switched).
fn may_replace(root: BorrowedFd<'_>, rel: &Path) -> io::Result<bool> {
    let parent = parent_of(rel);
    match open_beneath(root, parent, libc::O_PATH | libc::O_DIRECTORY, 0) {
        Ok(fd) => verdict(access_fd(fd.as_fd(), libc::W_OK | libc::X_OK)),
        Err(e) if is_denial(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

fn parent_of(rel: &Path) -> &Path {
    match rel.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// May `who` read the content of `rel` now (docs/history.md)? A file there: read
/// permission on it, as the caller's own `open` would check (a symlink or another kind of
/// file: no). Nothing there (a version of a removed file): read, write and search
/// permission on its parent, the caller could list the directory and make the file again.
/// Anything else, a walk that leaves the root included: no.
pub fn may_read(root: BorrowedFd<'_>, rel: &Path, who: &Who) -> bool {
    let _as = (!who.is_root()).then(|| AsUser::enter(who));
    match open_beneath(root, rel, libc::O_PATH | libc::O_NOFOLLOW, 0) {
        Ok(fd) => {
            let Ok(st) = nix::sys::stat::fstat(fd.as_raw_fd()) else {
                return false;
            };
            st.st_mode & libc::S_IFMT == libc::S_IFREG
                && (who.is_root() || access_fd(fd.as_fd(), libc::R_OK).is_ok())
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            match open_beneath(root, parent_of(rel), libc::O_PATH | libc::O_DIRECTORY, 0) {
                Ok(fd) => {
                    who.is_root()
                        || access_fd(fd.as_fd(), libc::R_OK | libc::W_OK | libc::X_OK).is_ok()
                }
                Err(_) => false,
            }
        }
        Err(_) => false,
    }
}

/// Could `who` look `rel` up: search permission on every directory from the root down to
/// its parent (the name itself need not exist)? This is what decides whether a caller may
/// see a path, its record and its note (docs/design.md#control-surface). A parent that does not
/// exist (or leaves the root) answers no: nobody but root can look a name up there.
pub fn may_look_up(root: BorrowedFd<'_>, rel: &Path, who: &Who) -> bool {
    if who.is_root() {
        return true;
    }
    let _as = AsUser::enter(who);
    // The walk to the parent checks search permission on each directory above it; the
    // parent's own search permission is checked explicitly (the walk's last component is
    // not searched).
    match open_beneath(root, parent_of(rel), libc::O_PATH | libc::O_DIRECTORY, 0) {
        Ok(fd) => access_fd(fd.as_fd(), libc::X_OK).is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_line() {
        let st = b"Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 27 1000 \nNSpid:\t1\n";
        assert_eq!(parse_groups(st), Some(vec![4, 27, 1000]));
        assert_eq!(parse_groups(b"Groups:\t\n"), Some(vec![]));
        assert_eq!(parse_groups(b"Name:\tx\n"), None);
    }

    #[test]
    fn own_groups_match_getgroups() {
        let mut buf = vec![0 as libc::gid_t; 256];
        // SAFETY: getgroups into a buffer of the length given.
        let n = unsafe { libc::getgroups(buf.len() as i32, buf.as_mut_ptr()) };
        buf.truncate(n as usize);
        let tid = nix::unistd::gettid().as_raw() as u32;
        let mut got = groups_of(tid);
        got.sort();
        buf.sort();
        assert_eq!(got, buf);
    }
}
