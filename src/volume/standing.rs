//! Standing waits (docs/agents.md#standing-waits): a `wait` that outlives the process that
//! asked, the agent's context and the daemon.
//!
//! `wait PATH [UNTIL] --standing` leaves, for the caller's session, a wait on the record
//! that `wait PATH` would follow. The `coherent-wait` thread resolves it when the record
//! reaches the state (or can no longer reach it, or is gone), keeping the record as it
//! stood then; `wait --report` hands the session its resolved waits once and forgets
//! them. An ordinary `wait` of the session answered "reached" on the same path and state
//! forgets the standing one too: the agent heard it already.
//!
//! The registry is this volume's, not the journal's: one JSON file in the state directory
//! (`standing-waits.json`, 0600), replaced whole (write, fsync, rename, fsync the
//! directory) on every change, before the change is answered: through the journal's
//! [`replace_durably`] and [`StateIo`], the one owner of such writes. It is small: a
//! session has at most [`MAX_PER_SESSION`] waits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::coherence::{Engine, RecordJson, Timestamp, Until, WaitState};
use crate::control::{Reply, Verb};
use crate::error::{Reason, Refusal, Status};
use crate::journal::{replace_durably, StateIo};
use crate::names::display_name;

/// The registry's file in the state directory.
pub(super) const FILE: &str = "standing-waits.json";

/// The most standing waits one session keeps (a runaway loop gets `bad_request`).
pub const MAX_PER_SESSION: usize = 256;

/// Where a standing wait stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// The record has not reached the state yet.
    Waiting,
    /// It did.
    Reached,
    /// It ended in a status that can never reach the state.
    Unreachable,
    /// Its record is gone (evicted, or the file moved).
    Gone,
}

/// One standing wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub session: String,
    pub path: String,
    pub until: Until,
    /// The record followed (the `seq` of its `transfer` event).
    pub record_id: u64,
    pub registered: Timestamp,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<Timestamp>,
    /// The record as it stood when the wait resolved (or was registered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordJson>,
}

#[derive(Serialize, Deserialize)]
struct OnDisk {
    version: u32,
    waits: Vec<Entry>,
}

/// The volume's standing waits.
pub(crate) struct Standing {
    /// The state directory holding [`FILE`] (None: kept in memory only, a volume without
    /// a state directory of its own).
    dir: Option<PathBuf>,
    /// How the file is written: the journal's, so tests can make it fail.
    io: Arc<dyn StateIo>,
    entries: Mutex<Vec<Entry>>,
}

/// The wire name of a record status.
fn status_word(s: Status) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Who made the record's status what it is, in words: "accepted by bob", "withdrawn by
/// alice (the giver)".
fn outcome(until: Until, r: &RecordJson) -> String {
    let who = |s: &str| format!("session {}", display_name(s));
    match r.status {
        Status::Completed if until == Until::Accepted => {
            format!("accepted by {}", who(&r.successor))
        }
        Status::Completed => format!("completed by {}", who(&r.successor)),
        Status::Declined => format!("declined by {}", who(&r.successor)),
        Status::Withdrawn => format!("withdrawn by {} (the giver)", who(&r.giver)),
        Status::Overtaken => format!(
            "overtaken by {}",
            who(r.counterparty.as_deref().unwrap_or("?"))
        ),
        Status::Superseded => format!("superseded by a new transfer from {}", who(&r.giver)),
        Status::Pending => "still pending".to_string(),
    }
}

impl Entry {
    /// The line the session reads when the wait is reported.
    pub fn line(&self) -> String {
        let what = format!(
            "your wait on {} (until {})",
            display_name(&self.path),
            self.until.as_str()
        );
        let at = |r: &RecordJson| format!("{} at {}", outcome(self.until, r), r.updated);
        match (self.state, &self.record) {
            (State::Waiting, _) => format!("{what} is still waiting"),
            (State::Reached, Some(r)) => format!("{what} was reached: {}", at(r)),
            (State::Reached, None) => format!("{what} was reached"),
            (State::Unreachable, Some(r)) => format!(
                "{what} can no longer be reached: the handoff ended as {} ({})",
                status_word(r.status),
                at(r)
            ),
            (State::Unreachable, None) => format!("{what} can no longer be reached"),
            (State::Gone, _) => format!(
                "{what} can no longer be reached: its handoff record is gone (evicted, or the \
                 file moved)"
            ),
        }
    }

    /// The entry as `.coherent/waits` and `wait --report` show it.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.remove("record_id");
            m.insert("standing".into(), true.into());
            m.insert("line".into(), self.line().into());
        }
        v
    }

    fn same_wait(&self, session: &str, path: &str, until: Until) -> bool {
        self.session == session && self.path == path && self.until == until
    }
}

/// Where record `id` of `path` stands now for `until`, as a standing wait sees it.
fn look(engine: &Engine, path: &str, id: u64, until: Until) -> (State, Option<RecordJson>) {
    match engine.wait_state(path, id, until) {
        Ok(WaitState::Pending(r)) => (State::Waiting, Some(r)),
        Ok(WaitState::Reached(r)) => (State::Reached, Some(r)),
        Err(f) if f.reason == Reason::HandoffEnded => {
            (State::Unreachable, engine.wait_record(path, id))
        }
        Err(_) => (State::Gone, None),
    }
}

impl Standing {
    /// The registry kept in `state_dir`, as it was left (a file that cannot be read is set
    /// aside as `standing-waits.json.bad` and said so: the waits in it are lost, the volume
    /// mounts). Changes are written through `io`.
    pub(super) fn open(state_dir: &Path, io: Arc<dyn StateIo>) -> Standing {
        let file = state_dir.join(FILE);
        let entries = match std::fs::read(&file) {
            Ok(bytes) => match serde_json::from_slice::<OnDisk>(&bytes) {
                Ok(d) => d.waits,
                Err(e) => {
                    let bad = state_dir.join(format!("{FILE}.bad"));
                    tracing::warn!(
                        "{} is not a standing-wait registry ({e}); moved to {} and started \
                         with none",
                        file.display(),
                        bad.display()
                    );
                    let _ = std::fs::rename(&file, &bad);
                    Vec::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!("cannot read {}: {e}; no standing waits", file.display());
                Vec::new()
            }
        };
        Standing {
            dir: Some(state_dir.to_path_buf()),
            io,
            entries: Mutex::new(entries),
        }
    }

    /// Write `entries` durably (called with the lock held, so writes do not cross).
    fn save(&self, entries: &[Entry]) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let bytes = serde_json::to_vec(&OnDisk {
            version: 1,
            waits: entries.to_vec(),
        })
        .map_err(std::io::Error::other)?;
        // Any failure, the directory fsync's too, answers an error and the change is
        // undone in memory.
        replace_durably(&*self.io, dir, FILE, &[&bytes]).map_err(std::io::Error::from)
    }

    /// Apply `change` to the entries and make it durable; undone when it cannot be.
    fn change<T>(&self, change: impl FnOnce(&mut Vec<Entry>) -> T) -> std::io::Result<T> {
        let mut entries = self.entries.lock();
        let before = entries.clone();
        let out = change(&mut entries);
        if *entries == before {
            return Ok(out);
        }
        match self.save(&entries) {
            Ok(()) => Ok(out),
            Err(e) => {
                *entries = before;
                Err(e)
            }
        }
    }

    /// Register a standing wait for `session` from the answer `checked` that a `wait` with
    /// no time to wait gave (placed, visible, tracked; or refused, answered as is). The
    /// reply is that answer with `"standing": true`.
    pub(super) fn register(
        &self,
        engine: &Engine,
        session: &str,
        until: Until,
        checked: Reply,
    ) -> Reply {
        if !checked.is_ok() {
            return checked;
        }
        let Some(path) = checked.body()["path"].as_str().map(str::to_string) else {
            return checked;
        };
        let id = match engine.wait_target(&path) {
            Ok(id) => id,
            Err(f) => return Reply::refused(Some(Verb::Wait), &f, Some(&path)),
        };
        let now = Timestamp::now();
        let (state, record) = look(engine, &path, id, until);
        let entry = Entry {
            session: session.to_string(),
            path: path.clone(),
            until,
            record_id: id,
            registered: now,
            state,
            resolved: (state != State::Waiting).then_some(now),
            record,
        };
        let added = self.change(|entries| {
            // A wait registered again replaces the old one (its record may be newer).
            entries.retain(|e| !e.same_wait(session, &path, until));
            if entries.iter().filter(|e| e.session == session).count() >= MAX_PER_SESSION {
                return false;
            }
            entries.push(entry.clone());
            true
        });
        let refused =
            |f: Refusal| Reply::refused(Some(Verb::Wait), &f.at(path.as_str()), Some(&path));
        match added {
            Err(e) => refused(Refusal::new(
                Reason::IoError,
                format!("the standing wait could not be made durable: {e}"),
            )),
            Ok(false) => refused(Refusal::new(
                Reason::BadRequest,
                format!(
                    "bad request: this session already has {MAX_PER_SESSION} standing waits; \
                     `wait --report` (the next prompt's hook) clears those that resolved"
                ),
            )),
            Ok(true) => {
                let mut m = match checked.body().clone() {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                m.insert("standing".into(), true.into());
                m.insert(
                    "state".into(),
                    serde_json::to_value(state).unwrap_or(Value::Null),
                );
                let message = match state {
                    State::Waiting => format!(
                        "{}: standing wait for {} registered; the session hears of it on its \
                         next prompt after it resolves",
                        display_name(&path),
                        until.as_str()
                    ),
                    _ => format!("{}; reported on the session's next prompt", entry.line()),
                };
                Reply::ok(Verb::Wait, m, message)
            }
        }
    }

    /// Resolve the waits whose record reached their state, can no longer reach it, or is
    /// gone. Returns whether any wait is still waiting (the wait thread then follows record
    /// changes).
    pub(super) fn resolve(&self, engine: &Engine) -> bool {
        let now = Timestamp::now();
        let r = self.change(|entries| {
            for e in entries.iter_mut().filter(|e| e.state == State::Waiting) {
                let (state, record) = look(engine, &e.path, e.record_id, e.until);
                if state != State::Waiting {
                    tracing::debug!(session = %e.session, path = %e.path, ?state, "standing wait resolved");
                    e.state = state;
                    e.resolved = Some(now);
                    e.record = record.or(e.record.take());
                }
            }
        });
        if let Err(e) = r {
            // Kept in memory as waiting: the next look tries again.
            tracing::warn!("a standing wait resolved but could not be saved: {e}");
        }
        self.entries
            .lock()
            .iter()
            .any(|e| e.state == State::Waiting)
    }

    /// An ordinary `wait` of `session` was answered "reached": its standing twin has
    /// nothing left to tell.
    pub(super) fn answered(&self, session: &str, path: &str, until: Until) {
        if let Err(e) =
            self.change(|entries| entries.retain(|e| !e.same_wait(session, path, until)))
        {
            tracing::warn!("a standing wait answered by a wait could not be dropped: {e}");
        }
    }

    /// The standing waits of `session` whose path `sees` accepts, as they stand.
    pub(super) fn of_session(
        &self,
        session: &str,
        mut sees: impl FnMut(&str) -> bool,
    ) -> Vec<Entry> {
        self.entries
            .lock()
            .iter()
            .filter(|e| e.session == session && sees(&e.path))
            .cloned()
            .collect()
    }

    /// `wait --report`: the resolved waits of `session` it may see, taken out (durably)
    /// so they are reported once.
    pub(super) fn report(&self, session: &str, mut sees: impl FnMut(&str) -> bool) -> Reply {
        let taken = self.change(|entries| {
            let (out, keep): (Vec<Entry>, Vec<Entry>) = std::mem::take(entries)
                .into_iter()
                .partition(|e| e.session == session && e.state != State::Waiting && sees(&e.path));
            *entries = keep;
            out
        });
        match taken {
            Err(e) => Reply::refused(
                Some(Verb::Wait),
                &Refusal::new(
                    Reason::IoError,
                    format!("the standing waits could not be marked reported: {e}"),
                ),
                None,
            ),
            Ok(out) => {
                let message = match out.len() {
                    0 => "no standing wait resolved since the last report".to_string(),
                    _ => out.iter().map(Entry::line).collect::<Vec<_>>().join("; "),
                };
                let mut m = Map::new();
                m.insert(
                    "waits".into(),
                    Value::Array(out.iter().map(Entry::to_json).collect()),
                );
                Reply::ok(Verb::Wait, m, message)
            }
        }
    }
}

/// `.coherent/waits`: a session's waits in flight (path, state, how long), then its
/// standing waits.
pub(super) fn listing(
    in_flight: Vec<(String, Until, std::time::Duration)>,
    kept: &[Entry],
) -> Value {
    let now = Timestamp::now();
    let mut out: Vec<Value> = in_flight
        .into_iter()
        .map(|(path, until, waited)| {
            serde_json::json!({
                "path": path,
                "until": until,
                "standing": false,
                "state": State::Waiting,
                "registered": Timestamp(now.0 - waited.as_millis() as i64),
            })
        })
        .collect();
    out.extend(kept.iter().map(Entry::to_json));
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{DiskIo, LogFile, NewFile};
    use std::io;
    use std::os::unix::fs::PermissionsExt;

    fn entry(state: State) -> Entry {
        Entry {
            session: "alice".into(),
            path: "plan.md".into(),
            until: Until::Accepted,
            record_id: 7,
            registered: Timestamp(0),
            state,
            resolved: None,
            record: None,
        }
    }

    #[test]
    fn the_registry_survives_a_reopen_and_a_report_takes_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = Standing::open(dir.path(), Arc::new(DiskIo));
        s.change(|e| {
            e.push(entry(State::Reached));
            e.push(entry(State::Waiting));
        })
        .unwrap();
        let again = Standing::open(dir.path(), Arc::new(DiskIo));
        assert_eq!(again.of_session("alice", |_| true).len(), 2);
        let r = again.report("alice", |_| true);
        assert_eq!(r.body()["waits"].as_array().unwrap().len(), 1);
        let r = Standing::open(dir.path(), Arc::new(DiskIo)).report("alice", |_| true);
        assert_eq!(r.body()["waits"].as_array().unwrap().len(), 0);
        assert_eq!(
            Standing::open(dir.path(), Arc::new(DiskIo))
                .of_session("alice", |_| true)
                .len(),
            1
        );
    }

    #[test]
    fn a_broken_file_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), b"{not json").unwrap();
        let s = Standing::open(dir.path(), Arc::new(DiskIo));
        assert!(s.of_session("alice", |_| true).is_empty());
        assert!(dir.path().join(format!("{FILE}.bad")).exists());
    }

    /// What the next file written whole meets (the faults of a replacing file in
    /// tests/nomount/core_journal_faults.rs).
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Fault {
        None,
        /// Its write fails with `ENOSPC` after half its bytes.
        Write,
        /// Its fsync fails with `EIO`.
        Fsync,
    }

    /// The state directory on disk, with the fault of the moment.
    #[derive(Debug)]
    struct Faulty(Mutex<Fault>);

    struct FaultyNew {
        file: Box<dyn NewFile>,
        fault: Fault,
    }

    impl StateIo for Faulty {
        fn open_log(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
            DiskIo.open_log(path)
        }
        fn create(&self, path: &Path) -> io::Result<Box<dyn NewFile>> {
            Ok(Box::new(FaultyNew {
                file: DiskIo.create(path)?,
                fault: *self.0.lock(),
            }))
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            DiskIo.rename(from, to)
        }
        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            DiskIo.sync_dir(dir)
        }
    }

    impl NewFile for FaultyNew {
        fn write_part(&mut self, bytes: &[u8]) -> io::Result<()> {
            match self.fault {
                Fault::Write => {
                    self.file.write_part(&bytes[..bytes.len() / 2])?;
                    Err(io::Error::from_raw_os_error(libc::ENOSPC))
                }
                _ => self.file.write_part(bytes),
            }
        }
        fn sync_all(&mut self) -> io::Result<()> {
            match self.fault {
                Fault::Fsync => Err(io::Error::from_raw_os_error(libc::EIO)),
                _ => self.file.sync_all(),
            }
        }
    }

    #[test]
    fn a_failed_write_or_fsync_keeps_the_previous_registry_and_says_so() {
        for fault in [Fault::Write, Fault::Fsync] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(FILE);
            let io = Arc::new(Faulty(Mutex::new(Fault::None)));
            let s = Standing::open(dir.path(), io.clone());
            s.change(|e| {
                e.push(entry(State::Reached));
                e.push(entry(State::Waiting));
            })
            .unwrap();
            let before = std::fs::read_to_string(&path).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{fault:?}");

            // The report takes the resolved wait out: a change to save, which fails.
            *io.0.lock() = fault;
            let r = s.report("alice", |_| true);
            assert_eq!(r.reason(), Some(Reason::IoError), "{fault:?}: {r:?}");
            assert!(
                r.message().contains("could not be marked reported"),
                "{fault:?}"
            );
            assert_eq!(
                std::fs::read_to_string(&path).unwrap(),
                before,
                "{fault:?}: the previous standing-waits.json is intact"
            );
            assert!(
                !dir.path().join(format!("{FILE}.tmp")).exists(),
                "{fault:?}: no partial temporary is left"
            );
            // Undone in memory too, and a reopen (a crash now) finds both waits.
            assert_eq!(s.of_session("alice", |_| true).len(), 2, "{fault:?}");
            let reopened = Standing::open(dir.path(), Arc::new(DiskIo));
            assert_eq!(reopened.of_session("alice", |_| true).len(), 2, "{fault:?}");
            drop(reopened);

            // Once the fault clears, the same report goes through, once.
            *io.0.lock() = Fault::None;
            let r = s.report("alice", |_| true);
            assert_eq!(r.body()["waits"].as_array().unwrap().len(), 1, "{fault:?}");
            let again = Standing::open(dir.path(), Arc::new(DiskIo));
            assert_eq!(again.of_session("alice", |_| true).len(), 1, "{fault:?}");
        }
    }
}
