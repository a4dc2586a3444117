//! Untracked names of tracked files (docs/design.md#write-routes): a hard link into an ignored
//! directory, or a tracked file's second name under `.git/`, is a name of the same inode.
//! The fence follows the inode, so a giver's write route through such a name is fenced
//! like one through the handed path; and what a write route through it does to the
//! inode's ctime (a link, an unlink, a rename, a setattr) is not a change of the tracked
//! names behind the volume's back: they take the new stamp. Nothing else about untracked
//! names changes (no entry, no version, no event unless refused).

use std::path::Path;

use super::WritePolicy;
use crate::coherence::{self, Permit, Route, Timestamp};
use crate::fs::WriteRoute;
use crate::request_timeout::Started;
use crate::store::{Caller, FsError};
use crate::volume::tell::Denied;
use crate::volume::workspace::{rel, stamp};

impl WritePolicy {
    /// The stamp of `p` when it is a file with several names of which the engine tracks
    /// one. Free while the engine holds no record and no tracked file with several names
    /// was seen; else one `fstatat`, and a scan of the engine's paths only for a file with
    /// several names while there are records (a fence to find) or when a tracked name of
    /// it was seen (names to restamp).
    fn alias_of(&self, p: &str, started: Started) -> Option<coherence::Stamp> {
        let records = self.engine.any_records();
        if !records && !self.ws.seen_linked(None) {
            return None;
        }
        let (st, n) = self.file_links(p)?;
        if n < 2 {
            return None;
        }
        if !records && !self.ws.seen_linked(Some(st.ino)) {
            return None;
        }
        if records {
            self.ws.stamp_handed(started);
        }
        (!self.engine.paths_of_inode(st.ino).is_empty()).then_some(st)
    }

    /// The stamp and number of names of the file (not a directory) at `p`. Unlike
    /// [`crate::volume::workspace::Workspace::stat_links`] it does not remember the inode as linked: untracked files
    /// with several names (a build tree's hard links) must not make every change of a
    /// tracked file's names scan the engine.
    fn file_links(&self, p: &str) -> Option<(coherence::Stamp, u64)> {
        let st = self.backing.lstat(p)?;
        (!st.dir).then(|| (stamp(&st.stamp), st.nlink))
    }

    /// A write route through untracked names of tracked files: the fence by inode, and a
    /// permit whose after-part restamps the tracked names. `Ok(None)`: not such a route
    /// (or an open, which needs nothing after): decide it as usual.
    pub(super) fn alias_write(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
    ) -> Result<Option<Permit>, FsError> {
        if !self.engine.any_records() && !self.ws.seen_linked(None) {
            return Ok(None);
        }
        let untracked = |p: Option<&Path>| -> Option<String> {
            rel(p)
                .filter(|p| !self.ws.is_tracked(p, false))
                .map(str::to_string)
        };
        // (name, route, the file there when it is an alias) to fence; then whether the
        // route needs the after-part.
        let mut checks: Vec<(String, Route, coherence::Stamp)> = Vec::new();
        let mut check = |p: Option<String>, r: Route| {
            if let Some(p) = p {
                if let Some(st) = self.alias_of(&p, caller.started) {
                    checks.push((p, r, st));
                }
            }
        };
        let after = match *route {
            WriteRoute::Open { path, .. } => {
                check(untracked(path), Route::OpenWrite);
                false
            }
            WriteRoute::Setattr { path, .. } => {
                check(untracked(path), Route::Setattr);
                true
            }
            WriteRoute::Unlink { path } => {
                check(untracked(path), Route::Unlink);
                true
            }
            WriteRoute::Setxattr { path, .. } => {
                check(untracked(path), Route::Setxattr);
                true
            }
            WriteRoute::Removexattr { path, .. } => {
                check(untracked(path), Route::Removexattr);
                true
            }
            WriteRoute::Link { from, to } => {
                check(untracked(from), Route::Link);
                untracked(to).is_some()
            }
            WriteRoute::Rename { from, to, .. } => {
                let (f, t) = (untracked(from), untracked(to));
                let both = f.is_some() && t.is_some();
                check(f, Route::RenameSource);
                check(t, Route::RenameTarget);
                both
            }
            _ => false,
        };
        let Some((p, _, st)) = checks.first().cloned() else {
            return Ok(None);
        };
        let now = Timestamp::now();
        let who = self.sessions.writer(caller);
        for (q, r, st) in &checks {
            let (s, resolved) = match &who {
                Ok(s) => (s, true),
                Err(s) => (s, false),
            };
            if let Err(f) = self.engine.fence_alias(s, resolved, q, st.ino, *r, now) {
                let (caller, tell) = (Some(caller), resolved);
                let d = Denied {
                    caller,
                    session: s,
                    tell,
                    log: None,
                };
                return Err(self.tell.refuse_write(d, &f, now));
            }
        }
        if !after {
            return Ok(None);
        }
        let s = match who {
            Ok(s) | Err(s) => s,
        };
        Ok(Some(Permit::alias(s, &p, st)))
    }

    /// The after-part of an alias permit: the tracked names of the inode take its new
    /// stamp (the route changed its ctime, not the tracked names' content).
    pub(super) fn count_alias(&self, pm: &Permit, failed: bool) {
        if failed {
            return;
        }
        let Some(pre) = pm.pre else { return };
        // Not gated on `linked`: `alias_of` found tracked names of this inode.
        for q in self.engine.paths_of_inode(pre.ino) {
            if let Some(now) = self.ws.stamp_now(&q).filter(|st| st.ino == pre.ino) {
                self.engine.restamp(&q, now);
            }
        }
    }
}
