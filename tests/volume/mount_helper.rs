//! Installed the way filesystems are: `mount -t fuse.TYPE`, an fstab line, `umount`, the
//! `-o` spelling of every flag, and the one-line refusals of bad input, through the real
//! mount(8) and the real helper lookup (`/sbin/mount.fuse.TYPE`).
//!
//! Each test installs its own helper name (`mount.fuse.coherent-mount-t<pid>-<n>`, a
//! symlink to the built binary), so a packaged `mount.fuse.coherent-mount` on the machine
//! is never used or touched, and removes it at the end.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::CLI;
use common::{is_mounted, lazy_umount, mount_fstype, run_timeout, wait_until, BIN, TIMEOUT};

/// A helper name of this test's own in /sbin, removed on drop, with scratch directories.
struct Helper {
    fstype: String,
    link: PathBuf,
    dir: tempfile::TempDir,
}

impl Helper {
    fn new() -> Helper {
        static N: AtomicU32 = AtomicU32::new(0);
        let sub = format!(
            "coherent-mount-t{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let link = PathBuf::from(format!("/sbin/mount.fuse.{sub}"));
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(BIN, &link).expect("install the helper link in /sbin");
        let dir = tempfile::Builder::new()
            .prefix("coherent-helper-")
            .tempdir()
            .unwrap();
        for d in ["b", "m", "f"] {
            fs::create_dir(dir.path().join(d)).unwrap();
        }
        Helper {
            fstype: format!("fuse.{sub}"),
            link,
            dir,
        }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        for d in ["m", "f"] {
            let p = self.p(d);
            if is_mounted(&p) {
                let _ = run_timeout(Command::new("umount").arg(&p), Duration::from_secs(20));
            }
            if is_mounted(&p) {
                lazy_umount(&p);
            }
        }
        let _ = fs::remove_file(&self.link);
    }
}

fn run(cmd: &mut Command) -> Output {
    run_timeout(cmd, Duration::from_secs(30))
}

/// The daemons serving a mount point (by their command line).
fn daemons_of(mnt: &Path) -> Vec<i32> {
    let want = mnt.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // As the helper link, or as the command mount.fuse3 runs (`coherent-mount-t...`).
        if args
            .first()
            .is_some_and(|a| a.contains("mount.fuse.coherent") || a.contains("coherent-mount-t"))
            && args.contains(&want)
        {
            out.push(pid);
        }
    }
    out
}

fn sh_in(dir: &Path, session: &str, script: &str) -> Output {
    run(Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("COHERENT_SESSION", session)
        .env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", cli_dir()),
        ))
}

fn cli_dir() -> String {
    Path::new(CLI)
        .parent()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The source column of the mount at `p`.
fn mount_source(p: &Path) -> Option<String> {
    let o = Command::new("findmnt")
        .args(["-n", "-o", "SOURCE", "--mountpoint"])
        .arg(p)
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// The per-mount and superblock options of the mount at `p`, as findmnt shows them.
fn mount_options_of(p: &Path) -> Vec<String> {
    let o = Command::new("findmnt")
        .args(["-n", "-o", "OPTIONS", "--mountpoint"])
        .arg(p)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .split(',')
        .map(String::from)
        .collect()
}

fn mount_t(h: &Helper, opts: &str) -> Output {
    run(Command::new("mount")
        .args(["-t", &h.fstype])
        .arg(h.p("b"))
        .arg(h.p("m"))
        .arg("-o")
        .arg(format!("state_dir={}{opts}", h.p("state").display())))
}

/// `umount; mount` back to back, ten times through mount(8): umount returns before the
/// old daemon has let go of the state directory, and the new mount must not be refused
/// for it (xfstests generic/604 and every cycle mount).
#[test]
fn umount_then_mount_at_once_succeeds_every_time() {
    let h = Helper::new();
    let m = h.p("m");
    let o = mount_t(&h, "");
    assert!(o.status.success(), "{o:?}");
    for i in 0..10 {
        fs::write(m.join(format!("f{i}")), b"x").unwrap();
        let o = run(Command::new("umount").arg(&m));
        assert!(o.status.success(), "umount {i}: {o:?}");
        let o = mount_t(&h, "");
        assert!(
            o.status.success(),
            "mount right after umount, cycle {i}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(m.join(format!("f{i}")).exists());
    }
    // A volume still mounted is refused at once, not waited for.
    let other = h.p("f");
    let t = std::time::Instant::now();
    let o = run(Command::new("mount")
        .args(["-t", &h.fstype])
        .arg(h.p("b"))
        .arg(&other)
        .arg("-o")
        .arg(format!("state_dir={}", h.p("state").display())));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is in use by another coherent-mount"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "waited for a live volume"
    );
}

/// `mount -o remount,...` changes the flags of the mounted volume (xfstests 294, 306,
/// 452), and the kernel's own flags mount(8) passes are taken (003).
#[test]
fn remount_and_the_kernels_flags_through_mount_8() {
    let h = Helper::new();
    let m = h.p("m");
    let o = mount_t(
        &h,
        ",nodiratime,strictatime,nosymfollow,lazytime,iversion,silent",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let opts = mount_options_of(&m);
    for want in ["nodiratime", "nosymfollow", "lazytime"] {
        assert!(opts.iter().any(|o| o == want), "{want} in {opts:?}");
    }
    assert!(
        !opts.iter().any(|o| o == "relatime"),
        "strictatime: {opts:?}"
    );
    fs::write(m.join("f"), b"x").unwrap();
    let remount = |o: &str| {
        run(Command::new("mount")
            .args(["-t", &h.fstype, "-o", o])
            .arg(h.p("b"))
            .arg(&m))
    };
    let o = remount("remount,ro");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        fs::write(m.join("f"), b"y").unwrap_err().raw_os_error(),
        Some(libc::EROFS)
    );
    let o = remount("remount,rw");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    fs::write(m.join("f"), b"y").unwrap();
    assert_eq!(fs::read(h.p("b").join("f")).unwrap(), b"y");
    // The same daemon serves it all along.
    assert_eq!(daemons_of(&m).len(), 1);
}

/// As root through mount(8), `-o nodev,nosuid` are honoured and dev,suid are the
/// default: a device node made in the volume opens (xfstests 184).
#[test]
fn dev_and_suid_as_root_through_mount_8() {
    let h = Helper::new();
    let m = h.p("m");
    let o = mount_t(&h, "");
    assert!(o.status.success(), "{o:?}");
    let opts = mount_options_of(&m);
    assert!(
        !opts.iter().any(|o| o == "nodev" || o == "nosuid"),
        "{opts:?}"
    );
    // /dev/null's numbers (1, 3).
    let o = run(Command::new("mknod")
        .arg(m.join("null"))
        .args(["c", "1", "3"]));
    assert!(o.status.success(), "{o:?}");
    fs::write(m.join("null"), b"gone").expect("write to a device node in a dev mount");
    let o = run(Command::new("umount").arg(&m));
    assert!(o.status.success(), "{o:?}");
    let o = mount_t(&h, ",nodev,nosuid");
    assert!(o.status.success(), "{o:?}");
    let opts = mount_options_of(&m);
    assert!(
        opts.iter().any(|o| o == "nodev") && opts.iter().any(|o| o == "nosuid"),
        "{opts:?}"
    );
    assert_eq!(
        fs::write(m.join("null"), b"x").unwrap_err().raw_os_error(),
        Some(libc::EACCES)
    );
}

/// `mount -t`, then a handoff through the mounted volume, then `umount` ends the daemon.
#[test]
fn mount_t_mounts_an_enforcing_volume_and_umount_stops_it() {
    let h = Helper::new();
    let (b, m) = (h.p("b"), h.p("m"));
    let log = h.p("daemon.log");
    let o = run(Command::new("mount")
        .args(["-t", &h.fstype])
        .arg(&b)
        .arg(&m)
        .arg("-o")
        .arg(format!(
            "state_dir={},stale=strict,log_file={},no_passthrough,nodev",
            h.p("state").display(),
            log.display()
        )));
    assert!(o.status.success(), "mount -t failed: {o:?}");
    // A mount helper is silent when all is well; its log is in the file.
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // mount(8) returned: the volume answers now (readiness).
    assert_eq!(mount_fstype(&m).as_deref(), Some("fuse"));
    // The source names the backing directory (`coherent run` finds it there).
    assert_eq!(mount_source(&m), Some(format!("coherent:{}", b.display())));
    assert!(m.join(".coherent/ctl").exists());
    let daemons = daemons_of(&m);
    assert_eq!(daemons.len(), 1, "one detached daemon: {daemons:?}");
    // The options reached the daemon (its log, where a detached daemon writes).
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("stale=Strict"), "{text}");
    assert!(
        text.contains("through the daemon (--no-passthrough)"),
        "{text}"
    );
    // It enforces: a handoff fences the giver.
    assert!(sh_in(&m, "bob", "coherent register").status.success());
    let o = sh_in(
        &m,
        "alice",
        "echo plan > plan.md && coherent transfer --to bob plan.md",
    );
    assert!(o.status.success(), "{o:?}");
    let o = sh_in(&m, "alice", "echo again >> plan.md");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{o:?}"
    );
    assert_eq!(fs::read_to_string(b.join("plan.md")).unwrap(), "plan\n");
    // umount ends the daemon cleanly.
    let o = run(Command::new("umount").arg(&m));
    assert!(o.status.success(), "{o:?}");
    assert!(
        wait_until(TIMEOUT, || daemons_of(&m).is_empty()),
        "the daemon outlived umount"
    );
    assert!(!is_mounted(&m));
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("unmounted, exiting"), "{text}");
}

/// An fstab line with fstab's and systemd's own options, mounted by mount point alone.
#[test]
fn fstab_line_mounts_with_every_flag_as_an_option() {
    let h = Helper::new();
    let (b, f) = (h.p("b"), h.p("f"));
    fs::write(b.join("seen.md"), b"from the backing dir\n").unwrap();
    let fstab = h.p("fstab");
    fs::write(
        &fstab,
        format!(
            "# a test fstab\n{} {} {} defaults,_netdev,nofail,x-systemd.requires=network-online.target,state-dir={},evict_after=2d,session_env=AGENT_ID,track_ignored,log_file={} 0 0\n",
            b.display(),
            f.display(),
            h.fstype,
            h.p("state").display(),
            h.p("log").display()
        ),
    )
    .unwrap();
    let o = run(Command::new("mount").arg("-T").arg(&fstab).arg(&f));
    assert!(o.status.success(), "mount -T failed: {o:?}");
    assert!(is_mounted(&f));
    assert_eq!(
        fs::read_to_string(f.join("seen.md")).unwrap(),
        "from the backing dir\n"
    );
    let text = fs::read_to_string(h.p("log")).unwrap();
    assert!(text.contains("evict_after=172800s"), "{text}");
    assert!(text.contains(r#"session_env=["AGENT_ID"]"#), "{text}");
    assert!(text.contains("track_ignored=true"), "{text}");
    // The session variable named in fstab is the one the volume reads.
    let o = run(Command::new("cat")
        .arg(f.join(".coherent/whoami"))
        .env("AGENT_ID", "carol"));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("carol"),
        "{o:?}"
    );
    let o = run(Command::new("umount").arg(&f));
    assert!(o.status.success(), "{o:?}");
    assert!(wait_until(TIMEOUT, || daemons_of(&f).is_empty()));
}

/// Refusals through mount(8): one line from coherent-mount, a failing exit, nothing left
/// mounted.
#[test]
fn mount_t_refuses_bad_input_with_one_line_and_mounts_nothing() {
    let h = Helper::new();
    let (b, m) = (h.p("b"), h.p("m"));
    let cases: [(Vec<String>, &str); 4] = [
        (
            vec![
                b.display().to_string(),
                m.display().to_string(),
                "-o".into(),
                "bogus".into(),
            ],
            "unknown mount option \"bogus\"",
        ),
        (
            vec![
                b.display().to_string(),
                m.display().to_string(),
                "-o".into(),
                "stale=sometimes".into(),
            ],
            "sometimes",
        ),
        (
            vec![
                h.p("missing").display().to_string(),
                m.display().to_string(),
            ],
            "does not exist",
        ),
        (
            vec![
                b.display().to_string(),
                m.display().to_string(),
                "-o".into(),
                "state_dir".into(),
            ],
            "needs a value",
        ),
    ];
    for (args, want) in cases {
        let o = run(Command::new("mount").args(["-t", &h.fstype]).args(&args));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} mounted");
        assert!(
            err.contains(want),
            "{args:?}: {err:?} does not say {want:?}"
        );
        assert!(!is_mounted(&m), "{args:?} left a mount");
        assert!(daemons_of(&m).is_empty());
    }
    // A mount point that is already a volume.
    let o = run(Command::new("mount")
        .args(["-t", &h.fstype])
        .arg(&b)
        .arg(&m)
        .arg("-o")
        .arg(format!("state_dir={}", h.p("s1").display())));
    assert!(o.status.success(), "{o:?}");
    let o = run(Command::new("mount")
        .args(["-t", &h.fstype])
        .arg(&b)
        .arg(&m)
        .arg("-o")
        .arg(format!("state_dir={}", h.p("s2").display())));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is busy") && err.contains("umount"), "{err}");
    assert_eq!(daemons_of(&m).len(), 1, "the first volume stays, alone");
    // mount -f checks and mounts nothing.
    let o = run(Command::new("mount")
        .args(["-f", "-t", &h.fstype])
        .arg(&b)
        .arg(h.p("f")));
    assert!(o.status.success(), "{o:?}");
    assert!(!is_mounted(&h.p("f")));
}

/// The same refusals straight from the binary, including the ones only it can meet.
#[test]
fn coherent_mount_refuses_unknown_options_and_users_without_dev_fuse() {
    let dir = tempfile::tempdir().unwrap();
    let (b, m) = (dir.path().join("b"), dir.path().join("m"));
    fs::create_dir(&b).unwrap();
    fs::create_dir(&m).unwrap();
    let o = run(Command::new(BIN)
        .arg(&b)
        .arg(&m)
        .args(["-o", "allow_other,nonsense=3"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("coherent-mount: unknown mount option \"nonsense=3\""),
        "{err}"
    );
    assert!(!is_mounted(&m));

    // Not root, with a /dev/fuse the user may not open (made so in a mount namespace of
    // the test's own, whatever the machine's mode): one line that says what to do.
    let u = common::users::u1();
    let udir = tempfile::tempdir().unwrap();
    fs::set_permissions(udir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let d = udir.path().display();
    let script = format!(
        "mknod -m 600 {d}/fuse c 10 229 && mount --bind {d}/fuse /dev/fuse && \
         exec setpriv --reuid={uid} --regid={gid} --init-groups -- \
         sh -c 'mkdir {d}/b {d}/m && exec {bin} {d}/b {d}/m --state-dir {d}/s'",
        uid = u.uid,
        gid = u.gid,
        bin = BIN
    );
    let o =
        run(Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("coherent-mount: /dev/fuse cannot be opened")
            && err.contains("run as root"),
        "{err}"
    );
    assert!(!is_mounted(&udir.path().join("m")));
}

/// The command mount.fuse3 runs for type `fuse.NAME` (NAME, found on the shell's default
/// PATH, since mount(8) passes none): a link of this test's own in /usr/local/bin, and no
/// helper link in /sbin, removed on drop.
struct Command3 {
    link: PathBuf,
}

impl Drop for Command3 {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.link);
    }
}

/// `mount -t fuse.TYPE` with no `mount.fuse.TYPE` helper: mount(8) goes through mount.fuse3,
/// which runs `coherent-mount` through `/bin/sh` and waits for it. It must come back at
/// once with a working, detached volume (main hung here until killed), as nodev,nosuid as
/// through the helper link, and its log must name the `ln -s` step it did without.
#[test]
fn mount_t_without_the_helper_link_returns_mounted_instead_of_hanging() {
    let h = Helper::new();
    // This test's own type, without its helper link: mount.fuse3 it is.
    fs::remove_file(&h.link).unwrap();
    let name = h.fstype.strip_prefix("fuse.").unwrap().to_string();
    let cmd = Command3 {
        link: PathBuf::from("/usr/local/bin").join(&name),
    };
    let _ = fs::remove_file(&cmd.link);
    std::os::unix::fs::symlink(BIN, &cmd.link).expect("link the command in /usr/local/bin");
    let (b, m) = (h.p("b"), h.p("m"));
    let log = h.p("daemon.log");
    // mount's output goes to a file, not a pipe: a daemon left in the foreground would
    // keep a pipe open, and the test would hang on it instead of failing.
    let err_file = h.p("mount.err");
    let mut child = Command::new("mount")
        .args(["-t", &h.fstype])
        .arg(&b)
        .arg(&m)
        .arg("-o")
        .arg(format!(
            "state_dir={},log_file={}",
            h.p("state").display(),
            log.display()
        ))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&err_file).unwrap())
        .spawn()
        .expect("spawn mount");
    let status = common::wait_child_quiet(&mut child, Duration::from_secs(30));
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        for pid in daemons_of(&m) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        lazy_umount(&m);
        panic!("mount -t through mount.fuse3 hung: killed after 30 s");
    };
    let err = fs::read_to_string(&err_file).unwrap();
    assert!(
        status.success(),
        "mount -t through mount.fuse3 failed: {status}: {err}"
    );
    assert!(err.is_empty(), "{err}");
    // Not a silent success: the volume is there and answers, served by one detached daemon.
    assert_eq!(mount_fstype(&m).as_deref(), Some("fuse"));
    let who = fs::read_to_string(m.join(".coherent/whoami")).expect("the volume answers");
    assert!(who.contains("\"session\""), "{who}");
    assert_eq!(daemons_of(&m).len(), 1, "one detached daemon");
    // Mounted by root through mount(8): dev,suid, as any filesystem (mount.fuse3 asks
    // for them too).
    let flags = nix::sys::statvfs::statvfs(&m).unwrap().flags();
    use nix::sys::statvfs::FsFlags;
    assert!(
        !flags.contains(FsFlags::ST_NOSUID) && !flags.contains(FsFlags::ST_NODEV),
        "{flags:?}"
    );
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("started by mount.fuse3") && text.contains("ln -s"),
        "{text}"
    );
    let o = run(Command::new("umount").arg(&m));
    assert!(o.status.success(), "{o:?}");
    assert!(
        wait_until(TIMEOUT, || daemons_of(&m).is_empty()),
        "the daemon outlived umount"
    );
    drop(cmd);
}
