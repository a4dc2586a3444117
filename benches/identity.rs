//! Session resolution cost: `cargo bench --bench identity`.
//!
//! The subject is a real `sleep` child carrying this process's environment plus a
//! `COHERENT_SESSION` tag (so `environ` is as long as a real shell's). Medians are in
//! `target/criterion/identity/*/new/estimates.json`.

use coherent::identity::{procfs, Resolver, ResolverConfig};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tagged_child(tag: Option<&str>) -> Kid {
    let mut c = Command::new("sleep");
    c.arg("3600")
        .env_remove("COHERENT_SESSION")
        .env_remove("CLAUDE_CODE_SESSION_ID");
    if let Some(t) = tag {
        c.env("COHERENT_SESSION", t);
    }
    let kid = Kid(c.spawn().expect("spawn sleep"));
    // spawn returns mid-execve; wait until the new environment block is in place.
    while procfs::read_stat(kid.0.id()).unwrap().stamp.env_end == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    kid
}

fn bench(c: &mut Criterion) {
    let kid = tagged_child(Some("bench-session"));
    let untagged = tagged_child(None);
    let pid = kid.0.id();
    let bare = untagged.0.id();
    let r = Arc::new(Resolver::new(ResolverConfig::default()));
    assert_eq!(r.resolve(pid).unwrap().name, "bench-session");

    let mut g = c.benchmark_group("identity");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));

    // The floor of a warm lookup: the one /proc read it makes.
    g.bench_function("stat_read", |b| {
        b.iter(|| procfs::read_stat(black_box(pid)).unwrap())
    });
    // For comparison only: a stat(2) of /proc/PID, the cheapest /proc call there is.
    let dir = format!("/proc/{pid}");
    g.bench_function("statx_proc_dir_reference", |b| {
        b.iter(|| std::fs::metadata(black_box(&dir)).unwrap())
    });
    let stamp = procfs::read_stat(pid).unwrap().stamp;
    g.bench_function("cache_get_only", |b| {
        b.iter(|| r.cache().get(black_box(pid), &stamp).unwrap())
    });
    // Warm, validated by a pread of the held stat file (the default)...
    g.bench_function("warm", |b| b.iter(|| r.resolve(black_box(pid)).unwrap()));
    // ...and by opening /proc/PID/stat again (when the budget of held files is spent).
    let reopen = Resolver::new(ResolverConfig {
        held_stat_files: 0,
        ..ResolverConfig::default()
    });
    reopen.resolve(pid).unwrap();
    g.bench_function("warm_reopen_stat", |b| {
        b.iter(|| reopen.resolve(black_box(pid)).unwrap())
    });
    assert!(r.stats().held_stat_files > 0, "held mode in the bench");
    g.bench_function("cold_env_tag", |b| {
        b.iter(|| {
            r.cache().clear();
            r.resolve(black_box(pid)).unwrap()
        })
    });
    g.bench_function("cold_untagged", |b| {
        b.iter(|| {
            r.cache().clear();
            r.resolve(black_box(bare)).unwrap()
        })
    });
    // Two threads hitting the warm path at once (the mount's worker threads): time per
    // lookup per thread.
    r.resolve(pid).unwrap();
    r.resolve(bare).unwrap();
    g.bench_function("warm_2_threads", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let workers: Vec<_> = [pid, bare]
                .into_iter()
                .map(|p| {
                    let r = r.clone();
                    std::thread::spawn(move || {
                        for _ in 0..iters {
                            black_box(r.resolve(p).unwrap());
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            start.elapsed()
        })
    });
    g.bench_function("session_alive_cached_live", |b| {
        b.iter(|| assert!(r.session_alive("bench-session")))
    });
    g.sample_size(10);
    g.bench_function("session_alive_dead_full_scan", |b| {
        b.iter(|| assert!(!r.session_alive("no-such-session")))
    });
    g.finish();
    drop(kid);
    drop(untagged);
}

criterion_group!(benches, bench);
criterion_main!(benches);
