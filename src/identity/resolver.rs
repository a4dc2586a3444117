//! pid → session, in the order of docs/design.md#sessions, behind the (tid, stamp) cache.
//!
//! Warm path: a shard lookup, then one read of the task's `stat` to compare its current
//! [`ProcStamp`] with the cached one. That read cannot be skipped: without it nothing tells
//! a live process from a new one that got its pid, or from itself after an `execve`. It is
//! a `pread` of the `/proc/TID/stat` file held open since the cold resolution (bound to
//! that task: it fails once the task is gone, see [`StatFile`]) while the budget of held
//! files lasts, else an open + read + close of `/proc/TID/stat`.
//! Cold path: `/proc/TID` opened once, then `stat`, `status`, `cgroup` and (when the cgroup
//! names no session) `environ` read relative to it, then `stat` again to make sure the task
//! did not die or exec meanwhile.
//!
//! What the cache does not see: a process moved into another cgroup without exec'ing
//! (`echo $$ > .../coherent-session-x/cgroup.procs` from a running shell) keeps the session
//! it was first resolved to until it execs or exits. `coherent run` joins the cgroup before
//! it execs the command, so its commands are resolved afresh.

use super::cache::{CacheStats, Entry, HeldStat, Outcome, PidCache};
use super::directory::SessionDirectory;
use super::procfs::{self, ProcStamp, StatFile, TaskDir};
use super::{session_of_cgroup, Session, SessionInfo, Via, DEFAULT_SESSION_ENV};
use crate::names::validate_session_name;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The default bound of the cache, in tasks (about 150 bytes and one open file each):
/// far more than the tasks that use a workspace at once; dead tasks are never referenced
/// again, so CLOCK evicts them first and their held files are reused.
pub const DEFAULT_CACHE_CAPACITY: usize = 4096;

/// The default number of `/proc/TID/stat` files held open for cheap validation: one per
/// cache slot (also limited to a quarter of the soft `RLIMIT_NOFILE`; the mount may want
/// to raise its soft limit to the hard one).
pub const DEFAULT_HELD_STAT_FILES: usize = DEFAULT_CACHE_CAPACITY;

/// How a [`Resolver`] is set up.
#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// Environment tags in order; `--session-env` replaces the whole list.
    pub env_vars: Vec<String>,
    /// Bound of the cache, in tasks.
    pub capacity: usize,
    /// At most this many cached tasks keep their `stat` open (0: none); the rest are
    /// validated by opening it again. Capped at a quarter of the soft `RLIMIT_NOFILE`.
    pub held_stat_files: usize,
}

impl Default for ResolverConfig {
    fn default() -> Self {
        ResolverConfig {
            env_vars: DEFAULT_SESSION_ENV.iter().map(|v| v.to_string()).collect(),
            capacity: DEFAULT_CACHE_CAPACITY,
            held_stat_files: DEFAULT_HELD_STAT_FILES,
        }
    }
}

/// `wanted`, capped at a quarter of the soft open-file limit: the mount needs its
/// descriptors for the workspace more.
fn held_budget(wanted: usize) -> usize {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 0;
    }
    wanted.min(usize::try_from(rl.rlim_cur / 4).unwrap_or(usize::MAX))
}

/// Why a pid could not be resolved. Callers treat every case as unattributed
/// ([`Resolver::resolve_request`] does).
#[derive(Debug)]
pub enum ResolveError {
    /// Pid 0: the kernel could not name the caller in our pid namespace.
    NoPid,
    /// The task exited (or was replaced) while being resolved.
    Gone { pid: u32 },
    /// `/proc` answered something else (permissions, a malformed file).
    Io { pid: u32, source: io::Error },
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::NoPid => f.write_str("request without a pid"),
            ResolveError::Gone { pid } => write!(f, "process {pid} is gone"),
            ResolveError::Io { pid, source } => write!(f, "reading /proc/{pid}: {source}"),
        }
    }
}

impl std::error::Error for ResolveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ResolveError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn err(pid: u32, e: io::Error) -> ResolveError {
    if procfs::is_gone(&e) {
        ResolveError::Gone { pid }
    } else {
        ResolveError::Io { pid, source: e }
    }
}

/// One fresh (uncached) resolution.
struct Fresh {
    info: SessionInfo,
    stamp: ProcStamp,
    owner: (u32, u64),
    stat_file: StatFile,
}

/// Resolves FUSE request pids to sessions. Share it between worker threads (`&self`).
pub struct Resolver {
    env_vars: Vec<String>,
    cache: PidCache,
    directory: Arc<SessionDirectory>,
    /// Sessions some of whose cached tasks were evicted: the cache alone can no longer
    /// prove them dead.
    spilled: Mutex<HashSet<String>>,
    held: Arc<AtomicUsize>,
    max_held: usize,
    /// (tgid, variable, value) of the ignored tags already logged: once per process.
    warned: Mutex<HashSet<(u32, String, String)>>,
}

/// An environment tag that was present but ignored because its value is not a valid
/// session name (docs/design.md#sessions: ignored loudly, explained by `whoami`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IgnoredTag {
    pub var: String,
    /// The names module's message, naming the value and the rule it breaks.
    pub why: String,
}

/// The bound of [`Resolver`]'s once-per-process log memory; when full it starts afresh
/// (a process may then be logged a second time, never not at all).
const WARNED_MAX: usize = 4096;

impl Default for Resolver {
    fn default() -> Self {
        Resolver::new(ResolverConfig::default())
    }
}

impl Resolver {
    pub fn new(config: ResolverConfig) -> Resolver {
        Resolver::with_directory(config, Arc::new(SessionDirectory::new()))
    }

    /// A resolver that records the sessions it meets in `directory`.
    pub fn with_directory(config: ResolverConfig, directory: Arc<SessionDirectory>) -> Resolver {
        Resolver {
            env_vars: config.env_vars,
            cache: PidCache::new(config.capacity),
            directory,
            spilled: Mutex::new(HashSet::new()),
            held: Arc::new(AtomicUsize::new(0)),
            max_held: held_budget(config.held_stat_files),
            warned: Mutex::new(HashSet::new()),
        }
    }

    pub fn env_vars(&self) -> &[String] {
        &self.env_vars
    }

    /// The known sessions: every session this resolver has resolved a process to.
    pub fn directory(&self) -> &Arc<SessionDirectory> {
        &self.directory
    }

    /// The cache itself, for keyed lookups (tests, diagnostics).
    pub fn cache(&self) -> &PidCache {
        &self.cache
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            held_stat_files: self.held.load(Ordering::Relaxed),
            ..self.cache.stats()
        }
    }

    /// The session of task `tid` (a FUSE request pid: a thread id is fine).
    pub fn resolve(&self, tid: u32) -> Result<Session, ResolveError> {
        if tid == 0 {
            return Err(ResolveError::NoPid);
        }
        match self.cache.peek(tid) {
            Some(e) => {
                let now = match &e.stat_file {
                    // Fails once the cached task is gone: the tid may be someone else's.
                    Some(held) => held.file.read(),
                    // Fails when no task has the tid now (the cold path then says Gone).
                    None => procfs::read_stat(tid),
                };
                if now.is_ok_and(|st| st.stamp == e.stamp) {
                    self.cache.count(tid, Outcome::Hit);
                    return Ok(e.session);
                }
                self.cache.count(tid, Outcome::Stale);
                // Drop it now: its held file goes back to the budget even if `tid` turns
                // out to be gone.
                self.cache.remove(tid, &e.stamp);
            }
            None => self.cache.count(tid, Outcome::Miss),
        }
        let fresh = self.resolve_fresh(tid, true)?;
        let session = self.directory.record(fresh.info);
        let entry = Entry {
            stamp: fresh.stamp,
            session: session.clone(),
            owner: fresh.owner,
            stat_file: HeldStat::hold(fresh.stat_file, &self.held, self.max_held),
        };
        if let Some(evicted) = self.cache.insert(tid, entry) {
            let mut spilled = self.spilled.lock();
            if !spilled.contains(&evicted.session.name) {
                spilled.insert(evicted.session.name.clone());
            }
        }
        Ok(session)
    }

    /// What the mount calls per request: the session of `pid`, or the unattributed
    /// session of the request's `uid` when the pid cannot be resolved (0, or gone).
    pub fn resolve_request(&self, pid: u32, uid: u32) -> Session {
        self.resolve(pid).unwrap_or_else(|e| {
            tracing::debug!("session of pid {pid}: {e}; unattributed");
            self.directory.record(SessionInfo::unattributed(uid))
        })
    }

    /// Resolve `tid` from `/proc` without the cache and without recording the session.
    pub fn resolve_uncached(&self, tid: u32) -> Result<SessionInfo, ResolveError> {
        if tid == 0 {
            return Err(ResolveError::NoPid);
        }
        self.resolve_fresh(tid, true).map(|f| f.info)
    }

    /// `warn`: log ignored (invalid) tags; off for the liveness scan, which would repeat it
    /// for every process on every scan.
    fn resolve_fresh(&self, tid: u32, warn: bool) -> Result<Fresh, ResolveError> {
        let e = |x| err(tid, x);
        let dir = TaskDir::open(tid).map_err(e)?;
        let stat_file = dir.stat_file().map_err(e)?;
        // A task that execs while we read is read again; twice in a row is rare enough.
        for _ in 0..3 {
            let before = stat_file.read().map_err(e)?;
            if before.is_dead() {
                return Err(ResolveError::Gone { pid: tid });
            }
            let (tgid, euid) = dir.tgid_and_euid().map_err(e)?;
            let info = self.classify(tid, &dir, euid, warn.then_some(tgid))?;
            let after = stat_file.read().map_err(e)?;
            if after.is_dead() {
                return Err(ResolveError::Gone { pid: tid });
            }
            if after.stamp != before.stamp {
                continue;
            }
            let start = before.stamp.start_time;
            let owner = if tgid == tid {
                (tid, start)
            } else {
                procfs::read_stat(tgid)
                    .map(|s| (tgid, s.stamp.start_time))
                    .unwrap_or((tid, start))
            };
            return Ok(Fresh {
                info,
                stamp: before.stamp,
                owner,
                stat_file,
            });
        }
        Err(ResolveError::Io {
            pid: tid,
            source: io::Error::other("process keeps changing while being resolved"),
        })
    }

    /// docs/design.md#sessions order: cgroup, then the environment tags, then `uid:UID`.
    /// `warn_for`: the tgid to log ignored tags for (once per process), None to stay quiet.
    fn classify(
        &self,
        tid: u32,
        dir: &TaskDir,
        euid: u32,
        warn_for: Option<u32>,
    ) -> Result<SessionInfo, ResolveError> {
        let e = |x| err(tid, x);
        if let Some(path) = dir.cgroup_v2_path().map_err(e)? {
            if let Some(name) = session_of_cgroup(&path) {
                return Ok(SessionInfo::from_tag(
                    None,
                    name,
                    Via::Cgroup {
                        path: path.to_string(),
                    },
                ));
            }
        }
        let environ = match dir.environ() {
            Ok(env) => env,
            // Another user's process when we are not root: its tags are not ours to see.
            Err(x) if x.kind() == io::ErrorKind::PermissionDenied => Vec::new(),
            Err(x) => return Err(e(x)),
        };
        let (found, ignored) = self.env_tag(&environ);
        if let Some(tgid) = warn_for {
            for t in &ignored {
                self.warn_once(tgid, t);
            }
        }
        Ok(match found {
            Some((var, name)) => SessionInfo::from_tag(
                Some(var),
                name,
                Via::Env {
                    var: var.to_string(),
                },
            ),
            None => SessionInfo::unattributed(euid),
        })
    }

    /// The first configured tag whose value is a valid session name, and the tags before
    /// it that were set but invalid (empty values count as unset).
    fn env_tag<'a>(&'a self, environ: &'a [u8]) -> (Option<(&'a str, &'a str)>, Vec<IgnoredTag>) {
        let mut ignored = Vec::new();
        let values = procfs::env_values(environ, &self.env_vars);
        for (var, value) in self.env_vars.iter().zip(values) {
            let Some(value) = value.filter(|v| !v.is_empty()) else {
                continue;
            };
            let checked = match std::str::from_utf8(value) {
                Ok(v) => validate_session_name(v).map(|_| v),
                Err(_) => Err(format!(
                    "invalid session name {:?}: not UTF-8",
                    String::from_utf8_lossy(value)
                )),
            };
            match checked {
                Ok(name) => return (Some((var.as_str(), name)), ignored),
                Err(why) => ignored.push(IgnoredTag {
                    var: var.clone(),
                    why,
                }),
            }
        }
        (None, ignored)
    }

    fn warn_once(&self, tgid: u32, t: &IgnoredTag) {
        let mut warned = self.warned.lock();
        if warned.len() >= WARNED_MAX {
            warned.clear();
        }
        if warned.insert((tgid, t.var.clone(), t.why.clone())) {
            tracing::warn!("process {tgid}: ignoring {}: {}", t.var, t.why);
        }
    }

    /// The environment tags of `tid` that are set but ignored (invalid names): what
    /// `whoami` explains. Reads `/proc/TID/environ` afresh (whoami is rare); a process whose
    /// cgroup names its session has none (the environment is not consulted).
    pub fn ignored_tags(&self, tid: u32) -> Vec<IgnoredTag> {
        let Ok(dir) = TaskDir::open(tid) else {
            return Vec::new();
        };
        if dir
            .cgroup_v2_path()
            .ok()
            .flatten()
            .is_some_and(|p| session_of_cgroup(&p).is_some())
        {
            return Vec::new();
        }
        let environ = dir.environ().unwrap_or_default();
        self.env_tag(&environ).1
    }

    /// Is any process of session `name` still running? Checks the processes the cache knows
    /// for that session first (one `stat` read per process; dead ones are dropped from the
    /// cache). When none of them lives, scans every process in `/proc` (a few ms per
    /// thousand processes) so that a live process the cache never saw or evicted still
    /// counts. Meant for occasional calls (deciding a `reclaim`), never per request.
    pub fn session_alive(&self, name: &str) -> bool {
        self.session_alive_cached(name) || self.scan_for(name)
    }

    /// Like [`Resolver::session_alive`] but only the cached processes: no `/proc` scan.
    /// A `false` is certain only for sessions none of whose cached tasks were evicted
    /// ([`Resolver::may_have_evicted`]) and whose processes all touched the volume.
    pub fn session_alive_cached(&self, name: &str) -> bool {
        let mut by_owner: HashMap<(u32, u64), Vec<(u32, ProcStamp)>> = HashMap::new();
        for (tid, entry) in self.cache.entries_of(name) {
            by_owner
                .entry(entry.owner)
                .or_default()
                .push((tid, entry.stamp));
        }
        for (owner, tasks) in by_owner {
            if process_alive(owner) {
                return true;
            }
            for (tid, stamp) in tasks {
                self.cache.remove(tid, &stamp);
            }
        }
        false
    }

    /// True when the cache evicted some task of session `name` (so only a scan can tell
    /// whether it still runs).
    pub fn may_have_evicted(&self, name: &str) -> bool {
        self.spilled.lock().contains(name)
    }

    fn scan_for(&self, name: &str) -> bool {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return false;
        };
        dir.filter_map(|d| d.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .any(|pid| {
                self.resolve_fresh(pid, false)
                    .is_ok_and(|f| f.info.name == name)
            })
    }
}

/// The process (tgid, start time) still runs: same start time, not a zombie.
fn process_alive((tgid, start): (u32, u64)) -> bool {
    procfs::read_stat(tgid).is_ok_and(|s| s.stamp.start_time == start && !s.is_dead())
}
