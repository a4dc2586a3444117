//! Tests of the store: lookups and paths across renames and removals, bounded
//! descriptors, reused inode numbers, the hidden name.

use super::*;

fn store() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let fd = Store::open_root(d.path()).unwrap();
    (d, Store::new(fd, Some(".coherent".into())).unwrap())
}

/// A request of root beginning now.
fn root() -> Caller {
    Caller {
        pid: 0,
        uid: 0,
        gid: 0,
        started: crate::request_timeout::Started::now(),
    }
}

#[test]
fn lookup_counts_and_paths_follow_renames() {
    let (d, s) = store();
    std::fs::create_dir(d.path().join("a")).unwrap();
    std::fs::write(d.path().join("a/f"), b"x").unwrap();
    let a = s.lookup(ROOT_INO, OsStr::new("a")).unwrap();
    let f = s.lookup(a.ino, OsStr::new("f")).unwrap();
    assert_eq!(s.lookup(a.ino, OsStr::new("f")).unwrap().ino, f.ino);
    assert_eq!(s.path_of(f.ino).unwrap(), Path::new("a/f"));
    s.rename(a.ino, OsStr::new("f"), ROOT_INO, OsStr::new("g"), 0)
        .unwrap();
    assert_eq!(s.path_of(f.ino).unwrap(), Path::new("g"));
    s.forget(f.ino, 1);
    assert!(s.getattr(f.ino).is_ok());
    s.forget(f.ino, 1);
    assert_eq!(s.getattr(f.ino), Err(FsError(libc::ESTALE)));
    assert_eq!(s.inode_count(), 2);
}

#[test]
fn removed_and_replaced_nodes_lose_their_path() {
    let (d, s) = store();
    for n in ["a", "b", "c"] {
        std::fs::write(d.path().join(n), n).unwrap();
    }
    let a = s.lookup(ROOT_INO, OsStr::new("a")).unwrap();
    let b = s.lookup(ROOT_INO, OsStr::new("b")).unwrap();
    let c = s.lookup(ROOT_INO, OsStr::new("c")).unwrap();
    std::fs::hard_link(d.path().join("c"), d.path().join("c2")).unwrap();
    s.unlink(ROOT_INO, OsStr::new("a")).unwrap();
    assert_eq!(s.path_of(a.ino), None, "removed");
    s.rename(ROOT_INO, OsStr::new("c"), ROOT_INO, OsStr::new("b"), 0)
        .unwrap();
    assert_eq!(s.path_of(b.ino), None, "replaced by the rename");
    assert_eq!(s.path_of(c.ino).unwrap(), Path::new("b"));
    // A node with another name left keeps its last known one.
    std::fs::hard_link(d.path().join("b"), d.path().join("b3")).unwrap();
    s.unlink(ROOT_INO, OsStr::new("c2")).unwrap();
    assert_eq!(s.path_of(c.ino).unwrap(), Path::new("b"));
    // ... and when that one is removed, another name it was seen under takes over.
    s.lookup(ROOT_INO, OsStr::new("b3")).unwrap();
    assert_eq!(s.path_of(c.ino).unwrap(), Path::new("b3"));
    s.lookup(ROOT_INO, OsStr::new("b")).unwrap();
    assert_eq!(s.path_of(c.ino).unwrap(), Path::new("b"));
    s.unlink(ROOT_INO, OsStr::new("b")).unwrap();
    assert_eq!(
        s.path_of(c.ino).unwrap(),
        Path::new("b3"),
        "not the removed name"
    );
}

/// A store holding at most 8 descriptors; `handles` false: re-resolution by name.
fn small_store(handles: bool) -> (tempfile::TempDir, Store) {
    let (d, mut s) = store();
    s.fds = FdCache::new(8);
    if !handles {
        s.mount = None;
    }
    (d, s)
}

fn bounded_descriptors(handles: bool) {
    let (d, s) = small_store(handles);
    assert_eq!(s.mount.is_some(), handles);
    let sub = s
        .mkdir(&root(), ROOT_INO, OsStr::new("sub"), 0o755, 0)
        .unwrap();
    let mut inos = Vec::new();
    for i in 0..300 {
        let name = format!("f{i}");
        let (a, fh, _) = s
            .create(
                &root(),
                sub.ino,
                OsStr::new(&name),
                0o644,
                0,
                libc::O_WRONLY,
            )
            .unwrap();
        s.write(fh, 0, name.as_bytes(), false).unwrap();
        s.release(fh);
        inos.push(a.ino);
    }
    assert!(s.fds.len() <= 8, "{} descriptors cached", s.fds.len());
    // Every node still answers, re-opened on demand, after its descriptor was evicted.
    for (i, ino) in inos.iter().enumerate() {
        let a = s.getattr(*ino).unwrap();
        assert_eq!(a.size, format!("f{i}").len() as u64);
        let (fh, _) = s.open(*ino, libc::O_RDONLY).unwrap();
        assert_eq!(s.read(fh, 0, 16).unwrap(), format!("f{i}").as_bytes());
        s.release(fh);
    }
    assert!(s.fds.len() <= 8);
    // Renamed behind a cold cache: still the same node under its new name.
    s.rename(sub.ino, OsStr::new("f7"), ROOT_INO, OsStr::new("g7"), 0)
        .unwrap();
    for ino in &inos[100..120] {
        s.getattr(*ino).unwrap();
    }
    assert_eq!(s.getattr(inos[7]).unwrap().size, 2);
    // Removed and still referenced: the node keeps answering from its pinned descriptor.
    let (fh, _) = s.open(inos[9], libc::O_RDONLY).unwrap();
    s.unlink(sub.ino, OsStr::new("f9")).unwrap();
    for ino in &inos[120..140] {
        s.getattr(*ino).unwrap();
    }
    assert_eq!(s.getattr(inos[9]).unwrap().nlink, 0);
    s.release(fh);
    // Replaced behind the volume's back with a new file: never reached through the old
    // node (a stale handle, or a (dev, ino) that no longer matches).
    for ino in &inos[140..160] {
        s.getattr(*ino).unwrap();
    }
    std::fs::remove_file(d.path().join("sub/f11")).unwrap();
    std::fs::write(d.path().join("sub/f11"), b"another").unwrap();
    match s.getattr(inos[11]) {
        Err(e) => assert_eq!(e, FsError(libc::ESTALE)),
        // By name, a reused inode number at the same name cannot be told apart (the
        // known limit of the fallback); with handles the generation tells.
        Ok(a) => assert!(!handles, "old node reached a new file: {a:?}"),
    }
    let again = s.lookup(sub.ino, OsStr::new("f11")).unwrap();
    // The new file's number is its own inode number (docs/posix.md#identity).
    let new_ino = std::fs::symlink_metadata(d.path().join("sub/f11")).unwrap();
    assert_eq!(again.ino, std::os::unix::fs::MetadataExt::ino(&new_ino));
    assert_eq!(again.size, 7);
}

/// A node whose file is gone and whose inode number came back for a new file (as
/// ext4 does) is told apart by its handle: the number is the new file's now, and the
/// kernel's references to the old one are counted on (its forgets come for it).
#[test]
fn a_reused_inode_number_goes_to_the_new_file() {
    let (d, s) = small_store(true);
    std::fs::write(d.path().join("f"), b"new").unwrap();
    let st = fstatat(
        s.node_fd(ROOT_INO).unwrap().1.as_raw_fd(),
        c"f",
        libc::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let stale = FileHandle::from_parts(1, vec![0; 8]);
    {
        let mut t = s.tables.write();
        t.inodes.insert(
            st.st_ino,
            Arc::new(Inode {
                key: (st.st_dev, st.st_ino),
                kind: Kind::File,
                handle: Some(stale),
                pinned: Mutex::new(None),
                state: Mutex::new(InodeState {
                    refs: 1,
                    link: Some((ROOT_INO, "old".into())),
                    others: Vec::new(),
                }),
            }),
        );
        t.by_key.insert((st.st_dev, st.st_ino), st.st_ino);
        s.live.fetch_add(1, Ordering::Relaxed);
    }
    let a = s.lookup(ROOT_INO, OsStr::new("f")).unwrap();
    assert_eq!(a.ino, st.st_ino);
    assert_eq!(a.size, 3, "the new file's attributes");
    assert_eq!(s.path_of(a.ino).unwrap(), Path::new("f"));
    assert_eq!(s.inode_count(), 2, "one node for the number");
    // The old reference's forget leaves the new one's.
    s.forget(st.st_ino, 1);
    assert_eq!(s.getattr(st.st_ino).unwrap().size, 3);
    s.forget(st.st_ino, 1);
    assert_eq!(s.inode_count(), 1);
}

#[test]
fn bounded_descriptors_with_handles() {
    bounded_descriptors(true);
}

#[test]
fn bounded_descriptors_by_name() {
    bounded_descriptors(false);
}

#[test]
fn hidden_name_is_not_visible() {
    let (d, s) = store();
    std::fs::create_dir(d.path().join(".coherent")).unwrap();
    assert_eq!(
        s.lookup(ROOT_INO, OsStr::new(".coherent")),
        Err(FsError(libc::ENOENT))
    );
    let fh = s.opendir(ROOT_INO).unwrap();
    let names: Vec<_> = s
        .readdir(fh, 0)
        .unwrap()
        .0
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![OsString::from("."), OsString::from("..")]);
    assert_eq!(
        s.mkdir(&root(), ROOT_INO, OsStr::new(".coherent"), 0o755, 0),
        Err(FsError(libc::EEXIST))
    );
}
