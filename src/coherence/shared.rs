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

impl SharedPath {
    /// Two accounts of a path that differ in the count of its commits alone (the same
    /// records, none live in either): no fence hangs on the difference.
    pub fn counts_apart(&self, other: &SharedPath) -> bool {
        counts_apart(
            (self.version, &self.records),
            (other.version, &other.records),
        )
    }

    /// This host's account of a path (`self`) counted more commits than another host's
    /// that came first, and differs in nothing else (on one backing directory, that host
    /// found this one's commits on its copy and counted them as one change behind the
    /// volume's back): this host's account stands, to be published over the other,
    /// which takes it in. Any other difference is the other host's step, which wins.
    pub fn counted_further(&self, theirs: &SharedPath) -> bool {
        self.version > theirs.version && self.counts_apart(theirs)
    }
}

fn counts_apart(a: (u64, &[Record]), b: (u64, &[Record])) -> bool {
    a.1 == b.1 && !a.1.iter().any(|r| r.is_live(a.0)) && !b.1.iter().any(|r| r.is_live(b.0))
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

/// A live record another host made, as [`Engine::adopt_beside`] took it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub id: u64,
    /// Its giver holds the file open for writing on this host (`handoff_in_flight`).
    pub writing: bool,
    /// This host's copy holds a version its giver did not see (`handoff_not_held`).
    pub newer: bool,
}

/// What [`Engine::adopt_beside`] did.
#[derive(Debug, Default)]
pub struct Adopted {
    pub records: Vec<Taken>,
    /// This copy's content was counted again as the version after the adopted one: the
    /// path's state here is to be published.
    pub recounted: bool,
    /// Nothing was taken in: this host counted further, and nothing else differs (see
    /// [`SharedPath::counted_further`]); its state is to be published over the other.
    pub kept: bool,
}

/// This host's copy of a path at a version counted here (see [`Engine::own_copy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnCopy {
    pub version: u64,
    pub stamp: Stamp,
    pub print: Option<Print>,
}

fn own_copy(e: &Entry, copies: bool) -> Option<OwnCopy> {
    // A first sight counts nothing (`last_by` is set by counts alone); a copy behind the
    // version it knows holds something else.
    let counted = copies && e.exists && e.version > 0 && e.last_by.is_some();
    let stamp = e.stamp.filter(|_| counted && e.held_here >= e.version)?;
    Some(OwnCopy {
        version: e.version,
        stamp,
        print: e.current_print(),
    })
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
        self.adopt_beside(path, shared, None, Timestamp::now())
            .records
            .into_iter()
            .map(|t| (t.id, t.writing))
            .collect()
    }

    /// [`Engine::adopt`], beside this host's copy: `copy` is the fingerprint of the file
    /// here as the mount read it, with the stamp it had then (for a version counted here
    /// whose fingerprint the engine did not take; see [`Engine::own_copy`]).
    ///
    /// A version this host counted (a commit through its mount, or a change found on its
    /// copy) that no other host has seen may meet another host's state at the same or a
    /// lower version: two hosts counted concurrently. The other state is taken in, and
    /// this copy's content, when it is not the adopted version's, is counted again as the
    /// version after it (by the session that made it here): the change is kept and
    /// published, never taken for the other host's version (whose copies would then count
    /// it as a change behind the volume's back, ending records, once a sync brought it). A
    /// new live record over such a copy is `newer`: its giver did not see this host's
    /// version, and the transfer is undone (`handoff_not_held`), as one host refuses a
    /// giver whose view is not the current version (docs/multi-host.md#copies).
    pub fn adopt_beside(
        &self,
        path: &str,
        shared: Option<SharedPath>,
        copy: Option<(Stamp, Print)>,
        now: Timestamp,
    ) -> Adopted {
        let mut sh = self.lock_one(path);
        let e = entry_mut(&mut sh, path);
        let Some(s) = shared else {
            e.records.clear();
            self.changes.bump();
            return Adopted::default();
        };
        // Checked here, under the path's lock: a commit counted here since the caller
        // looked is never undone by taking in an older count.
        if e.version > s.version && counts_apart((e.version, &e.records), (s.version, &s.records)) {
            return Adopted {
                kept: true,
                ..Adopted::default()
            };
        }
        let own = own_copy(e, self.copies());
        let own_print = own.as_ref().and_then(|o| {
            o.print
                .or_else(|| copy.filter(|(st, _)| *st == o.stamp).map(|(_, p)| p))
        });
        // Counted here at this version or past it; below it, a copy whose content the
        // other hosts know (theirs, or one of the older versions') lags, nothing more.
        let at_or_above = own.is_some_and(|o| o.version >= s.version);
        let known_there = |p: Print| {
            s.print == Some(p)
                || s.older.iter().any(|(_, q)| *q == p)
                || s.records.iter().any(|r| r.print == Some(p))
        };
        let differs = s.exists
            && s.print.is_some()
            && own_print.is_some_and(|p| {
                if at_or_above {
                    s.print != Some(p)
                } else {
                    !known_there(p)
                }
            });
        let by = e.last_by.clone();
        if s.version != e.version {
            for h in &mut e.holders {
                if h.writers == 0 {
                    h.hold = Hold::I;
                }
            }
            // Another host's count: who made it is not known here (and this host's own
            // count, if it had one, is no longer the current version).
            e.last_by = None;
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
        let new_live: Vec<(u64, bool)> = s
            .records
            .iter()
            .filter(|r| r.is_live(s.version) && !e.records.iter().any(|o| o.id == r.id))
            .map(|r| {
                let writing = e.holder(&r.giver.name).is_some_and(|h| h.writers > 0);
                (r.id, writing)
            })
            .collect();
        e.records = s.records;
        // Not known to be the adopted content, under a new transfer: fail closed (undone),
        // and the copy is judged again at its next look.
        let unsure = at_or_above
            && !new_live.is_empty()
            && !differs
            && (own_print.is_none() || s.print.is_none());
        let mut recounted = false;
        if let (true, Some(o), Some(p)) = (differs, own, own_print) {
            self.count_again(e, path, by.as_deref(), o.stamp, p, now);
            recounted = true;
        } else if unsure {
            e.stamp = None;
        }
        self.changes.bump();
        Adopted {
            records: new_live
                .into_iter()
                .map(|(id, writing)| Taken {
                    id,
                    writing,
                    newer: differs || unsure,
                })
                .collect(),
            recounted,
            kept: false,
        }
    }

    /// What this host's copy of `path` holds when it is a version counted here (committed
    /// through this mount or found on this copy, not only seen), with its fingerprint when
    /// the engine took one: what [`Engine::adopt_beside`] compares another host's state
    /// with. Several hosts only.
    pub fn own_copy(&self, path: &str) -> Option<OwnCopy> {
        own_copy(self.lock_one(path).get(path)?, self.copies())
    }

    /// Counts this copy's content (`stamp`, `print`) as the version after the current
    /// one, by `by` (the session whose commit made it here, or `external`).
    fn count_again(
        &self,
        e: &mut Entry,
        path: &str,
        by: Option<&str>,
        stamp: Stamp,
        print: Print,
        now: Timestamp,
    ) {
        let session = by
            .filter(|b| *b != EXTERNAL)
            .and_then(|b| self.sessions.read().get(b).cloned());
        let by = session.as_ref().map_or(EXTERNAL, |s| s.name.as_str());
        self.overtake_live(e, by, now);
        let mut ev = match &session {
            Some(s) => {
                let mut ev = Event::new(EventKind::Commit, now, Some(path), Some(s));
                ev.op = Some(CommitOp::Write);
                ev
            }
            None => {
                let mut ev = Event::new(EventKind::ExternalChange, now, Some(path), None);
                ev.session = Some(EXTERNAL.to_string());
                ev
            }
        };
        ev.version = Some(e.version + 1);
        ev.stamp = Some(stamp);
        ev.print = Some(print);
        self.emit(e, ev);
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
    /// writing there: `why` is `handoff_in_flight`), or over a version of its copy the
    /// giver did not see (`handoff_not_held`): the record ends `withdrawn` with `why` and
    /// is evicted at once, so sending it again later is a new transfer, as on one host.
    pub fn undo_transfer(&self, path: &str, id: u64, why: Reason, now: Timestamp) -> bool {
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
        ev.reason = Some(why);
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
