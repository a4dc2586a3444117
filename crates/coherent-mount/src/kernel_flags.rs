//! The kernel's own mount flags that mount(8) passes to a helper (`nodiratime`,
//! `strictatime`, `lazytime`, `nosymfollow`, ...) beyond those fuser knows, and
//! `remount`: a remount changes the flags of the mounted volume in place (no new daemon),
//! as `mount -o remount,...` does for any filesystem.

use std::path::Path;

use nix::mount::MsFlags;

/// `MS_NOSYMFOLLOW` (Linux 5.10), not named by nix.
const MS_NOSYMFOLLOW: u64 = 256;

/// Each flag by name: the bits it sets and the bits it clears.
const FLAGS: &[(&str, u64, u64)] = {
    const RDONLY: u64 = libc::MS_RDONLY;
    const NOSUID: u64 = libc::MS_NOSUID;
    const NODEV: u64 = libc::MS_NODEV;
    const NOEXEC: u64 = libc::MS_NOEXEC;
    const SYNC: u64 = libc::MS_SYNCHRONOUS;
    const DIRSYNC: u64 = libc::MS_DIRSYNC;
    const NOATIME: u64 = libc::MS_NOATIME;
    const NODIRATIME: u64 = libc::MS_NODIRATIME;
    const RELATIME: u64 = libc::MS_RELATIME;
    const STRICTATIME: u64 = libc::MS_STRICTATIME;
    const LAZYTIME: u64 = libc::MS_LAZYTIME;
    const IVERSION: u64 = libc::MS_I_VERSION;
    const SILENT: u64 = libc::MS_SILENT;
    &[
        ("ro", RDONLY, 0),
        ("rw", 0, RDONLY),
        ("nosuid", NOSUID, 0),
        ("suid", 0, NOSUID),
        ("nodev", NODEV, 0),
        ("dev", 0, NODEV),
        ("noexec", NOEXEC, 0),
        ("exec", 0, NOEXEC),
        ("sync", SYNC, 0),
        ("async", 0, SYNC),
        ("dirsync", DIRSYNC, 0),
        ("noatime", NOATIME, RELATIME | STRICTATIME),
        ("atime", 0, NOATIME),
        ("nodiratime", NODIRATIME, 0),
        ("diratime", 0, NODIRATIME),
        ("relatime", RELATIME, NOATIME | STRICTATIME),
        ("norelatime", 0, RELATIME),
        ("strictatime", STRICTATIME, NOATIME | RELATIME),
        ("nostrictatime", 0, STRICTATIME),
        ("lazytime", LAZYTIME, 0),
        ("nolazytime", 0, LAZYTIME),
        ("nosymfollow", MS_NOSYMFOLLOW, 0),
        ("symfollow", 0, MS_NOSYMFOLLOW),
        ("iversion", IVERSION, 0),
        ("noiversion", 0, IVERSION),
        ("silent", SILENT, 0),
        ("loud", 0, SILENT),
        // Mandatory locks are gone from Linux (5.15): accepted and without effect, as
        // natively.
        ("mand", 0, 0),
        ("nomand", 0, 0),
    ]
};

/// The flags fuser has no option for, by name (fuser's own are in `FUSE_OPTIONS`).
pub const EXTRA: &[&str] = &[
    "nodiratime",
    "diratime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "nosymfollow",
    "symfollow",
    "iversion",
    "noiversion",
    "silent",
    "loud",
    "mand",
    "nomand",
];

/// Is `o` one of the [`EXTRA`] flags?
pub fn is_extra(o: &str) -> bool {
    EXTRA.contains(&o)
}

/// The flags of the mount at `mnt` now, as `MS_*` bits, read from /proc/self/mountinfo
/// (not statvfs: a volume just mounted answers no request until its loop runs).
fn current(mnt: &Path) -> Result<u64, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    let want = mnt
        .to_string_lossy()
        .replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012");
    // The last mount there is the one on top.
    let line = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(want.as_str()))
        .ok_or_else(|| format!("nothing is mounted on {}", mnt.display()))?;
    let per_mount = line.split(' ').nth(5).unwrap_or("");
    let sb = line
        .split_once(" - ")
        .and_then(|(_, t)| t.split(' ').nth(2))
        .unwrap_or("");
    let mut out = 0;
    let mut atime = libc::MS_STRICTATIME;
    for o in per_mount.split(',').chain(sb.split(',')) {
        match o {
            "ro" => out |= libc::MS_RDONLY,
            "nosuid" => out |= libc::MS_NOSUID,
            "nodev" => out |= libc::MS_NODEV,
            "noexec" => out |= libc::MS_NOEXEC,
            "sync" => out |= libc::MS_SYNCHRONOUS,
            "dirsync" => out |= libc::MS_DIRSYNC,
            "lazytime" => out |= libc::MS_LAZYTIME,
            "nodiratime" => out |= libc::MS_NODIRATIME,
            "nosymfollow" => out |= MS_NOSYMFOLLOW,
            "relatime" => atime = libc::MS_RELATIME,
            "noatime" => atime = libc::MS_NOATIME,
            _ => {}
        }
    }
    Ok(out | atime)
}

/// The flags `opts` (in order, later ones win) make of `from`; other options are left
/// for the caller.
fn apply(mut from: u64, opts: &[String]) -> u64 {
    for o in opts {
        if let Some((_, set, clear)) = FLAGS.iter().find(|(n, _, _)| n == o) {
            from = (from & !clear) | set;
        }
    }
    from
}

/// Remount `mnt` with the flags `opts` name, the others as they are. The FUSE
/// connection and the daemon stay; the volume's own options cannot change this way.
pub fn remount(mnt: &Path, opts: &[String]) -> Result<(), String> {
    let flags = apply(current(mnt)?, opts);
    nix::mount::mount(
        None::<&str>,
        mnt,
        None::<&str>,
        MsFlags::from_bits_retain(flags) | MsFlags::MS_REMOUNT,
        None::<&str>,
    )
    .map_err(|e| format!("remount of {} failed: {e}", mnt.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_flags_win_and_atime_modes_exclude_each_other() {
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let f = apply(libc::MS_RELATIME, &o(&["strictatime", "nodiratime", "ro"]));
        assert_eq!(
            f,
            libc::MS_STRICTATIME | libc::MS_NODIRATIME | libc::MS_RDONLY
        );
        let f = apply(f, &o(&["rw", "noatime", "state_dir=/x"]));
        assert_eq!(f, libc::MS_NOATIME | libc::MS_NODIRATIME);
        for name in EXTRA {
            assert!(FLAGS.iter().any(|(n, _, _)| n == name), "{name}");
        }
    }
}
