//! `coherent doctor` against real setups: a healthy mount with Claude Code installed, and
//! each broken setup a test can make for real (a hook naming a missing binary, settings
//! without the hooks or without some, the kernel's FUSE request timeout set, the mount's
//! daemon gone, no volume at all). Each problem must show as its check's FAIL or warn line
//! with a fix, and only a FAIL makes the exit status non-zero (3).

use crate::common;

use common::{lazy_umount, run_timeout, Mount};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::CLI;

/// A PATH with `coherent` and `coherent-mount` (links to the built binaries) and a HOME of
/// its own, as after an install.
struct Env {
    _tmp: tempfile::TempDir,
    bin: PathBuf,
    home: PathBuf,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        let home = tmp.path().join("home");
        std::fs::create_dir(&bin).unwrap();
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::symlink(CLI, bin.join("coherent")).unwrap();
        std::os::unix::fs::symlink(common::BIN, bin.join("coherent-mount")).unwrap();
        Env {
            _tmp: tmp,
            bin,
            home,
        }
    }

    /// `coherent` run from `dir` (which, for a dead mount, cannot be entered: then `/`).
    fn cmd(&self, dir: &Path) -> Command {
        let mut c = Command::new(CLI);
        c.current_dir(if std::fs::metadata(dir).is_ok() {
            dir
        } else {
            Path::new("/")
        })
        .env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", self.bin.display()),
        )
        .env("HOME", &self.home)
        .env_remove("COHERENT_SESSION")
        .env_remove("CLAUDE_CODE_SESSION_ID")
        .env_remove("CODEX_HOME");
        c
    }

    fn install(&self, dir: &Path) {
        let o = run_timeout(
            self.cmd(dir).args(["install", "claude-code"]).arg(dir),
            Duration::from_secs(30),
        );
        assert!(o.status.success(), "{o:?}");
    }

    /// `coherent install codex DIR`: Codex's config in this HOME (`.codex/config.toml`).
    fn install_codex(&self, dir: &Path) -> PathBuf {
        let o = run_timeout(
            self.cmd(dir).args(["install", "codex"]).arg(dir),
            Duration::from_secs(30),
        );
        assert!(o.status.success(), "{o:?}");
        self.home.join(".codex/config.toml")
    }

    /// `coherent doctor DIR`: exit code and the lines.
    fn doctor(&self, dir: &Path) -> (Option<i32>, String) {
        self.doctor_with_path(dir, None)
    }

    /// [`Env::doctor`] with a PATH of its own (None: the one with `coherent`).
    fn doctor_with_path(&self, dir: &Path, path: Option<&str>) -> (Option<i32>, String) {
        let mut c = self.cmd(dir);
        if let Some(p) = path {
            c.env("PATH", p);
        }
        let o = run_timeout(c.arg("doctor").arg(dir), Duration::from_secs(60));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.code(), out)
    }
}

/// The line of check `name`, which must exist.
fn line<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| {
            l.split_once("  ")
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(&format!("{name}:")))
        })
        .unwrap_or_else(|| panic!("no `{name}` line in:\n{out}"))
}

fn level(l: &str) -> &str {
    l.split_whitespace().next().unwrap_or("")
}

#[test]
fn healthy_install_is_all_ok_and_exits_0() {
    let _t = common::fuse_sysctl_turn();
    let m = Mount::new(true);
    let env = Env::new();
    env.install(&m.mnt);
    let (code, out) = env.doctor(&m.mnt);
    assert_eq!(code, Some(0), "{out}");
    for name in [
        "mount",
        "data mode",
        "coherent on PATH",
        "coherent-mount on PATH",
        "claude hooks",
        "hooks fire",
        "mcp server",
        "git fsmonitor",
        "landlock",
    ] {
        assert_eq!(level(line(&out, name)), "ok", "{name}:\n{out}");
    }
    // The mount helper link is the machine's (/usr/sbin), not this test's to make: ok or a
    // warning with the ln -s line, never a FAIL.
    let helper = line(&out, "mount helper");
    assert!(
        level(helper) == "ok" || helper.contains("fix: ln -s"),
        "{helper}"
    );
    // The request timeout is the machine's too (another suite may set it meanwhile): ok,
    // or a warning with its fix.
    let t = line(&out, "fuse request timeout");
    assert!(level(t) == "ok" || t.contains("fix: sysctl -w"), "{t}");
    assert!(!out.contains("FAIL"), "{out}");
    assert!(line(&out, "mcp server").contains("lists 12 tools"), "{out}");
    assert!(line(&out, "data mode").contains("passthrough"), "{out}");

    // --json: the same checks, as data.
    let o = run_timeout(
        env.cmd(&m.mnt).args(["doctor", "--json"]),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{o:?}");
    let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["ok"], true, "{v}");
    let checks = v["checks"].as_array().unwrap();
    assert_eq!(checks.len(), out.lines().count(), "{v}");
    assert!(checks.iter().all(|c| c["level"] != "fail"), "{v}");
    assert!(checks
        .iter()
        .any(|c| c["check"] == "hooks fire" && c["level"] == "ok"));
}

#[test]
fn a_hook_naming_a_missing_binary_fails_its_live_probe() {
    let _t = common::fuse_sysctl_turn();
    let m = Mount::new(false);
    let env = Env::new();
    env.install(&m.mnt);
    let settings = m.path(".claude/settings.json");
    let text = std::fs::read_to_string(&settings).unwrap();
    assert!(text.contains("\"coherent hook claude-code\""), "{text}");
    // As after the binary moved (an old install named a build directory).
    std::fs::write(
        &settings,
        text.replace(
            "\"coherent hook claude-code\"",
            "\"/opt/gone/coherent hook claude-code\"",
        ),
    )
    .unwrap();
    let (code, out) = env.doctor(&m.mnt);
    assert_eq!(code, Some(3), "{out}");
    // Registered, so the static check passes; only running it finds the fault.
    assert_eq!(level(line(&out, "claude hooks")), "ok", "{out}");
    let fire = line(&out, "hooks fire");
    assert_eq!(level(fire), "FAIL", "{out}");
    // Resolved as the agent would, without running it (the doctor runs no program the
    // settings name): it is not there.
    assert!(
        fire.contains("/opt/gone/coherent") && fire.contains("does not exist"),
        "{fire}"
    );
    assert!(
        fire.contains("fix: ") && fire.contains("coherent install claude-code"),
        "{fire}"
    );
}

#[test]
fn settings_without_the_hooks_warn_and_with_some_missing_fail() {
    let _t = common::fuse_sysctl_turn();
    let m = Mount::new(false);
    let env = Env::new();
    // Claude Code settings of the project's own, without ours.
    std::fs::create_dir(m.path(".claude")).unwrap();
    std::fs::write(
        m.path(".claude/settings.json"),
        r#"{"permissions": {"allow": ["Bash(ls)"]}, "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "true"}]}]}}"#,
    )
    .unwrap();
    let (code, out) = env.doctor(&m.mnt);
    let hooks = line(&out, "claude hooks");
    assert_eq!(level(hooks), "warn", "{out}");
    assert!(hooks.contains("no coherent hooks"), "{hooks}");
    assert!(
        hooks.contains(&format!(
            "fix: coherent install claude-code {}",
            m.mnt.display()
        )),
        "{hooks}"
    );
    assert_eq!(code, Some(0), "a warning alone does not fail: {out}");

    // Installed, then SessionStart taken out by hand: the agent is never told at start.
    env.install(&m.mnt);
    let p = m.path(".claude/settings.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["hooks"].as_object_mut().unwrap().remove("SessionStart");
    std::fs::write(&p, v.to_string()).unwrap();
    let (code, out) = env.doctor(&m.mnt);
    let hooks = line(&out, "claude hooks");
    assert_eq!(level(hooks), "FAIL", "{out}");
    assert!(hooks.contains("none for SessionStart"), "{hooks}");
    assert_eq!(code, Some(3), "{out}");
}

/// Sets `fs.fuse.default_request_timeout`, restored on drop.
struct Sysctl {
    path: PathBuf,
    old: String,
    set: String,
}

impl Sysctl {
    fn set(name: &str, value: &str) -> Option<Sysctl> {
        let path = Path::new("/proc/sys/fs/fuse").join(name);
        let old = std::fs::read_to_string(&path).ok()?;
        std::fs::write(&path, value).expect("set the sysctl (as root)");
        Some(Sysctl {
            path,
            old,
            set: value.to_string(),
        })
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        // Put back what was there (unless someone else changed it meanwhile).
        if std::fs::read_to_string(&self.path).is_ok_and(|v| v.trim() == self.set) {
            let _ = std::fs::write(&self.path, self.old.trim());
        }
    }
}

#[test]
fn a_fuse_request_timeout_set_is_a_warning_that_says_what_the_volume_does() {
    let _t = common::fuse_sysctl_turn();
    let m = Mount::new(false);
    let env = Env::new();
    // An hour: long enough that no other test's mount made meanwhile can run into it.
    let Some(_guard) = Sysctl::set("default_request_timeout", "3600") else {
        panic!("this kernel has no fs.fuse.default_request_timeout (needs 6.14+): cannot test it");
    };
    let (code, out) = env.doctor(&m.mnt);
    let t = line(&out, "fuse request timeout");
    assert_eq!(level(t), "warn", "{out}");
    assert!(t.contains("over 3600 s"), "{t}");
    assert!(
        t.contains("answers a `wait` before then"),
        "says what the volume does: {t}"
    );
    assert!(
        t.contains("fix: sysctl -w fs.fuse.default_request_timeout=0"),
        "{t}"
    );
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn the_mount_gone_or_absent_fails_with_how_to_mount() {
    // One test at a time in this binary (request_timeout sets the sysctl beside it).
    let _t = common::fuse_sysctl_turn();
    let env = Env::new();
    // No volume at all.
    let plain = tempfile::tempdir().unwrap();
    let (code, out) = env.doctor(plain.path());
    let l = line(&out, "mount");
    assert_eq!(level(l), "FAIL", "{out}");
    assert!(
        l.contains("fix: mount the workspace: `coherent-mount"),
        "{l}"
    );
    assert_eq!(code, Some(3), "{out}");

    // A daemon killed under its mount: the mount point answers ENOTCONN.
    let m = Mount::new(false);
    m.signal(libc::SIGKILL);
    assert!(
        common::wait_until(common::TIMEOUT, || std::fs::metadata(m.path(".coherent"))
            .is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))),
        "the mount still answers after SIGKILL"
    );
    let (code, out) = env.doctor(&m.mnt);
    let l = line(&out, "mount");
    assert_eq!(level(l), "FAIL", "{out}");
    assert!(
        l.contains("fix: the daemon behind it is gone: `fusermount3 -u"),
        "{l}"
    );
    assert_eq!(
        l.matches("fusermount3").count(),
        1,
        "one fix, said once: {l}"
    );
    assert_eq!(code, Some(3), "{out}");
    lazy_umount(&m.mnt);
}

/// On a multi-host volume: etcd over TLS with a user is ok; etcd reached in the clear is a
/// FAIL that names the secure setup (whoever reaches etcd can lift fences).
#[test]
fn etcd_over_tls_with_a_user_is_ok_and_in_the_clear_fails() {
    // One test at a time in this binary (request_timeout sets the sysctl beside it).
    let _t = common::fuse_sysctl_turn();
    use common::etcd::Etcd;
    let env = Env::new();
    for secure in [true, false] {
        let e = if secure {
            Etcd::start(1)
        } else {
            Etcd::start_insecure(1)
        };
        let state = tempfile::tempdir().unwrap();
        let m = Mount::builder()
            .args(["--coordinator", e.url(), "--host-id", "A", "--state-dir"])
            .arg(state.path().display().to_string())
            .start();
        let (code, out) = env.doctor(&m.mnt);
        let l = line(&out, "etcd");
        // A multi-host volume checks every write in the daemon: chosen, not a fault.
        let mode = line(&out, "data mode");
        assert_eq!(level(mode), "ok", "{out}");
        assert!(mode.contains("multi-host"), "{mode}");
        if secure {
            assert_eq!(level(l), "ok", "{out}");
            assert!(l.contains("over TLS as user"), "{l}");
        } else {
            assert_eq!(level(l), "FAIL", "{out}");
            assert!(l.contains("without TLS"), "{l}");
            assert!(l.contains("fix: mount with --coordinator etcds://"), "{l}");
            assert_eq!(code, Some(3), "{out}");
        }
    }
}

/// Codex installed as `coherent install codex` writes it: its hooks registered and firing
/// (ok, exit 0). Then each way a Codex install breaks is a FAIL line with its fix and exit
/// 3: a hook missing from config.toml, the registered command not on PATH, and a command
/// whose answer has a field Codex does not document (Codex fails such a hook).
#[test]
fn codex_hooks_are_checked_registered_and_firing() {
    let _t = common::fuse_sysctl_turn();
    let m = Mount::new(true);
    let env = Env::new();
    env.install(&m.mnt);
    let config = env.install_codex(&m.mnt);
    let installed = std::fs::read_to_string(&config).unwrap();
    let (code, out) = env.doctor(&m.mnt);
    assert_eq!(code, Some(0), "{out}");
    let reg = line(&out, "codex hooks");
    assert_eq!(level(reg), "ok", "{out}");
    assert!(reg.contains("registered in"), "{reg}");
    let fire = line(&out, "codex hooks fire");
    assert_eq!(level(fire), "ok", "{out}");
    assert!(fire.contains("only documented fields"), "{fire}");

    // A hook missing: the PreCompact group taken out by hand.
    let group = "[[hooks.PreCompact]]\n\n[[hooks.PreCompact.hooks]]\ntype = \"command\"\n\
                 command = \"coherent hook codex\"\ntimeout = 30\n";
    assert!(installed.contains(group), "{installed}");
    std::fs::write(&config, installed.replace(group, "")).unwrap();
    let (code, out) = env.doctor(&m.mnt);
    assert_eq!(code, Some(3), "{out}");
    let reg = line(&out, "codex hooks");
    assert_eq!(level(reg), "FAIL", "{out}");
    assert!(reg.contains("none for PreCompact"), "{reg}");
    assert!(reg.contains("fix: coherent install codex"), "{reg}");
    std::fs::write(&config, &installed).unwrap();

    // The command not on PATH: Codex runs `coherent hook codex` with a PATH without it.
    let bare = "/usr/sbin:/usr/bin:/sbin:/bin";
    let (code, out) = env.doctor_with_path(&m.mnt, Some(bare));
    assert_eq!(code, Some(3), "{out}");
    assert_eq!(level(line(&out, "codex hooks")), "ok", "{out}");
    let fire = line(&out, "codex hooks fire");
    assert_eq!(level(fire), "FAIL", "{out}");
    assert!(fire.contains("`coherent` is not on PATH"), "{fire}");
    assert!(
        fire.contains("fix: ") && fire.contains("coherent install codex"),
        "{fire}"
    );

    // A `coherent` of its own elsewhere, answering with a field Codex does not document
    // for SessionStart: the doctor does not run it (it is not the `coherent` on PATH), and
    // says so.
    let fake = env.home.join("fake");
    std::fs::create_dir(&fake).unwrap();
    let script = fake.join("coherent");
    let ran = env.home.join("fake-ran");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ntouch '{}'\ncat >/dev/null\necho '{{\"decision\":\"approve\"}}'\n",
            ran.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(
        &config,
        installed.replace(
            "command = \"coherent hook codex\"",
            &format!("command = \"'{}' hook codex\"", script.display()),
        ),
    )
    .unwrap();
    let (code, out) = env.doctor(&m.mnt);
    assert_eq!(code, Some(3), "{out}");
    assert_eq!(level(line(&out, "codex hooks")), "ok", "{out}");
    let fire = line(&out, "codex hooks fire");
    assert_eq!(level(fire), "FAIL", "{out}");
    assert!(
        fire.contains("is not the `coherent` on PATH") && fire.contains("not run"),
        "{fire}"
    );
    assert!(!ran.exists(), "the doctor ran the program the config named");
}
