//! How the store holds a version in memory: its index line without what every line of a
//! path repeats. The path is the table's key (not a copy per version), the digest is its
//! 32 bytes (not 64 hex characters on the heap), and the session and the op name are
//! shared among every version that has them. An index line ([`Entry`]) is made back from
//! it only when a verb asks.

use std::sync::Arc;

use super::content::hex;
use super::Entry;
pub(super) use crate::mem::Names;

/// One version of one path (its path is the key it is filed under).
#[derive(Debug, Clone)]
pub(super) struct Rec {
    pub version: u64,
    pub ts: i64,
    pub size: u64,
    pub digest: Option<[u8; 32]>,
    pub session: Arc<str>,
    pub op: Arc<str>,
    pub kept: bool,
}

/// The 32 bytes of a digest written as 64 hex characters (None: not one).
pub(super) use crate::coherence::hex32::decode as unhex;

impl Rec {
    /// The record of the index line `e` (a digest that is not one is dropped: it names no
    /// blob the store could hold).
    pub fn of(e: &Entry, names: &mut Names) -> Rec {
        Rec {
            version: e.version,
            ts: e.ts,
            size: e.size,
            digest: e.digest.as_deref().and_then(unhex),
            session: names.get(&e.session),
            op: names.get(&e.op),
            kept: e.kept,
        }
    }

    /// The index line of this version of `path`.
    pub fn entry(&self, path: &str) -> Entry {
        Entry {
            path: path.to_string(),
            version: self.version,
            session: self.session.to_string(),
            ts: self.ts,
            op: self.op.to_string(),
            digest: self.digest.as_ref().map(hex),
            size: self.size,
            kept: self.kept,
            from: None,
        }
    }

    pub fn is_base(&self) -> bool {
        &*self.op == "base"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version is held for every version of every path in the history window.
    #[test]
    fn a_version_stays_small() {
        assert!(std::mem::size_of::<Rec>() <= 96);
    }

    #[test]
    fn a_digest_round_trips_and_anything_else_is_none() {
        let d = *blake3::hash(b"x").as_bytes();
        assert_eq!(unhex(&hex(&d)), Some(d));
        assert_eq!(unhex(&hex(&d).to_uppercase()), Some(d));
        assert_eq!(unhex(&hex(&d)[1..]), None);
        assert_eq!(unhex(&format!("{}g", &hex(&d)[1..])), None);
        assert_eq!(unhex(""), None);
    }

    #[test]
    fn a_line_made_back_is_the_line_and_names_are_shared() {
        let mut names = Names::default();
        let e = Entry {
            path: "a/b.md".into(),
            version: 3,
            session: "alice".into(),
            ts: 17,
            op: "write".into(),
            digest: Some(hex(blake3::hash(b"y").as_bytes())),
            size: 1,
            kept: true,
            from: None,
        };
        let (r1, r2) = (Rec::of(&e, &mut names), Rec::of(&e, &mut names));
        assert_eq!(r1.entry("a/b.md"), e);
        assert!(Arc::ptr_eq(&r1.session, &r2.session));
        assert!(Arc::ptr_eq(&r1.op, &r2.op));
    }
}
