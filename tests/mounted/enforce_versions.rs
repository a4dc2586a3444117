//! Versions on a real mount (docs/design.md#versions): one per committed change of each tool, none
//! for a read or an unchanged close, changes behind the volume's back counted at the next open,
//! directory renames moving versions, tombstones continuing the numbering.

use crate::coherent;
use crate::common;

use coherent::*;
use common::Mount;

fn v(m: &Mount, p: &str) -> Option<u64> {
    version(m, p)
}

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

#[test]
fn a_created_file_is_v1_after_its_first_commit() {
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo a > new.md");
    assert_eq!(v(&m, "new.md"), Some(1));
    sh_ok(&m, Some("alice"), "echo b >> new.md");
    assert_eq!(v(&m, "new.md"), Some(2));
    sh_ok(&m, Some("alice"), "touch empty.md");
    assert_eq!(v(&m, "empty.md"), Some(1), "create without writes");
    sh_ok(
        &m,
        Some("alice"),
        "python3 -c \"f=open('py.md','w'); f.write('a'); f.flush(); f.write('b')\"",
    );
    assert_eq!(
        v(&m, "py.md"),
        Some(1),
        "create and writes on one handle: one commit"
    );
    sh_ok(&m, Some("alice"), "ln -s new.md link.md");
    let (code, st) = cli_json(&m, Some("alice"), &["status", "link.md"]);
    assert_eq!(code, Some(0), "{st}");
    assert_eq!(st["status"]["version"], 1, "a symlink has a version: {st}");
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

#[test]
fn changes_behind_the_volumes_back_are_counted() {
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo a > f");
    assert_eq!(v(&m, "f"), Some(1));
    // an edit in the backing directory, then an open through the volume
    std::fs::write(m.backing_path("f"), "edited behind\n").unwrap();
    assert_eq!(sh_ok(&m, Some("bob"), "cat f"), "edited behind\n");
    assert_eq!(v(&m, "f"), Some(2));
    let ev = await_events(&m, "external_change", "f", None, 1);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["version"], 2, "{ev:?}");
    // counted once: further opens see the same stamp
    sh_ok(&m, Some("bob"), "cat f >/dev/null");
    assert_eq!(v(&m, "f"), Some(2));
    // a replaced inode (the editor way, behind our back) is a change as well
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
    // the external change also ends a live handoff's fence (the version moved)
    sh_ok(&m, Some("alice"), "cat f >/dev/null");
    transfer(&m, "alice", "bob", &["f"]);
    sh_refused(&m, "alice", "echo x >> f", "f", "fenced");
    std::fs::write(m.backing_path("f"), "again\n").unwrap();
    sh_ok(&m, Some("bob"), "cat f >/dev/null");
    assert_eq!(v(&m, "f"), Some(v3 + 1));
    sh_ok(&m, Some("alice"), "echo x >> f");
}

#[test]
fn directory_renames_keep_versions() {
    let m = mount(true);
    sh_ok(
        &m,
        Some("alice"),
        "mkdir -p d/sub && echo 1 > d/a && echo 2 >> d/a && echo x > d/b && echo c > d/sub/c \
         && echo c2 >> d/sub/c && echo c3 >> d/sub/c",
    );
    assert_eq!(
        (v(&m, "d/a"), v(&m, "d/b"), v(&m, "d/sub/c")),
        (Some(2), Some(1), Some(3))
    );
    sh_ok(&m, Some("alice"), "mv d e");
    assert_eq!(
        (v(&m, "e/a"), v(&m, "e/b"), v(&m, "e/sub/c")),
        (Some(2), Some(1), Some(3))
    );
    sh_ok(&m, Some("alice"), "mv e/sub top");
    assert_eq!(v(&m, "top/c"), Some(3));
    sh_ok(&m, Some("alice"), "echo more >> e/a && echo more >> top/c");
    assert_eq!((v(&m, "e/a"), v(&m, "top/c")), (Some(3), Some(4)));
    // a handoff follows a path: a live record under a renamed directory keeps its fence
    touch_session(&m, "bob");
    transfer(&m, "alice", "bob", &["e/b"]);
    sh_refused(&m, "alice", "echo no >> e/b", "e/b", "fenced");
}

#[test]
fn a_removed_path_continues_its_numbering() {
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo 1 > f && echo 2 >> f");
    assert_eq!(v(&m, "f"), Some(2));
    sh_ok(&m, Some("alice"), "rm f");
    assert_eq!(await_committed_version(&m, "f", 3), Some(3));
    let rm = events_of(&m, "commit", "f", Some("alice"));
    assert_eq!(rm.last().unwrap()["removed"], true, "{rm:?}");
    sh_ok(&m, Some("bob"), "echo new > f");
    assert_eq!(v(&m, "f"), Some(4));
    sh_ok(&m, Some("bob"), "mv f g");
    assert_eq!(await_committed_version(&m, "f", 5), Some(5));
    assert_eq!(v(&m, "g"), Some(1));
    sh_ok(&m, Some("bob"), "mv g f");
    assert_eq!(v(&m, "f"), Some(6));
}

#[test]
fn commits_are_logged_with_their_session() {
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo a > f");
    sh_ok(&m, Some("bob"), "echo b >> f");
    let c = await_events(&m, "commit", "f", None, 2);
    let who: Vec<(&str, u64)> = c
        .iter()
        .map(|e| {
            (
                e["session"].as_str().unwrap(),
                e["version"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(who, [("alice", 1), ("bob", 2)], "{c:?}");
    assert_eq!(c[1]["agent"], agent_of("bob"));
}
