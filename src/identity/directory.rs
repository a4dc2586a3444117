//! The directory of known sessions (docs/design.md#sessions). How a command names one is
//! `coherence::resolve_session`'s rule.
//!
//! A session is known once recorded here ([`SessionDirectory::record`]); the resolver
//! records every session whose process it resolves. The directory also interns sessions so
//! that the thousands of cached tasks of one session share one `Arc`.

use super::{Session, SessionInfo};
use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use uuid::Uuid;

#[derive(Default)]
struct Inner {
    /// Every distinct `SessionInfo` seen (name, id and how it was resolved).
    interned: HashSet<Session>,
    /// Agent id → the session as first seen.
    by_id: BTreeMap<u128, Session>,
    /// Name → agent ids with that name (two only if `COHERENT_SESSION=X` and
    /// `CLAUDE_CODE_SESSION_ID=X` both occur).
    by_name: HashMap<String, Vec<u128>>,
}

/// Known sessions. Cheap to share (`Arc`), read-mostly.
#[derive(Default)]
pub struct SessionDirectory {
    inner: RwLock<Inner>,
}

impl SessionDirectory {
    pub fn new() -> SessionDirectory {
        SessionDirectory::default()
    }

    /// Record a session as known and return the shared `Arc` for this exact
    /// (name, agent id, via). Returns the same `Arc` for equal infos.
    pub fn record(&self, info: SessionInfo) -> Session {
        if let Some(s) = self.inner.read().interned.get(&info) {
            return s.clone();
        }
        self.record_new(Arc::new(info)).0
    }

    /// Record an already built session (e.g. one the coherence engine restored from its
    /// journal, or one that registered). Returns true when its agent id was not known yet.
    pub fn insert(&self, s: &Session) -> bool {
        self.record_new(s.clone()).1
    }

    fn record_new(&self, s: Session) -> (Session, bool) {
        let mut inner = self.inner.write();
        let s = match inner.interned.get(&*s) {
            Some(known) => known.clone(),
            None => {
                inner.interned.insert(s.clone());
                s
            }
        };
        let id = s.agent_id.as_u128();
        let new = !inner.by_id.contains_key(&id);
        if new {
            inner.by_id.insert(id, s.clone());
            inner.by_name.entry(s.name.clone()).or_default().push(id);
        }
        (s, new)
    }

    /// Number of known sessions (distinct agent ids).
    pub fn len(&self) -> usize {
        self.inner.read().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every known session, ordered by agent id.
    pub fn sessions(&self) -> Vec<Session> {
        self.inner.read().by_id.values().cloned().collect()
    }

    pub fn by_id(&self, id: &Uuid) -> Option<Session> {
        self.inner.read().by_id.get(&id.as_u128()).cloned()
    }

    /// The session named `name`, if exactly one session has that name.
    pub fn by_name(&self, name: &str) -> Option<Session> {
        let inner = self.inner.read();
        match inner.by_name.get(name).map(Vec::as_slice) {
            Some([id]) => inner.by_id.get(id).cloned(),
            _ => None,
        }
    }
}
