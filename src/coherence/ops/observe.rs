//! What the mount sees in the backing directory: a path's stamp and fingerprint, judged
//! against the version counted there (docs/versions-and-holds.md#content).

use crate::coherence::engine::*;
use crate::coherence::time::Timestamp;
use crate::coherence::types::*;

impl Engine {
    /// The mount saw `path` in the backing directory with `stamp` (None: the file is not
    /// there). Call at lookup/open before `open_read`/`acquire`. A path seen for the first
    /// time is at version 1 (nothing logged); a known path whose content changed while no
    /// handle writes it changed behind the volume's back: a commit by `external`
    /// (`external_change`, and `overtaken` on a live record). Returns the version. Without
    /// a fingerprint, a stamp whose content only a fingerprint can judge counts nothing
    /// (see [`Engine::observe_content`]).
    pub fn observe(&self, path: &str, stamp: Option<Stamp>, now: Timestamp) -> Option<u64> {
        self.observe_in(&mut self.lock_one(path), path, stamp, None, now)
    }

    /// [`Engine::observe`] with the fingerprint of the file the mount took (when
    /// [`Engine::wants_print`] asked for one, or at a transfer): what the content check of
    /// docs/versions-and-holds.md#content decides (`Content::Changed` was counted).
    pub fn observe_content(
        &self,
        path: &str,
        stamp: Stamp,
        print: Option<Print>,
        now: Timestamp,
    ) -> Content {
        let mut sh = self.lock_one(path);
        // A judgement of bytes read before a newer stamp was counted (the judge's worker,
        // late): the file no longer holds them, so it says nothing. The next open asks again.
        if sh
            .get(path)
            .and_then(|e| e.stamp)
            .is_some_and(|cur| cur.ctime_ns > stamp.ctime_ns)
        {
            return Content::Unchanged;
        }
        let verdict = sh.get(path).map_or(Content::Unchanged, |e| {
            judge(e, stamp, print, self.copies())
        });
        self.observe_in(&mut sh, path, Some(stamp), print, now);
        verdict
    }

    /// What the content check would find for the file at `path` (no change made; for the
    /// mount's log line). A path with no entry, or no file counted there, is `Unchanged`.
    pub fn content(&self, path: &str, stamp: Stamp, print: Option<Print>) -> Content {
        let sh = self.lock_one(path);
        match sh.get(path) {
            Some(e) if e.exists && e.version > 0 && !e.writing() => {
                judge(e, stamp, print, self.copies())
            }
            _ => Content::Unchanged,
        }
    }

    /// Does judging `stamp` at `path` need the file's fingerprint? Only when the stamp
    /// differs from the one counted (or is new here) and the path has a fingerprint of the
    /// same size: a metadata-only change, a copy that caught up or lags behind, or a
    /// same-size rewrite, which only the content tells apart.
    pub fn wants_print(&self, path: &str, stamp: &Stamp) -> bool {
        self.lock_one(path).get(path).is_some_and(|e| {
            !e.writing()
                && e.exists
                && e.version > 0
                && e.stamp != Some(*stamp)
                && needs_print(e, stamp, self.copies())
        })
    }

    /// Several hosts, each maybe on its own copy of the workspace: a copy may lag behind
    /// the version the hosts agree on. On one host there is one copy, so content equal to
    /// an older version's is a change (a revert), not a lag.
    pub(in crate::coherence) fn copies(&self) -> bool {
        self.config.host.is_some()
    }

    /// `observe` with the shard of `path` held (the write decision holds it).
    pub(in crate::coherence) fn observe_in(
        &self,
        sh: &mut Shard,
        path: &str,
        stamp: Option<Stamp>,
        print: Option<Print>,
        now: Timestamp,
    ) -> Option<u64> {
        let Some(e) = sh.get_mut(path) else {
            stamp?;
            sh.insert(
                path.into(),
                Entry {
                    version: 1,
                    exists: true,
                    stamp,
                    print: print.map(|p| {
                        Box::new(Prints {
                            current: Some(p),
                            taken_in: Vec::new(),
                        })
                    }),
                    // The copy holds the version it is first seen at.
                    held_here: 1,
                    ..Default::default()
                },
            );
            return Some(1);
        };
        if e.writing() {
            // A handle of the volume is writing it: the commit will count the change.
            return (e.version > 0 && e.exists).then_some(e.version);
        }
        match (e.exists && e.version > 0, stamp) {
            (false, None) => return None,
            (false, Some(_)) if e.version == 0 => {
                e.version = 1;
                e.exists = true;
                e.held_here = 1;
                e.stamp = stamp;
                e.set_print(print);
                return Some(1);
            }
            // A copy this host never looked at, where the file is not yet: the sync that
            // brings it has not arrived (docs/multi-host.md#copies).
            (true, None) if self.copies() && e.stamp.is_none() && e.held_here == 0 => {
                return None;
            }
            (true, Some(st)) => match judge(e, st, print, self.copies()) {
                Content::Unchanged | Content::Same => {
                    // A metadata-only change (or a copy that caught up): the new stamp is
                    // this content's, silently (docs/versions-and-holds.md#content).
                    e.stamp = Some(st);
                    if print.is_some() && e.current_print().is_none() {
                        e.set_print(print);
                    }
                    // Only bytes found to be the current version's are held here: an
                    // unchanged stamp may be of an older version's copy, kept when another
                    // host's commit moved the version on.
                    if print.is_some_and(|p| e.current_print() == Some(p)) {
                        e.held_here = e.held_here.max(e.version);
                    }
                    return Some(e.version);
                }
                // First sight of a copy that is not yet the current version: its stamp is
                // taken as this copy's, counted as nothing (a later change of it is one).
                Content::Lags => {
                    e.stamp = Some(st);
                    return Some(e.version);
                }
                // Behind: this host's copy has not caught up yet; Unknown: the content
                // would tell, and was not looked at. Neither is a change; the stamp stays,
                // so the next look asks again.
                Content::Behind(_) | Content::Unknown => return Some(e.version),
                Content::Changed => {}
            },
            _ => {}
        }
        // Changed, removed or recreated behind the volume's back.
        let version = e.version + 1;
        self.overtake_live(e, EXTERNAL, now);
        let mut ev = Event::new(EventKind::ExternalChange, now, Some(path), None);
        ev.session = Some(EXTERNAL.to_string());
        ev.version = Some(version);
        ev.removed = stamp.is_none();
        ev.stamp = stamp;
        ev.print = stamp.and(print);
        self.emit(e, ev);
        stamp.map(|_| version)
    }

    /// The fingerprint of the content just committed at `path` with `stamp` (taken by the
    /// mount after the commit, for what other hosts compare their copies with). Kept if the
    /// file is still as committed. Memory only: a restart knows the records' prints.
    pub fn note_print(&self, path: &str, stamp: Stamp, print: Print) {
        if let Some(e) = self.lock_one(path).get_mut(path) {
            if e.exists && e.version > 0 && e.stamp == Some(stamp) {
                e.set_print(Some(print));
            }
        }
    }

    /// A metadata change made through the volume that is not a commit (chmod, chown,
    /// utimes, xattrs) changed the file's ctime: remember the new stamp so the next
    /// `observe` does not count it as an external change. Memory only (no event): after a
    /// restart the stamp of the last logged commit applies again.
    pub fn restamp(&self, path: &str, stamp: Stamp) {
        if let Some(e) = self.lock_one(path).get_mut(path) {
            if e.exists && e.version > 0 && e.stamp != Some(stamp) {
                e.stamp = Some(stamp);
            }
        }
    }
}

/// What the backing file at a known, existing path holds, against what the engine counted
/// there (docs/versions-and-holds.md#content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// The stamp counted last: nothing happened.
    Unchanged,
    /// Another stamp, the same content: a metadata-only change (atime, mtime, mode,
    /// owner, an xattr), or a copy that caught up with the version. Restamped, no event.
    Same,
    /// This host's copy holds the content of an older version (its sync has not arrived):
    /// behind, not a change. A copy that held a newer version is never behind.
    Behind(u64),
    /// Only the content can tell, and no fingerprint was given: nothing is counted now.
    Unknown,
    /// Several hosts: the first look here at this copy since the path got a version from
    /// another host, and its bytes are no version known here (older ones are known only
    /// from transfers): a copy the sync has not reached, taken as it is, as a first sight
    /// is on one host. Its stamp is kept; a later change of it is a change.
    Lags,
    /// The content differs: a commit by `external`.
    Changed,
}

/// Could a fingerprint tell what `st` is? Some known fingerprint (this version's or an
/// older one's) has its size: a file of another size is none of them.
/// `copies`: older versions' fingerprints count too (see [`Engine::copies`]).
fn needs_print(e: &Entry, st: &Stamp, copies: bool) -> bool {
    let fits = |p: &Print| p.size == st.size;
    e.current_print().as_ref().is_some_and(fits)
        || (copies && e.older_prints().any(|(_, p)| fits(&p)))
}

/// The content check. With a fingerprint of the current version: the content decides
/// (size first, then the digest); with `copies`, an older version's fingerprint means
/// behind, if this copy never held a newer version. Without one (a path never handed on): a stamp first seen here is taken as it
/// is, and another one with the same size and mtime is a metadata-only change (the check
/// `make` and rsync rely on; a rewrite that puts the mtime back is only caught where a
/// fingerprint is kept).
fn judge(e: &Entry, st: Stamp, print: Option<Print>, copies: bool) -> Content {
    let current = e.current_print();
    // On copies the stamp may be of an older version's bytes, kept when another host's
    // commit moved the version on: unchanged, that copy still lags (not a change).
    let older_copy = copies && e.held_here < e.version;
    if e.stamp == Some(st) && (older_copy || print.is_none_or(|p| current.is_none_or(|c| c == p))) {
        return Content::Unchanged;
    }
    if needs_print(e, &st, copies) {
        let Some(got) = print else {
            return Content::Unknown;
        };
        if current == Some(got) {
            return Content::Same;
        }
        // An older version's bytes are a copy behind, unless this copy already held a
        // newer one: then they were put back (a revert, or a sync from a lagging copy over
        // this one), a change that erased the newer version.
        if let Some((v, _)) = e.older_prints().find(|(_, p)| copies && *p == got) {
            if v >= e.held_here {
                return Content::Behind(v);
            }
        }
    }
    if current.is_some() {
        if copies && e.stamp.is_none() && e.held_here == 0 {
            return Content::Lags;
        }
        return Content::Changed;
    }
    match e.stamp {
        None => Content::Same,
        // A stamp kept from an older version's copy says nothing of this version, whose
        // fingerprint is not known here: taken as it is, as a first sight.
        Some(_) if older_copy => Content::Same,
        Some(old) if old.size == st.size && old.mtime_ns == st.mtime_ns && old.mtime_ns != 0 => {
            Content::Same
        }
        Some(_) => Content::Changed,
    }
}
