//! One step over shared paths as this host runs it: tried on its own state with the
//! events held back, decided here when nothing shared changes, else published in a
//! transaction that compares revisions (undone on a conflict) and acknowledged by every
//! live host.

use super::*;

/// See [`SharedPath::counted_further`].
pub(super) fn counted_further(mine: Option<&SharedPath>, theirs: &SharedPath) -> bool {
    mine.is_some_and(|m| m.counted_further(theirs))
}

/// Where the events of a step wait, in order and not yet numbered, while the hosts agree
/// on it: the journal numbers them once it is agreed; an undone step drops them.
struct Held {
    host: String,
    events: Mutex<Vec<Event>>,
}

impl EventSink for Held {
    fn append(&self, ev: &mut Event) {
        // Named before the engine applies it, as the tap names every other event.
        ev.host = Some(self.host.clone());
        self.events.lock().push(ev.clone());
    }

    /// A step's events are durable once the step is published (or written here).
    fn wait_durable(&self, _seq: u64) {}
}

/// What etcd holds for a path now: its state and mod revision (`None`: no key).
pub(super) type Current = Option<(SharedPath, i64)>;

pub(super) enum Publish {
    /// Another host changed one of the paths first: what is there now, to take in
    /// once the step is undone, and the revision it was read at.
    Conflict(Vec<(String, Current)>, i64),
    Unavailable(Refusal),
}

/// Record ids past every revision seen (see [`Engine::raise_record_ids`]).
pub(super) fn id_floor(rev: i64) -> u64 {
    (rev.max(0) as u64 + 1) << 20
}

impl Etcd {
    /// `paths`, and for a directory every shared path under it.
    pub(super) fn expand(&self, paths: &[(&str, bool)]) -> Vec<String> {
        let mut out = BTreeSet::new();
        for (p, dir) in paths {
            out.insert(p.to_string());
            if *dir {
                out.extend(self.engine.paths_with_records(p));
                let pre = format!("{p}/");
                let l = self.link.lock();
                out.extend(l.revs.keys().filter(|k| k.starts_with(&pre)).cloned());
            }
        }
        out.into_iter().collect()
    }

    /// A write route or a count that changes nothing the hosts share (the successor's next
    /// open of a file it has completed, a bystander's open of one already overtaken, the
    /// release of a hold) is decided on this host's state alone, with no round trip to
    /// etcd: while this host's lease is confirmed, every transfer another host had
    /// acknowledged is applied here (the acknowledgement waits for it), so the fence is as
    /// exact as after a catch-up. `None` (and nothing changed): the step must be agreed, or
    /// the decision refused the write (a refusal is decided again on the newest state, so
    /// it is never a stale one).
    ///
    /// A commit of a path whose records have all ended changes only its version and stamp:
    /// no fence hangs on that, so it is counted here too and published by the publisher
    /// (as after an outage). Another host's step on the path meanwhile wins, and this
    /// change is then found there as a change behind the volume's back.
    pub(super) fn decided_here(
        &self,
        paths: &[(&str, bool)],
        kind: StepKind,
        op: &mut dyn FnMut(&Engine) -> bool,
    ) -> Option<Stepped> {
        self.confirmed().ok()?;
        let t = self.tried(paths, &self.expand(paths), op);
        let counted_only = kind == StepKind::Commit
            && t.changed.iter().all(|(p, now)| {
                let was = t.before.get(p).cloned().flatten();
                matches!((was, now), (Some(w), Some(n)) if w.counts_apart(n))
            });
        if !t.ok || !(t.changed.is_empty() || counted_only) {
            self.undo(t.saved, &t.added);
            return None;
        }
        self.dirty
            .lock()
            .extend(t.changed.into_iter().map(|(p, _)| p));
        self.log_events(t.evs, true);
        self.local.fetch_add(1, Ordering::Relaxed);
        Some(Stepped {
            ok: true,
            ..Default::default()
        })
    }

    /// Runs a step's operation once on this host's state, its events kept back (`names`:
    /// the step's paths as expanded before it ran).
    pub(super) fn tried(
        &self,
        paths: &[(&str, bool)],
        names: &[String],
        op: &mut dyn FnMut(&Engine) -> bool,
    ) -> Tried {
        let saved = self.engine.save(names);
        let before: HashMap<String, Option<SharedPath>> = names
            .iter()
            .map(|p| (p.clone(), self.engine.shared_state(p)))
            .collect();
        let (ok, evs) = captured(&self.engine, &self.spec.host, op);
        let mut added = self.expand(paths);
        added.retain(|p| !before.contains_key(p));
        let changed = names
            .iter()
            .chain(added.iter())
            .filter_map(|p| {
                let now = self.engine.shared_state(p);
                let was = before.get(p).cloned().flatten();
                (now != was).then(|| (p.clone(), now))
            })
            .collect();
        Tried {
            ok,
            evs,
            before,
            changed,
            saved,
            added,
        }
    }

    /// Undoes what [`Etcd::tried`] changed here.
    pub(super) fn undo(&self, saved: Saved, added: &[String]) {
        self.engine.restore(saved);
        self.engine.restore(Saved::absent(added));
    }

    /// Publishes the new shared state of `changed` if nobody changed them since this host
    /// took them in. On a conflict the newer state is taken in.
    pub(super) fn publish(
        &self,
        changed: &[(String, Option<SharedPath>)],
        evs: &[Event],
        revs: &HashMap<String, i64>,
        deadline: Instant,
    ) -> Result<(i64, bool), Publish> {
        let mut when = Vec::new();
        let mut then = Vec::new();
        let mut or_else = Vec::new();
        // The step's events go with its state, so another host logs them before anything
        // that follows (when they fit; else the feed carries them).
        let fits = !evs.is_empty() && changed.len() + evs.len() <= MAX_TXN_OPS;
        let lease = fits.then(|| self.events_lease(deadline)).flatten();
        if let Some(lease) = lease {
            then.extend(evs.iter().map(|ev| self.event_op(ev, lease)));
        }
        {
            for (i, (p, st)) in changed.iter().enumerate() {
                let k = self.key("p", p);
                // The revision this host decided on (taken before the step ran).
                let rev = revs.get(p).copied().unwrap_or(0);
                when.push(Compare::mod_revision(k.clone(), CompareOp::Equal, rev));
                then.insert(
                    i,
                    match st {
                        Some(s) => {
                            let value = serde_json::to_vec(s).expect("state serialises");
                            self.link.lock().publishing.insert(p.clone(), value.clone());
                            TxnOp::put(k.clone(), value, None)
                        }
                        None => TxnOp::delete(k.clone(), None),
                    },
                );
                or_else.push(TxnOp::get(k, None));
            }
        }
        let txn = Txn::new().when(when).and_then(then).or_else(or_else);
        let resp = self.call(deadline, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        });
        // In the same hold of the lock as the revisions below: the watch skips this
        // host's put until then, and from then on by its revision.
        let mut l = self.link.lock();
        for (p, _) in changed {
            l.publishing.remove(p);
        }
        let resp = resp.map_err(Publish::Unavailable)?;
        let rev = resp.header().map_or(0, |h| h.revision());
        if resp.succeeded() {
            for (p, st) in changed {
                if st.is_some() {
                    let r = l.revs.entry(p.clone()).or_insert(0);
                    *r = (*r).max(rev);
                } else {
                    l.forget(p, rev);
                }
            }
            drop(l);
            self.engine.raise_record_ids(id_floor(rev));
            return Ok((rev, lease.is_some()));
        }
        drop(l);
        let mut now = Vec::new();
        for (i, op) in resp.op_responses().into_iter().enumerate() {
            let TxnOpResponse::Get(g) = op else { continue };
            let cur = g.kvs().first().and_then(|kv| {
                let st = serde_json::from_slice::<SharedPath>(kv.value()).ok()?;
                Some((st, kv.mod_revision()))
            });
            now.push((changed[i].0.clone(), cur));
        }
        Err(Publish::Conflict(now, rev))
    }

    /// Takes in what etcd holds for paths (after a step was undone), as read at `rev`.
    /// The watch skips these revisions later, so what it would find is found here.
    pub(super) fn take_in(&self, current: Vec<(String, Current)>, rev: i64) {
        for (p, cur) in current {
            let (st, at) = match cur {
                Some((st, r)) => (Some(st), r),
                None => (None, rev),
            };
            let put = st.is_some();
            let (in_flight, newer, publish) = self.adopt_here(&p, st);
            let mut l = self.link.lock();
            if put {
                l.revs.insert(p.clone(), at);
            } else {
                l.forget(&p, at);
            }
            l.report(&p, in_flight, newer);
            drop(l);
            if publish && put {
                self.dirty.lock().insert(p);
            }
        }
    }

    /// Takes in another host's state of `path` beside this host's copy (read when the
    /// engine does not know the fingerprint of a version counted here). Returns the new
    /// live records found in flight here (their giver writes the file on this host, under
    /// any name), those over a version of this copy their giver did not see, and whether
    /// this host's state of the path is to be published (its copy counted again, or its
    /// count further than theirs).
    pub(super) fn adopt_here(
        &self,
        path: &str,
        st: Option<SharedPath>,
    ) -> (Vec<u64>, Vec<u64>, bool) {
        let copy = match (&st, self.engine.own_copy(path), self.copy.get()) {
            (Some(s), Some(own), Some(probe))
                if own.print.is_none()
                    && (own.version >= s.version
                        || s.records.iter().any(|r| r.is_live(s.version))) =>
            {
                probe(path)
            }
            _ => None,
        };
        let givers: HashMap<u64, String> = st
            .iter()
            .flat_map(|s| s.records.iter())
            .map(|r| (r.id, r.giver.name.clone()))
            .collect();
        let taken = self.engine.adopt_beside(path, st, copy, Timestamp::now());
        if taken.recounted {
            tracing::info!(
                path,
                version = self.engine.version(path),
                "this host's copy holds a version counted here that another host's state does \
                 not know: counted again after it"
            );
        }
        // A new record whose giver has the file open for writing here under another
        // name (or since before it was tracked) is in flight all the same: the engine
        // knows the giver's handles by name only.
        let writes = |id: &u64| {
            self.writers
                .get()
                .is_some_and(|probe| givers.get(id).is_some_and(|g| probe(path, g)))
        };
        let in_flight = taken
            .records
            .iter()
            .filter(|t| t.writing || writes(&t.id))
            .map(|t| t.id)
            .collect();
        let newer: Vec<u64> = taken
            .records
            .iter()
            .filter(|t| t.newer)
            .map(|t| t.id)
            .collect();
        if !newer.is_empty() {
            tracing::info!(
                path,
                records = ?newer,
                "a transfer made on another host over a version of this host's copy its giver \
                 did not see: reported, to be undone (handoff_not_held)"
            );
        }
        (in_flight, newer, taken.recounted || taken.kept)
    }

    /// After a step was undone without knowing what etcd holds: a path another host
    /// changed meanwhile (the watch took it in, the undo put the older one back) is
    /// marked so its next publication conflicts and takes the state in.
    pub(super) fn distrust(&self, revs: &HashMap<String, i64>) {
        let mut l = self.link.lock();
        for (p, r) in revs {
            if let Some(cur) = l.revs.get_mut(p) {
                if *cur != *r {
                    *cur = -1;
                }
            }
        }
    }

    /// Waits until every other live host applied revision `rev` (or left: its lease
    /// ended), within the budget of the request that `started` the step. Returns the
    /// records some host found in flight, and those some host found over a newer version
    /// of its copy (with that host).
    #[allow(clippy::type_complexity)]
    pub(super) fn wait_acks(
        &self,
        rev: i64,
        made: &[(String, u64)],
        started: Started,
    ) -> Result<(Vec<(String, u64)>, Vec<(String, u64, String)>), Refusal> {
        let deadline = started.deadline(self.spec.ttl + STEP_TIMEOUT);
        let mut l = self.link.lock();
        loop {
            let found: Vec<(String, u64)> = l
                .hosts
                .values()
                .flat_map(|h| h.in_flight.iter())
                .filter(|x| made.contains(x))
                .cloned()
                .collect();
            let newer: Vec<(String, u64, String)> = l
                .hosts
                .iter()
                .flat_map(|(n, h)| h.newer.iter().map(move |x| (x, n)))
                .filter(|(x, _)| made.contains(x))
                .map(|((p, id), n)| (p.clone(), *id, n.clone()))
                .collect();
            if !found.is_empty() || !newer.is_empty() {
                return Ok((found, newer));
            }
            let behind: Vec<String> = l
                .hosts
                .iter()
                .filter(|(n, h)| **n != self.spec.host && h.applied < rev)
                .map(|(n, _)| n.clone())
                .collect();
            if behind.is_empty() {
                return Ok(Default::default());
            }
            if Instant::now() >= deadline || !l.connected {
                // `pending`: recorded, not acknowledged; a client sends it again.
                return Err(unavailable(format!(
                    "the handoff is recorded but host(s) {} have not confirmed it: until they \
                     do or their lease ends, the fence may not hold there. Run the same \
                     transfer again to wait once more",
                    behind.join(", ")
                ))
                .with_status(crate::error::Status::Pending));
            }
            self.changed.wait_until(&mut l, deadline);
        }
    }
}

/// Runs `op` on a view of `engine` that keeps its events; returns them with its answer.
fn captured(
    engine: &Engine,
    host: &str,
    op: &mut dyn FnMut(&Engine) -> bool,
) -> (bool, Vec<Event>) {
    let held = Arc::new(Held {
        host: host.to_string(),
        events: Mutex::new(Vec::new()),
    });
    let ok = op(&engine.with_sink(held.clone()));
    let evs = std::mem::take(&mut *held.events.lock());
    (ok, evs)
}
