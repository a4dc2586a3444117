//! How long a FUSE request may be held (docs/design.md#mounting, docs/install.md): the one
//! owner of the kernel's request timeout.
//!
//! Linux 6.15+ aborts the whole FUSE connection (every process on the volume then gets
//! `ENOTCONN` and the daemon exits) when a request stays unanswered past the timeout the
//! connection got at `FUSE_INIT`. We never ask for one (`FUSE_REQUEST_TIMEOUT`), so the
//! kernel derives it from two sysctls, [`DEFAULT_SYSCTL`] and [`MAX_SYSCTL`]
//! ([`effective`]). A worker checks every 15 s and aborts if any request is older than
//! the timeout, so a request held past it is not always cut at once, but may be. Later
//! kernels raise a timeout under 15 s to 15 s (6.18 does: docs/install.md); the budget
//! is taken from the sysctls as written, as the first kernels with the feature do not.
//!
//! The connection keeps the value it got at mount even when the sysctls change later, and
//! the daemon reads them just before the mount, so a change in between could give the
//! connection another value. So the sysctls are read at mount ([`at_mount`]) and again
//! whenever a request is about to be held ([`budget`]), and the smaller answer wins.
//!
//! A held request gets half the timeout ([`budget_of`]): the other half covers the time a
//! request waits in the kernel's queue for a free request thread (the kernel counts from
//! when it queued the request) and the time the reply takes to go out. It counts from when
//! the daemon took the request ([`Started`], which the request carries down to wherever
//! it waits).

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The timeout of a connection whose server asks for none (seconds, 0: none).
pub const DEFAULT_SYSCTL: &str = "/proc/sys/fs/fuse/default_request_timeout";
/// The most any connection may get (seconds, 0: no maximum).
pub const MAX_SYSCTL: &str = "/proc/sys/fs/fuse/max_request_timeout";

/// The shortest budget: a client loop that asks again never spins faster than this. The
/// kernel takes whole seconds, so half of the smallest timeout (1 s) is this already.
pub const FLOOR: Duration = Duration::from_millis(500);

/// The timeout (seconds) a connection gets at `FUSE_INIT` from the two sysctls when the
/// server asks for none, as the kernel decides it; `None`: no timeout.
pub fn effective(default: u32, max: u32) -> Option<u32> {
    match (default, max) {
        (0, 0) => None,
        (d, 0) => Some(d),
        (0, m) => Some(m),
        (d, m) => Some(d.min(m)),
    }
}

/// The longest a request may be held under a timeout of `timeout` seconds: half of it,
/// at least [`FLOOR`]; `None`: no limit from the kernel.
pub fn budget_of(timeout: Option<u32>) -> Option<Duration> {
    timeout.map(|t| (Duration::from_secs(u64::from(t)) / 2).max(FLOOR))
}

/// The smaller of two budgets (`None` is no limit).
fn tighter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// One sysctl in seconds: 0 when the kernel has none (before 6.15). A file that is there
/// but cannot be read counts as the smallest timeout the kernel takes (1 s): when in
/// doubt, answer early.
fn sysctl(path: &Path) -> u32 {
    match std::fs::read_to_string(path) {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(
                "{}: {:?} is not a number of seconds; answering requests as if it were 1",
                path.display(),
                s.trim()
            );
            1
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => {
            tracing::warn!(
                "cannot read {}: {e}; answering requests as if it were 1",
                path.display()
            );
            1
        }
    }
}

/// The effective timeout the sysctls give now.
pub fn now() -> Option<u32> {
    effective(
        sysctl(Path::new(DEFAULT_SYSCTL)),
        sysctl(Path::new(MAX_SYSCTL)),
    )
}

static AT_MOUNT: OnceLock<Option<u32>> = OnceLock::new();

/// Reads the sysctls for the connection about to be made (call once, just before the
/// mount) and returns the effective timeout, to tell the user.
pub fn at_mount() -> Option<u32> {
    *AT_MOUNT.get_or_init(now)
}

/// The longest a request may be held now: the budget of the smaller of the timeout read
/// at mount and the one the sysctls give now. `None`: no limit.
pub fn budget() -> Option<Duration> {
    let mounted = AT_MOUNT.get().copied().flatten();
    tighter(budget_of(mounted), budget_of(now()))
}

/// `want`, cut to the budget: how long a request that has just begun may be held.
pub fn cap(want: Duration) -> Duration {
    budget().map_or(want, |b| want.min(b))
}

/// When a FUSE request began: the `fuse` adapter takes it first thing and hands it down
/// with the request (`Caller::started`), so whatever the request blocks on, however deep,
/// is bounded from then. Work that serves no request (the etcd publisher thread) takes
/// [`Started::now`] where it begins: what it holds, e.g. a lock, may hold up a request
/// that does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started(Instant);

impl Started {
    /// Begins now.
    pub fn now() -> Started {
        Started(Instant::now())
    }

    /// The deadline of a blocking step that wants `want`: no later than `want` from now,
    /// nor than the budget from when this began.
    pub fn deadline(self, want: Duration) -> Instant {
        deadline_within(self.0, Instant::now(), want, budget())
    }
}

/// [`Started::deadline`] with the clock and the budget given.
fn deadline_within(
    start: Instant,
    now: Instant,
    want: Duration,
    budget: Option<Duration>,
) -> Instant {
    let wanted = now + want;
    match budget {
        None => wanted,
        Some(b) => wanted.min(start + b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_follows_the_kernel() {
        // Neither set: no timeout.
        assert_eq!(effective(0, 0), None);
        // The default only.
        assert_eq!(effective(5, 0), Some(5));
        // The maximum only: it applies to a server that asks for none too.
        assert_eq!(effective(0, 7), Some(7));
        // Both: the smaller.
        assert_eq!(effective(5, 3), Some(3));
        assert_eq!(effective(3, 5), Some(3));
        assert_eq!(effective(65535, 65535), Some(65535));
    }

    #[test]
    fn budget_is_half_with_a_floor() {
        assert_eq!(budget_of(None), None);
        assert_eq!(budget_of(Some(5)), Some(Duration::from_millis(2500)));
        assert_eq!(budget_of(Some(1)), Some(FLOOR));
        assert_eq!(budget_of(Some(60)), Some(Duration::from_secs(30)));
        assert_eq!(
            budget_of(effective(0, 2)),
            Some(Duration::from_secs(1)),
            "the maximum alone bounds the budget"
        );
        for t in 1..=100 {
            let b = budget_of(Some(t)).unwrap();
            assert!(b < Duration::from_secs(u64::from(t)), "{t} s: {b:?}");
            assert!(b >= FLOOR);
        }
    }

    #[test]
    fn the_tighter_budget_wins() {
        let s = Duration::from_secs;
        assert_eq!(tighter(None, None), None);
        assert_eq!(tighter(Some(s(2)), None), Some(s(2)));
        assert_eq!(tighter(None, Some(s(3))), Some(s(3)));
        assert_eq!(tighter(Some(s(4)), Some(s(3))), Some(s(3)));
    }

    #[test]
    fn a_deadline_is_cut_to_the_budget_from_the_start() {
        let s = Duration::from_secs;
        let start = Instant::now();
        let now = start + s(2);
        // No budget: what the step wants, from now.
        assert_eq!(deadline_within(start, now, s(10), None), now + s(10));
        // The budget counts from the start, not from now.
        assert_eq!(deadline_within(start, now, s(10), Some(s(5))), start + s(5));
        // A step that wants less than is left keeps its own.
        assert_eq!(deadline_within(start, now, s(1), Some(s(5))), now + s(1));
        // Begun now: the budget from now.
        assert_eq!(deadline_within(now, now, s(10), Some(s(5))), now + s(5));
    }

    #[test]
    fn a_missing_sysctl_is_no_timeout() {
        assert_eq!(sysctl(Path::new("/proc/sys/fs/fuse/no-such-sysctl")), 0);
    }
}
