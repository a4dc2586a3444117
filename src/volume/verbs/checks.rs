//! The checks a verb makes of its paths, all reading one look of each path
//! ([`Seen`]): placed beneath the backing root and stat'ed once as the daemon, and asked
//! at most once per identity whether it may write it. A look that fails leaves each check
//! to answer as it did when it asked on its own (by path, with the same refusal).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::Verbs;
use crate::access::{look_up_and_write, may_write, Who};
use crate::beneath::{self, Parent, Resolved};
use crate::coherence::{Engine, Role, Stamp, Timestamp};
use crate::control::{Request, Verb};
use crate::error::{Reason, Refusal};
use crate::identity::Session;
use crate::visibility::Sight;
use crate::volume::workspace::print_at;

/// What the backing directory held at one path when it was looked at.
#[derive(Debug)]
struct Look {
    /// Its stat (a final symlink not followed), and whether it is a directory.
    stat: Option<(Stamp, bool)>,
    /// Whether it has content to fingerprint (a regular file or a symlink); None: not
    /// known from the look, asked by path when needed.
    content: Option<bool>,
    /// The directory the name was found in, open, and the name: the file's content and
    /// its writers are asked of it with one name looked up (None: asked by path).
    parent: Option<Parent>,
}

impl Look {
    /// Nothing there.
    const MISSING: Look = Look {
        stat: None,
        content: Some(false),
        parent: None,
    };

    /// Looked at by path (an `fstatat` beneath the root), when the walk could not tell.
    fn by_path(v: &Verbs, p: &str) -> Look {
        Look {
            stat: v.ws.stat(p),
            content: None,
            parent: None,
        }
    }
}

/// The paths of a request, each looked at once as the daemon when the request was placed
/// (resolved beneath the root, its stat read from the descriptor that walk opened), and
/// asked at most once per identity whether that identity may write it. Every check of
/// the verb reads it in place of walking the path again. A verb attempted again (after
/// waiting for releases, or a step run again on newer state) looks again: see
/// [`Seen::attempt`].
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// The paths as placed (the real path through a symlinked directory inside).
    pub(super) paths: Vec<String>,
    looks: Vec<Look>,
    /// Per path and identity: may it write the file (None: the check could not tell).
    writes: Vec<(usize, Who, Option<bool>)>,
    /// An attempt has read the looks: the next one looks again.
    used: bool,
}

impl Seen {
    /// Before an attempt of the verb: the first reads the looks of the placing; a later
    /// one (the files may have changed meanwhile) looks at each path again, by path, and
    /// asks each identity again.
    pub(super) fn attempt(&mut self, v: &Verbs) {
        if self.used {
            self.looks = self.paths.iter().map(|p| Look::by_path(v, p)).collect();
            self.writes.clear();
        }
        self.used = true;
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, Option<(Stamp, bool)>)> + '_ {
        self.paths.iter().zip(self.looks.iter().map(|l| l.stat))
    }

    /// The stat of the `i`th path.
    pub(super) fn stat(&self, i: usize) -> Option<(Stamp, bool)> {
        self.looks[i].stat
    }

    /// Where the `i`th path is asked about again: the directory its look found it in and
    /// its name there, or (a look that could not keep it) the root and the path.
    pub(super) fn at<'a>(&'a self, v: &'a Verbs, i: usize) -> (BorrowedFd<'a>, &'a str) {
        match &self.looks[i].parent {
            Some(at) => (at.dir.as_fd(), at.name.as_str()),
            None => (v.backing.fd(), self.paths[i].as_str()),
        }
    }

    /// Has the `i`th path content to fingerprint (a regular file or a symlink)?
    fn has_content(&self, v: &Verbs, i: usize) -> bool {
        self.looks[i]
            .content
            .unwrap_or_else(|| v.backing.has_content(&self.paths[i]))
    }

    /// May `who` open the `i`th path for writing, as the kernel would decide it for its
    /// uid, groups and the file's mode and ACL? Asked once per identity (a walk as it);
    /// None when it cannot be told (a path that is gone: the engine answers for it).
    fn may_write(&mut self, v: &Verbs, i: usize, who: &Who) -> Option<bool> {
        if let Some((.., a)) = self.writes.iter().find(|(j, w, _)| *j == i && w == who) {
            return *a;
        }
        let a = may_write(v.backing.fd(), Path::new(&self.paths[i]), who).ok();
        self.writes.push((i, who.clone(), a));
        a
    }
}

/// `p` placed beneath the backing root: the real path through a symlinked directory inside,
/// `bad_request` for a path that leaves the root (whether the host path exists or not).
pub(in crate::volume) fn placed(v: &Verbs, p: &str) -> Result<String, Refusal> {
    place(v, p).map(|(real, _)| real)
}

/// What the walk of [`placed`] found at the path.
enum Found {
    /// The name, and the directory it is in.
    Name(OwnedFd, Option<Parent>),
    Missing,
    /// The walk could not tell (it failed, or found the root itself).
    Unknown,
}

fn place(v: &Verbs, p: &str) -> Result<(String, Found), Refusal> {
    match beneath::resolve(v.backing.fd(), p) {
        Ok(Resolved::Outside) => Err(Refusal::new(
            Reason::BadRequest,
            format!(
                "bad request: {} is outside the volume (it leaves the mount root through a \
                 symlink)",
                crate::names::quote_for_message(p)
            ),
        )),
        Ok(Resolved::Inside {
            real: Some(r),
            fd,
            parent,
        }) if !r.is_empty() => Ok((r, Found::Name(fd, parent))),
        Ok(Resolved::Inside {
            real: None,
            fd,
            parent,
        }) => Ok((p.to_string(), Found::Name(fd, parent))),
        Ok(Resolved::Missing) => Ok((p.to_string(), Found::Missing)),
        _ => Ok((p.to_string(), Found::Unknown)),
    }
}

/// [`placed`], with what the one walk found there: the name's stat, read from the
/// descriptor the walk opened (None: the walk could not tell, so the look asks by path).
fn look(v: &Verbs, p: &str) -> Result<(String, Option<Look>), Refusal> {
    let (real, found) = place(v, p)?;
    let l = match found {
        Found::Name(fd, parent) => v.ws.stat_fd(fd.as_fd()).map(|(st, dir, content)| Look {
            stat: Some((st, dir)),
            content: Some(content),
            parent,
        }),
        Found::Missing => Some(Look::MISSING),
        Found::Unknown => None,
    };
    Ok((real, l))
}

/// What placing a path asks of the caller.
#[derive(Clone, Copy)]
enum Ask {
    /// Nothing (`status PATH` answers for a path the caller may not see itself).
    Nothing,
    /// May it see the path (a path it may not is refused as one that does not exist).
    Sight,
    /// That, and may it write the file: for the verbs that check it (`transfer`,
    /// `accept`), from the same walk.
    SightAndWrite,
}

/// The request with its paths placed beneath the backing root: a path that leaves it is
/// refused `bad_request` (the same answer whether the host path exists or not, and the
/// engine never sees it); a path through a symlink to a directory inside becomes the real
/// path; a path the caller may not see is refused as a path that does not exist
/// (`status PATH` answers for it as for a path never seen, in `seen_status`). With it,
/// the [`Seen`] of its paths: what that one walk found at each.
pub(super) fn place_request(
    v: &Verbs,
    sight: &mut Sight,
    req: &Request,
) -> Result<(Request, Seen), Refusal> {
    let mut seen = Seen::default();
    let mut place = |sight: &mut Sight, p: &String, ask: Ask| -> Result<String, Refusal> {
        let (real, l) = look(v, p)?;
        let sees = match ask {
            _ if sight.sees_all() => true,
            Ask::Nothing => true,
            Ask::Sight => sight.sees(v.backing.fd(), &real),
            Ask::SightAndWrite => {
                // One walk as the caller: may it see the path, and may it write it (what
                // the verb's check of the caller reads).
                let who = sight.who().clone();
                let a = look_up_and_write(v.backing.fd(), Path::new(&real), &who);
                sight.learned(&real, a.looks_up);
                seen.writes.push((seen.paths.len(), who, a.writes));
                a.looks_up
            }
        };
        if !sees {
            return Err(not_there(&real));
        }
        seen.paths.push(real.clone());
        seen.looks
            .push(l.unwrap_or_else(|| Look::by_path(v, &real)));
        Ok(real)
    };
    let req = match req {
        Request::Transfer { paths, to, note } => Request::Transfer {
            paths: paths
                .iter()
                .map(|p| place(sight, p, Ask::SightAndWrite))
                .collect::<Result<_, _>>()?,
            to: to.clone(),
            note: note.clone(),
        },
        Request::Accept { paths } => Request::Accept {
            paths: paths
                .iter()
                .map(|p| place(sight, p, Ask::SightAndWrite))
                .collect::<Result<_, _>>()?,
        },
        Request::Decline { paths } => Request::Decline {
            paths: paths
                .iter()
                .map(|p| place(sight, p, Ask::Sight))
                .collect::<Result<_, _>>()?,
        },
        Request::Withdraw { paths } => Request::Withdraw {
            paths: paths
                .iter()
                .map(|p| place(sight, p, Ask::Sight))
                .collect::<Result<_, _>>()?,
        },
        Request::Status { path: Some(p) } => Request::Status {
            path: Some(place(sight, p, Ask::Nothing)?),
        },
        Request::Wait {
            path,
            until,
            timeout_ms,
        } => Request::Wait {
            path: place(sight, path, Ask::Sight)?,
            until: *until,
            timeout_ms: *timeout_ms,
        },
        other => other.clone(),
    };
    Ok((req, seen))
}

/// The refusal for a path that does not exist (the engine's own answer for one).
fn not_there(p: &str) -> Refusal {
    Refusal::new(
        Reason::NoSuchPath,
        format!(
            "{p_q} does not exist in this volume (or the volume has not seen it yet)",
            p_q = crate::names::display_name(p)
        ),
    )
}

/// A transfer hands on tracked paths only (docs/design.md#versions): each untracked one is refused
/// `not_tracked`, saying which `.git` or which ignore file and pattern, and how to track it.
pub(super) fn tracked_paths(v: &Verbs, seen: &Seen) -> Result<(), Refusal> {
    let paths = &seen.paths;
    let refused: Vec<Refusal> = seen
        .iter()
        .filter_map(|(p, st)| {
            let is_dir = st.is_some_and(|x| x.1);
            let why = v.ws.why_untracked(p, is_dir)?;
            Some(
                Refusal::new(
                    Reason::NotTracked,
                    format!(
                        "{p_q} is not tracked by the volume, so it cannot be handed on: {why}",
                        p_q = crate::names::display_name(p)
                    ),
                )
                .at(p.as_str()),
            )
        })
        .collect();
    let Some(first) = refused.first() else {
        return Ok(());
    };
    let mut r = first.clone();
    if paths.len() > 1 {
        r.per_path = refused;
    }
    Err(r)
}

/// Count what the backing directory holds at each path before a verb decides on it.
/// Directories are not handed on.
pub(super) fn observe_paths(
    v: &Verbs,
    e: &Engine,
    seen: &Seen,
    now: Timestamp,
) -> Result<(), Refusal> {
    for (p, st) in seen.iter() {
        v.ws.observe_seen(e, p, st, now);
        if st.is_some_and(|x| x.1) {
            return Err(Refusal::new(
                Reason::BadRequest,
                format!(
                    "bad request: {p_q} is a directory; hand on the files in it",
                    p_q = crate::names::display_name(p)
                ),
            ));
        }
    }
    Ok(())
}

/// A transfer hands on content: each file's fingerprint is taken now (and counted, should
/// the file have changed since it was observed), so while the record is live only content
/// that differs from it ends it (docs/versions-and-holds.md#content). A file that cannot be
/// read to take it is not handed on (fail closed: without it, no metadata change could be
/// told from a rewrite).
pub(super) fn fingerprint_paths(
    v: &Verbs,
    e: &Engine,
    seen: &Seen,
    now: Timestamp,
) -> Result<(), Refusal> {
    for (i, p) in seen.paths.iter().enumerate() {
        if e.version(p).is_none() || !seen.has_content(v, i) {
            continue; // the engine refuses it (`no_such_path`), or a special file
        }
        let (dir, name) = seen.at(v, i);
        let Some((st, print)) = print_at(dir, name) else {
            return Err(Refusal::new(
                Reason::IoError,
                format!(
                    "{p} could not be read to take its content's fingerprint (it is changing \
                     right now, or the volume may not read it): the handoff needs one; try \
                     again once it is still"
                ),
            )
            .at(p.as_str()));
        };
        e.observe_content(p, st, Some(print), now);
    }
    Ok(())
}

/// `accept` (and the claim of an offer) needs that the caller could open the file for
/// writing (docs/design.md#handoff): a session that cannot write a file cannot be its
/// successor. Checked on the paths whose live record names `s` as successor or is an
/// offer `s` would claim; the others get the engine's answer. An offer stays open for a
/// session that can.
pub(super) fn successor_may_write(
    v: &Verbs,
    s: &Session,
    who: &Who,
    seen: &mut Seen,
) -> Result<(), Refusal> {
    for i in 0..seen.paths.len() {
        let p = &seen.paths[i].clone();
        let Some(h) = v.engine.handoff(s, p) else {
            continue;
        };
        let claim = h.record.offer && h.record.claimed_by.is_none() && h.role == Role::Bystander;
        if h.role != Role::Successor && !claim {
            continue;
        }
        if let Some(false) = seen.may_write(v, i, who) {
            let way = if claim {
                "the offer stays open for a session that can write it".to_string()
            } else {
                format!(
                    "decline it instead (coherent decline {})",
                    crate::control::shell_word(p)
                )
            };
            return Err(Refusal::new(
                Reason::SessionNotYours,
                format!(
                    "you may not write {p_q} (its mode or ACL does not let uid {} write it), so \
                     this session cannot {} it: {way}",
                    who.uid,
                    if claim { "claim" } else { "accept" },
                    p_q = crate::names::display_name(p)
                ),
            )
            .at(p.as_str())
            .with_status(h.record.status));
        }
    }
    Ok(())
}

/// The two write-permission checks of a `transfer`, in one place, as the kernel would
/// decide an open for writing for a uid, its groups and the file's mode and ACL
/// (docs/design.md#handoff):
/// - the caller could open each file for writing itself;
/// - a transfer to a session owned by another uid needs that this uid could too (as above: only
///   a session whose owner could write the file can be its successor; otherwise "when it
///   writes the file" would be a way out that cannot work). An owner the user database
///   does not know is not checked here (its `accept` is).
///
/// Errors (a path that is gone) are the engine's to answer.
pub(super) fn writers_may_write(
    v: &Verbs,
    who: &Who,
    to: &str,
    seen: &mut Seen,
) -> Result<(), Refusal> {
    for i in 0..seen.paths.len() {
        if let Some(false) = seen.may_write(v, i, who) {
            let p = &seen.paths[i];
            return Err(Refusal::new(
                Reason::SessionNotYours,
                format!(
                    "you may not write {p_q} (its mode or ACL does not let uid {} write it), \
                     so you cannot hand it on",
                    who.uid,
                    p_q = crate::names::display_name(p)
                ),
            ));
        }
    }
    let Ok(succ) = v.engine.lookup_session(to) else {
        return Ok(());
    };
    let Some(uid) = v
        .engine
        .owner(&succ.name)
        .filter(|u| *u != who.uid && *u != 0)
    else {
        return Ok(());
    };
    let Some(owner) = Who::of_user(uid) else {
        return Ok(());
    };
    for i in 0..seen.paths.len() {
        if let Some(false) = seen.may_write(v, i, &owner) {
            let p = &seen.paths[i];
            return Err(Refusal::new(
                Reason::SessionNotYours,
                format!(
                    "session {} belongs to uid {uid}, which may not write {p_q}, so it cannot be \
                     its successor: hand it to a session that can write it",
                    succ.name,
                    p_q = crate::names::display_name(p)
                ),
            )
            .at(p.as_str()));
        }
    }
    Ok(())
}

/// `accept`/`decline` only by the successor's owner uid, `withdraw` only by the giver's
/// (docs/design.md#handoff): a caller of another uid is refused `session_not_yours` (a caller of
/// the same uid in another session gets the engine's `handoff_not_successor`/`handoff_not_giver`).
pub(super) fn owner_only(
    v: &Verbs,
    s: &Session,
    who: &Who,
    verb: Verb,
    paths: &[String],
) -> Result<(), Refusal> {
    for p in paths {
        let Some(h) = v.engine.handoff(s, p) else {
            continue;
        };
        let (role, name) = match verb {
            Verb::Withdraw => ("giver", &h.record.giver),
            _ => ("successor", &h.record.successor),
        };
        match v.engine.owner(name) {
            Some(owner) if *name != s.name && owner != who.uid => {
                return Err(Refusal::new(
                    Reason::SessionNotYours,
                    format!(
                        "the {role} of {p_q} is session {name}, which belongs to uid {owner}: \
                         only that uid may {} it",
                        verb.as_str(),
                        p_q = crate::names::display_name(p)
                    ),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}
