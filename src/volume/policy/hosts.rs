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
    pub(super) fn handle_write(&self, w: &WriteHandle, ticket: &mut Ticket) -> Result<(), Refusal> {
        self.coord
            .admits(ticket, &w.path)
            .map_err(|r| r.at(w.path.clone()))?;
        if !self.engine.is_fenced(&w.session, &w.path) {
            return Ok(());
        }
        // The deny text of the contract, from the record that fences this session.
        let text = self
            .engine
            .shared_state(&w.path)
            .and_then(|st| {
                let v = st.version;
                st.records
                    .into_iter()
                    .find(|r| r.is_live(v) && r.giver.name == w.session.name)
            })
            .map_or_else(
                || format!("write denied: {} was handed on by this session", w.path),
                |r| coherence::deny_text(&w.path, &r.successor, r.version_at_transfer),
            );
        Err(Refusal::new(Reason::Fenced, text).at(w.path.clone()))
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
