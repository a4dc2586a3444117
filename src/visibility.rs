//! What a reader may see of a path (docs/design.md#control-surface): a path, its record and its
//! note only if the reader could look the path up itself (search permission on every directory
//! above it, checked as the reader by [`crate::access::may_look_up`]); to anyone else, the answer
//! for a path that does not exist. Root sees everything.
//!
//! [`Sight`] answers "may this reader see this path?" with a memo per parent directory
//! (the answer depends only on the parent), meant to live for one answer (one read of a
//! control file), so a `chmod` shows at the next read. [`LogView`] is the reader's own
//! view of the state log: only the lines whose paths it may see, with its own offsets.

use std::collections::HashMap;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use crate::access::{may_look_up, Who};

/// One reader's view: who it is and what it was found to see.
#[derive(Debug, Clone)]
pub struct Sight {
    who: Who,
    /// Parent directory → may look names up in it.
    memo: HashMap<String, bool>,
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map(|(p, _)| p).unwrap_or("")
}

impl Sight {
    pub fn new(who: Who) -> Sight {
        Sight {
            who,
            memo: HashMap::new(),
        }
    }

    pub fn who(&self) -> &Who {
        &self.who
    }

    /// Sees everything (root): no check needed.
    pub fn sees_all(&self) -> bool {
        self.who.is_root()
    }

    /// May the reader see `path` (relative to the root)?
    pub fn sees(&mut self, root: BorrowedFd<'_>, path: &str) -> bool {
        if self.sees_all() {
            return true;
        }
        let dir = parent(path);
        if let Some(&v) = self.memo.get(dir) {
            return v;
        }
        let v = may_look_up(root, Path::new(path), &self.who);
        self.memo.insert(dir.to_string(), v);
        v
    }

    /// Remember that the reader may (or may not) see `path`, found out by a check made
    /// elsewhere ([`crate::access::look_up_and_write`]).
    pub fn learned(&mut self, path: &str, sees: bool) {
        self.memo.insert(parent(path).to_string(), sees);
    }

    /// Forget the memo (before a new answer: permissions may have changed).
    pub fn forget(&mut self) {
        self.memo.clear();
    }
}

/// The path fields of a state log line (`path`, and `from` for a rename).
#[derive(serde::Deserialize, Default)]
struct LinePaths {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    from: Option<String>,
}

/// May the reader see this log line? Lines naming no path (`session_seen`) are seen by
/// all; a line that does not parse is shown to root only.
pub fn sees_line(sight: &mut Sight, root: BorrowedFd<'_>, line: &[u8]) -> bool {
    if sight.sees_all() {
        return true;
    }
    let Ok(p) = serde_json::from_slice::<LinePaths>(line) else {
        return false;
    };
    [p.path, p.from]
        .iter()
        .flatten()
        .all(|path| sight.sees(root, path))
}

/// How much of the raw log one step reads.
const RAW_CHUNK: usize = 64 * 1024;

/// A reader's filtered view of the growing state log, read forward (`cat`, `tail -f`):
/// its offsets count only the lines it may see. The bytes before the last read offset are
/// dropped; reading before them again rebuilds the view from the start of the log.
#[derive(Debug)]
pub struct LogView {
    sight: Sight,
    /// Raw offset of the next log byte to fetch.
    raw_next: u64,
    /// Fetched bytes of a line not yet complete.
    partial: Vec<u8>,
    /// Filtered offset of `window[0]`.
    window_start: u64,
    window: Vec<u8>,
}

impl LogView {
    pub fn new(who: Who) -> LogView {
        LogView {
            sight: Sight::new(who),
            raw_next: 0,
            partial: Vec::new(),
            window_start: 0,
            window: Vec::new(),
        }
    }

    /// Up to `size` bytes of the view at `offset`. `raw(offset, max)` reads the log itself
    /// and says where the bytes start (what [`crate::journal::Journal::read_log_from`]
    /// does: past `offset` when the log was compacted below it); `root` is the backing
    /// directory.
    pub fn read(
        &mut self,
        root: BorrowedFd<'_>,
        offset: u64,
        size: usize,
        mut raw: impl FnMut(u64, usize) -> io::Result<(u64, Vec<u8>)>,
    ) -> io::Result<Vec<u8>> {
        if offset < self.window_start {
            *self = LogView::new(self.sight.who().clone());
        }
        self.sight.forget();
        let want_end = offset.saturating_add(size as u64);
        while self.window_start + (self.window.len() as u64) < want_end {
            let (start, chunk) = raw(self.raw_next, RAW_CHUNK)?;
            if chunk.is_empty() {
                break;
            }
            if start != self.raw_next {
                // Compacted away below `start`: a line begun there is gone.
                self.partial.clear();
            }
            self.raw_next = start + chunk.len() as u64;
            self.partial.extend_from_slice(&chunk);
            let Some(last_nl) = self.partial.iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            let whole: Vec<u8> = self.partial.drain(..=last_nl).collect();
            for line in whole.split_inclusive(|&b| b == b'\n') {
                if sees_line(&mut self.sight, root, line) {
                    self.window.extend_from_slice(line);
                }
            }
        }
        // Keep memory bounded: what lies before this read is not needed again.
        let end = self.window_start + self.window.len() as u64;
        let drop_to = offset.min(end);
        let n = (drop_to - self.window_start) as usize;
        self.window.drain(..n);
        self.window_start = drop_to;
        let from = (offset - self.window_start) as usize;
        let to = self.window.len().min(from + size);
        Ok(self.window.get(from..to).unwrap_or_default().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, OwnedFd};

    fn log_of(lines: &[&str]) -> Vec<u8> {
        lines
            .iter()
            .flat_map(|l| format!("{l}\n").into_bytes())
            .collect()
    }

    fn reader(log: &[u8]) -> impl FnMut(u64, usize) -> io::Result<(u64, Vec<u8>)> + '_ {
        // Small raw reads, so lines are cut across chunks.
        move |off, max| {
            let end = log.len().min(off as usize + max.min(7));
            Ok((off, log.get(off as usize..end).unwrap_or_default().to_vec()))
        }
    }

    fn root_dir() -> (tempfile::TempDir, OwnedFd) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("pub")).unwrap();
        let fd = std::fs::File::open(d.path()).unwrap().into();
        (d, fd)
    }

    #[test]
    fn root_reads_the_whole_log_in_any_pieces() {
        let (_d, root) = root_dir();
        let log = log_of(&[
            r#"{"seq":1,"event":"session_seen"}"#,
            r#"{"seq":2,"event":"commit","path":"pub/a"}"#,
        ]);
        let mut v = LogView::new(Who::root());
        let mut got = Vec::new();
        loop {
            let b = v
                .read(root.as_fd(), got.len() as u64, 5, reader(&log))
                .unwrap();
            if b.is_empty() {
                break;
            }
            got.extend(b);
        }
        assert_eq!(got, log);
        // Reading from 0 again rebuilds the view.
        let b = v.read(root.as_fd(), 0, 1 << 20, reader(&log)).unwrap();
        assert_eq!(b, log);
    }

    #[test]
    fn a_partial_last_line_waits_for_its_end() {
        let (_d, root) = root_dir();
        let mut log = log_of(&[r#"{"seq":1,"event":"session_seen"}"#]);
        log.extend_from_slice(br#"{"seq":2,"eve"#);
        let mut v = LogView::new(Who::root());
        let b = v.read(root.as_fd(), 0, 1 << 20, reader(&log)).unwrap();
        assert_eq!(b, log_of(&[r#"{"seq":1,"event":"session_seen"}"#]));
    }
}
