//! One scenario per row of the docs/design.md#handoff table and per refusal reason code.

use crate::core_common;
use coherent::coherence::*;
use coherent::error::Reason;
use core_common::*;

const P: &str = "plan.md";

const ALL_ROUTES: [Route; 10] = [
    Route::OpenWrite,
    Route::Setattr,
    Route::RenameSource,
    Route::RenameTarget,
    Route::Unlink,
    Route::Link,
    Route::Symlink,
    Route::Mknod,
    Route::Setxattr,
    Route::Removexattr,
];

/// alice commits plan.md v2 and hands it to bob. Returns (harness, alice, bob, carol).
fn handed() -> (
    H,
    coherent::identity::Session,
    coherent::identity::Session,
    coherent::identity::Session,
) {
    let mut h = H::new();
    let (a, b, c) = (sess("alice"), sess("bob"), sess("carol"));
    for s in [&a, &b, &c] {
        let t = h.t();
        h.e.session_seen(s, t);
    }
    let st = h.next_stamp();
    let t = h.t();
    assert_eq!(h.e.observe(P, st, t), Some(1));
    assert_eq!(h.write(&a, P).unwrap(), 2);
    let r = h.transfer(&a, &[P], "bob").unwrap();
    assert_eq!(r.records.len(), 1);
    let rec = &r.records[0];
    assert_eq!(
        (
            rec.giver.as_str(),
            rec.successor.as_str(),
            rec.version_at_transfer
        ),
        ("alice", "bob", 2)
    );
    assert_eq!(rec.hold, Hold::M);
    assert_eq!(rec.status, Status::Pending);
    assert!(rec.live);
    (h, a, b, c)
}

fn assert_fenced_everywhere(h: &mut H, s: &coherent::identity::Session) {
    let t = h.t();
    let err = h.e.acquire(s, P, t).unwrap_err();
    assert_eq!(err.reason, Reason::Fenced);
    assert_eq!(err.errno(), libc::EACCES);
    for route in ALL_ROUTES {
        let t = h.t();
        let err = h.e.check_write(s, P, route, t).unwrap_err();
        assert_eq!(err.reason, Reason::Fenced, "{route:?}");
    }
    let t = h.t();
    assert_eq!(
        h.e.check_rename(s, P, "x.md", false, t).unwrap_err().reason,
        Reason::Fenced
    );
    let t = h.t();
    assert_eq!(
        h.e.check_rename(s, "x.md", P, false, t).unwrap_err().reason,
        Reason::Fenced
    );
    assert!(h.e.is_fenced(s, P));
}

#[test]
fn basic_flow_successor_commit_completes_and_lifts_the_fence() {
    let (mut h, a, b, c) = handed();
    assert_fenced_everywhere(&mut h, &a);
    // The deny text, word for word (bob's agent id is 9ae2705c-...).
    assert_eq!(
        h.e.why(&a).unwrap(),
        "write denied: you handed plan.md to agent 9ae2705c (bob) at v2, so this session can no \
         longer write it. The handoff ends when 9ae2705c writes plan.md, when 9ae2705c declines \
         it, or when you withdraw it (coherent withdraw plan.md). Stop and tell your user that \
         plan.md was handed off. Retrying will be denied the same way."
    );
    assert!(h.count(EventKind::Denied) >= 13);
    // Denials change nothing.
    assert_eq!(h.e.version(P), Some(2));
    // Reads are never refused.
    assert_eq!(h.read(&a, P), Some(2));

    // Everyone sees the record with their role.
    assert_eq!(h.e.handoff(&a, P).unwrap().role, Role::Giver);
    assert_eq!(h.e.handoff(&c, P).unwrap().role, Role::Bystander);
    let inbox = h.e.inbox(&b);
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].note.as_deref(), Some("over to you: [\"plan.md\"]"));
    assert!(h.e.inbox(&c).is_empty());

    // bob's first open logs handoff_seen, once.
    assert_eq!(h.count(EventKind::HandoffSeen), 0);
    assert_eq!(h.read(&b, P), Some(2));
    assert_eq!(h.read(&b, P), Some(2));
    assert_eq!(h.count(EventKind::HandoffSeen), 1);
    let hv = h.e.handoff(&b, P).unwrap();
    assert_eq!(hv.role, Role::Successor);
    let json = serde_json::to_value(&hv).unwrap();
    for k in [
        "path",
        "giver",
        "giver_agent",
        "successor",
        "successor_agent",
        "version_at_transfer",
        "hold",
        "status",
        "counterparty",
        "note",
        "created",
        "updated",
        "live",
        "role",
    ] {
        assert!(json.get(k).is_some(), "{k} missing in {json}");
    }
    assert_eq!(
        json["successor_agent"],
        "9ae2705c-1759-59d9-9266-5e25c13ba62a"
    );
    assert_eq!(json["status"], "pending");
    assert_eq!(json["hold"], "M");
    assert_eq!(json["role"], "successor");

    // bob writes: completed, v3, fence lifted.
    assert_eq!(h.write(&b, P).unwrap(), 3);
    assert!(h.kinds().contains(&EventKind::Completed));
    assert!(!h.e.is_fenced(&a, P));
    assert!(h.e.handoff(&a, P).is_none());
    let st = h.e.status(Some(P));
    assert_eq!(st.ended.len(), 1);
    assert_eq!(st.ended[0].status, Status::Completed);
    assert_eq!(st.version, Some(3));
    // alice, the former giver, has not read bob's version: a late giver, refused on
    // every write route (the fence is gone, the reason is `stale_view`) until she reads
    let err = h.write(&a, P).unwrap_err();
    assert_eq!((err.reason, err.errno()), (Reason::StaleView, libc::EACCES));
    h.read(&a, P);
    assert_eq!(h.write(&a, P).unwrap(), 4);
    h.assert_replay_equal();
}

#[test]
fn bystander_acquire_overtakes_and_fence_stays_until_its_commit() {
    let (mut h, a, _b, c) = handed();
    let t = h.t();
    h.e.acquire(&c, P, t).unwrap();
    let rec = h.e.handoff(&c, P).unwrap().record;
    assert_eq!(rec.status, Status::Overtaken);
    assert_eq!(rec.counterparty.as_deref(), Some("carol"));
    assert!(rec.live);
    // carol closes without changing anything: release, fence kept.
    let t = h.t();
    h.e.close_write(&c, P, false, t);
    assert!(h.kinds().contains(&EventKind::Release));
    assert!(h.e.is_fenced(&a, P));
    // carol's commit moves the version: fence lifted, record ended as overtaken.
    assert_eq!(h.write(&c, P).unwrap(), 3);
    assert!(!h.e.is_fenced(&a, P));
    let st = h.e.status(None);
    assert_eq!(st.live.len(), 0);
    assert_eq!(st.ended[0].status, Status::Overtaken);
    assert_eq!(st.ended[0].counterparty.as_deref(), Some("carol"));
    h.assert_replay_equal();
}

#[test]
fn bystander_is_never_fenced_and_unattributed_bystander_overtakes() {
    let (mut h, _a, b, c) = handed();
    for s in [&b, &c] {
        for route in ALL_ROUTES {
            let t = h.t();
            h.e.check_write(s, P, route, t).unwrap();
        }
    }
    let u = uid0();
    assert_eq!(h.write(&u, P).unwrap(), 3);
    assert_eq!(
        h.e.status(None).ended[0].counterparty.as_deref(),
        Some("uid:0")
    );
}

#[test]
fn accept_keeps_the_fence_until_the_version_moves() {
    let (mut h, a, b, _c) = handed();
    let t = h.t();
    let r = h.e.accept(&b, &paths(&[P]), t).unwrap();
    assert_eq!(r.records[0].status, Status::Completed);
    assert!(r.records[0].live);
    assert!(h.e.is_fenced(&a, P));
    // Accepting again answers the record unchanged (docs/design.md#handoff: no second event).
    let n = h.sink.events().len();
    let t = h.t();
    let again = h.e.accept(&b, &paths(&[P]), t).unwrap();
    assert_eq!(again.records[0].status, Status::Completed);
    assert_eq!(h.sink.events().len(), n);
    assert_eq!(h.write(&b, P).unwrap(), 3);
    assert!(!h.e.is_fenced(&a, P));
    h.assert_replay_equal();
}

#[test]
fn decline_and_withdraw_lift_the_fence() {
    let (mut h, a, b, _c) = handed();
    let t = h.t();
    let r = h.e.decline(&b, &paths(&[P]), t).unwrap();
    assert_eq!(r.records[0].status, Status::Declined);
    assert!(!r.records[0].live);
    assert!(!h.e.is_fenced(&a, P));
    assert_eq!(h.write(&a, P).unwrap(), 3);

    let (mut h, a, _b, _c) = handed();
    let t = h.t();
    let r = h.e.withdraw(&a, &paths(&[P]), t).unwrap();
    assert_eq!(r.records[0].status, Status::Withdrawn);
    assert!(!h.e.is_fenced(&a, P));
    h.assert_replay_equal();
}

#[test]
fn handoff_ended_until_the_version_moves() {
    let (mut h, a, b, c) = handed();
    let t = h.t();
    h.e.decline(&b, &paths(&[P]), t).unwrap();
    h.read(&a, P);
    let err = h.transfer(&a, &[P], "bob").unwrap_err();
    assert_eq!(err.reason, Reason::HandoffEnded);
    assert_eq!(h.e.why(&a).unwrap(), err.message);
    // Another successor is fine.
    h.transfer(&a, &[P], "carol").unwrap();
    // ...but superseding it back to bob is the same ended handoff.
    assert_eq!(
        h.transfer(&a, &[P], "bob").unwrap_err().reason,
        Reason::HandoffEnded
    );
    assert_eq!(h.e.handoff(&a, P).unwrap().record.successor, "carol");
    let t = h.t();
    h.e.withdraw(&a, &paths(&[P]), t).unwrap();
    // Once the version moves, bob can be asked again.
    h.write(&c, P).unwrap();
    h.read(&a, P);
    h.transfer(&a, &[P], "bob").unwrap();
    assert!(h.e.is_fenced(&a, P));
    h.assert_replay_equal();
}

#[test]
fn no_timer_a_year_later_the_fence_holds() {
    let (mut h, a, _b, _c) = handed();
    let before = h.e.status(None);
    h.now += 366 * 24 * 3600 * 1000;
    let t = h.t();
    assert_eq!(h.e.evict(t), 0);
    assert!(h.e.is_fenced(&a, P));
    let after = h.e.status(None);
    assert_eq!(before.live, after.live);
    let t = h.t();
    assert_eq!(h.e.acquire(&a, P, t).unwrap_err().reason, Reason::Fenced);
}

#[test]
fn eviction_after_24h_of_ended_records_only() {
    let (mut h, a, b, _c) = handed();
    // A second path with an ended record.
    let q = "notes.md";
    let st = h.next_stamp();
    let t = h.t();
    h.e.observe(q, st, t);
    h.read(&a, q);
    h.transfer(&a, &[q], "bob").unwrap();
    let t = h.t();
    h.e.decline(&b, &paths(&[q]), t).unwrap();
    let declined_at = h.now;
    let day = 24 * 3600 * 1000;
    assert_eq!(h.e.evict(Timestamp(declined_at + day - 1)), 0);
    assert_eq!(h.e.evict(Timestamp(declined_at + day)), 1);
    assert_eq!(h.count(EventKind::Evict), 1);
    let st = h.e.status(None);
    assert_eq!(st.ended.len(), 0);
    assert_eq!(
        st.live.len(),
        1,
        "the live record of plan.md is never evicted"
    );
    assert!(h.e.is_fenced(&a, P));
    // Evicted: re-transfer to bob at the same version is possible again.
    h.read(&a, q);
    h.transfer(&a, &[q], "bob").unwrap();
    h.assert_replay_equal();
}

#[test]
fn supersede_and_idempotent_resend() {
    let (mut h, a, _b, c) = handed();
    let n = h.sink.events().len();
    let first = h.transfer(&a, &[P], "bob").unwrap();
    assert_eq!(h.sink.events().len(), n, "re-send changes nothing");
    assert_eq!(first.records[0].status, Status::Pending);
    let r = h.transfer(&a, &[P], "carol").unwrap();
    assert_eq!(r.records[0].successor, "carol");
    assert_eq!(r.records[0].hold, Hold::M);
    let st = h.e.status(Some(P));
    assert_eq!(st.ended.len(), 1);
    assert_eq!(st.ended[0].status, Status::Superseded);
    assert_eq!(st.live[0].successor, "carol");
    assert!(h.e.is_fenced(&a, P));
    assert_eq!(h.write(&c, P).unwrap(), 3);
    assert_eq!(h.e.status(Some(P)).ended.len(), 2);
    h.assert_replay_equal();
}

#[test]
fn in_flight_while_the_giver_has_it_open_for_writing() {
    let mut h = H::new();
    let (a, b) = (sess("alice"), sess("bob"));
    let t = h.t();
    h.e.register(&b, t).unwrap();
    h.write(&a, P).unwrap();
    let t = h.t();
    h.e.acquire(&a, P, t).unwrap();
    let err = h.transfer(&a, &[P], "bob").unwrap_err();
    assert_eq!(err.reason, Reason::HandoffInFlight);
    assert_eq!(err.errno(), libc::EBUSY);
    let t = h.t();
    h.e.close_write(&a, P, false, t);
    h.transfer(&a, &[P], "bob").unwrap();
}

#[test]
fn every_refusal_code() {
    let (mut h, a, b, c) = handed();
    let code = |r: Result<VerbReply, coherent::error::Refusal>| r.unwrap_err().reason;
    assert_eq!(code(h.transfer(&c, &[P], "carol")), Reason::HandoffToSelf);
    assert_eq!(
        code(h.transfer(&c, &[P], "dave")),
        Reason::HandoffSuccessorUnknown
    );
    assert_eq!(
        code(h.transfer(&c, &[P], "2130ff")),
        Reason::HandoffSuccessorMalformed
    );
    // carol never read plan.md.
    let q = "q.md";
    h.write(&b, q).unwrap();
    assert_eq!(code(h.transfer(&c, &[q], "bob")), Reason::HandoffNotHeld);
    // ...or read an older version.
    h.read(&c, q);
    h.write(&b, q).unwrap();
    assert_eq!(code(h.transfer(&c, &[q], "bob")), Reason::HandoffNotHeld);
    h.read(&c, P);
    assert_eq!(
        code(h.transfer(&c, &[P], "bob")),
        Reason::HandoffOtherHolder
    );
    let t = h.t();
    assert_eq!(
        code(h.e.accept(&c, &paths(&[P]), t)),
        Reason::HandoffNotSuccessor
    );
    let t = h.t();
    assert_eq!(
        code(h.e.decline(&a, &paths(&[P]), t)),
        Reason::HandoffNotSuccessor
    );
    let t = h.t();
    assert_eq!(
        code(h.e.withdraw(&b, &paths(&[P]), t)),
        Reason::HandoffNotGiver
    );
    let t = h.t();
    assert_eq!(
        code(h.e.accept(&b, &paths(&[q]), t)),
        Reason::HandoffNotLive
    );
    let t = h.t();
    assert_eq!(
        code(h.e.withdraw(&b, &paths(&[q]), t)),
        Reason::HandoffNotLive
    );
    let u = uid0();
    h.read(&u, q);
    assert_eq!(code(h.transfer(&u, &[q], "bob")), Reason::Unattributed);
    let t = h.t();
    assert_eq!(code(h.e.register(&u, t)), Reason::Unattributed);
    let t = h.t();
    assert_eq!(code(h.e.accept(&u, &paths(&[q]), t)), Reason::Unattributed);
    assert_eq!(
        code(h.transfer(&b, &["nope.md"], "carol")),
        Reason::NoSuchPath
    );
    for bad in ["../etc/passwd", "/abs", "a//b", "./x", ""] {
        assert_eq!(
            code(h.transfer(&b, &[bad], "carol")),
            Reason::BadRequest,
            "{bad}"
        );
    }
    assert_eq!(code(h.transfer(&b, &[], "carol")), Reason::BadRequest);
    let t = h.t();
    let big = "x".repeat(MAX_NOTE + 1);
    assert_eq!(
        code(h.e.transfer(&b, &paths(&[q]), "carol", Some(big), t)),
        Reason::BadRequest
    );
    // The last refusal's text is what `why` shows.
    let t = h.t();
    let err = h.e.withdraw(&b, &paths(&[P]), t).unwrap_err();
    assert_eq!(h.e.why(&b).unwrap(), err.message);
    // Unattributed sessions cannot be successors.
    assert_eq!(
        code(h.transfer(&b, &[q], "uid:0")),
        Reason::HandoffSuccessorUnknown
    );
    // Nothing above changed the records.
    assert_eq!(h.e.status(None).live.len(), 1);
    h.assert_replay_equal();
}

#[test]
fn multi_path_verbs_are_all_or_nothing() {
    let mut h = H::new();
    let (a, b) = (sess("alice"), sess("bob"));
    let t = h.t();
    h.e.register(&b, t).unwrap();
    for p in ["a.md", "b.md", "c.md"] {
        h.write(&a, p).unwrap();
    }
    let err = h
        .transfer(&a, &["a.md", "b.md", "missing.md", "c.md"], "bob")
        .unwrap_err();
    assert_eq!(err.reason, Reason::NoSuchPath);
    assert!(err.message.contains("missing.md"));
    assert_eq!(h.e.status(None).live.len(), 0);
    assert_eq!(h.count(EventKind::Transfer), 0);
    let r = h.transfer(&a, &["a.md", "b.md", "c.md"], "bob").unwrap();
    assert_eq!(r.records.len(), 3);
    // bob accepts two paths, one of which has no live record: nothing is accepted.
    h.write(&b, "z.md").unwrap();
    let t = h.t();
    assert_eq!(
        h.e.accept(&b, &paths(&["a.md", "z.md"]), t)
            .unwrap_err()
            .reason,
        Reason::HandoffNotLive
    );
    assert!(h
        .e
        .status(None)
        .live
        .iter()
        .all(|r| r.status == Status::Pending));
    assert_eq!(h.e.inbox(&b).len(), 3);
    h.assert_replay_equal();
}

#[test]
fn successor_by_id_and_prefix() {
    let (mut h, a, _b, c) = handed();
    h.read(&c, P);
    let t = h.t();
    h.e.withdraw(&a, &paths(&[P]), t).unwrap();
    h.read(&a, P);
    let r = h.transfer(&a, &[P], "2130ffdc").unwrap();
    assert_eq!(r.records[0].successor, "carol");
    // The full id of the same successor: an idempotent re-send.
    let r = h
        .transfer(&a, &[P], "2130ffdc-5b10-5e5b-8ae0-5700831ef5cc")
        .unwrap();
    assert_eq!(r.records[0].successor, "carol");
    assert_eq!(h.count(EventKind::Transfer), 2);
    let bob =
        h.e.lookup_session("9ae2705c-1759-59d9-9266-5e25c13ba62a")
            .unwrap();
    assert_eq!(bob.name, "bob");
}

#[test]
fn stale_guard_modes() {
    for mode in [
        StaleMode::Off,
        StaleMode::Warn,
        StaleMode::Guard,
        StaleMode::Strict,
    ] {
        let mut h = H::with(Config {
            stale: mode,
            ..Config::default()
        });
        let (a, b) = (sess("alice"), sess("bob"));
        h.write(&b, P).unwrap();
        h.read(&a, P);
        h.write(&b, P).unwrap();
        let t = h.t();
        let r = h.e.acquire(&a, P, t);
        match mode {
            StaleMode::Off => {
                assert!(!r.unwrap().stale);
                assert_eq!(h.count(EventKind::StaleWrite), 0);
            }
            StaleMode::Warn => {
                assert!(r.unwrap().stale);
                assert_eq!(h.count(EventKind::StaleWrite), 1);
            }
            StaleMode::Guard | StaleMode::Strict => {
                let err = r.unwrap_err();
                assert_eq!(err.reason, Reason::StaleView);
                assert_eq!(err.errno(), libc::EACCES);
                let why = h.e.why(&a).unwrap();
                assert!(
                    why.contains("is at v2 (agent") && why.contains("last saw v1"),
                    "{why}"
                );
                // An append: allowed (and counted) under guard, refused under strict.
                let t = h.t();
                match (mode, h.e.acquire_append(&a, P, t)) {
                    (StaleMode::Guard, Ok(x)) => {
                        assert!(x.stale);
                        assert_eq!(h.count(EventKind::StaleWrite), 1);
                        let t = h.t();
                        h.e.close_write(&a, P, false, t);
                    }
                    (StaleMode::Strict, Err(e)) => assert_eq!(e.reason, Reason::StaleView),
                    (m, got) => panic!("{m:?}: a stale append {got:?}"),
                }
                h.read(&a, P);
                let t = h.t();
                assert!(!h.e.acquire(&a, P, t).unwrap().stale);
            }
        }
        // A blind write (no view) is never stale.
        let c = sess("carol");
        let t = h.t();
        assert!(!h.e.acquire(&c, P, t).unwrap().stale);
    }
}

#[test]
fn versions_tombstones_renames_and_external_changes() {
    let mut h = H::new();
    let (a, b) = (sess("alice"), sess("bob"));
    // A create and its writes on one handle: one commit, version 1.
    assert_eq!(h.write(&a, "n.md").unwrap(), 1);
    // A close without change is not a commit.
    let t = h.t();
    h.e.acquire(&a, "n.md", t).unwrap();
    let t = h.t();
    h.e.close_write(&a, "n.md", false, t);
    assert_eq!(h.e.version("n.md"), Some(1));
    // unlink: tombstone; recreating continues the numbering.
    let t = h.t();
    assert_eq!(h.e.commit(&a, "n.md", CommitOp::Unlink, None, t), 2);
    assert_eq!(h.e.version("n.md"), None);
    assert_eq!(h.write(&b, "n.md").unwrap(), 3);
    // An atomic save: write tmp, rename over.
    h.write(&a, "n.md.tmp").unwrap();
    let st = h.next_stamp();
    let t = h.t();
    assert_eq!(h.e.rename(&a, "n.md.tmp", "n.md", false, st, t), Some(4));
    assert_eq!(h.e.version("n.md.tmp"), None);
    // Directory rename moves versions and records.
    h.write(&a, "d/x.md").unwrap();
    h.write(&a, "d/x.md").unwrap();
    h.write(&a, "d/sub/y.md").unwrap();
    let t = h.t();
    h.e.register(&b, t).unwrap();
    h.transfer(&a, &["d/x.md"], "bob").unwrap();
    let t = h.t();
    assert_eq!(
        h.e.check_rename(&a, "d", "e", true, t).unwrap_err().reason,
        Reason::Fenced
    );
    let t = h.t();
    h.e.rename(&b, "d", "e", true, None, t);
    assert_eq!(h.e.version("e/x.md"), Some(2));
    assert_eq!(h.e.version("e/sub/y.md"), Some(1));
    assert_eq!(h.e.version("d/x.md"), None);
    assert!(h.e.is_fenced(&a, "e/x.md"));
    assert_eq!(h.e.handoff(&b, "e/x.md").unwrap().record.path, "e/x.md");
    // External change: a different stamp at the next open, nobody writing.
    let st = h.e.stamp("n.md");
    assert_eq!(h.e.observe("n.md", st, Timestamp(T0)), Some(4));
    let t = h.t();
    assert_eq!(h.e.observe("n.md", stamp(999_999), t), Some(5));
    // A chmod through the volume changes ctime but is not a commit.
    h.e.restamp("n.md", stamp(777_777).unwrap());
    let t = h.t();
    assert_eq!(h.e.observe("n.md", stamp(777_777), t), Some(5));
    // Removed behind the volume's back.
    let t = h.t();
    assert_eq!(h.e.observe("n.md", None, t), None);
    assert_eq!(h.e.version("n.md"), None);
    assert_eq!(h.count(EventKind::ExternalChange), 2);
    // An external change of a handed-off path overtakes the record.
    let st = h.e.stamp("e/x.md");
    let t = h.t();
    h.e.observe("e/x.md", st, t);
    let t = h.t();
    assert_eq!(h.e.observe("e/x.md", stamp(4242), t), Some(3));
    assert!(!h.e.is_fenced(&a, "e/x.md"));
    let ended = h.e.status(Some("e/x.md")).ended;
    assert_eq!(ended[0].counterparty.as_deref(), Some(EXTERNAL));
    h.assert_replay_equal();
}

#[test]
fn reclaim_when_a_session_is_gone() {
    let mut h = H::new();
    let a = sess("alice");
    h.write(&a, P).unwrap();
    let t = h.t();
    h.e.acquire(&a, P, t).unwrap();
    assert_eq!(h.e.hold(&a, P).unwrap().0, Hold::E);
    let t = h.t();
    assert_eq!(h.e.session_gone(&a, t), 1);
    assert_eq!(h.count(EventKind::Reclaim), 1);
    assert_eq!(h.count(EventKind::Release), 0);
    assert!(h.e.hold(&a, P).is_none());
    let t = h.t();
    assert_eq!(h.e.session_gone(&a, t), 0);
}

#[test]
fn holds_follow_mesi() {
    let mut h = H::new();
    let (a, b) = (sess("alice"), sess("bob"));
    h.write(&a, P).unwrap();
    assert_eq!(h.e.hold(&a, P), Some((Hold::M, Some(1))));
    h.read(&b, P);
    assert_eq!(h.e.hold(&b, P), Some((Hold::S, Some(1))));
    h.write(&b, P).unwrap();
    assert_eq!(h.e.hold(&a, P), Some((Hold::I, Some(1))));
    assert_eq!(h.e.hold(&b, P), Some((Hold::M, Some(2))));
    // transfer ends the giver's hold.
    h.transfer(&b, &[P], "alice").unwrap();
    assert_eq!(h.e.hold(&b, P).unwrap().0, Hold::I);
}

#[test]
fn status_and_event_json() {
    let (mut h, _a, _b, _c) = handed();
    let st = serde_json::to_value(h.e.status(None)).unwrap();
    assert_eq!(st["counts"]["live"], 1);
    assert_eq!(st["counts"]["sessions"], 3);
    assert_eq!(
        st["live"][0]["giver_agent"],
        "27a468b0-7fa2-5c0d-a2ba-2dac753b2070"
    );
    let t = h.t();
    h.e.check_write(&sess("alice"), P, Route::Unlink, t)
        .unwrap_err();
    let ev = h.sink.events().pop().unwrap();
    let v = serde_json::to_value(&ev).unwrap();
    assert_eq!(v["event"], "denied");
    assert_eq!(v["reason"], "fenced");
    assert_eq!(v["route"], "unlink");
    assert_eq!(v["session"], "alice");
    assert!(v["ts"].as_str().unwrap().ends_with('Z'));
    for k in ["seq", "ts", "event", "path", "session", "agent"] {
        assert!(v.get(k).is_some(), "{k}");
    }
    let seen = &h.sink.events()[0];
    let v = serde_json::to_value(seen).unwrap();
    assert_eq!(v["event"], "session_seen");
    assert!(v["path"].is_null());
}

/// A directory rename moves paths the volume has only seen (first sight: version 1, not
/// logged) as well as logged ones. The log does not know the seen-only ones, so the move
/// must change the durable state exactly as replaying the log without them does (the
/// stress test once found a seen-only file landing on a tombstone: live v+1, log v).
#[test]
fn a_directory_rename_of_seen_only_paths_replays_the_same() {
    let mut h = H::new();
    let (a, b) = (sess("alice"), sess("bob"));
    // Tombstones and live files under the target directory.
    h.write(&a, "e/gone.md").unwrap();
    let t = h.t();
    h.e.commit(&a, "e/gone.md", CommitOp::Unlink, None, t);
    h.write(&a, "e/kept.md").unwrap();
    // Seen-only files under the source, one of them read, one of them being written.
    for p in ["d/gone.md", "d/kept.md", "d/new.md", "d/open.md"] {
        let t = h.t();
        assert_eq!(h.e.observe(p, stamp(5), t), Some(1));
    }
    h.read(&b, "d/gone.md");
    let t = h.t();
    h.e.acquire(&b, "d/open.md", t).unwrap();
    // A logged file under the source landing on a seen-only one under the target.
    h.write(&a, "d/logged.md").unwrap();
    let t = h.t();
    h.e.observe("e/logged.md", stamp(6), t);
    h.assert_replay_equal();
    let t = h.t();
    h.e.rename(&a, "d", "e", true, None, t);
    h.assert_replay_equal();
    assert_eq!(h.e.path_state("e/logged.md").unwrap().version, 1);
    // Writing and committing the moved files goes on consistently.
    let t = h.t();
    h.e.commit(&b, "e/open.md", CommitOp::Write, stamp(8), t);
    let t = h.t();
    h.e.close_write(&b, "e/open.md", true, t);
    for p in ["e/gone.md", "e/kept.md", "e/new.md"] {
        let t = h.t();
        h.e.observe(p, stamp(9), t);
        h.write(&b, p).unwrap();
    }
    h.assert_replay_equal();
}
