//! The change counter a waiter sleeps on: bumped by every event that can change a record
//! (see `wait.rs`), so the mount answers a wait when its record changes, not by polling.
//! A waiter with nothing to wait for sleeps on pokes alone (a new wait, unmount), so a
//! commit wakes no thread while no `wait` is pending: that wake-up and its context switch
//! were a tenth of the daemon's CPU in an `rm -rf` (docs/profile.md).

use super::types::EventKind;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// A counter of record changes that a thread can sleep on.
#[derive(Default)]
pub(super) struct Changes {
    gen: AtomicU64,
    /// Pokes only (also counted in `gen`).
    pokes: AtomicU64,
    /// Threads in [`Changes::wait_poke`] (not in `sleepers`: a bump does not wake them).
    poke_sleepers: AtomicUsize,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Changes {
    /// The counter now.
    pub(super) fn now(&self) -> u64 {
        self.gen.load(Ordering::SeqCst)
    }

    /// Cheap when nobody sleeps: an atomic add and load.
    pub(super) fn bump(&self) {
        self.gen.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// A change that every sleeper must see, record waiter or not (a new wait, unmount).
    pub(super) fn poke(&self) {
        self.pokes.fetch_add(1, Ordering::SeqCst);
        self.gen.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) + self.poke_sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// The poke counter now.
    pub(super) fn pokes(&self) -> u64 {
        self.pokes.load(Ordering::SeqCst)
    }

    /// Sleeps until a poke after `seen` (a [`Changes::pokes`] value) or `deadline`,
    /// counted apart from the record waiters, so [`Changes::bump`] stays an atomic add.
    pub(super) fn wait_poke(&self, seen: u64, deadline: Instant) -> u64 {
        let mut g = self.lock.lock();
        self.poke_sleepers.fetch_add(1, Ordering::SeqCst);
        while self.pokes.load(Ordering::SeqCst) == seen {
            if self.cv.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        self.poke_sleepers.fetch_sub(1, Ordering::SeqCst);
        self.pokes.load(Ordering::SeqCst)
    }

    pub(super) fn wait(&self, seen: u64, deadline: Instant) -> u64 {
        let mut g = self.lock.lock();
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.gen.load(Ordering::SeqCst) == seen {
            if self.cv.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        self.gen.load(Ordering::SeqCst)
    }
}

/// Does an event of this kind change a record (its status, successor or liveness)?
pub(super) fn changes_records(k: EventKind) -> bool {
    matches!(
        k,
        EventKind::Transfer
            | EventKind::Accept
            | EventKind::Decline
            | EventKind::Withdraw
            | EventKind::Completed
            | EventKind::Overtaken
            | EventKind::Superseded
            | EventKind::Evict
            | EventKind::Commit
            | EventKind::ExternalChange
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// Each sleeper wakes for what it sleeps on, well before its (long) deadline.
    #[test]
    fn a_poke_wakes_both_sleepers_and_a_bump_the_record_waiter() {
        let far = || Instant::now() + Duration::from_secs(60);
        let c = Arc::new(Changes::default());
        let (c1, seen) = (c.clone(), c.now());
        let records = std::thread::spawn(move || (c1.wait(seen, far()), Instant::now()));
        // Only once the record waiter sleeps does a bump have someone to wake.
        while c.sleepers.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let t0 = Instant::now();
        c.bump();
        let (got, at) = records.join().unwrap();
        assert_eq!(got, seen + 1);
        assert!(
            at - t0 < Duration::from_secs(30),
            "a bump left the waiter asleep"
        );

        let (c2, poked) = (c.clone(), c.pokes());
        let pokes = std::thread::spawn(move || (c2.wait_poke(poked, far()), Instant::now()));
        while c.poke_sleepers.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let t0 = Instant::now();
        c.poke();
        let (got, at) = pokes.join().unwrap();
        assert_eq!(got, poked + 1);
        assert!(
            at - t0 < Duration::from_secs(30),
            "a poke left the waiter asleep"
        );
        assert_eq!(c.now(), seen + 2, "a poke is a change too");
    }
}
