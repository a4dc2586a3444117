//! What a `wait` waits for: part of the wire (requests name it, replies show it) and of
//! the engine's decision of when a wait is over.

use serde::{Deserialize, Serialize};

use crate::error::Status;

/// What `wait PATH [UNTIL]` waits for (docs/design.md#control-surface); wire names `accepted`,
/// `completed`, `ended`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Until {
    /// The successor took it: `accept` (or the claim of an offer), or its commit. Both
    /// make the status `completed` (docs/design.md#handoff), so this is reached exactly when
    /// `completed` is.
    Accepted,
    /// Status `completed`.
    Completed,
    /// Any status but `pending`.
    #[default]
    Ended,
}

impl Until {
    pub const ALL: [Until; 3] = [Until::Accepted, Until::Completed, Until::Ended];

    pub fn as_str(self) -> &'static str {
        match self {
            Until::Accepted => "accepted",
            Until::Completed => "completed",
            Until::Ended => "ended",
        }
    }

    pub fn parse(s: &str) -> Option<Until> {
        Until::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(s))
    }

    /// Is a record with this status (`live`: and still live) there? (`Some(false)`:
    /// never will be; `None`: not yet.) A live `overtaken` record can still become
    /// `completed` (its status follows the latest event while it is live, docs/design.md#handoff).
    pub fn reached(self, st: Status, live: bool) -> Option<bool> {
        match (self, st) {
            (_, Status::Pending) => None,
            (Until::Ended, _) => Some(true),
            (_, Status::Completed) => Some(true),
            (_, Status::Overtaken) if live => None,
            _ => Some(false),
        }
    }
}
