//! The log's file I/O behind a small trait ([`LogFile`], opened through [`LogIo`]), so a
//! test can make it fail (`ENOSPC`, `EIO`, a failed fsync, a torn write) and check what the
//! journal does. [`DiskIo`] is the real one.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// The open log file.
pub trait LogFile: Send + Sync {
    /// Writes `bytes` at the end of the file. On an error, part of them may be written.
    fn append(&self, bytes: &[u8]) -> io::Result<()>;
    /// `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// The length of the file now.
    fn size(&self) -> io::Result<u64>;
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

/// Opens the log.
pub trait LogIo: Send + Sync + std::fmt::Debug {
    /// Opens (creating it, 0600) the log at `path` for reading and appending.
    fn open_log(&self, path: &Path) -> io::Result<Arc<dyn LogFile>>;
}

/// The log on disk.
#[derive(Debug, Default, Clone, Copy)]
pub struct DiskIo;

impl LogIo for DiskIo {
    fn open_log(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        let f = std::fs::OpenOptions::new()
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .create(true)
            .read(true)
            .append(true)
            .open(path)?;
        Ok(Arc::new(f))
    }
}

impl LogFile for File {
    fn append(&self, bytes: &[u8]) -> io::Result<()> {
        (&mut &*self).write_all(bytes)
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}
