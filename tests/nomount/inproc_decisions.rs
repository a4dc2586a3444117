//! The decision tables of the handoff (docs/design.md#write-routes, docs/design.md#handoff,
//! docs/design.md#holds) through the filesystem type with the real volume policy and no
//! mount (tests/common/inproc.rs): who may write a handed file, through which route, with
//! which errno, `denied` reason and route, and what it does to the version and the record;
//! the stale-write guard in each `--stale` mode; and every refusal code of a verb with the
//! errno of its `ctl` write.
//!
//! The mounted tests keep what only the kernel shows: the same routes made by real tools
//! (tests/mounted/enforce_routes.rs: a shell's redirection, `sed -i`, `cp`, `ln -f`, python's
//! `open`), and the stale guard seen by a shell (tests/mounted/enforce_stale.rs).

use crate::coherent;
use crate::common;

use std::ffi::OsStr;

use ::coherent::coherence::StaleMode;
use ::coherent::store::SetAttr;
use coherent::check_deny_text;
use common::inproc::{errno, Agent, InProc, Setup};

use common::routes::{check_after, check_record, report, set_backing_xattr, After};
use After::*;

/// The setting of one row: a handed file `t` (content `orig\n`, xattr `user.keep`), a
/// helper file `o` (content `other\n`) that nobody handed on, and the caller.
struct Try<'a> {
    f: &'a InProc,
    a: &'a Agent,
    t: &'a str,
    o: &'a str,
}

impl Try<'_> {
    fn ino(&self, p: &str) -> u64 {
        self.f.ino(self.a, p).unwrap()
    }
    fn link(&self, from: &str, to: &str) -> Result<(), i32> {
        let (dir, name) = self.f.at(self.a, to);
        errno(self.f.fs.link(&self.a.caller(), self.ino(from), dir, name)).map(drop)
    }
    fn unlink(&self, p: &str) -> Result<(), i32> {
        self.f.unlink(self.a, p)
    }
    fn symlink(&self, p: &str, target: &str) -> Result<(), i32> {
        self.f.symlink(self.a, p, target)
    }
    fn setattr(&self, set: SetAttr) -> Result<(), i32> {
        self.f.setattr(self.a, self.t, &set)
    }
}

struct Row {
    name: &'static str,
    /// The route, as the kernel would send it for the tool named in `name`.
    run: fn(&Try) -> Result<(), i32>,
    /// When the giver tries it: the route its `denied` event names.
    route: &'static str,
    /// When allowed: the target afterwards.
    after: After,
    /// When allowed: how many commits the route makes on the target.
    commits: u64,
    /// When allowed: the route opens the target for writing (an acquire).
    acquires: bool,
}

const W: i32 = libc::O_WRONLY;

const ROWS: &[Row] = &[
    Row {
        name: "open_trunc_write",
        run: |t| t.f.write(t.a, t.t, W | libc::O_TRUNC, Some(b"new\n")),
        route: "open_write",
        after: Bytes("new\n"),
        commits: 1,
        acquires: true,
    },
    Row {
        name: "append",
        run: |t| t.f.write(t.a, t.t, W | libc::O_APPEND, Some(b"new\n")),
        route: "open_write",
        after: Bytes("orig\nnew\n"),
        commits: 1,
        acquires: true,
    },
    Row {
        name: "create_over",
        run: |t| {
            let (dir, name) = t.f.at(t.a, t.t);
            let flags = W | libc::O_CREAT | libc::O_TRUNC;
            let made = errno(t.f.fs.create(&t.a.caller(), dir, name, 0o644, 0, flags))?;
            let ino = made.entry.attr.unwrap().ino;
            t.f.fs.flush(&t.a.caller(), ino, made.opened.fh).unwrap();
            t.f.fs.release(&t.a.caller(), ino, made.opened.fh);
            Ok(())
        },
        route: "open_write",
        after: Bytes(""),
        commits: 1,
        acquires: true,
    },
    Row {
        name: "open_trunc_no_write",
        run: |t| t.f.write(t.a, t.t, W | libc::O_TRUNC, None),
        route: "open_write",
        after: Bytes(""),
        commits: 1,
        acquires: true,
    },
    Row {
        name: "rdwr_no_write",
        run: |t| t.f.write(t.a, t.t, libc::O_RDWR, None),
        route: "open_write",
        after: Bytes("orig\n"),
        commits: 0,
        acquires: true,
    },
    Row {
        name: "truncate_by_path",
        run: |t| {
            t.setattr(SetAttr {
                size: Some(0),
                ..Default::default()
            })
        },
        route: "setattr",
        after: Bytes(""),
        commits: 1,
        acquires: false,
    },
    Row {
        name: "chmod",
        run: |t| {
            t.setattr(SetAttr {
                mode: Some(0o600),
                ..Default::default()
            })
        },
        route: "setattr",
        after: Bytes("orig\n"),
        commits: 0,
        acquires: false,
    },
    Row {
        name: "chown_same_owner",
        run: |t| {
            t.setattr(SetAttr {
                uid: Some(0),
                gid: Some(0),
                ..Default::default()
            })
        },
        route: "setattr",
        after: Bytes("orig\n"),
        commits: 0,
        acquires: false,
    },
    Row {
        name: "rename_away",
        run: |t| t.f.rename(t.a, t.t, &format!("{}.away", t.t), 0),
        route: "rename_source",
        after: Gone,
        commits: 1,
        acquires: false,
    },
    Row {
        name: "rename_onto",
        run: |t| t.f.rename(t.a, t.o, t.t, 0),
        route: "rename_target",
        after: Bytes("other\n"),
        commits: 1,
        acquires: false,
    },
    Row {
        name: "rename_exchange",
        run: |t| t.f.rename(t.a, t.o, t.t, libc::RENAME_EXCHANGE),
        route: "rename_target",
        after: Bytes("other\n"),
        commits: 1,
        acquires: false,
    },
    Row {
        name: "editor_atomic_save",
        run: |t| {
            let swp = format!(".{}.swp", t.t);
            t.f.write(t.a, &swp, W | libc::O_CREAT, Some(b"new\n"))?;
            t.f.rename(t.a, &swp, t.t, 0)
        },
        route: "rename_target",
        after: Bytes("new\n"),
        commits: 1,
        acquires: false,
    },
    Row {
        name: "unlink",
        run: |t| t.unlink(t.t),
        route: "unlink",
        after: Gone,
        commits: 1,
        acquires: false,
    },
    Row {
        name: "link_away",
        // A new name for the handed inode is a write of it too.
        run: |t| t.link(t.t, &format!("{}.lnk", t.t)),
        route: "link",
        after: Bytes("orig\n"),
        commits: 0,
        acquires: false,
    },
    Row {
        name: "ln_hard_onto",
        // `ln -f o t` as coreutils does it: a new name of the helper, renamed over t.
        run: |t| {
            let tmp = format!("{}.lntmp", t.t);
            t.link(t.o, &tmp)?;
            t.f.rename(t.a, &tmp, t.t, 0)
        },
        route: "rename_target",
        after: Bytes("other\n"),
        commits: 1,
        acquires: false,
    },
    Row {
        name: "ln_symlink_onto",
        // `ln -sf o t`: a symlink made aside, renamed over t.
        run: |t| {
            let tmp = format!("{}.lntmp", t.t);
            t.symlink(&tmp, t.o)?;
            t.f.rename(t.a, &tmp, t.t, 0)
        },
        route: "rename_target",
        after: Symlink,
        commits: 1,
        acquires: false,
    },
    Row {
        name: "setxattr",
        run: |t| {
            let ino = t.ino(t.t);
            let name = OsStr::new("user.test");
            errno(t.f.fs.setxattr(&t.a.caller(), ino, name, b"1", 0))
        },
        route: "setxattr",
        after: Bytes("orig\n"),
        commits: 0,
        acquires: false,
    },
    Row {
        name: "removexattr",
        run: |t| {
            let ino = t.ino(t.t);
            errno(
                t.f.fs
                    .removexattr(&t.a.caller(), ino, OsStr::new("user.keep")),
            )
        },
        route: "removexattr",
        after: Bytes("orig\n"),
        commits: 0,
        acquires: false,
    },
];

fn target(i: usize) -> String {
    format!("t{i}.md")
}
fn helper(i: usize) -> String {
    format!("o{i}.txt")
}

/// The agents of a table: alice hands every `tN.md` (read at v1) to bob; carol is a
/// bystander.
struct Cast {
    alice: Agent,
    bob: Agent,
    carol: Agent,
}

fn handed_off() -> (InProc, Cast) {
    handed_off_with(StaleMode::default())
}

fn handed_off_with(stale: StaleMode) -> (InProc, Cast) {
    let f = InProc::with(Setup {
        stale,
        ..Setup::default()
    });
    let cast = Cast {
        alice: Agent::new("alice"),
        bob: Agent::new("bob"),
        carol: Agent::new("carol"),
    };
    for i in 0..ROWS.len() {
        f.write_file(&target(i), "orig\n");
        f.write_file(&helper(i), "other\n");
        set_backing_xattr(&f.backing.join(target(i)), "user.keep", "1");
    }
    // bob and carol are known (they touched the volume); alice has read every target.
    f.read(&cast.bob, &helper(0)).unwrap();
    f.read(&cast.carol, &helper(0)).unwrap();
    let paths: Vec<String> = (0..ROWS.len()).map(target).collect();
    for p in &paths {
        f.read(&cast.alice, p).unwrap();
    }
    let req = format!("transfer --to bob {}", paths.join(" "));
    assert_eq!(f.ctl(&cast.alice, &req), Ok(()));
    for p in &paths {
        let r = f
            .record(&cast.alice, p)
            .unwrap_or_else(|| panic!("no record of {p}"));
        assert_eq!(
            (&r["giver"], &r["successor"], &r["status"], &r["live"]),
            (
                &"alice".into(),
                &"bob".into(),
                &"pending".into(),
                &true.into()
            ),
            "{r}"
        );
        assert_eq!(f.version(&cast.alice, p), Some(1), "{p}");
    }
    (f, cast)
}

/// The giver is refused on every route with `EACCES`, before the backing file changes;
/// each refusal is one `denied` event with reason `fenced` and the route, and `why` is
/// the deny text. The record stays live and `pending`.
#[test]
fn the_giver_is_fenced_on_every_route() {
    let (f, cast) = handed_off();
    let alice = &cast.alice;
    let mut failures = Vec::new();
    for (i, r) in ROWS.iter().enumerate() {
        let (t, o) = (target(i), helper(i));
        let before = f.events_written("denied", "alice").len();
        let got = (r.run)(&Try {
            f: &f,
            a: alice,
            t: &t,
            o: &o,
        });
        let mut bad = Vec::new();
        if got != Err(libc::EACCES) {
            bad.push(format!("{got:?}, want EACCES"));
        }
        if f.content(&t).as_deref() != Some("orig\n") {
            bad.push(format!("bytes now {:?}", f.content(&t)));
        }
        if f.version(alice, &t) != Some(1) {
            bad.push(format!("version {:?}", f.version(alice, &t)));
        }
        if let Some(e) = check_deny_text(&f.why(alice), &t, "bob", 1) {
            bad.push(e);
        }
        // Written out when the call returns: no flush, no wait.
        let denied = f.events_written("denied", "alice");
        match denied.get(before..) {
            Some([d]) if d["reason"] == "fenced" && d["route"] == r.route && d["path"] == t => {}
            other => bad.push(format!(
                "denied events {other:?}, want one: fenced, {}, {t}",
                r.route
            )),
        }
        let rec = f.record(alice, &t);
        match &rec {
            Some(rec) if rec["live"] == true && rec["status"] == "pending" => {}
            other => bad.push(format!("record {other:?}, want live and pending")),
        }
        if !bad.is_empty() {
            failures.push(format!("  {}: {}", r.name, bad.join("; ")));
        }
    }
    report("giver", ROWS.len(), failures);
}

/// The successor or a bystander may take every route: the effect of the row, its
/// commits, and the record moves as docs/design.md#handoff says (the successor's commit
/// completes and ends it, its acquire completes it; a bystander's overtakes it with
/// itself as the counterparty).
fn others_may_write(who: &str) {
    let (f, cast) = handed_off();
    let a = if who == "bob" { &cast.bob } else { &cast.carol };
    let mut failures = Vec::new();
    for (i, r) in ROWS.iter().enumerate() {
        let (t, o) = (target(i), helper(i));
        let got = (r.run)(&Try {
            f: &f,
            a,
            t: &t,
            o: &o,
        });
        let mut bad = Vec::new();
        if got.is_err() {
            bad.push(format!("refused: {got:?}"));
        }
        bad.extend(check_after(r.after, &f.backing.join(&t), &o));
        let want_v = 1 + r.commits;
        let got_v = match r.after {
            Bytes(_) => f.version(a, &t),
            // No name left to read an xattr of: the last commit in the log.
            _ => f.committed_version(&t),
        };
        if got_v != Some(want_v) {
            bad.push(format!("version {got_v:?}, want {want_v}"));
        }
        bad.extend(check_record(
            f.record(a, &t).as_ref(),
            who,
            r.commits,
            r.acquires,
        ));
        if !bad.is_empty() {
            failures.push(format!("  {}: {}", r.name, bad.join("; ")));
        }
    }
    report(who, ROWS.len(), failures);
}

#[test]
fn the_successor_may_write_on_every_route() {
    others_may_write("bob");
}

#[test]
fn a_bystander_may_write_on_every_route() {
    others_may_write("carol");
}

/// alice read f at v1, then bob committed v2: alice's view is outdated.
fn outdated(stale: StaleMode) -> (InProc, Agent, Agent) {
    let f = InProc::with(Setup {
        stale,
        ..Setup::default()
    });
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.write_file("f", "v1\n");
    f.read(&alice, "f").unwrap();
    f.write(&bob, "f", W | libc::O_APPEND, Some(b"bob\n"))
        .unwrap();
    assert_eq!(f.version(&bob, "f"), Some(2));
    (f, alice, bob)
}

const APPEND: i32 = W | libc::O_APPEND;

/// `--stale strict`: a write from an outdated view is refused (`EACCES`, `denied` with
/// reason `stale_view`, `why` names both versions) until the session reads again; a
/// blind write is never stale.
#[test]
fn strict_refuses_a_stale_write_until_the_session_reads_again() {
    let (f, alice, bob) = outdated(StaleMode::Strict);
    assert_eq!(
        f.write(&alice, "f", APPEND, Some(b"a\n")),
        Err(libc::EACCES)
    );
    assert_eq!(f.content("f").as_deref(), Some("v1\nbob\n"));
    assert_eq!(f.version(&alice, "f"), Some(2));
    let d = f.events_written("denied", "alice");
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (&d[0]["reason"], &d[0]["path"]),
        (&"stale_view".into(), &"f".into())
    );
    let w = f.why(&alice);
    assert!(
        w.contains("v2") && w.contains("v1") && w.contains('f'),
        "{w:?}"
    );
    // carol never read f: a blind write.
    let carol = Agent::new("carol");
    assert_eq!(f.write(&carol, "f", APPEND, Some(b"c\n")), Ok(()));
    assert_eq!(f.version(&carol, "f"), Some(3));
    // bob's view is his own commit (v2): stale now too.
    assert_eq!(f.write(&bob, "f", APPEND, Some(b"b\n")), Err(libc::EACCES));
    // Reading again clears it.
    f.read(&alice, "f").unwrap();
    assert_eq!(f.write(&alice, "f", APPEND, Some(b"a\n")), Ok(()));
    assert_eq!(f.version(&alice, "f"), Some(4));
    assert!(f.events_of("stale_write", "alice").is_empty());
}

/// A stale append: `--stale warn` and `guard` (the default) allow it and log
/// `stale_write` with the view and the version; `off` does neither. None refuses.
#[test]
fn warn_logs_a_stale_write_and_off_says_nothing() {
    for (mode, logged) in [
        (StaleMode::default(), 1),
        (StaleMode::Guard, 1),
        (StaleMode::Warn, 1),
        (StaleMode::Off, 0),
    ] {
        let (f, alice, _bob) = outdated(mode);
        assert_eq!(
            f.write(&alice, "f", APPEND, Some(b"a\n")),
            Ok(()),
            "{mode:?}"
        );
        assert_eq!(f.version(&alice, "f"), Some(3), "{mode:?}");
        let ev = f.events_of("stale_write", "alice");
        assert_eq!(ev.len(), logged, "{mode:?}: {ev:?}");
        if let Some(e) = ev.first() {
            assert_eq!((&e["view"], &e["version"]), (&1.into(), &2.into()), "{e}");
        }
        assert!(f.events_of("denied", "alice").is_empty(), "{mode:?}");
        // A current view is not stale.
        assert_eq!(f.write(&alice, "f", APPEND, Some(b"b\n")), Ok(()));
        assert_eq!(
            f.events_of("stale_write", "alice").len(),
            logged,
            "{mode:?}"
        );
    }
}

/// One stale write of the guard's table: alice (view v1, `f` at v2 by bob) tries it.
struct StaleRow {
    name: &'static str,
    run: fn(&InProc, &Agent) -> Result<(), i32>,
    /// It can overwrite (refused under `guard`); else it only appends or keeps the bytes.
    overwrites: bool,
    /// It writes the bytes at all (a stale one is counted under `warn`); a chmod does not.
    writes: bool,
    route: &'static str,
}

const STALE_ROWS: &[StaleRow] = &[
    StaleRow {
        name: "open_trunc",
        run: |f, a| f.write(a, "f", W | libc::O_TRUNC, Some(b"a\n")),
        overwrites: true,
        writes: true,
        route: "open_write",
    },
    StaleRow {
        name: "open_wronly",
        run: |f, a| f.write(a, "f", W, Some(b"a\n")),
        overwrites: true,
        writes: true,
        route: "open_write",
    },
    StaleRow {
        name: "open_rdwr",
        run: |f, a| f.write(a, "f", libc::O_RDWR, Some(b"a\n")),
        overwrites: true,
        writes: true,
        route: "open_write",
    },
    StaleRow {
        name: "append_trunc",
        run: |f, a| f.write(a, "f", APPEND | libc::O_TRUNC, Some(b"a\n")),
        overwrites: true,
        writes: true,
        route: "open_write",
    },
    StaleRow {
        name: "truncate",
        run: |f, a| {
            let set = SetAttr {
                size: Some(1),
                ..Default::default()
            };
            f.setattr(a, "f", &set)
        },
        overwrites: true,
        writes: true,
        route: "setattr",
    },
    StaleRow {
        name: "atomic_save",
        run: |f, a| {
            f.write(a, "f.tmp", W | libc::O_CREAT, Some(b"a\n"))?;
            f.rename(a, "f.tmp", "f", 0)
        },
        overwrites: true,
        writes: true,
        route: "rename_target",
    },
    StaleRow {
        name: "append",
        run: |f, a| f.write(a, "f", APPEND, Some(b"a\n")),
        overwrites: false,
        writes: true,
        route: "open_write",
    },
    StaleRow {
        name: "append_rdwr",
        run: |f, a| f.write(a, "f", libc::O_RDWR | libc::O_APPEND, Some(b"a\n")),
        overwrites: false,
        writes: true,
        route: "open_write",
    },
    StaleRow {
        name: "chmod",
        run: |f, a| {
            let set = SetAttr {
                mode: Some(0o600),
                ..Default::default()
            };
            f.setattr(a, "f", &set)
        },
        overwrites: false,
        writes: false,
        route: "setattr",
    },
];

/// The stale guard of each `--stale` on each kind of write
/// (docs/versions-and-holds.md#the-stale-write-guard): refused (`EACCES`, one `denied` `stale_view` with the route, the view, the version and
/// who wrote since; bob's bytes intact) or allowed with or without `stale_write`.
#[test]
fn each_stale_mode_decides_each_kind_of_write() {
    let mut failures = Vec::new();
    for mode in [
        StaleMode::Guard,
        StaleMode::Strict,
        StaleMode::Warn,
        StaleMode::Off,
    ] {
        for r in STALE_ROWS {
            let (f, alice, _bob) = outdated(mode);
            let refused = match mode {
                StaleMode::Guard => r.overwrites,
                StaleMode::Strict => r.writes,
                _ => false,
            };
            let counted = r.writes && !refused && mode != StaleMode::Off;
            let got = (r.run)(&f, &alice);
            let mut bad = Vec::new();
            let denied = f.events_written("denied", "alice");
            if refused {
                if got != Err(libc::EACCES) {
                    bad.push(format!("{got:?}, want EACCES"));
                }
                if f.content("f").as_deref() != Some("v1\nbob\n") {
                    bad.push(format!("bytes {:?}", f.content("f")));
                }
                match denied.as_slice() {
                    [d] if d["reason"] == "stale_view"
                        && d["route"] == r.route
                        && d["view"] == 1
                        && d["version"] == 2
                        && d["counterparty"] == "bob" => {}
                    other => bad.push(format!("denied {other:?}")),
                }
            } else {
                if got.is_err() {
                    bad.push(format!("refused: {got:?}"));
                }
                if !denied.is_empty() {
                    bad.push(format!("denied {denied:?}"));
                }
            }
            let sw = f.events_of("stale_write", "alice");
            if sw.len() != counted as usize {
                bad.push(format!("stale_write {sw:?}, want {}", counted as usize));
            }
            if !bad.is_empty() {
                failures.push(format!("  {mode:?} {}: {}", r.name, bad.join("; ")));
            }
        }
    }
    assert!(failures.is_empty(), "wrong:\n{}", failures.join("\n"));
}

/// A blind write (carol never read `f`) is never stale, an overwrite included.
#[test]
fn a_blind_overwrite_is_never_stale() {
    for mode in [StaleMode::Guard, StaleMode::Strict] {
        let (f, _alice, _bob) = outdated(mode);
        let carol = Agent::new("carol");
        assert_eq!(
            f.write(&carol, "f", W | libc::O_TRUNC, Some(b"c\n")),
            Ok(())
        );
        assert_eq!(f.content("f").as_deref(), Some("c\n"));
        assert!(f.events_of("stale_write", "carol").is_empty());
    }
}

/// A race inside one handle's life: alice (view v1) opens `f` for writing, bob commits v2
/// while her handle is open. Her truncate is still refusable (refused); her handle's
/// commit is not, and is counted: `stale_write` with `op` `write`, the version her handle
/// built on, the version it wrote over and who made it.
#[test]
fn a_commit_over_a_version_made_while_the_handle_was_open_is_counted() {
    for mode in [StaleMode::Guard, StaleMode::Warn, StaleMode::Strict] {
        let f = InProc::with(Setup {
            stale: mode,
            ..Setup::default()
        });
        let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
        f.write_file("f", "v1\n");
        f.read(&alice, "f").unwrap();
        let ino = f.ino(&alice, "f").unwrap();
        let o = f.fs.open(&alice.caller(), ino, APPEND).unwrap();
        f.write(&bob, "f", APPEND, Some(b"bob\n")).unwrap();
        assert_eq!(f.version(&bob, "f"), Some(2));
        let set = SetAttr {
            size: Some(0),
            ..Default::default()
        };
        // Still refusable: a truncate (allowed and counted under `warn`).
        let want = match mode {
            StaleMode::Warn => Ok(()),
            _ => Err(libc::EACCES),
        };
        assert_eq!(f.setattr(&alice, "f", &set), want, "{mode:?}");
        f.fs.write(&alice.caller(), ino, o.fh, 7, b"alice\n")
            .unwrap();
        f.fs.flush(&alice.caller(), ino, o.fh).unwrap();
        f.fs.release(&alice.caller(), ino, o.fh);
        assert_eq!(f.version(&alice, "f"), Some(3));
        let sw: Vec<_> = f
            .events_of("stale_write", "alice")
            .into_iter()
            .filter(|e| e["op"] == "write")
            .collect();
        assert_eq!(sw.len(), 1, "{mode:?}: {sw:?}");
        assert_eq!(
            (&sw[0]["view"], &sw[0]["version"], &sw[0]["counterparty"]),
            (&1.into(), &2.into(), &"bob".into()),
            "{mode:?}"
        );
    }
}

/// The late giver on every route (issue 42): alice hands every `tN.md` to bob, bob writes
/// each (the records complete and end, the fence lifts), and alice, who has not read bob's
/// version, tries every route: refused under every `--stale` but `off` (`EACCES`, one
/// `denied` `stale_view` with the route, the record's successor and both versions; bob's
/// bytes intact; `why` names bob and the versions). Under `off` every route goes on.
#[test]
fn a_late_giver_is_refused_on_every_route() {
    for mode in [
        StaleMode::Guard,
        StaleMode::Warn,
        StaleMode::Strict,
        StaleMode::Off,
    ] {
        let (f, cast) = handed_off_with(mode);
        for i in 0..ROWS.len() {
            let t = target(i);
            f.write(&cast.bob, &t, APPEND, Some(b"bob\n")).unwrap();
            let rec = f.record(&cast.bob, &t).unwrap();
            assert_eq!(
                (&rec["status"], &rec["live"]),
                (&"completed".into(), &false.into())
            );
        }
        let alice = &cast.alice;
        let mut failures = Vec::new();
        for (i, r) in ROWS.iter().enumerate() {
            let (t, o) = (target(i), helper(i));
            let before = f.events_written("denied", "alice").len();
            let got = (r.run)(&Try {
                f: &f,
                a: alice,
                t: &t,
                o: &o,
            });
            let mut bad = Vec::new();
            if mode == StaleMode::Off {
                if got.is_err() {
                    bad.push(format!("refused under off: {got:?}"));
                }
            } else {
                if got != Err(libc::EACCES) {
                    bad.push(format!("{got:?}, want EACCES"));
                }
                if f.content(&t).as_deref() != Some("orig\nbob\n") {
                    bad.push(format!("bytes now {:?}", f.content(&t)));
                }
                let w = f.why(alice);
                if !(w.contains(&format!("you handed {t} to agent"))
                    && w.contains("(bob) at v1")
                    && w.contains("it is at v2 now")
                    && w.contains(&format!("Read {t} again")))
                {
                    bad.push(format!("why {w:?}"));
                }
                let denied = f.events_written("denied", "alice");
                match denied.get(before..) {
                    Some([d])
                        if d["reason"] == "stale_view"
                            && d["route"] == r.route
                            && d["path"] == t
                            && d["successor"] == "bob"
                            && d["view"] == 1
                            && d["version"] == 2 => {}
                    other => bad.push(format!("denied events {other:?}")),
                }
            }
            if !bad.is_empty() {
                failures.push(format!("  {mode:?} {}: {}", r.name, bad.join("; ")));
            }
        }
        report("late giver", ROWS.len(), failures);
    }
}

/// A verb written to `.coherent/ctl` by `a` (None: an unattributed process) that must be
/// refused: the write fails with `errno` and the reply read back names `reason`.
fn refused(f: &InProc, a: &Agent, req: &serde_json::Value, reason: &str, errno: i32) {
    let (r, reply) = f.ctl_reply(a, &req.to_string());
    assert_eq!(
        (r, reply["reason"].as_str()),
        (Err(errno), Some(reason)),
        "{req}: {reply}"
    );
}

fn verb_ok(f: &InProc, a: &Agent, req: &serde_json::Value) {
    let (r, reply) = f.ctl_reply(a, &req.to_string());
    assert_eq!(r, Ok(()), "{req}: {reply}");
}

fn transfer_req(path: &str, to: &str) -> serde_json::Value {
    serde_json::json!({"verb": "transfer", "paths": [path], "to": to})
}

fn path_req(verb: &str, path: &str) -> serde_json::Value {
    serde_json::json!({"verb": verb, "paths": [path]})
}

/// Every refusal code of docs/handoff.md with the errno of its `ctl` write (the JSON
/// requests of tests/mounted/enforce_handoff.rs `every_refusal`, in process); none of them
/// changes a record or a version.
#[test]
fn every_refusal_has_its_reason_and_errno() {
    let f = InProc::new();
    let (alice, bob, carol) = (Agent::new("alice"), Agent::new("bob"), Agent::new("carol"));
    f.write_file("other.md", "o\n");
    f.read(&bob, "other.md").unwrap();
    f.read(&carol, "other.md").unwrap();
    f.write(&alice, "plan.md", W | libc::O_CREAT, Some(b"plan\n"))
        .unwrap();
    assert_eq!(f.version(&alice, "plan.md"), Some(1));

    let t = transfer_req;
    refused(
        &f,
        &alice,
        &t("plan.md", "alice"),
        "handoff_to_self",
        libc::EACCES,
    );
    refused(
        &f,
        &alice,
        &t("plan.md", "nobody"),
        "handoff_successor_unknown",
        libc::ESRCH,
    );
    let bad = t("plan.md", "bad\u{1}name");
    refused(
        &f,
        &alice,
        &bad,
        "handoff_successor_malformed",
        libc::EINVAL,
    );
    refused(
        &f,
        &alice,
        &t("missing.md", "bob"),
        "no_such_path",
        libc::ENOENT,
    );
    let nobody = Agent::unattributed();
    refused(
        &f,
        &nobody,
        &t("plan.md", "bob"),
        "unattributed",
        libc::EACCES,
    );
    let mut big = t("plan.md", "bob");
    big["note"] = "x".repeat(70 * 1024).into();
    refused(&f, &alice, &big, "bad_request", libc::EINVAL);
    assert!(f.record(&alice, "plan.md").is_none());
    assert_eq!(f.version(&alice, "plan.md"), Some(1));

    // Not held: alice made old.md v1, bob committed v2 since.
    f.write(&alice, "old.md", W | libc::O_CREAT, Some(b"old\n"))
        .unwrap();
    f.write(&bob, "old.md", W | libc::O_APPEND, Some(b"bob\n"))
        .unwrap();
    refused(
        &f,
        &alice,
        &t("old.md", "carol"),
        "handoff_not_held",
        libc::EACCES,
    );

    // In flight: alice holds busy.md open for writing (no FLUSH yet).
    f.write(&alice, "busy.md", W | libc::O_CREAT, Some(b"busy\n"))
        .unwrap();
    let busy = f.ino(&alice, "busy.md").unwrap();
    let held = f.fs.open(&alice.caller(), busy, W).unwrap();
    refused(
        &f,
        &alice,
        &t("busy.md", "bob"),
        "handoff_in_flight",
        libc::EBUSY,
    );
    f.fs.release(&alice.caller(), busy, held.fh);

    // A live record alice -> bob on plan.md.
    verb_ok(&f, &alice, &t("plan.md", "bob"));
    f.read(&carol, "plan.md").unwrap();
    refused(
        &f,
        &carol,
        &t("plan.md", "bob"),
        "handoff_other_holder",
        libc::EACCES,
    );
    for verb in ["accept", "decline"] {
        let req = path_req(verb, "plan.md");
        refused(&f, &carol, &req, "handoff_not_successor", libc::EACCES);
    }
    let withdraw = path_req("withdraw", "plan.md");
    refused(&f, &bob, &withdraw, "handoff_not_giver", libc::EACCES);

    // Ended by a decline: no longer live, and the same transfer is handoff_ended.
    verb_ok(&f, &bob, &path_req("decline", "plan.md"));
    let accept = path_req("accept", "plan.md");
    refused(&f, &bob, &accept, "handoff_not_live", libc::EACCES);
    refused(&f, &alice, &withdraw, "handoff_not_live", libc::EACCES);
    f.read(&alice, "plan.md").unwrap();
    refused(
        &f,
        &alice,
        &t("plan.md", "bob"),
        "handoff_ended",
        libc::EACCES,
    );

    // No refusal above logged a transfer.
    let transfers = f.events_of("transfer", "alice");
    assert_eq!(transfers.len(), 1, "{transfers:?}");
}
