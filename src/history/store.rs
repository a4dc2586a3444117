//! The history store: `history/` in the state directory, 0700, owned by the daemon's user,
//! opened without following symlinks (as the state directory itself).
//!
//! - `objects/<64 hex>`: one blob per distinct content, named by its BLAKE3 digest (so two
//!   versions with the same bytes share one), 0600. Made as a reflink (`FICLONE`) of the
//!   backing file where its filesystem has one, else by `copy_file_range` (a server-side or
//!   in-kernel copy), else by read and write; written as `.tmp-*` and renamed into place,
//!   so a blob is whole or absent.
//! - `index.jsonl`: one line per version (path, version, session, time, op, digest, size,
//!   whether the bytes are kept), appended after its blob is in place.
//!
//! **Crash semantics.** The volume keeps the blob *before* it counts the commit, and
//! appends the index line right after, before the FUSE request that committed is answered.
//! Both are in the kernel by then, so a `kill -9` of the daemon loses no version whose
//! commit was answered; a restart reads the index back and checks each blob is there. (A
//! power loss can lose the last lines, as it can lose the journal's last group commit: no
//! fsync is paid per commit.) A torn last line is skipped; a `.tmp-*` left by a crash is
//! removed at open. When the journal lost a commit the index has (killed between the two),
//! the next commit counts the same version again and the later line wins.
//!
//! **Retention** ([`Limits`]): blobs whose last use is older than `keep` are removed, and
//! while the blobs together are larger than `max_bytes`, the least recently used go first
//! (down to 90 % of the bound), except each path's latest version. A version whose blob is
//! gone stays in the index by digest only (`kept: false`); index lines older than `keep`
//! are dropped (each path keeps its latest).

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, BufRead, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::coherence::Timestamp;

const INDEX: &str = "index.jsonl";
const OBJECTS: &str = "objects";
/// How often the age bound is applied at most (it also runs at open).
const AGE_PRUNE_EVERY_MS: i64 = 60_000;

/// The bounds of the store (`--history-max`, `--history-keep`, `--history-file-max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The blobs together, in bytes.
    pub max_bytes: u64,
    /// How long a blob is kept after its last use.
    pub keep: Duration,
    /// Files larger than this are recorded by digest only.
    pub max_file: u64,
}

impl Default for Limits {
    /// A day of an agent's work on a normal repository: a few thousand commits of source
    /// files, and the first-write copies of whatever a `git checkout` touched, fit in 1 GiB;
    /// two days so yesterday's session is still there in the morning.
    fn default() -> Self {
        Limits {
            max_bytes: 1 << 30,
            keep: Duration::from_secs(48 * 3600),
            max_file: 16 << 20,
        }
    }
}

/// One version of one path, as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub version: u64,
    pub session: String,
    /// Milliseconds since the epoch.
    pub ts: i64,
    /// What made it: `write`, `truncate`, `rename`, `link`, `unlink`, `rename_away`, or
    /// `base` (the content a path had when the volume first kept it, before a write).
    pub op: String,
    /// The BLAKE3 digest (hex) of the content; None: the version removed the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default)]
    pub size: u64,
    /// The bytes are in the store (false: over the size limit, not a regular file, or
    /// pruned).
    #[serde(default)]
    pub kept: bool,
    /// `move_dir` (an index line, not a version): the directory `from` was renamed to
    /// `path`, and the history of everything under it moved with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// Moves the history of `from` and everything under it to `to` (a directory rename).
fn move_dir(by_path: &mut HashMap<String, Vec<Entry>>, from: &str, to: &str) {
    let under = format!("{from}/");
    let moved: Vec<String> = by_path
        .keys()
        .filter(|k| *k == from || k.starts_with(&under))
        .cloned()
        .collect();
    for k in moved {
        let Some(mut v) = by_path.remove(&k) else {
            continue;
        };
        let nk = format!("{to}{}", &k[from.len()..]);
        for e in &mut v {
            e.path = nk.clone();
        }
        let dest = by_path.entry(nk).or_default();
        v.append(dest);
        *dest = v;
    }
}

impl Entry {
    /// The version removed the path (no content).
    pub fn removed(&self) -> bool {
        matches!(self.op.as_str(), "unlink" | "rename_away")
    }
}

/// What [`Store::keep_fd`] took of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    pub digest: [u8; 32],
    pub size: u64,
    /// The bytes are in the store.
    pub stored: bool,
}

struct Blob {
    size: u64,
    /// The latest `ts` of a version with this content.
    last: i64,
}

struct Inner {
    index: File,
    by_path: HashMap<String, Vec<Entry>>,
    blobs: HashMap<String, Blob>,
    total: u64,
    last_age_prune: i64,
}

/// The history of one volume (see the module docs).
pub struct Store {
    dir: OwnedFd,
    objects: OwnedFd,
    limits: Limits,
    inner: Mutex<Inner>,
    tmp: AtomicU64,
    /// The backing filesystem refused a reflink once: copy from then on.
    no_reflink: AtomicBool,
    /// The worker that hashes files over the size limit (started at the first).
    hasher: OnceLock<Mutex<Sender<Job>>>,
}

enum Job {
    Large(Box<Large>),
    /// Answered once every job before it is done.
    Settle(Sender<()>),
}

/// A file over the size limit to hash off the request path.
struct Large {
    fd: OwnedFd,
    stat: libc::stat,
    entry: Entry,
}

/// Files up to this size are read into memory once (hash and blob from one read).
const SMALL: u64 = 256 << 10;

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn openat(dir: BorrowedFd<'_>, name: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat returned a descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat buffer we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// A private directory `name` in `parent`, made if missing: refused unless it is a real
/// directory (not a symlink), owned by this daemon's user and open to nobody else.
fn private_dir(parent: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    if unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    let fd = openat(parent, name, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot open the history directory {name} (a symlink?): {e}"),
        )
    })?;
    let st = fstat(fd_b(&fd))?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me || st.st_mode & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the history directory {name} is owned by uid {} with mode {:o}; it must be \
                 this daemon's (uid {me}) and 0700: fix it or remove it",
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(fd)
}

fn fd_b(fd: &OwnedFd) -> BorrowedFd<'_> {
    std::os::fd::AsFd::as_fd(fd)
}

/// The digest as the blob's name: 64 lower-case hex digits.
pub fn hex(d: &[u8; 32]) -> String {
    use std::fmt::Write as _;
    d.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Reads all of `fd` from offset 0 with `pread` (its file offset untouched) into `f`.
fn each_chunk(fd: BorrowedFd<'_>, mut f: impl FnMut(&[u8])) -> io::Result<u64> {
    each_chunk_while(fd, |b| {
        f(b);
        true
    })
}

/// As [`each_chunk`], stopping early when `f` says false; the bytes read either way.
fn each_chunk_while(fd: BorrowedFd<'_>, mut f: impl FnMut(&[u8]) -> bool) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        // SAFETY: a valid descriptor and a buffer as long as we say.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                off as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(off);
        }
        off += n as u64;
        if !f(&buf[..n as usize]) {
            return Ok(off);
        }
    }
}

/// How much of a large file is hashed between two looks at whether it is still there.
const RECHECK: u64 = 64 << 20;

/// The digest of the large file `fd` while it stays as `stat` saw it (looked at every
/// [`RECHECK`] bytes), None once it changed or lost its last name: the descriptor held for
/// hashing pins the file's blocks, and an `rm` of a huge file must free them now, not
/// after a read to its end for a digest of bytes that are gone.
fn digest_while_unmoved(fd: BorrowedFd<'_>, stat: &libc::stat) -> Option<[u8; 32]> {
    let unmoved = || fstat(fd).is_ok_and(|now| same(stat, &now) && now.st_nlink > 0);
    if !unmoved() {
        return None;
    }
    let mut h = blake3::Hasher::new();
    let (mut since, mut moved) = (0u64, false);
    let n = each_chunk_while(fd, |b| {
        h.update(b);
        since += b.len() as u64;
        if since >= RECHECK {
            since = 0;
            moved = !unmoved();
        }
        !moved
    })
    .ok()?;
    (!moved && n == stat.st_size as u64 && unmoved()).then(|| *h.finalize().as_bytes())
}

fn digest_of(fd: BorrowedFd<'_>) -> io::Result<([u8; 32], u64)> {
    let mut h = blake3::Hasher::new();
    let n = each_chunk(fd, |b| {
        h.update(b);
    })?;
    Ok((*h.finalize().as_bytes(), n))
}

/// Same file, same content as far as a stat tells (inode, size, mtime, ctime).
fn same(a: &libc::stat, b: &libc::stat) -> bool {
    (
        a.st_ino,
        a.st_size,
        a.st_mtime,
        a.st_mtime_nsec,
        a.st_ctime,
        a.st_ctime_nsec,
    ) == (
        b.st_ino,
        b.st_size,
        b.st_mtime,
        b.st_mtime_nsec,
        b.st_ctime,
        b.st_ctime_nsec,
    )
}

/// Copies all of `src` into the empty `dst`: a reflink, else `copy_file_range`, else read
/// and write.
fn copy_into(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    size: u64,
    no_reflink: &AtomicBool,
) -> io::Result<()> {
    if !no_reflink.load(Ordering::Relaxed) {
        // SAFETY: FICLONE between two valid descriptors; it changes only dst.
        if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE as _, src.as_raw_fd()) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP | libc::EXDEV | libc::EINVAL | libc::ENOTTY)
        ) {
            no_reflink.store(true, Ordering::Relaxed);
        }
    }
    let (mut off_in, mut off_out): (libc::loff_t, libc::loff_t) = (0, 0);
    let mut fallback = false;
    while (off_in as u64) < size {
        let left = (size - off_in as u64).min(1 << 30) as usize;
        // SAFETY: valid descriptors and offsets we own (the files' offsets are untouched).
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                left,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EXDEV | libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP) => {
                    fallback = true;
                    break;
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            break; // the file shrank: the stat check after the copy sees it
        }
    }
    if !fallback {
        return Ok(());
    }
    // SAFETY: a valid descriptor.
    if unsafe { libc::ftruncate(dst.as_raw_fd(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = File::from(dst.try_clone_to_owned()?);
    let mut err = None;
    each_chunk(src, |b| {
        if err.is_none() {
            if let Err(e) = out.write_all(b) {
                err = Some(e);
            }
        }
    })?;
    err.map_or(Ok(()), Err)
}

impl Store {
    /// Opens (making it if missing) the history in `state_dir` (already checked trusted by
    /// the caller: the volume opens the journal there).
    pub fn open(state_dir: &Path, limits: Limits) -> io::Result<Store> {
        let sd = File::open(state_dir)?;
        let sd: OwnedFd = sd.into();
        let dir = private_dir(fd_b(&sd), "history")?;
        let objects = private_dir(fd_b(&dir), OBJECTS)?;
        let index_fd = openat(
            fd_b(&dir),
            INDEX,
            libc::O_RDWR | libc::O_APPEND | libc::O_CREAT,
            0o600,
        )?;
        let st = fstat(fd_b(&index_fd))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io::Error::other("the history index is not a regular file"));
        }
        let store = Store {
            dir,
            objects,
            limits,
            inner: Mutex::new(Inner {
                index: File::from(index_fd),
                by_path: HashMap::new(),
                blobs: HashMap::new(),
                total: 0,
                last_age_prune: 0,
            }),
            tmp: AtomicU64::new(0),
            no_reflink: AtomicBool::new(false),
            hasher: OnceLock::new(),
        };
        store.load()?;
        store.prune(Timestamp::now(), true);
        Ok(store)
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn load(&self) -> io::Result<()> {
        self.remove_tmp();
        let mut inner = self.inner.lock();
        let f = inner.index.try_clone()?;
        let mut read = io::BufReader::new(f);
        let mut line = Vec::new();
        let mut by_path: HashMap<String, Vec<Entry>> = HashMap::new();
        let mut ends_whole = true;
        loop {
            line.clear();
            if read.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            ends_whole = line.ends_with(b"\n");
            // A torn last line (killed mid-append) or a damaged one is skipped.
            let Ok(e) = serde_json::from_slice::<Entry>(&line) else {
                continue;
            };
            if let (Some(from), "move_dir") = (e.from.as_deref(), e.op.as_str()) {
                move_dir(&mut by_path, from, &e.path);
                continue;
            }
            let v = by_path.entry(e.path.clone()).or_default();
            // The journal may have lost a commit the index has: the later line wins.
            v.retain(|x| x.version != e.version || x.op == "base");
            v.push(e);
        }
        if !ends_whole {
            // The next line must not be glued to a torn one.
            inner.index.write_all(b"\n")?;
        }
        let mut blobs: HashMap<String, Blob> = HashMap::new();
        let mut total = 0;
        for e in by_path.values_mut().flat_map(|v| v.iter_mut()) {
            let Some(d) = e.digest.as_deref().filter(|_| e.kept) else {
                continue;
            };
            if let Some(b) = blobs.get_mut(d) {
                b.last = b.last.max(e.ts);
                continue;
            }
            match openat(fd_b(&self.objects), d, libc::O_RDONLY, 0).and_then(|f| fstat(fd_b(&f))) {
                Ok(st) => {
                    total += st.st_size as u64;
                    blobs.insert(
                        d.to_string(),
                        Blob {
                            size: st.st_size as u64,
                            last: e.ts,
                        },
                    );
                }
                Err(_) => e.kept = false,
            }
        }
        inner.by_path = by_path;
        inner.blobs = blobs;
        inner.total = total;
        Ok(())
    }

    fn remove_tmp(&self) {
        let Ok(d) = nix::dir::Dir::from_fd(
            match openat(
                fd_b(&self.objects),
                ".",
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
            ) {
                Ok(fd) => {
                    let raw = fd.as_raw_fd();
                    std::mem::forget(fd);
                    raw
                }
                Err(_) => return,
            },
        ) else {
            return;
        };
        let mut d = d;
        let names: Vec<CString> = d
            .iter()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_owned())
            .filter(|n| n.to_bytes().starts_with(b".tmp-"))
            .collect();
        for n in names {
            // SAFETY: a valid directory descriptor and a NUL-terminated name.
            unsafe { libc::unlinkat(self.objects.as_raw_fd(), n.as_ptr(), 0) };
        }
    }

    /// Takes the content of the regular file `fd` into the store (or only its digest, over
    /// the size limit). None: not a regular file, or changing under every try.
    pub fn keep_fd(&self, fd: BorrowedFd<'_>) -> io::Result<Option<Kept>> {
        for _ in 0..3 {
            let before = fstat(fd)?;
            if before.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Ok(None);
            }
            match self.keep_once(fd, &before)? {
                Some(k) => return Ok(Some(k)),
                None => continue, // it changed while it was read: again
            }
        }
        Ok(None)
    }

    /// One try of [`Store::keep_fd`] of the file `fd` as `before` stats it; None when it
    /// changed meanwhile.
    fn keep_once(&self, fd: BorrowedFd<'_>, before: &libc::stat) -> io::Result<Option<Kept>> {
        let size = before.st_size as u64;
        // A small file is read once: hashed and, if new, written from memory (no second
        // pass over it, no reflink or copy_file_range round trip).
        let small = size <= SMALL && size <= self.limits.max_file;
        let mut buf = Vec::new();
        let (digest, n) = if small {
            buf.reserve_exact(size as usize + 1);
            each_chunk(fd, |b| buf.extend_from_slice(b))?;
            (*blake3::hash(&buf).as_bytes(), buf.len() as u64)
        } else {
            digest_of(fd)?
        };
        if n != size || !same(before, &fstat(fd)?) {
            return Ok(None);
        }
        let name = hex(&digest);
        let kept = |stored| Kept {
            digest,
            size,
            stored,
        };
        if size > self.limits.max_file {
            return Ok(Some(kept(false)));
        }
        if self.inner.lock().blobs.contains_key(&name) {
            return Ok(Some(kept(true)));
        }
        let tmp = format!(
            ".tmp-{}-{}",
            std::process::id(),
            self.tmp.fetch_add(1, Ordering::Relaxed)
        );
        let out = openat(
            fd_b(&self.objects),
            &tmp,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )?;
        let copied = if small {
            File::from(out).write_all(&buf).map(|()| true)
        } else {
            let r = copy_into(fd, fd_b(&out), size, &self.no_reflink);
            // The copy is of this content only if the file did not move while it ran.
            r.and_then(|()| {
                Ok(same(before, &fstat(fd)?) && fstat(fd_b(&out))?.st_size as u64 == size)
            })
        };
        match copied {
            Ok(true) => {}
            Ok(false) => {
                self.unlink_obj(&tmp);
                return Ok(None);
            }
            Err(e) => {
                self.unlink_obj(&tmp);
                return Err(e);
            }
        }
        let (from, to) = (cstr(&tmp)?, cstr(&name)?);
        // SAFETY: valid directory descriptors and NUL-terminated names.
        let r = unsafe {
            libc::renameat(
                self.objects.as_raw_fd(),
                from.as_ptr(),
                self.objects.as_raw_fd(),
                to.as_ptr(),
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            self.unlink_obj(&tmp);
            return Err(e);
        }
        let mut inner = self.inner.lock();
        if !inner.blobs.contains_key(&name) {
            inner.total += size;
            inner.blobs.insert(name, Blob { size, last: 0 });
        }
        Ok(Some(kept(true)))
    }

    /// A file over `max_file` is recorded by digest only, and reading all of it to hash it
    /// is not worth holding the request that committed it: a worker thread hashes it and
    /// records `entry` with the digest, if the file is still as `stat` saw it at the
    /// commit (else without one: that content is gone).
    pub fn record_large_later(self: &Arc<Self>, fd: OwnedFd, stat: libc::stat, entry: Entry) {
        let tx = self.hasher.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            let me = Arc::downgrade(self);
            let _ = std::thread::Builder::new()
                .name("coherent-history".into())
                .spawn(move || {
                    for job in rx {
                        match job {
                            Job::Large(l) => {
                                let Some(store) = me.upgrade() else { return };
                                store.hash_large(*l);
                            }
                            Job::Settle(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                });
            Mutex::new(tx)
        });
        let job = Job::Large(Box::new(Large { fd, stat, entry }));
        if let Err(std::sync::mpsc::SendError(Job::Large(l))) = tx.lock().send(job) {
            self.hash_large(*l);
        }
    }

    fn hash_large(&self, job: Large) {
        let Large {
            fd,
            stat,
            mut entry,
        } = job;
        let got = digest_while_unmoved(fd_b(&fd), &stat);
        drop(fd);
        entry.digest = got.map(|d| hex(&d));
        entry.kept = false;
        self.record(entry);
    }

    /// Waits until the worker has recorded every large file handed to it so far.
    pub fn settle(&self) {
        if let Some(tx) = self.hasher.get() {
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let _ = tx.lock().send(Job::Settle(done_tx));
            let _ = done_rx.recv_timeout(std::time::Duration::from_secs(30));
        }
    }

    fn unlink_obj(&self, name: &str) {
        if let Ok(c) = cstr(name) {
            // SAFETY: a valid directory descriptor and a NUL-terminated name.
            unsafe { libc::unlinkat(self.objects.as_raw_fd(), c.as_ptr(), 0) };
        }
    }

    /// Appends one version to the index (after its blob, if any, is in place).
    pub fn record(&self, e: Entry) {
        let mut line = match serde_json::to_vec(&e) {
            Ok(l) => l,
            Err(_) => return,
        };
        line.push(b'\n');
        let now = e.ts;
        let mut inner = self.inner.lock();
        if let Err(err) = inner.index.write_all(&line) {
            tracing::warn!("history: cannot append to the index: {err}");
        }
        if let Some(d) = e.digest.as_deref().filter(|_| e.kept) {
            if let Some(b) = inner.blobs.get_mut(d) {
                b.last = b.last.max(e.ts);
            }
        }
        let v = inner.by_path.entry(e.path.clone()).or_default();
        v.retain(|x| x.version != e.version || x.op == "base" || e.op == "base");
        v.push(e);
        let over = inner.total > self.limits.max_bytes;
        let age = now - inner.last_age_prune > AGE_PRUNE_EVERY_MS;
        drop(inner);
        if over || age {
            self.prune(Timestamp(now), age);
        }
    }

    /// Applies the bounds (module docs); `by_age` also drops old index lines.
    pub fn prune(&self, now: Timestamp, by_age: bool) {
        let mut inner = self.inner.lock();
        let cutoff = now.0 - self.limits.keep.as_millis() as i64;
        // Each path's latest version stays.
        let latest: HashSet<String> = inner
            .by_path
            .values()
            .filter_map(|v| v.last().and_then(|e| e.digest.clone()))
            .collect();
        let mut victims: Vec<(i64, String)> = inner
            .blobs
            .iter()
            .filter(|(d, _)| !latest.contains(*d))
            .map(|(d, b)| (b.last, d.clone()))
            .collect();
        victims.sort();
        let mut dropped: HashSet<String> = HashSet::new();
        let target = self.limits.max_bytes / 10 * 9;
        let over_bound = inner.total > self.limits.max_bytes;
        let mut total = inner.total;
        for (last, d) in victims {
            let old = by_age && last < cutoff;
            let over = over_bound && total > target;
            if !old && !over {
                continue;
            }
            if let Some(b) = inner.blobs.remove(&d) {
                total -= b.size;
                self.unlink_obj(&d);
                dropped.insert(d);
            }
        }
        inner.total = total;
        if !dropped.is_empty() {
            for e in inner.by_path.values_mut().flat_map(|v| v.iter_mut()) {
                if e.digest.as_ref().is_some_and(|d| dropped.contains(d)) {
                    e.kept = false;
                }
            }
        }
        if by_age {
            inner.last_age_prune = now.0;
            let mut gone = 0usize;
            for v in inner.by_path.values_mut() {
                let n = v.len();
                let keep_from = v.iter().position(|e| e.ts >= cutoff).unwrap_or(n - 1);
                v.drain(..keep_from.min(n - 1));
                gone += n - v.len();
            }
            if gone > 0 {
                if let Err(err) = self.rewrite(&mut inner) {
                    tracing::warn!("history: cannot rewrite the index: {err}");
                }
            }
        }
    }

    /// Writes the index anew (the entries in memory) and renames it into place.
    fn rewrite(&self, inner: &mut Inner) -> io::Result<()> {
        let tmp = ".index.tmp";
        let fd = openat(
            fd_b(&self.dir),
            tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            0o600,
        )?;
        let mut f = io::BufWriter::new(File::from(fd));
        let mut all: Vec<&Entry> = inner.by_path.values().flatten().collect();
        all.sort_by_key(|e| e.ts);
        for e in all {
            serde_json::to_writer(&mut f, e)?;
            f.write_all(b"\n")?;
        }
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.sync_data()?;
        let (a, b) = (cstr(tmp)?, cstr(INDEX)?);
        // SAFETY: valid directory descriptors and NUL-terminated names.
        if unsafe {
            libc::renameat(
                self.dir.as_raw_fd(),
                a.as_ptr(),
                self.dir.as_raw_fd(),
                b.as_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        inner.index = File::from(openat(
            fd_b(&self.dir),
            INDEX,
            libc::O_RDWR | libc::O_APPEND,
            0,
        )?);
        Ok(())
    }

    /// A directory renamed from `from` to `to` through the volume: the history of
    /// everything under it moves with it (as the versions do).
    pub fn rename_dir(&self, from: &str, to: &str, ts: i64) {
        let e = Entry {
            path: to.to_string(),
            version: 0,
            session: String::new(),
            ts,
            op: "move_dir".into(),
            digest: None,
            size: 0,
            kept: false,
            from: Some(from.to_string()),
        };
        let Ok(mut line) = serde_json::to_vec(&e) else {
            return;
        };
        line.push(b'\n');
        let mut inner = self.inner.lock();
        if let Err(err) = inner.index.write_all(&line) {
            tracing::warn!("history: cannot append to the index: {err}");
        }
        move_dir(&mut inner.by_path, from, to);
    }

    /// The versions of `path`, oldest first.
    pub fn log(&self, path: &str) -> Vec<Entry> {
        self.inner
            .lock()
            .by_path
            .get(path)
            .cloned()
            .unwrap_or_default()
    }

    /// Is `version` of `path` in the index?
    pub fn has(&self, path: &str, version: u64) -> bool {
        self.inner
            .lock()
            .by_path
            .get(path)
            .is_some_and(|v| v.iter().any(|e| e.version == version))
    }

    /// Every version, path by path (for `diff`/`undo --session`).
    pub fn all(&self) -> Vec<Entry> {
        self.inner
            .lock()
            .by_path
            .values()
            .flatten()
            .cloned()
            .collect()
    }

    /// The bytes of the blob `digest` (hex), checked against it. `Ok(None)`: not kept.
    pub fn bytes(&self, digest: &str) -> io::Result<Option<Vec<u8>>> {
        if digest.len() != 64 || !digest.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Ok(None);
        }
        let fd = match openat(fd_b(&self.objects), digest, libc::O_RDONLY, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        each_chunk(fd_b(&fd), |b| out.extend_from_slice(b))?;
        if hex(blake3::hash(&out).as_bytes()) != digest {
            return Err(io::Error::other(format!(
                "the history blob {digest} does not match its digest (damaged)"
            )));
        }
        Ok(Some(out))
    }

    /// Bytes the blobs take, and how many there are.
    pub fn usage(&self) -> (u64, usize) {
        let inner = self.inner.lock();
        (inner.total, inner.blobs.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn entry(path: &str, v: u64, ts: i64, k: &Kept) -> Entry {
        Entry {
            path: path.into(),
            version: v,
            session: "s".into(),
            ts,
            op: "write".into(),
            digest: Some(hex(&k.digest)),
            size: k.size,
            kept: k.stored,
            from: None,
        }
    }

    fn file(dir: &Path, name: &str, bytes: &[u8]) -> File {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        File::open(p).unwrap()
    }

    #[test]
    fn keeps_each_content_once_and_reads_it_back_after_reopening() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path(), Limits::default()).unwrap();
        let a = s
            .keep_fd(file(t.path(), "a", b"one\n").as_fd())
            .unwrap()
            .unwrap();
        let b = s
            .keep_fd(file(t.path(), "b", b"one\n").as_fd())
            .unwrap()
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(s.usage(), (4, 1));
        s.record(entry("f", 2, 1, &a));
        drop(s);
        let s = Store::open(t.path(), Limits::default()).unwrap();
        let log = s.log("f");
        assert_eq!(log.len(), 1);
        assert_eq!(
            s.bytes(log[0].digest.as_deref().unwrap()).unwrap().unwrap(),
            b"one\n"
        );
        // The directory is private, and a blob changed on disk is refused, not shown.
        let md = std::fs::metadata(t.path().join("history")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o777,
            0o700
        );
        let d = hex(&a.digest);
        std::fs::write(t.path().join("history/objects").join(&d), b"two\n").unwrap();
        assert!(s.bytes(&d).is_err());
    }

    #[test]
    fn refuses_a_history_dir_open_to_others_or_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(t.path().join("elsewhere"), t.path().join("history")).unwrap();
        assert!(Store::open(t.path(), Limits::default()).is_err());
        std::fs::remove_file(t.path().join("history")).unwrap();
        std::fs::create_dir(t.path().join("history")).unwrap();
        std::fs::set_permissions(
            t.path().join("history"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        assert!(Store::open(t.path(), Limits::default()).is_err());
    }

    #[test]
    fn over_the_file_limit_only_the_digest() {
        let t = tempfile::tempdir().unwrap();
        let lim = Limits {
            max_file: 3,
            ..Limits::default()
        };
        let s = Store::open(t.path(), lim).unwrap();
        let k = s
            .keep_fd(file(t.path(), "a", b"four").as_fd())
            .unwrap()
            .unwrap();
        assert!(!k.stored);
        assert_eq!(k.digest, *blake3::hash(b"four").as_bytes());
        assert_eq!(s.usage(), (0, 0));
    }

    #[test]
    fn a_large_file_is_hashed_off_the_request_and_recorded_by_digest() {
        let t = tempfile::tempdir().unwrap();
        let lim = Limits {
            max_file: 3,
            ..Limits::default()
        };
        let s = Arc::new(Store::open(t.path(), lim).unwrap());
        let f = file(t.path(), "big", b"large");
        let st = fstat(f.as_fd()).unwrap();
        let e = Entry {
            path: "big".into(),
            version: 2,
            session: "s".into(),
            ts: Timestamp::now().0,
            op: "write".into(),
            digest: None,
            size: 5,
            kept: false,
            from: None,
        };
        s.record_large_later(f.into(), st, e.clone());
        s.settle();
        let log = s.log("big");
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].digest, Some(hex(blake3::hash(b"large").as_bytes())));
        assert!(!log[0].kept);
        assert_eq!(s.usage(), (0, 0));
        // changed since the commit: that content is gone, no digest is made up
        let f = file(t.path(), "big2", b"large");
        let st = fstat(f.as_fd()).unwrap();
        std::fs::write(t.path().join("big2"), b"other!").unwrap();
        s.record_large_later(
            f.into(),
            st,
            Entry {
                path: "big2".into(),
                ..e
            },
        );
        s.settle();
        assert_eq!(s.log("big2")[0].digest, None);
    }

    #[test]
    fn the_size_bound_holds_and_spares_each_paths_latest() {
        let t = tempfile::tempdir().unwrap();
        let lim = Limits {
            max_bytes: 10_000,
            ..Limits::default()
        };
        let s = Store::open(t.path(), lim).unwrap();
        let now = Timestamp::now().0;
        for i in 0..200u64 {
            let body = format!("{i:0>999}\n");
            let k = s
                .keep_fd(file(t.path(), "w", body.as_bytes()).as_fd())
                .unwrap()
                .unwrap();
            s.record(entry("w", i + 1, now + i as i64, &k));
            assert!(s.usage().0 <= 10_000 + 1000, "{:?}", s.usage());
        }
        let log = s.log("w");
        let last = log.last().unwrap();
        assert!(last.kept);
        assert!(s.bytes(last.digest.as_deref().unwrap()).unwrap().is_some());
        assert!(!log[0].kept, "the oldest went first");
        // What the index says is kept is on disk, after a reopen too.
        drop(s);
        let s = Store::open(t.path(), lim).unwrap();
        let on_disk = std::fs::read_dir(t.path().join("history/objects"))
            .unwrap()
            .count();
        assert_eq!(s.usage().1, on_disk);
        for e in s.log("w").iter().filter(|e| e.kept) {
            assert!(s.bytes(e.digest.as_deref().unwrap()).unwrap().is_some());
        }
    }

    #[test]
    fn the_age_bound_drops_old_blobs_and_lines() {
        let t = tempfile::tempdir().unwrap();
        let lim = Limits {
            keep: Duration::from_secs(3600),
            ..Limits::default()
        };
        let s = Store::open(t.path(), lim).unwrap();
        let old = Timestamp::now().0 - 2 * 3600 * 1000;
        let a = s
            .keep_fd(file(t.path(), "a", b"old\n").as_fd())
            .unwrap()
            .unwrap();
        s.record(entry("f", 1, old, &a));
        let b = s
            .keep_fd(file(t.path(), "b", b"new\n").as_fd())
            .unwrap()
            .unwrap();
        s.record(entry("f", 2, Timestamp::now().0, &b));
        s.prune(Timestamp::now(), true);
        assert_eq!(s.usage(), (4, 1));
        assert_eq!(s.log("f").len(), 1);
        drop(s);
        let s = Store::open(t.path(), lim).unwrap();
        assert_eq!(
            s.log("f").iter().map(|e| e.version).collect::<Vec<_>>(),
            [2]
        );
    }

    #[test]
    fn a_directory_rename_moves_the_history_under_it_also_after_reopening() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path(), Limits::default()).unwrap();
        let a = s
            .keep_fd(file(t.path(), "a", b"x").as_fd())
            .unwrap()
            .unwrap();
        let now = Timestamp::now().0;
        s.record(entry("d/x", 1, now, &a));
        s.record(entry("d/sub/y", 1, now, &a));
        s.record(entry("dx", 1, now, &a));
        s.rename_dir("d", "e/f", now);
        let check = |s: &Store| {
            assert!(s.log("d/x").is_empty());
            assert_eq!(s.log("e/f/x")[0].path, "e/f/x");
            assert_eq!(s.log("e/f/sub/y").len(), 1);
            assert_eq!(s.log("dx").len(), 1, "a sibling with the same prefix stays");
        };
        check(&s);
        drop(s);
        check(&Store::open(t.path(), Limits::default()).unwrap());
    }

    #[test]
    fn a_torn_last_line_and_a_left_temp_file_are_cleaned() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path(), Limits::default()).unwrap();
        let a = s
            .keep_fd(file(t.path(), "a", b"x").as_fd())
            .unwrap()
            .unwrap();
        s.record(entry("f", 1, Timestamp::now().0, &a));
        drop(s);
        let idx = t.path().join("history").join(INDEX);
        let mut f = std::fs::OpenOptions::new().append(true).open(&idx).unwrap();
        f.write_all(b"{\"path\":\"f\",\"vers").unwrap();
        std::fs::write(t.path().join("history/objects/.tmp-1-1"), b"partial").unwrap();
        let s = Store::open(t.path(), Limits::default()).unwrap();
        assert_eq!(s.log("f").len(), 1);
        assert!(!t.path().join("history/objects/.tmp-1-1").exists());
    }
}
