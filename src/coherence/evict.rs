//! Bounded state: tombstones of removed paths are dropped when nothing refers to them.
//!
//! A removed path keeps its entry (a tombstone) so that recreating it continues the
//! numbering (docs/design.md#versions). The journal drops the tombstones that have no record (live
//! or ended: ended records go first, by `evict` after `--evict-after`) and no open writer at
//! each compaction, in the same step as the snapshot it writes, so the snapshot and the
//! engine agree and no event is needed (replaying the log from its start would bring them
//! back; after a compaction the log does not reach back that far). A path recreated after
//! its tombstone went starts again at version 1.

use super::engine::Engine;

impl Engine {
    /// Drops every tombstone nothing refers to; returns how many. Shards that shrank a lot
    /// give their memory back.
    pub fn evict_tombstones(&self) -> usize {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            let before = sh.len();
            sh.retain(|_, e| {
                e.exists || !e.records.is_empty() || e.holders.iter().any(|h| h.writers > 0)
            });
            n += before - sh.len();
            if sh.capacity() > 64 && sh.len() < sh.capacity() / 4 {
                sh.shrink_to_fit();
            }
        }
        n
    }
}
