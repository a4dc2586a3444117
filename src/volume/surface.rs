//! The `.coherent/` directory of §7: `ctl` (one request per write, the reply read back
//! from the same handle), `status`, `events`, `whoami`, `why`, `inbox`.
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
//! [`Surface`] owns the open virtual handles; the volume's `virtual_*` hooks delegate to it
//! in one line each, and its methods take the [`Volume`] for what they read (engine,
//! journal, resolver, the backing directory).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;

use super::Volume;
use crate::coherence::Timestamp;
use crate::control::{session_json, CtlHandle, Reply, Request, Verb, NO_REFUSAL};
use crate::error::{Reason, Refusal};
use crate::fuse::open_writes;
use crate::identity::{Session, SessionInfo, Via};
use crate::passthrough::{
    Attr, Caller, DirEntry, FsError, FsResult, Kind, Time, ROOT_INO, VIRTUAL_INO_BIT,
};

pub(super) const DIR: u64 = VIRTUAL_INO_BIT | 1;
const CTL: u64 = VIRTUAL_INO_BIT | 2;
const STATUS: u64 = VIRTUAL_INO_BIT | 3;
const EVENTS: u64 = VIRTUAL_INO_BIT | 4;
const WHOAMI: u64 = VIRTUAL_INO_BIT | 5;
const WHY: u64 = VIRTUAL_INO_BIT | 6;
const INBOX: u64 = VIRTUAL_INO_BIT | 7;

const FILES: [(&str, u64); 6] = [
    ("ctl", CTL),
    ("status", STATUS),
    ("events", EVENTS),
    ("whoami", WHOAMI),
    ("why", WHY),
    ("inbox", INBOX),
];

/// One open handle of a virtual file.
enum VHandle {
    Ctl(CtlHandle),
    /// Content computed at open.
    Text(Vec<u8>),
    /// The journal, read at each offset plus `shift`: a reader that started below the
    /// log's base (compacted away) is moved up to the base once, and stays moved, so it
    /// reads each event once.
    Events {
        shift: u64,
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
    pub(super) fn new() -> Self {
        let now = time_now();
        Surface {
            handles: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            events_seen: Mutex::new((0, now)),
            started: now,
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
        }
    }
}

/// The text of `why`: the latest refusal or stale write (its versions are in the text),
/// then when it happened; `no refusal` when there was none.
fn why_text(t: Option<(String, Option<Timestamp>)>) -> Vec<u8> {
    match t {
        Some((t, at)) => {
            let mut out = t.trim_end().to_string();
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
            STATUS | WHOAMI | WHY | INBOX => (Kind::File, 0o444, 0, time_now()),
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
            EVENTS => VHandle::Events { shift: 0 },
            STATUS => VHandle::Text(json_line(&vol.engine.status(None))),
            WHOAMI => VHandle::Text(json_line(&whoami_json(vol, caller))),
            WHY => VHandle::Text(why_text(vol.engine.why_at(&vol.session(caller)))),
            INBOX => VHandle::Text(json_line(&vol.engine.inbox(&vol.session(caller)))),
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

    pub(super) fn read(
        &self,
        vol: &Volume,
        token: u64,
        offset: u64,
        size: u32,
    ) -> FsResult<Vec<u8>> {
        let h = self.handle(token)?;
        let mut h = h.lock();
        match &mut *h {
            VHandle::Ctl(c) => Ok(c.read(offset, size).to_vec()),
            VHandle::Text(t) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(t.len());
                let end = start.saturating_add(size as usize).min(t.len());
                Ok(t[start..end].to_vec())
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

    /// One request on `ctl`: served for the writer's session; a refusal fails the write
    /// with its errno (the reply is stored either way, to be read back).
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
        ctl.write(data, |req| self.serve(vol, caller, req))
            .map_err(FsError)
    }

    pub(super) fn release(&self, token: u64) {
        self.handles.lock().remove(&token);
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
        if vol.journal.is_poisoned() {
            return journal_failed(req.verb());
        }
        if let Request::Whoami = req {
            return Reply::whoami(whoami_json(vol, caller));
        }
        let s = &vol.session(caller);
        let verb = req.verb();
        let r = self.serve_verb(vol, s, req);
        if vol.journal.is_poisoned() && !matches!(verb, Verb::Status | Verb::Whoami) {
            // The events of this verb may not be on disk: do not report success.
            return journal_failed(verb);
        }
        match r {
            Ok(reply) => reply,
            Err(f) => {
                // `why` shows the latest refusal, whichever part of the volume made it.
                vol.engine.tell(s, &f.message, Timestamp::now());
                let paths = req.paths();
                let path = (paths.len() == 1).then(|| paths[0].as_str());
                Reply::refused(Some(verb), &f, path)
            }
        }
    }

    fn serve_verb(&self, vol: &Volume, s: &Session, req: &Request) -> Result<Reply, Refusal> {
        let now = Timestamp::now();
        let records = |r: crate::coherence::VerbReply| match serde_json::to_value(&r.records) {
            Ok(Value::Array(v)) => v,
            _ => Vec::new(),
        };
        Ok(match req {
            Request::Register { name: None } => {
                vol.engine.register(s, now)?;
                Reply::session(Verb::Register, s)
            }
            Request::Register { name: Some(n) } => {
                // Anyone may name a session ahead of its first process (an unattributed
                // human preparing a handoff included): it only makes the name known.
                crate::names::validate_session_name(n)
                    .map_err(|e| Refusal::new(Reason::BadRequest, e))?;
                let named = Arc::new(SessionInfo::from_tag(None, n, Via::Registered));
                vol.engine.register(&named, now)?;
                let known = vol.engine.lookup_session(n).unwrap_or(named);
                Reply::session(Verb::Register, &known)
            }
            Request::Transfer { paths, to, note } => {
                tracked_paths(vol, paths)?;
                observe_paths(vol, paths, now)?;
                let r = match vol.engine.transfer(s, paths, to, note.clone(), now) {
                    Err(f)
                        if matches!(f.reason, Reason::HandoffInFlight | Reason::NoSuchPath)
                            && vol.wait_for_releases(s, paths) =>
                    {
                        let now = Timestamp::now();
                        observe_paths(vol, paths, now)?;
                        vol.engine.transfer(s, paths, to, note.clone(), now)
                    }
                    r => r,
                }?;
                Reply::records(Verb::Transfer, records(r))
            }
            Request::Accept { paths } => {
                observe_paths(vol, paths, now)?;
                Reply::records(Verb::Accept, records(vol.engine.accept(s, paths, now)?))
            }
            Request::Decline { paths } => {
                observe_paths(vol, paths, now)?;
                Reply::records(Verb::Decline, records(vol.engine.decline(s, paths, now)?))
            }
            Request::Withdraw { paths } => {
                observe_paths(vol, paths, now)?;
                Reply::records(Verb::Withdraw, records(vol.engine.withdraw(s, paths, now)?))
            }
            Request::Status { path } => {
                if let Some(p) = path {
                    if vol.is_tracked(p, false) {
                        vol.observe(p, now);
                    }
                }
                let st = vol.engine.status(path.as_deref());
                let c = st.counts;
                let msg = match path {
                    Some(p) => format!(
                        "{p}: {}; {} live and {} ended handoff record(s)",
                        st.version
                            .map(|v| format!("v{v}"))
                            .unwrap_or_else(|| "not in the volume".into()),
                        c.live,
                        c.ended
                    ),
                    None => format!(
                        "{} session(s), {} path(s), {} live and {} ended handoff record(s)",
                        c.sessions, c.paths, c.live, c.ended
                    ),
                };
                let body = serde_json::to_value(&st).unwrap_or(Value::Null);
                Reply::status(body, msg)
            }
            Request::Whoami => unreachable!("served above, with the ignored tags"),
        })
    }
}

/// A transfer hands on tracked paths only (§3): each untracked one is refused
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
                    format!("{p} is not tracked by the volume, so it cannot be handed on: {why}"),
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
fn observe_paths(vol: &Volume, paths: &[String], now: Timestamp) -> Result<(), Refusal> {
    for p in paths {
        if vol.observe(p, now).is_some_and(|x| x.1) {
            return Err(Refusal::new(
                Reason::BadRequest,
                format!("bad request: {p} is a directory; hand on the files in it"),
            ));
        }
    }
    Ok(())
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
