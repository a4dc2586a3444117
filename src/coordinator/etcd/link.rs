//! The link to etcd, on the coordinator's runtime: connect to a member that answers, take
//! a lease and renew it, register this host, take the shared state in (at start, or from
//! the revision it had), and apply the watch as it arrives.

use super::call::short;
use super::step::id_floor;
use super::*;

impl Etcd {
    pub(super) async fn run_link(self: Arc<Self>) {
        while !self.stop.load(Ordering::SeqCst) {
            let err = self.clone().link_once().await.err();
            let was_up;
            {
                let mut l = self.link.lock();
                was_up = l.connected;
                if was_up {
                    l.down_since = Some(Instant::now());
                }
                if l.connected || l.error.is_none() {
                    if let Some(e) = &err {
                        tracing::warn!("coordinator {}: {e}", self.spec.endpoints.join(","));
                    }
                    l.since = Some(Timestamp::now());
                }
                l.connected = false;
                l.caught_up = false;
                // Whatever the lease's time left, this host can no longer show that it
                // holds it: agent writes wait for the next link (docs/multi-host.md).
                l.confirmed_until = None;
                l.error = err;
            }
            *self.client.lock() = None;
            self.changed.notify_all();
            // At once after a working link broke (another member may answer), then
            // every 300 ms.
            let pause = if was_up {
                Duration::ZERO
            } else {
                Duration::from_millis(300)
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.stopped.notified() => {}
            }
        }
    }

    /// One connection: lease, registration, watch, renewals, until something fails.
    pub(super) async fn link_once(self: Arc<Self>) -> Result<(), String> {
        let mut client = self.connect_one().await?;
        let ttl = self.spec.ttl.as_secs() as i64;
        // Lease times are on the boot clock: a suspend in between counts (see `boot`).
        let granted_at = BootTime::now();
        let lease = timed(client.lease_grant(ttl, None))
            .await
            .map_err(|e| format!("lease: {}", short(&e)))?
            .id();
        let (mut keeper, mut renewals) = timed(client.lease_keep_alive(lease))
            .await
            .map_err(|e| format!("lease renewal: {}", short(&e)))?;
        let resume = self.link.lock().applied;
        let (start, from) = if resume == 0 {
            let loaded = self.load(&mut client).await?;
            // The other hosts' events since the last one in this log (a restart, or the
            // history compacted under a link that was away) are read from etcd's history.
            // A log that has none of theirs yet but has run before reads all there is; a new
            // one starts at its join.
            let logged = self.engine.peer_rev();
            let from = if logged > 0 && logged < loaded {
                logged + 1
            } else if logged == 0 && self.engine.last_seq() > 0 {
                1
            } else {
                loaded + 1
            };
            (loaded, from)
        } else {
            (resume, resume + 1)
        };
        // Registered (acknowledgements wait for this host) before catching up.
        let reg = self.put_host(&mut client, lease, start).await?;
        let mut watch = timed(client.watch(
            self.prefix.clone(),
            Some(WatchOptions::new().with_prefix().with_start_revision(from)),
        ))
        .await
        .map_err(|e| format!("watch: {}", short(&e)))?;
        *self.client.lock() = Some(client.clone());
        {
            let mut l = self.link.lock();
            l.connected = true;
            l.refused = false;
            l.error = None;
            l.lease = lease;
        }
        // The stream is read as it comes (each response with the time it arrived), so a
        // lagging applier (the test hook) is late by its delay, never slower.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            loop {
                let m = watch.message().await;
                let end = !matches!(m, Ok(Some(_)));
                if tx.send((Instant::now(), m)).is_err() || end {
                    return;
                }
            }
        });
        let _stop_reader = AbortOnDrop(reader);
        let mut renew = tokio::time::interval(self.spec.ttl / 4);
        let mut sent = granted_at;
        loop {
            tokio::select! {
                got = rx.recv() => {
                    let (at, msg) = got.ok_or_else(|| "watch ended".to_string())?;
                    let resp = msg
                        .map_err(|e| format!("watch: {}", short(&e)))?
                        .ok_or_else(|| "watch ended".to_string())?;
                    if resp.canceled() {
                        if resp.compact_revision() > 0 {
                            // History gone: name the gap in the other hosts' events, and
                            // take the state in again on the next link.
                            self.events_missed(from, resp.compact_revision() - 1);
                            self.link.lock().applied = 0;
                        }
                        return Err(format!("watch canceled: {}", resp.cancel_reason()));
                    }
                    if !self.apply_delay.is_zero() {
                        tokio::time::sleep_until((at + self.apply_delay).into()).await;
                    }
                    self.apply(&resp, &mut client, lease, reg, sent).await?;
                }
                _ = renew.tick() => {
                    sent = BootTime::now();
                    timed(keeper.keep_alive()).await.map_err(|e| format!("lease renewal: {}", short(&e)))?;
                    let r = tokio::time::timeout(CALL_TIMEOUT, renewals.message())
                        .await
                        .map_err(|_| "lease renewal: timed out".to_string())?
                        .map_err(|e| format!("lease renewal: {}", short(&e)))?
                        .ok_or_else(|| "lease renewal stream ended".to_string())?;
                    if r.ttl() <= 0 {
                        return Err("this host's lease expired".into());
                    }
                    let mut l = self.link.lock();
                    if l.caught_up {
                        l.confirmed_until = Some(sent + self.spec.ttl - self.margin());
                    }
                }
                _ = self.relink.notified() => return Err("a call failed; finding a member that answers".into()),
                _ = self.stopped.notified() => return Ok(()),
            }
        }
    }

    /// A client of the first member (from the last good one on) that answers a
    /// linearizable read, i.e. is part of a quorum. One member at a time: a client
    /// balancing over several keeps sending to a dead one.
    pub(super) async fn connect_one(&self) -> Result<Client, String> {
        let n = self.spec.endpoints.len();
        let first = self.good.load(Ordering::SeqCst);
        let mut why = String::new();
        // A member that refused the credentials says more than one that is away.
        let mut refusal = None;
        self.link.lock().refused = false;
        for i in 0..n {
            let k = (first + i) % n;
            let ep = &self.spec.endpoints[k];
            let opts = self.spec.connect_options(
                ConnectOptions::new()
                    .with_connect_timeout(CALL_TIMEOUT)
                    .with_timeout(CALL_TIMEOUT)
                    .with_keep_alive(Duration::from_millis(500), Duration::from_secs(1)),
            );
            let connected = tokio::time::timeout(
                CALL_TIMEOUT,
                Client::connect([self.spec.endpoint_url(ep)], Some(opts)),
            )
            .await;
            let mut c = match connected {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    match self.refused(ep, &e) {
                        Some(r) => refusal = Some(r),
                        None => why = format!("{ep}: {}", short(&e)),
                    }
                    continue;
                }
                Err(_) => {
                    why = format!("{ep}: no answer in time");
                    continue;
                }
            };
            let probe = GetOptions::new().with_prefix().with_count_only();
            match timed(c.get(self.key("h", ""), Some(probe))).await {
                Ok(_) => {
                    self.good.store(k, Ordering::SeqCst);
                    return Ok(c);
                }
                Err(e) => match self.refused(ep, &e) {
                    Some(r) => refusal = Some(r),
                    None => why = format!("{ep}: {}", short(&e)),
                },
            }
        }
        Err(refusal.unwrap_or(why))
    }

    /// When etcd answered but refused this mount's credentials or certificates (not a
    /// member that is away): what to fix, and the link marks itself refused so a mount
    /// that is starting says so at once instead of waiting.
    fn refused(&self, ep: &str, e: &etcd_client::Error) -> Option<String> {
        // The whole chain: a TLS failure is in the transport error's sources.
        let mut text = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            text.push_str(": ");
            text.push_str(&s.to_string());
            src = s.source();
        }
        let file = self
            .spec
            .auth
            .as_ref()
            .map_or("(none)".to_string(), |a| a.file.display().to_string());
        let fix = if text.contains("authentication failed") || text.contains("user name is empty") {
            format!("check user= and password= in --coordinator-auth {file}")
        } else if text.contains("permission denied") {
            format!(
                "the etcd user of --coordinator-auth {file} may not use /coherent/{}/: grant \
                 its role readwrite on that prefix",
                self.spec.volume
            )
        } else if text.contains("certificate") || text.contains("InvalidCertificate") {
            format!("check ca=, cert= and key= in --coordinator-auth {file}")
        } else {
            return None;
        };
        self.link.lock().refused = true;
        // etcd's or TLS's own words (the status message), not the whole error chain.
        let what: String = match text.split_once("message: \"") {
            Some((_, m)) => m.split('"').next().unwrap_or(m).to_string(),
            None => text.chars().take(200).collect(),
        };
        Some(format!("{ep} refused this mount: {what}; {fix}"))
    }

    /// Takes in every shared path and session and the live hosts; returns the revision.
    pub(super) async fn load(&self, client: &mut Client) -> Result<i64, String> {
        let get = |kind: &str, rev: i64| {
            let mut o = GetOptions::new().with_prefix();
            if rev > 0 {
                o = o.with_revision(rev);
            }
            (self.key(kind, ""), o)
        };
        let (k, o) = get("p", 0);
        let paths = timed(client.get(k, Some(o)))
            .await
            .map_err(|e| format!("load: {}", short(&e)))?;
        let rev = paths.header().map_or(0, |h| h.revision());
        let (k, o) = get("s", rev);
        let sessions = timed(client.get(k, Some(o)))
            .await
            .map_err(|e| format!("load: {}", short(&e)))?;
        let (k, o) = get("h", rev);
        let hosts = timed(client.get(k, Some(o)))
            .await
            .map_err(|e| format!("load: {}", short(&e)))?;
        let mut seen = BTreeSet::new();
        for kv in paths.kvs() {
            let Some(p) = kv
                .key_str()
                .ok()
                .and_then(|k| k.strip_prefix(&self.key("p", "")))
            else {
                continue;
            };
            let Ok(st) = serde_json::from_slice::<SharedPath>(kv.value()) else {
                tracing::warn!("coordinator: unreadable state of {p}; ignored");
                continue;
            };
            seen.insert(p.to_string());
            let (in_flight, newer, publish) = self.adopt_here(p, Some(st));
            let mut l = self.link.lock();
            l.revs.insert(p.to_string(), kv.mod_revision());
            l.report(p, in_flight, newer);
            drop(l);
            if publish {
                self.dirty.lock().insert(p.to_string());
            }
        }
        // Keys this host had that are gone now (deleted while it was not watching): their
        // state goes too, or the loop below would publish evicted records again.
        let stale: Vec<String> = {
            let mut l = self.link.lock();
            let stale: Vec<String> = l
                .revs
                .keys()
                .filter(|p| !seen.contains(*p))
                .cloned()
                .collect();
            for p in &stale {
                l.revs.remove(p);
                l.aged.remove(p);
            }
            stale
        };
        for p in stale {
            self.engine.adopt(&p, None);
        }
        // Records this host has and etcd has not: a volume used alone before publishes
        // them; one that took part before (it logged other hosts' events) was away while
        // another host evicted them (its own log does not say so: the removal was taken
        // in, not logged), and drops them, or they would come back to life everywhere.
        let coordinated = self.engine.peer_rev() > 0;
        for p in self.engine.paths_with_records("") {
            if seen.contains(&p) {
                continue;
            }
            if coordinated {
                self.engine.adopt(&p, None);
            } else {
                self.dirty.lock().insert(p);
            }
        }
        for kv in sessions.kvs() {
            if let Ok(s) = serde_json::from_slice::<SharedSession>(kv.value()) {
                self.engine.adopt_session(s);
            }
        }
        let mut l = self.link.lock();
        l.hosts.clear();
        for kv in hosts.kvs() {
            if let (Ok(k), Ok(h)) = (kv.key_str(), serde_json::from_slice(kv.value())) {
                if let Some(name) = k.strip_prefix(&self.key("h", "")) {
                    l.hosts.insert(name.to_string(), h);
                }
            }
        }
        l.applied = rev;
        l.loaded_at = rev;
        // Keys made and deleted while this host was not watching are not known here: every
        // path without a key takes an epoch past them.
        l.gone.clear();
        l.gone_floor = rev;
        drop(l);
        self.engine.raise_record_ids(id_floor(rev));
        Ok(rev)
    }

    pub(super) async fn put_host(
        &self,
        client: &mut Client,
        lease: i64,
        applied: i64,
    ) -> Result<i64, String> {
        let st = self.link.lock().host_state(applied);
        let v = serde_json::to_vec(&st).expect("host state serialises");
        let r = timed(client.put(
            self.key("h", &self.spec.host),
            v,
            Some(PutOptions::new().with_lease(lease)),
        ))
        .await
        .map_err(|e| format!("register this host: {}", short(&e)))?;
        Ok(r.header().map_or(0, |h| h.revision()))
    }

    /// Takes in one watch response, then tells the others how far this host is.
    pub(super) async fn apply(
        &self,
        resp: &etcd_client::WatchResponse,
        client: &mut Client,
        lease: i64,
        reg: i64,
        sent: BootTime,
    ) -> Result<(), String> {
        // How far this response brings this host: the newest event in it. Not its
        // header, which may name a later revision whose events are still to come; nor a
        // progress notice, which etcd 3.4 sends without waiting for the events before it.
        let rev = resp
            .events()
            .iter()
            .filter_map(|e| e.kv())
            .map(|kv| kv.mod_revision())
            .max()
            .unwrap_or(0);
        let mut state_changed = false;
        let loaded_at = self.link.lock().loaded_at;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let Some(rest) = kv.key_str().ok().and_then(|k| k.strip_prefix(&self.prefix)) else {
                continue;
            };
            let Some((kind, name)) = rest.split_once('/') else {
                continue;
            };
            if kind != "e" && kv.mod_revision() <= loaded_at {
                continue; // history read for the events alone: the state is in already
            }
            let put = ev.event_type() == EventType::Put;
            match kind {
                "p" => {
                    state_changed = true;
                    let mr = kv.mod_revision();
                    {
                        let l = self.link.lock();
                        if l.revs.get(name).is_some_and(|r| *r >= mr)
                            || l.publishing.get(name).is_some_and(|v| v == kv.value())
                        {
                            continue; // this host's own change, already here
                        }
                    }
                    let st = if put {
                        match serde_json::from_slice::<SharedPath>(kv.value()) {
                            Ok(s) => Some(s),
                            Err(_) => continue,
                        }
                    } else {
                        None
                    };
                    if !self.adopt_delay.is_zero() {
                        tokio::time::sleep(self.adopt_delay).await;
                    }
                    let (in_flight, newer, publish) = self.adopt_here(name, st);
                    let mut l = self.link.lock();
                    if put {
                        l.revs.insert(name.to_string(), mr);
                    } else {
                        // A delete's kv carries the revision of the deletion.
                        let at = if mr > 0 { mr } else { rev };
                        l.forget(name, at);
                    }
                    l.report(name, in_flight, newer);
                    drop(l);
                    if publish && put {
                        self.dirty.lock().insert(name.to_string());
                    }
                }
                "s" if put => {
                    state_changed = true;
                    if let Ok(s) = serde_json::from_slice::<SharedSession>(kv.value()) {
                        // This host's own claim logs `session_seen` itself.
                        if s.host.as_deref() != Some(&self.spec.host) {
                            self.engine.adopt_session(s);
                        }
                    }
                }
                "h" => {
                    let mut l = self.link.lock();
                    if put {
                        if let Ok(h) = serde_json::from_slice(kv.value()) {
                            l.hosts.insert(name.to_string(), h);
                        }
                    } else {
                        l.hosts.remove(name);
                    }
                }
                "e" if put => {
                    let Some((host, _)) = name.rsplit_once('/') else {
                        continue;
                    };
                    if host == self.spec.host {
                        continue;
                    }
                    if let Ok(mut e) = serde_json::from_slice::<Event>(kv.value()) {
                        e.host = Some(host.to_string());
                        e.rev = Some(kv.mod_revision());
                        self.journal.append_kept(&mut e);
                        self.engine.note_peer_rev(kv.mod_revision());
                    }
                }
                _ => {}
            }
        }
        let (first, applied) = {
            let mut l = self.link.lock();
            l.applied = l.applied.max(rev);
            (!l.caught_up && l.applied >= reg, l.applied)
        };
        self.engine.raise_record_ids(id_floor(applied));
        if state_changed || first {
            self.put_host(client, lease, applied).await?;
        }
        if first {
            let mut l = self.link.lock();
            l.caught_up = true;
            l.generation += 1;
            l.down_since = None;
            l.confirmed_until = Some(sent + self.spec.ttl - self.margin());
        }
        self.changed.notify_all();
        Ok(())
    }
}

/// Ends a runtime task when dropped (the watch reader of a link that ended).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One etcd call from inside the runtime, bounded.
pub(super) async fn timed<T>(
    f: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, etcd_client::Error> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r,
        Err(_) => Err(etcd_client::Error::InvalidArgs("timed out".into())),
    }
}

impl Etcd {
    /// Names in this host's log the other hosts' events it may lack, revisions `from` to
    /// `to`: etcd's history of them was compacted before this host read it.
    fn events_missed(&self, from: i64, to: i64) {
        if to < from {
            return;
        }
        let mut ev = Event::new(EventKind::EventsMissed, Timestamp::now(), None, None);
        ev.from_rev = Some(from);
        ev.rev = Some(to);
        ev.note = Some(format!(
            "other hosts' events between etcd revisions {from} and {to} may be missing from \
             this log: etcd compacted its history before this host read it (state is \
             unaffected: it is taken in from etcd)"
        ));
        tracing::warn!("coordinator: {}", ev.note.as_deref().unwrap_or_default());
        self.journal.append_kept(&mut ev);
        self.engine.note_peer_rev(to);
    }
}
