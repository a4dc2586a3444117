//! What other hosts read of this one: its events (in a step's own transaction, or batched
//! by the publisher thread under a short lease) and the paths changed here outside a step
//! or while etcd was away.

use super::step::counted_further;
use super::*;

impl Etcd {
    /// The lease of new `e/` keys, granted anew when half its life is gone.
    pub(super) fn events_lease(&self, deadline: Instant) -> Option<i64> {
        if let Some((id, at)) = *self.events_lease.lock() {
            if at.elapsed() < Duration::from_secs(EVENTS_TTL as u64 / 2) {
                return Some(id);
            }
        }
        let r = self
            .call(deadline, |mut c| async move {
                c.lease_grant(EVENTS_TTL, None).await
            })
            .ok()?;
        *self.events_lease.lock() = Some((r.id(), Instant::now()));
        Some(r.id())
    }

    pub(super) fn event_op(&self, ev: &Event, lease: i64) -> TxnOp {
        let n = self.next_event.fetch_add(1, Ordering::SeqCst);
        TxnOp::put(
            self.key("e", &format!("{}/{n:020}", self.spec.host)),
            serde_json::to_vec(ev).expect("events serialise"),
            Some(PutOptions::new().with_lease(lease)),
        )
    }

    /// Writes the events of a step to this host's log, durable; `feed`: other hosts have
    /// not had them yet.
    pub(super) fn write_events(&self, evs: Vec<Event>, feed: bool) {
        let last = self.log_events(evs, feed);
        if last > 0 {
            use crate::coherence::EventSink;
            self.journal.wait_durable(last);
        }
    }

    /// [`Etcd::write_events`] without waiting for the disk: for what was decided on this
    /// host alone, which a one-host volume would not wait for either (group commit).
    /// Returns the seq of the last event.
    pub(super) fn log_events(&self, evs: Vec<Event>, feed: bool) -> u64 {
        let mut last = 0;
        for mut ev in evs {
            self.journal.append_kept(&mut ev);
            last = ev.seq;
            if feed {
                self.feed.lock().push(ev);
            }
        }
        last
    }

    pub(super) fn publish_loop(self: Arc<Self>) {
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(self.publish_delay.max(Duration::from_millis(50)));
            if !self.link.lock().caught_up {
                continue;
            }
            self.publish_dirty();
            let batch: Vec<Event> = {
                let mut f = self.feed.lock();
                let n = f.len().min(MAX_TXN_OPS);
                f.drain(..n).collect()
            };
            if batch.is_empty() {
                continue;
            }
            let deadline = Instant::now() + CALL_TIMEOUT;
            let Some(lease) = self.events_lease(deadline) else {
                self.requeue(batch);
                continue;
            };
            let ops: Vec<TxnOp> = batch.iter().map(|ev| self.event_op(ev, lease)).collect();
            let txn = Txn::new().and_then(ops);
            if self
                .call(deadline, |mut c| {
                    let txn = txn.clone();
                    async move { c.txn(txn).await }
                })
                .is_err()
            {
                self.requeue(batch);
            }
        }
    }

    pub(super) fn requeue(&self, batch: Vec<Event>) {
        let mut f = self.feed.lock();
        let rest = std::mem::replace(&mut *f, batch);
        f.extend(rest);
        // Bounded: a long outage drops the oldest events of the feed (never state).
        let n = f.len();
        if n > 100_000 {
            f.drain(..n - 100_000);
        }
    }

    /// Publishes paths changed here while etcd could not be reached (or outside a step).
    /// A path another host changed meanwhile takes that host's state; this host's change
    /// is then found at the next open as a change behind its back.
    pub(super) fn publish_dirty(&self) {
        let paths: Vec<String> = std::mem::take(&mut *self.dirty.lock())
            .into_iter()
            .collect();
        for p in paths {
            let _g = self.steps.lock();
            // No request began this, but a FUSE step may be waiting for this lock: bounded
            // as a request that begins now.
            let deadline = Started::now().deadline(STEP_TIMEOUT);
            let st = self.engine.shared_state(&p);
            let revs = HashMap::from([(
                p.clone(),
                self.link.lock().revs.get(&p).copied().unwrap_or(0),
            )]);
            let r = match self.sync(deadline) {
                Ok(()) => self.publish(&[(p.clone(), st)], &[], &revs, deadline),
                Err(r) => Err(Publish::Unavailable(r)),
            };
            match r {
                Ok(_) => {}
                Err(Publish::Conflict(current, _))
                    if !current.is_empty()
                        && current.iter().all(|(_, cur)| {
                            cur.as_ref().is_some_and(|(theirs, _)| {
                                counted_further(self.engine.shared_state(&p).as_ref(), theirs)
                            })
                        }) =>
                {
                    // Published again over theirs at the next round.
                    let mut l = self.link.lock();
                    for (p, cur) in &current {
                        if let Some((_, mr)) = cur {
                            l.revs.insert(p.clone(), *mr);
                        }
                    }
                    drop(l);
                    self.dirty.lock().insert(p);
                }
                Err(Publish::Conflict(current, rev)) => self.take_in(current, rev),
                Err(Publish::Unavailable(_)) => {
                    self.dirty.lock().insert(p);
                }
            }
        }
    }
}
