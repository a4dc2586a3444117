//! A coordinator's step runs engine calls on a view of the engine whose events it keeps
//! as values (`Engine::with_sink`): the state is shared at once, the log hears of the
//! change only when the step writes the kept events, and an undone step leaves neither.

use crate::core_common;
use coherent::coherence::*;
use coherent::error::Reason;
use core_common::*;
use std::sync::Arc;

const P: &str = "plan.md";

/// alice has committed plan.md v2; alice and bob are known.
fn written() -> (H, coherent::identity::Session) {
    let mut h = H::new();
    let (a, b) = (sess("alice"), sess("bob"));
    for s in [&a, &b] {
        let t = h.t();
        h.e.session_seen(s, t);
    }
    let st = h.next_stamp();
    let t = h.t();
    h.e.observe(P, st, t);
    h.write(&a, P).unwrap();
    // As with a coordinator: record ids come from its revisions, not from the log's seq
    // (a step's events are numbered only when written).
    h.e.raise_record_ids(1000);
    (h, a)
}

fn alice_may_write(h: &mut H, a: &coherent::identity::Session) -> Result<(), Reason> {
    let t = h.t();
    let r = h.e.acquire(a, P, t).map(|_| ()).map_err(|r| r.reason);
    if r.is_ok() {
        let t = h.t();
        h.e.close_write(a, P, false, t);
    }
    r
}

#[test]
fn a_views_events_go_to_its_own_sink_and_its_changes_to_the_shared_state() {
    let (mut h, a) = written();
    let logged = h.sink.events().len();
    let held = Arc::new(MemorySink::new());
    let view = h.e.with_sink(held.clone());
    let t = h.t();
    view.transfer(&a, &paths(&[P]), "bob", None, t).unwrap();

    let kept: Vec<EventKind> = held.events().iter().map(|e| e.event).collect();
    assert_eq!(
        kept,
        vec![EventKind::Transfer],
        "the view kept the step's event"
    );
    assert_eq!(
        h.sink.events().len(),
        logged,
        "nothing reached the engine's own log"
    );
    // The state is one: the engine itself fences the giver now.
    assert_eq!(alice_may_write(&mut h, &a), Err(Reason::Fenced));

    // The step is agreed: its events are written, in order, and the log rebuilds the state.
    for mut ev in held.events() {
        h.sink.append(&mut ev);
    }
    assert_replay_equal_but_seq(&h);
}

/// The log rebuilds the engine's state. Only the seq may differ: the engine counts the
/// events it saw numbered, and a step's are numbered when they are written.
fn assert_replay_equal_but_seq(h: &H) {
    let fresh = Engine::new(h.e.config().clone(), Arc::new(MemorySink::discarding()));
    for ev in h.sink.events() {
        fresh.replay(&ev);
    }
    let (mut rebuilt, live) = (fresh.durable_state(), h.e.durable_state());
    rebuilt.seq = live.seq;
    assert_eq!(rebuilt, live);
}

#[test]
fn an_undone_step_leaves_neither_state_nor_log() {
    let (mut h, a) = written();
    let logged = h.sink.events().len();
    let saved = h.e.save(&paths(&[P]));
    let held = Arc::new(MemorySink::new());
    let t = h.t();
    h.e.with_sink(held.clone())
        .transfer(&a, &paths(&[P]), "bob", None, t)
        .unwrap();
    assert_eq!(alice_may_write(&mut h, &a), Err(Reason::Fenced));

    // Another host changed plan.md first: the step is undone and its events dropped.
    h.e.restore(saved);
    assert_eq!(alice_may_write(&mut h, &a), Ok(()));
    let after: Vec<EventKind> = h.sink.events()[logged..].iter().map(|e| e.event).collect();
    assert!(
        !after.contains(&EventKind::Transfer),
        "an undone transfer is not in the log: {after:?}"
    );
    assert_replay_equal_but_seq(&h);
}
