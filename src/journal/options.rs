//! The journal's tuning.

use std::sync::Arc;
use std::time::Duration;

use super::file::{DiskIo, StateIo};

/// Default of [`JournalOptions::buffer_limit`]. Here, not in `log.rs`: the log reads the
/// options, so the options take nothing from the log.
pub const BUFFER_LIMIT: usize = 64 << 20;

/// Tuning.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    /// Group-commit window of the background flusher.
    pub flush_interval: Duration,
    /// Write a snapshot (at the next `maintain`) after this many events.
    pub snapshot_every: u64,
    /// Compact (at the next `maintain`) once the log file holds this many bytes of events.
    pub compact_bytes: u64,
    /// Bytes of events kept in memory while the log cannot be written, past which the
    /// journal sheds (docs/design.md#state-log).
    pub buffer_limit: usize,
    /// How the state directory's files are opened, written and renamed (tests make it
    /// fail).
    pub io: Arc<dyn StateIo>,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            flush_interval: Duration::from_millis(5),
            snapshot_every: 100_000,
            compact_bytes: 8 << 20,
            buffer_limit: BUFFER_LIMIT,
            io: Arc::new(DiskIo),
        }
    }
}
