//! What opening the journal can fail with.

use std::io;
use std::path::PathBuf;

#[derive(Debug)]
pub enum JournalError {
    /// Another process holds the state directory.
    Locked {
        dir: PathBuf,
        pid: Option<u32>,
    },
    Io {
        what: String,
        err: io::Error,
    },
    /// The state directory is not private (another owner, or writable by others).
    NotPrivate {
        dir: PathBuf,
        why: String,
    },
    /// The coordinator (`--coordinator`) could not be reached at start.
    Coordinator(String),
    /// Another user could change what the state directory's path names (a directory of
    /// theirs on the way): `why` names the component.
    UnsafePath {
        dir: PathBuf,
        why: String,
    },
}

pub(super) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> JournalError {
    let what = what.into();
    move |err| JournalError::Io { what, err }
}

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalError::Locked {
                dir,
                pid: Some(pid),
            } => write!(
                f,
                "state directory {} is in use by another coherent-mount (pid {pid})",
                dir.display()
            ),
            JournalError::Locked { dir, pid: None } => write!(
                f,
                "state directory {} is in use by another coherent-mount",
                dir.display()
            ),
            JournalError::Io { what, err } => write!(f, "{what}: {err}"),
            JournalError::NotPrivate { dir, why } => write!(
                f,
                "state directory {} {why}: anyone who can write it can rewrite the volume's \
                 records; make it yours and private (`chown $(id -u) DIR && chmod 700 DIR`) \
                 or choose another with --state-dir",
                dir.display()
            ),
            JournalError::Coordinator(why) => f.write_str(why),
            JournalError::UnsafePath { dir, why } => write!(
                f,
                "refusing the state directory {}: {why}; choose one on a path only root or \
                 this daemon's user can change (--state-dir)",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for JournalError {}
