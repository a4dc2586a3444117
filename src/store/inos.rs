//! The inode numbers the mount reports (`st_ino`, `d_ino`), and with them the node ids the
//! kernel is given: a function of the backing file's (dev, ino), so a file keeps its number
//! for its whole life, across the kernel forgetting it, a remount and a restart, as it
//! would natively (docs/design.md#identity).
//!
//! The mount is one filesystem (one `st_dev`) while the backing tree may span several, so
//! the device is folded into the number:
//!
//! - on the backing root's own filesystem: the backing inode number itself, when it is
//!   below 2^62 (every ext4, xfs, btrfs or tmpfs number in practice) and not 1 (the
//!   mount root's node id);
//! - on another filesystem mounted below the root: `2^62 | tag << 40 | ino` for an inode
//!   number below 2^40, where `tag` (1 to 2^22-1) is a hash of the device number, probed
//!   to the next free tag on a collision with another device seen before: stable as long
//!   as the device number is (a block device's is; a tmpfs gets a new one, and new inode
//!   numbers, at each mount natively too);
//! - anything else (a number too large to fold, tags exhausted): a number of tag 0 from a
//!   counter, unique for the node's life but not stable across forgets.
//!
//! Numbers are unique among live nodes by construction: the three ranges are disjoint and
//! below [`super::VIRTUAL_INO_BIT`].

use std::collections::HashMap;

use parking_lot::Mutex;

const OTHER_FS: u64 = 1 << 62;
const TAG_SHIFT: u32 = 40;
const TAG_BITS: u32 = 62 - TAG_SHIFT;
const INO_MASK: u64 = (1 << TAG_SHIFT) - 1;
const TAGS: u64 = 1 << TAG_BITS;

pub(super) struct Inos {
    /// The backing root's device and inode number.
    home: (u64, u64),
    /// Tags given to other devices, and the devices by tag.
    tags: Mutex<Tags>,
}

#[derive(Default)]
struct Tags {
    of_dev: HashMap<u64, u64>,
    taken: HashMap<u64, u64>,
    /// The next number of tag 0 (the unstable fallback).
    next_spare: u64,
}

impl Inos {
    pub(super) fn new(home: (u64, u64)) -> Inos {
        Inos {
            home,
            tags: Mutex::new(Tags {
                next_spare: 1,
                ..Tags::default()
            }),
        }
    }

    /// The number the mount reports for the backing file (dev, ino), when it has a stable
    /// one (None: the caller takes [`Inos::spare`]).
    pub(super) fn stable(&self, (dev, ino): (u64, u64)) -> Option<u64> {
        if dev == self.home.0 {
            // 1 is the root's node id: another file numbered 1 (none on ext4, xfs, btrfs,
            // where 1 is never a reachable file) takes a spare.
            return (ino < OTHER_FS && (ino != 1 || ino == self.home.1) && ino != 0).then_some(ino);
        }
        if ino > INO_MASK || ino == 0 {
            return None;
        }
        let tag = self.tag(dev)?;
        Some(OTHER_FS | tag << TAG_SHIFT | ino)
    }

    /// The number reported for a directory entry (`d_ino`) of a directory on device `dev`:
    /// the same as its stat's unless the entry is a mount point (natively too, `d_ino` of
    /// a mount point is the covered directory's); 0 for one without a stable number, for
    /// the caller to fill.
    pub(super) fn entry(&self, dev: u64, ino: u64) -> u64 {
        self.stable((dev, ino)).unwrap_or(0)
    }

    /// A number of the fallback range, never given before.
    pub(super) fn spare(&self) -> u64 {
        let mut t = self.tags.lock();
        let n = t.next_spare;
        t.next_spare += 1;
        OTHER_FS | (n & INO_MASK)
    }

    fn tag(&self, dev: u64) -> Option<u64> {
        let mut t = self.tags.lock();
        if let Some(tag) = t.of_dev.get(&dev) {
            return Some(*tag);
        }
        // FNV-1a of the device number: the same device gets the same tag in every run
        // unless another device took it first.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in dev.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        let start = h % (TAGS - 1) + 1;
        let mut tag = start;
        loop {
            if let std::collections::hash_map::Entry::Vacant(e) = t.taken.entry(tag) {
                e.insert(dev);
                t.of_dev.insert(dev, tag);
                return Some(tag);
            }
            tag = tag % (TAGS - 1) + 1;
            if tag == start {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_the_backing_ones_on_the_root_filesystem_and_folded_elsewhere() {
        let m = Inos::new((10, 2));
        assert_eq!(m.stable((10, 12345)), Some(12345));
        assert_eq!(m.stable((10, 2)), Some(2), "the root reports its own");
        assert_eq!(m.stable((10, 1)), None, "1 is the root's node id");
        assert_eq!(m.stable((10, 1 << 62)), None);
        let a = m.stable((11, 7)).unwrap();
        let b = m.stable((12, 7)).unwrap();
        assert!(a & OTHER_FS != 0 && a != b && a & INO_MASK == 7 && b & INO_MASK == 7);
        assert_eq!(m.stable((11, 7)), Some(a), "stable within a run");
        assert_eq!(
            Inos::new((10, 2)).stable((11, 7)),
            Some(a),
            "and across runs"
        );
        assert_eq!(m.stable((11, 1 << 41)), None);
        let s = m.spare();
        assert_ne!(s, m.spare());
        assert_eq!(s >> TAG_SHIFT, OTHER_FS >> TAG_SHIFT, "tag 0");
        assert!(a < super::super::VIRTUAL_INO_BIT && s < super::super::VIRTUAL_INO_BIT);
    }

    #[test]
    fn a_tag_collision_probes_to_the_next_free_tag() {
        let m = Inos::new((10, 2));
        let first = m.tag(11).unwrap();
        // Take the tag another device would hash to by pretending it is taken.
        m.tags.lock().taken.insert(first % (TAGS - 1) + 1, 99);
        m.tags.lock().of_dev.remove(&11);
        m.tags.lock().taken.remove(&first);
        m.tags.lock().taken.insert(first, 98);
        let again = m.tag(11).unwrap();
        assert_ne!(again, first);
        assert_ne!(again, first % (TAGS - 1) + 1);
    }
}
