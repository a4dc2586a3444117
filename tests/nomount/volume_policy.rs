//! The volume's policy driven through its `Policy`, without a FUSE mount: the routes a
//! fenced giver is refused on (errno and `denied` event with its route), release vs
//! reclaim, and the in-flight rule of a transfer. Callers are real child processes
//! (`sleep` with `COHERENT_SESSION`), so the sessions resolve from the real /proc
//! (tests/common/inproc.rs).

use crate::common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use coherent::fs::{HandleInfo, HandleState, OpenInfo, WriteRoute};
use coherent::request_timeout::Started;
use coherent::store::{Caller, FsError, SetAttr, Stamp, XattrReply, ROOT_INO};
use common::inproc::{Agent, InProc as Fixture};

/// The policy's hooks called directly, as `Fs` would around an open (inode 1: the policy
/// goes by path).
trait Hooks {
    fn open_write(&self, a: &Agent, p: &str) -> HandleState;
    fn handle<'a>(&self, p: &'a str, state: &'a HandleState, before: Stamp) -> HandleInfo<'a>;
}

impl Hooks for Fixture {
    /// An open for write by `a` that succeeds: the state of its write handle.
    fn open_write(&self, a: &Agent, p: &str) -> HandleState {
        let route = WriteRoute::Open {
            ino: 1,
            path: Some(Path::new(p)),
            flags: libc::O_WRONLY,
        };
        let permit = self.pol.before_write(&a.caller(), &route).unwrap();
        let info = OpenInfo {
            ino: 1,
            path: Some(Path::new(p)),
            flags: libc::O_WRONLY,
            created: false,
            stamp: self.stamp(p),
        };
        let state = self.pol.on_open(&a.caller(), &info, permit).unwrap();
        state.expect("a write handle keeps state")
    }

    fn handle<'a>(&self, p: &'a str, state: &'a HandleState, before: Stamp) -> HandleInfo<'a> {
        HandleInfo {
            ino: 1,
            path: Some(Path::new(p)),
            flags: libc::O_WRONLY,
            state: Some(state),
            before,
            now: self.stamp(p),
        }
    }
}

/// A request of uid 0 from `pid` (0: none the kernel could name), beginning now.
fn root_caller(pid: u32) -> Caller {
    Caller {
        pid,
        uid: 0,
        gid: 0,
        started: Started::now(),
    }
}

/// alice reads plan.md and hands it to bob.
fn handed(f: &Fixture, alice: &Agent, bob: &Agent) {
    f.write_file("plan.md", "v1\n");
    f.write_file("other.md", "o\n");
    f.read(bob, "other.md").unwrap(); // makes bob known
    f.read(alice, "plan.md").unwrap();
    f.ctl(alice, "transfer --to bob plan.md").unwrap();
}

#[test]
fn a_fenced_giver_is_refused_on_every_route_with_eacces_and_a_denied_event() {
    let f = Fixture::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    handed(&f, &alice, &bob);
    let p = |s: &'static str| Some(Path::new(s));
    let set = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    let user = OsStr::new("user.note");
    let routes: Vec<(WriteRoute<'_>, &str)> = vec![
        (
            WriteRoute::Open {
                ino: 1,
                path: p("plan.md"),
                flags: libc::O_WRONLY | libc::O_APPEND,
            },
            "open_write",
        ),
        (
            WriteRoute::Create {
                path: p("plan.md"),
                flags: libc::O_WRONLY | libc::O_CREAT,
                mode: 0o644,
            },
            "open_write",
        ),
        (
            WriteRoute::Setattr {
                ino: 1,
                path: p("plan.md"),
                set: &set,
            },
            "setattr",
        ),
        (
            WriteRoute::Rename {
                from: p("plan.md"),
                to: p("x.md"),
                flags: 0,
            },
            "rename_source",
        ),
        (
            WriteRoute::Rename {
                from: p("other.md"),
                to: p("plan.md"),
                flags: 2, // RENAME_EXCHANGE
            },
            "rename_target",
        ),
        (WriteRoute::Unlink { path: p("plan.md") }, "unlink"),
        // Both names of a link: not from the handed path, not onto it.
        (
            WriteRoute::Link {
                from: p("plan.md"),
                to: p("copy.md"),
            },
            "link",
        ),
        (
            WriteRoute::Link {
                from: p("other.md"),
                to: p("plan.md"),
            },
            "link",
        ),
        (
            WriteRoute::Symlink {
                path: p("plan.md"),
                target: Path::new("other.md"),
            },
            "symlink",
        ),
        (
            WriteRoute::Mknod {
                path: p("plan.md"),
                mode: libc::S_IFIFO | 0o644,
                rdev: 0,
            },
            "mknod",
        ),
        (
            WriteRoute::Setxattr {
                path: p("plan.md"),
                name: user,
            },
            "setxattr",
        ),
        (
            WriteRoute::Removexattr {
                path: p("plan.md"),
                name: user,
            },
            "removexattr",
        ),
    ];
    for (i, (route, name)) in routes.iter().enumerate() {
        let err = f.pol.before_write(&alice.caller(), route).unwrap_err();
        assert_eq!(err.errno(), libc::EACCES, "{route:?}");
        let denied = f.events_written("denied", "alice");
        assert_eq!(
            denied.len(),
            i + 1,
            "one denied event per refusal: {route:?}"
        );
        let last = denied.last().unwrap();
        assert_eq!(last["route"], *name, "{route:?}");
        assert_eq!(last["reason"], "fenced");
        assert_eq!(last["path"], "plan.md");
    }
    let why = f
        .vol
        .engine()
        .why(&f.vol.resolver().resolve_request(alice.caller().pid, 0));
    assert!(why.unwrap().contains("you handed plan.md"));
    // A bystander and the successor are not fenced; mkdir/rmdir are no write routes.
    let carol = Agent::new("carol");
    for a in [&bob, &carol] {
        let permit = f.pol.before_write(&a.caller(), &routes[2].0).unwrap();
        assert_eq!(permit.unwrap().path, "plan.md");
    }
    let mkdir = WriteRoute::Mkdir {
        path: p("plan.md"),
        mode: 0o755,
    };
    assert!(f
        .pol
        .before_write(&alice.caller(), &mkdir)
        .unwrap()
        .is_none());
    // A computed xattr is refused to anyone, with no event.
    let computed = WriteRoute::Setxattr {
        path: p("other.md"),
        name: OsStr::new("user.coherent.version"),
    };
    assert_eq!(
        f.pol
            .before_write(&carol.caller(), &computed)
            .unwrap_err()
            .errno(),
        libc::EACCES
    );
    assert!(f.events_of("denied", "carol").is_empty());
}

#[test]
fn an_unchanged_handle_closed_by_a_running_task_is_released_by_a_dead_session_reclaimed() {
    let f = Fixture::new();
    f.write_file("a.md", "a\n");
    let mut bob = Agent::new("bob");
    let t = f.open_write(&bob, "a.md");
    let st = f.stamp("a.md");
    // A deliberate close(2) by a running task, then its process exits before the
    // RELEASE arrives: still a `release`.
    f.pol.on_flush(&bob.caller(), &f.handle("a.md", &t, st));
    bob.kill();
    f.pol.on_release(&root_caller(0), &f.handle("a.md", &t, st));
    assert_eq!(f.events_of("release", "bob").len(), 1);
    assert!(f.events_of("reclaim", "bob").is_empty());

    // carol's only process dies with the file open (no FLUSH from a running task).
    let mut carol = Agent::new("carol");
    let t = f.open_write(&carol, "a.md");
    carol.kill();
    f.pol.on_release(&root_caller(0), &f.handle("a.md", &t, st));
    let reclaimed = f.await_event("reclaim", "carol", 1);
    assert_eq!(reclaimed.len(), 1, "{:#?}", f.events());
    assert_eq!(reclaimed[0]["path"], "a.md");
    assert!(f.events_of("release", "carol").is_empty());
}

#[test]
fn a_transfer_waits_for_a_flushed_handle_and_refuses_one_held_open() {
    let f = Fixture::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.write_file("plan.md", "v1\n");
    f.read(&bob, "plan.md").unwrap();
    f.read(&alice, "plan.md").unwrap();
    let t = f.open_write(&alice, "plan.md");
    let st = f.stamp("plan.md");
    // Held open (no FLUSH yet): refused at once.
    let started = Instant::now();
    assert_eq!(f.ctl(&alice, "transfer --to bob plan.md"), Err(libc::EBUSY));
    assert!(started.elapsed() < Duration::from_secs(4), "did not wait");
    // Closed (FLUSH) but the RELEASE is still on its way: the transfer waits for it.
    f.pol
        .on_flush(&alice.caller(), &f.handle("plan.md", &t, st));
    std::thread::scope(|sc| {
        let vol = &f.pol;
        let h = f.handle("plan.md", &t, st);
        let releaser = sc.spawn(move || {
            // Release once the transfer is waiting (it logs nothing while waiting; its
            // refusal would already be back, so give it a moment to start).
            std::thread::sleep(Duration::from_millis(200));
            vol.on_release(&root_caller(0), &h);
        });
        assert_eq!(f.ctl(&alice, "transfer --to bob plan.md"), Ok(()));
        releaser.join().unwrap();
    });
    assert_eq!(f.events_of("transfer", "alice").len(), 1);
}

/// docs/design.md#sessions, fail closed: a caller the volume cannot resolve (here: a pid whose
/// process is gone, so /proc has no entry for it, and pid 0, what FUSE sends for a caller outside
/// the daemon's pid namespace) is refused on a path with a live record (`EACCES`, a `denied`
/// event with reason `unresolved`, the record still `pending`), never admitted as `uid:0`;
/// its other writes and its reads go on.
#[test]
fn an_unresolved_caller_is_refused_on_a_handed_path_and_nowhere_else() {
    let f = Fixture::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    handed(&f, &alice, &bob);
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let dead = gone.id();
    assert!(!Path::new(&format!("/proc/{dead}")).exists());
    for pid in [dead, 0] {
        let c = || root_caller(pid);
        let denied_before = f.events_of("denied", "uid:0").len();
        let route = WriteRoute::Open {
            ino: 1,
            path: Some(Path::new("plan.md")),
            flags: libc::O_WRONLY | libc::O_APPEND,
        };
        let e = f.pol.before_write(&c(), &route).unwrap_err();
        assert_eq!(e.errno(), libc::EACCES, "pid {pid}");
        let denied = f.events_written("denied", "uid:0");
        assert_eq!(denied.len(), denied_before + 1, "pid {pid}: {denied:?}");
        let d = denied.last().unwrap();
        assert_eq!(d["reason"], "unresolved", "{d}");
        assert_eq!(d["path"], "plan.md", "{d}");
        assert_eq!(d["route"], "open_write", "{d}");
        // A rename onto the handed path is refused the same way (the target side).
        let onto = WriteRoute::Rename {
            from: Some(Path::new("other.md")),
            to: Some(Path::new("plan.md")),
            flags: 0,
        };
        assert_eq!(
            f.pol.before_write(&c(), &onto).unwrap_err().errno(),
            libc::EACCES
        );
        // Other paths: written as the request's uid, as before.
        let other = WriteRoute::Open {
            ino: 1,
            path: Some(Path::new("other.md")),
            flags: libc::O_WRONLY,
        };
        let permit = f.pol.before_write(&c(), &other).unwrap().expect("a permit");
        assert_eq!(permit.session.name, "uid:0");
        f.pol
            .after_write(&c(), &other, Some(permit), Err(FsError(libc::EIO)));
        // Reads go on.
        let info = OpenInfo {
            ino: 1,
            path: Some(Path::new("plan.md")),
            flags: libc::O_RDONLY,
            created: false,
            stamp: f.stamp("plan.md"),
        };
        assert!(f.pol.on_open(&c(), &info, None).unwrap().is_none());
    }
    // Nothing overtook the handoff: the record is pending and alice is still fenced.
    let st = f.vol.engine().status(Some("plan.md"));
    let v = serde_json::to_value(&st).unwrap();
    assert_eq!(v["live"][0]["status"], "pending", "{v}");
    assert!(f.events_of("overtaken", "uid:0").is_empty());
    assert!(f
        .events_of("acquire", "uid:0")
        .iter()
        .all(|e| e["path"] != "plan.md"));
}

/// Fail closed on renames: an unresolved caller's rename onto a handed file is denied with
/// route `rename_target`; a rename of the directory holding a handed file with
/// `rename_source` naming that file; a directory whose name only starts the same
/// (`d` and `dd/`) is not refused.
#[test]
fn an_unresolved_rename_is_denied_with_its_side_and_only_over_its_own_subtree() {
    let f = Fixture::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    handed(&f, &alice, &bob);
    std::fs::create_dir(f.backing.join("d")).unwrap();
    std::fs::create_dir(f.backing.join("dd")).unwrap();
    f.write_file("d/x.md", "x\n");
    f.read(&alice, "d/x.md").unwrap();
    f.ctl(&alice, "transfer --to bob d/x.md").unwrap();
    let c = || root_caller(0);
    let p = |s: &'static str| Some(Path::new(s));
    let last_denied = || f.events_written("denied", "uid:0").last().cloned().unwrap();
    let onto = WriteRoute::Rename {
        from: p("other.md"),
        to: p("plan.md"),
        flags: 0,
    };
    let e = f.pol.before_write(&c(), &onto).unwrap_err();
    assert_eq!(e.errno(), libc::EACCES);
    let d = last_denied();
    assert_eq!(
        (&d["path"], &d["route"]),
        (&"plan.md".into(), &"rename_target".into()),
        "{d}"
    );
    assert_eq!(d["reason"], "unresolved", "{d}");
    let away = WriteRoute::Rename {
        from: p("plan.md"),
        to: p("elsewhere.md"),
        flags: 0,
    };
    f.pol.before_write(&c(), &away).unwrap_err();
    let d = last_denied();
    assert_eq!(
        (&d["path"], &d["route"]),
        (&"plan.md".into(), &"rename_source".into()),
        "{d}"
    );
    let dir = WriteRoute::Rename {
        from: p("d"),
        to: p("e"),
        flags: 0,
    };
    assert_eq!(
        f.pol.before_write(&c(), &dir).unwrap_err().errno(),
        libc::EACCES
    );
    let d = last_denied();
    assert_eq!(
        (&d["path"], &d["route"]),
        (&"d/x.md".into(), &"rename_source".into()),
        "{d}"
    );
    let n = f.events_written("denied", "uid:0").len();
    let neighbour = WriteRoute::Rename {
        from: p("dd"),
        to: p("ee"),
        flags: 0,
    };
    let permit = f.pol.before_write(&c(), &neighbour).unwrap();
    f.pol
        .after_write(&c(), &neighbour, permit, Err(FsError(libc::EIO)));
    // A one-letter directory: `d/x.md` has its `/` right after one letter, yet is not in `z/`.
    std::fs::create_dir(f.backing.join("z")).unwrap();
    let short = WriteRoute::Rename {
        from: p("z"),
        to: p("y"),
        flags: 0,
    };
    let permit = f.pol.before_write(&c(), &short).unwrap();
    f.pol
        .after_write(&c(), &short, permit, Err(FsError(libc::EIO)));
    assert_eq!(f.events_written("denied", "uid:0").len(), n);
}

/// docs/design.md#state-log: `handoff_seen` is in the log when the successor's open returns
/// (written out, not left for the group commit): read without a flush right after the hook.
#[test]
fn handoff_seen_is_written_out_before_the_open_returns() {
    let f = Fixture::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    handed(&f, &alice, &bob);
    assert!(f.events_written("handoff_seen", "bob").is_empty());
    f.read(&bob, "plan.md").unwrap();
    let seen = f.events_written("handoff_seen", "bob");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["path"], "plan.md");
}

/// Every write route of a fenced giver through the filesystem itself (what a mount
/// would do, without one): refused with `EACCES` before the backing directory changes,
/// one `denied` event per route, and the refusal readable in `.coherent/why`. The
/// successor's write-open goes through, and its release commits a new version.
#[test]
fn every_write_route_through_the_filesystem_is_decided_before_it_operates() {
    let f = Fixture::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    handed(&f, &alice, &bob);
    let c = &alice.caller();
    let name = OsStr::new;
    let ino = |p: &str| f.fs.lookup(c, ROOT_INO, name(p)).unwrap().attr.unwrap().ino;
    let (plan, other) = (ino("plan.md"), ino("other.md"));
    let trunc = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    let tries: Vec<(&str, Result<(), FsError>)> = vec![
        ("open_write", {
            let flags = libc::O_WRONLY | libc::O_TRUNC;
            f.fs.open(c, plan, flags).map(drop)
        }),
        ("open_write", {
            let flags = libc::O_WRONLY | libc::O_CREAT;
            f.fs.create(c, ROOT_INO, name("plan.md"), 0o644, 0, flags)
                .map(drop)
        }),
        ("setattr", f.fs.setattr(c, plan, &trunc, None).map(drop)),
        ("rename_source", {
            f.fs.rename(c, ROOT_INO, name("plan.md"), ROOT_INO, name("x.md"), 0)
        }),
        ("rename_target", {
            let exchange = libc::RENAME_EXCHANGE;
            f.fs.rename(
                c,
                ROOT_INO,
                name("other.md"),
                ROOT_INO,
                name("plan.md"),
                exchange,
            )
        }),
        ("unlink", f.fs.unlink(c, ROOT_INO, name("plan.md"))),
        (
            "link",
            f.fs.link(c, plan, ROOT_INO, name("copy.md")).map(drop),
        ),
        (
            "link",
            f.fs.link(c, other, ROOT_INO, name("plan.md")).map(drop),
        ),
        ("symlink", {
            let target = Path::new("other.md");
            f.fs.symlink(c, ROOT_INO, name("plan.md"), target).map(drop)
        }),
        ("mknod", {
            let fifo = libc::S_IFIFO | 0o644;
            f.fs.mknod(c, ROOT_INO, name("plan.md"), fifo, 0, 0)
                .map(drop)
        }),
        (
            "setxattr",
            f.fs.setxattr(c, plan, name("user.note"), b"x", 0),
        ),
        ("removexattr", f.fs.removexattr(c, plan, name("user.note"))),
    ];
    let denied = f.events_written("denied", "alice");
    assert_eq!(denied.len(), tries.len(), "one denied event per refusal");
    for ((route, r), event) in tries.iter().zip(&denied) {
        assert_eq!(r.unwrap_err().errno(), libc::EACCES, "{route}");
        assert_eq!(event["route"], *route);
        assert_eq!(event["path"], "plan.md");
    }
    // Nothing reached the backing directory: not even the truncation of the open.
    assert_eq!(
        std::fs::read_to_string(f.backing.join("plan.md")).unwrap(),
        "v1\n"
    );
    for gone in ["x.md", "copy.md"] {
        assert!(!f.backing.join(gone).exists(), "{gone}");
    }
    let why = f.read_surface(&alice, "why");
    assert!(why.contains("you handed plan.md"), "{why}");
    assert!(why.contains("\n(at "), "{why}");

    // The successor writes: decided, opened with FLUSH (the volume keeps state for the
    // handle), and its release commits the next version.
    let version = |a: &Agent| {
        let v =
            f.fs.getxattr(&a.caller(), plan, name("user.coherent.version"), 64);
        match v.unwrap() {
            XattrReply::Data(d) => String::from_utf8(d).unwrap(),
            XattrReply::Size(_) => unreachable!(),
        }
    };
    assert_eq!(version(&bob), "1");
    let o =
        f.fs.open(&bob.caller(), plan, libc::O_WRONLY | libc::O_TRUNC)
            .unwrap();
    assert!(!o.fopen.noflush && !o.fopen.direct_io);
    assert_eq!(
        f.fs.write(&bob.caller(), plan, o.fh, 0, b"v2\n").unwrap(),
        3
    );
    f.fs.flush(&bob.caller(), plan, o.fh).unwrap();
    assert!(f.fs.release(&bob.caller(), plan, o.fh).is_some());
    assert_eq!(version(&bob), "2");
    assert_eq!(
        f.read_surface(&bob, "why").split(':').next(),
        Some("no refusal")
    );
}

/// A stale append (allowed under the default `--stale guard`, as under `warn`): the write
/// goes on, and the writer
/// reads at `.coherent/why` exactly what happened, through the filesystem.
#[test]
fn a_stale_write_goes_on_and_the_writer_is_told_at_why() {
    let f = Fixture::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.write_file("plan.md", "v1\n");
    let plan =
        f.fs.lookup(&alice.caller(), ROOT_INO, OsStr::new("plan.md"));
    let plan = plan.unwrap().attr.unwrap().ino;
    let append = |a: &Agent| {
        let o =
            f.fs.open(&a.caller(), plan, libc::O_WRONLY | libc::O_APPEND)
                .unwrap();
        f.fs.write(&a.caller(), plan, o.fh, 0, b"more\n").unwrap();
        f.fs.flush(&a.caller(), plan, o.fh).unwrap();
        f.fs.release(&a.caller(), plan, o.fh);
    };
    f.read(&alice, "plan.md").unwrap();
    append(&bob);
    append(&alice);
    let why = f.read_surface(&alice, "why");
    let told = "stale write: plan.md is at v2 but this session last saw v1 (another session \
                changed it since); the write goes on (an append adds after that change, any other \
                write replaces it). Read plan.md again to see it.\n(at ";
    assert!(why.starts_with(told), "{why}");
    assert_eq!(f.events_of("stale_write", "alice").len(), 1);
}

/// Refuse and tell, one recipe for every refusal: a fenced giver's refused open and an
/// unresolved caller's are both in the log when the call returns (`denied`, each with its
/// reason), only the giver (whose session is known) is told at `why`, with the time, and
/// a refused verb is told there too.
#[test]
fn a_refusal_is_logged_before_it_returns_and_told_only_to_a_known_session() {
    let f = Fixture::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    handed(&f, &alice, &bob);
    let open = WriteRoute::Open {
        ino: 1,
        path: Some(Path::new("plan.md")),
        flags: libc::O_WRONLY,
    };
    let e = f.pol.before_write(&alice.caller(), &open).unwrap_err();
    assert_eq!(e.errno(), libc::EACCES);
    let denied = f.events_written("denied", "alice");
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0]["reason"], "fenced");
    let why = f.read_surface(&alice, "why");
    assert!(why.contains("you handed plan.md"), "{why}");
    assert!(why.contains("\n(at "), "the volume says when: {why}");

    // pid 0: no session to resolve, so it is decided as uid:0 and refused `unresolved`.
    let e = f.pol.before_write(&root_caller(0), &open).unwrap_err();
    assert_eq!(e.errno(), libc::EACCES);
    let denied = f.events_written("denied", "uid:0");
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0]["reason"], "unresolved");
    let uid0 = coherent::identity::SessionInfo::unattributed(0);
    assert_eq!(
        f.vol.engine().why(&uid0),
        None,
        "a caller whose session is unknown is not told as uid:0"
    );

    // A refused verb: its reply fails the write, and `why` says it.
    assert_eq!(f.ctl(&alice, "withdraw nothing.md"), Err(libc::ENOENT));
    let why = f.read_surface(&alice, "why");
    assert!(why.contains("nothing.md"), "{why}");
}

/// An open for write is looked at once: a tracked name is decided on what it holds, and
/// an untracked name of the handed file (a hard link in an ignored directory, which the
/// store may hand the policy when it knows no other name) is fenced by inode all the same.
#[test]
fn a_giver_opening_an_untracked_name_of_the_handed_file_is_fenced() {
    let f = Fixture::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.write_file(".gitignore", "build/\n");
    std::fs::create_dir(f.backing.join("build")).unwrap();
    handed(&f, &alice, &bob);
    std::fs::hard_link(f.backing.join("plan.md"), f.backing.join("build/p.alias")).unwrap();
    for path in ["build/p.alias", "plan.md"] {
        let open = WriteRoute::Open {
            ino: 1,
            path: Some(Path::new(path)),
            flags: libc::O_WRONLY | libc::O_APPEND,
        };
        let e = f.pol.before_write(&alice.caller(), &open).unwrap_err();
        assert_eq!(e.errno(), libc::EACCES, "{path}");
    }
    let denied = f.events_written("denied", "alice");
    assert_eq!(denied.len(), 2, "{denied:?}");
    assert!(denied.iter().all(|d| d["reason"] == "fenced"), "{denied:?}");
    // A bystander opens either name.
    let carol = Agent::new("carol");
    for path in ["build/p.alias", "plan.md"] {
        let open = WriteRoute::Open {
            ino: 1,
            path: Some(Path::new(path)),
            flags: libc::O_WRONLY | libc::O_APPEND,
        };
        assert!(f.pol.before_write(&carol.caller(), &open).is_ok(), "{path}");
    }
}
