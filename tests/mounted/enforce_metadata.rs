//! Issue 29, item 2: a change behind the volume's back that leaves the handed content as it
//! was never ends a record (docs/versions-and-holds.md#content). A giver inside `coherent
//! run` may still change a backing file's metadata (Landlock does not cover it), and any
//! process of its uid outside may too: `touch -a`, `touch -m`, a same-mode `chmod`, an xattr
//! and a same-owner `chown` are restamped silently, the record stays live and the giver's
//! next write through the mount is still refused (`fenced`). A real rewrite of the content
//! (same size, other bytes, its mtime put back) still ends it as overtaken by `external`.

use crate::coherent;

use crate::common::wait_until;
use coherent::*;
use std::path::Path;
use std::process::Command;

/// Does this kernel enforce Landlock ABI >= 3 (what `coherent run` needs)?
fn landlock() -> bool {
    // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    let abi = unsafe { libc::syscall(444, std::ptr::null::<u8>(), 0usize, 1u32) };
    abi >= 3
}

/// The metadata routes of the issue, each a shell command on the backing file `{f}`.
const ROUTES: [(&str, &str); 5] = [
    ("touch -a", "touch -a {f}"),
    ("touch -m", "touch -m {f}"),
    ("same-mode chmod", "chmod $(stat -c %a {f}) {f}"),
    ("setfattr user.x", "setfattr -n user.x -v 1 {f}"),
    ("same-owner chown", "chown $(stat -c %u:%g {f}) {f}"),
];

/// The ctime of a backing file, in ns (each route must move it, or it proves nothing).
fn ctime(p: &Path) -> i128 {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap();
    m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128
}

/// `coherent run --session alice -- sh -c CMD` in the mount (Landlock on), with a scratch
/// directory as its only writable place outside the volume.
fn in_run(m: &Vol, scratch: &Path, cmd: &str) -> Run {
    let mut c = Command::new(CLI);
    c.args(["run", "--session", "alice", "--", "sh", "-c", cmd]);
    let w = scratch.display().to_string();
    run_in(m.root(), &[("COHERENT_RUN_WRITABLE", w.as_str())], &mut c)
}

/// `f`, handed from alice to bob: its record is live, pending.
fn handed(m: &impl Root, f: &str) {
    sh_ok(
        m,
        Some("alice"),
        &format!("echo plan > {f}; cat {f} >/dev/null"),
    );
    transfer(m, "alice", "bob", &[f]);
    let rec = live_record(m, f).unwrap_or_else(|| panic!("{f}: no live record"));
    assert_eq!(rec["status"], "pending", "{rec}");
}

/// After a metadata route on `f`: the record is still live and pending, no change was
/// counted, the version is the one handed, and `.coherent/why` names the handoff.
fn still_fenced(m: &impl Root, f: &str, route: &str) {
    let rec = live_record(m, f)
        .unwrap_or_else(|| panic!("{route} on {f}: the record ended: {:?}", record(m, f)));
    assert_eq!(rec["status"], "pending", "{route} on {f}: {rec}");
    assert!(
        events_of(m, "external_change", f, None).is_empty(),
        "{route} on {f} was counted as a change"
    );
    assert_eq!(version(m, f), Some(1), "{route} on {f}: the version moved");
    if let Some(bad) = check_deny_text(&why(m, Some("alice")), f, "bob", 1) {
        panic!("{route} on {f}: {bad}");
    }
}

/// Every route on a file of its own, run from outside `coherent run` (`inside` false: a
/// process of the giver's uid in the backing directory) or from inside it (Landlock on;
/// the giver's append through the mount runs in the same sandboxed shell).
fn metadata_routes_keep_the_fence(passthrough: bool, inside: bool) {
    if inside && !landlock() {
        eprintln!("SKIP: this kernel has no Landlock ABI >= 3 (`coherent run` needs it)");
        return;
    }
    let m = mount(passthrough);
    touch_session(&m, "bob");
    let scratch = tempfile::Builder::new()
        .prefix("coherent-scratch-")
        .tempdir_in("/var/tmp")
        .unwrap();
    for (i, (route, cmd)) in ROUTES.iter().enumerate() {
        let f = format!("f{i}.md");
        handed(&m, &f);
        let b = m.backing_path(&f);
        let cmd = cmd.replace("{f}", &b.display().to_string());
        let before = ctime(&b);
        if inside {
            // The route is allowed (Landlock does not cover metadata); the giver's
            // append through the mount right after it is refused.
            let denied = events_of(&m, "denied", &f, Some("alice")).len();
            let script = format!(
                "{cmd} || {{ echo ROUTE-FAILED; exit 9; }}; \
                 if echo EVIL >> {f}; then echo WROTE; else echo REFUSED; fi"
            );
            let r = in_run(&m, scratch.path(), &script);
            assert!(
                r.ok() && r.out.contains("REFUSED") && !r.out.contains("WROTE"),
                "{route} inside `coherent run`: {}",
                r.show()
            );
            assert!(r.err.contains("Permission denied"), "{route}: {}", r.show());
            let d = await_events(&m, "denied", &f, Some("alice"), denied + 1);
            assert_eq!(d[denied]["reason"], "fenced", "{route}: {}", d[denied]);
        } else {
            let r = sh(&m, Some("alice"), &cmd);
            assert!(r.ok(), "{route}: {}", r.show());
            sh_refused(&m, "alice", &format!("echo EVIL >> {f}"), &f, "fenced");
        }
        assert_ne!(ctime(&b), before, "{route} did not change the file's ctime");
        still_fenced(&m, &f, route);
        // Read by the successor too: still the same record (a read ends nothing).
        sh_ok(&m, Some("bob"), &format!("cat {f} >/dev/null"));
        still_fenced(&m, &f, route);
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "plan\n", "{route}");
    }
    // The daemon says why it counted nothing.
    // (The content is judged off the request threads: the line may follow the reads.)
    assert!(
        wait_until(SETTLE, || m.log().contains("its content is the same")),
        "no restamp line in the daemon's log:\n{}",
        m.log()
    );
}

#[test]
fn metadata_changes_behind_the_volume_never_lift_a_fence() {
    metadata_routes_keep_the_fence(true, false);
}

#[test]
fn metadata_changes_behind_the_volume_never_lift_a_fence_without_passthrough() {
    metadata_routes_keep_the_fence(false, false);
}

#[test]
fn metadata_changes_from_inside_coherent_run_never_lift_a_fence() {
    metadata_routes_keep_the_fence(true, true);
}

#[test]
fn metadata_changes_from_inside_coherent_run_never_lift_a_fence_without_passthrough() {
    metadata_routes_keep_the_fence(false, true);
}

#[test]
fn a_same_size_rewrite_with_its_mtime_put_back_still_ends_the_record() {
    let m = mount(true);
    touch_session(&m, "bob");
    handed(&m, "plan.md");
    let b = m.backing_path("plan.md").display().to_string();
    // Other bytes, the same size, and the mtime as it was: only the content tells.
    sh_ok(
        &m,
        None,
        &format!("t=$(stat -c %y {b}); printf 'PLAN\\n' > {b}; touch -m -d \"$t\" {b}"),
    );
    sh_ok(&m, Some("bob"), "cat plan.md >/dev/null");
    let ev = await_events(&m, "external_change", "plan.md", None, 1);
    assert!(!ev.is_empty(), "the rewrite was not counted:\n{}", m.log());
    assert_eq!(ev[0]["version"], 2, "{}", ev[0]);
    let rec = record(&m, "plan.md").expect("a record");
    assert_eq!(rec["status"], "overtaken", "{rec}");
    assert_eq!(rec["counterparty"], "external", "{rec}");
    assert_eq!(rec["live"], false, "{rec}");
    // The version moved: the fence lifted (as for any change behind the volume's back).
    sh_ok(&m, Some("alice"), "echo alice >> plan.md");
}

/// The handed content's fingerprint is in the state log with the transfer: after a crash
/// or a clean stop of the daemon, a metadata change behind the volume still ends nothing.
#[test]
fn the_handed_fingerprint_survives_a_restart() {
    for sig in [libc::SIGKILL, libc::SIGTERM] {
        let dir = tempfile::Builder::new()
            .prefix("coherent-fp-")
            .tempdir()
            .unwrap();
        let base = dir.path().canonicalize().unwrap();
        let mut m = Remount::start(&base, &[]);
        touch_session(&m, "bob");
        handed(&m, "plan.md");
        m.stop_with(sig);
        drop(m);
        let m = Remount::start(&base, &[]);
        let b = m.backing.join("plan.md").display().to_string();
        sh_ok(
            &m,
            None,
            &format!("touch -m {b}; chmod $(stat -c %a {b}) {b}"),
        );
        sh_refused(&m, "alice", "echo EVIL >> plan.md", "plan.md", "fenced");
        still_fenced(&m, "plan.md", &format!("touch -m after signal {sig}"));
    }
}
