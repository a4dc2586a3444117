//! The `.coherent/` directory of docs/design.md#control-surface: `ctl` (one request per write, the
//! reply read back from the same handle), `status`, `events`, `whoami`, `why`, `inbox`.
//!
//! Content that depends on the reader (`whoami`, `why`, `inbox`) and `status` are computed
//! once, at open, for the opener's session: a reader sees one consistent snapshot however
//! it reads. `events` reads the journal at the requested offset, so a reader follows it as
//! it grows; its size is the log's length and its mtime moves when the log grows (the
//! adapter gives virtual nodes an attribute TTL of 0, so `tail -f` and `coherent watch`
//! see both). Per-reader files report size 0 (like `/proc`): they are opened with direct
//! I/O, so readers read until EOF. Only `ctl` is writable (mode 0666, any user may send a
//! request; the verbs decide who may do what).
//!
//! What a reader sees of a path depends on the reader (docs/design.md#control-surface): `status`,
//! `events`, `inbox` and the ctl verbs show a path, its record and its note only to callers who
//! could look the path up themselves ([`crate::visibility`]); to anyone else the answer is the one
//! for a path that does not exist. A path in a request resolves beneath the backing root
//! ([`crate::beneath`]): one that leaves it is `bad_request` "outside the volume", whether
//! or not the host path exists, and the engine never hears of it.
//!
//! [`Surface`] owns the open handles of the tree; the volume's [`PseudoFs`] methods (the
//! backend [`crate::fs::Fs`] routes `.coherent/` to) delegate to it in one line each, and
//! its methods take the [`Volume`] for what they read (engine, journal, resolver, the
//! backing directory).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;

use super::standing::{self, Standing};
use super::waits::{self, Check, Waits};
use super::Volume;
use crate::access::{may_write, Who};
use crate::beneath::{self, Resolved};
use crate::coherence::{Engine, RecordJson, Role, StatusReport, Timestamp};
use crate::control::{session_json, CtlHandle, Reply, Request, Verb, NO_REFUSAL};
use crate::coordinator::StepKind;
use crate::error::{Reason, Refusal};
use crate::fs::{open_writes, PseudoFs, ReadDone};
use crate::identity::{Session, Via};
use crate::store::{
    Attr, Caller, DirEntry, FsError, FsResult, Kind, Time, ROOT_INO, VIRTUAL_INO_BIT,
};
use crate::visibility::{LogView, Sight};

pub(super) const DIR: u64 = VIRTUAL_INO_BIT | 1;
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

/// The `.coherent/` control surface: its open handles and the state of `events`' mtime.
pub(crate) struct Surface {
    handles: Mutex<HashMap<u64, Arc<Mutex<VHandle>>>>,
    next: AtomicU64,
    /// (log length last reported, when it was first seen at that length).
    events_seen: Mutex<(u64, Time)>,
    started: Time,
    uid: u32,
    gid: u32,
    /// `ctl` handles waiting for a `wait` request's answer, and their kept reads.
    waits: Waits,
    /// The sessions' standing waits (`wait --standing`), kept in the state directory.
    standing: Standing,
    /// How file data flows, as the FUSE layer found it at `init` (`data_mode` in `status`).
    data_mode: Mutex<Option<String>>,
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

impl Surface {
    pub(super) fn new(standing: Standing) -> Self {
        let now = time_now();
        Surface {
            handles: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            events_seen: Mutex::new((0, now)),
            started: now,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            waits: Waits::default(),
            standing,
            data_mode: Mutex::new(None),
        }
    }
}

/// The text of `why`: the latest refusal or stale write (its versions are in the text),
/// then when it happened; `no refusal` when there was none.
fn why_text(t: Option<(String, Option<Timestamp>)>) -> Vec<u8> {
    match t {
        Some((t, at)) => {
            // one line whatever a message holds: no name in it can forge a second
            let mut out = crate::names::one_line(t.trim_end()).into_owned();
            if let Some(at) = at {
                out.push_str(&format!("\n(at {})", at.rfc3339()));
            }
            out.push('\n');
            out.into_bytes()
        }
        None => format!("{NO_REFUSAL}: this session has not been refused or warned\n").into_bytes(),
    }
}

fn json_line(v: &impl serde::Serialize) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).expect("state serialises");
    b.push(b'\n');
    b
}

impl Surface {
    pub(super) fn attr(&self, vol: &Volume, ino: u64) -> FsResult<Attr> {
        let v = self;
        let (kind, perm, size, mtime) = match ino {
            DIR => (Kind::Dir, 0o555, 0, v.started),
            CTL => (Kind::File, 0o666, 0, v.started),
            EVENTS => {
                let len = vol.journal.log_len();
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

    pub(super) fn lookup(&self, vol: &Volume, parent: u64, name: &OsStr) -> FsResult<Attr> {
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
        self.attr(vol, ino)
    }

    pub(super) fn readdir(&self, ino: u64) -> FsResult<Vec<(u64, DirEntry)>> {
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
                        backing_ino: *i,
                    },
                )
            })
            .collect())
    }

    pub(super) fn open(
        &self,
        vol: &Volume,
        caller: &Caller,
        ino: u64,
        flags: i32,
    ) -> FsResult<u64> {
        let h = match ino {
            DIR => return Err(FsError(libc::EISDIR)),
            CTL => VHandle::Ctl(CtlHandle::new()),
            _ if open_writes(flags) => return Err(FsError(libc::EACCES)),
            EVENTS => match who(caller) {
                w if w.is_root() => VHandle::Events { shift: 0 },
                w => VHandle::SeenEvents(LogView::new(w)),
            },
            STATUS => {
                vol.coord.catch_up();
                let mut sight = Sight::new(who(caller));
                VHandle::Text(json_line(&seen_status(vol, &mut sight, None)))
            }
            WHOAMI => VHandle::Text(json_line(&whoami_json(vol, caller))),
            CHANGES => VHandle::Changes {
                who: who(caller),
                kept: None,
            },
            WHY => {
                // A path the reader can no longer look up is not shown, even its own.
                let mut sight = Sight::new(who(caller));
                let why = vol.engine.why_about(&vol.session(caller));
                VHandle::Text(why_text(why.and_then(|(p, t, at)| match p {
                    Some(p) if !sight.sees(vol.root.as_fd(), &p) => None,
                    _ => Some((t, at)),
                })))
            }
            WAITS => {
                self.standing.resolve(&vol.engine);
                let me = vol.session(caller).name.to_string();
                let mut sight = Sight::new(who(caller));
                let root = vol.root.as_fd();
                let mut flying = self.waits.of_session(&me);
                flying.retain(|(p, ..)| sight.sees(root, p));
                let kept = self.standing.of_session(&me, |p| sight.sees(root, p));
                VHandle::Text(json_line(&standing::listing(flying, &kept)))
            }
            INBOX => {
                vol.coord.catch_up();
                let mut sight = Sight::new(who(caller));
                let inbox = vol.engine.inbox(&vol.session(caller));
                VHandle::Text(json_line(&seen_records(vol, &mut sight, inbox)))
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

    fn read(&self, vol: &Volume, token: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let h = self.handle(token)?;
        let mut h = h.lock();
        match &mut *h {
            VHandle::Ctl(c) => Ok(c.read(offset, size).to_vec()),
            VHandle::Text(t) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(t.len());
                let end = start.saturating_add(size as usize).min(t.len());
                Ok(t[start..end].to_vec())
            }
            VHandle::SeenEvents(view) => view
                .read(vol.root.as_fd(), offset, size as usize, |o, n| {
                    vol.journal.read_log_from(o, n)
                })
                .map_err(FsError::from),
            VHandle::Changes { who, kept } => {
                let (start, text) = kept.get_or_insert_with(|| {
                    let mut sight = Sight::new(who.clone());
                    let root = vol.root.as_fd();
                    let text = vol.changes.answer(offset, |p| {
                        if sight.sees_all() {
                            return Some(true);
                        }
                        p.to_str().map(|p| sight.sees(root, p))
                    });
                    (offset, text)
                });
                let from = offset.saturating_sub(*start).min(text.len() as u64) as usize;
                let from = if offset < *start { text.len() } else { from };
                let end = from.saturating_add(size as usize).min(text.len());
                Ok(text[from..end].to_vec())
            }
            VHandle::Events { shift } => {
                let want = offset.saturating_add(*shift);
                let (start, bytes) = vol
                    .journal
                    .read_log_from(want, size as usize)
                    .map_err(FsError::from)?;
                *shift += start - want;
                Ok(bytes)
            }
        }
    }

    /// A read that a waiting `ctl` handle answers later (see `waits`); any other read at
    /// once.
    pub(super) fn read_deferred(
        &self,
        vol: &Volume,
        caller: &Caller,
        token: u64,
        offset: u64,
        size: u32,
        done: ReadDone,
    ) {
        let done = match self.handle(token) {
            Ok(h) => {
                let _locked = h.lock();
                match self.waits.keep_read(token, offset, size, caller.pid, done) {
                    Some(done) => done,
                    None => {
                        // The waiter now checks this reader for a kill, too.
                        vol.engine.poke();
                        return;
                    }
                }
            }
            Err(e) => return done(Err(e)),
        };
        done(self.read(vol, token, offset, size))
    }

    /// One request on `ctl`: served for the writer's session; a refusal fails the write
    /// with its errno (the reply is stored either way, to be read back). A `wait` not
    /// reached yet leaves the handle waiting: its next read is answered when it is.
    pub(super) fn write(
        &self,
        vol: &Volume,
        caller: &Caller,
        token: u64,
        data: &[u8],
    ) -> FsResult<u32> {
        let h = self.handle(token)?;
        let mut h = h.lock();
        let VHandle::Ctl(ctl) = &mut *h else {
            return Err(FsError(libc::EBADF));
        };
        let lost = self.waits.stop(token);
        let mut later = None;
        let r = ctl.write(data, |req| match req {
            Request::Wait { until, .. } => match wait_check(vol, caller, req) {
                Check::Now(reply) => {
                    // (the path as placed: the one a standing wait keeps)
                    if let (true, Some(p)) = (reached(&reply), reply.body()["path"].as_str()) {
                        self.standing.answered(&vol.session(caller).name, p, *until);
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
                // Checked as a wait with no time to wait: the same refusals, at once.
                let probe = Request::Wait {
                    path: path.clone(),
                    until: *until,
                    timeout_ms: Some(0),
                };
                let Check::Now(checked) = wait_check(vol, caller, &probe) else {
                    unreachable!("a wait with no time to wait is answered now")
                };
                let me = vol.session(caller).name.to_string();
                let reply = self.standing.register(&vol.engine, &me, *until, checked);
                // The wait thread now follows record changes for it.
                vol.engine.poke();
                reply
            }
            Request::WaitReport => {
                self.standing.resolve(&vol.engine);
                let mut sight = Sight::new(who(caller));
                let root = vol.root.as_fd();
                self.standing
                    .report(&vol.session(caller).name, |p| sight.sees(root, p))
            }
            _ => self.serve(vol, caller, req),
        });
        if let Some(w) = later {
            self.waits.start(token, w);
            // The waiter looks again, so a change since the check is not missed.
            vol.engine.poke();
        }
        drop(h);
        waits::interrupted(lost.into_iter().flatten().map(|(_, _, d)| d));
        r.map_err(FsError)
    }

    pub(super) fn release(&self, token: u64) {
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
    pub(super) fn run_waits(&self, vol: &Volume, stopped: impl Fn() -> bool) {
        let mut seen = vol.engine.changes();
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
            let poked = vol.engine.pokes();
            let (due, killed, next) = self.waits.due(&vol.engine);
            waits::interrupted(killed);
            for (token, reply) in due {
                if reached(&reply) {
                    if let Some((s, p, u)) = self.waits.key(token) {
                        self.standing.answered(&s, &p, u);
                    }
                }
                self.finish(token, &reply);
            }
            let standing = self.standing.resolve(&vol.engine);
            if self.waits.is_empty() && !standing {
                // Nothing to follow: commits need not wake this thread, only a new wait
                // (or unmount) does.
                vol.engine.wait_poke(poked, next);
                seen = vol.engine.changes();
            } else {
                seen = vol.engine.wait_change(seen, next);
            }
        }
    }
}

/// The `.coherent/` tree as a backend of [`crate::fs::Fs`]: each request goes to the
/// [`Surface`] with the volume it reads.
impl PseudoFs for Volume {
    fn root_name(&self) -> OsString {
        crate::control::CONTROL_DIR.into()
    }

    fn lookup(&self, _caller: &Caller, parent: u64, name: &OsStr) -> FsResult<Attr> {
        self.surface.lookup(self, parent, name)
    }

    /// The nodes are fixed: nothing to forget.
    fn forget(&self, _ino: u64, _nlookup: u64) {}

    fn getattr(&self, _caller: &Caller, ino: u64) -> FsResult<Attr> {
        self.surface.attr(self, ino)
    }

    fn readdir(&self, _caller: &Caller, ino: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        self.surface.readdir(ino)
    }

    fn open(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<u64> {
        self.surface.open(self, caller, ino, flags)
    }

    fn read(&self, caller: &Caller, token: u64, offset: u64, size: u32, done: ReadDone) {
        self.surface
            .read_deferred(self, caller, token, offset, size, done)
    }

    fn write(&self, caller: &Caller, token: u64, data: &[u8]) -> FsResult<u32> {
        self.surface.write(self, caller, token, data)
    }

    fn release(&self, token: u64) {
        self.surface.release(token)
    }

    fn set_data_mode(&self, mode: &str) {
        *self.surface.data_mode.lock() = Some(mode.to_string());
    }
}

/// `.coherent/whoami` and the `whoami` reply's fields: the session, and the environment
/// tags that were ignored because their value is not a valid session name.
fn whoami_json(vol: &Volume, caller: &Caller) -> Value {
    let mut v = session_json(&vol.session(caller));
    let ignored = vol.resolver().ignored_tags(caller.pid);
    if !ignored.is_empty() {
        v["ignored"] = serde_json::to_value(&ignored).unwrap_or(Value::Null);
    }
    v
}

/// The verbs, served for the caller's session: what `ctl` runs on a well-formed request.
impl Surface {
    /// Serve one parsed request for `caller`.
    fn serve(&self, vol: &Volume, caller: &Caller, req: &Request) -> Reply {
        if vol.journal.is_poisoned() && !matches!(req, Request::Status { .. }) {
            return journal_failed(req.verb());
        }
        if let Request::Whoami = req {
            return Reply::whoami(whoami_json(vol, caller));
        }
        let s = &vol.session(caller);
        let verb = req.verb();
        let mut sight = Sight::new(who(caller));
        let r = match not_yours(s, verb).map_or_else(|| place_request(vol, &mut sight, req), Err) {
            Ok(req) => self.serve_agreed(vol, s, &mut sight, &req),
            Err(f) => Err(f),
        };
        if vol.journal.is_poisoned() && !matches!(verb, Verb::Status | Verb::Whoami) {
            // The events of this verb may not be on disk: do not report success.
            return journal_failed(verb);
        }
        match r {
            Ok(reply) => reply,
            Err(f) => {
                // `why` shows the latest refusal, whichever part of the volume made it.
                vol.tell_why(s, super::Told::Refused(&f), Timestamp::now());
                let paths = req.paths();
                let path = (paths.len() == 1).then(|| paths[0].as_str());
                Reply::refused(Some(verb), &f, path)
            }
        }
    }

    /// With a coordinator, a verb is one agreed step (refused `coordinator_unavailable`
    /// when etcd cannot be reached), and `status` first catches up with the other hosts.
    fn serve_agreed(
        &self,
        vol: &Volume,
        s: &Session,
        sight: &mut Sight,
        req: &Request,
    ) -> Result<Reply, Refusal> {
        let verb = req.verb();
        if vol.coord.host().is_none() {
            let attempt = || self.serve_verb(vol, &vol.engine, s, sight, req);
            let refused = |r: &Result<_, _>| matches!(r, Err(f) if in_flight(f));
            return once_more_after_releases(vol, s, req, attempt, refused);
        }
        if matches!(verb, Verb::Whoami | Verb::Wait) {
            return self.serve_verb(vol, &vol.engine, s, sight, req);
        }
        if verb == Verb::Status {
            // Best effort: a host cut off answers with what it has (and says so).
            vol.coord.catch_up();
            return self.serve_verb(vol, &vol.engine, s, sight, req);
        }
        let names: Vec<(&str, bool)> = req.paths().iter().map(|p| (p.as_str(), false)).collect();
        // The wait for releases happens outside the step, which their release needs.
        let attempt = || {
            let mut out = None;
            let stepped = vol
                .coord
                .step(&vol.engine, &names, StepKind::Verb, &mut |e| {
                    let r = self.serve_verb(vol, e, s, sight, req);
                    let ok = r.is_ok();
                    out = Some(r);
                    ok
                });
            stepped.map(|st| (st, out))
        };
        let refused = |r: &Result<_, Refusal>| matches!(r, Ok((_, Some(Err(f)))) if in_flight(f));
        let (stepped, out) = once_more_after_releases(vol, s, req, attempt, refused)?;
        if stepped.in_flight.is_empty() {
            return out.expect("the step ran the verb");
        }
        // Another host has the file open for writing by this giver: the transfer is
        // undone (withdrawn), as one host refuses it (`handoff_in_flight`).
        let paths: Vec<String> = stepped.in_flight.iter().map(|x| x.0.clone()).collect();
        let undo = vol
            .coord
            .step(&vol.engine, &names, StepKind::Verb, &mut |e| {
                let now = Timestamp::now();
                for (p, id) in &stepped.in_flight {
                    e.undo_transfer(p, *id, now);
                }
                true
            });
        if let Err(r) = undo {
            tracing::warn!("undoing a transfer found in flight: {}", r.message);
        }
        Err(Refusal::new(
            Reason::HandoffInFlight,
            format!(
                "this session still has {} open for writing on another host: close it there \
                 first, then transfer",
                paths.join(", ")
            ),
        )
        .at(paths[0].clone()))
    }

    /// Runs a verb's changes through `e`: the volume's engine, or a step's view of it.
    fn serve_verb(
        &self,
        vol: &Volume,
        e: &Engine,
        s: &Session,
        sight: &mut Sight,
        req: &Request,
    ) -> Result<Reply, Refusal> {
        let now = Timestamp::now();
        let records = |r: crate::coherence::VerbReply| match serde_json::to_value(&r.records) {
            Ok(Value::Array(v)) => v,
            _ => Vec::new(),
        };
        Ok(match req {
            Request::Register { name: None } => {
                e.register(s, now)?;
                Reply::session(Verb::Register, s)
            }
            Request::Register { name: Some(n) } => {
                // Only the caller's own session (docs/design.md#sessions): naming another would let
                // anyone claim a name ahead of its owner.
                crate::names::validate_session_name(n)
                    .map_err(|e| Refusal::new(Reason::BadRequest, e))?;
                if s.is_attributed() && *n != s.name {
                    return Err(Refusal::new(
                        Reason::SessionNotYours,
                        format!(
                            "register registers only this process's own session ({}), not {n}: \
                             run it in that session (coherent run --session {n})",
                            s.display()
                        ),
                    ));
                }
                e.register(s, now)?;
                Reply::session(Verb::Register, s)
            }
            Request::Transfer { paths, to, note } => {
                tracked_paths(vol, paths)?;
                observe_paths(vol, e, paths, now)?;
                fingerprint_paths(vol, e, paths, now)?;
                may_write_all(vol, sight.who(), paths)?;
                successor_owner_may_write(vol, to, sight.who(), paths)?;
                no_unseen_writer(vol, paths)?;
                let r = e.transfer(s, paths, to, note.clone(), now)?;
                Reply::records(Verb::Transfer, records(r))
            }
            Request::Accept { paths } => {
                observe_paths(vol, e, paths, now)?;
                owner_only(vol, s, sight.who(), Verb::Accept, paths)?;
                successor_may_write(vol, s, sight.who(), paths)?;
                Reply::records(Verb::Accept, records(e.accept(s, paths, now)?))
            }
            Request::Decline { paths } => {
                observe_paths(vol, e, paths, now)?;
                owner_only(vol, s, sight.who(), Verb::Decline, paths)?;
                Reply::records(Verb::Decline, records(e.decline(s, paths, now)?))
            }
            Request::Withdraw { paths } => {
                observe_paths(vol, e, paths, now)?;
                owner_only(vol, s, sight.who(), Verb::Withdraw, paths)?;
                Reply::records(Verb::Withdraw, records(e.withdraw(s, paths, now)?))
            }
            Request::Status { path } => {
                if let Some(p) = path
                    .as_deref()
                    .filter(|p| vol.is_tracked(p, false) && sight.sees(vol.root.as_fd(), p))
                {
                    vol.observe(p, now);
                }
                let st = seen_status(vol, sight, path.as_deref());
                let c = st.counts;
                let msg = match path {
                    Some(p) => format!(
                        "{p_q}: {}; {} live and {} ended handoff record(s)",
                        st.version
                            .map(|v| format!("v{v}"))
                            .unwrap_or_else(|| "not in the volume".into()),
                        c.live,
                        c.ended,
                        p_q = crate::names::display_name(p)
                    ),
                    None => format!(
                        "{} session(s), {} path(s), {} live and {} ended handoff record(s)",
                        c.sessions, c.paths, c.live, c.ended
                    ),
                };
                let mut body = serde_json::to_value(&st).unwrap_or(Value::Null);
                if let Some(c) = vol.coord.describe() {
                    body["coordinator"] = c;
                }
                if let Some(m) = vol.surface.data_mode.lock().clone() {
                    body["data_mode"] = Value::String(m);
                }
                let msg = match journal_json(vol) {
                    Some((j, line)) => {
                        body["journal"] = j;
                        format!("{msg}; {line}")
                    }
                    None => msg,
                };
                Reply::status(body, msg)
            }
            Request::Whoami => unreachable!("served above, with the ignored tags"),
            Request::Wait { .. } | Request::WaitStanding { .. } | Request::WaitReport => {
                unreachable!("served by `write`, which may leave it waiting")
            }
        })
    }
}

/// A transfer refused for a write handle still open (or a file its creating handle has
/// not committed yet): worth waiting for imminent releases.
fn in_flight(f: &Refusal) -> bool {
    matches!(f.reason, Reason::HandoffInFlight | Reason::NoSuchPath)
}

/// The in-flight rule, in one place: FUSE sends RELEASE after `close(2)` returned, so a
/// transfer `refused` in flight (see [`in_flight`]) by write handles of `s` that are
/// being released waits for them (see [`Volume::wait_for_releases`]), then is `attempt`ed
/// once more.
fn once_more_after_releases<T>(
    vol: &Volume,
    s: &Session,
    req: &Request,
    mut attempt: impl FnMut() -> T,
    refused: impl Fn(&T) -> bool,
) -> T {
    let first = attempt();
    match req {
        Request::Transfer { paths, .. } if refused(&first) && vol.wait_for_releases(s, paths) => {
            attempt()
        }
        _ => first,
    }
}

/// A transfer is not acknowledged while a process holds the file open for writing where
/// the volume does not see it (docs/handoff.md#in-flight): a descriptor opened through
/// this volume before its daemon was killed (with FUSE passthrough it writes straight to
/// the backing file), or one opened in the backing directory itself. The kernel tells
/// whether the inode is open for writing at all ([`crate::store::open_for_writing`]);
/// when the volume has a write handle of its own on it, the two cannot be told apart and
/// the engine's rules decide (the giver's own handle is in flight there, a bystander's
/// reserves nothing).
fn no_unseen_writer(vol: &Volume, paths: &[String]) -> Result<(), Refusal> {
    for p in paths {
        match vol.unseen_writer(p) {
            Some(true) => {
                return Err(Refusal::new(
                    Reason::HandoffInFlight,
                    format!(
                        "{p_q} is open for writing by a process this volume does not see (a \
                         descriptor opened before the volume was last restarted, or one in \
                         the backing directory): close it first, then transfer",
                        p_q = crate::names::display_name(p)
                    ),
                )
                .at(p.as_str()))
            }
            Some(false) => {}
            None => vol.warn_no_leases(p),
        }
    }
    Ok(())
}

/// A transfer hands on tracked paths only (docs/design.md#versions): each untracked one is refused
/// `not_tracked`, saying which `.git` or which ignore file and pattern, and how to track it.
fn tracked_paths(vol: &Volume, paths: &[String]) -> Result<(), Refusal> {
    let refused: Vec<Refusal> = paths
        .iter()
        .filter_map(|p| {
            let is_dir = vol.stat(p).is_some_and(|x| x.1);
            let why = vol.tracking.why_untracked(p, is_dir)?;
            Some(
                Refusal::new(
                    Reason::NotTracked,
                    format!(
                        "{p_q} is not tracked by the volume, so it cannot be handed on: {why}",
                        p_q = crate::names::display_name(p)
                    ),
                )
                .at(p.as_str()),
            )
        })
        .collect();
    let Some(first) = refused.first() else {
        return Ok(());
    };
    let mut r = first.clone();
    if paths.len() > 1 {
        r.per_path = refused;
    }
    Err(r)
}

/// Count what the backing directory holds at each path before a verb decides on it.
/// Directories are not handed on.
fn observe_paths(
    vol: &Volume,
    e: &Engine,
    paths: &[String],
    now: Timestamp,
) -> Result<(), Refusal> {
    for p in paths {
        if vol.observe_in(e, p, now).is_some_and(|x| x.1) {
            return Err(Refusal::new(
                Reason::BadRequest,
                format!(
                    "bad request: {p_q} is a directory; hand on the files in it",
                    p_q = crate::names::display_name(p)
                ),
            ));
        }
    }
    Ok(())
}

/// A transfer hands on content: each file's fingerprint is taken now (and counted, should
/// the file have changed since it was observed), so while the record is live only content
/// that differs from it ends it (docs/versions-and-holds.md#content). A file that cannot be
/// read to take it is not handed on (fail closed: without it, no metadata change could be
/// told from a rewrite).
fn fingerprint_paths(
    vol: &Volume,
    e: &Engine,
    paths: &[String],
    now: Timestamp,
) -> Result<(), Refusal> {
    for p in paths {
        if e.version(p).is_none() || !crate::store::has_content(vol.root.as_fd(), p) {
            continue; // the engine refuses it (`no_such_path`), or a special file
        }
        let Some((st, print)) = vol.print_of(p) else {
            return Err(Refusal::new(
                Reason::IoError,
                format!(
                    "{p} could not be read to take its content's fingerprint (it is changing \
                     right now, or the volume may not read it): the handoff needs one; try \
                     again once it is still"
                ),
            )
            .at(p.as_str()));
        };
        e.observe_content(p, st, Some(print), now);
    }
    Ok(())
}

/// The state log's trouble, for `status` (None while it is written normally): JSON and a
/// line.
fn journal_json(vol: &Volume) -> Option<(Value, String)> {
    if !vol.journal.is_poisoned() {
        return None;
    }
    let (kept, shed, limit) = vol.journal.backlog();
    let shedding = vol.journal.is_shedding();
    let line = if shedding {
        format!(
            "the state log cannot be written and the events kept in memory reached their \
             bound ({} KiB): {shed} event(s) not kept; verbs and writes to handed files are \
             refused until the disk takes writes again",
            limit >> 10
        )
    } else {
        format!(
            "the state log cannot be written: {} KiB of events kept in memory (bound {} KiB); \
             verbs are refused until the disk takes writes again",
            kept >> 10,
            limit >> 10
        )
    };
    Some((
        serde_json::json!({
            "failing": true,
            "shedding": shedding,
            "kept_bytes": kept,
            "not_kept": shed,
            "bound_bytes": limit,
            "message": line,
        }),
        line,
    ))
}

/// The reply when the state log cannot be written: the write fails with `EIO`.
fn journal_failed(verb: Verb) -> Reply {
    Reply::refused(
        Some(verb),
        &Refusal::new(
            Reason::IoError,
            "the volume cannot write its state log (disk error), so it records nothing more \
             for now; see the coherent-mount log and free the disk",
        ),
        None,
    )
}

/// A verb of a process carrying another uid's session name (docs/design.md#sessions): refused.
fn not_yours(s: &Session, verb: Verb) -> Option<Refusal> {
    let Via::NotYours { session, owner } = &s.via else {
        return None;
    };
    if verb == Verb::Status {
        return None;
    }
    Some(Refusal::new(
        Reason::SessionNotYours,
        format!(
            "session {session} belongs to uid {owner}; this process (uid {}) is not that \
             session, so it cannot {} as it",
            s.name.trim_start_matches("uid:"),
            verb.as_str()
        ),
    ))
}

/// The caller as the permission checks see it (its supplementary groups from `/proc`).
fn who(caller: &Caller) -> Who {
    Who::of_task(caller.pid, caller.uid, caller.gid)
}

/// The request with its paths placed beneath the backing root: a path that leaves it is
/// refused `bad_request` (the same answer whether the host path exists or not, and the
/// engine never sees it); a path through a symlink to a directory inside becomes the real
/// path; a path the caller may not see is refused as a path that does not exist
/// (`status PATH` answers for it as for a path never seen, in [`seen_status`]).
fn place_request(vol: &Volume, sight: &mut Sight, req: &Request) -> Result<Request, Refusal> {
    let place = |sight: &mut Sight, p: &String, hide: bool| -> Result<String, Refusal> {
        let real = match beneath::resolve(vol.root.as_fd(), p) {
            Ok(Resolved::Outside) => {
                return Err(Refusal::new(
                    Reason::BadRequest,
                    format!(
                        "bad request: {} is outside the volume (it leaves the mount root \
                         through a symlink)",
                        crate::names::quote_for_message(p)
                    ),
                ))
            }
            Ok(Resolved::Inside { real: Some(r), .. }) if !r.is_empty() => r,
            _ => p.clone(),
        };
        if hide && !sight.sees(vol.root.as_fd(), &real) {
            return Err(not_there(&real));
        }
        Ok(real)
    };
    let all = |sight: &mut Sight, paths: &[String]| -> Result<Vec<String>, Refusal> {
        paths.iter().map(|p| place(sight, p, true)).collect()
    };
    Ok(match req {
        Request::Transfer { paths, to, note } => Request::Transfer {
            paths: all(sight, paths)?,
            to: to.clone(),
            note: note.clone(),
        },
        Request::Accept { paths } => Request::Accept {
            paths: all(sight, paths)?,
        },
        Request::Decline { paths } => Request::Decline {
            paths: all(sight, paths)?,
        },
        Request::Withdraw { paths } => Request::Withdraw {
            paths: all(sight, paths)?,
        },
        Request::Status { path: Some(p) } => Request::Status {
            path: Some(place(sight, p, false)?),
        },
        Request::Wait {
            path,
            until,
            timeout_ms,
        } => Request::Wait {
            path: place(sight, path, true)?,
            until: *until,
            timeout_ms: *timeout_ms,
        },
        other => other.clone(),
    })
}

/// A `wait` request placed and checked like any request on a path (beneath the root, a
/// path the caller may look up, tracked), then answered now or later.
fn wait_check(vol: &Volume, caller: &Caller, req: &Request) -> Check {
    let mut sight = Sight::new(who(caller));
    let refused = |f: Refusal, p: &str| Check::Now(Reply::refused(Some(Verb::Wait), &f, Some(p)));
    let placed = match place_request(vol, &mut sight, req) {
        Ok(r) => r,
        Err(f) => return refused(f, &req.paths()[0]),
    };
    let Request::Wait {
        path,
        until,
        timeout_ms,
    } = placed
    else {
        unreachable!("a wait stays a wait")
    };
    if let Err(f) = tracked_paths(vol, std::slice::from_ref(&path)) {
        return refused(f, &path);
    }
    vol.observe(&path, Timestamp::now());
    let me = vol.session(caller).name.to_string();
    waits::check(&vol.engine, &me, &path, until, timeout_ms)
}

/// A `wait` reply that says the state was reached.
fn reached(reply: &Reply) -> bool {
    reply.is_ok() && reply.body()["reached"] == Value::Bool(true)
}

/// The refusal for a path that does not exist (the engine's own answer for one).
fn not_there(p: &str) -> Refusal {
    Refusal::new(
        Reason::NoSuchPath,
        format!(
            "{p_q} does not exist in this volume (or the volume has not seen it yet)",
            p_q = crate::names::display_name(p)
        ),
    )
}

/// `transfer` needs that the caller could open each file for writing itself
/// (docs/design.md#handoff), as the kernel would decide it for the caller's uid, groups and the
/// file's mode and ACL.
fn may_write_all(vol: &Volume, who: &Who, paths: &[String]) -> Result<(), Refusal> {
    for p in paths {
        // Errors (a path that is gone) are the engine's to answer.
        if let Ok(false) = may_write(vol.root.as_fd(), Path::new(p), who) {
            return Err(Refusal::new(
                Reason::SessionNotYours,
                format!(
                    "you may not write {p_q} (its mode or ACL does not let uid {} write it), \
                     so you cannot hand it on",
                    who.uid,
                    p_q = crate::names::display_name(p)
                ),
            ));
        }
    }
    Ok(())
}

/// `accept` (and the claim of an offer) needs that the caller could open the file for
/// writing (§5): a session that cannot write a file cannot be its successor. Checked on
/// the paths whose live record names `s` as successor or is an offer `s` would claim;
/// the others get the engine's answer. An offer stays open for a session that can.
fn successor_may_write(
    vol: &Volume,
    s: &Session,
    who: &Who,
    paths: &[String],
) -> Result<(), Refusal> {
    for p in paths {
        let Some(h) = vol.engine.handoff(s, p) else {
            continue;
        };
        let claim = h.record.offer && h.record.claimed_by.is_none() && h.role == Role::Bystander;
        if h.role != Role::Successor && !claim {
            continue;
        }
        if let Ok(false) = may_write(vol.root.as_fd(), Path::new(p), who) {
            let way = if claim {
                "the offer stays open for a session that can write it".to_string()
            } else {
                format!(
                    "decline it instead (coherent decline {})",
                    crate::control::shell_word(p)
                )
            };
            return Err(Refusal::new(
                Reason::SessionNotYours,
                format!(
                    "you may not write {p_q} (its mode or ACL does not let uid {} write it), so \
                     this session cannot {} it: {way}",
                    who.uid,
                    if claim { "claim" } else { "accept" },
                    p_q = crate::names::display_name(p)
                ),
            )
            .at(p.as_str())
            .with_status(h.record.status));
        }
    }
    Ok(())
}

/// A transfer to a session owned by another uid needs that this uid could open each file
/// for writing (§5: only a session whose owner could write the file can be its
/// successor; otherwise "when it writes the file" would be a way out that cannot work).
/// An owner the user database does not know is not checked here (its `accept` is).
fn successor_owner_may_write(
    vol: &Volume,
    to: &str,
    who: &Who,
    paths: &[String],
) -> Result<(), Refusal> {
    let Ok(succ) = vol.engine.lookup_session(to) else {
        return Ok(());
    };
    let Some(uid) = vol
        .engine
        .owner(&succ.name)
        .filter(|u| *u != who.uid && *u != 0)
    else {
        return Ok(());
    };
    let Some(owner) = Who::of_user(uid) else {
        return Ok(());
    };
    for p in paths {
        if let Ok(false) = may_write(vol.root.as_fd(), Path::new(p), &owner) {
            return Err(Refusal::new(
                Reason::SessionNotYours,
                format!(
                    "session {} belongs to uid {uid}, which may not write {p_q}, so it cannot be \
                     its successor: hand it to a session that can write it",
                    succ.name,
                    p_q = crate::names::display_name(p)
                ),
            )
            .at(p.as_str()));
        }
    }
    Ok(())
}

/// `accept`/`decline` only by the successor's owner uid, `withdraw` only by the giver's
/// (docs/design.md#handoff): a caller of another uid is refused `session_not_yours` (a caller of
/// the same uid in another session gets the engine's `handoff_not_successor`/`handoff_not_giver`).
fn owner_only(
    vol: &Volume,
    s: &Session,
    who: &Who,
    verb: Verb,
    paths: &[String],
) -> Result<(), Refusal> {
    for p in paths {
        let Some(h) = vol.engine.handoff(s, p) else {
            continue;
        };
        let (role, name) = match verb {
            Verb::Withdraw => ("giver", &h.record.giver),
            _ => ("successor", &h.record.successor),
        };
        match vol.engine.owner(name) {
            Some(owner) if *name != s.name && owner != who.uid => {
                return Err(Refusal::new(
                    Reason::SessionNotYours,
                    format!(
                        "the {role} of {p_q} is session {name}, which belongs to uid {owner}: \
                         only that uid may {} it",
                        verb.as_str(),
                        p_q = crate::names::display_name(p)
                    ),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Only the records whose paths the reader may see.
fn seen_records(vol: &Volume, sight: &mut Sight, recs: Vec<RecordJson>) -> Vec<RecordJson> {
    if sight.sees_all() {
        return recs;
    }
    recs.into_iter()
        .filter(|r| sight.sees(vol.root.as_fd(), &r.path))
        .collect()
}

/// `status [PATH]` as the reader may see it: records of paths it may not look up are left
/// out (and out of the counts); `status PATH` of such a path is the answer for a path
/// never seen.
fn seen_status(vol: &Volume, sight: &mut Sight, path: Option<&str>) -> StatusReport {
    let mut st = vol.engine.status(path);
    if sight.sees_all() {
        return st;
    }
    if let Some(p) = path {
        if !sight.sees(vol.root.as_fd(), p) {
            st.version = None;
            st.live.clear();
            st.ended.clear();
        }
    }
    st.live = seen_records(vol, sight, std::mem::take(&mut st.live));
    st.ended = seen_records(vol, sight, std::mem::take(&mut st.ended));
    st.counts.live = st.live.len();
    st.counts.ended = st.ended.len();
    st
}
