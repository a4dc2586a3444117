//! Who is calling: a FUSE request's process to its session (docs/design.md#sessions), the
//! name's owner asked of the coordinator, and, now and then, the sessions whose processes
//! are all gone. The one owner of the resolver.

use std::collections::HashSet;
use std::sync::Arc;

use super::liveness::TaskState;

use crate::access::Who;
use crate::coherence::{Engine, Timestamp};
use crate::coordinator::Coordinator;
use crate::identity::{Resolver, Session, SessionInfo, Via};
use crate::store::Caller;

pub(super) struct Sessions {
    resolver: Arc<Resolver>,
    /// Where a session is made known (`session_seen`).
    engine: Arc<Engine>,
    /// Who owns a name, agreed across hosts.
    coord: Arc<dyn Coordinator>,
}

impl Sessions {
    pub(super) fn new(
        resolver: Arc<Resolver>,
        engine: Arc<Engine>,
        coord: Arc<dyn Coordinator>,
    ) -> Self {
        Sessions {
            resolver,
            engine,
            coord,
        }
    }

    /// The resolver (its cache's numbers for `status`, its cache to empty at unmount).
    pub(super) fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// The caller's session, made known to the engine (`session_seen` the first time): a
    /// session is known once any of its processes touched the volume where it resolves.
    /// A session name belongs to the first uid that shows it (docs/design.md#sessions): a process
    /// of another uid carrying it is its own `uid:UID`, marked [`Via::NotYours`].
    pub(super) fn session(&self, c: &Caller) -> Session {
        self.owned(self.resolver.resolve_request(c.pid, c.uid), c)
    }

    /// `s` as resolved for caller `c`, if `c`'s uid owns the name (docs/design.md#sessions: the
    /// first uid that shows a name owns it); else `c`'s own `uid:UID`, marked with whose name it
    /// showed.
    pub(super) fn owned(&self, s: Session, c: &Caller) -> Session {
        self.claimed(s, c).unwrap_or_else(|anyone| anyone)
    }

    /// [`Sessions::owned`], but `Err` (the caller's `uid:UID`) when the coordinator could
    /// not be asked who owns the name: a writer is then decided as unresolved
    /// (docs/design.md#sessions).
    pub(super) fn claimed(&self, s: Session, c: &Caller) -> Result<Session, Session> {
        let now = Timestamp::now();
        let claim = match self.coord.claim(&self.engine, &s, c.uid, now, c.started) {
            Ok(r) => r,
            Err(r) => {
                tracing::debug!("session {} not claimed: {}", s.name, r.message);
                return Err(Arc::new(SessionInfo::unattributed(c.uid)));
            }
        };
        Ok(match claim {
            Ok(()) => s,
            Err(owner) => {
                let mine = SessionInfo::unattributed(c.uid);
                self.engine.session_seen(&Arc::new(mine.clone()), now);
                Arc::new(SessionInfo {
                    via: Via::NotYours {
                        session: s.name.clone(),
                        owner,
                    },
                    ..mine
                })
            }
        })
    }

    /// The session of a caller about to write (docs/design.md#sessions: fail closed). `Err` carries
    /// the caller's `uid:UID`, under which a write to a path with no live record goes on.
    pub(super) fn writer(&self, c: &Caller) -> Result<Session, Session> {
        match self.resolver.resolve(c.pid) {
            Ok(s) => self.claimed(s, c),
            Err(e) => {
                tracing::debug!("session of pid {}: {e}; failing closed", c.pid);
                Err(self
                    .resolver
                    .directory()
                    .record(SessionInfo::unattributed(c.uid)))
            }
        }
    }
}

// Memory the volume keeps per path: the views of sessions whose processes are all gone
// refer to nothing, and neither do the entries of paths only those sessions read. The
// maintenance thread drops entries nothing refers to now and then and, once the volume
// holds more than MANY_PATHS entries, the views of gone sessions too (one scan of /proc):
// a session that comes back then reads a file again before it hands it on, as after a
// restart.

/// Entries past which the views of gone sessions are forgotten.
pub const MANY_PATHS: usize = 100_000;

impl Sessions {
    /// Forgets the views of sessions with no running process left, then the per-path
    /// entries nothing refers to any more. Returns how many entries went.
    pub(super) fn forget_gone_readers(&self) -> usize {
        let pruned = self.engine.prune();
        if self.engine.path_count() <= MANY_PATHS {
            return pruned;
        }
        let viewers = self.engine.viewers();
        if viewers.is_empty() {
            return pruned;
        }
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return pruned; // cannot tell: forget no view on a guess
        };
        let mut running: HashSet<String> = HashSet::new();
        for pid in dir.filter_map(|d| d.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
            if TaskState::read(pid).is_some_and(|t| t.running()) {
                if let Ok(s) = self.resolver.resolve(pid) {
                    running.insert(s.name.clone());
                }
            }
        }
        let gone: Vec<String> = viewers
            .into_iter()
            .filter(|s| !running.contains(&s.name))
            .map(|s| s.name.clone())
            .collect();
        let n = self.engine.forget_views(&gone);
        if n > 0 {
            tracing::debug!(
                "forgot the views of {} gone session(s): {n} path entries dropped",
                gone.len()
            );
        }
        pruned + n
    }
}

/// The caller as the permission checks see it (its supplementary groups from `/proc`).
pub(super) fn who(caller: &Caller) -> Who {
    Who::of_task(caller.pid, caller.uid, caller.gid)
}
