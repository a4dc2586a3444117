//! The files of the state directory and their formats: the names, the header line of a
//! compacted log, the snapshot's header and checksum. No I/O here (reading them is
//! `replay.rs`'s), so every other layer, `dir.rs` too, can name the files.

pub const LOG: &str = "events.log";
pub const SNAPSHOT: &str = "snapshot.json";
pub const LOCK: &str = "lock";

/// The first line of a compacted log.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct LogHeader {
    pub(super) log_base: u64,
    pub(super) seq: u64,
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
