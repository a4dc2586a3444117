//! Issue 29, items 4 and 8: the root daemon's own files. A state directory or log file on a
//! path another user could change (a directory of coh-u1's on the way, where it plants a
//! symlink to a root file or directory) is refused before anything is mounted, in one line
//! that names the component; the state directory and the log file themselves are never
//! opened through a symlink; and a log file that cannot be opened fails the mount at once
//! instead of leaving a detached daemon on the caller's stdout.

use crate::common;

use common::{is_mounted, lazy_umount, users, BIN};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A scratch tree: `b` (backing), `m` (mountpoint), `victim` (root's, 0755, with a file
/// `keep`), and `u1` (a directory coh-u1 owns, where it plants what it likes).
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::Builder::new()
            .prefix("coherent-paths-")
            .tempdir()
            .unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        for d in ["b", "m", "victim", "u1"] {
            fs::create_dir(dir.path().join(d)).unwrap();
        }
        fs::set_permissions(dir.path().join("victim"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(dir.path().join("victim/keep"), "root's\n").unwrap();
        let u1 = users::u1();
        std::os::unix::fs::chown(dir.path().join("u1"), Some(u1.uid), Some(u1.gid)).unwrap();
        Tree { dir }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    /// coh-u1 runs `cmd` in its directory.
    fn as_u1(&self, cmd: &str) {
        users::u1().sh_ok(&self.p("u1"), &[], cmd);
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let m = self.p("m");
        if is_mounted(&m) {
            lazy_umount(&m);
        }
    }
}

/// `coherent-mount ARGS` (foreground unless `--daemon` is among them): its exit code and
/// stderr, or None when it did not let go of its stdout within 20 s (a daemon holding it).
fn mount(args: &[&str]) -> Option<(Option<i32>, String)> {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    std::thread::spawn(move || {
        use std::io::Read;
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let _ = out.read_to_end(&mut o);
        let _ = err.read_to_end(&mut e);
        let _ = tx.send(String::from_utf8_lossy(&e).into_owned());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(stderr) => Some((child.wait().unwrap().code(), stderr)),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Refused: exit 1, one line on stderr that says `says` and names `component`; nothing
/// mounted; root's directory and file as they were.
fn assert_refused(t: &Tree, got: Option<(Option<i32>, String)>, says: &str, component: &Path) {
    let (code, err) = got.expect("coherent-mount let go of its stdout");
    assert_eq!(code, Some(1), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("coherent-mount:"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(says), "{err}");
    assert!(
        lines[0].contains(&format!("{} ", component.display())),
        "names {}: {err}",
        component.display()
    );
    assert!(!is_mounted(&t.p("m")), "mounted anyway: {err}");
    let victim = fs::metadata(t.p("victim")).unwrap();
    assert_eq!(
        victim.mode() & 0o7777,
        0o755,
        "root's directory was chmodded"
    );
    let mut names: Vec<_> = fs::read_dir(t.p("victim"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["keep"], "state written into root's directory");
    assert_eq!(fs::read_to_string(t.p("victim/keep")).unwrap(), "root's\n");
}

#[test]
fn a_state_dir_or_log_file_another_user_could_redirect_is_refused_by_name() {
    let t = Tree::new();
    let u1 = t.p("u1");
    let (b, m) = (s(&t.p("b")), s(&t.p("m")));
    // coh-u1 points the state directory root named at root's directory
    t.as_u1(&format!("ln -s {} state", s(&t.p("victim"))));
    let state = s(&t.p("u1/state"));
    assert_refused(
        &t,
        mount(&[&b, &m, "--state-dir", &state]),
        &format!(
            "refusing the state directory {state}: {} is owned by uid",
            s(&u1)
        ),
        &u1,
    );
    // ... and before it plants anything: the path is coh-u1's to change at any time
    let later = s(&t.p("u1/later"));
    assert_refused(
        &t,
        mount(&[&b, &m, "--state-dir", &later]),
        "is owned by uid",
        &u1,
    );
    // the log file: a symlink of coh-u1's to root's file
    t.as_u1(&format!("ln -s {} log", s(&t.p("victim/keep"))));
    let log = s(&t.p("u1/log"));
    let own_state = s(&t.p("state"));
    assert_refused(
        &t,
        mount(&[&b, &m, "--state-dir", &own_state, "--log-file", &log]),
        &format!("cannot log to {log}: {} is owned by uid", s(&u1)),
        &u1,
    );
    // a directory its group can write (root's, but coh-shared may replace entries)
    let gw = t.p("gw");
    fs::create_dir(&gw).unwrap();
    std::os::unix::fs::chown(&gw, Some(0), Some(users::shared_gid())).unwrap();
    fs::set_permissions(&gw, fs::Permissions::from_mode(0o775)).unwrap();
    assert_refused(
        &t,
        mount(&[&b, &m, "--state-dir", &s(&gw.join("state"))]),
        "can be written by its group (mode 775)",
        &gw,
    );
}

#[test]
fn the_state_dir_and_log_file_are_never_opened_through_a_symlink() {
    let t = Tree::new();
    let (b, m) = (s(&t.p("b")), s(&t.p("m")));
    // root's own symlinks, on a path only root can change: still not followed
    std::os::unix::fs::symlink(t.p("victim"), t.p("state-link")).unwrap();
    let got = mount(&[&b, &m, "--state-dir", &s(&t.p("state-link"))]);
    let (code, err) = got.expect("let go of stdout");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "refusing the state directory {}: it is a symlink",
            s(&t.p("state-link"))
        )),
        "{err}"
    );
    std::os::unix::fs::symlink(t.p("victim/keep"), t.p("log-link")).unwrap();
    let got = mount(&[
        &b,
        &m,
        "--state-dir",
        &s(&t.p("state")),
        "--log-file",
        &s(&t.p("log-link")),
    ]);
    let (code, err) = got.expect("let go of stdout");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("log-link is a symlink"), "{err}");
    assert!(!is_mounted(&t.p("m")));
    assert_eq!(fs::read_to_string(t.p("victim/keep")).unwrap(), "root's\n");
    assert_eq!(fs::metadata(t.p("victim")).unwrap().mode() & 0o7777, 0o755);
}

/// Item 8: `--daemon` (what mount(8)'s helper runs) with a log file it cannot open fails
/// at once, saying why, and lets go of the caller's stdout; with a good one it detaches.
#[test]
fn a_log_file_that_cannot_be_opened_fails_the_mount_and_lets_go_of_stdout() {
    let t = Tree::new();
    let (b, m) = (s(&t.p("b")), s(&t.p("m")));
    let state = s(&t.p("state"));
    let missing = s(&t.p("no/such/dir/coherent.log"));
    let got = mount(&[
        &b,
        &m,
        "--daemon",
        "--state-dir",
        &state,
        "--log-file",
        &missing,
    ]);
    let (code, err) = got.expect("the daemon kept the caller's stdout");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot log to {missing}: ")) && err.contains("No such file"),
        "{err}"
    );
    assert!(!is_mounted(&t.p("m")));
    // a good one: mounted, detached, logging there
    let log = s(&t.p("coherent.log"));
    let got = mount(&[
        &b,
        &m,
        "--daemon",
        "--state-dir",
        &state,
        "--log-file",
        &log,
    ]);
    let (code, err) = got.expect("the daemon kept the caller's stdout");
    assert_eq!(code, Some(0), "{err}");
    assert!(is_mounted(&t.p("m")));
    let md = fs::metadata(&log).unwrap();
    assert_eq!(md.mode() & 0o777, 0o600);
    assert!(fs::read_to_string(&log)
        .unwrap()
        .contains("mounted and ready"));
    let st = Command::new("umount").arg(&m).status().unwrap();
    assert!(st.success());
}
