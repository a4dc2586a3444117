//! The real users multi-user tests run as (made by `scripts/test-users.sh`, which
//! `scripts/deps.sh` calls): `coh-u1` (also in group `coh-shared`) and `coh-u2` (not).
//!
//! ```ignore
//! let (u1, u2) = (users::u1(), users::u2());
//! let out = u1.sh(&m.mnt, &[("COHERENT_SESSION", "alice")], "echo x > a");
//! assert!(out.status.success());
//! ```
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// One test user as `getent` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Every group id the user is in (primary included), as `id -G` prints them.
    pub groups: Vec<u32>,
}

/// The group `coh-u1` is in and `coh-u2` is not.
pub const SHARED_GROUP: &str = "coh-shared";

fn getent(db: &str, key: &str) -> Option<String> {
    let o = Command::new("getent").args([db, key]).output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Create the users when they are missing (the script is idempotent); panic with the
/// reason when that fails: a multi-user test never passes by skipping.
fn ensure() {
    if getent("passwd", "coh-u1").is_some()
        && getent("passwd", "coh-u2").is_some()
        && getent("group", SHARED_GROUP).is_some()
    {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test-users.sh");
    let o = Command::new("bash")
        .arg(script)
        .output()
        .expect("run test-users.sh");
    assert!(
        o.status.success(),
        "scripts/test-users.sh failed (the tests need root): {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Look a test user up (creating the test users first if needed).
pub fn user(name: &str) -> User {
    ensure();
    let line = getent("passwd", name).unwrap_or_else(|| panic!("no user {name}"));
    let f: Vec<&str> = line.split(':').collect();
    let id = |flag: &str| {
        let o = Command::new("id").args([flag, name]).output().expect("id");
        assert!(o.status.success(), "id {flag} {name}");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    User {
        name: name.to_string(),
        uid: f[2].parse().expect("uid"),
        gid: f[3].parse().expect("gid"),
        groups: id("-G")
            .split_whitespace()
            .map(|g| g.parse().expect("gid"))
            .collect(),
    }
}

pub fn u1() -> User {
    user("coh-u1")
}

pub fn u2() -> User {
    user("coh-u2")
}

/// The gid of [`SHARED_GROUP`].
pub fn shared_gid() -> u32 {
    ensure();
    getent("group", SHARED_GROUP)
        .expect("shared group")
        .split(':')
        .nth(2)
        .unwrap()
        .parse()
        .unwrap()
}

impl User {
    /// `sh -c CMD` as this user (real and effective uid/gid, its groups), in `dir`, with a
    /// clean environment (`PATH`, `HOME=/`, `USER`) plus `env`, killed after 60 s.
    pub fn command(&self, dir: &Path, env: &[(&str, &str)], cmd: &str) -> Command {
        self.argv(dir, env, &["sh", "-c", cmd])
    }

    /// `ARGV...` as this user, like [`User::command`].
    pub fn argv(&self, dir: &Path, env: &[(&str, &str)], argv: &[&str]) -> Command {
        let mut c = Command::new("timeout");
        c.args(["--kill-after=5", "60", "setpriv"])
            .arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .args(["--init-groups", "--"])
            .args(argv)
            .current_dir(dir)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            )
            .env("HOME", "/")
            .env("USER", &self.name)
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        c
    }

    /// Run [`User::command`] and collect its output.
    pub fn sh(&self, dir: &Path, env: &[(&str, &str)], cmd: &str) -> Output {
        self.command(dir, env, cmd).output().expect("spawn setpriv")
    }

    /// Run and assert success; returns stdout.
    pub fn sh_ok(&self, dir: &Path, env: &[(&str, &str)], cmd: &str) -> String {
        let o = self.sh(dir, env, cmd);
        assert!(
            o.status.success(),
            "`{cmd}` as {} failed: {}\nstdout: {}\nstderr: {}",
            self.name,
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}
