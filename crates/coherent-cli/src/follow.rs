//! Following `.coherent/events` as it grows: what `coherent watch` and `coherent top` share.
//!
//! The volume serves the log at growing offsets and moves a reader that fell below a
//! compaction up to the log's base (docs/state-log.md), so following is reading on from
//! where the last read stopped; at the end of the log the follower sleeps a little and
//! reads again, and once a second it checks that the volume is still mounted (a lazy
//! unmount leaves the open file answering end-of-file forever).

use crate::{gone, mounts, Fail};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often, at most, the follower checks that the volume is still mounted.
const MOUNT_CHECK: Duration = Duration::from_secs(1);

/// One reader of a volume's `.coherent/events`.
pub(crate) struct Follower {
    root: PathBuf,
    file: File,
    /// The start of a line not complete yet.
    pending: Vec<u8>,
    buf: Vec<u8>,
    last_check: Instant,
}

/// What one read gave.
pub(crate) enum Step {
    /// The lines this read completed (possibly none: a line still being read).
    Lines(Vec<Vec<u8>>),
    /// The end of the log as it is now.
    AtEnd,
}

impl Follower {
    /// Opens the log of the volume mounted at `root`, at its start (its oldest event kept).
    pub(crate) fn open(root: &Path) -> Result<Follower, Fail> {
        let path = root.join(".coherent/events");
        let file = File::open(&path).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTCONN) | Some(libc::ENODEV) => gone(root, &e),
            _ => Fail::no_volume(format!("cannot open {}: {e}", path.display())),
        })?;
        Ok(Follower {
            root: root.to_path_buf(),
            file,
            pending: Vec::new(),
            buf: vec![0u8; 64 * 1024],
            last_check: Instant::now(),
        })
    }

    /// One `read(2)`: the complete lines it finished (each with its newline), or the end
    /// of the log. `Err` is the message for a volume that went away.
    pub(crate) fn step(&mut self) -> Result<Step, String> {
        let n = match self.file.read(&mut self.buf) {
            Ok(n) => n,
            // a signal: the caller may want to stop before the next read
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(Step::Lines(vec![])),
            Err(e) => {
                return Err(format!(
                    "coherent: the volume at {} went away ({e})",
                    self.root.display()
                ))
            }
        };
        if n == 0 {
            return Ok(Step::AtEnd);
        }
        self.pending.extend_from_slice(&self.buf[..n]);
        let mut lines = Vec::new();
        let mut start = 0;
        while let Some(nl) = self.pending[start..].iter().position(|&c| c == b'\n') {
            lines.push(self.pending[start..start + nl + 1].to_vec());
            start += nl + 1;
        }
        self.pending.drain(..start);
        Ok(Step::Lines(lines))
    }

    /// At the end of the log: sleep `interval` before the next read; `Err` with the
    /// message once the volume is no longer mounted.
    pub(crate) fn idle(&mut self, interval: Duration) -> Result<(), String> {
        if self.last_check.elapsed() >= MOUNT_CHECK {
            self.last_check = Instant::now();
            if !still_mounted(&self.root) {
                return Err(format!(
                    "coherent: the volume at {} was unmounted",
                    self.root.display()
                ));
            }
        }
        std::thread::sleep(interval);
        Ok(())
    }
}

fn still_mounted(root: &Path) -> bool {
    match mounts() {
        Some(t) => t
            .iter()
            .rev()
            .find(|m| m.mount_point == root)
            .is_some_and(|m| m.is_fuse()),
        None => root.join(".coherent/ctl").exists(),
    }
}
