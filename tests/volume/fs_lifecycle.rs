//! Mount lifecycle: signals, umount, kill -9, --daemon, in-place mounts, bad input, and
//! that passthrough really keeps file data away from the daemon.

use crate::common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{is_mounted, run_timeout, wait_until, Mount, BIN, TIMEOUT};

#[test]
fn sigterm_unmounts_and_exits_zero() {
    let mut m = Mount::new(true);
    fs::write(m.path("f"), b"x").unwrap();
    assert!(m.log().contains("data mode: passthrough"), "{}", m.log());
    let st = m.stop().expect("exited");
    assert!(st.success(), "{st:?}\n{}", m.log());
    assert!(!is_mounted(&m.mnt));
    assert_eq!(fs::read(m.backing_path("f")).unwrap(), b"x");
}

#[test]
fn sighup_unmounts_too() {
    let mut m = Mount::new(false);
    m.signal(libc::SIGHUP);
    let st = m.wait_exit(TIMEOUT).expect("exited");
    assert!(st.success(), "{st:?}\n{}", m.log());
    assert!(!is_mounted(&m.mnt));
}

#[test]
fn sigint_with_a_busy_mount_still_exits_zero() {
    let mut m = Mount::new(false);
    // The mount is listed before the daemon has answered the kernel's INIT, where this
    // line is logged: wait for it, not for the listing.
    assert!(
        wait_until(TIMEOUT, || m
            .log()
            .contains("data mode: through the daemon (--no-passthrough)")),
        "{}",
        m.log()
    );
    // An open file and a process with its cwd inside keep the mount busy.
    let f = fs::File::create(m.path("held")).unwrap();
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .current_dir(&m.mnt)
        .spawn()
        .unwrap();
    m.signal(libc::SIGINT);
    let st = m.wait_exit(TIMEOUT).expect("daemon exited");
    assert!(st.success(), "{st:?}\n{}", m.log());
    assert!(!is_mounted(&m.mnt));
    drop(f);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn umount_and_fusermount_end_the_daemon() {
    for tool in [&["umount"][..], &["fusermount3", "-u"][..]] {
        let mut m = Mount::new(true);
        // The daemon's readiness thread stats a path inside the mount once it is listed; an
        // unmount while that stat is in flight is EBUSY (seen 4 in 40 runs). An unmount
        // races nothing once the daemon has logged that the mount answers.
        assert!(
            wait_until(TIMEOUT, || m.log().contains("mounted and ready")),
            "{}",
            m.log()
        );
        let o = run_timeout(
            Command::new(tool[0]).args(&tool[1..]).arg(&m.mnt),
            Duration::from_secs(20),
        );
        assert!(o.status.success(), "{tool:?}: {o:?}");
        let st = m.wait_exit(TIMEOUT).expect("daemon exited after unmount");
        assert!(st.success(), "{tool:?}: {st:?}\n{}", m.log());
        assert!(!is_mounted(&m.mnt));
    }
}

#[test]
fn kill_9_leaves_nothing_hung() {
    let mut m = Mount::new(true);
    fs::write(m.path("f"), b"x").unwrap();
    m.signal(libc::SIGKILL);
    let st = m.wait_exit(TIMEOUT).expect("killed");
    assert!(!st.success());
    // The dead mount answers ENOTCONN instead of hanging.
    let e = fs::metadata(m.path("f")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN));
    let mnt = m.mnt.clone();
    drop(m); // the harness detaches the dead mount
    assert!(!is_mounted(&mnt));
}

#[test]
fn in_place_mount_keeps_paths() {
    let mut m = Mount::builder().in_place().start();
    assert_eq!(m.mnt, m.backing);
    fs::write(m.path("inside"), b"through the volume").unwrap();
    assert_eq!(common::mount_fstype(&m.mnt).unwrap(), "fuse");
    assert!(m.stop().unwrap().success());
    // After unmounting, the file is in the directory itself.
    assert_eq!(
        fs::read(m.mnt.join("inside")).unwrap(),
        b"through the volume"
    );
}

fn daemon_pids_for(marker: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("coherent-mount") && cmd.contains(&*marker.to_string_lossy()) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn daemon_flag_detaches_once_ready() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mnt) = (dir.path().join("b"), dir.path().join("m"));
    fs::create_dir(&b).unwrap();
    fs::create_dir(&mnt).unwrap();
    let o = run_timeout(
        Command::new(BIN).arg("--daemon").arg(&b).arg(&mnt),
        Duration::from_secs(20),
    );
    assert!(o.status.success(), "{o:?}");
    // The parent returned only once the mount was live.
    assert!(is_mounted(&mnt));
    fs::write(mnt.join("f"), b"d").unwrap();
    assert_eq!(fs::read(b.join("f")).unwrap(), b"d");
    let pids = daemon_pids_for(&b);
    assert_eq!(pids.len(), 1, "one detached daemon");
    let o = run_timeout(Command::new("umount").arg(&mnt), Duration::from_secs(20));
    assert!(o.status.success(), "{o:?}");
    assert!(
        wait_until(TIMEOUT, || daemon_pids_for(&b).is_empty()),
        "daemon exited"
    );
    if is_mounted(&mnt) {
        common::lazy_umount(&mnt);
    }
}

/// Run coherent-mount expecting a clean refusal: non-zero, one line naming the problem.
fn refused(args: &[&Path], want: &str) {
    let before: std::collections::HashMap<_, _> = args
        .iter()
        .map(|a| (a.to_path_buf(), mounts_at(a)))
        .collect();
    let o = run_timeout(Command::new(BIN).args(args), Duration::from_secs(20));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("coherent-mount:"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(want),
        "{:?} does not say {want:?}",
        lines[0]
    );
    for a in args {
        assert_eq!(mounts_at(a), before[&a.to_path_buf()], "{a:?} got mounted");
    }
}

fn mounts_at(p: &Path) -> usize {
    coherent::sys::mounts()
        .unwrap()
        .iter()
        .filter(|m| m.mount_point == p)
        .count()
}

#[test]
fn a_busy_mountpoint_is_refused_with_one_line() {
    // The checks of the arguments alone: crates/coherent-mount/tests/usage.rs.
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().canonicalize().unwrap().join("b");
    fs::create_dir(&b).unwrap();
    // Busy: a volume is already mounted there (also for the in-place form).
    let m = Mount::new(true);
    refused(&[&b, &m.mnt], "is busy");
    refused(&[&m.mnt], "is busy");
    assert!(is_mounted(&m.mnt), "the first mount is untouched");
}

#[test]
fn missing_dev_fuse_is_refused() {
    // In a private mount namespace, hide /dev/fuse behind a regular file.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::create_dir(d.join("b")).unwrap();
    fs::create_dir(d.join("m")).unwrap();
    fs::write(d.join("fake"), b"").unwrap();
    let script = format!(
        "mount --bind {fake} /dev/fuse && exec {bin} {b} {m}",
        fake = d.join("fake").display(),
        bin = BIN,
        b = d.join("b").display(),
        m = d.join("m").display()
    );
    let o = run_timeout(
        Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]),
        Duration::from_secs(20),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("coherent-mount: /dev/fuse"), "{err}");
    assert!(!is_mounted(&d.join("m")));
}

/// With passthrough, reading and writing a big file never reaches the daemon's read and
/// write handlers; without it, they do.
#[test]
fn passthrough_keeps_data_out_of_the_daemon() {
    for pt in [true, false] {
        let m = Mount::new(pt);
        let data = vec![7u8; 16 << 20];
        fs::write(m.path("big"), &data).unwrap();
        fs::write("/proc/sys/vm/drop_caches", b"1").unwrap();
        assert_eq!(fs::read(m.path("big")).unwrap().len(), data.len());
        m.signal(libc::SIGUSR1);
        let mut line = String::new();
        assert!(wait_until(Duration::from_secs(5), || {
            line = m
                .log()
                .lines()
                .rev()
                .find(|l| l.contains("daemon reads"))
                .unwrap_or("")
                .to_string();
            !line.is_empty()
        }));
        let num = |key: &str| -> u64 {
            line.split(key)
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        if pt {
            assert_eq!(
                (num("daemon reads: "), num("daemon writes: ")),
                (0, 0),
                "{line}"
            );
        } else {
            assert!(
                num("daemon reads: ") > 0 && num("daemon writes: ") > 0,
                "{line}"
            );
            // Large requests: 16 MiB in at most 1 MiB writes, so few of them.
            assert!(num("daemon writes: ") <= 64, "{line}");
        }
    }
}

#[test]
fn options_ro_threads_and_carried_flags() {
    let m = Mount::builder()
        .args(["-o", "ro", "--threads", "1"])
        .args([
            "--state-dir",
            "/tmp/coherent-state-test",
            "--stale",
            "strict",
        ])
        .args([
            "--evict-after",
            "2d",
            "--session-env",
            "A",
            "--session-env",
            "B",
        ])
        .start();
    let e = fs::write(m.path("f"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    let log = m.log();
    assert!(log.contains("threads=1"), "{log}");
    assert!(log.contains("stale=Strict"), "{log}");
    assert!(log.contains("evict_after=172800s"), "{log}");
    assert!(log.contains(r#"session_env=["A", "B"]"#), "{log}");
    // Bad values are usage errors.
    let o = run_timeout(
        Command::new(BIN).args(["--stale", "sometimes", "/tmp"]),
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(2));
    let o = run_timeout(
        Command::new(BIN).args(["--evict-after", "soon", "/tmp"]),
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(2));
}
