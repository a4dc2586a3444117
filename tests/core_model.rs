//! Model test: random operation sequences from 4 sessions over 3 paths, with the §5
//! invariants checked after every step.

mod core_common;
use coherent::coherence::*;
use coherent::error::Reason;
use coherent::identity::Session;
use core_common::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const PATHS: [&str; 3] = ["a.md", "b.md", "d/c.md"];
const NAMES: [&str; 3] = ["alice", "bob", "carol"];

#[derive(Debug, Clone)]
enum Op {
    Read(usize, usize),
    Write(usize, usize),
    OpenClose(usize, usize),
    Acquire(usize, usize),
    Close(usize, usize, bool),
    Unlink(usize, usize),
    Rename(usize, usize, usize),
    Transfer(usize, Vec<usize>, usize),
    Accept(usize, usize),
    Decline(usize, usize),
    Withdraw(usize, usize),
    External(usize),
    Advance(u32),
    Evict,
    Gone(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0usize..4; // 3 named sessions + the unattributed uid:0
    let p = 0usize..3;
    prop_oneof![
        3 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Read(s, p)),
        3 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Write(s, p)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::OpenClose(s, p)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Acquire(s, p)),
        1 => (s.clone(), p.clone(), any::<bool>()).prop_map(|(s, p, c)| Op::Close(s, p, c)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Unlink(s, p)),
        1 => (s.clone(), p.clone(), p.clone()).prop_map(|(s, a, b)| Op::Rename(s, a, b)),
        4 => (s.clone(), prop::collection::vec(p.clone(), 1..3), 0usize..4)
            .prop_map(|(s, ps, to)| Op::Transfer(s, ps, to)),
        2 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Accept(s, p)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Decline(s, p)),
        1 => (s.clone(), p.clone()).prop_map(|(s, p)| Op::Withdraw(s, p)),
        1 => p.clone().prop_map(Op::External),
        1 => (1u32..100_000).prop_map(Op::Advance),
        1 => Just(Op::Evict),
        1 => s.prop_map(Op::Gone),
    ]
}

fn versions(e: &Engine) -> BTreeMap<String, u64> {
    PATHS
        .iter()
        .filter_map(|p| e.path_state(p).map(|st| (p.to_string(), st.version)))
        .collect()
}

fn live_givers(e: &Engine) -> Vec<(String, String)> {
    e.status(None)
        .live
        .into_iter()
        .map(|r| (r.giver, r.path))
        .collect()
}

fn run(ops: Vec<Op>, stale: StaleMode) -> Result<(), TestCaseError> {
    let mut h = H::with(Config {
        stale,
        ..Config::default()
    });
    let ss: Vec<Session> = NAMES
        .iter()
        .map(|n| sess(n))
        .chain(std::iter::once(uid0()))
        .collect();
    for s in &ss[..3] {
        let t = h.t();
        h.e.register(s, t).unwrap();
    }
    for p in PATHS {
        let st = h.next_stamp();
        let t = h.t();
        h.e.observe(p, st, t);
    }
    for op in ops {
        let before = versions(&h.e);
        let givers = live_givers(&h.e);
        let is_giver = |s: &Session, p: &str| givers.iter().any(|(g, q)| *g == s.name && q == p);
        // Paths whose version this op may move by one.
        let mut moved: Vec<&str> = Vec::new();
        let fence_ok = |r: Option<&coherent::error::Refusal>, s: &Session, p: &str| {
            if let Some(e) = r {
                if e.reason == Reason::Fenced {
                    prop_assert!(is_giver(s, p), "bystander {} fenced on {p}", s.name);
                }
            }
            Ok(())
        };
        match &op {
            Op::Read(s, p) => {
                h.read(&ss[*s], PATHS[*p]);
            }
            Op::Write(s, p) => {
                let r = h.write(&ss[*s], PATHS[*p]);
                fence_ok(r.as_ref().err(), &ss[*s], PATHS[*p])?;
                if r.is_ok() {
                    moved.push(PATHS[*p]);
                } else {
                    prop_assert!(is_giver(&ss[*s], PATHS[*p]) || stale == StaleMode::Strict);
                }
            }
            Op::OpenClose(s, p) => {
                let t = h.t();
                let r = h.e.acquire(&ss[*s], PATHS[*p], t);
                fence_ok(r.as_ref().err(), &ss[*s], PATHS[*p])?;
                if r.is_ok() {
                    let t = h.t();
                    h.e.close_write(&ss[*s], PATHS[*p], false, t);
                }
            }
            Op::Acquire(s, p) => {
                let t = h.t();
                let r = h.e.acquire(&ss[*s], PATHS[*p], t);
                fence_ok(r.as_ref().err(), &ss[*s], PATHS[*p])?;
            }
            Op::Close(s, p, committed) => {
                let t = h.t();
                h.e.close_write(&ss[*s], PATHS[*p], *committed, t);
            }
            Op::Unlink(s, p) => {
                let t = h.t();
                let r = h.e.check_write(&ss[*s], PATHS[*p], Route::Unlink, t);
                fence_ok(r.as_ref().err(), &ss[*s], PATHS[*p])?;
                if r.is_ok() && h.e.version(PATHS[*p]).is_some() {
                    let t = h.t();
                    h.e.commit(&ss[*s], PATHS[*p], CommitOp::Unlink, None, t);
                    moved.push(PATHS[*p]);
                }
            }
            Op::Rename(s, a, b) if a != b => {
                let (from, to) = (PATHS[*a], PATHS[*b]);
                let t = h.t();
                let r = h.e.check_rename(&ss[*s], from, to, false, t);
                if let Err(e) = &r {
                    prop_assert!(
                        e.reason != Reason::Fenced
                            || is_giver(&ss[*s], from)
                            || is_giver(&ss[*s], to)
                    );
                }
                if r.is_ok() && h.e.version(from).is_some() {
                    let st = h.next_stamp();
                    let t = h.t();
                    h.e.rename(&ss[*s], from, to, false, st, t);
                    moved.push(from);
                    moved.push(to);
                }
            }
            Op::Rename(..) => {}
            Op::Transfer(s, ps, to) => {
                let ps: Vec<&str> = ps.iter().map(|p| PATHS[*p]).collect();
                let name = ss[*to].name.clone();
                let live_before = h.e.status(None);
                let r = h.transfer(&ss[*s], &ps, &name);
                if r.is_err() {
                    // All or nothing.
                    prop_assert_eq!(live_before, h.e.status(None));
                }
            }
            Op::Accept(s, p) => {
                let t = h.t();
                let _ = h.e.accept(&ss[*s], &paths(&[PATHS[*p]]), t);
            }
            Op::Decline(s, p) => {
                let t = h.t();
                let _ = h.e.decline(&ss[*s], &paths(&[PATHS[*p]]), t);
            }
            Op::Withdraw(s, p) => {
                let t = h.t();
                let _ = h.e.withdraw(&ss[*s], &paths(&[PATHS[*p]]), t);
            }
            Op::External(p) => {
                // A change behind the volume's back counts unless a handle of the
                // volume is writing the path (its commit will count it).
                let writing = ss
                    .iter()
                    .any(|s| matches!(h.e.hold(s, PATHS[*p]), Some((Hold::E, _))));
                let st = h.next_stamp();
                let t = h.t();
                if h.e.observe(PATHS[*p], st, t).is_some() && !writing {
                    moved.push(PATHS[*p]);
                }
            }
            Op::Advance(secs) => h.now += *secs as i64 * 1000,
            Op::Evict => {
                let t = h.t();
                h.e.evict(t);
            }
            Op::Gone(s) => {
                let t = h.t();
                h.e.session_gone(&ss[*s], t);
            }
        }

        // Versions never decrease and move (by exactly one) only on commits.
        let after = versions(&h.e);
        for (p, v) in &after {
            let old = before.get(p).copied();
            if moved.contains(&p.as_str()) {
                prop_assert_eq!(Some(*v), Some(old.unwrap_or(0) + 1), "{} after {:?}", p, op);
            } else if let Some(old) = old {
                prop_assert_eq!(*v, old, "{} moved without a commit: {:?}", p, op);
            }
        }
        for p in before.keys() {
            prop_assert!(after.contains_key(p), "{p} forgotten");
        }

        // Fenced on P iff giver of a live record on P; bystanders never fenced.
        let givers = live_givers(&h.e);
        for s in &ss {
            for p in PATHS {
                let giver = givers.iter().any(|(g, q)| *g == s.name && q == p);
                prop_assert_eq!(h.e.is_fenced(s, p), giver, "{} on {}", s.name, p);
                let t = h.t();
                let r = h.e.check_write(s, p, Route::Setxattr, t);
                prop_assert_eq!(r.is_err(), giver);
            }
        }
        // At most one live record per path.
        for p in PATHS {
            prop_assert!(givers.iter().filter(|(_, q)| q == p).count() <= 1);
        }
        // The log rebuilds the live state.
        h.assert_replay_equal();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_random_histories(
        ops in prop::collection::vec(op(), 1..40),
        stale in prop_oneof![Just(StaleMode::Warn), Just(StaleMode::Strict), Just(StaleMode::Off)],
    ) {
        run(ops, stale)?;
    }
}
