//! Versions (docs/design.md#versions) through the filesystem type with the real volume
//! policy and no mount (tests/common/inproc.rs): one per committed change, none for a read
//! or an unchanged close, changes behind the volume's back counted at the next open,
//! directory renames moving versions, tombstones continuing the numbering, each commit
//! logged with its session.
//!
//! The mounted tests keep what only the kernel shows (tests/mounted/enforce_versions.rs):
//! the syscalls of real tools, a real close's RELEASE, and a change behind the volume's
//! back showing through the kernel's caches.

use crate::coherent;
use crate::common;

use ::coherent::store::ROOT_INO;
use coherent::agent_of;
use common::inproc::{Agent, InProc};

const W: i32 = libc::O_WRONLY;
const CREATE: i32 = W | libc::O_CREAT | libc::O_TRUNC;
const APPEND: i32 = W | libc::O_APPEND | libc::O_CREAT;

/// Reads, listings and opens for write closed unchanged (`: >> f`, python's `open('f',
/// 'r+')` and `open('f', 'a')`, `exec 3>>f`) leave the version where it is; each such close
/// is a `release`, none a commit; a write then moves it.
#[test]
fn a_read_or_an_unchanged_close_does_not_move_the_version() {
    let f = InProc::new();
    let alice = Agent::new("alice");
    f.write_file("f", "x\n");
    assert_eq!(f.cat(&alice, "f").as_deref(), Ok("x\n"));
    assert_eq!(
        f.version(&alice, "f"),
        Some(1),
        "an existing file is v1 when first seen"
    );
    let ino = f.ino(&alice, "f").unwrap();
    f.fs.getattr(&alice.caller(), ino).unwrap();
    let dir = f.fs.opendir(&alice.caller(), ROOT_INO).unwrap();
    f.fs.readdirplus(&alice.caller(), ROOT_INO, dir.fh, 0, |_, _, _| false)
        .unwrap();
    f.fs.releasedir(ROOT_INO, dir.fh);
    assert_eq!(f.version(&alice, "f"), Some(1), "after a listing");
    for (what, flags) in [
        (": >> f", APPEND),
        ("open('f', 'r+')", libc::O_RDWR),
        ("open('f', 'a')", APPEND),
        ("exec 3>>f", APPEND),
        ("open(O_WRONLY)", W),
    ] {
        let before = f.events_of("release", "alice").len();
        assert_eq!(f.write(&alice, "f", flags, None), Ok(()), "{what}");
        assert_eq!(f.version(&alice, "f"), Some(1), "after `{what}`");
        let released = f.events_of("release", "alice");
        assert_eq!(released.len(), before + 1, "`{what}`: {released:?}");
    }
    assert_eq!(f.content("f").as_deref(), Some("x\n"));
    assert!(f.events_on("commit", "f").is_empty());
    f.write(&alice, "f", APPEND, Some(b"y\n")).unwrap();
    assert_eq!(f.version(&alice, "f"), Some(2));
}

#[test]
fn a_created_file_is_v1_after_its_first_commit() {
    let f = InProc::new();
    let alice = Agent::new("alice");
    f.write(&alice, "new.md", CREATE, Some(b"a\n")).unwrap();
    assert_eq!(f.version(&alice, "new.md"), Some(1));
    f.write(&alice, "new.md", APPEND, Some(b"b\n")).unwrap();
    assert_eq!(f.version(&alice, "new.md"), Some(2));
    f.write(&alice, "empty.md", CREATE, None).unwrap();
    assert_eq!(
        f.version(&alice, "empty.md"),
        Some(1),
        "create without writes"
    );
    // A create and two writes on one handle, one FLUSH: one commit.
    let c = &alice.caller();
    let made =
        f.fs.create(c, ROOT_INO, "py.md".as_ref(), 0o644, 0, CREATE)
            .unwrap();
    let (ino, fh) = (made.entry.attr.unwrap().ino, made.opened.fh);
    f.fs.write(c, ino, fh, 0, b"a").unwrap();
    f.fs.write(c, ino, fh, 1, b"b").unwrap();
    f.fs.flush(c, ino, fh).unwrap();
    f.fs.release(c, ino, fh);
    assert_eq!(f.content("py.md").as_deref(), Some("ab"));
    assert_eq!(
        f.version(&alice, "py.md"),
        Some(1),
        "create and writes on one handle: one commit"
    );
    f.symlink(&alice, "link.md", "new.md").unwrap();
    let (r, st) = f.ctl_reply(&alice, "status link.md");
    assert_eq!(r, Ok(()), "{st}");
    assert_eq!(st["status"]["version"], 1, "a symlink has a version: {st}");
}

#[test]
fn changes_behind_the_volumes_back_are_counted() {
    let f = InProc::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.write(&alice, "f", CREATE, Some(b"a\n")).unwrap();
    assert_eq!(f.version(&alice, "f"), Some(1));
    // an edit in the backing directory, then an open through the volume
    f.write_file("f", "edited behind\n");
    assert_eq!(f.cat(&bob, "f").as_deref(), Ok("edited behind\n"));
    assert_eq!(f.version(&bob, "f"), Some(2));
    let ev = f.events_on("external_change", "f");
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["version"], 2, "{ev:?}");
    // counted once: further opens see the same stamp
    f.read(&bob, "f").unwrap();
    assert_eq!(f.version(&bob, "f"), Some(2));
    assert_eq!(f.events_on("external_change", "f").len(), 1);
    // a replaced inode (the editor way, behind our back) is a change as well, counted
    // once (no kernel here keeps the old inode in sight)
    f.write_file("f.tmp", "replaced\n");
    std::fs::rename(f.backing.join("f.tmp"), f.backing.join("f")).unwrap();
    assert_eq!(f.cat(&bob, "f").as_deref(), Ok("replaced\n"));
    assert_eq!(f.version(&bob, "f"), Some(3), "replaced inode not counted");
    // the external change also ends a live handoff's fence (the version moved)
    f.read(&alice, "f").unwrap();
    f.ctl(&alice, "transfer --to bob f").unwrap();
    let before = f.events_written("denied", "alice").len();
    assert_eq!(
        f.write(&alice, "f", APPEND, Some(b"x\n")),
        Err(libc::EACCES)
    );
    let d = f.events_written("denied", "alice");
    match d.get(before..) {
        Some([d]) if d["reason"] == "fenced" && d["path"] == "f" => {}
        other => panic!("denied events {other:?}, want one: fenced on f"),
    }
    f.write_file("f", "again\n");
    f.read(&bob, "f").unwrap();
    assert_eq!(f.version(&bob, "f"), Some(4));
    assert_eq!(f.write(&alice, "f", APPEND, Some(b"x\n")), Ok(()));
}

#[test]
fn directory_renames_keep_versions() {
    let f = InProc::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    let v = |p: &str| f.version(&alice, p);
    f.mkdir(&alice, "d").unwrap();
    f.mkdir(&alice, "d/sub").unwrap();
    for (p, flags, data) in [
        ("d/a", CREATE, "1\n"),
        ("d/a", APPEND, "2\n"),
        ("d/b", CREATE, "x\n"),
        ("d/sub/c", CREATE, "c\n"),
        ("d/sub/c", APPEND, "c2\n"),
        ("d/sub/c", APPEND, "c3\n"),
    ] {
        f.write(&alice, p, flags, Some(data.as_bytes())).unwrap();
    }
    assert_eq!(
        (v("d/a"), v("d/b"), v("d/sub/c")),
        (Some(2), Some(1), Some(3))
    );
    f.rename(&alice, "d", "e", 0).unwrap();
    assert_eq!(
        (v("e/a"), v("e/b"), v("e/sub/c")),
        (Some(2), Some(1), Some(3))
    );
    f.rename(&alice, "e/sub", "top", 0).unwrap();
    assert_eq!(v("top/c"), Some(3));
    f.write(&alice, "e/a", APPEND, Some(b"more\n")).unwrap();
    f.write(&alice, "top/c", APPEND, Some(b"more\n")).unwrap();
    assert_eq!((v("e/a"), v("top/c")), (Some(3), Some(4)));
    // a handoff follows a path: a live record under a renamed directory keeps its fence
    f.ctl(&bob, "register").unwrap();
    f.ctl(&alice, "transfer --to bob e/b").unwrap();
    assert_eq!(
        f.write(&alice, "e/b", APPEND, Some(b"no\n")),
        Err(libc::EACCES)
    );
    let d = f.events_written("denied", "alice");
    assert_eq!(
        d.iter()
            .map(|d| (d["reason"].as_str(), d["path"].as_str()))
            .collect::<Vec<_>>(),
        [(Some("fenced"), Some("e/b"))],
        "{d:?}"
    );
}

#[test]
fn a_removed_path_continues_its_numbering() {
    let f = InProc::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.write(&alice, "f", CREATE, Some(b"1\n")).unwrap();
    f.write(&alice, "f", APPEND, Some(b"2\n")).unwrap();
    assert_eq!(f.version(&alice, "f"), Some(2));
    f.unlink(&alice, "f").unwrap();
    assert_eq!(f.committed_version("f"), Some(3));
    let rm: Vec<_> = f
        .events_of("commit", "alice")
        .into_iter()
        .filter(|e| e["path"] == "f")
        .collect();
    assert_eq!(rm.last().unwrap()["removed"], true, "{rm:?}");
    f.write(&bob, "f", CREATE, Some(b"new\n")).unwrap();
    assert_eq!(f.version(&bob, "f"), Some(4));
    f.rename(&bob, "f", "g", 0).unwrap();
    assert_eq!(f.committed_version("f"), Some(5));
    assert_eq!(f.version(&bob, "g"), Some(1));
    f.rename(&bob, "g", "f", 0).unwrap();
    assert_eq!(f.version(&bob, "f"), Some(6));
}

#[test]
fn commits_are_logged_with_their_session() {
    let f = InProc::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.write(&alice, "f", CREATE, Some(b"a\n")).unwrap();
    f.write(&bob, "f", APPEND, Some(b"b\n")).unwrap();
    let c = f.events_on("commit", "f");
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

/// Has thread `tid` of this process gone to sleep (a wait, not running or runnable)?
fn asleep(tid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    // The state follows the command name in parentheses.
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    state.is_some_and(|s| s.starts_with('S'))
}

/// A transfer refused in flight while the giver's write handle is closing waits for the
/// release and is tried again (docs/handoff.md#in-flight); the second try looks at the
/// file again: the giver's commits made while it waited (v3, and v4 counted at the
/// release, which finds the file changed since its flush) are the version handed on, and
/// none is taken for a change behind the volume's back (a try reading the first look
/// counts two, v6, and refuses alice `handoff_not_held`).
#[test]
fn a_transfer_tried_again_looks_at_the_file_again() {
    let f = InProc::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.ctl(&bob, r#"{"verb":"register"}"#).unwrap();
    f.write(&alice, "f.md", CREATE, Some(b"a\n")).unwrap();
    let ino = f.ino(&alice, "f.md").unwrap();
    let c = alice.caller();
    // alice's handle is flushed (v2) and about to be released: a transfer waits for it.
    let fh = f.fs.open(&c, ino, W | libc::O_APPEND).unwrap().fh;
    f.fs.write(&c, ino, fh, 2, b"b\n").unwrap();
    f.fs.flush(&c, ino, fh).unwrap();
    assert_eq!(f.version(&alice, "f.md"), Some(2));
    let req = r#"{"verb":"transfer","paths":["f.md"],"to":"bob"}"#;
    let (r, reply) = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let (f, alice) = (&f, &alice);
        let t = s.spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            f.ctl_reply(alice, req)
        });
        let tid = rx.recv().unwrap();
        // The first try looked at the file (v2) and waits for the release.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !asleep(tid) {
            assert!(
                std::time::Instant::now() < deadline,
                "the transfer never waited"
            );
            std::thread::yield_now();
        }
        // Meanwhile alice commits through another handle, then the first one goes.
        f.write(alice, "f.md", APPEND, Some(b"c\n")).unwrap();
        f.fs.release(&c, ino, fh);
        t.join().unwrap()
    });
    assert_eq!(r, Ok(()), "{reply}");
    let rec = &reply["records"][0];
    assert_eq!(rec["version_at_transfer"], 4, "{reply}");
    assert_eq!(f.version(&alice, "f.md"), Some(4));
    assert!(f.events_on("external_change", "f.md").is_empty());
    assert_eq!(f.content("f.md").as_deref(), Some("a\nb\nc\n"));
}
