//! The clock leases and eviction ages are counted on: `CLOCK_BOOTTIME`.
//!
//! `CLOCK_MONOTONIC` (behind `std::time::Instant`) stops while the machine is suspended
//! (and, in many setups, while a VM is paused), but etcd's clock does not: a host counting
//! its lease on it would wake up believing a lease that etcd ended long ago is still good.
//! `CLOCK_BOOTTIME` is the same clock plus the time spent suspended, so a lease counted on
//! it ends no later than etcd ends it (docs/multi-host.md, "Clocks").

use std::time::Duration;

/// A moment on `CLOCK_BOOTTIME` (time since boot, suspend included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootTime(Duration);

impl BootTime {
    pub fn now() -> BootTime {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // Linux has had CLOCK_BOOTTIME since 2.6.39; with a valid pointer it cannot fail.
        // SAFETY: clock_gettime writes one timespec into `ts`, which we own.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
        BootTime(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// How long ago this was (0 for a moment not yet reached).
    pub fn elapsed(self) -> Duration {
        BootTime::now().0.saturating_sub(self.0)
    }
}

impl std::ops::Add<Duration> for BootTime {
    type Output = BootTime;
    fn add(self, d: Duration) -> BootTime {
        BootTime(self.0 + d)
    }
}

impl std::ops::Sub<Duration> for BootTime {
    type Output = BootTime;
    fn sub(self, d: Duration) -> BootTime {
        BootTime(self.0.saturating_sub(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_runs_with_the_monotonic_clock() {
        let (b, i) = (BootTime::now(), std::time::Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (db, di) = (b.elapsed(), i.elapsed());
        assert!(db >= Duration::from_millis(20), "{db:?}");
        // No suspend in between: both clocks advanced alike.
        assert!(db.abs_diff(di) < Duration::from_millis(20), "{db:?} {di:?}");
        assert!(b + Duration::from_secs(1) > BootTime::now());
        assert_eq!((b - Duration::from_secs(1)) + Duration::from_secs(1), b);
    }
}
