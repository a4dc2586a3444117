//! Recovery: the snapshot and the log's header read and checked, and the log replayed from
//! an offset (parsed in parallel, applied in order), stopping at the first damaged line.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

use super::format::{fnv64, LogHeader, SnapHeader, SNAPSHOT};
use crate::coherence::{DurableState, Event};

/// Reads and checks `snapshot.json`. Err: why it cannot be used.
pub(super) fn read_snapshot(dir: &Path) -> Result<Option<(SnapHeader, DurableState)>, String> {
    let data = match super::dir::open_private(&dir.join(SNAPSHOT)).and_then(|mut f| {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut b).map(|_| b)
    }) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let nl = data
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no header line")?;
    let h: SnapHeader =
        serde_json::from_slice(&data[..nl]).map_err(|e| format!("bad header: {e}"))?;
    let body = &data[nl + 1..];
    if h.format != 1 || body.len() as u64 != h.len || fnv64(body) != h.fnv {
        return Err("checksum or length mismatch".into());
    }
    let st: DurableState = serde_json::from_slice(body).map_err(|e| format!("bad body: {e}"))?;
    if st.seq != h.seq {
        return Err("seq mismatch".into());
    }
    Ok(Some((h, st)))
}

/// The header of the log at `path`, with its length in bytes (None: a log from offset 0).
pub(super) fn read_log_header(path: &Path) -> io::Result<Option<(LogHeader, u64)>> {
    let mut f = match super::dir::open_private(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut head = vec![0u8; 256];
    let mut n = 0;
    while n < head.len() {
        let k = f.read(&mut head[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    head.truncate(n);
    if !head.starts_with(b"{\"log_base\"") {
        return Ok(None);
    }
    let Some(nl) = head.iter().position(|&b| b == b'\n') else {
        return Err(io::Error::other("log header line cut short"));
    };
    let h: LogHeader = serde_json::from_slice(&head[..nl]).map_err(io::Error::other)?;
    Ok(Some((h, nl as u64 + 1)))
}

/// Damage found by [`replay_log`].
#[derive(Debug, Clone)]
pub struct Damage {
    /// The log ends in a partial line (an interrupted append), not in a bad one.
    pub cut: bool,
    pub message: String,
}

/// Replays `events.log` from `offset` (expecting seq `after + 1` first) into `apply`.
/// Stops at the first incomplete or invalid line. Returns (events applied, last seq,
/// offset of the end of the last good line, warning if damage was found).
///
/// Parsing dominates recovery, so it is pipelined: this thread reads blocks of whole
/// lines and hands them to parser threads, and applies the parsed blocks in log order
/// while the next ones are being parsed.
pub fn replay_log(
    path: &Path,
    offset: u64,
    after: u64,
    apply: impl FnMut(&Event),
) -> io::Result<(u64, u64, u64, Option<Damage>)> {
    let mut f = match super::dir::open_private(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, after, 0, None)),
        Err(e) => return Err(e),
    };
    f.seek(SeekFrom::Start(offset))?;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    std::thread::scope(|sc| {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..threads {
            let queue = queue.clone();
            sc.spawn(move || loop {
                // The guard ends with the statement: one parser waits, the others queue.
                let job = queue.lock().recv();
                let Ok((bytes, back)) = job else { break };
                // The reader may have stopped (damage found): nobody to tell.
                let _ = back.send(parse_block(&bytes));
            });
        }
        // `jobs` is dropped when `feed` returns, however it returns: the parsers end.
        feed(path, &mut f, offset, after, threads, jobs, apply)
    })
}

/// A block of whole lines to parse, and where to send the result.
type Job = (Vec<u8>, mpsc::SyncSender<Parsed>);
/// Each line's length (with its newline) and its event.
type Parsed = Vec<(usize, Result<Event, String>)>;

/// The reading and applying side of [`replay_log`].
fn feed(
    path: &Path,
    f: &mut File,
    offset: u64,
    after: u64,
    threads: usize,
    jobs: mpsc::Sender<Job>,
    mut apply: impl FnMut(&Event),
) -> io::Result<(u64, u64, u64, Option<Damage>)> {
    // Blocks of about 1 MiB (no bigger than what is left: small logs, tests); a few in
    // flight keep every parser busy.
    let left = f.metadata()?.len().saturating_sub(offset) as usize;
    let block_len = left.clamp(4096, 1 << 20);
    let in_flight = threads * 2;
    let (mut n, mut seq, mut good) = (0u64, after, offset);
    let warn = |what: String, seq: u64, cut: bool| {
        Some(Damage {
            cut,
            message: format!(
                "{}: {what}; recovered the {seq} events before it",
                path.display()
            ),
        })
    };
    let mut pending: VecDeque<mpsc::Receiver<Parsed>> = VecDeque::new();
    let mut carry: Vec<u8> = Vec::new();
    let mut eof = false;
    loop {
        while !eof && pending.len() < in_flight {
            let mut data = std::mem::take(&mut carry);
            // Read until the block holds a whole line (a line may be longer than a block).
            let whole = loop {
                let target = data.len() + block_len;
                while !eof && data.len() < target {
                    let old = data.len();
                    data.resize(target, 0);
                    let got = f.read(&mut data[old..])?;
                    data.truncate(old + got);
                    eof = got == 0;
                }
                let whole = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                if whole > 0 || eof {
                    break whole;
                }
            };
            carry = data.split_off(whole);
            if whole > 0 {
                let (back, result) = mpsc::sync_channel(1);
                if jobs.send((data, back)).is_err() {
                    return Err(io::Error::other("log parser threads ended"));
                }
                pending.push_back(result);
            }
        }
        let Some(result) = pending.pop_front() else {
            // Everything read and applied; what is left is a line cut short.
            let w = (!carry.is_empty()).then(|| {
                warn(
                    format!(
                        "cut in the middle of an event at byte {good} ({} bytes dropped)",
                        carry.len()
                    ),
                    seq,
                    true,
                )
            });
            return Ok((n, seq, good, w.flatten()));
        };
        let parsed = result
            .recv()
            .map_err(|_| io::Error::other("a log parser thread failed"))?;
        for (len, parsed) in parsed {
            match parsed {
                Ok(ev) if ev.seq == seq + 1 => {
                    apply(&ev);
                    seq = ev.seq;
                    n += 1;
                    good += len as u64;
                }
                Ok(ev) => {
                    let w = format!(
                        "event at byte {good} has seq {} where {} was expected",
                        ev.seq,
                        seq + 1
                    );
                    return Ok((n, seq, good, warn(w, seq, false)));
                }
                Err(e) => {
                    return Ok((
                        n,
                        seq,
                        good,
                        warn(format!("unreadable event at byte {good} ({e})"), seq, false),
                    ))
                }
            }
        }
    }
}

/// Parses the newline-terminated lines of `bytes`, stopping at the first bad one (nothing
/// after it is used anyway).
fn parse_block(bytes: &[u8]) -> Parsed {
    let mut out = Vec::with_capacity(bytes.len() / 200 + 1);
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        let r = serde_json::from_slice::<Event>(&line[..line.len() - 1]).map_err(|e| e.to_string());
        let bad = r.is_err();
        out.push((line.len(), r));
        if bad {
            break;
        }
    }
    out
}
