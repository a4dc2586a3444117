//! Each write route as the policy sees it: which write it is, before it runs (what the
//! engine decides on), and what it did, counted after.

use super::*;

impl WritePolicy {
    /// The decision of a write route (the history keeps what it may change once permitted).
    pub(super) fn decide_write(
        &self,
        caller: &Caller,
        route: &WriteRoute<'_>,
    ) -> Result<Option<Permit>, FsError> {
        // An open for write names a file (a directory fails EISDIR anyway). Tracking
        // first: an untracked path costs no session lookup and no engine lock; what a
        // tracked one opens is looked at once, here.
        if let WriteRoute::Open { path, flags, .. } | WriteRoute::Create { path, flags, .. } =
            *route
        {
            return match rel(path).filter(|p| self.ws.is_tracked(p, false)) {
                Some(p) => {
                    let at = self.ws.at_by(p, Some(caller.uid), caller.started);
                    let w = match reach(flags) {
                        Reach::Append => Write::Append(at),
                        Reach::Overwrite => Write::Open(at),
                    };
                    self.decide(caller, w)
                }
                // An untracked name of a tracked file (a hard link): fenced by inode.
                None => self.alias_write(caller, route),
            };
        }
        if let Some(permit) = self.alias_write(caller, route)? {
            return Ok(Some(permit));
        }
        let w = match *route {
            WriteRoute::Open { .. } | WriteRoute::Create { .. } => unreachable!("decided above"),
            WriteRoute::Setattr { path, set, .. } => {
                let Some((a, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    return Ok(None);
                };
                // A change of size can drop bytes: the stale guard applies.
                match set.size {
                    Some(_) => Write::Truncate(a),
                    None => Write::Setattr(a),
                }
            }
            WriteRoute::Rename { from, to, flags } => {
                let (Some(f), Some(t)) = (rel(from), rel(to)) else {
                    return Ok(None);
                };
                let ((from, ft), (to, tt)) = (
                    self.ws.tracked(f, caller.started),
                    self.ws.tracked(t, caller.started),
                );
                // A move across the boundary is decided on both names (a fenced file may
                // not leave by a rename); the after-part counts only the tracked side.
                if !ft && !tt {
                    return Ok(None);
                }
                // The untracked name of a file is not looked at (no entry, no event).
                let from = if ft || from.found == Found::Dir {
                    from
                } else {
                    At::unseen(f)
                };
                let to = if tt || to.found == Found::Dir {
                    to
                } else {
                    At::unseen(t)
                };
                Write::Rename {
                    from,
                    to,
                    exchange: flags & RENAME_EXCHANGE != 0,
                }
            }
            WriteRoute::Unlink { path } => {
                let Some((a, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    return Ok(None);
                };
                Write::Unlink(a)
            }
            WriteRoute::Link { from, to } => {
                let from = rel(from)
                    .map(|p| self.ws.tracked(p, caller.started))
                    .filter(|x| x.1);
                let to = rel(to).map(|p| self.ws.tracked(p, caller.started));
                // The giver cannot give a fenced file another name, tracked or not.
                let to = match (to, from) {
                    (Some((a, true)), _) | (Some((a, false)), Some(_)) => a,
                    _ => return Ok(None),
                };
                Write::Link {
                    from: from.map(|x| x.0),
                    to,
                }
            }
            WriteRoute::Symlink { path, .. } => {
                let Some((a, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    return Ok(None);
                };
                Write::Symlink(a)
            }
            WriteRoute::Mknod { path, .. } => {
                let Some((a, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    return Ok(None);
                };
                Write::Mknod(a)
            }
            WriteRoute::Setxattr { path, name } | WriteRoute::Removexattr { path, name } => {
                let name = name.as_encoded_bytes();
                let Some((at, true)) = rel(path).map(|p| self.ws.tracked(p, caller.started)) else {
                    // Untracked (the root too): only the computed-name rule applies.
                    return match coherence::computed_xattr(name) {
                        Some(r) => Err(FsError(r.write_errno())),
                        None => Ok(None),
                    };
                };
                match route {
                    WriteRoute::Setxattr { .. } => Write::Setxattr { at, name },
                    _ => Write::Removexattr { at, name },
                }
            }
            // docs/design.md#write-routes does not fence directories being made or removed (a
            // directory rename is).
            WriteRoute::Mkdir { .. } | WriteRoute::Rmdir { .. } => return Ok(None),
        };
        self.decide(caller, w)
    }

    /// What a write route did, counted after it ran (`failed`: it did not).
    pub(super) fn count_write(
        &self,
        e: &Engine,
        route: &WriteRoute<'_>,
        pm: &Permit,
        failed: bool,
        now: Timestamp,
    ) {
        if pm.alias {
            return self.count_alias(pm, failed);
        }
        let (s, p) = (&pm.session, pm.path.as_str());
        match *route {
            WriteRoute::Open { .. } | WriteRoute::Create { .. } => {
                // The open failed after the acquire: give the hold back.
                if pm.acquired.is_some() {
                    e.close_write(s, p, false, now);
                }
            }
            _ if failed => {}
            WriteRoute::Setattr { set, .. } => {
                if pm.is_dir {
                    return;
                }
                let holds_e = matches!(e.hold(s, p), Some((coherence::Hold::E, _)));
                match self.ws.stamp_now(p) {
                    // A truncate by a session writing the file through a handle (coreutils
                    // `truncate` is open + ftruncate + close) is part of that handle's
                    // commit; any other change of size is a commit of its own.
                    Some(after) if set.size.is_some() && !holds_e => {
                        self.history
                            .with_history(p, s, CommitOp::Truncate, now, || {
                                e.commit(s, p, CommitOp::Truncate, Some(after), now)
                            });
                        self.ws.print_commit(e, p, after);
                        self.ws.restamp_other_names(after.ino, &[p]);
                    }
                    Some(after) => {
                        e.restamp(p, after);
                        self.ws.restamp_other_names(after.ino, &[p]);
                    }
                    None => {}
                }
            }
            WriteRoute::Rename { flags, .. } => {
                let Some(t) = pm.to.as_deref() else { return };
                if flags & RENAME_EXCHANGE != 0 {
                    self.exchange(e, s, p, t, now);
                } else if !pm.is_dir && !self.ws.is_tracked(t, false) {
                    // Moved out of what the volume tracks: the source is removed.
                    self.history
                        .with_history(p, s, CommitOp::RenameAway, now, || {
                            e.commit(s, p, CommitOp::RenameAway, None, now)
                        });
                } else {
                    let after = if pm.is_dir {
                        None
                    } else {
                        self.ws.stamp_now(t)
                    };
                    if pm.is_dir {
                        e.rename(s, p, t, true, None, now);
                        self.history.history_moved_dir(p, t, now);
                    } else {
                        // The source records a removal, the target the moved content.
                        self.history.history_moved(p, s, now);
                        self.history.with_history(t, s, CommitOp::Rename, now, || {
                            e.rename(s, p, t, false, after, now).unwrap_or(0)
                        });
                    }
                    if let Some(moved) = after {
                        self.ws.restamp_other_names(moved.ino, &[p, t]);
                    }
                }
            }
            WriteRoute::Unlink { .. } => {
                self.history.with_history(p, s, CommitOp::Unlink, now, || {
                    e.commit(s, p, CommitOp::Unlink, None, now)
                });
                if let Some(pre) = pm.pre {
                    self.ws.restamp_other_names(pre.ino, &[p]);
                }
            }
            WriteRoute::Link { .. } if !self.ws.is_tracked(p, false) => {
                // A new untracked name of a tracked file: not a change of its tracked
                // names (docs/design.md#versions), which take the new stamp.
                if let Some(after) = self.ws.stamp_now(p) {
                    self.ws.restamp_other_names(after.ino, &[]);
                }
            }
            WriteRoute::Link { .. } | WriteRoute::Symlink { .. } | WriteRoute::Mknod { .. } => {
                let op = match route {
                    WriteRoute::Link { .. } => CommitOp::Link,
                    WriteRoute::Symlink { .. } => CommitOp::Symlink,
                    _ => CommitOp::Mknod,
                };
                let after = self.ws.stamp_now(p);
                self.history
                    .with_history(p, s, op, now, || e.commit(s, p, op, after, now));
                if let (WriteRoute::Link { .. }, Some(after)) = (route, after) {
                    self.ws.restamp_other_names(after.ino, &[p]);
                }
            }
            WriteRoute::Setxattr { .. } | WriteRoute::Removexattr { .. } => {
                if let Some(after) = self.ws.stamp_now(p) {
                    e.restamp(p, after);
                    self.ws.restamp_other_names(after.ino, &[p]);
                }
            }
            WriteRoute::Mkdir { .. } | WriteRoute::Rmdir { .. } => {}
        }
    }
}
