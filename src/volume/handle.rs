//! One open write handle of the volume and its state: commits, release or reclaim, the
//! in-flight race (docs/design.md#volume-parts).

use parking_lot::Mutex;

use crate::coordinator::Ticket;
use crate::identity::Session;

/// Where a write handle stands between its open and its release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// No FLUSH yet, nothing committed. `dirty`: a change not visible in the handle's
    /// stamps (the `O_TRUNC` of its open) waits for its next commit.
    Open { dirty: bool },
    /// At least one FLUSH (a `close(2)` of one of its descriptors) arrived, nothing
    /// committed. `closed_alive`: the last FLUSH of a handle with nothing to commit came
    /// from a running task (a deliberate `close(2)`), so it ends in `release` even if its
    /// process exits before the RELEASE arrives (a killed process closes its files while
    /// exiting).
    Flushed { dirty: bool, closed_alive: bool },
    /// A commit was made through this handle.
    Committed { flushed: bool },
}

/// How a handle ends at RELEASE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// It committed: give the `E` hold back as committed.
    Committed,
    /// Unchanged and last closed by a running task: `release`.
    Released,
    /// Unchanged and not known to be closed deliberately: `release` if the session still
    /// runs, else the session's holds are reclaimed.
    MaybeGone,
}

/// An open write handle (its token is the key).
pub(super) struct WriteHandle {
    pub session: Session,
    /// The path at open: where the `E` hold was taken, so where it is given back.
    pub path: String,
    /// The backing file's inode at open: the handle writes that file under any name.
    pub ino: u64,
    /// The thread that opened it (for the in-flight check).
    pub pid: u32,
    /// The handle created its file: it commits at release even if nothing was written.
    pub created: bool,
    /// Multi-host, an agent session's handle: what it was admitted under, checked at each
    /// of its writes (`None`: its writes need no check).
    pub ticket: Mutex<Option<Ticket>>,
    /// The last refusal of a write through it that was logged (the same one again is
    /// not logged again: a program may retry in a loop).
    refused: Mutex<Option<String>>,
    state: Mutex<State>,
}

impl WriteHandle {
    pub fn new(session: Session, path: String, pid: u32, created: bool, dirty: bool) -> Self {
        WriteHandle {
            session,
            path,
            ino: 0,
            pid,
            created,
            ticket: Mutex::new(None),
            refused: Mutex::new(None),
            state: Mutex::new(State::Open { dirty }),
        }
    }

    /// The backing inode the handle writes (see [`WriteHandle::ino`]).
    pub fn on_inode(self, ino: u64) -> Self {
        WriteHandle { ino, ..self }
    }

    pub fn with_ticket(self, ticket: Option<Ticket>) -> Self {
        WriteHandle {
            ticket: Mutex::new(ticket),
            ..self
        }
    }

    /// Notes a refused write; true when it is not the one logged last (log it then).
    pub fn new_refusal(&self, message: &str) -> bool {
        let mut last = self.refused.lock();
        if last.as_deref() == Some(message) {
            return false;
        }
        *last = Some(message.to_string());
        true
    }

    #[cfg(test)]
    fn state(&self) -> State {
        *self.state.lock()
    }

    /// Did a FLUSH arrive?
    pub fn flushed(&self) -> bool {
        !matches!(
            *self.state.lock(),
            State::Open { .. } | State::Committed { flushed: false }
        )
    }

    /// A FLUSH. Only a change since the last flush commits here (`commit` returns whether
    /// it could: a file removed while open has no name to count); the truncation of an
    /// `O_TRUNC` open waits for the handle's next change or its release (a shell's `> f`
    /// closes a duplicate of the descriptor before writing: one change). True: nothing is
    /// to be committed, so whether the closer still runs decides release or reclaim (tell
    /// [`WriteHandle::closed_by`]).
    pub fn flush(&self, changed: bool, commit: impl FnOnce() -> bool) -> bool {
        let mut st = self.state.lock();
        let (mut dirty, closed_alive) = match *st {
            State::Open { dirty } => (dirty, false),
            State::Flushed {
                dirty,
                closed_alive,
            } => (dirty, closed_alive),
            State::Committed { .. } => (false, false),
        };
        let mut committed = matches!(*st, State::Committed { .. });
        if changed {
            dirty = false;
            committed |= commit();
        }
        *st = if committed {
            State::Committed { flushed: true }
        } else {
            State::Flushed {
                dirty,
                closed_alive,
            }
        };
        !(changed || dirty || committed || self.created)
    }

    /// Whether the task of the last FLUSH of an unchanged handle was still running.
    pub fn closed_by(&self, running: bool) {
        if let State::Flushed { closed_alive, .. } = &mut *self.state.lock() {
            *closed_alive = running;
        }
    }

    /// The RELEASE: a change since the last flush, a pending truncation, or a created file
    /// not committed yet commits now (`commit` as for [`WriteHandle::flush`]). Returns how
    /// the handle ends.
    pub fn release(&self, changed: bool, commit: impl FnOnce() -> bool) -> End {
        let mut st = self.state.lock();
        let (dirty, committed, closed_alive, flushed) = match *st {
            State::Open { dirty } => (dirty, false, false, false),
            State::Flushed {
                dirty,
                closed_alive,
            } => (dirty, false, closed_alive, true),
            State::Committed { flushed } => (false, true, false, flushed),
        };
        if (changed || dirty || (self.created && !committed)) && commit() {
            *st = State::Committed { flushed };
            return End::Committed;
        }
        if committed {
            End::Committed
        } else if closed_alive {
            End::Released
        } else {
            End::MaybeGone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::SessionInfo;
    use std::sync::Arc;

    fn handle(created: bool, dirty: bool) -> WriteHandle {
        let s = Arc::new(SessionInfo::unattributed(0));
        WriteHandle::new(s, "f".into(), 1, created, dirty)
    }

    #[test]
    fn a_truncating_open_commits_at_its_next_change_or_release() {
        let h = handle(false, true);
        // `> f`: the shell closes a duplicate first (unchanged): nothing commits yet.
        assert!(!h.flush(false, || panic!("no commit on an unchanged flush")));
        assert!(h.flushed());
        assert_eq!(h.release(false, || true), End::Committed);
        assert_eq!(h.state(), State::Committed { flushed: true });
    }

    #[test]
    fn an_unchanged_handle_ends_by_how_it_was_closed() {
        let h = handle(false, false);
        assert!(!h.flushed());
        assert!(h.flush(false, || unreachable!()));
        h.closed_by(true);
        assert_eq!(h.release(false, || unreachable!()), End::Released);
        let h = handle(false, false);
        assert!(h.flush(false, || unreachable!()));
        h.closed_by(false);
        assert_eq!(h.release(false, || unreachable!()), End::MaybeGone);
        // Never flushed (FOPEN_NOFLUSH, or the kernel sent none): not known to be closed.
        assert_eq!(
            handle(false, false).release(false, || unreachable!()),
            End::MaybeGone
        );
    }

    #[test]
    fn a_created_file_commits_once() {
        let h = handle(true, false);
        assert!(
            !h.flush(false, || unreachable!()),
            "a created handle has a commit due"
        );
        assert_eq!(h.release(false, || true), End::Committed);
        let h = handle(true, false);
        assert!(!h.flush(true, || true));
        assert_eq!(
            h.release(false, || panic!("committed at the flush already")),
            End::Committed
        );
    }

    #[test]
    fn a_removed_file_commits_nothing() {
        let h = handle(false, false);
        assert!(!h.flush(true, || false));
        assert_eq!(h.release(true, || false), End::MaybeGone);
    }
}
