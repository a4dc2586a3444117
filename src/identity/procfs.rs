//! The few `/proc` reads identity needs, and their parsers.
//!
//! A cold resolution opens `/proc/TID` once as a directory and reads everything relative
//! to that handle: if the task dies and its pid is reused meanwhile, the handle still
//! names the old task (reads fail), so the answer can never mix two processes.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// What identifies one process image behind a tid: its start time (field 22 of
/// `/proc/TID/stat`, clock ticks since boot) plus the addresses of its stack and
/// environment block (fields 28, 50, 51). Those move on every `execve` (ASLR; and the
/// environment size changes with its content), so a process that execs with another
/// environment (`exec env COHERENT_SESSION=b ...`) keeps its pid and start time but not its
/// stamp. They read as 0 when we may not ptrace the task; then only the start time counts.
/// They also read as 0 for a moment inside `execve`, before the new environment block is
/// set up (environ then reads empty): an answer cached in that window is keyed by that
/// transient stamp and so is replaced at the next lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProcStamp {
    pub start_time: u64,
    pub start_stack: u64,
    pub env_start: u64,
    pub env_end: u64,
}

/// The parsed fields of `/proc/TID/stat` that identity uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `D`, `Z`, `X`, ...
    pub state: u8,
    /// Field 20.
    pub num_threads: u64,
    pub stamp: ProcStamp,
}

impl Stat {
    /// True for a task that has exited and is only waiting to be reaped. A zombie thread
    /// group leader whose other threads still run counts as alive (`num_threads` > 1).
    pub fn is_dead(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x') && self.num_threads <= 1
    }
}

/// Parse a `/proc/TID/stat` line (the one parser is [`crate::sys::parse_stat`]).
pub fn parse_stat(line: &[u8]) -> Option<Stat> {
    crate::sys::parse_stat(line).map(|p| Stat {
        state: p.state,
        num_threads: p.num_threads,
        stamp: ProcStamp {
            start_time: p.start_time,
            start_stack: p.start_stack,
            env_start: p.env_start,
            env_end: p.env_end,
        },
    })
}

/// `/proc/TID/stat` fits in 1 KiB (comm is at most 64 bytes, then 50 numbers).
const STAT_BUF: usize = 1024;

fn path_for(tid: u32, file: &str) -> String {
    format!("/proc/{tid}/{file}")
}

/// Read and parse `/proc/TID/stat`: the one read a warm lookup makes.
pub fn read_stat(tid: u32) -> io::Result<Stat> {
    let mut f = File::open(path_for(tid, "stat")).map_err(gone_if_missing)?;
    stat_from(&mut f)
}

fn stat_from(f: &mut File) -> io::Result<Stat> {
    let mut buf = [0u8; STAT_BUF];
    let mut len = 0;
    loop {
        let n = f.read(&mut buf[len..]).map_err(gone_if_missing)?;
        len += n;
        // The line ends in '\n': stop there and save the read(2) that would return 0.
        if n == 0 || len == buf.len() || buf[len - 1] == b'\n' {
            break;
        }
    }
    parse_stat_buf(&buf[..len])
}

fn parse_stat_buf(line: &[u8]) -> io::Result<Stat> {
    parse_stat(line).ok_or_else(|| {
        if line.is_empty() {
            gone()
        } else {
            io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc stat line")
        }
    })
}

/// An open `/proc/TID/stat`, kept to validate cache hits with one `pread(2)` instead of
/// open + read + close (about half the cost). The open file is bound to the task it was
/// opened for, not to the number: once that task is gone, reads fail with ESRCH even if
/// its tid now belongs to a new process, so a successful read with an equal stamp proves
/// the tid is still the same process image.
#[derive(Debug)]
pub struct StatFile(File);

impl StatFile {
    pub fn open(tid: u32) -> io::Result<StatFile> {
        File::open(path_for(tid, "stat"))
            .map(StatFile)
            .map_err(gone_if_missing)
    }

    pub fn read(&self) -> io::Result<Stat> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; STAT_BUF];
        let mut len = 0;
        loop {
            let n = self
                .0
                .read_at(&mut buf[len..], len as u64)
                .map_err(gone_if_missing)?;
            len += n;
            if n == 0 || len == buf.len() || buf[len - 1] == b'\n' {
                break;
            }
        }
        parse_stat_buf(&buf[..len])
    }
}

/// The error of a task that no longer exists.
pub fn gone() -> io::Error {
    io::Error::from_raw_os_error(libc::ESRCH)
}

/// `/proc` answers ENOENT or ESRCH for a task that vanished; report both as ESRCH.
fn gone_if_missing(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::ENOENT) => gone(),
        _ => e,
    }
}

/// True when an error from these reads means "the task is gone".
pub fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ESRCH) | Some(libc::ENOENT))
}

/// A `/proc/TID` directory held open for a cold resolution.
pub struct TaskDir {
    fd: OwnedFd,
}

impl TaskDir {
    /// Open `/proc/TID`. Works for any thread id, listed in `/proc` or not.
    pub fn open(tid: u32) -> io::Result<TaskDir> {
        let path = std::ffi::CString::new(format!("/proc/{tid}")).expect("no NUL in a number");
        // SAFETY: plain open(2) of a NUL-terminated path; the fd is owned below.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(gone_if_missing(io::Error::last_os_error()));
        }
        Ok(TaskDir {
            // SAFETY: fd is a fresh descriptor nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn open_file(&self, name: &CStr) -> io::Result<File> {
        // SAFETY: openat(2) relative to a directory fd we own; the result is owned below.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(gone_if_missing(io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    pub fn stat(&self) -> io::Result<Stat> {
        stat_from(&mut self.open_file(c"stat")?)
    }

    /// `stat` of this very task, held open (see [`StatFile`]).
    pub fn stat_file(&self) -> io::Result<StatFile> {
        self.open_file(c"stat").map(StatFile)
    }

    fn read_all(&self, name: &CStr, cap: usize) -> io::Result<Vec<u8>> {
        let mut buf = Vec::with_capacity(cap);
        self.open_file(name)?
            .read_to_end(&mut buf)
            .map_err(gone_if_missing)?;
        Ok(buf)
    }

    /// The cgroup v2 path (the `0::` line of `/proc/TID/cgroup`), if any.
    pub fn cgroup_v2_path(&self) -> io::Result<Option<String>> {
        let text = self.read_all(c"cgroup", 256)?;
        Ok(parse_cgroup_v2(&text).map(str::to_owned))
    }

    /// The raw NUL-separated environment of the task's process (`/proc/TID/environ`).
    /// Empty for a zombie or a kernel thread.
    pub fn environ(&self) -> io::Result<Vec<u8>> {
        self.read_all(c"environ", 8192)
    }

    /// `Tgid:` and the effective uid (second field of `Uid:`) from `/proc/TID/status`.
    pub fn tgid_and_euid(&self) -> io::Result<(u32, u32)> {
        let text = self.read_all(c"status", 2048)?;
        parse_status(&text)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc status"))
    }
}

/// The path of the `0::` line of a `/proc/PID/cgroup` file.
pub fn parse_cgroup_v2(text: &[u8]) -> Option<&str> {
    text.split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"0::"))
        .and_then(|p| std::str::from_utf8(p).ok())
}

/// `(Tgid, effective uid)` from a `/proc/PID/status` text.
pub fn parse_status(text: &[u8]) -> Option<(u32, u32)> {
    let text = std::str::from_utf8(text).ok()?;
    let mut tgid = None;
    let mut euid = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Tgid:") {
            tgid = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("Uid:") {
            euid = v
                .split_ascii_whitespace()
                .nth(1)
                .and_then(|u| u.parse().ok());
        }
        if tgid.is_some() && euid.is_some() {
            break;
        }
    }
    Some((tgid?, euid?))
}

/// The value of each of `vars` in a NUL-separated environment block, by position in
/// `vars`. The first occurrence of a name wins, as with `getenv(3)`.
pub fn env_values<'a, S: AsRef<str>>(environ: &'a [u8], vars: &[S]) -> Vec<Option<&'a [u8]>> {
    let mut found = vec![None; vars.len()];
    for entry in environ.split(|&b| b == 0) {
        let Some(eq) = entry.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (&entry[..eq], &entry[eq + 1..]);
        for (slot, var) in found.iter_mut().zip(vars) {
            if slot.is_none() && name == var.as_ref().as_bytes() {
                *slot = Some(value);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_stat_is_readable_and_stable() {
        let me = std::process::id();
        let a = read_stat(me).unwrap();
        let b = TaskDir::open(me).unwrap().stat().unwrap();
        assert_eq!(a.stamp, b.stamp);
        let held = StatFile::open(me).unwrap();
        assert_eq!(held.read().unwrap().stamp, a.stamp);
        assert_eq!(held.read().unwrap().stamp, a.stamp);
        assert!(a.stamp.start_time > 0);
        assert!(!a.is_dead());
    }

    #[test]
    fn cgroup_and_status_parsers() {
        let cg = b"12:pids:/x\n1:name=systemd:/\n0::/a/coherent-session-b/c\n";
        assert_eq!(parse_cgroup_v2(cg), Some("/a/coherent-session-b/c"));
        assert_eq!(parse_cgroup_v2(b"1:cpu:/\n"), None);
        let st = b"Name:\tx\nTgid:\t17\nPid:\t18\nUid:\t1000\t1001\t1001\t1001\n";
        assert_eq!(parse_status(st), Some((17, 1001)));
    }

    #[test]
    fn env_values_in_configured_order_first_occurrence() {
        let env = b"A=1\0B=\0C=3=4\0A=9\0noeq\0";
        let got = env_values(env, &["C", "A", "B", "D"]);
        assert_eq!(
            got,
            vec![Some(&b"3=4"[..]), Some(&b"1"[..]), Some(&b""[..]), None]
        );
    }
}
