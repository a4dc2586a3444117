//! The private state directory: made 0700 with files 0600, refused when others could
//! write it, cleared of temporaries, and locked by the one daemon using it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::error::{io_err, JournalError};
use super::format::{LOCK, LOG, SNAPSHOT};

/// Options for a file of the state directory: created 0600 whatever the umask (the daemon
/// runs with umask 0), never opened through a symlink. Every file written there goes
/// through this.
pub fn private_file() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

/// A file of the state directory opened for reading, never through a symlink.
pub fn open_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Makes `dir` (creating it 0700) the daemon's private state directory: refuses one that
/// another user owns or group or others can write (they could rewrite the records),
/// tightens it to 0700 and its files to 0600, and removes the temporaries an interrupted
/// snapshot or compaction left (they are never needed and may fill the disk).
pub(super) fn prepare_dir(dir: &Path) -> Result<(), JournalError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(format!("create {}", dir.display())))?;
    // the directory itself, never what a symlink there leads to
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir);
    let not_private = |why: String| JournalError::NotPrivate {
        dir: dir.to_path_buf(),
        why,
    };
    let handle = match handle {
        Ok(h) => h,
        // O_DIRECTORY with O_NOFOLLOW on a symlink: ENOTDIR or ELOOP
        Err(e)
            if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
                && std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) =>
        {
            return Err(JournalError::UnsafePath {
                dir: dir.to_path_buf(),
                why: "it is a symlink, and the daemon follows none to its own files".into(),
            })
        }
        Err(e) => return Err(io_err(format!("open {}", dir.display()))(e)),
    };
    let md = handle
        .metadata()
        .map_err(io_err(format!("stat {}", dir.display())))?;
    let me = nix::unistd::geteuid().as_raw();
    if md.uid() != me {
        return Err(not_private(format!(
            "is owned by uid {}, not {me}",
            md.uid()
        )));
    }
    if md.mode() & 0o022 != 0 {
        return Err(not_private(format!(
            "can be written by {} (mode {:o})",
            if md.mode() & 0o002 != 0 {
                "anyone"
            } else {
                "its group"
            },
            md.mode() & 0o7777
        )));
    }
    if md.mode() & 0o7777 != 0o700 {
        handle
            .set_permissions(std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(format!("chmod 700 {}", dir.display())))?;
    }
    for tmp in [format!("{SNAPSHOT}.tmp"), format!("{LOG}.tmp")] {
        match std::fs::remove_file(dir.join(&tmp)) {
            Ok(()) => tracing::info!("removed {tmp} left by an interrupted write"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("remove {tmp}"))(e)),
        }
    }
    let entries = std::fs::read_dir(dir).map_err(io_err(format!("list {}", dir.display())))?;
    for e in entries.flatten() {
        let Ok(md) = e.metadata() else { continue };
        if md.is_file() && md.mode() & 0o077 != 0 {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o600))
                .map_err(io_err(format!("chmod 600 {}", e.path().display())))?;
        }
    }
    Ok(())
}

pub(super) fn lock_dir(dir: &Path) -> Result<File, JournalError> {
    let path = dir.join(LOCK);
    let mut f = private_file()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err(format!("open {}", path.display())))?;
    // SAFETY: flock on a valid open descriptor.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        return Err(JournalError::Locked {
            dir: dir.to_path_buf(),
            pid: s.trim().parse().ok(),
        });
    }
    // The pid is for a human (and the `Locked` message): a full disk must not stop a mount.
    if let Err(e) = f
        .set_len(0)
        .and_then(|()| f.write_all(format!("{}\n", std::process::id()).as_bytes()))
    {
        tracing::warn!("{}: cannot record the pid: {e}", path.display());
    }
    Ok(f)
}
