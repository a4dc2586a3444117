//! Who is calling: pid → session (docs/design.md#sessions), agent ids, the resolution cache and the
//! directory of known sessions.
//!
//! Contract shared with `coherence`: a session is an `Arc<SessionInfo>`; coherence keys
//! sessions by `name`.
//!
//! - [`Resolver`] maps a FUSE request's pid (a thread id) to its session: the cgroup v2
//!   segment `coherent-session-NAME`, else the first configured environment tag, else the
//!   unattributed `uid:UID`. Answers are cached per (tid, [`ProcStamp`]).
//! - [`SessionDirectory`] knows the sessions (found by name or agent id).
//! - [`join_session_cgroup`] is what `coherent run` uses to put a process in a session's
//!   cgroup.
//!
//! **Session names.** A valid session name is 1 to 128 characters from `A-Z a-z 0-9 . _ :
//! @ -`, and does not start with `uid:` (reserved for unattributed sessions, so no tag can
//! pose as one). A tag or cgroup segment whose value is not a valid name is ignored as if it
//! were absent (resolution goes on to the next source), and logged: rewriting it could merge
//! two sessions into one, and an unattributed process is the harmless default. `coherent run`
//! refuses such names up front with [`check_session_name`].

mod cache;
mod cgroup;
mod directory;
pub mod procfs;
mod resolver;

pub use crate::names::{check_session_name, is_valid_session_name, BadName, MAX_SESSION_NAME};
pub use cache::{CacheStats, Entry as CacheEntry, HeldStat, Outcome, PidCache};
pub use cgroup::{
    cgroup2_mount, cgroup2_of, join_session_cgroup, remove_session_cgroup, Cgroup2Mount,
};
pub use coherent_wire::session::{
    agent_id_for_claude, agent_id_for_name, SessionInfo, Via, CLAUDE_VAR, DEFAULT_SESSION_ENV,
};
pub use directory::SessionDirectory;
pub use procfs::{ProcStamp, StatFile};
pub use resolver::{
    IgnoredTag, ResolveError, Resolver, ResolverConfig, DEFAULT_CACHE_CAPACITY,
    DEFAULT_HELD_STAT_FILES,
};

use std::sync::Arc;

pub type Session = Arc<SessionInfo>;

/// The cgroup directory name prefix that names a session: `coherent-session-NAME`.
pub const CGROUP_PREFIX: &str = "coherent-session-";

/// The session named by a cgroup v2 path: its innermost `coherent-session-NAME` segment
/// with a valid NAME (a `coherent run` inside another session's cgroup is the inner one).
pub fn session_of_cgroup(path: &str) -> Option<&str> {
    path.rsplit('/')
        .filter_map(|seg| seg.strip_prefix(CGROUP_PREFIX))
        .find(|name| is_valid_session_name(name))
}

#[cfg(test)]
mod contract_tests {
    use super::*;

    #[test]
    fn agent_id_vectors() {
        assert_eq!(
            agent_id_for_claude("abc").to_string(),
            "54c1e55e-b8fa-534a-93fc-0c4393bd8424"
        );
        assert_eq!(
            agent_id_for_name("alice").to_string(),
            "27a468b0-7fa2-5c0d-a2ba-2dac753b2070"
        );
    }
}
