//! Shared helpers of the core tests.
#![allow(dead_code)]

use coherent::coherence::*;
use coherent::identity::{Session, SessionInfo, Via};
use std::sync::Arc;

pub const T0: i64 = 1_790_000_000_000;

pub fn sess(name: &str) -> Session {
    Arc::new(SessionInfo::from_tag(
        Some("COHERENT_SESSION"),
        name,
        Via::Env {
            var: "COHERENT_SESSION".into(),
        },
    ))
}

pub fn uid0() -> Session {
    Arc::new(SessionInfo::unattributed(0))
}

pub fn stamp(n: u64) -> Option<Stamp> {
    Some(Stamp {
        ino: 7,
        ctime_ns: n as i64,
        size: n,
        // No mtime (0): a different stamp is a change, as before mtimes were kept.
        mtime_ns: 0,
    })
}

pub fn paths(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

/// An engine over a memory log, with a clock.
pub struct H {
    pub e: Engine,
    pub sink: Arc<MemorySink>,
    pub now: i64,
    stamps: u64,
}

impl H {
    pub fn new() -> Self {
        Self::with(Config::default())
    }

    pub fn with(config: Config) -> Self {
        let sink = Arc::new(MemorySink::new());
        H {
            e: Engine::new(config, sink.clone()),
            sink,
            now: T0,
            stamps: 100,
        }
    }

    pub fn t(&mut self) -> Timestamp {
        self.now += 1;
        Timestamp(self.now)
    }

    pub fn next_stamp(&mut self) -> Option<Stamp> {
        self.stamps += 1;
        stamp(self.stamps)
    }

    /// A full write through a handle: acquire, commit, close.
    pub fn write(&mut self, s: &Session, p: &str) -> Result<u64, coherent::error::Refusal> {
        let t = self.t();
        self.e.acquire(s, p, t)?;
        let st = self.next_stamp();
        let t = self.t();
        let v = self.e.commit(s, p, CommitOp::Write, st, t);
        let t = self.t();
        self.e.close_write(s, p, true, t);
        Ok(v)
    }

    pub fn read(&mut self, s: &Session, p: &str) -> Option<u64> {
        let t = self.t();
        self.e.open_read(s, p, t)
    }

    pub fn transfer(
        &mut self,
        s: &Session,
        p: &[&str],
        to: &str,
    ) -> Result<VerbReply, coherent::error::Refusal> {
        let t = self.t();
        self.e
            .transfer(s, &paths(p), to, Some(format!("over to you: {p:?}")), t)
    }

    pub fn kinds(&self) -> Vec<EventKind> {
        self.sink.events().iter().map(|e| e.event).collect()
    }

    pub fn count(&self, k: EventKind) -> usize {
        self.kinds().into_iter().filter(|x| *x == k).count()
    }

    /// The live state rebuilt from the memory log equals the engine's.
    pub fn assert_replay_equal(&self) {
        let fresh = Engine::new(self.e.config().clone(), Arc::new(MemorySink::discarding()));
        for ev in self.sink.events() {
            // Every event survives the JSON line round trip of the journal.
            let line = serde_json::to_string(&ev).unwrap();
            let back: Event = serde_json::from_str(&line).unwrap();
            assert_eq!(back, ev);
            fresh.replay(&back);
        }
        assert_eq!(fresh.durable_state(), self.e.durable_state());
    }
}
