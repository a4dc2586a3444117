//! The two `/proc` formats more than one part of coherent reads, parsed in one place:
//! `/proc/self/mountinfo` (both binaries find mounts in it, identity its cgroup v2 mount,
//! the tests their FUSE mounts) and `/proc/PID/stat` (identity's process stamp, the
//! volume's liveness checks). Parsers take text, so they are tested without `/proc`.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One line of mountinfo: `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [TAGS...] - FSTYPE SRC
/// SUPEROPTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `MAJ:MIN` of the mounted filesystem (for FUSE, the minor is the connection id).
    pub major: u32,
    pub minor: u32,
    /// The path inside the mounted filesystem shown at the mount point (`/` unless a bind
    /// mount of a sub-tree).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub fstype: String,
    /// The mount source, unescaped: `coherent-mount` names its mounts `coherent:BACKING`,
    /// which is how `coherent run` finds the backing directory to fence off.
    pub source: OsString,
}

impl MountEntry {
    pub fn is_fuse(&self) -> bool {
        is_fuse(&self.fstype)
    }
}

/// `fuse`, `fuseblk` or `fuse.SUBTYPE`.
pub fn is_fuse(fstype: &str) -> bool {
    fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.")
}

/// Parse one mountinfo line (None if it is not one).
pub fn parse_mount_line(line: &str) -> Option<MountEntry> {
    let (head, tail) = line.split_once(" - ")?;
    let mut f = head.split(' ');
    let (major, minor) = f.nth(2)?.split_once(':')?;
    let (major, minor) = (major.parse().ok()?, minor.parse().ok()?);
    let root = unescape(f.next()?);
    let mount_point = unescape(f.next()?);
    let mut tail = tail.split(' ');
    let fstype = tail.next()?.to_string();
    let source = unescape(tail.next()?);
    Some(MountEntry {
        major,
        minor,
        root: PathBuf::from(root),
        mount_point: PathBuf::from(mount_point),
        fstype,
        source,
    })
}

/// Every mount in a mountinfo text, in mount order (later entries are on top).
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_mount_line).collect()
}

/// The mounts of this process's mount namespace.
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

/// The topmost mount exactly at `p` (no canonicalisation: pass the path as mounted).
pub fn mount_at(p: &Path) -> Option<MountEntry> {
    mounts()
        .ok()?
        .into_iter()
        .rev()
        .find(|m| m.mount_point == p)
}

/// Undo mountinfo's octal escapes of space, tab, newline and backslash (`\040`, ...).
fn unescape(s: &str) -> OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let digit = |k: usize| u32::from(b[i + k] - b'0');
            out.push((digit(1) * 64 + digit(2) * 8 + digit(3)) as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// The fields of `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) that coherent uses.
/// Fields a shorter line (an older kernel) lacks read as 0, except the start time, which a
/// stat line always has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z`, `X`, ...
    pub state: u8,
    /// Field 9 (`PF_*` flags).
    pub flags: u64,
    /// Field 20.
    pub num_threads: u64,
    /// Field 22: clock ticks since boot.
    pub start_time: u64,
    /// Field 28.
    pub start_stack: u64,
    /// Fields 50 and 51: the environment block.
    pub env_start: u64,
    pub env_end: u64,
}

/// `PF_EXITING` in [`ProcStat::flags`]: the task is in `do_exit`.
pub const PF_EXITING: u64 = 0x4;

impl ProcStat {
    /// A zombie (or dead) task; a zombie group leader may still have running threads.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x')
    }
}

/// Parse a stat line. `comm` (field 2) may hold spaces and `)`, so the fields are counted
/// from the *last* `)`. None when the line is not a stat line (no start time).
pub fn parse_stat(line: &[u8]) -> Option<ProcStat> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(line.get(close + 1..)?).ok()?;
    // Index i of this iterator is field i + 3.
    let mut fields = rest.split_ascii_whitespace();
    let mut st = ProcStat {
        state: fields.next()?.as_bytes().first().copied()?,
        ..ProcStat::default()
    };
    let mut seen_start = false;
    for (i, f) in fields.enumerate() {
        let field = i + 4;
        let slot = match field {
            9 => &mut st.flags,
            20 => &mut st.num_threads,
            22 => &mut st.start_time,
            28 => &mut st.start_stack,
            50 => &mut st.env_start,
            51 => &mut st.env_end,
            52.. => break,
            _ => continue,
        };
        *slot = f.parse().ok()?;
        seen_start |= field == 22;
    }
    seen_start.then_some(st)
}

/// Read and parse `/proc/PID/stat` (None: no such task, or unreadable).
pub fn read_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_with_comm(comm: &str) -> String {
        // 52 fields: pid (comm) state, then fields 4..=52 numbered by their position.
        let mut s = format!("4242 ({comm}) S");
        for field in 4..=52 {
            s.push_str(&format!(" {field}"));
        }
        s
    }

    #[test]
    fn stat_fields_counted_from_the_last_paren() {
        for comm in ["sleep", "a b", "x) S 1 2 (y", ")", "((", ") 99 99 99"] {
            let st = parse_stat(line_with_comm(comm).as_bytes()).unwrap();
            assert_eq!(st.state, b'S', "{comm}");
            assert_eq!(st.flags, 9, "{comm}");
            assert_eq!(st.num_threads, 20, "{comm}");
            assert_eq!(st.start_time, 22, "{comm}");
            assert_eq!(st.start_stack, 28, "{comm}");
            assert_eq!(st.env_start, 50, "{comm}");
            assert_eq!(st.env_end, 51, "{comm}");
        }
    }

    #[test]
    fn short_or_garbled_stat_lines() {
        // An older kernel without the env fields: start time still counts.
        let st = parse_stat(b"1 (init) S 0 1 1 0 -1 4194560 1 1 0 0 0 0 0 0 20 0 1 0 77").unwrap();
        assert_eq!((st.start_time, st.flags, st.env_start), (77, 4194560, 0));
        assert!(parse_stat(b"1 (init) S 0 1").is_none());
        assert!(parse_stat(b"no paren here").is_none());
        assert!(parse_stat(b"").is_none());
        assert!(parse_stat(line_with_comm("x").replace(" 22 ", " z ").as_bytes()).is_none());
    }

    #[test]
    fn own_stat_is_readable() {
        let st = read_stat(std::process::id()).unwrap();
        assert!(st.start_time > 0 && !st.is_zombie(), "{st:?}");
    }

    #[test]
    fn mountinfo_lines() {
        let m = parse_mount_line(
            "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
        )
        .unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(
            (m.fstype.as_str(), m.root.as_path()),
            ("cgroup2", Path::new("/"))
        );
        let m = parse_mount_line(
            "90 23 0:50 /sub /tmp/my\\040mnt\\134x rw,nosuid shared:1 - fuse.coherent c rw",
        )
        .unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/tmp/my mnt\\x"));
        assert_eq!(m.root, PathBuf::from("/sub"));
        assert_eq!((m.major, m.minor), (0, 50));
        assert!(m.is_fuse() && is_fuse("fuseblk") && !is_fuse("ext4"));
        assert_eq!(m.source, OsString::from("c"));
        assert!(parse_mount_line("garbage").is_none());
        // The source is unescaped like the paths; a line without one is not a mount line.
        let m =
            parse_mount_line("91 23 0:51 / /m rw - fuse coherent:/srv/my\\040repo rw,user_id=0")
                .unwrap();
        assert_eq!(m.source, OsString::from("coherent:/srv/my repo"));
        assert!(parse_mount_line("92 23 0:52 / /m rw - fuse").is_none());
        assert_eq!(unescape("a\\0"), OsString::from("a\\0"));
        assert_eq!(
            parse_mountinfo("garbage\n1 0 0:1 / / rw - ext4 /dev/sda rw\n").len(),
            1
        );
    }

    #[test]
    fn this_process_sees_its_root_mount() {
        assert!(mounts()
            .unwrap()
            .iter()
            .any(|m| m.mount_point == Path::new("/")));
    }
}

/// Lowers the calling thread (Linux: nice and I/O priority are per thread) to background
/// work: the lowest CPU priority and the idle I/O class, so that a request's work and the
/// tools' own I/O go first. Best effort: a failure leaves the priorities as they were.
pub fn background_thread() {
    // SAFETY: setpriority on the calling thread (who 0) with a plain integer.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_IDLE: libc::c_long = 3;
    // SAFETY: ioprio_set on the calling thread (who 0) with the idle class.
    unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            IOPRIO_CLASS_IDLE << 13,
        )
    };
}

#[cfg(test)]
mod background_tests {
    #[test]
    fn a_background_thread_gets_nice_19_and_the_idle_io_class() {
        std::thread::spawn(|| {
            super::background_thread();
            let tid = nix::unistd::gettid().as_raw();
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
            let rest = stat.rsplit_once(')').unwrap().1;
            // Field 19 (nice) is the 17th after the state.
            let nice: i64 = rest.split_whitespace().nth(16).unwrap().parse().unwrap();
            assert_eq!(nice, 19);
            // SAFETY: ioprio_get of the calling thread.
            let prio = unsafe { libc::syscall(libc::SYS_ioprio_get, 1, 0) };
            assert_eq!(prio >> 13, 3, "idle class");
        })
        .join()
        .unwrap();
    }
}
