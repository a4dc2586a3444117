//! Issue 20, item 7: `coherent run` closes the way around the mount with a Landlock
//! ruleset. A giver it starts cannot write the backing directory by any route (a path
//! into it, a `cd` into it, an old working directory inside an in-place mount's
//! directory), while normal agent work in the mount (git, editors' temporary files) runs.
//! Needs a kernel with Landlock (ABI >= 3); on one without, the tests say so and pass
//! only the parts that do not depend on it.

use crate::coherent;
use crate::common;

use coherent::*;
use common::{lazy_umount, spawn_mounted, wait_child, wait_until, BIN, TIMEOUT};
use std::path::Path;
use std::process::{Child, Command};

/// The kernel's Landlock ABI (0: none).
fn landlock_abi() -> i64 {
    // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    unsafe { libc::syscall(444, std::ptr::null::<u8>(), 0usize, 1u32) }.max(0)
}

/// Does this kernel enforce Landlock ABI >= 3?
fn landlock() -> bool {
    landlock_abi() >= 3
}

/// `coherent run --session NAME [ARGS] -- sh -c CMD` in `dir`, with `writable` as the
/// scratch list (COHERENT_RUN_WRITABLE).
fn run(dir: &Path, writable: &str, args: &[&str], cmd: &str) -> Run {
    let mut c = Command::new(CLI);
    c.arg("run")
        .args(["--session", "alice"])
        .args(args)
        .args(["--", "sh", "-c", cmd]);
    run_in(dir, &[("COHERENT_RUN_WRITABLE", writable)], &mut c)
}

/// A scratch directory outside the test's temporary directories (which hold the backing
/// directories).
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("coherent-scratch-")
        .tempdir_in("/var/tmp")
        .unwrap()
}

#[test]
fn a_session_cannot_write_the_backing_directory_by_any_route() {
    if !landlock() {
        eprintln!("SKIP: this kernel has no Landlock ABI >= 3");
        return;
    }
    let m = mount(true);
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && mkdir d && echo x > d/x",
    );
    let s = scratch();
    let b = m.backing.display().to_string();
    let routes = [
        format!("echo evil >> {b}/plan.md"),
        format!("echo evil > {b}/new.md"),
        format!("truncate -s 0 {b}/plan.md"),
        format!("rm {b}/d/x"),
        format!("mv {b}/plan.md {b}/moved.md"),
        format!("ln {b}/plan.md {b}/linked.md"),
        format!("mkdir {b}/newdir"),
        format!("cd {b} && touch t.md"),
        format!("cd {b}/d && echo evil > ../plan.md"),
        format!("python3 -c \"open('{b}/plan.md','a').write('evil')\""),
    ];
    for r in &routes {
        let out = run(m.root(), &s.path().display().to_string(), &[], r);
        assert!(
            !out.ok(),
            "`{r}` wrote the backing directory: {}",
            out.show()
        );
        assert!(
            out.err.contains("Permission denied") || out.err.contains("PermissionError"),
            "`{r}`: {}",
            out.show()
        );
    }
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\n"
    );
    let mut names: Vec<_> = std::fs::read_dir(&m.backing)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["d", "plan.md"]);
    // Without the ruleset the same write goes through (the hole this closes).
    let out = run(
        m.root(),
        "",
        &["--no-landlock"],
        &format!("echo more >> {b}/plan.md"),
    );
    assert!(out.ok(), "{}", out.show());
}

#[test]
fn normal_agent_work_in_the_mount_still_runs() {
    if !landlock() {
        eprintln!("SKIP: this kernel has no Landlock ABI >= 3");
        return;
    }
    let m = mount(true);
    let s = scratch();
    let sp = s.path().display().to_string();
    let work = format!(
        "set -e; export TMPDIR={sp} HOME={sp}; \
         echo 'hello' > notes.md; sed -i s/hello/hi/ notes.md; \
         git init -q .; git add -A; \
         git -c user.email=a@b -c user.name=a commit -qm first; \
         t=$(mktemp); echo scratch > $t; cat $t >/dev/null; \
         t2=$(mktemp -p .); echo swap > $t2; mv $t2 notes.md.swp; rm notes.md.swp; \
         echo >/dev/null; git log --oneline | grep -q first; echo done"
    );
    let out = run(m.root(), &sp, &["-v"], &work);
    assert!(out.ok() && out.out.contains("done"), "{}", out.show());
    assert!(out.err.contains("(Landlock)"), "{}", out.show());
    assert_eq!(std::fs::read_to_string(m.path("notes.md")).unwrap(), "hi\n");
    // ... and the writes went through the volume: notes.md has versions.
    assert!(version(&m, "notes.md").is_some_and(|v| v >= 2));
}

#[test]
fn a_writable_place_holding_the_backing_directory_is_refused_by_name() {
    let m = mount(true);
    let base = m.backing.parent().unwrap().display().to_string();
    let out = run(m.root(), &format!("/var/tmp:{base}"), &[], "echo started");
    assert_eq!(out.code, Some(2), "{}", out.show());
    assert!(!out.out.contains("started"), "{}", out.show());
    assert!(
        out.err.contains(&format!("the writable place {base} ")),
        "names the entry: {}",
        out.show()
    );
    // Also through --allow-write.
    let out = run(m.root(), "", &["--allow-write", &base], "echo started");
    assert_eq!(out.code, Some(2), "{}", out.show());
}

/// An in-place mount over a directory; a process already inside keeps its working
/// directory in the directory under the mount.
struct InPlace {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl InPlace {
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for InPlace {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            if wait_child(&mut c, TIMEOUT).is_none() {
                lazy_umount(self.dir.path());
            }
        }
        wait_until(TIMEOUT, || common::mount_fstype(self.dir.path()).is_none());
    }
}

/// A shell started in `dir` before it is mounted over: on a line on its stdin it runs
/// `coherent run ARGS -- sh -c CMD` from its old working directory (the directory under
/// the mount), as a user's terminal left open there would.
fn old_shell(dir: &Path, writable: &str, args: &str, cmd: &str) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "read go; exec \"$0\" run --session alice {args} -- sh -c '{cmd}'"
        ))
        .arg(CLI)
        .current_dir(dir)
        .env("COHERENT_RUN_WRITABLE", writable)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn go(mut c: Child) -> Run {
    use std::io::Write;
    c.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let o = c.wait_with_output().unwrap();
    Run {
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

#[test]
fn an_old_working_directory_inside_an_in_place_mount_is_closed_too() {
    if !landlock() {
        eprintln!("SKIP: this kernel has no Landlock ABI >= 3");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("coherent-inplace-")
        .tempdir()
        .unwrap();
    std::fs::write(dir.path().join("plan.md"), "plan\n").unwrap();
    let s = scratch();
    let sp = s.path().display().to_string();
    let sandboxed = old_shell(dir.path(), &sp, "", "echo evil >> plan.md && echo wrote");
    let bare = old_shell(
        dir.path(),
        "",
        "--no-landlock",
        "echo around >> plan.md && echo wrote",
    );
    let log = s.path().join("daemon.log");
    let mut cmd = Command::new(BIN);
    cmd.arg(dir.path())
        .arg("--state-dir")
        .arg(s.path().join("state"));
    let child = spawn_mounted(cmd, dir.path(), &log);
    let ip = InPlace {
        dir,
        child: Some(child),
    };
    let out = go(sandboxed);
    assert!(
        !out.out.contains("wrote"),
        "wrote under the mount: {}",
        out.show()
    );
    assert!(out.err.contains("Permission denied"), "{}", out.show());
    assert_eq!(
        std::fs::read_to_string(ip.path().join("plan.md")).unwrap(),
        "plan\n"
    );
    // Without the ruleset the old directory is a way around the volume.
    let out = go(bare);
    assert!(out.out.contains("wrote"), "{}", out.show());
    assert_eq!(
        std::fs::read_to_string(ip.path().join("plan.md")).unwrap(),
        "plan\naround\n"
    );
    // From the mount itself, writes go through the volume.
    let out = run(ip.path(), &sp, &[], "echo ok >> plan.md");
    assert!(out.ok(), "{}", out.show());
    drop(ip);
}

#[test]
fn outside_a_volume_nothing_is_restricted_and_it_says_so() {
    let d = scratch();
    let out = run(d.path(), "", &["-v"], "echo x > f && echo wrote");
    assert!(out.ok() && out.out.contains("wrote"), "{}", out.show());
    assert!(
        out.err.contains("not inside a coherent volume"),
        "{}",
        out.show()
    );
}

/// A process started outside any `coherent run`, killed at the end of the test.
struct Outside(Child);

impl Outside {
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A helper of the same user outside the session: it listens on the abstract unix socket
/// `name` and appends whatever a client sends to `target` (as a tmux server's `run-shell`
/// would), answering `done`.
fn abstract_writer(name: &str, target: &Path) -> Outside {
    use std::io::BufRead;
    let mut c = python()
        .arg("-c")
        .arg(
            "import socket,sys\n\
             s=socket.socket(socket.AF_UNIX); s.bind('\\0'+sys.argv[1]); s.listen(4)\n\
             print('ready', flush=True)\n\
             while True:\n\
             \x20   c,_=s.accept(); d=c.recv(100)\n\
             \x20   open(sys.argv[2],'a').write(d.decode()); c.send(b'done'); c.close()\n",
        )
        .arg(name)
        .arg(target)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    Outside(c)
}

/// Connects to the abstract socket `name`, sends `evil`, prints the answer or `errno N`.
fn abstract_client(name: &str) -> String {
    format!(
        "python3 -c \"import socket\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect('\\0{name}'); \
         s.send(b'evil'); print('answer', s.recv(9).decode())\nexcept OSError as e:\n \
         print('errno', e.errno)\""
    )
}

/// Issue 29, item 3: a helper of the same user started outside `coherent run` and
/// listening on an abstract unix socket cannot be asked to write the backing directory,
/// and no process outside the session can be signalled (Landlock ABI 6 scoping).
#[test]
fn a_session_cannot_reach_a_helper_outside_it_by_abstract_socket_or_signal() {
    if landlock_abi() < 6 {
        eprintln!("SKIP: this kernel has no Landlock ABI >= 6 (IPC scoping)");
        return;
    }
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    let s = scratch();
    let sp = s.path().display().to_string();
    let name = unique("coherent-ipc");
    let _helper = abstract_writer(&name, &m.backing.join("plan.md"));
    let out = run(m.root(), &sp, &["-v"], &abstract_client(&name));
    assert!(
        out.out.contains(&format!("errno {}", libc::EPERM)),
        "the abstract socket outside was reached: {}",
        out.show()
    );
    assert!(
        out.err
            .contains("no abstract unix socket or signal reaches outside"),
        "{}",
        out.show()
    );
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\n"
    );
    // A signal to a process outside: refused, and it lives on.
    let mut sleeper = Outside(Command::new("sleep").arg("600").spawn().unwrap());
    let pid = sleeper.pid();
    let out = run(
        m.root(),
        &sp,
        &[],
        &format!("kill -TERM {pid} 2>&1; echo status=$?"),
    );
    assert!(
        out.out.contains("Operation not permitted") && !out.out.contains("status=0"),
        "{}",
        out.show()
    );
    assert!(sleeper.alive(), "the signal reached {pid}: {}", out.show());
    // Inside the session, its own processes still talk and signal each other.
    let out = run(
        m.root(),
        &sp,
        &[],
        "sleep 600 & p=$!; kill -TERM $p && wait $p; echo status=$?",
    );
    assert!(out.out.contains("status=143"), "{}", out.show());
    // Without the ruleset both reach outside (the hole this closes).
    let out = run(m.root(), "", &["--no-landlock"], &abstract_client(&name));
    assert!(out.out.contains("answer done"), "{}", out.show());
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\nevil"
    );
    let out = run(m.root(), "", &["--no-landlock"], &format!("kill -0 {pid}"));
    assert!(out.ok(), "{}", out.show());
}

/// What the ruleset does not close, pinned so docs/sessions.md stays true: Landlock before
/// ABI 9 does not check `connect` to a pathname unix socket, so a tmux server of the same
/// user started outside, on a socket outside the mount, still runs a command for the
/// session. If this starts failing, the kernel closed it: update docs/sessions.md.
#[test]
fn a_pathname_socket_outside_is_still_reachable_as_documented() {
    if !landlock() {
        eprintln!("SKIP: this kernel has no Landlock ABI >= 3");
        return;
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        panic!("tmux is not installed (apt-get install tmux): this test needs a real tmux");
    }
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    let s = scratch();
    let sp = s.path().display().to_string();
    let sock = s.path().join("tmux.sock");
    let sock_s = sock.display().to_string();
    let started = Command::new("tmux")
        .args(["-S", &sock_s, "new-session", "-d", "sleep 600"])
        .status()
        .unwrap();
    assert!(started.success());
    struct Server(String);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = Command::new("tmux")
                .args(["-S", &self.0, "kill-server"])
                .status();
        }
    }
    let _server = Server(sock_s.clone());
    let b = m.backing.display().to_string();
    let out = run(
        m.root(),
        &sp,
        &[],
        &format!("tmux -S {sock_s} run-shell 'echo tmux >> {b}/plan.md'"),
    );
    assert!(out.ok(), "{}", out.show());
    let abi = landlock_abi();
    let text = std::fs::read_to_string(m.path("plan.md")).unwrap();
    assert_eq!(
        text,
        "plan\ntmux\n",
        "on Landlock ABI {abi} a pathname socket is {}: update docs/sessions.md",
        if text == "plan\n" { "closed" } else { "open" }
    );
}

/// Issue 38, item 9: a checkout under /tmp. The backing directory lies under /tmp (as every
/// test mount's does), and /tmp is a default scratch place: `coherent run` no longer
/// refuses, it leaves /tmp out and gives the session a temporary directory of its own
/// (TMPDIR), so `mktemp` works, the mount is written, and the backing directory is not.
#[test]
fn a_backing_directory_under_tmp_gets_the_session_its_own_tmpdir() {
    if !landlock() {
        eprintln!("SKIP: this kernel has no Landlock ABI >= 3");
        return;
    }
    let m = mount(true);
    assert!(m.backing.starts_with("/tmp"), "{}", m.backing.display());
    let b = m.backing.display().to_string();
    let mut c = Command::new(CLI);
    c.args(["run", "--session", "alice", "--", "sh", "-c"])
        .arg(format!(
            "echo started; t=$(mktemp) && echo tmp > \"$t\" && echo \"tmpdir=$TMPDIR\" \
         && echo mine > notes.md && echo ok-mount; echo x > '{b}/sneak' && echo WROTE-BACKING"
        ));
    // not `run_in`: it sets a scratch list without /tmp, and this is about the defaults
    c.current_dir(m.root())
        .env_remove("COHERENT_RUN_WRITABLE")
        .env_remove("TMPDIR");
    for t in TAGS {
        c.env_remove(t);
    }
    let o = common::run_timeout(&mut c, RUN_TIMEOUT);
    let out = Run {
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    assert!(out.out.contains("started"), "refused: {}", out.show());
    assert!(out.out.contains("ok-mount"), "{}", out.show());
    let tmpdir = out
        .out
        .lines()
        .find_map(|l| l.strip_prefix("tmpdir="))
        .unwrap_or_else(|| panic!("no private TMPDIR: {}", out.show()));
    assert!(
        tmpdir.contains("coherent-run-") && !Path::new(&b).starts_with(tmpdir),
        "{tmpdir}"
    );
    assert!(!out.out.contains("WROTE-BACKING"), "{}", out.show());
    assert!(!m.backing.join("sneak").exists());
    assert_eq!(
        std::fs::read_to_string(m.path("notes.md")).unwrap(),
        "mine\n"
    );
    let _ = std::fs::remove_dir_all(tmpdir);
}
