//! The content check of a changed stamp (docs/versions-and-holds.md#content), in the core:
//! a stamp that moved with the handed bytes unchanged is a metadata-only change (nothing
//! counted, the record live); other bytes are a change by `external`; without a fingerprint
//! nothing is counted; on several hosts an older version's bytes are a copy behind.

use crate::core_common;

use coherent::coherence::*;
use coherent::identity::Session;
use core_common::*;

const P: &str = "plan.md";

fn print(size: u64, byte: u8) -> Print {
    Print {
        size,
        digest: [byte; 32],
    }
}

/// A stamp of this host's copy: inode, ctime, size, mtime.
fn st(ino: u64, ctime: i64, size: u64, mtime: i64) -> Stamp {
    Stamp {
        ino,
        ctime_ns: ctime,
        size,
        mtime_ns: mtime,
    }
}

/// plan.md (5 bytes, print A) read by alice and handed to bob, with its fingerprint.
fn handed(config: Config) -> (H, Session) {
    let mut h = H::with(config);
    let (a, b) = (sess("alice"), sess("bob"));
    for s in [&a, &b] {
        let t = h.t();
        h.e.session_seen(s, t);
    }
    let t = h.t();
    h.e.observe(P, Some(st(7, 1, 5, 1)), t);
    h.read(&a, P);
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(7, 1, 5, 1), Some(print(5, 0xa)), t),
        Content::Unchanged
    );
    h.transfer(&a, &[P], "bob").unwrap();
    (h, a)
}

/// Another host's engine (named `name`, so it judges copies) that has seen `sessions`.
fn host_seeing(name: &str, sessions: &[&Session]) -> H {
    let mut h = H::with(Config {
        host: Some(name.into()),
        ..Config::default()
    });
    for s in sessions {
        let t = h.t();
        h.e.session_seen(s, t);
    }
    h
}

fn live(h: &H) -> bool {
    !h.e.status(Some(P)).live.is_empty()
}

#[test]
fn a_metadata_only_change_is_restamped_and_ends_nothing() {
    let (mut h, a) = handed(Config::default());
    // touch -m: ctime and mtime moved, same size: only the content can tell.
    let moved = st(7, 2, 5, 2);
    assert!(h.e.wants_print(P, &moved));
    // Without the fingerprint nothing is counted (fail closed), and it is asked again.
    let t = h.t();
    assert_eq!(h.e.observe(P, Some(moved), t), Some(1));
    assert!(h.e.wants_print(P, &moved), "judged without the content");
    // With the same bytes: restamped, nothing logged, still fenced.
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, moved, Some(print(5, 0xa)), t),
        Content::Same
    );
    assert_eq!(h.e.stamp(P), Some(moved));
    assert!(!h.e.wants_print(P, &moved));
    assert_eq!(h.count(EventKind::ExternalChange), 0);
    assert!(live(&h) && h.e.is_fenced(&a, P));
    // Another size is a change without reading anything.
    assert!(!h.e.wants_print(P, &st(7, 3, 6, 3)));
    h.assert_replay_equal();
}

#[test]
fn other_bytes_of_the_same_size_are_a_change_by_external() {
    let (mut h, a) = handed(Config::default());
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(7, 2, 5, 1), Some(print(5, 0xb)), t),
        Content::Changed
    );
    assert_eq!(h.count(EventKind::ExternalChange), 1);
    assert!(!live(&h) && !h.e.is_fenced(&a, P));
    let ended = &h.e.status(Some(P)).ended[0];
    assert_eq!(ended.status, Status::Overtaken);
    assert_eq!(ended.counterparty.as_deref(), Some(EXTERNAL));
    // On one host the old bytes coming back are a change too (a revert, not a lag).
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(7, 3, 5, 1), Some(print(5, 0xa)), t),
        Content::Changed
    );
    h.assert_replay_equal();
}

#[test]
fn without_a_fingerprint_size_and_mtime_decide() {
    let mut h = H::new();
    let t = h.t();
    h.e.observe(P, Some(st(7, 1, 5, 1)), t);
    for (stamp, counted) in [
        (st(7, 2, 5, 1), false), // chmod, xattr, touch -a
        (st(7, 3, 5, 9), true),  // touch -m, or a rewrite
        (st(7, 4, 6, 9), true),  // another size
    ] {
        let before = h.count(EventKind::ExternalChange);
        let t = h.t();
        h.e.observe(P, Some(stamp), t);
        assert_eq!(
            h.count(EventKind::ExternalChange) - before,
            counted as usize
        );
    }
}

/// Host B of `handed`, which then learns from the other host that v2 (5 bytes, print C)
/// was committed there: this copy still holds v1's bytes (A).
fn v2_committed_elsewhere() -> (H, Session) {
    let config = Config {
        host: Some("B".into()),
        ..Config::default()
    };
    let (h, a) = handed(config);
    let mut s = h.e.shared_state(P).expect("shared");
    s.version = 2;
    s.print = Some(print(5, 0xc));
    h.e.adopt(P, Some(s));
    (h, a)
}

#[test]
fn on_several_hosts_a_copy_with_an_older_versions_bytes_is_behind() {
    let (mut h, _) = v2_committed_elsewhere();
    // A copy replaced by the sync (another inode) still holding v1's bytes: behind.
    let old = st(9, 6, 5, 1);
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, old, Some(print(5, 0xa)), t),
        Content::Behind(1)
    );
    assert_eq!(h.count(EventKind::ExternalChange), 0);
    assert_eq!(h.e.version(P), Some(2));
    // The sync arrives: caught up.
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(9, 7, 5, 5), Some(print(5, 0xc)), t),
        Content::Same
    );
    assert_eq!(h.count(EventKind::ExternalChange), 0);
}

#[test]
fn on_several_hosts_a_copy_that_held_a_newer_version_and_goes_back_is_a_change() {
    // Caught up with v2, then v1's bytes put back (a revert, or a sync from a copy that
    // lags over this one): v2 is erased, which is counted, not taken for a lag.
    let (mut h, _) = v2_committed_elsewhere();
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(9, 7, 5, 5), Some(print(5, 0xc)), t),
        Content::Same
    );
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(9, 8, 5, 1), Some(print(5, 0xa)), t),
        Content::Changed
    );
    assert_eq!(h.count(EventKind::ExternalChange), 1);
    assert_eq!(h.e.version(P), Some(3));

    // The same after a commit through this host's own mount: the successor's v2 is this
    // copy's, and the handed v1's bytes coming back end the record.
    let config = Config {
        host: Some("B".into()),
        ..Config::default()
    };
    let (mut h, a) = handed(config);
    let b = sess("bob");
    let t = h.t();
    h.e.acquire(&b, P, t).unwrap();
    let t = h.t();
    h.e.commit(&b, P, CommitOp::Write, Some(st(7, 5, 5, 5)), t);
    h.e.note_print(P, st(7, 5, 5, 5), print(5, 0xc));
    let t = h.t();
    h.e.close_write(&b, P, true, t);
    h.transfer(&b, &[P], "alice").unwrap();
    assert!(h.e.is_fenced(&b, P));
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(9, 6, 5, 1), Some(print(5, 0xa)), t),
        Content::Changed
    );
    assert!(!h.e.is_fenced(&b, P), "the record ended");
    assert!(!h.e.is_fenced(&a, P));
    h.assert_replay_equal();
}

/// A commit decided before a newer change of the path was counted and applied after it (a
/// RELEASE on its own thread, late) keeps the newer stamp: the file as it is now is not a
/// change behind the volume's back, so nothing is counted `external` at the next open.
#[test]
fn a_late_commit_with_an_older_stamp_keeps_the_newer_one() {
    let mut h = H::with(Config::default());
    let a = sess("alice");
    let t = h.t();
    h.e.session_seen(&a, t);
    let newer = st(8, 20, 3, 20); // the file that is at the path now
    let older = st(7, 10, 8, 10); // the file an old handle wrote, stamped before it
    let t = h.t();
    h.e.commit(&a, P, CommitOp::Write, Some(newer), t);
    let t = h.t();
    h.e.commit(&a, P, CommitOp::Write, Some(older), t);
    assert_eq!(h.e.stamp(P), Some(newer));
    let t = h.t();
    assert_eq!(h.e.observe(P, Some(newer), t), Some(2));
    assert_eq!(h.count(EventKind::ExternalChange), 0);
    // A later stamp still replaces it.
    let later = st(8, 30, 4, 30);
    let t = h.t();
    h.e.commit(&a, P, CommitOp::Write, Some(later), t);
    assert_eq!(h.e.stamp(P), Some(later));
    h.assert_replay_equal();
}

/// A judgement of bytes read before a newer stamp was counted (the judge's worker, late)
/// says nothing: the file no longer holds them, so it is no change behind the volume's back.
#[test]
fn a_late_judgement_of_an_older_stamp_counts_nothing() {
    let mut h = H::with(Config::default());
    let a = sess("alice");
    let t = h.t();
    h.e.session_seen(&a, t);
    let t = h.t();
    h.e.commit(&a, P, CommitOp::Write, Some(st(7, 20, 5, 20)), t);
    // Read at ctime 10 (before the commit), other bytes: applied late, nothing counted.
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(7, 10, 5, 10), Some(print(5, 0xb)), t),
        Content::Unchanged
    );
    assert_eq!(h.count(EventKind::ExternalChange), 0);
    assert_eq!(h.e.stamp(P), Some(st(7, 20, 5, 20)));
    h.assert_replay_equal();
}

/// Host B, which has never looked at plan.md, learns from host A that A edited it (v2, 7
/// bytes, print C: an edit before any transfer, so v1's bytes were never fingerprinted)
/// and handed it from alice to bob.
fn edited_and_handed_elsewhere() -> (H, Session) {
    let mut a = H::new();
    let (alice, bob) = (sess("alice"), sess("bob"));
    for s in [&alice, &bob] {
        let t = a.t();
        a.e.session_seen(s, t);
    }
    let t = a.t();
    a.e.observe(P, Some(st(7, 1, 5, 1)), t);
    let t = a.t();
    a.e.acquire(&alice, P, t).unwrap();
    let t = a.t();
    a.e.commit(&alice, P, CommitOp::Write, Some(st(7, 2, 7, 2)), t);
    let t = a.t();
    a.e.close_write(&alice, P, true, t);
    a.read(&alice, P);
    let t = a.t();
    a.e.observe_content(P, st(7, 2, 7, 2), Some(print(7, 0xc)), t);
    a.transfer(&alice, &[P], "bob").unwrap();
    let shared = a.e.shared_state(P).expect("shared");
    assert_eq!((shared.version, shared.print), (2, Some(print(7, 0xc))));

    let b = host_seeing("B", &[&alice, &bob]);
    b.e.adopt(P, Some(shared));
    assert!(b.e.is_fenced(&alice, P));
    (b, alice)
}

/// Issue 39 item 1: the first look at a copy the sync has not reached, holding bytes of a
/// version no host fingerprinted, is a copy that lags: nothing counted, the record stays,
/// its stamp is kept; the sync's arrival is no change, and a change after it is one.
#[test]
fn on_several_hosts_the_first_look_at_a_copy_the_edit_has_not_reached_is_a_lag() {
    let (mut h, alice) = edited_and_handed_elsewhere();
    let lagging = st(9, 1, 5, 1);
    // Another size than any known version: nothing to read, and nothing counted.
    assert!(!h.e.wants_print(P, &lagging));
    let t = h.t();
    assert_eq!(h.e.observe(P, Some(lagging), t), Some(2));
    assert_eq!(h.count(EventKind::ExternalChange), 0);
    assert!(h.e.is_fenced(&alice, P) && live(&h));
    assert_eq!(h.e.stamp(P), Some(lagging), "the copy's stamp is kept");
    let t = h.t();
    assert_eq!(h.e.observe(P, Some(lagging), t), Some(2));
    // The sync arrives (another inode, v2's bytes): caught up, no change.
    let synced = st(10, 3, 7, 2);
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, synced, Some(print(7, 0xc)), t),
        Content::Same
    );
    assert_eq!(h.count(EventKind::ExternalChange), 0);
    assert!(h.e.is_fenced(&alice, P));
    // Now a real change on this copy: counted, the record ends.
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(10, 4, 7, 4), Some(print(7, 0xd)), t),
        Content::Changed
    );
    assert_eq!(h.count(EventKind::ExternalChange), 1);
    assert!(!live(&h) && !h.e.is_fenced(&alice, P));
}

/// The same first look with bytes of another size than the first look's, later: a change
/// of the copy after the first look is one.
#[test]
fn on_several_hosts_a_copy_that_moves_after_its_first_look_changed() {
    let (mut h, alice) = edited_and_handed_elsewhere();
    let t = h.t();
    h.e.observe(P, Some(st(9, 1, 5, 1)), t);
    let t = h.t();
    h.e.observe(P, Some(st(9, 5, 9, 5)), t);
    assert_eq!(h.count(EventKind::ExternalChange), 1);
    assert!(!h.e.is_fenced(&alice, P));
}

/// A copy this host looked at (v1's stamp), then another host's commit moved the version
/// on: the copy as it was lags, whatever print is offered for its unchanged stamp.
#[test]
fn on_several_hosts_an_unchanged_copy_lags_when_another_host_moves_the_version_on() {
    let config = Config {
        host: Some("B".into()),
        ..Config::default()
    };
    let (mut h, a) = handed(config);
    let mut s = h.e.shared_state(P).expect("shared");
    s.version = 2;
    s.print = Some(print(6, 0xc));
    h.e.adopt(P, Some(s));
    let v1 = st(7, 1, 5, 1);
    assert_eq!(h.e.stamp(P), Some(v1), "this copy's stamp is kept");
    let t = h.t();
    assert_eq!(h.e.observe(P, Some(v1), t), Some(2));
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, v1, Some(print(5, 0xa)), t),
        Content::Unchanged
    );
    assert_eq!(h.count(EventKind::ExternalChange), 0);
    assert_eq!(h.e.version(P), Some(2));
    // The sync arrives: caught up; then v1's bytes put back: a revert, counted.
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(9, 2, 6, 2), Some(print(6, 0xc)), t),
        Content::Same
    );
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(9, 3, 5, 1), Some(print(5, 0xa)), t),
        Content::Changed
    );
    assert_eq!(h.count(EventKind::ExternalChange), 1);
    let _ = a;
}

/// On a copy that never held the file (created and handed on by another host), the file
/// not being there yet is the sync not having arrived: not a removal.
#[test]
fn on_several_hosts_a_file_not_yet_on_a_copy_that_never_held_it_is_no_removal() {
    let (mut h, alice) = edited_and_handed_elsewhere();
    let t = h.t();
    assert_eq!(h.e.observe(P, None, t), None);
    assert_eq!(h.count(EventKind::ExternalChange), 0);
    assert!(h.e.is_fenced(&alice, P) && live(&h));
    // Once it held the file, its going is a removal.
    let t = h.t();
    h.e.observe_content(P, st(9, 1, 7, 1), Some(print(7, 0xc)), t);
    let t = h.t();
    h.e.observe(P, None, t);
    assert_eq!(h.count(EventKind::ExternalChange), 1);
}

/// Issue 39: versions another host published one after the other (v2, then v3) are known
/// here by their fingerprints: a copy the sync brings v2 while v3 is current lags behind
/// (no transfer was made at v2); once it held v3, v2's bytes coming back are a change.
#[test]
fn on_several_hosts_a_copy_that_reaches_a_version_between_lags_behind() {
    let (mut h, a) = v2_committed_elsewhere();
    let mut s = h.e.shared_state(P).expect("shared");
    s.version = 3;
    s.print = Some(print(6, 0xd));
    h.e.adopt(P, Some(s));
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(9, 6, 5, 5), Some(print(5, 0xc)), t),
        Content::Behind(2),
        "v2's bytes, v3 current"
    );
    assert_eq!(h.count(EventKind::ExternalChange), 0);
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(9, 7, 6, 6), Some(print(6, 0xd)), t),
        Content::Same
    );
    let t = h.t();
    assert_eq!(
        h.e.observe_content(P, st(9, 8, 5, 5), Some(print(5, 0xc)), t),
        Content::Changed,
        "v2's bytes after this copy held v3"
    );
    assert_eq!(h.count(EventKind::ExternalChange), 1);
    let _ = a;
}

/// Versions one host made before a file's first transfer (v2, v3 on A, known from its
/// history) are published with the transfer: host B, which looked at its copy of v1 before
/// it, finds the sync bringing v2 behind (no change, the record live), then v3 caught up.
#[test]
fn on_several_hosts_versions_made_before_the_first_transfer_are_behind() {
    let mut a = H::new();
    let (alice, bob) = (sess("alice"), sess("bob"));
    for s in [&alice, &bob] {
        let t = a.t();
        a.e.session_seen(s, t);
    }
    let t = a.t();
    a.e.observe(P, Some(st(7, 1, 5, 1)), t);
    for (n, size) in [(2, 7), (3, 9)] {
        let t = a.t();
        a.e.acquire(&alice, P, t).unwrap();
        let t = a.t();
        a.e.commit(&alice, P, CommitOp::Write, Some(st(7, n, size, n)), t);
        let t = a.t();
        a.e.close_write(&alice, P, true, t);
    }
    a.e.know_older_prints(
        P,
        vec![(2, print(7, 0xb)), (1, print(5, 0xa)), (3, print(9, 0xf))],
    );
    a.read(&alice, P);
    let t = a.t();
    a.e.observe_content(P, st(7, 3, 9, 3), Some(print(9, 0xc)), t);
    a.transfer(&alice, &[P], "bob").unwrap();
    let shared = a.e.shared_state(P).expect("shared");
    assert_eq!(
        shared.older,
        vec![(2, print(7, 0xb)), (1, print(5, 0xa))],
        "the current version's is no older one"
    );

    let mut b = host_seeing("B", &[&alice, &bob]);
    let t = b.t();
    b.e.observe(P, Some(st(9, 1, 5, 1)), t);
    b.e.adopt(P, Some(shared));
    let t = b.t();
    assert_eq!(b.e.observe(P, Some(st(9, 1, 5, 1)), t), Some(3));
    let v2 = st(10, 2, 7, 2);
    assert!(b.e.wants_print(P, &v2), "v2's size is a known version's");
    let t = b.t();
    assert_eq!(
        b.e.observe_content(P, v2, Some(print(7, 0xb)), t),
        Content::Behind(2)
    );
    assert_eq!(b.count(EventKind::ExternalChange), 0);
    assert!(b.e.is_fenced(&alice, P) && live(&b));
    let t = b.t();
    assert_eq!(
        b.e.observe_content(P, st(11, 3, 9, 3), Some(print(9, 0xc)), t),
        Content::Same
    );
    assert!(b.e.is_fenced(&alice, P) && live(&b));
}

/// A host's own commit moves the version on past a fingerprint it knew (v2's, taken when
/// it looked): that version stays known and is published, so a host that takes in v3
/// directly, never having seen v2, finds a copy the sync brings v2 behind.
#[test]
fn on_several_hosts_a_version_another_host_skipped_is_still_known_behind() {
    let (mut a, alice) = handed(Config {
        host: Some("A".into()),
        ..Config::default()
    });
    let bob = sess("bob");
    for (n, size) in [(2i64, 6u64), (3, 8)] {
        let t = a.t();
        a.e.acquire(&bob, P, t).unwrap();
        let t = a.t();
        a.e.commit(&bob, P, CommitOp::Write, Some(st(7, n, size, n)), t);
        let t = a.t();
        a.e.close_write(&bob, P, true, t);
        if n == 2 {
            let t = a.t();
            a.e.observe_content(P, st(7, 9, 6, 2), Some(print(6, 0xb)), t);
        }
    }
    let shared = a.e.shared_state(P).expect("shared");
    assert_eq!(shared.version, 3);
    assert!(
        shared.older.contains(&(2, print(6, 0xb))),
        "v2's fingerprint published: {:?}",
        shared.older
    );

    let mut c = host_seeing("C", &[&alice, &bob]);
    let t = c.t();
    c.e.observe(P, Some(st(5, 1, 5, 1)), t);
    c.e.adopt(P, Some(shared));
    let t = c.t();
    assert_eq!(
        c.e.observe_content(P, st(6, 2, 6, 2), Some(print(6, 0xb)), t),
        Content::Behind(2)
    );
    assert_eq!(c.count(EventKind::ExternalChange), 0);
}

/// Host A, where alice committed v2 (9 bytes, stamp `A_V2`), and the state host B
/// publishes when carol hands B's v2 on to bob: another change B found on its copy
/// (`b_bytes`, print B), or the same bytes as A's.
const A_V2: Stamp = Stamp {
    ino: 7,
    ctime_ns: 2,
    size: 9,
    mtime_ns: 2,
};

fn a_committed_and_b_handed(b_print: Print) -> (H, SharedPath) {
    let (alice, bob, carol) = (sess("alice"), sess("bob"), sess("carol"));
    let mut a = host_seeing("A", &[&alice, &bob, &carol]);
    let t = a.t();
    a.e.observe(P, Some(st(7, 1, 5, 1)), t);
    let t = a.t();
    a.e.acquire(&alice, P, t).unwrap();
    let t = a.t();
    a.e.commit(&alice, P, CommitOp::Write, Some(A_V2), t);
    let t = a.t();
    a.e.close_write(&alice, P, true, t);

    let mut b = host_seeing("B", &[&alice, &bob, &carol]);
    let t = b.t();
    b.e.observe(P, Some(st(5, 1, 5, 1)), t);
    let t = b.t();
    let found =
        b.e.observe_content(P, st(5, 2, b_print.size, 2), Some(b_print), t);
    assert_eq!(found, Content::Changed);
    b.read(&carol, P);
    b.transfer(&carol, &[P], "bob").unwrap();
    let shared = b.e.shared_state(P).expect("shared");
    assert_eq!((shared.version, shared.print), (2, Some(b_print)));
    (a, shared)
}

/// Two hosts counted v2 apart (issue 39, the seeded lag run's race): A's copy holds
/// alice's v2, which carol on B never saw. Taking in B's transfer, A finds it `newer`
/// (the transfer is to be undone) and counts its copy again as v3, alice's, with its
/// fingerprint (to publish): never a change behind A's back.
#[test]
fn on_several_hosts_a_version_counted_here_that_a_transfer_lacks_is_newer_and_counted_again() {
    let (mut a, shared) = a_committed_and_b_handed(print(20, 0xb));
    let t = a.t();
    let got =
        a.e.adopt_beside(P, Some(shared), Some((A_V2, print(9, 0xa))), t);
    assert_eq!(got.records.len(), 1);
    assert!(got.records[0].newer && !got.records[0].writing, "{got:?}");
    assert!(got.recounted);
    assert_eq!(a.e.version(P), Some(3));
    let last = a.sink.events().last().cloned().unwrap();
    assert_eq!(
        (
            last.event,
            last.session.as_deref(),
            last.version,
            last.print
        ),
        (
            EventKind::Commit,
            Some("alice"),
            Some(3),
            Some(print(9, 0xa))
        )
    );
    assert!(!live(&a), "the record over A's copy stayed live");
    let t = a.t();
    assert_eq!(
        a.e.observe_content(P, A_V2, Some(print(9, 0xa)), t),
        Content::Unchanged
    );
    assert_eq!(a.count(EventKind::ExternalChange), 0);
}

/// The same bytes on both copies: what carol handed is what A holds; nothing to undo.
#[test]
fn on_several_hosts_a_transfer_of_the_bytes_a_host_counted_is_taken_in_as_is() {
    let (mut a, shared) = a_committed_and_b_handed(print(9, 0xa));
    let t = a.t();
    let got =
        a.e.adopt_beside(P, Some(shared), Some((A_V2, print(9, 0xa))), t);
    assert!(!got.records[0].newer && !got.recounted, "{got:?}");
    assert_eq!(a.e.version(P), Some(2));
    assert!(live(&a));
}

/// A's copy could not be read as counted (it changed since, or no reader): fail closed,
/// the transfer is `newer` (undone), nothing is counted, and the copy is judged again at
/// its next look (here: bytes that are not B's v2, a change).
#[test]
fn on_several_hosts_a_counted_copy_that_cannot_be_told_fails_a_transfer_closed() {
    let (mut a, shared) = a_committed_and_b_handed(print(20, 0xb));
    let t = a.t();
    let got = a.e.adopt_beside(P, Some(shared), None, t);
    assert!(got.records[0].newer && !got.recounted, "{got:?}");
    assert_eq!(a.e.version(P), Some(2));
    let t = a.t();
    assert_eq!(
        a.e.observe_content(P, A_V2, Some(print(9, 0xa)), t),
        Content::Changed
    );
}

/// Below the adopted version, A's counted copy lags when the state knows its bytes (an
/// older version's), and is newer when it does not.
#[test]
fn on_several_hosts_a_counted_copy_below_the_adopted_version_is_newer_only_if_unknown() {
    for known in [true, false] {
        let (mut a, mut shared) = a_committed_and_b_handed(print(20, 0xb));
        shared.version = 3;
        for r in &mut shared.records {
            r.version_at_transfer = 3;
        }
        if known {
            shared.older.push((2, print(9, 0xa)));
        }
        let t = a.t();
        let got =
            a.e.adopt_beside(P, Some(shared), Some((A_V2, print(9, 0xa))), t);
        assert_eq!(got.records[0].newer, !known, "known: {known}: {got:?}");
        assert_eq!(got.recounted, !known, "known: {known}");
        assert_eq!(a.e.version(P), Some(if known { 3 } else { 4 }));
    }
}

/// A count of fewer commits and nothing else (the same records, none live) never undoes
/// commits counted here, however late it is taken in: this host's count stands, to be
/// published over it; any other difference is taken in.
#[test]
fn on_several_hosts_a_state_that_counted_fewer_commits_is_never_taken_over_this_hosts() {
    let (mut a, shared) = a_committed_and_b_handed(print(9, 0xa));
    let t = a.t();
    a.e.adopt_beside(P, Some(shared.clone()), None, t);
    let bob = sess("bob");
    a.write(&bob, P).unwrap();
    a.write(&bob, P).unwrap();
    let mine = a.e.shared_state(P).expect("shared");
    assert_eq!(mine.version, 4);
    let mut theirs = mine.clone();
    theirs.version = 3;
    assert!(mine.counted_further(&theirs));
    let t = a.t();
    let got = a.e.adopt_beside(P, Some(theirs.clone()), None, t);
    assert!(got.kept, "{got:?}");
    assert_eq!(a.e.version(P), Some(4));
    // Another step of theirs (a record changed) wins.
    theirs.records[0].status = Status::Declined;
    let t = a.t();
    let got = a.e.adopt_beside(P, Some(theirs), None, t);
    assert!(!got.kept, "{got:?}");
    assert_eq!(a.e.version(P), Some(3));
}

/// A version taken in from another host is not this host's own, even on a copy that
/// caught up with it after this host's own commit: a later state meeting it is that
/// host's to count again, never this one's in the name of its last writer here.
#[test]
fn on_several_hosts_a_version_taken_in_and_caught_up_is_not_counted_again_here() {
    let (mut a, mut shared) = a_committed_and_b_handed(print(20, 0xb));
    shared.version = 3;
    shared.print = Some(print(30, 0x3));
    shared.records.clear();
    let t = a.t();
    let got = a.e.adopt_beside(P, Some(shared.clone()), None, t);
    assert!(!got.recounted && !got.kept, "{got:?}");
    let t = a.t();
    assert_eq!(
        a.e.observe_content(P, st(7, 9, 30, 9), Some(print(30, 0x3)), t),
        Content::Same
    );
    assert_eq!(a.e.own_copy(P), None, "v3 was counted on another host");
    // A third host's account of v3, other bytes, with a transfer over it.
    let (_, mut third) = a_committed_and_b_handed(print(31, 0xc));
    third.version = 3;
    third.print = Some(print(31, 0xc));
    for r in &mut third.records {
        r.version_at_transfer = 3;
    }
    let t = a.t();
    let got = a.e.adopt_beside(P, Some(third), None, t);
    assert!(!got.recounted && !got.records[0].newer, "{got:?}");
    assert_eq!(a.count(EventKind::Commit), 1, "only alice's own commit");
}
