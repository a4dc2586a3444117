//! The files of the state directory and their formats: the names, the header line of a
//! compacted log, the snapshot's header and checksum.

use std::io::{self, Read};
use std::path::Path;

pub const LOG: &str = "events.log";
pub const SNAPSHOT: &str = "snapshot.json";
pub const LOCK: &str = "lock";

/// The first line of a compacted log.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct LogHeader {
    pub(super) log_base: u64,
    pub(super) seq: u64,
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

pub(super) fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct SnapHeader {
    pub(super) format: u32,
    pub(super) seq: u64,
    pub(super) log_offset: u64,
    pub(super) len: u64,
    pub(super) fnv: u64,
}
