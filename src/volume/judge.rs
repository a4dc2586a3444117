//! The content judgement of a changed stamp (docs/versions-and-holds.md#content), off the
//! FUSE request threads: a BLAKE3 pass over a large handed file takes seconds, and anyone
//! who can `touch -a` its backing file can change its stamp as often as they like. A
//! request never waits on the hash but a write decision does, and only for a bounded time
//! (well under the kernel's request timeout: src/request_timeout.rs).
//!
//! - Once per stamp change: a path's last judgement (the stamp it was asked for, and the
//!   fingerprint with the stamp it was read at) answers every later ask of that stamp.
//! - Bounded per path: one judgement queued or running for a path at a time; an ask for
//!   a newer stamp while one runs waits for the next ask after it ends.
//! - Bounded per caller: a uid has at most [`PER_CALLER`] judgements queued or running on
//!   its behalf, all callers together at most [`QUEUE`]; past that an ask answers
//!   "pending" and queues nothing.
//! - [`WORKERS`] threads hash at most, started when there is work, gone when there is
//!   none.
//!
//! A finished judgement is applied to the engine by the worker itself (a `Same` restamps,
//! a `Changed` is an `external_change`), so the next open finds the stamp counted and asks
//! nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::coherence::{Print, Stamp};

/// Threads hashing at most (each is one core at most while it runs).
pub(super) const WORKERS: usize = 2;
/// Judgements queued or running on behalf of one uid.
pub(super) const PER_CALLER: usize = 4;
/// Judgements queued or running in all.
pub(super) const QUEUE: usize = 256;
/// Last judgements kept (one per path): past this the oldest half is forgotten (a path
/// forgotten is judged again at its next changed stamp).
const KEPT: usize = 4096;

/// What a reading of a file found: its fingerprint and the stamp it was read at (None: it
/// could not be read still, e.g. its stamp moved under every try).
pub(super) type Reading = Option<(Stamp, Print)>;

/// What an ask answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Judged: what the reading found.
    Ready(Reading),
    /// Not judged yet (queued, running, or over a bound).
    Pending,
}

/// Reads a file's fingerprint: (the stamp it was read at, its print).
pub(super) type Reader = dyn Fn(&str) -> Reading + Send + Sync;
/// Applies a finished judgement: (path, stamp asked, fingerprint).
pub(super) type Apply = dyn Fn(&str, Stamp, Reading) + Send + Sync;

struct Job {
    /// The newest stamp asked while queued (the reading takes the file as it is then).
    stamp: Stamp,
    /// The uid it counts against.
    uid: Option<u32>,
}

#[derive(Default)]
struct State {
    jobs: HashMap<String, Job>,
    queue: VecDeque<String>,
    per_uid: HashMap<u32, usize>,
    workers: usize,
    /// Each path's last judgement: the stamp asked, and what the reading found.
    judged: HashMap<String, (Stamp, Reading, u64)>,
    /// Judgements finished (orders `judged` by age; also what a waiter watches).
    finished: u64,
}

struct Inner {
    state: Mutex<State>,
    done: Condvar,
    read: Box<Reader>,
    apply: Box<Apply>,
}

/// The judge of one volume.
pub(super) struct Judge(Arc<Inner>);

impl Judge {
    pub(super) fn new(read: Box<Reader>, apply: Box<Apply>) -> Self {
        Judge(Arc::new(Inner {
            state: Mutex::new(State::default()),
            done: Condvar::new(),
            read,
            apply,
        }))
    }

    /// The judgement of `path` at stamp `st`, asked by `uid`: ready if this stamp (or the
    /// stamp the last reading found) was judged; else queued (within the bounds) and
    /// pending. Never waits on a hash.
    pub(super) fn ask(&self, path: &str, st: Stamp, uid: Option<u32>) -> Verdict {
        let mut s = self.0.state.lock();
        self.ask_locked(&mut s, path, st, uid)
    }

    /// The last judgement of `path`, if it answers for stamp `st`.
    fn judged(s: &State, path: &str, st: Stamp) -> Option<Verdict> {
        let (asked, got, _) = s.judged.get(path)?;
        (*asked == st || got.is_some_and(|(at, _)| at == st)).then_some(Verdict::Ready(*got))
    }

    fn ask_locked(&self, s: &mut State, path: &str, st: Stamp, uid: Option<u32>) -> Verdict {
        if let Some(v) = Self::judged(s, path, st) {
            return v;
        }
        if let Some(j) = s.jobs.get_mut(path) {
            j.stamp = st;
            return Verdict::Pending;
        }
        let mine = uid.map_or(0, |u| s.per_uid.get(&u).copied().unwrap_or(0));
        if s.jobs.len() >= QUEUE || mine >= PER_CALLER {
            tracing::debug!("{path}: content judgement not queued (bound reached)");
            return Verdict::Pending;
        }
        if let Some(u) = uid {
            *s.per_uid.entry(u).or_default() += 1;
        }
        s.jobs.insert(path.to_string(), Job { stamp: st, uid });
        s.queue.push_back(path.to_string());
        if s.workers < WORKERS {
            s.workers += 1;
            let inner = self.0.clone();
            let spawned = std::thread::Builder::new()
                .name("coherent-judge".into())
                .spawn(move || work(&inner));
            if let Err(e) = spawned {
                // The work stays queued for a worker that runs (or the next spawn).
                tracing::warn!("starting a content-judgement thread: {e}");
                s.workers -= 1;
            }
        }
        Verdict::Pending
    }

    /// [`Judge::ask`], then waits for the judgement until `deadline` (a write decision:
    /// it may not go on an unjudged change of a handed file).
    pub(super) fn wait(&self, path: &str, st: Stamp, uid: Option<u32>, until: Instant) -> Verdict {
        let mut s = self.0.state.lock();
        loop {
            let v = self.ask_locked(&mut s, path, st, uid);
            if v != Verdict::Pending || !s.jobs.contains_key(path) {
                return v;
            }
            if self.0.done.wait_until(&mut s, until).timed_out() {
                return Self::judged(&s, path, st).unwrap_or(Verdict::Pending);
            }
        }
    }

    /// Judgements queued or running now (for tests and the log).
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.0.state.lock().jobs.len()
    }
}

/// A worker: judges queued paths until none is left.
fn work(inner: &Inner) {
    loop {
        let (path, st) = {
            let mut s = inner.state.lock();
            let Some(path) = s.queue.pop_front() else {
                s.workers -= 1;
                return;
            };
            let st = s.jobs.get(&path).map(|j| j.stamp);
            match st {
                Some(st) => (path, st),
                None => continue,
            }
        };
        let got = (inner.read)(&path);
        // Applied before the job is marked done: a waiter woken then finds it counted.
        (inner.apply)(&path, st, got);
        let mut s = inner.state.lock();
        if let Some(j) = s.jobs.remove(&path) {
            if let Some(u) = j.uid {
                if let Some(n) = s.per_uid.get_mut(&u) {
                    *n -= 1;
                    if *n == 0 {
                        s.per_uid.remove(&u);
                    }
                }
            }
        }
        s.finished += 1;
        let n = s.finished;
        if s.judged.len() >= KEPT {
            let mut ages: Vec<u64> = s.judged.values().map(|x| x.2).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            s.judged.retain(|_, x| x.2 > cut);
        }
        s.judged.insert(path, (st, got, n));
        inner.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn st(ctime: i64) -> Stamp {
        Stamp {
            ino: 1,
            ctime_ns: ctime,
            size: 5,
            mtime_ns: 1,
        }
    }

    fn print() -> Print {
        Print {
            size: 5,
            digest: [7; 32],
        }
    }

    /// A gate a reading waits at until it opens.
    type Gate = Arc<(Mutex<bool>, Condvar)>;

    /// A judge whose reading blocks until `gate` opens, counting the readings.
    fn gated() -> (Judge, Gate, Arc<AtomicUsize>) {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let reads = Arc::new(AtomicUsize::new(0));
        let (g, r) = (gate.clone(), reads.clone());
        let judge = Judge::new(
            Box::new(move |_| {
                r.fetch_add(1, Ordering::SeqCst);
                let mut open = g.0.lock();
                while !*open {
                    g.1.wait(&mut open);
                }
                Some((st(2), print()))
            }),
            Box::new(|_, _, _| {}),
        );
        (judge, gate, reads)
    }

    fn open(gate: &(Mutex<bool>, Condvar)) {
        *gate.0.lock() = true;
        gate.1.notify_all();
    }

    #[test]
    fn an_ask_never_waits_and_a_stamp_is_read_once() {
        let (j, gate, reads) = gated();
        assert_eq!(j.ask("a", st(2), Some(1)), Verdict::Pending);
        // More asks while it runs: no second job for the path.
        for c in 3..50 {
            assert_eq!(j.ask("a", st(c), Some(1)), Verdict::Pending);
        }
        assert_eq!(j.pending(), 1);
        assert!(j.0.state.lock().queue.len() <= 1, "a path queued twice");
        open(&gate);
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(
            j.wait("a", st(2), Some(1), far),
            Verdict::Ready(Some((st(2), print())))
        );
        // The stamp judged answers again without a reading.
        for _ in 0..10 {
            assert_eq!(
                j.ask("a", st(2), Some(1)),
                Verdict::Ready(Some((st(2), print())))
            );
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        // Once the workers are idle, every judgement counted against the caller was
        // given back (else its bound would fill for good).
        let idle = Instant::now() + Duration::from_secs(60);
        while j.0.state.lock().workers > 0 && Instant::now() < idle {
            std::thread::yield_now();
        }
        assert!(j.0.state.lock().per_uid.is_empty());
    }

    #[test]
    fn bounded_per_caller_and_a_wait_ends_at_its_deadline() {
        let (j, gate, _) = gated();
        for i in 0..PER_CALLER + 3 {
            assert_eq!(j.ask(&format!("p{i}"), st(2), Some(7)), Verdict::Pending);
        }
        assert_eq!(j.pending(), PER_CALLER, "one uid queued past its bound");
        // Another caller still gets its own.
        j.ask("q", st(2), Some(8));
        assert_eq!(j.pending(), PER_CALLER + 1);
        let t = Instant::now();
        let soon = t + Duration::from_millis(200);
        assert_eq!(j.wait("q", st(2), Some(8), soon), Verdict::Pending);
        assert!(t.elapsed() < Duration::from_secs(30));
        open(&gate);
    }
}
