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
//! The rule (the kernel's `setattr_should_drop_suidgid` and `cap_inode_killpriv`), for a
//! regular file: a caller without `CAP_FSETID` (here: any caller but root, whose requests
//! the kernel does not flag) loses set-user-ID, and set-group-ID when the group may
//! execute or the caller is not in the file's group; `security.capability` goes for any
//! caller. The cost, a stat and a `removexattr` of the backing file, is paid only where
//! the kernel would have paid a round trip: a truncating open or setattr and a chown by a
//! plain user, a write the kernel flags, and the (otherwise empty) setattr the kernel
//! sends when its own check on a write found something to remove.

use std::ffi::OsStr;

use super::Fs;
use crate::store::{Caller, FsError, FsResult, Kind, SetAttr};

/// The extended attribute that holds file capabilities.
const CAPS: &str = "security.capability";

impl Fs {
    /// Clear what a write, truncate or chown by `caller` clears on a local filesystem.
    /// True when the mode changed.
    pub(super) fn kill_privs(&self, caller: &Caller, ino: u64) -> FsResult<bool> {
        let a = self.store.getattr(ino)?;
        if a.kind != Kind::File {
            return Ok(false);
        }
        let perm = u32::from(a.perm);
        let mut keep = perm;
        if caller.uid != 0 {
            keep &= !libc::S_ISUID;
            let gx = perm & libc::S_IXGRP != 0;
            if perm & libc::S_ISGID != 0 && (gx || !in_group(caller, a.gid)) {
                keep &= !libc::S_ISGID;
            }
        }
        if keep != perm {
            let set = SetAttr {
                mode: Some(keep),
                ..SetAttr::default()
            };
            self.store.setattr(ino, &set, None)?;
        }
        match self.store.removexattr(caller, ino, OsStr::new(CAPS)) {
            Ok(()) | Err(FsError(libc::ENODATA | libc::EOPNOTSUPP)) => Ok(keep != perm),
            Err(e) => Err(e),
        }
    }
}

/// Is `gid` the caller's group or one of its supplementary groups?
fn in_group(c: &Caller, gid: u32) -> bool {
    c.gid == gid || crate::access::groups_of(c.pid).contains(&gid)
}
