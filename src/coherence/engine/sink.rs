//! Where the engine's events go: the [`EventSink`] trait (the journal in the mount) and
//! [`MemorySink`], a memory log for tests and benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::coherence::types::Event;

/// Where events go: the journal in the mount, a memory log in tests.
pub trait EventSink: Send + Sync {
    /// Assigns `ev.seq` (the next number) and queues the event. Called with engine locks
    /// held: must not call back into the engine.
    fn append(&self, ev: &mut Event);
    /// Blocks until every event up to `seq` is durable.
    fn wait_durable(&self, seq: u64);
}

/// A sink that keeps every event in memory (tests, benchmarks, replay checks).
#[derive(Default)]
pub struct MemorySink {
    events: Mutex<Vec<Event>>,
    keep: bool,
    next: AtomicU64,
}

impl MemorySink {
    /// Keeps every event.
    pub fn new() -> Self {
        MemorySink {
            keep: true,
            ..Default::default()
        }
    }

    /// Only numbers events (benchmarks).
    pub fn discarding() -> Self {
        MemorySink::default()
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }
}

impl EventSink for MemorySink {
    fn append(&self, ev: &mut Event) {
        if self.keep {
            let mut v = self.events.lock();
            ev.seq = v.len() as u64 + 1;
            v.push(ev.clone());
        } else {
            ev.seq = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        }
    }

    fn wait_durable(&self, _seq: u64) {}
}
