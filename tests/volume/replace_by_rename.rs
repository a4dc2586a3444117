//! A name a sync replaced by a rename in the backing directory opens through the mount as
//! the new file, never as the orphan the kernel's cached entry still points to (whatever
//! is written to the orphan is lost).

use crate::common;

use std::io::Write;

use common::Mount;

/// A sync that replaces a file by a rename in the backing directory: the next open of the
/// name through the mount, within the entry's cache time, is of the new file, and what is
/// written there lands in it (not in the orphan, where it would be lost).
fn open_after_a_replace_by_rename_reaches_the_new_file(m: &Mount) {
    std::fs::write(m.path("h.md"), b"one\n").unwrap();
    assert_eq!(std::fs::read(m.path("h.md")).unwrap(), b"one\n");
    for round in 0..3 {
        std::fs::write(m.backing_path(".h.md.sync"), format!("synced {round}\n")).unwrap();
        std::fs::rename(m.backing_path(".h.md.sync"), m.backing_path("h.md")).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(m.path("h.md"))
            .unwrap();
        f.write_all(format!("added {round}\n").as_bytes()).unwrap();
        drop(f);
        let want = format!("synced {round}\nadded {round}\n");
        assert_eq!(
            std::fs::read_to_string(m.backing_path("h.md")).unwrap(),
            want,
            "round {round}: the write through the mount went to the replaced file"
        );
        assert_eq!(std::fs::read_to_string(m.path("h.md")).unwrap(), want);
    }
}

both_modes!(open_after_a_replace_by_rename_reaches_the_new_file);
