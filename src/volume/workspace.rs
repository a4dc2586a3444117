//! What every part of the volume reads: the engine, the journal, the coordinator, the
//! session resolver, the tracked paths and the store's backing directory, with the two
//! questions each decision starts from, asked here once: who is calling (its session,
//! docs/design.md#sessions) and what the backing directory holds at a path
//! (docs/design.md#versions).

use std::collections::HashSet;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::judge::{Judge, Verdict};
use crate::coherence::{self, At, Engine, Found, Timestamp};
use crate::coordinator::Coordinator;
use crate::journal::Journal;
use crate::request_timeout::Started;
use crate::store::{Backing, Stamp};
use crate::tracking::{Tracking, COHERENTIGNORE, GITIGNORE};

/// A workspace path as the engine keys it (None: the root, a name the store lost, or a
/// name that is not UTF-8, which the volume does not track).
pub(super) fn rel(path: Option<&Path>) -> Option<&str> {
    path.and_then(Path::to_str)
        .filter(|p| coherence::valid_path(p))
}

/// The engine's stamp of a backing file: (ino, ctime, mtime, size).
pub(super) fn stamp(s: &Stamp) -> coherence::Stamp {
    let ns = |t: crate::store::Time| t.sec * 1_000_000_000 + i64::from(t.nsec);
    coherence::Stamp {
        ino: s.ino,
        ctime_ns: ns(s.ctime),
        size: s.size,
        mtime_ns: ns(s.mtime),
    }
}

/// How long a write decision waits for the content judgement of a changed stamp (then,
/// on a path with a live record, the write fails `EAGAIN`: docs/versions-and-holds.md).
pub(super) const JUDGE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

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
        Content::Lags => tracing::info!(
            "{p}: first look at this copy since another host moved the version on, and it \
             holds no version known here: taken as a copy the sync has not reached, not a \
             change"
        ),
        Content::Unknown => tracing::warn!(
            "{p}: changed behind the volume's back and could not be read to compare its \
             content: nothing counted, any record on it stays live"
        ),
    }
}

/// What is on disk: the backing directory, which of its paths are tracked, and what the
/// engine must be shown of a path before a decision (its stamp, its other names, a
/// changed content judged off the request threads). The one owner of those; the parts
/// ask it, none reads its fields.
pub(super) struct Workspace {
    engine: Arc<Engine>,
    /// Whether other hosts share the workspace (they share no stamps: fingerprints are
    /// taken for them, and paths taken in are stamped here).
    coord: Arc<dyn Coordinator>,
    /// The backing directory: the store's root descriptor.
    backing: Backing,
    /// Which paths are tracked (docs/design.md#versions): the rest pass through with no
    /// version, no hold, no event and no session lookup.
    tracking: Tracking,
    /// Inodes seen with more than one name (their other names are restamped after a link,
    /// unlink or rename through the volume).
    linked: Mutex<HashSet<u64>>,
    /// The content judgement of changed stamps, off the request threads (`judge.rs`).
    judge: Judge,
}

/// The fingerprint of the file at `rel` beneath the directory `dir` now (the backing
/// root and a path, or a directory a request's look kept and a name in it), with the
/// stamp it had while it was read.
pub(super) fn print_at(
    dir: BorrowedFd<'_>,
    rel: &str,
) -> Option<(coherence::Stamp, coherence::Print)> {
    let fp = crate::store::fingerprint_at(dir, rel)?;
    let print = coherence::Print {
        size: fp.size,
        digest: fp.digest,
    };
    Some((stamp(&fp.stamp), print))
}

/// The judge of a volume: it reads fingerprints beneath `backing` and counts what it
/// finds in `engine` (its events written out to `journal`).
pub(super) fn judge(backing: &Backing, engine: &Arc<Engine>, journal: &Arc<Journal>) -> Judge {
    let b = backing.clone();
    let (e, j) = (engine.clone(), journal.clone());
    Judge::new(
        Box::new(move |p| print_at(b.fd(), p)),
        Box::new(move |p, asked, got| {
            let before = e.last_seq();
            let c = match got {
                Some((st, print)) => e.observe_content(p, st, Some(print), Timestamp::now()),
                None => e.content(p, asked, None),
            };
            log_content(p, c);
            if e.last_seq() != before {
                if let Err(err) = j.write_out() {
                    tracing::warn!("writing the state log: {err}");
                }
            }
        }),
    )
}

impl Workspace {
    pub(super) fn new(
        engine: Arc<Engine>,
        coord: Arc<dyn Coordinator>,
        backing: Backing,
        tracking: Tracking,
        judge: Judge,
    ) -> Self {
        Workspace {
            engine,
            coord,
            backing,
            tracking,
            linked: Mutex::new(HashSet::new()),
            judge,
        }
    }

    /// Why `p` is not tracked (None: it is, by the ignore files alone).
    pub(super) fn why_untracked(
        &self,
        p: &str,
        is_dir: bool,
    ) -> Option<crate::tracking::Untracked> {
        self.tracking.why_untracked(p, is_dir)
    }

    /// Was any file seen with several names (`Some(ino)`: was this one)?
    pub(super) fn seen_linked(&self, ino: Option<u64>) -> bool {
        let linked = self.linked.lock();
        match ino {
            None => !linked.is_empty(),
            Some(i) => linked.contains(&i),
        }
    }

    /// Is the workspace path `p` tracked (docs/design.md#versions)? `is_dir`: it names a directory.
    /// A path with a live record stays tracked whatever the ignore files say now, so a giver
    /// cannot step out of its fence by ignoring the file it handed on.
    pub(super) fn is_tracked(&self, p: &str, is_dir: bool) -> bool {
        self.tracking.is_tracked(p, is_dir) || self.engine.has_live_record(p)
    }

    /// After a change through the mount of `p`: an ignore file changed, or a directory
    /// moved, so what is tracked may have changed (applies at once).
    pub(super) fn retrack(&self, p: &str, is_dir: bool) {
        let name = p.rsplit('/').next().unwrap_or(p);
        if is_dir || name == GITIGNORE || p == COHERENTIGNORE {
            self.tracking.invalidate(p);
        }
    }

    /// `p` with what the backing directory holds there, if `p` is tracked (for a request
    /// that `started` then: [`Workspace::at`]).
    pub(super) fn tracked<'p>(&self, p: &'p str, started: Started) -> (At<'p>, bool) {
        let at = self.at(p, started);
        let dir = at.found == Found::Dir;
        (at, self.is_tracked(p, dir))
    }

    /// `fstatat` in the backing directory, without following a final symlink.
    pub(super) fn stat(&self, p: &str) -> Option<(coherence::Stamp, bool)> {
        self.stat_links(p).map(|(s, dir, _)| (s, dir))
    }

    /// What a [`Workspace::stat`] of the name `fd` was opened on (an `O_PATH` descriptor
    /// of a path placed beneath the root) finds, read from the descriptor so the path is
    /// not walked again; and whether it has content (a regular file or a symlink, as
    /// [`Backing::has_content`] asks). None when the descriptor cannot be asked.
    pub(super) fn stat_fd(&self, fd: BorrowedFd<'_>) -> Option<(coherence::Stamp, bool, bool)> {
        let st = nix::sys::stat::fstat(fd.as_raw_fd()).ok()?;
        let kind = st.st_mode & libc::S_IFMT;
        let s = Stamp::from_stat(&st);
        let dir = kind == libc::S_IFDIR;
        if !dir && st.st_nlink > 1 {
            self.linked.lock().insert(s.ino);
        }
        let content = matches!(kind, libc::S_IFREG | libc::S_IFLNK);
        Some((stamp(&s), dir, content))
    }

    /// [`Workspace::stat`] and the number of names of the file (`st_nlink`). A file seen with
    /// several names is remembered in `linked` (see [`Workspace::restamp_other_names`]).
    pub(super) fn stat_links(&self, p: &str) -> Option<(coherence::Stamp, bool, u64)> {
        let st = self.backing.lstat(p)?;
        if !st.dir && st.nlink > 1 {
            self.linked.lock().insert(st.stamp.ino);
        }
        Some((stamp(&st.stamp), st.dir, st.nlink))
    }

    /// A link, unlink or rename through the volume changed the ctime of inode `ino`; its
    /// other tracked names (`except` the ones the operation itself counts) take the new
    /// stamp, so the change is never taken for one behind the volume's back
    /// (docs/design.md#versions). Only for inodes seen with several names.
    pub(super) fn restamp_other_names(&self, ino: u64, except: &[&str]) {
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

    /// Show the engine what the backing directory holds at `p` now (versions count
    /// regular files, symlinks and special files, not directories), so an untracked
    /// file starts at v1 and a change behind the volume's back is counted.
    pub(super) fn observe(&self, p: &str, now: Timestamp) -> Option<(coherence::Stamp, bool)> {
        self.observe_in(&self.engine, p, now)
    }

    /// [`Workspace::observe`] through `e` (a step's view of the engine keeps the events).
    pub(super) fn observe_in(
        &self,
        e: &Engine,
        p: &str,
        now: Timestamp,
    ) -> Option<(coherence::Stamp, bool)> {
        let st = self.stat(p);
        self.observe_seen(e, p, st, now);
        st
    }

    /// [`Workspace::observe_in`] of what a [`Workspace::stat`] of `p` found just before.
    pub(super) fn observe_seen(
        &self,
        e: &Engine,
        p: &str,
        st: Option<(coherence::Stamp, bool)>,
        now: Timestamp,
    ) {
        match st {
            Some((_, true)) => {}
            Some((s, false)) => self.observe_file(e, p, s, now),
            None => {
                e.observe(p, None, now);
            }
        }
    }

    /// Shows `e` the file at `p` with stamp `st`, with its fingerprint when only the
    /// content can tell what a changed stamp means (docs/versions-and-holds.md#content).
    /// The judgement is never waited for: while it is pending the stamp counts nothing
    /// (the content check's `Unknown`: any record on the path stays live).
    pub(super) fn observe_file(&self, e: &Engine, p: &str, st: coherence::Stamp, now: Timestamp) {
        self.observe_file_by(e, p, st, None, None, now)
    }

    /// [`Workspace::observe_file`] for a request of `uid` (whose judgements are bounded),
    /// waiting for the judgement until `until` (None: not at all).
    pub(super) fn observe_file_by(
        &self,
        e: &Engine,
        p: &str,
        st: coherence::Stamp,
        uid: Option<u32>,
        until: Option<std::time::Instant>,
        now: Timestamp,
    ) {
        match self.print_if_judged(e, p, st, uid, until) {
            (st, Some(print)) => {
                e.observe_content(p, st, Some(print), now);
            }
            (st, None) => {
                e.observe(p, Some(st), now);
            }
        }
    }

    /// The fingerprint of the file at `p` (seen with stamp `st`) if `e` needs it to judge
    /// the stamp ([`Engine::wants_print`]) and the judge has it, with the stamp it was
    /// taken at (maybe newer than `st`). Waits for the judgement until `until` at most
    /// (None: not at all; a request thread never hashes: `judge.rs`).
    pub(super) fn print_if_judged(
        &self,
        e: &Engine,
        p: &str,
        st: coherence::Stamp,
        uid: Option<u32>,
        until: Option<std::time::Instant>,
    ) -> (coherence::Stamp, Option<coherence::Print>) {
        if !e.wants_print(p, &st) {
            return (st, None);
        }
        let v = match until {
            Some(t) => self.judge.wait(p, st, uid, t),
            None => self.judge.ask(p, st, uid),
        };
        match v {
            Verdict::Ready(Some((now, print))) => {
                // What the content check finds when it counts nothing (a copy behind stays
                // behind at every open: said at each, as the judge said it the first time).
                log_content(p, e.content(p, now, Some(print)));
                (now, Some(print))
            }
            Verdict::Ready(None) | Verdict::Pending => (st, None),
        }
    }

    /// Is the stamp `st` of `p` a change the content judgement has not decided yet (a
    /// write decision on it fails closed where a record is live)?
    pub(super) fn unjudged(&self, p: &str, st: &coherence::Stamp, print: bool) -> bool {
        !print && self.engine.wants_print(p, st)
    }

    /// The fingerprint of the file at `p` now, with the stamp it had while it was read.
    pub(super) fn print_of(&self, p: &str) -> Option<(coherence::Stamp, coherence::Print)> {
        print_at(self.backing.fd(), p)
    }

    /// With a coordinator: the fingerprint of what a commit of `p` (a path with records,
    /// which hosts share) made, for the other hosts to compare their copies with.
    pub(super) fn print_commit(&self, e: &Engine, p: &str, st: coherence::Stamp) {
        if !self.coord.is_shared() || !e.has_records(p) {
            return;
        }
        if let Some((now, print)) = self.print_of(p).filter(|(now, _)| *now == st) {
            e.note_print(p, now, print);
        }
    }

    /// Before a write through a file with several names (the fence follows the inode):
    /// the handed paths taken in from another host and not looked at here yet are looked
    /// at now, so this host knows their inode on its own copy (hosts share no stamps).
    pub(super) fn stamp_handed(&self, started: Started) {
        if !self.coord.is_shared() {
            return;
        }
        let now = Timestamp::now();
        // A write decision waits (bounded, by the request's budget too) for these
        // judgements: until a handed path has this host's stamp, another name of its file
        // is not known to be fenced.
        let until = started.deadline(JUDGE_WAIT);
        for q in self.engine.unstamped_live_paths() {
            if let Some(st) = self.stamp_now(&q) {
                self.observe_file_by(&self.engine, &q, st, None, Some(until), now);
            }
        }
    }

    /// What the backing directory holds at `p` now, for the write decision (a file with
    /// several names is marked: the fence follows the inode), with the fingerprint the
    /// decision needs to judge a changed stamp.
    /// The judgement is waited for up to [`JUDGE_WAIT`] (and the budget of the request
    /// that `started` then).
    pub(super) fn at<'a>(&self, p: &'a str, started: Started) -> At<'a> {
        self.at_by(p, None, started)
    }

    /// [`Workspace::at`] for a request of `uid`.
    pub(super) fn at_by<'a>(&self, p: &'a str, uid: Option<u32>, started: Started) -> At<'a> {
        match self.stat_links(p) {
            None => At::new(p, Found::Absent),
            Some((_, true, _)) => At::new(p, Found::Dir),
            Some((s, false, n)) => {
                if n > 1 {
                    self.stamp_handed(started);
                }
                let until = started.deadline(JUDGE_WAIT);
                let (s, print) = self.print_if_judged(&self.engine, p, s, uid, Some(until));
                At::new(p, Found::File(s)).linked(n > 1).print(print)
            }
        }
    }

    pub(super) fn stamp_now(&self, p: &str) -> Option<coherence::Stamp> {
        self.stat(p).filter(|(_, dir)| !dir).map(|(s, _)| s)
    }
}
