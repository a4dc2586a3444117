//! The contract of docs/design.md#handoff, and the write decision of docs/design.md#write-routes
//! over the core's `Write` routes: one test per rule.

use crate::core_common;
use coherent::coherence::*;
use coherent::error::Reason;
use coherent::identity::Session;
use core_common::*;

const P: &str = "plan.md";

/// alice commits plan.md v2 and hands it to bob; carol is a bystander.
fn handed() -> (H, Session, Session, Session) {
    let mut h = H::new();
    let (a, b, c) = (sess("alice"), sess("bob"), sess("carol"));
    for s in [&a, &b, &c] {
        let t = h.t();
        h.e.session_seen(s, t);
    }
    let st = h.next_stamp();
    let t = h.t();
    h.e.observe(P, st, t);
    assert_eq!(h.write(&a, P).unwrap(), 2);
    h.transfer(&a, &[P], "bob").unwrap();
    (h, a, b, c)
}

/// Every record of plan.md, live or ended.
fn records(h: &H) -> Vec<RecordJson> {
    let st = h.e.status(Some(P));
    st.live.into_iter().chain(st.ended).collect()
}

fn record(h: &H) -> RecordJson {
    records(h).into_iter().next().expect("a record")
}

#[test]
fn an_exact_resend_of_an_ended_transfer_is_handoff_ended_before_the_hold_check() {
    for end in [EventKind::Decline, EventKind::Withdraw] {
        let (mut h, a, b, _) = handed();
        let t = h.t();
        match end {
            EventKind::Decline => h.e.decline(&b, &paths(&[P]), t).unwrap(),
            _ => h.e.withdraw(&a, &paths(&[P]), t).unwrap(),
        };
        // alice has not read plan.md again: her hold is no longer one she may hand on,
        // yet the answer is that this very transfer already ended, with its status.
        let err = h.transfer(&a, &[P], "bob").unwrap_err();
        assert_eq!(err.reason, Reason::HandoffEnded, "{end:?}");
        let want = match end {
            EventKind::Decline => Status::Declined,
            _ => Status::Withdrawn,
        };
        assert_eq!(err.status, Some(want));
        assert_eq!(err.path.as_deref(), Some(P));
    }
}

#[test]
fn counterparty_is_set_only_on_overtaken_records() {
    // Overtaken by carol: counterparty carol.
    let (mut h, _, b, c) = handed();
    let t = h.t();
    h.e.acquire(&c, P, t).unwrap();
    let r = record(&h);
    assert_eq!(r.status, Status::Overtaken);
    assert_eq!(r.counterparty.as_deref(), Some("carol"));
    let t = h.t();
    h.e.close_write(&c, P, false, t);
    // bob's commit is the latest event on the live record: completed, no counterparty
    // (docs/design.md#handoff: while live, the status follows the latest event).
    h.write(&b, P).unwrap();
    let r = records(&h);
    let r = r.iter().find(|r| r.giver == "alice").unwrap();
    assert_eq!(r.status, Status::Completed);
    assert_eq!(r.counterparty, None);
    assert!(!r.live);

    // Completed by bob, then a bystander's acquire: overtaken, counterparty carol.
    let (mut h, _, b, c) = handed();
    let t = h.t();
    h.e.accept(&b, &paths(&[P]), t).unwrap();
    let t = h.t();
    h.e.acquire(&c, P, t).unwrap();
    let r = record(&h);
    assert_eq!(r.status, Status::Overtaken);
    assert_eq!(r.counterparty.as_deref(), Some("carol"));
    h.assert_replay_equal();
}

#[test]
fn a_live_record_of_any_status_answers_every_verb_its_way_out() {
    // Overtaken (live): bob's accept completes it, his decline and alice's withdraw end it.
    for verb in ["accept", "decline", "withdraw"] {
        let (mut h, a, b, c) = handed();
        let t = h.t();
        h.e.acquire(&c, P, t).unwrap(); // overtaken, still live (the version has not moved)
        let t = h.t();
        let r = match verb {
            "accept" => h.e.accept(&b, &paths(&[P]), t),
            "decline" => h.e.decline(&b, &paths(&[P]), t),
            _ => h.e.withdraw(&a, &paths(&[P]), t),
        };
        let r = r.unwrap_or_else(|e| panic!("{verb}: {e:?}"));
        let want = match verb {
            "accept" => Status::Completed,
            "decline" => Status::Declined,
            _ => Status::Withdrawn,
        };
        assert_eq!(r.records[0].status, want, "{verb}");
        assert_eq!(r.records[0].counterparty, None, "{verb}");
        assert_eq!(h.e.is_fenced(&a, P), verb == "accept", "{verb}");
        h.assert_replay_equal();
    }
    // A second accept of a completed record answers it unchanged: no second event.
    let (mut h, _, b, _) = handed();
    let t = h.t();
    h.e.accept(&b, &paths(&[P]), t).unwrap();
    let t = h.t();
    let r = h.e.accept(&b, &paths(&[P]), t).unwrap();
    assert_eq!(r.records[0].status, Status::Completed);
    assert_eq!(h.count(EventKind::Accept), 1);
}

#[test]
fn a_record_no_longer_live_answers_handoff_not_live_with_its_status() {
    let (mut h, a, b, c) = handed();
    h.write(&c, P).unwrap(); // overtaken, and the version moved: final
    for verb in ["accept", "decline", "withdraw"] {
        let t = h.t();
        let r = match verb {
            "accept" => h.e.accept(&b, &paths(&[P]), t),
            "decline" => h.e.decline(&b, &paths(&[P]), t),
            _ => h.e.withdraw(&a, &paths(&[P]), t),
        };
        let err = r.unwrap_err();
        assert_eq!(err.reason, Reason::HandoffNotLive, "{verb}");
        assert_eq!(err.status, Some(Status::Overtaken), "{verb}");
        assert_eq!(err.path.as_deref(), Some(P), "{verb}");
    }
    assert_eq!(record(&h).status, Status::Overtaken);
}

#[test]
fn a_refused_multi_path_transfer_names_each_path_with_its_reason() {
    let (mut h, a, _, _) = handed();
    for p in ["ok.md", "unread.md"] {
        let st = h.next_stamp();
        let t = h.t();
        h.e.observe(p, st, t);
    }
    h.read(&a, "ok.md");
    let seq = h.e.last_seq();
    let err = h
        .transfer(&a, &["ok.md", "unread.md", "missing.md"], "carol")
        .unwrap_err();
    assert_eq!(err.reason, Reason::HandoffNotHeld);
    assert_eq!(err.path.as_deref(), Some("unread.md"));
    let per: Vec<(Option<&str>, Reason)> = err
        .per_path
        .iter()
        .map(|r| (r.path.as_deref(), r.reason))
        .collect();
    assert_eq!(
        per,
        vec![
            (Some("unread.md"), Reason::HandoffNotHeld),
            (Some("missing.md"), Reason::NoSuchPath),
        ]
    );
    assert_eq!(h.e.last_seq(), seq, "all or nothing: nothing logged");
    // The fence refusal names its path and the record's status.
    let t = h.t();
    let err = h.e.acquire(&a, P, t).unwrap_err();
    assert_eq!(
        (err.reason, err.path.as_deref(), err.status),
        (Reason::Fenced, Some(P), Some(Status::Pending))
    );
}

#[test]
fn decide_fences_both_names_of_a_link_and_every_path_under_a_renamed_directory() {
    let (mut h, a, _, c) = handed();
    let t = h.t();
    let w = Write::Link {
        from: Some(At::unseen(P)),
        to: At::new("copy.md", Found::Absent),
    };
    let err = h.e.decide(&a, w, t).unwrap_err();
    assert_eq!(err.reason, Reason::Fenced);
    let t = h.t();
    let pm = h.e.decide(&c, w, t).unwrap();
    assert_eq!((pm.path.as_str(), pm.acquired), ("copy.md", None));

    // A directory holding a handed path: renaming it either way is refused.
    let st = h.next_stamp();
    let t = h.t();
    h.e.observe("d/deep.md", st, t);
    h.read(&a, "d/deep.md");
    h.transfer(&a, &["d/deep.md"], "bob").unwrap();
    for (from, to, exchange) in [("d", "e", false), ("e", "d", true)] {
        let w = Write::Rename {
            from: At::new(
                from,
                if from == "d" {
                    Found::Dir
                } else {
                    Found::File(stamp(1).unwrap())
                },
            ),
            to: At::new(to, if to == "d" { Found::Dir } else { Found::Absent }),
            exchange,
        };
        let t = h.t();
        let err = h.e.decide(&a, w, t).unwrap_err();
        assert_eq!(err.reason, Reason::Fenced, "{from} -> {to}");
        assert_eq!(err.path.as_deref(), Some("d/deep.md"));
    }
}

#[test]
fn decide_counts_a_change_behind_the_volumes_back_before_the_fence() {
    let (mut h, a, _, _) = handed();
    // The backing file changed while nobody wrote through the volume: an external
    // commit moves the version, the record is overtaken, and the fence lifts. (An
    // append: the giver's view is older than the external version now, and under the
    // default `--stale guard` an overwrite from it would be refused `stale_view`.)
    let t = h.t();
    let w = Write::Append(At::new(P, Found::File(stamp(999).unwrap())));
    let pm = h.e.decide(&a, w, t).unwrap();
    assert_eq!(pm.acquired.map(|x| x.version), Some(3));
    assert_eq!(pm.pre, stamp(999));
    assert_eq!(h.count(EventKind::ExternalChange), 1);
    assert_eq!(record(&h).status, Status::Overtaken);
}

#[test]
fn computed_xattrs_are_refused_without_an_event() {
    let (mut h, _, _, c) = handed();
    let seq = h.e.last_seq();
    let t = h.t();
    let w = Write::Setxattr {
        at: At::unseen(P),
        name: b"user.coherent.version",
    };
    let err = h.e.decide(&c, w, t).unwrap_err();
    assert_eq!(err.errno(), libc::EACCES);
    assert_eq!(h.e.last_seq(), seq);
    let t = h.t();
    let w = Write::Setxattr {
        at: At::unseen(P),
        name: b"user.note",
    };
    h.e.decide(&c, w, t).unwrap();
}

/// Issue 20: a write route through an untracked name of a handed inode is fenced for the
/// giver only (denied event and deny text of the handed path); an unresolved caller is
/// refused while the inode has a live record; nothing else is changed.
#[test]
fn fence_alias_fences_the_giver_through_an_untracked_name() {
    let (mut h, a, b, c) = handed();
    let ino = h.e.stamp(P).expect("stamped").ino;
    let t = h.t();
    let err =
        h.e.fence_alias(&a, true, "build/p.alias", ino, Route::OpenWrite, t)
            .unwrap_err();
    assert_eq!(err.reason, Reason::Fenced);
    assert_eq!(err.path.as_deref(), Some(P));
    assert_eq!(h.e.why(&a).unwrap(), err.message);
    for s in [&b, &c] {
        let t = h.t();
        h.e.fence_alias(s, true, "build/p.alias", ino, Route::Unlink, t)
            .unwrap();
    }
    let t = h.t();
    let err =
        h.e.fence_alias(&uid0(), false, "build/p.alias", ino, Route::Setattr, t)
            .unwrap_err();
    assert_eq!(err.reason, Reason::Unresolved);
    // Another inode is not the handed one.
    let t = h.t();
    h.e.fence_alias(&a, true, "build/other", ino + 1, Route::OpenWrite, t)
        .unwrap();
    assert_eq!(
        h.e.path_state("build/p.alias"),
        None,
        "no entry for the untracked name"
    );
    assert_eq!(record(&h).status, Status::Pending);
    h.assert_replay_equal();
}

/// Issue 20: per-path entries nothing refers to are pruned (memory only, no event): never
/// logged, no record, no hold a rule reads. A file only read keeps its view (a transfer
/// needs it), a logged path its version, a handed path its record.
#[test]
fn prune_drops_only_what_nothing_refers_to() {
    let (mut h, a, _, c) = handed();
    for p in ["seen.md", "read.md"] {
        let st = h.next_stamp();
        let t = h.t();
        h.e.observe(p, st, t);
    }
    h.read(&c, "read.md");
    let durable = h.e.durable_state();
    let events = h.sink.events().len();
    assert_eq!(h.e.prune(), 1);
    assert_eq!(h.e.path_state("seen.md"), None);
    assert_eq!(h.e.version("read.md"), Some(1));
    assert_eq!(h.e.hold(&c, "read.md").map(|x| x.0), Some(Hold::S));
    assert!(h.e.is_fenced(&a, P));
    assert_eq!(h.e.durable_state(), durable);
    assert_eq!(h.sink.events().len(), events);
    // carol can still hand on what she read.
    h.transfer(&c, &["read.md"], "bob").unwrap();
    // The pruned path starts at v1 again when next seen, as after a restart.
    let st = h.next_stamp();
    let t = h.t();
    assert_eq!(h.e.observe("seen.md", st, t), Some(1));
    assert_eq!(h.e.prune(), 1);
    h.assert_replay_equal();
}

/// Issue 20: the views of sessions gone are forgotten (memory only) and the entries of
/// paths only they read go with them; a write handle, a record or a logged path stays.
#[test]
fn forget_views_of_gone_sessions_drops_what_only_they_read() {
    let (mut h, a, b, c) = handed();
    for p in ["r1.md", "r2.md"] {
        let st = h.next_stamp();
        let t = h.t();
        h.e.observe(p, st, t);
        h.read(&c, p);
    }
    h.read(&b, "r2.md");
    let t = h.t();
    h.e.acquire(&c, "w.md", t).unwrap();
    let names: Vec<String> = h.e.viewers().iter().map(|s| s.name.clone()).collect();
    assert!(names.contains(&"carol".to_string()), "{names:?}");
    let durable = h.e.durable_state();
    assert_eq!(
        h.e.forget_views(&["carol".to_string()]),
        1,
        "only r1.md goes"
    );
    assert_eq!(h.e.path_state("r1.md"), None);
    assert_eq!(h.e.hold(&b, "r2.md").map(|x| x.0), Some(Hold::S));
    assert_eq!(h.e.hold(&c, "r2.md"), None);
    assert_eq!(
        h.e.hold(&c, "w.md").map(|x| x.0),
        Some(Hold::E),
        "a write handle stays"
    );
    assert!(h.e.is_fenced(&a, P));
    assert_eq!(h.e.durable_state(), durable);
    h.assert_replay_equal();
}
