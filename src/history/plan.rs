//! What a session changed, from the index: for `diff --session S` and `undo --session S`,
//! per file, the version before S's first change in the window and S's last version, and
//! whether another session committed after S.

use std::collections::BTreeMap;

use super::Entry;

/// One file S changed in the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: String,
    /// The version before S's first change in the window (None: S made the path: there
    /// was none, or the index does not reach back that far).
    pub before: Option<Entry>,
    /// S's last version in the window.
    pub last: Entry,
    /// The version someone else committed after S's last one (the latest), if any.
    pub after: Option<Entry>,
}

/// The files `session` changed at or after `since` (ms), path order. `entries` in any
/// order; each path's are ordered by version then time.
pub fn changes(entries: Vec<Entry>, session: &str, since: i64) -> Vec<Change> {
    let mut by_path: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    for e in entries {
        by_path.entry(e.path.clone()).or_default().push(e);
    }
    let mut out = Vec::new();
    for (path, mut v) in by_path {
        // `base` (the content first seen) sorts before a commit of the same version.
        v.sort_by_key(|e| (e.version, e.op != "base", e.ts));
        let is_s = |e: &Entry| e.session == session && e.op != "base" && e.ts >= since;
        let Some(first) = v.iter().position(is_s) else {
            continue;
        };
        let last = v.iter().rposition(is_s).expect("first exists");
        // The version before S's first change: the latest entry below it that is not
        // S's first change itself (a base of the same version is the content before it).
        let before = v[..first]
            .iter()
            .rev()
            .find(|e| e.version < v[first].version || e.op == "base")
            .cloned();
        let after = v[last + 1..]
            .iter()
            .rev()
            .find(|e| e.session != session && e.op != "base")
            .cloned();
        out.push(Change {
            path,
            before,
            last: v[last].clone(),
            after,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(path: &str, v: u64, s: &str, ts: i64, op: &str, d: Option<&str>) -> Entry {
        Entry {
            path: path.into(),
            version: v,
            session: s.into(),
            ts,
            op: op.into(),
            digest: d.map(str::to_string),
            size: 0,
            kept: true,
            from: None,
        }
    }

    #[test]
    fn before_first_and_last_of_the_session_in_the_window() {
        let all = vec![
            e("a", 1, "", 0, "base", Some("a1")),
            e("a", 2, "s", 10, "write", Some("a2")),
            e("a", 3, "t", 20, "write", Some("a3")),
            e("a", 4, "s", 30, "write", Some("a4")),
            e("a", 5, "s", 40, "write", Some("a5")),
            e("b", 1, "s", 15, "write", Some("b1")),
            e("c", 7, "t", 5, "write", Some("c7")),
            e("c", 8, "s", 25, "unlink", None),
            e("c", 9, "t", 35, "write", Some("c9")),
        ];
        let c = changes(all.clone(), "s", 0);
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].before.as_ref().unwrap().digest.as_deref(), Some("a1"));
        assert_eq!(c[0].last.version, 5);
        assert!(c[0].after.is_none());
        assert!(c[1].before.is_none(), "s made b");
        assert_eq!(c[2].before.as_ref().unwrap().version, 7);
        assert_eq!(c[2].after.as_ref().unwrap().session, "t");
        // The window starts after s's first change of a: t's v3 is then the version before.
        let c = changes(all, "s", 26);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].before.as_ref().unwrap().version, 3);
        assert_eq!(c[0].last.version, 5);
    }
}
