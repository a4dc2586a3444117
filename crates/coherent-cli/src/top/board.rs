//! What the board knows of a volume: built from one `status` reply, then kept current by
//! the events of `.coherent/events` alone (docs/board.md). Kept in maps keyed by path and
//! session, so an event costs a lookup however many records there are.
//!
//! A record is live while its status is `pending`, `completed` or `overtaken` and its
//! path's version is still the one it was handed at (docs/design.md#handoff): a commit that
//! moves the version ends it here as it does in the volume.

use coherent::coherence::Timestamp;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// How far back refusals are kept for their rate.
pub(crate) const RATE_WINDOW_MS: i64 = 60_000;

/// One handoff record as the board shows it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rec {
    /// The `seq` of its `transfer` event (what later events name in `record`); unknown
    /// for a record first read from `status`.
    pub id: Option<u64>,
    pub giver: String,
    /// `any` while an offer to anyone is unclaimed.
    pub successor: String,
    pub offer: bool,
    pub status: String,
    pub counterparty: Option<String>,
    pub version: Option<u64>,
    pub note: Option<String>,
    pub created: i64,
    pub updated: i64,
}

impl Rec {
    pub(crate) fn is_live_status(&self) -> bool {
        matches!(self.status.as_str(), "pending" | "completed" | "overtaken")
    }
    pub(crate) fn unclaimed(&self) -> bool {
        self.offer && self.successor == coherent_wire::names::ANY
    }
    /// The note's first line (the rest is for `coherent status --json` or the inbox).
    pub(crate) fn note_head(&self) -> Option<&str> {
        self.note.as_deref().and_then(|n| n.lines().next())
    }
}

/// One file of the volume.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct File {
    /// Its version, when an event or a live record told it.
    pub version: Option<u64>,
    pub removed: bool,
    /// Sessions with the file open for writing (hold `E`).
    pub writers: Vec<String>,
    /// The session that made the current version (hold `M`).
    pub maker: Option<String>,
    pub live: Option<Rec>,
    /// The newest record that ended (shown until a newer one replaces it or it is evicted).
    pub ended: Option<Rec>,
}

/// A known session.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Session {
    pub agent: Option<String>,
    pub via: Option<String>,
}

/// What a `denied` event of reason `stale_view` says about the write it refused: who made
/// the current version (its `counterparty`, else a late giver's `successor`), that
/// version, and the refused session's view.
fn stale_facts(ev: &Value) -> String {
    if ev["reason"] != "stale_view" {
        return String::new();
    }
    let by = ev["counterparty"]
        .as_str()
        .or(ev["successor"].as_str())
        .unwrap_or("another session");
    let v = |k: &str| ev[k].as_u64().map_or("?".to_string(), |n| n.to_string());
    let by = coherent_wire::names::display_name(by);
    format!("{by} wrote v{}, saw v{}", v("version"), v("view"))
}

/// The refusals of one session by one route.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Refusals {
    /// When each of the recent ones happened (ms), oldest first.
    pub recent: VecDeque<i64>,
    pub total: u64,
    pub last_reason: String,
    pub last_path: String,
    /// The last refusal's `stale_view` facts: who wrote since, the version it made and the
    /// refused session's view (`bob wrote v3, saw v1`); empty for other reasons.
    pub last_stale: String,
}

/// A host of a multi-host volume.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Host {
    /// This host (the one whose mount the board reads).
    pub this: bool,
    /// Listed by `status`: its lease in etcd is live.
    pub leased: bool,
    pub applied: Option<i64>,
    /// Its newest event in this log (ms).
    pub last_event: Option<i64>,
}

#[derive(Debug, Default)]
pub(crate) struct Board {
    pub files: BTreeMap<String, File>,
    pub sessions: BTreeMap<String, Session>,
    /// Keyed by (session, route).
    pub refusals: BTreeMap<(String, String), Refusals>,
    pub hosts: BTreeMap<String, Host>,
    /// This host's side of the coordinator (`connected`, `confirmed`, `error`), from
    /// `status`; None on a single-host volume.
    pub coordinator: Option<Value>,
    /// The log lost other hosts' events (`events_missed`): `r` reads `status` again.
    pub missed: bool,
    pub last_seq: Option<u64>,
    pub events: u64,
    /// Moves on every change, so views computed from the board can be kept until it moves.
    pub generation: u64,
}

fn ms(v: &Value) -> Option<i64> {
    v.as_str()
        .and_then(Timestamp::parse_rfc3339)
        .map(Timestamp::millis)
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

fn rec_from_status(r: &Value) -> Option<Rec> {
    Some(Rec {
        id: None,
        giver: text(&r["giver"])?,
        successor: text(&r["successor"]).unwrap_or_default(),
        offer: r["offer"].as_bool().unwrap_or(false),
        status: text(&r["status"]).unwrap_or_else(|| "?".into()),
        counterparty: text(&r["counterparty"]),
        version: r["version_at_transfer"].as_u64(),
        note: text(&r["note"]),
        created: ms(&r["created"]).unwrap_or(0),
        updated: ms(&r["updated"]).unwrap_or(0),
    })
}

impl Board {
    /// Takes in a `status` reply's object (`sessions`, `live`, `ended`, `coordinator`):
    /// what it says of sessions, records and hosts replaces what the board had.
    pub(crate) fn apply_status(&mut self, st: &Value) {
        self.generation += 1;
        for s in st["sessions"].as_array().into_iter().flatten() {
            if let Some(name) = s["name"].as_str() {
                let e = self.sessions.entry(name.to_string()).or_default();
                e.agent = text(&s["agent"]).or(e.agent.take());
                e.via = s["via"]["kind"]
                    .as_str()
                    .or(s["via"].as_str())
                    .map(str::to_string)
                    .or(e.via.take());
            }
        }
        for f in self.files.values_mut() {
            f.live = None;
            f.ended = None;
        }
        for r in st["ended"].as_array().into_iter().flatten() {
            let (Some(path), Some(rec)) = (r["path"].as_str(), rec_from_status(r)) else {
                continue;
            };
            let f = self.files.entry(path.to_string()).or_default();
            if f.ended
                .as_ref()
                .is_none_or(|old| old.updated <= rec.updated)
            {
                f.ended = Some(rec);
            }
        }
        for r in st["live"].as_array().into_iter().flatten() {
            let (Some(path), Some(rec)) = (r["path"].as_str(), rec_from_status(r)) else {
                continue;
            };
            let f = self.files.entry(path.to_string()).or_default();
            // a live record's path is at the version it was handed at
            f.version = rec.version.or(f.version);
            f.live = Some(rec);
        }
        self.coordinator = st.get("coordinator").cloned();
        if let Some(c) = &self.coordinator {
            let this = c["host"].as_str().unwrap_or("");
            for h in self.hosts.values_mut() {
                h.leased = false;
            }
            for h in c["hosts"].as_array().into_iter().flatten() {
                if let Some(name) = h["host"].as_str() {
                    let e = self.hosts.entry(name.to_string()).or_default();
                    e.leased = true;
                    e.applied = h["applied"].as_i64();
                }
            }
            if !this.is_empty() {
                self.hosts.entry(this.to_string()).or_default().this = true;
            }
        }
        self.missed = false;
    }

    /// Takes in one line of the log; false when it is not an event (ignored).
    pub(crate) fn apply_line(&mut self, line: &[u8]) -> bool {
        match serde_json::from_slice::<Value>(line) {
            Ok(ev @ Value::Object(_)) => {
                self.apply_event(&ev);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn apply_event(&mut self, ev: &Value) {
        self.generation += 1;
        self.events += 1;
        if let Some(seq) = ev["seq"].as_u64() {
            self.last_seq = Some(seq);
        }
        let ts = ms(&ev["ts"]).unwrap_or(0);
        let who = ev["session"].as_str().unwrap_or("");
        if let Some(h) = ev["host"].as_str() {
            let e = self.hosts.entry(h.to_string()).or_default();
            e.last_event = Some(e.last_event.map_or(ts, |t| t.max(ts)));
        }
        if !who.is_empty() && !who.starts_with("uid:") && who != coherent::coherence::EXTERNAL {
            let s = self.sessions.entry(who.to_string()).or_default();
            if let Some(a) = ev["agent"].as_str() {
                s.agent.get_or_insert_with(|| a.to_string());
            }
        }
        let kind = ev["event"].as_str().unwrap_or("");
        if kind == "events_missed" {
            self.missed = true;
            return;
        }
        let Some(path) = ev["path"].as_str() else {
            if kind == "session_seen" {
                if let Some(s) = self.sessions.get_mut(who) {
                    s.via = ev["via"]["kind"]
                        .as_str()
                        .map(str::to_string)
                        .or(s.via.take());
                }
            }
            return;
        };
        let record = ev["record"].as_u64();
        let version = ev["version"].as_u64();
        match kind {
            "denied" => {
                let route = ev["route"].as_str().unwrap_or("?").to_string();
                let r = self.refusals.entry((who.to_string(), route)).or_default();
                r.total += 1;
                r.recent.push_back(ts);
                r.last_reason = ev["reason"].as_str().unwrap_or("?").to_string();
                r.last_path = path.to_string();
                r.last_stale = stale_facts(ev);
                while r.recent.len() > 4096 {
                    r.recent.pop_front();
                }
            }
            "acquire" => {
                let f = self.files.entry(path.to_string()).or_default();
                if !f.writers.iter().any(|w| w == who) {
                    f.writers.push(who.to_string());
                }
                f.version = version.or(f.version);
            }
            "release" | "reclaim" => {
                if let Some(f) = self.files.get_mut(path) {
                    f.writers.retain(|w| w != who);
                }
            }
            "commit" | "external_change" => {
                if kind == "commit" && ev["op"] == "rename_dir" {
                    if let Some(from) = ev["from"].as_str() {
                        self.move_dir(from, path);
                    }
                }
                let f = self.files.entry(path.to_string()).or_default();
                f.version = version.or(f.version.map(|v| v + 1));
                f.removed = ev["removed"].as_bool().unwrap_or(false);
                f.maker = Some(who.to_string());
                // a commit on close logs no `release`: the maker shows as `M` from here
                f.writers.retain(|w| w != who);
                // the version moved: a live record handed at another version has ended
                if let Some(live) = &f.live {
                    if live.version.is_some() && live.version != f.version {
                        f.ended = f.live.take();
                    }
                }
            }
            "transfer" => {
                let f = self.files.entry(path.to_string()).or_default();
                let successor = ev["successor"].as_str().unwrap_or("").to_string();
                f.version = version.or(f.version);
                if f.maker.as_deref() == Some(who) {
                    f.maker = None;
                }
                f.live = Some(Rec {
                    id: record.or(ev["seq"].as_u64()),
                    giver: who.to_string(),
                    offer: successor == coherent_wire::names::ANY,
                    successor,
                    status: "pending".into(),
                    counterparty: None,
                    version,
                    note: text(&ev["note"]),
                    created: ts,
                    updated: ts,
                });
            }
            "accept" | "completed" | "decline" | "withdraw" | "superseded" | "overtaken" => {
                let Some(f) = self.files.get_mut(path) else {
                    return;
                };
                let same = |r: &Rec| r.id.is_none() || record.is_none() || r.id == record;
                let live = f.live.as_mut().filter(|r| same(r));
                let Some(r) = live.or(f.ended.as_mut().filter(|r| same(r))) else {
                    return;
                };
                r.status = match kind {
                    "accept" => "completed",
                    "decline" => "declined",
                    "withdraw" => "withdrawn",
                    other => other,
                }
                .to_string();
                r.updated = ts;
                r.id = r.id.or(record);
                if kind == "accept" && ev["claimed"].as_bool() == Some(true) {
                    r.successor = ev["successor"].as_str().unwrap_or(who).to_string();
                }
                r.counterparty = if kind == "overtaken" {
                    text(&ev["counterparty"]).or_else(|| Some(who.to_string()))
                } else {
                    None
                };
                if f.live.as_ref().is_some_and(|r| !r.is_live_status()) {
                    f.ended = f.live.take();
                }
            }
            "evict" => {
                if let Some(f) = self.files.get_mut(path) {
                    if f.ended
                        .as_ref()
                        .is_some_and(|r| r.id.is_none() || r.id == record)
                    {
                        f.ended = None;
                    }
                }
            }
            _ => {}
        }
    }

    /// A directory rename: everything under `from/` moves under `to/`, records included.
    fn move_dir(&mut self, from: &str, to: &str) {
        let pre = format!("{from}/");
        let keys: Vec<String> = self
            .files
            .range(pre.clone()..)
            .take_while(|(k, _)| k.starts_with(&pre))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some(f) = self.files.remove(&k) {
                self.files.insert(format!("{to}/{}", &k[pre.len()..]), f);
            }
        }
    }

    /// Refusals in the minute before `now` (ms), and the refusal totals.
    pub(crate) fn refusal_rates(&mut self, now: i64) -> Vec<(&(String, String), usize, &Refusals)> {
        for r in self.refusals.values_mut() {
            while r.recent.front().is_some_and(|&t| t < now - RATE_WINDOW_MS) {
                r.recent.pop_front();
            }
        }
        let mut out: Vec<_> = self
            .refusals
            .iter()
            .map(|(k, r)| (k, r.recent.len(), r))
            .collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.total.cmp(&a.2.total)));
        out
    }

    /// What the panes show that takes a pass over every file, in one pass.
    pub(crate) fn summary(&self) -> Summary {
        let mut sum = Summary::default();
        let mut waits: BTreeMap<(&str, &str), (usize, i64)> = BTreeMap::new();
        for (p, f) in &self.files {
            let Some(r) = &f.live else {
                continue;
            };
            sum.live += 1;
            // the giver of a live record cannot write its file
            match sum.fenced.get_mut(&r.giver) {
                Some(n) => *n += 1,
                None => {
                    sum.fenced.insert(r.giver.clone(), 1);
                }
            }
            // and waits on its successor (or on the session that overtook it, or on
            // anyone for an open offer) until it writes or declines, or the giver withdraws
            let on = match (&r.counterparty, r.status.as_str()) {
                (Some(c), "overtaken") => c.as_str(),
                _ => r.successor.as_str(),
            };
            let w = waits.entry((r.giver.as_str(), on)).or_insert((0, i64::MAX));
            w.0 += 1;
            w.1 = w.1.min(r.created);
            if r.unclaimed() {
                sum.offers.push((p.clone(), r.clone()));
            }
        }
        sum.waits = waits
            .into_iter()
            .map(|((g, on), (n, since))| (g.to_string(), on.to_string(), n, since))
            .collect();
        sum.waits.sort_by_key(|w| w.3);
        sum
    }
}

/// The board's totals and cross-file views (see [`Board::summary`]).
#[derive(Debug, Default)]
pub(crate) struct Summary {
    /// Files with a live record.
    pub live: usize,
    /// Sessions fenced, with the number of files.
    pub fenced: HashMap<String, usize>,
    /// (giver, on whom, files, since when (ms)), the oldest first.
    pub waits: Vec<(String, String, usize, i64)>,
    /// Open offers to anyone: (path, record).
    pub offers: Vec<(String, Rec)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(board: &mut Board, v: Value) {
        board.apply_event(&v);
    }

    #[test]
    fn events_keep_records_versions_and_refusals() {
        let mut b = Board::default();
        let t = "2026-12-03T12:00:00.000Z";
        ev(
            &mut b,
            json!({"seq":1,"ts":t,"event":"commit","path":"p","session":"alice","version":2}),
        );
        ev(
            &mut b,
            json!({"seq":2,"ts":t,"event":"transfer","path":"p","session":"alice",
            "successor":"bob","version":2,"note":"first\nsecond"}),
        );
        let live = b.files["p"].live.clone().unwrap();
        assert_eq!(
            (live.giver.as_str(), live.successor.as_str()),
            ("alice", "bob")
        );
        assert_eq!(
            (live.status.as_str(), live.id, live.note_head()),
            ("pending", Some(2), Some("first"))
        );
        assert_eq!(b.summary().fenced.get("alice"), Some(&1));
        ev(
            &mut b,
            json!({"seq":3,"ts":t,"event":"accept","path":"p","session":"bob","record":2}),
        );
        assert_eq!(b.files["p"].live.as_ref().unwrap().status, "completed");
        // the successor's commit moves the version: the record ends, the fence lifts
        ev(
            &mut b,
            json!({"seq":4,"ts":t,"event":"commit","path":"p","session":"bob","version":3}),
        );
        assert!(b.files["p"].live.is_none());
        assert_eq!(b.files["p"].ended.as_ref().unwrap().status, "completed");
        assert!(b.summary().fenced.is_empty());
        ev(
            &mut b,
            json!({"seq":5,"ts":t,"event":"denied","path":"p","session":"alice",
            "reason":"fenced","route":"open_write"}),
        );
        let now = Timestamp::parse_rfc3339(t).unwrap().millis() + 1000;
        let rates = b.refusal_rates(now);
        assert_eq!(rates.len(), 1);
        assert_eq!(
            (rates[0].0 .0.as_str(), rates[0].0 .1.as_str(), rates[0].1),
            ("alice", "open_write", 1)
        );
        assert_eq!(b.refusal_rates(now + RATE_WINDOW_MS + 1)[0].1, 0);
    }

    #[test]
    fn a_stale_refusal_shows_who_wrote_since_and_at_which_version() {
        let mut b = Board::default();
        let t = "2026-12-03T12:00:00.000Z";
        ev(
            &mut b,
            json!({"seq":1,"ts":t,"event":"denied","path":"p","session":"alice",
            "reason":"stale_view","route":"open_write","view":1,"version":3,
            "counterparty":"bob"}),
        );
        let now = Timestamp::parse_rfc3339(t).unwrap().millis() + 1000;
        let rates = b.refusal_rates(now);
        assert_eq!(rates[0].2.last_reason, "stale_view");
        assert_eq!(rates[0].2.last_stale, "bob wrote v3, saw v1");
        // a late giver's names its successor when the writer is not known
        ev(
            &mut b,
            json!({"seq":2,"ts":t,"event":"denied","path":"p","session":"alice",
            "reason":"stale_view","route":"setattr","view":1,"version":2,"successor":"bob"}),
        );
        assert_eq!(
            b.refusals[&("alice".into(), "setattr".into())].last_stale,
            "bob wrote v2, saw v1"
        );
        ev(
            &mut b,
            json!({"seq":3,"ts":t,"event":"denied","path":"p","session":"alice",
            "reason":"fenced","route":"open_write","version":2}),
        );
        assert_eq!(
            b.refusals[&("alice".into(), "open_write".into())].last_stale,
            ""
        );
    }

    #[test]
    fn an_event_of_an_older_record_leaves_the_live_one_alone() {
        let mut b = Board::default();
        let t = "2026-12-03T12:00:00.000Z";
        ev(
            &mut b,
            json!({"seq":1,"ts":t,"event":"transfer","path":"p","session":"a","successor":"b","version":1}),
        );
        ev(
            &mut b,
            json!({"seq":2,"ts":t,"event":"transfer","path":"p","session":"a","successor":"c","version":1}),
        );
        ev(
            &mut b,
            json!({"seq":3,"ts":t,"event":"superseded","path":"p","session":"a","record":1}),
        );
        let live = b.files["p"].live.as_ref().unwrap();
        assert_eq!(
            (live.successor.as_str(), live.status.as_str()),
            ("c", "pending")
        );
    }
}
