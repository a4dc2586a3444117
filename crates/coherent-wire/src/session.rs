//! Sessions as the wire names them: a session's name, its agent id and how it was
//! resolved. Which process belongs to which session is the core's `identity`.

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
