//! Running a syscall with the caller's credentials, on this thread only: the per-thread
//! switch lives in [`crate::access`] (one owner), this is its form for a FUSE caller.

use super::Caller;
use crate::access::{AsUser, Who};

/// The caller's supplementary groups, from `/proc/PID/status`.
pub(super) fn groups_of(pid: u32) -> Vec<u32> {
    crate::access::groups_of(pid)
}

/// While alive, this thread's fsuid/fsgid/groups are the caller's.
pub(super) struct AsCaller {
    _guard: AsUser,
}

impl AsCaller {
    pub(super) fn enter(c: &Caller) -> AsCaller {
        if c.uid == 0 && c.gid == 0 {
            // Root: nothing to switch, and no /proc read.
            return AsCaller {
                _guard: AsUser::enter(&Who::root()),
            };
        }
        AsCaller {
            _guard: AsUser::enter(&Who::of_task(c.pid, c.uid, c.gid)),
        }
    }
}
