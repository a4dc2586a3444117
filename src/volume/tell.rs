//! Refuse and tell: the one recipe for what a refused caller hears. A refused write
//! route or handle write is told at `.coherent/why` (with its time), its `denied`
//! event is in the state log before the call returns, and it fails with the refusal's
//! errno; a refused verb is told at `why` too (its reply carries the rest). A stale
//! write let through (`--stale warn`, or an append under the default `guard`) is told the
//! same way.

use std::sync::Arc;

use crate::coherence::{Engine, Route, Timestamp};
use crate::error::{Reason, Refusal};
use crate::identity::Session;
use crate::journal::Journal;
use crate::store::{Caller, FsError};

/// What a writer or a verb's caller is told at `.coherent/why`.
pub(super) enum Told<'a> {
    Refused(&'a Refusal),
    /// A stale write let through (`warn`, or an append under `guard`): the path, its
    /// version, the writer's view.
    Stale(&'a str, u64, u64),
}

/// Whom a refused write is refused to.
pub(super) struct Denied<'a> {
    /// The calling task (None: a write through a handle, whose caller is not known).
    pub caller: Option<&'a Caller>,
    /// The writer's session, or the caller's `uid:UID` when it could not be resolved.
    pub session: &'a Session,
    /// The session hears the refusal at `why` (false: a caller whose session could not be
    /// resolved has none to tell; the daemon's log says it).
    pub tell: bool,
    /// The `denied` event is the recipe's to log, under this route (None: the engine
    /// logged it with the decision).
    pub log: Option<Route>,
}

/// The one owner of what a refused caller hears: the `why` text, the `denied` event and
/// the errno.
pub(super) struct Tell {
    engine: Arc<Engine>,
    journal: Arc<Journal>,
}

impl Tell {
    pub(super) fn new(engine: Arc<Engine>, journal: Arc<Journal>) -> Self {
        Tell { engine, journal }
    }

    /// What `.coherent/why` shows `s` from now on, with the time it happened: the one place
    /// the volume says it (a refusal the engine made is kept there already, without a
    /// time, and said again here when it reaches the caller).
    pub(super) fn tell(&self, s: &Session, what: Told<'_>, now: Timestamp) {
        let (path, text) = match what {
            Told::Refused(r) => (r.path.as_deref(), r.message.clone()),
            Told::Stale(p, v, seen) => (
                Some(p),
                format!(
                    "stale write: {p_q} is at v{v} but this session last saw v{seen} (another \
                     session changed it since); the write goes on (an append adds after that \
                     change, any other write replaces it). Read {p_q} again to see it.",
                    p_q = crate::names::display_name(p)
                ),
            ),
        };
        self.engine.tell(s, path, &text, now);
    }

    /// Refuse a write: log its `denied` event if the engine did not, tell the writer, put
    /// the event in the log (no fsync) before the call returns, and give the errno.
    pub(super) fn refuse_write(&self, d: Denied<'_>, r: &Refusal, now: Timestamp) -> FsError {
        if let (Some(route), Some(p)) = (d.log, r.path.as_deref()) {
            self.engine.denied(d.session, p, r.reason, route, now);
        }
        if d.tell && r.reason != Reason::Unresolved {
            self.tell(d.session, Told::Refused(r), now);
        } else {
            let (pid, uid) = d.caller.map_or((0, 0), |c| (c.pid, c.uid));
            tracing::warn!(pid, uid, "{}", r.message);
        }
        // Past the journal's bound nothing more is written: the refusal stands anyway.
        if !self.journal.is_shedding() {
            if let Err(e) = self.journal.write_out() {
                tracing::warn!("writing a denied event to the state log: {e}");
            }
        }
        FsError(r.write_errno())
    }
}
