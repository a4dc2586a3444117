//! The data of the engine: holds, statuses, records, events and the durable state, all
//! serde-serializable with the wire names of docs/design.md#holds, docs/design.md#handoff and
//! docs/design.md#state-log.

use super::time::Timestamp;
use crate::error::Reason;
use crate::identity::{Session, SessionInfo, Via};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A per-(session, path) hold, after MESI (docs/design.md#holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Hold {
    S,
    E,
    M,
    I,
}

/// The status of a transfer record: with the reason codes, since a refusal names it.
pub use crate::control::Until;
pub use crate::error::Status;

/// `--stale`: what a write from an outdated view meets (docs/design.md#holds,
/// docs/versions-and-holds.md#the-stale-write-guard). Every mode but `off` refuses a late giver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StaleMode {
    /// Nothing is checked or logged.
    Off,
    /// Allowed, with a `stale_write` event.
    Warn,
    /// The default: a stale write that can overwrite (an open for write without
    /// `O_APPEND`, a truncate, a rename onto the path) is refused `stale_view`; a stale
    /// append is allowed with `stale_write`.
    #[default]
    Guard,
    /// Every stale write is refused `stale_view`, appends too.
    Strict,
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub stale: StaleMode,
    /// Ended records are evicted this long after their last change (`--evict-after`).
    pub evict_after: std::time::Duration,
    /// `--host-id` with a coordinator: events of other hosts are skipped at replay.
    pub host: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            stale: StaleMode::default(),
            evict_after: std::time::Duration::from_secs(24 * 3600),
            host: None,
        }
    }
}

/// What this host's backing file looked like when the volume last counted it: (ino,
/// ctime, mtime, size) from `fstat` (docs/design.md#versions). A different stamp at the next open
/// means something changed behind the volume's back, maybe only metadata: the content check
/// ([`Print`]) decides whether it is a change. Local to one host's copy: never shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Stamp {
    pub ino: u64,
    pub ctime_ns: i64,
    pub size: u64,
    /// 0 in stamps logged before mtimes were kept: such a stamp never passes the mtime
    /// check (a difference counts as a change, as it did then).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub mtime_ns: i64,
}

/// A portable fingerprint of a file's content (docs/versions-and-holds.md#content): its size
/// and a BLAKE3 digest of its bytes (of its target, for a symlink). Equal on every host whose
/// copy holds the same bytes, whatever its inode or times, so it is what hosts share.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Print {
    pub size: u64,
    #[serde(with = "hex32")]
    pub digest: [u8; 32],
}

impl std::fmt::Debug for Print {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Print({} bytes, {})",
            self.size,
            hex32::encode(&self.digest)
        )
    }
}

/// A digest as 64 lowercase hex digits on the wire.
/// A BLAKE3 digest written as 64 hex digits: the one codec of the fingerprints and of the
/// history's blobs.
pub mod hex32 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn encode(d: &[u8; 32]) -> String {
        use std::fmt::Write as _;
        d.iter().fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }

    /// The 32 bytes of `s` (None: not 64 hex digits).
    pub fn decode(s: &str) -> Option<[u8; 32]> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let nib = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = nib(b[2 * i])? << 4 | nib(b[2 * i + 1])?;
        }
        Some(out)
    }

    pub fn serialize<S: Serializer>(d: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = String::deserialize(d)?;
        decode(&s).ok_or_else(|| D::Error::custom("a digest is 64 hex digits"))
    }
}

/// The write routes of docs/design.md#write-routes; named in `denied` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// `open`/`create` with `O_WRONLY`, `O_RDWR`, `O_TRUNC` or `O_APPEND`.
    OpenWrite,
    /// `truncate`/`setattr` changing size, mode, owner or times.
    Setattr,
    RenameSource,
    RenameTarget,
    Unlink,
    Link,
    Symlink,
    Mknod,
    Setxattr,
    Removexattr,
}

/// What made a commit (docs/design.md#versions); in `commit` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitOp {
    /// A write handle flushed or released with a changed file (a create on that handle
    /// included).
    Write,
    Truncate,
    /// `rename` onto the path (the event's `from` names the source).
    Rename,
    /// The source of a rename: the path records a removal.
    RenameAway,
    /// A directory rename: every path under `from` moves under `path` with its version.
    RenameDir,
    Unlink,
    Link,
    Symlink,
    Mknod,
}

/// The event names of docs/design.md#state-log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    SessionSeen,
    Acquire,
    Commit,
    Release,
    Reclaim,
    StaleWrite,
    Denied,
    Transfer,
    HandoffSeen,
    Accept,
    Decline,
    Withdraw,
    Completed,
    Overtaken,
    Superseded,
    Evict,
    ExternalChange,
    /// With a coordinator: other hosts' events this host's log may lack (`from_rev` to
    /// `rev`, etcd revisions), because etcd's history was compacted before this host read
    /// them. Changes no state.
    EventsMissed,
}

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One line of the state log (docs/design.md#state-log): `seq`, `ts`, `event`, `path`, `session`,
/// `agent` always, then the fields of that event. Replaying the events in order rebuilds the
/// durable state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub ts: Timestamp,
    pub event: EventKind,
    pub path: Option<String>,
    pub session: Option<String>,
    pub agent: Option<Uuid>,
    /// `session_seen`: how the session was resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<Via>,
    /// `session_seen`: the uid that owns the session name from then on (docs/design.md#sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The path's version after the event (commit, external_change, transfer, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<CommitOp>,
    /// A commit that removed the path (unlink, rename away): it is now a tombstone.
    #[serde(default, skip_serializing_if = "is_false")]
    pub removed: bool,
    /// Rename source (for `op` rename / rename_dir).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<Stamp>,
    /// `transfer`: the fingerprint of the handed content; a commit or `external_change`:
    /// of the content it made, when the volume took one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub print: Option<Print>,
    /// The record an event is about: the `seq` of its `transfer` event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub giver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successor_agent: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// `overtaken`: the bystander. `stale_write` and a `denied` of reason `stale_view`:
    /// the session whose commit made the current version (who wrote since the view).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counterparty: Option<String>,
    /// `stale_write` and a `denied` of reason `stale_view`: the writer's view (for a
    /// handle's commit, the version the handle was opened at).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<u64>,
    /// `denied`: the reason code and the route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
    /// `accept` of an offer to anyone: the accepting session claimed it and is now its
    /// successor (`successor` names it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub claimed: bool,
    /// With a coordinator (several hosts): the host whose volume made the event. A host
    /// replays only its own events; the others' are in its log to be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// With a coordinator: the etcd revision another host's event was published at (so a
    /// restarted host knows where its log of the others stops); `events_missed`: the last
    /// revision of the gap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rev: Option<i64>,
    /// `events_missed`: the first revision of the gap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_rev: Option<i64>,
}

impl Event {
    /// A `denied` event: `s`'s write to `path` by `route` refused for `reason` (the
    /// caller adds the record, version, ... it knows).
    pub fn denied(
        reason: Reason,
        route: Route,
        now: Timestamp,
        path: &str,
        s: &SessionInfo,
    ) -> Self {
        let mut ev = Event::new(EventKind::Denied, now, Some(path), Some(s));
        ev.reason = Some(reason);
        ev.route = Some(route);
        ev
    }

    /// An event with its header filled and every field empty; `seq` is set by the sink.
    pub fn new(
        event: EventKind,
        ts: Timestamp,
        path: Option<&str>,
        session: Option<&SessionInfo>,
    ) -> Self {
        Event {
            seq: 0,
            ts,
            event,
            path: path.map(str::to_string),
            session: session.map(|s| s.name.clone()),
            agent: session.map(|s| s.agent_id),
            via: None,
            uid: None,
            version: None,
            op: None,
            removed: false,
            from: None,
            stamp: None,
            print: None,
            record: None,
            giver: None,
            successor: None,
            successor_agent: None,
            hold: None,
            note: None,
            counterparty: None,
            view: None,
            reason: None,
            route: None,
            claimed: false,
            host: None,
            rev: None,
            from_rev: None,
        }
    }
}

/// A transfer record (docs/design.md#handoff). `id` is the `seq` of its `transfer` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub id: u64,
    pub path: String,
    #[serde(with = "arc_session")]
    pub giver: Session,
    #[serde(with = "arc_session")]
    pub successor: Session,
    pub version_at_transfer: u64,
    pub hold: Hold,
    pub status: Status,
    pub counterparty: Option<String>,
    pub note: Option<String>,
    pub created: Timestamp,
    pub updated: Timestamp,
    /// The successor has opened the path since the transfer (`handoff_seen` was logged).
    pub seen: bool,
    /// Made by `transfer --to any`: `successor` is the placeholder `any` until a session
    /// claims it by `accept`, then that session.
    #[serde(default, skip_serializing_if = "is_false")]
    pub offer: bool,
    /// The fingerprint of the content handed on (at `version_at_transfer`): while the
    /// record is live, only content that differs from it is a change behind the volume's
    /// back (None: a record made before fingerprints were taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub print: Option<Print>,
}

impl Record {
    /// Live: status pending/completed/overtaken and the version has not moved.
    pub fn is_live(&self, current_version: u64) -> bool {
        self.status.may_be_live() && self.version_at_transfer == current_version
    }

    /// An offer to anyone that no session has claimed yet.
    pub fn unclaimed(&self) -> bool {
        self.offer && self.successor.name == crate::names::ANY
    }

    pub fn to_json(&self, current_version: u64) -> RecordJson {
        RecordJson {
            path: self.path.clone(),
            giver: self.giver.name.clone(),
            giver_agent: self.giver.agent_id,
            successor: self.successor.name.clone(),
            successor_agent: self.successor.agent_id,
            version_at_transfer: self.version_at_transfer,
            hold: self.hold,
            status: self.status,
            counterparty: self.counterparty.clone(),
            note: self.note.clone(),
            created: self.created,
            updated: self.updated,
            live: self.is_live(current_version),
            offer: self.offer,
            claimed_by: (self.offer && !self.unclaimed()).then(|| self.successor.name.clone()),
        }
    }
}

/// A record as the control surface shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordJson {
    pub path: String,
    pub giver: String,
    pub giver_agent: Uuid,
    pub successor: String,
    pub successor_agent: Uuid,
    pub version_at_transfer: u64,
    pub hold: Hold,
    pub status: Status,
    pub counterparty: Option<String>,
    pub note: Option<String>,
    pub created: Timestamp,
    pub updated: Timestamp,
    pub live: bool,
    /// An offer to anyone (`transfer --to any`); `successor` is `any` until claimed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub offer: bool,
    /// The session that claimed the offer (it is then the successor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_by: Option<String>,
}

/// How a session stands to a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Giver,
    Successor,
    Bystander,
}

/// `user.coherent.handoff`: the live record of a path plus the reader's role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffView {
    #[serde(flatten)]
    pub record: RecordJson,
    pub role: Role,
}

/// The durable part of one path: what the log rebuilds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathState {
    pub version: u64,
    /// False for a tombstone (removed; recreating it continues the numbering).
    pub exists: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<Stamp>,
}

/// Everything the journal must rebuild: versions and tombstones, records, known sessions
/// and the seq counter. Holds and views are memory only (docs/design.md#state-log). Sorted, so two
/// states compare and serialize identically.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DurableState {
    /// The seq of the last event applied.
    pub seq: u64,
    pub paths: std::collections::BTreeMap<String, PathState>,
    /// All records (live and ended, not yet evicted), by (path, id).
    pub records: Vec<Record>,
    pub sessions: std::collections::BTreeMap<String, SessionInfo>,
    /// The uid owning each session name (docs/design.md#sessions: the first uid that showed it).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub owners: std::collections::BTreeMap<String, u32>,
    /// With a coordinator: the newest etcd revision of the other hosts' events in the log.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub peer_rev: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A known session as `status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionJson {
    pub name: String,
    pub agent: Uuid,
    pub short_id: String,
    pub via: Via,
    pub attributed: bool,
    /// The uid the session belongs to, where known (`status`): a hook uses it to say whose
    /// note it quotes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

/// Counts in `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Counts {
    pub sessions: usize,
    pub paths: usize,
    pub live: usize,
    pub ended: usize,
}

/// `status` / `.coherent/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Set for `status PATH`: that path's version (None if never seen or removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    pub sessions: Vec<SessionJson>,
    pub live: Vec<RecordJson>,
    pub ended: Vec<RecordJson>,
    pub counts: Counts,
}

/// The reply of a verb: the records it touched (for `register`, none) and, for
/// `register`, the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerbReply {
    pub verb: String,
    pub records: Vec<RecordJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionJson>,
}

/// Outcome of an allowed open for write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    pub version: u64,
    /// The write was stale and allowed with a `stale_write` event (`--stale warn`, or an
    /// append under `guard`).
    pub stale: bool,
    /// The version the session last read, wrote or committed (None: a blind write).
    pub view: Option<u64>,
}

/// Serde for `Arc<SessionInfo>` without serde's `rc` feature.
mod arc_session {
    use crate::identity::{Session, SessionInfo};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::sync::Arc;

    pub fn serialize<S: Serializer>(s: &Session, ser: S) -> Result<S::Ok, S::Error> {
        SessionInfo::serialize(s, ser)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Session, D::Error> {
        SessionInfo::deserialize(d).map(Arc::new)
    }
}

/// Where the record a `wait` follows stands.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitState {
    /// The state waited for is reached.
    Reached(RecordJson),
    /// Not yet: the record is still `pending`.
    Pending(RecordJson),
}
