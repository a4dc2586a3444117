//! End-to-end checks of the wiring (src/volume.rs) on a real mount with real shells: the
//! fence and `why`, the in-flight race of an asynchronous RELEASE against a real open
//! descriptor, `tail -f` on `.coherent/events`, reclaim of a killed session, the read-only
//! control directory and persistence across a restart and a `kill -9`. The full
//! enforcement suite is `tests/enforce_*.rs`.

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{mount_fstype, run_timeout, wait_child, wait_until, Mount, Remount, BIN, TIMEOUT};

use crate::common::CLI;

fn path_with_cli() -> String {
    let dir = Path::new(CLI).parent().unwrap();
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// `sh -c CMD` in `dir` as session `who` (None: unattributed), with `coherent` on PATH.
fn sh_in(dir: &Path, who: Option<&str>, cmd: &str) -> Output {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .env("PATH", path_with_cli())
        .env_remove("COHERENT_SESSION")
        .env_remove("CLAUDE_CODE_SESSION_ID");
    if let Some(w) = who {
        c.env("COHERENT_SESSION", w);
    }
    run_timeout(&mut c, Duration::from_secs(60))
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn version(p: &Path) -> Option<u64> {
    xattr(p, "user.coherent.version").map(|v| String::from_utf8(v).unwrap().parse().unwrap())
}

fn xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

fn events(m: &Path) -> String {
    std::fs::read_to_string(m.join(".coherent/events")).unwrap()
}

fn has_event(m: &Path, event: &str, session: &str) -> bool {
    events(m).lines().any(|l| {
        l.contains(&format!("\"event\":\"{event}\""))
            && l.contains(&format!("\"session\":\"{session}\""))
    })
}

fn state_mount(state: &Path) -> Mount {
    Mount::builder()
        .arg("--state-dir")
        .arg(state.to_str().unwrap())
        .start()
}

/// alice reads and writes plan.md, bob registers, alice hands it to bob.
fn handed_to_bob(m: &Path) {
    std::fs::write(m.join("plan.md"), "v1\n").unwrap();
    ok(&sh_in(
        m,
        Some("bob"),
        "coherent whoami && echo register > .coherent/ctl",
    ));
    ok(&sh_in(
        m,
        Some("alice"),
        "cat plan.md >/dev/null && echo alice >> plan.md && coherent transfer --to bob plan.md",
    ));
}

#[test]
fn fenced_giver_reads_why_and_successor_completes() {
    let state = tempfile::tempdir().unwrap();
    let mount = state_mount(state.path());
    let m = mount.mnt.as_path();
    handed_to_bob(m);
    let p = m.join("plan.md");
    let v = version(&p).unwrap();
    assert_eq!(v, 2, "write after create: v1 then v2");
    let before = std::fs::read(&p).unwrap();
    for cmd in [
        "echo x >> plan.md",
        "echo x > plan.md",
        "sed -i s/v1/v9/ plan.md",
        "cp /etc/hostname plan.md",
        "rm plan.md",
        "mv plan.md other.md",
        "chmod 600 plan.md",
        "truncate -s 0 plan.md",
        "sh -c 'echo child >> plan.md'",
    ] {
        let o = sh_in(m, Some("alice"), cmd);
        assert!(!o.status.success(), "`{cmd}` by the fenced giver succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("ermission denied"), "`{cmd}`: {err}");
    }
    assert_eq!(std::fs::read(&p).unwrap(), before);
    assert_eq!(version(&p), Some(v));
    let why = ok(&sh_in(m, Some("alice"), "cat .coherent/why"));
    assert!(why.contains("bob") && why.contains("v2") && why.contains("coherent withdraw plan.md"));
    assert!(why.ends_with('\n'));
    // Reads are never refused.
    assert_eq!(
        ok(&sh_in(m, Some("alice"), "cat plan.md")).as_bytes(),
        before
    );
    // The successor's view of the record, then its write completes it.
    let h = String::from_utf8(xattr(&p, "user.coherent.handoff").unwrap()).unwrap();
    assert!(h.contains("\"role\":\"bystander\""), "{h}");
    let inbox = ok(&sh_in(m, Some("bob"), "cat .coherent/inbox"));
    assert!(inbox.contains("\"path\":\"plan.md\""), "{inbox}");
    ok(&sh_in(m, Some("bob"), "echo bob >> plan.md"));
    assert_eq!(version(&p), Some(v + 1));
    let st = ok(&sh_in(m, Some("bob"), "coherent --json status plan.md"));
    assert!(st.contains("\"completed\""), "{st}");
    assert!(xattr(&p, "user.coherent.handoff").is_none());
    ok(&sh_in(
        m,
        Some("alice"),
        "cat plan.md >/dev/null; echo back >> plan.md",
    ));
    assert_eq!(version(&p), Some(v + 2));
}

#[test]
fn release_race_waits_but_an_open_descriptor_is_in_flight() {
    let state = tempfile::tempdir().unwrap();
    let mount = state_mount(state.path());
    let m = mount.mnt.as_path();
    handed_to_bob(m);
    ok(&sh_in(m, Some("alice"), "coherent withdraw plan.md"));
    // The write's RELEASE may arrive after the transfer: it must not be refused.
    for i in 0..20 {
        let o = sh_in(
            m,
            Some("alice"),
            &format!(
                "echo {i} >> plan.md && coherent transfer --to bob plan.md && coherent withdraw plan.md"
            ),
        );
        ok(&o);
    }
    // A descriptor really open for writing: refused at once with handoff_in_flight (EBUSY).
    let o = sh_in(
        m,
        Some("alice"),
        "exec 3>>plan.md; echo y >&3; coherent --json transfer --to bob plan.md; echo rc=$?",
    );
    let out = ok(&o);
    assert!(
        out.contains("handoff_in_flight") && out.contains("rc=2"),
        "{out}"
    );
    let o = sh_in(
        m,
        Some("alice"),
        "exec 3>>plan.md; python3 -c \"import os, errno
try:
    os.write(os.open('.coherent/ctl', os.O_WRONLY), b'transfer --to bob plan.md')
except OSError as e:
    print(errno.errorcode[e.errno])\"",
    );
    assert_eq!(ok(&o).trim(), "EBUSY");
}

#[test]
fn tail_f_follows_events() {
    let state = tempfile::tempdir().unwrap();
    let mount = state_mount(state.path());
    let m = mount.mnt.clone();
    // An event before tail starts: its first line shows tail has the log open.
    ok(&sh_in(
        &m,
        Some("before-tail"),
        "echo register > .coherent/ctl",
    ));
    let mut tail = Command::new("tail")
        .args(["-n", "+1", "-f", ".coherent/events"])
        .current_dir(&m)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = tail.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(10));
    assert!(first.is_ok(), "tail -f printed nothing of the log");
    ok(&sh_in(
        &m,
        Some("tailed-session"),
        "echo register > .coherent/ctl",
    ));
    let got = std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(10)).ok())
        .find(|l| l.contains("tailed-session"));
    let _ = tail.kill();
    let _ = tail.wait();
    let _ = reader.join();
    let line = got.expect("tail -f showed no new event");
    assert!(
        line.contains("session_seen") && line.contains("tailed-session"),
        "{line}"
    );
}

#[test]
fn killed_writer_is_reclaimed_not_released() {
    let state = tempfile::tempdir().unwrap();
    let mount = state_mount(state.path());
    let m = mount.mnt.clone();
    std::fs::write(m.join("f"), "x").unwrap();
    // Session names are host-wide: other suites running at the same time must not keep
    // "our" session alive.
    let carol = format!("carol-{}", std::process::id());
    let carol = carol.as_str();
    let mut c = Command::new("sh")
        .args(["-c", "exec 3>>f; echo ready; exec sleep 60"])
        .current_dir(&m)
        .env("COHERENT_SESSION", carol)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut b = [0u8; 6];
    c.stdout.as_mut().unwrap().read_exact(&mut b).unwrap();
    let acquired = wait_until(TIMEOUT, || has_event(&m, "acquire", carol));
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    wait_child(&mut c, TIMEOUT);
    assert!(acquired, "{}", events(&m));
    assert!(
        wait_until(TIMEOUT, || has_event(&m, "reclaim", carol)),
        "{}",
        events(&m)
    );
    assert!(!has_event(&m, "release", carol));
    // A close of an unchanged write handle is a release, even when the closer exits
    // before the (asynchronous) RELEASE arrives.
    let (dave, erin) = (
        format!("dave-{}", std::process::id()),
        format!("erin-{}", std::process::id()),
    );
    // The shell stays alive until the daemon logged the release (fails after 10 s).
    let until_released = r#"n=0; until grep -q "\"release\".*\"$COHERENT_SESSION\"" .coherent/events || [ $n -ge 1000 ]; do n=$((n+1)); sleep 0.01; done; [ $n -lt 1000 ]"#;
    for (who, open) in [
        (dave.as_str(), "exec 3>>f; exec 3>&-"),
        (erin.as_str(), ": >> f"),
    ] {
        ok(&sh_in(&m, Some(who), &format!("{open}; {until_released}")));
        assert!(
            wait_until(TIMEOUT, || has_event(&m, "release", who)),
            "{who}"
        );
        assert!(!has_event(&m, "reclaim", who), "{who}: {}", events(&m));
    }
}

#[test]
fn one_commit_per_change_and_no_second_name_for_a_fenced_file() {
    let state = tempfile::tempdir().unwrap();
    let mount = state_mount(state.path());
    let m = mount.mnt.as_path();
    let p = m.join("plan.md");
    std::fs::write(&p, "old content\n").unwrap();
    assert_eq!(version(&p), Some(1));
    // The shell closes a duplicate of the descriptor before writing: still one commit.
    ok(&sh_in(m, Some("alice"), "echo new > plan.md"));
    assert_eq!(version(&p), Some(2));
    ok(&sh_in(
        m,
        Some("alice"),
        "printf x | dd of=plan.md 2>/dev/null",
    ));
    assert_eq!(version(&p), Some(3));
    ok(&sh_in(m, Some("alice"), ": > plan.md"));
    assert_eq!(version(&p), Some(4));
    ok(&sh_in(
        m,
        Some("alice"),
        "echo more >> plan.md; cat plan.md",
    ));
    assert_eq!(version(&p), Some(5));
    // A fenced giver may not hard-link the file it handed on (the new name would bypass
    // the fence); a bystander may.
    ok(&sh_in(m, Some("bob"), "echo register > .coherent/ctl"));
    ok(&sh_in(
        m,
        Some("alice"),
        "coherent transfer --to bob plan.md",
    ));
    let o = sh_in(m, Some("alice"), "ln plan.md alias");
    assert!(!o.status.success());
    assert!(!m.join("alias").exists());
    ok(&sh_in(m, Some("carol"), "ln plan.md alias2"));
}

#[test]
fn control_directory_is_read_only_and_xattrs_are_computed() {
    let state = tempfile::tempdir().unwrap();
    let mount = state_mount(state.path());
    let m = mount.mnt.as_path();
    std::fs::write(m.join("a"), "x").unwrap();
    for cmd in [
        "rm -f .coherent/status",
        "rm -rf .coherent",
        "mv .coherent x",
        "mv a .coherent/a",
        "chmod 777 .coherent",
        "chmod 777 .coherent/ctl",
        "touch .coherent/new",
        "mkdir .coherent/d",
        "mkdir .coherent",
        "echo x > .coherent/status",
        "setfattr -n user.coherent.version -v 9 a",
        "setfattr -x user.coherent.version a",
    ] {
        let o = sh_in(m, Some("eve"), cmd);
        assert!(!o.status.success(), "`{cmd}` succeeded");
    }
    assert!(m.join(".coherent/ctl").exists());
    assert_eq!(version(&m.join("a")), Some(1));
    // Other xattrs pass through; listxattr does not list the computed names
    // (docs/design.md#control-surface: copies must not carry them), which stay readable by name.
    ok(&sh_in(m, Some("eve"), "setfattr -n user.note -v hi a"));
    let list = ok(&sh_in(m, Some("eve"), "getfattr -d -m - a"));
    assert!(
        list.contains("user.note=\"hi\"") && !list.contains("user.coherent."),
        "{list}"
    );
    let named = ok(&sh_in(
        m,
        Some("eve"),
        "getfattr -n user.coherent.version a",
    ));
    assert!(named.contains("user.coherent.version=\"1\""), "{named}");
    assert!(xattr(&m.join("a"), "user.coherent.handoff").is_none());
    // A backing .coherent is hidden behind the virtual one.
    let who = ok(&sh_in(m, Some("eve"), "cat .coherent/whoami"));
    assert!(who.contains("\"session\":\"eve\""), "{who}");
}

#[test]
fn handoff_survives_restart_and_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut vol = Remount::start(dir.path(), &[]);
    let (b, mnt, st) = (vol.backing.clone(), vol.mnt.clone(), vol.state.clone());
    handed_to_bob(&mnt);
    let v = version(&mnt.join("plan.md")).unwrap();

    // A second daemon on the same state directory is refused before mounting.
    let other = tempfile::tempdir().unwrap();
    let o = run_timeout(
        Command::new(BIN)
            .arg(&b)
            .arg(other.path())
            .arg("--state-dir")
            .arg(&st),
        TIMEOUT,
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("in use"));
    assert!(mount_fstype(other.path()).is_none());

    for kill in [libc::SIGTERM, libc::SIGKILL] {
        vol.stop_with(kill);
        // stopped: dropping it unmounts nothing, so the next daemon may take the mount point
        drop(vol);
        vol = Remount::start(dir.path(), &[]);
        assert_eq!(version(&mnt.join("plan.md")), Some(v));
        let o = sh_in(&mnt, Some("alice"), "echo again >> plan.md");
        assert!(
            !o.status.success(),
            "giver not fenced after restart ({kill})"
        );
        let h = ok(&sh_in(&mnt, Some("bob"), "cat .coherent/inbox"));
        assert!(h.contains("\"live\":true"), "{h}");
    }
    drop(vol);
}
