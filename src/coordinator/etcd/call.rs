//! Calls to etcd from FUSE threads: one call within a deadline, moved once to a member
//! that answers when it fails, and the barrier that waits until this host applied all
//! etcd has.

use super::*;

/// An etcd client error in a few words (the transport's own text is a paragraph).
pub(super) fn short(e: &etcd_client::Error) -> String {
    let t = e.to_string();
    for (needle, say) in [
        ("KeepAliveTimedOut", "no answer (connection timed out)"),
        ("Connection refused", "connection refused"),
        ("timed out", "no answer in time"),
        ("Unavailable", "unavailable"),
    ] {
        if t.contains(needle) {
            return say.to_string();
        }
    }
    t.chars().take(160).collect()
}

impl Etcd {
    pub(super) fn unreachable(&self) -> Refusal {
        let l = self.link.lock();
        let why = l.error.clone().unwrap_or_else(|| "not connected".into());
        unavailable(format!(
            "the coordinator (etcd at {}) cannot be reached: {why}. Nothing was changed; \
             files handed on stay fenced; try again when it is back",
            self.spec.endpoints.join(",")
        ))
    }

    /// One etcd call with a deadline, from a thread outside the runtime.
    /// When a call fails the link moves to a member that answers and the call is made
    /// once more there, within `deadline`.
    pub(super) fn call<T, F, Fut>(&self, deadline: Instant, f: F) -> Result<T, Refusal>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        for attempt in 0..2 {
            self.await_link(deadline)?;
            let (client, generation) = (self.client.lock().clone(), self.link.lock().generation);
            let Some(client) = client else {
                return Err(self.unreachable());
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let fut = f(client);
            let limit = left.min(CALL_TIMEOUT);
            // The timer must be made inside the runtime.
            let why = match self
                .rt
                .block_on(async move { tokio::time::timeout(limit, fut).await })
            {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => short(&e),
                Err(_) => "no answer in time".to_string(),
            };
            let mut l = self.link.lock();
            l.error = Some(why);
            if attempt == 1 {
                break;
            }
            self.relink.notify_one();
            while l.generation == generation || !l.caught_up {
                if self.changed.wait_until(&mut l, deadline).timed_out() {
                    drop(l);
                    return Err(self.unreachable());
                }
            }
        }
        Err(self.unreachable())
    }

    /// A link being made again shortly after a working one broke (a member died, etcd
    /// blinked) is waited for, within `deadline`; a link down for longer fails at once, so
    /// an outage costs the writes that need etcd no time.
    pub(super) fn await_link(&self, deadline: Instant) -> Result<(), Refusal> {
        let mut l = self.link.lock();
        while !l.caught_up {
            let recent = l.down_since.is_some_and(|t| t.elapsed() < STEP_TIMEOUT);
            if !recent || self.changed.wait_until(&mut l, deadline).timed_out() {
                drop(l);
                return Err(self.unreachable());
            }
        }
        Ok(())
    }

    /// Waits until this host has applied everything etcd has now.
    pub(super) fn sync(&self, deadline: Instant) -> Result<(), Refusal> {
        self.await_link(deadline)?;
        // A barrier: this host's own key, written now, comes back through the watch
        // after every change before it.
        let (lease, st) = {
            let l = self.link.lock();
            let st = l.host_state(l.applied);
            (l.lease, st)
        };
        let key = self.key("h", &self.spec.host);
        let value = serde_json::to_vec(&st).expect("host state serialises");
        let r = self.call(deadline, |mut c| {
            let (key, value) = (key.clone(), value.clone());
            async move {
                c.put(key, value, Some(PutOptions::new().with_lease(lease)))
                    .await
            }
        })?;
        let rev = r.header().map_or(0, |h| h.revision());
        let mut l = self.link.lock();
        while l.applied < rev {
            if !l.connected || Instant::now() >= deadline {
                drop(l);
                return Err(self.unreachable());
            }
            self.changed.wait_until(&mut l, deadline);
        }
        Ok(())
    }
}
