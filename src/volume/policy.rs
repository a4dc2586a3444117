//! The write policy of the volume: the [`Policy`] the filesystem asks around every
//! write route, open, flush and release (docs/design.md#write-routes).
//!
//! - **Tracked paths first**: an untracked path passes through with no session lookup, no
//!   engine call and no event; a change through the mount of an ignore file, or a
//!   directory rename, retracks at once.
//! - **The decision**: every write route is decided by [`Engine::decide`] (or, for a
//!   caller whose session cannot be resolved, [`Engine::decide_unresolved`]: fail
//!   closed) before it reaches the backing directory, with who and what resolved once
//!   in the [`Workspace`]. A refusal goes through the one recipe of `tell.rs`.
//! - **Write handles**: an open for write is fenced and acquires its hold *before* the
//!   backing file is opened (a fenced `> plan.md` truncates nothing); its
//!   [`WriteHandle`] is then registered in [`Handles`] until its release, which commits,
//!   releases or reclaims (docs/design.md#handoff).

mod alias;
mod hosts;
mod routes;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use super::changes::Changes;
use super::handle::{End, WriteHandle};
use super::handles::Handles;
use super::history::History;
use super::liveness::{closer_runs, session_running, FLUSH_PROC_WAIT};
use super::sessions::Sessions;
use super::tell::{Denied, Tell, Told};
use super::workspace::{rel, stamp, Workspace};
use super::Owners;
use crate::access::Who;
use crate::coherence::{
    self, At, CommitOp, Engine, Found, Permit, Reach, Route, Timestamp, Write, XATTR_PREFIX,
};
use crate::coordinator::{Coordinator, StepKind, Ticket};
use crate::error::{Reason, Refusal};
use crate::fs::{open_writes, HandleInfo, HandleState, OpenInfo, Policy, WriteRoute};
use crate::identity::Session;
use crate::journal::Journal;
use crate::request_timeout::Started;
use crate::store::{Backing, Caller, FsError, FsResult};
use crate::visibility::Sight;

/// The computed xattrs this policy serves under [`XATTR_PREFIX`]
/// (docs/design.md#control-surface). Defined here, where they are served, so the policy
/// takes nothing from its parent module (which names them too).
pub const XATTR_VERSION: &str = "user.coherent.version";
pub const XATTR_HANDOFF: &str = "user.coherent.handoff";

/// `renameat2` flag: swap the two names.
const RENAME_EXCHANGE: u32 = 2;

/// What an open for write with `flags` can do to the bytes there (the stale guard's one
/// fact of the request): only an `O_APPEND` open that does not truncate only appends.
fn reach(flags: i32) -> Reach {
    if flags & libc::O_APPEND != 0 && flags & libc::O_TRUNC == 0 {
        Reach::Append
    } else {
        Reach::Overwrite
    }
}

/// The volume's write policy: decides and counts write routes, keeps write handles.
pub struct WritePolicy {
    engine: Arc<Engine>,
    journal: Arc<Journal>,
    coord: Arc<dyn Coordinator>,
    backing: Backing,
    sessions: Arc<Sessions>,
    /// What is on disk at a path.
    ws: Arc<Workspace>,
    changes: Arc<Changes>,
    tell: Arc<Tell>,
    history: Arc<History>,
    handles: Arc<Handles>,
}

impl WritePolicy {
    pub(super) fn new(o: &Owners, handles: Arc<Handles>) -> Self {
        WritePolicy {
            engine: o.engine.clone(),
            journal: o.journal.clone(),
            coord: o.coord.clone(),
            backing: o.backing.clone(),
            sessions: o.sessions.clone(),
            ws: o.ws.clone(),
            changes: o.changes.clone(),
            tell: o.tell.clone(),
            history: o.history.clone(),
            handles,
        }
    }

    /// The decision of write `w` by the caller (who it is resolved here, once): fail
    /// closed while the journal sheds or the lease is unconfirmed, one agreed step when a
    /// name is shared across hosts, the engine's answer otherwise.
    fn decide(&self, caller: &Caller, w: Write<'_>) -> Result<Option<Permit>, FsError> {
        let now = Timestamp::now();
        let who = self.sessions.writer(caller);
        if let Some(r) = self.shedding_refusal(&w) {
            // Past the journal's bound nothing about a handed file can be recorded: fail
            // closed on it (`EACCES`, as a fence); other writes go on.
            let (Ok(session) | Err(session)) = &who;
            let (caller, tell, log) = (Some(caller), who.is_ok(), None);
            self.tell.refuse_write(
                Denied {
                    caller,
                    session,
                    tell,
                    log,
                },
                &r,
                now,
            );
            return Err(FsError(libc::EACCES));
        }
        if let Some(p) = self.unjudged(&w, &who) {
            // A change behind the volume's back not judged yet (its content is being
            // read, `judge.rs`): a record on the path may be overtaken by it, so a write
            // there waits for the judgement, not on it. The caller tries again.
            tracing::info!(
                "write to {p} held back: it changed behind the volume's back and its \
                 content is still being compared (EAGAIN: try again)"
            );
            return Err(FsError(libc::EAGAIN));
        }
        let decide = |e: &Engine| match &who {
            Ok(s) => e.decide(s, w, now).map_err(|r| (s.clone(), r)),
            Err(anyone) => e
                .decide_unresolved(anyone, w, now)
                .map_err(|r| (anyone.clone(), r)),
        };
        let decided = match (self.unconfirmed(&who, &w), self.coordinated(&w)) {
            (Some(refused), _) => Err(refused),
            (None, None) => decide(&self.engine),
            (None, Some(names)) => self.admit(&who, &names, w, caller.started, decide),
        };
        match decided {
            Ok(permit) => {
                if let Some(a) = permit.acquired.filter(|a| a.stale) {
                    // A stale write allowed (`--stale warn`, or an append under `guard`):
                    // the writer is told.
                    let seen = a.view.unwrap_or(0);
                    let stale = Told::Stale(&permit.path, a.version, seen);
                    self.tell.tell(&permit.session, stale, now);
                }
                Ok(Some(permit))
            }
            Err((session, r)) => {
                // The engine logs `denied` with its decision; a write held back for want of
                // the coordinator never reached it.
                let log = (r.reason == Reason::CoordinatorUnavailable).then(|| w.route());
                let d = Denied {
                    caller: Some(caller),
                    session: &session,
                    tell: true,
                    log,
                };
                Err(self.tell.refuse_write(d, &r, now))
            }
        }
    }

    /// A write route that succeeded: retrack what it changed (ignore files, a directory
    /// moved). Runs for tracked and untracked paths alike.
    fn retrack_after(&self, route: &WriteRoute<'_>) {
        match *route {
            WriteRoute::Rename { from, to, .. } => {
                let moved_dir = rel(to).is_some_and(|t| self.ws.stat(t).is_some_and(|x| x.1));
                for p in [rel(from), rel(to)].into_iter().flatten() {
                    self.ws.retrack(p, moved_dir);
                }
            }
            WriteRoute::Setattr { path, .. }
            | WriteRoute::Unlink { path }
            | WriteRoute::Symlink { path, .. }
            | WriteRoute::Mknod { path, .. } => {
                if let Some(p) = rel(path) {
                    self.ws.retrack(p, false);
                }
            }
            WriteRoute::Link { to, .. } => {
                if let Some(p) = rel(to) {
                    self.ws.retrack(p, false);
                }
            }
            _ => {}
        }
    }

    /// A write handle flushed or released: if it changed an ignore file, retrack.
    fn retrack_handle(&self, h: &HandleInfo<'_>) {
        if open_writes(h.flags) && h.changed() {
            if let Some(p) = rel(h.path) {
                self.ws.retrack(p, false);
            }
        }
    }

    /// While the journal sheds (its memory bound reached during a disk outage): the
    /// refusal of a write route touching a path with a live record.
    fn shedding_refusal(&self, w: &Write<'_>) -> Option<Refusal> {
        if !self.journal.is_shedding() {
            return None;
        }
        let p = w
            .names()
            .into_iter()
            .map(|x| x.0)
            .find(|p| self.engine.has_live_record(p))?;
        Some(
            Refusal::new(
                Reason::IoError,
                format!(
                    "write denied: {p_q} is handed on, and the volume cannot record a change of \
                     it now (its state log cannot be written and the events it keeps in \
                     memory reached their bound); refused until the disk takes writes again",
                    p_q = crate::names::display_name(p)
                ),
            )
            .at(p),
        )
    }

    /// A name of `w` with a live record whose changed stamp is not judged yet.
    /// (A session fenced there is refused by the fence as ever.)
    fn unjudged<'a>(&self, w: &Write<'a>, who: &Result<Session, Session>) -> Option<&'a str> {
        let (Ok(s) | Err(s)) = who;
        w.paths()
            .into_iter()
            .flatten()
            .find_map(|at| match at.found {
                Found::File(st)
                    if self.ws.unjudged(at.path, &st, at.print.is_some())
                        && self.engine.has_live_record(at.path)
                        && !self.engine.is_fenced(s, at.path) =>
                {
                    Some(at.path)
                }
                _ => None,
            })
    }

    /// A write handle changed its file's ctime but not its content (`touch -a` is an open
    /// for write and a `futimens`): not a commit, so the names of the file take the new
    /// stamp (else the next open would count it as a change behind the volume's back).
    fn restamp_handle(&self, h: &HandleInfo<'_>) {
        if !h.changed() || h.content_changed() {
            return;
        }
        let Some((p, st)) = self.handle_path(h) else {
            return;
        };
        self.engine.restamp(p, st);
        self.ws.restamp_other_names(st.ino, &[p]);
    }

    /// The path a handle's commit (or restamp) counts for, with the handle's stamp. None
    /// when the name no longer denotes the handle's file: a sync (or any tool) replaced it
    /// by a rename in the backing directory, and what the handle wrote went to the orphan,
    /// which no name shows (counted, it would be a commit of bytes nobody can read, and
    /// would end a live record).
    fn handle_path<'p>(&self, h: &HandleInfo<'p>) -> Option<(&'p str, coherence::Stamp)> {
        let p = rel(h.path)?;
        let st = stamp(&h.now);
        if self.ws.stat(p).map(|(now, _)| now.ino) != Some(st.ino) {
            tracing::info!(
                "{}: a handle's file was replaced in the backing directory while open; \
                 what it wrote is in no file of the volume, nothing counted",
                crate::names::display_name(p)
            );
            return None;
        }
        Some((p, st))
    }

    /// `RENAME_EXCHANGE` of `f` and `t` (after it succeeded): two files each take the
    /// other's content (a commit of both); a directory side moves through a temporary
    /// name so the versions under both trees swap.
    fn exchange(&self, e: &Engine, s: &Session, f: &str, t: &str, now: Timestamp) {
        let f_dir = self.ws.stat(f).is_some_and(|x| x.1); // now holds the old t
        let t_dir = self.ws.stat(t).is_some_and(|x| x.1); // now holds the old f
        if !f_dir && !t_dir {
            // An untracked side of the swap is not counted (docs/design.md#versions).
            for p in [f, t].into_iter().filter(|p| self.ws.is_tracked(p, false)) {
                self.history.with_history(p, s, CommitOp::Rename, now, || {
                    e.commit(s, p, CommitOp::Rename, self.ws.stamp_now(p), now)
                });
            }
            return;
        }
        let tmp = format!("{f}.coherent-exchange-{}", e.last_seq());
        let (old_f_dir, old_t_dir) = (t_dir, f_dir);
        if old_f_dir {
            e.rename(s, f, &tmp, true, None, now);
            e.rename(s, t, f, old_t_dir, self.ws.stamp_now(f), now);
            e.rename(s, &tmp, t, true, None, now);
        } else {
            e.rename(s, t, &tmp, true, None, now);
            e.rename(s, f, t, false, self.ws.stamp_now(t), now);
            e.rename(s, &tmp, f, true, None, now);
        }
    }
}

impl Policy for WritePolicy {
    fn before_write(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
    ) -> Result<Option<Permit>, FsError> {
        let r = self.decide_write(caller, route);
        if matches!(r, Ok(Some(_))) {
            self.history.history_before(route);
        }
        r
    }

    fn after_write(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
        permit: Option<Permit>,
        outcome: Result<(), FsError>,
    ) {
        if outcome.is_ok() {
            self.retrack_after(route);
            self.changes.after_write(self.backing.fd(), route, |dir| {
                // git's own rules: `.coherentignore` is the volume's, not git's.
                self.ws
                    .why_untracked(dir, true)
                    .is_some_and(|u| !u.by_coherentignore())
            });
        }
        let Some(pm) = permit else { return };
        let now = Timestamp::now();
        let names = [
            (pm.path.as_str(), pm.is_dir),
            (pm.to.as_deref().unwrap_or(""), pm.is_dir),
        ];
        let names = &names[..if pm.to.is_some() { 2 } else { 1 }];
        let failed = outcome.is_err();
        self.counted(names, caller.started, |e| {
            self.count_write(e, route, &pm, failed, now)
        });
    }

    fn on_open(
        &self,
        caller: &Caller,
        open: &OpenInfo<'_>,
        permit: Option<Permit>,
    ) -> Result<Option<HandleState>, FsError> {
        let now = Timestamp::now();
        // A file just made has no other name; another may have some (one fstatat, only
        // when the ring of changes records).
        self.changes.opened(open, || match open.created {
            true => Some(1),
            false => rel(open.path)
                .and_then(|p| self.ws.stat_links(p))
                .map(|x| x.2),
        });
        if !open_writes(open.flags) {
            if let Some(p) = rel(open.path).filter(|p| self.ws.is_tracked(p, false)) {
                // A handed file is read at the version the hosts agree on (its view then
                // lets this session hand it on); any other read never waits on etcd.
                if self.coord.shared(&self.engine, p) {
                    self.coord.catch_up(caller.started);
                }
                let s = self.sessions.session(caller);
                let before = self.engine.last_seq();
                let (st, uid) = (stamp(&open.stamp), Some(caller.uid));
                self.ws.observe_file_by(&self.engine, p, st, uid, None, now);
                self.engine.open_read(&s, p, now);
                // A successor's first open logs `handoff_seen`: in the log when it returns.
                if self.engine.last_seq() != before {
                    if let Err(e) = self.journal.write_out() {
                        tracing::warn!("writing the state log: {e}");
                    }
                }
            }
            return Ok(None);
        }
        if open.flags & libc::O_TRUNC != 0 || open.created {
            if let Some(p) = rel(open.path) {
                self.ws.retrack(p, false);
            }
        }
        // No acquire (an untracked path, a directory): no state. Multi-host, an agent's
        // write handle of a file is kept by its inode all the same: the file may become
        // a tracked one that another host hands on while it is open (moved to a tracked
        // name, or the ignore rule dropped).
        let Some(pm) = permit.filter(|pm| pm.acquired.is_some()) else {
            if self.coord.is_shared() {
                let s = self.sessions.session(caller);
                if s.is_attributed() {
                    let ino = stamp(&open.stamp).ino;
                    return Ok(Some(self.handles.insert_unheld(ino, &s.name)));
                }
            }
            return Ok(None);
        };
        if rel(open.path) != Some(pm.path.as_str()) {
            // Not the file the permit was made for (renamed in between): give the hold back.
            self.engine.close_write(&pm.session, &pm.path, false, now);
            return Ok(None);
        }
        // An O_TRUNC open that emptied the file changed it before the handle's first stamp.
        let dirty =
            open.flags & libc::O_TRUNC != 0 && pm.pre.is_some_and(|pre| pre != stamp(&open.stamp));
        // Multi-host: an agent's handle is checked at each write against what it was
        // admitted under (unattributed processes are never givers).
        let ticket = if pm.session.is_attributed() {
            self.coord.ticket(&pm.path)
        } else {
            None
        };
        let w = Arc::new(
            WriteHandle::new(pm.session, pm.path, caller.pid, open.created, dirty)
                .on_inode(stamp(&open.stamp).ino)
                .with_ticket(ticket),
        );
        Ok(Some(self.handles.insert(w)))
    }

    fn sees_every_write(&self) -> bool {
        self.coord.is_shared()
    }

    /// Multi-host: an agent's write handle (one with a ticket) gets no page cache. The
    /// kernel writes a shared mapping's dirty pages back through whichever writable
    /// handle of the file it picks, so a giver's pages could land as another session's
    /// write, past every check of the giver's own handle; with `FOPEN_DIRECT_IO` (and no
    /// `FUSE_DIRECT_IO_ALLOW_MMAP`) the kernel refuses a shared `mmap` of the handle
    /// (`ENODEV`), so such pages never exist (docs/multi-host.md, shared mappings).
    fn flushes(&self, state: &HandleState) -> bool {
        !self.handles.is_unheld(state)
    }

    fn direct_io(&self, state: &HandleState) -> bool {
        self.handles
            .get(Some(state))
            .is_some_and(|w| w.ticket.lock().is_some())
    }

    fn before_handle_write(
        &self,
        state: Option<&HandleState>,
        path: Option<&Path>,
    ) -> Result<(), FsError> {
        let Some(w) = self.handles.get(state) else {
            return Ok(());
        };
        let mut ticket = w.ticket.lock();
        let Some(ticket) = ticket.as_mut() else {
            return Ok(());
        };
        self.handle_write(&w, rel(path), ticket).map_err(|r| {
            if !w.new_refusal(&r.message) {
                return FsError(r.write_errno());
            }
            // Logged under the route of the handle's open: the write carries it on.
            let (session, log) = (&w.session, Some(Route::OpenWrite));
            let d = Denied {
                caller: None,
                session,
                tell: true,
                log,
            };
            self.tell.refuse_write(d, &r, Timestamp::now())
        })
    }

    fn on_flush(&self, caller: &Caller, h: &HandleInfo<'_>) {
        self.retrack_handle(h);
        let Some(w) = self.handles.get(h.state) else {
            return;
        };
        self.restamp_handle(h);
        let unsettled = w.flush(h.content_changed(), || {
            // No path: the file was removed while open; its changes have no name to count.
            let Some((p, st)) = self.handle_path(h) else {
                return false;
            };
            let now = Timestamp::now();
            self.counted(&[(p, false)], caller.started, |e| {
                self.history
                    .with_history(p, &w.session, CommitOp::Write, now, || {
                        e.commit(&w.session, p, CommitOp::Write, Some(st), now)
                    });
                self.ws.print_commit(e, p, st);
            });
            // The file's other names (hard links) hold this session's bytes too: they are
            // not changed behind the volume's back, so a later open of them is not an
            // `external_change` (and no stale view of this session's own write).
            self.ws.restamp_other_names(st.ino, &[p]);
            // The handle's own commit moved the path's epoch: still known good (under
            // the same lease), so a later lease compares with the epoch it made.
            if let Some(t) = w.ticket.lock().as_mut() {
                let _ = self.coord.admits(t, p);
            }
            true
        });
        // A FLUSH of an unchanged handle may be its last close: note whether the closer
        // still runs (a deliberate close(2)) or is exiting (killed, or exit with the file
        // open), so RELEASE can tell `release` from `reclaim` even when a quick process is
        // gone by then. The /proc read can block in the kernel while an exiting closer
        // waits for this very FLUSH (seen in the fs_ops locks test), so it runs on its own
        // thread and is waited for only briefly: no answer in time counts as "not known
        // to run", which is what an exiting task would have said.
        if unsettled && w.session.is_attributed() && caller.pid != 0 {
            w.closed_by(closer_runs(caller.pid, FLUSH_PROC_WAIT));
        }
    }

    fn on_release(&self, caller: &Caller, h: &HandleInfo<'_>) {
        self.retrack_handle(h);
        self.changes.released(h);
        let Some(w) = self.handles.get(h.state) else {
            // A handle kept by its inode alone (see `on_open`) is forgotten.
            if h.state.is_some() {
                self.handles.remove(h.state);
            }
            return;
        };
        let now = Timestamp::now();
        self.restamp_handle(h);
        let end = w.release(h.content_changed(), || {
            let Some((p, st)) = self.handle_path(h) else {
                return false;
            };
            self.counted(&[(p, false)], caller.started, |e| {
                self.history
                    .with_history(p, &w.session, CommitOp::Write, now, || {
                        e.commit(&w.session, p, CommitOp::Write, Some(st), now)
                    });
                self.ws.print_commit(e, p, st);
            });
            // The file's other names (hard links) hold this session's bytes too: they are
            // not changed behind the volume's back, so a later open of them is not an
            // `external_change` (and no stale view of this session's own write).
            self.ws.restamp_other_names(st.ino, &[p]);
            true
        });
        // On a shared path, also the hold's end is one step: a step undone meanwhile on
        // this host cannot put back a write handle that is gone.
        let close = |changed: bool| {
            self.counted(&[(w.path.as_str(), false)], caller.started, |e| {
                e.close_write(&w.session, &w.path, changed, now);
            })
        };
        match end {
            End::Committed => close(true),
            End::MaybeGone if w.session.is_attributed() => {
                // Whether any process of the session is left may need a scan of /proc,
                // which can block on a stuck task anywhere on the host: not on a FUSE
                // thread.
                let (engine, sessions, session, path) = (
                    self.engine.clone(),
                    self.sessions.clone(),
                    w.session.clone(),
                    w.path.clone(),
                );
                std::thread::spawn(move || {
                    let now = Timestamp::now();
                    if session_running(sessions.resolver(), &session.name) {
                        engine.close_write(&session, &path, false, now);
                    } else {
                        let n = engine.session_gone(&session, now);
                        tracing::info!(
                            "session {} is gone: reclaimed {n} hold(s)",
                            session.display()
                        );
                    }
                });
            }
            End::MaybeGone | End::Released => close(false),
        }
        self.handles.remove(h.state);
    }

    fn getxattr(
        &self,
        caller: &Caller,
        _ino: u64,
        path: Option<&Path>,
        name: &OsStr,
    ) -> Option<FsResult<Vec<u8>>> {
        let name = name.to_str()?;
        if !name.starts_with(XATTR_PREFIX) {
            return None;
        }
        let nodata = Some(Err(FsError(libc::ENODATA)));
        let Some(p) = rel(path) else { return nodata };
        let is_dir = self.ws.stat(p).is_some_and(|x| x.1);
        if !self.ws.is_tracked(p, is_dir) {
            return nodata;
        }
        match name {
            XATTR_VERSION => {
                if self.ws.observe(p, Timestamp::now()).is_some_and(|x| x.1) {
                    return nodata;
                }
                match self.engine.version(p) {
                    Some(v) => Some(Ok(v.to_string().into_bytes())),
                    None => nodata,
                }
            }
            XATTR_HANDOFF => {
                let s = self.sessions.session(caller);
                // The kernel checked the path's search permission only with
                // default_permissions; the volume checks it in any case
                // (docs/design.md#control-surface).
                let who = Who::of_task(caller.pid, caller.uid, caller.gid);
                if !Sight::new(who).sees(self.backing.fd(), p) {
                    return nodata;
                }
                match self.engine.handoff(&s, p) {
                    Some(h) => Some(Ok(serde_json::to_vec(&h).expect("records serialise"))),
                    None => nodata,
                }
            }
            _ => nodata,
        }
    }

    // listxattr: the default (nothing added). The computed `user.coherent.*` attributes
    // are readable by name but not listed, so copies (`cp -a`, `shutil.copy2`, `tar
    // --xattrs`, `rsync -X`) neither try to set them nor carry a stale version out.

    fn prefers_name(&self, path: &Path) -> bool {
        rel(Some(path)).is_some_and(|p| self.ws.is_tracked(p, false))
    }
}
