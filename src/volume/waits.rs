//! `wait PATH [UNTIL]` on `ctl` (docs/design.md#control-surface), answered without parking a FUSE
//! thread.
//!
//! The write of a `wait` request is answered at once: refused (with its errno) when there is
//! no record to wait for, with the reply when the state is already reached, and otherwise
//! with success while the handle becomes *waiting*. A read of a waiting handle is not
//! answered: its [`ReadDone`] is kept here, and the FUSE thread goes back to serve other
//! requests. One thread (`coherent-wait`) sleeps on the engine's record-change counter
//! ([`Engine::wait_change`]), so it looks again as soon as any record changes, and answers
//! the kept reads when their state is reached, when their request's deadline passes (at
//! most [`MAX_WAIT_SECS`], and at most half the kernel's FUSE request timeout when one is
//! set: [`request_timeout`]; the reply says `"reached": false` and the client asks
//! again), or when the reader was killed.
//!
//! Why the read and not the write: the kernel holds a FUSE file's inode lock for the whole
//! of a write to a file of size 0, so a pending write on `ctl` would hold up every other
//! request on `ctl` (the `accept` being waited for included). Reads take no inode lock.
//!
//! Why the killed-reader check: fuser does not act on `FUSE_INTERRUPT`, and a task killed
//! in the middle of a FUSE request stays in the kernel until the request is answered.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use crate::coherence::{Engine, RecordJson, Until, WaitState};
use crate::control::{describe_record, Reply, Verb, MAX_WAIT_SECS};
use crate::error::Refusal;
use crate::fs::ReadDone;
use crate::request_timeout;
use crate::store::FsError;

/// The longest the wait thread sleeps without a change.
const IDLE_LOOK: Duration = Duration::from_secs(5);

/// How often kept reads are checked for a killed reader.
const KILLED_CHECK: Duration = Duration::from_millis(250);

/// One read kept until its wait is answered.
struct Reader {
    offset: u64,
    size: u32,
    tid: u32,
    done: ReadDone,
}

/// One waiting `ctl` handle.
pub(super) struct Wait {
    /// The session that asked (`.coherent/waits` lists a session's waits in flight).
    session: String,
    path: String,
    record: u64,
    until: Until,
    started: Instant,
    deadline: Instant,
    readers: Vec<Reader>,
}

/// The waiting handles, by handle token. Lock order: a handle's lock, then this.
#[derive(Default)]
pub(super) struct Waits {
    map: Mutex<HashMap<u64, Wait>>,
}

/// What a request's check says.
pub(super) enum Check {
    /// Answer now.
    Now(Reply),
    /// Not yet: make the handle wait.
    Later(Wait),
}

/// The reply of a wait that ended: reached or not, with the record as it stands.
fn answer(path: &str, until: Until, rec: &RecordJson, reached: bool, waited: Duration) -> Reply {
    let rec = serde_json::to_value(rec).unwrap_or(Value::Null);
    let line = describe_record(Verb::Wait, &rec);
    let message = if reached {
        format!(
            "{path_q}: {} reached; {line}",
            until.as_str(),
            path_q = crate::names::display_name(path)
        )
    } else {
        format!(
            "{path_q}: not {} yet after {:.1} s; {line}",
            until.as_str(),
            waited.as_secs_f64(),
            path_q = crate::names::display_name(path)
        )
    };
    let mut m = Map::new();
    m.insert("reached".into(), reached.into());
    m.insert("until".into(), until.as_str().into());
    m.insert("path".into(), path.into());
    m.insert("record".into(), rec);
    m.insert("waited_ms".into(), json!(waited.as_millis() as u64));
    Reply::ok(Verb::Wait, m, message)
}

fn refused(path: &str, f: &Refusal) -> Reply {
    Reply::refused(Some(Verb::Wait), f, Some(path))
}

/// Check a new `wait` request (the write): now, or later.
pub(super) fn check(
    engine: &Engine,
    session: &str,
    path: &str,
    until: Until,
    timeout_ms: Option<u64>,
) -> Check {
    let started = Instant::now();
    // The read that waits is a FUSE request: never longer than the kernel lets it be held.
    let cap = request_timeout::cap(Duration::from_secs_f64(MAX_WAIT_SECS));
    let limit = timeout_ms.map_or(cap, |t| Duration::from_millis(t).min(cap));
    let record = match engine.wait_target(path) {
        Ok(id) => id,
        Err(f) => return Check::Now(refused(path, &f)),
    };
    match engine.wait_state(path, record, until) {
        Err(f) => Check::Now(refused(path, &f)),
        Ok(WaitState::Reached(r)) => Check::Now(answer(path, until, &r, true, Duration::ZERO)),
        Ok(WaitState::Pending(r)) if limit.is_zero() => {
            Check::Now(answer(path, until, &r, false, Duration::ZERO))
        }
        Ok(WaitState::Pending(_)) => Check::Later(Wait {
            session: session.to_string(),
            path: path.to_string(),
            record,
            until,
            started,
            deadline: started + limit,
            readers: Vec::new(),
        }),
    }
}

/// The reply a waiting handle holds until its wait is answered (never read: reads wait).
pub(super) fn placeholder(w: &Wait) -> Reply {
    let (path, until) = (&w.path, w.until);
    let mut m = Map::new();
    m.insert("pending".into(), true.into());
    m.insert("until".into(), until.as_str().into());
    Reply::ok(
        Verb::Wait,
        m,
        format!(
            "{path_q}: waiting for {}",
            until.as_str(),
            path_q = crate::names::display_name(path)
        ),
    )
}

/// Is task `tid` being killed (SIGKILL pending, which is also what a fatal signal turns
/// into), or gone?
fn killed(tid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return true;
    };
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    text.lines()
        .filter_map(|l| {
            l.strip_prefix("SigPnd:")
                .or_else(|| l.strip_prefix("ShdPnd:"))
        })
        .filter_map(|v| u64::from_str_radix(v.trim(), 16).ok())
        .any(|mask| mask & SIGKILL_BIT != 0)
}

impl Waits {
    pub(super) fn start(&self, token: u64, w: Wait) {
        tracing::debug!(token, path = %w.path, until = w.until.as_str(), "wait pending");
        self.map.lock().insert(token, w);
    }

    /// Keep a read of a waiting handle; gives `done` back if the handle is not waiting.
    /// Call with the handle locked.
    pub(super) fn keep_read(
        &self,
        token: u64,
        offset: u64,
        size: u32,
        tid: u32,
        done: ReadDone,
    ) -> Option<ReadDone> {
        match self.map.lock().get_mut(&token) {
            Some(w) => {
                w.readers.push(Reader {
                    offset,
                    size,
                    tid,
                    done,
                });
                None
            }
            None => Some(done),
        }
    }

    /// The handle is waiting no more (a new request on it, or released). Call with the
    /// handle locked; answer the returned reads (none in a sane client) after unlocking.
    pub(super) fn stop(&self, token: u64) -> Option<Vec<(u64, u32, ReadDone)>> {
        self.map.lock().remove(&token).map(|w| {
            w.readers
                .into_iter()
                .map(|r| (r.offset, r.size, r.done))
                .collect()
        })
    }

    /// The waits to answer now, with their replies (they stay registered until
    /// [`Waits::stop`]), the reads of killed readers (taken out, to fail with `EINTR`),
    /// and when to look again at the latest.
    pub(super) fn due(&self, engine: &Engine) -> (Vec<(u64, Reply)>, Vec<ReadDone>, Instant) {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut gone = Vec::new();
        // Never sleep long: a missed wake-up (there should be none) costs seconds, not a
        // hung unmount.
        let mut next = now + IDLE_LOOK;
        let mut map = self.map.lock();
        for (token, w) in map.iter_mut() {
            let reply = match engine.wait_state(&w.path, w.record, w.until) {
                Err(f) => Some(refused(&w.path, &f)),
                Ok(WaitState::Reached(r)) => {
                    Some(answer(&w.path, w.until, &r, true, now - w.started))
                }
                Ok(WaitState::Pending(r)) if now >= w.deadline => {
                    Some(answer(&w.path, w.until, &r, false, now - w.started))
                }
                Ok(WaitState::Pending(_)) => None,
            };
            if let Some(r) = reply {
                out.push((*token, r));
                continue;
            }
            next = next.min(w.deadline);
            if !w.readers.is_empty() {
                let (dead, alive): (Vec<Reader>, Vec<Reader>) =
                    w.readers.drain(..).partition(|r| killed(r.tid));
                w.readers = alive;
                gone.extend(dead.into_iter().map(|r| r.done));
                if !w.readers.is_empty() {
                    next = next.min(now + KILLED_CHECK);
                }
            }
        }
        (out, gone, next)
    }

    /// (session, path, state) of a waiting handle.
    pub(super) fn key(&self, token: u64) -> Option<(String, String, Until)> {
        let map = self.map.lock();
        let w = map.get(&token)?;
        Some((w.session.clone(), w.path.clone(), w.until))
    }

    /// The waits in flight of `session`: (path, state, how long it has waited).
    pub(super) fn of_session(&self, session: &str) -> Vec<(String, Until, Duration)> {
        self.map
            .lock()
            .values()
            .filter(|w| w.session == session)
            .map(|w| (w.path.clone(), w.until, w.started.elapsed()))
            .collect()
    }

    /// No handle is waiting.
    pub(super) fn is_empty(&self) -> bool {
        self.map.lock().is_empty()
    }

    /// Every waiting handle (at unmount).
    pub(super) fn tokens(&self) -> Vec<u64> {
        self.map.lock().keys().copied().collect()
    }
}

/// Answer kept reads that lost their wait.
pub(super) fn interrupted(reads: impl IntoIterator<Item = ReadDone>) {
    for done in reads {
        done(Err(FsError(libc::EINTR)));
    }
}
