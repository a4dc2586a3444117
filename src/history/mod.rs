//! The content history of tracked files (docs/history.md): every version a commit made,
//! kept by its BLAKE3 digest in a store beside the journal, so a version can be shown and a
//! session's work diffed or undone. No FUSE in here: the volume calls `Store::keep` at
//! its commit points and [`Store::record`] with the version the engine counted.
//!
//! - `store`: the blobs (`objects/`) and the index (`index.jsonl`), their crash semantics
//!   and retention (`store/content.rs` reading, hashing and copying a file into a blob,
//!   `store/fd.rs` opening without following symlinks);
//! - `diff`: a line diff (Myers) printed as a unified diff;
//! - `plan`: what `diff --session` and `undo --session` take from the index;
//! - `b64`: base64, for bytes that are not UTF-8 in a JSON reply.

pub mod b64;
pub mod diff;
pub mod plan;
mod store;

pub use store::{hex as store_hex, Entry, Kept, Limits, Store};

/// How `--since` is written: RFC 3339 (`2026-12-04T17:00:00Z`) or a span back from now
/// (`90s`, `30m`, `2h`, `1d`). None if neither.
pub fn parse_since(
    s: &str,
    now: crate::coherence::Timestamp,
) -> Option<crate::coherence::Timestamp> {
    if let Some(t) = crate::coherence::Timestamp::parse_rfc3339(s) {
        return Some(t);
    }
    let unit = s.chars().last()?;
    let n: i64 = s[..s.len() - unit.len_utf8()].parse().ok()?;
    let secs = match unit {
        's' => n,
        'm' => n.checked_mul(60)?,
        'h' => n.checked_mul(3600)?,
        'd' => n.checked_mul(86_400)?,
        _ => return None,
    };
    Some(crate::coherence::Timestamp(
        now.0.saturating_sub(secs.saturating_mul(1000)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coherence::Timestamp;

    #[test]
    fn since_is_a_time_or_a_span_back() {
        let now = Timestamp(10_000_000);
        assert_eq!(
            parse_since("90s", now),
            Some(Timestamp(10_000_000 - 90_000))
        );
        assert_eq!(
            parse_since("2h", now),
            Some(Timestamp(10_000_000 - 7_200_000))
        );
        assert_eq!(
            parse_since("2026-12-04T17:00:00Z", now),
            Timestamp::parse_rfc3339("2026-12-04T17:00:00.000Z")
        );
        assert_eq!(parse_since("soon", now), None);
        assert_eq!(parse_since("5w", now), None);
    }
}
