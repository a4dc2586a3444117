//! The coherent volume: the filesystem's [`Policy`] (and, in `surface.rs`, its `.coherent/`
//! backend) made of the identity [`Resolver`], the coherence [`Engine`], the [`Journal`] and
//! the coordinator (docs/design.md#sessions to #state-log).
//!
//! - **Who**: the caller's session is resolved only where a decision needs it: opens and
//!   creates, the metadata write routes of docs/design.md#write-routes, the `user.coherent.handoff`
//!   xattr, opens of `.coherent/` files and writes to `ctl`. Never on read, write, getattr or
//!   lookup.
//! - **Tracked paths** (docs/design.md#versions, [`Tracking`]): checked first on every route; an
//!   untracked path (under `.git/`, ignored by `.gitignore` or `.coherentignore`) passes through
//!   with no session lookup, no engine call and no event. A change through the mount of an
//!   ignore file, or a directory rename, retracks at once.
//! - **Fail closed** (docs/design.md#sessions): a writer whose session cannot be resolved (pid 0,
//!   gone, /proc unreadable) is decided by [`Engine::decide_unresolved`]: refused on a path with a
//!   live record (`denied`, reason `unresolved`), its `uid:UID` elsewhere.
//! - **Tell the writer**: a refusal or a stale write is kept for `.coherent/why` with its
//!   time, and a refused call writes its `denied` event out before it answers.
//! - **The decision**: every write route is decided by [`Engine::decide`] before it
//!   reaches the backing directory (`before_write` turns the route into a
//!   [`coherence::Write`]); the adapter hands the [`Permit`] back to `after_write`, or to
//!   `on_open` for an open that succeeded.
//! - **Write handles**: an open for write is fenced and acquired *before* the backing
//!   file is opened (so a fenced `> plan.md` truncates nothing). The open file's handle
//!   then keeps a `WriteHandle` as its state (`handle.rs`: session, path at open, opener
//!   pid, created?, and one [`handle::State`]), which flush and release use: those
//!   requests may carry pid 0. Read-only opens keep no state (flush and release of them
//!   cost nothing here).
//! - **Commits**: a flush or release whose backing stamp changed commits `Write`; a
//!   handle that created its file commits at its first changed flush or at release (the
//!   create and its writes are one commit); the truncation of an `O_TRUNC` open belongs
//!   to the handle's next changed flush, or its release (so `echo x > f` is one commit). Metadata
//!   routes commit (`unlink`, `link`, `symlink`, `mknod`, `truncate`, `rename`) or restamp
//!   (`chmod`, `chown`, `utimes`, xattrs) afterwards.
//! - **Release or reclaim**: a write handle released without a commit is a `release` when
//!   its last `close(2)` came from a running task (read at that FLUSH, which is
//!   synchronous and carries the closer's pid). Closed by an exiting task (killed, or
//!   exiting with the file open), it is a `reclaim` of the session's holds if every
//!   process of the session is gone (dead, zombie or exiting). Only handles that changed
//!   nothing read `/proc` ([`liveness`]).
//! - **The in-flight race**: FUSE sends RELEASE asynchronously, after `close(2)` returned,
//!   so `echo x > f; coherent transfer f` can reach the transfer first. A transfer refused
//!   `handoff_in_flight` waits (up to [`VolumeConfig::in_flight_wait`]) when every write
//!   handle in the way has been flushed and its opener no longer has the file open, then
//!   tries once more. A descriptor really held open is refused at once.

mod alias;
mod changes;
mod handle;
mod liveness;
mod prune;
mod standing;
pub mod state_dir;
mod surface;
mod waits;

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::access::Who;
use crate::coherence::{self, At, CommitOp, Engine, Found, Permit, Route, Timestamp, Write};
use crate::coordinator::etcd::{Etcd, EtcdSpec};
use crate::coordinator::{Coordinator, Embedded, StepKind, Ticket};
use crate::error::{Reason, Refusal};
use crate::fs::{open_writes, HandleInfo, HandleState, OpenInfo, Policy, WriteRoute};
use crate::identity::{Resolver, ResolverConfig, Session, SessionInfo, Via, DEFAULT_SESSION_ENV};
use crate::journal::{Journal, JournalError, JournalOptions};
use crate::store::{Caller, FsError, FsResult, Stamp};
use crate::tracking::{Tracking, COHERENTIGNORE, GITIGNORE};
use crate::visibility::Sight;
use handle::{End, WriteHandle};

pub use liveness::{closer_runs, holds_open, session_running, TaskState, FLUSH_PROC_WAIT};
pub use state_dir::default_state_dir;

/// The computed xattrs (docs/design.md#control-surface); every other name passes through to the
/// backing file.
pub use crate::coherence::XATTR_PREFIX;
pub const XATTR_VERSION: &str = "user.coherent.version";
pub const XATTR_HANDOFF: &str = "user.coherent.handoff";

/// How long a mount with a coordinator waits for it at start.
const COORDINATOR_WAIT: Duration = Duration::from_secs(10);

/// `renameat2` flag: swap the two names.
const RENAME_EXCHANGE: u32 = 2;

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
    /// with other hosts (None: this host's journal alone).
    pub coordinator: Option<EtcdSpec>,
    /// Every change of the backing directory goes through this volume: an in-place mount
    /// with no process inside the directory at mount time. Only then are the changes at
    /// `.coherent/changes` complete (docs/git.md); false answers "everything may have
    /// changed".
    pub sole_path: bool,
    /// The processes found inside the directory of an in-place mount before it was
    /// mounted: the changes are complete only once none of them is left inside.
    pub bypassers: Vec<u32>,
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

/// A workspace path as the engine keys it (None: the root, a name the store lost, or a
/// name that is not UTF-8, which the volume does not track).
fn rel(path: Option<&Path>) -> Option<&str> {
    path.and_then(Path::to_str)
        .filter(|p| coherence::valid_path(p))
}

fn refused(r: Refusal) -> FsError {
    FsError(r.write_errno())
}

/// The daemon's line for a content check that counted nothing (a changed one is in the
/// state log as `external_change`).
fn log_content(p: &str, c: coherence::Content) {
    use coherence::Content;
    match c {
        Content::Unchanged | Content::Changed => {}
        Content::Same => tracing::info!(
            "{p}: changed behind the volume's back but its content is the same (a \
             metadata-only change, or this copy caught up): restamped, not a change"
        ),
        Content::Behind(v) => tracing::info!(
            "{p}: this copy still holds the content of v{v} (its sync has not arrived): \
             behind, not a change"
        ),
        Content::Unknown => tracing::warn!(
            "{p}: changed behind the volume's back and could not be read to compare its \
             content: nothing counted, any record on it stays live"
        ),
    }
}

/// The write handle kept in an open file's handle (None: a handle without state).
fn write_handle(h: &HandleInfo<'_>) -> Option<Arc<WriteHandle>> {
    h.state?.clone().downcast::<WriteHandle>().ok()
}

/// A write handle's key in [`Volume::handles`] (it is there from its open to its release).
fn key(w: &Arc<WriteHandle>) -> usize {
    Arc::as_ptr(w) as usize
}

/// The engine's stamp of a backing file: (ino, ctime, mtime, size).
fn stamp(s: &Stamp) -> coherence::Stamp {
    let ns = |t: crate::store::Time| t.sec * 1_000_000_000 + i64::from(t.nsec);
    coherence::Stamp {
        ino: s.ino,
        ctime_ns: ns(s.ctime),
        size: s.size,
        mtime_ns: ns(s.mtime),
    }
}

/// What a writer or a verb's caller is told at `.coherent/why`.
enum Told<'a> {
    Refused(&'a Refusal),
    /// A stale write allowed by `--stale warn`: the path, its version, the writer's view.
    Stale(&'a str, u64, u64),
}

/// How long a transfer asks again whether a file is still open for writing where the
/// volume does not see it, before refusing (see [`Volume::unseen_writer`]).
const UNSEEN_WRITER_SETTLE: Duration = Duration::from_millis(100);

/// The coherent volume: the [`Policy`] and the `.coherent/` backend of [`crate::fs::Fs`].
pub struct Volume {
    engine: Arc<Engine>,
    journal: Arc<Journal>,
    /// Where shared state is agreed: [`Embedded`] on one host, [`Etcd`] across hosts.
    coord: Arc<dyn Coordinator>,
    etcd: Option<Arc<Etcd>>,
    resolver: Arc<Resolver>,
    /// The backing directory (`O_PATH`), for the stats that decide what changed.
    root: OwnedFd,
    cfg: VolumeConfig,
    /// The write handles open now, to wait for their release (each lives in the state of
    /// its open file; this only finds them).
    handles: Mutex<HashMap<usize, Arc<WriteHandle>>>,
    /// Inodes seen with more than one name (their other names are restamped after a link,
    /// unlink or rename through the volume).
    linked: Mutex<HashSet<u64>>,
    /// Signalled whenever a write handle is released.
    released: Condvar,
    surface: surface::Surface,
    /// The paths changed through the volume, for git's fsmonitor (`changes.rs`).
    changes: changes::Changes,
    /// Which paths are tracked (docs/design.md#versions): the rest pass through with no version, no
    /// hold, no event and no session lookup.
    tracking: Tracking,
    stop: Mutex<bool>,
    stop_cv: Condvar,
    maintenance: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The thread that answers pending `wait` requests.
    waiter: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Volume {
    /// Open the state directory (locks it; recovers the journal, logging any repair) and
    /// build the volume over the backing directory `root` (an `O_PATH` descriptor).
    pub fn open(cfg: VolumeConfig, root: OwnedFd) -> Result<Arc<Volume>, JournalError> {
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
        let tracking = Tracking::new(
            root.try_clone().map_err(|err| JournalError::Io {
                what: "duplicate the backing directory handle".into(),
                err,
            })?,
            cfg.track_ignored,
        );
        let etcd = match cfg.coordinator.clone() {
            None => None,
            Some(spec) => Some(
                Etcd::start(
                    spec,
                    opened.engine.clone(),
                    opened.journal.clone(),
                    COORDINATOR_WAIT,
                )
                .map_err(JournalError::Coordinator)?,
            ),
        };
        let coord: Arc<dyn Coordinator> = match &etcd {
            Some(e) => e.clone(),
            None => Arc::new(Embedded),
        };
        let bypass = changes::Bypass::new(cfg.mountpoint.clone(), root.as_fd(), &cfg.bypassers);
        // Other hosts (with a coordinator: a shared workspace) and other clients of a
        // network filesystem write behind the volume's back.
        let sole_path =
            cfg.sole_path && cfg.coordinator.is_none() && changes::local_fs(root.as_fd());
        let changes = changes::Changes::new(sole_path, bypass);
        let standing = standing::Standing::open(&cfg.state_dir);
        let v = Arc::new(Volume {
            engine: opened.engine,
            journal: opened.journal,
            coord,
            etcd,
            resolver,
            root,
            cfg,
            handles: Mutex::new(HashMap::new()),
            linked: Mutex::new(HashSet::new()),
            released: Condvar::new(),
            surface: surface::Surface::new(standing),
            changes,
            tracking,
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
            .spawn(move || bg.surface.run_waits(&bg, || *bg.stop.lock()))
            .map_err(|err| JournalError::Io {
                what: "spawn the wait thread".into(),
                err,
            })?;
        *v.waiter.lock() = Some(h);
        Ok(v)
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn journal(&self) -> &Arc<Journal> {
        &self.journal
    }

    pub fn resolver(&self) -> &Resolver {
        &self.resolver
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
                    self.stop_cv.wait_for(&mut stop, self.cfg.maintain_every);
                }
                if *stop {
                    return;
                }
            }
            let may_evict = |p: &str| self.coord.may_evict(p);
            match self
                .journal
                .maintain_with(&self.engine, Timestamp::now(), &may_evict)
            {
                Ok(0) => {}
                Ok(n) => tracing::info!("evicted {n} ended handoff record(s)"),
                Err(e) => tracing::warn!("state maintenance failed: {e}"),
            }
            // About once a minute: the views of sessions gone.
            rounds += 1;
            if rounds % 12 == 0 {
                self.forget_gone_readers();
            }
        }
    }

    /// At unmount: stop the maintenance thread, write out the log and take a snapshot.
    pub fn shutdown(&self) {
        if let Some(e) = &self.etcd {
            e.shutdown();
        }
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
                self.cfg.state_dir.display(),
                self.engine.last_seq()
            ),
            Err(e) => tracing::warn!("snapshot at exit failed: {e}"),
        }
    }

    /// The caller's session, made known to the engine (`session_seen` the first time): a
    /// session is known once any of its processes touched the volume where it resolves.
    /// A session name belongs to the first uid that shows it (docs/design.md#sessions): a process
    /// of another uid carrying it is its own `uid:UID`, marked [`Via::NotYours`].
    fn session(&self, c: &Caller) -> Session {
        self.owned(self.resolver.resolve_request(c.pid, c.uid), c)
    }

    /// `s` as resolved for caller `c`, if `c`'s uid owns the name (docs/design.md#sessions: the
    /// first uid that shows a name owns it); else `c`'s own `uid:UID`, marked with whose name it
    /// showed.
    fn owned(&self, s: Session, c: &Caller) -> Session {
        self.claimed(s, c).unwrap_or_else(|anyone| anyone)
    }

    /// [`Volume::owned`], but `Err` (the caller's `uid:UID`) when the coordinator could
    /// not be asked who owns the name: a writer is then decided as unresolved
    /// (docs/design.md#sessions).
    fn claimed(&self, s: Session, c: &Caller) -> Result<Session, Session> {
        let now = Timestamp::now();
        let claim = match self.coord.claim(&self.engine, &s, c.uid, now) {
            Ok(r) => r,
            Err(r) => {
                tracing::debug!("session {} not claimed: {}", s.name, r.message);
                return Err(Arc::new(SessionInfo::unattributed(c.uid)));
            }
        };
        Ok(match claim {
            Ok(()) => s,
            Err(owner) => {
                let mine = SessionInfo::unattributed(c.uid);
                self.engine.session_seen(&Arc::new(mine.clone()), now);
                Arc::new(SessionInfo {
                    via: Via::NotYours {
                        session: s.name.clone(),
                        owner,
                    },
                    ..mine
                })
            }
        })
    }

    /// The session of a caller about to write (docs/design.md#sessions: fail closed). `Err` carries
    /// the caller's `uid:UID`, under which a write to a path with no live record goes on.
    fn writer(&self, c: &Caller) -> Result<Session, Session> {
        match self.resolver.resolve(c.pid) {
            Ok(s) => self.claimed(s, c),
            Err(e) => {
                tracing::debug!("session of pid {}: {e}; failing closed", c.pid);
                Err(self
                    .resolver
                    .directory()
                    .record(SessionInfo::unattributed(c.uid)))
            }
        }
    }

    /// Is the workspace path `p` tracked (docs/design.md#versions)? `is_dir`: it names a directory.
    /// A path with a live record stays tracked whatever the ignore files say now, so a giver
    /// cannot step out of its fence by ignoring the file it handed on.
    pub fn is_tracked(&self, p: &str, is_dir: bool) -> bool {
        self.tracking.is_tracked(p, is_dir) || self.engine.has_live_record(p)
    }

    /// After a change through the mount of `p`: an ignore file changed, or a directory
    /// moved, so what is tracked may have changed (applies at once).
    fn retrack(&self, p: &str, is_dir: bool) {
        let name = p.rsplit('/').next().unwrap_or(p);
        if is_dir || name == GITIGNORE || p == COHERENTIGNORE {
            self.tracking.invalidate(p);
        }
    }

    /// A write route that succeeded: retrack what it changed (ignore files, a directory
    /// moved). Runs for tracked and untracked paths alike.
    fn retrack_after(&self, route: &WriteRoute<'_>) {
        match *route {
            WriteRoute::Rename { from, to, .. } => {
                let moved_dir = rel(to).is_some_and(|t| self.stat(t).is_some_and(|x| x.1));
                for p in [rel(from), rel(to)].into_iter().flatten() {
                    self.retrack(p, moved_dir);
                }
            }
            WriteRoute::Setattr { path, .. }
            | WriteRoute::Unlink { path }
            | WriteRoute::Symlink { path, .. }
            | WriteRoute::Mknod { path, .. } => {
                if let Some(p) = rel(path) {
                    self.retrack(p, false);
                }
            }
            WriteRoute::Link { to, .. } => {
                if let Some(p) = rel(to) {
                    self.retrack(p, false);
                }
            }
            _ => {}
        }
    }

    /// A write handle flushed or released: if it changed an ignore file, retrack.
    fn retrack_handle(&self, h: &HandleInfo<'_>) {
        if open_writes(h.flags) && h.changed() {
            if let Some(p) = rel(h.path) {
                self.retrack(p, false);
            }
        }
    }

    /// `p` with what the backing directory holds there, if `p` is tracked.
    fn tracked<'p>(&self, p: &'p str) -> (At<'p>, bool) {
        let at = self.at(p);
        let dir = at.found == Found::Dir;
        (at, self.is_tracked(p, dir))
    }

    /// `fstatat` in the backing directory, without following a final symlink.
    fn stat(&self, p: &str) -> Option<(coherence::Stamp, bool)> {
        self.stat_links(p).map(|(s, dir, _)| (s, dir))
    }

    /// [`Volume::stat`] and the number of names of the file (`st_nlink`). A file seen with
    /// several names is remembered in `linked` (see [`Volume::restamp_other_names`]).
    fn stat_links(&self, p: &str) -> Option<(coherence::Stamp, bool, u64)> {
        let st = crate::store::lstat_at(self.root.as_fd(), p)?;
        if !st.dir && st.nlink > 1 {
            self.linked.lock().insert(st.stamp.ino);
        }
        Some((stamp(&st.stamp), st.dir, st.nlink))
    }

    /// A link, unlink or rename through the volume changed the ctime of inode `ino`; its
    /// other tracked names (`except` the ones the operation itself counts) take the new
    /// stamp, so the change is never taken for one behind the volume's back
    /// (docs/design.md#versions). Only for inodes seen with several names.
    fn restamp_other_names(&self, ino: u64, except: &[&str]) {
        if !self.linked.lock().contains(&ino) {
            return;
        }
        for q in self.engine.paths_of_inode(ino) {
            if except.contains(&q.as_str()) {
                continue;
            }
            if let Some(now) = self.stamp_now(&q).filter(|st| st.ino == ino) {
                self.engine.restamp(&q, now);
            }
        }
    }

    /// While the journal sheds (its memory bound reached during a disk outage): the
    /// refusal of a write route touching a path with a live record.
    fn shedding_refusal(&self, w: &Write<'_>) -> Option<Refusal> {
        if !self.journal.is_shedding() {
            return None;
        }
        let p = w
            .names()
            .into_iter()
            .map(|x| x.0)
            .find(|p| self.engine.has_live_record(p))?;
        Some(
            Refusal::new(
                Reason::IoError,
                format!(
                    "write denied: {p_q} is handed on, and the volume cannot record a change of \
                     it now (its state log cannot be written and the events it keeps in \
                     memory reached their bound); refused until the disk takes writes again",
                    p_q = crate::names::display_name(p)
                ),
            )
            .at(p),
        )
    }

    /// A write handle changed its file's ctime but not its content (`touch -a` is an open
    /// for write and a `futimens`): not a commit, so the names of the file take the new
    /// stamp (else the next open would count it as a change behind the volume's back).
    fn restamp_handle(&self, h: &HandleInfo<'_>) {
        if !h.changed() || h.content_changed() {
            return;
        }
        let Some(p) = rel(h.path) else { return };
        let st = stamp(&h.now);
        self.engine.restamp(p, st);
        self.restamp_other_names(st.ino, &[p]);
    }

    /// Show the engine what the backing directory holds at `p` now (versions count
    /// regular files, symlinks and special files, not directories), so an untracked
    /// file starts at v1 and a change behind the volume's back is counted.
    fn observe(&self, p: &str, now: Timestamp) -> Option<(coherence::Stamp, bool)> {
        self.observe_in(&self.engine, p, now)
    }

    /// [`Volume::observe`] through `e` (a step's view of the engine keeps the events).
    fn observe_in(&self, e: &Engine, p: &str, now: Timestamp) -> Option<(coherence::Stamp, bool)> {
        let st = self.stat(p);
        match st {
            Some((_, true)) => {}
            Some((s, false)) => {
                self.observe_file(e, p, s, now);
            }
            None => {
                e.observe(p, None, now);
            }
        }
        st
    }

    /// Shows `e` the file at `p` with stamp `st`, with its fingerprint when only the
    /// content can tell what a changed stamp means (docs/versions-and-holds.md#content).
    fn observe_file(&self, e: &Engine, p: &str, st: coherence::Stamp, now: Timestamp) {
        match self.print_if_wanted(e, p, st) {
            (st, Some(print)) => {
                e.observe_content(p, st, Some(print), now);
            }
            (st, None) => {
                e.observe(p, Some(st), now);
            }
        }
    }

    /// The fingerprint of the file at `p` (seen with stamp `st`) if `e` needs it to judge
    /// the stamp ([`Engine::wants_print`]), with the stamp it was taken at (maybe newer
    /// than `st`). Logs what the content check will find when it counts nothing.
    fn print_if_wanted(
        &self,
        e: &Engine,
        p: &str,
        st: coherence::Stamp,
    ) -> (coherence::Stamp, Option<coherence::Print>) {
        if !e.wants_print(p, &st) {
            return (st, None);
        }
        let (st, print) = match self.print_of(p) {
            Some((now, print)) => (now, Some(print)),
            None => (st, None),
        };
        log_content(p, e.content(p, st, print));
        (st, print)
    }

    /// The fingerprint of the file at `p` now, with the stamp it had while it was read.
    fn print_of(&self, p: &str) -> Option<(coherence::Stamp, coherence::Print)> {
        let fp = crate::store::fingerprint_at(self.root.as_fd(), p)?;
        let print = coherence::Print {
            size: fp.size,
            digest: fp.digest,
        };
        Some((stamp(&fp.stamp), print))
    }

    /// With a coordinator: the fingerprint of what a commit of `p` (a path with records,
    /// which hosts share) made, for the other hosts to compare their copies with.
    fn print_commit(&self, e: &Engine, p: &str, st: coherence::Stamp) {
        if self.etcd.is_none() || !e.has_records(p) {
            return;
        }
        if let Some((now, print)) = self.print_of(p).filter(|(now, _)| *now == st) {
            e.note_print(p, now, print);
        }
    }

    /// Before a write through a file with several names (the fence follows the inode):
    /// the handed paths taken in from another host and not looked at here yet are looked
    /// at now, so this host knows their inode on its own copy (hosts share no stamps).
    fn stamp_handed(&self) {
        if self.etcd.is_none() {
            return;
        }
        let now = Timestamp::now();
        for q in self.engine.unstamped_live_paths() {
            if let Some(st) = self.stamp_now(&q) {
                self.observe_file(&self.engine, &q, st, now);
            }
        }
    }

    /// What the backing directory holds at `p` now, for the write decision (a file with
    /// several names is marked: the fence follows the inode), with the fingerprint the
    /// decision needs to judge a changed stamp.
    fn at<'a>(&self, p: &'a str) -> At<'a> {
        match self.stat_links(p) {
            None => At::new(p, Found::Absent),
            Some((_, true, _)) => At::new(p, Found::Dir),
            Some((s, false, n)) => {
                if n > 1 {
                    self.stamp_handed();
                }
                let (s, print) = self.print_if_wanted(&self.engine, p, s);
                At::new(p, Found::File(s)).linked(n > 1).print(print)
            }
        }
    }

    fn stamp_now(&self, p: &str) -> Option<coherence::Stamp> {
        self.stat(p).filter(|(_, dir)| !dir).map(|(s, _)| s)
    }

    /// `RENAME_EXCHANGE` of `f` and `t` (after it succeeded): two files each take the
    /// other's content (a commit of both); a directory side moves through a temporary
    /// name so the versions under both trees swap.
    fn exchange(&self, e: &Engine, s: &Session, f: &str, t: &str, now: Timestamp) {
        let f_dir = self.stat(f).is_some_and(|x| x.1); // now holds the old t
        let t_dir = self.stat(t).is_some_and(|x| x.1); // now holds the old f
        if !f_dir && !t_dir {
            // An untracked side of the swap is not counted (docs/design.md#versions).
            for p in [f, t].into_iter().filter(|p| self.is_tracked(p, false)) {
                e.commit(s, p, CommitOp::Rename, self.stamp_now(p), now);
            }
            return;
        }
        let tmp = format!("{f}.coherent-exchange-{}", e.last_seq());
        let (old_f_dir, old_t_dir) = (t_dir, f_dir);
        if old_f_dir {
            e.rename(s, f, &tmp, true, None, now);
            e.rename(s, t, f, old_t_dir, self.stamp_now(f), now);
            e.rename(s, &tmp, t, true, None, now);
        } else {
            e.rename(s, t, &tmp, true, None, now);
            e.rename(s, f, t, false, self.stamp_now(t), now);
            e.rename(s, &tmp, f, true, None, now);
        }
    }

    /// What `.coherent/why` shows `s` from now on, with the time it happened: the one place
    /// the volume says it (a refusal the engine made is kept there already, without a
    /// time, and said again here when it reaches the caller).
    fn tell_why(&self, s: &Session, what: Told<'_>, now: Timestamp) {
        let (path, text) = match what {
            Told::Refused(r) => (r.path.as_deref(), r.message.clone()),
            Told::Stale(p, v, seen) => (
                Some(p),
                format!(
                    "stale write: {p_q} is at v{v} but this session last saw v{seen} (another \
                     session changed it since); the write goes on over that change. Read {p_q} \
                     again to see it.",
                    p_q = crate::names::display_name(p)
                ),
            ),
        };
        self.engine.tell(s, path, &text, now);
    }

    /// A transfer was refused because write handles of `s` on `paths` are open. If each
    /// of them is about to be released (flushed, and its opener no longer has the file
    /// open), wait until they are, at most `in_flight_wait`. True: there was something to
    /// wait for and it is gone (try again).
    /// Is `p` open for writing by something other than this volume's own write handles?
    /// `Some(false)` also when the volume has a write handle on any name of the file
    /// (then the kernel's answer covers it too, and cannot be split). `None`: the backing
    /// filesystem cannot tell.
    fn unseen_writer(&self, p: &str) -> Option<bool> {
        if !crate::store::open_for_writing(self.root.as_fd(), p)? {
            return Some(false);
        }
        // Only now: the names of the file (a scan of the engine's paths).
        let mut names = vec![p.to_string()];
        if let Some((st, _)) = self.stat(p) {
            names.extend(self.engine.paths_of_inode(st.ino));
        }
        // A write handle the volume has just released closes its backing file (and the
        // kernel drops its passthrough reference, a deferred close) a moment after the
        // volume hears of it: ask again for a short while before calling a writer unseen.
        let settle = Instant::now() + UNSEEN_WRITER_SETTLE;
        loop {
            if !crate::store::open_for_writing(self.root.as_fd(), p)? {
                return Some(false);
            }
            if self
                .handles
                .lock()
                .values()
                .any(|w| names.contains(&w.path))
            {
                return Some(false);
            }
            if Instant::now() >= settle {
                return Some(true);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Says once per daemon that writers outside the volume cannot be seen on this backing
    /// filesystem, so a transfer cannot check for them.
    fn warn_no_leases(&self, p: &str) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            tracing::warn!(
                "cannot tell whether {p} is open for writing outside the volume (the backing \
                 filesystem grants no file leases): a transfer cannot check for descriptors \
                 from before a restart"
            )
        });
    }

    fn wait_for_releases(&self, s: &Session, paths: &[String]) -> bool {
        let mine = |w: &WriteHandle| w.session.name == s.name && paths.contains(&w.path);
        let pending: Vec<Arc<WriteHandle>> = self
            .handles
            .lock()
            .values()
            .filter(|w| mine(w))
            .cloned()
            .collect();
        if pending.is_empty() {
            return false;
        }
        for w in &pending {
            if !w.flushed() || holds_open(w.pid, &self.cfg.mountpoint.join(&w.path)) {
                return false;
            }
        }
        let deadline = crate::request_timeout::deadline(self.cfg.in_flight_wait);
        let mut handles = self.handles.lock();
        while handles.values().any(|w| mine(w)) {
            if self.released.wait_until(&mut handles, deadline).timed_out() {
                return !handles.values().any(|w| mine(w));
            }
        }
        true
    }
}

/// A write route across hosts (docs/design.md#hosts): see `coordinator` and
/// docs/multi-host.md.
impl Volume {
    /// The names of `w` when it needs the coordinator (a shared path, or a directory
    /// with shared paths under it); `None` on one host or when nothing is shared.
    fn coordinated<'a>(&self, w: &Write<'a>) -> Option<Vec<(&'a str, bool)>> {
        self.coord.host()?;
        let names = w.names();
        self.involves_shared(&names).then_some(names)
    }

    /// Is a name shared, or a directory with shared paths under it? (One host: never,
    /// at no cost.)
    fn involves_shared(&self, names: &[(&str, bool)]) -> bool {
        self.coord.host().is_some()
            && names.iter().any(|(p, dir)| {
                self.coord.shared(&self.engine, p)
                    || (*dir && !self.engine.paths_with_records(p).is_empty())
            })
    }

    /// Decides a write route touching shared paths as one agreed step.
    fn admit(
        &self,
        who: &Result<Session, Session>,
        names: &[(&str, bool)],
        w: Write<'_>,
        decide: impl Fn(&Engine) -> Result<Permit, (Session, Refusal)>,
    ) -> Result<Permit, (Session, Refusal)> {
        let mut out = None;
        let stepped = self
            .coord
            .step(&self.engine, names, StepKind::Admit, &mut |e| {
                let d = decide(e);
                let ok = d.is_ok();
                out = Some(d);
                ok
            });
        let s = match who {
            Ok(s) | Err(s) => s.clone(),
        };
        match stepped {
            Ok(_) => out.expect("the step ran the decision"),
            Err(r) => {
                let p = w.names().first().map_or("", |x| x.0).to_string();
                let r = r.at(p.clone());
                let text =
                    format!(
                    "write denied: {p_q} has a handoff record and the hosts cannot agree on it \
                     now: {}",
                    r.message, p_q = crate::names::display_name(&p));
                Err((s, Refusal { message: text, ..r }))
            }
        }
    }

    /// Runs `f` (engine calls counting what a write route or handle did to `names`, made
    /// through the engine it is given) as an agreed step when a name is shared.
    fn counted(&self, names: &[(&str, bool)], f: impl Fn(&Engine)) {
        if !self.involves_shared(names) {
            f(&self.engine);
            return;
        }
        // A conflict undoes `f` and runs it again on the newer state.
        let r = self
            .coord
            .step(&self.engine, names, StepKind::Commit, &mut |e| {
                f(e);
                true
            });
        if let Err(r) = r {
            tracing::warn!("a change of {:?} was not agreed: {}", names[0].0, r.message);
        }
    }

    /// May write handle `w` (admitted under `ticket`) write now? This host's lease and the
    /// path's epoch ([`Coordinator::admits`]), then the fence as this host knows it now.
    fn handle_write(&self, w: &WriteHandle, ticket: &mut Ticket) -> Result<(), Refusal> {
        self.coord
            .admits(ticket, &w.path)
            .map_err(|r| r.at(w.path.clone()))?;
        if !self.engine.is_fenced(&w.session, &w.path) {
            return Ok(());
        }
        // The deny text of the contract, from the record that fences this session.
        let text = self
            .engine
            .shared_state(&w.path)
            .and_then(|st| {
                let v = st.version;
                st.records
                    .into_iter()
                    .find(|r| r.is_live(v) && r.giver.name == w.session.name)
            })
            .map_or_else(
                || format!("write denied: {} was handed on by this session", w.path),
                |r| coherence::deny_text(&w.path, &r.successor, r.version_at_transfer),
            );
        Err(Refusal::new(Reason::Fenced, text).at(w.path.clone()))
    }

    /// Refuses an agent write while this host cannot confirm its lease (see
    /// [`Coordinator::confirmed`]): `None` when the write may go on.
    fn unconfirmed(
        &self,
        who: &Result<Session, Session>,
        w: &Write<'_>,
    ) -> Option<(Session, Refusal)> {
        let r = self.coord.confirmed().err()?;
        let s = match who {
            // Unattributed processes are never givers: they keep writing.
            Ok(s) if !s.is_attributed() => return None,
            Ok(s) | Err(s) => s.clone(),
        };
        // A giver fenced on the path hears `fenced` (the deny text and its ways out): the
        // engine refuses it on what this host knows, which a lost lease cannot make laxer.
        if w.names().iter().any(|(p, _)| self.engine.is_fenced(&s, p)) {
            return None;
        }
        let p = w.names().first().map_or("", |x| x.0).to_string();
        Some((s, r.at(p)))
    }

    /// What a write route did, counted after it ran (`failed`: it did not).
    fn count_write(
        &self,
        e: &Engine,
        route: &WriteRoute<'_>,
        pm: &Permit,
        failed: bool,
        now: Timestamp,
    ) {
        if pm.alias {
            return self.count_alias(pm, failed);
        }
        let (s, p) = (&pm.session, pm.path.as_str());
        match *route {
            WriteRoute::Open { .. } | WriteRoute::Create { .. } => {
                // The open failed after the acquire: give the hold back.
                if pm.acquired.is_some() {
                    e.close_write(s, p, false, now);
                }
            }
            _ if failed => {}
            WriteRoute::Setattr { set, .. } => {
                if pm.is_dir {
                    return;
                }
                let holds_e = matches!(e.hold(s, p), Some((coherence::Hold::E, _)));
                match self.stamp_now(p) {
                    // A truncate by a session writing the file through a handle (coreutils
                    // `truncate` is open + ftruncate + close) is part of that handle's
                    // commit; any other change of size is a commit of its own.
                    Some(after) if set.size.is_some() && !holds_e => {
                        e.commit(s, p, CommitOp::Truncate, Some(after), now);
                        self.print_commit(e, p, after);
                    }
                    Some(after) => {
                        e.restamp(p, after);
                        self.restamp_other_names(after.ino, &[p]);
                    }
                    None => {}
                }
            }
            WriteRoute::Rename { flags, .. } => {
                let Some(t) = pm.to.as_deref() else { return };
                if flags & RENAME_EXCHANGE != 0 {
                    self.exchange(e, s, p, t, now);
                } else if !pm.is_dir && !self.is_tracked(t, false) {
                    // Moved out of what the volume tracks: the source is removed.
                    e.commit(s, p, CommitOp::RenameAway, None, now);
                } else {
                    let after = if pm.is_dir { None } else { self.stamp_now(t) };
                    e.rename(s, p, t, pm.is_dir, after, now);
                    if let Some(moved) = after {
                        self.restamp_other_names(moved.ino, &[p, t]);
                    }
                }
            }
            WriteRoute::Unlink { .. } => {
                e.commit(s, p, CommitOp::Unlink, None, now);
                if let Some(pre) = pm.pre {
                    self.restamp_other_names(pre.ino, &[p]);
                }
            }
            WriteRoute::Link { .. } if !self.is_tracked(p, false) => {
                // A new untracked name of a tracked file: not a change of its tracked
                // names (§3), which take the new stamp.
                if let Some(after) = self.stamp_now(p) {
                    self.restamp_other_names(after.ino, &[]);
                }
            }
            WriteRoute::Link { .. } | WriteRoute::Symlink { .. } | WriteRoute::Mknod { .. } => {
                let op = match route {
                    WriteRoute::Link { .. } => CommitOp::Link,
                    WriteRoute::Symlink { .. } => CommitOp::Symlink,
                    _ => CommitOp::Mknod,
                };
                let after = self.stamp_now(p);
                e.commit(s, p, op, after, now);
                if let (WriteRoute::Link { .. }, Some(after)) = (route, after) {
                    self.restamp_other_names(after.ino, &[p]);
                }
            }
            WriteRoute::Setxattr { .. } | WriteRoute::Removexattr { .. } => {
                if let Some(after) = self.stamp_now(p) {
                    e.restamp(p, after);
                    self.restamp_other_names(after.ino, &[p]);
                }
            }
            WriteRoute::Mkdir { .. } | WriteRoute::Rmdir { .. } => {}
        }
    }
}

impl Policy for Volume {
    fn before_write(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
    ) -> Result<Option<Permit>, FsError> {
        // An untracked name of a tracked file (a hard link): fenced by inode.
        if let Some(permit) = self.alias_write(caller, route)? {
            return Ok(Some(permit));
        }
        // Tracking first: an untracked path costs no session lookup and no engine lock.
        let w = match *route {
            WriteRoute::Open { path, .. } | WriteRoute::Create { path, .. } => {
                // An open for write names a file (a directory fails EISDIR anyway).
                let Some(p) = rel(path).filter(|p| self.is_tracked(p, false)) else {
                    return Ok(None);
                };
                Write::Open(self.at(p))
            }
            WriteRoute::Setattr { path, .. } => {
                let Some((a, true)) = rel(path).map(|p| self.tracked(p)) else {
                    return Ok(None);
                };
                Write::Setattr(a)
            }
            WriteRoute::Rename { from, to, flags } => {
                let (Some(f), Some(t)) = (rel(from), rel(to)) else {
                    return Ok(None);
                };
                let ((from, ft), (to, tt)) = (self.tracked(f), self.tracked(t));
                // A move across the boundary is decided on both names (a fenced file may
                // not leave by a rename); the after-part counts only the tracked side.
                if !ft && !tt {
                    return Ok(None);
                }
                // The untracked name of a file is not looked at (no entry, no event).
                let from = if ft || from.found == Found::Dir {
                    from
                } else {
                    At::unseen(f)
                };
                let to = if tt || to.found == Found::Dir {
                    to
                } else {
                    At::unseen(t)
                };
                Write::Rename {
                    from,
                    to,
                    exchange: flags & RENAME_EXCHANGE != 0,
                }
            }
            WriteRoute::Unlink { path } => {
                let Some((a, true)) = rel(path).map(|p| self.tracked(p)) else {
                    return Ok(None);
                };
                Write::Unlink(a)
            }
            WriteRoute::Link { from, to } => {
                let from = rel(from).map(|p| self.tracked(p)).filter(|x| x.1);
                let to = rel(to).map(|p| self.tracked(p));
                // The giver cannot give a fenced file another name, tracked or not.
                let to = match (to, from) {
                    (Some((a, true)), _) | (Some((a, false)), Some(_)) => a,
                    _ => return Ok(None),
                };
                Write::Link {
                    from: from.map(|x| x.0),
                    to,
                }
            }
            WriteRoute::Symlink { path, .. } => {
                let Some((a, true)) = rel(path).map(|p| self.tracked(p)) else {
                    return Ok(None);
                };
                Write::Symlink(a)
            }
            WriteRoute::Mknod { path, .. } => {
                let Some((a, true)) = rel(path).map(|p| self.tracked(p)) else {
                    return Ok(None);
                };
                Write::Mknod(a)
            }
            WriteRoute::Setxattr { path, name } | WriteRoute::Removexattr { path, name } => {
                let name = name.as_encoded_bytes();
                let Some((at, true)) = rel(path).map(|p| self.tracked(p)) else {
                    // Untracked (the root too): only the computed-name rule applies.
                    return match coherence::computed_xattr(name) {
                        Some(r) => Err(refused(r)),
                        None => Ok(None),
                    };
                };
                match route {
                    WriteRoute::Setxattr { .. } => Write::Setxattr { at, name },
                    _ => Write::Removexattr { at, name },
                }
            }
            // docs/design.md#write-routes does not fence directories being made or removed (a
            // directory rename is).
            WriteRoute::Mkdir { .. } | WriteRoute::Rmdir { .. } => return Ok(None),
        };
        let now = Timestamp::now();
        let who = self.writer(caller);
        if let Some(r) = self.shedding_refusal(&w) {
            // Past the journal's bound nothing about a handed file can be recorded: fail
            // closed on it; other writes go on.
            if let Ok(s) = &who {
                self.engine.tell(s, r.path.as_deref(), &r.message, now);
            }
            tracing::warn!(pid = caller.pid, "{}", r.message);
            return Err(FsError(libc::EACCES));
        }
        let decide = |e: &Engine| match &who {
            Ok(s) => e.decide(s, w, now).map_err(|r| (s.clone(), r)),
            Err(anyone) => e
                .decide_unresolved(anyone, w, now)
                .map_err(|r| (anyone.clone(), r)),
        };
        let decided = match (self.unconfirmed(&who, &w), self.coordinated(&w)) {
            (Some(refused), _) => Err(refused),
            (None, None) => decide(&self.engine),
            (None, Some(names)) => self.admit(&who, &names, w, decide),
        };
        if let Err((s, r)) = &decided {
            if let (Reason::CoordinatorUnavailable, Some(p)) = (r.reason, r.path.as_deref()) {
                self.engine.denied(s, p, r.reason, w.route(), now);
            }
        }
        match decided {
            Ok(permit) => {
                if let Some(a) = permit.acquired.filter(|a| a.stale) {
                    // `--stale warn`: allowed, and the writer is told.
                    let seen = a.view.unwrap_or(0);
                    let stale = Told::Stale(&permit.path, a.version, seen);
                    self.tell_why(&permit.session, stale, now);
                }
                Ok(Some(permit))
            }
            Err((s, r)) => {
                if r.reason == Reason::Unresolved {
                    tracing::warn!(pid = caller.pid, uid = caller.uid, "{}", r.message);
                } else {
                    self.tell_why(&s, Told::Refused(&r), now);
                }
                // The `denied` event is in the log when the call returns (no fsync).
                if let Err(e) = self.journal.write_out() {
                    tracing::warn!("writing a denied event to the state log: {e}");
                }
                Err(refused(r))
            }
        }
    }

    fn after_write(
        &self,
        _caller: &Caller,
        route: &WriteRoute<'_>,
        permit: Option<Permit>,
        outcome: Result<(), FsError>,
    ) {
        if outcome.is_ok() {
            self.retrack_after(route);
            self.changes.after_write(self.root.as_fd(), route, |dir| {
                // git's own rules: `.coherentignore` is the volume's, not git's.
                self.tracking
                    .why_untracked(dir, true)
                    .is_some_and(|u| !u.by_coherentignore())
            });
        }
        let Some(pm) = permit else { return };
        let now = Timestamp::now();
        let names = [
            (pm.path.as_str(), pm.is_dir),
            (pm.to.as_deref().unwrap_or(""), pm.is_dir),
        ];
        let names = &names[..if pm.to.is_some() { 2 } else { 1 }];
        let failed = outcome.is_err();
        self.counted(names, |e| self.count_write(e, route, &pm, failed, now));
    }

    fn on_open(
        &self,
        caller: &Caller,
        open: &OpenInfo<'_>,
        permit: Option<Permit>,
    ) -> Result<Option<HandleState>, FsError> {
        let now = Timestamp::now();
        // A file just made has no other name; another may have some (one fstatat, only
        // when the ring of changes records).
        self.changes.opened(open, || match open.created {
            true => Some(1),
            false => rel(open.path).and_then(|p| self.stat_links(p)).map(|x| x.2),
        });
        if !open_writes(open.flags) {
            if let Some(p) = rel(open.path).filter(|p| self.is_tracked(p, false)) {
                // A handed file is read at the version the hosts agree on (its view then
                // lets this session hand it on); any other read never waits on etcd.
                if self.coord.shared(&self.engine, p) {
                    self.coord.catch_up();
                }
                let s = self.session(caller);
                let before = self.engine.last_seq();
                self.observe_file(&self.engine, p, stamp(&open.stamp), now);
                self.engine.open_read(&s, p, now);
                // A successor's first open logs `handoff_seen`: in the log when it returns.
                if self.engine.last_seq() != before {
                    if let Err(e) = self.journal.write_out() {
                        tracing::warn!("writing the state log: {e}");
                    }
                }
            }
            return Ok(None);
        }
        if open.flags & libc::O_TRUNC != 0 || open.created {
            if let Some(p) = rel(open.path) {
                self.retrack(p, false);
            }
        }
        // No acquire (an untracked path, a directory): no state.
        let Some(pm) = permit.filter(|pm| pm.acquired.is_some()) else {
            return Ok(None);
        };
        if rel(open.path) != Some(pm.path.as_str()) {
            // Not the file the permit was made for (renamed in between): give the hold back.
            self.engine.close_write(&pm.session, &pm.path, false, now);
            return Ok(None);
        }
        // An O_TRUNC open that emptied the file changed it before the handle's first stamp.
        let dirty =
            open.flags & libc::O_TRUNC != 0 && pm.pre.is_some_and(|pre| pre != stamp(&open.stamp));
        // Multi-host: an agent's handle is checked at each write against what it was
        // admitted under (unattributed processes are never givers).
        let ticket = if pm.session.is_attributed() {
            self.coord.ticket(&pm.path)
        } else {
            None
        };
        let w = Arc::new(
            WriteHandle::new(pm.session, pm.path, caller.pid, open.created, dirty)
                .with_ticket(ticket),
        );
        self.handles.lock().insert(key(&w), w.clone());
        Ok(Some(w))
    }

    fn sees_every_write(&self) -> bool {
        self.coord.host().is_some()
    }

    /// Multi-host: an agent's write handle (one with a ticket) gets no page cache. The
    /// kernel writes a shared mapping's dirty pages back through whichever writable
    /// handle of the file it picks, so a giver's pages could land as another session's
    /// write, past every check of the giver's own handle; with `FOPEN_DIRECT_IO` (and no
    /// `FUSE_DIRECT_IO_ALLOW_MMAP`) the kernel refuses a shared `mmap` of the handle
    /// (`ENODEV`), so such pages never exist (docs/multi-host.md, shared mappings).
    fn direct_io(&self, state: &HandleState) -> bool {
        state
            .downcast_ref::<WriteHandle>()
            .is_some_and(|w| w.ticket.lock().is_some())
    }

    fn before_handle_write(&self, state: Option<&HandleState>) -> Result<(), FsError> {
        let Some(w) = state.and_then(|st| st.downcast_ref::<WriteHandle>()) else {
            return Ok(());
        };
        let mut ticket = w.ticket.lock();
        let Some(ticket) = ticket.as_mut() else {
            return Ok(());
        };
        self.handle_write(w, ticket).map_err(|r| {
            if w.new_refusal(&r.message) {
                // Logged under the route of the handle's open: the write carries it on.
                let now = Timestamp::now();
                self.engine
                    .denied(&w.session, &w.path, r.reason, Route::OpenWrite, now);
                self.tell_why(&w.session, Told::Refused(&r), now);
                if let Err(e) = self.journal.write_out() {
                    tracing::warn!("writing a denied event to the state log: {e}");
                }
            }
            refused(r)
        })
    }

    fn on_flush(&self, caller: &Caller, h: &HandleInfo<'_>) {
        self.retrack_handle(h);
        let Some(w) = write_handle(h) else {
            return;
        };
        self.restamp_handle(h);
        let unsettled = w.flush(h.content_changed(), || {
            // No path: the file was removed while open; its changes have no name to count.
            let Some(p) = rel(h.path) else { return false };
            let now = Timestamp::now();
            self.counted(&[(p, false)], |e| {
                e.commit(&w.session, p, CommitOp::Write, Some(stamp(&h.now)), now);
                self.print_commit(e, p, stamp(&h.now));
            });
            // The handle's own commit moved the path's epoch: still known good (under
            // the same lease), so a later lease compares with the epoch it made.
            if let Some(t) = w.ticket.lock().as_mut() {
                let _ = self.coord.admits(t, &w.path);
            }
            true
        });
        // A FLUSH of an unchanged handle may be its last close: note whether the closer
        // still runs (a deliberate close(2)) or is exiting (killed, or exit with the file
        // open), so RELEASE can tell `release` from `reclaim` even when a quick process is
        // gone by then. The /proc read can block in the kernel while an exiting closer
        // waits for this very FLUSH (seen in the fs_ops locks test), so it runs on its own
        // thread and is waited for only briefly: no answer in time counts as "not known
        // to run", which is what an exiting task would have said.
        if unsettled && w.session.is_attributed() && caller.pid != 0 {
            w.closed_by(closer_runs(caller.pid, FLUSH_PROC_WAIT));
        }
    }

    fn on_release(&self, _caller: &Caller, h: &HandleInfo<'_>) {
        self.retrack_handle(h);
        self.changes.released(h);
        let Some(w) = write_handle(h) else {
            return;
        };
        let now = Timestamp::now();
        self.restamp_handle(h);
        let end = w.release(h.content_changed(), || {
            let Some(p) = rel(h.path) else { return false };
            self.counted(&[(p, false)], |e| {
                e.commit(&w.session, p, CommitOp::Write, Some(stamp(&h.now)), now);
                self.print_commit(e, p, stamp(&h.now));
            });
            true
        });
        // On a shared path, also the hold's end is one step: a step undone meanwhile on
        // this host cannot put back a write handle that is gone.
        let close = |changed: bool| {
            self.counted(&[(w.path.as_str(), false)], |e| {
                e.close_write(&w.session, &w.path, changed, now);
            })
        };
        match end {
            End::Committed => close(true),
            End::MaybeGone if w.session.is_attributed() => {
                // Whether any process of the session is left may need a scan of /proc,
                // which can block on a stuck task anywhere on the host: not on a FUSE
                // thread.
                let (engine, resolver, session, path) = (
                    self.engine.clone(),
                    self.resolver.clone(),
                    w.session.clone(),
                    w.path.clone(),
                );
                std::thread::spawn(move || {
                    let now = Timestamp::now();
                    if session_running(&resolver, &session.name) {
                        engine.close_write(&session, &path, false, now);
                    } else {
                        let n = engine.session_gone(&session, now);
                        tracing::info!(
                            "session {} is gone: reclaimed {n} hold(s)",
                            session.display()
                        );
                    }
                });
            }
            End::MaybeGone | End::Released => close(false),
        }
        self.handles.lock().remove(&key(&w));
        self.released.notify_all();
    }

    fn getxattr(
        &self,
        caller: &Caller,
        _ino: u64,
        path: Option<&Path>,
        name: &OsStr,
    ) -> Option<FsResult<Vec<u8>>> {
        let name = name.to_str()?;
        if !name.starts_with(XATTR_PREFIX) {
            return None;
        }
        let nodata = Some(Err(FsError(libc::ENODATA)));
        let Some(p) = rel(path) else { return nodata };
        let is_dir = self.stat(p).is_some_and(|x| x.1);
        if !self.is_tracked(p, is_dir) {
            return nodata;
        }
        match name {
            XATTR_VERSION => {
                if self.observe(p, Timestamp::now()).is_some_and(|x| x.1) {
                    return nodata;
                }
                match self.engine.version(p) {
                    Some(v) => Some(Ok(v.to_string().into_bytes())),
                    None => nodata,
                }
            }
            XATTR_HANDOFF => {
                let s = self.session(caller);
                // The kernel checked the path's search permission only with
                // default_permissions; the volume checks it in any case
                // (docs/design.md#control-surface).
                let who = Who::of_task(caller.pid, caller.uid, caller.gid);
                if !Sight::new(who).sees(self.root.as_fd(), p) {
                    return nodata;
                }
                match self.engine.handoff(&s, p) {
                    Some(h) => Some(Ok(serde_json::to_vec(&h).expect("records serialise"))),
                    None => nodata,
                }
            }
            _ => nodata,
        }
    }

    // listxattr: the default (nothing added). The computed `user.coherent.*` attributes
    // are readable by name but not listed, so copies (`cp -a`, `shutil.copy2`, `tar
    // --xattrs`, `rsync -X`) neither try to set them nor carry a stale version out.

    fn prefers_name(&self, path: &Path) -> bool {
        rel(Some(path)).is_some_and(|p| self.is_tracked(p, false))
    }
}
