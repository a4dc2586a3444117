//! Memory the volume keeps per path: the views of sessions whose processes
//! are all gone refer to nothing, and neither do the entries of paths only those sessions
//! read. The maintenance thread drops entries nothing refers to now and then and, once
//! the volume holds more than [`MANY_PATHS`] entries, the views of gone sessions too (one
//! scan of `/proc`): a session that comes back then reads a file again before it hands it
//! on, as after a restart.

use std::collections::HashSet;

use super::liveness::TaskState;
use super::workspace::Workspace;

/// Entries past which the views of gone sessions are forgotten.
pub const MANY_PATHS: usize = 100_000;

impl Workspace {
    /// Forgets the views of sessions with no running process left, then the per-path
    /// entries nothing refers to any more. Returns how many entries went.
    pub(super) fn forget_gone_readers(&self) -> usize {
        let pruned = self.engine.prune();
        if self.engine.path_count() <= MANY_PATHS {
            return pruned;
        }
        let viewers = self.engine.viewers();
        if viewers.is_empty() {
            return pruned;
        }
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return pruned; // cannot tell: forget no view on a guess
        };
        let mut running: HashSet<String> = HashSet::new();
        for pid in dir.filter_map(|d| d.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
            if TaskState::read(pid).is_some_and(|t| t.running()) {
                if let Ok(s) = self.resolver.resolve(pid) {
                    running.insert(s.name.clone());
                }
            }
        }
        let gone: Vec<String> = viewers
            .into_iter()
            .filter(|s| !running.contains(&s.name))
            .map(|s| s.name.clone())
            .collect();
        let n = self.engine.forget_views(&gone);
        if n > 0 {
            tracing::debug!(
                "forgot the views of {} gone session(s): {n} path entries dropped",
                gone.len()
            );
        }
        pruned + n
    }
}
