//! Model test: random histories of 3 sessions and the unattributed `uid:0` over 3 paths, run on
//! the engine and on an independent model of docs/design.md (#versions, #holds, #handoff)
//! written here from the text (not from the engine): versions, holds and views, transfer
//! records with their statuses (the table of docs/design.md#handoff as data), and the fence
//! computed from the model's records. After every step the engine must agree with the model on
//! every verb's result (ok, or the reason code), every version, every hold, every record
//! (status, counterparty, liveness) and the fence of every (session, path); and its log must
//! rebuild its state.

use crate::core_common;
use coherent::coherence::*;
use coherent::error::Reason;
use coherent::identity::Session;
use core_common::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

// Contract points of docs/design.md#handoff the model holds the engine to (issues 13 and 20):
// - an exact re-send of a transfer whose record ended answers `handoff_ended`, even
//   before the giver has read the file again (the ended check comes first);
// - while a record is live its status follows the latest event: the successor's acquire,
//   commit or `accept` make it `completed` (counterparty cleared), a bystander's acquire
//   or commit `overtaken` (`counterparty` names the latest bystander);
// - `decline` and `withdraw` end a live record whatever its status; `accept` of a
//   `completed` record answers it unchanged;
// - a verb on a path with no live record answers `handoff_not_live`;
// - an offer to anyone (`transfer --to any`) is claimed by the first `accept` of anyone
//   but its giver; until then `decline` is `handoff_not_successor`.

const PATHS: [&str; 4] = ["a.md", "b.md", "d/c.md", "new.md"];
/// The paths that exist when the volume starts (the others are created through it, or
/// appear behind its back).
const EXISTING: usize = 3;
const NAMES: [&str; 4] = ["alice", "bob", "carol", "uid:0"];
/// Index of the unattributed session in `NAMES`.
const UNATTRIBUTED: usize = 3;
/// A transfer's successor index meaning `--to any` (an offer to anyone).
const ANY: usize = 4;
/// What the model calls a change behind the volume's back (docs/design.md#versions).
const EXTERNAL: &str = "external";
const HOUR_MS: i64 = 3_600_000;
/// `--evict-after` of the engine's default config, in hours.
const EVICT_HOURS: u64 = 24;

#[derive(Debug, Clone)]
enum Op {
    Read(usize, usize),
    /// A handle opened for write, written, flushed, closed.
    Write(usize, usize),
    /// A handle opened for write and closed unchanged.
    OpenClose(usize, usize),
    /// A handle opened for write and kept open.
    Acquire(usize, usize),
    /// A kept handle closed, after a change (`true`) or not.
    Close(usize, usize, bool),
    Unlink(usize, usize),
    Rename(usize, usize, usize),
    Transfer(usize, Vec<usize>, usize),
    Accept(usize, usize),
    Decline(usize, usize),
    Withdraw(usize, usize),
    /// A metadata change through the volume (chmod, utimes): not a commit; the volume
    /// keeps the file's new stamp, and the next open finds the file as it was told.
    Metadata(usize),
    /// A write whose file the volume could not stat afterwards (no stamp).
    WriteUnstamped(usize, usize),
    /// A change behind the volume's back: the file changed or appeared (`true`) or
    /// vanished.
    External(usize, bool),
    /// Hours pass.
    Advance(u64),
    Evict,
    Gone(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0usize..4;
    let p = 0usize..PATHS.len();
    prop_oneof![
        3 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Read(s, p)),
        3 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Write(s, p)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::OpenClose(s, p)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Acquire(s, p)),
        1 => (s.clone(), p.clone(), any::<bool>()).prop_map(|(s, p, c)| Op::Close(s, p, c)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Unlink(s, p)),
        1 => (s.clone(), p.clone(), p.clone()).prop_map(|(s, a, b)| Op::Rename(s, a, b)),
        4 => (s.clone(), prop::collection::vec(p.clone(), 1..3), 0usize..5)
            .prop_map(|(s, ps, to)| Op::Transfer(s, ps, to)),
        2 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Accept(s, p)),
        2 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Decline(s, p)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Withdraw(s, p)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::WriteUnstamped(s, p)),
        1 => p.clone().prop_map(Op::Metadata),
        2 => (p.clone(), any::<bool>()).prop_map(|(p, present)| Op::External(p, present)),
        1 => (1u64..30).prop_map(Op::Advance),
        1 => Just(Op::Evict),
        1 => s.prop_map(Op::Gone),
    ]
}

// ----- the model ------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MStatus {
    Pending,
    Completed,
    Overtaken,
    Declined,
    Withdrawn,
    Superseded,
}

impl MStatus {
    /// docs/design.md#handoff: live while pending, completed or overtaken (and the version has
    /// not moved).
    fn may_be_live(self) -> bool {
        matches!(
            self,
            MStatus::Pending | MStatus::Completed | MStatus::Overtaken
        )
    }

    fn wire(self) -> Status {
        match self {
            MStatus::Pending => Status::Pending,
            MStatus::Completed => Status::Completed,
            MStatus::Overtaken => Status::Overtaken,
            MStatus::Declined => Status::Declined,
            MStatus::Withdrawn => Status::Withdrawn,
            MStatus::Superseded => Status::Superseded,
        }
    }
}

/// The table of docs/design.md#handoff as data: what each event does to a record of each status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum REvent {
    SuccessorCommits,
    Accept,
    Decline,
    Withdraw,
    /// A bystander acquires or commits.
    Bystander,
    /// The successor opens the path for writing.
    SuccessorAcquires,
    /// The same giver hands the path to another successor.
    Supersede,
}

/// The status a live record moves to, or None when the event leaves it as it is
/// (docs/design.md#handoff: while live, the status follows the latest event; decline and
/// withdraw end it whatever its status). A record that is not live never changes (the callers
/// only apply events to live records).
fn transition(from: MStatus, ev: REvent) -> Option<MStatus> {
    use MStatus::*;
    use REvent::*;
    const TABLE: &[(MStatus, REvent, MStatus)] = &[
        (Pending, SuccessorCommits, Completed),
        (Overtaken, SuccessorCommits, Completed),
        (Pending, SuccessorAcquires, Completed),
        (Overtaken, SuccessorAcquires, Completed),
        (Pending, Accept, Completed),
        (Overtaken, Accept, Completed),
        (Pending, Decline, Declined),
        (Completed, Decline, Declined),
        (Overtaken, Decline, Declined),
        (Pending, Withdraw, Withdrawn),
        (Completed, Withdraw, Withdrawn),
        (Overtaken, Withdraw, Withdrawn),
        (Pending, Bystander, Overtaken),
        (Completed, Bystander, Overtaken),
        (Pending, Supersede, Superseded),
        (Completed, Supersede, Superseded),
        (Overtaken, Supersede, Superseded),
    ];
    if let Some((_, _, to)) = TABLE.iter().find(|(f, e, _)| *f == from && *e == ev) {
        return Some(*to);
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MHold {
    S,
    E,
    M,
    I,
}

#[derive(Debug, Clone, Default)]
struct MHolder {
    hold: Option<MHold>,
    view: Option<u64>,
    writers: u32,
}

#[derive(Debug, Clone)]
struct MRecord {
    path: usize,
    giver: usize,
    /// None: an offer to anyone nobody has claimed yet.
    successor: Option<usize>,
    version_at_transfer: u64,
    hold: MHold,
    status: MStatus,
    counterparty: Option<String>,
    /// The model's hour of the last change.
    updated: u64,
}

#[derive(Debug, Clone, Default)]
struct MPath {
    version: u64,
    exists: bool,
    /// The volume knows what the file looked like at its last commit (the stamp of
    /// docs/design.md#versions).
    stamped: bool,
    holders: BTreeMap<usize, MHolder>,
}

#[derive(Debug, Clone)]
struct Model {
    paths: Vec<MPath>,
    records: Vec<MRecord>,
    hour: u64,
    stale: StaleMode,
    /// Changes counted behind the volume's back (`external_change` events).
    externals: usize,
    /// `overtaken` events: a record overtaken, or its counterparty changed.
    overtakes: usize,
}

/// A predicted result: ok, or any of these reasons (more than one where docs/design.md#handoff
/// leaves the order of two checks open).
type Want = Result<(), Vec<Reason>>;

fn refuse(r: Reason) -> Want {
    Err(vec![r])
}

impl Model {
    fn new(stale: StaleMode) -> Self {
        Model {
            paths: (0..PATHS.len())
                .map(|i| MPath {
                    version: (i < EXISTING) as u64,
                    exists: i < EXISTING,
                    stamped: true,
                    holders: BTreeMap::new(),
                })
                .collect(),
            records: Vec::new(),
            externals: 0,
            overtakes: 0,
            hour: 0,
            stale,
        }
    }

    fn live(&self, p: usize) -> Option<usize> {
        let v = self.paths[p].version;
        self.records
            .iter()
            .position(|r| r.path == p && r.status.may_be_live() && r.version_at_transfer == v)
    }

    /// docs/design.md#handoff: the giver of a live record on `p` is fenced on `p`; nobody else is.
    fn fenced(&self, s: usize, p: usize) -> bool {
        self.live(p).is_some_and(|i| self.records[i].giver == s)
    }

    /// docs/design.md#holds: the late giver: `s` gave a record on `p` that completed and ended (its
    /// successor's version exists) and has not seen that version (its view is at most the
    /// handed one; with no view its write is blind). Every `--stale` but `off`.
    fn late(&self, s: usize, p: usize) -> bool {
        let v = self.paths[p].version;
        let view = self.paths[p].holders.get(&s).and_then(|h| h.view);
        self.stale != StaleMode::Off
            && self.records.iter().any(|r| {
                r.path == p
                    && r.giver == s
                    && r.status == MStatus::Completed
                    && r.version_at_transfer < v
                    && view.is_some_and(|w| w <= r.version_at_transfer)
            })
    }

    /// docs/design.md#holds: a write that can overwrite, from a view older than the version of
    /// an existing file, under `guard` or `strict`.
    fn stale_overwrite(&self, s: usize, p: usize) -> bool {
        let e = &self.paths[p];
        let view = e.holders.get(&s).and_then(|h| h.view);
        (self.stale == StaleMode::Strict || (self.stale == StaleMode::Guard && s != UNATTRIBUTED))
            && e.exists
            && view.is_some_and(|w| w < e.version)
    }

    /// The fence, then the late giver, on one path of a route.
    fn fence(&self, s: usize, p: usize) -> Want {
        if self.fenced(s, p) {
            return refuse(Reason::Fenced);
        }
        if self.late(s, p) {
            return refuse(Reason::StaleView);
        }
        Ok(())
    }

    fn holder(&mut self, s: usize, p: usize) -> &mut MHolder {
        self.paths[p].holders.entry(s).or_default()
    }

    fn apply(&mut self, i: usize, ev: REvent) {
        if let Some(to) = transition(self.records[i].status, ev) {
            self.records[i].status = to;
            self.records[i].updated = self.hour;
            // `counterparty` belongs to `overtaken` records only (docs/design.md#handoff): an
            // overtaken record that is then superseded no longer names one.
            if to != MStatus::Overtaken {
                self.records[i].counterparty = None;
            }
        }
    }

    /// A session or `external` that is neither giver nor successor touched a live record.
    fn bystander(&mut self, by: &str, p: usize) {
        let Some(i) = self.live(p) else { return };
        let r = &self.records[i];
        if NAMES[r.giver] == by || r.successor.is_some_and(|x| NAMES[x] == by) {
            return;
        }
        if r.status == MStatus::Overtaken {
            // the latest bystander is the counterparty
            if r.counterparty.as_deref() != Some(by) {
                self.records[i].counterparty = Some(by.to_string());
                self.records[i].updated = self.hour;
                self.overtakes += 1;
            }
            return;
        }
        let before = r.status;
        self.apply(i, REvent::Bystander);
        if before != MStatus::Overtaken && self.records[i].status == MStatus::Overtaken {
            self.records[i].counterparty = Some(by.to_string());
            self.overtakes += 1;
        }
    }

    /// Open for write (docs/design.md#holds, #write-routes): fence, stale guard, then an `E` hold.
    fn acquire(&mut self, s: usize, p: usize) -> Want {
        self.fence(s, p)?;
        if self.stale_overwrite(s, p) {
            return refuse(Reason::StaleView);
        }
        match self.live(p) {
            Some(i) if self.records[i].successor == Some(s) => {
                self.apply(i, REvent::SuccessorAcquires)
            }
            _ => self.bystander(NAMES[s], p),
        }
        let h = self.holder(s, p);
        h.writers += 1;
        h.hold = Some(MHold::E);
        Ok(())
    }

    /// A commit of `p` by `s` (docs/design.md#versions): `removed` for unlink and rename away.
    fn commit(&mut self, s: usize, p: usize, removed: bool) {
        if let Some(i) = self.live(p) {
            if self.records[i].successor == Some(s) {
                self.apply(i, REvent::SuccessorCommits);
            } else {
                self.bystander(NAMES[s], p);
            }
        }
        let e = &mut self.paths[p];
        e.version += 1;
        e.exists = !removed;
        e.stamped = true;
        let v = e.version;
        for (who, h) in e.holders.iter_mut() {
            if *who != s {
                h.hold = Some(MHold::I);
            }
        }
        let h = self.holder(s, p);
        h.view = Some(v);
        h.hold = Some(if h.writers > 0 { MHold::E } else { MHold::M });
    }

    fn close(&mut self, s: usize, p: usize, committed: bool) {
        let v = self.paths[p].version;
        let Some(h) = self.paths[p].holders.get_mut(&s) else {
            return;
        };
        if h.writers == 0 {
            return;
        }
        h.writers -= 1;
        if h.writers > 0 {
            return;
        }
        let current = h.view == Some(v);
        // docs/design.md#holds: after a commit M (if still current); a close without a change:
        // release.
        h.hold = Some(match (committed, current) {
            (_, false) => MHold::I,
            (true, true) => MHold::M,
            (false, true) => MHold::S,
        });
    }

    fn read(&mut self, s: usize, p: usize) {
        let e = &self.paths[p];
        if !e.exists {
            return;
        }
        let v = e.version;
        let h = self.holder(s, p);
        h.hold = Some(if h.writers > 0 {
            MHold::E
        } else if h.hold == Some(MHold::M) && h.view == Some(v) {
            MHold::M
        } else {
            MHold::S
        });
        h.view = Some(v);
    }

    /// A change behind the volume's back (docs/design.md#versions): a commit by `external`,
    /// unless a handle of the volume is writing the path (its commit counts the change), the
    /// path is a tombstone and still absent, or the volume had no stamp of the file to compare
    /// (it adopts the one it sees). Returns what `observe` answers: the path's version, None
    /// when it is not there.
    fn external(&mut self, p: usize, present: bool) -> Option<u64> {
        let e = &mut self.paths[p];
        if e.holders.values().any(|h| h.writers > 0) {
            return e.exists.then_some(e.version);
        }
        if !present && !e.exists {
            return None;
        }
        if present && e.exists && !e.stamped {
            e.stamped = true;
            return Some(e.version);
        }
        if present && e.version == 0 {
            // first sight of a path the volume never counted: v1, not a change
            // (docs/design.md#versions)
            e.version = 1;
            e.exists = true;
            e.stamped = true;
            return Some(1);
        }
        self.externals += 1;
        self.bystander(EXTERNAL, p);
        let e = &mut self.paths[p];
        e.version += 1;
        e.exists = present;
        e.stamped = true;
        for h in e.holders.values_mut() {
            h.hold = Some(MHold::I);
        }
        present.then_some(e.version)
    }

    /// Every process of `s` is gone: its write handles are reclaimed. Returns how many
    /// paths it was writing.
    fn gone(&mut self, s: usize) -> usize {
        let mut n = 0;
        for e in &mut self.paths {
            if e.holders.get(&s).is_some_and(|h| h.writers > 0) {
                e.holders.remove(&s);
                n += 1;
            }
        }
        n
    }

    /// Ended records older than `--evict-after` go; live ones never. Returns how many.
    fn evict(&mut self) -> usize {
        let before = self.records.len();
        let hour = self.hour;
        let live: Vec<bool> = (0..self.records.len())
            .map(|i| {
                let r = &self.records[i];
                r.status.may_be_live() && r.version_at_transfer == self.paths[r.path].version
            })
            .collect();
        let mut i = 0;
        self.records.retain(|r| {
            let keep = live[i] || hour - r.updated < EVICT_HOURS;
            i += 1;
            keep
        });
        before - self.records.len()
    }

    /// `transfer(paths, to)` by `s` (docs/design.md#handoff): all or nothing, the first refusal
    /// in path order.
    fn transfer(&mut self, s: usize, ps: &[usize], to: usize) -> Want {
        if s == UNATTRIBUTED {
            return refuse(Reason::Unattributed);
        }
        let to = (to != ANY).then_some(to);
        if to == Some(UNATTRIBUTED) {
            return refuse(Reason::HandoffSuccessorUnknown);
        }
        if to == Some(s) {
            return refuse(Reason::HandoffToSelf);
        }
        let mut uniq: Vec<usize> = Vec::new();
        for p in ps {
            if !uniq.contains(p) {
                uniq.push(*p);
            }
        }
        enum Plan {
            Same,
            New(MHold),
            Supersede(usize, MHold),
        }
        let mut plans = Vec::new();
        for &p in &uniq {
            let e = &self.paths[p];
            if !e.exists {
                return refuse(Reason::NoSuchPath);
            }
            let v = e.version;
            let ended = self.records.iter().any(|r| {
                r.path == p
                    && r.giver == s
                    && r.successor == to
                    && r.version_at_transfer == v
                    && matches!(r.status, MStatus::Declined | MStatus::Withdrawn)
            });
            if let Some(i) = self.live(p) {
                let r = &self.records[i];
                if r.giver != s {
                    return refuse(Reason::HandoffOtherHolder);
                }
                if r.successor == to {
                    plans.push((p, Plan::Same));
                    continue;
                }
                if ended {
                    return refuse(Reason::HandoffEnded);
                }
                plans.push((p, Plan::Supersede(i, r.hold)));
                continue;
            }
            // The ended check comes first (docs/design.md#handoff).
            if ended {
                return refuse(Reason::HandoffEnded);
            }
            let h = e.holders.get(&s).cloned().unwrap_or_default();
            if h.writers > 0 {
                return refuse(Reason::HandoffInFlight);
            }
            let hold = match h.hold {
                Some(x @ (MHold::M | MHold::S)) if h.view == Some(v) => x,
                _ => return refuse(Reason::HandoffNotHeld),
            };
            if ended {
                return refuse(Reason::HandoffEnded);
            }
            plans.push((p, Plan::New(hold)));
        }
        for (p, plan) in plans {
            let hold = match plan {
                Plan::Same => continue,
                Plan::New(h) => h,
                Plan::Supersede(i, h) => {
                    self.apply(i, REvent::Supersede);
                    h
                }
            };
            self.records.push(MRecord {
                path: p,
                giver: s,
                successor: to,
                version_at_transfer: self.paths[p].version,
                hold,
                status: MStatus::Pending,
                counterparty: None,
                updated: self.hour,
            });
            if let Some(h) = self.paths[p].holders.get_mut(&s) {
                h.hold = Some(MHold::I);
            }
        }
        Ok(())
    }

    /// `accept`/`decline` (by the successor) or `withdraw` (by the giver) of one path.
    fn answer(&mut self, s: usize, p: usize, ev: REvent) -> Want {
        if s == UNATTRIBUTED {
            return refuse(Reason::Unattributed);
        }
        if !self.paths[p].exists {
            return refuse(Reason::NoSuchPath);
        }
        let Some(i) = self.live(p) else {
            // No live record: final (docs/design.md#handoff), whatever the verb.
            return refuse(Reason::HandoffNotLive);
        };
        let r = &self.records[i];
        if ev == REvent::Withdraw {
            if r.giver != s {
                return refuse(Reason::HandoffNotGiver);
            }
        } else if r.successor.is_none() {
            // An unclaimed offer: the first accept of anyone but its giver claims it.
            if ev != REvent::Accept || r.giver == s {
                return refuse(Reason::HandoffNotSuccessor);
            }
            self.records[i].successor = Some(s);
        } else if r.successor != Some(s) {
            return refuse(Reason::HandoffNotSuccessor);
        }
        self.apply(i, ev);
        Ok(())
    }
}

// ----- comparing the engine with the model ----------------------------------------------

fn got(r: Result<impl Sized, coherent::error::Refusal>) -> Result<(), Reason> {
    r.map(|_| ()).map_err(|e| e.reason)
}

fn check(want: &Want, got: Result<(), Reason>, what: &str) -> Result<(), TestCaseError> {
    let agree = match (want, &got) {
        (Ok(()), Ok(())) => true,
        (Err(rs), Err(r)) => rs.contains(r),
        _ => false,
    };
    prop_assert!(agree, "{}: model {:?}, engine {:?}", what, want, got);
    Ok(())
}

type RecKey = (
    String,
    String,
    String,
    u64,
    Hold,
    Status,
    Option<String>,
    bool,
);

fn engine_records(e: &Engine) -> Vec<RecKey> {
    let st = e.status(None);
    let mut v: Vec<RecKey> = st
        .live
        .into_iter()
        .chain(st.ended)
        .map(|r| {
            (
                r.path,
                r.giver,
                r.successor,
                r.version_at_transfer,
                r.hold,
                r.status,
                r.counterparty,
                r.live,
            )
        })
        .collect();
    v.sort_by_key(|r| format!("{r:?}"));
    v
}

fn model_records(m: &Model) -> Vec<RecKey> {
    let mut v: Vec<RecKey> = m
        .records
        .iter()
        .map(|r| {
            (
                PATHS[r.path].to_string(),
                NAMES[r.giver].to_string(),
                r.successor.map_or("any", |x| NAMES[x]).to_string(),
                r.version_at_transfer,
                match r.hold {
                    MHold::M => Hold::M,
                    _ => Hold::S,
                },
                r.status.wire(),
                r.counterparty.clone(),
                r.status.may_be_live() && r.version_at_transfer == m.paths[r.path].version,
            )
        })
        .collect();
    v.sort_by_key(|r| format!("{r:?}"));
    v
}

fn wire_hold(h: MHold) -> Hold {
    match h {
        MHold::S => Hold::S,
        MHold::E => Hold::E,
        MHold::M => Hold::M,
        MHold::I => Hold::I,
    }
}

/// `Engine::accept`, `decline` or `withdraw`.
type Verb =
    fn(&Engine, &Session, &[String], Timestamp) -> Result<VerbReply, coherent::error::Refusal>;

fn run(ops: Vec<Op>, stale: StaleMode) -> Result<(), TestCaseError> {
    let mut h = H::with(Config {
        stale,
        ..Config::default()
    });
    let mut m = Model::new(stale);
    let ss: Vec<Session> = NAMES[..UNATTRIBUTED]
        .iter()
        .map(|n| sess(n))
        .chain(std::iter::once(uid0()))
        .collect();
    for s in &ss[..UNATTRIBUTED] {
        let t = h.t();
        h.e.register(s, t).unwrap();
    }
    for p in &PATHS[..EXISTING] {
        let st = h.next_stamp();
        let t = h.t();
        h.e.observe(p, st, t);
    }
    for (step, op) in ops.iter().enumerate() {
        let what = format!("step {step} {op:?}");
        match *op {
            Op::Read(s, p) => {
                let v = h.read(&ss[s], PATHS[p]);
                let e = &m.paths[p];
                prop_assert_eq!(v, e.exists.then_some(e.version), "{}: read", what);
                m.read(s, p);
            }
            Op::Write(s, p) => {
                let want = m.acquire(s, p);
                let t = h.t();
                let r = got(h.e.acquire(&ss[s], PATHS[p], t));
                check(&want, r, &what)?;
                if r.is_ok() {
                    let st = h.next_stamp();
                    let t = h.t();
                    h.e.commit(&ss[s], PATHS[p], CommitOp::Write, st, t);
                    let t = h.t();
                    h.e.close_write(&ss[s], PATHS[p], true, t);
                    m.commit(s, p, false);
                    m.close(s, p, true);
                }
            }
            Op::WriteUnstamped(s, p) => {
                let want = m.acquire(s, p);
                let t = h.t();
                let r = got(h.e.acquire(&ss[s], PATHS[p], t));
                check(&want, r, &what)?;
                if r.is_ok() {
                    let t = h.t();
                    h.e.commit(&ss[s], PATHS[p], CommitOp::Write, None, t);
                    let t = h.t();
                    h.e.close_write(&ss[s], PATHS[p], true, t);
                    m.commit(s, p, false);
                    m.paths[p].stamped = false;
                    m.close(s, p, true);
                }
            }
            Op::OpenClose(s, p) => {
                let want = m.acquire(s, p);
                let t = h.t();
                let r = got(h.e.acquire(&ss[s], PATHS[p], t));
                check(&want, r, &what)?;
                if r.is_ok() {
                    let t = h.t();
                    h.e.close_write(&ss[s], PATHS[p], false, t);
                    m.close(s, p, false);
                }
            }
            Op::Acquire(s, p) => {
                let want = m.acquire(s, p);
                let t = h.t();
                let r = got(h.e.acquire(&ss[s], PATHS[p], t));
                check(&want, r, &what)?;
            }
            Op::Close(s, p, changed) => {
                // Only a handle that exists can change the file.
                let open = m.paths[p].holders.get(&s).is_some_and(|x| x.writers > 0);
                if changed && open {
                    let st = h.next_stamp();
                    let t = h.t();
                    h.e.commit(&ss[s], PATHS[p], CommitOp::Write, st, t);
                    m.commit(s, p, false);
                }
                let t = h.t();
                h.e.close_write(&ss[s], PATHS[p], changed && open, t);
                m.close(s, p, changed && open);
            }
            Op::Unlink(s, p) => {
                let want = m.fence(s, p);
                let t = h.t();
                let r = got(h.e.check_write(&ss[s], PATHS[p], Route::Unlink, t));
                check(&want, r, &what)?;
                if r.is_ok() && m.paths[p].exists {
                    let t = h.t();
                    h.e.commit(&ss[s], PATHS[p], CommitOp::Unlink, None, t);
                    m.commit(s, p, true);
                }
            }
            Op::Rename(s, a, b) if a != b => {
                let want = m.fence(s, a).and_then(|_| m.fence(s, b)).and_then(|_| {
                    match m.stale_overwrite(s, b) {
                        true => refuse(Reason::StaleView),
                        false => Ok(()),
                    }
                });
                let t = h.t();
                let r = got(h.e.check_rename(&ss[s], PATHS[a], PATHS[b], false, t));
                check(&want, r, &what)?;
                if r.is_ok() && m.paths[a].exists {
                    let st = h.next_stamp();
                    let t = h.t();
                    h.e.rename(&ss[s], PATHS[a], PATHS[b], false, st, t);
                    m.commit(s, a, true);
                    m.commit(s, b, false);
                }
            }
            Op::Rename(..) => {}
            Op::Transfer(s, ref ps, to) => {
                let want = m.transfer(s, ps, to);
                let names: Vec<&str> = ps.iter().map(|p| PATHS[*p]).collect();
                let to = if to == ANY { "any" } else { NAMES[to] };
                let r = got(h.transfer(&ss[s], &names, to));
                check(&want, r, &what)?;
            }
            Op::Accept(s, p) | Op::Decline(s, p) | Op::Withdraw(s, p) => {
                let (ev, f, name): (REvent, Verb, &str) = match op {
                    Op::Accept(..) => (REvent::Accept, Engine::accept, "accept"),
                    Op::Decline(..) => (REvent::Decline, Engine::decline, "decline"),
                    _ => (REvent::Withdraw, Engine::withdraw, "withdraw"),
                };
                let want = m.answer(s, p, ev);
                let t = h.t();
                let reply = f(&h.e, &ss[s], &paths(&[PATHS[p]]), t);
                if let Ok(reply) = &reply {
                    prop_assert_eq!(&reply.verb, name, "{}: the reply's verb", what);
                }
                check(&want, got(reply), &what)?;
            }
            Op::Metadata(p) => {
                let st = h.next_stamp();
                h.e.restamp(PATHS[p], st.expect("a stamp"));
                let t = h.t();
                let v = h.e.observe(PATHS[p], st, t);
                let want = if m.paths[p].exists {
                    m.paths[p].stamped = true;
                    Some(m.paths[p].version)
                } else {
                    // nothing to restamp: the file appeared behind the volume's back
                    m.external(p, true)
                };
                prop_assert_eq!(v, want, "{}: observe after restamp", what);
            }
            Op::External(p, present) => {
                let st = if present { h.next_stamp() } else { None };
                let t = h.t();
                let v = h.e.observe(PATHS[p], st, t);
                let want = m.external(p, present);
                prop_assert_eq!(v, want, "{}: observe", what);
            }
            Op::Advance(hours) => {
                h.now += hours as i64 * HOUR_MS;
                m.hour += hours;
            }
            Op::Evict => {
                let t = h.t();
                let n = h.e.evict(t);
                prop_assert_eq!(n, m.evict(), "{}: evicted", what);
            }
            Op::Gone(s) => {
                let t = h.t();
                let n = h.e.session_gone(&ss[s], t);
                prop_assert_eq!(n, m.gone(s), "{}: reclaimed", what);
            }
        }

        for (i, p) in PATHS.iter().enumerate() {
            let st =
                h.e.path_state(p)
                    .map_or((0, false), |st| (st.version, st.exists));
            prop_assert_eq!(
                st,
                (m.paths[i].version, m.paths[i].exists),
                "{}: version of {}",
                what,
                p
            );
            for (j, s) in ss.iter().enumerate() {
                let mh = m.paths[i].holders.get(&j);
                let want = mh.and_then(|x| {
                    // an open write handle shows as E whatever happened since
                    let k = if x.writers > 0 {
                        Some(MHold::E)
                    } else {
                        x.hold
                    };
                    k.map(|k| (wire_hold(k), x.view))
                });
                prop_assert_eq!(
                    h.e.hold(s, p),
                    want,
                    "{}: hold of {} on {}",
                    what,
                    s.name,
                    p
                );
                // The fence, from the model's records.
                let fenced = m.fenced(j, i);
                prop_assert_eq!(h.e.is_fenced(s, p), fenced, "{}: {} on {}", what, s.name, p);
                let t = h.t();
                let r = got(h.e.check_write(s, p, Route::Setxattr, t));
                // The fence, then the late giver (every route, docs/design.md#holds).
                let want = m.fence(j, i);
                check(&want, r, &format!("{what}: setxattr by {} on {p}", s.name))?;
            }
        }
        prop_assert_eq!(engine_records(&h.e), model_records(&m), "{}: records", what);
        prop_assert_eq!(
            h.count(EventKind::ExternalChange),
            m.externals,
            "{}: external changes",
            what
        );
        prop_assert_eq!(
            h.count(EventKind::Overtaken),
            m.overtakes,
            "{}: overtaken events",
            what
        );
        h.assert_replay_equal();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_engine_follows_the_model(
        ops in prop::collection::vec(op(), 1..40),
        stale in prop_oneof![
            Just(StaleMode::Guard),
            Just(StaleMode::Warn),
            Just(StaleMode::Strict),
            Just(StaleMode::Off)
        ],
    ) {
        run(ops, stale)?;
    }
}

/// The contract points of docs/design.md#handoff as fixed histories, so a failure names the
/// point. Each runs on the engine and on the model.
mod contract {
    use super::*;

    fn history(ops: Vec<Op>) {
        run(ops, StaleMode::Warn).unwrap();
    }

    /// An exact re-send of a transfer whose record ended answers `handoff_ended`.
    #[test]
    fn resend_after_decline() {
        use Op::*;
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            Decline(1, 0),
            Transfer(0, vec![0], 1),
        ]);
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            Withdraw(0, 0),
            Read(0, 0),
            Transfer(0, vec![0], 1),
        ]);
    }

    /// An overtaken record superseded by its giver's new transfer names no counterparty
    /// any more (found by the random histories).
    #[test]
    fn superseded_after_overtaken() {
        use Op::*;
        history(vec![
            Write(2, 3),
            Transfer(2, vec![3], 1),
            Acquire(0, 3),
            Write(2, 1),
            Transfer(2, vec![3], 0),
        ]);
    }

    /// `counterparty` only on `overtaken`; the latest bystander is it.
    #[test]
    fn counterparty() {
        use Op::*;
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            OpenClose(2, 0),
            OpenClose(3, 0),
            Write(1, 0),
        ]);
    }

    /// A record that is no longer live never changes; every verb on it answers
    /// `handoff_not_live`.
    #[test]
    fn ended_records_do_not_change() {
        use Op::*;
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            Decline(1, 0),
            Write(1, 0),
            Accept(1, 0),
            Withdraw(0, 0),
        ]);
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            Write(2, 0),
            Accept(1, 0),
            Decline(1, 0),
            Withdraw(0, 0),
        ]);
    }

    /// Issue 20: after a bystander's acquire (`overtaken`, live) the giver's withdraw and
    /// the successor's decline still end the record.
    #[test]
    fn the_ways_out_of_an_overtaken_record() {
        use Op::*;
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            OpenClose(2, 0),
            Withdraw(0, 0),
            Write(0, 0),
        ]);
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            OpenClose(2, 0),
            Decline(1, 0),
            Write(0, 0),
        ]);
    }

    /// Issue 20: a completed live record: accept again changes nothing, decline and
    /// withdraw end it, a bystander's acquire overtakes it, the successor's acquire
    /// completes it again.
    #[test]
    fn the_ways_out_of_a_completed_record() {
        use Op::*;
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            Accept(1, 0),
            Accept(1, 0),
            Decline(1, 0),
        ]);
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            Accept(1, 0),
            Withdraw(0, 0),
        ]);
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], 1),
            Accept(1, 0),
            OpenClose(2, 0),
            OpenClose(1, 0),
            Write(2, 0),
        ]);
    }

    /// Issue 20: an offer to anyone: claimed by the first accept, declinable once claimed,
    /// claimable while overtaken.
    #[test]
    fn offers() {
        use Op::*;
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], ANY),
            Decline(1, 0),
            Accept(0, 0),
            OpenClose(2, 0),
            Accept(1, 0),
            Accept(2, 0),
            Decline(1, 0),
        ]);
        history(vec![
            Read(0, 0),
            Transfer(0, vec![0], ANY),
            Accept(1, 0),
            Withdraw(0, 0),
            Transfer(0, vec![0], ANY),
        ]);
    }
}

/// docs/design.md#handoff: a note may be up to 64 KiB; one byte more is `bad_request`, and
/// nothing changes.
#[test]
fn a_note_of_64_kib_is_accepted_one_byte_more_is_not() {
    let h = H::new();
    let (a, b) = (sess("alice"), sess("bob"));
    let t = Timestamp(T0);
    h.e.register(&b, t).unwrap();
    h.e.observe("n.md", stamp(1), t);
    h.e.open_read(&a, "n.md", t);
    let over =
        h.e.transfer(
            &a,
            &paths(&["n.md"]),
            "bob",
            Some("x".repeat(64 * 1024 + 1)),
            t,
        )
        .unwrap_err();
    assert_eq!(over.reason, Reason::BadRequest);
    assert!(h.e.status(None).live.is_empty());
    let r =
        h.e.transfer(&a, &paths(&["n.md"]), "bob", Some("x".repeat(64 * 1024)), t)
            .unwrap();
    assert_eq!(r.records[0].note.as_ref().map(String::len), Some(64 * 1024));
}
