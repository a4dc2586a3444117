//! Helpers for the enforcement tests (`tests/enforce_*.rs`): run real programs as a given
//! session in a mount, talk to `.coherent/ctl`, read the computed xattrs, the state log and
//! the status, and remount one backing directory with one state directory (persistence).
//!
//! Include next to the harness with
//! ```ignore
//! mod common;
//! #[path = "common/coherent.rs"]
//! mod coherent;
//! ```
#![allow(dead_code)]

use crate::common::{run_timeout, wait_until, Mount};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `coherent` CLI binary.
pub use crate::common::CLI;

/// The variables that tag a session by default (docs/design.md#sessions): cleared from every child
/// so the test runner's own environment never leaks a session into a test.
pub const TAGS: [&str; 2] = ["COHERENT_SESSION", "CLAUDE_CODE_SESSION_ID"];

/// How long any one program may run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long to wait for an asynchronous effect (a FUSE RELEASE, a reclaim) to show.
pub const SETTLE: Duration = Duration::from_secs(10);

/// The outcome of one program.
#[derive(Debug, Clone)]
pub struct Run {
    /// The exit code (`None`: killed by a signal or by the timeout).
    pub code: Option<i32>,
    pub out: String,
    pub err: String,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
    /// Failed, and a tool said `Permission denied` (strerror of `EACCES`).
    pub fn denied(&self) -> bool {
        self.code != Some(0) && self.err.contains("Permission denied")
    }
    /// The CLI's `--json` reply on stdout.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
    /// A one-line description for failure messages.
    pub fn show(&self) -> String {
        format!(
            "exit {:?}, stdout {:?}, stderr {:?}",
            self.code,
            self.out.trim(),
            self.err.trim()
        )
    }
}

/// Who runs a program: a session by `COHERENT_SESSION`, or nobody (unattributed).
pub type Who<'a> = Option<&'a str>;

/// Run `cmd` in `dir` with the session tags cleared and `env` set.
pub fn run_in(dir: &Path, env: &[(&str, &str)], cmd: &mut Command) -> Run {
    cmd.current_dir(dir);
    for t in TAGS {
        cmd.env_remove(t);
    }
    // Test mounts live under /tmp, which `coherent run`'s default writable places include:
    // it would refuse to start there (issue 20). A scratch list without /tmp instead.
    cmd.env("COHERENT_RUN_WRITABLE", "/var/tmp");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = run_timeout(cmd, RUN_TIMEOUT);
    Run {
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `COHERENT_SESSION=who` (when given) plus `env`.
fn tagged<'a>(who: Who<'a>, env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut v: Vec<(&str, &str)> = who.map(|w| ("COHERENT_SESSION", w)).into_iter().collect();
    v.extend_from_slice(env);
    v
}

/// `sh -c CMD` in the mount root as session `who` (`None`: unattributed).
pub fn sh(m: &impl Root, who: Who, cmd: &str) -> Run {
    sh_env(m, &tagged(who, &[]), cmd)
}

/// `sh -c CMD` in the mount root with the tags cleared and `env` set.
pub fn sh_env(m: &impl Root, env: &[(&str, &str)], cmd: &str) -> Run {
    let mut c = Command::new("sh");
    c.arg("-c").arg(cmd);
    run_in(m.root(), env, &mut c)
}

/// `sh -c CMD` as `who`; panics with the output unless it exits 0. Returns stdout.
pub fn sh_ok(m: &impl Root, who: Who, cmd: &str) -> String {
    let r = sh(m, who, cmd);
    assert!(r.ok(), "{who:?} `{cmd}`: {}", r.show());
    r.out
}

/// The `coherent` CLI in the mount root as `who`.
pub fn cli(m: &impl Root, who: Who, args: &[&str]) -> Run {
    cli_env(m, &tagged(who, &[]), args)
}

/// The `coherent` CLI in the mount root with the tags cleared and `env` set.
pub fn cli_env(m: &impl Root, env: &[(&str, &str)], args: &[&str]) -> Run {
    crate::common::binaries_are_fresh();
    let mut c = Command::new(CLI);
    c.args(args);
    run_in(m.root(), env, &mut c)
}

/// `coherent --json ARGS` as `who`: the exit code and the reply.
pub fn cli_json(m: &impl Root, who: Who, args: &[&str]) -> (Option<i32>, Value) {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let r = cli(m, who, &a);
    let v = serde_json::from_str(r.out.trim()).unwrap_or(Value::Null);
    (r.code, v)
}

/// One `write(2)` of `request` to `.coherent/ctl` as `who`, then the reply read back at
/// offset 0 of the same descriptor: `(errno of the write or 0, reply)`.
pub fn ctl(m: &impl Root, who: Who, request: &str) -> (i32, Value) {
    ctl_env(m, &tagged(who, &[]), request)
}

/// One request on `.coherent/ctl` from Python: prints the errno of the write (0: it
/// succeeded), a newline, then the reply read back from the same descriptor.
pub const CTL_PY: &str = r#"
import os, sys
fd = os.open('.coherent/ctl', os.O_RDWR)
err = 0
try:
    os.write(fd, sys.argv[1].encode())
except OSError as e:
    err = e.errno
sys.stdout.write(str(err) + '\n' + os.pread(fd, 1 << 20, 0).decode())
"#;

pub fn ctl_env(m: &impl Root, env: &[(&str, &str)], request: &str) -> (i32, Value) {
    let mut c = python();
    c.arg("-c").arg(CTL_PY).arg(request);
    let r = run_in(m.root(), env, &mut c);
    assert!(r.ok(), "ctl helper failed for {request:?}: {}", r.show());
    let (errno, reply) = r.out.split_once('\n').expect("helper output");
    let reply = reply.trim();
    (
        errno.parse().expect("errno"),
        serde_json::from_str(reply).unwrap_or_else(|_| Value::String(reply.to_string())),
    )
}

/// A quick python3 for the helpers: the system one without site packages when there is
/// one (a version-manager shim costs a shell start per call).
pub fn python() -> Command {
    let sys = Path::new("/usr/bin/python3");
    let mut c = Command::new(if sys.exists() {
        sys
    } else {
        Path::new("python3")
    });
    c.args(["-S", "-I"]);
    c
}

/// Read a file of `.coherent/` as `who`.
pub fn read_ctl_file(m: &impl Root, who: Who, name: &str) -> String {
    let r = sh(m, who, &format!("cat .coherent/{name}"));
    assert!(r.ok(), "cat .coherent/{name} as {who:?}: {}", r.show());
    r.out
}

/// `.coherent/why` as `who`.
pub fn why(m: &impl Root, who: Who) -> String {
    read_ctl_file(m, who, "why")
}

/// `.coherent/whoami` as `who`, as JSON.
pub fn whoami(m: &impl Root, who: Who) -> Value {
    let s = read_ctl_file(m, who, "whoami");
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("whoami not JSON ({e}): {s:?}"))
}

/// `.coherent/inbox` as `who` (JSON, kept raw).
pub fn inbox(m: &impl Root, who: Who) -> String {
    read_ctl_file(m, who, "inbox")
}

/// `.coherent/status`, read by the test process itself (a read of a virtual file).
pub fn status(m: &impl Root) -> Value {
    let s = std::fs::read_to_string(m.at(".coherent/status")).expect("read .coherent/status");
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("status not JSON ({e}): {s:?}"))
}

/// The names of the known sessions in `.coherent/status`.
pub fn session_names(m: &impl Root) -> Vec<String> {
    status(m)["sessions"]
        .as_array()
        .expect("status has sessions")
        .iter()
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect()
}

/// Every record (live and ended) of `path` in `.coherent/status`, oldest first.
pub fn records(m: &impl Root, path: &str) -> Vec<Value> {
    let st = status(m);
    let mut v: Vec<Value> = ["live", "ended"]
        .iter()
        .flat_map(|k| st[*k].as_array().cloned().unwrap_or_default())
        .filter(|r| r["path"] == path)
        .collect();
    v.sort_by(|a, b| {
        a["created"]
            .as_str()
            .cmp(&b["created"].as_str())
            .then(a["updated"].as_str().cmp(&b["updated"].as_str()))
    });
    v
}

/// The newest record of `path` (by `updated`), if any.
pub fn record(m: &impl Root, path: &str) -> Option<Value> {
    let mut v = records(m, path);
    v.sort_by(|a, b| a["updated"].as_str().cmp(&b["updated"].as_str()));
    v.pop()
}

/// The live record of `path`, if any.
pub fn live_record(m: &impl Root, path: &str) -> Option<Value> {
    records(m, path).into_iter().find(|r| r["live"] == true)
}

/// A computed xattr of `rel` read by `who` with `getfattr` (not following symlinks).
pub fn xattr(m: &impl Root, who: Who, rel: &str, name: &str) -> Option<String> {
    let mut c = Command::new("getfattr");
    c.args(["-h", "--only-values", "--absolute-names", "-n", name])
        .arg(m.at(rel));
    let r = run_in(m.root(), &tagged(who, &[]), &mut c);
    r.ok().then_some(r.out)
}

/// `user.coherent.version` of `rel` (read by an unattributed `getfattr`).
pub fn version(m: &impl Root, rel: &str) -> Option<u64> {
    xattr(m, None, rel, "user.coherent.version").and_then(|s| s.trim().parse().ok())
}

/// `user.coherent.handoff` of `rel` as read by `who`.
pub fn handoff(m: &impl Root, who: Who, rel: &str) -> Option<Value> {
    xattr(m, who, rel, "user.coherent.handoff").and_then(|s| serde_json::from_str(&s).ok())
}

/// The state log, parsed (the test process reads `.coherent/events`).
pub fn events(m: &impl Root) -> Vec<Value> {
    let s = std::fs::read_to_string(m.at(".coherent/events")).unwrap_or_default();
    s.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("event not JSON ({e}): {l}")))
        .collect()
}

/// Events named `event` on `path` (any session when `session` is `None`).
pub fn events_of(m: &impl Root, event: &str, path: &str, session: Option<&str>) -> Vec<Value> {
    events(m)
        .into_iter()
        .filter(|e| e["event"] == event && e["path"] == path)
        .filter(|e| session.is_none_or(|s| e["session"] == s))
        .collect()
}

/// Events named `event` on `path` (by `session` if given), once at least `n` are in the
/// log (or [`SETTLE`] passed). The daemon writes filesystem events to the log in groups,
/// so an event can show in `.coherent/events` a moment after the call that made it.
pub fn await_events(
    m: &impl Root,
    event: &str,
    path: &str,
    session: Option<&str>,
    n: usize,
) -> Vec<Value> {
    let mut got = Vec::new();
    wait_until(SETTLE, || {
        got = events_of(m, event, path, session);
        got.len() >= n
    });
    got
}

/// The version of the newest commit of `path` in the log once it equals `want` (or what it
/// is after [`SETTLE`]).
pub fn await_committed_version(m: &impl Root, path: &str, want: u64) -> Option<u64> {
    let mut got = None;
    wait_until(SETTLE, || {
        got = committed_version(m, path);
        got == Some(want)
    });
    got
}

/// Poll the log until an event matches, up to `timeout`.
pub fn wait_event(m: &impl Root, timeout: Duration, f: impl Fn(&Value) -> bool) -> Option<Value> {
    let mut found = None;
    wait_until(timeout, || {
        found = events(m).into_iter().find(|e| f(e));
        found.is_some()
    });
    found
}

/// The version of the newest `commit` event of `path` (it also covers removals, whose
/// path has no xattr any more).
pub fn committed_version(m: &impl Root, path: &str) -> Option<u64> {
    events(m)
        .into_iter()
        .filter(|e| {
            (e["event"] == "commit" || e["event"] == "external_change") && e["path"] == path
        })
        .filter_map(|e| e["version"].as_u64())
        .next_back()
}

/// A session name unique to this test process: session names (and `coherent run`
/// cgroups) are host-wide, and other test processes may run at the same time.
pub fn unique(base: &str) -> String {
    format!("{base}-{}", std::process::id())
}

/// The agent id of a session named by a tag other than `CLAUDE_CODE_SESSION_ID`
/// (docs/design.md#sessions).
pub fn agent_of(name: &str) -> String {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_URL,
        format!("ccs-agent:{name}").as_bytes(),
    )
    .to_string()
}

/// The display short id: the agent id's first 8 hex digits.
pub fn short_of(name: &str) -> String {
    agent_of(name)[..8].to_string()
}

/// Make `who` known to the volume: it registers itself through the control file
/// (docs/design.md#sessions).
pub fn touch_session(m: &impl Root, who: &str) {
    let r = cli(m, Some(who), &["register"]);
    assert!(r.ok(), "{who} coherent register: {}", r.show());
}

/// `coherent transfer --to TO PATHS` as `giver`, retried while the answer is
/// `handoff_in_flight` (a close returns before the daemon sees the FUSE RELEASE).
pub fn transfer(m: &impl Root, giver: &str, to: &str, paths: &[&str]) -> Value {
    let mut args = vec!["--to", to];
    args.extend_from_slice(paths);
    transfer_with(m, giver, &args)
}

/// `coherent --json transfer ARGS` as `giver`, retried while `handoff_in_flight`; must succeed.
pub fn transfer_with(m: &impl Root, giver: &str, args: &[&str]) -> Value {
    let mut a = vec!["transfer"];
    a.extend_from_slice(args);
    let mut last = (None, Value::Null);
    let ok = wait_until(SETTLE, || {
        last = cli_json(m, Some(giver), &a);
        last.1["reason"] != "handoff_in_flight"
    });
    assert!(
        ok,
        "transfer still in flight after {SETTLE:?}: {:?}",
        last.1
    );
    assert_eq!(last.0, Some(0), "{giver} coherent {a:?}: {}", last.1);
    last.1
}

/// A plain verb as `who` through the CLI, expecting success.
pub fn verb_ok(m: &impl Root, who: &str, args: &[&str]) -> Value {
    let (code, v) = cli_json(m, Some(who), args);
    assert_eq!(code, Some(0), "{who} coherent {args:?}: {v}");
    v
}

/// Check that `why` read by the giver is the deny text of docs/design.md#handoff for `path` handed
/// to `successor` at `version`; returns what is wrong.
pub fn check_deny_text(why: &str, path: &str, successor: &str, version: u64) -> Option<String> {
    let short = short_of(successor);
    let want = [
        format!("you handed {path} to agent {short} ({successor}) at v{version}"),
        format!("when {short} writes {path}"),
        format!("when {short} declines"),
        format!("coherent withdraw {path}"),
    ];
    let missing: Vec<&String> = want.iter().filter(|w| !why.contains(w.as_str())).collect();
    (!missing.is_empty()).then(|| format!("why {why:?} lacks {missing:?}"))
}

pub use crate::common::Remount;

/// A [`Mount`] with its own `--state-dir` in a temporary directory, so test mounts leave
/// no state under `~/.local/state/coherent` (the default). Derefs to the [`Mount`].
pub struct Vol {
    // dropped in this order: the daemon stops before its state directory goes
    m: Mount,
    _state: tempfile::TempDir,
}

impl std::ops::Deref for Vol {
    type Target = Mount;
    fn deref(&self) -> &Mount {
        &self.m
    }
}

impl Root for Vol {
    fn root(&self) -> &Path {
        &self.m.mnt
    }
}

/// Start `b` with a private state directory.
pub fn mount_with(b: crate::common::Builder) -> Vol {
    let state = tempfile::Builder::new()
        .prefix("coherent-state-")
        .tempdir()
        .expect("tempdir");
    let m = b
        .arg("--state-dir")
        .arg(state.path().to_string_lossy().into_owned())
        .start();
    Vol { m, _state: state }
}

/// A mount with default options and a private state directory.
pub fn mount(passthrough: bool) -> Vol {
    mount_with(Mount::builder().passthrough(passthrough))
}

/// What the helpers need of a mount: its root ([`Mount`] and [`Remount`]).
pub trait Root {
    fn root(&self) -> &Path;
    fn at(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }
}

impl Root for Mount {
    fn root(&self) -> &Path {
        &self.mnt
    }
}

impl Root for Remount {
    fn root(&self) -> &Path {
        &self.mnt
    }
}

/// A process of a session that keeps a file of the mount open until told to close it,
/// killed or dropped (a python3 reading commands on its stdin).
///
/// Note: a process that exits with the file still open closes it in the kernel's exit path,
/// exactly as when it is killed; only [`Holder::close`] is a `close(2)` by a live process.
pub struct Holder {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Holder {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    /// `close(2)` the descriptor; the process stays alive until [`Holder::exit`] or drop.
    pub fn close(&mut self) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("holder stdin");
        stdin
            .write_all(b"close\n")
            .and_then(|_| stdin.flush())
            .expect("holder stdin");
        let line = self.lines.recv_timeout(RUN_TIMEOUT).unwrap_or_default();
        assert_eq!(line.trim(), "closed", "holder did not close");
    }
    /// Let the process exit normally (anything still open is closed by the kernel).
    pub fn exit(mut self) {
        drop(self.child.stdin.take());
        if crate::common::wait_child(&mut self.child, RUN_TIMEOUT).is_none() {
            panic!("holder did not exit");
        }
    }
    /// `kill -9` the process and reap it.
    pub fn kill9(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start a process of `who` holding `rel` open (`write`: `O_WRONLY|O_APPEND`, else
/// `O_RDONLY`); returns once the open succeeded, or `Err(stderr)` if it failed.
pub fn hold_open(m: &impl Root, who: Who, rel: &str, write: bool) -> Result<Holder, String> {
    const PY: &str = r#"
import os, sys
flags = os.O_WRONLY | os.O_APPEND if sys.argv[2] == 'w' else os.O_RDONLY
fd = os.open(sys.argv[1], flags)
print('ready', flush=True)
for line in sys.stdin:
    if line.strip() == 'close':
        os.close(fd)
        print('closed', flush=True)
"#;
    let mut c = python();
    c.arg("-c")
        .arg(PY)
        .arg(rel)
        .arg(if write { "w" } else { "r" });
    spawn_holder(m, who, c)
}

/// A long-lived shell of `who` that has run `exec 3>>REL` (as an agent's shell would):
/// `close` runs `exec 3>&-` in that same shell.
pub fn hold_shell(m: &impl Root, who: Who, rel: &str) -> Result<Holder, String> {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(
            "exec 3>>\"$1\" && echo ready && while read l; do \
             [ \"$l\" = close ] && exec 3>&- && echo closed; done",
        )
        .arg("sh")
        .arg(rel);
    spawn_holder(m, who, c)
}

/// Run a holder program (prints `ready` once its descriptor is open, then obeys `close`
/// lines on stdin) as `who` in the mount root.
fn spawn_holder(m: &impl Root, who: Who, mut c: Command) -> Result<Holder, String> {
    c.current_dir(m.root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for t in TAGS {
        c.env_remove(t);
    }
    if let Some(w) = who {
        c.env("COHERENT_SESSION", w);
    }
    let mut child = c.spawn().expect("spawn a holder");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(std::io::BufReader::new(out)) {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let line = rx.recv_timeout(RUN_TIMEOUT).unwrap_or_default();
    if line.trim() == "ready" {
        return Ok(Holder { child, lines: rx });
    }
    let _ = child.kill();
    let o = child.wait_with_output().expect("wait");
    Err(String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A long-lived shell of a session that runs one command per call (an agent's persistent
/// shell): its process exists before and after whatever the test does in between.
pub struct LiveShell {
    holder: Holder,
}

impl LiveShell {
    pub fn start(m: &impl Root, who: Who) -> LiveShell {
        let mut c = Command::new("sh");
        c.arg("-c").arg(
            "echo ready; while IFS= read -r l; do eval \"$l\" >/dev/null 2>&1; echo \"rc=$?\"; done",
        );
        LiveShell {
            holder: spawn_holder(m, who, c).expect("live shell"),
        }
    }
    /// Run `cmd` in the shell; its exit status.
    pub fn run(&mut self, cmd: &str) -> i32 {
        use std::io::Write;
        let stdin = self.holder.child.stdin.as_mut().expect("shell stdin");
        writeln!(stdin, "{cmd}")
            .and_then(|_| stdin.flush())
            .expect("shell stdin");
        let line = self
            .holder
            .lines
            .recv_timeout(RUN_TIMEOUT)
            .unwrap_or_default();
        line.strip_prefix("rc=")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("live shell said {line:?} for `{cmd}`"))
    }
    pub fn pid(&self) -> i32 {
        self.holder.pid()
    }
}

/// `sh -c CMD` as `who`, which must be refused: the tool says `Permission denied` (EACCES)
/// and the log gains a `denied` event of `who` on `path` with `reason` (`fenced`,
/// `stale_view`, `unresolved`). Returns the run.
pub fn sh_refused(m: &impl Root, who: &str, cmd: &str, path: &str, reason: &str) -> Run {
    let before = events_of(m, "denied", path, Some(who)).len();
    let r = sh(m, Some(who), cmd);
    assert!(r.denied(), "{who} `{cmd}`: want EACCES, got {}", r.show());
    let d = await_events(m, "denied", path, Some(who), before + 1);
    assert!(d.len() > before, "{who} `{cmd}`: no `denied` on {path}");
    assert_eq!(d[before]["reason"], reason, "{who} `{cmd}`: {}", d[before]);
    r
}

/// A process of a session holding a file open for writing (`O_WRONLY|O_APPEND`) across
/// whatever happens to its host, writing through that one descriptor when told. Requests
/// and answers are separate calls, so a caller can send a write to a host and collect the
/// answer later (or never, if the host is stopped). Answers: `ok N` / `err ERRNO` for
/// `write TEXT` (one `write(2)` of TEXT and a newline) and for `truncate N` (an
/// `ftruncate`), `flushed` for `flush` (a close of a duplicate: a FLUSH, which commits),
/// `closed` / `err ERRNO` for `close`; `ok 0` / `err ERRNO` for `map` (a shared writable
/// mapping of the whole file, opened again by its first name), `closefd` (the descriptor
/// closed, the mapping kept) and `unmap`.
pub struct HeldWriter {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

/// What one request through a [`HeldWriter`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Err(i32),
    /// No answer in time (the process is stuck in a call to a stopped daemon).
    Unknown,
}

impl HeldWriter {
    /// Opens `rel` as `who`; `Err(errno)` if the open fails.
    pub fn open(m: &impl Root, who: &str, rel: &str) -> Result<HeldWriter, i32> {
        const PY: &str = r#"
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
except OSError as e:
    print('err', e.errno, flush=True)
    sys.exit(0)
print('ready', flush=True)
maps = []
for line in sys.stdin:
    cmd, _, text = line.rstrip('\n').partition(' ')
    try:
        if cmd == 'write':
            print('ok', os.write(fd, (text + '\n').encode()), flush=True)
        elif cmd == 'truncate':
            os.ftruncate(fd, int(text))
            print('ok 0', flush=True)
        elif cmd == 'flush':
            os.close(os.dup(fd))
            print('flushed', flush=True)
        elif cmd == 'close':
            os.close(fd)
            print('closed', flush=True)
            break
        elif cmd == 'map':
            import mmap
            rw = os.open(sys.argv[1], os.O_RDWR)
            maps.append(mmap.mmap(rw, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
            os.close(rw)
            print('ok 0', flush=True)
        elif cmd == 'closefd':
            os.close(fd)
            print('ok 0', flush=True)
        elif cmd == 'unmap':
            maps.pop().close()
            print('ok 0', flush=True)
    except (OSError, ValueError) as e:
        print('err', getattr(e, 'errno', None) or -1, flush=True)
"#;
        let mut c = python();
        c.arg("-c")
            .arg(PY)
            .arg(rel)
            .current_dir(m.root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for t in TAGS {
            c.env_remove(t);
        }
        c.env("COHERENT_SESSION", who);
        let mut child = c.spawn().expect("spawn a held writer");
        let out = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take().expect("stdin");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let w = HeldWriter {
            child,
            stdin,
            lines,
        };
        match w.recv(RUN_TIMEOUT) {
            Some(l) if l == "ready" => Ok(w),
            Some(l) => Err(l
                .strip_prefix("err ")
                .and_then(|e| e.parse().ok())
                .unwrap_or(-1)),
            None => Err(-1),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Send one request without waiting for its answer.
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        // A writer that died (killed with its host's mount) answers nothing: recv says so.
        let _ = writeln!(self.stdin, "{line}").and_then(|_| self.stdin.flush());
    }

    /// The next answer line, if one comes within `timeout`.
    pub fn recv(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Send `line` and wait up to `timeout` for its answer.
    pub fn ask(&mut self, line: &str, timeout: Duration) -> Answer {
        self.send(line);
        match self.recv(timeout) {
            Some(a) if a.starts_with("ok ") || a == "closed" => Answer::Ok,
            Some(a) => Answer::Err(
                a.strip_prefix("err ")
                    .and_then(|e| e.parse().ok())
                    .unwrap_or(-1),
            ),
            None => Answer::Unknown,
        }
    }
}

/// The same, for a test that waits for each answer ([`RUN_TIMEOUT`]) and must have one.
impl HeldWriter {
    /// One `write(2)` through the held descriptor: `Ok(bytes)` or `Err(errno)`.
    pub fn write(&mut self, text: &str) -> Result<usize, i32> {
        self.call(&format!("write {text}"))
    }

    /// One `ftruncate(2)` of the held descriptor: `Ok(0)` or `Err(errno)`.
    pub fn truncate(&mut self, len: u64) -> Result<usize, i32> {
        self.call(&format!("truncate {len}"))
    }

    /// A FLUSH of the held descriptor (the volume commits what was written).
    pub fn flush(&mut self) {
        self.send("flush");
        assert_eq!(self.recv(RUN_TIMEOUT).as_deref(), Some("flushed"));
    }

    /// One of the requests above (`map`, `closefd`, `unmap`, ...): `Ok(n)` or `Err(errno)`.
    pub fn call(&mut self, line: &str) -> Result<usize, i32> {
        self.send(line);
        let a = self.recv(RUN_TIMEOUT).unwrap_or_default();
        match a.split_once(' ') {
            Some(("ok", n)) => Ok(n.parse().expect("a byte count")),
            Some(("err", e)) => Err(e.parse().expect("an errno")),
            _ => panic!("the held writer said {a:?} to {line:?}"),
        }
    }
}

impl Drop for HeldWriter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
