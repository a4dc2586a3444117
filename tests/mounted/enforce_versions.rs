//! Versions on a real mount (docs/design.md#versions): what only the kernel shows. The
//! syscalls real tools make move the version once per commit and never for a read or an
//! unchanged close, a real close's RELEASE comes as a `release`, and a change behind the
//! volume's back shows through the kernel's caches and is counted. The decisions (one version
//! per commit, external changes counted once, directory renames, tombstones, the session
//! of each commit) are tested in process: tests/nomount/inproc_versions.rs.

use crate::coherent;
use crate::common;

use coherent::*;
use common::Mount;

fn v(m: &Mount, p: &str) -> Option<u64> {
    version(m, p)
}

/// Real tools' reads and unchanged opens for write (whatever opens, stats and listings they
/// make) leave the version where it is, and a live process's close(2) reaches the daemon
/// as an asynchronous RELEASE, logged `release`.
#[test]
fn a_read_or_an_unchanged_close_does_not_move_the_version() {
    let m = mount(true);
    std::fs::write(m.backing_path("f"), "x\n").unwrap();
    sh_ok(&m, Some("alice"), "cat f >/dev/null");
    assert_eq!(
        v(&m, "f"),
        Some(1),
        "an existing file is v1 when first seen"
    );
    for cmd in [
        "cat f >/dev/null",
        "head -c1 f >/dev/null; stat f >/dev/null; ls -l >/dev/null",
        ": >> f",
        "python3 -c \"open('f','r+')\"",
        "python3 -c \"open('f','a')\"",
        "exec 3>>f; exec 3>&-",
    ] {
        sh_ok(&m, Some("alice"), cmd);
        assert_eq!(v(&m, "f"), Some(1), "after `{cmd}`");
    }
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "x\n");
    // an unchanged close(2) of a write handle by a live process is a `release` (FUSE
    // RELEASE is asynchronous: wait for it)
    let before = events_of(&m, "release", "f", Some("alice")).len();
    let mut h = hold_open(&m, Some("alice"), "f", true).expect("open for write");
    h.close();
    assert!(
        common::wait_until(SETTLE, || events_of(&m, "release", "f", Some("alice"))
            .len()
            > before),
        "no release event"
    );
    h.exit();
    assert_eq!(v(&m, "f"), Some(1));
    // the log is in order: with the release shown, a commit of the reads would show too
    assert!(events_of(&m, "commit", "f", None).is_empty());
    sh_ok(&m, Some("alice"), "echo y >> f");
    assert_eq!(v(&m, "f"), Some(2));
}

/// Each tool, one after the other on one file by one session: exactly one commit each;
/// metadata-only changes (mode, xattrs) none, and they are not mistaken for external
/// changes at the next open.
#[test]
fn each_tool_moves_the_version_once_per_commit() {
    each_tool(mount(true));
}

/// The same with reads and writes going through the daemon (`--no-passthrough`).
#[test]
fn each_tool_moves_the_version_once_per_commit_without_passthrough() {
    each_tool(mount(false));
}

fn each_tool(m: Vol) {
    sh_ok(&m, Some("alice"), "echo 0 > f && echo other > o");
    let tools: &[(&str, u64)] = &[
        // `>` and `dd of=` flush once before writing (see enforce_routes.rs)
        ("echo a > f", 1),
        ("echo b >> f", 1),
        ("echo c | tee f >/dev/null", 1),
        ("echo d | tee -a f >/dev/null", 1),
        ("sed -i s/c/C/ f", 1),
        ("cp o f", 1),
        ("printf dd | dd of=f status=none", 1),
        ("python3 -c \"open('f','w').write('py')\"", 1),
        ("python3 -c \"open('f','a').write('more')\"", 1),
        ("truncate -s 1 f", 1),
        ("truncate -s 100 f", 1),
        ("touch f", 1),
        ("printf 'saved\\n' > .f.swp && mv .f.swp f", 1),
        ("cp o o2 && mv o2 f", 1),
        ("chmod 600 f", 0),
        ("chmod 644 f", 0),
        ("setfattr -n user.x -v 1 f", 0),
        ("setfattr -x user.x f", 0),
        ("cat f >/dev/null", 0),
        ("python3 -c \"open('f','w')\"", 1),
    ];
    let mut want = 1;
    let mut wrong = Vec::new();
    for (cmd, d) in tools {
        sh_ok(&m, Some("alice"), cmd);
        // a read after each: a metadata change through the volume is not "external"
        sh_ok(&m, Some("alice"), "cat f >/dev/null");
        want += d;
        let got = v(&m, "f");
        if got != Some(want) {
            wrong.push(format!("`{cmd}`: version {got:?}, want {want}"));
            want = got.unwrap_or(want);
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(await_committed_version(&m, "f", want), Some(want));
    assert!(
        events_of(&m, "external_change", "f", None).is_empty(),
        "changes through the volume counted as external"
    );
}

/// A change behind the volume's back shows through the mount at the next open, an edit in
/// place at once and a replaced inode once the kernel lets go of its entry, and is counted
/// (that each is counted exactly once, and ends a handoff's fence, is decided in process).
#[test]
fn changes_behind_the_volumes_back_show_through_the_mount() {
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo a > f");
    assert_eq!(v(&m, "f"), Some(1));
    // an edit in the backing directory, then an open through the volume
    std::fs::write(m.backing_path("f"), "edited behind\n").unwrap();
    assert_eq!(sh_ok(&m, Some("bob"), "cat f"), "edited behind\n");
    assert_eq!(v(&m, "f"), Some(2));
    // a replaced inode (the editor way, behind our back)
    std::fs::write(m.backing_path("f.tmp"), "replaced\n").unwrap();
    std::fs::rename(m.backing_path("f.tmp"), m.backing_path("f")).unwrap();
    // the kernel may keep the old entry until its TTL runs out: wait for the new inode
    assert!(
        common::wait_until(SETTLE, || sh_ok(&m, Some("bob"), "cat f") == "replaced\n"),
        "the replaced file never showed through the mount"
    );
    // (while the kernel still shows the old, now unlinked inode, its changed ctime may be
    // counted too: the version moved at least once)
    let v3 = v(&m, "f").unwrap();
    assert!(v3 >= 3, "replaced inode not counted: v{v3}");
}
