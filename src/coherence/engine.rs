//! The engine's state, its locks, and the one function that applies an event (live and
//! in replay). Its other methods: `ops` (what the mount reports, the fence decisions),
//! `verbs`, `queries`, and `engine/sessions`; the event sinks are in `engine/sink`.
//!
//! Locking. Paths live in `SHARDS` shards, each a `parking_lot::Mutex` over a map from
//! path to [`Entry`] (version, holds, records), so operations on different paths rarely
//! share a lock. Lock order, always:
//!   1. shard mutexes, in ascending shard index (multi-path verbs, renames, snapshots);
//!   2. `sessions` (RwLock), then `owners` (RwLock);
//!   3. `why` (Mutex), or `names` (RwLock: held for a lookup or an insert, nothing inside);
//!   4. the sink's own locks (inside `EventSink::append`).
//!
//! Every event is appended to the sink while the lock(s) guarding what it changes are held,
//! and applied right after with the same code that replays the log ([`Engine::replay`]),
//! so the log order is the application order for every path, and the log rebuilds exactly
//! the live state.

use super::time::Timestamp;
use super::types::*;
use crate::error::{Reason, Refusal};
use crate::identity::{Session, SessionInfo, Via};
use crate::mem::push_tight;
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod sessions;
mod sink;

pub use sink::{EventSink, MemorySink};

const SHARDS: usize = 64;

/// Largest note a transfer accepts: a wire limit, checked early by the request parser.
pub use crate::control::MAX_NOTE;

/// The name commits found behind the volume's back are attributed to (docs/design.md#versions).
pub const EXTERNAL: &str = "external";

/// One session's stake in one path: memory only (docs/design.md#state-log).
#[derive(Debug, Clone)]
pub(super) struct Holder {
    pub(super) session: Session,
    pub(super) hold: Hold,
    /// The version this session last read, wrote or committed.
    pub(super) view: Option<u64>,
    /// Open write handles.
    pub(super) writers: u32,
    /// While `writers` > 0: the version the handles' content builds on (the version at
    /// the first acquire, then this session's own commits). A commit over a newer version
    /// made by someone else while the handles were open is counted (`stale_write`).
    pub(super) base: Option<u64>,
}

/// One path.
#[derive(Debug, Default, Clone)]
pub(super) struct Entry {
    /// 0: being created through the volume, not yet committed.
    pub(super) version: u64,
    pub(super) exists: bool,
    pub(super) stamp: Option<Stamp>,
    /// The stamp of the last logged commit: what a restart knows (`stamp` may be newer,
    /// adopted silently at first sight or by `restamp`).
    pub(super) logged_stamp: Option<Stamp>,
    /// The fingerprint of the content at `version`, when known (taken at a transfer, or
    /// at a commit whose print another host needs), and those of versions taken in from
    /// other hosts since; see [`Entry::current_print`], [`Entry::older_prints`].
    /// Boxed: most paths never have one, and the entry is a row per path.
    pub(super) print: Option<Box<Prints>>,
    /// Some logged event touched this path: it is part of the durable state.
    pub(super) logged: bool,
    pub(super) holders: Vec<Holder>,
    pub(super) records: Vec<Record>,
    /// The session whose commit (or `external`) made the current version, when known:
    /// who wrote since, in a stale writer's refusal.
    /// Shared with every entry the same session wrote last (`EngineState::names`).
    pub(super) last_by: Option<Arc<str>>,
    /// The newest version this host's backing file was seen holding (committed through
    /// this mount, or judged by content to be it). An older version's bytes there after it
    /// are a revert, not a copy that lags (docs/multi-host.md#copies). Memory only: after
    /// a restart an older version's bytes are taken as behind again.
    pub(super) held_here: u64,
}

/// What is known of a path's content, version by version (several hosts).
#[derive(Debug, Default, Clone)]
pub(super) struct Prints {
    /// The current version's.
    pub(super) current: Option<Print>,
    /// Older versions' (as the version moved on here, and as another host published them,
    /// from its history too), newest first, at most [`OLDER_PRINTS`]: a copy the sync brings
    /// one of them lags behind, whether or not a transfer was made at it.
    pub(super) taken_in: Vec<(u64, Print)>,
}

/// How many older versions' fingerprints a path keeps beyond its records' (a sync that
/// lags further than this behind is taken for a change), and a transfer publishes from
/// the giver's history.
pub const OLDER_PRINTS: usize = 8;

impl Entry {
    /// The fingerprint of the content at the current version (None: not known).
    pub(super) fn set_print(&mut self, print: Option<Print>) {
        match (&mut self.print, print) {
            (Some(b), p) => b.current = p,
            (None, Some(p)) => {
                self.print = Some(Box::new(Prints {
                    current: Some(p),
                    taken_in: Vec::new(),
                }))
            }
            (None, None) => {}
        }
    }

    /// The version moves on from `self.version`: its fingerprint, when known, joins the
    /// older ones.
    pub(super) fn version_moved_on(&mut self) {
        let v = self.version;
        if let Some(p) = self.print.as_mut().and_then(|b| b.current.take()) {
            self.keep_older(vec![(v, p)]);
        }
    }

    /// Fingerprints of older versions (below the current one), kept newest first, at most
    /// [`OLDER_PRINTS`]; one already known for a version is replaced.
    pub(super) fn know_older(&mut self, prints: impl IntoIterator<Item = (u64, Print)>) {
        let below = self.version;
        self.keep_older(prints.into_iter().filter(|(v, _)| *v < below).collect());
    }

    fn keep_older(&mut self, prints: Vec<(u64, Print)>) {
        if prints.is_empty() {
            return;
        }
        let b = self.print.get_or_insert_with(Default::default);
        for (v, p) in prints {
            b.taken_in.retain(|(w, _)| *w != v);
            b.taken_in.push((v, p));
        }
        b.taken_in.sort_by_key(|(v, _)| std::cmp::Reverse(*v));
        b.taken_in.truncate(OLDER_PRINTS);
    }

    /// The older versions' fingerprints kept beyond the records' (to publish).
    pub(super) fn older_kept(&self) -> Vec<(u64, Print)> {
        self.print
            .as_ref()
            .map(|b| b.taken_in.clone())
            .unwrap_or_default()
    }

    pub(super) fn live(&self) -> Option<&Record> {
        self.records.iter().find(|r| r.is_live(self.version))
    }

    pub(super) fn holder(&self, name: &str) -> Option<&Holder> {
        self.holders.iter().find(|h| h.session.name == name)
    }

    pub(super) fn holder_mut(&mut self, s: &Session) -> &mut Holder {
        let i = match self.holders.iter().position(|h| h.session.name == s.name) {
            Some(i) => i,
            None => {
                push_tight(
                    &mut self.holders,
                    Holder {
                        session: s.clone(),
                        hold: Hold::I,
                        view: None,
                        writers: 0,
                        base: None,
                    },
                );
                self.holders.len() - 1
            }
        };
        &mut self.holders[i]
    }

    /// The fingerprint of the content at the current version: the entry's own, or the
    /// one a record handed on at this version carries (it survives a restart).
    pub(super) fn current_print(&self) -> Option<Print> {
        self.print.as_ref().and_then(|b| b.current).or_else(|| {
            self.records
                .iter()
                .filter(|r| r.version_at_transfer == self.version)
                .find_map(|r| r.print)
        })
    }

    /// Fingerprints of older versions of the path known here (their records', and those
    /// taken in from other hosts), newest first: a copy still holding one of them lags
    /// behind (docs/multi-host.md#copies).
    pub(super) fn older_prints(&self) -> impl Iterator<Item = (u64, Print)> + '_ {
        let taken_in = self.print.iter().flat_map(|b| b.taken_in.iter().copied());
        let mut v: Vec<(u64, Print)> = self
            .records
            .iter()
            .filter_map(|r| r.print.map(|p| (r.version_at_transfer, p)))
            .chain(taken_in)
            .filter(|(v, _)| *v < self.version)
            .collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.0));
        v.into_iter()
    }

    pub(super) fn writing(&self) -> bool {
        self.holders.iter().any(|h| h.writers > 0)
    }

    pub(super) fn record_mut(&mut self, id: Option<u64>) -> Option<&mut Record> {
        let id = id?;
        self.records.iter_mut().find(|r| r.id == id)
    }
}

pub(super) type Shard = HashMap<Box<str>, Entry, BuildHasherDefault<PathHasher>>;

/// A fast multiplicative hash for path keys (the maps are local; no untrusted network
/// input chooses them).
#[derive(Default, Clone, Copy)]
pub(super) struct PathHasher(u64);

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
pub(super) fn entry_mut<'a>(sh: &'a mut Shard, path: &str) -> &'a mut Entry {
    if !sh.contains_key(path) {
        sh.insert(path.into(), Entry::default());
    }
    sh.get_mut(path).expect("just inserted")
}

/// What `why` keeps per session: the path the text is about (if one), the text, and when
/// the volume told it.
pub type WhyEntry = (Option<String>, String, Option<Timestamp>);

/// The coherence engine. Cheap to share (`Arc<Engine>`); every method takes `&self`.
/// Its state is shared by every view of it ([`Engine::with_sink`]); a view differs only in
/// where its events go.
pub struct Engine {
    state: Arc<EngineState>,
    pub(super) sink: Arc<dyn EventSink>,
}

impl std::ops::Deref for Engine {
    type Target = EngineState;
    fn deref(&self) -> &EngineState {
        &self.state
    }
}

/// What every view of one engine shares.
pub struct EngineState {
    pub(super) config: Config,
    pub(super) shards: Box<[Mutex<Shard>]>,
    pub(super) sessions: RwLock<HashMap<String, Session, BuildHasherDefault<PathHasher>>>,
    /// Session name → the uid that owns it (docs/design.md#sessions).
    pub(super) owners: RwLock<HashMap<String, u32, BuildHasherDefault<PathHasher>>>,
    /// Per session: its latest refusal or stale write: the path it is about (None: not
    /// about one path), the text, and when the volume told it (None: set by the core
    /// alone, which has no clock of its own here).
    pub(super) why: Mutex<HashMap<String, WhyEntry>>,
    /// The session names entries point to (who committed last), each held once: a name
    /// per path would be a heap string per file of the tree.
    pub(super) names: RwLock<crate::mem::Names<BuildHasherDefault<PathHasher>>>,
    pub(super) applied: AtomicU64,
    /// With a coordinator: the newest etcd revision of the other hosts' events (or of a
    /// gap named) in the log: where a restarted host resumes reading them.
    pub(super) peer_rev: std::sync::atomic::AtomicI64,
    /// Bumped by every event that can change a record (`wait`).
    pub(super) changes: super::changes::Changes,
    /// With a coordinator: the next record id (0: a record's id is its transfer's seq).
    /// Several hosts make records, so ids come from the coordinator's revisions.
    pub(super) record_ids: AtomicU64,
    /// How many records (live or ended) the engine holds: a free "are there any?".
    pub(super) record_count: AtomicU64,
}

impl EngineState {
    /// The one shared copy of the session name `s`.
    pub(super) fn name(&self, s: &str) -> Arc<str> {
        if let Some(a) = self.names.read().find(s) {
            return a;
        }
        self.names.write().get(s)
    }
}

pub(super) fn shard_of(path: &str) -> usize {
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

pub(super) fn bad_path(p: &str) -> Refusal {
    Refusal::new(
        Reason::BadRequest,
        format!(
            "{} is not a path inside the volume",
            crate::names::quote_for_message(p)
        ),
    )
}

/// The deny text of docs/design.md#handoff (for an unclaimed offer to anyone, its three ways out).
pub fn deny_text(path: &str, successor: &SessionInfo, version: u64) -> String {
    if successor.name == crate::names::ANY {
        return format!(
            "write denied: you offered {path_q} to any session at v{version}, so this session \
             can no longer write it. The handoff ends when a session claims it (coherent \
             accept {path_w}) and writes it, when another session writes it first, or when you \
             withdraw it (coherent withdraw {path_w}). Stop and tell your user that {path_q} was \
             offered on. Retrying will be denied the same way.",
            path_q = crate::names::display_name(path),
            path_w = crate::names::shell_word(path)
        );
    }
    let id = successor.short_id();
    format!(
        "write denied: you handed {path_q} to agent {id} ({name}) at v{version}, so this session \
         can no longer write it. The handoff ends when {id} writes {path_q}, when {id} declines \
         it, or when you withdraw it (coherent withdraw {path_w}). Stop and tell your user that \
         {path_q} was handed off. Retrying will be denied the same way.",
        name = successor.name,
        path_q = crate::names::display_name(path),
        path_w = crate::names::shell_word(path)
    )
}

impl Engine {
    pub fn new(config: Config, sink: Arc<dyn EventSink>) -> Self {
        let state = EngineState {
            config,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            sessions: RwLock::new(HashMap::default()),
            owners: RwLock::new(HashMap::default()),
            why: Mutex::new(HashMap::new()),
            names: RwLock::new(Default::default()),
            applied: AtomicU64::new(0),
            peer_rev: std::sync::atomic::AtomicI64::new(0),
            changes: Default::default(),
            record_ids: AtomicU64::new(0),
            record_count: AtomicU64::new(0),
        };
        Engine {
            state: Arc::new(state),
            sink,
        }
    }

    /// The same engine (one state, the same locks) with its events going to `sink`
    /// instead: a coordinator's step keeps the events its operation made, as values,
    /// until the hosts have agreed on them.
    pub fn with_sink(&self, sink: Arc<dyn EventSink>) -> Engine {
        Engine {
            state: self.state.clone(),
            sink,
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
            e.owners.write().extend(state.owners);
        }
        e.peer_rev.store(state.peer_rev, Ordering::SeqCst);
        for (path, p) in state.paths {
            let entry = Entry {
                version: p.version,
                exists: p.exists,
                logged_stamp: p.stamp,
                stamp: p.stamp,
                print: None,
                logged: true,
                holders: Vec::new(),
                records: Vec::new(),
                // A snapshot does not say who made a version (the log after it does).
                last_by: None,
                // A stamp is this host's copy's: it held that version.
                held_here: if p.exists && p.stamp.is_some() {
                    p.version
                } else {
                    0
                },
            };
            e.shards[shard_of(&path)]
                .lock()
                .insert(path.into_boxed_str(), entry);
        }
        e.record_count
            .store(state.records.len() as u64, Ordering::SeqCst);
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

    // ----- plumbing -----------------------------------------------------------------

    pub(super) fn lock_one(&self, path: &str) -> MutexGuard<'_, Shard> {
        self.shards[shard_of(path)].lock()
    }

    /// Locks the shards of `paths` in ascending order; returns (shard index, guard) pairs.
    pub(super) fn lock_many<'a>(&'a self, paths: &[&str]) -> Vec<(usize, MutexGuard<'a, Shard>)> {
        let mut idx: Vec<usize> = paths.iter().map(|p| shard_of(p)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| (i, self.shards[i].lock()))
            .collect()
    }

    pub(super) fn lock_all(&self) -> Vec<MutexGuard<'_, Shard>> {
        self.shards.iter().map(|s| s.lock()).collect()
    }

    /// Appends `ev` and applies it to `entry` (which the caller holds locked).
    pub(super) fn emit(&self, entry: &mut Entry, mut ev: Event) -> u64 {
        self.sink.append(&mut ev);
        self.applied.fetch_max(ev.seq, Ordering::SeqCst);
        self.apply_entry(entry, &ev, true);
        if super::changes::changes_records(ev.event) {
            self.changes.bump();
        }
        ev.seq
    }

    /// What `.coherent/why` shows `s` from now on: its latest refusal or stale write
    /// (about `path`, if one), told at `now` (docs/design.md#handoff: the latest one wins).
    pub fn tell(&self, s: &SessionInfo, path: Option<&str>, text: &str, now: Timestamp) {
        self.keep_why(s, path.map(str::to_string), text.to_string(), Some(now));
    }

    /// A refusal made by the engine: kept for `why` (without a time: the volume says it
    /// again, with one, when it reaches the caller).
    pub(super) fn refuse(&self, s: &SessionInfo, r: Refusal) -> Refusal {
        self.keep_why(s, r.path.clone(), r.message.clone(), None);
        r
    }

    /// The one writer of `why`.
    fn keep_why(&self, s: &SessionInfo, path: Option<String>, text: String, at: Option<Timestamp>) {
        self.why.lock().insert(s.name.clone(), (path, text, at));
    }

    /// The state change of one logged event on one path: shared by the live path
    /// (`emit`, `live`) and the replay of the log, so both build the same durable state.
    /// Holds and views are memory only: a replay creates none (docs/design.md#state-log: after a
    /// restart no session has a view).
    pub(super) fn apply_entry(&self, e: &mut Entry, ev: &Event, live: bool) {
        let who = ev.session.as_deref().unwrap_or("");
        match ev.event {
            EventKind::SessionSeen
            | EventKind::StaleWrite
            | EventKind::Denied
            | EventKind::EventsMissed => {}
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
                if h.writers == 0 {
                    h.base = Some(e.version);
                }
                h.writers += 1;
                h.hold = Hold::E;
            }
            EventKind::Release => {
                let v = e.version;
                if let Some(h) = e.holders.iter_mut().find(|h| h.session.name == who) {
                    h.writers = 0;
                    h.base = None;
                    h.hold = if h.view == Some(v) { Hold::S } else { Hold::I };
                }
            }
            EventKind::Reclaim => e.holders.retain(|h| h.session.name != who),
            EventKind::Commit | EventKind::ExternalChange => {
                let v = ev.version.unwrap_or(e.version + 1);
                if v > e.version && self.copies() {
                    // Published with the path: a host that takes in a later version
                    // directly still knows this one's bytes as behind.
                    e.version_moved_on();
                }
                e.version = v;
                e.exists = !ev.removed;
                e.stamp = ev.stamp;
                e.logged_stamp = ev.stamp;
                e.set_print(ev.print);
                e.logged = true;
                if e.last_by.as_deref() != ev.session.as_deref() {
                    e.last_by = ev.session.as_deref().map(|s| self.name(s));
                }
                if !ev.removed {
                    e.held_here = e.held_here.max(v);
                }
                for h in &mut e.holders {
                    if ev.event == EventKind::Commit && h.session.name == who {
                        h.hold = if h.writers > 0 { Hold::E } else { Hold::M };
                        h.view = Some(v);
                        if h.writers > 0 {
                            h.base = Some(v);
                        }
                    } else {
                        h.hold = Hold::I;
                    }
                }
                if live
                    && ev.event == EventKind::Commit
                    && !e.holders.iter().any(|h| h.session.name == who)
                {
                    let s = self.known(who, ev.agent);
                    push_tight(
                        &mut e.holders,
                        Holder {
                            session: s,
                            hold: Hold::M,
                            view: Some(v),
                            writers: 0,
                            base: None,
                        },
                    );
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
                if ev.print.is_some() && version == e.version {
                    e.set_print(ev.print);
                }
                let giver = self.known(who, ev.agent);
                let succ_name = ev.successor.as_deref().unwrap_or("");
                let offer = succ_name == crate::names::ANY;
                let successor = self.known(succ_name, ev.successor_agent);
                if let Some(h) = e.holders.iter_mut().find(|h| h.session.name == who) {
                    h.hold = Hold::I;
                }
                self.record_count.fetch_add(1, Ordering::SeqCst);
                e.records.push(Record {
                    // A coordinated transfer carries the id it was given (`record`).
                    id: ev.record.unwrap_or(ev.seq),
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
                    offer,
                    print: ev.print,
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
                let claimer = (ev.event == EventKind::Accept && ev.claimed)
                    .then(|| self.known(who, ev.agent));
                if let Some(r) = e.record_mut(ev.record) {
                    if let Some(c) = claimer {
                        // The first accept of an offer to anyone makes its successor.
                        r.successor = c;
                    }
                    r.status = status;
                    r.updated = ev.ts;
                    // `counterparty` belongs to `overtaken` records only.
                    r.counterparty = if ev.event == EventKind::Overtaken {
                        ev.counterparty.clone()
                    } else {
                        None
                    };
                }
            }
            EventKind::Evict => {
                if let Some(id) = ev.record {
                    let before = e.records.len();
                    e.records.retain(|r| r.id != id);
                    let gone = (before - e.records.len()) as u64;
                    self.record_count.fetch_sub(gone, Ordering::SeqCst);
                }
            }
        }
    }

    /// Moves every path under directory `from` to under `to` (a logged `rename_dir`).
    /// Caller holds every shard.
    pub(super) fn apply_rename_dir(
        &self,
        shards: &mut [MutexGuard<'_, Shard>],
        from: &str,
        to: &str,
    ) {
        let pre = format!("{from}/");
        let mut moved = Vec::new();
        for sh in shards.iter_mut() {
            let keys: Vec<Box<str>> = sh.keys().filter(|k| k.starts_with(&pre)).cloned().collect();
            for k in keys {
                let e = sh.remove(&k).expect("key just listed");
                moved.push((format!("{to}/{}", &k[pre.len()..]), e));
            }
        }
        // The log knows only logged paths: a path merely seen (first sight, version 1) or
        // acquired is absent from a replay (or from a snapshot). So what lands where may
        // depend only on logged entries, and a move never makes an entry logged;
        // otherwise the live state and the rebuilt one part ways.
        for (path, mut e) in moved {
            let sh = &mut shards[shard_of(&path)];
            if let Some(mut old) = sh.remove(path.as_str()) {
                match (e.logged, old.logged) {
                    (true, true) => {
                        // Only a tombstone can sit under an empty target directory; keep
                        // the numbering of that path increasing.
                        if old.version >= e.version {
                            e.version = old.version + 1;
                        }
                    }
                    (false, true) => {
                        // The logged target stays as the log says; the next open finds
                        // the moved file's stamp and counts it (`external_change`), or
                        // the writer's commit does. Open write handles stay counted so
                        // their changes are not taken for external ones.
                        for h in e.holders.drain(..) {
                            let o = old.holder_mut(&h.session);
                            o.writers += h.writers;
                            if o.writers > 0 {
                                o.hold = Hold::E;
                            }
                        }
                        e = old;
                    }
                    (_, false) => {}
                }
            }
            for r in &mut e.records {
                r.path = path.clone();
            }
            sh.insert(path.into_boxed_str(), e);
        }
    }

    /// With a coordinator: the newest etcd revision of the other hosts' events in the log.
    pub fn peer_rev(&self) -> i64 {
        self.peer_rev.load(Ordering::SeqCst)
    }

    /// Another host's event at etcd revision `rev` (or a gap up to it) is in the log now.
    pub fn note_peer_rev(&self, rev: i64) {
        self.peer_rev.fetch_max(rev, Ordering::SeqCst);
    }

    /// Applies one event read back from the log (recovery). Events must come in log order.
    pub fn replay(&self, ev: &Event) {
        self.applied.fetch_max(ev.seq, Ordering::SeqCst);
        if let Some(rev) = ev.rev {
            self.note_peer_rev(rev);
        }
        if ev.event == EventKind::EventsMissed || (ev.host.is_some() && ev.host != self.config.host)
        {
            // Another host's event, kept to be read (its state comes from the coordinator),
            // or a gap in them named.
            return;
        }
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
                let mut sessions = self.sessions.write();
                if let Some(uid) = ev.uid {
                    self.owners.write().entry(name.clone()).or_insert(uid);
                }
                sessions.entry(name).or_insert_with(|| Arc::new(info));
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
}

pub(super) fn session_json(s: &SessionInfo) -> SessionJson {
    SessionJson {
        name: s.name.clone(),
        agent: s.agent_id,
        short_id: s.short_id(),
        via: s.via.clone(),
        attributed: s.is_attributed(),
        uid: None,
    }
}
#[cfg(test)]
mod row_size {
    /// An entry is held for every path the volume has seen: a field added here is paid
    /// for by every file of the tree (docs/speed.md#what-grows-with-the-tree-per-path).
    #[test]
    fn an_entry_and_a_holder_stay_small() {
        assert!(std::mem::size_of::<super::Entry>() <= 176);
        assert!(std::mem::size_of::<super::Holder>() <= 48);
    }
}
