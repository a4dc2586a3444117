//! Which workspace paths the volume tracks (docs/design.md#versions, "Tracked paths").
//!
//! Untracked: a `.git` entry and everything under any `.git/`; paths the workspace's
//! `.gitignore` files ignore (not with `--track-ignored`); paths that `.coherentignore` at
//! the volume root ignores. `.coherentignore` is asked first and has the last word, so a
//! `!pattern` there re-includes what a `.gitignore` ignores. The semantics are git's and the
//! matching is the `ignore` crate's: the deepest `.gitignore` with a matching pattern
//! decides, the last matching pattern of a file wins, and nothing inside an untracked
//! directory is tracked whatever a later pattern says (re-including `target/x` needs
//! `!/target/` first). `.git/info/exclude` and `core.excludesFile` are per clone or per
//! user, not part of the workspace, and are not read.
//!
//! Cost: one cached `Node` per directory holds whether the directory is untracked and the
//! matchers that apply inside it, so a warm [`Tracking::is_tracked`] is one hash lookup plus
//! one match per ignore file on the path (`cargo bench --bench tracking`).
//!
//! Freshness: the volume calls [`Tracking::invalidate`] after a change through the mount to
//! an ignore file (or a rename or removal of a directory), which applies at once. A change
//! behind the volume's back applies within the recheck interval ([`DEFAULT_RECHECK`], 1 s):
//! a node older than that re-stats the ignore files it was built from (inode, size, mtime,
//! ctime) before it answers, and a difference drops every cached node.

use crate::store::Backing;
use ignore::gitignore::{Gitignore, GitignoreBuilder, Glob};
use ignore::Match;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const GITIGNORE: &str = ".gitignore";
pub const COHERENTIGNORE: &str = ".coherentignore";
/// How long a directory's cached answer is trusted before its ignore files are re-stat'ed.
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(1);
/// Bound on cached directories; past it the cache starts over (it refills on demand).
const MAX_DIRS: usize = 1 << 16;
/// Ignore files are read up to this many bytes.
const MAX_IGNORE_FILE: u64 = 1 << 20;

/// Why a path is not tracked: for the `not_tracked` refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Untracked {
    /// The path is a `.git` entry or lies under one; `git_dir` is that `.git`.
    GitDir { git_dir: String },
    /// `path` (the path asked about, or the ancestor directory that decided) matched
    /// `pattern` in the ignore file `file` (workspace-relative).
    Ignored {
        path: String,
        is_dir: bool,
        file: String,
        pattern: String,
    },
}

impl Untracked {
    /// True when `.coherentignore` (not a `.gitignore`) is what ignores the path.
    pub fn by_coherentignore(&self) -> bool {
        matches!(self, Untracked::Ignored { file, .. } if file == COHERENTIGNORE)
    }

    /// The line that re-includes the path when appended to `.coherentignore`.
    pub fn reinclude_pattern(&self) -> Option<String> {
        match self {
            Untracked::GitDir { .. } => None,
            Untracked::Ignored { path, is_dir, .. } => {
                let mut p = String::from("!/");
                for ch in path.chars() {
                    if matches!(ch, '*' | '?' | '[' | '\\') {
                        p.push('\\');
                    }
                    p.push(ch);
                }
                if *is_dir {
                    p.push('/');
                }
                Some(p)
            }
        }
    }
}

impl fmt::Display for Untracked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Untracked::GitDir { git_dir } => write!(
                f,
                "`{git_dir}` is a git directory: paths under `.git/` are never tracked"
            ),
            Untracked::Ignored {
                path,
                is_dir,
                file,
                pattern,
            } => {
                let slash = if *is_dir { "/" } else { "" };
                let again = self.reinclude_pattern().unwrap_or_default();
                write!(f, "`{path}{slash}` is ignored by `{pattern}` in `{file}`; ")?;
                if self.by_coherentignore() {
                    write!(
                        f,
                        "to track it, remove that pattern or add `{again}` after it in `{COHERENTIGNORE}`"
                    )
                } else {
                    write!(
                        f,
                        "to track it, add `{again}` to `{COHERENTIGNORE}` at the volume root, \
                         or mount with `--track-ignored`"
                    )
                }
            }
        }
    }
}

/// What an ignore file looked like when it was read; `None` in a source means absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// The patterns of one ignore file; paths are given to it relative to its directory.
struct Rules {
    gi: Gitignore,
    /// Bytes to cut from a workspace-relative path: the directory and its '/'.
    strip: usize,
}

/// A directory's cached answer.
struct Node {
    /// Why the directory itself (or an ancestor) is untracked; `None` when tracked.
    untracked: Option<Arc<Untracked>>,
    coherent: Option<Arc<Rules>>,
    /// `.gitignore` rules that apply inside this directory, deepest first.
    chain: Vec<Arc<Rules>>,
    /// The ignore files this node was built from and their stamps when they were read.
    sources: Vec<(Arc<str>, Option<Stamp>)>,
    checked_ms: AtomicU64,
}

impl Node {
    /// The ignore pattern that makes `rel` (inside this directory) untracked, if any.
    fn verdict<'a>(&'a self, rel: &str, is_dir: bool) -> Option<&'a Glob> {
        if let Some(c) = &self.coherent {
            match c.gi.matched(rel, is_dir) {
                Match::Ignore(g) => return Some(g),
                Match::Whitelist(_) => return None,
                Match::None => {}
            }
        }
        for r in &self.chain {
            match r.gi.matched(&rel[r.strip..], is_dir) {
                Match::Ignore(g) => return Some(g),
                Match::Whitelist(_) => return None,
                Match::None => {}
            }
        }
        None
    }

    fn tracks(&self, rel: &str, is_dir: bool) -> bool {
        self.untracked.is_none() && self.verdict(rel, is_dir).is_none()
    }
}

struct Cache {
    dirs: HashMap<Box<str>, Arc<Node>>,
    /// Bumped by every drop, so a node built from files read before it is not cached.
    gen: u64,
}

/// Decides whether workspace-relative paths are tracked. Cheap, thread-safe, `&self`.
pub struct Tracking {
    /// The backing directory: the store's descriptor, lent (not a copy of it).
    root: Backing,
    track_ignored: bool,
    recheck_ms: u64,
    cache: RwLock<Cache>,
}

impl fmt::Debug for Tracking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracking")
            .field("track_ignored", &self.track_ignored)
            .field("recheck_ms", &self.recheck_ms)
            .field("cached_dirs", &self.cache.read().dirs.len())
            .finish()
    }
}

impl Tracking {
    /// `root`: the backing directory (`O_PATH` is enough); ignore files are read beneath
    /// it without following symlinks, as git does.
    pub fn new(root: Backing, track_ignored: bool) -> Tracking {
        Tracking {
            root,
            track_ignored,
            recheck_ms: DEFAULT_RECHECK.as_millis() as u64,
            cache: RwLock::new(Cache {
                dirs: HashMap::new(),
                gen: 0,
            }),
        }
    }

    /// [`Tracking::new`] on a directory opened by path.
    pub fn open(root: &Path, track_ignored: bool) -> io::Result<Tracking> {
        let fd = nix::fcntl::open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        // SAFETY: `open` just returned this descriptor and nothing else owns it.
        Ok(Tracking::new(
            Backing::from(unsafe { OwnedFd::from_raw_fd(fd) }),
            track_ignored,
        ))
    }

    /// How long a cached answer is trusted before the ignore files behind it are re-stat'ed
    /// (zero: on every call). Bounds how late a change behind the volume's back applies.
    pub fn with_recheck(mut self, every: Duration) -> Tracking {
        self.recheck_ms = every.as_millis() as u64;
        self
    }

    /// Is the workspace-relative path `rel` tracked? `is_dir` says whether it names a
    /// directory (directory-only patterns such as `target/` need it).
    pub fn is_tracked(&self, rel: &str, is_dir: bool) -> bool {
        let rel = trim(rel);
        if rel.is_empty() {
            return true;
        }
        let (dir, name) = split(rel);
        if name == ".git" {
            return false;
        }
        let now = now_ms();
        {
            let cache = self.cache.read();
            if let Some(n) = cache.dirs.get(dir) {
                if self.fresh(n, now) {
                    return n.tracks(rel, is_dir);
                }
            }
        }
        self.node(dir).tracks(rel, is_dir)
    }

    /// Why `rel` is untracked (`None` when it is tracked): which `.git`, or which file and
    /// pattern, and how to track it (the `Display` of [`Untracked`]).
    pub fn why_untracked(&self, rel: &str, is_dir: bool) -> Option<Untracked> {
        let rel = trim(rel);
        if rel.is_empty() {
            return None;
        }
        let (dir, name) = split(rel);
        if name == ".git" {
            return Some(Untracked::GitDir {
                git_dir: rel.to_string(),
            });
        }
        let node = self.node(dir);
        if let Some(u) = &node.untracked {
            return Some((**u).clone());
        }
        node.verdict(rel, is_dir)
            .map(|g| ignored_by(g, rel, is_dir))
    }

    /// Forget what depends on `rel`: call after a change through the mount to a path named
    /// `.gitignore` or `.coherentignore` (created, written, renamed to or from, removed),
    /// and after a directory is renamed or removed (with both names of a rename).
    pub fn invalidate(&self, rel: &str) {
        let rel = trim(rel);
        let (dir, name) = split(rel);
        // A .gitignore changes what its own directory and everything under it hold; any
        // other path is taken as a directory whose subtree changed.
        let top = if name == GITIGNORE { dir } else { rel };
        let mut cache = self.cache.write();
        cache.gen += 1;
        if top.is_empty() || rel == COHERENTIGNORE {
            cache.dirs.clear();
        } else {
            cache.dirs.retain(|k, _| !within(k, top));
        }
    }

    fn fresh(&self, node: &Node, now: u64) -> bool {
        self.recheck_ms != 0
            && now.saturating_sub(node.checked_ms.load(Ordering::Relaxed)) < self.recheck_ms
    }

    /// The node of directory `dir`, built (parents first) or revalidated as needed.
    fn node(&self, dir: &str) -> Arc<Node> {
        let now = now_ms();
        let hit = self.cache.read().dirs.get(dir).cloned();
        if let Some(n) = hit {
            if self.fresh(&n, now) {
                return n;
            }
            if n.sources.iter().all(|(p, s)| self.stamp(p) == *s) {
                n.checked_ms.store(now, Ordering::Relaxed);
                return n;
            }
            // An ignore file changed behind the volume's back: whatever was built from the
            // old text is stale, which may be any node below it.
            let mut cache = self.cache.write();
            cache.gen += 1;
            cache.dirs.clear();
        }
        let gen = self.cache.read().gen;
        let node = Arc::new(self.build(dir, now));
        let mut cache = self.cache.write();
        if cache.gen == gen {
            if cache.dirs.len() >= MAX_DIRS {
                cache.dirs.clear();
            }
            cache.dirs.insert(dir.into(), node.clone());
        }
        node
    }

    fn build(&self, dir: &str, now: u64) -> Node {
        let mut node = if dir.is_empty() {
            let (coherent, stamp) = self.load("", COHERENTIGNORE);
            Node {
                untracked: None,
                coherent,
                chain: Vec::new(),
                sources: vec![(Arc::from(COHERENTIGNORE), stamp)],
                checked_ms: AtomicU64::new(now),
            }
        } else {
            let (parent_dir, name) = split(dir);
            let parent = self.node(parent_dir);
            let untracked = match &parent.untracked {
                Some(u) => Some(u.clone()),
                None if name == ".git" => Some(Arc::new(Untracked::GitDir {
                    git_dir: dir.to_string(),
                })),
                None => parent
                    .verdict(dir, true)
                    .map(|g| Arc::new(ignored_by(g, dir, true))),
            };
            let tracked = untracked.is_none();
            Node {
                untracked,
                // Nothing inside an untracked directory is asked about its patterns.
                coherent: parent.coherent.clone().filter(|_| tracked),
                chain: if tracked {
                    parent.chain.clone()
                } else {
                    Vec::new()
                },
                sources: parent.sources.clone(),
                checked_ms: AtomicU64::new(now),
            }
        };
        if node.untracked.is_none() && !self.track_ignored {
            let (rules, stamp) = self.load(dir, GITIGNORE);
            node.sources.push((Arc::from(join(dir, GITIGNORE)), stamp));
            if let Some(r) = rules {
                node.chain.insert(0, r);
            }
        }
        node
    }

    /// Reads `dir/file` into rules (`None` when absent, unreadable, or without patterns).
    fn load(&self, dir: &str, file: &str) -> (Option<Arc<Rules>>, Option<Stamp>) {
        let path = join(dir, file);
        let Some(mut f) = self.open_beneath(&path) else {
            return (None, None);
        };
        let Ok(meta) = f.metadata() else {
            return (None, None);
        };
        let stamp = Some(stamp_of(&meta));
        if !meta.is_file() {
            return (None, stamp);
        }
        let mut bytes = Vec::new();
        if let Err(e) = (&mut f).take(MAX_IGNORE_FILE).read_to_end(&mut bytes) {
            tracing::warn!(path = %path, error = %e, "cannot read ignore file");
            return (None, stamp);
        }
        // Paths are handed over relative to `dir` already, so the root must strip nothing.
        let mut b = GitignoreBuilder::new(".");
        let from = PathBuf::from(&path);
        for line in String::from_utf8_lossy(&bytes).lines() {
            // A line git would not understand is skipped, as git does.
            let _ = b.add_line(Some(from.clone()), line);
        }
        match b.build() {
            Ok(gi) if !gi.is_empty() => {
                let strip = if dir.is_empty() { 0 } else { dir.len() + 1 };
                (Some(Arc::new(Rules { gi, strip })), stamp)
            }
            Ok(_) => (None, stamp),
            Err(e) => {
                tracing::warn!(path = %path, error = %e, "ignore file not usable");
                (None, stamp)
            }
        }
    }

    fn stamp(&self, path: &str) -> Option<Stamp> {
        let f = self.open_beneath(path)?;
        f.metadata().ok().map(|m| stamp_of(&m))
    }

    /// Opens a workspace-relative path beneath the root, following no symlink (as git
    /// reads no symlinked .gitignore) and never blocking on a FIFO.
    fn open_beneath(&self, path: &str) -> Option<File> {
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let fd = openat2(self.root.fd().as_raw_fd(), path, how).ok()?;
        // SAFETY: `openat2` just returned this descriptor and nothing else owns it.
        Some(unsafe { File::from_raw_fd(fd) })
    }
}

fn ignored_by(g: &Glob, path: &str, is_dir: bool) -> Untracked {
    Untracked::Ignored {
        path: path.to_string(),
        is_dir,
        file: g
            .from()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        pattern: g.original().to_string(),
    }
}

fn stamp_of(m: &std::fs::Metadata) -> Stamp {
    Stamp {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    }
}

/// `a/b/` or `/a/b` or `./a` → `a/b`, `a`; `.` → the root (empty).
fn trim(rel: &str) -> &str {
    let rel = rel.trim_matches('/');
    let rel = rel.strip_prefix("./").unwrap_or(rel);
    if rel == "." {
        ""
    } else {
        rel
    }
}

/// `a/b/c` → (`a/b`, `c`); `c` → (``, `c`).
fn split(rel: &str) -> (&str, &str) {
    match rel.rfind('/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => ("", rel),
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Is `key` the directory `top` or inside it?
fn within(key: &str, top: &str) -> bool {
    key.strip_prefix(top)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A monotonic millisecond clock cheap enough for every call (the coarse clock is read
/// from the vDSO without a syscall; its tick is a few ms, well inside the recheck bound).
fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised() {
        assert_eq!(trim("/a/b/"), "a/b");
        assert_eq!(trim("./a"), "a");
        assert_eq!(trim("."), "");
        assert_eq!(split("a/b/c"), ("a/b", "c"));
        assert_eq!(split("c"), ("", "c"));
        assert!(within("a/b", "a"));
        assert!(within("a", "a"));
        assert!(!within("ab", "a"));
    }

    #[test]
    fn reinclude_pattern_escapes_globs() {
        let u = Untracked::Ignored {
            path: "a*b/[x]".into(),
            is_dir: true,
            file: GITIGNORE.into(),
            pattern: "a*".into(),
        };
        assert_eq!(u.reinclude_pattern().unwrap(), "!/a\\*b/\\[x]/");
    }
}
