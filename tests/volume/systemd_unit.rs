//! The systemd unit `packaging/coherent-mount@.service`: its `ExecStart` as systemd runs
//! it (`Type=notify`: `READY=1` only once the mount answers; `KillSignal` unmounts
//! cleanly), `systemd-analyze verify` where that tool is installed, and the real
//! `systemctl start`/`stop` where systemd is PID 1. Where it is not, the test says so
//! plainly and runs the unit's command line under a notify socket of its own.

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{is_mounted, lazy_umount, run_timeout, wait_child, BIN, TIMEOUT};

const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/packaging/coherent-mount@.service"
);

fn unit_text() -> String {
    std::fs::read_to_string(UNIT).expect("the unit file")
}

/// `KEY=` of the [Service] section.
fn service_key(key: &str) -> Option<String> {
    let text = unit_text();
    let mut in_service = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service {
            if let Some(v) = line.strip_prefix(&format!("{key}=")) {
                return Some(v.to_string());
            }
        }
    }
    None
}

/// `ExecStart` expanded as systemd would for instance path `mnt`: `${VAR}` one word,
/// `$VAR` split at whitespace (zero or more words), `%f` the instance as a path; the
/// installed binary replaced by the one under test.
fn exec_start(mnt: &Path, env: &[(&str, &str)]) -> Vec<String> {
    let line = service_key("ExecStart").expect("ExecStart");
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    };
    let mut out = Vec::new();
    for word in line.split_whitespace() {
        if word == "/usr/bin/coherent-mount" {
            out.push(BIN.to_string());
        } else if word == "%f" {
            out.push(mnt.display().to_string());
        } else if let Some(name) = word.strip_prefix("${").and_then(|w| w.strip_suffix('}')) {
            out.push(var(name).unwrap_or_default());
        } else if let Some(name) = word.strip_prefix('$') {
            out.extend(
                var(name)
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(String::from),
            );
        } else {
            assert!(
                !word.contains('%') && !word.contains('$'),
                "unexpanded {word}"
            );
            out.push(word.to_string());
        }
    }
    out
}

/// A notice in the test run's own output, passed or not (the test harness keeps what
/// `eprintln!` prints for failures only): what could not be run here is said plainly.
fn say(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "systemd_unit: NOTE: {what}");
}

#[test]
fn unit_declares_notify_readiness_and_a_clean_stop() {
    assert_eq!(service_key("Type").as_deref(), Some("notify"));
    assert_eq!(service_key("KillSignal").as_deref(), Some("SIGTERM"));
    assert_eq!(service_key("StateDirectoryMode").as_deref(), Some("0700"));
    let exec = service_key("ExecStart").unwrap();
    assert!(
        !exec.contains("--daemon"),
        "systemd keeps the process: {exec}"
    );
}

/// The unit's command line, started as systemd starts a `Type=notify` service: READY=1
/// arrives when, and only when, the volume answers; SIGTERM unmounts and exits 0.
#[test]
fn exec_start_tells_ready_once_usable_and_stops_cleanly_on_the_kill_signal() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().canonicalize().unwrap();
    let (mnt, backing, state) = (d.join("work"), d.join("backing"), d.join("state"));
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&backing).unwrap();
    std::fs::write(backing.join("plan.md"), b"plan\n").unwrap();
    let sock_path = d.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    let state_s = state.display().to_string();
    let backing_s = backing.display().to_string();
    let argv = exec_start(
        &mnt,
        &[
            ("STATE_DIRECTORY", &state_s),
            ("COHERENT_MOUNT_OPTS", "--stale strict --evict-after 2d"),
            ("COHERENT_BACKING", &backing_s),
        ],
    );
    let log = d.join("log");
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // A failed assertion below must not leave the daemon and its mount behind.
    struct Daemon(std::process::Child, PathBuf);
    impl Drop for Daemon {
        fn drop(&mut self) {
            if self.0.try_wait().ok().flatten().is_none() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
            if is_mounted(&self.1) {
                lazy_umount(&self.1);
            }
        }
    }
    let mut child = Daemon(child, mnt.clone());
    let mut buf = [0u8; 256];
    let got = sock.recv(&mut buf);
    // At the moment of READY=1 the mount must already answer: no waiting here.
    let mounted_at_ready = is_mounted(&mnt) && mnt.join(".coherent/ctl").exists();
    let msg = got.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned());
    let logtext = || std::fs::read_to_string(&log).unwrap_or_default();
    // The datagram is newline-separated assignments, as systemd reads them.
    assert!(
        msg.as_deref()
            .is_ok_and(|m| m.lines().any(|l| l == "READY=1")),
        "{msg:?}\n{}",
        logtext()
    );
    assert!(
        mounted_at_ready,
        "READY=1 came before the mount answered\n{}",
        logtext()
    );
    assert_eq!(std::fs::read(mnt.join("plan.md")).unwrap(), b"plan\n");
    assert!(logtext().contains("stale=Strict"), "{}", logtext());
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let st = wait_child(&mut child.0, TIMEOUT).expect("stopped on SIGTERM");
    assert!(st.success(), "{st:?}\n{}", logtext());
    assert!(!is_mounted(&mnt));
    assert!(logtext().contains("unmounted, exiting"), "{}", logtext());
}

#[test]
fn systemd_tools_accept_and_run_the_unit_where_present() {
    // systemd-analyze verify: the unit's syntax and its ExecStart binary.
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        let dir = tempfile::tempdir().unwrap();
        let unit = dir.path().join("coherent-mount@.service");
        std::fs::write(&unit, unit_text().replace("/usr/bin/coherent-mount", BIN)).unwrap();
        let inst: PathBuf = dir.path().join("coherent-mount@srv-work.service");
        std::os::unix::fs::symlink(&unit, &inst).unwrap();
        let o = run_timeout(
            Command::new("systemd-analyze")
                .args(["verify", "--man=no"])
                .arg(&inst),
            Duration::from_secs(60),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        let problems: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("coherent-mount@"))
            .collect();
        assert!(problems.is_empty(), "systemd-analyze verify: {err}");
    } else {
        say("systemd-analyze is not installed here: the unit was not verified by systemd");
    }
    if !Path::new("/run/systemd/system").is_dir() {
        say(&format!(
            "systemd is not PID 1 here ({}): systemctl start/stop of the unit not run; \
             its ExecStart was run under the test's own NOTIFY_SOCKET instead",
            std::fs::read_to_string("/proc/1/comm")
                .unwrap_or_default()
                .trim()
        ));
        return;
    }
    // systemd is PID 1: the real thing, as a runtime unit.
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().canonicalize().unwrap().join("work");
    std::fs::create_dir(&mnt).unwrap();
    let unit_path = Path::new("/run/systemd/system/coherent-mount@.service");
    std::fs::write(
        unit_path,
        unit_text().replace("/usr/bin/coherent-mount", BIN),
    )
    .unwrap();
    let sc = |args: &[&str]| run_timeout(Command::new("systemctl").args(args), TIMEOUT);
    assert!(sc(&["daemon-reload"]).status.success());
    let esc = run_timeout(
        Command::new("systemd-escape").arg("--path").arg(&mnt),
        TIMEOUT,
    );
    let inst = format!(
        "coherent-mount@{}.service",
        String::from_utf8_lossy(&esc.stdout).trim()
    );
    let o = sc(&["start", &inst]);
    let started = o.status.success() && is_mounted(&mnt);
    let o2 = sc(&["stop", &inst]);
    let stopped = o2.status.success() && !is_mounted(&mnt);
    if is_mounted(&mnt) {
        lazy_umount(&mnt);
    }
    let _ = std::fs::remove_file(unit_path);
    let _ = sc(&["daemon-reload"]);
    assert!(started, "systemctl start {inst}: {o:?}");
    assert!(stopped, "systemctl stop {inst}: {o2:?}");
}
