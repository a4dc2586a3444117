//! The `coherent` CLI against a real FUSE mount whose `.coherent/ctl` is served by
//! `control::CtlHandle` exactly as the mount's adapter will serve it, with a small scripted
//! service in place of the engine (the engine has its own tests; this file tests the client:
//! mount discovery, one request per write, reply read back from the same descriptor, errno
//! on refusal, human lines, `--json`, exit codes and `watch`).

use coherent::control::{CtlHandle, Reply, Request, Verb};
use coherent::error::{Reason, Refusal};
use coherent::identity::{SessionInfo, Via};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, ReplyWrite, WriteFlags,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

const ROOT: u64 = 1;
const CDIR: u64 = 2;
const CTL: u64 = 3;
const EVENTS: u64 = 4;
const PLAN: u64 = 5;
const SUB: u64 = 6;
const SUBX: u64 = 7;

#[derive(Default)]
struct Shared {
    /// Every request written to ctl, as received.
    requests: Mutex<Vec<Vec<u8>>>,
    events: Mutex<Vec<u8>>,
}

struct FakeVolume {
    shared: Arc<Shared>,
    handles: Mutex<HashMap<u64, CtlHandle>>,
    next_fh: AtomicU64,
}

fn attr(ino: u64, kind: FileType, size: u64, perm: u16) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 512,
    }
}

impl FakeVolume {
    fn attr_of(&self, ino: u64) -> Option<FileAttr> {
        Some(match ino {
            ROOT | CDIR | SUB => attr(ino, FileType::Directory, 0, 0o755),
            CTL => attr(ino, FileType::RegularFile, 0, 0o666),
            EVENTS => attr(
                ino,
                FileType::RegularFile,
                self.shared.events.lock().unwrap().len() as u64,
                0o444,
            ),
            PLAN | SUBX => attr(ino, FileType::RegularFile, 5, 0o644),
            _ => return None,
        })
    }
}

fn caller_session(pid: u32) -> SessionInfo {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    for var in env.split(|&b| b == 0) {
        if let Some(v) = var.strip_prefix(b"COHERENT_SESSION=") {
            let name = String::from_utf8_lossy(v);
            return SessionInfo::from_tag(
                Some("COHERENT_SESSION"),
                &name,
                Via::Env {
                    var: "COHERENT_SESSION".into(),
                },
            );
        }
    }
    SessionInfo::unattributed(0)
}

fn record(path: &str, giver: &str, successor: &str, status: &str, live: bool) -> Value {
    json!({
        "path": path,
        "giver": giver,
        "giver_agent": coherent::identity::agent_id_for_name(giver).to_string(),
        "successor": successor,
        "successor_agent": coherent::identity::agent_id_for_name(successor).to_string(),
        "version_at_transfer": 2,
        "hold": "M",
        "status": status,
        "counterparty": null,
        "note": null,
        "created": "2026-11-30T12:00:00Z",
        "updated": "2026-11-30T12:00:00Z",
        "live": live,
    })
}

/// The scripted stand-in for the engine.
fn serve(me: &SessionInfo, req: &Request) -> Reply {
    let known = |p: &str| p == "plan.md" || p == "sub/x.md";
    if let Some(p) = req.paths().iter().find(|p| !known(p)) {
        return Reply::refused(
            Some(req.verb()),
            &Refusal::new(Reason::NoSuchPath, format!("{p} does not exist")),
            Some(p),
        );
    }
    match req {
        Request::Transfer { paths, to, .. } => {
            if to == "nobody" {
                return Reply::refused(
                    Some(Verb::Transfer),
                    &Refusal::new(
                        Reason::HandoffSuccessorUnknown,
                        "no session nobody has touched this volume",
                    ),
                    None,
                );
            }
            let recs = paths
                .iter()
                .map(|p| record(p, &me.name, to, "pending", true))
                .collect();
            Reply::records(Verb::Transfer, recs)
        }
        Request::Accept { paths } => Reply::records(
            Verb::Accept,
            paths
                .iter()
                .map(|p| record(p, "alice", &me.name, "completed", true))
                .collect(),
        ),
        Request::Decline { paths } => Reply::refused(
            Some(Verb::Decline),
            &Refusal::new(
                Reason::HandoffNotSuccessor,
                format!("{} was not handed to you", paths[0]),
            ),
            Some(&paths[0]),
        ),
        Request::Withdraw { paths } => Reply::records(
            Verb::Withdraw,
            paths
                .iter()
                .map(|p| record(p, &me.name, "bob", "withdrawn", false))
                .collect(),
        ),
        Request::Status { path } => Reply::status(
            json!({
                "sessions": [{"session": "alice",
                              "agent": coherent::identity::agent_id_for_name("alice").to_string()}],
                "records": [record(path.as_deref().unwrap_or("plan.md"), "alice", "bob",
                                   "overtaken", true)],
                "counts": {"live": 1},
            }),
            "1 session, 1 live record",
        ),
        Request::Whoami => Reply::session(Verb::Whoami, me),
        Request::Register { .. } => Reply::session(Verb::Register, me),
        Request::WaitReport => Reply::ok(
            Verb::Wait,
            json!({"waits": []})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            "no standing wait resolved since the last report",
        ),
        Request::Wait { path, until, .. } | Request::WaitStanding { path, until } => Reply::ok(
            Verb::Wait,
            json!({"reached": true, "until": until.as_str(),
                   "record": record(path, "alice", "bob", "completed", false)})
            .as_object()
            .cloned()
            .unwrap_or_default(),
            format!("{path}: {} reached", until.as_str()),
        ),
    }
}

impl Filesystem for FakeVolume {
    fn lookup(&self, _req: &fuser::Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ino = match (u64::from(parent), name.to_str().unwrap_or("")) {
            (ROOT, ".coherent") => CDIR,
            (ROOT, "plan.md") => PLAN,
            (ROOT, "sub") => SUB,
            (SUB, "x.md") => SUBX,
            (CDIR, "ctl") => CTL,
            (CDIR, "events") => EVENTS,
            _ => return reply.error(Errno::ENOENT),
        };
        reply.entry(&Duration::ZERO, &self.attr_of(ino).unwrap(), Generation(0));
    }

    fn getattr(
        &self,
        _req: &fuser::Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        match self.attr_of(u64::from(ino)) {
            Some(a) => reply.attr(&Duration::ZERO, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &fuser::Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
        if u64::from(ino) == CTL {
            self.handles.lock().unwrap().insert(fh, CtlHandle::new());
        }
        // the reply's size is not the file's size: direct I/O, as the adapter must
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match u64::from(ino) {
            CTL => {
                let mut handles = self.handles.lock().unwrap();
                match handles.get_mut(&u64::from(fh)) {
                    Some(h) => reply.data(h.read(offset, size)),
                    None => reply.error(Errno::EBADF),
                }
            }
            EVENTS => {
                let ev = self.shared.events.lock().unwrap();
                let start = (offset as usize).min(ev.len());
                let end = (start + size as usize).min(ev.len());
                reply.data(&ev[start..end]);
            }
            PLAN | SUBX => reply.data(&b"plan\n"[(offset as usize).min(5)..]),
            _ => reply.error(Errno::EISDIR),
        }
    }

    fn write(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if u64::from(ino) != CTL {
            return reply.error(Errno::EACCES);
        }
        self.shared.requests.lock().unwrap().push(data.to_vec());
        let me = caller_session(req.pid());
        // `register noreply`: fail the write without storing a reply, to test errno mapping
        if matches!(coherent::control::parse_request(data),
                    Ok(Request::Register { name: Some(ref n) }) if n == "noreply")
        {
            return reply.error(Errno::from_i32(libc::EBUSY));
        }
        let mut handles = self.handles.lock().unwrap();
        let Some(h) = handles.get_mut(&u64::from(fh)) else {
            return reply.error(Errno::EBADF);
        };
        match h.write(data, |r| serve(&me, r)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn release(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        self.handles.lock().unwrap().remove(&u64::from(fh));
        reply.ok();
    }

    fn flush(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &fuser::Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries: &[(u64, FileType, &str)] = match u64::from(ino) {
            ROOT => &[
                (CDIR, FileType::Directory, ".coherent"),
                (PLAN, FileType::RegularFile, "plan.md"),
                (SUB, FileType::Directory, "sub"),
            ],
            CDIR => &[
                (CTL, FileType::RegularFile, "ctl"),
                (EVENTS, FileType::RegularFile, "events"),
            ],
            SUB => &[(SUBX, FileType::RegularFile, "x.md")],
            _ => return reply.error(Errno::ENOTDIR),
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

struct Mounted {
    dir: tempfile::TempDir,
    shared: Arc<Shared>,
    session: Option<fuser::BackgroundSession>,
}

impl Mounted {
    fn new() -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared::default());
        let fs = FakeVolume {
            shared: shared.clone(),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        };
        let mut cfg = fuser::Config::default();
        cfg.mount_options = vec![fuser::MountOption::FSName("coherent-test".into())];
        let session = fuser::spawn_mount(fs, dir.path(), &cfg).expect("mount the fake volume");
        let m = Mounted {
            dir,
            shared,
            session: Some(session),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !m.root().join(".coherent/ctl").exists() {
            assert!(Instant::now() < deadline, "fake volume did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn root(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path()).unwrap()
    }

    fn requests(&self) -> Vec<Value> {
        self.shared
            .requests
            .lock()
            .unwrap()
            .iter()
            .map(|b| serde_json::from_slice(b).expect("the CLI writes JSON"))
            .collect()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                // already detached (a test unmounted it): make sure, quietly
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(self.dir.path())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

fn cli(cwd: &Path, session: &str, args: &[&str]) -> Output {
    Command::new(crate::common::CLI)
        .args(args)
        .current_dir(cwd)
        .env("COHERENT_SESSION", session)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn verbs_round_trip_through_a_real_mount() {
    let m = Mounted::new();
    let root = m.root();

    // transfer from the root, note included: one write, one JSON request
    let out = cli(
        &root,
        "alice",
        &["transfer", "--to", "bob", "--note", "two words", "plan.md"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let bob_id = &coherent::identity::agent_id_for_name("bob")
        .simple()
        .to_string()[..8];
    assert_eq!(
        text(&out.stdout),
        format!(
            "handed plan.md (v2) to bob ({bob_id}); you can no longer write it until bob \
             writes or declines it, or you run: coherent withdraw plan.md\n"
        )
    );
    assert_eq!(
        m.requests(),
        vec![json!({"verb":"transfer","paths":["plan.md"],"to":"bob","note":"two words"})]
    );

    // from a subdirectory, with `..` and an absolute path: mount-relative paths
    let sub = root.join("sub");
    let out = cli(&sub, "bob", &["accept", "x.md", "../plan.md"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("accepted sub/x.md (v2) from alice (27a468b0)"),
        "{lines:?}"
    );
    let abs = root.join("plan.md");
    let out = cli(
        Path::new("/"),
        "alice",
        &["withdraw", abs.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("withdrew plan.md (v2) from bob"));
    let reqs = m.requests();
    assert_eq!(
        reqs[1],
        json!({"verb":"accept","paths":["sub/x.md","plan.md"]})
    );
    assert_eq!(reqs[2], json!({"verb":"withdraw","paths":["plan.md"]}));

    // the suggested command works from where the user stands
    let out = cli(&sub, "alice", &["transfer", "--to", "bob", "../plan.md"]);
    assert!(
        text(&out.stdout).ends_with("or you run: coherent withdraw ../plan.md\n"),
        "{}",
        text(&out.stdout)
    );
    let out = cli(
        Path::new("/"),
        "alice",
        &["transfer", "--to", "bob", abs.to_str().unwrap()],
    );
    assert!(
        text(&out.stdout).ends_with(&format!(
            "or you run: coherent withdraw {}\n",
            abs.display()
        )),
        "{}",
        text(&out.stdout)
    );

    // --json prints the reply object as is
    let out = cli(&sub, "bob", &["--json", "accept", "x.md"]);
    assert_eq!(out.status.code(), Some(0));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["ok"], true);
    assert_eq!(reply["records"][0]["path"], "sub/x.md");

    // whoami: the CLI's own process is the caller
    let out = cli(&sub, "carol", &["whoami"]);
    assert_eq!(out.status.code(), Some(0));
    let carol = &coherent::identity::agent_id_for_name("carol").to_string();
    assert_eq!(
        text(&out.stdout),
        format!(
            "you are session carol ({}), agent id {carol}, resolved by environment variable \
             COHERENT_SESSION\n",
            &carol[..8]
        )
    );

    // status: the whole volume from anywhere inside, or one path
    let out = cli(&sub, "alice", &["status"]);
    assert_eq!(out.status.code(), Some(0));
    let s = text(&out.stdout);
    assert!(
        s.starts_with("1 session, 1 live record\nsessions: alice (27a468b0)\n"),
        "{s}"
    );
    assert!(s.contains("plan.md (v2): alice (27a468b0) -> bob"), "{s}");
    assert!(s.contains("counts: live=1"), "{s}");
    let out = cli(&root, "alice", &["status", "."]);
    assert_eq!(out.status.code(), Some(0));
    let out = cli(&root, "alice", &["status", "sub/x.md"]);
    assert_eq!(out.status.code(), Some(0));
    let reqs = m.requests();
    let n = reqs.len();
    assert_eq!(reqs[n - 2], json!({"verb":"status"}));
    assert_eq!(reqs[n - 1], json!({"verb":"status","path":"sub/x.md"}));
}

#[test]
fn refusals_exit_2_with_the_reason() {
    let m = Mounted::new();
    let root = m.root();
    for (args, reason) in [
        (
            &["transfer", "--to", "nobody", "plan.md"][..],
            "handoff_successor_unknown",
        ),
        (&["decline", "plan.md"], "handoff_not_successor"),
        (&["accept", "missing.md"], "no_such_path"),
        // the volume refuses what the CLI passes through: the control directory
        (&["accept", ".coherent/events"], "bad_request"),
    ] {
        let out = cli(&root, "bob", args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("coherent: refused ({reason}): ")),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty());
        // --json: the reply on stdout, still exit 2
        let mut j = vec!["--json"];
        j.extend_from_slice(args);
        let out = cli(&root, "bob", &j);
        assert_eq!(out.status.code(), Some(2));
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(reply["ok"], false);
        assert_eq!(reply["reason"], reason);
    }
    // a failed write with no reply stored: the errno decides
    let out = cli(&root, "bob", &["register", "noreply"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with("coherent: refused (handoff_in_flight): "),
        "{}",
        text(&out.stderr)
    );
    // paths on two volumes are a usage error
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("f"), "").unwrap();
    let out = cli(
        &root,
        "alice",
        &[
            "withdraw",
            "plan.md",
            other.path().join("f").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    // paths on two coherent volumes are a usage error: one request goes to one volume
    let m2 = Mounted::new();
    let out = cli(
        &root,
        "alice",
        &[
            "withdraw",
            "plan.md",
            m2.root().join("plan.md").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("run once per volume"),
        "{}",
        text(&out.stderr)
    );
    assert!(m2.requests().is_empty());
    // naming the mount root as a file is a usage error
    let out = cli(&root, "alice", &["withdraw", "."]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn event(seq: u64, ev: &str) -> String {
    format!(
        "{{\"seq\":{seq},\"ts\":\"2026-11-30T12:00:0{seq}Z\",\"event\":\"{ev}\",\"path\":\"plan.md\",\
         \"session\":\"alice\",\"agent\":\"27a468b0-7fa2-5c0d-a2ba-2dac753b2070\"}}\n"
    )
}

/// Read one line from the watcher, failing after a timeout instead of hanging.
fn next_line(rx: &std::sync::mpsc::Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("coherent watch printed nothing within 10 s")
}

fn spawn_watch(root: &Path, args: &[&str]) -> (KillOnDrop, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(crate::common::CLI)
        .arg("watch")
        .args(args)
        .current_dir(root)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (KillOnDrop(child), rx)
}

fn wait_exit(child: &mut KillOnDrop) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            return st.code();
        }
        assert!(Instant::now() < deadline, "coherent watch did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn watch_follows_the_log_and_stops_on_sigint() {
    let m = Mounted::new();
    let root = m.root();
    {
        let mut ev = m.shared.events.lock().unwrap();
        for (i, e) in ["session_seen", "acquire", "commit"].iter().enumerate() {
            ev.extend_from_slice(event(i as u64 + 1, e).as_bytes());
        }
    }
    let (mut child, rx) = spawn_watch(&root, &["-n", "2"]);
    // the last two existing events, readable
    assert_eq!(
        next_line(&rx),
        "12:00:02 #2 acquire plan.md by alice (27a468b0)"
    );
    assert_eq!(
        next_line(&rx),
        "12:00:03 #3 commit plan.md by alice (27a468b0)"
    );
    // then new ones as they are appended
    m.shared
        .events
        .lock()
        .unwrap()
        .extend_from_slice(event(4, "transfer").as_bytes());
    assert_eq!(
        next_line(&rx),
        "12:00:04 #4 transfer plan.md by alice (27a468b0)"
    );
    // SIGINT: a clean exit
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(wait_exit(&mut child), Some(0));

    // --json --all: every line raw
    let (_child, rx) = spawn_watch(&root, &["--json", "--all"]);
    for i in 1..=4 {
        let line = next_line(&rx);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["seq"], i);
    }
}

#[test]
fn watch_exits_when_the_volume_goes_away() {
    let m = Mounted::new();
    let root = m.root();
    m.shared
        .events
        .lock()
        .unwrap()
        .extend_from_slice(event(1, "commit").as_bytes());
    let (mut child, rx) = spawn_watch(&root, &[]);
    assert_eq!(
        next_line(&rx),
        "12:00:01 #1 commit plan.md by alice (27a468b0)"
    );
    // the watcher holds events open: a lazy unmount detaches the mount at once, then the
    // daemon side stops
    let st = Command::new("umount")
        .arg("-l")
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(wait_exit(&mut child), Some(0));
}

#[test]
fn a_request_near_the_size_limit_arrives_in_one_write() {
    use std::io::{Read, Seek, Write};
    let m = Mounted::new();
    let ctl = m.root().join(".coherent/ctl");
    // ~1000 KiB of paths: the kernel must deliver it as one FUSE write for the request to be
    // parsed whole (fuser asks for 16 MiB writes; the kernel caps them at max_pages)
    let mut line = String::from("accept");
    while line.len() < coherent::control::MAX_REQUEST - 30_000 {
        line.push_str(" plan.md");
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&ctl)
        .unwrap();
    let n = f.write(line.as_bytes()).unwrap();
    assert_eq!(n, line.len());
    {
        let reqs = m.shared.requests.lock().unwrap();
        assert_eq!(
            reqs.len(),
            1,
            "the request was split into {} writes",
            reqs.len()
        );
        assert_eq!(reqs[0].len(), line.len());
    }
    let mut reply = Vec::new();
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut reply).unwrap();
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(
        reply["records"].as_array().unwrap().len(),
        1,
        "duplicates collapse"
    );
}

/// Not a test: the cost of the control path without the engine (FUSE round trip of one
/// request, and a whole `coherent` process). Run with
/// `cargo test --release --test cli_mount -- --ignored --nocapture measure`.
#[test]
#[ignore]
fn measure_round_trip() {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let m = Mounted::new();
    let root = m.root();
    let ctl = root.join(".coherent/ctl");
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let mut raw = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&ctl)
            .unwrap();
        f.write_all(b"{\"verb\":\"whoami\"}\n").unwrap();
        let mut buf = [0u8; 4096];
        let n = f.read_at(&mut buf, 0).unwrap();
        assert!(n > 0);
        drop(f);
        raw.push(t.elapsed());
    }
    let mut cli_runs = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let out = cli(&root, "alice", &["--json", "accept", "plan.md"]);
        assert_eq!(out.status.code(), Some(0));
        cli_runs.push(t.elapsed());
    }
    eprintln!(
        "ctl open+write+pread+close, median of 2000: {:?}; `coherent accept` process, median \
         of 200: {:?}",
        median(raw),
        median(cli_runs)
    );
}
