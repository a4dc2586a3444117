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

    /// The path a handle's commit (or restamp) counts for, with the handle's stamp.
    fn handle_path<'p>(&self, h: &HandleInfo<'p>) -> Option<(&'p str, coherence::Stamp)> {
        Some((rel(h.path)?, stamp(&h.now)))
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

/// A write route across hosts (docs/design.md#hosts): see `coordinator` and
/// docs/multi-host.md.
impl WritePolicy {
    /// The names of `w` when it needs the coordinator (a shared path, or a directory
    /// with shared paths under it); `None` on one host or when nothing is shared.
    fn coordinated<'a>(&self, w: &Write<'a>) -> Option<Vec<(&'a str, bool)>> {
        self.coord.host()?;
        let names = w.names();
        self.involves_shared(&names).then_some(names)
    }

    /// Is a name shared, or a directory with shared paths under it? (One host: never,
    /// at no cost.)
    fn involves_shared(&self, names: &[(&str, bool)]) -> bool {
        self.coord.is_shared()
            && names.iter().any(|(p, dir)| {
                self.coord.shared(&self.engine, p)
                    || (*dir && !self.engine.paths_with_records(p).is_empty())
            })
    }

    /// Decides a write route touching shared paths as one agreed step (of the request
    /// that `started` then).
    fn admit(
        &self,
        who: &Result<Session, Session>,
        names: &[(&str, bool)],
        w: Write<'_>,
        started: Started,
        decide: impl Fn(&Engine) -> Result<Permit, (Session, Refusal)>,
    ) -> Result<Permit, (Session, Refusal)> {
        let mut out = None;
        let stepped = self
            .coord
            .step(&self.engine, names, StepKind::Admit, started, &mut |e| {
                let d = decide(e);
                let ok = d.is_ok();
                out = Some(d);
                ok
            });
        let s = match who {
            Ok(s) | Err(s) => s.clone(),
        };
        match stepped {
            Ok(_) => out.expect("the step ran the decision"),
            Err(r) => {
                let p = w.names().first().map_or("", |x| x.0).to_string();
                let r = r.at(p.clone());
                let text =
                    format!(
                    "write denied: {p_q} has a handoff record and the hosts cannot agree on it \
                     now: {}",
                    r.message, p_q = crate::names::display_name(&p));
                Err((s, Refusal { message: text, ..r }))
            }
        }
    }

    /// Runs `f` (engine calls counting what a write route or handle did to `names`, made
    /// through the engine it is given) as an agreed step when a name is shared, for the
    /// request that `started` then.
    fn counted(&self, names: &[(&str, bool)], started: Started, f: impl Fn(&Engine)) {
        if !self.involves_shared(names) {
            f(&self.engine);
            return;
        }
        // A conflict undoes `f` and runs it again on the newer state.
        let r = self
            .coord
            .step(&self.engine, names, StepKind::Commit, started, &mut |e| {
                f(e);
                true
            });
        if let Err(r) = r {
            tracing::warn!("a change of {:?} was not agreed: {}", names[0].0, r.message);
        }
    }

    /// May write handle `w` (admitted under `ticket`) write now? This host's lease and the
    /// path's epoch ([`Coordinator::admits`]), then the fence as this host knows it now.
    fn handle_write(&self, w: &WriteHandle, ticket: &mut Ticket) -> Result<(), Refusal> {
        self.coord
            .admits(ticket, &w.path)
            .map_err(|r| r.at(w.path.clone()))?;
        if !self.engine.is_fenced(&w.session, &w.path) {
            return Ok(());
        }
        // The deny text of the contract, from the record that fences this session.
        let text = self
            .engine
            .shared_state(&w.path)
            .and_then(|st| {
                let v = st.version;
                st.records
                    .into_iter()
                    .find(|r| r.is_live(v) && r.giver.name == w.session.name)
            })
            .map_or_else(
                || format!("write denied: {} was handed on by this session", w.path),
                |r| coherence::deny_text(&w.path, &r.successor, r.version_at_transfer),
            );
        Err(Refusal::new(Reason::Fenced, text).at(w.path.clone()))
    }

    /// Refuses an agent write while this host cannot confirm its lease (see
    /// [`Coordinator::confirmed`]): `None` when the write may go on.
    fn unconfirmed(
        &self,
        who: &Result<Session, Session>,
        w: &Write<'_>,
    ) -> Option<(Session, Refusal)> {
        let r = self.coord.confirmed().err()?;
        let s = match who {
            // Unattributed processes are never givers: they keep writing.
            Ok(s) if !s.is_attributed() => return None,
            Ok(s) | Err(s) => s.clone(),
        };
        // A giver fenced on the path hears `fenced` (the deny text and its ways out): the
        // engine refuses it on what this host knows, which a lost lease cannot make laxer.
        if w.names().iter().any(|(p, _)| self.engine.is_fenced(&s, p)) {
            return None;
        }
        let p = w.names().first().map_or("", |x| x.0).to_string();
        Some((s, r.at(p)))
    }

    /// What a write route did, counted after it ran (`failed`: it did not).
    fn count_write(
        &self,
        e: &Engine,
        route: &WriteRoute<'_>,
        pm: &Permit,
        failed: bool,
        now: Timestamp,
    ) {
        if pm.alias {
            return self.count_alias(pm, failed);
        }
        let (s, p) = (&pm.session, pm.path.as_str());
        match *route {
            WriteRoute::Open { .. } | WriteRoute::Create { .. } => {
                // The open failed after the acquire: give the hold back.
                if pm.acquired.is_some() {
                    e.close_write(s, p, false, now);
                }
            }
            _ if failed => {}
            WriteRoute::Setattr { set, .. } => {
                if pm.is_dir {
                    return;
                }
                let holds_e = matches!(e.hold(s, p), Some((coherence::Hold::E, _)));
                match self.ws.stamp_now(p) {
                    // A truncate by a session writing the file through a handle (coreutils
                    // `truncate` is open + ftruncate + close) is part of that handle's
                    // commit; any other change of size is a commit of its own.
                    Some(after) if set.size.is_some() && !holds_e => {
                        self.history
                            .with_history(p, s, CommitOp::Truncate, now, || {
                                e.commit(s, p, CommitOp::Truncate, Some(after), now)
                            });
                        self.ws.print_commit(e, p, after);
                        self.ws.restamp_other_names(after.ino, &[p]);
                    }
                    Some(after) => {
                        e.restamp(p, after);
                        self.ws.restamp_other_names(after.ino, &[p]);
                    }
                    None => {}
                }
            }
            WriteRoute::Rename { flags, .. } => {
                let Some(t) = pm.to.as_deref() else { return };
                if flags & RENAME_EXCHANGE != 0 {
                    self.exchange(e, s, p, t, now);
                } else if !pm.is_dir && !self.ws.is_tracked(t, false) {
                    // Moved out of what the volume tracks: the source is removed.
                    self.history
                        .with_history(p, s, CommitOp::RenameAway, now, || {
                            e.commit(s, p, CommitOp::RenameAway, None, now)
                        });
                } else {
                    let after = if pm.is_dir {
                        None
                    } else {
                        self.ws.stamp_now(t)
                    };
                    if pm.is_dir {
                        e.rename(s, p, t, true, None, now);
                        self.history.history_moved_dir(p, t, now);
                    } else {
                        // The source records a removal, the target the moved content.
                        self.history.history_moved(p, s, now);
                        self.history.with_history(t, s, CommitOp::Rename, now, || {
                            e.rename(s, p, t, false, after, now).unwrap_or(0)
                        });
                    }
                    if let Some(moved) = after {
                        self.ws.restamp_other_names(moved.ino, &[p, t]);
                    }
                }
            }
            WriteRoute::Unlink { .. } => {
                self.history.with_history(p, s, CommitOp::Unlink, now, || {
                    e.commit(s, p, CommitOp::Unlink, None, now)
                });
                if let Some(pre) = pm.pre {
                    self.ws.restamp_other_names(pre.ino, &[p]);
                }
            }
            WriteRoute::Link { .. } if !self.ws.is_tracked(p, false) => {
                // A new untracked name of a tracked file: not a change of its tracked
                // names (§3), which take the new stamp.
                if let Some(after) = self.ws.stamp_now(p) {
                    self.ws.restamp_other_names(after.ino, &[]);
                }
            }
            WriteRoute::Link { .. } | WriteRoute::Symlink { .. } | WriteRoute::Mknod { .. } => {
                let op = match route {
                    WriteRoute::Link { .. } => CommitOp::Link,
                    WriteRoute::Symlink { .. } => CommitOp::Symlink,
                    _ => CommitOp::Mknod,
                };
                let after = self.ws.stamp_now(p);
                self.history
                    .with_history(p, s, op, now, || e.commit(s, p, op, after, now));
                if let (WriteRoute::Link { .. }, Some(after)) = (route, after) {
                    self.ws.restamp_other_names(after.ino, &[p]);
                }
            }
            WriteRoute::Setxattr { .. } | WriteRoute::Removexattr { .. } => {
                if let Some(after) = self.ws.stamp_now(p) {
                    e.restamp(p, after);
                    self.ws.restamp_other_names(after.ino, &[p]);
                }
            }
            WriteRoute::Mkdir { .. } | WriteRoute::Rmdir { .. } => {}
        }
    }
}

impl WritePolicy {
    /// The decision of a write route (the history keeps what it may change once permitted).
    fn decide_write(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
    ) -> Result<Option<Permit>, FsError> {
        // An open for write names a file (a directory fails EISDIR anyway). Tracking
        // first: an untracked path costs no session lookup and no engine lock; what a
        // tracked one opens is looked at once, here.
        if let WriteRoute::Open { path, flags, .. } | WriteRoute::Create { path, flags, .. } =
            *route
        {
            return match rel(path).filter(|p| self.ws.is_tracked(p, false)) {
                Some(p) => {
                    let at = self.ws.at_by(p, Some(caller.uid), caller.started);
                    let w = match reach(flags) {
                        Reach::Append => Write::Append(at),
                        Reach::Overwrite => Write::Open(at),
                    };
                    self.decide(caller, w)
                }
                // An untracked name of a tracked file (a hard link): fenced by inode.
                None => self.alias_write(caller, route),
            };
        }
        if let Some(permit) = self.alias_write(caller, route)? {
            return Ok(Some(permit));
        }
        let w = match *route {
            WriteRoute::Open { .. } | WriteRoute::Create { .. } => unreachable!("decided above"),
            WriteRoute::Setattr { path, set, .. } => {
                let Some((a, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    return Ok(None);
                };
                // A change of size can drop bytes: the stale guard applies.
                match set.size {
                    Some(_) => Write::Truncate(a),
                    None => Write::Setattr(a),
                }
            }
            WriteRoute::Rename { from, to, flags } => {
                let (Some(f), Some(t)) = (rel(from), rel(to)) else {
                    return Ok(None);
                };
                let ((from, ft), (to, tt)) = (
                    self.ws.tracked(f, caller.started),
                    self.ws.tracked(t, caller.started),
                );
                // A move across the boundary is decided on both names (a fenced file may
                // not leave by a rename); the after-part counts only the tracked side.
                if !ft && !tt {
                    return Ok(None);
                }
                // The untracked name of a file is not looked at (no entry, no event).
                let from = if ft || from.found == Found::Dir {
                    from
                } else {
                    At::unseen(f)
                };
                let to = if tt || to.found == Found::Dir {
                    to
                } else {
                    At::unseen(t)
                };
                Write::Rename {
                    from,
                    to,
                    exchange: flags & RENAME_EXCHANGE != 0,
                }
            }
            WriteRoute::Unlink { path } => {
                let Some((a, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    return Ok(None);
                };
                Write::Unlink(a)
            }
            WriteRoute::Link { from, to } => {
                let from = rel(from)
                    .map(|p| self.ws.tracked(p, caller.started))
                    .filter(|x| x.1);
                let to = rel(to).map(|p| self.ws.tracked(p, caller.started));
                // The giver cannot give a fenced file another name, tracked or not.
                let to = match (to, from) {
                    (Some((a, true)), _) | (Some((a, false)), Some(_)) => a,
                    _ => return Ok(None),
                };
                Write::Link {
                    from: from.map(|x| x.0),
                    to,
                }
            }
            WriteRoute::Symlink { path, .. } => {
                let Some((a, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    return Ok(None);
                };
                Write::Symlink(a)
            }
            WriteRoute::Mknod { path, .. } => {
                let Some((a, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    return Ok(None);
                };
                Write::Mknod(a)
            }
            WriteRoute::Setxattr { path, name } | WriteRoute::Removexattr { path, name } => {
                let name = name.as_encoded_bytes();
                let Some((at, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    // Untracked (the root too): only the computed-name rule applies.
                    return match coherence::computed_xattr(name) {
                        Some(r) => Err(FsError(r.write_errno())),
                        None => Ok(None),
                    };
                };
                match route {
                    WriteRoute::Setxattr { .. } => Write::Setxattr { at, name },
                    _ => Write::Removexattr { at, name },
                }
            }
            // docs/design.md#write-routes does not fence directories being made or removed (a
            // directory rename is).
            WriteRoute::Mkdir { .. } | WriteRoute::Rmdir { .. } => return Ok(None),
        };
        self.decide(caller, w)
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

    fn before_handle_write(&self, state: Option<&HandleState>) -> Result<(), FsError> {
        let Some(w) = self.handles.get(state) else {
            return Ok(());
        };
        let mut ticket = w.ticket.lock();
        let Some(ticket) = ticket.as_mut() else {
            return Ok(());
        };
        self.handle_write(&w, ticket).map_err(|r| {
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
                let _ = self.coord.admits(t, &w.path);
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
