//! The paths changed through the volume, for git's fsmonitor (docs/git.md): an in-memory
//! ring of every name a write route touched, tracked or not, with its own sequence, served
//! at `.coherent/changes` (reachable by name, not listed).
//!
//! The state log is not enough: it has no event for untracked paths (which git may still
//! care about: `.coherentignore` is not `.gitignore`), for directories made or removed, or
//! for a `chmod`, and it is a growing file. This ring costs one short lock per write route.
//!
//! An answer is "complete" only when the ring can name every change since the asked
//! sequence: the mount is the only path to the backing directory (in place, nobody inside
//! at mount time), nothing since was dropped from the ring, and no change since was one it
//! cannot name (a directory renamed: git's untracked cache would trust the old entries under
//! its new name; a file with other names written; a node whose name the store lost).
//! Anything else answers "incomplete", which the hook turns into "everything may have
//! changed". Files open for writing are named in every answer: with FUSE passthrough their
//! writes never reach the daemon.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::fs::{open_writes, HandleInfo, OpenInfo, WriteRoute};

/// How many changes the ring keeps; an older token answers "everything may have changed".
pub const CAPACITY: usize = 1 << 16;

/// The first line of every answer names the format.
pub const FORMAT: &str = "coherent-changes 1";

/// `renameat2` flag: swap the two names.
const RENAME_EXCHANGE: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// A path (relative to the root) whose entry or content changed; `dir`: a directory.
    Path(OsString, bool),
    /// A change the ring cannot name.
    All,
}

#[derive(Default)]
struct Ring {
    /// The sequence of the latest change (0: none yet).
    seq: u64,
    /// The highest sequence dropped from the ring (answers since before it are incomplete).
    dropped: u64,
    ring: VecDeque<(u64, Change)>,
    /// Files open for writing: inode → (path, open handles).
    writers: HashMap<u64, (Option<PathBuf>, u32)>,
}

impl Ring {
    fn push(&mut self, c: Change) {
        self.seq += 1;
        if self.ring.len() >= CAPACITY {
            if let Some((s, _)) = self.ring.pop_front() {
                self.dropped = s;
            }
        }
        self.ring.push_back((self.seq, c));
    }
}

/// Processes inside an in-place mount's directory at mount time: they reach the files
/// underneath, not the volume, until they leave (or re-enter through the mount).
pub(crate) struct Bypass {
    /// The directory (the mount point, which is also the backing directory).
    dir: PathBuf,
    /// The device of the backing directory: a process there is on it, one that entered
    /// through the mount is on the FUSE device.
    dev: u64,
    /// (pid, start time) of the processes still inside.
    pids: Vec<(u32, u64)>,
}

impl Bypass {
    /// `pids` found inside `dir` (whose backing directory is `root`) before the mount.
    pub(crate) fn new(dir: PathBuf, root: BorrowedFd<'_>, pids: &[u32]) -> Option<Bypass> {
        let dev = nix::sys::stat::fstat(root.as_raw_fd()).ok()?.st_dev;
        let pids = pids
            .iter()
            .filter_map(|&p| crate::sys::read_stat(p).map(|st| (p, st.start_time)))
            .collect();
        Some(Bypass { dir, dev, pids })
    }

    /// Is the process still running with its working directory, root or an open file
    /// in the directory underneath the mount?
    fn still_inside(&self, pid: u32, start: u64) -> bool {
        match crate::sys::read_stat(pid) {
            Some(st) if st.start_time == start && !st.is_zombie() => {}
            _ => return false,
        }
        let base = PathBuf::from(format!("/proc/{pid}"));
        let beneath = |link: &Path| {
            std::fs::read_link(link).is_ok_and(|l| crate::bypass::is_inside(&l, &self.dir))
                && nix::sys::stat::stat(link).is_ok_and(|st| st.st_dev == self.dev)
        };
        if beneath(&base.join("cwd")) || beneath(&base.join("root")) {
            return true;
        }
        match std::fs::read_dir(base.join("fd")) {
            Ok(fds) => fds.filter_map(|d| d.ok()).any(|d| beneath(&d.path())),
            // Cannot look: still assume the worst.
            Err(_) => base.exists(),
        }
    }
}

/// The changes of one mount instance.
pub(crate) struct Changes {
    /// Random per daemon start: a token from another instance (a restart) is not ours.
    instance: u64,
    /// Does every change of the backing directory go through this volume?
    sees_all: AtomicBool,
    ring: Mutex<Ring>,
    /// Processes that bypassed the mount at its start, until none is left.
    bypass: Mutex<Option<Bypass>>,
    /// Can an answer ever be complete? If not, nothing is recorded (no cost per write).
    records: bool,
}

/// Is the backing directory on a local filesystem, which only this host writes? A network
/// or cluster filesystem (NFS, SMB, Ceph, ...), another FUSE filesystem or any type not
/// known here may change behind the volume's back: the changes are never complete there.
pub(crate) fn local_fs(root: BorrowedFd<'_>) -> bool {
    const LOCAL: [i64; 14] = [
        0xEF53,      // ext2/3/4
        0x5846_5342, // xfs
        0x9123_683E, // btrfs
        0x0102_1994, // tmpfs
        0x8584_58f6, // ramfs
        0xF2F5_2010, // f2fs
        0x2FC1_2FC1, // zfs
        0x794c_7630, // overlayfs
        0xca45_1a4e, // bcachefs
        0x3153_464a, // jfs
        0x5265_4973, // reiserfs
        0x3434,      // nilfs
        0x2011_BAB0, // exfat
        0x4d44,      // vfat
    ];
    // An O_PATH descriptor is accepted.
    match nix::sys::statfs::fstatfs(root) {
        Ok(st) => LOCAL.contains(&st.filesystem_type().0),
        Err(_) => false,
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        // No entropy source: time and pid still differ between two starts.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
    }
}

impl Changes {
    /// `sole_path`: an in-place mount; `bypass`: the processes inside it at mount time
    /// (the changes are complete once none is left).
    pub(crate) fn new(sole_path: bool, bypass: Option<Bypass>) -> Self {
        let bypass = bypass.filter(|b| sole_path && !b.pids.is_empty());
        Changes {
            instance: random_u64(),
            sees_all: AtomicBool::new(sole_path && bypass.is_none()),
            ring: Mutex::new(Ring::default()),
            bypass: Mutex::new(bypass),
            records: sole_path,
        }
    }

    /// Have the processes that bypassed the mount at its start all left? Then the volume
    /// sees everything from now on (earlier tokens stay incomplete).
    fn recheck_bypass(&self) {
        let mut b = self.bypass.lock();
        let Some(by) = b.as_mut() else { return };
        let still: Vec<(u32, u64)> = by
            .pids
            .iter()
            .copied()
            .filter(|&(p, s)| by.still_inside(p, s))
            .collect();
        by.pids = still;
        if by.pids.is_empty() {
            *b = None;
            self.set_sees_all(true);
        }
    }

    fn note(&self, path: Option<&Path>, dir: bool) {
        if !self.records {
            return;
        }
        let c = match path {
            Some(p) => Change::Path(p.as_os_str().to_owned(), dir),
            None => Change::All,
        };
        self.ring.lock().push(c);
    }

    /// A write route that succeeded. `root` is the backing directory (to tell whether a
    /// renamed name is a directory); `git_ignores(dir)`: does git ignore that directory
    /// (under a `.git`, or by a `.gitignore`)?
    pub(crate) fn after_write(
        &self,
        root: BorrowedFd<'_>,
        route: &WriteRoute<'_>,
        git_ignores: impl Fn(&str) -> bool,
    ) {
        if !self.records {
            return;
        }
        match *route {
            WriteRoute::Setattr { path, .. }
            | WriteRoute::Unlink { path }
            | WriteRoute::Symlink { path, .. }
            | WriteRoute::Mknod { path, .. }
            | WriteRoute::Setxattr { path, .. }
            | WriteRoute::Removexattr { path, .. } => self.note(path, false),
            WriteRoute::Mkdir { path, .. } | WriteRoute::Rmdir { path } => self.note(path, true),
            WriteRoute::Link { from, to } => {
                self.note(from, false);
                self.note(to, false);
            }
            WriteRoute::Rename { from, to, flags } => {
                let is_dir = |p: Option<&Path>| {
                    // A name that is not UTF-8 or cannot be looked at: assume the worst.
                    p.and_then(Path::to_str)
                        .is_none_or(|p| crate::store::lstat_at(root, p).is_none_or(|s| s.dir))
                };
                let exchange = flags & RENAME_EXCHANGE != 0;
                let ignored = |p: Option<&Path>| p.and_then(Path::to_str).is_some_and(&git_ignores);
                if is_dir(to) || (exchange && is_dir(from)) {
                    if ignored(from) && ignored(to) {
                        // git never looks inside (its untracked cache keeps nothing of
                        // either tree): the two names, as directories, are enough. rustc
                        // renames its incremental session directories at every build.
                        self.note(from, true);
                        self.note(to, true);
                    } else {
                        self.ring.lock().push(Change::All);
                    }
                } else {
                    self.note(from, false);
                    self.note(to, false);
                }
                // A file open for writing keeps being written under its new name.
                if let (Some(f), Some(t)) = (from, to) {
                    let mut r = self.ring.lock();
                    for (p, _) in r.writers.values_mut() {
                        let Some(q) = p.as_ref() else { continue };
                        // (`join` of an empty rest would add a trailing slash.)
                        let under = |base: &Path, rest: &Path| match rest.as_os_str().is_empty() {
                            true => base.to_path_buf(),
                            false => base.join(rest),
                        };
                        let moved = if exchange && q.starts_with(t) {
                            q.strip_prefix(t).ok().map(|rest| under(f, rest))
                        } else {
                            q.strip_prefix(f).ok().map(|rest| under(t, rest))
                        };
                        if let Some(m) = moved {
                            *p = Some(m);
                        }
                    }
                }
            }
            // Opens and creates are told at `opened`.
            WriteRoute::Open { .. } | WriteRoute::Create { .. } => {}
        }
    }

    /// A backing file was opened (or created). `links` tells its number of names, if it
    /// can: asked only for an open for writing while the ring records (it may cost a stat).
    pub(crate) fn opened(&self, open: &OpenInfo<'_>, links: impl FnOnce() -> Option<u64>) {
        let writes = open_writes(open.flags);
        if !self.records || (!writes && !open.created) {
            return;
        }
        let links = if writes { links() } else { None };
        let mut r = self.ring.lock();
        r.push(match open.path {
            Some(p) => Change::Path(p.as_os_str().to_owned(), false),
            None => Change::All,
        });
        if writes {
            // Its other names change too, and the ring does not know them.
            if links.is_none_or(|n| n > 1) {
                r.push(Change::All);
            }
            let e = r
                .writers
                .entry(open.ino)
                .or_insert_with(|| (open.path.map(Path::to_path_buf), 0));
            e.1 += 1;
        }
    }

    /// A backing file's handle was released.
    pub(crate) fn released(&self, h: &HandleInfo<'_>) {
        if !self.records || !open_writes(h.flags) {
            return;
        }
        let mut r = self.ring.lock();
        if let Some(e) = r.writers.get_mut(&h.ino) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                r.writers.remove(&h.ino);
            }
        }
        r.push(match h.path {
            Some(p) => Change::Path(p.as_os_str().to_owned(), false),
            None => Change::All,
        });
    }

    /// The mount stops (or starts) being the only path to the backing directory: answers
    /// since before now are incomplete either way.
    pub(crate) fn set_sees_all(&self, yes: bool) {
        let mut r = self.ring.lock();
        r.push(Change::All);
        self.sees_all.store(yes, Ordering::SeqCst);
    }

    /// The answer for changes after `since`, as `.coherent/changes` serves it:
    ///
    /// ```text
    /// coherent-changes 1 instance=HEX seq=N since=S complete=0|1 open=K\n
    /// PATH\0PATH\0...
    /// ```
    ///
    /// Paths are relative to the root, each once, a directory with a trailing `/`; the
    /// last K are the files open for writing now. Only a complete answer has paths.
    /// `sees(path)` hides a path from this reader; a path it cannot judge makes the answer
    /// incomplete.
    pub(crate) fn answer(
        &self,
        since: u64,
        mut sees: impl FnMut(&OsStr) -> Option<bool>,
    ) -> Vec<u8> {
        self.recheck_bypass();
        let r = self.ring.lock();
        let mut complete =
            self.sees_all.load(Ordering::SeqCst) && since <= r.seq && since >= r.dropped;
        let mut changed: BTreeSet<Vec<u8>> = BTreeSet::new();
        if complete {
            // The ring is in sequence order: the changes after `since` are its tail.
            let first = r.ring.partition_point(|(s, _)| *s <= since);
            for (_, c) in r.ring.range(first..) {
                match c {
                    Change::All => {
                        complete = false;
                        break;
                    }
                    Change::Path(p, dir) => {
                        if p.is_empty() {
                            continue;
                        }
                        let mut b = p.as_bytes().to_vec();
                        if *dir {
                            b.push(b'/');
                        }
                        changed.insert(b);
                    }
                }
            }
        }
        let mut open: BTreeSet<Vec<u8>> = BTreeSet::new();
        if complete {
            for (p, _) in r.writers.values() {
                match p {
                    Some(p) => {
                        open.insert(p.as_os_str().as_bytes().to_vec());
                    }
                    None => complete = false,
                }
            }
        }
        let (seq, instance) = (r.seq, self.instance);
        drop(r);
        let mut out = Vec::new();
        let mut shown = |set: BTreeSet<Vec<u8>>, out: &mut Vec<u8>, complete: &mut bool| {
            let mut n = 0;
            for p in set {
                let bare = p.strip_suffix(b"/").unwrap_or(&p).to_vec();
                match sees(&OsString::from_vec(bare)) {
                    Some(true) => {
                        out.extend_from_slice(&p);
                        out.push(0);
                        n += 1;
                    }
                    Some(false) => {}
                    None => *complete = false,
                }
            }
            n
        };
        let mut body = Vec::new();
        let mut n_open = 0;
        if complete {
            shown(changed, &mut body, &mut complete);
            n_open = shown(open, &mut body, &mut complete);
        }
        if !complete {
            body.clear();
            n_open = 0;
        }
        out.extend_from_slice(
            format!(
                "{FORMAT} instance={instance:016x} seq={seq} since={since} complete={} open={n_open}\n",
                u8::from(complete)
            )
            .as_bytes(),
        );
        out.extend_from_slice(&body);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Stamp;
    use std::os::fd::AsFd;

    fn all(_: &OsStr) -> Option<bool> {
        Some(true)
    }

    fn parse(b: &[u8]) -> (bool, u64, Vec<String>, usize) {
        let nl = b.iter().position(|&c| c == b'\n').unwrap();
        let head = std::str::from_utf8(&b[..nl]).unwrap();
        let field = |k: &str| {
            head.split(' ')
                .find_map(|w| w.strip_prefix(k))
                .unwrap()
                .to_string()
        };
        let paths = b[nl + 1..]
            .split(|&c| c == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8(p.to_vec()).unwrap())
            .collect();
        (
            field("complete=") == "1",
            field("seq=").parse().unwrap(),
            paths,
            field("open=").parse().unwrap(),
        )
    }

    fn open_info(ino: u64, path: &Path, flags: i32) -> OpenInfo<'_> {
        OpenInfo {
            ino,
            path: Some(path),
            flags,
            created: false,
            stamp: Stamp::default(),
        }
    }

    #[test]
    fn names_each_change_once_after_the_token() {
        let c = Changes::new(true, None);
        c.note(Some(Path::new("a")), false);
        let (ok, seq, paths, _) = parse(&c.answer(0, all));
        assert!(ok);
        assert_eq!((seq, paths), (1, vec!["a".to_string()]));
        c.note(Some(Path::new("d")), true);
        c.note(Some(Path::new("b")), false);
        c.note(Some(Path::new("b")), false);
        let (ok, seq, paths, _) = parse(&c.answer(1, all));
        assert!(ok);
        assert_eq!(seq, 4);
        assert_eq!(paths, vec!["b".to_string(), "d/".to_string()]);
        // Nothing since: complete and empty.
        let (ok, _, paths, _) = parse(&c.answer(4, all));
        assert!(ok && paths.is_empty());
        // A token from the future (another instance's numbering) is not trusted.
        assert!(!parse(&c.answer(5, all)).0);
    }

    #[test]
    fn incomplete_when_dropped_unnamed_or_not_the_only_path() {
        let c = Changes::new(true, None);
        for _ in 0..CAPACITY + 1 {
            c.note(Some(Path::new("x")), false);
        }
        assert!(!parse(&c.answer(0, all)).0, "dropped past the token");
        assert!(parse(&c.answer(1, all)).0);
        c.note(None, false);
        assert!(!parse(&c.answer(1, all)).0, "an unnamed change");
        let seq = parse(&c.answer(0, all)).1;
        assert!(parse(&c.answer(seq, all)).0);
        c.set_sees_all(false);
        let seq = parse(&c.answer(0, all)).1;
        assert!(
            !parse(&c.answer(seq, all)).0,
            "a separate backing directory"
        );
        let c = Changes::new(true, None);
        c.note(Some(Path::new("secret/x")), false);
        assert!(!parse(&c.answer(0, |_| None)).0, "a path it cannot judge");
        let (ok, _, paths, _) = parse(&c.answer(0, |_| Some(false)));
        assert!(ok && paths.is_empty(), "a path hidden from the reader");
    }

    #[test]
    fn local_filesystems_only() {
        let proc_ = std::fs::File::open("/proc").unwrap();
        assert!(!local_fs(proc_.as_fd()));
        let tmp = std::fs::File::open(std::env::temp_dir()).unwrap();
        // The test machines' temporary directories are on ext4 or tmpfs.
        assert!(local_fs(tmp.as_fd()));
    }

    #[test]
    fn open_writers_are_in_every_answer_under_their_current_name() {
        let c = Changes::new(true, None);
        let p = PathBuf::from("f");
        c.opened(&open_info(7, &p, libc::O_WRONLY), || Some(1));
        let (ok, seq, paths, open) = parse(&c.answer(0, all));
        assert!(ok);
        assert_eq!((paths, open), (vec!["f".to_string(), "f".to_string()], 1));
        let dir = std::env::temp_dir().join(format!("changes-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("d")).unwrap();
        std::fs::write(dir.join("d/g"), b"").unwrap();
        let root = std::fs::File::open(&dir).unwrap();
        let route = WriteRoute::Rename {
            from: Some(Path::new("f")),
            to: Some(Path::new("d/g")),
            flags: 0,
        };
        c.after_write(root.as_fd(), &route, |_| false);
        let (ok, _, paths, open) = parse(&c.answer(seq, all));
        assert!(ok);
        assert_eq!(open, 1);
        assert_eq!(paths.last().unwrap(), "d/g");
        std::fs::remove_dir_all(&dir).unwrap();
        // A file with other names: the ring cannot name them.
        c.opened(&open_info(8, &p, libc::O_RDWR), || Some(2));
        assert!(!parse(&c.answer(seq, all)).0);
    }
}
