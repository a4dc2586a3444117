//! Cost of one `Tracking::is_tracked` call, warm: `cargo bench --bench tracking`.
//!
//! A workspace with a `.gitignore` at the root and one a level down (and a
//! `.coherentignore`), asked about paths 5 levels deep. Medians are in
//! `target/criterion/tracking/*/new/estimates.json`.

use coherent::tracking::Tracking;
use criterion::{criterion_group, criterion_main, Criterion};
use std::fs;
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    fs::write(
        root.join(".gitignore"),
        "/target/\n*.log\n*.tmp\nnode_modules/\n.DS_Store\n*.swp\n__pycache__/\n*.pyc\n",
    )
    .unwrap();
    fs::create_dir_all(root.join("src/a/b/c")).unwrap();
    fs::write(
        root.join("src/.gitignore"),
        "generated/\n*.bak\n!keep.bak\n",
    )
    .unwrap();
    fs::write(root.join(".coherentignore"), "secrets/\n!important.log\n").unwrap();
    let t = Tracking::open(root, false).unwrap();

    let mut g = c.benchmark_group("tracking");
    let tracked = "src/a/b/c/main.rs";
    let ignored = "src/a/b/c/debug.log";
    let in_ignored_dir = "target/debug/deps/x/libfoo.rlib";
    let in_git = "sub/.git/objects/ab/cdef0123";
    assert!(t.is_tracked(tracked, false));
    assert!(!t.is_tracked(ignored, false));
    assert!(!t.is_tracked(in_ignored_dir, false));
    assert!(!t.is_tracked(in_git, false));
    g.bench_function("tracked_5_deep", |b| {
        b.iter(|| t.is_tracked(black_box(tracked), false))
    });
    g.bench_function("ignored_5_deep", |b| {
        b.iter(|| t.is_tracked(black_box(ignored), false))
    });
    g.bench_function("in_ignored_dir_5_deep", |b| {
        b.iter(|| t.is_tracked(black_box(in_ignored_dir), false))
    });
    g.bench_function("under_git_5_deep", |b| {
        b.iter(|| t.is_tracked(black_box(in_git), false))
    });
    // Cold: every call starts from an empty cache (the cost after an invalidate).
    g.bench_function("cold_5_deep", |b| {
        b.iter(|| {
            t.invalidate(".gitignore");
            t.is_tracked(black_box(tracked), false)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
