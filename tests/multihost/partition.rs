//! Partition tests (issue 22, item 4; docs/multi-host.md "Partition tests"): three
//! `coherent-mount` hosts of one backing directory (or, with `PARTITION_COPIES=1`, each of
//! its own copy, which the test keeps in step with rsync after every write, as a synced
//! directory would), each in its own network namespace with
//! a veth link to a three-member etcd in the root namespace, driven by a seeded random
//! schedule of verbs, writes (fresh opens and descriptors held open across faults) and
//! faults (links cut and healed, slowed and lossy links, daemons stopped, put to sleep as
//! in a suspend (their monotonic clock stops too: tests/common/clock.rs), killed and
//! restarted, etcd members killed and restarted), with ended records evicted after 1 s. Every operation goes into a history; a
//! checker then proves over the history and the backing files:
//!
//! 1. no write by a giver was admitted or landed after its transfer was acknowledged
//!    (while nothing could have lifted the fence);
//! 2. no refused write landed and no admitted write is missing;
//! 3. no host ever showed two live records of one path;
//! 4. once every fault is healed, every host converges on the same records and versions,
//!    and every acknowledged transfer is among them.
//!
//! `PARTITION_SEED=N` (or `random`) and `PARTITION_STEPS=N` make a longer run:
//!
//!     PARTITION_STEPS=2000 PARTITION_SEED=7 cargo test --test partition -- --nocapture
//!
//! On a violation the test prints the seed and the operations that show it, and fails.

use crate::coherent;
use crate::common;

use coherent::*;
use common::clock::ClockShim;
use common::etcd::Etcd;
use common::hosts::Daemon;
use common::netns::{Degrade, Net};
use common::rng::Rng;
use common::{wait_until, BIN};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Each host's lease (the shortest the daemon takes: faults show sooner).
const TTL: &str = "2s";
/// Ended records are evicted this soon (each host evicts once a path's shared state has
/// not changed for this long on its own boot clock): a path's key comes and goes all run.
const EVICT_AFTER: &str = "1s";
const HOSTS: [&str; 3] = ["A", "B", "C"];
const FILES: [&str; 3] = ["f0.md", "f1.md", "f2.md"];
/// The schedule of the CI run.
const DEFAULT_SEED: u64 = 22;
/// The schedule of the CI run on copies that lag.
const DEFAULT_LAG_SEED: u64 = 39;
const DEFAULT_STEPS: usize = 150;
/// How long hosts may take to agree once every fault is healed.
const CONVERGE: Duration = Duration::from_secs(60);
/// How long one request through a held descriptor may take on a running host.
const HELD_TIMEOUT: Duration = Duration::from_secs(30);

/// One entry of the history.
#[derive(Debug, Clone, Default)]
struct Op {
    i: usize,
    /// transfer, accept, decline, withdraw, write, open, close, or a fault's name.
    kind: String,
    host: String,
    session: String,
    path: String,
    /// transfer: the successor; write: the tag it wrote; fault: what was done.
    arg: String,
    /// `fresh` (a new open) or `held#N` (through held descriptor N), for writes.
    via: String,
    start: f64,
    end: f64,
    /// Definitely done (exit 0, write returned its bytes).
    ok: bool,
    /// Definitely not done.
    refused: bool,
    errno: Option<i32>,
    reason: Option<String>,
    /// An acknowledged transfer's record: (created) as the reply showed it.
    created: Option<String>,
    /// A sync or a revert that changed a copy in a way that is a change, not a copy
    /// catching up: it erased lines there, or brought bytes no commit made (written through
    /// a descriptor still open on its source). It may end records, as any change behind
    /// a volume's back does.
    lifts: bool,
    /// A write through a descriptor whose file a sync or a revert replaced on its copy:
    /// it writes to the orphaned file, as on any filesystem, and lands nowhere.
    orphan: bool,
}

impl Op {
    fn line(&self) -> String {
        let mut s = format!(
            "#{:<4} {:>9.3}-{:<9.3} {:<13} host={}",
            self.i,
            self.start / 1000.0,
            self.end / 1000.0,
            self.kind,
            self.host
        );
        for (k, v) in [
            ("session", &self.session),
            ("path", &self.path),
            ("arg", &self.arg),
            ("via", &self.via),
        ] {
            if !v.is_empty() {
                let _ = write!(s, " {k}={v}");
            }
        }
        let res = if self.ok {
            "ok".to_string()
        } else if self.refused {
            "refused".to_string()
        } else {
            "unknown".to_string()
        };
        let _ = write!(s, " -> {res}");
        if let Some(e) = self.errno {
            let _ = write!(s, " errno={e}");
        }
        if let Some(r) = &self.reason {
            let _ = write!(s, " reason={r}");
        }
        if let Some(c) = &self.created {
            let _ = write!(s, " created={c}");
        }
        if self.lifts {
            s.push_str(" lifts");
        }
        if self.orphan {
            s.push_str(" orphan");
        }
        s
    }

    fn is_fault(&self) -> bool {
        self.session.is_empty() && !matches!(self.kind.as_str(), "sync" | "revert")
    }
}

/// Where the hosts' workspaces are (`PARTITION_COPIES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One backing directory for all three hosts (unset).
    Shared,
    /// A copy per host, which the test brings in step right after every write there, in
    /// place (`1`).
    Copies,
    /// A copy per host, synced on a schedule of its own as a sync tool would: one file
    /// from one copy to another, replaced by a rename (rsync's default), now and then
    /// from a copy that lags over a newer one; and now and then a copy put back to older
    /// bytes (a revert). Copies lag in both directions (`lag`).
    Lagging,
}

impl Mode {
    fn describe(self) -> &'static str {
        match self {
            Mode::Shared => "one backing directory",
            Mode::Copies => "each on its own copy, synced in place after every write",
            Mode::Lagging => "each on its own copy, synced by replace on its own schedule, reverts",
        }
    }
}

/// One host: a daemon in its namespace on its own mount point and state directory.
struct Host {
    name: &'static str,
    mnt: PathBuf,
    state: PathBuf,
    log: PathBuf,
    daemon: Option<Daemon>,
    /// Its daemon's clock shim (a suspend: the monotonic clock stops).
    clock: ClockShim,
    paused: bool,
    /// Paused as a machine's sleep (since when): on resume its monotonic clock will not
    /// have moved meanwhile, while etcd's and its boot clock did.
    asleep: Option<Instant>,
    cut: bool,
    degraded: Option<Degrade>,
}

impl Root for Host {
    fn root(&self) -> &Path {
        &self.mnt
    }
}

impl Host {
    /// Its daemon runs and is not stopped: requests to its mount are answered.
    fn serving(&self) -> bool {
        self.daemon.is_some() && !self.paused
    }
}

/// A descriptor held open for writing by a session on a host.
struct Held {
    id: usize,
    host: usize,
    session: String,
    path: String,
    w: HeldWriter,
    /// A request sent whose answer never came: the writer is no longer usable.
    stuck: bool,
    /// Its file was replaced on its copy (a sync or revert): it writes to the orphan.
    orphan: bool,
    /// A write through it returned (its release commits).
    wrote: bool,
}

impl Held {
    /// Descriptor `id`, just opened by `session` on host `k`, writing `path`.
    fn new(id: usize, k: usize, session: &str, path: &str, w: HeldWriter) -> Held {
        Held {
            id,
            host: k,
            session: session.to_string(),
            path: path.to_string(),
            w,
            stuck: false,
            orphan: false,
            wrote: false,
        }
    }
}

/// The whole run. Fields drop in order: writers, hosts, etcd, namespaces, directory.
struct World {
    held: Vec<Held>,
    hosts: Vec<Host>,
    etcd: Etcd,
    net: Net,
    /// The backing directory of each host: one shared by all, or (`PARTITION_COPIES=1`)
    /// one copy per host, kept in step by the test as a sync would.
    backings: Vec<PathBuf>,
    url: String,
    sessions: Vec<String>,
    etcd_down: Option<usize>,
    history: Vec<Op>,
    t0: Instant,
    next_tag: usize,
    next_held: usize,
    faults: BTreeMap<&'static str, usize>,
    violations: Vec<String>,
    mode: Mode,
    /// Every line the test saw in any copy at any time (tag -> file): lines a sync or a
    /// revert erased later were written and landed; whatever is lost unseen is a loss.
    seen: BTreeMap<String, String>,
    /// (host, file) whose copy may hold bytes no commit made yet: written through a
    /// descriptor still open, a write whose answer never came, or such bytes synced in.
    dirty: BTreeSet<(usize, String)>,
    /// Per file, the lines of the newest commit through a mount, while no change behind
    /// the volumes came after it (None: one did). Only those bytes are a version every
    /// host knows as the current one: a sync bringing anything else is a change there.
    latest: BTreeMap<String, Option<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl World {
    fn new(mode: Mode) -> World {
        let net = Net::new(&HOSTS);
        let etcd = Etcd::start_listening(3, &net.etcd_ip);
        let url = etcd.url_via(&net.etcd_ip);
        let dir = tempfile::Builder::new()
            .prefix("coherent-partition-")
            .tempdir()
            .unwrap();
        let base = dir.path().canonicalize().unwrap();
        let backings: Vec<PathBuf> = if mode != Mode::Shared {
            HOSTS
                .iter()
                .map(|h| base.join(format!("backing-{h}")))
                .collect()
        } else {
            vec![base.join("backing")]
        };
        for backing in &backings {
            std::fs::create_dir(backing).unwrap();
            for f in FILES {
                std::fs::write(backing.join(f), format!("{f}\n")).unwrap();
            }
        }
        let mut w = World {
            held: Vec::new(),
            hosts: Vec::new(),
            etcd,
            net,
            backings,
            url,
            sessions: (0..3).map(|i| unique(&format!("s{i}"))).collect(),
            etcd_down: None,
            history: Vec::new(),
            t0: Instant::now(),
            next_tag: 0,
            next_held: 0,
            faults: BTreeMap::new(),
            violations: Vec::new(),
            mode,
            seen: BTreeMap::new(),
            dirty: BTreeSet::new(),
            latest: FILES
                .iter()
                .map(|f| (f.to_string(), Some(Vec::new())))
                .collect(),
            _dir: dir,
        };
        for (k, name) in HOSTS.iter().enumerate() {
            let clock_dir = base.join(format!("clock-{name}"));
            std::fs::create_dir_all(&clock_dir).unwrap();
            let h = Host {
                name,
                mnt: base.join(format!("mnt-{name}")),
                state: base.join(format!("state-{name}")),
                log: base.join(format!("daemon-{name}.log")),
                daemon: None,
                clock: ClockShim::build(&clock_dir),
                paused: false,
                asleep: None,
                cut: false,
                degraded: None,
            };
            for d in [&h.mnt, &h.state] {
                std::fs::create_dir_all(d).unwrap();
            }
            w.hosts.push(h);
            w.spawn(k);
        }
        for s in w.sessions.clone() {
            for k in 0..HOSTS.len() {
                touch_session(&w.hosts[k], &s);
            }
        }
        w
    }

    fn spawn(&mut self, k: usize) {
        let h = &self.hosts[k];
        let mut cmd = self.net.command(k, BIN);
        cmd.arg(self.backing(k))
            .arg(&h.mnt)
            .arg("--state-dir")
            .arg(&h.state)
            .args(["--coordinator", &self.url, "--host-id", h.name])
            .args(["--coordinator-ttl", TTL, "--evict-after", EVICT_AFTER])
            .envs(h.clock.env());
        let d = Daemon::spawn(cmd, &h.mnt, &h.log);
        self.hosts[k].daemon = Some(d);
    }

    /// Host `k`'s backing directory.
    fn backing(&self, k: usize) -> &Path {
        &self.backings[k.min(self.backings.len() - 1)]
    }

    /// With a copy per host: what host `k`'s copy holds now reaches the others, as a sync
    /// tool would carry it (in place: a descriptor open on another host keeps its file).
    fn sync_from(&self, k: usize) {
        if self.mode != Mode::Copies {
            return;
        }
        let from = format!("{}/", self.backing(k).display());
        for (j, to) in self.backings.iter().enumerate().filter(|(j, _)| *j != k) {
            let out = std::process::Command::new("rsync")
                .args(["-rt", "--inplace", &from])
                .arg(format!("{}/", to.display()))
                .output()
                .expect("rsync (Debian package rsync)");
            assert!(
                out.status.success(),
                "rsync {} -> {}: {}",
                HOSTS[k],
                HOSTS[j],
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64() * 1000.0
    }

    fn begin(&self, kind: &str, host: usize) -> Op {
        Op {
            i: self.history.len(),
            kind: kind.to_string(),
            host: HOSTS[host].to_string(),
            start: self.now(),
            ..Op::default()
        }
    }

    fn finish(&mut self, mut op: Op) {
        if matches!(op.kind.as_str(), "write" | "close") {
            if let Some(k) = HOSTS.iter().position(|h| *h == op.host) {
                self.sync_from(k);
            }
        }
        op.end = self.now();
        if std::env::var_os("PARTITION_VERBOSE").is_some() {
            eprintln!("{}", op.line());
        }
        self.history.push(op);
    }

    fn fault(&mut self, kind: &'static str, host: usize, arg: &str, f: impl FnOnce(&mut World)) {
        let mut op = self.begin(kind, host);
        op.arg = arg.to_string();
        f(self);
        op.ok = true;
        *self.faults.entry(kind).or_default() += 1;
        self.finish(op);
    }

    /// The reason of the newest `denied` event of `session` on `path` in host `k`'s log
    /// (the log is written in groups: looked for up to a second).
    fn denied_reason(&self, k: usize, session: &str, path: &str) -> Option<String> {
        let h = &self.hosts[k];
        let mut got = None;
        wait_until(Duration::from_secs(1), || {
            got = events_of(h, "denied", path, Some(session))
                .last()
                .and_then(|e| e["reason"].as_str().map(str::to_string));
            got.is_some()
        });
        got
    }

    // --- client operations ---------------------------------------------------------------

    /// A verb through the CLI. A transfer's giver reads the file first (a hold on the
    /// version it hands on).
    fn verb(&mut self, k: usize, verb: &str, session: &str, path: &str, to: Option<&str>) {
        let mut op = self.begin(verb, k);
        op.session = session.to_string();
        op.path = path.to_string();
        let h = &self.hosts[k];
        let (code, v) = if let Some(to) = to {
            op.arg = to.to_string();
            sh(h, Some(session), &format!("cat {path} >/dev/null"));
            cli_json(h, Some(session), &["transfer", "--to", to, path])
        } else {
            cli_json(h, Some(session), &[verb, path])
        };
        op.ok = code == Some(0);
        // A refusal with a reason was decided; anything else (killed by the timeout, no
        // reply) may or may not have been published.
        op.reason = v["reason"].as_str().map(str::to_string);
        op.refused = !op.ok && op.reason.is_some() && op.reason.as_deref() != Some("internal");
        if let Some(to) = to.filter(|_| op.ok) {
            let rec = &v["records"][0];
            op.created = rec["created"].as_str().map(str::to_string);
            if rec["giver"] != session || rec["successor"] != to {
                self.violations.push(format!(
                    "transfer #{} answered a record that is not the one asked: {v}",
                    op.i
                ));
            }
        }
        self.finish(op);
    }

    fn tag(&mut self, k: usize, session: &str) -> String {
        self.next_tag += 1;
        format!("w{}-{}-{}", self.next_tag, HOSTS[k], session)
    }

    /// A write through a new open: open, one write of a tagged line, close.
    fn fresh_write(&mut self, k: usize, session: &str, path: &str) {
        const PY: &str = r#"
import os, sys
stage = 'open'
try:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
    stage = 'write'
    os.write(fd, (sys.argv[2] + '\n').encode())
    stage = 'close'
    os.close(fd)
    print('ok')
except OSError as e:
    print(stage, e.errno)
"#;
        let tag = self.tag(k, session);
        let mut op = self.begin("write", k);
        op.session = session.to_string();
        op.path = path.to_string();
        op.arg = tag.clone();
        op.via = "fresh".into();
        let (said, errno) = self.py_as(k, session, PY, &[path, &tag]);
        match (said.as_str(), errno) {
            ("ok", _) => op.ok = true,
            // The write returned: it was admitted (the close's commit may still fail).
            ("close", e) => {
                op.ok = true;
                op.errno = e;
            }
            ("open" | "write", Some(e)) => {
                op.refused = true;
                op.errno = Some(e);
            }
            _ => {}
        }
        if op.refused && op.errno == Some(libc::EACCES) {
            op.reason = self.denied_reason(k, session, path);
        }
        // A write that returned and closed is committed, and with it whatever the copy held
        // (unless a descriptor open there goes on writing); one whose end is unknown may
        // have left bytes no commit made.
        if op.ok && op.errno.is_none() {
            if !self.writing_on(k, path) {
                self.dirty.remove(&(k, path.to_string()));
            }
            self.committed(k, path);
        } else if !op.refused {
            self.dirty.insert((k, path.to_string()));
        }
        self.finish(op);
    }

    /// A commit of `path` through host `k`'s mount: its copy's bytes are the newest version.
    fn committed(&mut self, k: usize, path: &str) {
        let lines = self.lines(k, path);
        self.latest.insert(path.to_string(), Some(lines));
    }

    /// Runs Python `script` with `args` as `session` in host `k`'s mount: the first word
    /// it printed (`ok`, or the stage that failed) and the errno printed after it.
    fn py_as(&self, k: usize, session: &str, script: &str, args: &[&str]) -> (String, Option<i32>) {
        let mut c = python();
        c.arg("-c").arg(script).args(args);
        let r = run_in(
            self.hosts[k].root(),
            &[("COHERENT_SESSION", session)],
            &mut c,
        );
        let out = r.out.trim().to_string();
        let mut words = out.split(' ');
        let said = words.next().unwrap_or("").to_string();
        (said, words.next().and_then(|e| e.parse().ok()))
    }

    /// Some descriptor held on host `k` may still write `path` there.
    fn writing_on(&self, k: usize, path: &str) -> bool {
        self.held
            .iter()
            .any(|h| h.host == k && h.path == path && !h.orphan)
    }

    fn hold(&mut self, k: usize, session: &str, path: &str) {
        let mut op = self.begin("open", k);
        op.session = session.to_string();
        op.path = path.to_string();
        self.next_held += 1;
        let id = self.next_held;
        op.via = format!("held#{id}");
        match HeldWriter::open(&self.hosts[k], session, path) {
            Ok(w) => {
                op.ok = true;
                self.held.push(Held::new(id, k, session, path, w));
            }
            Err(e) => {
                op.refused = e > 0;
                op.errno = (e > 0).then_some(e);
                if e == libc::EACCES {
                    op.reason = self.denied_reason(k, session, path);
                }
            }
        }
        self.finish(op);
    }

    /// An editor's save by rename, with a descriptor held under the other name (issue 39
    /// item 4): the session copies `path` to `side-N.md` through host `k`'s mount, opens the
    /// copy for writing and keeps it open, then moves it over `path`. From then on the held
    /// descriptor writes `path`'s file, under the name it was opened by. Refused (a fenced
    /// giver, a stale view), the descriptor is closed and the side file left.
    fn save_aside(&mut self, k: usize, session: &str, path: &str) {
        const MV: &str = r#"
import os, sys
try:
    os.rename(sys.argv[1], sys.argv[2])
    print('ok')
except OSError as e:
    print('err', e.errno)
"#;
        self.next_held += 1;
        let id = self.next_held;
        let side = format!("side-{id}.md");
        let mut op = self.begin("rename", k);
        op.session = session.to_string();
        op.path = path.to_string();
        op.arg = side.clone();
        op.via = format!("held#{id}");
        let copied = sh(&self.hosts[k], Some(session), &format!("cp {path} {side}"));
        if copied.code != Some(0) {
            op.refused = true;
            op.reason = Some(format!("cp: {}", copied.err.trim()));
            return self.finish(op);
        }
        let w = match HeldWriter::open(&self.hosts[k], session, &side) {
            Ok(w) => w,
            Err(e) => {
                op.refused = true;
                op.errno = (e > 0).then_some(e);
                return self.finish(op);
            }
        };
        match self.py_as(k, session, MV, &[&side, path]) {
            (said, _) if said == "ok" => {
                op.ok = true;
                // Whatever was held open on the file the name denoted now writes an orphan.
                self.replaced(k, path);
                self.held.push(Held::new(id, k, session, path, w));
                // The rename committed the copy's bytes, nothing written through it yet.
                if !self.writing_on(k, path) {
                    self.dirty.remove(&(k, path.to_string()));
                }
                self.committed(k, path);
            }
            (said, Some(e)) if said == "err" => {
                op.refused = true;
                op.errno = Some(e);
                if e == libc::EACCES {
                    op.reason = self.denied_reason(k, session, path);
                }
                drop(w);
            }
            _ => drop(w),
        }
        self.finish(op);
    }

    /// Aims at a descriptor held across a transfer made elsewhere (issue 39 item 4): half
    /// the time the session of a held descriptor hands its file on from another host
    /// (which must find it in flight, under whatever name it was opened); else the
    /// giver of the newest acknowledged transfer writes through a descriptor it holds on
    /// that path, if any.
    fn aim_at_held(&mut self, rng: &mut Rng, usable: &[usize], serving: &[usize]) {
        let last_ack = self
            .history
            .iter()
            .rev()
            .find(|o| o.kind == "transfer" && o.ok)
            .map(|o| (o.session.clone(), o.path.clone()));
        let giver_held: Vec<usize> = usable
            .iter()
            .copied()
            .filter(|&j| {
                let h = &self.held[j];
                last_ack
                    .as_ref()
                    .is_some_and(|(g, p)| h.session == *g && h.path == *p)
            })
            .collect();
        if !giver_held.is_empty() && rng.below(2) == 0 {
            let j = *rng.pick(&giver_held);
            return self.held_write(j);
        }
        let j = *rng.pick(usable);
        let (hk, session, path) = {
            let h = &self.held[j];
            (h.host, h.session.clone(), h.path.clone())
        };
        let elsewhere: Vec<usize> = serving.iter().copied().filter(|&k| k != hk).collect();
        let k = if elsewhere.is_empty() {
            hk
        } else {
            *rng.pick(&elsewhere)
        };
        let i = self
            .sessions
            .iter()
            .position(|x| *x == session)
            .unwrap_or(0);
        let to = self.sessions[(i + 1 + rng.below(self.sessions.len() - 1)) % 3].clone();
        self.verb(k, "transfer", &session, &path, Some(&to));
    }

    /// One write through held descriptor `j` (its host serves, or its daemon is dead).
    fn held_write(&mut self, j: usize) {
        let (k, session, path, id, orphan) = {
            let h = &self.held[j];
            (h.host, h.session.clone(), h.path.clone(), h.id, h.orphan)
        };
        let tag = self.tag(k, &session);
        let mut op = self.begin("write", k);
        op.session = session.clone();
        op.path = path.clone();
        op.arg = tag.clone();
        op.via = format!("held#{id}");
        op.orphan = orphan;
        match self.held[j].w.ask(&format!("write {tag}"), HELD_TIMEOUT) {
            Answer::Ok => op.ok = true,
            Answer::Err(e) => {
                op.refused = true;
                op.errno = Some(e);
            }
            Answer::Unknown => self.held[j].stuck = true,
        }
        if op.errno == Some(libc::EACCES) {
            op.reason = self.denied_reason(k, &session, &path);
        }
        if !op.refused && !orphan {
            self.dirty.insert((k, path.clone()));
            self.held[j].wrote = true;
        }
        self.finish(op);
    }

    fn held_close(&mut self, j: usize) {
        let h = self.held.remove(j);
        let mut op = self.begin("close", h.host);
        op.session = h.session.clone();
        op.path = h.path.clone();
        op.via = format!("held#{}", h.id);
        let mut w = h.w;
        match w.ask("close", HELD_TIMEOUT) {
            Answer::Ok => op.ok = true,
            Answer::Err(e) => {
                op.refused = true;
                op.errno = Some(e);
            }
            Answer::Unknown => {}
        }
        drop(w);
        // Its release committed what it wrote (on a daemon that runs).
        if op.ok && !h.orphan && h.wrote && self.hosts[h.host].serving() {
            if !self.writing_on(h.host, &h.path) {
                self.dirty.remove(&(h.host, h.path.clone()));
            }
            self.committed(h.host, &h.path);
        }
        self.finish(op);
    }

    // --- copies that lag (Mode::Lagging) ----------------------------------------------------

    /// The tagged lines of `path` in host `k`'s copy (after its first line).
    fn lines(&self, k: usize, path: &str) -> Vec<String> {
        std::fs::read_to_string(self.backing(k).join(path))
            .unwrap_or_default()
            .lines()
            .skip(1)
            .map(str::to_string)
            .collect()
    }

    fn ino(&self, k: usize, path: &str) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.backing(k).join(path))
            .ok()
            .map(|m| m.ino())
    }

    fn saw(&mut self, path: &str, lines: &[String]) {
        for l in lines {
            self.seen.insert(l.clone(), path.to_string());
        }
    }

    /// Host `to`'s copy of `path` was replaced by another file: descriptors held on it
    /// (through any host that shares that copy) write to the orphan from now on.
    fn replaced(&mut self, to: usize, path: &str) {
        let copy = self.backing(to).to_path_buf();
        let on: Vec<bool> = self
            .held
            .iter()
            .map(|h| h.path == path && self.backing(h.host) == copy)
            .collect();
        for (h, on) in self.held.iter_mut().zip(on) {
            if on {
                h.orphan = true;
            }
        }
    }

    /// A sync tool carries `path` from host `from`'s copy to host `to`'s, as rsync does by
    /// default: a temporary file beside it, renamed over it (when size or mtime differ).
    /// It is a copy catching up when the target's lines are a prefix of what arrives and
    /// what arrives was committed; else it lifts (a change that may end records).
    fn sync(&mut self, from: usize, to: usize, path: &str) {
        let mut op = self.begin("sync", to);
        op.path = path.to_string();
        op.arg = format!("from {}", HOSTS[from]);
        let before = self.lines(to, path);
        let ino = self.ino(to, path);
        let src_dirty =
            self.dirty.contains(&(from, path.to_string())) || self.writing_on(from, path);
        let out = std::process::Command::new("rsync")
            .arg("-t")
            .arg(self.backing(from).join(path))
            .arg(self.backing(to).join(path))
            .output()
            .expect("rsync (Debian package rsync)");
        assert!(
            out.status.success(),
            "rsync {} -> {}: {}",
            HOSTS[from],
            HOSTS[to],
            String::from_utf8_lossy(&out.stderr)
        );
        let after = self.lines(to, path);
        op.ok = true;
        if self.ino(to, path) != ino {
            self.replaced(to, path);
            // A catch-up brings the newest version's bytes (what every host knows as current)
            // to a copy that lags (it had a prefix of them); anything else is a change.
            let forward = after.len() >= before.len() && after[..before.len()] == before[..];
            let newest = self
                .latest
                .get(path)
                .is_some_and(|l| l.as_ref() == Some(&after));
            op.lifts = after != before && (!forward || src_dirty || !newest);
            if op.lifts {
                self.latest.insert(path.to_string(), None);
            }
            if src_dirty {
                self.dirty.insert((to, path.to_string()));
            } else {
                self.dirty.remove(&(to, path.to_string()));
            }
        }
        self.saw(path, &before);
        self.saw(path, &after);
        self.finish(op);
    }

    /// Host `k`'s copy of `path` put back to older bytes behind every volume (its last
    /// `drop` lines taken off, the file replaced by a rename): a revert, which lifts.
    fn revert(&mut self, k: usize, path: &str, drop: usize) {
        let mut op = self.begin("revert", k);
        op.path = path.to_string();
        op.arg = format!("{drop} lines");
        let before = self.lines(k, path);
        let keep = before.len().saturating_sub(drop);
        let mut text = format!("{path}\n");
        for l in &before[..keep] {
            text.push_str(l);
            text.push('\n');
        }
        let tmp = self.backing(k).join(format!(".{path}.revert"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.backing(k).join(path)).unwrap();
        op.ok = true;
        op.lifts = true;
        self.latest.insert(path.to_string(), None);
        self.replaced(k, path);
        self.dirty.insert((k, path.to_string()));
        self.saw(path, &before);
        self.finish(op);
    }

    /// A sync or revert step: mostly a file carried from the copy with the most of it (a
    /// sync tool carries the newest change) to another copy; one in five from any copy to
    /// any other (a copy that lags run over a newer one); now and then a revert.
    fn copy_step(&mut self, rng: &mut Rng) {
        let n = HOSTS.len();
        let path = *rng.pick(&FILES);
        if rng.below(6) == 0 {
            let k = rng.below(n);
            let drop = 1 + rng.below(2);
            return self.revert(k, path, drop);
        }
        let from = if rng.below(5) == 0 {
            rng.below(n)
        } else {
            (0..n).max_by_key(|&k| self.lines(k, path).len()).unwrap()
        };
        let to = (from + 1 + rng.below(n - 1)) % n;
        self.sync(from, to, path);
    }

    // --- faults ----------------------------------------------------------------------------

    fn cut(&mut self, k: usize) {
        self.fault("cut", k, "ip link set down", |w| {
            w.net.cut(k);
            w.hosts[k].cut = true;
        });
    }

    fn heal(&mut self, k: usize) {
        self.fault("heal", k, "ip link set up", |w| {
            w.net.heal(k);
            w.hosts[k].cut = false;
        });
    }

    fn degrade(&mut self, k: usize, how: Degrade) {
        let kind = match how {
            Degrade::Delay => "delay",
            Degrade::Loss => "loss",
        };
        self.fault(kind, k, "tc qdisc", |w| {
            w.net.degrade(k, how);
            w.hosts[k].degraded = Some(how);
        });
    }

    fn restore(&mut self, k: usize) {
        self.fault("restore", k, "tc qdisc del", |w| {
            w.net.restore(k);
            w.hosts[k].degraded = None;
        });
    }

    fn pause(&mut self, k: usize) {
        self.fault("pause", k, "SIGSTOP", |w| {
            w.hosts[k].daemon.as_ref().unwrap().signal(libc::SIGSTOP);
            w.hosts[k].paused = true;
        });
    }

    fn resume(&mut self, k: usize) {
        if let Some(since) = self.hosts[k].asleep.take() {
            return self.fault("wake", k, "monotonic clock held back, SIGCONT", |w| {
                let h = &mut w.hosts[k];
                let pid = h.daemon.as_ref().unwrap().pid();
                h.clock.wake(pid, since);
                h.paused = false;
            });
        }
        self.fault("resume", k, "SIGCONT", |w| {
            w.hosts[k].daemon.as_ref().unwrap().signal(libc::SIGCONT);
            w.hosts[k].paused = false;
        });
    }

    /// A pause as a machine's suspend: the daemon stops, and when it runs again its
    /// monotonic clock has not moved in between (see [`World::resume`]).
    fn sleep(&mut self, k: usize) {
        self.fault("sleep", k, "SIGSTOP, clocks as in a suspend", |w| {
            let h = &mut w.hosts[k];
            let pid = h.daemon.as_ref().unwrap().pid();
            h.asleep = Some(h.clock.sleep(pid));
            h.paused = true;
        });
    }

    fn kill(&mut self, k: usize) {
        self.fault("kill", k, "kill -9", |w| {
            let mut d = w.hosts[k].daemon.take().unwrap();
            d.kill9();
            w.hosts[k].paused = false;
            w.hosts[k].asleep = None;
        });
    }

    fn restart(&mut self, k: usize) {
        self.fault("restart", k, "coherent-mount", |w| w.spawn(k));
    }

    fn etcd_kill(&mut self, m: usize) {
        self.fault("etcd-kill", 0, &format!("member {m}"), |w| {
            w.etcd.kill_member(m);
            w.etcd_down = Some(m);
        });
        self.history.last_mut().unwrap().host.clear();
    }

    fn etcd_restart(&mut self, m: usize) {
        self.fault("etcd-restart", 0, &format!("member {m}"), |w| {
            w.etcd.restart_member(m);
            w.etcd_down = None;
        });
        self.history.last_mut().unwrap().host.clear();
    }

    // --- the schedule ------------------------------------------------------------------------

    /// One step: a fault (about one step in four) or a client operation on a host that
    /// serves. Faults are bounded so the run keeps making progress: at most two hosts away
    /// (stopped, killed or cut) at once, one daemon dead, one etcd member down.
    fn step(&mut self, rng: &mut Rng) {
        let n = HOSTS.len();
        if rng.below(4) == 0 && self.fault_step(rng) {
            return;
        }
        // Drawn only in this mode, so the other modes' schedules stay as they were.
        if self.mode == Mode::Lagging && rng.below(5) == 0 {
            return self.copy_step(rng);
        }
        let serving: Vec<usize> = (0..n).filter(|&k| self.hosts[k].serving()).collect();
        if serving.is_empty() {
            return;
        }
        let mut k = *rng.pick(&serving);
        let s = rng.below(self.sessions.len());
        let mut session = self.sessions[s].clone();
        let other = self.sessions[(s + 1 + rng.below(self.sessions.len() - 1)) % 3].clone();
        let mut path = *rng.pick(&FILES);
        // Half the writes aim at the property: the giver of the newest acknowledged
        // transfer writes its path, preferably on a host that is cut off or on a bad link
        // (where it may not know of the transfer yet).
        let last_ack = self
            .history
            .iter()
            .rev()
            .find(|o| o.kind == "transfer" && o.ok)
            .map(|o| (o.session.clone(), o.path.clone()));
        if let Some((g, p)) = last_ack.filter(|_| rng.below(2) == 0) {
            session = g;
            path = FILES.iter().find(|f| **f == p).expect("a file of the run");
            let far: Vec<usize> = serving
                .iter()
                .copied()
                .filter(|&j| self.hosts[j].cut || self.hosts[j].degraded.is_some())
                .collect();
            if !far.is_empty() {
                k = *rng.pick(&far);
            }
        }
        // Held descriptors that can be asked now: on a serving host, or on a dead daemon
        // (the kernel answers at once), never on a stopped one (the call would wait for it).
        // Copies that lag also see saves by rename with a descriptor held under the other
        // name (drawn only in this mode, so the other modes' schedules stay as they were).
        if self.mode == Mode::Lagging && self.held.len() < 6 && rng.below(12) == 0 {
            return self.save_aside(k, &session, path);
        }
        let usable: Vec<usize> = (0..self.held.len())
            .filter(|&j| {
                let h = &self.held[j];
                !h.stuck && !self.hosts[h.host].paused
            })
            .collect();
        if self.mode == Mode::Lagging && !usable.is_empty() && rng.below(4) == 0 {
            return self.aim_at_held(rng, &usable, &serving);
        }
        match rng.below(100) {
            0..=21 => self.verb(k, "transfer", &session, path, Some(&other)),
            22..=29 => self.verb(k, "accept", &session, path, None),
            30..=35 => self.verb(k, "decline", &session, path, None),
            36..=43 => self.verb(k, "withdraw", &session, path, None),
            44..=61 => self.fresh_write(k, &session, path),
            62..=71 if self.held.len() < 6 => self.hold(k, &session, path),
            62..=91 if !usable.is_empty() => {
                let j = *rng.pick(&usable);
                self.held_write(j)
            }
            62..=99 if !usable.is_empty() => {
                let j = *rng.pick(&usable);
                // A close on a dead daemon's mount is only the process's own business.
                self.held_close(j)
            }
            _ => self.fresh_write(k, &session, path),
        }
    }

    /// A fault step: half the time (when something is broken) one repair, else a new
    /// fault. Bounded so the run keeps making progress: at most two hosts away (stopped,
    /// killed or cut) at once, one daemon dead, one etcd member down. False when the fault
    /// drawn does not apply now (the step is a client operation instead).
    fn fault_step(&mut self, rng: &mut Rng) -> bool {
        let n = HOSTS.len();
        let mut repairs: Vec<(&str, usize)> = Vec::new();
        for (k, h) in self.hosts.iter().enumerate() {
            if h.cut {
                repairs.push(("heal", k));
            }
            if h.degraded.is_some() {
                repairs.push(("restore", k));
            }
            if h.paused {
                repairs.push(("resume", k));
            }
            // A daemon starts only when it loads the shared state from etcd within its
            // start wait: over a healthy link (a lossy one may take longer).
            if h.daemon.is_none() && !h.cut && h.degraded.is_none() {
                repairs.push(("restart", k));
            }
        }
        if let Some(m) = self.etcd_down {
            repairs.push(("etcd-restart", m));
        }
        if !repairs.is_empty() && rng.below(2) == 0 {
            let (what, k) = *rng.pick(&repairs);
            match what {
                "heal" => self.heal(k),
                "restore" => self.restore(k),
                "resume" => self.resume(k),
                "restart" => self.restart(k),
                _ => self.etcd_restart(k),
            }
            return true;
        }
        let away = self
            .hosts
            .iter()
            .filter(|h| h.paused || h.cut || h.daemon.is_none())
            .count();
        let dead = self.hosts.iter().any(|h| h.daemon.is_none());
        let k = rng.below(n);
        let h = &self.hosts[k];
        let fine = !h.paused && !h.cut && h.daemon.is_some();
        match rng.below(5) {
            0 if fine && away < 2 => self.cut(k),
            1 if h.degraded.is_none() => {
                let how = *rng.pick(&[Degrade::Delay, Degrade::Loss]);
                self.degrade(k, how)
            }
            // Half the pauses are suspends (the monotonic clock stops too).
            2 if fine && away < 2 && rng.below(2) == 0 => self.sleep(k),
            2 if fine && away < 2 => self.pause(k),
            3 if fine && away < 2 && !dead => self.kill(k),
            4 if self.etcd_down.is_none() => {
                let m = 1 + rng.below(3);
                self.etcd_kill(m)
            }
            _ => return false,
        }
        true
    }

    /// Per-step invariant: no host that serves shows two live records of one path.
    fn check_live(&mut self) {
        for h in self.hosts.iter().filter(|h| h.serving()) {
            let st = status(h);
            let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for r in st["live"].as_array().cloned().unwrap_or_default() {
                if r["live"] == true {
                    seen.entry(r["path"].as_str().unwrap_or("").to_string())
                        .or_default()
                        .push(format!("{}->{}", r["giver"], r["successor"]));
                }
            }
            for (p, v) in seen {
                if v.len() > 1 {
                    self.violations.push(format!(
                        "host {} shows {} live records of {p} at {:.3}s (after op #{}): {v:?}",
                        h.name,
                        v.len(),
                        self.t0.elapsed().as_secs_f64(),
                        self.history.len().saturating_sub(1)
                    ));
                }
            }
        }
    }

    /// Undo every fault still in place, close every held descriptor.
    fn heal_all(&mut self) {
        for k in 0..HOSTS.len() {
            if self.hosts[k].paused {
                self.resume(k);
            }
            if self.hosts[k].cut {
                self.heal(k);
            }
            if self.hosts[k].degraded.is_some() {
                self.restore(k);
            }
        }
        if let Some(m) = self.etcd_down {
            self.etcd_restart(m);
        }
        for k in 0..HOSTS.len() {
            if self.hosts[k].daemon.is_none() {
                self.restart(k);
            }
        }
        while !self.held.is_empty() {
            if self.held[0].stuck {
                // Its answer may still come now that its host runs again.
                let h = self.held.remove(0);
                drop(h.w);
                continue;
            }
            self.held_close(0);
        }
    }

    /// What a host shows once it is confirmed: its records and the versions of the files.
    fn view(&self, k: usize) -> Option<(BTreeSet<String>, Vec<Option<u64>>)> {
        let h = &self.hosts[k];
        let (_, v) = cli_json(h, None, &["status"]);
        if v["status"]["coordinator"]["confirmed"] != true {
            return None;
        }
        let st = status(h);
        let recs: BTreeSet<String> = ["live", "ended"]
            .iter()
            .flat_map(|k| st[*k].as_array().cloned().unwrap_or_default())
            .map(|r| record_key(&r))
            .collect();
        // Only a path with records has a shared version: once its ended records are
        // evicted, each host counts its changes on its own again (docs/multi-host.md).
        let shared = |f: &str| {
            recs.iter()
                .any(|r: &String| r.starts_with(&format!("{f} ")))
        };
        let versions = FILES
            .iter()
            .map(|f| shared(f).then(|| version(h, f)).flatten())
            .collect();
        Some((recs, versions))
    }
}

/// The fields of a record every host must agree on.
fn record_key(r: &Value) -> String {
    format!(
        "{} {}->{} {} live={} v{} created={}",
        r["path"].as_str().unwrap_or("?"),
        r["giver"].as_str().unwrap_or("?"),
        r["successor"].as_str().unwrap_or("?"),
        r["status"].as_str().unwrap_or("?"),
        r["live"],
        r["version_at_transfer"],
        r["created"].as_str().unwrap_or("?"),
    )
}

/// The tags of the lines of every file in the backing directory: tag -> file.
fn landed(backing: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for f in FILES {
        let text = std::fs::read_to_string(backing.join(f)).unwrap_or_default();
        for l in text.lines().skip(1) {
            out.insert(l.to_string(), f.to_string());
        }
    }
    out
}

/// The checker: every violation of the promises in the module comment, each with the
/// operations that show it.
fn check(history: &[Op], landed: &BTreeMap<String, String>) -> Vec<String> {
    let mut bad = Vec::new();
    // A write through a descriptor whose file was replaced lands in the orphan, nowhere
    // anyone reads: neither a loss nor anyone's work erased.
    let writes: Vec<&Op> = history
        .iter()
        .filter(|o| o.kind == "write" && !o.orphan)
        .collect();
    let by_tag: BTreeMap<&str, &Op> = writes.iter().map(|o| (o.arg.as_str(), *o)).collect();
    // Landed means admitted, and admitted means landed.
    for (tag, file) in landed {
        match by_tag.get(tag.as_str()) {
            None => bad.push(format!(
                "{file} holds a line no write of the history wrote: {tag}"
            )),
            Some(o) if o.refused => {
                bad.push(format!("a refused write landed in {file}:\n  {}", o.line()))
            }
            Some(o) if o.path != *file => bad.push(format!(
                "a write landed in {file}, not its path:\n  {}",
                o.line()
            )),
            _ => {}
        }
    }
    for o in &writes {
        if o.ok && !landed.contains_key(&o.arg) {
            bad.push(format!(
                "an admitted write is missing from {}:\n  {}",
                o.path,
                o.line()
            ));
        }
    }
    // No giver write after the acknowledgement, while nothing could have lifted the fence.
    // A save by rename onto the path is a write of it.
    let writes_and_saves: Vec<&Op> = history
        .iter()
        .filter(|o| (o.kind == "write" && !o.orphan) || o.kind == "rename")
        .collect();
    for x in history.iter().filter(|o| o.kind == "transfer" && o.ok) {
        let (p, g, s) = (&x.path, &x.session, &x.arg);
        for w in &writes_and_saves {
            let admitted = w.ok || landed.contains_key(&w.arg);
            if !admitted || w.path != *p || w.session != *g || w.start <= x.end {
                continue;
            }
            // A later transfer by the giver of the same path supersedes this one: the
            // record is then the later one's, and a decline by its receiver ends it
            // (conservatively: attempts count whatever they answered).
            let superseded_to = |who: &str, before: f64| {
                history.iter().any(|y| {
                    y.kind == "transfer"
                        && y.path == *p
                        && y.session == *g
                        && y.arg == who
                        && y.i != x.i
                        && y.start > x.start
                        && y.start < before
                })
            };
            // Anything on the path that may have ended or moved the record, started after
            // the transfer started and before the write ended (conservatively: attempts
            // count whatever they answered).
            let lifts = |o: &&Op| {
                o.path == *p
                    && o.start > x.start
                    && o.start < w.end
                    && o.i != x.i
                    && match o.kind.as_str() {
                        "withdraw" => o.session == *g,
                        "decline" => o.session == *s || superseded_to(&o.session, o.start),
                        "transfer" => o.session != *g,
                        "write" | "rename" => {
                            o.session != *g && (o.ok || !o.refused || landed.contains_key(&o.arg))
                        }
                        "close" => o.session != *g,
                        "sync" | "revert" => o.lifts,
                        _ => false,
                    }
            };
            // A change to a copy (a sync or revert that lifts) is found by that host only
            // when it next looks at the file: made before the transfer, it may still end
            // the record after it, until that host has surely looked (opened the file
            // through its mount: an admitted write, or an acknowledged transfer's read).
            let latent = |o: &&Op| {
                o.path == *p
                    && o.lifts
                    && o.start <= x.start
                    && !history.iter().any(|l| {
                        l.host == o.host
                            && l.path == *p
                            && l.start > o.end
                            && l.start < x.start
                            && l.ok
                            && ((l.kind == "write" && l.via == "fresh")
                                || l.kind == "transfer"
                                || l.kind == "rename")
                    })
            };
            if history.iter().any(|o| lifts(&o) || latent(&o)) {
                continue;
            }
            let mut msg = format!(
                "a write by giver {g} on {p} was admitted after its transfer to {s} was \
                 acknowledged, with nothing in between that could end the record:\n  {}\n  {}\n\
                 everything in between (operations on {p} and faults):",
                x.line(),
                w.line()
            );
            for o in history
                .iter()
                .filter(|o| o.i > x.i && o.i < w.i && (o.path == *p || o.is_fault()))
            {
                let _ = write!(msg, "\n    {}", o.line());
            }
            let _ = write!(
                msg,
                "\nfaults in place at the transfer: {}; at the write: {}",
                faults_at(history, x.i),
                faults_at(history, w.i)
            );
            bad.push(msg);
        }
    }
    bad
}

/// The faults in place just before operation `i` (replayed from the history).
fn faults_at(history: &[Op], i: usize) -> String {
    let mut on: BTreeMap<String, &str> = BTreeMap::new();
    for o in &history[..i] {
        let key = |what: &str| format!("{what} {}{}", o.host, o.arg);
        match o.kind.as_str() {
            "cut" => drop(on.insert(format!("host {}", o.host), "cut")),
            "pause" => drop(on.insert(format!("host {}", o.host), "stopped")),
            "sleep" => drop(on.insert(format!("host {}", o.host), "asleep")),
            "kill" => drop(on.insert(format!("host {}", o.host), "dead")),
            "heal" | "resume" | "wake" | "restart" => {
                on.remove(&format!("host {}", o.host));
            }
            "delay" | "loss" => drop(on.insert(format!("link {}", o.host), o.kind.as_str())),
            "restore" => drop(on.remove(&format!("link {}", o.host))),
            "etcd-kill" => drop(on.insert(key("etcd"), "down")),
            "etcd-restart" => drop(on.remove(&key("etcd"))),
            _ => {}
        }
    }
    if on.is_empty() {
        return "none".into();
    }
    on.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// `PARTITION_COPIES`: `1`, each host mounts its own copy of the workspace, synced after
/// every write; `lag`, synced on a schedule of its own, by replace, with reverts.
fn mode() -> Mode {
    match std::env::var("PARTITION_COPIES").as_deref() {
        Ok("1") => Mode::Copies,
        Ok("lag") => Mode::Lagging,
        Ok("") | Ok("0") | Err(_) => Mode::Shared,
        Ok(v) => panic!("PARTITION_COPIES={v:?}: use 1 (synced after every write) or lag"),
    }
}

/// The seed: `PARTITION_SEED` (a number or `random`), else the CI run's.
fn seed() -> u64 {
    match std::env::var("PARTITION_SEED").as_deref() {
        Ok("random") => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000
        }
        Ok(_) => env_or("PARTITION_SEED", DEFAULT_SEED),
        Err(_) => DEFAULT_SEED,
    }
}

/// The CI run: the mode `PARTITION_COPIES` names (one backing directory unless set).
#[test]
fn a_seeded_schedule_of_faults_keeps_every_fence() {
    run(mode(), seed());
}

/// The CI run on copies that lag (a sync on its own schedule, by replace; reverts), with a
/// seed of its own unless `PARTITION_SEED` names one.
#[test]
fn a_seeded_schedule_on_copies_that_lag_keeps_every_fence() {
    let seed = match std::env::var("PARTITION_SEED") {
        Ok(_) => seed(),
        Err(_) => DEFAULT_LAG_SEED,
    };
    run(Mode::Lagging, seed);
}

fn run(mode: Mode, seed: u64) {
    let steps = env_or("PARTITION_STEPS", DEFAULT_STEPS);
    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut w = World::new(mode);
    eprintln!(
        "partition: seed {seed}, {steps} steps, 3 hosts ({}), 3-member etcd, link faults by {}",
        mode.describe(),
        w.net.degrade_kind()
    );
    for _ in 0..steps {
        w.step(&mut rng);
        w.check_live();
    }
    w.heal_all();
    // Convergence: every host confirmed with the same records and versions.
    let mut views = Vec::new();
    let converged = wait_until(CONVERGE, || {
        views = (0..HOSTS.len()).map(|k| w.view(k)).collect();
        views.iter().all(Option::is_some) && views.windows(2).all(|v| v[0] == v[1])
    });
    if !converged {
        let mut msg = format!("the hosts did not converge within {CONVERGE:?} of the heal:");
        for (k, v) in views.iter().enumerate() {
            let _ = write!(msg, "\n  host {}: {v:?}", HOSTS[k]);
        }
        w.violations.push(msg);
    } else {
        // Every acknowledged transfer is known to every host, or its record ended and was
        // evicted (a host logged an `evict` of a record of that path and giver).
        let (recs, _) = views[0].clone().unwrap();
        let evicted: BTreeSet<(String, String)> = w
            .hosts
            .iter()
            .flat_map(events)
            .filter(|e| e["event"] == "evict")
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
                (s("path"), s("giver"))
            })
            .collect();
        for x in w.history.iter().filter(|o| o.kind == "transfer" && o.ok) {
            let known = recs.iter().any(|r| {
                r.starts_with(&format!("{} {}->{} ", x.path, x.session, x.arg))
                    && x.created
                        .as_ref()
                        .is_none_or(|c| r.ends_with(&format!("created={c}")))
            }) || evicted.contains(&(x.path.clone(), x.session.clone()));
            if !known {
                w.violations.push(format!(
                    "an acknowledged transfer is not among the hosts' records:\n  {}",
                    x.line()
                ));
            }
        }
    }
    // With copies synced after every write, every copy holds the same. With copies that
    // lag, a line is in some copy, or was seen in one before a sync or revert erased it.
    let mut landed: BTreeMap<String, String> = BTreeMap::new();
    for b in &w.backings {
        landed.extend(self::landed(b));
    }
    landed.extend(std::mem::take(&mut w.seen));
    let mut violations = std::mem::take(&mut w.violations);
    violations.extend(check(&w.history, &landed));
    // `PARTITION_KEEP=1`: each host's events, daemon log and copy, for a look after the run.
    if std::env::var_os("PARTITION_KEEP").is_some() {
        let keep = std::env::temp_dir().join(format!("coherent-partition-{seed}-kept"));
        let _ = std::fs::remove_dir_all(&keep);
        std::fs::create_dir_all(&keep).unwrap();
        for (k, h) in w.hosts.iter().enumerate() {
            let n = h.name;
            let _ = std::fs::copy(
                h.mnt.join(".coherent/events"),
                keep.join(format!("events-{n}")),
            );
            let _ = std::fs::copy(&h.log, keep.join(format!("daemon-{n}.log")));
            for f in FILES {
                let _ = std::fs::copy(w.backing(k).join(f), keep.join(format!("{n}-{f}")));
            }
        }
        eprintln!("partition: kept in {}", keep.display());
    }
    // The history, kept for a look after the run.
    let file = std::env::temp_dir().join(format!("coherent-partition-{seed}.history"));
    let text: String = w.history.iter().map(|o| o.line() + "\n").collect();
    let _ = std::fs::write(&file, text);
    let count = |k: &str| w.history.iter().filter(|o| o.kind == k).count();
    let acked = w
        .history
        .iter()
        .filter(|o| o.kind == "transfer" && o.ok)
        .count();
    let admitted = w
        .history
        .iter()
        .filter(|o| o.kind == "write" && o.ok)
        .count();
    // Host A's log holds every host's events.
    let evictions = events(&w.hosts[0])
        .iter()
        .filter(|e| e["event"] == "evict")
        .count();
    let lifting = w.history.iter().filter(|o| o.lifts).count();
    let orphans = w.history.iter().filter(|o| o.orphan).count();
    eprintln!(
        "partition: seed {seed}: {} operations ({} transfers, {acked} acknowledged; {} writes, \
         {admitted} admitted, {} landed, {orphans} into an orphan; {} held opens; {} saves by \
         rename; {} syncs and {} reverts, {lifting} of them changes; {evictions} records evicted), faults \
         {:?}, {} violations, {:.1}s; \
         history in {}",
        w.history.len(),
        count("transfer"),
        count("write"),
        landed.len(),
        count("open"),
        count("rename"),
        count("sync"),
        count("revert"),
        w.faults,
        violations.len(),
        started.elapsed().as_secs_f64(),
        file.display()
    );
    assert!(
        violations.is_empty(),
        "seed {seed} ({steps} steps, {mode:?}; rerun with PARTITION_SEED={seed} \
         PARTITION_STEPS={steps}{}): {} violation(s):\n{}",
        match mode {
            Mode::Shared => "",
            Mode::Copies => " PARTITION_COPIES=1",
            Mode::Lagging => " PARTITION_COPIES=lag",
        },
        violations.len(),
        violations.join("\n\n")
    );
}

/// The checker itself: a giver's write admitted after its acknowledged transfer, with
/// nothing in between, is a violation; the same write after a withdraw is not.
#[test]
fn the_checker_flags_a_giver_write_after_the_acknowledgement() {
    let op = |i: usize, kind: &str, session: &str, arg: &str, t: f64| Op {
        i,
        kind: kind.into(),
        host: "A".into(),
        session: session.into(),
        path: "f0.md".into(),
        arg: arg.into(),
        start: t,
        end: t + 1.0,
        ok: true,
        ..Op::default()
    };
    let landed: BTreeMap<String, String> = [("w1-A-s0".to_string(), "f0.md".to_string())].into();
    let bad = vec![
        op(0, "transfer", "s0", "s1", 0.0),
        op(1, "write", "s0", "w1-A-s0", 5.0),
    ];
    assert_eq!(check(&bad, &landed).len(), 1, "{:?}", check(&bad, &landed));
    let cut = Op {
        i: 0,
        kind: "cut".into(),
        host: "A".into(),
        ..Op::default()
    };
    let mut shown = vec![cut];
    shown.extend(bad.iter().cloned().map(|o| Op { i: o.i + 1, ..o }));
    let v = check(&shown, &landed);
    assert!(
        v.len() == 1 && v[0].ends_with("at the transfer: host A cut; at the write: host A cut"),
        "{v:?}"
    );
    let lifted = vec![
        op(0, "transfer", "s0", "s1", 0.0),
        op(1, "withdraw", "s0", "", 2.0),
        op(2, "write", "s0", "w1-A-s0", 5.0),
    ];
    assert!(check(&lifted, &landed).is_empty());
    let mut refused = bad.clone();
    refused[1].ok = false;
    refused[1].refused = true;
    let found = check(&refused, &landed);
    assert!(
        found
            .iter()
            .any(|v| v.starts_with("a refused write landed")),
        "{found:?}"
    );
    assert!(
        check(&bad[..1], &BTreeMap::new()).is_empty(),
        "a transfer alone"
    );
    // The giver hands the file on again, to s2 (superseding the record to s1), and s2
    // declines: the record ends, the giver may write (seed 5151 in copy mode).
    let superseded = vec![
        op(0, "transfer", "s0", "s1", 0.0),
        op(1, "transfer", "s0", "s2", 2.0),
        op(2, "decline", "s2", "", 3.0),
        op(3, "write", "s0", "w1-A-s0", 5.0),
    ];
    assert!(
        check(&superseded, &landed).is_empty(),
        "{:?}",
        check(&superseded, &landed)
    );
    // ... but a decline by someone no transfer of the giver named lifts nothing (the
    // write is then after each of the two acknowledgements).
    let mut stranger = superseded.clone();
    stranger[2].session = "s3".into();
    assert_eq!(check(&stranger, &landed).len(), 2);
    // ... nor one made before the superseding transfer.
    let early = vec![
        op(0, "transfer", "s0", "s1", 0.0),
        op(1, "decline", "s2", "", 1.5),
        op(2, "transfer", "s0", "s2", 2.0),
        op(3, "write", "s0", "w1-A-s0", 5.0),
    ];
    assert_eq!(
        check(&early, &landed).len(),
        2,
        "{:?}",
        check(&early, &landed)
    );
}
