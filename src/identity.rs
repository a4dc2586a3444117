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
pub use directory::SessionDirectory;
pub use procfs::{ProcStamp, StatFile};
pub use resolver::{
    IgnoredTag, ResolveError, Resolver, ResolverConfig, DEFAULT_CACHE_CAPACITY,
    DEFAULT_HELD_STAT_FILES,
};

use std::sync::Arc;
use uuid::Uuid;

/// How a session was resolved.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Via {
    /// A `coherent-session-NAME` segment of the cgroup v2 path.
    Cgroup { path: String },
    /// An environment variable (`COHERENT_SESSION`, `CLAUDE_CODE_SESSION_ID`, ...).
    Env { var: String },
    /// Neither: the unattributed session `uid:UID`.
    Uid,
    /// Registered through the control file without a process having touched the mount.
    Registered,
    /// A tag or cgroup named `session`, which belongs to another uid (`owner`): this
    /// process is its own unattributed `uid:UID` instead (docs/design.md#sessions), and its verbs
    /// are refused `session_not_yours`.
    NotYours { session: String, owner: u32 },
}

/// One agent session.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct SessionInfo {
    /// The session name: the tag value, the cgroup NAME, or `uid:UID`.
    pub name: String,
    /// UUID v5 in `NAMESPACE_URL` (see [`agent_id_for_claude`], [`agent_id_for_name`]).
    pub agent_id: Uuid,
    pub via: Via,
}

pub type Session = Arc<SessionInfo>;

/// The variable whose value is a Claude Code session id; its agent id uses the
/// `ccs-agent:claude-session-S` name so ids agree with other Claude Code coordination tools.
pub const CLAUDE_VAR: &str = "CLAUDE_CODE_SESSION_ID";

/// Default environment tags, in order.
pub const DEFAULT_SESSION_ENV: [&str; 2] = ["COHERENT_SESSION", CLAUDE_VAR];

/// The agent id of a Claude Code session id `S`.
pub fn agent_id_for_claude(session_id: &str) -> Uuid {
    Uuid::new_v5(
        &Uuid::NAMESPACE_URL,
        format!("ccs-agent:claude-session-{session_id}").as_bytes(),
    )
}

/// The agent id of any other session name `N`.
pub fn agent_id_for_name(name: &str) -> Uuid {
    Uuid::new_v5(&Uuid::NAMESPACE_URL, format!("ccs-agent:{name}").as_bytes())
}

impl SessionInfo {
    /// A session named by a tag variable's value (or a cgroup name when `var` is None).
    pub fn from_tag(var: Option<&str>, value: &str, via: Via) -> Self {
        let agent_id = match var {
            Some(CLAUDE_VAR) => agent_id_for_claude(value),
            _ => agent_id_for_name(value),
        };
        SessionInfo {
            name: value.to_string(),
            agent_id,
            via,
        }
    }

    /// The unattributed session of a uid.
    pub fn unattributed(uid: u32) -> Self {
        let name = format!("uid:{uid}");
        SessionInfo {
            agent_id: agent_id_for_name(&name),
            name,
            via: Via::Uid,
        }
    }

    /// Unattributed sessions read and write like anyone but never give or receive.
    pub fn is_attributed(&self) -> bool {
        !matches!(self.via, Via::Uid | Via::NotYours { .. })
    }

    /// The first 8 hex digits of the agent id, for display.
    pub fn short_id(&self) -> String {
        self.agent_id.simple().to_string()[..8].to_string()
    }

    /// `name (6e271ee6)`: how messages name a session.
    pub fn display(&self) -> String {
        format!("{} ({})", self.name, self.short_id())
    }
}

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
