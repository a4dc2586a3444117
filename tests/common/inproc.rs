//! The in-process harness: the filesystem type [`Fs`] with the real volume policy (the
//! one `coherent-mount` wires: the volume is both the policy and the `.coherent/`
//! backend), over a backing directory in a temp dir. No mount, no kernel: the test calls
//! `Fs` as the FUSE adapter would, with the caller of each request.
//!
//! Callers are real processes ([`Agent`]: a `sleep` with `COHERENT_SESSION` set), so the
//! policy resolves their sessions from the real /proc, as it does under a mount.
//!
//! This file is the only place a test builds the volume policy: when its constructor
//! changes, only [`InProc::with`] changes.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coherent::coherence::StaleMode;
use coherent::fs::{Fs, FsOptions, Policy};
use coherent::request_timeout::Started;
use coherent::store::{Caller, FsError, SetAttr, Stamp, Store, Time, XattrReply, ROOT_INO};
use coherent::volume::{Volume, VolumeConfig};
use serde_json::Value;

/// A session's process: a real child with `COHERENT_SESSION` set, and the caller a FUSE
/// request of it would carry.
pub struct Agent {
    /// None for [`Agent::outside`]: no process behind the caller.
    child: Option<Child>,
    who: Caller,
}

impl Agent {
    pub fn new(session: &str) -> Agent {
        let child = Command::new("sleep")
            .arg("60")
            .env("COHERENT_SESSION", session)
            .spawn()
            .expect("spawn sleep");
        // The environment is readable once the child has exec'd.
        let environ = format!("/proc/{}/environ", child.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        while !std::fs::read(&environ)
            .map(|e| e.windows(session.len()).any(|w| w == session.as_bytes()))
            .unwrap_or(false)
        {
            assert!(Instant::now() < deadline, "sleep never exec'd");
            std::thread::yield_now();
        }
        let who = Caller {
            pid: child.id(),
            uid: 0,
            gid: 0,
            started: Started::now(),
        };
        Agent {
            child: Some(child),
            who,
        }
    }

    /// A process with no session tag at all (an empty environment but `PATH`): the volume
    /// sees an unattributed caller.
    pub fn unattributed() -> Agent {
        let child = Command::new("sleep")
            .arg("60")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .spawn()
            .expect("spawn sleep");
        // Exec'd once its environment is the cleared one, not the parent's copy.
        let environ = format!("/proc/{}/environ", child.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read(&environ).map_or(true, |e| !e.starts_with(b"PATH=/usr/bin:/bin\0")) {
            assert!(Instant::now() < deadline, "sleep never exec'd");
            std::thread::yield_now();
        }
        let who = Caller {
            pid: child.id(),
            uid: 0,
            gid: 0,
            started: Started::now(),
        };
        Agent {
            child: Some(child),
            who,
        }
    }

    /// A caller the volume cannot resolve: pid 0, what FUSE sends for a process outside
    /// the daemon's pid namespace (docs/design.md#sessions), as uid 0. No process behind it.
    pub fn outside() -> Agent {
        let who = Caller {
            pid: 0,
            uid: 0,
            gid: 0,
            started: Started::now(),
        };
        Agent { child: None, who }
    }

    /// The caller of a request of this process beginning now (a FUSE request's waits are
    /// bounded from its start: src/request_timeout.rs).
    pub fn caller(&self) -> Caller {
        Caller {
            started: Started::now(),
            ..self.who
        }
    }

    /// Kill the process and reap it (its /proc entry is gone afterwards).
    pub fn kill(&mut self) {
        let child = self.child.as_mut().expect("a process to kill");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The settings of a harness volume that tests vary (the rest is `coherent-mount`'s
/// default).
#[derive(Debug, Clone)]
pub struct Setup {
    /// `--stale`.
    pub stale: StaleMode,
    /// How long a transfer waits for a handle that is closing (long here: a loaded test
    /// machine must not turn a wait into a refusal).
    pub in_flight_wait: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            stale: StaleMode::default(),
            in_flight_wait: Duration::from_secs(5),
        }
    }
}

/// A volume with the real policy over `backing`, and its state in `state`.
pub struct InProc {
    _dir: tempfile::TempDir,
    pub backing: PathBuf,
    /// The volume (its engine, journal and resolver).
    pub vol: Arc<Volume>,
    /// The volume's write policy, for tests that call its hooks directly.
    pub pol: Arc<dyn Policy>,
    pub fs: Fs,
}

impl InProc {
    pub fn new() -> InProc {
        InProc::with(Setup::default())
    }

    pub fn with(setup: Setup) -> InProc {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("backing");
        let state = dir.path().join("state");
        std::fs::create_dir_all(&backing).unwrap();
        let mut cfg = VolumeConfig::new(state, dir.path().join("mnt"));
        cfg.in_flight_wait = setup.in_flight_wait;
        cfg.engine.stale = setup.stale;
        // What coherent-mount wires: the store, the volume over its backing directory as
        // the policy and the `.coherent/` backend, and the filesystem over them.
        let (vol, fs) = Volume::open_fs(
            cfg,
            Store::open_root(&backing).unwrap(),
            FsOptions::default(),
        )
        .unwrap();
        InProc {
            _dir: dir,
            backing,
            pol: vol.policy(),
            vol,
            fs,
        }
    }

    /// Write a backing file directly (behind the volume's back).
    pub fn write_file(&self, p: &str, data: &str) {
        std::fs::write(self.backing.join(p), data).unwrap();
    }

    /// The content of a backing file (None: no such file).
    pub fn content(&self, p: &str) -> Option<String> {
        std::fs::read_to_string(self.backing.join(p)).ok()
    }

    /// The backing file's stamp, as the store takes it.
    pub fn stamp(&self, p: &str) -> Stamp {
        let m = std::fs::symlink_metadata(self.backing.join(p)).unwrap();
        Stamp {
            ino: m.ino(),
            ctime: Time {
                sec: m.ctime(),
                nsec: m.ctime_nsec() as u32,
            },
            mtime: Time {
                sec: m.mtime(),
                nsec: m.mtime_nsec() as u32,
            },
            size: m.size(),
        }
    }

    /// The inode of a workspace-relative path, looked up by `a` one name at a time as
    /// the kernel would; the errno of the first lookup that fails.
    pub fn ino(&self, a: &Agent, p: &str) -> Result<u64, i32> {
        let mut ino = ROOT_INO;
        for name in Path::new(p).iter() {
            let e = self
                .fs
                .lookup(&a.caller(), ino, name)
                .map_err(|e| e.errno())?;
            ino = e.attr.ok_or(libc::ENOENT)?.ino;
        }
        Ok(ino)
    }

    /// The parent's inode and the last name of `p`.
    pub fn at<'p>(&self, a: &Agent, p: &'p str) -> (u64, &'p OsStr) {
        let path = Path::new(p);
        let parent = match path.parent().and_then(|d| d.to_str()) {
            Some("") | None => ROOT_INO,
            Some(d) => self.ino(a, d).unwrap(),
        };
        (parent, path.file_name().unwrap())
    }

    /// `a` opens `p` for reading and closes it (its view: an `S` hold).
    pub fn read(&self, a: &Agent, p: &str) -> Result<(), i32> {
        let ino = self.ino(a, p)?;
        let o = self
            .fs
            .open(&a.caller(), ino, libc::O_RDONLY)
            .map_err(|e| e.errno())?;
        self.fs.release(&a.caller(), ino, o.fh);
        Ok(())
    }

    /// `a` opens `p` for reading, reads it whole and closes it: the bytes `a` read.
    pub fn cat(&self, a: &Agent, p: &str) -> Result<String, i32> {
        let ino = self.ino(a, p)?;
        let o = self
            .fs
            .open(&a.caller(), ino, libc::O_RDONLY)
            .map_err(|e| e.errno())?;
        let data = self.read_fh(a, ino, o.fh);
        self.fs.release(&a.caller(), ino, o.fh);
        Ok(data)
    }

    /// `a` opens `p` with `flags` (creating it if `O_CREAT` and missing), writes `data`
    /// at `offset` if any, and closes it (FLUSH, RELEASE): one write as a tool does it.
    pub fn write(&self, a: &Agent, p: &str, flags: i32, data: Option<&[u8]>) -> Result<(), i32> {
        let c = &a.caller();
        let (ino, fh) = match self.ino(a, p) {
            Ok(ino) => (ino, self.fs.open(c, ino, flags).map_err(|e| e.errno())?.fh),
            Err(libc::ENOENT) if flags & libc::O_CREAT != 0 => {
                let (dir, name) = self.at(a, p);
                let made = self
                    .fs
                    .create(c, dir, name, 0o644, 0, flags)
                    .map_err(|e| e.errno())?;
                (made.entry.attr.unwrap().ino, made.opened.fh)
            }
            Err(e) => return Err(e),
        };
        let wrote = match data {
            Some(d) => {
                let off = if flags & libc::O_APPEND != 0 {
                    std::fs::metadata(self.backing.join(p)).unwrap().len()
                } else {
                    0
                };
                self.fs.write(c, ino, fh, off, d).map(drop)
            }
            None => Ok(()),
        };
        let flushed = self.fs.flush(c, ino, fh).map(drop);
        self.fs.release(c, ino, fh);
        wrote.and(flushed).map_err(|e| e.errno())
    }

    /// A setattr of `p` by `a` (no handle).
    pub fn setattr(&self, a: &Agent, p: &str, set: &SetAttr) -> Result<(), i32> {
        let ino = self.ino(a, p)?;
        self.fs
            .setattr(&a.caller(), ino, set, None)
            .map(drop)
            .map_err(|e| e.errno())
    }

    /// `rename(from, to)` with `RENAME_*` flags, by `a`.
    pub fn rename(&self, a: &Agent, from: &str, to: &str, flags: u32) -> Result<(), i32> {
        let ((fp, fname), (tp, tname)) = (self.at(a, from), self.at(a, to));
        self.fs
            .rename(&a.caller(), fp, fname, tp, tname, flags)
            .map_err(|e| e.errno())
    }

    /// `mkdir p` by `a` (mode 0755).
    pub fn mkdir(&self, a: &Agent, p: &str) -> Result<(), i32> {
        let (dir, name) = self.at(a, p);
        let made = self.fs.mkdir(&a.caller(), dir, name, 0o755, 0);
        made.map(drop).map_err(|e| e.errno())
    }

    /// `unlink(p)` by `a`.
    pub fn unlink(&self, a: &Agent, p: &str) -> Result<(), i32> {
        let (dir, name) = self.at(a, p);
        self.fs
            .unlink(&a.caller(), dir, name)
            .map_err(|e| e.errno())
    }

    /// `symlink(target, p)` by `a`.
    pub fn symlink(&self, a: &Agent, p: &str, target: &str) -> Result<(), i32> {
        let (dir, name) = self.at(a, p);
        let made = self.fs.symlink(&a.caller(), dir, name, Path::new(target));
        made.map(drop).map_err(|e| e.errno())
    }

    /// The inode of `.coherent/NAME`, looked up through the filesystem.
    pub fn surface_file(&self, a: &Agent, name: &str) -> u64 {
        self.ino(a, &format!(".coherent/{name}")).unwrap()
    }

    /// A request written to `.coherent/ctl` by `a`: Ok, or the errno of the write.
    pub fn ctl(&self, a: &Agent, req: &str) -> Result<(), i32> {
        self.ctl_reply(a, req).0
    }

    /// A request written to `.coherent/ctl` by `a`, and the reply read back on the same
    /// descriptor (JSON; Null if there is none).
    pub fn ctl_reply(&self, a: &Agent, req: &str) -> (Result<(), i32>, Value) {
        let ctl = self.surface_file(a, "ctl");
        let o = self.fs.open(&a.caller(), ctl, libc::O_RDWR).unwrap();
        let r = self.fs.write(&a.caller(), ctl, o.fh, 0, req.as_bytes());
        let reply = self.read_fh(a, ctl, o.fh);
        self.fs.release(&a.caller(), ctl, o.fh);
        let reply = serde_json::from_str(&reply).unwrap_or(Value::Null);
        (r.map(drop).map_err(|e| e.errno()), reply)
    }

    fn read_fh(&self, a: &Agent, ino: u64, fh: u64) -> String {
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Box::new(move |r| tx.send(r).unwrap());
        self.fs.read(&a.caller(), ino, fh, 0, 1 << 20, done);
        String::from_utf8(rx.recv().unwrap().unwrap_or_default()).unwrap()
    }

    /// The content of `.coherent/NAME` as `a` reads it.
    pub fn read_surface(&self, a: &Agent, name: &str) -> String {
        let ino = self.surface_file(a, name);
        let o = self.fs.open(&a.caller(), ino, libc::O_RDONLY).unwrap();
        assert!(o.fopen.direct_io);
        let data = self.read_fh(a, ino, o.fh);
        self.fs.release(&a.caller(), ino, o.fh);
        data
    }

    /// `.coherent/why` as `a` reads it.
    pub fn why(&self, a: &Agent) -> String {
        self.read_surface(a, "why")
    }

    /// `.coherent/status` as `a` reads it.
    pub fn status(&self, a: &Agent) -> Value {
        serde_json::from_str(&self.read_surface(a, "status")).unwrap()
    }

    /// The newest record of `p` (live or ended) in `.coherent/status`.
    pub fn record(&self, a: &Agent, p: &str) -> Option<Value> {
        let st = self.status(a);
        let mut v: Vec<Value> = ["live", "ended"]
            .iter()
            .flat_map(|k| st[*k].as_array().cloned().unwrap_or_default())
            .filter(|r| r["path"] == p)
            .collect();
        v.sort_by(|a, b| a["updated"].as_str().cmp(&b["updated"].as_str()));
        v.pop()
    }

    /// `user.coherent.version` of `p` as `a` reads it through the filesystem.
    pub fn version(&self, a: &Agent, p: &str) -> Option<u64> {
        let ino = self.ino(a, p).ok()?;
        let name = OsStr::new("user.coherent.version");
        match self.fs.getxattr(&a.caller(), ino, name, 64).ok()? {
            XattrReply::Data(d) => String::from_utf8(d).ok()?.trim().parse().ok(),
            XattrReply::Size(_) => None,
        }
    }

    /// Every event of the state log, flushed first.
    pub fn events(&self) -> Vec<Value> {
        self.vol.journal().flush().unwrap();
        self.log()
    }

    fn log(&self) -> Vec<Value> {
        let log = self.vol.journal().read_log(0, 1 << 24).unwrap();
        String::from_utf8(log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// What a reader of the log sees now, without flushing it first (docs/design.md#state-log:
    /// a `denied` event is in the log when the call returns).
    pub fn events_written(&self, kind: &str, session: &str) -> Vec<Value> {
        self.log()
            .into_iter()
            .filter(|e| e["event"] == kind && e["session"] == session)
            .collect()
    }

    pub fn events_of(&self, kind: &str, session: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == kind && e["session"] == session)
            .collect()
    }

    /// Every event of that kind on `path`, of any session (flushed first).
    pub fn events_on(&self, kind: &str, path: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == kind && e["path"] == path)
            .collect()
    }

    /// The version the log last gave `path` (its last commit or counted external change):
    /// what a path with no name left to read an xattr of is at.
    pub fn committed_version(&self, path: &str) -> Option<u64> {
        self.events()
            .iter()
            .filter(|e| e["path"] == path)
            .filter(|e| e["event"] == "commit" || e["event"] == "external_change")
            .filter_map(|e| e["version"].as_u64())
            .next_back()
    }

    /// The events in `.coherent/events` as `a` reads it through the filesystem, no flush
    /// first: what a reader of the file sees when the call before returned.
    pub fn read_events(&self, a: &Agent) -> Vec<Value> {
        self.read_surface(a, "events")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Wait (up to 10 s) for the n-th event of that kind and session.
    pub fn await_event(&self, kind: &str, session: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let evs = self.events_of(kind, session);
            if evs.len() >= n || Instant::now() > deadline {
                return evs;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// An error of the filesystem as its errno (for `assert_eq!` on results).
pub fn errno<T>(r: Result<T, FsError>) -> Result<T, i32> {
    r.map_err(|e| e.errno())
}
