//! Removing a file's privileges when it is written, truncated or given away, as the
//! kernel does on a local filesystem. The mount takes `FUSE_HANDLE_KILLPRIV_V2`: the kernel
//! then stops asking for `security.capability` before writes (one or two `getxattr` round
//! trips per write open) and stops sending the mode change itself; the daemon does it here.
//!
//! The backing filesystem cannot do it for us: the daemon truncates and writes as root,
//! which holds `CAP_FSETID`, and passthrough writes run with the daemon's credentials too.
//! A chown as root does clear set-user-ID and `security.capability` on the backing file,
//! but keeps a set-group-ID bit that a plain user's chown would clear.
//!
//! Two rules (the kernel's `setattr_should_drop_suidgid`, `chown_common` and
//! `cap_inode_killpriv`). A write or truncate, on a regular file, by a caller without
//! `CAP_FSETID` (here: any caller but root, whose requests the kernel does not flag):
//! set-user-ID goes, and set-group-ID when the group may execute or the caller is not in
//! the file's group. A chown (`chown(f, -1, -1)` too), on anything but a directory: set-user-ID
//! goes whoever the caller is, set-group-ID when the group may execute, or when the
//! caller is neither in the file's group nor root. `security.capability` goes for any
//! caller in both. The cost, a stat and a `removexattr` of the backing file, is paid only
//! where the kernel would have paid a round trip: a truncating open or setattr and a
//! chown by a plain user, a write the kernel flags, and the (otherwise empty) setattr the
//! kernel sends when its own check on a write or a chown found something to remove.

use std::ffi::OsStr;

use super::Fs;
use crate::store::{Attr, Caller, FsError, FsResult, Kind, SetAttr};

/// The extended attribute that holds file capabilities.
const CAPS: &str = "security.capability";

/// Which of the kernel's rules applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KillRule {
    /// A write or truncate.
    Write,
    /// A chown, whatever it changes.
    Chown,
}

impl Fs {
    /// Clear what a write, truncate or chown by `caller` clears on a local filesystem.
    /// True when the mode changed.
    pub(super) fn kill_privs(&self, caller: &Caller, ino: u64, rule: KillRule) -> FsResult<bool> {
        let a = self.store.getattr(ino)?;
        if !applies(&a, rule) {
            return Ok(false);
        }
        let (perm, keep) = (u32::from(a.perm), kept(caller, &a, rule));
        if keep != perm {
            let set = SetAttr {
                mode: Some(keep),
                ..SetAttr::default()
            };
            self.store.setattr(ino, &set, None)?;
        }
        let gone = |e: FsError| matches!(e, FsError(libc::ENODATA | libc::EOPNOTSUPP));
        match self.store.removexattr(caller, ino, OsStr::new(CAPS)) {
            Ok(()) => Ok(keep != perm),
            Err(e) if gone(e) => Ok(keep != perm),
            // A daemon without CAP_SETFCAP (a plain user's mount) may not remove the
            // attribute even where there is none: fine when there is none.
            Err(FsError(libc::EPERM)) => match self.store.getxattr(ino, OsStr::new(CAPS), 0) {
                Err(e) if gone(e) => Ok(keep != perm),
                _ => Err(FsError(libc::EPERM)),
            },
            Err(e) => Err(e),
        }
    }

    /// The empty setattr is a chown (`chown(f, -1, -1)`) or a write's own check, and
    /// FUSE tells them apart no more. A chown by neither root nor the owner that would
    /// clear a bit is refused (`EPERM`), as natively, unless the file is open for writing
    /// through the mount: then it may be a write's (whose caller may have opened it
    /// before giving up its privileges), which clears the same bits whoever writes.
    pub(super) fn may_kill_privs(&self, caller: &Caller, ino: u64) -> FsResult<()> {
        if caller.uid == 0 {
            return Ok(());
        }
        let a = self.store.getattr(ino)?;
        if a.uid == caller.uid || kept(caller, &a, KillRule::Chown) == u32::from(a.perm) {
            return Ok(());
        }
        if self.store.has_write_handle(ino) {
            Ok(())
        } else {
            Err(FsError(libc::EPERM))
        }
    }
}

/// Does `rule` apply to a node like `a` at all?
fn applies(a: &Attr, rule: KillRule) -> bool {
    match rule {
        KillRule::Write => a.kind == Kind::File,
        // A symlink has no such bits (and no mode to set).
        KillRule::Chown => !matches!(a.kind, Kind::Dir | Kind::Symlink),
    }
}

/// The permission bits `rule` leaves `a` by `caller`.
fn kept(caller: &Caller, a: &Attr, rule: KillRule) -> u32 {
    let perm = u32::from(a.perm);
    let root = caller.uid == 0;
    if !applies(a, rule) || (root && rule == KillRule::Write) {
        return perm;
    }
    let mut keep = perm & !libc::S_ISUID;
    let gx = perm & libc::S_IXGRP != 0;
    if perm & libc::S_ISGID != 0 && (gx || !(root || in_group(caller, a.gid))) {
        keep &= !libc::S_ISGID;
    }
    keep
}

/// Is `gid` the caller's group or one of its supplementary groups?
fn in_group(c: &Caller, gid: u32) -> bool {
    c.gid == gid || crate::access::groups_of(c.pid).contains(&gid)
}
