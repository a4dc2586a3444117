//! What the mount reports: opens, acquires, commits, renames, changes behind the
//! volume's back, sessions gone, eviction; and the fence decision of every write route
//! (docs/design.md#write-routes).

use super::engine::*;
use super::route::{Against, At, Found, Reach, Write};
use super::time::Timestamp;
use super::types::*;
use crate::error::{Reason, Refusal};
use crate::identity::{Session, SessionInfo};
use std::sync::atomic::Ordering;

mod observe;

pub use observe::Content;

impl Engine {
    // ----- file operations (the mount) ----------------------------------------------

    /// A live record on `e` touched by `by`, who is neither its giver nor its successor:
    /// `overtaken` with `counterparty` (unless it already says so). While a record is live
    /// its status follows the latest event (docs/design.md#handoff): a `completed` record is
    /// overtaken too.
    pub(super) fn overtake_live(&self, e: &mut Entry, by: &str, now: Timestamp) {
        let Some(r) = e.live() else {
            return;
        };
        if r.giver.name == by || r.successor.name == by {
            return;
        }
        if r.status == Status::Overtaken && r.counterparty.as_deref() == Some(by) {
            return;
        }
        let mut ev = Event::new(EventKind::Overtaken, now, Some(&r.path), None);
        ev.session = Some(by.to_string());
        if let Some(s) = self.sessions.read().get(by) {
            ev.agent = Some(s.agent_id);
        }
        ev.record = Some(r.id);
        ev.giver = Some(r.giver.name.clone());
        ev.successor = Some(r.successor.name.clone());
        ev.counterparty = Some(by.to_string());
        ev.version = Some(e.version);
        self.emit(e, ev);
    }

    /// A live record on `e` acquired or committed by `s` (the commit to `version`, else
    /// the acquire at the current version): the successor's makes it `completed`
    /// (`counterparty` cleared; nothing when it already is), anyone else's but the giver's
    /// `overtaken` (docs/design.md#handoff).
    fn touch_live(&self, e: &mut Entry, s: &Session, version: Option<u64>, now: Timestamp) {
        let Some(r) = e.live() else { return };
        if r.successor.name != s.name {
            self.overtake_live(e, &s.name, now);
            return;
        }
        if r.status == Status::Completed {
            return;
        }
        let mut ev = Event::new(EventKind::Completed, now, Some(&r.path), Some(s));
        ev.record = Some(r.id);
        ev.giver = Some(r.giver.name.clone());
        ev.version = Some(version.unwrap_or(e.version));
        self.emit(e, ev);
    }

    /// The successor's first open of a path handed to it: `handoff_seen`.
    fn mark_seen(&self, e: &mut Entry, s: &Session, now: Timestamp) {
        let Some(r) = e.live() else { return };
        if r.seen || r.successor.name != s.name {
            return;
        }
        let mut ev = Event::new(EventKind::HandoffSeen, now, Some(&r.path), Some(s));
        ev.record = Some(r.id);
        ev.giver = Some(r.giver.name.clone());
        ev.version = Some(e.version);
        self.emit(e, ev);
    }

    /// Refuse and tell, in the engine: the one place a live record refuses a write route.
    /// `against` says whom it refuses: its giver (`fenced`, the deny text kept for the
    /// giver's `why`), or any caller whose session could not be resolved (`unresolved`: no
    /// session to tell). Logs `denied` with the record and returns the refusal.
    pub(super) fn refuse_live(
        &self,
        e: &mut Entry,
        path: &str,
        s: &Session,
        against: Against,
        route: Route,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let Some(r) = e.live() else { return Ok(()) };
        let (reason, text, successor) = match against {
            Against::Giver if r.giver.name != s.name => return Ok(()),
            Against::Giver => (
                Reason::Fenced,
                deny_text(path, &r.successor, r.version_at_transfer),
                Some(r.successor.name.clone()),
            ),
            Against::Unresolved => (
                Reason::Unresolved,
                format!(
                    "write denied: {path_q} is handed on (v{}) and the volume could not tell \
                     which session this process belongs to, so it refuses the write rather \
                     than guess",
                    e.version,
                    path_q = crate::names::display_name(path)
                ),
                None,
            ),
        };
        let (status, record) = (r.status, r.id);
        let mut ev = Event::denied(reason, route, now, path, s);
        ev.record = Some(record);
        ev.successor = successor;
        ev.version = Some(e.version);
        self.emit(e, ev);
        let refusal = Refusal::new(reason, text).at(path).with_status(status);
        Err(match against {
            Against::Giver => self.refuse(s, refusal),
            Against::Unresolved => refusal,
        })
    }

    /// Is `s` fenced on `path`? (No event; for queries and tests. The mount uses
    /// `acquire`/`check_write`, which also log the denial.)
    pub fn is_fenced(&self, s: &SessionInfo, path: &str) -> bool {
        let sh = self.lock_one(path);
        sh.get(path)
            .and_then(Entry::live)
            .is_some_and(|r| r.giver.name == s.name)
    }

    /// An open for read by `s`: sets its view and an `S` hold (memory only); the
    /// successor's first open of a path handed to it logs `handoff_seen`. Returns the
    /// version (None: the path is not tracked or not committed yet).
    pub fn open_read(&self, s: &Session, path: &str, now: Timestamp) -> Option<u64> {
        self.session_seen(s, now);
        let mut sh = self.lock_one(path);
        let e = sh.get_mut(path)?;
        if e.version == 0 || !e.exists {
            return None;
        }
        let v = e.version;
        let h = e.holder_mut(s);
        h.hold = if h.writers > 0 {
            Hold::E
        } else if h.hold == Hold::M && h.view == Some(v) {
            Hold::M
        } else {
            Hold::S
        };
        h.view = Some(v);
        self.mark_seen(e, s, now);
        Some(v)
    }

    /// An open (or create) for write by `s`: the fence and the stale guard, then an `E`
    /// hold (`acquire`). A bystander's acquire turns a live record `overtaken`. On
    /// refusal nothing is held; answer `EACCES`. Pair with `close_write`.
    /// Shorthand for [`Engine::decide`] of [`Write::Open`] (an open that can overwrite)
    /// on a path the caller did not stat.
    pub fn acquire(&self, s: &Session, path: &str, now: Timestamp) -> Result<Acquired, Refusal> {
        let p = self.decide(s, Write::Open(At::unseen(path)), now)?;
        Ok(p.acquired.expect("an open of a file acquires"))
    }

    /// [`Engine::acquire`] of an open that only appends ([`Write::Append`]).
    pub fn acquire_append(
        &self,
        s: &Session,
        path: &str,
        now: Timestamp,
    ) -> Result<Acquired, Refusal> {
        let p = self.decide(s, Write::Append(At::unseen(path)), now)?;
        Ok(p.acquired.expect("an open of a file acquires"))
    }

    /// The open-for-write rule with the entry held: the fence (and the late giver), the
    /// stale guard (`reach`: what the open can do to the bytes there), the acquire (a
    /// bystander's acquire overtakes a live record).
    pub(super) fn acquire_in(
        &self,
        e: &mut Entry,
        s: &Session,
        path: &str,
        reach: Reach,
        now: Timestamp,
    ) -> Result<Acquired, Refusal> {
        self.refuse_live(e, path, s, Against::Giver, Route::OpenWrite, now)?;
        self.refuse_late(e, path, s, Route::OpenWrite, now)?;
        let version = e.version;
        let view = e.holder(&s.name).and_then(|h| h.view);
        let stale = self.stale_guard(e, path, s, Route::OpenWrite, reach, now)?;
        self.touch_live(e, s, None, now);
        self.mark_seen(e, s, now);
        let mut ev = Event::new(EventKind::Acquire, now, Some(path), Some(s));
        ev.version = Some(version);
        self.emit(e, ev);
        Ok(Acquired {
            version,
            stale,
            view,
        })
    }

    /// The stale guard of one write of `s` to `path`
    /// (docs/versions-and-holds.md#the-stale-write-guard): is its view older than the
    /// current version? Under `--stale` and `reach`, refused
    /// (`denied`, reason `stale_view`), or allowed and counted (`stale_write`, returns
    /// true), or allowed unseen. A session with no view (a blind write), or a path with no
    /// file, is never stale.
    pub(super) fn stale_guard(
        &self,
        e: &mut Entry,
        path: &str,
        s: &Session,
        route: Route,
        reach: Reach,
        now: Timestamp,
    ) -> Result<bool, Refusal> {
        let version = e.version;
        let view = e.holder(&s.name).and_then(|h| h.view);
        let Some(seen) = view.filter(|v| *v < version && e.exists) else {
            return Ok(false);
        };
        let refuse = match self.config.stale {
            StaleMode::Off => return Ok(false),
            StaleMode::Warn => false,
            // For agent sessions: an unattributed process (a person at a terminal, a tool of
            // another uid, a POSIX test suite) writes as on any filesystem, its stale
            // overwrite counted (`stale_write`), not refused. `strict` refuses everyone.
            StaleMode::Guard => reach == Reach::Overwrite && s.is_attributed(),
            StaleMode::Strict => true,
        };
        let by = e.last_by.as_deref().map(str::to_string);
        if !refuse {
            let mut ev = Event::new(EventKind::StaleWrite, now, Some(path), Some(s));
            ev.view = view;
            ev.version = Some(version);
            ev.counterparty = by;
            self.emit(e, ev);
            return Ok(true);
        }
        let mut ev = Event::denied(Reason::StaleView, route, now, path, s);
        ev.view = view;
        ev.version = Some(version);
        ev.counterparty = by.clone();
        self.emit(e, ev);
        let who = by.map_or_else(|| "another session".to_string(), |b| self.who(&b));
        let text = format!(
            "write denied: {path_q} is at v{version} ({who} changed it since) but this session \
             last saw v{seen}, so this write would erase that change. Read {path_q} again, \
             then make your change on what it holds now.",
            path_q = crate::names::display_name(path)
        );
        Err(self.refuse(s, Refusal::new(Reason::StaleView, text).at(path)))
    }

    /// A session as a refusal names it: `agent 6e271ee6 (bob)`, `a process outside any
    /// session` for `external`.
    fn who(&self, name: &str) -> String {
        if name == EXTERNAL {
            return "a process outside the volume".to_string();
        }
        match self.sessions.read().get(name) {
            Some(x) => format!("agent {} ({name})", x.short_id()),
            None => format!("session {name}"),
        }
    }

    /// The record that makes `s` a late giver on `e`: `s` handed the path on, the
    /// successor's version now exists (the record `completed` and ended: its version
    /// moved), and `s` has not seen it (its view is at most the handed version). A session
    /// with no view here (views are memory only: after a restart, or on another host) writes
    /// blind, which is never stale (docs/design.md#holds).
    fn late_record<'e>(&self, e: &'e Entry, s: &Session) -> Option<&'e Record> {
        if self.config.stale == StaleMode::Off || !s.is_attributed() {
            return None;
        }
        let view = e.holder(&s.name).and_then(|h| h.view)?;
        e.records.iter().find(|r| {
            r.giver.name == s.name
                && r.status == Status::Completed
                && !r.is_live(e.version)
                && r.version_at_transfer < e.version
                && view <= r.version_at_transfer
        })
    }

    /// The late giver (docs/versions-and-holds.md#the-late-giver): a former giver writing from a
    /// view older than its successor's version is refused on every write route under every
    /// `--stale` but `off` (`denied`, reason `stale_view`, the record and the successor).
    pub(super) fn refuse_late(
        &self,
        e: &mut Entry,
        path: &str,
        s: &Session,
        route: Route,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let Some(r) = self.late_record(e, s) else {
            return Ok(());
        };
        let (id, succ) = (r.id, r.successor.clone());
        let vat = r.version_at_transfer;
        let version = e.version;
        let by = e.last_by.as_deref().map(str::to_string);
        let view = e.holder(&s.name).and_then(|h| h.view);
        let mut ev = Event::denied(Reason::StaleView, route, now, path, s);
        ev.record = Some(id);
        ev.successor = Some(succ.name.clone());
        ev.view = Some(view.unwrap_or(vat));
        ev.version = Some(version);
        ev.counterparty = by;
        self.emit(e, ev);
        let text = format!(
            "write denied: you handed {path_q} to agent {id} ({name}) at v{vat}, and {name} has \
             changed it since (it is at v{version} now); this session last saw v{seen}, so this \
             write would erase {name}'s work. Read {path_q} again (cat {path_w}), then make your \
             change on what it holds now. Retrying without reading will be denied the same way.",
            id = succ.short_id(),
            name = succ.name,
            seen = view.unwrap_or(vat),
            path_q = crate::names::display_name(path),
            path_w = crate::names::shell_word(path)
        );
        Err(self.refuse(s, Refusal::new(Reason::StaleView, text).at(path)))
    }

    /// The fence alone on one path for `route` (no acquire, no other rule; for the core
    /// tests). The mount decides every route with [`Engine::decide`].
    pub fn check_write(
        &self,
        s: &Session,
        path: &str,
        route: Route,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        self.session_seen(s, now);
        self.fence_at(&mut self.lock_one(path), path, s, route, now)
    }

    /// Shorthand for [`Engine::decide`] of [`Write::Rename`] (`is_dir`: the source is a
    /// directory) on paths the caller did not stat.
    pub fn check_rename(
        &self,
        s: &Session,
        from: &str,
        to: &str,
        is_dir: bool,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let found = if is_dir { Found::Dir } else { Found::Unseen };
        let w = Write::Rename {
            from: At::new(from, found),
            to: At::unseen(to),
            exchange: false,
        };
        self.decide(s, w, now).map(drop)
    }

    // Internal: the arguments are exactly the fields of the commit event.
    #[allow(clippy::too_many_arguments)]
    fn commit_locked(
        &self,
        e: &mut Entry,
        s: &Session,
        path: &str,
        op: CommitOp,
        stamp: Option<Stamp>,
        from: Option<&str>,
        now: Timestamp,
    ) -> u64 {
        let version = e.version + 1;
        self.superseded_while_open(e, s, path, op, now);
        self.touch_live(e, s, Some(version), now);
        let mut ev = Event::new(EventKind::Commit, now, Some(path), Some(s));
        ev.version = Some(version);
        ev.op = Some(op);
        ev.removed = matches!(op, CommitOp::Unlink | CommitOp::RenameAway);
        // A commit decided before a newer change of the path was counted, and applied after
        // it (a RELEASE on its own thread, late), carries the older stamp: the newer one
        // stays, or the next open would take the volume's own change for one behind its back.
        let stamp = match (stamp, e.stamp) {
            (Some(st), Some(cur)) if cur.ctime_ns > st.ctime_ns => Some(cur),
            (st, _) => st,
        };
        ev.stamp = if ev.removed { None } else { stamp };
        ev.from = from.map(str::to_string);
        self.emit(e, ev);
        version
    }

    /// A commit through write handles of `s` opened at a version that another session (or
    /// a change behind the volume's back) superseded while they were open: a race inside
    /// one handle's life, which nothing can refuse any more (the bytes are in the file).
    /// Counted under every `--stale` but `off`: `stale_write` with `op` `write`, `view` the
    /// version the handles built on, `version` the one this commit writes over and
    /// `counterparty` who made it.
    fn superseded_while_open(
        &self,
        e: &mut Entry,
        s: &Session,
        path: &str,
        op: CommitOp,
        now: Timestamp,
    ) {
        if op != CommitOp::Write || self.config.stale == StaleMode::Off {
            return;
        }
        let Some(base) = e
            .holder(&s.name)
            .filter(|h| h.writers > 0)
            .and_then(|h| h.base)
        else {
            return;
        };
        if base >= e.version || e.last_by.as_deref() == Some(s.name.as_str()) {
            return;
        }
        let mut ev = Event::new(EventKind::StaleWrite, now, Some(path), Some(s));
        ev.op = Some(CommitOp::Write);
        ev.view = Some(base);
        ev.version = Some(e.version);
        ev.counterparty = e.last_by.as_deref().map(str::to_string);
        self.emit(e, ev);
    }

    /// A committed change of `path` by `s` (docs/design.md#versions): a write handle
    /// flushed/released with a changed file (`CommitOp::Write`; a create and its writes are
    /// one commit → v1), `Truncate`, `Unlink` (the path becomes a tombstone),
    /// `Link`/`Symlink`/`Mknod` creating it. `stamp` is the file after the change (None after
    /// unlink). The successor's commit completes a live record; anyone else's overtakes it.
    /// Returns the new version. Renames go through `rename`.
    pub fn commit(
        &self,
        s: &Session,
        path: &str,
        op: CommitOp,
        stamp: Option<Stamp>,
        now: Timestamp,
    ) -> u64 {
        self.session_seen(s, now);
        let mut sh = self.lock_one(path);
        let e = entry_mut(&mut sh, path);
        self.commit_locked(e, s, path, op, stamp, None, now)
    }

    /// A write handle of `s` on `path` closed. `committed`: the handle committed (the
    /// mount calls `commit` first when the file changed). The last write handle closing
    /// without a commit logs `release`.
    pub fn close_write(&self, s: &Session, path: &str, committed: bool, now: Timestamp) {
        let mut sh = self.lock_one(path);
        let Some(e) = sh.get_mut(path) else { return };
        let v = e.version;
        let Some(h) = e.holders.iter_mut().find(|h| h.session.name == s.name) else {
            return;
        };
        if h.writers == 0 {
            return;
        }
        if h.writers > 1 || committed {
            h.writers -= 1;
            if h.writers == 0 {
                h.base = None;
                // M if its commit is still the current version, else someone committed since.
                h.hold = if h.view == Some(v) { Hold::M } else { Hold::I };
            }
            return;
        }
        let mut ev = Event::new(EventKind::Release, now, Some(path), Some(s));
        ev.version = Some(e.version);
        self.emit(e, ev);
    }

    /// `rename(from, to)` by `s` after it succeeded in the backing directory. A file: the
    /// source records a removal, the target a commit by `s` (`stamp`: the target now). A
    /// directory: every tracked path under `from` moves under `to` with its version,
    /// holds and records. Returns the target's version (None for a directory).
    pub fn rename(
        &self,
        s: &Session,
        from: &str,
        to: &str,
        is_dir: bool,
        stamp: Option<Stamp>,
        now: Timestamp,
    ) -> Option<u64> {
        self.session_seen(s, now);
        if is_dir {
            let mut all = self.lock_all();
            let mut ev = Event::new(EventKind::Commit, now, Some(to), Some(s));
            ev.op = Some(CommitOp::RenameDir);
            ev.from = Some(from.to_string());
            self.sink.append(&mut ev);
            self.applied.fetch_max(ev.seq, Ordering::SeqCst);
            self.apply_rename_dir(&mut all, from, to);
            self.changes.bump();
            return None;
        }
        let mut guards = self.lock_many(&[from, to]);
        let pos = |p: &str| {
            let i = shard_of(p);
            guards.iter().position(|(j, _)| *j == i).expect("locked")
        };
        let (fi, ti) = (pos(from), pos(to));
        if let Some(e) = guards[fi].1.get_mut(from) {
            if e.version > 0 && e.exists {
                self.commit_locked(e, s, from, CommitOp::RenameAway, None, None, now);
            }
        }
        let e = entry_mut(&mut guards[ti].1, to);
        Some(self.commit_locked(e, s, to, CommitOp::Rename, stamp, Some(from), now))
    }

    /// Every process of `s` is gone: its `E` holds are reclaimed (`reclaim`, one per
    /// path). Scans every path (rare).
    pub fn session_gone(&self, s: &SessionInfo, now: Timestamp) -> usize {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            for (k, e) in sh.iter_mut() {
                if e.holder(&s.name).is_some_and(|h| h.writers > 0) {
                    let mut ev = Event::new(EventKind::Reclaim, now, Some(k), Some(s));
                    ev.version = Some(e.version);
                    self.emit(e, ev);
                    n += 1;
                }
            }
        }
        n
    }

    /// The sessions holding a view or a hold on some path without a write handle there
    /// (memory only): the ones whose views [`Engine::forget_views`] may drop.
    pub fn viewers(&self) -> Vec<Session> {
        let mut out: Vec<Session> = Vec::new();
        for shard in self.shards.iter() {
            let sh = shard.lock();
            for e in sh.values() {
                for h in e.holders.iter().filter(|h| h.writers == 0) {
                    if !out.iter().any(|s| s.name == h.session.name) {
                        out.push(h.session.clone());
                    }
                }
            }
        }
        out
    }

    /// Every process of each session in `gone` has exited: its views and holds without a
    /// write handle refer to nothing any more (a session that comes back reads again, as
    /// after a restart), so they go, and with them the entries nothing else refers to
    /// ([`Engine::prune`]). Memory only, no event. Returns how many entries went.
    pub fn forget_views(&self, gone: &[String]) -> usize {
        if gone.is_empty() {
            return 0;
        }
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            for e in sh.values_mut() {
                e.holders
                    .retain(|h| h.writers > 0 || !gone.contains(&h.session.name));
            }
        }
        self.prune()
    }

    /// Drops the per-path entries nothing refers to: never logged (so not part of
    /// the durable state: a restart would not have them either), no record, and no hold a
    /// rule reads (no write handle, no view a transfer or the stale guard could use: only
    /// `I` holds or none). Memory only, no event; the next sight of such a path starts it
    /// at version 1 again, as after a restart. Returns how many were dropped.
    pub fn prune(&self) -> usize {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            let before = sh.len();
            sh.retain(|_, e| {
                e.logged
                    || !e.records.is_empty()
                    || e.holders.iter().any(|h| h.writers > 0 || h.hold != Hold::I)
            });
            n += before - sh.len();
        }
        n
    }

    /// Evicts ended records whose last change is at least `evict_after` before `now`
    /// (`evict`). The only time-driven change; live records are never touched. Returns
    /// how many were evicted.
    pub fn evict(&self, now: Timestamp) -> usize {
        self.evict_if(now, &|_| true)
    }

    /// [`Engine::evict`] of the paths `may` allows (on a multi-host volume the
    /// coordinator decides when a shared path's records are old enough, not this host's
    /// wall clock alone).
    pub fn evict_if(&self, now: Timestamp, may: &dyn Fn(&str) -> bool) -> usize {
        let cutoff = now.millis() - self.config.evict_after.as_millis() as i64;
        let old = |r: &Record, v: u64| !r.is_live(v) && r.updated.millis() <= cutoff;
        let mut n = 0;
        for shard in self.shards.iter() {
            // Asked with no shard locked (`may` takes the coordinator's own lock).
            let due: Vec<String> = shard
                .lock()
                .iter()
                .filter(|(_, e)| e.records.iter().any(|r| old(r, e.version)))
                .map(|(k, _)| k.to_string())
                .filter(|k| may(k))
                .collect();
            let mut sh = shard.lock();
            for path in due {
                let Some(e) = sh.get_mut(path.as_str()) else {
                    continue;
                };
                let v = e.version;
                let ended: Vec<(u64, String, String)> = e
                    .records
                    .iter()
                    .filter(|r| old(r, v))
                    .map(|r| (r.id, r.path.clone(), r.giver.name.clone()))
                    .collect();
                for (id, path, giver) in ended {
                    let mut ev = Event::new(EventKind::Evict, now, Some(&path), None);
                    ev.record = Some(id);
                    ev.giver = Some(giver);
                    self.emit(e, ev);
                    n += 1;
                }
            }
        }
        n
    }
}
