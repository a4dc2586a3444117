//! The resolution cache: tid → (stamp, session), bounded, sharded.
//!
//! One slot per tid. A lookup hits only when the stored [`ProcStamp`] equals the task's
//! current one, so a recycled pid (another start time) or a process that exec'd with a new
//! environment never inherits the old answer; the stale slot is simply overwritten.
//!
//! Bounded by CLOCK (second chance) per shard: cheap on hits (one bit set under the shard
//! lock) and close to LRU. Shards are `parking_lot` mutexes chosen by tid, so FUSE worker
//! threads serving different processes rarely meet on a lock.

use super::procfs::{ProcStamp, StatFile};
use super::Session;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const SHARDS: usize = 16;

/// The cached answer for one task.
#[derive(Debug, Clone)]
pub struct Entry {
    pub stamp: ProcStamp,
    pub session: Session,
    /// Whose life decides whether this task's session is still alive: its thread group
    /// leader (tgid, leader's start time). Threads come and go; the process is what counts.
    pub owner: (u32, u64),
    /// The task's `stat` held open, when the resolver's budget of open files allows:
    /// validates a hit with one `pread` (see [`StatFile`]).
    pub stat_file: Option<Arc<HeldStat>>,
}

/// A held `/proc/TID/stat`, counted against a budget of open files; closing it (when the
/// last entry clone goes) gives its place back.
#[derive(Debug)]
pub struct HeldStat {
    pub file: StatFile,
    budget: Arc<AtomicUsize>,
}

impl HeldStat {
    /// Hold `file` if fewer than `max` are held against `budget`; else drop it.
    pub fn hold(file: StatFile, budget: &Arc<AtomicUsize>, max: usize) -> Option<Arc<HeldStat>> {
        if budget.fetch_add(1, Ordering::Relaxed) >= max {
            budget.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Arc::new(HeldStat {
            file,
            budget: budget.clone(),
        }))
    }
}

impl Drop for HeldStat {
    fn drop(&mut self) {
        self.budget.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a validated lookup found, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Hit,
    Miss,
    Stale,
}

/// Counters that make the cache's cost visible.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub hits: u64,
    /// Lookups that found nothing for the tid.
    pub misses: u64,
    /// Lookups that found the tid with another stamp (a recycled pid or an exec).
    pub stale: u64,
    pub evictions: u64,
    pub len: usize,
    pub capacity: usize,
    /// Cached tasks whose `stat` is held open (filled in by the resolver).
    pub held_stat_files: usize,
}

struct Slot {
    tid: u32,
    entry: Entry,
    referenced: bool,
}

#[derive(Default)]
struct Shard {
    index: HashMap<u32, usize, BuildHasherDefault<TidHasher>>,
    slots: Vec<Slot>,
    hand: usize,
    hits: u64,
    misses: u64,
    stale: u64,
    evictions: u64,
}

/// The bounded tid → session cache.
pub struct PidCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
}

impl PidCache {
    /// A cache holding at most about `capacity` tasks (rounded up to a multiple of the
    /// shard count, at least one per shard).
    pub fn new(capacity: usize) -> PidCache {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        PidCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard,
        }
    }

    fn shard(&self, tid: u32) -> &Mutex<Shard> {
        &self.shards[tid as usize % SHARDS]
    }

    /// The session cached for `tid` if its stamp is still `stamp`.
    pub fn get(&self, tid: u32, stamp: &ProcStamp) -> Option<Session> {
        let mut sh = self.shard(tid).lock();
        let Some(&i) = sh.index.get(&tid) else {
            sh.misses += 1;
            return None;
        };
        let slot = &mut sh.slots[i];
        if slot.entry.stamp != *stamp {
            sh.stale += 1;
            return None;
        }
        slot.referenced = true;
        let s = slot.entry.session.clone();
        sh.hits += 1;
        Some(s)
    }

    /// The entry of `tid`, whatever its stamp, for the caller to validate (then
    /// [`PidCache::count`] the outcome). Gives the slot its second chance.
    pub fn peek(&self, tid: u32) -> Option<Entry> {
        let mut sh = self.shard(tid).lock();
        let i = *sh.index.get(&tid)?;
        let slot = &mut sh.slots[i];
        slot.referenced = true;
        Some(slot.entry.clone())
    }

    /// Count the outcome of a lookup validated by the caller.
    pub fn count(&self, tid: u32, outcome: Outcome) {
        let mut sh = self.shard(tid).lock();
        match outcome {
            Outcome::Hit => sh.hits += 1,
            Outcome::Miss => sh.misses += 1,
            Outcome::Stale => sh.stale += 1,
        }
    }

    /// Store the answer for `tid`, replacing whatever the tid held. Returns the entry
    /// evicted to make room, if any (not the replaced one of the same tid).
    pub fn insert(&self, tid: u32, entry: Entry) -> Option<Entry> {
        let mut guard = self.shard(tid).lock();
        let sh = &mut *guard;
        if let Some(&i) = sh.index.get(&tid) {
            sh.slots[i].entry = entry;
            sh.slots[i].referenced = true;
            return None;
        }
        let fresh = Slot {
            tid,
            entry,
            referenced: false,
        };
        if sh.slots.len() < self.per_shard {
            sh.index.insert(tid, sh.slots.len());
            sh.slots.push(fresh);
            return None;
        }
        // CLOCK: clear reference bits until a slot without one comes under the hand.
        loop {
            let n = sh.slots.len();
            let h = sh.hand % n;
            sh.hand = (h + 1) % n;
            if std::mem::take(&mut sh.slots[h].referenced) {
                continue;
            }
            let old = std::mem::replace(&mut sh.slots[h], fresh);
            sh.index.remove(&old.tid);
            sh.index.insert(tid, h);
            sh.evictions += 1;
            return Some(old.entry);
        }
    }

    /// Drop `tid`'s slot if it still holds `stamp`.
    pub fn remove(&self, tid: u32, stamp: &ProcStamp) -> bool {
        let mut guard = self.shard(tid).lock();
        let sh = &mut *guard;
        let Some(&i) = sh.index.get(&tid) else {
            return false;
        };
        if sh.slots[i].entry.stamp != *stamp {
            return false;
        }
        sh.index.remove(&tid);
        let last = sh.slots.len() - 1;
        sh.slots.swap_remove(i);
        if i != last {
            let moved = sh.slots[i].tid;
            sh.index.insert(moved, i);
        }
        true
    }

    /// Drop every entry.
    pub fn clear(&self) {
        for s in self.shards.iter() {
            let mut sh = s.lock();
            sh.index.clear();
            sh.slots.clear();
            sh.hand = 0;
        }
    }

    /// `(tid, entry)` of every cached task whose session is named `name`. Locks one shard
    /// at a time; meant for occasional use (liveness checks), not the hot path.
    pub fn entries_of(&self, name: &str) -> Vec<(u32, Entry)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let sh = s.lock();
            out.extend(
                sh.slots
                    .iter()
                    .filter(|slot| slot.entry.session.name == name)
                    .map(|slot| (slot.tid, slot.entry.clone())),
            );
        }
        out
    }

    pub fn stats(&self) -> CacheStats {
        let mut st = CacheStats {
            capacity: self.per_shard * SHARDS,
            ..CacheStats::default()
        };
        for s in self.shards.iter() {
            let sh = s.lock();
            st.hits += sh.hits;
            st.misses += sh.misses;
            st.stale += sh.stale;
            st.evictions += sh.evictions;
            st.len += sh.slots.len();
        }
        st
    }
}

/// Tids are small integers already spread by the shard choice: a multiplicative hash is
/// all the `HashMap` needs, far cheaper than SipHash.
#[derive(Default)]
struct TidHasher(u64);

impl Hasher for TidHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{SessionInfo, Via};
    use std::sync::Arc;

    fn entry(name: &str, start: u64) -> Entry {
        Entry {
            stamp: ProcStamp {
                start_time: start,
                ..ProcStamp::default()
            },
            session: Arc::new(SessionInfo::from_tag(
                None,
                name,
                Via::Env {
                    var: "COHERENT_SESSION".into(),
                },
            )),
            owner: (1, start),
            stat_file: None,
        }
    }

    #[test]
    fn bounded_with_second_chance() {
        let c = PidCache::new(SHARDS * 2); // two slots per shard
        let st = |s| ProcStamp {
            start_time: s,
            ..ProcStamp::default()
        };
        // tids 0, 16, 32 land in shard 0.
        assert!(c.insert(0, entry("a", 1)).is_none());
        assert!(c.insert(16, entry("b", 1)).is_none());
        assert!(c.get(0, &st(1)).is_some()); // 0 gets a second chance
        let evicted = c.insert(32, entry("c", 1)).unwrap();
        assert_eq!(evicted.session.name, "b");
        assert!(c.get(16, &st(1)).is_none());
        assert!(c.get(0, &st(1)).is_some());
        assert!(c.get(32, &st(1)).is_some());
        let s = c.stats();
        assert_eq!((s.len, s.evictions, s.capacity), (2, 1, SHARDS * 2));
        for tid in 0..10_000 {
            c.insert(tid, entry("x", 1));
        }
        assert!(c.stats().len <= SHARDS * 2);
    }

    #[test]
    fn stamp_mismatch_misses_and_replacement_and_removal() {
        let c = PidCache::new(64);
        let st = |s| ProcStamp {
            start_time: s,
            ..ProcStamp::default()
        };
        c.insert(7, entry("old", 100));
        assert!(c.get(7, &st(101)).is_none());
        assert_eq!(c.stats().stale, 1);
        c.insert(7, entry("new", 101));
        assert!(c.get(7, &st(100)).is_none());
        assert_eq!(c.get(7, &st(101)).unwrap().name, "new");
        assert!(!c.remove(7, &st(100)));
        c.insert(23, entry("other", 5)); // same shard as 7
        assert!(c.remove(7, &st(101)));
        assert_eq!(c.get(23, &st(5)).unwrap().name, "other");
        assert_eq!(c.entries_of("other").len(), 1);
        c.clear();
        assert_eq!(c.stats().len, 0);
    }

    #[test]
    fn held_stat_files_respect_the_budget() {
        let budget = Arc::new(AtomicUsize::new(0));
        let me = std::process::id();
        let open = || StatFile::open(me).unwrap();
        let a = HeldStat::hold(open(), &budget, 2).unwrap();
        let b = HeldStat::hold(open(), &budget, 2).unwrap();
        assert!(HeldStat::hold(open(), &budget, 2).is_none());
        assert_eq!(budget.load(Ordering::Relaxed), 2);
        let c = PidCache::new(16);
        let mut e = entry("x", 1);
        e.stat_file = Some(a);
        c.insert(5, e);
        drop(b);
        assert_eq!(budget.load(Ordering::Relaxed), 1);
        c.clear(); // the entry held the last reference
        assert_eq!(budget.load(Ordering::Relaxed), 0);
        assert!(HeldStat::hold(open(), &budget, 2).is_some());
    }
}
