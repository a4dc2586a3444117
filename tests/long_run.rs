//! Long-running pressure on a real mount (issue 9): the daemon's descriptors stay bounded
//! however many files the kernel caches.
//!
//! This test binary lowers its own `RLIMIT_NOFILE` (soft and hard) before it starts a
//! daemon, so the daemon runs as if started under `ulimit -n 256` and cannot raise it.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Mount;

const LIMIT: u64 = 256;
const FILES: usize = 20_000;

fn lower_nofile(limit: u64) {
    let rl = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: setrlimit reads the struct we pass.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) }, 0);
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn twenty_thousand_files_under_ulimit_256() {
    lower_nofile(LIMIT);
    let m = Mount::new(true);
    let pid = m.pid();
    // Sample the daemon's descriptor count while the files are made and looked at.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(fd_count(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // Create, write, stat and read back every file through the mount: each one is a
    // node the kernel caches (and so the daemon remembers).
    let script = format!(
        r#"
import os
os.makedirs("many/a", exist_ok=True)
os.makedirs("many/b", exist_ok=True)
for i in range({FILES}):
    with open(f"many/{{'ab'[i % 2]}}/f{{i}}", "w") as f:
        f.write(str(i))
n = 0
for i in range({FILES}):
    p = f"many/{{'ab'[i % 2]}}/f{{i}}"
    os.stat(p)
    with open(p) as f:
        assert f.read() == str(i), p
    n += 1
print(n)
"#
    );
    let out = m.sh_ok(&format!("python3 -c '{}'", script.replace('\'', "'\\''")));
    assert_eq!(out.trim(), FILES.to_string());
    // A listing of everything, then a rename and removal of every other file.
    let listed = m.sh_ok("find many -type f | wc -l");
    assert_eq!(listed.trim(), FILES.to_string());
    m.sh_ok("for i in $(seq 0 2 998); do mv many/a/f$i many/b/g$i && rm many/b/g$i; done");
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    let log = m.log();
    assert!(
        peak < LIMIT as usize,
        "daemon held {peak} descriptors (limit {LIMIT})\n{log}"
    );
    for bad in ["Too many open files", "no longer durable", "ERROR"] {
        assert!(!log.contains(bad), "daemon log has {bad:?}:\n{log}");
    }
    // Still serving, and still seeing what was made.
    assert_eq!(
        std::fs::read_to_string(m.path("many/b/f19999")).unwrap(),
        "19999"
    );
    assert!(!m.path("many/a/f0").exists());
    eprintln!("{FILES} files under ulimit -n {LIMIT}: peak {peak} descriptors in the daemon");
}
