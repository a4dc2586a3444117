//! The write policy across hosts (docs/design.md#hosts, docs/multi-host.md): when a
//! write route needs the coordinator, deciding and counting it as one agreed step, and
//! the lease checks of a write handle.

use super::*;

/// A write route across hosts (docs/design.md#hosts): see `coordinator` and
/// docs/multi-host.md.
impl WritePolicy {
    /// The names of `w` when it needs the coordinator (a shared path, or a directory
    /// with shared paths under it); `None` on one host or when nothing is shared.
    pub(super) fn coordinated<'a>(&self, w: &Write<'a>) -> Option<Vec<(&'a str, bool)>> {
        self.coord.host()?;
        let names = w.names();
        self.involves_shared(&names).then_some(names)
    }

    /// Is a name shared, or a directory with shared paths under it? (One host: never,
    /// at no cost.)
    pub(super) fn involves_shared(&self, names: &[(&str, bool)]) -> bool {
        self.coord.is_shared()
            && names.iter().any(|(p, dir)| {
                self.coord.shared(&self.engine, p)
                    || (*dir && !self.engine.paths_with_records(p).is_empty())
            })
    }

    /// Decides a write route touching shared paths as one agreed step (of the request
    /// that `started` then).
    pub(super) fn admit(
        &self,
        who: &Result<Session, Session>,
        names: &[(&str, bool)],
        w: Write<'_>,
        started: Started,
        decide: impl Fn(&Engine) -> Result<Permit, (Session, Refusal)>,
    ) -> Result<Permit, (Session, Refusal)> {
        let mut out = None;
        let stepped = self
            .coord
            .step(&self.engine, names, StepKind::Admit, started, &mut |e| {
                let d = decide(e);
                let ok = d.is_ok();
                out = Some(d);
                ok
            });
        let s = match who {
            Ok(s) | Err(s) => s.clone(),
        };
        match stepped {
            Ok(_) => out.expect("the step ran the decision"),
            Err(r) => {
                let p = w.names().first().map_or("", |x| x.0).to_string();
                let r = r.at(p.clone());
                let text =
                    format!(
                    "write denied: {p_q} has a handoff record and the hosts cannot agree on it \
                     now: {}",
                    r.message, p_q = crate::names::display_name(&p));
                Err((s, Refusal { message: text, ..r }))
            }
        }
    }

    /// Runs `f` (engine calls counting what a write route or handle did to `names`, made
    /// through the engine it is given) as an agreed step when a name is shared, for the
    /// request that `started` then.
    pub(super) fn counted(&self, names: &[(&str, bool)], started: Started, f: impl Fn(&Engine)) {
        if !self.involves_shared(names) {
            f(&self.engine);
            return;
        }
        // A conflict undoes `f` and runs it again on the newer state.
        let r = self
            .coord
            .step(&self.engine, names, StepKind::Commit, started, &mut |e| {
                f(e);
                true
            });
        if let Err(r) = r {
            tracing::warn!("a change of {:?} was not agreed: {}", names[0].0, r.message);
        }
    }

    /// May write handle `w` (admitted under `ticket`) write now? This host's lease and the
    /// path's epoch ([`Coordinator::admits`]), then the fence as this host knows it now.
    ///
    /// `now` is the path the handle's file has now: a handle opened under another name
    /// (`side.md`, then renamed over the handed path) writes that path's file, so both
    /// names are checked.
    pub(super) fn handle_write(
        &self,
        w: &WriteHandle,
        now: Option<&str>,
        ticket: &mut Ticket,
    ) -> Result<(), Refusal> {
        // The ticket follows the file: its epoch is the path's it writes now (after a
        // rename under another lease the two differ, and the write is refused).
        let here = now.unwrap_or(&w.path);
        self.coord
            .admits(ticket, here)
            .map_err(|r| r.at(here.to_string()))?;
        for p in [w.path.as_str(), here] {
            if self.engine.is_fenced(&w.session, p) {
                return Err(self.fenced_write(w, p));
            }
        }
        Ok(())
    }

    /// The refusal of a write by a fenced giver through its handle on `p`: the deny text of
    /// the contract, from the record that fences it.
    fn fenced_write(&self, w: &WriteHandle, p: &str) -> Refusal {
        let text = self
            .engine
            .shared_state(p)
            .and_then(|st| {
                let v = st.version;
                st.records
                    .into_iter()
                    .find(|r| r.is_live(v) && r.giver.name == w.session.name)
            })
            .map_or_else(
                || format!("write denied: {p} was handed on by this session"),
                |r| coherence::deny_text(p, &r.successor, r.version_at_transfer),
            );
        Refusal::new(Reason::Fenced, text).at(p.to_string())
    }

    /// Refuses an agent write while this host cannot confirm its lease (see
    /// [`Coordinator::confirmed`]): `None` when the write may go on.
    pub(super) fn unconfirmed(
        &self,
        who: &Result<Session, Session>,
        w: &Write<'_>,
    ) -> Option<(Session, Refusal)> {
        let r = self.coord.confirmed().err()?;
        let s = match who {
            // Unattributed processes are never givers: they keep writing.
            Ok(s) if !s.is_attributed() => return None,
            Ok(s) | Err(s) => s.clone(),
        };
        // A giver fenced on the path hears `fenced` (the deny text and its ways out): the
        // engine refuses it on what this host knows, which a lost lease cannot make laxer.
        if w.names().iter().any(|(p, _)| self.engine.is_fenced(&s, p)) {
            return None;
        }
        let p = w.names().first().map_or("", |x| x.0).to_string();
        Some((s, r.at(p)))
    }
}
