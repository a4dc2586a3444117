//! Read-only views for the control surface: versions, the handoff xattr, inbox, why,
//! status, and the durable state for snapshots and tests.

use super::engine::*;
use super::time::Timestamp;
use super::types::*;
use crate::identity::SessionInfo;
use std::sync::atomic::Ordering;

impl Engine {
    // ----- queries ------------------------------------------------------------------

    /// The version of `path` (`user.coherent.version`); None if untracked, uncommitted or
    /// removed.
    pub fn version(&self, path: &str) -> Option<u64> {
        let sh = self.lock_one(path);
        sh.get(path)
            .filter(|e| e.exists && e.version > 0)
            .map(|e| e.version)
    }

    /// Version, existence and stamp of any tracked path, tombstones included.
    pub fn path_state(&self, path: &str) -> Option<PathState> {
        let sh = self.lock_one(path);
        sh.get(path).filter(|e| e.version > 0).map(|e| PathState {
            version: e.version,
            exists: e.exists,
            stamp: e.stamp,
        })
    }

    /// The stamp the engine last counted for `path` (for the mount's external-change check).
    pub fn stamp(&self, path: &str) -> Option<Stamp> {
        self.lock_one(path).get(path).and_then(|e| e.stamp)
    }

    /// The tracked, existing paths whose last stamp is of inode `ino` (the other names of a
    /// hard-linked file). Scans every shard: for files known to have several names.
    pub fn paths_of_inode(&self, ino: u64) -> Vec<String> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let sh = shard.lock();
            out.extend(
                sh.iter()
                    .filter(|(_, e)| e.exists && e.stamp.is_some_and(|st| st.ino == ino))
                    .map(|(k, _)| k.to_string()),
            );
        }
        out
    }

    /// `user.coherent.handoff`: the live record of `path` with the reader's role.
    pub fn handoff(&self, s: &SessionInfo, path: &str) -> Option<HandoffView> {
        let sh = self.lock_one(path);
        let e = sh.get(path)?;
        let r = e.live()?;
        let role = if r.giver.name == s.name {
            Role::Giver
        } else if r.successor.name == s.name {
            Role::Successor
        } else {
            Role::Bystander
        };
        Some(HandoffView {
            record: r.to_json(e.version),
            role,
        })
    }

    /// How many per-path entries the engine holds (tombstones and paths only seen too).
    pub fn path_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Does the engine hold any record (live or ended)? Free.
    pub fn any_records(&self) -> bool {
        self.record_count.load(Ordering::SeqCst) > 0
    }

    /// Does `path` have a live record? (The volume keeps such a path in view even when
    /// an ignore file later says it is untracked: a fence cannot be dropped that way.)
    pub fn has_live_record(&self, path: &str) -> bool {
        self.lock_one(path)
            .get(path)
            .is_some_and(|e| e.live().is_some())
    }

    /// The hold of `s` on `path` and its view (tests, status).
    pub fn hold(&self, s: &SessionInfo, path: &str) -> Option<(Hold, Option<u64>)> {
        let sh = self.lock_one(path);
        let h = sh.get(path)?.holder(&s.name)?;
        Some((if h.writers > 0 { Hold::E } else { h.hold }, h.view))
    }

    fn all_records(&self) -> Vec<RecordJson> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let sh = shard.lock();
            for e in sh.values() {
                out.extend(e.records.iter().map(|r| r.to_json(e.version)));
            }
        }
        out
    }

    /// `.coherent/inbox`: live records naming `s` as successor and open offers to anyone
    /// (unclaimed, live, not its own), notes included, oldest first.
    pub fn inbox(&self, s: &SessionInfo) -> Vec<RecordJson> {
        let mut out = Vec::new();
        let offered = |r: &Record| r.unclaimed() && r.giver.name != s.name && s.is_attributed();
        for shard in self.shards.iter() {
            let sh = shard.lock();
            for e in sh.values() {
                if let Some(r) = e
                    .live()
                    .filter(|r| r.successor.name == s.name || offered(r))
                {
                    out.push((r.id, r.to_json(e.version)));
                }
            }
        }
        out.sort_by_key(|(id, _)| *id);
        out.into_iter().map(|(_, r)| r).collect()
    }

    /// `.coherent/why`: the text of the last denial or refusal of `s`.
    pub fn why(&self, s: &SessionInfo) -> Option<String> {
        self.why.lock().get(&s.name).map(|(_, t, _)| t.clone())
    }

    /// [`Engine::why`] with the path the text is about (None: not about one path) and
    /// when the volume told it.
    pub fn why_about(
        &self,
        s: &SessionInfo,
    ) -> Option<(Option<String>, String, Option<Timestamp>)> {
        self.why.lock().get(&s.name).cloned()
    }

    /// `status [PATH]`: known sessions, live and ended records (of PATH only if given),
    /// counts.
    pub fn status(&self, path: Option<&str>) -> StatusReport {
        let mut recs: Vec<RecordJson> = match path {
            Some(p) => {
                let sh = self.lock_one(p);
                sh.get(p)
                    .map(|e| e.records.iter().map(|r| r.to_json(e.version)).collect())
                    .unwrap_or_default()
            }
            None => self.all_records(),
        };
        recs.sort_by(|a, b| (a.created, &a.path).cmp(&(b.created, &b.path)));
        let (live, ended): (Vec<_>, Vec<_>) = recs.into_iter().partition(|r| r.live);
        let mut sessions: Vec<SessionJson> = self
            .sessions
            .read()
            .values()
            .map(|s| SessionJson {
                uid: self.owner(&s.name),
                ..session_json(s)
            })
            .collect();
        sessions.sort_by(|a, b| a.name.cmp(&b.name));
        let paths = self
            .shards
            .iter()
            .map(|s| {
                s.lock()
                    .values()
                    .filter(|e| e.exists && e.version > 0)
                    .count()
            })
            .sum();
        StatusReport {
            path: path.map(str::to_string),
            version: path.and_then(|p| self.version(p)),
            counts: Counts {
                sessions: sessions.len(),
                paths,
                live: live.len(),
                ended: ended.len(),
            },
            sessions,
            live,
            ended,
        }
    }

    /// The durable state (what the log rebuilds). Takes every lock: for snapshots and
    /// tests, not the hot path.
    pub fn durable_state(&self) -> DurableState {
        self.durable_state_with(|| ()).0
    }

    /// The durable state, with `at_barrier` run while every lock is held (no event can be
    /// appended meanwhile): the journal records there the log position the state matches.
    pub fn durable_state_with<R>(&self, at_barrier: impl FnOnce() -> R) -> (DurableState, R) {
        let all = self.lock_all();
        let sessions = self.sessions.read();
        let r = at_barrier();
        let mut st = DurableState {
            seq: self.applied.load(Ordering::SeqCst),
            peer_rev: self.peer_rev.load(Ordering::SeqCst),
            ..Default::default()
        };
        for sh in &all {
            for (k, e) in sh.iter() {
                if e.logged && e.version > 0 {
                    st.paths.insert(
                        k.to_string(),
                        PathState {
                            version: e.version,
                            exists: e.exists,
                            stamp: e.logged_stamp,
                        },
                    );
                }
                st.records.extend(e.records.iter().cloned());
            }
        }
        st.records
            .sort_by(|a, b| (&a.path, a.id).cmp(&(&b.path, b.id)));
        st.sessions = sessions
            .iter()
            .map(|(k, v)| (k.clone(), (**v).clone()))
            .collect();
        st.owners = self
            .owners
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        (st, r)
    }

    /// The seq of the last event applied.
    pub fn last_seq(&self) -> u64 {
        self.applied.load(Ordering::SeqCst)
    }
}
