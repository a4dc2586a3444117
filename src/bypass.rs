//! Processes that would bypass an in-place mount (docs/design.md#mounting): a process whose working
//! directory, root directory or an open file is inside the directory before it is mounted
//! over keeps reaching the files underneath, not the volume, until it re-enters the
//! directory (`cd` again, reopen). The mount cannot change that; it warns, one line per
//! process.

use std::fmt;
use std::path::{Path, PathBuf};

/// One process with something inside the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bypasser {
    pub pid: u32,
    /// `/proc/PID/comm`.
    pub comm: String,
    /// Its working directory is inside.
    pub cwd: bool,
    /// Its root directory is inside (a chroot there).
    pub root: bool,
    /// Its open descriptors inside, as (fd, path) (the first few).
    pub files: Vec<(u32, PathBuf)>,
    /// How many descriptors inside in all.
    pub n_files: usize,
}

/// At most this many descriptors are named per process (the count says the rest).
const NAMED_FILES: usize = 3;

/// Is `p` the directory `dir` or under it? (`/a/bc` is not under `/a/b`.) A deleted
/// file's link reads `PATH (deleted)`, still under it.
pub fn is_inside(p: &Path, dir: &Path) -> bool {
    p.starts_with(dir)
}

/// Every process but `except` (the daemon itself) with its cwd, root or an open file
/// inside `dir` (an absolute, canonical path). Processes that vanish meanwhile or whose
/// `/proc` entries cannot be read are skipped.
pub fn processes_inside(dir: &Path, except: u32) -> Vec<Bypasser> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<Bypasser> = procs
        .filter_map(|d| d.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != except)
        .filter_map(|pid| inspect(pid, dir))
        .collect();
    out.sort_by_key(|b| b.pid);
    out
}

fn inspect(pid: u32, dir: &Path) -> Option<Bypasser> {
    let base = PathBuf::from(format!("/proc/{pid}"));
    let link_inside =
        |name: &str| std::fs::read_link(base.join(name)).is_ok_and(|l| is_inside(&l, dir));
    let (cwd, root) = (link_inside("cwd"), link_inside("root"));
    let mut files = Vec::new();
    let mut n_files = 0;
    if let Ok(fds) = std::fs::read_dir(base.join("fd")) {
        for d in fds.filter_map(|d| d.ok()) {
            let Ok(l) = std::fs::read_link(d.path()) else {
                continue;
            };
            if !is_inside(&l, dir) {
                continue;
            }
            n_files += 1;
            if files.len() < NAMED_FILES {
                let fd = d.file_name().to_str().and_then(|s| s.parse().ok());
                files.push((fd.unwrap_or(0), l));
            }
        }
    }
    if !cwd && !root && n_files == 0 {
        return None;
    }
    files.sort();
    let comm = std::fs::read_to_string(base.join("comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default();
    Some(Bypasser {
        pid,
        comm,
        cwd,
        root,
        files,
        n_files,
    })
}

impl fmt::Display for Bypasser {
    /// One warning line: who, what is inside, and what it means.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut what = Vec::new();
        if self.cwd {
            what.push("its working directory".to_string());
        }
        if self.root {
            what.push("its root directory".to_string());
        }
        if self.n_files > 0 {
            let names: Vec<String> = self
                .files
                .iter()
                .map(|(fd, p)| format!("fd {fd} {}", p.display()))
                .collect();
            let more = self.n_files - self.files.len();
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            what.push(format!(
                "{} open file{} ({}{more})",
                self.n_files,
                if self.n_files == 1 { "" } else { "s" },
                names.join(", ")
            ));
        }
        write!(
            f,
            "process {} ({}) has {} inside the directory: it reaches the files underneath, \
             not the volume, until it re-enters the directory (its writes are seen as \
             external changes)",
            self.pid,
            self.comm,
            what.join(" and ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    #[test]
    fn inside_is_by_component() {
        let d = Path::new("/w/dir");
        assert!(is_inside(Path::new("/w/dir"), d));
        assert!(is_inside(Path::new("/w/dir/a/b"), d));
        assert!(is_inside(Path::new("/w/dir/x (deleted)"), d));
        assert!(!is_inside(Path::new("/w/dir2/a"), d));
        assert!(!is_inside(Path::new("/w"), d));
        assert!(!is_inside(Path::new("socket:[123]"), d));
    }

    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn spawn(cwd: &Path, script: &str) -> Kill {
        let c = Command::new("sh")
            .args(["-c", script])
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Kill(c)
    }

    /// Wait for the child to say it is ready (a line on stdout), not a sleep.
    fn ready(k: &mut Kill) {
        use std::io::BufRead;
        let mut line = String::new();
        let out = k.0.stdout.as_mut().unwrap();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
    }

    #[test]
    fn finds_cwd_and_open_files_not_neighbours() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        let dir = base.join("dir");
        let sub = dir.join("sub");
        let dir2 = base.join("dir2");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::create_dir_all(&dir2).unwrap();
        std::fs::write(dir.join("f"), "x").unwrap();
        // `exec sleep` keeps the pid, the cwd and fd 3.
        let mut in_cwd = spawn(&sub, "echo ready; exec sleep 600");
        let mut with_fd = spawn(&base, "exec 3>>dir/f; echo ready; exec sleep 600");
        let mut next_door = spawn(&dir2, "echo ready; exec sleep 600");
        for k in [&mut in_cwd, &mut with_fd, &mut next_door] {
            ready(k);
        }
        let found = processes_inside(&dir, std::process::id());
        let by_pid = |pid: u32| found.iter().find(|b| b.pid == pid);
        let a = by_pid(in_cwd.0.id()).expect("the process working in dir/sub");
        assert!(a.cwd && !a.root && a.n_files == 0, "{a:?}");
        let b = by_pid(with_fd.0.id()).expect("the process with dir/f open");
        assert!(!b.cwd && b.n_files == 1, "{b:?}");
        assert_eq!(b.files, vec![(3, dir.join("f"))]);
        assert!(by_pid(next_door.0.id()).is_none(), "{found:?}");
        let line = b.to_string();
        // The name is the shell's or, once it has exec'd, sleep's: "ready" comes first.
        assert!(line.contains(&format!("process {} (", b.pid)), "{line}");
        assert!(line.contains("1 open file (fd 3 "), "{line}");
        assert!(a.to_string().contains("its working directory"), "{a}");
        // The caller itself is left out.
        let me = spawn(&dir, "echo ready; exec sleep 600");
        let mut me = me;
        ready(&mut me);
        assert!(processes_inside(&dir, me.0.id())
            .iter()
            .all(|b| b.pid != me.0.id()));
    }
}
