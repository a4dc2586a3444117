//! The verbs server: what `ctl` runs on a well-formed request (`register`, `transfer`,
//! `accept`, `decline`, `withdraw`, `status`, `whoami`, `wait`), served for the caller's
//! session. (What the `.coherent/` files show each reader is `control::views`.)
//!
//! A path in a request resolves beneath the backing root ([`crate::beneath`]) once, when
//! the request is placed: one that leaves it is `bad_request` "outside the volume",
//! whether or not the host path exists, and the engine never hears of it; a path the
//! caller could not look up itself ([`crate::visibility`]) is answered as one that does
//! not exist. Every check of the verb reads that one look (`checks.rs`).

mod checks;
mod history;

pub(super) use checks::placed;
use checks::{
    fingerprint_paths, observe_paths, owner_only, place_request, successor_may_write,
    tracked_paths, writers_may_write, Seen,
};

use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use super::control::views::{seen_status, whoami_json};
use super::handles::Handles;
use super::history::History;
use super::sessions::{self, Sessions};
use super::standing::Standing;
use super::tell::{Tell, Told};
use super::waits::{self, Check};
use super::workspace::Workspace;
use super::Owners;
use crate::coherence::{Engine, Timestamp, Until};
use crate::control::{Reply, Request, Verb};
use crate::coordinator::{Coordinator, StepKind};
use crate::error::{Reason, Refusal};
use crate::identity::{Session, Via};
use crate::journal::Journal;
use crate::request_timeout::Started;
use crate::store::{Backing, Caller};
use crate::visibility::Sight;

/// How long a transfer asks again whether a file is still open for writing where the
/// volume does not see it, before refusing (see [`Verbs::unseen_writer`]).
const UNSEEN_WRITER_SETTLE: Duration = Duration::from_millis(100);

/// The verbs server of one volume.
pub struct Verbs {
    engine: Arc<Engine>,
    journal: Arc<Journal>,
    coord: Arc<dyn Coordinator>,
    backing: Backing,
    sessions: Arc<Sessions>,
    /// What is on disk at a path.
    ws: Arc<Workspace>,
    tell: Arc<Tell>,
    history: Arc<History>,
    /// The open write handles, for the in-flight rule of a transfer.
    handles: Arc<Handles>,
    /// Where the volume is mounted (to recognise its files in `/proc/PID/fd`).
    mountpoint: PathBuf,
    /// How long a transfer refused `handoff_in_flight` waits for imminent releases.
    in_flight_wait: Duration,
    /// How file data flows, as the FUSE layer found it at `init` (`data_mode` in `status`).
    data_mode: Mutex<Option<String>>,
    /// The sessions' standing waits (`wait --standing`), kept in the state directory.
    standing: Arc<Standing>,
}

impl Verbs {
    pub(super) fn new(
        o: &Owners,
        handles: Arc<Handles>,
        mountpoint: PathBuf,
        in_flight_wait: Duration,
        standing: Arc<Standing>,
    ) -> Self {
        Verbs {
            engine: o.engine.clone(),
            journal: o.journal.clone(),
            coord: o.coord.clone(),
            backing: o.backing.clone(),
            sessions: o.sessions.clone(),
            ws: o.ws.clone(),
            tell: o.tell.clone(),
            history: o.history.clone(),
            handles,
            mountpoint,
            in_flight_wait,
            standing,
            data_mode: Mutex::new(None),
        }
    }

    /// The engine, whose changes the waits follow.
    pub(super) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(super) fn set_data_mode(&self, mode: &str) {
        *self.data_mode.lock() = Some(mode.to_string());
    }

    /// A `wait` request on `ctl`: answered now (refused, or reached) or later.
    pub(super) fn wait_check(&self, caller: &Caller, req: &Request) -> Check {
        wait_check(self, caller, req)
    }

    /// The name of `caller`'s session.
    pub(super) fn session_name(&self, caller: &Caller) -> String {
        self.sessions.session(caller).name.to_string()
    }

    /// `wait --standing`: checked as a wait with no time to wait (the same refusals, at
    /// once), then kept for the caller's session.
    pub(super) fn standing_register(&self, caller: &Caller, path: &str, until: Until) -> Reply {
        let probe = Request::Wait {
            path: path.to_string(),
            until,
            timeout_ms: Some(0),
        };
        let Check::Now(checked) = self.wait_check(caller, &probe) else {
            unreachable!("a wait with no time to wait is answered now")
        };
        let me = self.session_name(caller);
        let reply = self.standing.register(&self.engine, &me, until, checked);
        // The wait thread now follows record changes for it.
        self.engine.poke();
        reply
    }

    /// `wait --report`: the caller's session's resolved standing waits, told once.
    pub(super) fn standing_report(&self, caller: &Caller) -> Reply {
        self.standing.resolve(&self.engine);
        let mut sight = Sight::new(sessions::who(caller));
        let root = self.backing.fd();
        self.standing
            .report(&self.session_name(caller), |p| sight.sees(root, p))
    }

    /// A wait of `session` on `path` was answered "reached": its standing twin is done.
    pub(super) fn standing_answered(&self, session: &str, path: &str, until: Until) {
        self.standing.answered(session, path, until)
    }

    /// Resolve the standing waits whose state is reached; true while any still waits.
    pub(super) fn standing_resolve(&self) -> bool {
        self.standing.resolve(&self.engine)
    }

    /// Serve one parsed request for `caller`.
    pub(super) fn serve(&self, caller: &Caller, req: &Request) -> Reply {
        let v = self;
        if v.journal.is_poisoned() && !matches!(req, Request::Status { .. }) {
            return journal_failed(req.verb());
        }
        if let Request::Whoami = req {
            return Reply::whoami(whoami_json(&v.sessions, caller));
        }
        let s = &v.sessions.session(caller);
        let verb = req.verb();
        let mut sight = Sight::new(sessions::who(caller));
        let r = match not_yours(s, verb).map_or_else(|| place_request(v, &mut sight, req), Err) {
            Ok((req, mut seen)) => {
                self.serve_agreed(s, &mut sight, &mut seen, &req, caller.started)
            }
            Err(f) => Err(f),
        };
        if v.journal.is_poisoned() && !matches!(verb, Verb::Status | Verb::Whoami) {
            // The events of this verb may not be on disk: do not report success.
            return journal_failed(verb);
        }
        match r {
            Ok(reply) => reply,
            Err(f) => {
                // `why` shows the latest refusal, whichever part of the volume made it.
                v.tell.tell(s, Told::Refused(&f), Timestamp::now());
                let paths = req.paths();
                let path = (paths.len() == 1).then(|| paths[0].as_str());
                Reply::refused(Some(verb), &f, path)
            }
        }
    }

    /// With a coordinator, a verb is one agreed step (refused `coordinator_unavailable`
    /// when etcd cannot be reached), and `status` first catches up with the other hosts;
    /// all within the budget of the request that `started` then.
    fn serve_agreed(
        &self,
        s: &Session,
        sight: &mut Sight,
        seen: &mut Seen,
        req: &Request,
        started: Started,
    ) -> Result<Reply, Refusal> {
        let v = self;
        let verb = req.verb();
        if !v.coord.is_shared() {
            let attempt = || self.serve_verb(&v.engine, s, sight, seen, req);
            let refused = |r: &Result<_, _>| matches!(r, Err(f) if in_flight(f));
            return self.once_more_after_releases(s, req, started, attempt, refused);
        }
        if matches!(verb, Verb::Whoami | Verb::Wait) {
            return self.serve_verb(&v.engine, s, sight, seen, req);
        }
        if verb == Verb::Status {
            // Best effort: a host cut off answers with what it has (and says so).
            v.coord.catch_up(started);
            return self.serve_verb(&v.engine, s, sight, seen, req);
        }
        let names: Vec<(&str, bool)> = req.paths().iter().map(|p| (p.as_str(), false)).collect();
        // The wait for releases happens outside the step, which their release needs.
        let attempt = || {
            let mut out = None;
            let stepped = v
                .coord
                .step(&v.engine, &names, StepKind::Verb, started, &mut |e| {
                    let r = self.serve_verb(e, s, sight, seen, req);
                    let ok = r.is_ok();
                    out = Some(r);
                    ok
                });
            stepped.map(|st| (st, out))
        };
        let refused = |r: &Result<_, Refusal>| matches!(r, Ok((_, Some(Err(f)))) if in_flight(f));
        let (stepped, out) = self.once_more_after_releases(s, req, started, attempt, refused)?;
        if stepped.in_flight.is_empty() && stepped.newer.is_empty() {
            return out.expect("the step ran the verb");
        }
        // Another host has the file open for writing by this giver, or holds a version of
        // it the giver did not see: the transfer is undone (withdrawn), as one host
        // refuses it (`handoff_in_flight`, `handoff_not_held`).
        let undone: Vec<(String, u64, Reason)> = stepped
            .in_flight
            .iter()
            .map(|(p, id)| (p.clone(), *id, Reason::HandoffInFlight))
            .chain(
                stepped
                    .newer
                    .iter()
                    .map(|(p, id, _)| (p.clone(), *id, Reason::HandoffNotHeld)),
            )
            .collect();
        let undo = v
            .coord
            .step(&v.engine, &names, StepKind::Verb, started, &mut |e| {
                let now = Timestamp::now();
                for (p, id, why) in &undone {
                    e.undo_transfer(p, *id, *why, now);
                }
                true
            });
        if let Err(r) = undo {
            tracing::warn!("undoing a transfer found in flight: {}", r.message);
        }
        if !stepped.in_flight.is_empty() {
            let paths: Vec<String> = stepped.in_flight.iter().map(|x| x.0.clone()).collect();
            return Err(Refusal::new(
                Reason::HandoffInFlight,
                format!(
                    "this session still has {} open for writing on another host (under this \
                     or another name): close it there first, then transfer",
                    paths.join(", ")
                ),
            )
            .at(paths[0].clone()));
        }
        let (path, _, host) = &stepped.newer[0];
        Err(Refusal::new(
            Reason::HandoffNotHeld,
            format!(
                "{path} has a newer version on host {host} than this host's copy, which this \
                 session read: hand on only what it has seen. Read {path} again once the \
                 sync has brought that version here, then transfer"
            ),
        )
        .at(path.clone()))
    }

    /// Runs a verb's changes through `e`: the volume's engine, or a step's view of it.
    fn serve_verb(
        &self,
        e: &Engine,
        s: &Session,
        sight: &mut Sight,
        seen: &mut Seen,
        req: &Request,
    ) -> Result<Reply, Refusal> {
        let v = self;
        let now = Timestamp::now();
        seen.attempt(v);
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
                // Each path was looked at once, when placed; every check reads that look.
                tracked_paths(v, seen)?;
                observe_paths(v, e, seen, now)?;
                fingerprint_paths(v, e, seen, now)?;
                if v.coord.is_shared() {
                    for p in &seen.paths {
                        let below = e.version(p).unwrap_or(0);
                        e.know_older_prints(p, v.history.older_prints(p, below));
                    }
                }
                writers_may_write(v, sight.who(), to, seen)?;
                self.no_writer_under_another_name(s, seen)?;
                self.no_unseen_writer(seen)?;
                let r = e.transfer(s, paths, to, note.clone(), now)?;
                Reply::records(Verb::Transfer, records(r))
            }
            Request::Accept { paths } => {
                observe_paths(v, e, seen, now)?;
                owner_only(v, s, sight.who(), Verb::Accept, paths)?;
                successor_may_write(v, s, sight.who(), seen)?;
                Reply::records(Verb::Accept, records(e.accept(s, paths, now)?))
            }
            Request::Decline { paths } => {
                observe_paths(v, e, seen, now)?;
                owner_only(v, s, sight.who(), Verb::Decline, paths)?;
                Reply::records(Verb::Decline, records(e.decline(s, paths, now)?))
            }
            Request::Withdraw { paths } => {
                observe_paths(v, e, seen, now)?;
                owner_only(v, s, sight.who(), Verb::Withdraw, paths)?;
                Reply::records(Verb::Withdraw, records(e.withdraw(s, paths, now)?))
            }
            Request::Status { path } => {
                if let Some(p) = path
                    .as_deref()
                    .filter(|p| v.ws.is_tracked(p, false) && sight.sees(v.backing.fd(), p))
                {
                    v.ws.observe(p, now);
                }
                let st = seen_status(&v.engine, &v.backing, sight, path.as_deref());
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
                if let Some(c) = v.coord.describe() {
                    body["coordinator"] = c;
                }
                if let Some(m) = self.data_mode.lock().clone() {
                    body["data_mode"] = Value::String(m);
                }
                let msg = match journal_json(v) {
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

    /// The in-flight rule, in one place: FUSE sends RELEASE after `close(2)` returned, so a
    /// transfer `refused` in flight (see [`in_flight`]) by write handles of `s` that are
    /// being released waits for them (see [`Handles::wait_for_releases`]), then is `attempt`ed
    /// once more; the wait ends within the budget of the request that `started` then.
    fn once_more_after_releases<T>(
        &self,
        s: &Session,
        req: &Request,
        started: Started,
        mut attempt: impl FnMut() -> T,
        refused: impl Fn(&T) -> bool,
    ) -> T {
        let first = attempt();
        match req {
            Request::Transfer { paths, .. }
                if refused(&first) && self.wait_for_releases(s, paths, started) =>
            {
                attempt()
            }
            _ => first,
        }
    }

    /// See [`Handles::wait_for_releases`].
    fn wait_for_releases(&self, s: &Session, paths: &[String], started: Started) -> bool {
        self.handles
            .wait_for_releases(s, paths, &self.mountpoint, self.in_flight_wait, started)
    }

    /// The giver's write handles are in flight under any name of the file: the engine
    /// knows a handle by the name it was opened under, so one opened as `side.md` and then
    /// renamed over the handed path is found here, by the file's inode (when another
    /// process also has the file open for writing, the kernel's answer below cannot tell
    /// them apart).
    fn no_writer_under_another_name(&self, s: &Session, seen: &Seen) -> Result<(), Refusal> {
        for (p, st) in seen.iter() {
            let Some((st, _)) = st else { continue };
            if self.handles.writes_inode(&s.name, st.ino) {
                return Err(Refusal::new(
                    Reason::HandoffInFlight,
                    format!(
                        "this session still has {p_q} open for writing (under this or another \
                         name): close it first, then transfer",
                        p_q = crate::names::display_name(p)
                    ),
                )
                .at(p.as_str()));
            }
        }
        Ok(())
    }

    /// A transfer is not acknowledged while a process holds the file open for writing where
    /// the volume does not see it (docs/handoff.md#in-flight): a descriptor opened through
    /// this volume before its daemon was killed (with FUSE passthrough it writes straight to
    /// the backing file), or one opened in the backing directory itself. The kernel tells
    /// whether the inode is open for writing at all ([`crate::store::open_for_writing`]);
    /// when the volume has a write handle of its own on it, the two cannot be told apart and
    /// the engine's rules decide (the giver's own handle is in flight there, a bystander's
    /// reserves nothing).
    fn no_unseen_writer(&self, seen: &Seen) -> Result<(), Refusal> {
        for (i, (p, st)) in seen.iter().enumerate() {
            match self.unseen_writer(seen.at(self, i), p, st) {
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
                None => warn_no_leases(p),
            }
        }
        Ok(())
    }

    /// Is `p` open for writing by something other than this volume's own write handles?
    /// `Some(false)` also when the volume has a write handle on any name of the file
    /// (then the kernel's answer covers it too, and cannot be split). `None`: the backing
    /// filesystem cannot tell.
    /// `at` is where the file is asked about (see [`Seen::at`]).
    fn unseen_writer(
        &self,
        at: (BorrowedFd<'_>, &str),
        p: &str,
        st: Option<(crate::coherence::Stamp, bool)>,
    ) -> Option<bool> {
        let writing = || crate::store::open_for_writing(at.0, at.1);
        if !writing()? {
            return Some(false);
        }
        // Only now: the names of the file (a scan of the engine's paths).
        let mut names = vec![p.to_string()];
        if let Some((st, _)) = st {
            names.extend(self.engine.paths_of_inode(st.ino));
        }
        // A write handle the volume has just released closes its backing file (and the
        // kernel drops its passthrough reference, a deferred close) a moment after the
        // volume hears of it: ask again for a short while before calling a writer unseen.
        let settle = Instant::now() + UNSEEN_WRITER_SETTLE;
        loop {
            if !writing()? {
                return Some(false);
            }
            if self.handles.open_on(&names, st.map(|(st, _)| st.ino)) {
                return Some(false);
            }
            if Instant::now() >= settle {
                return Some(true);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Says once per daemon that writers outside the volume cannot be seen on this backing
/// filesystem, so a transfer cannot check for them.
fn warn_no_leases(p: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            "cannot tell whether {p} is open for writing outside the volume (the backing \
             filesystem grants no file leases): a transfer cannot check for descriptors \
             from before a restart"
        )
    });
}

/// A transfer refused for a write handle still open (or a file its creating handle has
/// not committed yet): worth waiting for imminent releases.
fn in_flight(f: &Refusal) -> bool {
    matches!(f.reason, Reason::HandoffInFlight | Reason::NoSuchPath)
}

/// The state log's trouble, for `status` (None while it is written normally): JSON and a
/// line.
fn journal_json(v: &Verbs) -> Option<(Value, String)> {
    if !v.journal.is_poisoned() {
        return None;
    }
    let (kept, shed, limit) = v.journal.backlog();
    let shedding = v.journal.is_shedding();
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

/// A `wait` request placed and checked like any request on a path (beneath the root, a
/// path the caller may look up, tracked), then answered now or later.
fn wait_check(v: &Verbs, caller: &Caller, req: &Request) -> Check {
    let mut sight = Sight::new(sessions::who(caller));
    let refused = |f: Refusal, p: &str| Check::Now(Reply::refused(Some(Verb::Wait), &f, Some(p)));
    let (placed, seen) = match place_request(v, &mut sight, req) {
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
    if let Err(f) = tracked_paths(v, &seen) {
        return refused(f, &path);
    }
    v.ws.observe_seen(&v.engine, &path, seen.stat(0), Timestamp::now());
    let me = v.sessions.session(caller).name.to_string();
    waits::check(&v.engine, &me, &path, until, timeout_ms)
}
