//! The engine: versions, holds, records, the fence decision and the verbs.
//!
//! Locking. Paths live in `SHARDS` shards, each a `parking_lot::Mutex` over a map from
//! path to [`Entry`] (version, holds, records), so operations on different paths rarely
//! share a lock. Lock order, always:
//!   1. shard mutexes, in ascending shard index (multi-path verbs, renames, snapshots);
//!   2. `sessions` (RwLock);
//!   3. `why` (Mutex);
//!   4. the sink's own locks (inside `EventSink::append`).
//!
//! Every event is appended to the sink while the lock(s) guarding what it changes are held,
//! and applied right after with the same code that replays the log ([`Engine::replay`]),
//! so the log order is the application order for every path, and the log rebuilds exactly
//! the live state.

use super::lookup::resolve_session;
use super::time::Timestamp;
use super::types::*;
use crate::error::{Reason, Refusal};
use crate::identity::{Session, SessionInfo, Via};
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const SHARDS: usize = 64;

/// Largest note a transfer accepts (§5).
pub const MAX_NOTE: usize = 64 * 1024;

/// The name commits found behind the volume's back are attributed to (§3).
pub const EXTERNAL: &str = "external";

/// Where events go: the journal in the mount, a memory log in tests.
pub trait EventSink: Send + Sync {
    /// Assigns `ev.seq` (the next number) and queues the event. Called with engine locks
    /// held: must not call back into the engine.
    fn append(&self, ev: &mut Event);
    /// Blocks until every event up to `seq` is durable.
    fn wait_durable(&self, seq: u64);
}

/// A sink that keeps every event in memory (tests, benchmarks, replay checks).
#[derive(Default)]
pub struct MemorySink {
    events: Mutex<Vec<Event>>,
    keep: bool,
    next: AtomicU64,
}

impl MemorySink {
    /// Keeps every event.
    pub fn new() -> Self {
        MemorySink {
            keep: true,
            ..Default::default()
        }
    }

    /// Only numbers events (benchmarks).
    pub fn discarding() -> Self {
        MemorySink::default()
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }
}

impl EventSink for MemorySink {
    fn append(&self, ev: &mut Event) {
        if self.keep {
            let mut v = self.events.lock();
            ev.seq = v.len() as u64 + 1;
            v.push(ev.clone());
        } else {
            ev.seq = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        }
    }

    fn wait_durable(&self, _seq: u64) {}
}

/// One session's stake in one path: memory only (§8).
#[derive(Debug, Clone)]
struct Holder {
    session: Session,
    hold: Hold,
    /// The version this session last read, wrote or committed.
    view: Option<u64>,
    /// Open write handles.
    writers: u32,
}

/// One path.
#[derive(Debug, Default)]
struct Entry {
    /// 0: being created through the volume, not yet committed.
    version: u64,
    exists: bool,
    stamp: Option<Stamp>,
    /// The stamp of the last logged commit: what a restart knows (`stamp` may be newer,
    /// adopted silently at first sight or by `restamp`).
    logged_stamp: Option<Stamp>,
    /// Some logged event touched this path: it is part of the durable state.
    logged: bool,
    holders: Vec<Holder>,
    records: Vec<Record>,
}

impl Entry {
    fn live(&self) -> Option<&Record> {
        self.records.iter().find(|r| r.is_live(self.version))
    }

    fn holder(&self, name: &str) -> Option<&Holder> {
        self.holders.iter().find(|h| h.session.name == name)
    }

    fn holder_mut(&mut self, s: &Session) -> &mut Holder {
        let i = match self.holders.iter().position(|h| h.session.name == s.name) {
            Some(i) => i,
            None => {
                self.holders.push(Holder {
                    session: s.clone(),
                    hold: Hold::I,
                    view: None,
                    writers: 0,
                });
                self.holders.len() - 1
            }
        };
        &mut self.holders[i]
    }

    fn writing(&self) -> bool {
        self.holders.iter().any(|h| h.writers > 0)
    }

    fn record_mut(&mut self, id: Option<u64>) -> Option<&mut Record> {
        let id = id?;
        self.records.iter_mut().find(|r| r.id == id)
    }
}

type Shard = HashMap<Box<str>, Entry, BuildHasherDefault<PathHasher>>;

/// A fast multiplicative hash for path keys (the maps are local; no untrusted network
/// input chooses them).
#[derive(Default, Clone, Copy)]
struct PathHasher(u64);

impl Hasher for PathHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
        }
        let mut tail = [0u8; 8];
        let rest = chunks.remainder();
        tail[..rest.len()].copy_from_slice(rest);
        self.0 =
            (self.0.rotate_left(5) ^ u64::from_le_bytes(tail) ^ rest.len() as u64).wrapping_mul(K);
    }

    fn write_u8(&mut self, b: u8) {
        self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The entry of `path`, created empty (version 0) if missing; no allocation when present.
fn entry_mut<'a>(sh: &'a mut Shard, path: &str) -> &'a mut Entry {
    if !sh.contains_key(path) {
        sh.insert(path.into(), Entry::default());
    }
    sh.get_mut(path).expect("just inserted")
}

/// The coherence engine. Cheap to share (`Arc<Engine>`); every method takes `&self`.
pub struct Engine {
    config: Config,
    shards: Box<[Mutex<Shard>]>,
    sessions: RwLock<HashMap<String, Session, BuildHasherDefault<PathHasher>>>,
    why: Mutex<HashMap<String, String>>,
    sink: Arc<dyn EventSink>,
    applied: AtomicU64,
}

fn shard_of(path: &str) -> usize {
    let mut h = PathHasher(0x9e37_79b9_7f4a_7c15);
    h.write(path.as_bytes());
    // The high bits mix best in a multiplicative hash.
    (h.finish() >> 58) as usize % SHARDS
}

/// A workspace-relative path as the engine accepts it: not empty, not absolute, no `.`,
/// `..` or empty component.
pub fn valid_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

fn bad_path(p: &str) -> Refusal {
    Refusal::new(
        Reason::BadRequest,
        format!("'{p}' is not a path inside the volume"),
    )
}

/// The deny text of §5.
pub fn deny_text(path: &str, successor: &SessionInfo, version: u64) -> String {
    let id = successor.short_id();
    format!(
        "write denied: you handed {path} to agent {id} ({name}) at v{version}, so this session \
         can no longer write it. The handoff ends when {id} writes {path}, when {id} declines \
         it, or when you withdraw it (coherent withdraw {path}). Stop and tell your user that \
         {path} was handed off. Retrying will be denied the same way.",
        name = successor.name
    )
}

/// What a verb decided for one path, before anything changes.
enum Plan {
    Nothing,
    New { hold: Hold, version: u64 },
    Supersede { old: u64, hold: Hold, version: u64 },
    Status(EventKind),
}

impl Engine {
    pub fn new(config: Config, sink: Arc<dyn EventSink>) -> Self {
        Engine {
            config,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            sessions: RwLock::new(HashMap::default()),
            why: Mutex::new(HashMap::new()),
            sink,
            applied: AtomicU64::new(0),
        }
    }

    /// An engine holding `state` (a snapshot); events after `state.seq` follow via
    /// [`Engine::replay`].
    pub fn from_state(config: Config, state: DurableState, sink: Arc<dyn EventSink>) -> Self {
        let e = Engine::new(config, sink);
        {
            let mut sessions = e.sessions.write();
            for (name, info) in state.sessions {
                sessions.insert(name, Arc::new(info));
            }
        }
        for (path, p) in state.paths {
            let entry = Entry {
                version: p.version,
                exists: p.exists,
                logged_stamp: p.stamp,
                stamp: p.stamp,
                logged: true,
                holders: Vec::new(),
                records: Vec::new(),
            };
            e.shards[shard_of(&path)]
                .lock()
                .insert(path.into_boxed_str(), entry);
        }
        for r in state.records {
            let mut sh = e.shards[shard_of(&r.path)].lock();
            let entry = entry_mut(&mut sh, &r.path);
            entry.logged = true;
            entry.records.push(r);
        }
        e.applied.store(state.seq, Ordering::SeqCst);
        e
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    // ----- sessions -----------------------------------------------------------------

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

    /// The known session of that name (records use it, so the first-seen `via` wins).
    fn known(&self, name: &str, agent: Option<uuid::Uuid>) -> Session {
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

    // ----- plumbing -----------------------------------------------------------------

    fn lock_one(&self, path: &str) -> MutexGuard<'_, Shard> {
        self.shards[shard_of(path)].lock()
    }

    /// Locks the shards of `paths` in ascending order; returns (shard index, guard) pairs.
    fn lock_many<'a>(&'a self, paths: &[&str]) -> Vec<(usize, MutexGuard<'a, Shard>)> {
        let mut idx: Vec<usize> = paths.iter().map(|p| shard_of(p)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| (i, self.shards[i].lock()))
            .collect()
    }

    fn lock_all(&self) -> Vec<MutexGuard<'_, Shard>> {
        self.shards.iter().map(|s| s.lock()).collect()
    }

    /// Appends `ev` and applies it to `entry` (which the caller holds locked).
    fn emit(&self, entry: &mut Entry, mut ev: Event) -> u64 {
        self.sink.append(&mut ev);
        self.applied.fetch_max(ev.seq, Ordering::SeqCst);
        self.apply_entry(entry, &ev, true);
        ev.seq
    }

    fn set_why(&self, s: &SessionInfo, text: &str) {
        self.why.lock().insert(s.name.clone(), text.to_string());
    }

    fn refuse(&self, s: &SessionInfo, r: Refusal) -> Refusal {
        self.set_why(s, &r.message);
        r
    }

    /// The state change of one logged event on one path: shared by the live path
    /// (`emit`, `live`) and the replay of the log, so both build the same durable state.
    /// Holds and views are memory only: a replay creates none (§8: after a restart no
    /// session has a view).
    fn apply_entry(&self, e: &mut Entry, ev: &Event, live: bool) {
        let who = ev.session.as_deref().unwrap_or("");
        match ev.event {
            EventKind::SessionSeen | EventKind::StaleWrite | EventKind::Denied => {}
            EventKind::Acquire => {
                if let Some(v) = ev.version.filter(|v| *v > e.version) {
                    // Replay of a path first seen (unlogged) at that version.
                    e.version = v;
                    e.exists = true;
                }
                if !live {
                    return;
                }
                if e.holder(who).is_none() {
                    let s = self.known(who, ev.agent);
                    e.holder_mut(&s);
                }
                let h = e
                    .holders
                    .iter_mut()
                    .find(|h| h.session.name == who)
                    .expect("held");
                h.writers += 1;
                h.hold = Hold::E;
            }
            EventKind::Release => {
                let v = e.version;
                if let Some(h) = e.holders.iter_mut().find(|h| h.session.name == who) {
                    h.writers = 0;
                    h.hold = if h.view == Some(v) { Hold::S } else { Hold::I };
                }
            }
            EventKind::Reclaim => e.holders.retain(|h| h.session.name != who),
            EventKind::Commit | EventKind::ExternalChange => {
                let v = ev.version.unwrap_or(e.version + 1);
                e.version = v;
                e.exists = !ev.removed;
                e.stamp = ev.stamp;
                e.logged_stamp = ev.stamp;
                e.logged = true;
                for h in &mut e.holders {
                    if ev.event == EventKind::Commit && h.session.name == who {
                        h.hold = if h.writers > 0 { Hold::E } else { Hold::M };
                        h.view = Some(v);
                    } else {
                        h.hold = Hold::I;
                    }
                }
                if live
                    && ev.event == EventKind::Commit
                    && !e.holders.iter().any(|h| h.session.name == who)
                {
                    let s = self.known(who, ev.agent);
                    e.holders.push(Holder {
                        session: s,
                        hold: Hold::M,
                        view: Some(v),
                        writers: 0,
                    });
                }
            }
            EventKind::Transfer => {
                let version = ev.version.unwrap_or(e.version);
                if e.version == 0 {
                    // Replay of a path first seen (unlogged) at version 1.
                    e.version = version;
                    e.exists = true;
                }
                e.logged = true;
                let giver = self.known(who, ev.agent);
                let successor =
                    self.known(ev.successor.as_deref().unwrap_or(""), ev.successor_agent);
                if let Some(h) = e.holders.iter_mut().find(|h| h.session.name == who) {
                    h.hold = Hold::I;
                }
                e.records.push(Record {
                    id: ev.seq,
                    path: ev.path.clone().unwrap_or_default(),
                    giver,
                    successor,
                    version_at_transfer: version,
                    hold: ev.hold.unwrap_or(Hold::S),
                    status: Status::Pending,
                    counterparty: None,
                    note: ev.note.clone(),
                    created: ev.ts,
                    updated: ev.ts,
                    seen: false,
                });
            }
            EventKind::HandoffSeen => {
                if let Some(r) = e.record_mut(ev.record) {
                    r.seen = true;
                }
            }
            EventKind::Accept
            | EventKind::Completed
            | EventKind::Decline
            | EventKind::Withdraw
            | EventKind::Superseded
            | EventKind::Overtaken => {
                let status = match ev.event {
                    EventKind::Accept | EventKind::Completed => Status::Completed,
                    EventKind::Decline => Status::Declined,
                    EventKind::Withdraw => Status::Withdrawn,
                    EventKind::Superseded => Status::Superseded,
                    _ => Status::Overtaken,
                };
                if let Some(r) = e.record_mut(ev.record) {
                    r.status = status;
                    r.updated = ev.ts;
                    if ev.event == EventKind::Overtaken {
                        r.counterparty = ev.counterparty.clone();
                    }
                }
            }
            EventKind::Evict => {
                if let Some(id) = ev.record {
                    e.records.retain(|r| r.id != id);
                }
            }
        }
    }

    /// Moves every path under directory `from` to under `to` (a logged `rename_dir`).
    /// Caller holds every shard.
    fn apply_rename_dir(&self, shards: &mut [MutexGuard<'_, Shard>], from: &str, to: &str) {
        let pre = format!("{from}/");
        let mut moved = Vec::new();
        for sh in shards.iter_mut() {
            let keys: Vec<Box<str>> = sh.keys().filter(|k| k.starts_with(&pre)).cloned().collect();
            for k in keys {
                let e = sh.remove(&k).expect("key just listed");
                moved.push((format!("{to}/{}", &k[pre.len()..]), e));
            }
        }
        for (path, mut e) in moved {
            let sh = &mut shards[shard_of(&path)];
            if let Some(old) = sh.remove(path.as_str()) {
                // Only a tombstone can sit under an empty target directory; keep the
                // numbering of that path increasing.
                if old.version >= e.version {
                    e.version = old.version + 1;
                }
            }
            for r in &mut e.records {
                r.path = path.clone();
            }
            e.logged = true;
            sh.insert(path.into_boxed_str(), e);
        }
    }

    /// Applies one event read back from the log (recovery). Events must come in log order.
    pub fn replay(&self, ev: &Event) {
        self.applied.fetch_max(ev.seq, Ordering::SeqCst);
        match (ev.event, ev.op) {
            (EventKind::SessionSeen, _) => {
                let name = ev.session.clone().unwrap_or_default();
                let info = SessionInfo {
                    name: name.clone(),
                    agent_id: ev
                        .agent
                        .unwrap_or_else(|| crate::identity::agent_id_for_name(&name)),
                    via: ev.via.clone().unwrap_or(Via::Registered),
                };
                self.sessions
                    .write()
                    .entry(name)
                    .or_insert_with(|| Arc::new(info));
            }
            (EventKind::Commit, Some(CommitOp::RenameDir)) => {
                let mut all = self.lock_all();
                if let (Some(from), Some(to)) = (&ev.from, &ev.path) {
                    self.apply_rename_dir(&mut all, from, to);
                }
            }
            _ => {
                let Some(path) = ev.path.as_deref() else {
                    return;
                };
                let mut sh = self.lock_one(path);
                let e = entry_mut(&mut sh, path);
                self.apply_entry(e, ev, false);
            }
        }
    }

    // ----- file operations (the mount) ----------------------------------------------

    /// The mount saw `path` in the backing directory with `stamp` (None: the file is not
    /// there). Call at lookup/open before `open_read`/`acquire`. A path seen for the first
    /// time is at version 1 (nothing logged); a known path whose stamp differs while no
    /// handle writes it changed behind the volume's back: a commit by `external`
    /// (`external_change`, and `overtaken` on a live record). Returns the version.
    pub fn observe(&self, path: &str, stamp: Option<Stamp>, now: Timestamp) -> Option<u64> {
        let mut sh = self.lock_one(path);
        let Some(e) = sh.get_mut(path) else {
            stamp?;
            sh.insert(
                path.into(),
                Entry {
                    version: 1,
                    exists: true,
                    stamp,
                    ..Default::default()
                },
            );
            return Some(1);
        };
        if e.writing() {
            // A handle of the volume is writing it: the commit will count the change.
            return (e.version > 0 && e.exists).then_some(e.version);
        }
        match (e.exists && e.version > 0, stamp) {
            (false, None) => return None,
            (true, Some(st)) if e.stamp.is_none() => {
                e.stamp = Some(st);
                return Some(e.version);
            }
            (true, Some(st)) if e.stamp == Some(st) => return Some(e.version),
            (false, Some(_)) if e.version == 0 => {
                e.version = 1;
                e.exists = true;
                e.stamp = stamp;
                return Some(1);
            }
            _ => {}
        }
        // Changed, removed or recreated behind the volume's back.
        let version = e.version + 1;
        self.overtake_live(e, EXTERNAL, now);
        let mut ev = Event::new(EventKind::ExternalChange, now, Some(path), None);
        ev.session = Some(EXTERNAL.to_string());
        ev.version = Some(version);
        ev.removed = stamp.is_none();
        ev.stamp = stamp;
        self.emit(e, ev);
        stamp.map(|_| version)
    }

    /// A metadata change made through the volume that is not a commit (chmod, chown,
    /// utimes, xattrs) changed the file's ctime: remember the new stamp so the next
    /// `observe` does not count it as an external change. Memory only (no event): after a
    /// restart the stamp of the last logged commit applies again.
    pub fn restamp(&self, path: &str, stamp: Stamp) {
        if let Some(e) = self.lock_one(path).get_mut(path) {
            if e.exists && e.version > 0 && e.stamp != Some(stamp) {
                e.stamp = Some(stamp);
            }
        }
    }

    /// A live record on `e` touched by `by`, who is neither its giver nor its successor:
    /// `overtaken` with `counterparty` (unless it already says so).
    fn overtake_live(&self, e: &mut Entry, by: &str, now: Timestamp) {
        let Some(r) = e.live() else { return };
        if r.giver.name == by || r.successor.name == by {
            return;
        }
        if r.status == Status::Overtaken && r.counterparty.as_deref() == Some(by) {
            return;
        }
        let mut ev = Event::new(EventKind::Overtaken, now, Some(&r.path), None);
        ev.session = Some(by.to_string());
        if let Some(s) = self.sessions.read().get(by) {
            ev.agent = Some(s.agent_id);
        }
        ev.record = Some(r.id);
        ev.giver = Some(r.giver.name.clone());
        ev.successor = Some(r.successor.name.clone());
        ev.counterparty = Some(by.to_string());
        ev.version = Some(e.version);
        self.emit(e, ev);
    }

    /// The successor's first open of a path handed to it: `handoff_seen`.
    fn mark_seen(&self, e: &mut Entry, s: &Session, now: Timestamp) {
        let Some(r) = e.live() else { return };
        if r.seen || r.successor.name != s.name {
            return;
        }
        let mut ev = Event::new(EventKind::HandoffSeen, now, Some(&r.path), Some(s));
        ev.record = Some(r.id);
        ev.giver = Some(r.giver.name.clone());
        ev.version = Some(e.version);
        self.emit(e, ev);
    }

    /// If `s` is fenced on `e`: logs `denied`, keeps the deny text for `why`, returns the
    /// refusal (`Reason::Fenced`, the text as message).
    fn fence(
        &self,
        e: &mut Entry,
        path: &str,
        s: &Session,
        route: Route,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let Some(r) = e.live() else { return Ok(()) };
        if r.giver.name != s.name {
            return Ok(());
        }
        let text = deny_text(path, &r.successor, r.version_at_transfer);
        let mut ev = Event::new(EventKind::Denied, now, Some(path), Some(s));
        ev.reason = Some(Reason::Fenced);
        ev.route = Some(route);
        ev.record = Some(r.id);
        ev.successor = Some(r.successor.name.clone());
        ev.version = Some(e.version);
        self.emit(e, ev);
        Err(self.refuse(s, Refusal::new(Reason::Fenced, text)))
    }

    /// Is `s` fenced on `path`? (No event; for queries and tests. The mount uses
    /// `acquire`/`check_write`, which also log the denial.)
    pub fn is_fenced(&self, s: &SessionInfo, path: &str) -> bool {
        let sh = self.lock_one(path);
        sh.get(path)
            .and_then(Entry::live)
            .is_some_and(|r| r.giver.name == s.name)
    }

    /// An open for read by `s`: sets its view and an `S` hold (memory only); the
    /// successor's first open of a path handed to it logs `handoff_seen`. Returns the
    /// version (None: the path is not tracked or not committed yet).
    pub fn open_read(&self, s: &Session, path: &str, now: Timestamp) -> Option<u64> {
        self.session_seen(s, now);
        let mut sh = self.lock_one(path);
        let e = sh.get_mut(path)?;
        if e.version == 0 || !e.exists {
            return None;
        }
        let v = e.version;
        let h = e.holder_mut(s);
        h.hold = if h.writers > 0 {
            Hold::E
        } else if h.hold == Hold::M && h.view == Some(v) {
            Hold::M
        } else {
            Hold::S
        };
        h.view = Some(v);
        self.mark_seen(e, s, now);
        Some(v)
    }

    /// An open (or create) for write by `s`: the fence and the stale guard, then an `E`
    /// hold (`acquire`). A bystander's acquire turns a live record `overtaken`. On
    /// refusal nothing is held; answer `EACCES`. Pair with `close_write`.
    pub fn acquire(&self, s: &Session, path: &str, now: Timestamp) -> Result<Acquired, Refusal> {
        self.session_seen(s, now);
        let mut sh = self.lock_one(path);
        let e = entry_mut(&mut sh, path);
        self.fence(e, path, s, Route::OpenWrite, now)?;
        let version = e.version;
        let view = e.holder(&s.name).and_then(|h| h.view);
        let stale = matches!(view, Some(v) if v < version);
        if stale {
            match self.config.stale {
                StaleMode::Off => {}
                StaleMode::Warn => {
                    let mut ev = Event::new(EventKind::StaleWrite, now, Some(path), Some(s));
                    ev.view = view;
                    ev.version = Some(version);
                    self.emit(e, ev);
                }
                StaleMode::Strict => {
                    let mut ev = Event::new(EventKind::Denied, now, Some(path), Some(s));
                    ev.reason = Some(Reason::StaleView);
                    ev.route = Some(Route::OpenWrite);
                    ev.view = view;
                    ev.version = Some(version);
                    self.emit(e, ev);
                    let text = format!(
                        "write denied: {path} is at v{version} but this session last saw v{} \
                         (another session changed it since). Read {path} again, then write.",
                        view.unwrap_or(0)
                    );
                    return Err(self.refuse(s, Refusal::new(Reason::StaleView, text)));
                }
            }
        }
        self.overtake_live(e, &s.name, now);
        self.mark_seen(e, s, now);
        let mut ev = Event::new(EventKind::Acquire, now, Some(path), Some(s));
        ev.version = Some(version);
        self.emit(e, ev);
        Ok(Acquired {
            version,
            stale: stale && self.config.stale == StaleMode::Warn,
        })
    }

    /// The fence decision for a write route other than an open for write (§6): setattr,
    /// unlink, link/symlink/mknod creating the path, set/removexattr, one side of a rename
    /// (see `check_rename`). Refused: `denied` is logged, answer `EACCES`.
    pub fn check_write(
        &self,
        s: &Session,
        path: &str,
        route: Route,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        self.session_seen(s, now);
        let mut sh = self.lock_one(path);
        match sh.get_mut(path) {
            Some(e) => self.fence(e, path, s, route, now),
            None => Ok(()),
        }
    }

    /// The fence decision for `rename(from, to)` (also `RENAME_EXCHANGE`): both sides and,
    /// for a directory, every path under either.
    pub fn check_rename(
        &self,
        s: &Session,
        from: &str,
        to: &str,
        is_dir: bool,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        self.check_write(s, from, Route::RenameSource, now)?;
        self.check_write(s, to, Route::RenameTarget, now)?;
        if is_dir {
            for (dir, route) in [(from, Route::RenameSource), (to, Route::RenameTarget)] {
                let pre = format!("{dir}/");
                for shard in self.shards.iter() {
                    let mut sh = shard.lock();
                    for (k, e) in sh.iter_mut() {
                        if k.starts_with(&pre) {
                            self.fence(e, k, s, route, now)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    // Internal: the arguments are exactly the fields of the commit event.
    #[allow(clippy::too_many_arguments)]
    fn commit_locked(
        &self,
        e: &mut Entry,
        s: &Session,
        path: &str,
        op: CommitOp,
        stamp: Option<Stamp>,
        from: Option<&str>,
        now: Timestamp,
    ) -> u64 {
        let version = e.version + 1;
        if let Some(r) = e.live() {
            if r.successor.name == s.name {
                let mut ev = Event::new(EventKind::Completed, now, Some(path), Some(s));
                ev.record = Some(r.id);
                ev.giver = Some(r.giver.name.clone());
                ev.version = Some(version);
                self.emit(e, ev);
            } else {
                self.overtake_live(e, &s.name, now);
            }
        }
        let mut ev = Event::new(EventKind::Commit, now, Some(path), Some(s));
        ev.version = Some(version);
        ev.op = Some(op);
        ev.removed = matches!(op, CommitOp::Unlink | CommitOp::RenameAway);
        ev.stamp = if ev.removed { None } else { stamp };
        ev.from = from.map(str::to_string);
        self.emit(e, ev);
        version
    }

    /// A committed change of `path` by `s` (§3): a write handle flushed/released with a
    /// changed file (`CommitOp::Write`; a create and its writes are one commit → v1),
    /// `Truncate`, `Unlink` (the path becomes a tombstone), `Link`/`Symlink`/`Mknod`
    /// creating it. `stamp` is the file after the change (None after unlink). The
    /// successor's commit completes a live record; anyone else's overtakes it. Returns the
    /// new version. Renames go through `rename`.
    pub fn commit(
        &self,
        s: &Session,
        path: &str,
        op: CommitOp,
        stamp: Option<Stamp>,
        now: Timestamp,
    ) -> u64 {
        self.session_seen(s, now);
        let mut sh = self.lock_one(path);
        let e = entry_mut(&mut sh, path);
        self.commit_locked(e, s, path, op, stamp, None, now)
    }

    /// A write handle of `s` on `path` closed. `committed`: the handle committed (the
    /// mount calls `commit` first when the file changed). The last write handle closing
    /// without a commit logs `release`.
    pub fn close_write(&self, s: &Session, path: &str, committed: bool, now: Timestamp) {
        let mut sh = self.lock_one(path);
        let Some(e) = sh.get_mut(path) else { return };
        let v = e.version;
        let Some(h) = e.holders.iter_mut().find(|h| h.session.name == s.name) else {
            return;
        };
        if h.writers == 0 {
            return;
        }
        if h.writers > 1 || committed {
            h.writers -= 1;
            if h.writers == 0 {
                // M if its commit is still the current version, else someone committed since.
                h.hold = if h.view == Some(v) { Hold::M } else { Hold::I };
            }
            return;
        }
        let mut ev = Event::new(EventKind::Release, now, Some(path), Some(s));
        ev.version = Some(e.version);
        self.emit(e, ev);
    }

    /// `rename(from, to)` by `s` after it succeeded in the backing directory. A file: the
    /// source records a removal, the target a commit by `s` (`stamp`: the target now). A
    /// directory: every tracked path under `from` moves under `to` with its version,
    /// holds and records. Returns the target's version (None for a directory).
    pub fn rename(
        &self,
        s: &Session,
        from: &str,
        to: &str,
        is_dir: bool,
        stamp: Option<Stamp>,
        now: Timestamp,
    ) -> Option<u64> {
        self.session_seen(s, now);
        if is_dir {
            let mut all = self.lock_all();
            let mut ev = Event::new(EventKind::Commit, now, Some(to), Some(s));
            ev.op = Some(CommitOp::RenameDir);
            ev.from = Some(from.to_string());
            self.sink.append(&mut ev);
            self.applied.fetch_max(ev.seq, Ordering::SeqCst);
            self.apply_rename_dir(&mut all, from, to);
            return None;
        }
        let mut guards = self.lock_many(&[from, to]);
        let pos = |p: &str| {
            let i = shard_of(p);
            guards.iter().position(|(j, _)| *j == i).expect("locked")
        };
        let (fi, ti) = (pos(from), pos(to));
        if let Some(e) = guards[fi].1.get_mut(from) {
            if e.version > 0 && e.exists {
                self.commit_locked(e, s, from, CommitOp::RenameAway, None, None, now);
            }
        }
        let e = entry_mut(&mut guards[ti].1, to);
        Some(self.commit_locked(e, s, to, CommitOp::Rename, stamp, Some(from), now))
    }

    /// Every process of `s` is gone: its `E` holds are reclaimed (`reclaim`, one per
    /// path). Scans every path (rare).
    pub fn session_gone(&self, s: &SessionInfo, now: Timestamp) -> usize {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            for (k, e) in sh.iter_mut() {
                if e.holder(&s.name).is_some_and(|h| h.writers > 0) {
                    let mut ev = Event::new(EventKind::Reclaim, now, Some(k), Some(s));
                    ev.version = Some(e.version);
                    self.emit(e, ev);
                    n += 1;
                }
            }
        }
        n
    }

    /// Evicts ended records whose last change is at least `evict_after` before `now`
    /// (`evict`). The only time-driven change; live records are never touched. Returns
    /// how many were evicted.
    pub fn evict(&self, now: Timestamp) -> usize {
        let cutoff = now.millis() - self.config.evict_after.as_millis() as i64;
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            for e in sh.values_mut() {
                let v = e.version;
                let old: Vec<(u64, String, String)> = e
                    .records
                    .iter()
                    .filter(|r| !r.is_live(v) && r.updated.millis() <= cutoff)
                    .map(|r| (r.id, r.path.clone(), r.giver.name.clone()))
                    .collect();
                for (id, path, giver) in old {
                    let mut ev = Event::new(EventKind::Evict, now, Some(&path), None);
                    ev.record = Some(id);
                    ev.giver = Some(giver);
                    self.emit(e, ev);
                    n += 1;
                }
            }
        }
        n
    }

    // ----- verbs --------------------------------------------------------------------

    fn attributed(&self, s: &Session, verb: &str) -> Result<(), Refusal> {
        if s.is_attributed() {
            return Ok(());
        }
        Err(self.refuse(
            s,
            Refusal::new(
                Reason::Unattributed,
                format!(
                    "{} is not an agent session (no cgroup or session variable), so it cannot {verb}; run it under `coherent run --session NAME`",
                    s.name
                ),
            ),
        ))
    }

    fn check_paths(&self, s: &Session, paths: &[String]) -> Result<Vec<String>, Refusal> {
        if paths.is_empty() {
            return Err(self.refuse(s, Refusal::new(Reason::BadRequest, "no path given")));
        }
        let mut out: Vec<String> = Vec::with_capacity(paths.len());
        for p in paths {
            if !valid_path(p) {
                return Err(self.refuse(s, bad_path(p)));
            }
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        Ok(out)
    }

    fn reply(&self, verb: &str, records: Vec<RecordJson>, last: Option<u64>) -> VerbReply {
        if let Some(seq) = last {
            self.sink.wait_durable(seq);
        }
        VerbReply {
            verb: verb.to_string(),
            records,
            session: None,
        }
    }

    /// `register`: makes `s` known (so it can be named as a successor). Durable before
    /// it returns.
    pub fn register(&self, s: &Session, now: Timestamp) -> Result<VerbReply, Refusal> {
        self.attributed(s, "register")?;
        let seq = self.session_seen(s, now);
        let mut r = self.reply("register", vec![], seq);
        r.session = Some(session_json(s));
        Ok(r)
    }

    /// `transfer(paths, successor, note)` by giver `s` (§5). All or nothing: every path is
    /// checked first and the first refusal, naming its path, changes nothing. Re-sending a
    /// live transfer answers the record unchanged; to another successor it supersedes.
    /// Returns after the events are durable.
    pub fn transfer(
        &self,
        s: &Session,
        paths: &[String],
        successor: &str,
        note: Option<String>,
        now: Timestamp,
    ) -> Result<VerbReply, Refusal> {
        self.attributed(s, "hand files on")?;
        self.session_seen(s, now);
        let paths = self.check_paths(s, paths)?;
        if note.as_ref().is_some_and(|n| n.len() > MAX_NOTE) {
            return Err(self.refuse(
                s,
                Refusal::new(Reason::BadRequest, "the note is longer than 64 KiB"),
            ));
        }
        let succ = self
            .lookup_session(successor)
            .map_err(|r| self.refuse(s, r))?;
        if succ.name == s.name {
            return Err(self.refuse(
                s,
                Refusal::new(
                    Reason::HandoffToSelf,
                    format!(
                        "{successor} is this session ({}): hand files to another session",
                        s.display()
                    ),
                ),
            ));
        }
        let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
        let mut guards = self.lock_many(&refs);
        let mut plans = Vec::with_capacity(paths.len());
        for p in &paths {
            let sh = &guards
                .iter()
                .find(|(i, _)| *i == shard_of(p))
                .expect("locked")
                .1;
            let plan = self.plan_transfer(sh.get(p.as_str()), p, s, &succ);
            plans.push(plan.map_err(|r| self.refuse(s, r))?);
        }
        let mut last = None;
        let mut out = Vec::new();
        for (p, plan) in paths.iter().zip(plans) {
            let sh = &mut guards
                .iter_mut()
                .find(|(i, _)| *i == shard_of(p))
                .expect("locked")
                .1;
            let e = sh.get_mut(p.as_str()).expect("checked");
            let (hold, version) = match plan {
                Plan::Nothing => {
                    out.push(e.live().expect("live").to_json(e.version));
                    continue;
                }
                Plan::New { hold, version } => (hold, version),
                Plan::Supersede { old, hold, version } => {
                    let mut ev = Event::new(EventKind::Superseded, now, Some(p), Some(s));
                    ev.record = Some(old);
                    ev.version = Some(version);
                    self.emit(e, ev);
                    (hold, version)
                }
                Plan::Status(_) => unreachable!(),
            };
            let mut ev = Event::new(EventKind::Transfer, now, Some(p), Some(s));
            ev.successor = Some(succ.name.clone());
            ev.successor_agent = Some(succ.agent_id);
            ev.version = Some(version);
            ev.hold = Some(hold);
            ev.note = note.clone();
            let seq = self.emit(e, ev);
            last = Some(seq);
            let r = e.records.iter().find(|r| r.id == seq).expect("just made");
            out.push(r.to_json(e.version));
        }
        drop(guards);
        Ok(self.reply("transfer", out, last))
    }

    fn plan_transfer(
        &self,
        e: Option<&Entry>,
        p: &str,
        s: &Session,
        succ: &Session,
    ) -> Result<Plan, Refusal> {
        let e = match e {
            Some(e) if e.exists && e.version > 0 => e,
            _ => return Err(no_such_path(p)),
        };
        if let Some(r) = e.live() {
            if r.giver.name != s.name {
                return Err(Refusal::new(
                    Reason::HandoffOtherHolder,
                    format!(
                        "{p} is already handed on by {} to {} (at v{}); only one handoff of a file at a time",
                        r.giver.display(),
                        r.successor.display(),
                        r.version_at_transfer
                    ),
                ));
            }
            if r.successor.name == succ.name {
                return Ok(Plan::Nothing);
            }
            ended_before(e, p, s, succ)?;
            return Ok(Plan::Supersede {
                old: r.id,
                hold: r.hold,
                version: e.version,
            });
        }
        let h = e.holder(&s.name);
        if h.is_some_and(|h| h.writers > 0) {
            return Err(Refusal::new(
                Reason::HandoffInFlight,
                format!(
                    "this session still has {p} open for writing: close it first, then transfer"
                ),
            ));
        }
        let hold = match h {
            Some(h) if h.view == Some(e.version) && matches!(h.hold, Hold::M | Hold::S) => h.hold,
            _ => {
                return Err(Refusal::new(
                    Reason::HandoffNotHeld,
                    format!(
                        "this session has not read or written {p} at its current version v{}: read it first",
                        e.version
                    ),
                ))
            }
        };
        ended_before(e, p, s, succ)?;
        Ok(Plan::New {
            hold,
            version: e.version,
        })
    }

    /// `accept` by the successor: `completed`; the fence stays until the version moves.
    pub fn accept(
        &self,
        s: &Session,
        paths: &[String],
        now: Timestamp,
    ) -> Result<VerbReply, Refusal> {
        self.answer(s, paths, EventKind::Accept, now)
    }

    /// `decline` by the successor: `declined`; the fence lifts.
    pub fn decline(
        &self,
        s: &Session,
        paths: &[String],
        now: Timestamp,
    ) -> Result<VerbReply, Refusal> {
        self.answer(s, paths, EventKind::Decline, now)
    }

    /// `withdraw` by the giver: `withdrawn`; the fence lifts.
    pub fn withdraw(
        &self,
        s: &Session,
        paths: &[String],
        now: Timestamp,
    ) -> Result<VerbReply, Refusal> {
        self.answer(s, paths, EventKind::Withdraw, now)
    }

    fn answer(
        &self,
        s: &Session,
        paths: &[String],
        kind: EventKind,
        now: Timestamp,
    ) -> Result<VerbReply, Refusal> {
        let verb = match kind {
            EventKind::Accept => "accept",
            EventKind::Decline => "decline",
            _ => "withdraw",
        };
        self.attributed(s, verb)?;
        self.session_seen(s, now);
        let paths = self.check_paths(s, paths)?;
        let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
        let mut guards = self.lock_many(&refs);
        let mut plans = Vec::new();
        for p in &paths {
            let sh = &guards
                .iter()
                .find(|(i, _)| *i == shard_of(p))
                .expect("locked")
                .1;
            let plan = match sh.get(p.as_str()) {
                Some(e) if e.exists && e.version > 0 => match e.live() {
                    None => Err(Refusal::new(
                        Reason::HandoffNotLive,
                        format!("{p} has no live handoff at v{}", e.version),
                    )),
                    Some(r) if kind == EventKind::Withdraw && r.giver.name != s.name => {
                        Err(Refusal::new(
                            Reason::HandoffNotGiver,
                            format!(
                                "{p} was handed on by {}, not by this session",
                                r.giver.display()
                            ),
                        ))
                    }
                    Some(r) if kind != EventKind::Withdraw && r.successor.name != s.name => {
                        Err(Refusal::new(
                            Reason::HandoffNotSuccessor,
                            format!(
                                "{p} was handed to {}, not to this session",
                                r.successor.display()
                            ),
                        ))
                    }
                    Some(r) if kind == EventKind::Accept && r.status == Status::Completed => {
                        Ok(Plan::Nothing)
                    }
                    Some(_) => Ok(Plan::Status(kind)),
                },
                _ => Err(no_such_path(p)),
            };
            plans.push(plan.map_err(|r| self.refuse(s, r))?);
        }
        let mut last = None;
        let mut out = Vec::new();
        for (p, plan) in paths.iter().zip(plans) {
            let sh = &mut guards
                .iter_mut()
                .find(|(i, _)| *i == shard_of(p))
                .expect("locked")
                .1;
            let e = sh.get_mut(p.as_str()).expect("checked");
            let r = e.live().expect("checked live");
            let id = r.id;
            if let Plan::Status(kind) = plan {
                let mut ev = Event::new(kind, now, Some(p), Some(s));
                ev.record = Some(id);
                ev.giver = Some(r.giver.name.clone());
                ev.successor = Some(r.successor.name.clone());
                ev.version = Some(e.version);
                last = Some(self.emit(e, ev));
            }
            let r = e.records.iter().find(|r| r.id == id).expect("kept");
            out.push(r.to_json(e.version));
        }
        drop(guards);
        Ok(self.reply(verb, out, last))
    }

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

    /// `.coherent/inbox`: live records naming `s` as successor, notes included, oldest first.
    pub fn inbox(&self, s: &SessionInfo) -> Vec<RecordJson> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let sh = shard.lock();
            for e in sh.values() {
                if let Some(r) = e.live().filter(|r| r.successor.name == s.name) {
                    out.push((r.id, r.to_json(e.version)));
                }
            }
        }
        out.sort_by_key(|(id, _)| *id);
        out.into_iter().map(|(_, r)| r).collect()
    }

    /// `.coherent/why`: the text of the last denial or refusal of `s`.
    pub fn why(&self, s: &SessionInfo) -> Option<String> {
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
            .map(|s| session_json(s))
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
        (st, r)
    }

    /// The seq of the last event applied.
    pub fn last_seq(&self) -> u64 {
        self.applied.load(Ordering::SeqCst)
    }
}

/// `handoff_ended`: this giver's transfer of `p` at this version to this successor already
/// ended by decline or withdraw (until the version moves or the record is evicted).
fn ended_before(e: &Entry, p: &str, s: &Session, succ: &Session) -> Result<(), Refusal> {
    if e.records.iter().any(|r| {
        r.giver.name == s.name
            && r.successor.name == succ.name
            && r.version_at_transfer == e.version
            && matches!(r.status, Status::Declined | Status::Withdrawn)
    }) {
        return Err(Refusal::new(
            Reason::HandoffEnded,
            format!(
                "the handoff of {p} at v{} to {} already ended (declined or withdrawn); it can be sent again once {p} changes",
                e.version,
                succ.display()
            ),
        ));
    }
    Ok(())
}

fn no_such_path(p: &str) -> Refusal {
    Refusal::new(
        Reason::NoSuchPath,
        format!("{p} does not exist in this volume (or the volume has not seen it yet)"),
    )
}

fn session_json(s: &SessionInfo) -> SessionJson {
    SessionJson {
        name: s.name.clone(),
        agent: s.agent_id,
        short_id: s.short_id(),
        via: s.via.clone(),
        attributed: s.is_attributed(),
    }
}
