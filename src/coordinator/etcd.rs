//! The etcd coordinator (`--coordinator etcd[s]://HOST:PORT[,HOST:PORT...][/VOLUME]`,
//! credentials in `--coordinator-auth FILE`: see [`auth`]).
//!
//! Keys, under `/coherent/VOLUME/`:
//! - `p/PATH`: the shared part of a path with records ([`SharedPath`]); changed only by a
//!   transaction that compares its mod revision with the one this host last took in, so
//!   two hosts never both decide on one state of a path;
//! - `s/NAME`: the session registry ([`SharedSession`], created once: its owner uid);
//! - `h/HOST`: each live host, under its lease: the revision it has applied (and records
//!   it found in flight). A transfer answers once every live host has applied it;
//! - `e/HOST/N`: every host's events, for the others' logs (short-lived).
//!
//! Threads: a tokio runtime runs the link (connect, lease, watch); FUSE threads call etcd
//! with `block_on` and bounded timeouts, each deadline also cut to what the kernel lets a
//! FUSE request be held, counted from when the request began ([`Started::deadline`]); one
//! thread publishes the event feed and paths changed while etcd could not be reached.

use super::boot::BootTime;
use super::{unavailable, Coordinator, CopyProbe, StepKind, Stepped, Ticket, WriterProbe};
use crate::coherence::{
    Engine, Event, EventKind, EventSink, Saved, SharedPath, SharedSession, Timestamp,
};
use crate::error::Refusal;
use crate::identity::Session;
use crate::journal::{Journal, Tap};
use crate::request_timeout::Started;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

pub mod auth;
mod call;
mod feed;
mod link;
mod spec;
mod step;

pub use auth::EtcdAuth;
pub use spec::{default_host_id, valid_host_id, EtcdSpec};
use step::Publish;

/// The lease of a host (`--coordinator-ttl`): how long a host that stopped answering is
/// waited for, and how soon a host cut off from etcd refuses agent writes.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// One etcd call; past it etcd counts as unreachable for that call.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// A whole step (sync, decide, publish, retries): verbs fail within this when etcd is away.
const STEP_TIMEOUT: Duration = Duration::from_secs(3);
/// How long other hosts' events stay in etcd (they copy them at once; a host away
/// longer misses some of them in its log, never any state).
const EVENTS_TTL: i64 = 120;
/// The largest etcd transaction we send (etcd's default limit is 128 operations).
const MAX_TXN_OPS: usize = 100;

/// What a host publishes about itself under its lease.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct HostState {
    /// Every change up to this revision is applied on that host.
    applied: i64,
    /// Records new to that host whose giver had the file open for writing there.
    #[serde(default)]
    in_flight: Vec<(String, u64)>,
    /// Records new to that host over a version of its copy their giver did not see
    /// (see [`Engine::adopt_beside`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    newer: Vec<(String, u64)>,
}

/// A test hook's delay from the environment (none when unset).
fn test_delay(var: &str) -> Duration {
    Duration::from_millis(
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    )
}

/// The link to etcd as the runtime sees it.
#[derive(Default)]
struct Link {
    /// A watch runs on a live connection.
    connected: bool,
    /// Registered with the current lease and applied past the registration.
    caught_up: bool,
    /// Until then no transfer can be acknowledged without this host (its lease, counted
    /// from when the last renewal was sent, less a margin, on the boot clock: a suspend
    /// counts). Cleared the moment the link fails.
    confirmed_until: Option<BootTime>,
    /// The etcd revision applied here.
    applied: i64,
    /// The revision the shared state was last loaded at: the watch may start before it
    /// (to log the other hosts' events this host has not), and changes up to it are
    /// already in.
    loaded_at: i64,
    /// The mod revision of each `p/` key as taken in here.
    revs: HashMap<String, i64>,
    /// The value of each `p/` key this host is publishing and has no answer for yet: the
    /// watch may bring the put before the answer does, and must not take in what this
    /// host already has (it may have counted more commits since).
    publishing: HashMap<String, Vec<u8>>,
    /// Paths whose `p/` key was deleted (records evicted) while this host watched: the
    /// revision of the deletion, the path's epoch from then on, so that a key deleted
    /// never reads as the same epoch as no key yet (see [`Link::epoch`]).
    gone: HashMap<String, i64>,
    /// The epoch of a path with no key and no entry in `gone`: the revision of the last
    /// full load of the shared state (a key made and deleted before it is not known
    /// here), raised when `gone` is dropped to stay bounded.
    gone_floor: i64,
    /// For eviction: each key's mod revision when this host first saw it, and when
    /// (see [`Etcd::may_evict`]).
    aged: HashMap<String, (i64, BootTime)>,
    hosts: HashMap<String, HostState>,
    in_flight: Vec<(String, u64)>,
    newer: Vec<(String, u64)>,
    error: Option<String>,
    since: Option<Timestamp>,
    /// The lease this host's `h/` key lives under.
    lease: i64,
    /// Counts connections (a call that failed waits for the next one).
    generation: u64,
    /// When the last working link broke (a call waits for a new one only shortly after).
    down_since: Option<Instant>,
    /// etcd refused the credentials or certificates (a start stops waiting).
    refused: bool,
}

/// At most this many deleted keys are remembered one by one (then `gone_floor` rises).
const MAX_GONE: usize = 100_000;

/// At most this many records found in flight (or newer) are reported, the newest.
const MAX_REPORTED: usize = 64;

impl Link {
    /// This host as it publishes itself, having applied every change up to `applied`.
    fn host_state(&self, applied: i64) -> HostState {
        HostState {
            applied,
            in_flight: self.in_flight.clone(),
            newer: self.newer.clone(),
        }
    }

    /// New records of `path` this host found in flight, and those over a newer version
    /// of its copy: reported with its state, for their transfers to be undone.
    fn report(&mut self, path: &str, in_flight: Vec<u64>, newer: Vec<u64>) {
        for (list, ids) in [(&mut self.in_flight, in_flight), (&mut self.newer, newer)] {
            list.extend(ids.into_iter().map(|id| (path.to_string(), id)));
            let n = list.len();
            if n > MAX_REPORTED {
                list.drain(..n - MAX_REPORTED);
            }
        }
    }

    /// The epoch of `path`: the mod revision of its key; with no key, the revision its key
    /// was deleted at, or the floor. Revisions never repeat, so neither do epochs: a
    /// descriptor's ticket from before a key was made, changed or deleted never matches
    /// the epoch after.
    fn epoch(&self, path: &str) -> i64 {
        match self.revs.get(path) {
            Some(r) => *r,
            None => self.gone.get(path).copied().unwrap_or(self.gone_floor),
        }
    }

    /// `path`'s key was deleted at revision `rev` (or is known to be gone as of it).
    fn forget(&mut self, path: &str, rev: i64) {
        self.revs.remove(path);
        self.aged.remove(path);
        if self.gone.len() >= MAX_GONE {
            // Every path without a key moves to an epoch past each deletion dropped here:
            // a descriptor of such a path from an earlier lease is refused (never one
            // admitted wrongly).
            let top = self.gone.values().copied().max().unwrap_or(0);
            self.gone_floor = self.gone_floor.max(top).max(rev);
            self.gone.clear();
        }
        let e = self.gone.entry(path.to_string()).or_insert(rev);
        *e = (*e).max(rev);
    }
}

/// The etcd coordinator. Built by [`Etcd::start`].
pub struct Etcd {
    spec: EtcdSpec,
    prefix: String,
    rt: tokio::runtime::Runtime,
    engine: Arc<Engine>,
    journal: Arc<Journal>,
    link: Mutex<Link>,
    changed: Condvar,
    client: Mutex<Option<Client>>,
    /// One step at a time on this host.
    steps: Mutex<()>,
    /// Steps published to etcd, and those decided on this host alone (`status`).
    agreed: AtomicU64,
    local: AtomicU64,
    feed: Mutex<Vec<Event>>,
    dirty: Mutex<BTreeSet<String>>,
    next_event: AtomicU64,
    /// The endpoint that answered last.
    good: std::sync::atomic::AtomicUsize,
    /// A call failed: drop the connection and find a member that answers.
    relink: tokio::sync::Notify,
    /// Test hook (`COHERENT_APPLY_DELAY_MS`): this host takes in each watch batch this
    /// much later, as a slow or distant host would (the acknowledgement must wait for it).
    apply_delay: Duration,
    /// Test hook (`COHERENT_ADOPT_DELAY_MS`): this host takes in another host's state of
    /// a path this much after it decided to, as a watch thread preempted at that point
    /// would (this host's own steps go on meanwhile).
    adopt_delay: Duration,
    /// Test hook (`COHERENT_PUBLISH_DELAY_MS`): the publisher thread's pause, when longer
    /// than its own (a slow link).
    publish_delay: Duration,
    /// The volume's [`WriterProbe`], once it has one.
    writers: std::sync::OnceLock<WriterProbe>,
    /// The volume's [`CopyProbe`], once it has one.
    copy: std::sync::OnceLock<CopyProbe>,
    /// The lease the `e/` keys live under (renewed by replacing it).
    events_lease: Mutex<Option<(i64, Instant)>>,
    stop: AtomicBool,
    stopped: tokio::sync::Notify,
}

struct EtcdTap(Weak<Etcd>);

impl Tap for EtcdTap {
    fn on_append(&self, ev: &mut Event) {
        let Some(c) = self.0.upgrade() else {
            return;
        };
        ev.host = Some(c.spec.host.clone());
        // A shared path changed outside a step (a change behind the volume's back found
        // at a read, an eviction): published by the publisher thread.
        if changes_shared(ev.event) {
            if let Some(p) = &ev.path {
                if c.link.lock().revs.contains_key(p) {
                    c.dirty.lock().insert(p.clone());
                }
            }
        }
        c.feed.lock().push(ev.clone());
    }
}

fn changes_shared(k: EventKind) -> bool {
    !matches!(
        k,
        EventKind::SessionSeen
            | EventKind::Acquire
            | EventKind::Release
            | EventKind::Reclaim
            | EventKind::StaleWrite
            | EventKind::Denied
            | EventKind::HandoffSeen
    )
}

impl Etcd {
    /// Connects (within `wait`), takes in the shared state, registers this host and
    /// starts the link; the volume may serve once this returns.
    pub fn start(
        spec: EtcdSpec,
        engine: Arc<Engine>,
        journal: Arc<Journal>,
        wait: Duration,
    ) -> Result<Arc<Etcd>, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("coherent-etcd")
            .enable_all()
            .build()
            .map_err(|e| format!("start the etcd client runtime: {e}"))?;
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let c = Arc::new(Etcd {
            prefix: format!("/coherent/{}/", spec.volume),
            spec,
            rt,
            engine,
            journal,
            link: Mutex::new(Link::default()),
            changed: Condvar::new(),
            client: Mutex::new(None),
            steps: Mutex::new(()),
            agreed: AtomicU64::new(0),
            local: AtomicU64::new(0),
            feed: Mutex::new(Vec::new()),
            dirty: Mutex::new(BTreeSet::new()),
            next_event: AtomicU64::new(micros),
            good: std::sync::atomic::AtomicUsize::new(0),
            relink: tokio::sync::Notify::new(),
            events_lease: Mutex::new(None),
            apply_delay: test_delay("COHERENT_APPLY_DELAY_MS"),
            adopt_delay: test_delay("COHERENT_ADOPT_DELAY_MS"),
            publish_delay: test_delay("COHERENT_PUBLISH_DELAY_MS"),
            writers: std::sync::OnceLock::new(),
            copy: std::sync::OnceLock::new(),
            stop: AtomicBool::new(false),
            stopped: tokio::sync::Notify::new(),
        });
        c.journal
            .set_tap(Arc::new(EtcdTap(Arc::downgrade(&c))) as Arc<dyn Tap>);
        let bg = c.clone();
        let link_task = c.rt.spawn(async move { bg.run_link().await });
        // Ready once registered and caught up (and so confirmed).
        let end = Instant::now() + wait;
        let mut l = c.link.lock();
        while !l.caught_up {
            let failed = if l.refused && l.error.is_some() {
                Some(format!(
                    "the coordinator refused this mount: {}",
                    l.error.clone().unwrap_or_default()
                ))
            } else if c.changed.wait_until(&mut l, end).timed_out() {
                let why = l.error.clone().unwrap_or_else(|| "no answer".into());
                Some(format!(
                    "cannot reach the coordinator at {} within {}s: {why}. Start etcd there \
                     (for a local one: bash scripts/etcd.sh start) or mount without --coordinator",
                    c.spec.endpoints.join(","),
                    wait.as_secs()
                ))
            } else {
                None
            };
            if let Some(why) = failed {
                drop(l);
                c.shutdown();
                // The link's task holds the other reference: it ends here, so the last
                // one (and the runtime with it) is dropped on this thread, not inside
                // the runtime, where dropping a runtime panics.
                link_task.abort();
                let _ = c.rt.block_on(link_task);
                return Err(why);
            }
        }
        drop(l);
        let bg = c.clone();
        std::thread::Builder::new()
            .name("coherent-publish".into())
            .spawn(move || bg.publish_loop())
            .map_err(|e| format!("spawn the publisher thread: {e}"))?;
        Ok(c)
    }

    /// Stops the link and revokes nothing: the lease ends by itself (other hosts stop
    /// waiting for this one after the TTL).
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stopped.notify_waiters();
        self.changed.notify_all();
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}/{name}", self.prefix)
    }

    fn margin(&self) -> Duration {
        (self.spec.ttl / 10).max(Duration::from_millis(300))
    }
}

/// One run of a step's operation on this host: its answer, the events it made (kept
/// back), the shared state before it and what it changed, and what undoes it.
struct Tried {
    ok: bool,
    evs: Vec<Event>,
    before: HashMap<String, Option<SharedPath>>,
    changed: Vec<(String, Option<SharedPath>)>,
    saved: Saved,
    /// Paths under the step's directories that the operation added.
    added: Vec<String>,
}

impl Coordinator for Etcd {
    fn shutdown(&self) {
        Etcd::shutdown(self)
    }

    fn host(&self) -> Option<&str> {
        Some(&self.spec.host)
    }

    fn watch_writers(&self, probe: WriterProbe) {
        let _ = self.writers.set(probe);
    }

    fn watch_copy(&self, probe: CopyProbe) {
        let _ = self.copy.set(probe);
    }

    fn confirmed(&self) -> Result<(), Refusal> {
        let l = self.link.lock();
        if l.confirmed_until.is_some_and(|t| BootTime::now() < t) {
            return Ok(());
        }
        let why = l.error.clone().unwrap_or_else(|| "not connected".into());
        Err(unavailable(format!(
            "write refused: this host ({}) has lost its lease with the coordinator (etcd at \
             {}: {why}), so another host may have handed this file on without it knowing. \
             Writes by agent sessions wait until it reconnects; unattributed processes still \
             write",
            self.spec.host,
            self.spec.endpoints.join(",")
        )))
    }

    fn ticket(&self, path: &str) -> Option<Ticket> {
        let l = self.link.lock();
        Some(Ticket {
            lease: if l.caught_up { l.lease } else { -1 },
            epoch: l.epoch(path),
        })
    }

    fn admits(&self, t: &mut Ticket, path: &str) -> Result<(), Refusal> {
        let again = format!(
            "A descriptor opened before writes again only under the lease it was opened \
             under, or if {path} did not change on the other hosts meanwhile; otherwise close \
             it and open {path} again (the open is decided on the current state)"
        );
        if let Err(r) = self.confirmed() {
            let message = format!("{}. {again}", r.message);
            return Err(Refusal { message, ..r });
        }
        let l = self.link.lock();
        // Under the same lease this host applied every change of the path in order, and a
        // transfer while the handle was open here was refused `handoff_in_flight`. Under a
        // later lease the other hosts may have stopped waiting for this one in between:
        // only a path whose shared state did not move since is known not to be handed on.
        let epoch = l.epoch(path);
        if l.lease == t.lease || epoch == t.epoch {
            if l.caught_up {
                *t = Ticket {
                    lease: l.lease,
                    epoch,
                };
            }
            return Ok(());
        }
        Err(unavailable(format!(
            "write refused: {path} was opened for writing on this host ({}) under an earlier \
             lease with the coordinator, and {path} changed on the other hosts since (it may \
             have been handed on while this host was away), so this descriptor can no longer \
             write. {again}",
            self.spec.host
        )))
    }

    fn may_evict(&self, path: &str) -> bool {
        let mut l = self.link.lock();
        // Not caught up, or not published yet: its age here says nothing.
        let Some(rev) = l.revs.get(path).copied().filter(|r| *r > 0 && l.caught_up) else {
            return false;
        };
        // Revisions never repeat: the key is unchanged since this host first saw `rev`,
        // counted on this host's boot clock (its rate, never its wall time). Every
        // record's last change is at least that old on every host.
        let now = BootTime::now();
        let since = match l.aged.get(path) {
            Some((r, t)) if *r == rev => *t,
            _ => {
                l.aged.insert(path.to_string(), (rev, now));
                now
            }
        };
        now >= since + self.engine.config().evict_after
    }

    fn shared(&self, engine: &Engine, path: &str) -> bool {
        engine.has_records(path) || self.link.lock().revs.contains_key(path)
    }

    fn step(
        &self,
        // The same state as `self.engine`, which the step saves and restores.
        _engine: &Engine,
        paths: &[(&str, bool)],
        kind: StepKind,
        started: Started,
        op: &mut dyn FnMut(&Engine) -> bool,
    ) -> Result<Stepped, Refusal> {
        let deadline = started.deadline(STEP_TIMEOUT);
        // A commit already happened and must be counted: it waits its turn (each step
        // ahead of it ends by its own deadline). A decision gives up at its deadline.
        let guard = match kind {
            StepKind::Commit => self.steps.lock(),
            _ => self.steps.try_lock_until(deadline).ok_or_else(|| {
                unavailable(format!(
                    "this host ({}) is still waiting for the coordinator (etcd at {}) on \
                     another change, past the time a request may wait. Nothing was \
                     changed; files handed on stay fenced; try again",
                    self.spec.host,
                    self.spec.endpoints.join(",")
                ))
            })?,
        };
        if kind != StepKind::Verb {
            if let Some(st) = self.decided_here(paths, kind, op) {
                return Ok(st);
            }
        }
        for _ in 0..8 {
            let synced = self.sync(deadline);
            if kind == StepKind::Verb {
                synced.clone()?;
            }
            let names = self.expand(paths);
            let revs: HashMap<String, i64> = {
                let l = self.link.lock();
                names
                    .iter()
                    .map(|p| (p.clone(), l.revs.get(p).copied().unwrap_or(0)))
                    .collect()
            };
            let Tried {
                ok,
                evs,
                before,
                changed,
                saved,
                added,
            } = self.tried(paths, &names, op);
            let undo = |saved: Saved| self.undo(saved, &added);
            if changed.is_empty() {
                if let (true, StepKind::Admit, Err(r)) = (ok, kind, &synced) {
                    undo(saved);
                    self.distrust(&revs);
                    return Err(r.clone());
                }
                self.write_events(evs, true);
                // A verb that changed nothing (a transfer sent again) answers as the first
                // one would: once every live host has applied its paths' state. The
                // first may have given up waiting at its deadline ("run it again").
                let rev = revs.values().copied().max().unwrap_or(0);
                if ok && kind == StepKind::Verb && rev > 0 {
                    drop(guard);
                    self.wait_acks(rev, &[], started)?;
                }
                return Ok(Stepped {
                    ok,
                    ..Default::default()
                });
            }
            let published = match &synced {
                Ok(()) => self.publish(&changed, &evs, &revs, deadline),
                Err(r) => Err(Publish::Unavailable(r.clone())),
            };
            match published {
                Ok((rev, sent)) => {
                    self.agreed.fetch_add(1, Ordering::Relaxed);
                    self.write_events(evs, !sent);
                    let made: Vec<(String, u64)> = changed
                        .iter()
                        .filter_map(|(p, st)| Some((p, st.as_ref()?)))
                        .flat_map(|(p, st)| {
                            let was = before.get(p).cloned().flatten();
                            st.records
                                .iter()
                                .filter(|r| r.is_live(st.version))
                                .filter(move |r| {
                                    !was.as_ref()
                                        .is_some_and(|w| w.records.iter().any(|o| o.id == r.id))
                                })
                                .map(|r| (p.clone(), r.id))
                                .collect::<Vec<_>>()
                        })
                        .collect();
                    drop(guard);
                    let (in_flight, newer) = if made.is_empty() {
                        Default::default()
                    } else {
                        self.wait_acks(rev, &made, started)?
                    };
                    return Ok(Stepped {
                        ok,
                        in_flight,
                        newer,
                    });
                }
                Err(Publish::Conflict(current, rev)) => {
                    undo(saved);
                    self.take_in(current, rev);
                }
                Err(Publish::Unavailable(r)) => {
                    if kind == StepKind::Commit {
                        // It happened: count it here, publish it when etcd is back.
                        self.write_events(evs, true);
                        self.dirty
                            .lock()
                            .extend(changed.into_iter().map(|(p, _)| p));
                        return Ok(Stepped {
                            ok,
                            ..Default::default()
                        });
                    }
                    undo(saved);
                    self.distrust(&revs);
                    if !ok {
                        // Refused by the engine anyway: its `denied` stays in the log.
                        self.write_events(
                            evs.into_iter()
                                .filter(|e| e.event == EventKind::Denied)
                                .collect(),
                            true,
                        );
                        return Ok(Stepped {
                            ok,
                            ..Default::default()
                        });
                    }
                    return Err(r);
                }
            }
        }
        Err(unavailable(
            "other hosts kept changing these files while this host decided; try again",
        ))
    }

    fn claim(
        &self,
        engine: &Engine,
        s: &Session,
        uid: u32,
        now: Timestamp,
        started: Started,
    ) -> Result<Result<(), u32>, Refusal> {
        if !s.is_attributed() || engine.owner(&s.name).is_some() {
            return Ok(engine.claim(s, uid, now));
        }
        let deadline = started.deadline(STEP_TIMEOUT);
        let key = self.key("s", &s.name);
        let mine = SharedSession {
            info: s.as_ref().clone(),
            uid: Some(uid),
            host: Some(self.spec.host.clone()),
        };
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                serde_json::to_vec(&mine).expect("sessions serialise"),
                None,
            )])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.call(deadline, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })?;
        if !resp.succeeded() {
            for op in resp.op_responses() {
                if let TxnOpResponse::Get(g) = op {
                    if let Some(kv) = g.kvs().first() {
                        if let Ok(theirs) = serde_json::from_slice::<SharedSession>(kv.value()) {
                            engine.adopt_session(theirs);
                        }
                    }
                }
            }
        }
        Ok(engine.claim(s, uid, now))
    }

    fn catch_up(&self, started: Started) {
        if let Err(r) = self.sync(started.deadline(CALL_TIMEOUT)) {
            tracing::debug!("not caught up: {}", r.message);
        }
    }

    fn describe(&self) -> Option<serde_json::Value> {
        let l = self.link.lock();
        // The live hosts as last seen are only known while the watch runs: cut off, this
        // host cannot tell which leases ended, so it shows none rather than a stale list.
        let known = l.connected && l.caught_up;
        let mut hosts: Vec<serde_json::Value> = l
            .hosts
            .iter()
            .filter(|_| known)
            .map(|(n, h)| serde_json::json!({"host": n, "applied": h.applied}))
            .collect();
        hosts.sort_by(|a, b| a["host"].as_str().cmp(&b["host"].as_str()));
        Some(serde_json::json!({
            "kind": "etcd",
            "endpoints": self.spec.endpoints,
            "volume": self.spec.volume,
            "host": self.spec.host,
            "connected": l.connected && l.caught_up,
            "confirmed": l.confirmed_until.is_some_and(|t| BootTime::now() < t),
            "applied": l.applied,
            "hosts": hosts,
            "hosts_known": known,
            "error": l.error,
            "tls": self.spec.tls,
            "user": self.spec.auth.as_ref().and_then(|a| a.user.as_ref()).map(|u| &u.0),
            "steps": {
                "agreed": self.agreed.load(Ordering::Relaxed),
                "local": self.local.load(Ordering::Relaxed),
            },
        }))
    }
}
