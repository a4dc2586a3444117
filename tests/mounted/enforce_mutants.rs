//! The behaviours that one-line mutants of the decision code got past the suite with
//! (docs/design.md#write-routes), each pinned on a real mount with the errno of the system call AND
//! the reason and route of the `denied` event it logged: `truncate(2)` by path is a commit, the
//! giver's directory rename and `RENAME_EXCHANGE` of directories are fenced, every write
//! route names itself in `denied`, a commit never revives an ended record, the latest
//! bystander is the counterparty, and `chown` by the giver is fenced.

use crate::coherent;

use coherent::*;
use serde_json::Value;

/// Run the Python statement `stmt` as `who` in the mount root and return the errno of the
/// first `OSError` it raised (0: it completed). The system call's own errno, not a tool's
/// message.
fn errno_of(m: &Vol, who: &str, stmt: &str) -> i32 {
    const PY: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def exchange(a, b):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
try:
    exec(sys.argv[1])
    print(0)
except OSError as e:
    print(e.errno)
"#;
    let mut c = python();
    c.arg("-c").arg(PY).arg(stmt);
    let r = run_in(m.root(), &[("COHERENT_SESSION", who)], &mut c);
    assert!(r.ok(), "{who} `{stmt}`: {}", r.show());
    r.out.trim().parse().expect("errno")
}

/// The `denied` events of `session` on `path`, once there are at least `n`.
fn denials(m: &Vol, session: &str, path: &str, n: usize) -> Vec<Value> {
    let d = await_events(m, "denied", path, Some(session), n);
    assert!(d.len() >= n, "want {n} denied on {path}, got {d:?}");
    d
}

/// `stmt` by `who` fails with `EACCES` and logs one more `denied` on `path` with reason
/// `fenced` and `route`.
fn fenced(m: &Vol, who: &str, stmt: &str, path: &str, route: &str) {
    let before = events_of(m, "denied", path, Some(who)).len();
    let errno = errno_of(m, who, stmt);
    assert_eq!(errno, libc::EACCES, "{who} `{stmt}`");
    let d = denials(m, who, path, before + 1);
    let last = &d[before];
    assert_eq!(last["reason"], "fenced", "{stmt}: {last}");
    assert_eq!(last["route"], route, "{stmt}: {last}");
}

/// alice writes plan.md (v1) and hands it to bob; carol and dave are known.
fn handed() -> Vol {
    handed_after("true")
}

/// [`handed`], with `prep` run by alice between her write and the transfer.
fn handed_after(prep: &str) -> Vol {
    let m = mount(true);
    for s in ["bob", "carol", "dave"] {
        touch_session(&m, s);
    }
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    sh_ok(
        &m,
        Some("alice"),
        &format!("{prep} && cat plan.md >/dev/null"),
    );
    transfer(&m, "alice", "bob", &["plan.md"]);
    m
}

fn content(m: &Vol, rel: &str) -> String {
    std::fs::read_to_string(m.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `truncate(2)` on a path (no handle of the caller open) is a commit of its own
/// (docs/design.md#versions).
#[test]
fn truncate_by_path_commits() {
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    assert_eq!(version(&m, "plan.md"), Some(1));
    assert_eq!(errno_of(&m, "alice", "os.truncate('plan.md', 2)"), 0);
    assert_eq!(content(&m, "plan.md"), "pl");
    assert_eq!(await_committed_version(&m, "plan.md", 2), Some(2));
    let c = events_of(&m, "commit", "plan.md", Some("alice"));
    assert_eq!(c.last().unwrap()["op"], "truncate", "{c:?}");
    assert_eq!(version(&m, "plan.md"), Some(2));
    // the successor's truncate completes a handoff: the version moves, the fence lifts
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    transfer(&m, "alice", "bob", &["plan.md"]);
    assert_eq!(errno_of(&m, "bob", "os.truncate('plan.md', 0)"), 0);
    assert_eq!(await_committed_version(&m, "plan.md", 3), Some(3));
    assert_eq!(record(&m, "plan.md").unwrap()["status"], "completed");
    assert!(live_record(&m, "plan.md").is_none());
    // alice is a late giver until she reads bob's version
    assert_eq!(
        errno_of(&m, "alice", "open('plan.md', 'a').write('x')"),
        libc::EACCES
    );
    let read_then_append = "open('plan.md').read(); open('plan.md', 'a').write('x')";
    assert_eq!(errno_of(&m, "alice", read_then_append), 0);
}

/// Every route of docs/design.md#write-routes a giver can try on a handed file answers EACCES and
/// names its route in the `denied` event; nothing changes.
#[test]
fn denied_events_name_the_route() {
    let m = handed_after("setfattr -n user.keep -v 1 plan.md");
    sh_ok(&m, Some("carol"), "echo o > other.md");
    let p = "plan.md";
    fenced(&m, "alice", "open('plan.md', 'a')", p, "open_write");
    fenced(&m, "alice", "open('plan.md', 'r+')", p, "open_write");
    fenced(&m, "alice", "os.truncate('plan.md', 0)", p, "setattr");
    fenced(&m, "alice", "os.chmod('plan.md', 0o600)", p, "setattr");
    fenced(&m, "alice", "os.utime('plan.md', (1, 1))", p, "setattr");
    fenced(&m, "alice", "os.unlink('plan.md')", p, "unlink");
    fenced(
        &m,
        "alice",
        "os.rename('plan.md', 'x.md')",
        p,
        "rename_source",
    );
    fenced(
        &m,
        "alice",
        "os.rename('other.md', 'plan.md')",
        p,
        "rename_target",
    );
    fenced(
        &m,
        "alice",
        "exchange('other.md', 'plan.md')",
        p,
        "rename_target",
    );
    fenced(&m, "alice", "os.link('plan.md', 'alias.md')", p, "link");
    fenced(
        &m,
        "alice",
        "os.setxattr('plan.md', 'user.t', b'1')",
        p,
        "setxattr",
    );
    fenced(
        &m,
        "alice",
        "os.removexattr('plan.md', 'user.keep')",
        p,
        "removexattr",
    );
    assert_eq!(content(&m, p), "plan\n");
    assert_eq!(content(&m, "other.md"), "o\n");
    assert!(!m.path("x.md").exists() && !m.path("alias.md").exists());
    assert_eq!(version(&m, p), Some(1));
    let r = live_record(&m, p).expect("still live");
    assert_eq!(r["status"], "pending", "{r}");
}

/// `chown` by the giver is a setattr of the owner: fenced (docs/design.md#write-routes), also to
/// the same owner.
#[test]
fn chown_by_the_giver_is_fenced() {
    let m = handed();
    fenced(
        &m,
        "alice",
        "st = os.stat('plan.md'); os.chown('plan.md', st.st_uid, st.st_gid)",
        "plan.md",
        "setattr",
    );
    fenced(
        &m,
        "alice",
        "os.chown('plan.md', 1, 1)",
        "plan.md",
        "setattr",
    );
    let st = std::fs::metadata(m.backing_path("plan.md")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&st), 0);
    // a bystander's chown is allowed (it is not a commit: the record stays pending)
    assert_eq!(errno_of(&m, "carol", "os.chown('plan.md', 0, 0)"), 0);
    assert_eq!(version(&m, "plan.md"), Some(1));
}

/// Renaming the directory that holds a handed file is a write of that file by its giver:
/// refused with EACCES, reason `fenced`, route `rename_source`; nothing moves.
#[test]
fn the_givers_directory_rename_is_fenced() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(
        &m,
        Some("alice"),
        "mkdir -p d/sub e && echo x > d/sub/plan.md",
    );
    transfer(&m, "alice", "bob", &["d/sub/plan.md"]);
    fenced(
        &m,
        "alice",
        "os.rename('d', 'moved')",
        "d/sub/plan.md",
        "rename_source",
    );
    fenced(
        &m,
        "alice",
        "os.rename('d/sub', 'e/sub')",
        "d/sub/plan.md",
        "rename_source",
    );
    let r = sh(&m, Some("alice"), "mv d moved2");
    assert!(r.denied(), "{}", r.show());
    assert!(m.path("d/sub/plan.md").exists());
    assert!(!m.path("moved").exists() && !m.path("e/sub").exists());
    assert_eq!(
        live_record(&m, "d/sub/plan.md").unwrap()["status"],
        "pending"
    );
    // a bystander may move the directory; the record moves with it
    assert_eq!(errno_of(&m, "bob", "os.rename('d', 'moved')"), 0);
    assert!(live_record(&m, "moved/sub/plan.md").is_some());
}

/// `RENAME_EXCHANGE` of two directories, one holding a handed file, by its giver: fenced
/// from either side (the route names the side the handed file is on).
#[test]
fn exchanging_directories_by_the_giver_is_fenced() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(
        &m,
        Some("alice"),
        "mkdir d e && echo x > d/plan.md && echo y > e/other.md",
    );
    transfer(&m, "alice", "bob", &["d/plan.md"]);
    fenced(
        &m,
        "alice",
        "exchange('d', 'e')",
        "d/plan.md",
        "rename_source",
    );
    fenced(
        &m,
        "alice",
        "exchange('e', 'd')",
        "d/plan.md",
        "rename_target",
    );
    assert_eq!(content(&m, "d/plan.md"), "x\n");
    assert_eq!(content(&m, "e/other.md"), "y\n");
    assert_eq!(live_record(&m, "d/plan.md").unwrap()["status"], "pending");
}

/// An ended record never changes: after a decline, neither the successor's nor the
/// giver's commit turns it `completed` (or anything else), and no `completed` is logged.
#[test]
fn a_commit_never_revives_a_declined_record() {
    let m = handed();
    verb_ok(&m, "bob", &["decline", "plan.md"]);
    assert_eq!(record(&m, "plan.md").unwrap()["status"], "declined");
    sh_ok(&m, Some("bob"), "echo bob >> plan.md");
    assert_eq!(await_committed_version(&m, "plan.md", 2), Some(2));
    sh_ok(&m, Some("alice"), "echo alice >> plan.md");
    assert_eq!(await_committed_version(&m, "plan.md", 3), Some(3));
    let recs = records(&m, "plan.md");
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["status"], "declined", "{recs:?}");
    assert_eq!(recs[0]["counterparty"], Value::Null, "{recs:?}");
    assert!(events_of(&m, "completed", "plan.md", None).is_empty());
    assert!(events_of(&m, "overtaken", "plan.md", None).is_empty());
}

/// Two bystanders acquire the handed file in turn without changing it: the record stays
/// live (`overtaken`), the counterparty is the latest of them, and the giver stays fenced.
#[test]
fn the_latest_bystander_is_the_counterparty() {
    let m = handed();
    assert_eq!(errno_of(&m, "carol", "open('plan.md', 'r+').close()"), 0);
    let o = await_events(&m, "overtaken", "plan.md", None, 1);
    assert_eq!(o[0]["counterparty"], "carol", "{o:?}");
    assert_eq!(errno_of(&m, "dave", "open('plan.md', 'r+').close()"), 0);
    let o = await_events(&m, "overtaken", "plan.md", None, 2);
    assert_eq!(o.len(), 2, "{o:?}");
    assert_eq!(o[1]["counterparty"], "dave", "{o:?}");
    let r = live_record(&m, "plan.md").expect("still live: the version did not move");
    assert_eq!(r["status"], "overtaken", "{r}");
    assert_eq!(r["counterparty"], "dave", "{r}");
    fenced(&m, "alice", "open('plan.md', 'a')", "plan.md", "open_write");
    assert_eq!(version(&m, "plan.md"), Some(1));
}
