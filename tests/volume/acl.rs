//! POSIX ACLs through the mount (docs/permissions.md): every caller gets exactly the access
//! the backing filesystem would give it, ACL entries (user, group, mask) and default ACLs
//! included. Each case runs twice as the same real users (`coh-u1`, `coh-u2`) with the real
//! `setfacl`: once in a plain directory on the backing filesystem, once through the mount;
//! the outcome of every operation (content or errno) and the final modes, owners and
//! `getfacl` output must be the same. With and without passthrough, in place and over a
//! separate backing directory. The control plane agrees: `coherent transfer` by a user
//! whose write permission comes from (or is taken by) an ACL.

use crate::coherent;
use crate::common;

use coherent::{mount_with, unique, Run, Vol, CLI};
use common::users::{self, User};
use common::{wait_until, Builder, Mount};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Who runs a step.
#[derive(Clone, Copy, Debug)]
enum As {
    Root,
    U1,
    U2,
}

/// One step of a case, run in the case's directory.
enum Step {
    /// A shell script that must succeed.
    Sh(As, &'static str),
    /// Operations whose outcomes are compared (see [`PROBE`]), and what they must be.
    Probe(As, &'static [&'static str], &'static [&'static str]),
}
use Step::{Probe, Sh};

/// Runs operations given as `OP:PATH[:ARG]` and prints one line each: `OP PATH -> ok ...`
/// or `OP PATH -> ERRNO` (the errno's name).
const PROBE: &str = r#"
import errno, os, sys
for spec in sys.argv[1:]:
    op, path, *arg = spec.split(':')
    try:
        if op == 'umask':
            os.umask(int(path, 8)); out = ''
        elif op == 'read':
            with open(path, 'rb') as f: out = repr(f.read())
        elif op == 'append':
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.write(fd, arg[0].encode() + b'\n'); os.close(fd); out = ''
        elif op == 'create':
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)); out = ''
        elif op == 'mkdir':
            os.mkdir(path, 0o777); out = ''
        elif op == 'list':
            out = ' '.join(sorted(os.listdir(path)))
        elif op == 'enter':
            os.chdir(path); os.chdir('..'); out = ''
        elif op == 'stat':
            out = oct(os.stat(path).st_mode & 0o7777)
        elif op == 'access':
            out = str(os.access(path, {'r': os.R_OK, 'w': os.W_OK, 'x': os.X_OK}[arg[0]]))
        print(f'{op} {path} -> ok {out}'.rstrip())
    except OSError as e:
        print(f'{op} {path} -> {errno.errorcode[e.errno]}')
"#;

/// What is left of a case: every path (sorted) with its mode, owner, group and size, and
/// its ACLs as `getfacl` prints them; read as root.
const STATE: &str = "find . -mindepth 1 | LC_ALL=C sort | while read -r p; do \
    stat -c '%n %A %U %G %s' \"$p\"; getfacl -n --omit-header -- \"$p\"; done";

struct Case {
    name: &'static str,
    steps: &'static [Step],
}

const CASES: &[Case] = &[
    Case {
        // The issue's report: other may write, an entry denies coh-u2 everything.
        name: "deny_entry_on_a_file",
        steps: &[
            Sh(
                As::U1,
                "echo SECRET > sec.md && chmod 646 sec.md && setfacl -m u:coh-u2:--- sec.md",
            ),
            Probe(
                As::U2,
                &["read:sec.md", "append:sec.md:u2", "access:sec.md:w"],
                &[
                    "read sec.md -> EACCES",
                    "append sec.md -> EACCES",
                    "access sec.md -> ok False",
                ],
            ),
            Probe(
                As::U1,
                &["read:sec.md"],
                &[r"read sec.md -> ok b'SECRET\n'"],
            ),
        ],
    },
    Case {
        name: "grant_entry_on_a_file",
        steps: &[
            Sh(
                As::U1,
                "echo g > g.md && chmod 644 g.md && setfacl -m u:coh-u2:rw g.md",
            ),
            Probe(
                As::U2,
                &["append:g.md:u2", "read:g.md", "access:g.md:w"],
                &[
                    "append g.md -> ok",
                    r"read g.md -> ok b'g\nu2\n'",
                    "access g.md -> ok True",
                ],
            ),
        ],
    },
    Case {
        // The mask caps every named entry and the group class.
        name: "mask_limits_a_grant",
        steps: &[
            Sh(
                As::U1,
                "echo m > m.md && chmod 600 m.md && setfacl -m u:coh-u2:rw,m::r m.md",
            ),
            Probe(
                As::U2,
                &["read:m.md", "append:m.md:u2"],
                &[r"read m.md -> ok b'm\n'", "append m.md -> EACCES"],
            ),
        ],
    },
    Case {
        // A matching group entry decides, even where `other` would allow more.
        name: "group_entries",
        steps: &[
            Sh(
                As::Root,
                "echo t > team.md && chmod 600 team.md && setfacl -m g:coh-shared:rw team.md \
                 && echo o > other.md && chmod 664 other.md \
                 && setfacl -m g:coh-shared:--- other.md",
            ),
            Probe(
                As::U1,
                &["append:team.md:u1", "read:team.md", "read:other.md"],
                &[
                    "append team.md -> ok",
                    r"read team.md -> ok b't\nu1\n'",
                    "read other.md -> EACCES",
                ],
            ),
            Probe(
                As::U2,
                &["read:team.md", "read:other.md"],
                &["read team.md -> EACCES", r"read other.md -> ok b'o\n'"],
            ),
        ],
    },
    Case {
        name: "acl_denied_and_granted_directories",
        steps: &[
            Sh(
                As::U1,
                "mkdir d && echo f > d/f && chmod 666 d/f && chmod 777 d \
                 && setfacl -m u:coh-u2:--- d \
                 && mkdir g && chmod 700 g && setfacl -m u:coh-u2:rwx g",
            ),
            Probe(
                As::U2,
                &[
                    "enter:d",
                    "list:d",
                    "create:d/new",
                    "read:d/f",
                    "enter:g",
                    "create:g/new",
                    "mkdir:g/sub",
                    "list:g",
                ],
                &[
                    "enter d -> EACCES",
                    "list d -> EACCES",
                    "create d/new -> EACCES",
                    "read d/f -> EACCES",
                    "enter g -> ok",
                    "create g/new -> ok",
                    "mkdir g/sub -> ok",
                    "list g -> ok new sub",
                ],
            ),
        ],
    },
    Case {
        // A default ACL replaces the umask; without one the caller's umask applies. The
        // state comparison holds the modes and `getfacl` of what each create made.
        name: "default_acl_inherited_and_umask",
        steps: &[
            Sh(
                As::U1,
                "mkdir dd && setfacl -d -m u:coh-u2:rwx,g::r-x,o::--- dd && chmod 777 dd",
            ),
            Probe(
                As::U1,
                &[
                    "umask:022",
                    "create:dd/f",
                    "mkdir:dd/s",
                    "create:dd/s/deep",
                    "umask:027",
                    "create:plain",
                    "mkdir:plaind",
                    "umask:077",
                    "create:dd/f77",
                ],
                &[
                    "umask 022 -> ok",
                    "create dd/f -> ok",
                    "mkdir dd/s -> ok",
                    "create dd/s/deep -> ok",
                    "umask 027 -> ok",
                    "create plain -> ok",
                    "mkdir plaind -> ok",
                    "umask 077 -> ok",
                    "create dd/f77 -> ok",
                ],
            ),
            Sh(As::U1, "mkfifo -m 666 dd/fifo"),
            Probe(
                As::U2,
                &["append:dd/f:u2", "append:dd/s/deep:u2", "stat:plain"],
                &[
                    "append dd/f -> ok",
                    "append dd/s/deep -> ok",
                    "stat plain -> ok 0o640",
                ],
            ),
        ],
    },
    Case {
        // The kernel caches a node's ACL: setfacl and chmod through the mount must drop it
        // (and the attributes, as setfacl changes the mode).
        name: "setfacl_changes_the_mode_and_chmod_the_mask",
        steps: &[
            Sh(As::U1, "echo c > c.md && chmod 600 c.md"),
            Probe(
                As::U2,
                &["read:c.md", "stat:c.md"],
                &["read c.md -> EACCES", "stat c.md -> ok 0o600"],
            ),
            Sh(As::U1, "setfacl -m u:coh-u2:r c.md"),
            Probe(
                As::U2,
                &["stat:c.md", "read:c.md"],
                &["stat c.md -> ok 0o640", r"read c.md -> ok b'c\n'"],
            ),
            Sh(As::U1, "chmod 600 c.md"),
            Probe(
                As::U2,
                &["read:c.md", "stat:c.md"],
                &["read c.md -> EACCES", "stat c.md -> ok 0o600"],
            ),
            Sh(As::U1, "chmod 660 c.md && setfacl -x u:coh-u2 c.md"),
            Probe(As::U2, &["read:c.md"], &["read c.md -> EACCES"]),
        ],
    },
    Case {
        // Setting an access ACL clears set-group-ID when the owner is not in the group,
        // as the owner's own setfacl does natively (the daemon is root, and in the group).
        name: "setfacl_by_a_non_member_clears_setgid",
        steps: &[
            Sh(
                As::Root,
                "echo s > s.md && chown coh-u1:coh-u2 s.md && chmod 2664 s.md",
            ),
            Sh(As::U1, "setfacl -m u:coh-u2:rw s.md"),
            Probe(As::U1, &["stat:s.md"], &["stat s.md -> ok 0o664"]),
        ],
    },
];

fn user(who: As) -> Option<User> {
    match who {
        As::Root => None,
        As::U1 => Some(users::u1()),
        As::U2 => Some(users::u2()),
    }
}

/// `argv` in `dir` as `who` (root: this process's own credentials).
fn run_as(who: As, dir: &Path, argv: &[&str]) -> Run {
    let mut cmd = match user(who) {
        Some(u) => u.argv(dir, &[], argv),
        None => {
            let mut c = Command::new(argv[0]);
            c.args(&argv[1..]).current_dir(dir);
            c
        }
    };
    let o = common::run_timeout(&mut cmd, Duration::from_secs(60));
    Run {
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Run a case's steps in `dir`; returns the probes' output lines.
fn run_case(case: &Case, dir: &Path, place: &str) -> Vec<Vec<String>> {
    let mut probes = Vec::new();
    for step in case.steps {
        match step {
            Sh(who, script) => {
                let r = run_as(*who, dir, &["sh", "-c", &format!("umask 022; {script}")]);
                assert!(
                    r.ok(),
                    "{} ({place}): `{script}` as {who:?}: {}",
                    case.name,
                    r.show()
                );
            }
            Probe(who, ops, _) => {
                let mut argv = vec!["/usr/bin/python3", "-S", "-I", "-c", PROBE];
                argv.extend_from_slice(ops);
                let r = run_as(*who, dir, &argv);
                assert!(r.ok(), "{} ({place}) probe: {}", case.name, r.show());
                probes.push(r.out.lines().map(str::to_string).collect());
            }
        }
    }
    probes
}

fn state(dir: &Path) -> String {
    let r = run_as(As::Root, dir, &["sh", "-c", STATE]);
    assert!(r.ok(), "state of {}: {}", dir.display(), r.show());
    r.out
}

/// A fresh directory for a case: owned by coh-u1, 0755.
fn case_dir(parent: &Path, name: &str) -> PathBuf {
    let d = parent.join(name);
    std::fs::create_dir(&d).unwrap();
    let u1 = users::u1();
    std::os::unix::fs::chown(&d, Some(u1.uid), Some(u1.gid)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// A root mount (`allow_other,default_permissions`) other users can reach, and a plain
/// directory beside it on the same filesystem for the native runs.
fn mount(b: Builder) -> (Vol, PathBuf) {
    let m = mount_with(b);
    let base = m.backing.parent().unwrap().to_path_buf();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&m.mnt, std::fs::Permissions::from_mode(0o755)).unwrap();
    let native = base.join("native");
    std::fs::create_dir(&native).unwrap();
    std::fs::set_permissions(&native, std::fs::Permissions::from_mode(0o755)).unwrap();
    (m, native)
}

/// Every case, natively and through the mount: the same outcomes, the same final state.
/// All cases run; the failure names every case that differs.
fn table(b: Builder) {
    table_of(b, CASES)
}

fn table_of(b: Builder, cases: &[Case]) {
    let (m, native) = mount(b);
    let mut wrong = Vec::new();
    for case in cases {
        let n = case_dir(&native, case.name);
        let t = case_dir(&m.mnt, case.name);
        let want: Vec<Vec<String>> = case
            .steps
            .iter()
            .filter_map(|s| match s {
                Probe(_, _, want) => Some(want.iter().map(|l| l.to_string()).collect()),
                Sh(..) => None,
            })
            .collect();
        let got_native = run_case(case, &n, "native");
        assert_eq!(
            got_native, want,
            "{}: the native outcomes are not the expected ones (is the backing filesystem \
             mounted with ACLs?)",
            case.name
        );
        let got_mount = run_case(case, &t, "mount");
        if got_mount != got_native {
            wrong.push(format!(
                "{}: through the mount {got_mount:?}, natively {got_native:?}",
                case.name
            ));
        }
        let (sm, sn) = (state(&t), state(&n));
        if sm != sn {
            wrong.push(format!(
                "{}: state through the mount:\n{sm}natively:\n{sn}",
                case.name
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let log = m.log();
    assert!(!log.contains("POSIX ACLs"), "daemon warned: {log}");
}

#[test]
fn acl_table_passthrough() {
    table(Mount::builder());
}

#[test]
fn acl_table_no_passthrough() {
    table(Mount::builder().passthrough(false));
}

#[test]
fn acl_table_in_place_passthrough() {
    table(Mount::builder().in_place());
}

#[test]
fn acl_table_in_place_no_passthrough() {
    table(Mount::builder().in_place().passthrough(false));
}

/// `--private` (root only, no `default_permissions` asked for: POSIX ACLs turn the
/// kernel's check on all the same): root's creates get its umask or the default ACL.
#[test]
fn private_mount_creates_as_natively() {
    const ROOT_CREATES: &[Case] = &[Case {
        name: "root_creates",
        steps: &[
            Sh(
                As::Root,
                "mkdir dd && setfacl -d -m u:coh-u2:rwx,g::r-x,o::--- dd",
            ),
            Probe(
                As::Root,
                &[
                    "umask:027",
                    "create:plain",
                    "mkdir:plaind",
                    "create:dd/f",
                    "mkdir:dd/s",
                ],
                &[
                    "umask 027 -> ok",
                    "create plain -> ok",
                    "mkdir plaind -> ok",
                    "create dd/f -> ok",
                    "mkdir dd/s -> ok",
                ],
            ),
        ],
    }];
    table_of(Mount::builder().arg("--private"), ROOT_CREATES);
}

/// A mount by a plain user (coh-u1, through fusermount3, in a mount namespace where it may
/// open /dev/fuse): its creates get its umask or the parent's default ACL, as natively.
#[test]
fn a_plain_users_mount_creates_as_natively() {
    let u1 = users::u1();
    let dir = tempfile::tempdir().unwrap();
    // Sticky, as /tmp is: the daemon refuses a state directory under a directory anyone
    // could replace entries of.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let d = dir.path().display();
    let file = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    file(
        "creates.sh",
        "umask 027; touch a; mkdir ad; mkdir dd\n\
         setfacl -d -m u:coh-u2:rwx,g::r-x,o::--- dd\n\
         umask 022; touch dd/f; mkdir dd/s; mkfifo dd/p; umask 077; touch dd/f77\n",
    );
    file("state.sh", STATE);
    // The daemon is unmounted on any way out, so it never outlives the script: by root,
    // since a plain user's `fusermount3 -u` needs an /etc/mtab that a minimal root (the
    // clean room) does not have, and the daemon would wait there forever.
    let script = format!(
        "set -e; mknod -m 666 {d}/fuse c 10 229; mount --bind {d}/fuse /dev/fuse; \
         as_u1() {{ setpriv --reuid={uid} --regid={gid} --init-groups -- sh -c \"$1\"; }}; \
         as_u1 'mkdir {d}/b {d}/m {d}/n'; \
         as_u1 'exec {bin} {d}/b {d}/m --state-dir {d}/s' >/dev/null 2>{d}/log & \
         trap \"umount {d}/m || umount -l {d}/m; wait\" EXIT; \
         i=0; until grep -q ' {d}/m ' /proc/self/mountinfo; do \
           i=$((i+1)); [ $i -lt 500 ] || exit 3; sleep 0.01; done; \
         grep ' {d}/m ' /proc/self/mountinfo > {d}/mountinfo; \
         for t in m n; do as_u1 \"cd {d}/$t && sh {d}/creates.sh\"; done; \
         for t in m n; do as_u1 \"cd {d}/$t && sh {d}/state.sh\" > {d}/state.$t; done",
        uid = u1.uid,
        gid = u1.gid,
        bin = common::BIN,
    );
    let o = common::run_timeout(
        Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]),
        Duration::from_secs(60),
    );
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    assert!(
        o.status.success(),
        "{}\nlog: {log}",
        String::from_utf8_lossy(&o.stderr)
    );
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    assert!(
        read("mountinfo").contains(" - fuse"),
        "{}",
        read("mountinfo")
    );
    let (sm, sn) = (read("state.m"), read("state.n"));
    assert!(
        sn.contains("./dd/f77") && sn.contains("default:user:"),
        "{sn}"
    );
    assert_eq!(
        sm, sn,
        "through a plain user's mount (left) vs natively (right)"
    );
}

/// `coherent --json ARGS` as `u` in session `session`, in the mount root: exit code, reply.
fn u_cli(u: &User, m: &Vol, session: &str, args: &[&str]) -> (Option<i32>, Value) {
    let mut argv = vec![CLI, "--json"];
    argv.extend_from_slice(args);
    let o = u
        .argv(&m.mnt, &[("COHERENT_SESSION", session)], &argv)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let v = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
    (o.status.code(), v)
}

/// `sh -c CMD` as `u` in session `session` in the mount root.
fn u_sh(u: &User, m: &Vol, session: &str, cmd: &str) -> Run {
    let o = u.sh(&m.mnt, &[("COHERENT_SESSION", session)], cmd);
    Run {
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn refused(code: Option<i32>, v: &Value, reason: &str) -> bool {
    code == Some(2) && v["ok"] == false && v["reason"] == reason
}

/// The control plane decides as the mount does (the giver's and the successor's right to
/// write): coh-u2 writes and may hand on a file an ACL entry lets it write; it can neither
/// write nor hand on, nor be handed, one an entry keeps it from writing though `other`
/// may write it.
#[test]
fn transfer_agrees_with_the_mount_on_acls() {
    let (u1, u2) = (users::u1(), users::u2());
    let (m, _) = mount(Mount::builder());
    std::fs::set_permissions(&m.mnt, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (alice, bob, carol) = (unique("alice"), unique("bob"), unique("carol"));
    let setup = "umask 022; echo g > granted.md && chmod 644 granted.md \
        && setfacl -m u:coh-u2:rw granted.md \
        && echo d > denied.md && chmod 646 denied.md && setfacl -m u:coh-u2:r denied.md \
        && cat granted.md denied.md >/dev/null";
    let r = u_sh(&u1, &m, &alice, setup);
    assert!(r.ok(), "{}", r.show());
    let (code, v) = u_cli(&u1, &m, &bob, &["register"]);
    assert_eq!(code, Some(0), "{v}");

    // Granted by the ACL: carol (coh-u2) writes it and hands it on.
    let r = u_sh(&u2, &m, &carol, "echo c >> granted.md");
    assert!(r.ok(), "an ACL entry grants coh-u2 write: {}", r.show());
    let (code, v) = u_cli(&u2, &m, &carol, &["transfer", "--to", &bob, "granted.md"]);
    assert_eq!(code, Some(0), "{v}");

    // Denied by the ACL: carol reads it (a view) but may neither write it nor hand it on.
    let r = u_sh(&u2, &m, &carol, "cat denied.md && echo c >> denied.md");
    assert!(r.denied(), "an ACL entry denies coh-u2 write: {}", r.show());
    assert_eq!(
        std::fs::read_to_string(m.backing_path("denied.md")).unwrap(),
        "d\n"
    );
    let (code, v) = u_cli(&u2, &m, &carol, &["transfer", "--to", &bob, "denied.md"]);
    assert!(refused(code, &v, "session_not_yours"), "{code:?} {v}");

    // The successor's side: alice (coh-u1) may hand carol the file she can write by the
    // ACL, not the one she cannot.
    let (code, v) = u_cli(&u1, &m, &alice, &["transfer", "--to", &carol, "denied.md"]);
    assert!(refused(code, &v, "session_not_yours"), "{code:?} {v}");
    let r = u_sh(
        &u1,
        &m,
        &alice,
        "echo a > mine.md && chmod 600 mine.md && \
        setfacl -m u:coh-u2:rw mine.md && cat mine.md >/dev/null",
    );
    assert!(r.ok(), "{}", r.show());
    let (code, v) = u_cli(&u1, &m, &alice, &["transfer", "--to", &carol, "mine.md"]);
    assert_eq!(code, Some(0), "{v}");
    let (code, v) = u_cli(&u2, &m, &carol, &["accept", "mine.md"]);
    assert_eq!(code, Some(0), "{v}");
    let r = u_sh(&u2, &m, &carol, "echo c >> mine.md");
    assert!(r.ok(), "{}", r.show());
}

/// Over a separate backing directory an ACL changed there (not through the mount) is
/// seen through it once the kernel's cached attributes expire (the cache TTL), as a
/// changed mode is: the kernel drops a node's cached ACL with its attributes.
#[test]
fn an_acl_set_in_the_backing_directory_is_seen_within_the_ttl() {
    let u2 = users::u2();
    let (m, _) = mount(Mount::builder());
    std::fs::write(m.path("f.md"), "f\n").unwrap();
    std::fs::set_permissions(m.path("f.md"), std::fs::Permissions::from_mode(0o646)).unwrap();
    let read = || u2.sh(&m.mnt, &[], "cat f.md").status.success();
    assert!(read(), "other may read");
    let t = std::time::Instant::now();
    let o = Command::new("setfacl")
        .args(["-m", "u:coh-u2:---"])
        .arg(m.backing_path("f.md"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        wait_until(Duration::from_secs(5), || !read()),
        "the ACL set in the backing directory is not seen through the mount"
    );
    let late = t.elapsed();
    assert!(
        late < coherent_ttl() + Duration::from_millis(900),
        "seen after {late:?}, beyond the cache TTL"
    );
}

fn coherent_ttl() -> Duration {
    ::coherent::fs::TTL
}

/// `setfacl` is a `setxattr` of `system.posix_acl_access` (`setfacl -b`, a removexattr):
/// a write route, refused to a fenced giver like any other (docs/write-routes.md), and
/// the ACL stays as it was.
#[test]
fn a_fenced_giver_cannot_change_the_acl() {
    let m = coherent::mount(true);
    coherent::sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && setfacl -m u:coh-u2:r plan.md && cat plan.md >/dev/null",
    );
    coherent::touch_session(&m, "bob");
    coherent::transfer(&m, "alice", "bob", &["plan.md"]);
    let acl = || coherent::sh_ok(&m, None, "getfacl -n --omit-header plan.md");
    let before = acl();
    let entry = format!("user:{}:r--", users::u2().uid);
    assert!(before.contains(&entry), "{before}");
    for cmd in [
        "setfacl -m u:coh-u2:rw plan.md",
        "setfacl -x u:coh-u2 plan.md",
        "setfacl -b plan.md",
    ] {
        coherent::sh_refused(&m, "alice", cmd, "plan.md", "fenced");
        assert_eq!(acl(), before, "after `{cmd}`");
    }
    // bob, the successor, may.
    coherent::sh_ok(&m, Some("bob"), "setfacl -b plan.md");
    assert!(!acl().contains(&entry), "{}", acl());
}

/// A backing filesystem without POSIX ACLs (ramfs: no extended attributes at all): the
/// kernel's ACL lookups are answered "no ACL", so the mode decides as it does natively,
/// and `setfacl` fails as it does natively.
#[test]
fn a_backing_filesystem_without_acls_leaves_the_mode_to_decide() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (rb, mnt) = (dir.path().join("rb"), dir.path().join("m"));
    std::fs::create_dir(&rb).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    nix::mount::mount(
        Some("none"),
        &rb,
        Some("ramfs"),
        nix::mount::MsFlags::empty(),
        Some("mode=755"),
    )
    .expect("mount ramfs");
    struct Cleanup(PathBuf, PathBuf, Option<std::process::Child>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            if let Some(mut c) = self.2.take() {
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
                if common::wait_child(&mut c, Duration::from_secs(10)).is_none() {
                    common::lazy_umount(&self.1);
                }
            }
            common::lazy_umount(&self.0);
        }
    }
    let mut guard = Cleanup(rb.clone(), mnt.clone(), None);
    for (f, mode) in [("f", 0o644), ("w", 0o666)] {
        std::fs::write(rb.join(f), "x\n").unwrap();
        std::fs::set_permissions(rb.join(f), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let mut cmd = Command::new(common::BIN);
    cmd.arg(&rb)
        .arg(&mnt)
        .arg("--state-dir")
        .arg(dir.path().join("s"));
    guard.2 = Some(common::spawn_mounted(cmd, &mnt, &dir.path().join("log")));
    std::fs::set_permissions(&mnt, std::fs::Permissions::from_mode(0o755)).unwrap();
    let probe = |d: &Path| {
        let mut argv = vec!["/usr/bin/python3", "-S", "-I", "-c", PROBE];
        argv.extend_from_slice(&["read:f", "append:f:u2", "append:w:u2", "access:f:r"]);
        let r = run_as(As::U2, d, &argv);
        assert!(r.ok(), "{}", r.show());
        r.out
    };
    let native = probe(&rb);
    assert_eq!(
        native,
        "read f -> ok b'x\\n'\nappend f -> EACCES\nappend w -> ok\naccess f -> ok True\n"
    );
    assert_eq!(
        probe(&mnt),
        native,
        "through the mount (left) vs natively (right)"
    );
    let setfacl = |d: &Path| {
        let o = Command::new("setfacl")
            .args(["-m", "u:coh-u2:rw", "f"])
            .current_dir(d)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).contains("not supported"),
        )
    };
    assert_eq!(setfacl(&rb), (false, true));
    assert_eq!(setfacl(&mnt), (false, true), "setfacl through the mount");
}
