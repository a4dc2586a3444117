//! The content fingerprint of a backing file (docs/versions-and-holds.md#content): its size
//! and a BLAKE3 digest of its bytes (of its target, for a symlink). Taken only where a
//! stamp cannot tell a change from a metadata-only one, and at a transfer.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::sys::{fstat_fd, fstatat};
use super::types::Stamp;

/// How often a file found changing while it is read is read again before giving up.
const TRIES: usize = 3;

/// A file's fingerprint and the stamp its content had all along the reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub stamp: Stamp,
    pub size: u64,
    pub digest: [u8; 32],
}

/// The fingerprint of the regular file or symlink at `rel` beneath `root` (a final
/// symlink is not followed). `None`: nothing there, another kind of file, unreadable, or
/// changing under every try (its stamp moved while it was read).
pub fn fingerprint_at(root: BorrowedFd<'_>, rel: &str) -> Option<Fingerprint> {
    let c = CString::new(rel).ok()?;
    for _ in 0..TRIES {
        let st = fstatat(root.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW).ok()?;
        let got = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => file(root, &c),
            libc::S_IFLNK => link(root, &c, &st),
            _ => return None,
        };
        match got {
            Some(Ok(fp)) => return Some(fp),
            Some(Err(Moved)) => continue,
            None => return None,
        }
    }
    None
}

/// Is there a regular file or a symlink at `rel` (a file with content to fingerprint)?
pub fn has_content(root: BorrowedFd<'_>, rel: &str) -> bool {
    let Ok(c) = CString::new(rel) else {
        return false;
    };
    fstatat(root.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| matches!(st.st_mode & libc::S_IFMT, libc::S_IFREG | libc::S_IFLNK))
}

/// The stamp moved while the content was read.
struct Moved;

fn file(root: BorrowedFd<'_>, c: &CString) -> Option<Result<Fingerprint, Moved>> {
    // O_NONBLOCK: a FIFO put there since the stat is not waited on (the fstat below
    // refuses it). O_NOATIME: reading to fingerprint is not a use of the file.
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    let open = |f: i32| {
        // SAFETY: a valid directory descriptor and a NUL-terminated path.
        let fd = unsafe { libc::openat(root.as_raw_fd(), c.as_ptr(), f) };
        // SAFETY: openat returned a descriptor that nothing else owns.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let fd = open(flags | libc::O_NOATIME).or_else(|| open(flags))?;
    let before = fstat_fd(fd.as_raw_fd()).ok()?;
    if before.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let mut f = std::fs::File::from(fd);
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                h.update(&buf[..n]);
                size += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let after = fstat_fd(f.as_raw_fd()).ok()?;
    let stamp = Stamp::from_stat(&after);
    if stamp != Stamp::from_stat(&before) || size != stamp.size {
        return Some(Err(Moved));
    }
    Some(Ok(Fingerprint {
        stamp,
        size,
        digest: *h.finalize().as_bytes(),
    }))
}

fn link(root: BorrowedFd<'_>, c: &CString, st: &libc::stat) -> Option<Result<Fingerprint, Moved>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the buffer is as long as we say.
    let n = unsafe {
        libc::readlinkat(
            root.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return None;
    }
    let target = &buf[..n as usize];
    let after = fstatat(root.as_raw_fd(), c, libc::AT_SYMLINK_NOFOLLOW).ok()?;
    let stamp = Stamp::from_stat(&after);
    if stamp != Stamp::from_stat(st) {
        return Some(Err(Moved));
    }
    Some(Ok(Fingerprint {
        stamp,
        size: target.len() as u64,
        digest: *blake3::hash(target).as_bytes(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn dir() -> (tempdir::Dir, std::fs::File) {
        let d = tempdir::Dir::new();
        let f = std::fs::File::open(&d.0).unwrap();
        (d, f)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!(
                    "coherent-print-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                let _ = std::fs::remove_dir_all(&p);
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn same_bytes_same_print_whatever_the_metadata_and_other_bytes_another() {
        let (d, root) = dir();
        std::fs::write(d.0.join("a"), b"plan v1\n").unwrap();
        std::fs::write(d.0.join("b"), b"plan v1\n").unwrap();
        std::fs::write(d.0.join("c"), b"plan v2\n").unwrap();
        let fp = |n: &str| fingerprint_at(root.as_fd(), n).unwrap();
        let (a, b, c) = (fp("a"), fp("b"), fp("c"));
        assert_ne!(a.stamp.ino, b.stamp.ino);
        assert_eq!(
            (a.size, a.digest),
            (b.size, b.digest),
            "a copy prints the same"
        );
        assert_eq!(a.size, c.size);
        assert_ne!(a.digest, c.digest, "same size, other bytes");
        assert_eq!(a.digest, *blake3::hash(b"plan v1\n").as_bytes());
        std::os::unix::fs::symlink("target", d.0.join("l")).unwrap();
        let l = fp("l");
        assert_eq!((l.size, l.digest), (6, *blake3::hash(b"target").as_bytes()));
        assert!(fingerprint_at(root.as_fd(), "missing").is_none());
        assert!(
            fingerprint_at(root.as_fd(), ".").is_none(),
            "a directory has none"
        );
    }
}
