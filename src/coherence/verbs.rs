//! The verbs of docs/design.md#handoff and #control-surface: `register`, `transfer`, `accept`,
//! `decline`, `withdraw`.

use super::engine::*;
use super::time::Timestamp;
use super::types::*;
use crate::error::{Reason, Refusal};
use crate::identity::Session;
use crate::names::ANY;

/// What a verb decided for one path, before anything changes.
enum Plan {
    Nothing,
    New { hold: Hold, version: u64 },
    Supersede { old: u64, hold: Hold, version: u64 },
    Status(EventKind),
}

impl Engine {
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

    /// The plans of a multi-path verb, or its refusal: every refused path named with its
    /// own reason in `per_path` (each refusal carries its path); the first one is the
    /// reply's reason and message. Nothing changes on refusal.
    fn all_or_nothing(
        &self,
        s: &Session,
        paths: &[String],
        plans: Vec<Result<Plan, Refusal>>,
    ) -> Result<Vec<Plan>, Refusal> {
        let refused: Vec<Refusal> = paths
            .iter()
            .zip(&plans)
            .filter_map(|(p, r)| r.as_ref().err().map(|r| r.clone().at(p.clone())))
            .collect();
        let Some(first) = refused.first() else {
            return Ok(plans.into_iter().map(|p| p.expect("no refusal")).collect());
        };
        let mut r = first.clone();
        if refused.len() > 1 || paths.len() > 1 {
            r.per_path = refused;
        }
        Err(self.refuse(s, r))
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

    /// `transfer(paths, successor, note)` by giver `s` (docs/design.md#handoff). All or
    /// nothing: every path is checked first and the first refusal, naming its path, changes
    /// nothing. Re-sending a live transfer answers the record unchanged; to another successor
    /// it supersedes. Returns after the events are durable.
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
        // `any` is never a session name: an offer to whichever session claims it first.
        let succ = if successor == ANY {
            self.known(ANY, None)
        } else {
            self.lookup_session(successor)
                .map_err(|r| self.refuse(s, r))?
        };
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
            plans.push(self.plan_transfer(sh.get(p.as_str()), p, s, &succ));
        }
        let plans = self.all_or_nothing(s, &paths, plans)?;
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
            // What is handed on: while the record is live, only content that differs from
            // this is a change behind the volume's back (docs/versions-and-holds.md#content).
            ev.print = e.current_print();
            let id = self.next_record_id();
            ev.record = id;
            let seq = self.emit(e, ev);
            last = Some(seq);
            let id = id.unwrap_or(seq);
            let r = e.records.iter().find(|r| r.id == id).expect("just made");
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
        // First: an exact re-send of a transfer that already ended answers so, whatever
        // the giver's hold now.
        ended_before(e, p, s, succ)?;
        if let Some(r) = e.live() {
            if r.giver.name != s.name {
                return Err(Refusal::new(
                    Reason::HandoffOtherHolder,
                    format!(
                        "{p_q} is already handed on by {} to {} (at v{}); only one handoff of a file at a time",
                        r.giver.display(),
                        r.successor.display(),
                        r.version_at_transfer, p_q = crate::names::display_name(p)),
                )
                .with_status(r.status));
            }
            if r.successor.name == succ.name {
                return Ok(Plan::Nothing);
            }
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
                    "this session still has {p_q} open for writing: close it first, then transfer",
                    p_q = crate::names::display_name(p)
                ),
            ));
        }
        let hold = match h {
            Some(h) if h.view == Some(e.version) && matches!(h.hold, Hold::M | Hold::S) => h.hold,
            _ => {
                return Err(Refusal::new(
                    Reason::HandoffNotHeld,
                    format!(
                        "this session has not read or written {p_q} at its current version v{}: read it first",
                        e.version, p_q = crate::names::display_name(p)),
                ))
            }
        };
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
                Some(e) if e.exists && e.version > 0 => plan_answer(e, p, s, kind),
                _ => Err(no_such_path(p)),
            };
            plans.push(plan);
        }
        let plans = self.all_or_nothing(s, &paths, plans)?;
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
                if kind == EventKind::Accept && r.unclaimed() {
                    ev.claimed = true;
                    ev.successor = Some(s.name.clone());
                    ev.successor_agent = Some(s.agent_id);
                }
                ev.version = Some(e.version);
                last = Some(self.emit(e, ev));
            }
            let r = e.records.iter().find(|r| r.id == id).expect("kept");
            out.push(r.to_json(e.version));
        }
        drop(guards);
        Ok(self.reply(verb, out, last))
    }
}

/// `handoff_ended`: this giver's transfer of `p` at this version to this successor already
/// ended by decline or withdraw (until the version moves or the record is evicted).
fn ended_before(e: &Entry, p: &str, s: &Session, succ: &Session) -> Result<(), Refusal> {
    if let Some(r) = e.records.iter().find(|r| {
        r.giver.name == s.name
            && r.successor.name == succ.name
            && r.version_at_transfer == e.version
            && matches!(r.status, Status::Declined | Status::Withdrawn)
    }) {
        return Err(Refusal::new(
            Reason::HandoffEnded,
            format!(
                "the handoff of {p_q} at v{} to {} already ended (declined or withdrawn); it can be sent again once {p_q} changes",
                e.version,
                succ.display(), p_q = crate::names::display_name(p)),
        )
        .with_status(r.status));
    }
    Ok(())
}

/// The wire name of a status (for messages).
fn status_name(st: Status) -> String {
    serde_json::to_value(st)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn no_such_path(p: &str) -> Refusal {
    Refusal::new(
        Reason::NoSuchPath,
        format!(
            "{p_q} does not exist in this volume (or the volume has not seen it yet)",
            p_q = crate::names::display_name(p)
        ),
    )
    .at(p)
}

/// What `accept`, `decline` (by the successor) or `withdraw` (by the giver) does to the record
/// of `p` (docs/design.md#handoff). While a record is live its status follows the latest event:
/// `decline` and `withdraw` end it whatever its live status (the ways out the deny text names
/// always work), `accept` makes it `completed` (an `accept` of a record already `completed`
/// answers it unchanged, no second event), and the first `accept` of an unclaimed offer claims
/// it. A record that is not live is final: `handoff_not_live`, with its status.
fn plan_answer(e: &Entry, p: &str, s: &Session, kind: EventKind) -> Result<Plan, Refusal> {
    let verb = match kind {
        EventKind::Accept => "accept",
        EventKind::Decline => "decline",
        _ => "withdraw",
    };
    let Some(r) = e.live() else {
        return Err(not_live(e, p, verb));
    };
    let refuse = |reason: Reason, msg: String| Err(Refusal::new(reason, msg).with_status(r.status));
    if kind == EventKind::Withdraw {
        if r.giver.name != s.name {
            return refuse(
                Reason::HandoffNotGiver,
                format!(
                    "{p_q} was handed on by {}, not by this session",
                    r.giver.display(),
                    p_q = crate::names::display_name(p)
                ),
            );
        }
        return Ok(Plan::Status(kind));
    }
    if r.unclaimed() {
        // The first accept of an offer to anyone by anyone but its giver claims it;
        // decline has nothing to decline yet.
        if kind == EventKind::Accept && r.giver.name != s.name {
            return Ok(Plan::Status(kind));
        }
        return refuse(
            Reason::HandoffNotSuccessor,
            if r.giver.name == s.name {
                format!(
                    "{p_q} is this session's own offer to anyone: withdraw it instead",
                    p_q = crate::names::display_name(p)
                )
            } else {
                format!(
                    "{p_q} is offered to any session and nobody has claimed it: accept it to claim it", p_q = crate::names::display_name(p))
            },
        );
    }
    if r.successor.name != s.name {
        return refuse(
            Reason::HandoffNotSuccessor,
            format!(
                "{p_q} was handed to {}, not to this session",
                r.successor.display(),
                p_q = crate::names::display_name(p)
            ),
        );
    }
    if kind == EventKind::Accept && r.status == Status::Completed {
        return Ok(Plan::Nothing);
    }
    Ok(Plan::Status(kind))
}

/// `handoff_not_live`: `p` has no live record; the reply names the status of its latest
/// record, if it has one.
fn not_live(e: &Entry, p: &str, verb: &str) -> Refusal {
    let last = e.records.iter().max_by_key(|r| r.id);
    let msg = match last {
        Some(r) if r.status.may_be_live() => format!(
            "the handoff of {p_q} to {} ({}) ended when {p_q} changed (v{} -> v{}); nothing to {verb}",
            r.successor.display(),
            status_name(r.status),
            r.version_at_transfer,
            e.version, p_q = crate::names::display_name(p)),
        Some(r) => format!(
            "the handoff of {p_q} to {} already ended ({}); nothing to {verb}",
            r.successor.display(),
            status_name(r.status), p_q = crate::names::display_name(p)),
        None => format!(
            "{p_q} has no live handoff at v{}; nothing to {verb}",
            e.version, p_q = crate::names::display_name(p)),
    };
    let r = Refusal::new(Reason::HandoffNotLive, msg);
    match last {
        Some(l) => r.with_status(l.status),
        None => r,
    }
}
