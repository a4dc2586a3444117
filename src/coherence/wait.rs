//! `wait PATH [UNTIL]` (docs/design.md#control-surface): which record a wait follows, where it
//! stands, and the engine's side of sleeping on the change counter (`changes.rs`).

use super::engine::*;
use super::types::*;
use crate::error::{Reason, Refusal};
use std::time::Instant;

impl Engine {
    /// The record counter now (pass it to [`Engine::wait_change`]).
    pub fn changes(&self) -> u64 {
        self.changes.now()
    }

    /// Sleeps until a record may have changed since `seen` (or `deadline`); returns the
    /// counter now.
    pub fn wait_change(&self, seen: u64, deadline: Instant) -> u64 {
        self.changes.wait(seen, deadline)
    }

    /// Wakes every [`Engine::wait_change`] and [`Engine::wait_poke`] (a new wait was
    /// registered, or the volume stops: look again).
    pub fn poke(&self) {
        self.changes.poke();
    }

    /// The poke counter now (pass it to [`Engine::wait_poke`]).
    pub fn pokes(&self) -> u64 {
        self.changes.pokes()
    }

    /// Sleeps until [`Engine::poke`] after `seen` (or `deadline`), whatever records do:
    /// what a waiter with no pending wait sleeps on, so commits wake nobody.
    pub fn wait_poke(&self, seen: u64, deadline: Instant) -> u64 {
        self.changes.wait_poke(seen, deadline)
    }

    /// The record `wait PATH` follows: the live one, else the newest. Refused
    /// `no_such_path` for a path the volume does not know, `handoff_not_live` when no
    /// record names it.
    pub fn wait_target(&self, path: &str) -> Result<u64, Refusal> {
        let sh = self.lock_one(path);
        let Some(e) = sh.get(path).filter(|e| e.version > 0) else {
            return Err(Refusal::new(
                Reason::NoSuchPath,
                format!(
                    "{path_q} does not exist in this volume (or the volume has not seen it yet)",
                    path_q = crate::names::display_name(path)
                ),
            )
            .at(path));
        };
        e.live()
            .or_else(|| e.records.iter().max_by_key(|r| r.id))
            .map(|r| r.id)
            .ok_or_else(|| {
                Refusal::new(
                    Reason::HandoffNotLive,
                    format!(
                        "{path_q} has no handoff record to wait for",
                        path_q = crate::names::display_name(path)
                    ),
                )
                .at(path)
            })
    }

    /// Record `id` of `path` as it stands, if it is still kept (a standing wait's report
    /// names who ended it, and when).
    pub fn wait_record(&self, path: &str, id: u64) -> Option<RecordJson> {
        let sh = self.lock_one(path);
        let e = sh.get(path)?;
        e.records
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.to_json(e.version))
    }

    /// Where record `id` of `path` stands for `until`. Refused `handoff_ended` (with the
    /// status) when the record ended in a status that can never reach it, and
    /// `handoff_not_live` when the record is gone (evicted, or moved away).
    pub fn wait_state(&self, path: &str, id: u64, until: Until) -> Result<WaitState, Refusal> {
        let sh = self.lock_one(path);
        let found = sh
            .get(path)
            .and_then(|e| e.records.iter().find(|r| r.id == id).map(|r| (e, r)));
        let Some((e, r)) = found else {
            return Err(Refusal::new(
                Reason::HandoffNotLive,
                format!(
                    "the handoff record of {path_q} is gone (evicted or moved)",
                    path_q = crate::names::display_name(path)
                ),
            )
            .at(path));
        };
        let json = r.to_json(e.version);
        match until.reached(r.status, json.live) {
            None => Ok(WaitState::Pending(json)),
            Some(true) => Ok(WaitState::Reached(json)),
            Some(false) => Err(Refusal::new(
                Reason::HandoffEnded,
                format!(
                    "the handoff of {path_q} ended as {} and can no longer be {}",
                    serde_json::to_value(r.status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    until.as_str(),
                    path_q = crate::names::display_name(path)
                ),
            )
            .at(path)
            .with_status(r.status)),
        }
    }
}
