//! The history store's tests: keeping, reading back, retention and cleaning.

use super::*;
use std::os::fd::AsFd;

fn entry(path: &str, v: u64, ts: i64, k: &Kept) -> Entry {
    Entry {
        path: path.into(),
        version: v,
        session: "s".into(),
        ts,
        op: "write".into(),
        digest: Some(hex(&k.digest)),
        size: k.size,
        kept: k.stored,
        from: None,
    }
}

fn file(dir: &Path, name: &str, bytes: &[u8]) -> File {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    File::open(p).unwrap()
}

/// `bytes` written to the file `name` in `dir` and kept by `s`.
fn keep(s: &Store, dir: &Path, name: &str, bytes: &[u8]) -> Kept {
    s.keep_fd(file(dir, name, bytes).as_fd()).unwrap().unwrap()
}

#[test]
fn keeps_each_content_once_and_reads_it_back_after_reopening() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::open(t.path(), Limits::default()).unwrap();
    let a = keep(&s, t.path(), "a", b"one\n");
    let b = keep(&s, t.path(), "b", b"one\n");
    assert_eq!(a, b);
    // One block on disk, as the bound counts it.
    assert_eq!(s.usage(), (4096, 1));
    s.record(entry("f", 2, 1, &a));
    drop(s);
    let s = Store::open(t.path(), Limits::default()).unwrap();
    let log = s.log("f");
    assert_eq!(log.len(), 1);
    assert_eq!(
        s.bytes(log[0].digest.as_deref().unwrap()).unwrap().unwrap(),
        b"one\n"
    );
    // The directory is private, and a blob changed on disk is refused, not shown.
    let md = std::fs::metadata(t.path().join("history")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o777,
        0o700
    );
    // A small blob is in a pack: its bytes are the pack's first.
    let d = hex(&a.digest);
    let pack = std::fs::OpenOptions::new()
        .write(true)
        .open(t.path().join("history/objects/pack-0"))
        .unwrap();
    std::os::unix::fs::FileExt::write_at(&pack, b"two\n", 0).unwrap();
    assert!(s.bytes(&d).is_err());
}

/// Allocated bytes of the blobs in `objects` (what `du` counts), the packs' entries left
/// out.
fn allocated(t: &Path) -> u64 {
    std::fs::read_dir(t.join("history/objects"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".idx"))
        .map(|e| std::os::unix::fs::MetadataExt::blocks(&e.metadata().unwrap()) * 512)
        .sum()
}

#[test]
fn a_pruned_packed_blob_frees_its_blocks_and_a_torn_entry_is_skipped() {
    let t = tempfile::tempdir().unwrap();
    let lim = Limits {
        keep: Duration::from_secs(3600),
        ..Limits::default()
    };
    let s = Store::open(t.path(), lim).unwrap();
    let old = Timestamp::now().0 - 2 * 3600 * 1000;
    let body = |c: u8| vec![c; 5000]; // two blocks
    let mut kept = Vec::new();
    for (i, c) in [b'a', b'b', b'c'].into_iter().enumerate() {
        let k = keep(&s, t.path(), "x", &body(c));
        let ts = if i == 1 { Timestamp::now().0 } else { old };
        s.record(entry(&format!("f{i}"), 1, ts, &k));
        kept.push(k);
    }
    assert_eq!(allocated(t.path()), 3 * 8192);
    // f1's is new; f0's and f2's are old, but each is its path's latest: kept. A second
    // version of f0 makes its first one prunable.
    let k = keep(&s, t.path(), "x", b"new\n");
    s.record(entry("f0", 2, Timestamp::now().0, &k));
    s.prune(Timestamp::now(), true);
    assert_eq!(s.usage(), (8192 + 8192 + 4096, 3));
    assert_eq!(
        allocated(t.path()),
        3 * 8192 - 8192 + 4096,
        "the record's blocks are freed"
    );
    // An entry whose bytes are not all in the pack (a power loss) is no blob.
    let entries = t.path().join("history/objects/pack-0.idx");
    let n = std::fs::metadata(&entries).unwrap().len();
    let mut torn = b"CPK1\0\0\0\0".to_vec();
    torn.extend_from_slice(&(1u64 << 20).to_le_bytes());
    torn.extend_from_slice(&5000u64.to_le_bytes());
    torn.extend_from_slice(&kept[1].digest); // taken, it would hide f1's bytes
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&entries)
        .unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &torn, n).unwrap();
    // And one cut short (killed mid-append) is skipped too.
    std::os::unix::fs::FileExt::write_at(&f, &torn[..20], n + 56).unwrap();
    drop(s);
    let s = Store::open(t.path(), lim).unwrap();
    assert_eq!(s.usage(), (8192 + 8192 + 4096, 3));
    assert_eq!(s.bytes(&hex(&kept[0].digest)).unwrap(), None);
    assert_eq!(s.bytes(&hex(&kept[1].digest)).unwrap(), Some(body(b'b')));
    assert_eq!(s.bytes(&hex(&kept[2].digest)).unwrap(), Some(body(b'c')));
    assert_eq!(
        s.bytes(&hex(&k.digest)).unwrap().as_deref(),
        Some(&b"new\n"[..])
    );
    // New blobs go to a new pack, and read back after a reopen.
    let k2 = keep(&s, t.path(), "x", b"later\n");
    s.record(entry("f3", 1, Timestamp::now().0, &k2));
    drop(s);
    let s = Store::open(t.path(), lim).unwrap();
    assert_eq!(
        s.bytes(&hex(&k2.digest)).unwrap().as_deref(),
        Some(&b"later\n"[..])
    );
}

#[test]
fn refuses_a_history_dir_open_to_others_or_a_symlink() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(t.path().join("elsewhere"), t.path().join("history")).unwrap();
    assert!(Store::open(t.path(), Limits::default()).is_err());
    std::fs::remove_file(t.path().join("history")).unwrap();
    std::fs::create_dir(t.path().join("history")).unwrap();
    std::fs::set_permissions(
        t.path().join("history"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    assert!(Store::open(t.path(), Limits::default()).is_err());
}

#[test]
fn over_the_file_limit_only_the_digest() {
    let t = tempfile::tempdir().unwrap();
    let lim = Limits {
        max_file: 3,
        ..Limits::default()
    };
    let s = Store::open(t.path(), lim).unwrap();
    let k = keep(&s, t.path(), "a", b"four");
    assert!(!k.stored);
    assert_eq!(k.digest, *blake3::hash(b"four").as_bytes());
    assert_eq!(s.usage(), (0, 0));
}

#[test]
fn a_large_file_is_hashed_off_the_request_and_recorded_by_digest() {
    let t = tempfile::tempdir().unwrap();
    let lim = Limits {
        max_file: 3,
        ..Limits::default()
    };
    let s = Arc::new(Store::open(t.path(), lim).unwrap());
    let f = file(t.path(), "big", b"large");
    let st = fstat(f.as_fd()).unwrap();
    let e = Entry {
        path: "big".into(),
        version: 2,
        session: "s".into(),
        ts: Timestamp::now().0,
        op: "write".into(),
        digest: None,
        size: 5,
        kept: false,
        from: None,
    };
    s.record_large_later(f.into(), st, e.clone());
    s.settle();
    let log = s.log("big");
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].digest, Some(hex(blake3::hash(b"large").as_bytes())));
    assert!(!log[0].kept);
    assert_eq!(s.usage(), (0, 0));
    // changed since the commit: that content is gone, no digest is made up
    let f = file(t.path(), "big2", b"large");
    let st = fstat(f.as_fd()).unwrap();
    std::fs::write(t.path().join("big2"), b"other!").unwrap();
    s.record_large_later(
        f.into(),
        st,
        Entry {
            path: "big2".into(),
            ..e
        },
    );
    s.settle();
    assert_eq!(s.log("big2")[0].digest, None);
}

/// A tree copied in whose files alone are over the bound: the bound holds, the least
/// recently used latest versions going by digest only, and a pass comes once per tenth of
/// the bound (each walks every path: one per version made an 80k-file untar quadratic).
#[test]
fn latest_versions_over_the_bound_yield_to_it_a_pass_per_tenth() {
    let t = tempfile::tempdir().unwrap();
    // 100 blocks; each version below takes one.
    let lim = Limits {
        max_bytes: 100 * 4096,
        ..Limits::default()
    };
    let s = Store::open(t.path(), lim).unwrap();
    let now = Timestamp::now().0;
    for i in 0..1000u64 {
        let p = format!("f{i}");
        let k = keep(&s, t.path(), &p, format!("{i:0>999}\n").as_bytes());
        s.record(entry(&p, 1, now + i as i64, &k));
        assert!(s.usage().0 <= lim.max_bytes, "{i}: {:?}", s.usage());
    }
    let (first, last) = (&s.log("f0")[0], &s.log("f999")[0]);
    assert!(!first.kept, "the least recently used went");
    assert!(first.digest.is_some(), "by digest still");
    assert!(s.bytes(last.digest.as_deref().unwrap()).unwrap().is_some());
    assert!(s.passes() <= 100, "{} passes for 1000 versions", s.passes());
}

#[test]
fn the_size_bound_holds_and_spares_each_paths_latest() {
    let t = tempfile::tempdir().unwrap();
    let lim = Limits {
        max_bytes: 10_000,
        ..Limits::default()
    };
    let s = Store::open(t.path(), lim).unwrap();
    let now = Timestamp::now().0;
    for i in 0..200u64 {
        let body = format!("{i:0>999}\n");
        let k = keep(&s, t.path(), "w", body.as_bytes());
        s.record(entry("w", i + 1, now + i as i64, &k));
        assert!(s.usage().0 <= 10_000 + 1000, "{:?}", s.usage());
    }
    let log = s.log("w");
    let last = log.last().unwrap();
    assert!(last.kept);
    assert!(s.bytes(last.digest.as_deref().unwrap()).unwrap().is_some());
    assert!(!log[0].kept, "the oldest went first");
    // What the index says is kept is on disk, after a reopen too; a pruned blob's block
    // is freed (each 1000-byte blob is one block of a pack).
    let before = s.usage();
    drop(s);
    let s = Store::open(t.path(), lim).unwrap();
    assert_eq!(s.usage(), before);
    assert_eq!(allocated(t.path()), before.1 as u64 * 4096);
    for e in s.log("w").iter().filter(|e| e.kept) {
        assert!(s.bytes(e.digest.as_deref().unwrap()).unwrap().is_some());
    }
}

#[test]
fn the_age_bound_drops_old_blobs_and_lines() {
    let t = tempfile::tempdir().unwrap();
    let lim = Limits {
        keep: Duration::from_secs(3600),
        ..Limits::default()
    };
    let s = Store::open(t.path(), lim).unwrap();
    let old = Timestamp::now().0 - 2 * 3600 * 1000;
    let a = keep(&s, t.path(), "a", b"old\n");
    s.record(entry("f", 1, old, &a));
    let b = keep(&s, t.path(), "b", b"new\n");
    s.record(entry("f", 2, Timestamp::now().0, &b));
    s.prune(Timestamp::now(), true);
    assert_eq!(s.usage(), (4096, 1));
    assert_eq!(s.log("f").len(), 1);
    drop(s);
    let s = Store::open(t.path(), lim).unwrap();
    assert_eq!(
        s.log("f").iter().map(|e| e.version).collect::<Vec<_>>(),
        [2]
    );
}

#[test]
fn a_directory_rename_moves_the_history_under_it_also_after_reopening() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::open(t.path(), Limits::default()).unwrap();
    let a = keep(&s, t.path(), "a", b"x");
    let now = Timestamp::now().0;
    s.record(entry("d/x", 1, now, &a));
    s.record(entry("d/sub/y", 1, now, &a));
    s.record(entry("dx", 1, now, &a));
    // Siblings that sort before `d/` ('-' and '.' are below '/') and after it.
    for sib in ["d-x", "d.0/z", "d0/z"] {
        s.record(entry(sib, 1, now, &a));
    }
    s.rename_dir("d", "e/f", now);
    let check = |s: &Store| {
        assert!(s.log("d/x").is_empty());
        assert_eq!(s.log("e/f/x")[0].path, "e/f/x");
        assert_eq!(s.log("e/f/sub/y").len(), 1);
        assert_eq!(s.log("dx").len(), 1, "a sibling with the same prefix stays");
        for sib in ["d-x", "d.0/z", "d0/z"] {
            assert_eq!(s.log(sib).len(), 1, "{sib} stays");
        }
        assert_eq!(s.all().len(), 6);
    };
    check(&s);
    drop(s);
    check(&Store::open(t.path(), Limits::default()).unwrap());
}

#[test]
fn a_torn_last_line_and_a_left_temp_file_are_cleaned() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::open(t.path(), Limits::default()).unwrap();
    let a = keep(&s, t.path(), "a", b"x");
    s.record(entry("f", 1, Timestamp::now().0, &a));
    drop(s);
    let idx = t.path().join("history").join(INDEX);
    let mut f = std::fs::OpenOptions::new().append(true).open(&idx).unwrap();
    f.write_all(b"{\"path\":\"f\",\"vers").unwrap();
    std::fs::write(t.path().join("history/objects/.tmp-1-1"), b"partial").unwrap();
    let s = Store::open(t.path(), Limits::default()).unwrap();
    assert_eq!(s.log("f").len(), 1);
    assert!(!t.path().join("history/objects/.tmp-1-1").exists());
}

/// What a transfer on several hosts publishes: the newest versions below the current one
/// that name a digest, newest first, a version kept twice (`base`, then a write) once, a
/// removal skipped; after a reopen too.
#[test]
fn digests_are_the_newest_versions_below_one_once_each() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::open(t.path(), Limits::default()).unwrap();
    let ks: Vec<Kept> = (0..5)
        .map(|i| keep(&s, t.path(), "x", format!("v{i}\n").as_bytes()))
        .collect();
    let now = Timestamp::now().0;
    let mut base = entry("f", 1, now, &ks[0]);
    base.op = "base".into();
    s.record(base);
    s.record(entry("f", 1, now + 2, &ks[1]));
    s.record(entry("f", 2, now + 3, &ks[2]));
    let mut gone = entry("f", 3, now + 4, &ks[2]);
    (gone.op, gone.digest) = ("unlink".into(), None);
    s.record(gone);
    s.record(entry("f", 4, now + 5, &ks[3]));
    s.record(entry("f", 5, now + 6, &ks[4]));
    let want = |s: &Store| {
        let d = s.digests("f", 5, 8);
        d.iter().map(|(v, _, d)| (*v, *d)).collect::<Vec<_>>()
    };
    let expect = vec![(4, ks[3].digest), (2, ks[2].digest), (1, ks[1].digest)];
    assert_eq!(want(&s), expect);
    assert_eq!(s.digests("f", 5, 2).len(), 2);
    assert!(s.digests("g", 5, 8).is_empty());
    drop(s);
    let s = Store::open(t.path(), Limits::default()).unwrap();
    assert_eq!(want(&s), expect);
}
