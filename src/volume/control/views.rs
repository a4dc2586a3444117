//! What the `.coherent/` files show each reader (`status`, `whoami`, `why`, `inbox`,
//! `events`, `waits`, `changes`): answers that read the volume's state as the reader may
//! see it and change nothing. The actions (`ctl` requests) are the verbs server's.
//!
//! What a reader sees of a path depends on the reader (docs/design.md#control-surface):
//! a path, its record and its note are shown only to callers who could look the path up
//! themselves ([`crate::visibility`]); to anyone else the answer is the one for a path
//! that does not exist.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::super::changes::Changes;
use super::super::sessions::Sessions;
use super::super::standing::{self, Standing};
use super::super::Owners;
use crate::access::Who;
use crate::coherence::{Engine, RecordJson, StatusReport, Timestamp, Until};
use crate::control::{session_json, NO_REFUSAL};
use crate::coordinator::Coordinator;
use crate::journal::Journal;
use crate::store::{Backing, Caller, FsError};
use crate::visibility::{LogView, Sight};
use crate::volume::sessions::who;

/// The per-reader views of one volume.
pub(in crate::volume) struct Views {
    engine: Arc<Engine>,
    journal: Arc<Journal>,
    coord: Arc<dyn Coordinator>,
    backing: Backing,
    sessions: Arc<Sessions>,
    changes: Arc<Changes>,
    /// The sessions' standing waits, which `waits` lists (the verbs keep them).
    standing: Arc<Standing>,
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

/// `.coherent/whoami` and the `whoami` reply's fields: the session, and the environment
/// tags that were ignored because their value is not a valid session name.
pub(in crate::volume) fn whoami_json(sessions: &Sessions, caller: &Caller) -> Value {
    let mut j = session_json(&sessions.session(caller));
    let ignored = sessions.resolver().ignored_tags(caller.pid);
    if !ignored.is_empty() {
        j["ignored"] = serde_json::to_value(&ignored).unwrap_or(Value::Null);
    }
    j
}

impl Views {
    pub(in crate::volume) fn new(o: &Owners, standing: Arc<Standing>) -> Self {
        Views {
            engine: o.engine.clone(),
            journal: o.journal.clone(),
            coord: o.coord.clone(),
            backing: o.backing.clone(),
            sessions: o.sessions.clone(),
            changes: o.changes.clone(),
            standing,
        }
    }

    /// `.coherent/status` for `caller`: after catching up with the other hosts.
    pub(super) fn status_file(&self, caller: &Caller) -> Vec<u8> {
        self.coord.catch_up(caller.started);
        let mut sight = Sight::new(who(caller));
        json_line(&seen_status(&self.engine, &self.backing, &mut sight, None))
    }

    /// `.coherent/whoami` for `caller`.
    pub(super) fn whoami_file(&self, caller: &Caller) -> Vec<u8> {
        json_line(&whoami_json(&self.sessions, caller))
    }

    /// `.coherent/why` for `caller`: a path the reader can no longer look up is not
    /// shown, even its own.
    pub(super) fn why_file(&self, caller: &Caller) -> Vec<u8> {
        let mut sight = Sight::new(who(caller));
        let why = self.engine.why_about(&self.sessions.session(caller));
        why_text(why.and_then(|(p, t, at)| match p {
            Some(p) if !sight.sees(self.backing.fd(), &p) => None,
            _ => Some((t, at)),
        }))
    }

    /// `.coherent/inbox` for `caller`.
    pub(super) fn inbox_file(&self, caller: &Caller) -> Vec<u8> {
        self.coord.catch_up(caller.started);
        let mut sight = Sight::new(who(caller));
        let inbox = self.engine.inbox(&self.sessions.session(caller));
        json_line(&seen_records(&self.backing, &mut sight, inbox))
    }

    /// The state log's length (the size of `events`).
    pub(super) fn log_len(&self) -> u64 {
        self.journal.log_len()
    }

    /// The state log from `from` (or from its base, if compacted past it): where it
    /// starts and up to `n` bytes.
    pub(super) fn read_log(&self, from: u64, n: usize) -> Result<(u64, Vec<u8>), FsError> {
        self.journal.read_log_from(from, n).map_err(FsError::from)
    }

    /// The state log as `view`'s reader may see it.
    pub(super) fn read_seen_log(
        &self,
        view: &mut LogView,
        offset: u64,
        size: usize,
    ) -> Result<Vec<u8>, FsError> {
        view.read(self.backing.fd(), offset, size, |o, n| {
            self.journal.read_log_from(o, n)
        })
        .map_err(FsError::from)
    }

    /// `.coherent/waits` for `caller`: its session's waits in flight (`flying`, those the
    /// reader can still look up) and its standing ones.
    pub(super) fn waits_file(
        &self,
        caller: &Caller,
        me: &str,
        mut flying: Vec<(String, Until, Duration)>,
    ) -> Vec<u8> {
        self.standing.resolve(&self.engine);
        let mut sight = Sight::new(who(caller));
        let root = self.backing.fd();
        flying.retain(|(p, ..)| sight.sees(root, p));
        let kept = self.standing.of_session(me, |p| sight.sees(root, p));
        json_line(&standing::listing(flying, &kept))
    }

    /// `.coherent/changes` after `offset`, the paths `who` may see.
    pub(super) fn changes_file(&self, who: &Who, offset: u64) -> Vec<u8> {
        let mut sight = Sight::new(who.clone());
        let root = self.backing.fd();
        self.changes.answer(offset, |p| {
            if sight.sees_all() {
                return Some(true);
            }
            p.to_str().map(|p| sight.sees(root, p))
        })
    }
}

/// Only the records whose paths the reader may see.
fn seen_records(backing: &Backing, sight: &mut Sight, recs: Vec<RecordJson>) -> Vec<RecordJson> {
    if sight.sees_all() {
        return recs;
    }
    recs.into_iter()
        .filter(|r| sight.sees(backing.fd(), &r.path))
        .collect()
}

/// `status [PATH]` as the reader may see it: records of paths it may not look up are left
/// out (and out of the counts); `status PATH` of such a path is the answer for a path
/// never seen. (The `status` verb's answer too.)
pub(in crate::volume) fn seen_status(
    engine: &Engine,
    backing: &Backing,
    sight: &mut Sight,
    path: Option<&str>,
) -> StatusReport {
    let mut st = engine.status(path);
    if sight.sees_all() {
        return st;
    }
    if let Some(p) = path {
        if !sight.sees(backing.fd(), p) {
            st.version = None;
            st.live.clear();
            st.ended.clear();
        }
    }
    st.live = seen_records(backing, sight, std::mem::take(&mut st.live));
    st.ended = seen_records(backing, sight, std::mem::take(&mut st.ended));
    st.counts.live = st.live.len();
    st.counts.ended = st.ended.len();
    st
}
