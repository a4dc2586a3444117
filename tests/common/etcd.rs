//! A real etcd for the tests of the etcd coordinator: one member or three on loopback,
//! started, stopped and killed by `scripts/etcd.sh` (which picks free ports, waits for
//! health and only ever signals the members it started). Removed when dropped.
//!
//! The script's secure default: TLS with client certificates and authentication, so every
//! multi-host test runs the way a volume should. [`Etcd::url`] carries the auth file
//! (`?auth=DIR/auth`), so `--coordinator URL` alone is enough; [`Etcd::etcdctl`] runs as
//! etcd's root (the harness may read and write anything, as the tests of fences need).
//!
//! ```ignore
//! let etcd = Etcd::start(3);
//! let m = Mount::builder().args(["--coordinator", etcd.url()]).start();
//! etcd.kill_member(2);
//! etcd.put("k", "v");
//! assert_eq!(etcd.get_prefix("k"), vec![("k".into(), "v".into())]);
//! ```
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::run_timeout;

/// The repo's script (the one tests and people use).
pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/etcd.sh");

/// Bound on one script run: its own waits are bounded by ETCD_SH_TIMEOUT (30 s).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one etcdctl call (its own --command-timeout is shorter).
const CTL_TIMEOUT: Duration = Duration::from_secs(20);

/// A running etcd cluster under a temporary directory.
pub struct Etcd {
    dir: tempfile::TempDir,
    /// `etcds://127.0.0.1:A[,127.0.0.1:B,...]/default?auth=DIR/auth` (`etcd://...` when
    /// insecure), the value for `--coordinator`.
    pub url: String,
    members: usize,
    secure: bool,
}

impl Etcd {
    /// Start `members` (1 or 3) members and wait until each answers; panics with the
    /// script's stderr when it fails (e.g. etcd not installed: run scripts/deps.sh).
    pub fn start(members: usize) -> Etcd {
        Etcd::start_with(members, true)
    }

    /// [`Etcd::start`] with `scripts/etcd.sh start --insecure`: plain http, no
    /// authentication (the baseline of the measurements, and to show what it exposes).
    pub fn start_insecure(members: usize) -> Etcd {
        Etcd::start_with(members, false)
    }

    /// [`Etcd::start`] with `--listen-ip IP`: the members also serve clients on `ip` (an
    /// address of this host that other network namespaces reach), named in their
    /// certificate. [`Etcd::url_via`] gives the `--coordinator` value through it.
    pub fn start_listening(members: usize, ip: &str) -> Etcd {
        Etcd::start_full(members, true, Some(ip))
    }

    /// [`Etcd::url`] with every member reached at `ip` instead of 127.0.0.1 (same ports).
    pub fn url_via(&self, ip: &str) -> String {
        self.url.replace("127.0.0.1:", &format!("{ip}:"))
    }

    fn start_with(members: usize, secure: bool) -> Etcd {
        Etcd::start_full(members, secure, None)
    }

    fn start_full(members: usize, secure: bool, listen_ip: Option<&str>) -> Etcd {
        let dir = tempfile::Builder::new()
            .prefix("coh-etcd.")
            .tempdir()
            .expect("tempdir");
        let mut e = Etcd {
            dir,
            url: String::new(),
            members,
            secure,
        };
        let n = members.to_string();
        let mut args = vec!["start", "--members", &n];
        if !secure {
            args.push("--insecure");
        }
        if let Some(ip) = listen_ip {
            args.extend(["--listen-ip", ip]);
        }
        let out = e.script(&args);
        e.url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let scheme = if secure { "etcds" } else { "etcd" };
        assert!(
            e.url.starts_with(&format!("{scheme}://127.0.0.1:")) && !e.url.contains('\n'),
            "etcd.sh start printed {:?}, not one {scheme}:// line",
            e.url
        );
        e
    }

    /// The value for `--coordinator`: `etcds://127.0.0.1:A[,..]/default?auth=DIR/auth`
    /// (`etcd://127.0.0.1:A[,..]` when insecure).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `127.0.0.1:A[,..]`, the members' client addresses.
    pub fn endpoints(&self) -> &str {
        let rest = self
            .url
            .trim_start_matches("etcds://")
            .trim_start_matches("etcd://");
        rest.split(['/', '?']).next().unwrap_or(rest)
    }

    /// Started secure (TLS, client certificates, authentication): the default.
    pub fn secure(&self) -> bool {
        self.secure
    }

    /// The `--coordinator-auth` file the script wrote for the mounts (DIR/auth: user
    /// `coherent-default`, whose role reaches only `/coherent/default/`).
    pub fn auth_file(&self) -> PathBuf {
        self.dir().join("auth")
    }

    /// The same for etcd's root (DIR/root-auth).
    pub fn root_auth_file(&self) -> PathBuf {
        self.dir().join("root-auth")
    }

    /// The cluster's CA, client certificate and key (DIR/tls/).
    pub fn tls_file(&self, name: &str) -> PathBuf {
        self.dir().join("tls").join(name)
    }

    /// `--endpoints` for etcdctl: `https://` when secure.
    pub fn ctl_endpoints(&self) -> String {
        let pfx = if self.secure { "https://" } else { "" };
        self.endpoints()
            .split(',')
            .map(|e| format!("{pfx}{e}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// One value of an auth file (`password`, `user`, ...).
    pub fn auth_value(file: &Path, key: &str) -> String {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in {}", file.display()))
            .to_string()
    }

    /// The client endpoint of member `k` (1-based).
    pub fn member_endpoint(&self, k: usize) -> &str {
        assert!((1..=self.members).contains(&k), "no member {k}");
        self.endpoints().split(',').nth(k - 1).expect("endpoint")
    }

    pub fn members(&self) -> usize {
        self.members
    }

    /// The cluster directory (pid files, member-K.log, data).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().join("cluster")
    }

    /// Member `k`'s log (for assertion messages).
    pub fn log(&self, k: usize) -> String {
        std::fs::read_to_string(self.dir().join(format!("member-{k}.log"))).unwrap_or_default()
    }

    /// Stop every member (SIGTERM, waits for each to exit).
    pub fn stop(&self) {
        self.script(&["stop"]);
    }

    /// Stop member `k` (SIGTERM, waits).
    pub fn stop_member(&self, k: usize) {
        self.script(&["stop", "--member", &k.to_string()]);
    }

    /// SIGKILL member `k` (1-based), waits until it is gone.
    pub fn kill_member(&self, k: usize) {
        self.script(&["kill", "--member", &k.to_string()]);
    }

    /// Send `sig` to member `k` (1-based), e.g. `SIGSTOP` for an etcd that keeps its
    /// sockets but answers nothing. Only the process the script started for this cluster:
    /// its pid file, checked against its command line (our data directory).
    pub fn signal_member(&self, k: usize, sig: i32) {
        let pidf = self.dir().join(format!("member-{k}.pid"));
        let pid: i32 = std::fs::read_to_string(&pidf)
            .unwrap_or_else(|e| panic!("{}: {e}", pidf.display()))
            .trim()
            .parse()
            .expect("a pid");
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let data = self.dir().join(format!("member-{k}.data"));
        assert!(
            String::from_utf8_lossy(&cmd).contains(&*data.to_string_lossy()),
            "pid {pid} is not member {k} of {}",
            self.dir().display()
        );
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// Start every stopped member again (same data, same ports); waits until they answer.
    pub fn restart(&self) {
        self.script(&["restart"]);
    }

    /// Start stopped member `k` again; waits until it answers (needs a quorum running).
    pub fn restart_member(&self, k: usize) {
        self.script(&["restart", "--member", &k.to_string()]);
    }

    /// Run etcdctl (API v3) against every member's endpoint, as etcd's root when secure;
    /// the output, whatever the status.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let mut c = self.ctl_command(true);
        run_timeout(c.args(args), CTL_TIMEOUT)
    }

    /// etcdctl with the cluster's CA and client certificate (when secure), as root when
    /// `root` (its password by environment, as nobody else can see it), else as nobody.
    pub fn ctl_command(&self, root: bool) -> Command {
        self.ctl_command_to(root, &self.ctl_endpoints())
    }

    /// [`Etcd::ctl_command`] through `endpoints` only (etcdctl adds up repeated
    /// `--endpoints`, so they are given once).
    pub fn ctl_command_to(&self, root: bool, endpoints: &str) -> Command {
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCDCTL_") && k != "ETCDCTL_API" {
                c.env_remove(k);
            }
        }
        if self.secure {
            c.env("ETCDCTL_CACERT", self.tls_file("ca.pem"))
                .env("ETCDCTL_CERT", self.tls_file("client.pem"))
                .env("ETCDCTL_KEY", self.tls_file("client-key.pem"));
            if root {
                let pw = Etcd::auth_value(&self.root_auth_file(), "password");
                c.env("ETCDCTL_USER", format!("root:{pw}"));
            }
        }
        c.arg(format!("--endpoints={endpoints}"))
            .args(["--dial-timeout=2s", "--command-timeout=5s"]);
        c
    }

    /// etcdctl that must succeed; its stdout. Tried again while etcd answers "leader
    /// changed": the login of an authenticated etcdctl is a proposal, which fails at once
    /// during an election (a member just killed) where a plain read would wait.
    fn etcdctl_ok(&self, args: &[&str]) -> Vec<u8> {
        let mut out = self.etcdctl(args);
        let end = std::time::Instant::now() + CTL_TIMEOUT;
        while !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("leader changed")
            && std::time::Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(50)); // bounded retry of a transient
            out = self.etcdctl(args);
        }
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed ({:?}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Put `key` = `value` (any bytes after `--`, so values may start with '-').
    pub fn put(&self, key: &str, value: &str) {
        let out = self.etcdctl_ok(&["put", "--", key, value]);
        assert_eq!(out, b"OK\n", "etcdctl put {key}");
    }

    /// Every (key, value) under `prefix`, in key order.
    pub fn get_prefix(&self, prefix: &str) -> Vec<(String, String)> {
        let out = self.etcdctl_ok(&["get", "--prefix", "-w", "json", "--", prefix]);
        let v: serde_json::Value = serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("etcdctl json: {e}: {}", String::from_utf8_lossy(&out)));
        let field = |kv: &serde_json::Value, name: &str| {
            // etcdctl's json carries keys and values base64-encoded; absent = empty.
            let s = kv[name].as_str().unwrap_or("");
            String::from_utf8(base64_decode(s)).expect("utf-8 key/value")
        };
        v["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter()
                    .map(|kv| (field(kv, "key"), field(kv, "value")))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Run `scripts/etcd.sh CMD ... --dir <ours>`; panics with its stderr on failure.
    fn script(&self, args: &[&str]) -> Output {
        let out = run_script(args, &self.dir());
        assert!(
            out.status.success(),
            "scripts/etcd.sh {args:?} failed ({:?}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

fn run_script(args: &[&str], dir: &Path) -> Output {
    run_timeout(
        Command::new("bash")
            .arg(SCRIPT)
            .args(args)
            .arg("--dir")
            .arg(dir),
        SCRIPT_TIMEOUT,
    )
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // Never panic in drop (a failing test is already unwinding); the TempDir then
        // removes the data.
        let out = run_script(&["stop"], &self.dir());
        if !out.status.success() {
            eprintln!(
                "etcd.rs: scripts/etcd.sh stop failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Standard base64 (with padding), as etcdctl's json writes bytes.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {s:?}"),
        }
    };
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for chunk in s.trim_end_matches('=').as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &c)| acc | val(c) << (18 - 6 * i));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}
