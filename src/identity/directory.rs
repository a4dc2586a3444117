//! The directory of known sessions, and how a command names one (docs/design.md#sessions): by
//! session name, by full agent id (with or without dashes, any case), or by an unambiguous agent id
//! prefix of at least 8 hex digits.
//!
//! A session is known once recorded here ([`SessionDirectory::record`]); the resolver
//! records every session whose process it resolves. The directory also interns sessions so
//! that the thousands of cached tasks of one session share one `Arc`.

use super::{Session, SessionInfo};
use crate::error::{Reason, Refusal};
use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use uuid::Uuid;

/// The shortest agent id prefix a lookup accepts.
pub const MIN_ID_PREFIX: usize = 8;

#[derive(Default)]
struct Inner {
    /// Every distinct `SessionInfo` seen (name, id and how it was resolved).
    interned: HashSet<Session>,
    /// Agent id → the session as first seen. Ordered so a hex prefix is a range.
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

    /// Resolve how a command names a session (a successor, say). In order: an exact session
    /// name; a full agent id (32 hex digits, dashes anywhere, any case); a hex prefix of at
    /// least [`MIN_ID_PREFIX`] digits matching exactly one id.
    ///
    /// Refusals: `handoff_successor_malformed` for an empty query, a prefix shorter than 8
    /// digits, an ambiguous prefix or a name shared by two ids; `handoff_successor_unknown`
    /// for anything well formed that matches no known session, and for an unattributed
    /// session (`uid:UID`), which can never receive a handoff.
    pub fn lookup(&self, query: &str) -> Result<Session, Refusal> {
        let q = query.trim();
        if q.is_empty() {
            return Err(malformed("an empty session name"));
        }
        let inner = self.inner.read();
        let found = match inner.by_name.get(q).map(Vec::as_slice) {
            Some([id]) => inner.by_id.get(id).cloned(),
            Some(ids) if ids.len() > 1 => {
                return Err(malformed(&format!(
                    "{q:?} names {} sessions; give its agent id instead",
                    ids.len()
                )))
            }
            _ => None,
        };
        let found = match found {
            Some(s) => s,
            None => by_hex(&inner, q)?,
        };
        if !found.is_attributed() {
            return Err(Refusal::new(
                Reason::HandoffSuccessorUnknown,
                format!(
                    "{} is an unattributed process owner, not an agent session; it cannot receive a handoff",
                    found.display()
                ),
            ));
        }
        Ok(found)
    }
}

fn malformed(what: &str) -> Refusal {
    Refusal::new(
        Reason::HandoffSuccessorMalformed,
        format!(
            "{what}: name a session by its name, its agent id or at least {MIN_ID_PREFIX} hex digits of it"
        ),
    )
}

fn unknown(q: &str) -> Refusal {
    Refusal::new(
        Reason::HandoffSuccessorUnknown,
        format!("no known session is {q:?}; a session is known once one of its processes has used the volume or it has registered"),
    )
}

/// Match `q` as a full agent id or a hex prefix of one.
fn by_hex(inner: &Inner, q: &str) -> Result<Session, Refusal> {
    let hex: String = q.chars().filter(|&c| c != '-').collect();
    if !hex.chars().all(|c| c.is_ascii_hexdigit()) || hex.len() > 32 {
        // Not an id: an ordinary name nobody has.
        return Err(unknown(q));
    }
    if hex.len() < MIN_ID_PREFIX {
        return Err(malformed(&format!(
            "{q:?} is too short for an agent id prefix"
        )));
    }
    let digits = hex.len() as u32;
    let value = u128::from_str_radix(&hex, 16).expect("checked hex, at most 32 digits");
    let shift = 4 * (32 - digits);
    let low = value.checked_shl(shift).unwrap_or(0);
    let high = low | (u128::MAX.checked_shr(4 * digits).unwrap_or(0));
    let mut hits = inner.by_id.range(low..=high).map(|(_, s)| s);
    match (hits.next(), hits.next()) {
        (None, _) => Err(unknown(q)),
        (Some(s), None) => Ok(s.clone()),
        (Some(a), Some(b)) => Err(malformed(&format!(
            "{q:?} is ambiguous (it matches {} and {}, at least)",
            a.display(),
            b.display()
        ))),
    }
}
