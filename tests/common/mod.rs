//! A reusable mount harness: runs the real `coherent-mount` binary on temporary
//! directories and always cleans up (SIGTERM, then `umount -l` and SIGKILL), so a killed
//! or hung daemon never hangs a test.
//!
//! ```ignore
//! let m = Mount::builder().arg("--no-passthrough").env("RUST_LOG", "debug").start();
//! std::fs::write(m.path("a"), "x").unwrap();
//! let out = m.sh_env(&[("COHERENT_SESSION", "alice")], "cat a");
//! assert_eq!(out.stdout, b"x");
//! ```
#![allow(dead_code)]

/// A suspend and a wrong wall clock, as a daemon sees them (an LD_PRELOAD clock shim).
pub mod clock;
/// A real etcd (scripts/etcd.sh) for the etcd coordinator's tests.
pub mod etcd;
pub mod hosts;
/// The filesystem type with the real volume policy, no mount (the in-process tests).
pub mod inproc;
/// Hosts in network namespaces (the partition tests).
pub mod netns;
/// The seedable RNG of the randomized tests.
pub mod rng;
/// The oracle of the write-route tables (in process and on a mount).
pub mod routes;
/// SQLite writers through several paths at once (the lock tests).
pub mod sqlite;
/// The real users of the multi-user tests (`coh-u1`, `coh-u2`).
pub mod users;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The daemon and the CLI this build made (build.rs says where: they are other packages'
/// binaries, so cargo gives these tests no CARGO_BIN_EXE_ for them).
pub const BIN: &str = concat!(env!("COHERENT_BIN_DIR"), "/coherent-mount");
pub const CLI: &str = concat!(env!("COHERENT_BIN_DIR"), "/coherent");

/// Refuse to test a stale binary. `cargo test` builds both (each binary's package has tests
/// of its own), but `cargo test --test volume` alone builds neither, and a test run against
/// yesterday's daemon passes or fails for the wrong reason. Each binary is checked against
/// the sources it is built from (the core, the wire and its own crate's `src/`), once per
/// test binary, where the harness starts the daemon or the CLI.
pub fn binaries_are_fresh() {
    static CHECK: std::sync::Once = std::sync::Once::new();
    CHECK.call_once(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let newest = |dirs: &[&str]| {
            let mut newest = std::time::SystemTime::UNIX_EPOCH;
            let mut stack: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
            while let Some(dir) = stack.pop() {
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let (p, Ok(md)) = (e.path(), e.metadata()) else {
                        continue;
                    };
                    if md.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|x| x == "rs") {
                        newest = newest.max(md.modified().unwrap_or(newest));
                    }
                }
            }
            newest
        };
        for (bin, own) in [
            (BIN, "crates/coherent-mount/src"),
            (CLI, "crates/coherent-cli/src"),
        ] {
            let sources = newest(&["src", "crates/coherent-wire/src", own]);
            let built = std::fs::metadata(bin).and_then(|m| m.modified());
            assert!(
                built.as_ref().is_ok_and(|t| *t >= sources),
                "{bin} is missing or older than its sources: run `cargo build --bins` \
                 (or the whole `cargo test`) first"
            );
        }
    });
}

/// How long to wait for a mount to appear or a daemon to exit.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Is there a mount at `p` (an exact mount point in /proc/self/mountinfo)?
pub fn is_mounted(p: &Path) -> bool {
    mount_fstype(p).is_some()
}

/// The filesystem type of the topmost mount at `p`.
pub fn mount_fstype(p: &Path) -> Option<String> {
    coherent::sys::mount_at(p).map(|m| m.fstype)
}

/// Poll `f` every 10 ms until it is true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Wait for a child with a timeout; kill it if it does not exit.
pub fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let st = wait_child_quiet(child, timeout);
    if st.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    st
}

/// A turn at the host's FUSE request-timeout sysctl (`fs.fuse.default_request_timeout`,
/// `max_request_timeout`): every test of the `host` binary holds one for its whole run, so
/// the one that sets the sysctl runs alone, as it did in a binary of its own.
pub fn fuse_sysctl_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's umask, read from /proc/self/status: never set and put back to learn it,
/// as the other tests of the binary share the process.
pub fn process_umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .expect("Umask: in /proc/self/status");
    u32::from_str_radix(line.trim(), 8).unwrap()
}

/// Runs the `#[ignore]`d test `name` of the module `module` (the caller's
/// `module_path!()`) alone in a new process of this test binary: for a test that changes
/// what belongs to the whole process (the umask) or measures it (RSS), which the other
/// tests of the binary share.
pub fn run_alone(module: &str, name: &str, extra: &[&str]) -> Output {
    // A test's name leaves out the crate: `nomount::core_journal` → `core_journal::NAME`.
    let path = module
        .split_once("::")
        .map_or(name.to_string(), |(_, m)| format!("{m}::{name}"));
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &path, "--ignored", "--test-threads=1"])
        .args(extra)
        .output()
        .unwrap()
}

/// Run a command with a timeout (killed when it runs over).
/// Runs `cmd` with `input` on its stdin, fed from a thread so a child that stops reading
/// cannot block the test; its output once it exits.
pub fn run_with_stdin(cmd: &mut Command, input: &str) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let text = input.to_string();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(text.as_bytes());
    });
    let o = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    o
}

pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out_pipe = child.stdout.take().unwrap();
    let err_pipe = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || read_all(out_pipe));
    let t2 = std::thread::spawn(move || read_all(err_pipe));
    let status = wait_child(&mut child, timeout).unwrap_or_else(|| ExitStatus::from_raw(9));
    Output {
        status,
        stdout: t1.join().unwrap(),
        stderr: t2.join().unwrap(),
    }
}

fn read_all(mut r: impl std::io::Read) -> Vec<u8> {
    let mut v = Vec::new();
    let _ = r.read_to_end(&mut v);
    v
}

/// Builder of a [`Mount`].
pub struct Builder {
    args: Vec<String>,
    env: Vec<(String, String)>,
    in_place: bool,
    passthrough: bool,
    nofile: Option<u64>,
}

impl Builder {
    /// Add a `coherent-mount` argument.
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }
    /// Set an environment variable of the daemon.
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    /// Mount over the backing directory itself (`coherent-mount DIR`).
    pub fn in_place(mut self) -> Self {
        self.in_place = true;
        self
    }
    /// Start the daemon under `ulimit -n LIMIT` (soft and hard): set in the daemon's
    /// process only, as the test binary's other tests share the test's process.
    pub fn nofile(mut self, limit: u64) -> Self {
        self.nofile = Some(limit);
        self
    }
    /// `false` adds `--no-passthrough`.
    pub fn passthrough(mut self, on: bool) -> Self {
        self.passthrough = on;
        self
    }
    /// Mount on fresh temporary directories and wait until the mount is live.
    pub fn start(self) -> Mount {
        let dir = tempfile::Builder::new()
            .prefix("coherent-test-")
            .tempdir()
            .expect("tempdir");
        let base = dir.path().canonicalize().unwrap();
        let backing = base.join("backing");
        std::fs::create_dir(&backing).unwrap();
        let mnt = if self.in_place {
            backing.clone()
        } else {
            let m = base.join("mnt");
            std::fs::create_dir(&m).unwrap();
            m
        };
        let log = base.join("daemon.log");
        binaries_are_fresh();
        let mut cmd = Command::new(BIN);
        cmd.arg(&backing);
        if !self.in_place {
            cmd.arg(&mnt);
        }
        if !self.passthrough {
            cmd.arg("--no-passthrough");
        }
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(limit) = self.nofile {
            use std::os::unix::process::CommandExt;
            let rl = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: runs in the forked child before exec; setrlimit is async-signal-safe
            // and only reads the struct, which was made before the fork.
            unsafe {
                cmd.pre_exec(move || match libc::setrlimit(libc::RLIMIT_NOFILE, &rl) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                });
            }
        }
        let child = spawn_mounted(cmd, &mnt, &log);
        Mount {
            dir: Some(dir),
            backing,
            mnt,
            log,
            child: Some(child),
        }
    }
}

/// Run `cmd` (a `coherent-mount` command line) with stdin and stdout on /dev/null and
/// stderr appended to `log`, and wait until `mnt` is a FUSE mount. Panics with the log if
/// the daemon exits first or the mount does not appear in time: the one way every test
/// harness starts a daemon.
pub fn spawn_mounted(mut cmd: Command, mnt: &Path, log: &Path) -> Child {
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the daemon log");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn coherent-mount");
    let ok = wait_until(TIMEOUT, || {
        mount_fstype(mnt).is_some_and(|t| t.starts_with("fuse"))
            || child.try_wait().ok().flatten().is_some()
    });
    let exited = child.try_wait().ok().flatten();
    if !ok || exited.is_some() {
        if exited.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            lazy_umount(mnt);
        }
        panic!(
            "coherent-mount did not mount (exit {exited:?}); log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    child
}

/// A live mount of the real binary on temporary directories.
pub struct Mount {
    dir: Option<tempfile::TempDir>,
    /// The backing directory.
    pub backing: PathBuf,
    /// The mount point (equal to `backing` for an in-place mount).
    pub mnt: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Mount {
    pub fn builder() -> Builder {
        Builder {
            args: Vec::new(),
            env: Vec::new(),
            in_place: false,
            nofile: None,
            passthrough: true,
        }
    }

    /// A mount with default options, with or without passthrough.
    pub fn new(passthrough: bool) -> Mount {
        Mount::builder().passthrough(passthrough).start()
    }

    /// `rel` inside the mount.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    /// `rel` inside the backing directory (not meaningful for in-place mounts).
    pub fn backing_path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.backing.join(rel)
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// What the daemon wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Run `sh -c CMD` in the mount root with extra environment, 60 s timeout.
    pub fn sh_env(&self, env: &[(&str, &str)], cmd: &str) -> Output {
        let mut c = Command::new("sh");
        c.arg("-c").arg(cmd).current_dir(&self.mnt);
        for (k, v) in env {
            c.env(k, v);
        }
        run_timeout(&mut c, Duration::from_secs(60))
    }

    /// Run `sh -c CMD` in the mount root.
    pub fn sh(&self, cmd: &str) -> Output {
        self.sh_env(&[], cmd)
    }

    /// Run `sh -c CMD` in the mount root and assert it succeeds; returns stdout.
    pub fn sh_ok(&self, cmd: &str) -> String {
        let o = self.sh(cmd);
        assert!(
            o.status.success(),
            "`{cmd}` failed: {}\nstdout: {}\nstderr: {}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Send a signal to the daemon.
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// Wait for the daemon to exit (after a signal or an unmount); `None` on timeout.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_child_quiet(self.child.as_mut()?, timeout)
    }

    /// SIGTERM the daemon and wait for it; returns its exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.signal(libc::SIGTERM);
        let st = self.wait_exit(TIMEOUT);
        self.cleanup();
        st
    }

    fn cleanup(&mut self) {
        if let Some(mut c) = self.child.take() {
            if c.try_wait().ok().flatten().is_none() {
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
                if wait_child_quiet(&mut c, Duration::from_secs(5)).is_none() {
                    lazy_umount(&self.mnt);
                    let _ = c.kill();
                    let _ = wait_child_quiet(&mut c, Duration::from_secs(5));
                }
            }
        }
        // A killed daemon leaves a dead mount ("transport endpoint is not connected").
        if is_mounted(&self.mnt) && mount_fstype(&self.mnt).is_some_and(|t| t.starts_with("fuse")) {
            lazy_umount(&self.mnt);
        }
    }
}

/// Wait for a child with a timeout; `None` (child left running) when it does not exit.
pub fn wait_child_quiet(c: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    loop {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `umount -l`, by syscall (no dependency on the umount binary, never blocks).
pub fn lazy_umount(p: &Path) {
    let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.cleanup();
        if let Some(d) = self.dir.take() {
            if is_mounted(&self.mnt) {
                // Never delete through a mount that is still there.
                std::mem::forget(d);
            }
        }
    }
}

/// Generate one test per data mode (`_passthrough` and `_daemon`) from `fn name(&Mount)`.
#[macro_export]
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {
        mod passthrough {
            $( #[test] fn $name() { super::$name(&$crate::common::Mount::new(true)) } )*
        }
        mod daemon {
            $( #[test] fn $name() { super::$name(&$crate::common::Mount::new(false)) } )*
        }
    };
}

/// A `coherent-mount` on a given backing directory, mount point and state directory, so a
/// test can stop it and mount the same workspace again. Cleans up like [`Mount`].
pub struct Remount {
    pub backing: PathBuf,
    pub mnt: PathBuf,
    pub state: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Remount {
    /// Start `coherent-mount BACKING MNT --state-dir STATE ARGS` and wait for the mount.
    pub fn start(base: &Path, args: &[&str]) -> Remount {
        let backing = base.join("backing");
        let mnt = base.join("mnt");
        let state = base.join("state");
        for d in [&backing, &mnt, &state] {
            std::fs::create_dir_all(d).unwrap();
        }
        let log = base.join(format!("daemon-{}.log", std::process::id()));
        binaries_are_fresh();
        let mut cmd = Command::new(BIN);
        cmd.arg(&backing)
            .arg(&mnt)
            .arg("--state-dir")
            .arg(&state)
            .args(args);
        let child = spawn_mounted(cmd, &mnt, &log);
        Remount {
            backing,
            mnt,
            state,
            log,
            child: Some(child),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Signal the daemon and wait for it to exit; then make sure nothing stays mounted
    /// (a daemon killed with SIGKILL leaves a dead mount behind: `umount -l`).
    pub fn stop_with(&mut self, sig: i32) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, sig) };
            if wait_child(&mut c, TIMEOUT).is_none() {
                lazy_umount(&self.mnt);
            }
        }
        if mount_fstype(&self.mnt).is_some_and(|t| t.starts_with("fuse")) {
            lazy_umount(&self.mnt);
        }
        assert!(
            wait_until(TIMEOUT, || mount_fstype(&self.mnt).is_none()),
            "still mounted"
        );
    }
}

impl Drop for Remount {
    fn drop(&mut self) {
        self.stop_with(libc::SIGTERM);
    }
}

/// The cgroup v2 mount of this host, if this process may create cgroups in it.
pub fn writable_cgroup2() -> Option<PathBuf> {
    let mount = coherent::identity::cgroup2_mount().ok()??.mount_point;
    // One probe per call: the tests of one process call this in parallel. A probe left by
    // an earlier, killed run is as good a proof as a new one; removing it may fail for a
    // moment, which says nothing about writability.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = mount.join(format!("coherent-test-probe-{}-{n}", std::process::id()));
    match std::fs::create_dir(&probe) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    let _ = std::fs::remove_dir(&probe);
    Some(mount)
}

/// Remove what `coherent run --session NAME` started by this process may have created: the
/// session cgroup under this process's own cgroup (which the child inherits) or under the
/// hierarchy root. Waits up to `wait` for its processes to leave it.
pub fn remove_session_cgroups(name: &str, wait: Duration) {
    let Some(m) = coherent::identity::cgroup2_mount().ok().flatten() else {
        return;
    };
    let own = std::fs::read("/proc/self/cgroup").unwrap_or_default();
    let parents = coherent::identity::procfs::parse_cgroup_v2(&own)
        .and_then(|cg| m.dir_of(cg))
        .into_iter()
        .chain([m.mount_point.clone()]);
    for p in parents {
        let d = p.join(format!("coherent-session-{name}"));
        wait_until(wait, || std::fs::remove_dir(&d).is_ok() || !d.exists());
    }
}
