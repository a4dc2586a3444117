//! Many users, one volume (docs/design.md#sessions, docs/design.md#handoff,
//! docs/design.md#control-surface, docs/design.md#mounting, docs/design.md#trust), with real users
//! (`coh-u1`, `coh-u2`, see `scripts/test-users.sh`) on real mounts made by root: the default mount
//! lets them in; a session name belongs to the first uid that shows it; verbs need the caller's own
//! permission; a caller sees only the paths it could look up; ctl paths never leave the volume; the
//! fence follows the inode; an in-place mount warns about processes already inside.

use crate::coherent;
use crate::common;

use coherent::*;
use common::{users, Mount};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use users::User;

/// A mount with a private state dir that other users can reach (the test harness's
/// temporary directories are 0700) and write at its root (0777, set through the mount).
fn open_mount(b: common::Builder) -> Vol {
    let v = mount_with(b);
    let base = v.mnt.parent().unwrap();
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&v.mnt, std::fs::Permissions::from_mode(0o777)).unwrap();
    v
}

fn env(session: Option<&str>) -> Vec<(&str, &str)> {
    session
        .map(|s| ("COHERENT_SESSION", s))
        .into_iter()
        .collect()
}

fn to_run(o: std::process::Output) -> Run {
    Run {
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `sh -c CMD` in the mount root as user `u`, in session `session` (None: no tag).
fn u_sh(u: &User, m: &impl Root, session: Option<&str>, cmd: &str) -> Run {
    to_run(u.sh(m.root(), &env(session), cmd))
}

fn u_sh_ok(u: &User, m: &impl Root, session: Option<&str>, cmd: &str) -> String {
    let r = u_sh(u, m, session, cmd);
    assert!(r.ok(), "{} {session:?} `{cmd}`: {}", u.name, r.show());
    r.out
}

/// `coherent --json ARGS` as user `u` in `session`: exit code and reply.
fn u_cli(u: &User, m: &impl Root, session: Option<&str>, args: &[&str]) -> (Option<i32>, Value) {
    let mut argv = vec![CLI, "--json"];
    argv.extend_from_slice(args);
    let r = to_run(u.argv(m.root(), &env(session), &argv).output().unwrap());
    let v = serde_json::from_str(r.out.trim()).unwrap_or(Value::Null);
    (r.code, v)
}

/// One request on `.coherent/ctl` as user `u`: (errno of the write, reply).
fn u_ctl(u: &User, m: &impl Root, session: Option<&str>, request: &str) -> (i32, Value) {
    let argv = ["/usr/bin/python3", "-S", "-I", "-c", CTL_PY, request];
    let r = to_run(u.argv(m.root(), &env(session), &argv).output().unwrap());
    assert!(r.ok(), "ctl as {}: {}", u.name, r.show());
    let (errno, reply) = r.out.split_once('\n').expect("helper output");
    (
        errno.parse().unwrap(),
        serde_json::from_str(reply.trim()).unwrap_or(Value::String(reply.into())),
    )
}

/// Read `.coherent/NAME` as user `u` in `session`.
fn u_read(u: &User, m: &impl Root, session: Option<&str>, name: &str) -> String {
    u_sh_ok(u, m, session, &format!("cat .coherent/{name}"))
}

/// Make session `session` of user `u` known (it registers itself).
fn u_touch(u: &User, m: &impl Root, session: &str) {
    let (code, v) = u_cli(u, m, Some(session), &["register"]);
    assert_eq!(code, Some(0), "{} registers {session}: {v}", u.name);
}

fn refused(reply: &Value, reason: &str) -> bool {
    reply["ok"] == false && reply["reason"] == reason
}

// ---- default mount options ------------------------------------------------------------

fn super_options(mnt: &Path) -> String {
    let s = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mnt.to_string_lossy().to_string();
    s.lines()
        .filter(|l| l.split(' ').nth(4) == Some(want.as_str()))
        .filter_map(|l| l.split(" - ").nth(1))
        .map(|t| t.split(' ').nth(2).unwrap_or("").to_string())
        .next_back()
        .unwrap_or_default()
}

#[test]
fn the_default_mount_lets_other_users_in_and_private_does_not() {
    let u1 = users::u1();
    let m = open_mount(Mount::builder());
    let opts = super_options(&m.mnt);
    assert!(opts.contains("allow_other"), "{opts}");
    assert!(opts.contains("default_permissions"), "{opts}");
    // The kernel checks modes: u1 enters, writes its own file, and cannot write root's.
    std::fs::write(m.at("roots"), "r").unwrap();
    u_sh_ok(
        &u1,
        &m,
        None,
        "ls >/dev/null && echo mine > mine && cat roots",
    );
    let r = u_sh(&u1, &m, None, "echo x >> roots");
    assert!(r.denied(), "{}", r.show());

    let p = open_mount(Mount::builder().arg("--private"));
    let opts = super_options(&p.mnt);
    assert!(!opts.contains("allow_other"), "{opts}");
    let r = u_sh(&u1, &p, None, "ls");
    assert!(
        r.denied(),
        "a private mount lets only its user in: {}",
        r.show()
    );
}

// ---- sessions belong to a uid ---------------------------------------------------------

#[test]
fn a_session_name_belongs_to_the_first_uid_that_shows_it() {
    let (u1, u2) = (users::u1(), users::u2());
    let m = open_mount(Mount::builder());
    let (alice, bob) = (unique("alice"), unique("bob"));
    u_sh_ok(&u1, &m, Some(&alice), "echo plan > plan.md");
    u_sh_ok(&u2, &m, Some(&bob), "cat plan.md >/dev/null");
    // u2 carrying alice's name is not alice: it is its own uid:UID, and whoami says why.
    let w: Value = serde_json::from_str(u_read(&u2, &m, Some(&alice), "whoami").trim()).unwrap();
    assert_eq!(w["session"], format!("uid:{}", u2.uid), "{w}");
    assert_eq!(w["via"]["kind"], "not_yours", "{w}");
    assert_eq!(w["via"]["session"], alice.as_str(), "{w}");
    assert_eq!(w["via"]["owner"], u1.uid, "{w}");
    let (code, w) = u_cli(&u2, &m, Some(&alice), &["whoami"]);
    assert_eq!(code, Some(0), "{w}");
    let msg = w["message"].as_str().unwrap_or("");
    assert!(
        msg.contains(&alice) && msg.contains(&u1.uid.to_string()),
        "{msg}"
    );

    // u1's alice hands plan.md to bob (u2 may write it: only such a session can be its
    // successor); u2 posing as alice cannot withdraw it.
    let _ = u_sh_ok(
        &u1,
        &m,
        Some(&alice),
        "chmod 666 plan.md && cat plan.md >/dev/null",
    );
    let (code, v) = u_cli(
        &u1,
        &m,
        Some(&alice),
        &["transfer", "--to", &bob, "plan.md"],
    );
    assert_eq!(code, Some(0), "{v}");
    let (errno, v) = u_ctl(&u2, &m, Some(&alice), "withdraw plan.md");
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "session_not_yours"), "{v}");
    assert!(live_record(&m, "plan.md").is_some(), "still live");
    // Nor write as alice's successor-to-be, nor transfer as alice.
    u_sh_ok(&u2, &m, Some(&alice), "cat plan.md >/dev/null");
    let (errno, v) = u_ctl(
        &u2,
        &m,
        Some(&alice),
        &format!("transfer --to {bob} plan.md"),
    );
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "session_not_yours"), "{v}");
    // The name is still u1's: alice's own withdraw works.
    let (code, v) = u_cli(&u1, &m, Some(&alice), &["withdraw", "plan.md"]);
    assert_eq!(code, Some(0), "{v}");
}

#[test]
fn a_session_name_stays_with_its_uid_across_a_restart() {
    let u1 = users::u1();
    let u2 = users::u2();
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let alice = unique("alice");
    {
        let r = Remount::start(base.path(), &[]);
        std::fs::set_permissions(&r.mnt, std::fs::Permissions::from_mode(0o777)).unwrap();
        u_sh_ok(&u1, &r, Some(&alice), "true > a");
        let mut r = r;
        r.stop_with(libc::SIGTERM);
    }
    let r = Remount::start(base.path(), &[]);
    let w: Value = serde_json::from_str(u_read(&u2, &r, Some(&alice), "whoami").trim()).unwrap();
    assert_eq!(w["session"], format!("uid:{}", u2.uid), "{w}");
    assert_eq!(w["via"]["owner"], u1.uid, "{w}");
}

#[test]
fn register_registers_only_the_callers_own_session() {
    let (u1, u2) = (users::u1(), users::u2());
    let m = open_mount(Mount::builder());
    let (alice, zed) = (unique("alice"), unique("zed"));
    // Unattributed: no name at all.
    let (errno, v) = u_ctl(&u1, &m, None, &format!("register {zed}"));
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "unattributed"), "{v}");
    // Another name than its own.
    let (errno, v) = u_ctl(&u1, &m, Some(&alice), &format!("register {zed}"));
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "session_not_yours"), "{v}");
    // Its own, by name or not.
    let (errno, v) = u_ctl(&u1, &m, Some(&alice), &format!("register {alice}"));
    assert_eq!(errno, 0, "{v}");
    // u2 cannot register alice.
    let (errno, v) = u_ctl(&u2, &m, Some(&alice), "register");
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "session_not_yours"), "{v}");
    let names = session_names(&m);
    assert!(names.contains(&alice), "{names:?}");
    assert!(!names.contains(&zed), "{names:?}");
}

// ---- verbs need the caller's own permission ---------------------------------------------

#[test]
fn the_second_user_cannot_withdraw_or_decline() {
    let (u1, u2) = (users::u1(), users::u2());
    let m = open_mount(Mount::builder());
    let (alice, bob, carol) = (unique("alice"), unique("bob"), unique("carol"));
    u_touch(&u2, &m, &carol);
    u_touch(&u1, &m, &bob);
    u_sh_ok(&u1, &m, Some(&alice), "echo a > a.md && echo b > b.md");
    let (code, v) = u_cli(
        &u1,
        &m,
        Some(&alice),
        &["transfer", "--to", &bob, "a.md", "b.md"],
    );
    assert_eq!(code, Some(0), "{v}");
    // carol (u2) is neither giver nor successor, nor their uid.
    for verb in ["withdraw", "decline", "accept"] {
        let (errno, v) = u_ctl(&u2, &m, Some(&carol), &format!("{verb} a.md"));
        assert_eq!(errno, libc::EACCES, "{verb}: {v}");
        assert!(refused(&v, "session_not_yours"), "{verb}: {v}");
    }
    // u2 posing as bob: not bob.
    let (errno, v) = u_ctl(&u2, &m, Some(&bob), "decline a.md");
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "session_not_yours"), "{v}");
    assert_eq!(live_record(&m, "a.md").unwrap()["status"], "pending");
    // The owners can.
    let (code, v) = u_cli(&u1, &m, Some(&bob), &["decline", "a.md"]);
    assert_eq!(code, Some(0), "{v}");
    let (code, v) = u_cli(&u1, &m, Some(&alice), &["withdraw", "b.md"]);
    assert_eq!(code, Some(0), "{v}");
}

#[test]
fn a_reader_cannot_transfer_a_file_it_cannot_write() {
    let (u1, u2) = (users::u1(), users::u2());
    let m = open_mount(Mount::builder());
    let (alice, bob, carol) = (unique("alice"), unique("bob"), unique("carol"));
    u_sh_ok(
        &u1,
        &m,
        Some(&alice),
        "echo mine > mine.md && chmod 644 mine.md",
    );
    u_touch(&u1, &m, &bob);
    // carol (u2) reads it (a view, so the transfer is not refused `handoff_not_held`).
    u_sh_ok(&u2, &m, Some(&carol), "cat mine.md >/dev/null");
    let (errno, v) = u_ctl(
        &u2,
        &m,
        Some(&carol),
        &format!("transfer --to {bob} mine.md"),
    );
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "session_not_yours"), "{v}");
    assert!(live_record(&m, "mine.md").is_none());
    // The owner's own transfer is not blocked by it (no `handoff_other_holder`).
    u_sh_ok(&u1, &m, Some(&alice), "cat mine.md >/dev/null");
    let (code, v) = u_cli(
        &u1,
        &m,
        Some(&alice),
        &["transfer", "--to", &bob, "mine.md"],
    );
    assert_eq!(code, Some(0), "{v}");
    // A file of the shared group is writable by u1 through its supplementary group.
    std::fs::write(m.at("team.md"), "t").unwrap();
    let gid = users::shared_gid();
    std::os::unix::fs::chown(m.at("team.md"), Some(0), Some(gid)).unwrap();
    std::fs::set_permissions(m.at("team.md"), std::fs::Permissions::from_mode(0o664)).unwrap();
    u_sh_ok(&u1, &m, Some(&alice), "cat team.md >/dev/null");
    let (code, v) = u_cli(
        &u1,
        &m,
        Some(&alice),
        &["transfer", "--to", &bob, "team.md"],
    );
    assert_eq!(code, Some(0), "{v}");
}

/// Issue 20: only a session whose owner could open the file for writing can be, or
/// become by claiming an offer, its successor (`session_not_yours`); an offer stays open
/// for a session that can, and a successor that cannot write declines instead.
#[test]
fn a_reader_cannot_claim_accept_or_be_handed_a_file_it_cannot_write() {
    let (u1, u2) = (users::u1(), users::u2());
    let m = open_mount(Mount::builder());
    let (alice, bob, carol) = (unique("alice"), unique("bob"), unique("carol"));
    u_sh_ok(
        &u1,
        &m,
        Some(&alice),
        "echo plan > plan.md && chmod 644 plan.md && echo t > t.md && chmod 666 t.md",
    );
    u_touch(&u1, &m, &bob);
    u_touch(&u2, &m, &carol);
    u_sh_ok(&u1, &m, Some(&alice), "cat plan.md t.md >/dev/null");
    let (code, v) = u_cli(
        &u1,
        &m,
        Some(&alice),
        &["transfer", "--to", "any", "plan.md"],
    );
    assert_eq!(code, Some(0), "{v}");
    // carol (u2) can read plan.md but not write it: she cannot claim the offer.
    assert!(u_read(&u2, &m, Some(&carol), "inbox").contains("plan.md"));
    let (errno, v) = u_ctl(&u2, &m, Some(&carol), "accept plan.md");
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "session_not_yours"), "{v}");
    assert!(
        v["message"].as_str().unwrap_or("").contains("stays open"),
        "{v}"
    );
    let r = live_record(&m, "plan.md").expect("still live");
    assert_eq!(r["successor"], "any", "{r}");
    // The offer stays open: bob (u1, who can write it) claims it.
    let (code, v) = u_cli(&u1, &m, Some(&bob), &["accept", "plan.md"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["records"][0]["claimed_by"], bob.as_str(), "{v}");

    // A transfer to a session whose uid cannot write the file: refused.
    let (code, v) = u_cli(&u1, &m, Some(&alice), &["transfer", "--to", &carol, "t.md"]);
    assert_eq!(code, Some(0), "t.md is 0666: carol can write it: {v}");
    let (code, v) = u_cli(&u1, &m, Some(&alice), &["withdraw", "t.md"]);
    assert_eq!(code, Some(0), "{v}");
    u_sh_ok(
        &u1,
        &m,
        Some(&alice),
        "echo more >> t.md && chmod 644 t.md && cat t.md >/dev/null",
    );
    let (errno, v) = u_ctl(
        &u1,
        &m,
        Some(&alice),
        &format!("transfer --to {carol} t.md"),
    );
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "session_not_yours"), "{v}");
    assert!(live_record(&m, "t.md").is_none());

    // A successor who lost the right to write after the transfer: accept is refused and
    // names decline, which works.
    u_sh_ok(
        &u1,
        &m,
        Some(&alice),
        "chmod 666 t.md && cat t.md >/dev/null",
    );
    let (code, v) = u_cli(&u1, &m, Some(&alice), &["transfer", "--to", &carol, "t.md"]);
    assert_eq!(code, Some(0), "{v}");
    std::fs::set_permissions(m.at("t.md"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let (errno, v) = u_ctl(&u2, &m, Some(&carol), "accept t.md");
    assert_eq!(errno, libc::EACCES, "{v}");
    assert!(refused(&v, "session_not_yours"), "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or("")
            .contains("coherent decline t.md"),
        "{v}"
    );
    let (errno, v) = u_ctl(&u2, &m, Some(&carol), "decline t.md");
    assert_eq!(errno, 0, "{v}");
    assert!(live_record(&m, "t.md").is_none());
}

// ---- what a caller may see ------------------------------------------------------------

#[test]
fn names_and_notes_show_only_to_callers_who_can_look_them_up() {
    let (u1, u2) = (users::u1(), users::u2());
    let m = open_mount(Mount::builder());
    let (alice, bob, carol) = (unique("alice"), unique("bob"), unique("carol"));
    const NOTE: &str = "secret-note-7f3a";
    u_touch(&u2, &m, &carol);
    u_touch(&u1, &m, &bob);
    u_sh_ok(
        &u1,
        &m,
        Some(&alice),
        "mkdir -m 700 private && echo s > private/hidden-name.md && cat private/hidden-name.md",
    );
    let (code, v) = u_cli(
        &u1,
        &m,
        Some(&alice),
        &[
            "transfer",
            "--to",
            &bob,
            "--note",
            NOTE,
            "private/hidden-name.md",
        ],
    );
    assert_eq!(code, Some(0), "{v}");
    // u2 sees neither the names nor the note, in any file.
    for f in ["status", "events", "inbox", "why"] {
        let text = u_read(&u2, &m, Some(&carol), f);
        assert!(
            !text.contains("hidden-name") && !text.contains("offer.md"),
            "{f}: {text}"
        );
        assert!(!text.contains(NOTE), "{f}: {text}");
    }
    let (_, v) = u_cli(&u2, &m, Some(&carol), &["status"]);
    assert!(!v.to_string().contains("hidden-name"), "{v}");
    // The owners see them.
    let text = u_read(&u1, &m, Some(&bob), "inbox");
    assert!(
        text.contains("hidden-name") && text.contains(NOTE),
        "{text}"
    );
    let text = u_read(&u1, &m, Some(&alice), "events");
    assert!(text.contains("hidden-name"), "{text}");
    assert!(std::fs::read_to_string(m.at(".coherent/status"))
        .unwrap()
        .contains("hidden-name"));
}

#[test]
fn status_of_a_private_path_is_no_oracle() {
    let (u1, u2) = (users::u1(), users::u2());
    let m = open_mount(Mount::builder());
    let (alice, carol) = (unique("alice"), unique("carol"));
    u_sh_ok(
        &u1,
        &m,
        Some(&alice),
        "mkdir -m 700 private && echo s > private/x",
    );
    let ask = |p: &str| {
        let (errno, v) = u_ctl(&u2, &m, Some(&carol), &format!("status {p}"));
        (errno, v.to_string().replace(p, "PATH"))
    };
    let existing = ask("private/x");
    let missing = ask("private/nope");
    assert_eq!(existing, missing);
    // ... and the same as a path that does not exist anywhere.
    assert_eq!(existing, ask("nodir/nope"));
    // The owner gets the version.
    let (_, v) = u_ctl(&u1, &m, Some(&alice), "status private/x");
    assert_eq!(v["status"]["version"], 1, "{v}");
    // And the xattr through the mount: u2 cannot even reach the path.
    let r = u_sh(
        &u2,
        &m,
        Some(&carol),
        "getfattr -n user.coherent.handoff private/x",
    );
    assert!(r.denied(), "{}", r.show());
}

// ---- nothing outside the volume ---------------------------------------------------------

#[test]
fn ctl_paths_through_a_symlink_to_root_are_outside() {
    assert!(
        Path::new("/root/.bashrc").exists(),
        "the test needs a host file"
    );
    let m = open_mount(Mount::builder());
    let u1 = users::u1();
    std::os::unix::fs::symlink("/root", m.at("to-root")).unwrap();
    std::os::unix::fs::symlink("../../../../../../../root", m.at("rel-root")).unwrap();
    let before = status(&m)["counts"]["paths"].as_u64().unwrap();
    let mut answers = Vec::new();
    for p in [
        "to-root/.bashrc",
        "to-root/no-such-file",
        "rel-root/.bashrc",
        "rel-root/no-such-file",
    ] {
        for who in [None, Some(&u1)] {
            let (errno, v) = match who {
                None => ctl(&m, Some("alice"), &format!("status {p}")),
                Some(u) => u_ctl(u, &m, Some("alice"), &format!("status {p}")),
            };
            assert_eq!(errno, libc::EINVAL, "{p}: {v}");
            assert!(refused(&v, "bad_request"), "{p}: {v}");
            assert!(
                v["message"]
                    .as_str()
                    .unwrap()
                    .contains("outside the volume"),
                "{v}"
            );
            answers.push(v.to_string().replace(p, "PATH"));
        }
    }
    answers.dedup();
    assert_eq!(answers.len(), 1, "{answers:#?}");
    // Transfer through it too, and nothing was added to memory.
    let (errno, v) = ctl(&m, Some("alice"), "transfer --to bob to-root/.bashrc");
    assert_eq!(errno, libc::EINVAL, "{v}");
    let after = status(&m)["counts"]["paths"].as_u64().unwrap();
    assert_eq!(before, after);
}

// ---- fence by inode -------------------------------------------------------------------

#[test]
fn a_hard_link_made_before_the_transfer_is_fenced_too() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(
        &m,
        Some("alice"),
        "echo v1 > f && ln f alias && cat f >/dev/null",
    );
    transfer(&m, "alice", "bob", &["f"]);
    let r = sh(&m, Some("alice"), "echo x >> alias");
    assert!(r.denied(), "through the other name: {}", r.show());
    // A bystander links and unlinks other names of the inode: not an external change.
    sh_ok(
        &m,
        Some("carol"),
        "ln f third && rm third && ln alias fourth",
    );
    let r = sh(&m, Some("alice"), "echo x >> f");
    assert!(r.denied(), "{}", r.show());
    let r = sh(&m, Some("alice"), "echo x >> alias");
    assert!(r.denied(), "{}", r.show());
    let rec = live_record(&m, "f").expect("still live");
    assert_eq!(rec["status"], "pending", "{rec}");
    assert!(events_of(&m, "external_change", "f", None).is_empty());
    // Removing the original's other name and renaming one through the mount neither.
    sh_ok(&m, Some("carol"), "rm alias && mv fourth fifth");
    let r = sh(&m, Some("alice"), "echo x >> fifth");
    assert!(r.denied(), "{}", r.show());
    assert_eq!(live_record(&m, "f").unwrap()["status"], "pending");
}

// ---- privileges -----------------------------------------------------------------------

/// `chown(f, -1, -1)` by a plain user changes no owner but removes set-user-ID,
/// set-group-ID and file capabilities, as a write would; the kernel leaves that to the
/// daemon (`FUSE_HANDLE_KILLPRIV_V2`) in a setattr with nothing else in it. A mode change
/// all the same: the fenced giver's is refused and the handed file keeps its bits.
fn chown_keep(u: &User, m: &impl Root, session: &str, file: &str) -> Run {
    u_sh(
        u,
        m,
        Some(session),
        &format!("python3 -c 'import os; os.chown(\"{file}\", -1, -1)'"),
    )
}

#[test]
fn a_fenced_giver_cannot_strip_the_handed_files_privileges() {
    let (u1, u2) = (users::u1(), users::u2());
    for passthrough in [true, false] {
        let m = open_mount(Mount::builder().passthrough(passthrough));
        let (alice, bob) = (unique("alice"), unique("bob"));
        let mode = |f: &str| {
            let md = std::fs::metadata(m.backing_path(f)).unwrap();
            md.permissions().mode() & 0o7777
        };
        for f in ["plan.md", "other.md"] {
            u_sh_ok(
                &u1,
                &m,
                Some(&alice),
                &format!("echo plan > {f} && chmod 6777 {f}"),
            );
        }
        // The same call on a file nobody handed on does remove them: the kernel does ask.
        let r = chown_keep(&u1, &m, &alice, "other.md");
        assert!(r.ok(), "{}", r.show());
        assert_eq!(mode("other.md"), 0o777, "passthrough {passthrough}");
        u_sh_ok(&u2, &m, Some(&bob), "cat plan.md >/dev/null");
        let (code, v) = u_cli(
            &u1,
            &m,
            Some(&alice),
            &["transfer", "--to", &bob, "plan.md"],
        );
        assert_eq!(code, Some(0), "{v}");
        let r = chown_keep(&u1, &m, &alice, "plan.md");
        assert!(r.denied(), "passthrough {passthrough}: {}", r.show());
        assert_eq!(mode("plan.md"), 0o6777, "passthrough {passthrough}");
        let d = events_of(&m, "denied", "plan.md", Some(&alice));
        assert_eq!(
            d.last().map(|e| e["route"].clone()),
            Some("setattr".into()),
            "{d:?}"
        );
        assert!(u_read(&u1, &m, Some(&alice), "why").contains("plan.md"));
        // Once bob declines, alice's call goes through.
        let (code, v) = u_cli(&u2, &m, Some(&bob), &["decline", "plan.md"]);
        assert_eq!(code, Some(0), "{v}");
        let r = chown_keep(&u1, &m, &alice, "plan.md");
        assert!(r.ok(), "{}", r.show());
        assert_eq!(mode("plan.md"), 0o777, "passthrough {passthrough}");
    }
}

// ---- in-place mount -------------------------------------------------------------------

#[test]
fn an_in_place_mount_warns_about_processes_already_inside() {
    use std::io::BufRead;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let mut inside = Command::new("sh")
        .args(["-c", "echo ready; exec sleep 600"])
        .current_dir(dir.join("sub"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(inside.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let state = t.path().join("state");
    let log = t.path().join("log");
    let mut daemon = Command::new(common::BIN)
        .arg(&dir)
        .arg("--state-dir")
        .arg(&state)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mounted = common::wait_until(common::TIMEOUT, || common::is_mounted(&dir));
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = Command::new("umount").arg(&dir).status();
    let _ = common::wait_child(&mut daemon, common::TIMEOUT);
    let _ = inside.kill();
    let _ = inside.wait();
    assert!(mounted, "{text}");
    // The name is sh's or, once it has exec'd, sleep's ("ready" comes before the exec).
    let want = format!("process {} (", inside.id());
    let line = text.lines().find(|l| l.contains(&want));
    assert!(
        line.is_some_and(|l| l.contains("has its working directory inside")),
        "{text}"
    );
}

#[test]
fn why_shows_no_path_its_reader_can_no_longer_look_up() {
    let u1 = users::u1();
    let m = open_mount(Mount::builder());
    let (alice, bob) = (unique("alice"), unique("bob"));
    u_touch(&u1, &m, &bob);
    u_sh_ok(
        &u1,
        &m,
        Some(&alice),
        "mkdir priv && echo s > priv/x && cat priv/x",
    );
    let (code, v) = u_cli(&u1, &m, Some(&alice), &["transfer", "--to", &bob, "priv/x"]);
    assert_eq!(code, Some(0), "{v}");
    let r = u_sh(&u1, &m, Some(&alice), "echo y >> priv/x");
    assert!(r.denied(), "{}", r.show());
    assert!(u_read(&u1, &m, Some(&alice), "why").contains("priv/x"));
    // The directory loses its search permission: the text names a path alice cannot
    // look up any more, so it is not shown.
    // The answer is the one for a session never refused.
    u_sh_ok(&u1, &m, Some(&alice), "chmod 600 priv");
    let why = u_read(&u1, &m, Some(&alice), "why");
    assert!(why.starts_with(::coherent::control::NO_REFUSAL), "{why}");
    assert!(!why.contains("priv"), "{why}");
    // Nor may a verb name it: the answer for a path that does not exist.
    let (code, v) = u_cli(&u1, &m, Some(&alice), &["withdraw", "priv/x"]);
    assert_ne!(code, Some(0), "{v}");
    assert!(refused(&v, "no_such_path"), "{v}");
    let (code, v) = u_cli(&u1, &m, Some(&alice), &["transfer", "--to", &bob, "priv/x"]);
    assert!(refused(&v, "no_such_path") && code != Some(0), "{v}");
}

/// The same through a cgroup: root runs a process of u2 in alice's `coherent run` cgroup
/// (where cgroup v2 is writable; else through the environment `coherent run` sets, which
/// the test says).
#[test]
fn another_uid_in_a_sessions_cgroup_is_not_that_session() {
    let (u1, u2) = (users::u1(), users::u2());
    let m = open_mount(Mount::builder());
    let alice = unique("calice");
    u_touch(&u1, &m, &alice);
    let uid = format!("--reuid={}", u2.uid);
    let gid = format!("--regid={}", u2.gid);
    let mut c = Command::new(CLI);
    c.args([
        "run",
        "--session",
        &alice,
        "--",
        "setpriv",
        &uid,
        &gid,
        "--init-groups",
    ])
    .args(["--", "cat", ".coherent/whoami"]);
    let r = run_in(&m.mnt, &[], &mut c);
    common::remove_session_cgroups(&alice, std::time::Duration::from_secs(5));
    assert!(r.ok(), "{}", r.show());
    let w: Value = serde_json::from_str(r.out.trim()).unwrap();
    assert_eq!(w["session"], format!("uid:{}", u2.uid), "{w}");
    assert_eq!(w["via"]["kind"], "not_yours", "{w}");
    assert_eq!(w["via"]["owner"], u1.uid, "{w}");
    if common::writable_cgroup2().is_none() {
        eprintln!("note: cgroup v2 is not writable here; the name came from the environment");
    }
}
