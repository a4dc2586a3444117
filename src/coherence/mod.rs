//! The coherence engine (docs/design.md#versions to #handoff): versions, holds, transfer records,
//! the fence decision and the verbs. Pure: no I/O, no clock (every call takes `now`); events go to
//! an [`EventSink`] (the journal).

mod changes;
mod engine;
mod evict;
mod lookup;
mod ops;
mod queries;
mod route;
mod shared;
mod time;
mod types;
mod verbs;
mod wait;

pub use engine::{
    deny_text, valid_path, Engine, EventSink, MemorySink, EXTERNAL, MAX_NOTE, OLDER_PRINTS,
};
pub use lookup::{resolve_session, MIN_PREFIX};
pub use ops::Content;
pub use route::{computed_xattr, At, Found, Permit, Reach, Write, XATTR_PREFIX};
pub use shared::{Adopted, OwnCopy, Saved, SharedPath, SharedSession, Taken};
pub use time::Timestamp;
pub use types::*;
