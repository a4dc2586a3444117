//! Running a syscall with the caller's credentials, on this thread only.

use super::Caller;

/// The caller's supplementary groups, from `/proc/PID/status`.
pub(super) fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    s.lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// While alive, this thread's fsuid/fsgid/groups are the caller's. The raw syscalls
/// are per-thread (glibc's wrappers would change every thread of the daemon).
pub(super) struct AsCaller {
    /// The thread's own fsuid, fsgid and groups, to put back (None: nothing changed).
    saved: Option<(i64, i64, Vec<libc::gid_t>)>,
}

impl AsCaller {
    pub(super) fn enter(c: &Caller) -> AsCaller {
        if c.uid == 0 && c.gid == 0 {
            return AsCaller { saved: None };
        }
        let mut saved = vec![0 as libc::gid_t; 256];
        let n = unsafe { libc::getgroups(saved.len() as i32, saved.as_mut_ptr()) };
        saved.truncate(n.max(0) as usize);
        let groups = groups_of(c.pid);
        // setfsuid/setfsgid return the previous value.
        let (uid, gid) = unsafe {
            libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
            let gid = libc::syscall(libc::SYS_setfsgid, c.gid);
            let uid = libc::syscall(libc::SYS_setfsuid, c.uid);
            (uid, gid)
        };
        AsCaller {
            saved: Some((uid, gid, saved)),
        }
    }
}

impl Drop for AsCaller {
    fn drop(&mut self) {
        if let Some((uid, gid, groups)) = &self.saved {
            // fsuid back to 0 also restores the filesystem capabilities.
            unsafe {
                libc::syscall(libc::SYS_setfsuid, *uid);
                libc::syscall(libc::SYS_setfsgid, *gid);
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
            }
        }
    }
}
