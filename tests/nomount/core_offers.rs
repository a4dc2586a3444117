//! Offers to anyone (docs/design.md#handoff): `transfer --to any`, claimed by the first `accept`.

use crate::core_common;
use coherent::coherence::*;
use coherent::error::Reason;
use coherent::journal::{Journal, JournalOptions};
use coherent::names::{check_session_name, BadName, ANY};
use core_common::*;
use std::sync::{Arc, Barrier};

/// alice wrote plan.md and offers it to anyone; bob and carol are known.
fn offered() -> (H, Vec<coherent::identity::Session>) {
    let mut h = H::new();
    let (a, b, c) = (sess("alice"), sess("bob"), sess("carol"));
    for s in [&a, &b, &c] {
        let t = h.t();
        h.e.register(s, t).unwrap();
    }
    h.write(&a, "plan.md").unwrap();
    let r = h.transfer(&a, &["plan.md"], ANY).unwrap();
    let rec = &r.records[0];
    assert_eq!(rec.successor, ANY);
    assert!(rec.offer && rec.live && rec.claimed_by.is_none());
    assert_eq!(rec.status, Status::Pending);
    (h, vec![a, b, c])
}

#[test]
fn any_is_never_a_session_name() {
    assert_eq!(check_session_name(ANY), Err(BadName::Any));
}

#[test]
fn an_offer_is_in_every_inbox_but_the_givers_and_fences_the_giver() {
    let (mut h, s) = offered();
    let (a, b, c) = (&s[0], &s[1], &s[2]);
    assert_eq!(h.e.inbox(b).len(), 1);
    assert_eq!(h.e.inbox(c).len(), 1);
    assert!(h.e.inbox(a).is_empty());
    assert!(h.e.inbox(&uid0()).is_empty(), "unattributed cannot claim");
    let err = h.write(a, "plan.md").unwrap_err();
    assert_eq!(err.reason, Reason::Fenced);
    assert_eq!(err.errno(), libc::EACCES);
    assert!(
        err.message.contains("offered plan.md to any session"),
        "{}",
        err.message
    );
    // decline of an unclaimed offer: nothing to decline yet
    let t = h.t();
    let err = h.e.decline(b, &paths(&["plan.md"]), t).unwrap_err();
    assert_eq!(err.reason, Reason::HandoffNotSuccessor);
    // the giver cannot claim its own offer
    let t = h.t();
    let err = h.e.accept(a, &paths(&["plan.md"]), t).unwrap_err();
    assert_eq!(err.reason, Reason::HandoffNotSuccessor);
    h.assert_replay_equal();
}

#[test]
fn the_first_accept_claims_it_and_then_it_is_a_targeted_grant() {
    let (mut h, s) = offered();
    let (a, b, c) = (&s[0], &s[1], &s[2]);
    let t = h.t();
    let r = h.e.accept(b, &paths(&["plan.md"]), t).unwrap();
    assert_eq!(r.records[0].successor, "bob");
    assert_eq!(r.records[0].claimed_by.as_deref(), Some("bob"));
    assert_eq!(r.records[0].status, Status::Completed);
    let ev = h.sink.events().last().unwrap().clone();
    assert_eq!(ev.event, EventKind::Accept);
    assert!(ev.claimed);
    assert_eq!(ev.successor.as_deref(), Some("bob"));
    // carol comes second
    let t = h.t();
    let err = h.e.accept(c, &paths(&["plan.md"]), t).unwrap_err();
    assert_eq!(err.reason, Reason::HandoffNotSuccessor);
    assert_eq!(err.status, Some(Status::Completed));
    assert!(h.e.inbox(c).is_empty());
    assert_eq!(h.e.inbox(b).len(), 1);
    // the giver is still fenced until bob writes
    assert!(h.write(a, "plan.md").is_err());
    let st = h.e.status(Some("plan.md"));
    assert_eq!(st.live[0].claimed_by.as_deref(), Some("bob"));
    h.write(b, "plan.md").unwrap();
    // alice is a late giver now (bob's version exists, she has not read it): refused
    // until she reads it
    assert_eq!(h.write(a, "plan.md").unwrap_err().reason, Reason::StaleView);
    h.read(a, "plan.md");
    h.write(a, "plan.md").unwrap();
    h.assert_replay_equal();
}

#[test]
fn a_bystander_commit_before_any_claim_overtakes_it_and_withdraw_works() {
    let (mut h, s) = offered();
    let (a, c) = (&s[0], &s[2]);
    h.write(c, "plan.md").unwrap();
    let st = h.e.status(Some("plan.md"));
    assert_eq!(st.ended[0].status, Status::Overtaken);
    assert_eq!(st.ended[0].counterparty.as_deref(), Some("carol"));
    assert!(st.ended[0].claimed_by.is_none());

    // a fresh offer, withdrawn
    h.read(a, "plan.md");
    h.transfer(a, &["plan.md"], ANY).unwrap();
    let t = h.t();
    let r = h.e.withdraw(a, &paths(&["plan.md"]), t).unwrap();
    assert_eq!(r.records[0].status, Status::Withdrawn);
    h.write(a, "plan.md").unwrap();
    h.assert_replay_equal();
}

#[test]
fn two_sessions_racing_to_claim_one_wins() {
    for _ in 0..50 {
        let (h, s) = offered();
        let e = Arc::new(h.e);
        let go = Arc::new(Barrier::new(2));
        let runs: Vec<_> = [s[1].clone(), s[2].clone()]
            .into_iter()
            .map(|who| {
                let (e, go) = (e.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    e.accept(&who, &paths(&["plan.md"]), Timestamp(T0 + 10_000))
                        .map(|r| r.records[0].successor.clone())
                        .map_err(|r| r.reason)
                })
            })
            .collect();
        let out: Vec<_> = runs.into_iter().map(|j| j.join().unwrap()).collect();
        let won: Vec<_> = out.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(won.len(), 1, "{out:?}");
        assert!(out.contains(&Err(Reason::HandoffNotSuccessor)), "{out:?}");
        let claims = h
            .sink
            .events()
            .iter()
            .filter(|ev| ev.event == EventKind::Accept && ev.claimed)
            .count();
        assert_eq!(claims, 1);
        assert_eq!(e.status(Some("plan.md")).live[0].successor, *won[0]);
    }
}

#[test]
fn a_claim_survives_a_restart_of_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (sess("alice"), sess("bob"));
    let before = {
        let o = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
        let e = &o.engine;
        e.register(&a, Timestamp(T0)).unwrap();
        e.register(&b, Timestamp(T0)).unwrap();
        e.acquire(&a, "x.md", Timestamp(T0 + 1)).unwrap();
        e.commit(&a, "x.md", CommitOp::Write, stamp(1), Timestamp(T0 + 2));
        e.close_write(&a, "x.md", true, Timestamp(T0 + 3));
        e.acquire(&a, "y.md", Timestamp(T0 + 1)).unwrap();
        e.commit(&a, "y.md", CommitOp::Write, stamp(2), Timestamp(T0 + 2));
        e.close_write(&a, "y.md", true, Timestamp(T0 + 3));
        e.transfer(&a, &paths(&["x.md", "y.md"]), ANY, None, Timestamp(T0 + 4))
            .unwrap();
        e.accept(&b, &paths(&["x.md"]), Timestamp(T0 + 5)).unwrap();
        e.durable_state()
    };
    let o = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
    assert_eq!(o.engine.durable_state(), before);
    let x = o.engine.status(Some("x.md")).live[0].clone();
    assert_eq!(x.claimed_by.as_deref(), Some("bob"));
    let y = o.engine.status(Some("y.md")).live[0].clone();
    assert!(y.offer && y.claimed_by.is_none() && y.successor == ANY);
    // still open after the restart: bob can claim y too
    o.engine
        .accept(&b, &paths(&["y.md"]), Timestamp(T0 + 6))
        .unwrap();
    assert!(o.engine.is_fenced(&a, "y.md"));
}
