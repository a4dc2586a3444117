//! Memory held per path. The volume keeps a few small tables for every path it has seen
//! (docs/speed.md#what-grows-with-the-tree-per-path), so what each row costs is what the
//! daemon's RSS grows by per file of the tree.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::Arc;

/// Appends `x` to `v`, growing it from one element and doubling after (a `Vec`'s first
/// push reserves four): most paths have one version and one holder, and at 80k paths
/// the three spare rows cost more than the row used.
pub fn push_tight<T>(v: &mut Vec<T>, x: T) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.len().max(1));
    }
    v.push(x);
}

/// Names many rows share (sessions, op names), each held once: a name per row would be a
/// heap string per file of the tree.
#[derive(Default)]
pub struct Names<S = std::collections::hash_map::RandomState>(HashSet<Arc<str>, S>);

impl<S: BuildHasher> Names<S> {
    /// The shared copy of `s`, if there is one.
    pub fn find(&self, s: &str) -> Option<Arc<str>> {
        self.0.get(s).cloned()
    }

    /// The shared copy of `s`, made if missing.
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.find(s) {
            return a;
        }
        let a: Arc<str> = Arc::from(s);
        self.0.insert(a.clone());
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_from_one_then_doubles() {
        let mut v = Vec::new();
        let mut caps = Vec::new();
        for i in 0..9 {
            push_tight(&mut v, i);
            caps.push(v.capacity());
        }
        assert_eq!(caps, [1, 2, 4, 4, 8, 8, 8, 8, 16]);
        assert_eq!(v, (0..9).collect::<Vec<_>>());
    }

    #[test]
    fn a_name_is_held_once() {
        let mut n: Names = Names::default();
        assert!(n.find("alice").is_none());
        let (a, b) = (n.get("alice"), n.get("alice"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(Arc::ptr_eq(&a, &n.find("alice").unwrap()));
    }
}
