//! The `.coherent/` directory of docs/design.md#control-surface as a pseudo filesystem:
//! `ctl` (one request per write, the reply read back from the same handle), `status`,
//! `events`, `whoami`, `why`, `inbox` (and the unlisted `changes`). It owns the open
//! handles of the tree and the waiting `ctl` handles; what a file says, and what a
//! request does, it asks of the [`Verbs`] server.
//!
//! Content that depends on the reader (`whoami`, `why`, `inbox`) and `status` are computed
//! once, at open, for the opener's session: a reader sees one consistent snapshot however
//! it reads. `events` reads the journal at the requested offset, so a reader follows it as
//! it grows; its size is the log's length and its mtime moves when the log grows (the
//! adapter gives virtual nodes an attribute TTL of 0, so `tail -f` and `coherent watch`
//! see both). Per-reader files report size 0 (like `/proc`): they are opened with direct
//! I/O, so readers read until EOF. Only `ctl` is writable (mode 0666, any user may send a
//! request; the verbs decide who may do what).

pub(super) mod views;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::sessions;
use super::verbs::Verbs;
use super::waits::{self, Check, Waits};
use crate::access::Who;
use crate::control::{CtlHandle, Reply, Request, Verb};
use crate::error::{Reason, Refusal};
use crate::fs::{open_writes, PseudoFs, ReadDone};
use crate::store::{
    Attr, Caller, DirEntry, FsError, FsResult, Kind, Time, ROOT_INO, VIRTUAL_INO_BIT,
};
use crate::visibility::LogView;
use views::Views;

const DIR: u64 = VIRTUAL_INO_BIT | 1;
const CTL: u64 = VIRTUAL_INO_BIT | 2;
const STATUS: u64 = VIRTUAL_INO_BIT | 3;
const EVENTS: u64 = VIRTUAL_INO_BIT | 4;
const WHOAMI: u64 = VIRTUAL_INO_BIT | 5;
const WHY: u64 = VIRTUAL_INO_BIT | 6;
const INBOX: u64 = VIRTUAL_INO_BIT | 7;
const CHANGES: u64 = VIRTUAL_INO_BIT | 8;
const WAITS: u64 = VIRTUAL_INO_BIT | 9;

const FILES: [(&str, u64); 6] = [
    ("ctl", CTL),
    ("status", STATUS),
    ("events", EVENTS),
    ("whoami", WHOAMI),
    ("why", WHY),
    ("inbox", INBOX),
];

/// Files reachable by name but not listed: `ls .coherent` shows the files of the contract
/// and nothing else. `changes` is for git's fsmonitor hook (docs/git.md); `waits` lists the
/// reader's session's waits, in flight and standing (docs/agents.md#standing-waits).
const UNLISTED: [(&str, u64); 2] = [("changes", CHANGES), ("waits", WAITS)];

/// One open handle of a virtual file.
enum VHandle {
    Ctl(CtlHandle),
    /// Content computed at open.
    Text(Vec<u8>),
    /// The journal, read at each offset plus `shift`: a reader that started below the
    /// log's base (compacted away) is moved up to the base once, and stays moved, so it
    /// reads each event once. For root, who sees every path.
    Events {
        shift: u64,
    },
    /// The journal as another reader may see it: only lines of paths it could look up.
    SeenEvents(LogView),
    /// `changes`: the answer for the changes after the offset of the first read, kept
    /// with that offset, so the reply reads as if it were placed there (a hook reads it
    /// with `pread` at its token's sequence; `cat` reads the whole ring from 0).
    Changes {
        who: Who,
        kept: Option<(u64, Vec<u8>)>,
    },
}

/// The `.coherent/` tree: its open handles and the state of `events`' mtime.
pub struct ControlFs {
    /// What a `ctl` request does.
    verbs: Arc<Verbs>,
    /// What the other files show their reader.
    views: Views,
    handles: Mutex<HashMap<u64, Arc<Mutex<VHandle>>>>,
    next: AtomicU64,
    /// (log length last reported, when it was first seen at that length).
    events_seen: Mutex<(u64, Time)>,
    started: Time,
    uid: u32,
    gid: u32,
    /// `ctl` handles waiting for a `wait` request's answer, and their kept reads.
    waits: Waits,
}

fn time_now() -> Time {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Time {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

impl ControlFs {
    pub(super) fn new(verbs: Arc<Verbs>, views: Views) -> Self {
        let now = time_now();
        ControlFs {
            verbs,
            views,
            handles: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            events_seen: Mutex::new((0, now)),
            started: now,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            waits: Waits::default(),
        }
    }
}

impl ControlFs {
    fn attr(&self, ino: u64) -> FsResult<Attr> {
        let v = self;
        let (kind, perm, size, mtime) = match ino {
            DIR => (Kind::Dir, 0o555, 0, v.started),
            CTL => (Kind::File, 0o666, 0, v.started),
            EVENTS => {
                let len = self.views.log_len();
                let mut seen = v.events_seen.lock();
                if seen.0 != len {
                    *seen = (len, time_now());
                }
                (Kind::File, 0o444, len, seen.1)
            }
            STATUS | WHOAMI | WHY | INBOX | CHANGES | WAITS => (Kind::File, 0o444, 0, time_now()),
            _ => return Err(FsError(libc::ENOENT)),
        };
        Ok(Attr {
            ino,
            kind,
            perm,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            uid: v.uid,
            gid: v.gid,
            size,
            blocks: 0,
            atime: mtime,
            mtime,
            ctime: mtime,
            rdev: 0,
            blksize: 4096,
        })
    }

    fn lookup_in(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        let ino = match parent {
            ROOT_INO if name == crate::control::CONTROL_DIR => DIR,
            DIR => FILES
                .iter()
                .chain(UNLISTED.iter())
                .find(|(n, _)| OsStr::new(n) == name)
                .map(|(_, i)| *i)
                .ok_or(FsError(libc::ENOENT))?,
            _ => return Err(FsError(libc::ENOENT)),
        };
        self.attr(ino)
    }

    fn entries(&self, ino: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        if ino != DIR {
            return Err(FsError(libc::ENOTDIR));
        }
        Ok(FILES
            .iter()
            .map(|(n, i)| {
                (
                    *i,
                    DirEntry {
                        name: (*n).into(),
                        kind: Kind::File,
                        d_ino: *i,
                    },
                )
            })
            .collect())
    }

    fn open_file(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<u64> {
        let h = match ino {
            DIR => return Err(FsError(libc::EISDIR)),
            CTL => VHandle::Ctl(CtlHandle::new()),
            _ if open_writes(flags) => return Err(FsError(libc::EACCES)),
            EVENTS => match sessions::who(caller) {
                w if w.is_root() => VHandle::Events { shift: 0 },
                w => VHandle::SeenEvents(LogView::new(w)),
            },
            STATUS => VHandle::Text(self.views.status_file(caller)),
            WHOAMI => VHandle::Text(self.views.whoami_file(caller)),
            CHANGES => VHandle::Changes {
                who: sessions::who(caller),
                kept: None,
            },
            WHY => VHandle::Text(self.views.why_file(caller)),
            INBOX => VHandle::Text(self.views.inbox_file(caller)),
            WAITS => {
                let me = self.verbs.session_name(caller);
                let flying = self.waits.of_session(&me);
                VHandle::Text(self.views.waits_file(caller, &me, flying))
            }
            _ => return Err(FsError(libc::ENOENT)),
        };
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(token, Arc::new(Mutex::new(h)));
        Ok(token)
    }

    fn handle(&self, token: u64) -> FsResult<Arc<Mutex<VHandle>>> {
        self.handles
            .lock()
            .get(&token)
            .cloned()
            .ok_or(FsError(libc::EBADF))
    }

    fn read_now(&self, token: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let h = self.handle(token)?;
        let mut h = h.lock();
        match &mut *h {
            VHandle::Ctl(c) => Ok(c.read(offset, size).to_vec()),
            VHandle::Text(t) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(t.len());
                let end = start.saturating_add(size as usize).min(t.len());
                Ok(t[start..end].to_vec())
            }
            VHandle::SeenEvents(view) => self.views.read_seen_log(view, offset, size as usize),
            VHandle::Changes { who, kept } => {
                let (start, text) =
                    kept.get_or_insert_with(|| (offset, self.views.changes_file(who, offset)));
                let from = offset.saturating_sub(*start).min(text.len() as u64) as usize;
                let from = if offset < *start { text.len() } else { from };
                let end = from.saturating_add(size as usize).min(text.len());
                Ok(text[from..end].to_vec())
            }
            VHandle::Events { shift } => {
                let want = offset.saturating_add(*shift);
                let (start, bytes) = self.views.read_log(want, size as usize)?;
                *shift += start - want;
                Ok(bytes)
            }
        }
    }

    /// A read that a waiting `ctl` handle answers later (see `waits`); any other read at
    /// once.
    fn read_deferred(&self, caller: &Caller, token: u64, offset: u64, size: u32, done: ReadDone) {
        let done = match self.handle(token) {
            Ok(h) => {
                let _locked = h.lock();
                match self.waits.keep_read(token, offset, size, caller.pid, done) {
                    Some(done) => done,
                    None => {
                        // The waiter now checks this reader for a kill, too.
                        self.verbs.engine().poke();
                        return;
                    }
                }
            }
            Err(e) => return done(Err(e)),
        };
        done(self.read_now(token, offset, size))
    }

    /// One request on `ctl`: served for the writer's session; a refusal fails the write
    /// with its errno (the reply is stored either way, to be read back). A `wait` not
    /// reached yet leaves the handle waiting: its next read is answered when it is.
    fn write_ctl(&self, caller: &Caller, token: u64, data: &[u8]) -> FsResult<u32> {
        let h = self.handle(token)?;
        let mut h = h.lock();
        let VHandle::Ctl(ctl) = &mut *h else {
            return Err(FsError(libc::EBADF));
        };
        let lost = self.waits.stop(token);
        if let Some(parsed) = crate::control::history::parse_history(data) {
            let reply = match parsed {
                Ok(req) => self.verbs.history(caller, &req),
                Err(refused) => refused,
            };
            let r = ctl.set_reply(&reply);
            drop(h);
            waits::interrupted(lost.into_iter().flatten().map(|(_, _, d)| d));
            return r
                .map(|()| u32::try_from(data.len()).unwrap_or(u32::MAX))
                .map_err(FsError);
        }
        let mut later = None;
        let r = ctl.write(data, |req| match req {
            Request::Wait { until, .. } => match self.verbs.wait_check(caller, req) {
                Check::Now(reply) => {
                    // (the path as placed: the one a standing wait keeps)
                    if let (true, Some(p)) = (reached(&reply), reply.body()["path"].as_str()) {
                        let me = self.verbs.session_name(caller);
                        self.verbs.standing_answered(&me, p, *until);
                    }
                    reply
                }
                Check::Later(w) => {
                    let reply = waits::placeholder(&w);
                    later = Some(w);
                    reply
                }
            },
            Request::WaitStanding { path, until } => {
                self.verbs.standing_register(caller, path, *until)
            }
            Request::WaitReport => self.verbs.standing_report(caller),
            _ => self.verbs.serve(caller, req),
        });
        if let Some(w) = later {
            self.waits.start(token, w);
            // The waiter looks again, so a change since the check is not missed.
            self.verbs.engine().poke();
        }
        drop(h);
        waits::interrupted(lost.into_iter().flatten().map(|(_, _, d)| d));
        r.map_err(FsError)
    }

    fn release_file(&self, token: u64) {
        if let Ok(h) = self.handle(token) {
            let _locked = h.lock();
            let lost = self.waits.stop(token);
            drop(_locked);
            waits::interrupted(lost.into_iter().flatten().map(|(_, _, d)| d));
        }
        self.handles.lock().remove(&token);
    }

    /// Answer a waiting handle: store `reply` and answer its kept reads from it.
    fn finish(&self, token: u64, reply: &Reply) {
        let Ok(h) = self.handle(token) else {
            self.waits.stop(token);
            return;
        };
        let mut h = h.lock();
        let Some(reads) = self.waits.stop(token) else {
            return;
        };
        let VHandle::Ctl(ctl) = &mut *h else { return };
        let _ = ctl.set_reply(reply);
        let answers: Vec<(ReadDone, Vec<u8>)> = reads
            .into_iter()
            .map(|(offset, size, done)| (done, ctl.read(offset, size).to_vec()))
            .collect();
        drop(h);
        for (done, bytes) in answers {
            done(Ok(bytes));
        }
    }

    /// The `coherent-wait` thread: answers waiting handles when their record changes,
    /// their deadline passes or their reader is killed, until `stopped()`.
    pub(super) fn run_waits(&self, stopped: impl Fn() -> bool) {
        let mut seen = self.verbs.engine().changes();
        loop {
            if stopped() {
                for token in self.waits.tokens() {
                    let r = Reply::refused(
                        Some(Verb::Wait),
                        &Refusal::new(Reason::IoError, "the volume is being unmounted"),
                        None,
                    );
                    self.finish(token, &r);
                }
                return;
            }
            // Read before looking, so a wait registered meanwhile (it pokes after it is
            // in the map) ends the sleep below at once.
            let poked = self.verbs.engine().pokes();
            let (due, killed, next) = self.waits.due(self.verbs.engine());
            waits::interrupted(killed);
            for (token, reply) in due {
                if reached(&reply) {
                    if let Some((s, p, u)) = self.waits.key(token) {
                        self.verbs.standing_answered(&s, &p, u);
                    }
                }
                self.finish(token, &reply);
            }
            let standing = self.verbs.standing_resolve();
            if self.waits.is_empty() && !standing {
                // Nothing to follow: commits need not wake this thread, only a new wait
                // (or unmount) does.
                self.verbs.engine().wait_poke(poked, next);
                seen = self.verbs.engine().changes();
            } else {
                seen = self.verbs.engine().wait_change(seen, next);
            }
        }
    }
}

/// The `.coherent/` tree as a backend of [`crate::fs::Fs`].
impl PseudoFs for ControlFs {
    fn root_name(&self) -> OsString {
        crate::control::CONTROL_DIR.into()
    }

    fn lookup(&self, _caller: &Caller, parent: u64, name: &OsStr) -> FsResult<Attr> {
        self.lookup_in(parent, name)
    }

    /// The nodes are fixed: nothing to forget.
    fn forget(&self, _ino: u64, _nlookup: u64) {}

    fn getattr(&self, _caller: &Caller, ino: u64) -> FsResult<Attr> {
        self.attr(ino)
    }

    fn readdir(&self, _caller: &Caller, ino: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        self.entries(ino)
    }

    fn open(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<u64> {
        self.open_file(caller, ino, flags)
    }

    fn read(&self, caller: &Caller, token: u64, offset: u64, size: u32, done: ReadDone) {
        self.read_deferred(caller, token, offset, size, done)
    }

    fn write(&self, caller: &Caller, token: u64, data: &[u8]) -> FsResult<u32> {
        self.write_ctl(caller, token, data)
    }

    fn release(&self, token: u64) {
        self.release_file(token)
    }

    fn set_data_mode(&self, mode: &str) {
        self.verbs.set_data_mode(mode)
    }
}

/// A `wait` reply that says the state was reached.
fn reached(reply: &Reply) -> bool {
    reply.is_ok() && reply.body()["reached"] == serde_json::Value::Bool(true)
}
