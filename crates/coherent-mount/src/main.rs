//! `coherent-mount BACKING MOUNTPOINT` or `coherent-mount DIR` (docs/design.md#mounting);
//! also the mount helper `mount.fuse.coherent-mount` (fstab, `mount -t fuse.coherent-mount`).

#![deny(clippy::undocumented_unsafe_blocks)]

mod daemon;
mod kernel_flags;
mod mount_opts;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use coherent::coherence;
use coherent::coordinator::{etcd, Connect, Coordinator};
use coherent::fs::{Fs, FsOptions, NoPolicy, Policy};
use coherent::fuse::CoherentFs;
use coherent::store::Store;
use coherent::volume::{default_state_dir, raise_nofile_limit, Volume, VolumeConfig};
use fuser::{Config, MountOption, SessionACL};

/// What `--stale` does with a write from an outdated view
/// (docs/versions-and-holds.md#the-stale-write-guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StaleMode {
    /// Nothing checked, nothing logged (not even a late giver is refused).
    Off,
    /// Allowed and logged (`stale_write`); a late giver is refused.
    Warn,
    /// Refused (`stale_view`) when it can overwrite; an append is allowed and logged.
    Guard,
    /// Every stale write refused, appends too.
    Strict,
}

#[derive(Debug, Parser)]
#[command(
    name = "coherent-mount",
    version,
    about = "Mount a workspace through a coherent FUSE volume",
    long_about = "coherent-mount BACKING MOUNTPOINT mounts BACKING at MOUNTPOINT; \
                  coherent-mount DIR mounts DIR over itself (paths stay the same). \
                  Runs in the foreground with logs on stderr; SIGINT/SIGTERM, umount or \
                  fusermount3 -u unmount it."
)]
struct Args {
    /// The backing directory (or, alone, the directory to mount over in place).
    backing: PathBuf,
    /// Where to mount (omit to mount over BACKING in place).
    mountpoint: Option<PathBuf>,
    /// Detach once the mount is usable (the parent exits 0 then); the log then goes to
    /// --log-file. Implied when run as the mount helper (mount.fuse.coherent-mount).
    #[arg(long)]
    daemon: bool,
    /// Write the log to this file (appended, mode 0600) once the mount is usable. Default
    /// with --daemon: coherent-mount.log in the state directory.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    /// Request threads (each with its own /dev/fuse clone). Default: the number of cores,
    /// at least 2 and at most 8 (more threads than cores only add CPU per request).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    threads: Option<u32>,
    /// How long the kernel may cache names, attributes and failed lookups (e.g. 1s, 10m).
    /// Default: 24h in place (every change goes through the volume), 1s over a separate
    /// backing directory (how late a change made there directly is seen).
    #[arg(long, value_parser = parse_duration)]
    cache_ttl: Option<Duration>,
    /// Serve file data through the daemon instead of FUSE passthrough.
    #[arg(long)]
    no_passthrough: bool,
    /// Mount options, comma-separated: FUSE options (allow_other, default_permissions, ro,
    /// ...), and every flag here as an option (state_dir=DIR, no_passthrough, ...);
    /// fstab's own (defaults, _netdev, nofail, x-systemd.*) are ignored. Run as root, the
    /// volume is mounted with allow_other,default_permissions unless --private.
    #[arg(short = 'o', value_name = "OPT[,OPT]")]
    options: Vec<String>,
    /// Only the mounting user may enter the volume (no allow_other,default_permissions).
    #[arg(long)]
    private: bool,
    /// State directory (default: $XDG_STATE_HOME or ~/.local/state, coherent/, one folder
    /// per backing directory).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// What to do with a write from an outdated view (another session changed the file
    /// since this session last read it).
    #[arg(long, value_enum, default_value_t = StaleMode::Guard)]
    stale: StaleMode,
    /// Keep ended handoff records this long (e.g. 24h, 30m, 90s, 2d).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    evict_after: Duration,
    /// The content history (every committed version, for `coherent log/show/diff/undo`):
    /// the most its blobs may take, e.g. 1G, 500M; 0 turns history off.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    history_max: u64,
    /// Keep a version's content this long after its last use (e.g. 48h, 7d).
    #[arg(long, default_value = "48h", value_parser = parse_duration)]
    history_keep: Duration,
    /// Files larger than this are recorded in the history by digest only (e.g. 16M).
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    history_file_max: u64,
    /// Track what `.gitignore` files ignore (paths under `.git/` and those
    /// `.coherentignore` matches stay untracked).
    #[arg(long)]
    track_ignored: bool,
    /// Environment variable naming the session (repeatable; replaces the default list).
    #[arg(long = "session-env", value_name = "VAR")]
    session_env: Vec<String>,
    /// Share sessions, handoff records and the versions of handed files with the other
    /// hosts mounting this workspace, through etcd:
    /// `etcd[s]://HOST:PORT[,HOST:PORT...][/VOLUME][?auth=FILE]` (etcds: TLS; VOLUME names
    /// the key space, default "default"; ?auth=FILE as --coordinator-auth). Without it:
    /// this host alone.
    #[arg(long, value_name = "URL")]
    coordinator: Option<String>,
    /// With --coordinator: the etcd credentials, KEY=VALUE lines (user=, password=, and
    /// for etcds:// ca=, cert=, key=). It must belong to the mounting user and be closed
    /// to everyone else (chmod 600): whoever can write the key space can lift fences.
    #[arg(long, value_name = "FILE", requires = "coordinator")]
    coordinator_auth: Option<PathBuf>,
    /// This host's name among the hosts of --coordinator (in every event's `host`).
    /// Default: the machine's hostname and the mount point.
    #[arg(long, value_name = "NAME", requires = "coordinator")]
    host_id: Option<String>,
    /// With --coordinator: this host's lease. A host that stops answering is waited for
    /// this long; a host cut off from etcd this long refuses agent writes (e.g. 10s).
    #[arg(long, value_parser = parse_duration, requires = "coordinator")]
    coordinator_ttl: Option<Duration>,
    /// A plain passthrough volume without coherence (no sessions, versions, fences or
    /// .coherent/): the baseline of the enforcement benchmarks.
    #[arg(long, hide = true)]
    no_coherence: bool,
}

/// Request threads by default: one per core, within 2..=8. Measured on 2 cores
/// (tools/uring-probe/README.md, README "Speed"): 2 threads beat 4 and 8, and 1 thread
/// serializes a slow request (a FLUSH waiting on the journal) with everything else.
fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 8)
}

/// A size in bytes: a number with an optional K, M, G or T (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?} (use e.g. 1G, 500M, 4096)"))?;
    let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("bad size unit in {s:?} (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (use e.g. 24h, 30m, 90s, 2d)"))?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("bad duration unit in {s:?} (use s, m, h or d)")),
    };
    Ok(Duration::from_secs(n * mult))
}

/// A one-line user error: printed as `coherent-mount: MESSAGE`, exit status 1.
struct Fail(String);

fn fail<T>(msg: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(msg.into()))
}

/// The FUSE options and who may enter: `-o` as given; run as root (`as_root`) and not
/// `private`, also `allow_other` and `default_permissions` (agents usually run as ordinary
/// users, and the kernel then checks modes and owners as a native filesystem does).
fn mount_options(
    opts: &[String],
    as_root: bool,
    private: bool,
) -> Result<(Vec<MountOption>, SessionACL), Fail> {
    let (mut out, mut acl) = given_options(opts);
    if private {
        if acl != SessionACL::Owner {
            return fail(
                "--private lets only the mounting user in: drop -o allow_other/allow_root",
            );
        }
    } else if as_root {
        if acl == SessionACL::Owner {
            acl = SessionACL::All;
        }
        if !out.contains(&MountOption::DefaultPermissions) {
            out.push(MountOption::DefaultPermissions);
        }
    }
    Ok((out, acl))
}

/// The `-o` FUSE options (already checked by [`mount_opts::rewrite`]) as fuser's options
/// and who may enter.
fn given_options(opts: &[String]) -> (Vec<MountOption>, SessionACL) {
    let mut out = Vec::new();
    let mut acl = SessionACL::Owner;
    for o in opts.iter().flat_map(|s| mount_opts::split_options(s)) {
        match mount_opts::fuse_option(&o) {
            Some(mount_opts::Fuse::Acl(a)) => acl = a,
            Some(mount_opts::Fuse::Opt(m)) => out.push(m),
            // Applied once mounted (kernel_flags).
            None if kernel_flags::is_extra(&o) || o == "remount" => {}
            // Refused before this (rewrite); kept out rather than passed on unchecked.
            None => tracing::warn!("ignoring unknown mount option {o}"),
        }
    }
    (out, acl)
}

fn check_dev_fuse() -> Result<(), Fail> {
    let p = Path::new("/dev/fuse");
    match std::fs::metadata(p) {
        Ok(m) if m.file_type().is_char_device() => {}
        Ok(_) => return fail("/dev/fuse is not the FUSE device (run with the real /dev/fuse, e.g. docker --device /dev/fuse)"),
        Err(_) => return fail("/dev/fuse is missing (load the module with `modprobe fuse`, or give the container --device /dev/fuse)"),
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(p) {
        return fail(format!(
            "/dev/fuse cannot be opened ({e}): run as root or give this user access to /dev/fuse"
        ));
    }
    Ok(())
}

fn check_dir(what: &str, p: &Path) -> Result<PathBuf, Fail> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(p
            .canonicalize()
            .map_err(|e| Fail(format!("{what} {}: {e}", p.display())))?),
        Ok(_) => fail(format!(
            "{what} {} is not a directory (pass a directory)",
            p.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => fail(format!(
            "{what} {} does not exist (create it first: mkdir -p {})",
            p.display(),
            p.display()
        )),
        Err(e) => fail(format!("{what} {}: {e}", p.display())),
    }
}

struct Plan {
    backing: PathBuf,
    mountpoint: PathBuf,
    in_place: bool,
    /// None with --no-coherence.
    state_dir: Option<PathBuf>,
}

fn validate(args: &Args) -> Result<Plan, Fail> {
    let backing = check_dir("backing directory", &args.backing)?;
    let (mountpoint, in_place) = match &args.mountpoint {
        None => (backing.clone(), true),
        Some(m) => {
            let m = check_dir("mountpoint", m)?;
            let same = m == backing;
            (m, same)
        }
    };
    if !in_place {
        if mountpoint.starts_with(&backing) {
            return fail(format!(
                "mountpoint {} is inside the backing directory {} (the volume would contain itself): choose a mountpoint outside it, or mount in place with `coherent-mount {}`",
                mountpoint.display(),
                backing.display(),
                backing.display()
            ));
        }
        if backing.starts_with(&mountpoint) {
            return fail(format!(
                "backing directory {} is inside the mountpoint {} (it would be hidden by the mount): choose a mountpoint outside it",
                backing.display(),
                mountpoint.display()
            ));
        }
    }
    // The topmost mount at that path decides: an existing FUSE volume (another
    // coherent-mount, say) is busy; in the two-argument form any mount is.
    if let Some(coherent::sys::MountEntry { fstype, .. }) = coherent::sys::mount_at(&mountpoint) {
        if !in_place || fstype.starts_with("fuse") {
            return fail(format!(
                "mountpoint {} is busy: a {fstype} filesystem is already mounted there (unmount it first: umount {})",
                mountpoint.display(),
                mountpoint.display()
            ));
        }
    }
    check_dev_fuse()?;
    let state_dir = match &args.state_dir {
        _ if args.no_coherence => None,
        Some(d) => Some(d.clone()),
        None => Some(default_state_dir(&backing).ok_or_else(|| {
            Fail("no state directory: set --state-dir, XDG_STATE_HOME or HOME".into())
        })?),
    };
    Ok(Plan {
        backing,
        mountpoint,
        in_place,
        state_dir,
    })
}

/// The FUSE connection id (the minor device number) of the topmost mount at `p`, from
/// mountinfo (a stat would ask our own, not yet serving, filesystem).
fn connection_of(p: &Path) -> Option<u32> {
    coherent::sys::mount_at(p).map(|m| m.minor)
}

/// Abort a FUSE connection (the last resort when a busy mount cannot be unmounted).
fn abort_connection(minor: u32) {
    let dir = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(dir)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false)
    {
        let _ = nix::mount::mount(
            Some("fusectl"),
            dir,
            Some("fusectl"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        );
    }
    let _ = std::fs::write(dir.join(minor.to_string()).join("abort"), b"1");
}

/// The policy of the filesystem, and the volume behind it (None: no coherence), whose
/// `.coherent/` tree is the filesystem's pseudo backend.
type Layer = (Arc<dyn Policy>, Option<Arc<Volume>>);

/// The enforcement layer plugged into the volume: the coherent [`Volume`] built from
/// `--state-dir`, `--stale`, `--evict-after` and `--session-env` (a plain passthrough
/// volume with the hidden `--no-coherence`). Opens (and locks) the state directory, so a
/// state directory in use fails here, before anything is mounted.
fn make_policy(
    args: &Args,
    plan: &Plan,
    store: &Store,
    bypassers: Vec<u32>,
) -> Result<Layer, Fail> {
    let Some(state_dir) = plan.state_dir.clone() else {
        tracing::info!("--no-coherence: a plain passthrough volume");
        return Ok((Arc::new(NoPolicy), None));
    };
    let limit = raise_nofile_limit();
    tracing::debug!("open file limit: {limit}");
    let mut cfg = VolumeConfig::new(state_dir, plan.mountpoint.clone());
    cfg.history = (args.history_max > 0).then_some(coherent::history::Limits {
        max_bytes: args.history_max,
        keep: args.history_keep,
        max_file: args.history_file_max,
    });
    cfg.engine = coherence::Config {
        stale: match args.stale {
            StaleMode::Off => coherence::StaleMode::Off,
            StaleMode::Warn => coherence::StaleMode::Warn,
            StaleMode::Guard => coherence::StaleMode::Guard,
            StaleMode::Strict => coherence::StaleMode::Strict,
        },
        evict_after: args.evict_after,
        host: None,
    };
    if let Some(url) = &args.coordinator {
        let host = args
            .host_id
            .clone()
            .unwrap_or_else(|| etcd::default_host_id(&plan.mountpoint));
        let ttl = args.coordinator_ttl.unwrap_or(etcd::DEFAULT_TTL);
        let spec = etcd::EtcdSpec::parse(url, args.coordinator_auth.as_deref(), host, ttl)
            .map_err(Fail)?;
        tracing::info!(
            host = %spec.host,
            endpoints = %spec.endpoints.join(","),
            volume = %spec.volume,
            tls = spec.tls,
            user = spec.auth.as_ref().and_then(|a| a.user.as_ref()).map_or("", |u| u.0.as_str()),
            "coordinator: etcd"
        );
        cfg.engine.host = Some(spec.host.clone());
        // The daemon builds the coordinator; the volume connects it once its state is
        // loaded (etcd publishes from the engine and the journal).
        cfg.coordinator = Some(Connect::new(move |engine, journal| {
            etcd::Etcd::start(spec.clone(), engine, journal, COORDINATOR_WAIT)
                .map(|e| e as Arc<dyn Coordinator>)
        }));
    }
    cfg.session_env = args.session_env.clone();
    cfg.track_ignored = args.track_ignored;
    cfg.sole_path = plan.in_place;
    cfg.bypassers = bypassers;
    // The volume works on the store's backing directory: one owner of the descriptor.
    let volume = open_volume(cfg, store, &plan.backing)?;
    Ok((volume.policy(), Some(volume)))
}

/// How long a mount with a coordinator waits for it at start.
const COORDINATOR_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a mount waits for the daemon of an unmounted volume to let go of the state
/// directory (`umount` returns before that daemon has saved its state and exited).
const LET_GO: std::time::Duration = std::time::Duration::from_secs(10);

/// [`Volume::open`], waiting (bounded) while the state directory is held by a daemon
/// whose volume is no longer mounted: `umount; mount` must work, as natively.
fn open_volume(cfg: VolumeConfig, store: &Store, backing: &Path) -> Result<Arc<Volume>, Fail> {
    let start = std::time::Instant::now();
    let mut said = false;
    loop {
        match Volume::open(cfg.clone(), store.backing()) {
            Ok(v) => return Ok(v),
            Err(coherent::journal::JournalError::Locked { pid, .. })
                if start.elapsed() < LET_GO && !backing_mounted(backing) =>
            {
                if !said {
                    tracing::info!(
                        "the state directory is still held by pid {} (an unmounted volume \
                         saving its state): waiting up to {} s",
                        pid.map_or("?".into(), |p| p.to_string()),
                        LET_GO.as_secs()
                    );
                    said = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(Fail(e.to_string())),
        }
    }
}

/// Is a volume of this backing directory mounted (its default source, `coherent:DIR`)?
fn backing_mounted(backing: &Path) -> bool {
    let mut want = std::ffi::OsString::from("coherent:");
    want.push(backing);
    coherent::sys::mounts().is_ok_and(|ms| ms.iter().any(|m| m.is_fuse() && m.source == want))
}

/// Opens the log file before anything is mounted: one that cannot be used (a path another
/// user could change, a symlink, no permission) fails the mount here, clearly, instead of
/// leaving a detached daemon with nowhere to log but the caller's terminal.
fn open_log(path: &Path) -> Result<(PathBuf, std::fs::File), Fail> {
    coherent::volume::state_dir::open_log_file(path)
        .map(|f| (path.to_path_buf(), f))
        .map_err(|why| {
            Fail(format!(
                "cannot log to {}: {why}; fix log_file (--log-file) or leave it out",
                path.display()
            ))
        })
}

fn run(args: Args) -> Result<(), Fail> {
    if VIA_MOUNT_FUSE.load(std::sync::atomic::Ordering::Relaxed) {
        tracing::info!(
            "started by mount.fuse3 (no mount.fuse.coherent-mount helper link): mounting as \
             the mount helper, nodev,nosuid unless -o dev/suid; to let mount(8) run it \
             directly: {}",
            mount_opts::LN_HELPER
        );
    }
    let plan = validate(&args)?;
    let mut log_file = args.log_file.as_deref().map(open_log).transpose()?;
    // Open the backing directory before mounting, so an in-place mount still reaches it.
    let root = Store::open_root(&plan.backing).map_err(|e| {
        Fail(format!(
            "cannot open backing directory {}: {e}",
            plan.backing.display()
        ))
    })?;
    // Only an in-place mount sees every change of its directory, and only once nobody
    // is left inside it underneath (git's fsmonitor trusts the volume only then;
    // docs/git.md).
    let mut bypassers = Vec::new();
    if plan.in_place {
        // Before the mount: these processes keep the directory underneath.
        let inside = daemon::with_progress("looking for processes inside the directory", || {
            coherent::bypass::processes_inside(&plan.backing, std::process::id())
        });
        for p in inside {
            bypassers.push(p.pid);
            tracing::warn!("in-place mount: {p}");
        }
    }
    let ready = if args.daemon {
        Some(daemon::daemonize()?)
    } else {
        None
    };

    // Signals are taken by a dedicated thread; block them before any thread starts (the
    // volume starts its journal and maintenance threads).
    let mut sigs = nix::sys::signal::SigSet::empty();
    sigs.add(nix::sys::signal::SIGINT);
    sigs.add(nix::sys::signal::SIGTERM);
    // A closed terminal must not leave a dead mount behind either.
    sigs.add(nix::sys::signal::SIGHUP);
    sigs.add(nix::sys::signal::SIGUSR1);
    sigs.thread_block()
        .map_err(|e| Fail(format!("sigmask: {e}")))?;

    // The store first: the volume is built over its backing directory. `.coherent` is
    // hidden in the backing directory only when the volume serves it.
    let hidden = plan
        .state_dir
        .as_ref()
        .map(|_| coherent_wire::control::CONTROL_DIR.into());
    let store = daemon::with_progress("opening the backing directory", || Store::new(root, hidden))
        .map_err(|e| Fail(format!("backing directory {}: {e}", plan.backing.display())))?;
    let (policy, volume) = daemon::with_progress("loading the state", || {
        make_policy(&args, &plan, &store, bypassers)
    })?;
    if let (None, true, Some(d)) = (&log_file, args.daemon, &plan.state_dir) {
        // the state directory is made and checked by now
        log_file = Some(open_log(&d.join("coherent-mount.log"))?);
    }
    let mut fs_opts = FsOptions::for_mount(plan.in_place);
    fs_opts.passthrough = !args.no_passthrough;
    if let Some(ttl) = args.cache_ttl {
        fs_opts.ttl = ttl;
    }
    tracing::info!(
        "cache policy: cache ttl {}s for names, attributes and failed lookups; directory \
         listings {}",
        fs_opts.ttl.as_secs(),
        if fs_opts.cache_dirs {
            "kept by the kernel"
        } else {
            "read at each opendir"
        }
    );
    let pseudo = volume.as_ref().map(|v| v.control());
    // The daemon's own umask is 0: creates set the caller's on their own thread, and a
    // thread that cannot have one masks the mode itself (src/store/umask.rs).
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    let fs = CoherentFs::new(Fs::over(store, policy, pseudo, fs_opts));

    let as_root = nix::unistd::geteuid().is_root();
    let (mut mopts, acl) = mount_options(&args.options, as_root, args.private)?;
    if !mopts.iter().any(|o| matches!(o, MountOption::FSName(_))) {
        mopts.push(MountOption::FSName(format!(
            "coherent:{}",
            plan.backing.display()
        )));
    }
    let mut config = Config::default();
    config.mount_options = mopts;
    config.acl = acl;
    let threads = args.threads.map_or_else(default_threads, |n| n as usize);
    config.n_threads = Some(threads);
    config.clone_fd = true;

    tracing::info!(
        backing = %plan.backing.display(),
        mountpoint = %plan.mountpoint.display(),
        in_place = plan.in_place,
        threads,
        stale = ?args.stale,
        evict_after = ?args.evict_after,
        session_env = ?args.session_env,
        track_ignored = args.track_ignored,
        state_dir = ?args.state_dir,
        "mounting"
    );
    // What the kernel lets a request wait, read for the connection about to be made.
    if let Some(t) = coherent::request_timeout::at_mount() {
        tracing::info!(
            "the kernel aborts this mount if a request waits over {t} s \
             (fs.fuse.default_request_timeout, max_request_timeout): no request is held \
             over {:.1} s",
            coherent::request_timeout::budget().map_or(0.0, |b| b.as_secs_f64())
        );
    }
    let inodes = fs.fs().store().inode_gauge();
    let counters = fs.counters.clone();
    let inval = fs.inval.clone();
    let mut session = fuser::Session::new(fs, &plan.mountpoint, &config).map_err(|e| {
        Fail(format!(
            "cannot mount on {}: {e} (is /dev/fuse usable and the mountpoint free?)",
            plan.mountpoint.display()
        ))
    })?;
    inval.set(session.notifier());
    // The kernel's flags fuser has no option for (nodiratime, strictatime, ...).
    let opts: Vec<String> = args
        .options
        .iter()
        .flat_map(|l| mount_opts::split_options(l))
        .collect();
    if opts.iter().any(|o| kernel_flags::is_extra(o)) {
        kernel_flags::remount(&plan.mountpoint, &opts).map_err(Fail)?;
    }
    let mut unmounter = session.unmount_callable();
    let conn = connection_of(&plan.mountpoint);
    tracing::info!(mountpoint = %plan.mountpoint.display(), "mounted");

    let mountpoint = plan.mountpoint.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = loop {
                let Ok(sig) = sigs.wait() else { return };
                if sig != nix::sys::signal::SIGUSR1 {
                    break sig;
                }
                // SIGUSR1: a diagnostic line (used by the tests to check lookup counts).
                tracing::info!(
                    "stats: inodes in use: {}, daemon reads: {}, daemon writes: {}, requests: {}",
                    inodes.load(std::sync::atomic::Ordering::Relaxed),
                    counters.reads.load(std::sync::atomic::Ordering::Relaxed),
                    counters.writes.load(std::sync::atomic::Ordering::Relaxed),
                    counters.summary()
                );
            };
            tracing::info!("{sig}: unmounting {}", mountpoint.display());
            if let Err(e) = unmounter.unmount() {
                // Busy (files still open): detach now, and abort the connection so the
                // request loop ends instead of waiting for the last close.
                tracing::warn!("unmount failed ({e}); detaching lazily");
                let _ = nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH);
                if let Some(minor) = conn {
                    abort_connection(minor);
                }
            }
        })
        .map_err(|e| Fail(format!("thread: {e}")))?;

    daemon::Readiness {
        probe: match volume {
            Some(_) => plan.mountpoint.join(".coherent"),
            None => plan.mountpoint.clone(),
        },
        parent: ready,
        log_file,
    }
    .spawn()?;
    let r = session.run();
    if let Some(v) = volume {
        v.shutdown();
    }
    match r {
        Ok(()) => {
            tracing::info!("unmounted, exiting");
            Ok(())
        }
        Err(e) => fail(format!("request loop ended with an error: {e}")),
    }
}

/// The `-o` options in order when they ask for a remount.
fn remount_of(options: &[String]) -> Option<Vec<String>> {
    let all: Vec<String> = options
        .iter()
        .flat_map(|l| mount_opts::split_options(l))
        .collect();
    all.iter().any(|o| o == "remount").then_some(all)
}

/// Started by mount(8) through mount.fuse3 rather than the helper link (said in the log).
static VIA_MOUNT_FUSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The arguments, with `-o` expanded and the mount-helper convention read, and whether
/// it runs as mount(8)'s helper; `Ok(None)`: nothing to mount (`--man`, or mount(8)'s
/// `-f` after every check passed).
fn parse_args() -> Result<Option<(Args, bool)>, Fail> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "--man") {
        // For packaging: the manual page as roff.
        clap_mangen::Man::new(Args::command())
            .render(&mut std::io::stdout())
            .map_err(|e| Fail(format!("cannot write the man page: {e}")))?;
        return Ok(None);
    }
    // mount(8) waits for its helper, also one it reached through mount.fuse3 (no
    // `mount.fuse.coherent-mount` link): a daemon in the foreground would hang it.
    let by_mount = mount_opts::started_by_mount(&argv, &mount_opts::ancestors(3));
    let inv = mount_opts::rewrite::<Args>(argv, by_mount).map_err(Fail)?;
    let matches = Args::command()
        .try_get_matches_from(&inv.args)
        .unwrap_or_else(|e| e.exit());
    let mut args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // mount(8) waits for its helper: detach once usable.
    args.daemon |= inv.helper;
    if inv.via_mount_fuse {
        VIA_MOUNT_FUSE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let as_root = nix::unistd::geteuid().is_root();
    if inv.helper && as_root {
        // mount(8) mounts every filesystem dev,suid for root unless told nodev/nosuid,
        // and passes neither `dev` nor `suid` on (they are the default).
        let given: Vec<String> = args
            .options
            .iter()
            .flat_map(|l| mount_opts::split_options(l))
            .collect();
        for (on, off) in [("dev", "nodev"), ("suid", "nosuid")] {
            if !given.iter().any(|x| x == on || x == off) {
                args.options.push(on.into());
            }
        }
    }
    if let Some(opts) = remount_of(&args.options) {
        // A remount changes the flags of the volume mounted there; nothing else starts.
        let mnt = args.mountpoint.as_ref().unwrap_or(&args.backing);
        kernel_flags::remount(mnt, &opts).map_err(Fail)?;
        return Ok(None);
    }
    if inv.fake {
        validate(&args)?;
        mount_options(
            &args.options,
            nix::unistd::geteuid().is_root(),
            args.private,
        )?;
        return Ok(None);
    }
    Ok(Some((args, inv.helper)))
}

fn main() -> ExitCode {
    let (args, helper) = match parse_args() {
        Ok(Some(parsed)) => parsed,
        Ok(None) => return ExitCode::SUCCESS,
        Err(Fail(msg)) => {
            eprintln!("coherent-mount: {msg}");
            return ExitCode::FAILURE;
        }
    };
    if args.daemon || args.log_file.is_some() {
        daemon::Sink::keep_early(helper);
    }
    // Colour only for a terminal that keeps the log.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && !args.daemon
        && args.log_file.is_none();
    tracing_subscriber::fmt()
        .with_writer(daemon::Sink)
        .with_ansi(ansi)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(msg)) => {
            eprintln!("coherent-mount: {msg}");
            ExitCode::FAILURE
        }
    }
}
