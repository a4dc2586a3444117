//! The control surface's wire format (docs/design.md#control-surface), with no FUSE types in it, in
//! three rooms:
//!
//! - `request`: [`parse_request`], the bytes of one `write(2)` to `.coherent/ctl` → a typed
//!   [`Request`] (a JSON object or a plain line `VERB ARG...`, syntax in that module's
//!   docs), paths normalised against the mount root;
//! - `reply`: [`Reply`], the one-object JSON envelope read back from the same open file, and
//!   [`CtlHandle`], the per-open-handle reply buffer, so the adapter only forwards bytes;
//! - `describe`: [`describe_record`] and friends, the human lines shared by replies and the
//!   CLI.

mod describe;
pub mod history;
mod reply;
mod request;
mod until;

pub use describe::{
    describe_record, describe_record_from, describe_records, relative_from, shell_word, short_id,
    via_text, whoami_text,
};
pub use reply::{session_json, CtlHandle, Reply};
pub use request::{
    normalize_path, parse_request, tokenize, Request, RequestError, Verb, MAX_WAIT_SECS,
};
pub use until::Until;

/// The largest request accepted in one write (bytes).
pub const MAX_REQUEST: usize = 1 << 20;
/// The largest note of a transfer (bytes, docs/design.md#handoff): checked by the request
/// parser, and by the engine for transfers that come another way.
pub const MAX_NOTE: usize = 64 * 1024;
/// The longest path accepted (bytes, after normalisation), as PATH_MAX.
pub const MAX_PATH: usize = 4096;
/// The longest session name accepted in `--to` or `register NAME` (bytes).
pub const MAX_NAME: usize = 1024;
/// How `.coherent/why` begins for a session never refused or warned.
pub const NO_REFUSAL: &str = "no refusal";
/// The virtual control directory at the mount root.
pub const CONTROL_DIR: &str = ".coherent";

/// What a valid request looks like; every `bad_request` message ends with it.
pub const USAGE: &str = "valid requests: `transfer --to SESSION [--note TEXT] PATH...`, \
`accept PATH...`, `decline PATH...`, `withdraw PATH...`, `status [PATH]`, `whoami`, \
`register [NAME]`, `wait PATH [accepted|completed|ended] [--timeout SECS | --standing]`, `wait --report`, \
or one JSON object such as \
{\"verb\":\"transfer\",\"paths\":[\"plan.md\"],\"to\":\"bob\",\"note\":\"...\"}";

#[cfg(test)]
mod tests;
