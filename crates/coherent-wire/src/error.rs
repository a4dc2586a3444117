//! Typed refusals and their wire names and errnos, in one place (docs/design.md#handoff,
//! docs/design.md#control-surface).
//!
//! Every refusal the volume can give a session is a [`Reason`]. The reason string is the
//! wire (tests outside this repo match on it); the errno is what a `write(2)` to
//! `.coherent/ctl` or a fenced filesystem call fails with. A refusal about a record names
//! its [`Status`], defined here, below the engine (which re-exports it).

use serde::{Deserialize, Serialize};
use std::fmt;

/// The status of a transfer record (docs/design.md#handoff).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pending,
    Completed,
    Overtaken,
    Declined,
    Withdrawn,
    Superseded,
}

impl Status {
    /// Statuses under which a record is live while the version has not moved.
    pub fn may_be_live(self) -> bool {
        matches!(
            self,
            Status::Pending | Status::Completed | Status::Overtaken
        )
    }
}

/// A wire-stable refusal reason code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    HandoffToSelf,
    HandoffSuccessorUnknown,
    HandoffSuccessorMalformed,
    HandoffNotHeld,
    HandoffInFlight,
    HandoffOtherHolder,
    HandoffEnded,
    HandoffNotSuccessor,
    HandoffNotGiver,
    HandoffNotLive,
    Unattributed,
    NoSuchPath,
    BadRequest,
    /// The caller's uid does not own the session it names, or lacks a permission the verb
    /// needs (also: setting or removing a computed `user.coherent.*` xattr).
    SessionNotYours,
    /// An untracked path (docs/design.md#versions).
    NotTracked,
    /// The state could not be made durable.
    IoError,
    /// Multi-host (docs/design.md#hosts): the coordinator could not be reached.
    CoordinatorUnavailable,
    /// A fenced write (the giver handed the path on); a `denied` event reason.
    Fenced,
    /// The stale guard: the session's view is older than the current version and the
    /// write could erase that change (or the session is a late giver); a `denied` event
    /// reason.
    StaleView,
    /// The caller could not be resolved to a session where the volume fails closed
    /// (docs/design.md#sessions); a `denied` event reason.
    Unresolved,
}

impl Reason {
    pub const ALL: [Reason; 20] = [
        Reason::HandoffToSelf,
        Reason::HandoffSuccessorUnknown,
        Reason::HandoffSuccessorMalformed,
        Reason::HandoffNotHeld,
        Reason::HandoffInFlight,
        Reason::HandoffOtherHolder,
        Reason::HandoffEnded,
        Reason::HandoffNotSuccessor,
        Reason::HandoffNotGiver,
        Reason::HandoffNotLive,
        Reason::Unattributed,
        Reason::NoSuchPath,
        Reason::BadRequest,
        Reason::SessionNotYours,
        Reason::NotTracked,
        Reason::IoError,
        Reason::CoordinatorUnavailable,
        Reason::Fenced,
        Reason::StaleView,
        Reason::Unresolved,
    ];

    /// The wire code.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::HandoffToSelf => "handoff_to_self",
            Reason::HandoffSuccessorUnknown => "handoff_successor_unknown",
            Reason::HandoffSuccessorMalformed => "handoff_successor_malformed",
            Reason::HandoffNotHeld => "handoff_not_held",
            Reason::HandoffInFlight => "handoff_in_flight",
            Reason::HandoffOtherHolder => "handoff_other_holder",
            Reason::HandoffEnded => "handoff_ended",
            Reason::HandoffNotSuccessor => "handoff_not_successor",
            Reason::HandoffNotGiver => "handoff_not_giver",
            Reason::HandoffNotLive => "handoff_not_live",
            Reason::Unattributed => "unattributed",
            Reason::NoSuchPath => "no_such_path",
            Reason::BadRequest => "bad_request",
            Reason::SessionNotYours => "session_not_yours",
            Reason::NotTracked => "not_tracked",
            Reason::IoError => "io_error",
            Reason::CoordinatorUnavailable => "coordinator_unavailable",
            Reason::Fenced => "fenced",
            Reason::StaleView => "stale_view",
            Reason::Unresolved => "unresolved",
        }
    }

    /// The errno a refused request or write fails with (docs/design.md#control-surface).
    pub fn errno(self) -> i32 {
        match self {
            Reason::BadRequest | Reason::HandoffSuccessorMalformed => libc::EINVAL,
            Reason::NoSuchPath => libc::ENOENT,
            Reason::HandoffSuccessorUnknown => libc::ESRCH,
            Reason::HandoffInFlight => libc::EBUSY,
            Reason::IoError | Reason::CoordinatorUnavailable => libc::EIO,
            _ => libc::EACCES,
        }
    }

    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal: the reason code plus a human sentence that names the file, the other
/// session and what to do next; the path it refers to and, where a transfer record
/// exists, that record's status (docs/design.md#handoff: every refusal reply names both). A refused
/// multi-path request lists each refused path with its own refusal in `per_path` (the
/// request stays all-or-nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub message: String,
    pub path: Option<String>,
    pub status: Option<Status>,
    pub per_path: Vec<Refusal>,
}

impl Refusal {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Refusal {
            reason,
            message: message.into(),
            path: None,
            status: None,
            per_path: Vec::new(),
        }
    }

    /// The path the refusal refers to.
    pub fn at(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// The status of the record the refusal refers to.
    pub fn with_status(mut self, status: Status) -> Self {
        self.status = Some(status);
        self
    }

    pub fn errno(&self) -> i32 {
        self.reason.errno()
    }

    /// The errno a refused *write route* (open for write, rename, unlink, ...) fails
    /// with: a write held back for want of the coordinator is a refusal like the fence
    /// (`EACCES`), not a disk error; on `ctl` it stays `EIO` (docs/design.md#control-surface).
    pub fn write_errno(&self) -> i32 {
        match self.reason {
            Reason::CoordinatorUnavailable => libc::EACCES,
            _ => self.errno(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

impl std::error::Error for Refusal {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            assert!(seen.insert(r.as_str()), "duplicate code {}", r);
            assert_eq!(Reason::parse(r.as_str()), Some(r));
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
        }
    }

    #[test]
    fn errnos_follow_the_contract() {
        assert_eq!(Reason::BadRequest.errno(), libc::EINVAL);
        assert_eq!(Reason::HandoffSuccessorMalformed.errno(), libc::EINVAL);
        assert_eq!(Reason::NoSuchPath.errno(), libc::ENOENT);
        assert_eq!(Reason::HandoffSuccessorUnknown.errno(), libc::ESRCH);
        assert_eq!(Reason::HandoffInFlight.errno(), libc::EBUSY);
        assert_eq!(Reason::IoError.errno(), libc::EIO);
        assert_eq!(Reason::CoordinatorUnavailable.errno(), libc::EIO);
        for r in [
            Reason::SessionNotYours,
            Reason::NotTracked,
            Reason::Unresolved,
            Reason::HandoffToSelf,
            Reason::HandoffNotHeld,
            Reason::HandoffOtherHolder,
            Reason::HandoffEnded,
            Reason::HandoffNotSuccessor,
            Reason::HandoffNotGiver,
            Reason::HandoffNotLive,
            Reason::Unattributed,
            Reason::Fenced,
            Reason::StaleView,
        ] {
            assert_eq!(r.errno(), libc::EACCES, "{r}");
        }
    }
}
