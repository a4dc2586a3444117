//! cgroup v2 helpers: where the hierarchy is mounted, and the `coherent-session-NAME`
//! cgroup that `coherent run` puts a session's processes in (docs/design.md#sessions,
//! docs/design.md#control-surface).

use super::{check_session_name, CGROUP_PREFIX};
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

/// A mounted cgroup v2 hierarchy: where it is mounted and which hierarchy path that
/// mount point shows (`/` unless it is a bind mount of a sub-tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup2Mount {
    pub mount_point: PathBuf,
    pub root: String,
}

impl Cgroup2Mount {
    /// The directory of hierarchy path `cg` (as in `/proc/PID/cgroup`), if this mount
    /// shows it.
    pub fn dir_of(&self, cg: &str) -> Option<PathBuf> {
        let rel = if self.root == "/" {
            cg
        } else {
            let rest = cg.strip_prefix(self.root.as_str())?;
            if !(rest.is_empty() || rest.starts_with('/')) {
                return None;
            }
            rest
        };
        Some(self.mount_point.join(rel.trim_start_matches('/')))
    }
}

/// The first cgroup2 mount of this process's mount namespace, from
/// `/proc/self/mountinfo` (e.g. `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
/// host).
pub fn cgroup2_mount() -> io::Result<Option<Cgroup2Mount>> {
    Ok(cgroup2_of(&crate::sys::mounts()?))
}

/// The first cgroup2 mount among `mounts` (as [`crate::sys::parse_mountinfo`] lists them).
pub fn cgroup2_of(mounts: &[crate::sys::MountEntry]) -> Option<Cgroup2Mount> {
    mounts
        .iter()
        .find(|m| m.fstype == "cgroup2")
        .map(|m| Cgroup2Mount {
            mount_point: m.mount_point.clone(),
            root: m.root.to_string_lossy().into_owned(),
        })
}

/// Put process `pid` in the cgroup of session `name` and return that cgroup's directory.
///
/// Where: a child `coherent-session-NAME` of the calling process's own cgroup v2 if that is
/// writable (so a session nests where its launcher lives, and systemd delegation keeps
/// working), else a child of the hierarchy root. The directory is created if missing and
/// reused if present (joining). Fails with `InvalidInput` for a name that is not a valid
/// session name, `NotFound` when no cgroup v2 is mounted, or the error of the last place
/// tried (typically `PermissionDenied` or `ReadOnlyFilesystem`) when none is writable.
pub fn join_session_cgroup(name: &str, pid: u32) -> io::Result<PathBuf> {
    check_session_name(name).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
    let mount = cgroup2_mount()?
        .ok_or_else(|| io::Error::new(ErrorKind::NotFound, "no cgroup v2 hierarchy mounted"))?;
    let own = std::fs::read("/proc/self/cgroup")?;
    let mut parents = Vec::new();
    if let Some(dir) = super::procfs::parse_cgroup_v2(&own).and_then(|cg| mount.dir_of(cg)) {
        parents.push(dir);
    }
    if !parents.contains(&mount.mount_point) {
        parents.push(mount.mount_point.clone());
    }
    let leaf = format!("{CGROUP_PREFIX}{name}");
    let mut last = io::Error::new(ErrorKind::NotFound, "no cgroup v2 directory to use");
    for parent in parents {
        // Already in a session cgroup of this name: join it rather than nest a twin.
        let dir = if parent.file_name().and_then(|n| n.to_str()) == Some(leaf.as_str()) {
            parent
        } else {
            parent.join(&leaf)
        };
        match try_join(&dir, pid) {
            Ok(()) => return Ok(dir),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn try_join(dir: &Path, pid: u32) -> io::Result<()> {
    let created = match std::fs::create_dir(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    let res = std::fs::write(dir.join("cgroup.procs"), format!("{pid}\n"));
    if res.is_err() && created {
        let _ = std::fs::remove_dir(dir);
    }
    res
}

/// Remove a session cgroup once it is empty. Returns false (and leaves it) while processes
/// are still in it.
pub fn remove_session_cgroup(dir: &Path) -> io::Result<bool> {
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::parse_mountinfo;

    #[test]
    fn finds_cgroup2_in_hybrid_and_unified_layouts() {
        let hybrid = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
            40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n\
            41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let m = cgroup2_of(&parse_mountinfo(hybrid)).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(
            m.dir_of("/a/b"),
            Some(PathBuf::from("/sys/fs/cgroup/unified/a/b"))
        );
        assert_eq!(m.dir_of("/"), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let bound = "30 1 0:26 /user.slice /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n";
        let m = cgroup2_of(&parse_mountinfo(bound)).unwrap();
        assert_eq!(m.root, "/user.slice");
        assert_eq!(
            m.dir_of("/user.slice/x"),
            Some(PathBuf::from("/sys/fs/cgroup/x"))
        );
        assert_eq!(m.dir_of("/user.slicex"), None);
        assert_eq!(m.dir_of("/system.slice"), None);
        let spaced = "30 1 0:26 / /mnt/cg\\040v2 rw - cgroup2 none rw\n";
        assert_eq!(
            cgroup2_of(&parse_mountinfo(spaced)).unwrap().mount_point,
            PathBuf::from("/mnt/cg v2")
        );
        assert!(cgroup2_of(&parse_mountinfo("1 0 0:1 / / rw - ext4 /dev/sda rw\n")).is_none());
    }

    #[test]
    fn refuses_invalid_names() {
        let e = join_session_cgroup("a/b", std::process::id()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
}
