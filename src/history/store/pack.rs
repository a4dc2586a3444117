//! Small blobs packed together: `objects/pack-<n>` holds their bytes, each starting at a
//! multiple of [`ALIGN`], and `objects/pack-<n>.idx` one 56-byte entry per blob (`CPK1`,
//! four zero bytes, then as u64 little-endian the offset and the length, then the 32-byte
//! BLAKE3 digest), written after its bytes.
//!
//! Why: a blob per file costs an inode, a create and a rename at each commit, which is most
//! of what keeping a small version costs (more on a filesystem whose inode allocator is
//! slow). A blob in a pack is two `pwrite`s into files that are already open. The bytes
//! are aligned to the filesystem's block and the entries live apart, so a blob takes the
//! blocks a file of its own would take, and a pruned one is a punched hole that frees
//! exactly them (its entry is cleared). A pack with no blob left is removed.
//!
//! Crash semantics are a blob file's: both writes are in the kernel before the commit is
//! answered; an entry cut short, or whose bytes are not all there (a power loss), is
//! skipped at open, and bytes that do not match their digest are refused at read.

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::fd::{cstr, fd_b, fstat, openat};

const MAGIC: &[u8; 4] = b"CPK1";
const ENTRY: u64 = 56;
/// Blobs start at multiples of this (the block size of the usual filesystems).
pub(super) const ALIGN: u64 = 4096;
/// A pack takes blobs until it is this large; then the next one is started.
const PACK_MAX: u64 = 64 << 20;
const PREFIX: &str = "pack-";

/// Where a packed blob is: its pack, the offset of its bytes and its entry's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct At {
    pub pack: u32,
    pub off: u64,
    pub entry: u64,
}

fn data(pack: u32) -> String {
    format!("{PREFIX}{pack}")
}

fn idx(pack: u32) -> String {
    format!("{PREFIX}{pack}.idx")
}

/// The bytes a blob of `len` takes in its pack.
fn span(len: u64) -> u64 {
    len.div_ceil(ALIGN) * ALIGN
}

fn pwrite_all(fd: BorrowedFd<'_>, buf: &[u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: a valid descriptor and a buffer as long as we say.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                buf[done..].as_ptr().cast(),
                buf.len() - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        done += n as usize;
    }
    Ok(())
}

/// The pack blobs are added to: its number, its two files, where the next blob's bytes
/// go and how many entries it has.
struct Current {
    pack: u32,
    data: OwnedFd,
    idx: OwnedFd,
    end: u64,
    entries: u64,
}

/// The packs of one store: the one blobs are added to, and how many live blobs each
/// holds (a pack at 0 that is not the current one is removed).
#[derive(Default)]
pub(super) struct Packs {
    current: Option<Current>,
    next: u32,
    live: HashMap<u32, usize>,
}

/// What a scan found: each digest with its place and length.
pub(super) type Found = HashMap<[u8; 32], (At, u64)>;

impl Packs {
    /// Scans the packs in `objects`: every blob whose entry and bytes are whole, by digest.
    pub(super) fn open(objects: BorrowedFd<'_>) -> io::Result<(Packs, Found)> {
        let mut packs = Packs::default();
        let mut found = Found::new();
        let mut dir = nix::dir::Dir::openat(
            Some(objects.as_raw_fd()),
            ".",
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(io::Error::from)?;
        let mut ids: Vec<u32> = Vec::new();
        for e in dir.iter().filter_map(Result::ok) {
            let n = e.file_name().to_string_lossy();
            if let Some(id) = n.strip_prefix(PREFIX).and_then(|s| s.parse().ok()) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        for id in ids {
            packs.next = packs.next.max(id + 1);
            let n = scan(objects, id, &mut found)?;
            packs.live.insert(id, n);
        }
        Ok((packs, found))
    }

    /// Adds `bytes` (whose digest is `digest`) to the current pack.
    pub(super) fn append(
        &mut self,
        objects: BorrowedFd<'_>,
        digest: &[u8; 32],
        bytes: &[u8],
    ) -> io::Result<At> {
        let len = bytes.len() as u64;
        if self.current.as_ref().is_none_or(|c| c.end >= PACK_MAX) {
            let pack = self.next;
            let new = |name: String| {
                let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
                openat(objects, &name, flags, 0o600)
            };
            let (d, i) = (new(data(pack))?, new(idx(pack))?);
            self.next = pack + 1;
            self.live.insert(pack, 0);
            let c = Current {
                pack,
                data: d,
                idx: i,
                end: 0,
                entries: 0,
            };
            if let Some(old) = self.current.replace(c) {
                self.remove_if_empty(objects, old.pack);
            }
        }
        let c = self.current.as_mut().expect("a current pack");
        let off = c.end;
        pwrite_all(fd_b(&c.data), bytes, off)?;
        let mut e = Vec::with_capacity(ENTRY as usize);
        e.extend_from_slice(MAGIC);
        e.extend_from_slice(&[0; 4]);
        e.extend_from_slice(&off.to_le_bytes());
        e.extend_from_slice(&len.to_le_bytes());
        e.extend_from_slice(digest);
        pwrite_all(fd_b(&c.idx), &e, c.entries * ENTRY)?;
        let at = At {
            pack: c.pack,
            off,
            entry: c.entries,
        };
        c.end = off + span(len);
        c.entries += 1;
        *self.live.entry(c.pack).or_default() += 1;
        Ok(at)
    }

    /// The bytes of the blob at `at` (`len` of them).
    pub(super) fn read(objects: BorrowedFd<'_>, at: At, len: u64) -> io::Result<Vec<u8>> {
        let fd = openat(objects, &data(at.pack), libc::O_RDONLY, 0)?;
        let mut out = vec![0u8; len as usize];
        if super::content::pread_full(fd_b(&fd), &mut out, at.off)? < out.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        Ok(out)
    }

    /// Drops the blob at `at`: its entry is cleared and its blocks freed (a hole; where
    /// the filesystem cannot punch one they stay until the pack goes).
    pub(super) fn drop_blob(&mut self, objects: BorrowedFd<'_>, at: At, len: u64) {
        if let Ok(fd) = openat(objects, &idx(at.pack), libc::O_RDWR, 0) {
            let _ = pwrite_all(fd_b(&fd), &[0; ENTRY as usize], at.entry * ENTRY);
        }
        if let Ok(fd) = openat(objects, &data(at.pack), libc::O_RDWR, 0) {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: fallocate on a descriptor we own, over the blob's own blocks.
            unsafe { libc::fallocate(fd.as_raw_fd(), mode, at.off as i64, span(len) as i64) };
        }
        if let Some(n) = self.live.get_mut(&at.pack) {
            *n = n.saturating_sub(1);
        }
        self.remove_if_empty(objects, at.pack);
    }

    fn remove_if_empty(&mut self, objects: BorrowedFd<'_>, pack: u32) {
        let current = self.current.as_ref().is_some_and(|c| c.pack == pack);
        if current || self.live.get(&pack).is_some_and(|n| *n > 0) {
            return;
        }
        self.live.remove(&pack);
        for name in [idx(pack), data(pack)] {
            if let Ok(c) = cstr(&name) {
                // SAFETY: a valid directory descriptor and a NUL-terminated name.
                unsafe { libc::unlinkat(objects.as_raw_fd(), c.as_ptr(), 0) };
            }
        }
    }
}

/// The whole blobs of pack `pack` into `found`; how many there are.
fn scan(objects: BorrowedFd<'_>, pack: u32, found: &mut Found) -> io::Result<usize> {
    let d = openat(objects, &data(pack), libc::O_RDONLY, 0)?;
    let size = fstat(fd_b(&d))?.st_size as u64;
    let i = match openat(objects, &idx(pack), libc::O_RDONLY, 0) {
        Ok(i) => i,
        // Killed between the two creates: nothing was added to it.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut entries = Vec::new();
    std::fs::File::from(i).read_to_end(&mut entries)?;
    let mut n = 0;
    for (k, e) in entries.chunks_exact(ENTRY as usize).enumerate() {
        let word = |a: usize| u64::from_le_bytes(e[a..a + 8].try_into().expect("8 bytes"));
        let (off, len) = (word(8), word(16));
        if &e[..4] != MAGIC || off.checked_add(len).is_none_or(|end| end > size) {
            continue; // cleared (pruned), or its bytes are not all there
        }
        let digest: [u8; 32] = e[24..56].try_into().expect("32 bytes");
        let at = At {
            pack,
            off,
            entry: k as u64,
        };
        found.insert(digest, (at, len));
        n += 1;
    }
    Ok(n)
}
