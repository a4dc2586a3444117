//! `impl Engine` for sessions: made known at first sight, claimed by a uid, resolved
//! from a name or id prefix.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::coherence::lookup::resolve_session;
use crate::coherence::time::Timestamp;
use crate::coherence::types::*;
use crate::error::Refusal;
use crate::identity::{Session, SessionInfo, Via};

use super::Engine;

impl Engine {
    /// Makes `s` known (`session_seen` on first sight). Returns the event's seq if one was
    /// logged. The mount calls this when it first resolves a session; every other method
    /// calls it too.
    pub fn session_seen(&self, s: &Session, now: Timestamp) -> Option<u64> {
        if self.sessions.read().contains_key(&s.name) {
            return None;
        }
        let mut w = self.sessions.write();
        if w.contains_key(&s.name) {
            return None;
        }
        let mut ev = Event::new(EventKind::SessionSeen, now, None, Some(s));
        ev.via = Some(s.via.clone());
        self.sink.append(&mut ev);
        self.applied.fetch_max(ev.seq, Ordering::SeqCst);
        w.insert(s.name.clone(), s.clone());
        Some(ev.seq)
    }

    /// Claims session `s` for `uid` (docs/design.md#sessions: a session name belongs to the first
    /// uid that shows it): makes it known and owned by `uid` on first sight (`session_seen` with
    /// `uid`). `Err(owner)` when another uid owns it. Unattributed sessions (`uid:UID`)
    /// are only made known. A read lock on the warm path.
    pub fn claim(&self, s: &Session, uid: u32, now: Timestamp) -> Result<(), u32> {
        if !s.is_attributed() {
            self.session_seen(s, now);
            return Ok(());
        }
        let mine = |o: u32| if o == uid { Ok(()) } else { Err(o) };
        if let Some(&o) = self.owners.read().get(&s.name) {
            return mine(o);
        }
        let mut sessions = self.sessions.write();
        let mut owners = self.owners.write();
        if let Some(&o) = owners.get(&s.name) {
            return mine(o);
        }
        // Also for a session known without an owner (registered ahead, or an older log).
        let mut ev = Event::new(EventKind::SessionSeen, now, None, Some(s));
        ev.via = Some(s.via.clone());
        ev.uid = Some(uid);
        self.sink.append(&mut ev);
        self.applied.fetch_max(ev.seq, Ordering::SeqCst);
        owners.insert(s.name.clone(), uid);
        sessions.entry(s.name.clone()).or_insert_with(|| s.clone());
        Ok(())
    }

    /// The uid owning session `name`, if known.
    pub fn owner(&self, name: &str) -> Option<u32> {
        self.owners.read().get(name).copied()
    }

    /// The known session of that name (records use it, so the first-seen `via` wins).
    pub(in crate::coherence) fn known(&self, name: &str, agent: Option<uuid::Uuid>) -> Session {
        if let Some(s) = self.sessions.read().get(name) {
            return s.clone();
        }
        Arc::new(SessionInfo {
            name: name.to_string(),
            agent_id: agent.unwrap_or_else(|| crate::identity::agent_id_for_name(name)),
            via: Via::Registered,
        })
    }

    /// Resolves a session argument (name, full id, or 8+ hex prefix) among known sessions.
    pub fn lookup_session(&self, arg: &str) -> Result<Session, Refusal> {
        resolve_session(&self.sessions.read(), arg)
    }
}
