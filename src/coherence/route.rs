//! The write decision (docs/design.md#holds, docs/design.md#write-routes): every write route of a
//! session is decided by [`Engine::decide`] in one locked pass: what the backing directory holds
//! now (a change behind the volume's back is counted first), the per-route rules below, the fence,
//! and for an open for write the stale guard and the acquire. The mount turns its request into
//! a [`Write`] and keeps the [`Permit`] for the part after the operation.

use parking_lot::MutexGuard;

use super::engine::*;
use super::time::Timestamp;
use super::types::*;
use crate::error::{Reason, Refusal};
use crate::identity::Session;

/// The computed xattrs (docs/design.md#control-surface) live under this prefix: readable, never set
/// or removed.
pub const XATTR_PREFIX: &str = "user.coherent.";

/// The rule for setting or removing xattr `name` on any path, tracked or not: a
/// computed name (`user.coherent.*`) is refused (`EACCES`, no event); any other passes.
pub fn computed_xattr(name: &[u8]) -> Option<Refusal> {
    name.starts_with(XATTR_PREFIX.as_bytes()).then(|| {
        Refusal::new(
            Reason::SessionNotYours,
            format!(
                "{} is computed by the volume: it cannot be set or removed",
                String::from_utf8_lossy(name)
            ),
        )
    })
}

/// Whom a live record refuses (see [`Engine::refuse_live`]). Here, with the write routes
/// that pick it: `ops.rs` takes it from this file, and this file takes nothing from `ops.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Against {
    /// The record's giver: it is fenced.
    Giver,
    /// Any caller whose session could not be resolved (fail closed).
    Unresolved,
}

/// What the backing directory holds at a path right now (the mount's `fstatat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Absent,
    /// A regular file, symlink or special file (versions count these).
    File(Stamp),
    Dir,
    /// The caller did not look (core tests and benches): nothing is observed.
    Unseen,
}

/// A path of a write route and what the backing directory holds there now.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub path: &'a str,
    pub found: Found,
    /// The file there has other names (hard links: `st_nlink` > 1): the fence follows the
    /// inode, so those names are checked too.
    pub linked: bool,
    /// The fingerprint of the file there, when the mount took one (it does when
    /// [`Engine::wants_print`] asks): the content check of a changed stamp.
    pub print: Option<Print>,
}

impl<'a> At<'a> {
    pub fn new(path: &'a str, found: Found) -> Self {
        At {
            path,
            found,
            linked: false,
            print: None,
        }
    }

    /// The same, with the file's fingerprint (see [`At::print`]).
    pub fn print(mut self, print: Option<Print>) -> Self {
        self.print = print;
        self
    }

    /// The same, for a file with other names (see [`At::linked`]).
    pub fn linked(mut self, linked: bool) -> Self {
        self.linked = linked;
        self
    }

    /// A path the caller did not stat.
    pub fn unseen(path: &'a str) -> Self {
        At::new(path, Found::Unseen)
    }

    fn stamp(&self) -> Option<Stamp> {
        match self.found {
            Found::File(s) => Some(s),
            _ => None,
        }
    }
}

/// What a write can do to the bytes already at its path: the one fact of the request the
/// stale guard needs (docs/versions-and-holds.md#the-stale-write-guard). The mount
/// derives it from the open flags or the setattr; the core never sees either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// It can replace or remove what is there: an open for write without `O_APPEND` (or
    /// with `O_TRUNC`), a truncate, a rename onto the path.
    Overwrite,
    /// It can only add after what is there: an `O_APPEND` open without `O_TRUNC`.
    Append,
}

/// A write route of docs/design.md#write-routes as the core decides it: the path(s) and the facts
/// the rules need. `mkdir` and `rmdir` are not among them: docs/design.md#write-routes fences no
/// directory being made or removed (a directory rename is).
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    /// `open`/`create` with `O_WRONLY`, `O_RDWR` or `O_TRUNC` (one that can overwrite):
    /// the fence, the stale guard, then an `E` hold (an acquire). A directory is not
    /// acquired (the open fails with `EISDIR` anyway).
    Open(At<'a>),
    /// `open`/`create` with `O_APPEND` and without `O_TRUNC`: as [`Write::Open`], but the
    /// stale guard of `--stale guard` lets it go on (with `stale_write`).
    Append(At<'a>),
    /// `chmod`/`chown`/`utimes`: a setattr that keeps the size.
    Setattr(At<'a>),
    /// `truncate`/`ftruncate`: a setattr that changes the size (the stale guard applies).
    Truncate(At<'a>),
    Unlink(At<'a>),
    /// A hard link `to` of `from`. Both names are fenced: a giver may not give the file
    /// it handed on a second name (writes through it would go around the fence). `from`
    /// is None when it is not a tracked name.
    Link {
        from: Option<At<'a>>,
        to: At<'a>,
    },
    Symlink(At<'a>),
    Mknod(At<'a>),
    /// `name` as the kernel gave it (not necessarily UTF-8).
    Setxattr {
        at: At<'a>,
        name: &'a [u8],
    },
    Removexattr {
        at: At<'a>,
        name: &'a [u8],
    },
    /// `rename(from, to)`, also `RENAME_EXCHANGE`: both names and, when either is a
    /// directory, every tracked path under either.
    Rename {
        from: At<'a>,
        to: At<'a>,
        exchange: bool,
    },
}

impl<'a> Write<'a> {
    /// The path the after-part counts, and the rename target.
    fn main(&self) -> (At<'a>, Option<At<'a>>) {
        match *self {
            Write::Open(a)
            | Write::Append(a)
            | Write::Setattr(a)
            | Write::Truncate(a)
            | Write::Unlink(a)
            | Write::Symlink(a)
            | Write::Mknod(a)
            | Write::Setxattr { at: a, .. }
            | Write::Removexattr { at: a, .. } => (a, None),
            Write::Link { to, .. } => (to, None),
            Write::Rename { from, to, .. } => (from, Some(to)),
        }
    }

    /// Every path the decision looks at (one or two).
    pub fn paths(&self) -> [Option<At<'a>>; 2] {
        match *self {
            Write::Link { from, to } => [from, Some(to)],
            Write::Rename { from, to, .. } => [Some(from), Some(to)],
            _ => [Some(self.main().0), None],
        }
    }

    /// The names this route writes, each with whether a directory is there (a
    /// coordinator shares the state of what it changes, under a directory too).
    pub fn names(&self) -> Vec<(&'a str, bool)> {
        self.paths()
            .into_iter()
            .flatten()
            .map(|a| (a.path, a.found == Found::Dir))
            .collect()
    }

    /// The route named in a `denied` event for the main path.
    pub fn route(&self) -> Route {
        match self {
            Write::Open(_) | Write::Append(_) => Route::OpenWrite,
            Write::Setattr(_) | Write::Truncate(_) => Route::Setattr,
            Write::Unlink(_) => Route::Unlink,
            Write::Link { .. } => Route::Link,
            Write::Symlink(_) => Route::Symlink,
            Write::Mknod(_) => Route::Mknod,
            Write::Setxattr { .. } => Route::Setxattr,
            Write::Removexattr { .. } => Route::Removexattr,
            Write::Rename { .. } => Route::RenameSource,
        }
    }
}

/// An allowed write route: what the part after the operation needs.
#[derive(Debug, Clone)]
pub struct Permit {
    pub session: Session,
    /// The path the after-part counts: the opened or created file, the new name of a
    /// link/symlink/mknod, the source of a rename.
    pub path: String,
    /// The target of a rename.
    pub to: Option<String>,
    /// The backing file at `path` before the operation (None: absent, a directory, or
    /// not looked at).
    pub pre: Option<Stamp>,
    /// `path` is a directory.
    pub is_dir: bool,
    /// An open for write of a file: the `E` hold taken (give it back with `close_write`).
    pub acquired: Option<Acquired>,
    /// `path` is an untracked name of a file with tracked names (see
    /// [`Engine::fence_alias`]): nothing is counted after the operation but the new
    /// stamp of those names (`pre` holds the file's stamp).
    pub alias: bool,
}

impl Permit {
    /// The permit of a write route through an untracked name of a tracked file.
    pub fn alias(session: Session, path: &str, pre: Stamp) -> Permit {
        Permit {
            session,
            path: path.to_string(),
            to: None,
            pre: Some(pre),
            is_dir: false,
            acquired: None,
            alias: true,
        }
    }
}

/// The shards a decision holds: those of its one or two paths (in shard order, so two
/// decisions never deadlock), or every shard (a directory rename). No allocation for the
/// common case.
struct Locked<'e> {
    few: [Option<(usize, MutexGuard<'e, Shard>)>; 2],
    all: Vec<MutexGuard<'e, Shard>>,
}

impl<'e> Locked<'e> {
    fn few(engine: &'e Engine, paths: [Option<&str>; 2]) -> Self {
        let [a, b] = paths.map(|p| p.map(shard_of));
        let (lo, hi) = match (a, b) {
            (Some(i), Some(j)) if i != j => (Some(i.min(j)), Some(i.max(j))),
            (Some(i), _) | (None, Some(i)) => (Some(i), None),
            (None, None) => (None, None),
        };
        let lock = |i: Option<usize>| i.map(|i| (i, engine.shards[i].lock()));
        let first = lock(lo);
        Locked {
            few: [first, lock(hi)],
            all: Vec::new(),
        }
    }

    fn all(engine: &'e Engine) -> Self {
        Locked {
            few: [None, None],
            all: engine.lock_all(),
        }
    }

    fn shard(&mut self, path: &str) -> &mut Shard {
        let i = shard_of(path);
        if !self.all.is_empty() {
            return &mut self.all[i];
        }
        self.few
            .iter_mut()
            .flatten()
            .find(|(j, _)| *j == i)
            .map(|(_, g)| &mut **g)
            .expect("locked")
    }
}

impl Engine {
    /// The decision of a write route by `s` (docs/design.md#holds, docs/design.md#write-routes), in
    /// one locked pass. Refused: the route answers `EACCES`; a fenced route logs `denied` and keeps
    /// the deny text for `why`. Allowed: the [`Permit`] for the part after the operation (an open
    /// for write holds `E` from here: pair it with `close_write`).
    pub fn decide(&self, s: &Session, w: Write<'_>, now: Timestamp) -> Result<Permit, Refusal> {
        self.decide_as(s, true, w, now)
    }

    /// The decision for a caller whose session could not be resolved (docs/design.md#sessions: fail
    /// closed). A route touching a path with a live record is refused (`denied`, reason
    /// `unresolved`, logged under `fallback`, the caller's `uid:UID`); any other route is
    /// decided as `fallback`'s, in the same locked pass.
    pub fn decide_unresolved(
        &self,
        fallback: &Session,
        w: Write<'_>,
        now: Timestamp,
    ) -> Result<Permit, Refusal> {
        self.decide_as(fallback, false, w, now)
    }

    fn decide_as(
        &self,
        s: &Session,
        resolved: bool,
        w: Write<'_>,
        now: Timestamp,
    ) -> Result<Permit, Refusal> {
        if let Write::Setxattr { at, name } | Write::Removexattr { at, name } = w {
            if let Some(r) = computed_xattr(name) {
                return Err(r.at(at.path));
            }
        }
        self.session_seen(s, now);
        let (main, to) = w.main();
        let paths = w.paths();
        // Every name of a handed inode is fenced for its giver (docs/design.md#write-routes),
        // before the shards of this route are locked (the other names may live in any shard).
        for at in paths.iter().flatten().filter(|a| a.linked) {
            if let Found::File(st) = at.found {
                let route = match w {
                    Write::Rename { to, .. } if to.path == at.path => Route::RenameTarget,
                    _ => w.route(),
                };
                self.fence_inode(s, at.path, st.ino, route, now)?;
            }
        }
        let subtree = matches!(w, Write::Rename { from, to, .. }
            if from.found == Found::Dir || to.found == Found::Dir);
        let mut locked = if subtree {
            Locked::all(self)
        } else {
            Locked::few(self, paths.map(|a| a.map(|a| a.path)))
        };
        for at in paths.iter().flatten() {
            match at.found {
                Found::Absent => self.observe_in(locked.shard(at.path), at.path, None, None, now),
                Found::File(st) => {
                    self.observe_in(locked.shard(at.path), at.path, Some(st), at.print, now)
                }
                Found::Dir | Found::Unseen => None,
            };
        }
        if !resolved {
            for (i, at) in paths.iter().enumerate() {
                let Some(at) = at else { continue };
                let route = match w {
                    Write::Rename { .. } if i == 1 => Route::RenameTarget,
                    _ => w.route(),
                };
                if let Some(e) = locked.shard(at.path).get_mut(at.path) {
                    self.refuse_live(e, at.path, s, Against::Unresolved, route, now)?;
                }
            }
            if subtree {
                for sh in locked.all.iter_mut() {
                    for (k, e) in sh.iter_mut() {
                        for (i, at) in paths.iter().flatten().enumerate() {
                            if k.starts_with(at.path)
                                && k.as_bytes().get(at.path.len()) == Some(&b'/')
                            {
                                let route = if i == 0 {
                                    Route::RenameSource
                                } else {
                                    Route::RenameTarget
                                };
                                self.refuse_live(e, k, s, Against::Unresolved, route, now)?;
                            }
                        }
                    }
                }
            }
        }
        let mut permit = Permit {
            session: s.clone(),
            path: main.path.to_string(),
            to: to.map(|t| t.path.to_string()),
            pre: main.stamp(),
            is_dir: main.found == Found::Dir,
            acquired: None,
            alias: false,
        };
        match w {
            Write::Open(at) | Write::Append(at) => {
                if at.found != Found::Dir {
                    let reach = match w {
                        Write::Append(_) => Reach::Append,
                        _ => Reach::Overwrite,
                    };
                    let e = entry_mut(locked.shard(at.path), at.path);
                    permit.acquired = Some(self.acquire_in(e, s, at.path, reach, now)?);
                }
            }
            Write::Truncate(at) => {
                self.fence_at(locked.shard(at.path), at.path, s, Route::Setattr, now)?;
                if let (Some(e), false) = (locked.shard(at.path).get_mut(at.path), permit.is_dir) {
                    self.stale_guard(e, at.path, s, Route::Setattr, Reach::Overwrite, now)?;
                }
            }
            Write::Link { from, to } => {
                if let Some(f) = from {
                    self.fence_at(locked.shard(f.path), f.path, s, Route::Link, now)?;
                }
                self.fence_at(locked.shard(to.path), to.path, s, Route::Link, now)?;
            }
            Write::Rename { from, to, .. } => {
                self.fence_at(
                    locked.shard(from.path),
                    from.path,
                    s,
                    Route::RenameSource,
                    now,
                )?;
                self.fence_at(locked.shard(to.path), to.path, s, Route::RenameTarget, now)?;
                // A rename onto a file replaces it: the stale guard of its target (a
                // session's own atomic save renames onto what it read).
                if !subtree && from.path != to.path {
                    if let Some(e) = locked.shard(to.path).get_mut(to.path) {
                        let route = Route::RenameTarget;
                        self.stale_guard(e, to.path, s, route, Reach::Overwrite, now)?;
                    }
                }
                if subtree {
                    for (dir, route) in [
                        (from.path, Route::RenameSource),
                        (to.path, Route::RenameTarget),
                    ] {
                        let pre = format!("{dir}/");
                        for sh in locked.all.iter_mut() {
                            for (k, e) in sh.iter_mut() {
                                if k.starts_with(&pre) {
                                    self.refuse_live(e, k, s, Against::Giver, route, now)?;
                                    self.refuse_late(e, k, s, route, now)?;
                                }
                            }
                        }
                    }
                }
            }
            _ => self.fence_at(locked.shard(main.path), main.path, s, w.route(), now)?,
        }
        Ok(permit)
    }

    /// A write route by `s` through `path`, an untracked name (ignored, or under `.git/`) of
    /// inode `ino` whose other names may be tracked (docs/design.md#write-routes: every name of
    /// a handed inode is fenced for its giver, tracked or not). The giver of a live record on a
    /// tracked name of that inode is fenced (`denied`, the deny text of the handed path); a
    /// caller whose session could not be resolved (`resolved` false) is refused when the inode
    /// has a live record (`unresolved`). Nothing else is looked at or changed.
    pub fn fence_alias(
        &self,
        s: &Session,
        resolved: bool,
        path: &str,
        ino: u64,
        route: Route,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        if resolved {
            return self.fence_inode(s, path, ino, route, now);
        }
        let handed = self.shards.iter().find_map(|shard| {
            shard
                .lock()
                .iter()
                .find(|(_, e)| {
                    e.exists && e.stamp.is_some_and(|st| st.ino == ino) && e.live().is_some()
                })
                .map(|(k, _)| k.to_string())
        });
        match handed {
            Some(q) => match self.lock_one(&q).get_mut(q.as_str()) {
                Some(e) => self.refuse_live(e, &q, s, Against::Unresolved, route, now),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// The fence by inode: if `s` gave a live record on another tracked name of inode `ino`
    /// than `path`, this route on `path` is a write to that file and is fenced the same
    /// way (denied event and deny text name the handed path). Scans every shard, one lock
    /// at a time: only called for files with more than one name.
    fn fence_inode(
        &self,
        s: &Session,
        path: &str,
        ino: u64,
        route: Route,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        if !s.is_attributed() {
            return Ok(());
        }
        let handed = self.shards.iter().find_map(|shard| {
            shard
                .lock()
                .iter()
                .find(|(k, e)| {
                    &***k != path
                        && e.exists
                        && e.stamp.is_some_and(|st| st.ino == ino)
                        && e.live().is_some_and(|r| r.giver.name == s.name)
                })
                .map(|(k, _)| k.to_string())
        });
        match handed {
            Some(q) => self.fence_at(&mut self.lock_one(&q), &q, s, route, now),
            None => Ok(()),
        }
    }

    pub(super) fn fence_at(
        &self,
        sh: &mut Shard,
        path: &str,
        s: &Session,
        route: Route,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        match sh.get_mut(path) {
            Some(e) => {
                self.refuse_live(e, path, s, Against::Giver, route, now)?;
                self.refuse_late(e, path, s, route, now)
            }
            None => Ok(()),
        }
    }
}
