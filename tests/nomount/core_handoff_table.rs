//! The handoff table of docs/design.md#handoff (docs/handoff.md, "What ends a handoff"), one test
//! per row, in the core (issue 20): while a record is live its status follows the latest
//! event, and `decline` and `withdraw` end it whatever its live status, so the three ways
//! out the deny text names always work.

use crate::core_common;
use coherent::coherence::*;
use coherent::error::Reason;
use coherent::identity::Session;
use core_common::*;

const P: &str = "plan.md";

/// alice commits plan.md v2 and hands it to bob (or offers it to `any`); carol is a
/// bystander.
fn handed_to(to: &str) -> (H, Session, Session, Session) {
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
    h.transfer(&a, &[P], to).unwrap();
    (h, a, b, c)
}

fn handed() -> (H, Session, Session, Session) {
    handed_to("bob")
}

/// The one record of plan.md.
fn record(h: &H) -> RecordJson {
    let st = h.e.status(Some(P));
    let mut all: Vec<RecordJson> = st.live.into_iter().chain(st.ended).collect();
    assert_eq!(all.len(), 1, "{all:?}");
    all.remove(0)
}

/// The three live statuses, reached from `pending` by the table's own events.
#[derive(Debug, Clone, Copy)]
enum Live {
    Pending,
    Completed,
    Overtaken,
}

const LIVE: [Live; 3] = [Live::Pending, Live::Completed, Live::Overtaken];

fn in_status(l: Live) -> (H, Session, Session, Session) {
    let (mut h, a, b, c) = handed();
    let t = h.t();
    match l {
        Live::Pending => {}
        Live::Completed => {
            h.e.accept(&b, &paths(&[P]), t).unwrap();
        }
        Live::Overtaken => {
            h.e.acquire(&c, P, t).unwrap();
            let t = h.t();
            h.e.close_write(&c, P, false, t);
        }
    }
    let r = record(&h);
    assert!(r.live);
    assert_eq!(
        r.status,
        match l {
            Live::Pending => Status::Pending,
            Live::Completed => Status::Completed,
            Live::Overtaken => Status::Overtaken,
        }
    );
    (h, a, b, c)
}

#[test]
fn row_successor_commits_completed_and_the_fence_lifts() {
    for l in LIVE {
        let (mut h, a, b, _) = in_status(l);
        assert_eq!(h.write(&b, P).unwrap(), 3);
        let r = record(&h);
        assert_eq!(r.status, Status::Completed, "{l:?}");
        assert_eq!(r.counterparty, None, "{l:?}");
        assert!(!r.live, "{l:?}");
        assert!(!h.e.is_fenced(&a, P), "{l:?}");
        h.assert_replay_equal();
    }
}

#[test]
fn row_successor_acquires_completed_and_the_fence_stays() {
    for l in LIVE {
        let (mut h, a, b, _) = in_status(l);
        let before = h.count(EventKind::Completed);
        let t = h.t();
        h.e.acquire(&b, P, t).unwrap();
        let t = h.t();
        h.e.close_write(&b, P, false, t);
        let r = record(&h);
        assert_eq!(r.status, Status::Completed, "{l:?}");
        assert_eq!(r.counterparty, None, "{l:?}");
        assert!(r.live, "{l:?}");
        assert!(h.e.is_fenced(&a, P), "{l:?}");
        // A record already completed is not completed a second time.
        let want = match l {
            Live::Completed => before,
            _ => before + 1,
        };
        assert_eq!(h.count(EventKind::Completed), want, "{l:?}");
        h.assert_replay_equal();
    }
}

#[test]
fn row_accept_completed_and_the_fence_stays_and_a_second_accept_changes_nothing() {
    for l in LIVE {
        let (mut h, a, b, _) = in_status(l);
        let accepts = h.count(EventKind::Accept);
        let t = h.t();
        let r = h.e.accept(&b, &paths(&[P]), t).unwrap();
        assert_eq!(r.records[0].status, Status::Completed, "{l:?}");
        assert_eq!(r.records[0].counterparty, None, "{l:?}");
        assert!(r.records[0].live, "{l:?}");
        assert!(h.e.is_fenced(&a, P), "{l:?}");
        let want = match l {
            Live::Completed => accepts,
            _ => accepts + 1,
        };
        assert_eq!(h.count(EventKind::Accept), want, "{l:?}");
        h.assert_replay_equal();
    }
}

#[test]
fn row_decline_declined_and_the_fence_lifts_whatever_the_live_status() {
    for l in LIVE {
        let (mut h, a, b, _) = in_status(l);
        let t = h.t();
        let r = h.e.decline(&b, &paths(&[P]), t).unwrap();
        assert_eq!(r.records[0].status, Status::Declined, "{l:?}");
        assert_eq!(r.records[0].counterparty, None, "{l:?}");
        assert!(!r.records[0].live, "{l:?}");
        assert!(!h.e.is_fenced(&a, P), "{l:?}");
        assert_eq!(h.write(&a, P).unwrap(), 3, "{l:?}");
        h.assert_replay_equal();
    }
}

#[test]
fn row_withdraw_withdrawn_and_the_fence_lifts_whatever_the_live_status() {
    for l in LIVE {
        let (mut h, a, _, _) = in_status(l);
        let t = h.t();
        let r = h.e.withdraw(&a, &paths(&[P]), t).unwrap();
        assert_eq!(r.records[0].status, Status::Withdrawn, "{l:?}");
        assert!(!r.records[0].live, "{l:?}");
        assert!(!h.e.is_fenced(&a, P), "{l:?}");
        assert_eq!(h.write(&a, P).unwrap(), 3, "{l:?}");
        h.assert_replay_equal();
    }
}

#[test]
fn row_bystander_acquires_overtaken_with_counterparty_and_the_fence_stays() {
    for l in LIVE {
        let (mut h, a, _, _) = in_status(l);
        let d = sess("dave");
        let t = h.t();
        h.e.acquire(&d, P, t).unwrap();
        let r = record(&h);
        assert_eq!(r.status, Status::Overtaken, "{l:?}");
        assert_eq!(r.counterparty.as_deref(), Some("dave"), "{l:?}");
        assert!(r.live, "{l:?}");
        assert!(h.e.is_fenced(&a, P), "{l:?}");
        h.assert_replay_equal();
    }
}

#[test]
fn row_bystander_commits_overtaken_and_the_fence_lifts() {
    for l in LIVE {
        let (mut h, a, _, _) = in_status(l);
        let d = sess("dave");
        h.write(&d, P).unwrap();
        let r = record(&h);
        assert_eq!(r.status, Status::Overtaken, "{l:?}");
        assert_eq!(r.counterparty.as_deref(), Some("dave"), "{l:?}");
        assert!(!r.live, "{l:?}");
        assert!(!h.e.is_fenced(&a, P), "{l:?}");
        h.assert_replay_equal();
    }
}

#[test]
fn row_silence_changes_nothing() {
    for l in LIVE {
        let (mut h, a, _, _) = in_status(l);
        let before = record(&h);
        h.now += 400 * 24 * 3_600_000;
        let t = h.t();
        assert_eq!(h.e.evict(t), 0);
        // A read is a view without a hold: no status changes either.
        h.read(&sess("dave"), P);
        assert_eq!(record(&h), before, "{l:?}");
        assert!(h.e.is_fenced(&a, P), "{l:?}");
    }
}

#[test]
fn a_record_no_longer_live_is_final_every_verb_answers_handoff_not_live() {
    // Ended four ways: the version moved (completed, overtaken), declined, withdrawn.
    for end in ["commit", "overtake", "decline", "withdraw"] {
        let (mut h, a, b, c) = handed();
        let t = h.t();
        let status = match end {
            "commit" => {
                h.write(&b, P).unwrap();
                Status::Completed
            }
            "overtake" => {
                h.write(&c, P).unwrap();
                Status::Overtaken
            }
            "decline" => {
                h.e.decline(&b, &paths(&[P]), t).unwrap();
                Status::Declined
            }
            _ => {
                h.e.withdraw(&a, &paths(&[P]), t).unwrap();
                Status::Withdrawn
            }
        };
        let n = h.sink.events().len();
        for (verb, s) in [("accept", &b), ("decline", &b), ("withdraw", &a)] {
            let t = h.t();
            let r = match verb {
                "accept" => h.e.accept(s, &paths(&[P]), t),
                "decline" => h.e.decline(s, &paths(&[P]), t),
                _ => h.e.withdraw(s, &paths(&[P]), t),
            };
            let err = r.unwrap_err();
            assert_eq!(
                (err.reason, err.status),
                (Reason::HandoffNotLive, Some(status)),
                "{end} then {verb}"
            );
            assert_eq!(err.path.as_deref(), Some(P));
            assert!(err.message.contains(P), "{}", err.message);
        }
        // A commit never changes it either.
        h.write(&c, P).unwrap();
        assert_eq!(record(&h).status, status, "{end}");
        assert_eq!(
            h.sink.events().len(),
            n + 2,
            "{end}: acquire and commit only"
        );
    }
}

#[test]
fn an_exact_resend_of_a_transfer_whose_record_ended_is_handoff_ended() {
    for end in ["decline", "withdraw"] {
        let (mut h, a, b, _) = handed();
        let t = h.t();
        match end {
            "decline" => h.e.decline(&b, &paths(&[P]), t).map(drop).unwrap(),
            _ => h.e.withdraw(&a, &paths(&[P]), t).map(drop).unwrap(),
        }
        let err = h.transfer(&a, &[P], "bob").unwrap_err();
        assert_eq!(err.reason, Reason::HandoffEnded, "{end}");
    }
}

#[test]
fn an_offer_is_claimed_by_the_first_accept_and_then_has_every_way_out() {
    // Unclaimed: decline is not the successor's (nobody is), the giver's accept neither.
    let (mut h, a, b, c) = handed_to("any");
    let t = h.t();
    assert_eq!(
        h.e.decline(&b, &paths(&[P]), t).unwrap_err().reason,
        Reason::HandoffNotSuccessor
    );
    let t = h.t();
    assert_eq!(
        h.e.accept(&a, &paths(&[P]), t).unwrap_err().reason,
        Reason::HandoffNotSuccessor
    );
    // Overtaken before anyone claimed it: still an open offer, claimable.
    let t = h.t();
    h.e.acquire(&c, P, t).unwrap();
    let t = h.t();
    h.e.close_write(&c, P, false, t);
    assert_eq!(record(&h).status, Status::Overtaken);
    assert_eq!(h.e.inbox(&b).len(), 1, "an overtaken offer is still open");
    let t = h.t();
    let r = h.e.accept(&b, &paths(&[P]), t).unwrap();
    assert_eq!(r.records[0].status, Status::Completed);
    assert_eq!(r.records[0].claimed_by.as_deref(), Some("bob"));
    assert_eq!(r.records[0].counterparty, None);
    // Claimed: the claimant's accept again changes nothing, anyone else's is refused,
    // and the claimant may decline it.
    let t = h.t();
    h.e.accept(&b, &paths(&[P]), t).unwrap();
    assert_eq!(h.count(EventKind::Accept), 1);
    let t = h.t();
    assert_eq!(
        h.e.accept(&c, &paths(&[P]), t).unwrap_err().reason,
        Reason::HandoffNotSuccessor
    );
    let t = h.t();
    let r = h.e.decline(&b, &paths(&[P]), t).unwrap();
    assert_eq!(r.records[0].status, Status::Declined);
    assert!(!h.e.is_fenced(&a, P));
    h.assert_replay_equal();

    // A claimed offer: the giver's withdraw works too.
    let (mut h, a, b, _) = handed_to("any");
    let t = h.t();
    h.e.accept(&b, &paths(&[P]), t).unwrap();
    let t = h.t();
    let r = h.e.withdraw(&a, &paths(&[P]), t).unwrap();
    assert_eq!(r.records[0].status, Status::Withdrawn);
    assert!(!h.e.is_fenced(&a, P));
}

#[test]
fn the_deny_text_is_the_same_across_retries_and_status_changes() {
    let (mut h, a, b, c) = handed();
    let mut texts = Vec::new();
    for step in 0..3 {
        let t = h.t();
        match step {
            1 => {
                h.e.acquire(&c, P, t).unwrap();
                let t = h.t();
                h.e.close_write(&c, P, false, t);
            }
            2 => {
                h.e.accept(&b, &paths(&[P]), t).unwrap();
            }
            _ => {}
        }
        for _ in 0..2 {
            let t = h.t();
            let err = h.e.acquire(&a, P, t).unwrap_err();
            assert_eq!(err.reason, Reason::Fenced);
            texts.push(h.e.why(&a).unwrap());
        }
    }
    assert!(texts.windows(2).all(|w| w[0] == w[1]), "{texts:#?}");
    // It names exactly the three ways out, each of which works now.
    let t0 = &texts[0];
    assert!(t0.contains("writes plan.md"));
    assert!(t0.contains("declines it"));
    assert!(t0.contains("coherent withdraw plan.md"));
    let t = h.t();
    h.e.decline(&b, &paths(&[P]), t).unwrap();
    assert!(!h.e.is_fenced(&a, P));
}

#[test]
fn wait_until_accepted_is_not_given_up_on_a_live_overtaken_record() {
    let (mut h, _, b, c) = handed();
    let t = h.t();
    h.e.acquire(&c, P, t).unwrap();
    let id = h.e.wait_target(P).unwrap();
    assert!(matches!(
        h.e.wait_state(P, id, Until::Accepted),
        Ok(WaitState::Pending(_))
    ));
    let t = h.t();
    h.e.accept(&b, &paths(&[P]), t).unwrap();
    assert!(matches!(
        h.e.wait_state(P, id, Until::Accepted),
        Ok(WaitState::Reached(_))
    ));
}
