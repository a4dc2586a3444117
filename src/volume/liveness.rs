//! Is a session still running, and does a process still hold a file open? Both read
//! `/proc`, so both are only called off the hot path: on the release of a write handle
//! that changed nothing (reclaim or release?) and on a transfer refused `handoff_in_flight`.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use crate::identity::Resolver;

// `PF_EXITING` (field 9 of `/proc/PID/stat`): the task is in `do_exit`. A killed process
// closes its files there, so its last RELEASE arrives while it still looks running
// (state `R`/`D`), before it turns into a zombie.
use crate::sys::{ProcStat, PF_EXITING};

/// The fields of `/proc/PID/stat` that decide whether a task still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskState {
    pub state: u8,
    pub flags: u64,
    pub num_threads: u64,
    pub start_time: u64,
}

impl TaskState {
    fn of(p: ProcStat) -> TaskState {
        TaskState {
            state: p.state,
            flags: p.flags,
            num_threads: p.num_threads,
            start_time: p.start_time,
        }
    }

    /// Parse a stat line (with the one parser, [`crate::sys::parse_stat`]).
    pub fn parse(line: &[u8]) -> Option<TaskState> {
        crate::sys::parse_stat(line).map(TaskState::of)
    }

    /// Read `/proc/PID/stat` (None: no such task).
    pub fn read(pid: u32) -> Option<TaskState> {
        crate::sys::read_stat(pid).map(TaskState::of)
    }

    /// Still running: not a zombie (unless other threads of its group run) and not
    /// exiting. A zombie leader with live threads keeps `PF_EXITING` but runs on.
    pub fn running(&self) -> bool {
        let zombie = matches!(self.state, b'Z' | b'X' | b'x');
        if zombie {
            return self.num_threads > 1;
        }
        self.flags & PF_EXITING == 0
    }
}

/// How long a FLUSH waits for the closer's `/proc/PID/stat` (see [`closer_runs`]).
pub const FLUSH_PROC_WAIT: Duration = Duration::from_millis(250);

/// Is task `pid` running (not exiting), asked from a FUSE request it is waiting on? The
/// read happens on a thread of its own, and the answer is waited for at most `wait`: an
/// exiting task can hold up the read until the request is answered, and no answer counts
/// as not running (what an exiting task would have said).
pub fn closer_runs(pid: u32, wait: Duration) -> bool {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("closer-stat".into())
        .spawn(move || {
            let _ = tx.send(TaskState::read(pid).is_some_and(|t| t.running()));
        });
    spawned.is_ok() && rx.recv_timeout(wait).unwrap_or(false)
}

/// Does any process of session `name` still run? First the processes the identity cache
/// knows for it (one stat read each), then, only if none of them runs, every process in
/// `/proc` (a stat read each, and a cached resolution of the running ones).
pub fn session_running(resolver: &Resolver, name: &str) -> bool {
    for (_, e) in resolver.cache().entries_of(name) {
        let (tgid, start) = e.owner;
        if TaskState::read(tgid).is_some_and(|t| t.start_time == start && t.running()) {
            return true;
        }
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true; // cannot tell: never reclaim on a guess
    };
    dir.filter_map(|d| d.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| {
            TaskState::read(pid).is_some_and(|t| t.running())
                && resolver.resolve(pid).is_ok_and(|s| s.name == name)
        })
}

/// Does task `pid` (still running) have a descriptor open on `target` (a path as the
/// kernel names it in `/proc/PID/fd`)? Reads the links only: no request reaches the mount.
pub fn holds_open(pid: u32, target: &Path) -> bool {
    if pid == 0 || !TaskState::read(pid).is_some_and(|t| t.running()) {
        return false;
    }
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    dir.filter_map(|d| d.ok())
        .any(|d| std::fs::read_link(d.path()).is_ok_and(|l| l == target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_after_the_last_paren() {
        let line = b"42 (a) b) c) S 1 42 42 0 -1 4194564 100 0 0 0 1 2 0 0 20 0 3 0 777 1 2 3\n";
        let t = TaskState::parse(line).unwrap();
        assert_eq!(t.state, b'S');
        assert_eq!(t.flags, 4194564);
        assert_eq!(t.num_threads, 3);
        assert_eq!(t.start_time, 777);
        assert!(t.flags & PF_EXITING != 0);
        assert!(!t.running());
    }

    #[test]
    fn this_process_runs_and_holds_its_own_files() {
        let me = std::process::id();
        let t = TaskState::read(me).unwrap();
        assert!(t.running(), "{t:?}");
        let f = tempfile::NamedTempFile::new().unwrap();
        assert!(holds_open(me, f.path()));
        assert!(!holds_open(me, Path::new("/nonexistent/x")));
    }

    #[test]
    fn a_running_closer_is_told_from_a_gone_one() {
        assert!(closer_runs(std::process::id(), Duration::from_secs(5)));
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(!closer_runs(pid, Duration::from_secs(5)));
    }

    #[test]
    fn a_reaped_child_does_not_run() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(!TaskState::read(pid).is_some_and(|t| t.running()));
    }
}
