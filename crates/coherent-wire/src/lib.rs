//! The wire of coherent: what the daemon and the `coherent` command say to each other
//! through `.coherent/` (docs/design.md#control-surface), and the names in it. Both sides
//! build on this crate and nothing here knows FUSE, the engine or the disk.
//!
//! - [`control`]: a request's bytes to a typed request, the JSON reply, the human lines;
//! - [`error`]: the reason codes, their errnos and the record statuses a refusal names;
//! - [`names`]: the session-name rule and how names are shown in text;
//! - [`session`]: a session's name, agent id and how it was resolved.

pub mod control;
pub mod error;
pub mod names;
pub mod session;
