//! Recovery: from what the state directory holds, the engine it describes and where the
//! log goes on. Reads the log header and the snapshot, picks the snapshot if it fits the
//! log (else rebuilds from the whole log), replays the log past it, sets an unusable
//! snapshot aside and cuts a damaged tail off the log (kept as `events.log.damaged-OFFSET`).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use super::dir::{open_private, private_file};
use super::error::{io_err, JournalError};
use super::file::StateIo;
use super::format::{SnapHeader, LOG, SNAPSHOT};
use super::replay::{read_log_header, read_snapshot, replay_log, Damage};
use crate::coherence::{Config, DurableState, Engine, EventSink};

/// The engine recovered, and where the log goes on.
pub(super) struct Recovered {
    pub(super) engine: Engine,
    /// Damage found and repaired.
    pub(super) warnings: Vec<String>,
    pub(super) from_snapshot: bool,
    /// Events replayed from the log (after the snapshot).
    pub(super) replayed: u64,
    /// The last event's seq.
    pub(super) seq: u64,
    /// The log file's length once cut back to its last whole event.
    pub(super) len: u64,
    /// The logical offset of the log file's first event, and its header's length.
    pub(super) base: u64,
    pub(super) hdr: u64,
}

/// Where the log file stands before recovery.
struct LogPos {
    /// The file's length.
    len: u64,
    /// Logical offset and seq before its first event; its header's length.
    base: u64,
    base_seq: u64,
    hdr: u64,
}

impl LogPos {
    fn read(path: &Path) -> Result<LogPos, JournalError> {
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let (base, base_seq, hdr) = match read_log_header(path) {
            Ok(Some((h, n))) => (h.log_base, h.seq, n),
            Ok(None) => (0, 0, 0),
            Err(e) => return Err(io_err(format!("read the header of {}", path.display()))(e)),
        };
        Ok(LogPos {
            len,
            base,
            base_seq,
            hdr,
        })
    }
    /// The logical end of the log.
    fn end(&self) -> u64 {
        self.len.max(self.hdr) - self.hdr + self.base
    }
    /// A logical offset's place in the file.
    fn file_off(&self, logical: u64) -> u64 {
        logical - self.base + self.hdr
    }
}

/// Rebuilds the engine (its events going to `sink`) from `dir`, repairing what it finds
/// damaged.
pub(super) fn recover(
    dir: &Path,
    config: Config,
    sink: Arc<dyn EventSink>,
    io: &dyn StateIo,
) -> Result<Recovered, JournalError> {
    let log_path = dir.join(LOG);
    let pos = LogPos::read(&log_path)?;
    let mut warnings = Vec::new();
    let snap = usable_snapshot(dir, &pos, &mut warnings);

    let replay = |engine: &Engine, offset: u64, after: u64| {
        replay_log(&log_path, offset, after, |ev| engine.replay(ev))
            .map_err(io_err(format!("read {}", log_path.display())))
    };
    let from_log = |config: Config| {
        let engine = Engine::new(config, sink.clone());
        let r = replay(&engine, pos.hdr, pos.base_seq)?;
        Ok::<_, JournalError>((engine, false, r))
    };
    let (engine, from_snapshot, (replayed, seq, good, damage)) = match snap {
        Some((h, st)) => {
            let engine = Engine::from_state(config.clone(), st, sink.clone());
            let r = replay(&engine, pos.file_off(h.log_offset), h.seq)?;
            // A snapshot whose offset does not start the next event is unusable.
            // (A cut right after the snapshot's offset is an interrupted append.)
            if r.0 == 0 && r.3.as_ref().is_some_and(|d| !d.cut) && h.log_offset < pos.end() {
                warnings.push(format!(
                    "{SNAPSHOT} does not match the log at offset {}; rebuilding from the whole log",
                    h.log_offset
                ));
                from_log(config)?
            } else {
                (engine, true, r)
            }
        }
        None => from_log(config)?,
    };
    if !from_snapshot && pos.base > 0 {
        // Should not happen (a compacted log always has its snapshot): say what is lost.
        let w = format!(
            "{LOG} was compacted at seq {} and no usable {SNAPSHOT} covers it: \
             versions and records before that event are lost",
            pos.base_seq
        );
        tracing::error!("{w}");
        warnings.push(w);
    }
    if let Some(Damage { message, .. }) = damage {
        tracing::warn!("{message}");
        warnings.push(message);
    }
    if !from_snapshot && dir.join(SNAPSHOT).exists() {
        // Set the unusable snapshot aside so the next start does not trip on it again.
        io.rename(&dir.join(SNAPSHOT), &dir.join(format!("{SNAPSHOT}.bad")))
            .map_err(io_err("set the bad snapshot aside"))?;
    }
    if good < pos.len {
        cut_damaged_tail(dir, good, &mut warnings)?;
    }
    Ok(Recovered {
        engine,
        warnings,
        from_snapshot,
        replayed,
        seq,
        len: good,
        base: pos.base,
        hdr: pos.hdr,
    })
}

/// The snapshot, if it is whole and its offset lies within the log.
fn usable_snapshot(
    dir: &Path,
    pos: &LogPos,
    warnings: &mut Vec<String>,
) -> Option<(SnapHeader, DurableState)> {
    let (h, st) = match read_snapshot(dir) {
        Ok(s) => s?,
        Err(why) => {
            warnings.push(format!(
                "{}: unusable ({why}); rebuilding from the whole log",
                dir.join(SNAPSHOT).display()
            ));
            return None;
        }
    };
    let end = pos.end();
    if h.log_offset > end {
        warnings.push(format!(
            "{SNAPSHOT} is ahead of the log (offset {} > {end}); rebuilding from the whole log",
            h.log_offset
        ));
        return None;
    }
    if h.log_offset < pos.base {
        warnings.push(format!(
            "{SNAPSHOT} is older than the log (offset {} < {}); rebuilding from the log",
            h.log_offset, pos.base
        ));
        return None;
    }
    Some((h, st))
}

/// Keeps the log's bytes past file offset `good` for a human, then cuts them off so
/// appends follow the last good event.
fn cut_damaged_tail(dir: &Path, good: u64, warnings: &mut Vec<String>) -> Result<(), JournalError> {
    let log_path = dir.join(LOG);
    let mut f = open_private(&log_path).map_err(io_err("reopen log"))?;
    f.seek(SeekFrom::Start(good)).map_err(io_err("seek log"))?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).map_err(io_err("read log tail"))?;
    let aside = dir.join(format!("{LOG}.damaged-{good}"));
    // Kept if there is room: a full disk must not stop the mount.
    if let Err(e) = private_file()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&aside)
        .and_then(|mut f| f.write_all(&tail))
    {
        let w = format!("{}: cannot keep the damaged tail: {e}", aside.display());
        tracing::warn!("{w}");
        warnings.push(w);
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&log_path)
        .map_err(io_err("open log"))?;
    f.set_len(good).map_err(io_err("truncate log"))?;
    f.sync_all().map_err(io_err("fsync log"))
}
