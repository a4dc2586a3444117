//! The coherent volume: the parts that make a [`crate::fs::Fs`] coherent, over the
//! store's backing directory, and their wiring (docs/design.md#volume-parts).
//!
//! - `Sessions`: who is calling (a request's process to its session, the name's owner).
//! - `Workspace`: what is on disk at a path (tracked, its stamp, its other
//!   names, its content judged).
//! - `History`: what a write is about to replace, kept.
//! - [`WritePolicy`]: the filesystem's [`Policy`]: decides, counts,
//!   keeps write handles in the `handles` registry.
//! - [`Verbs`]: the verbs server (executes `ctl` requests).
//! - [`ControlFs`]: `.coherent/` as a pseudo filesystem: what its files show each reader
//!   (`control/views.rs`), and a request it asks of the verbs server.
//! - `tell.rs`: refuse and tell, the one recipe for what a refused caller hears.

mod changes;
mod control;
mod handle;
mod handles;
mod history;
mod judge;
mod liveness;
mod policy;
mod sessions;
mod standing;
pub mod state_dir;
mod tell;
mod verbs;
mod waits;
mod workspace;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::coherence::{self, Engine, Timestamp};
use crate::coordinator::{Connect, Coordinator, Embedded};
use crate::fs::{Fs, FsOptions, Policy, PseudoFs};
use crate::identity::{Resolver, ResolverConfig, DEFAULT_SESSION_ENV};
use crate::journal::{Journal, JournalError, JournalOptions};
use crate::store::{Backing, Store};
use crate::tracking::Tracking;
use handles::Handles;
use history::History;
use sessions::Sessions;
use tell::Tell;
use workspace::Workspace;

pub use control::ControlFs;
pub use liveness::{closer_runs, holds_open, session_running, TaskState, FLUSH_PROC_WAIT};
pub use policy::WritePolicy;
pub use state_dir::default_state_dir;
pub use verbs::Verbs;

/// The computed xattrs (docs/design.md#control-surface); every other name passes through to the
/// backing file.
pub use crate::coherence::XATTR_PREFIX;
pub use policy::{XATTR_HANDOFF, XATTR_VERSION};

/// How a [`Volume`] is set up.
#[derive(Debug, Clone)]
pub struct VolumeConfig {
    /// The state directory (journal, snapshot, lock).
    pub state_dir: PathBuf,
    /// `--stale` and `--evict-after`.
    pub engine: coherence::Config,
    /// `--session-env` (empty: the default list of docs/design.md#sessions).
    pub session_env: Vec<String>,
    /// Where the volume is mounted (to recognise the volume's files in `/proc/PID/fd`).
    pub mountpoint: PathBuf,
    /// How long a transfer refused `handoff_in_flight` waits for imminent releases.
    pub in_flight_wait: Duration,
    /// Period of the maintenance thread (eviction, snapshots).
    pub maintain_every: Duration,
    /// `--track-ignored`: what `.gitignore` files ignore is tracked all the same.
    pub track_ignored: bool,
    /// `--coordinator etcd://...`: share records, sessions and versions of handed files
    /// with other hosts, through the coordinator this connects (None: this host's journal
    /// alone). The daemon builds it; the volume does not know which kind it is.
    pub coordinator: Option<Connect>,
    /// Every change of the backing directory goes through this volume: an in-place mount
    /// with no process inside the directory at mount time. Only then are the changes at
    /// `.coherent/changes` complete (docs/git.md); false answers "everything may have
    /// changed".
    pub sole_path: bool,
    /// The processes found inside the directory of an in-place mount before it was
    /// mounted: the changes are complete only once none of them is left inside.
    pub bypassers: Vec<u32>,
    /// The content history (docs/history.md): its bounds, or None when it is off.
    pub history: Option<crate::history::Limits>,
}

impl VolumeConfig {
    pub fn new(state_dir: PathBuf, mountpoint: PathBuf) -> Self {
        VolumeConfig {
            state_dir,
            engine: coherence::Config::default(),
            session_env: Vec::new(),
            mountpoint,
            in_flight_wait: Duration::from_millis(500),
            maintain_every: Duration::from_secs(5),
            track_ignored: false,
            coordinator: None,
            sole_path: false,
            bypassers: Vec::new(),
            history: Some(crate::history::Limits::default()),
        }
    }
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (the identity cache keeps one
/// `/proc/TID/stat` open per cached task, within a quarter of the soft limit). Returns the
/// soft limit now in force.
pub fn raise_nofile_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit {
                rlim_cur: rl.rlim_max,
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return want.rlim_cur;
            }
        }
    }
    rl.rlim_cur
}

/// The volume's parts, wired: the write policy and `.coherent/` for [`Fs`], and the
/// threads that keep the state (maintenance, the answers of waiting `ctl` handles).
/// The owners the parts are built from, each the one owner of its job; a part keeps
/// only the ones it uses.
struct Owners {
    engine: Arc<Engine>,
    journal: Arc<Journal>,
    /// Where shared state is agreed: [`Embedded`] on one host, [`Etcd`] across hosts
    /// (asked [`Coordinator::is_shared`]).
    coord: Arc<dyn Coordinator>,
    backing: Backing,
    /// Who is calling.
    sessions: Arc<Sessions>,
    /// What is on disk at a path.
    ws: Arc<Workspace>,
    /// The paths changed through the volume, for git's fsmonitor.
    changes: Arc<changes::Changes>,
    /// What a refused caller hears.
    tell: Arc<Tell>,
    /// What a write is about to replace, kept.
    history: Arc<History>,
}

pub struct Volume {
    engine: Arc<Engine>,
    journal: Arc<Journal>,
    coord: Arc<dyn Coordinator>,
    sessions: Arc<Sessions>,
    history: Arc<History>,
    policy: Arc<WritePolicy>,
    control: Arc<ControlFs>,
    state_dir: PathBuf,
    maintain_every: Duration,
    stop: Mutex<bool>,
    stop_cv: Condvar,
    maintenance: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The thread that answers pending `wait` requests.
    waiter: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Volume {
    /// Open the state directory (locks it; recovers the journal, logging any repair) and
    /// build the volume over the store's backing directory.
    pub fn open(cfg: VolumeConfig, backing: Backing) -> Result<Arc<Volume>, JournalError> {
        // COHERENT_JOURNAL_BUFFER (bytes): the bound of what the journal keeps in memory
        // while its disk is full (a tuning knob; the tests set it small).
        let mut jopts = JournalOptions::default();
        if let Some(n) = std::env::var("COHERENT_JOURNAL_BUFFER")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            jopts.buffer_limit = n;
        }
        // Only a path nobody else can change (checked before and after the directory is
        // made, so a component made meanwhile is checked too); the journal then opens it
        // and its files without following symlinks.
        let unsafe_path = |why| JournalError::UnsafePath {
            dir: cfg.state_dir.clone(),
            why,
        };
        state_dir::check_trusted_path(&cfg.state_dir).map_err(unsafe_path)?;
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&cfg.state_dir)
            .map_err(|err| JournalError::Io {
                what: format!("create {}", cfg.state_dir.display()),
                err,
            })?;
        state_dir::check_trusted_path(&cfg.state_dir).map_err(unsafe_path)?;
        // The standing waits' file is written through the journal's file I/O too.
        let state_io = jopts.io.clone();
        let opened = Journal::open(&cfg.state_dir, cfg.engine.clone(), jopts)?;
        for w in &opened.warnings {
            tracing::warn!("state recovery: {w}");
        }
        tracing::info!(
            state_dir = %cfg.state_dir.display(),
            from_snapshot = opened.from_snapshot,
            replayed = opened.replayed,
            "state loaded"
        );
        let env_vars = if cfg.session_env.is_empty() {
            DEFAULT_SESSION_ENV.iter().map(|v| v.to_string()).collect()
        } else {
            cfg.session_env.clone()
        };
        let resolver = Arc::new(Resolver::new(ResolverConfig {
            env_vars,
            ..ResolverConfig::default()
        }));
        let tracking = Tracking::new(backing.clone(), cfg.track_ignored);
        let coord: Arc<dyn Coordinator> = match &cfg.coordinator {
            None => Arc::new(Embedded),
            Some(c) => c
                .connect(opened.engine.clone(), opened.journal.clone())
                .map_err(JournalError::Coordinator)?,
        };
        let bypass = changes::Bypass::new(cfg.mountpoint.clone(), backing.fd(), &cfg.bypassers);
        // Other hosts (with a coordinator: a shared workspace) and other clients of a
        // network filesystem write behind the volume's back.
        let sole_path = cfg.sole_path && !coord.is_shared() && changes::local_fs(backing.fd());
        // The history is beside the journal, under the same checks; one that cannot be
        // opened fails the mount (say what to fix), rather than run without it silently.
        let history = match cfg.history {
            None => None,
            Some(limits) => Some(Arc::new(
                crate::history::Store::open(&cfg.state_dir, limits).map_err(|err| {
                    JournalError::Io {
                        what: format!("open the history in {}", cfg.state_dir.display()),
                        err,
                    }
                })?,
            )),
        };
        let judge = workspace::judge(&backing, &opened.engine, &opened.journal);
        let (engine, journal) = (opened.engine, opened.journal);
        let o = Owners {
            sessions: Arc::new(Sessions::new(resolver, engine.clone(), coord.clone())),
            ws: Arc::new(Workspace::new(
                engine.clone(),
                coord.clone(),
                backing.clone(),
                tracking,
                judge,
            )),
            changes: Arc::new(changes::Changes::new(sole_path, bypass)),
            tell: Arc::new(Tell::new(engine.clone(), journal.clone())),
            history: Arc::new(History::new(backing.clone(), engine.clone(), history)),
            engine,
            journal,
            coord,
            backing,
        };
        let handles = Arc::new(Handles::default());
        // Another host's transfer of a file its giver has open for writing here, under
        // any name, is in flight. Weak: the coordinator outlives the handles.
        let (b, h) = (o.backing.clone(), Arc::downgrade(&handles));
        o.coord.watch_writers(Box::new(move |p, giver| {
            let Some(handles) = h.upgrade() else {
                return false;
            };
            b.lstat(p)
                .is_some_and(|st| handles.writes_inode(giver, st.stamp.ino))
        }));
        // A version this host counted that another host's state meets: its copy is read
        // to tell whether it is that version (docs/multi-host.md#copies).
        let b = o.backing.clone();
        o.coord
            .watch_copy(Box::new(move |p| workspace::print_at(b.fd(), p)));
        let policy = Arc::new(WritePolicy::new(&o, handles.clone()));
        let standing = Arc::new(standing::Standing::open(&cfg.state_dir, state_io));
        let verbs = Arc::new(Verbs::new(
            &o,
            handles,
            cfg.mountpoint.clone(),
            cfg.in_flight_wait,
            standing.clone(),
        ));
        let views = control::views::Views::new(&o, standing);
        let v = Arc::new(Volume {
            engine: o.engine,
            journal: o.journal,
            coord: o.coord,
            sessions: o.sessions,
            history: o.history,
            policy,
            control: Arc::new(ControlFs::new(verbs, views)),
            state_dir: cfg.state_dir,
            maintain_every: cfg.maintain_every,
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
            maintenance: Mutex::new(None),
            waiter: Mutex::new(None),
        });
        let bg = v.clone();
        let h = std::thread::Builder::new()
            .name("coherent-maintain".into())
            .spawn(move || bg.maintain_loop())
            .map_err(|err| JournalError::Io {
                what: "spawn the maintenance thread".into(),
                err,
            })?;
        *v.maintenance.lock() = Some(h);
        let bg = v.clone();
        let h = std::thread::Builder::new()
            .name("coherent-wait".into())
            .spawn(move || bg.control.run_waits(|| *bg.stop.lock()))
            .map_err(|err| JournalError::Io {
                what: "spawn the wait thread".into(),
                err,
            })?;
        *v.waiter.lock() = Some(h);
        Ok(v)
    }

    /// The volume and the filesystem it makes coherent, over the backing directory `root`
    /// (an `O_PATH` descriptor), without a mount: what `coherent-mount` serves, for a
    /// caller that drives [`Fs`] itself (tests). The store is opened first so the volume
    /// uses its backing directory.
    pub fn open_fs(
        cfg: VolumeConfig,
        root: OwnedFd,
        opts: FsOptions,
    ) -> Result<(Arc<Volume>, Fs), String> {
        let store = Store::new(root, Some(crate::control::CONTROL_DIR.into()))
            .map_err(|e| format!("cannot open the backing directory: {e}"))?;
        let vol = Volume::open(cfg, store.backing()).map_err(|e| e.to_string())?;
        let fs = Fs::over(store, vol.policy(), Some(vol.control()), opts);
        Ok((vol, fs))
    }

    /// The filesystem's policy.
    pub fn policy(&self) -> Arc<dyn Policy> {
        self.policy.clone()
    }

    /// The `.coherent/` tree.
    pub fn control(&self) -> Arc<dyn PseudoFs> {
        self.control.clone()
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn journal(&self) -> &Arc<Journal> {
        &self.journal
    }

    pub fn resolver(&self) -> &Resolver {
        self.sessions.resolver()
    }

    pub fn coordinator(&self) -> &Arc<dyn Coordinator> {
        &self.coord
    }

    /// Every few seconds: evict ended records past `--evict-after`, snapshot when due.
    fn maintain_loop(&self) {
        let mut rounds = 0u64;
        loop {
            {
                let mut stop = self.stop.lock();
                if !*stop {
                    self.stop_cv.wait_for(&mut stop, self.maintain_every);
                }
                if *stop {
                    return;
                }
            }
            let may_evict = |p: &str| self.coord.may_evict(p);
            let (engine, journal) = (&self.engine, &self.journal);
            match journal.maintain_with(engine, Timestamp::now(), &may_evict) {
                Ok(0) => {}
                Ok(n) => tracing::info!("evicted {n} ended handoff record(s)"),
                Err(e) => tracing::warn!("state maintenance failed: {e}"),
            }
            // About once a minute: the views of sessions gone.
            rounds += 1;
            if rounds % 12 == 0 {
                self.sessions.forget_gone_readers();
                if let Some(h) = self.history.store() {
                    h.prune(Timestamp::now(), true);
                }
            }
        }
    }

    /// At unmount: stop the maintenance thread, write out the log and take a snapshot.
    pub fn shutdown(&self) {
        self.coord.shutdown();
        *self.stop.lock() = true;
        self.stop_cv.notify_all();
        if let Some(h) = self.maintenance.lock().take() {
            let _ = h.join();
        }
        self.engine.poke();
        if let Some(h) = self.waiter.lock().take() {
            let _ = h.join();
        }
        if let Err(e) = self.journal.flush() {
            tracing::warn!("writing the state log at exit failed: {e}");
        }
        match self.journal.checkpoint(&self.engine) {
            Ok(()) => tracing::info!(
                "state saved in {} (seq {})",
                self.state_dir.display(),
                self.engine.last_seq()
            ),
            Err(e) => tracing::warn!("snapshot at exit failed: {e}"),
        }
    }
}
