//! Memory held per path. The volume keeps a few small tables for every path it has seen
//! (docs/speed.md#what-grows-with-the-tree-per-path), so what each row costs is what the
//! daemon's RSS grows by per file of the tree.

/// Appends `x` to `v`, growing it from one element and doubling after (a `Vec`'s first
/// push reserves four): most paths have one version and one holder, and at 80k paths
/// the three spare rows cost more than the row used.
pub fn push_tight<T>(v: &mut Vec<T>, x: T) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.len().max(1));
    }
    v.push(x);
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
}
