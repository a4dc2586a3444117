//! Bounded descriptors: a node is remembered by its file handle (`name_to_handle_at`), not
//! by an open descriptor, and a bounded LRU of `O_PATH` descriptors is re-opened from the
//! handle on demand (`open_by_handle_at`, which needs CAP_DAC_READ_SEARCH: the daemon runs
//! as root). Where the backing filesystem has no handles, the caller re-resolves the node
//! by (parent, name) instead; either way the number of descriptors held stays bounded.

use std::ffi::CStr;
use std::num::NonZeroUsize;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use parking_lot::Mutex;

use super::sys::cvt;
use super::FsResult;

/// The kernel's `MAX_HANDLE_SZ`.
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// A file handle: stable across renames, and stale (ESTALE) once the file is gone, so
/// a reused inode number never reaches the wrong file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FileHandle {
    handle_type: i32,
    bytes: Box<[u8]>,
}

impl FileHandle {
    #[cfg(test)]
    pub(super) fn from_parts(handle_type: i32, bytes: Vec<u8>) -> FileHandle {
        FileHandle {
            handle_type,
            bytes: bytes.into(),
        }
    }
}

/// What `name_to_handle_at` answered.
pub(super) enum HandleOf {
    /// A handle on the mount `mount_id`.
    Handle(FileHandle, i32),
    /// The filesystem has no handles (EOPNOTSUPP) or the name is gone meanwhile.
    Unsupported,
}

/// The handle of `name` under `dirfd` (`name` empty: `dirfd` itself). Symlinks are not
/// followed.
pub(super) fn handle_at(dirfd: RawFd, name: &CStr) -> FsResult<HandleOf> {
    let mut h = RawHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH
    } else {
        0
    };
    // SAFETY: `h` has room for MAX_HANDLE_SZ bytes as handle_bytes says.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            dirfd,
            name.as_ptr(),
            &mut h as *mut RawHandle,
            &mut mount_id as *mut libc::c_int,
            flags,
        )
    };
    if r == -1 {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return match e {
            libc::EOPNOTSUPP | libc::EOVERFLOW => Ok(HandleOf::Unsupported),
            e => Err(super::FsError(e)),
        };
    }
    let n = (h.handle_bytes as usize).min(MAX_HANDLE_SZ);
    Ok(HandleOf::Handle(
        FileHandle {
            handle_type: h.handle_type,
            bytes: h.f_handle[..n].into(),
        },
        mount_id,
    ))
}

/// Open `h` with `O_PATH` on the mount of `mount_fd`.
pub(super) fn open_handle(mount_fd: RawFd, h: &FileHandle) -> FsResult<OwnedFd> {
    let mut raw = RawHandle {
        handle_bytes: h.bytes.len() as u32,
        handle_type: h.handle_type,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    raw.f_handle[..h.bytes.len()].copy_from_slice(&h.bytes);
    // SAFETY: `raw` is a valid file_handle of `handle_bytes` bytes.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd,
            &raw as *const RawHandle,
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The bounded set of open `O_PATH` descriptors, by our inode number, least recently
/// used first out. A descriptor in use by an operation stays open until that operation
/// drops its `Arc`, even if evicted meanwhile.
pub(super) struct FdCache {
    lru: Mutex<lru::LruCache<u64, Arc<OwnedFd>>>,
}

impl FdCache {
    pub(super) fn new(cap: usize) -> FdCache {
        FdCache {
            lru: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(cap.max(1)).expect("nonzero"),
            )),
        }
    }

    pub(super) fn get(&self, ino: u64) -> Option<Arc<OwnedFd>> {
        self.lru.lock().get(&ino).cloned()
    }

    pub(super) fn put(&self, ino: u64, fd: Arc<OwnedFd>) {
        self.lru.lock().put(ino, fd);
    }

    pub(super) fn remove(&self, ino: u64) {
        self.lru.lock().pop(&ino);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lru.lock().len()
    }
}

/// How many `O_PATH` descriptors to keep open: a quarter of the descriptor limit (the
/// rest is for files the kernel opens, the journal and the FUSE device), at least 16
/// and at most 4096.
pub(super) fn default_capacity() -> usize {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `rl`.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_cur
    } else {
        1024
    };
    (cur / 4).clamp(16, 4096) as usize
}
