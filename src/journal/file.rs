//! The state directory's file I/O behind small traits, so a test can make any step fail
//! (`ENOSPC`, `EIO`, a failed fsync, a torn write, a failed rename or directory fsync)
//! and check what the journal does: the log ([`LogFile`]) and the files that replace
//! another whole (snapshots, a compacted log, and the volume's standing waits too:
//! [`NewFile`], then a rename and a directory fsync, in [`replace_durably`]). [`DiskIo`]
//! is the real one.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use super::dir::private_file;

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

/// A file being written whole before it is renamed into place.
pub trait NewFile: Send {
    /// Writes all of `bytes`; on an error, part of them may be written.
    fn write_part(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// `fsync`.
    fn sync_all(&mut self) -> io::Result<()>;
}

/// Opens, creates and renames the files of the state directory.
pub trait StateIo: Send + Sync + std::fmt::Debug {
    /// Opens (creating it, 0600) the log at `path` for reading and appending.
    fn open_log(&self, path: &Path) -> io::Result<Arc<dyn LogFile>>;
    /// Creates (0600, truncating) `path` to be written whole.
    fn create(&self, path: &Path) -> io::Result<Box<dyn NewFile>>;
    /// `rename(2)`: replaces `to` at once.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// fsyncs the directory `dir`, so the renames in it survive a crash.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The state directory on disk.
#[derive(Debug, Default, Clone, Copy)]
pub struct DiskIo;

impl StateIo for DiskIo {
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
    fn create(&self, path: &Path) -> io::Result<Box<dyn NewFile>> {
        let f = private_file()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Box::new(f))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
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

impl NewFile for File {
    fn write_part(&mut self, bytes: &[u8]) -> io::Result<()> {
        Write::write_all(self, bytes)
    }
    fn sync_all(&mut self) -> io::Result<()> {
        File::sync_all(self)
    }
}

/// Replaces `dir/name` with `parts` as one step a crash cannot tear: written to
/// `name.tmp` (removed again on an error, so a partial one cannot keep the disk full),
/// fsynced, renamed over `name`, and the directory fsynced.
///
/// The error says how far it got: [`Replaced::NotRenamed`] (`name` is as before) or
/// [`Replaced::DirNotSynced`] (`name` is the new file, but a crash may bring back the
/// old one).
///
/// The one recipe for every file of the state directory that replaces another whole: the
/// journal's snapshots and compacted log, and the volume's `standing-waits.json`.
pub(crate) fn replace_durably(
    io: &dyn StateIo,
    dir: &Path,
    name: &str,
    parts: &[&[u8]],
) -> Result<(), Replaced> {
    let tmp = dir.join(format!("{name}.tmp"));
    let written = io.create(&tmp).and_then(|mut f| {
        for p in parts {
            f.write_part(p)?;
        }
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| io.rename(&tmp, &dir.join(name))) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Replaced::NotRenamed(e));
    }
    io.sync_dir(dir).map_err(Replaced::DirNotSynced)
}

/// How a [`replace_durably`] failed.
#[derive(Debug)]
pub(crate) enum Replaced {
    NotRenamed(io::Error),
    DirNotSynced(io::Error),
}

impl From<Replaced> for io::Error {
    fn from(r: Replaced) -> io::Error {
        match r {
            Replaced::NotRenamed(e) | Replaced::DirNotSynced(e) => e,
        }
    }
}
