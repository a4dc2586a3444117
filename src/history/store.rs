//! The history store: `history/` in the state directory, 0700, owned by the daemon's user,
//! opened without following symlinks (as the state directory itself).
//!
//! - `objects/`: one blob per distinct content, known by its BLAKE3 digest (so two versions
//!   with the same bytes share one), 0600. Up to [`SMALL`] bytes, in a pack (pack.rs);
//!   larger, `objects/<64 hex>`, a file of its own made as a reflink (`FICLONE`) of the
//!   backing file where its filesystem has one, else by `copy_file_range` (a server-side
//!   or in-kernel copy), else by read and write; written as `.tmp-*` and renamed into
//!   place, so a blob is whole or absent.
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
//! (down to 90 % of the bound), each path's latest version after every older one (the
//! bound holds even when the latest versions alone are over it: a big tree copied in; a
//! pass then comes once per tenth of the bound, not once per version). A version whose blob is
//! gone stays in the index by digest only (`kept: false`); index lines older than `keep`
//! are dropped (each path keeps its latest).

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, BufRead, Write};
use std::ops::Bound;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
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

/// The versions of each path, in path order: the paths under a directory are one range
/// (a directory rename moves them without a pass over every path; the index may hold tens
/// of thousands of renames, each replayed at open).
type ByPath = BTreeMap<String, Vec<Rec>>;

/// Moves the history of `from` and everything under it to `to` (a directory rename).
fn move_dir(by_path: &mut ByPath, from: &str, to: &str) {
    let under = format!("{from}/");
    // `from` itself, then the range of `from/...` (a name like `from-x` sorts between).
    let moved: Vec<String> = by_path
        .get_key_value(from)
        .map(|(k, _)| k)
        .into_iter()
        .chain(
            by_path
                .range::<str, _>((Bound::Included(under.as_str()), Bound::Unbounded))
                .map(|(k, _)| k)
                .take_while(|k| k.starts_with(&under)),
        )
        .cloned()
        .collect();
    for k in moved {
        let Some(mut v) = by_path.remove(&k) else {
            continue;
        };
        let nk = format!("{to}{}", &k[from.len()..]);
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
    /// Its record, for a blob kept in a pack (None: a file of its own).
    at: Option<pack::At>,
}

struct Inner {
    index: File,
    /// Each path's versions, oldest first.
    by_path: ByPath,
    names: Names,
    blobs: HashMap<[u8; 32], Blob>,
    total: u64,
    last_age_prune: i64,
    /// Retention passes run (a test counts them: each walks every path).
    #[cfg(test)]
    passes: u64,
    packs: Packs,
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

/// What a blob of `size` bytes takes on disk, as the bound counts it: whole 4 KiB blocks
/// (a packed blob's span, and what a file of its own is given on the usual filesystems),
/// so that `--history-max` bounds the space the store takes, tiny versions included.
fn on_disk(size: u64) -> u64 {
    size.div_ceil(pack::ALIGN) * pack::ALIGN
}

mod content;
mod fd;
mod pack;
mod rec;
mod retention;
#[cfg(test)]
mod tests;

use crate::mem::push_tight;
pub use content::hex;
use content::{copy_into, digest_of, digest_while_unmoved, each_chunk, read_small, same};
use fd::{cstr, fd_b, fstat, openat, private_dir};
use pack::Packs;
use rec::{unhex, Names, Rec};

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
        let (packs, packed) = Packs::open(fd_b(&objects))?;
        let store = Store {
            dir,
            objects,
            limits,
            inner: Mutex::new(Inner {
                index: File::from(index_fd),
                by_path: ByPath::new(),
                names: Names::default(),
                blobs: HashMap::new(),
                total: 0,
                last_age_prune: 0,
                #[cfg(test)]
                passes: 0,
                packs,
            }),
            tmp: AtomicU64::new(0),
            no_reflink: AtomicBool::new(false),
            hasher: OnceLock::new(),
        };
        store.load(&packed)?;
        store.prune(Timestamp::now(), true);
        Ok(store)
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Reads the index back; `packed` is what the packs hold.
    fn load(&self, packed: &pack::Found) -> io::Result<()> {
        self.remove_tmp();
        let mut inner = self.inner.lock();
        let f = inner.index.try_clone()?;
        let mut read = io::BufReader::new(f);
        let mut line = Vec::new();
        let mut by_path = ByPath::new();
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
            let r = Rec::of(&e, &mut inner.names);
            let v = by_path.entry(e.path).or_default();
            // The journal may have lost a commit the index has: the later line wins.
            v.retain(|x| x.version != r.version || x.is_base());
            push_tight(v, r);
        }
        if !ends_whole {
            // The next line must not be glued to a torn one.
            inner.index.write_all(b"\n")?;
        }
        let mut blobs: HashMap<[u8; 32], Blob> = HashMap::new();
        let mut total = 0;
        for e in by_path.values_mut().flat_map(|v| v.iter_mut()) {
            let Some(d) = e.digest.filter(|_| e.kept) else {
                continue;
            };
            if let Some(b) = blobs.get_mut(&d) {
                b.last = b.last.max(e.ts);
                continue;
            }
            if let Some(&(at, size)) = packed.get(&d) {
                total += on_disk(size);
                let at = Some(at);
                blobs.insert(
                    d,
                    Blob {
                        size,
                        last: e.ts,
                        at,
                    },
                );
                continue;
            }
            match openat(fd_b(&self.objects), &hex(&d), libc::O_RDONLY, 0)
                .and_then(|f| fstat(fd_b(&f)))
            {
                Ok(st) => {
                    total += on_disk(st.st_size as u64);
                    blobs.insert(
                        d,
                        Blob {
                            size: st.st_size as u64,
                            last: e.ts,
                            at: None,
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
            buf = read_small(fd, size)?;
            (*blake3::hash(&buf).as_bytes(), buf.len() as u64)
        } else {
            digest_of(fd)?
        };
        if n != size || !same(before, &fstat(fd)?) {
            return Ok(None);
        }
        let kept = |stored| Kept {
            digest,
            size,
            stored,
        };
        if size > self.limits.max_file {
            return Ok(Some(kept(false)));
        }
        if small {
            // Into a pack: one write, no file of its own (see pack.rs).
            let mut inner = self.inner.lock();
            if !inner.blobs.contains_key(&digest) {
                let at = inner.packs.append(fd_b(&self.objects), &digest, &buf)?;
                inner.total += on_disk(size);
                let blob = Blob {
                    size,
                    last: 0,
                    at: Some(at),
                };
                inner.blobs.insert(digest, blob);
            }
            return Ok(Some(kept(true)));
        }
        if self.inner.lock().blobs.contains_key(&digest) {
            return Ok(Some(kept(true)));
        }
        let name = hex(&digest);
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
        // A large file is copied (a reflink where it can be): the copy is of this content
        // only if the file did not move while it ran.
        let copied = copy_into(fd, fd_b(&out), size, &self.no_reflink).and_then(|()| {
            Ok(same(before, &fstat(fd)?) && fstat(fd_b(&out))?.st_size as u64 == size)
        });
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
        if !inner.blobs.contains_key(&digest) {
            inner.total += on_disk(size);
            let blob = Blob {
                size,
                last: 0,
                at: None,
            };
            inner.blobs.insert(digest, blob);
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
                    // Hashing a large file is background work: a tool's own reads and
                    // the requests go first.
                    crate::sys::background_thread();
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
        let r = Rec::of(&e, &mut inner.names);
        if let Some(d) = r.digest.filter(|_| r.kept) {
            if let Some(b) = inner.blobs.get_mut(&d) {
                b.last = b.last.max(r.ts);
            }
        }
        let v = inner.by_path.entry(e.path).or_default();
        v.retain(|x| x.version != r.version || x.is_base() || r.is_base());
        push_tight(v, r);
        let over = inner.total > self.limits.max_bytes;
        let age = now - inner.last_age_prune > AGE_PRUNE_EVERY_MS;
        drop(inner);
        if over || age {
            self.prune(Timestamp(now), age);
        }
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
        let inner = self.inner.lock();
        let v = inner.by_path.get(path);
        v.map(|v| v.iter().map(|r| r.entry(path)).collect())
            .unwrap_or_default()
    }

    /// The newest `n` versions of `path` below `below` whose content the index names, as
    /// (version, size, digest), newest first (a version named twice, as `base` and by a
    /// write, once). Several hosts publish them with a path's first transfer.
    pub fn digests(&self, path: &str, below: u64, n: usize) -> Vec<(u64, u64, [u8; 32])> {
        let inner = self.inner.lock();
        let mut out: Vec<(u64, u64, [u8; 32])> = Vec::new();
        for r in inner.by_path.get(path).into_iter().flatten().rev() {
            if out.len() == n {
                break;
            }
            let Some(d) = r.digest.filter(|_| r.version < below) else {
                continue;
            };
            if !out.iter().any(|(v, _, _)| *v == r.version) {
                out.push((r.version, r.size, d));
            }
        }
        out
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
        let inner = self.inner.lock();
        let each = inner.by_path.iter();
        each.flat_map(|(p, v)| v.iter().map(|r| r.entry(p)))
            .collect()
    }

    /// The bytes of the blob `digest` (hex), checked against it. `Ok(None)`: not kept.
    pub fn bytes(&self, digest: &str) -> io::Result<Option<Vec<u8>>> {
        let Some(d) = unhex(digest) else {
            return Ok(None);
        };
        let packed = self
            .inner
            .lock()
            .blobs
            .get(&d)
            .and_then(|b| Some((b.at?, b.size)));
        let out = match packed {
            Some((at, len)) => Packs::read(fd_b(&self.objects), at, len)?,
            None => {
                let fd = match openat(fd_b(&self.objects), digest, libc::O_RDONLY, 0) {
                    Ok(fd) => fd,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
                    Err(e) => return Err(e),
                };
                let mut out = Vec::new();
                each_chunk(fd_b(&fd), |b| out.extend_from_slice(b))?;
                out
            }
        };
        if *blake3::hash(&out).as_bytes() != d {
            return Err(io::Error::other(format!(
                "the history blob {digest} does not match its digest (damaged)"
            )));
        }
        Ok(Some(out))
    }

    /// Bytes the blobs take on disk (whole blocks: see `on_disk`), and how many there are.
    pub fn usage(&self) -> (u64, usize) {
        let inner = self.inner.lock();
        (inner.total, inner.blobs.len())
    }

    /// How many retention passes ran.
    #[cfg(test)]
    fn passes(&self) -> u64 {
        self.inner.lock().passes
    }
}
