//! Fail closed (docs/design.md#sessions) on a real mount: what only the kernel shows, that
//! a process outside the daemon's pid namespace reaches it as a caller it cannot resolve
//! (refused on a path with a live record as `unresolved`, never admitted as `uid:0`), and
//! one inside resolves. What such a caller may and may not do, route by route, is decided in
//! process: tests/nomount/inproc_unresolved.rs.
//!
//! How resolution really fails here: the daemon runs in its own pid namespace (`unshare
//! --pid --fork --mount-proc`), so the kernel sends pid 0 for a caller outside it (the
//! test's own processes): no /proc entry the daemon can read. The mount propagates back to
//! the test's mount namespace through a shared bind mount of the temp dir. Sessions inside
//! the daemon's namespaces (`nsenter --pid --mount`) resolve as usual: they set up the
//! handoff.

use crate::coherent;
use crate::common;

use coherent::{Run, CLI};
use common::{lazy_umount, spawn_mounted, wait_child, BIN};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

fn run(cmd: &mut Command) -> Run {
    let o = common::run_timeout(cmd, Duration::from_secs(30));
    Run {
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn must(cmd: &mut Command) {
    let r = run(cmd);
    assert!(r.ok(), "{cmd:?}: {}", r.show());
}

/// A daemon in its own pid and mount namespaces, its mount visible here.
struct NsMount {
    top: PathBuf,
    mnt: PathBuf,
    backing: PathBuf,
    unshare: Child,
    daemon: u32,
    _dir: tempfile::TempDir,
}

impl NsMount {
    fn start() -> NsMount {
        let dir = tempfile::Builder::new()
            .prefix("coherent-ns-")
            .tempdir()
            .unwrap();
        let top = dir.path().canonicalize().unwrap().join("top");
        std::fs::create_dir(&top).unwrap();
        // A shared mount, so the FUSE mount made in the daemon's namespace shows here.
        must(Command::new("mount").args(["--bind"]).arg(&top).arg(&top));
        must(Command::new("mount").arg("--make-shared").arg(&top));
        let (backing, mnt, state) = (top.join("b"), top.join("m"), top.join("st"));
        for d in [&backing, &mnt] {
            std::fs::create_dir(d).unwrap();
        }
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--propagation",
            "unchanged",
            BIN,
        ])
        .arg(&backing)
        .arg(&mnt)
        .arg("--state-dir")
        .arg(&state);
        let unshare = spawn_mounted(cmd, &mnt, &dir.path().join("daemon.log"));
        let children = format!("/proc/{0}/task/{0}/children", unshare.id());
        let daemon: u32 = std::fs::read_to_string(&children)
            .unwrap()
            .split_whitespace()
            .next()
            .expect("unshare has the daemon as its child")
            .parse()
            .unwrap();
        NsMount {
            top,
            mnt,
            backing,
            unshare,
            daemon,
            _dir: dir,
        }
    }

    /// `sh -c CMD` in the mount root as `who`, inside the daemon's namespaces.
    fn inside(&self, who: &str, cmd: &str) -> Run {
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(self.daemon.to_string())
            .args(["--pid", "--mount", "--", "sh", "-c"])
            .arg(format!("cd '{}' && {cmd}", self.mnt.display()))
            .env("COHERENT_SESSION", who);
        run(&mut c)
    }

    /// `sh -c CMD` in the mount root as `who`, from here (pid 0 to the daemon).
    fn outside(&self, who: &str, cmd: &str) -> Run {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(cmd)
            .current_dir(&self.mnt)
            .env("COHERENT_SESSION", who);
        run(&mut c)
    }

    fn events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.mnt.join(".coherent/events"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for NsMount {
    fn drop(&mut self) {
        // SAFETY: a signal to the daemon this test started (a SIGTERM unmounts cleanly).
        unsafe { libc::kill(self.daemon as i32, libc::SIGTERM) };
        if wait_child(&mut self.unshare, Duration::from_secs(10)).is_none() {
            let _ = self.unshare.kill();
            let _ = self.unshare.wait();
        }
        if common::is_mounted(&self.mnt) {
            lazy_umount(&self.mnt);
        }
        let _ = Command::new("umount").arg(&self.top).status();
    }
}

fn backing_text(m: &NsMount, rel: &str) -> String {
    std::fs::read_to_string(m.backing.join(rel)).unwrap()
}

fn in_session(m: &NsMount, who: &str, cmd: &str) {
    let r = m.inside(who, cmd);
    assert!(
        r.ok(),
        "{who} `{cmd}` in the daemon's namespace: {}",
        r.show()
    );
}

#[test]
fn a_caller_outside_the_daemons_pid_namespace_is_unresolved() {
    let m = NsMount::start();
    in_session(&m, "bob", &format!("{CLI} register"));
    in_session(&m, "alice", "echo plan > plan.md && echo o > other.md");
    in_session(&m, "alice", &format!("{CLI} transfer --to bob plan.md"));
    // The daemon cannot tell who this is (pid 0): the handed path is refused, as unresolved.
    let r = m.outside("alice", "printf x >> plan.md");
    assert!(
        r.denied(),
        "an unresolvable append was admitted: {}",
        r.show()
    );
    assert_eq!(backing_text(&m, "plan.md"), "plan\n");
    // Other writes go on.
    let r = m.outside("alice", "echo more >> other.md");
    assert!(r.ok(), "{}", r.show());
    assert_eq!(backing_text(&m, "other.md"), "o\nmore\n");
    // Inside, alice resolves and is fenced as herself.
    let r = m.inside("alice", "printf x >> plan.md");
    assert!(r.denied(), "{}", r.show());
    let denied: Vec<_> = m
        .events()
        .into_iter()
        .filter(|e| e["event"] == "denied" && e["path"] == "plan.md")
        .collect();
    let got: Vec<_> = denied
        .iter()
        .map(|d| (d["session"].as_str(), d["reason"].as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (Some("uid:0"), Some("unresolved")),
            (Some("alice"), Some("fenced"))
        ],
        "{denied:?}"
    );
}
