//! Where the state that hosts must agree on lives (docs/design.md#hosts, docs/multi-host.md): the
//! embedded journal of one host (the default) or etcd (`--coordinator etcd://...`).
//!
//! The volume asks its coordinator three things: may this host write at all right now
//! ([`Coordinator::confirmed`]), is a path shared ([`Coordinator::shared`]: it has a
//! transfer record, so its changes must be agreed), and to run a change of shared paths
//! as one agreed step ([`Coordinator::step`]). The rules themselves stay in the engine:
//! a step runs the same engine code as one host does, and the coordinator publishes what
//! it changed. See docs/multi-host.md for the safety argument.

pub mod boot;
pub mod etcd;

use std::sync::Arc;

use crate::coherence::{Engine, Timestamp};
use crate::error::{Reason, Refusal};
use crate::identity::Session;
use crate::journal::Journal;
use crate::request_timeout::Started;

/// How a volume gets its coordinator: built by whoever opens the volume (the daemon builds
/// etcd from its flags), called once the state is loaded, since a coordinator needs the
/// engine and the journal it publishes from. A volume opened without one is this host's
/// alone ([`Embedded`]). Cloned with the volume's configuration, so a retried open
/// connects again.
#[derive(Clone)]
pub struct Connect(Arc<ConnectFn>);

type ConnectFn =
    dyn Fn(Arc<Engine>, Arc<Journal>) -> Result<Arc<dyn Coordinator>, String> + Send + Sync;

impl Connect {
    pub fn new(
        f: impl Fn(Arc<Engine>, Arc<Journal>) -> Result<Arc<dyn Coordinator>, String>
            + Send
            + Sync
            + 'static,
    ) -> Connect {
        Connect(Arc::new(f))
    }

    /// Connect over the loaded state (an error says why, for the mount's refusal).
    pub fn connect(
        &self,
        engine: Arc<Engine>,
        journal: Arc<Journal>,
    ) -> Result<Arc<dyn Coordinator>, String> {
        (self.0)(engine, journal)
    }
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connect(..)")
    }
}

/// What kind of step: it decides what happens when the coordinator cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// A write route deciding (open for write, rename, ...): refused when the step cannot
    /// be agreed, unless the engine refused it anyway (a fenced giver hears `fenced`).
    Admit,
    /// What already happened (a commit after the data was written): applied here at
    /// once, and published when the coordinator is back.
    Commit,
    /// A verb: refused `coordinator_unavailable` when the coordinator cannot be reached.
    Verb,
}

/// The outcome of a step that ran.
#[derive(Debug, Default)]
pub struct Stepped {
    /// What the operation returned (true: it was allowed / did something).
    pub ok: bool,
    /// Records this step made that another host found in flight (the giver has the file
    /// open for writing there): (path, record id). The verb must undo them.
    pub in_flight: Vec<(String, u64)>,
    /// Records this step made over a version another host counted that their giver did
    /// not see (its copy there is newer than the giver's view): (path, record id, host).
    /// The verb must undo them (`handoff_not_held`).
    pub newer: Vec<(String, u64, String)>,
}

/// What a write handle was admitted under on a multi-host volume: this host's lease and
/// the path's epoch (the etcd mod revision of its shared state, 0: none) when the handle
/// was last known good. Checked at each write through the handle
/// ([`Coordinator::admits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The lease this host held (-1: a link being made again, so an earlier lease).
    pub lease: i64,
    /// The path's epoch then.
    pub epoch: i64,
}

/// Has session `giver` (the second argument) the file at a path (the first) open for
/// writing on this host, under any name, where the engine's holders may not show it (a
/// descriptor opened under another name, or while the path was untracked)?
pub type WriterProbe = Box<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// The fingerprint of the file at a path on this host's copy, with the stamp it had while
/// it was read (`None`: not there, or not readable).
pub type CopyProbe =
    Box<dyn Fn(&str) -> Option<(crate::coherence::Stamp, crate::coherence::Print)> + Send + Sync>;

/// The coordinator interface.
pub trait Coordinator: Send + Sync {
    /// This host's name in events (`None`: one host, no name).
    fn host(&self) -> Option<&str>;

    /// Do other hosts share this workspace? The one question every part asks before
    /// doing what only a shared workspace needs (fingerprints for other copies, stamps of
    /// paths taken in, untracked write handles kept by inode).
    fn is_shared(&self) -> bool {
        self.host().is_some()
    }

    /// At unmount, before the last snapshot: stop talking to the other hosts.
    fn shutdown(&self) {}

    /// `Ok` while this host is sure it has applied every transfer another host may have
    /// acknowledged. Otherwise writes by agent sessions to tracked files are refused
    /// (`coordinator_unavailable`): a giver's write could be one.
    fn confirmed(&self) -> Result<(), Refusal>;

    /// The ticket a write handle of `path` opened now is admitted under (`None`: one
    /// host, its writes need no check).
    fn ticket(&self, _path: &str) -> Option<Ticket> {
        None
    }

    /// May a handle admitted under `t` write `path` now? Only while this host's lease is
    /// confirmed, and, if that lease is not the ticket's, only if the path's epoch has not
    /// moved since (another host may have handed it on while this host was away). When it
    /// may, `t` moves to the current lease and epoch (the handle is known good as of now).
    /// `Err`: `coordinator_unavailable`, saying what to do.
    fn admits(&self, _t: &mut Ticket, _path: &str) -> Result<(), Refusal> {
        Ok(())
    }

    /// May this host evict the ended records of `path` now? One host: yes, the records'
    /// own times decide. Several: only once the path's shared state has not changed for
    /// `--evict-after`, as this host measures it, so one host's wall clock cannot evict
    /// the others' records early.
    fn may_evict(&self, _path: &str) -> bool {
        true
    }

    /// Is `path` shared (its changes need the coordinator)?
    fn shared(&self, engine: &Engine, path: &str) -> bool;

    /// Runs `op` (engine calls changing `paths`, or paths under them when a name is a
    /// directory) as one agreed step of `kind`. `op` makes its changes through the engine
    /// it is handed: `engine` itself on one host, a view of it whose events the step keeps
    /// (as values) until the hosts agree on them. Whatever the step waits for ends within
    /// the budget of the request that `started` it (src/request_timeout.rs).
    fn step(
        &self,
        engine: &Engine,
        paths: &[(&str, bool)],
        kind: StepKind,
        started: Started,
        op: &mut dyn FnMut(&Engine) -> bool,
    ) -> Result<Stepped, Refusal>;

    /// Claims session `s` for `uid` on every host (docs/design.md#sessions: the first uid that
    /// shows a name owns it). `Ok(Err(owner))`: another uid owns it. Bounded as a step.
    fn claim(
        &self,
        engine: &Engine,
        s: &Session,
        uid: u32,
        now: Timestamp,
        started: Started,
    ) -> Result<Result<(), u32>, Refusal>;

    /// Best effort, bounded (as a step): take in what the other hosts changed up to now
    /// (before a read of the shared state: `status`, the inbox).
    fn catch_up(&self, started: Started);

    /// What `coherent status` shows of the coordinator (`None`: nothing to show).
    fn describe(&self) -> Option<serde_json::Value>;

    /// How this host finds a giver's write handles its engine does not show: another
    /// host's transfer of a file its giver has open for writing here is in flight, as one
    /// host refuses it (`handoff_in_flight`).
    fn watch_writers(&self, _probe: WriterProbe) {}

    /// How this host reads its copy of a path that another host's state meets at a
    /// version this host counted too (see [`crate::coherence::Engine::adopt_beside`]).
    fn watch_copy(&self, _probe: CopyProbe) {}
}

/// One host: the journal is the only state; nothing to agree with anyone.
pub struct Embedded;

impl Coordinator for Embedded {
    fn host(&self) -> Option<&str> {
        None
    }

    fn confirmed(&self) -> Result<(), Refusal> {
        Ok(())
    }

    fn shared(&self, _engine: &Engine, _path: &str) -> bool {
        false
    }

    fn step(
        &self,
        engine: &Engine,
        _paths: &[(&str, bool)],
        _kind: StepKind,
        _started: Started,
        op: &mut dyn FnMut(&Engine) -> bool,
    ) -> Result<Stepped, Refusal> {
        Ok(Stepped {
            ok: op(engine),
            ..Default::default()
        })
    }

    fn claim(
        &self,
        engine: &Engine,
        s: &Session,
        uid: u32,
        now: Timestamp,
        _started: Started,
    ) -> Result<Result<(), u32>, Refusal> {
        Ok(engine.claim(s, uid, now))
    }

    fn catch_up(&self, _started: Started) {}

    fn describe(&self) -> Option<serde_json::Value> {
        None
    }
}

/// The refusal when the coordinator cannot be reached or confirmed.
pub fn unavailable(message: impl Into<String>) -> Refusal {
    Refusal::new(Reason::CoordinatorUnavailable, message)
}
