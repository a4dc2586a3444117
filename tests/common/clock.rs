//! A suspend, as a daemon's clocks see it, on one machine: an `LD_PRELOAD` shim (built
//! here with gcc into a temporary directory) that shifts what `clock_gettime` answers in
//! the daemon. While a laptop sleeps (or, in many setups, a VM is paused)
//! `CLOCK_MONOTONIC` (Rust's `Instant`, tokio's timers) stops, and `CLOCK_BOOTTIME`,
//! `CLOCK_REALTIME` and etcd's clock go on. [`ClockShim::suspend`] stops the daemon
//! (`SIGSTOP`), lets the time pass, and before `SIGCONT` moves its monotonic clocks back
//! by exactly the time it was stopped, so on waking the daemon's monotonic clock has not
//! moved at all, as after a real suspend. [`ClockShim::shift_wall_clock`] puts its wall
//! clock ahead (or behind): a host whose clock is set wrong.
//!
//! The shim reads two signed 64-bit offsets (monotonic skip, wall shift; nanoseconds)
//! from a small file it maps shared, so the test changes them while the daemon runs.
//! Never skips: without gcc it panics saying what to install.
#![allow(dead_code)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ctl[0]: nanoseconds the monotonic clocks lag (the time spent "suspended");
   ctl[1]: nanoseconds the wall clock is ahead. */
static volatile int64_t *ctl;
static int (*next_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void shim_init(void) {
    next_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    const char *p = getenv("COHERENT_CLOCK_SHIM");
    if (!p) return;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void *m = mmap(0, 16, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m != MAP_FAILED) ctl = m;
}

static void shift(struct timespec *ts, int64_t ns) {
    int64_t t = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + ns;
    ts->tv_sec = t / 1000000000LL;
    ts->tv_nsec = t % 1000000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (!next_clock_gettime) next_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    int r = next_clock_gettime(id, ts);
    if (r != 0 || !ctl) return r;
    switch (id) {
    case CLOCK_MONOTONIC:
    case CLOCK_MONOTONIC_RAW:
    case CLOCK_MONOTONIC_COARSE:
        shift(ts, -ctl[0]);
        break;
    case CLOCK_REALTIME:
    case CLOCK_REALTIME_COARSE:
        shift(ts, ctl[1]);
        break;
    }
    return r;
}
"#;

/// The shim library and the offsets file of one daemon.
pub struct ClockShim {
    lib: PathBuf,
    ctl: PathBuf,
    skipped: Duration,
}

impl ClockShim {
    /// Builds the shim into `dir` (gcc) with offsets 0.
    pub fn build(dir: &Path) -> ClockShim {
        let src = dir.join("clockshim.c");
        let lib = dir.join("clockshim.so");
        let ctl = dir.join("clockshim.ctl");
        std::fs::write(&src, SOURCE).unwrap();
        let out = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(&src)
            .arg("-ldl")
            .output()
            .unwrap_or_else(|e| {
                panic!("gcc: {e}: the suspend tests build a clock shim; install gcc")
            });
        assert!(
            out.status.success(),
            "building the clock shim failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&ctl, [0u8; 16]).unwrap();
        ClockShim {
            lib,
            ctl,
            skipped: Duration::ZERO,
        }
    }

    /// The environment that loads the shim into a daemon.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.lib.display().to_string()),
            ("COHERENT_CLOCK_SHIM".into(), self.ctl.display().to_string()),
        ]
    }

    fn set(&self, slot: u64, ns: i64) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.ctl)
            .unwrap();
        f.write_all_at(&ns.to_ne_bytes(), slot * 8).unwrap();
    }

    /// Puts the daemon's wall clock `ahead` of the machine's (negative: behind).
    pub fn shift_wall_clock(&self, ahead_secs: i64) {
        self.set(1, ahead_secs * 1_000_000_000);
    }

    /// Suspends process `pid` as a machine's sleep would: stopped (`SIGSTOP`, and
    /// stopped indeed before the clock is read), `during` runs while it sleeps (the time
    /// it takes is the suspend's length), then its monotonic clocks are moved back by the
    /// whole time it was stopped and it runs again (`SIGCONT`). Returns how long it slept.
    pub fn suspend(&mut self, pid: i32, during: impl FnOnce()) -> Duration {
        let since = self.sleep(pid);
        during();
        self.wake(pid, since)
    }

    /// The first half of [`ClockShim::suspend`]: stops `pid`; returns when.
    pub fn sleep(&self, pid: i32) -> Instant {
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        assert!(
            super::wait_until(super::TIMEOUT, || stopped(pid)),
            "process {pid} did not stop"
        );
        Instant::now()
    }

    /// The second half: its monotonic clocks lose the time since `since`, then it runs.
    pub fn wake(&mut self, pid: i32, since: Instant) -> Duration {
        let slept = since.elapsed();
        self.skipped += slept;
        self.set(0, self.skipped.as_nanos() as i64);
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGCONT) },
            0,
            "SIGCONT {pid}"
        );
        slept
    }
}

/// Is every thread of `pid` stopped (state `T`)?
fn stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
            s.rsplit(") ")
                .next()
                .is_some_and(|rest| rest.starts_with('T') || rest.starts_with('t'))
        })
    })
}
