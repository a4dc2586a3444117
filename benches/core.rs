//! Core benchmark (docs/design.md#speed): `cargo bench --bench core`.
//!
//! With 100,000 tracked paths, 1,000 sessions and 10,000 transfer records:
//! - the write decision per route (`Engine::decide`: the fence of a setattr, and an open
//!   for write with its acquire and release), `open_read`, one thread and two threads;
//! - commits with the grouped journal append (commits/s, durable at the end);
//! - memory per tracked path (bytes, counted by a wrapping global allocator);
//! - rebuilding the state from a log of 1,000,000 events (and from a snapshot + tail).

use coherent::coherence::*;
use coherent::identity::{Session, SessionInfo, Via};
use coherent::journal::{Journal, JournalOptions, LOG, SNAPSHOT};
use criterion::{criterion_group, criterion_main, Criterion};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// CPU time of this process (robust to other processes sharing the cores).
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Median wall time per call over batches of `per` calls: batches hit by preemption (the
/// machine is shared) fall in the tail, not at the median.
fn median_per_op(batches: usize, per: usize, mut f: impl FnMut()) -> Duration {
    let mut v: Vec<Duration> = (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per {
                f();
            }
            t.elapsed() / per as u32
        })
        .collect();
    v.sort();
    v[batches / 2]
}

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call goes to System unchanged; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

const PATHS: usize = 100_000;
const SESSIONS: usize = 1_000;
const RECORDS: usize = 10_000;
const T0: i64 = 1_790_000_000_000;

fn t() -> Timestamp {
    Timestamp::from_millis(T0)
}

fn sess(i: usize) -> Session {
    let name = format!("agent-{i:04}");
    Arc::new(SessionInfo::from_tag(
        Some("COHERENT_SESSION"),
        &name,
        Via::Env {
            var: "COHERENT_SESSION".into(),
        },
    ))
}

fn path(i: usize) -> String {
    format!("src/dir{:03}/file{:06}.rs", i % 997, i)
}

fn stamp(i: usize) -> Option<Stamp> {
    Some(Stamp {
        ino: i as u64,
        ctime_ns: i as i64,
        size: 100,
        mtime_ns: i as i64,
    })
}

/// The populated engine of the issue: 100k paths, 1k sessions, 10k live records.
fn populated(sink: Arc<dyn EventSink>) -> (Engine, Vec<Session>, Vec<String>) {
    let e = Engine::new(Config::default(), sink);
    let ss: Vec<Session> = (0..SESSIONS).map(sess).collect();
    for s in &ss {
        e.session_seen(s, t());
    }
    let ps: Vec<String> = (0..PATHS).map(path).collect();
    for (i, p) in ps.iter().enumerate() {
        e.observe(p, stamp(i), t());
    }
    for (i, p) in ps.iter().take(RECORDS).enumerate() {
        let g = &ss[i % SESSIONS];
        e.open_read(g, p, t());
        e.transfer(
            g,
            std::slice::from_ref(p),
            &ss[(i + 1) % SESSIONS].name,
            None,
            t(),
        )
        .unwrap();
    }
    (e, ss, ps)
}

/// The write decision of a setattr on `p` (the fence; no hold is taken): the same work
/// `check_write` measured before `decide` existed.
fn decide(e: &Engine, s: &Session, p: &str) -> Result<Permit, coherent::error::Refusal> {
    e.decide(s, Write::Setattr(At::unseen(p)), t())
}

/// An open for write of untouched path `i` as the mount decides it (the backing stamp
/// observed, the fence, the stale guard, the acquire) and its release.
fn open_write(e: &Engine, s: &Session, ps: &[String], i: usize) {
    let p = &ps[i];
    let at = At::new(p, Found::File(stamp(i).unwrap()));
    let pm = e.decide(s, Write::Open(at), t()).unwrap();
    e.close_write(&pm.session, &pm.path, false, t());
}

fn fence(c: &mut Criterion) {
    let (e, ss, ps) = populated(Arc::new(MemorySink::discarding()));
    let e = Arc::new(e);
    let mut i = 0usize;
    let m = median_per_op(3000, 1000, || {
        i = (i + 7919) % RECORDS;
        let s = &ss[(i + 500) % SESSIONS];
        black_box(decide(&e, s, &ps[i])).unwrap();
    });
    println!("fence: decide (setattr, path with a live record, bystander): median {m:?} per decision, 1 thread");
    let m = median_per_op(3000, 1000, || {
        i = (i + 7919) % RECORDS;
        let s = &ss[i % SESSIONS];
        black_box(decide(&e, s, &ps[i])).unwrap_err();
    });
    println!("fence: decide refused (the giver; builds the deny text, logs denied): median {m:?}");
    let m = median_per_op(3000, 1000, || {
        i = (i + 7919) % PATHS;
        black_box(e.open_read(&ss[i % SESSIONS], &ps[i], t()));
    });
    println!("fence: open_read: median {m:?} per open, 1 thread");
    let m = median_per_op(3000, 1000, || {
        i = (i + 7919) % (PATHS - RECORDS);
        open_write(&e, &ss[i % SESSIONS], &ps, RECORDS + i);
    });
    println!(
        "fence: decide an open for write (observe, fence, stale guard, acquire) + close_write: median {m:?}"
    );
    let meds: Vec<Duration> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2usize)
            .map(|k| {
                let (e, ss, ps) = (&e, &ss, &ps);
                sc.spawn(move || {
                    let mut j = k * 31;
                    median_per_op(3000, 1000, || {
                        j = (j + 7919) % PATHS;
                        let _ = black_box(decide(e, &ss[(j + 500) % SESSIONS], &ps[j]));
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    println!("fence: decide with 2 threads at once: median {meds:?} per decision per thread");
    let mut g = c.benchmark_group("fence");
    // A bystander opening a path with a live record for write (allowed).
    g.bench_function("decide_on_handed_path", |b| {
        b.iter(|| {
            i = (i + 7919) % RECORDS;
            let s = &ss[(i + 500) % SESSIONS];
            black_box(decide(&e, s, &ps[i])).unwrap();
        })
    });
    g.bench_function("decide_on_untouched_path", |b| {
        b.iter(|| {
            i = (i + 7919) % PATHS;
            let s = &ss[i % SESSIONS];
            let _ = black_box(decide(&e, s, &ps[RECORDS + i % (PATHS - RECORDS)]));
        })
    });
    g.bench_function("open_read", |b| {
        b.iter(|| {
            i = (i + 7919) % PATHS;
            black_box(e.open_read(&ss[i % SESSIONS], &ps[i], t()));
        })
    });
    // Two threads deciding at once (different random paths): wall time per decision per
    // thread.
    g.bench_function("decide_2_threads", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|sc| {
                for k in 0..2usize {
                    let (e, ss, ps) = (&e, &ss, &ps);
                    sc.spawn(move || {
                        let mut j = k * 31;
                        for _ in 0..iters {
                            j = (j + 7919) % PATHS;
                            let _ = black_box(decide(e, &ss[(j + 500) % SESSIONS], &ps[j]));
                        }
                    });
                }
            });
            start.elapsed()
        })
    });
    g.finish();
}

fn commits(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let o = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
    let ss: Vec<Session> = (0..SESSIONS).map(sess).collect();
    let ps: Vec<String> = (0..PATHS).map(path).collect();
    let mut g = c.benchmark_group("journal");
    g.throughput(criterion::Throughput::Elements(1));
    let mut i = 0usize;
    // A commit appended to the log, grouped fsync; the batch is made durable at the end
    // of each sample, so the figure includes the fsyncs.
    g.bench_function("commit_grouped", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                i += 1;
                o.engine.commit(
                    &ss[i % SESSIONS],
                    &ps[i % PATHS],
                    CommitOp::Write,
                    stamp(i),
                    t(),
                );
            }
            o.journal.flush().unwrap();
            start.elapsed()
        })
    });
    g.finish();
}

fn memory() {
    let before = LIVE.load(Ordering::SeqCst);
    let e = Engine::new(Config::default(), Arc::new(MemorySink::discarding()));
    let ps: Vec<String> = (0..PATHS).map(path).collect();
    let names_bytes: usize = ps.iter().map(|p| p.capacity()).sum::<usize>() + ps.capacity() * 24;
    let mid = LIVE.load(Ordering::SeqCst);
    for (i, p) in ps.iter().enumerate() {
        e.observe(p, stamp(i), t());
    }
    let after_seen = LIVE.load(Ordering::SeqCst);
    let s = sess(1);
    for p in &ps {
        e.open_read(&s, p, t());
    }
    let after_read = LIVE.load(Ordering::SeqCst);
    println!(
        "memory: {} bytes per tracked path (version, stamp, map slot, path name); +{} bytes per (session, path) hold/view; (test vector of names: {} bytes, not counted; engine empty: {} bytes)",
        (after_seen - mid) as usize / PATHS,
        (after_read - after_seen) as usize / PATHS,
        names_bytes,
        mid - before - names_bytes as isize,
    );
    drop(e);
}

fn rebuild() {
    const EVENTS: u64 = 1_000_000;
    let dir = tempfile::tempdir().unwrap();
    {
        let o = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
        let (e, j) = (&o.engine, &o.journal);
        let ss: Vec<Session> = (0..SESSIONS).map(sess).collect();
        let mut i = 0usize;
        // Realistic mix: mostly commits over 100k paths, with reads, transfers and
        // answers among them.
        while e.last_seq() < EVENTS {
            i += 1;
            let s = &ss[i % SESSIONS];
            let p = path(i % PATHS);
            if i % 10 == 0 {
                e.open_read(s, &p, t());
                let _ = e.transfer(
                    s,
                    std::slice::from_ref(&p),
                    &ss[(i + 1) % SESSIONS].name,
                    None,
                    t(),
                );
            } else if i % 10 == 1 {
                let p = path((i - 1) % PATHS);
                let _ = e.accept(&ss[i % SESSIONS], &[p], t());
            } else {
                e.commit(s, &p, CommitOp::Write, stamp(i), t());
            }
        }
        j.flush().unwrap();
    }
    let len = std::fs::metadata(dir.path().join(LOG)).unwrap().len();
    let mut runs = Vec::new();
    let mut cpu = Vec::new();
    let mut seq = 0;
    for _ in 0..3 {
        let start = Instant::now();
        let c0 = cpu_time();
        let o = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
        runs.push(start.elapsed());
        cpu.push(cpu_time() - c0);
        seq = o.engine.last_seq();
        assert!(o.warnings.is_empty());
        assert!(!o.from_snapshot);
    }
    runs.sort();
    println!(
        "rebuild: {seq} events ({:.0} MiB log) in {:?} median of 3 ({:?})",
        len as f64 / (1 << 20) as f64,
        runs[1],
        runs
    );
    cpu.sort();
    println!("rebuild: CPU time median of 3: {:?}", cpu[1]);
    // How much of it is reading and parsing the JSON lines alone.
    let start = Instant::now();
    let (n, ..) = coherent::journal::replay_log(&dir.path().join(LOG), 0, 0, |ev| {
        black_box(ev);
    })
    .unwrap();
    println!("rebuild: parsing alone {n} events: {:?}", start.elapsed());
    // With a snapshot at the end: only the snapshot is read.
    {
        let o = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
        o.journal.checkpoint(&o.engine).unwrap();
    }
    let snap = std::fs::metadata(dir.path().join(SNAPSHOT)).unwrap().len();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        let o = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
        runs.push(start.elapsed());
        assert!(o.from_snapshot);
    }
    runs.sort();
    println!(
        "rebuild from snapshot ({:.1} MiB): {:?} median of 3",
        snap as f64 / (1 << 20) as f64,
        runs[1]
    );
}

fn parse(c: &mut Criterion) {
    let line = br#"{"seq":123456,"ts":"2026-11-30T12:16:33.123Z","event":"commit","path":"src/dir123/file012345.rs","session":"agent-0123","agent":"27a468b0-7fa2-5c0d-a2ba-2dac753b2070","version":17,"op":"write","stamp":{"ino":123456,"ctime_ns":1790000000000000000,"size":100}}"#;
    c.bench_function("parse_commit_line", |b| {
        b.iter(|| black_box(serde_json::from_slice::<Event>(black_box(line)).unwrap()))
    });
    // The same line into a struct of borrowed fields: what allocation costs.
    #[allow(dead_code)]
    #[derive(serde::Deserialize)]
    struct Borrowed<'a> {
        seq: u64,
        ts: &'a str,
        event: &'a str,
        path: Option<&'a str>,
        session: Option<&'a str>,
        agent: Option<&'a str>,
        version: Option<u64>,
        op: Option<&'a str>,
        stamp: Option<Stamp>,
    }
    c.bench_function("parse_commit_line_borrowed", |b| {
        b.iter(|| black_box(serde_json::from_slice::<Borrowed>(black_box(line)).unwrap()))
    });
    c.bench_function("parse_commit_line_as_value", |b| {
        b.iter(|| black_box(serde_json::from_slice::<serde_json::Value>(black_box(line)).unwrap()))
    });
}

fn figures(_c: &mut Criterion) {
    if std::env::var_os("CORE_BENCH_SKIP_FIGURES").is_some() {
        return;
    }
    memory();
    rebuild();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = figures, fence, commits, parse
}
criterion_main!(benches);
