//! What several hosts share through a coordinator (docs/design.md#hosts, docs/multi-host.md): per
//! path its version, stamp and transfer records; per session its owner. Everything else (holds,
//! views, open write handles, `why`) stays on the host that saw it.
//!
//! The engine stays the one owner of the rules: a coordinated step runs the same engine
//! code as a single host, then publishes [`Engine::shared_state`] of the paths it touched;
//! another host takes it in with [`Engine::adopt`]. A step that could not be published is
//! undone with [`Engine::restore`] of what [`Engine::save`] kept.

use super::engine::*;
use super::time::Timestamp;
use super::types::*;
use crate::error::Reason;
use crate::identity::SessionInfo;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The shared part of one path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedPath {
    pub version: u64,
    pub exists: bool,
    /// The fingerprint of the content at `version`, when known. Hosts share it, never a
    /// stamp: an inode number or a ctime means nothing on another host's copy
    /// (docs/multi-host.md#copies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub print: Option<Print>,
    /// Older versions' fingerprints known to the publisher, newest first (its history's,
    /// from before the first transfer, and those its versions moved on from): a copy a
    /// sync brings to one of them lags, on every host (docs/multi-host.md#copies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub older: Vec<(u64, Print)>,
    pub records: Vec<Record>,
}

/// One session of the shared registry, with the uid that owns its name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedSession {
    pub info: SessionInfo,
    pub uid: Option<u32>,
    /// The host that claimed it first (it logged `session_seen`).
    #[serde(default)]
    pub host: Option<String>,
}

/// Entries as they were before a step (restored if the step cannot be published).
pub struct Saved(Vec<(String, Option<Entry>)>);

impl Saved {
    /// Paths that had no entry (restoring removes what a step made there).
    pub fn absent(paths: &[String]) -> Saved {
        Saved(paths.iter().map(|p| (p.clone(), None)).collect())
    }
}

impl Engine {
    /// The shared part of `path`: `None` while it has no record (a file never handed on
    /// is counted by each host on its own).
    pub fn shared_state(&self, path: &str) -> Option<SharedPath> {
        let sh = self.lock_one(path);
        let e = sh.get(path).filter(|e| !e.records.is_empty())?;
        Some(SharedPath {
            version: e.version,
            exists: e.exists,
            print: e.current_print(),
            older: e.older_kept(),
            records: e.records.clone(),
        })
    }

    /// Fingerprints of older versions of `path` this host's history kept: published with
    /// the path from its first transfer on, so a copy a sync brings to a version made
    /// before it lags instead of counting as a change (docs/multi-host.md#copies).
    pub fn know_older_prints(&self, path: &str, prints: Vec<(u64, Print)>) {
        if let Some(e) = self.lock_one(path).get_mut(path) {
            e.know_older(prints);
        }
    }

    /// The existing paths with a live record that this host has no stamp of yet (taken in
    /// from another host, not looked at here since): their inode on this host's copy is
    /// unknown until they are looked at.
    pub fn unstamped_live_paths(&self) -> Vec<String> {
        let mut out = Vec::new();
        for sh in self.shards.iter() {
            for (k, e) in sh.lock().iter() {
                if e.exists && e.stamp.is_none() && e.live().is_some() {
                    out.push(k.to_string());
                }
            }
        }
        out
    }

    /// Does `path` have any record (live or ended)? Such a path is shared.
    pub fn has_records(&self, path: &str) -> bool {
        self.lock_one(path)
            .get(path)
            .is_some_and(|e| !e.records.is_empty())
    }

    /// Every path with a record at or under `prefix` (`""`: all).
    pub fn paths_with_records(&self, prefix: &str) -> Vec<String> {
        let under = format!("{prefix}/");
        let mut out = Vec::new();
        for sh in self.shards.iter() {
            for (k, e) in sh.lock().iter() {
                if !e.records.is_empty()
                    && (prefix.is_empty() || &**k == prefix || k.starts_with(&under))
                {
                    out.push(k.to_string());
                }
            }
        }
        out
    }

    /// A copy of the entries of `paths`, for [`Engine::restore`].
    pub fn save(&self, paths: &[String]) -> Saved {
        Saved(
            paths
                .iter()
                .map(|p| (p.clone(), self.lock_one(p).get(p.as_str()).cloned()))
                .collect(),
        )
    }

    /// Puts back what [`Engine::save`] kept (a step that could not be published).
    pub fn restore(&self, saved: Saved) {
        for (p, e) in saved.0 {
            let mut sh = self.lock_one(&p);
            match e {
                Some(e) => {
                    sh.insert(p.into_boxed_str(), e);
                }
                None => {
                    sh.remove(p.as_str());
                }
            }
        }
        self.changes.bump();
    }

    /// Takes in the shared part of `path` as another host published it (`None`: it has
    /// no record any more). Holds stay; a version that moved leaves every local hold
    /// invalid. Returns the live records new here, each with whether its giver holds
    /// `path` open for writing on this host (the transfer's host must then undo it:
    /// `handoff_in_flight`).
    pub fn adopt(&self, path: &str, shared: Option<SharedPath>) -> Vec<(u64, bool)> {
        let mut sh = self.lock_one(path);
        let e = entry_mut(&mut sh, path);
        let Some(s) = shared else {
            e.records.clear();
            self.changes.bump();
            return Vec::new();
        };
        if s.version != e.version {
            for h in &mut e.holders {
                if h.writers == 0 {
                    h.hold = Hold::I;
                }
            }
            // This host's stamp is of its copy at the older version, and stays: a copy
            // still as it was lags (nothing to judge); one that moved is judged by content
            // (caught up, behind, or changed). Not logged: a restart knows no such stamp.
            e.logged_stamp = None;
            // The older version's fingerprint stays known: a copy the sync brings it to
            // lags (docs/multi-host.md#copies).
            if s.version > e.version {
                e.version_moved_on();
            }
            e.set_print(None);
        }
        e.version = s.version;
        e.exists = s.exists;
        if s.print.is_some() {
            e.set_print(s.print);
        }
        e.know_older(s.older);
        e.logged = true;
        let new_live = s
            .records
            .iter()
            .filter(|r| r.is_live(s.version) && !e.records.iter().any(|o| o.id == r.id))
            .map(|r| {
                let writing = e.holder(&r.giver.name).is_some_and(|h| h.writers > 0);
                (r.id, writing)
            })
            .collect();
        e.records = s.records;
        self.changes.bump();
        new_live
    }

    /// Takes in a session of the shared registry (no event: its host logged it).
    pub fn adopt_session(&self, s: SharedSession) {
        let name = s.info.name.clone();
        let mut sessions = self.sessions.write();
        if let Some(uid) = s.uid {
            self.owners.write().insert(name.clone(), uid);
        }
        sessions.entry(name).or_insert_with(|| Arc::new(s.info));
    }

    /// The known session `name` with its owner, to publish.
    pub fn shared_session(&self, name: &str) -> Option<SharedSession> {
        let info = self.sessions.read().get(name)?.as_ref().clone();
        Some(SharedSession {
            info,
            uid: self.owner(name),
            host: self.config.host.clone(),
        })
    }

    /// Undoes a transfer another host found in flight (its giver has the file open for
    /// writing there): the record ends `withdrawn` (reason `handoff_in_flight`) and is
    /// evicted at once, so sending it again later is a new transfer, as on one host.
    pub fn undo_transfer(&self, path: &str, id: u64, now: Timestamp) -> bool {
        let mut sh = self.lock_one(path);
        let Some(e) = sh.get_mut(path) else {
            return false;
        };
        let Some(r) = e
            .records
            .iter()
            .find(|r| r.id == id && r.status == Status::Pending)
        else {
            return false;
        };
        let giver = r.giver.clone();
        let successor = r.successor.name.clone();
        let mut ev = Event::new(EventKind::Withdraw, now, Some(path), Some(&*giver));
        ev.record = Some(id);
        ev.giver = Some(giver.name.clone());
        ev.successor = Some(successor);
        ev.version = Some(e.version);
        ev.reason = Some(Reason::HandoffInFlight);
        self.emit(e, ev);
        let mut ev = Event::new(EventKind::Evict, now, Some(path), None);
        ev.record = Some(id);
        ev.giver = Some(giver.name.clone());
        self.emit(e, ev);
        true
    }

    /// Logs a write refused outside the engine's decision (the coordinator could not
    /// agree it, or this host lost its lease): `denied` with `reason`.
    pub fn denied(
        &self,
        s: &SessionInfo,
        path: &str,
        reason: Reason,
        route: Route,
        now: Timestamp,
    ) {
        let mut sh = self.lock_one(path);
        let e = entry_mut(&mut sh, path);
        let mut ev = Event::denied(reason, route, now, path, s);
        ev.version = (e.version > 0).then_some(e.version);
        self.emit(e, ev);
    }

    /// Coordinated mode: record ids from here on are at least `floor` (the coordinator
    /// raises it past every revision it has seen, so two hosts never give one path two
    /// records with one id).
    pub fn raise_record_ids(&self, floor: u64) {
        self.record_ids.fetch_max(floor, Ordering::SeqCst);
    }

    /// The id of a record about to be made: `None` on a single host (its transfer's seq).
    pub(super) fn next_record_id(&self) -> Option<u64> {
        let mut cur = self.record_ids.load(Ordering::SeqCst);
        loop {
            if cur == 0 {
                return None;
            }
            match self
                .record_ids
                .compare_exchange(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Some(cur),
                Err(now) => cur = now,
            }
        }
    }
}
