//! `wait` in the core (docs/design.md#control-surface): which record a wait follows, when each
//! state is reached, and the record-change counter a waiter sleeps on.

use crate::core_common;
use coherent::coherence::*;
use coherent::error::Reason;
use core_common::*;
use std::time::{Duration, Instant};

fn handed() -> (H, u64) {
    let mut h = H::new();
    let (a, b) = (sess("alice"), sess("bob"));
    let t = h.t();
    h.e.register(&b, t).unwrap();
    h.write(&a, "plan.md").unwrap();
    h.transfer(&a, &["plan.md"], "bob").unwrap();
    let id = h.e.wait_target("plan.md").unwrap();
    (h, id)
}

/// `Ok(Some(status))` reached, `Ok(None)` pending, `Err` refused.
fn state(h: &H, id: u64, u: Until) -> Result<Option<Status>, (Reason, Option<Status>)> {
    match h.e.wait_state("plan.md", id, u) {
        Ok(WaitState::Reached(r)) => Ok(Some(r.status)),
        Ok(WaitState::Pending(_)) => Ok(None),
        Err(f) => Err((f.reason, f.status)),
    }
}

#[test]
fn the_target_is_the_live_record_else_the_newest() {
    let mut h = H::new();
    let a = sess("alice");
    assert_eq!(
        h.e.wait_target("nope.md").unwrap_err().reason,
        Reason::NoSuchPath
    );
    h.write(&a, "plain.md").unwrap();
    let f = h.e.wait_target("plain.md").unwrap_err();
    assert_eq!(
        (f.reason, f.errno()),
        (Reason::HandoffNotLive, libc::EACCES)
    );
    let (h, id) = handed();
    assert_eq!(state(&h, id, Until::Ended), Ok(None));
}

#[test]
fn each_state_is_reached_by_what_it_names() {
    let (mut h, id) = handed();
    let b = sess("bob");
    let t = h.t();
    h.e.accept(&b, &paths(&["plan.md"]), t).unwrap();
    for u in Until::ALL {
        assert_eq!(state(&h, id, u), Ok(Some(Status::Completed)), "{u:?}");
    }
    // the record stays the target after it ended
    assert_eq!(h.e.wait_target("plan.md").unwrap(), id);

    let (mut h, id) = handed();
    let t = h.t();
    h.e.decline(&b, &paths(&["plan.md"]), t).unwrap();
    assert_eq!(state(&h, id, Until::Ended), Ok(Some(Status::Declined)));
    for u in [Until::Accepted, Until::Completed] {
        assert_eq!(
            state(&h, id, u),
            Err((Reason::HandoffEnded, Some(Status::Declined))),
            "{u:?}"
        );
    }

    // the successor's write completes it
    let (mut h, id) = handed();
    h.write(&b, "plan.md").unwrap();
    assert_eq!(state(&h, id, Until::Completed), Ok(Some(Status::Completed)));
}

#[test]
fn a_waiter_wakes_when_a_record_changes_not_at_its_deadline() {
    let (h, _) = handed();
    let e = std::sync::Arc::new(h.e);
    let seen = e.changes();
    let waiter = {
        let e = e.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            let now = e.wait_change(seen, t + Duration::from_secs(20));
            (now, t.elapsed())
        })
    };
    // a read changes no record: no wake-up is owed for it
    e.open_read(&sess("bob"), "plan.md", Timestamp(T0 + 50));
    e.accept(&sess("bob"), &paths(&["plan.md"]), Timestamp(T0 + 100))
        .unwrap();
    let (now, took) = waiter.join().unwrap();
    eprintln!("woke {took:?} after it started waiting");
    assert_ne!(now, seen);
    assert!(took < Duration::from_secs(10), "woke only at the deadline");
}
