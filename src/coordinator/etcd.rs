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
use super::{unavailable, Coordinator, StepKind, Stepped, Ticket, WriterProbe};
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
mod feed;
mod link;

pub use auth::EtcdAuth;

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

/// Where and who: parsed from `--coordinator`, `--coordinator-auth`, `--host-id`,
/// `--coordinator-ttl`.
#[derive(Debug, Clone)]
pub struct EtcdSpec {
    /// `HOST:PORT` each.
    pub endpoints: Vec<String>,
    /// `etcds://`: every member is reached over TLS.
    pub tls: bool,
    /// User, password and certificates, read from the auth file.
    pub auth: Option<EtcdAuth>,
    /// The key space (`/coherent/VOLUME/`): hosts sharing one workspace use one.
    pub volume: String,
    pub host: String,
    pub ttl: Duration,
}

impl EtcdSpec {
    /// Parses `etcd[s]://HOST:PORT[,HOST:PORT...][/VOLUME][?auth=FILE]` and reads the
    /// auth file (`auth`: `--coordinator-auth`; the URL's `?auth=` says the same, so the
    /// one line `scripts/etcd.sh start` prints is all a mount needs).
    pub fn parse(
        url: &str,
        auth: Option<&std::path::Path>,
        host: String,
        ttl: Duration,
    ) -> Result<EtcdSpec, String> {
        let bad = |why: &str| {
            format!(
                "--coordinator {url:?}: {why}; expected \
                 etcd[s]://HOST:PORT[,HOST:PORT...][/VOLUME][?auth=FILE], for example \
                 etcd://127.0.0.1:2379"
            )
        };
        let (tls, rest) = if let Some(r) = url.strip_prefix("etcds://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("etcd://") {
            (false, r)
        } else {
            return Err(bad("only etcd:// and etcds:// (TLS) are supported"));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let url_auth = match query {
            None => None,
            Some(q) => Some(
                q.strip_prefix("auth=")
                    .filter(|f| !f.is_empty())
                    .ok_or_else(|| bad(&format!("unknown query {q:?} (only auth=FILE)")))?,
            ),
        };
        let auth_file = match (auth, url_auth) {
            (Some(a), Some(u)) if a != std::path::Path::new(u) => {
                return Err(format!(
                    "--coordinator-auth {} and the URL's ?auth={u} differ: give one",
                    a.display()
                ))
            }
            (Some(a), _) => Some(a.to_path_buf()),
            (None, u) => u.map(std::path::PathBuf::from),
        };
        let (hosts, volume) = match rest.split_once('/') {
            Some((h, v)) if !v.is_empty() => (h, v),
            Some((h, _)) => (h, "default"),
            None => (rest, "default"),
        };
        if !volume
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(bad(
                "the volume name may hold only letters, digits, '.', '_' and '-'",
            ));
        }
        let mut endpoints = Vec::new();
        for ep in hosts.split(',') {
            let (h, port) = ep
                .rsplit_once(':')
                .ok_or_else(|| bad(&format!("{ep:?} has no :PORT")))?;
            if h.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!("{ep:?} is not HOST:PORT")));
            }
            endpoints.push(ep.to_string());
        }
        if !valid_host_id(&host) {
            return Err(format!(
                "--host-id {host:?}: use 1 to 200 printable characters, no spaces"
            ));
        }
        if ttl < Duration::from_secs(2) {
            return Err("--coordinator-ttl must be at least 2 seconds".into());
        }
        let auth = match auth_file {
            Some(f) => {
                let a = EtcdAuth::read(&f)?;
                a.check_scheme(tls)?;
                Some(a)
            }
            None if tls => {
                return Err(format!(
                    "--coordinator {url:?}: etcds:// needs the cluster's CA: give \
                     --coordinator-auth FILE with ca=FILE (see docs/multi-host.md)"
                ))
            }
            None => None,
        };
        Ok(EtcdSpec {
            endpoints,
            tls,
            auth,
            volume: volume.to_string(),
            host,
            ttl,
        })
    }

    /// The client's options for this spec (user, TLS) on top of `o`.
    fn connect_options(&self, o: ConnectOptions) -> ConnectOptions {
        match &self.auth {
            Some(a) => a.apply(o, self.tls),
            None => o,
        }
    }

    /// The URL of one endpoint for the client.
    fn endpoint_url(&self, ep: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{ep}")
    }
}

pub fn valid_host_id(h: &str) -> bool {
    !h.is_empty() && h.len() <= 200 && h.chars().all(|c| c.is_ascii_graphic())
}

/// The default `--host-id`: this machine's name and the mount point.
pub fn default_host_id(mountpoint: &std::path::Path) -> String {
    let name = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".into());
    let id: String = format!("{name}:{}", mountpoint.display())
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    id.chars().take(200).collect()
}

/// What a host publishes about itself under its lease.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct HostState {
    /// Every change up to this revision is applied on that host.
    applied: i64,
    /// Records new to that host whose giver had the file open for writing there.
    #[serde(default)]
    in_flight: Vec<(String, u64)>,
}

/// Two accounts of a path that differ in the count of its commits alone (the same
/// records, none live in either): no fence hangs on the difference.
fn count_only(a: &SharedPath, b: &SharedPath) -> bool {
    a.records == b.records
        && !a.records.iter().any(|r| r.is_live(a.version))
        && !b.records.iter().any(|r| r.is_live(b.version))
}

/// This host's account of a path it has not published yet counted more commits than
/// another host's that came first (on one backing directory, that host found this one's
/// commits on its copy and counted them as one change behind the volume's back): this
/// host's account stands, to be published over the other, which takes it in. Any other
/// difference is the other host's step, which wins.
fn counted_further(mine: Option<&SharedPath>, theirs: &SharedPath) -> bool {
    mine.is_some_and(|m| m.version > theirs.version && count_only(m, theirs))
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

impl Link {
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

/// Where the events of a step wait, in order and not yet numbered, while the hosts agree
/// on it: the journal numbers them once it is agreed; an undone step drops them.
struct Held {
    host: String,
    events: Mutex<Vec<Event>>,
}

impl EventSink for Held {
    fn append(&self, ev: &mut Event) {
        // Named before the engine applies it, as the tap names every other event.
        ev.host = Some(self.host.clone());
        self.events.lock().push(ev.clone());
    }

    /// A step's events are durable once the step is published (or written here).
    fn wait_durable(&self, _seq: u64) {}
}

/// What etcd holds for a path now: its state and mod revision (`None`: no key).
type Current = Option<(SharedPath, i64)>;

enum Publish {
    /// Another host changed one of the paths first: what is there now, to take in
    /// once the step is undone, and the revision it was read at.
    Conflict(Vec<(String, Current)>, i64),
    Unavailable(Refusal),
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

/// An etcd client error in a few words (the transport's own text is a paragraph).
fn short(e: &etcd_client::Error) -> String {
    let t = e.to_string();
    for (needle, say) in [
        ("KeepAliveTimedOut", "no answer (connection timed out)"),
        ("Connection refused", "connection refused"),
        ("timed out", "no answer in time"),
        ("Unavailable", "unavailable"),
    ] {
        if t.contains(needle) {
            return say.to_string();
        }
    }
    t.chars().take(160).collect()
}

/// Record ids past every revision seen (see [`Engine::raise_record_ids`]).
fn id_floor(rev: i64) -> u64 {
    (rev.max(0) as u64 + 1) << 20
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

    // ----- calls from FUSE threads --------------------------------------------------

    fn unreachable(&self) -> Refusal {
        let l = self.link.lock();
        let why = l.error.clone().unwrap_or_else(|| "not connected".into());
        unavailable(format!(
            "the coordinator (etcd at {}) cannot be reached: {why}. Nothing was changed; \
             files handed on stay fenced; try again when it is back",
            self.spec.endpoints.join(",")
        ))
    }

    /// One etcd call with a deadline, from a thread outside the runtime.
    /// When a call fails the link moves to a member that answers and the call is made
    /// once more there, within `deadline`.
    fn call<T, F, Fut>(&self, deadline: Instant, f: F) -> Result<T, Refusal>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        for attempt in 0..2 {
            self.await_link(deadline)?;
            let (client, generation) = (self.client.lock().clone(), self.link.lock().generation);
            let Some(client) = client else {
                return Err(self.unreachable());
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let fut = f(client);
            let limit = left.min(CALL_TIMEOUT);
            // The timer must be made inside the runtime.
            let why = match self
                .rt
                .block_on(async move { tokio::time::timeout(limit, fut).await })
            {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => short(&e),
                Err(_) => "no answer in time".to_string(),
            };
            let mut l = self.link.lock();
            l.error = Some(why);
            if attempt == 1 {
                break;
            }
            self.relink.notify_one();
            while l.generation == generation || !l.caught_up {
                if self.changed.wait_until(&mut l, deadline).timed_out() {
                    drop(l);
                    return Err(self.unreachable());
                }
            }
        }
        Err(self.unreachable())
    }

    /// A link being made again shortly after a working one broke (a member died, etcd
    /// blinked) is waited for, within `deadline`; a link down for longer fails at once, so
    /// an outage costs the writes that need etcd no time.
    fn await_link(&self, deadline: Instant) -> Result<(), Refusal> {
        let mut l = self.link.lock();
        while !l.caught_up {
            let recent = l.down_since.is_some_and(|t| t.elapsed() < STEP_TIMEOUT);
            if !recent || self.changed.wait_until(&mut l, deadline).timed_out() {
                drop(l);
                return Err(self.unreachable());
            }
        }
        Ok(())
    }

    /// Waits until this host has applied everything etcd has now.
    fn sync(&self, deadline: Instant) -> Result<(), Refusal> {
        self.await_link(deadline)?;
        // A barrier: this host's own key, written now, comes back through the watch
        // after every change before it.
        let (lease, st) = {
            let l = self.link.lock();
            let st = HostState {
                applied: l.applied,
                in_flight: l.in_flight.clone(),
            };
            (l.lease, st)
        };
        let key = self.key("h", &self.spec.host);
        let value = serde_json::to_vec(&st).expect("host state serialises");
        let r = self.call(deadline, |mut c| {
            let (key, value) = (key.clone(), value.clone());
            async move {
                c.put(key, value, Some(PutOptions::new().with_lease(lease)))
                    .await
            }
        })?;
        let rev = r.header().map_or(0, |h| h.revision());
        let mut l = self.link.lock();
        while l.applied < rev {
            if !l.connected || Instant::now() >= deadline {
                drop(l);
                return Err(self.unreachable());
            }
            self.changed.wait_until(&mut l, deadline);
        }
        Ok(())
    }

    /// `paths`, and for a directory every shared path under it.
    fn expand(&self, paths: &[(&str, bool)]) -> Vec<String> {
        let mut out = BTreeSet::new();
        for (p, dir) in paths {
            out.insert(p.to_string());
            if *dir {
                out.extend(self.engine.paths_with_records(p));
                let pre = format!("{p}/");
                let l = self.link.lock();
                out.extend(l.revs.keys().filter(|k| k.starts_with(&pre)).cloned());
            }
        }
        out.into_iter().collect()
    }

    /// A write route or a count that changes nothing the hosts share (the successor's next
    /// open of a file it has completed, a bystander's open of one already overtaken, the
    /// release of a hold) is decided on this host's state alone, with no round trip to
    /// etcd: while this host's lease is confirmed, every transfer another host had
    /// acknowledged is applied here (the acknowledgement waits for it), so the fence is as
    /// exact as after a catch-up. `None` (and nothing changed): the step must be agreed, or
    /// the decision refused the write (a refusal is decided again on the newest state, so
    /// it is never a stale one).
    ///
    /// A commit of a path whose records have all ended changes only its version and stamp:
    /// no fence hangs on that, so it is counted here too and published by the publisher
    /// (as after an outage). Another host's step on the path meanwhile wins, and this
    /// change is then found there as a change behind the volume's back.
    fn decided_here(
        &self,
        paths: &[(&str, bool)],
        kind: StepKind,
        op: &mut dyn FnMut(&Engine) -> bool,
    ) -> Option<Stepped> {
        self.confirmed().ok()?;
        let t = self.tried(paths, &self.expand(paths), op);
        let counted_only = kind == StepKind::Commit
            && t.changed.iter().all(|(p, now)| {
                let was = t.before.get(p).cloned().flatten();
                matches!((was, now), (Some(w), Some(n)) if count_only(&w, n))
            });
        if !t.ok || !(t.changed.is_empty() || counted_only) {
            self.undo(t.saved, &t.added);
            return None;
        }
        self.dirty
            .lock()
            .extend(t.changed.into_iter().map(|(p, _)| p));
        self.log_events(t.evs, true);
        self.local.fetch_add(1, Ordering::Relaxed);
        Some(Stepped {
            ok: true,
            in_flight: Vec::new(),
        })
    }

    /// Runs a step's operation once on this host's state, its events kept back (`names`:
    /// the step's paths as expanded before it ran).
    fn tried(
        &self,
        paths: &[(&str, bool)],
        names: &[String],
        op: &mut dyn FnMut(&Engine) -> bool,
    ) -> Tried {
        let saved = self.engine.save(names);
        let before: HashMap<String, Option<SharedPath>> = names
            .iter()
            .map(|p| (p.clone(), self.engine.shared_state(p)))
            .collect();
        let (ok, evs) = captured(&self.engine, &self.spec.host, op);
        let mut added = self.expand(paths);
        added.retain(|p| !before.contains_key(p));
        let changed = names
            .iter()
            .chain(added.iter())
            .filter_map(|p| {
                let now = self.engine.shared_state(p);
                let was = before.get(p).cloned().flatten();
                (now != was).then(|| (p.clone(), now))
            })
            .collect();
        Tried {
            ok,
            evs,
            before,
            changed,
            saved,
            added,
        }
    }

    /// Undoes what [`Etcd::tried`] changed here.
    fn undo(&self, saved: Saved, added: &[String]) {
        self.engine.restore(saved);
        self.engine.restore(Saved::absent(added));
    }

    /// Publishes the new shared state of `changed` if nobody changed them since this host
    /// took them in. On a conflict the newer state is taken in.
    fn publish(
        &self,
        changed: &[(String, Option<SharedPath>)],
        evs: &[Event],
        revs: &HashMap<String, i64>,
        deadline: Instant,
    ) -> Result<(i64, bool), Publish> {
        let mut when = Vec::new();
        let mut then = Vec::new();
        let mut or_else = Vec::new();
        // The step's events go with its state, so another host logs them before anything
        // that follows (when they fit; else the feed carries them).
        let fits = !evs.is_empty() && changed.len() + evs.len() <= MAX_TXN_OPS;
        let lease = fits.then(|| self.events_lease(deadline)).flatten();
        if let Some(lease) = lease {
            then.extend(evs.iter().map(|ev| self.event_op(ev, lease)));
        }
        {
            for (i, (p, st)) in changed.iter().enumerate() {
                let k = self.key("p", p);
                // The revision this host decided on (taken before the step ran).
                let rev = revs.get(p).copied().unwrap_or(0);
                when.push(Compare::mod_revision(k.clone(), CompareOp::Equal, rev));
                then.insert(
                    i,
                    match st {
                        Some(s) => {
                            let value = serde_json::to_vec(s).expect("state serialises");
                            self.link.lock().publishing.insert(p.clone(), value.clone());
                            TxnOp::put(k.clone(), value, None)
                        }
                        None => TxnOp::delete(k.clone(), None),
                    },
                );
                or_else.push(TxnOp::get(k, None));
            }
        }
        let txn = Txn::new().when(when).and_then(then).or_else(or_else);
        let resp = self.call(deadline, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        });
        // In the same hold of the lock as the revisions below: the watch skips this
        // host's put until then, and from then on by its revision.
        let mut l = self.link.lock();
        for (p, _) in changed {
            l.publishing.remove(p);
        }
        let resp = resp.map_err(Publish::Unavailable)?;
        let rev = resp.header().map_or(0, |h| h.revision());
        if resp.succeeded() {
            for (p, st) in changed {
                if st.is_some() {
                    let r = l.revs.entry(p.clone()).or_insert(0);
                    *r = (*r).max(rev);
                } else {
                    l.forget(p, rev);
                }
            }
            drop(l);
            self.engine.raise_record_ids(id_floor(rev));
            return Ok((rev, lease.is_some()));
        }
        drop(l);
        let mut now = Vec::new();
        for (i, op) in resp.op_responses().into_iter().enumerate() {
            let TxnOpResponse::Get(g) = op else { continue };
            let cur = g.kvs().first().and_then(|kv| {
                let st = serde_json::from_slice::<SharedPath>(kv.value()).ok()?;
                Some((st, kv.mod_revision()))
            });
            now.push((changed[i].0.clone(), cur));
        }
        Err(Publish::Conflict(now, rev))
    }

    /// Takes in what etcd holds for paths (after a step was undone), as read at `rev`.
    fn take_in(&self, current: Vec<(String, Current)>, rev: i64) {
        for (p, cur) in current {
            match cur {
                Some((st, rev)) => {
                    self.engine.adopt(&p, Some(st));
                    self.link.lock().revs.insert(p, rev);
                }
                None => {
                    self.engine.adopt(&p, None);
                    self.link.lock().forget(&p, rev);
                }
            }
        }
    }

    /// After a step was undone without knowing what etcd holds: a path another host
    /// changed meanwhile (the watch took it in, the undo put the older one back) is
    /// marked so its next publication conflicts and takes the state in.
    fn distrust(&self, revs: &HashMap<String, i64>) {
        let mut l = self.link.lock();
        for (p, r) in revs {
            if let Some(cur) = l.revs.get_mut(p) {
                if *cur != *r {
                    *cur = -1;
                }
            }
        }
    }

    /// Waits until every other live host applied revision `rev` (or left: its lease
    /// ended), within the budget of the request that `started` the step. Returns the
    /// records some host found in flight.
    fn wait_acks(
        &self,
        rev: i64,
        made: &[(String, u64)],
        started: Started,
    ) -> Result<Vec<(String, u64)>, Refusal> {
        let deadline = started.deadline(self.spec.ttl + STEP_TIMEOUT);
        let mut l = self.link.lock();
        loop {
            let found: Vec<(String, u64)> = l
                .hosts
                .values()
                .flat_map(|h| h.in_flight.iter())
                .filter(|x| made.contains(x))
                .cloned()
                .collect();
            if !found.is_empty() {
                return Ok(found);
            }
            let behind: Vec<String> = l
                .hosts
                .iter()
                .filter(|(n, h)| **n != self.spec.host && h.applied < rev)
                .map(|(n, _)| n.clone())
                .collect();
            if behind.is_empty() {
                return Ok(Vec::new());
            }
            if Instant::now() >= deadline || !l.connected {
                // `pending`: recorded, not acknowledged; a client sends it again.
                return Err(unavailable(format!(
                    "the handoff is recorded but host(s) {} have not confirmed it: until they \
                     do or their lease ends, the fence may not hold there. Run the same \
                     transfer again to wait once more",
                    behind.join(", ")
                ))
                .with_status(crate::error::Status::Pending));
            }
            self.changed.wait_until(&mut l, deadline);
        }
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

/// Runs `op` on a view of `engine` that keeps its events; returns them with its answer.
fn captured(
    engine: &Engine,
    host: &str,
    op: &mut dyn FnMut(&Engine) -> bool,
) -> (bool, Vec<Event>) {
    let held = Arc::new(Held {
        host: host.to_string(),
        events: Mutex::new(Vec::new()),
    });
    let ok = op(&engine.with_sink(held.clone()));
    let evs = std::mem::take(&mut *held.events.lock());
    (ok, evs)
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
                    in_flight: Vec::new(),
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
                    let in_flight = if made.is_empty() {
                        Vec::new()
                    } else {
                        self.wait_acks(rev, &made, started)?
                    };
                    return Ok(Stepped { ok, in_flight });
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
                            in_flight: Vec::new(),
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
                            in_flight: Vec::new(),
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
