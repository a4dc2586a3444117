//! Many threads hammer one engine (and its journal, with snapshots) with every kind of
//! operation, including multi-path verbs and directory renames that take several locks.
//! Fails if the threads do not finish in bounded time (a deadlock), then checks the log
//! rebuilds the final state.

use crate::common::rng::Rng;
use crate::core_common;
use coherent::coherence::*;
use coherent::journal::*;
use core_common::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const THREADS: usize = 8;
const OPS: usize = 3000;

fn path(r: &mut Rng) -> String {
    format!("d{}/f{}.txt", r.below(4), r.below(12))
}

fn worker(e: Arc<Engine>, j: Arc<Journal>, seed: u64) {
    let names = ["s0", "s1", "s2", "s3", "s4", "s5"];
    let ss: Vec<_> = names.iter().map(|n| sess(n)).collect();
    let mut r = Rng(seed * 2_654_435_761 + 1);
    let now = || Timestamp::from_millis(T0);
    for i in 0..OPS {
        let s = &ss[r.below(ss.len())];
        let p = path(&mut r);
        match r.below(16) {
            0 | 1 => {
                e.open_read(s, &p, now());
            }
            2 | 3 => {
                if e.acquire(s, &p, now()).is_ok() {
                    e.commit(s, &p, CommitOp::Write, stamp(i as u64), now());
                    e.close_write(s, &p, true, now());
                }
            }
            4 => {
                let _ = e.acquire(s, &p, now());
            }
            5 => e.close_write(s, &p, r.below(2) == 0, now()),
            6 | 7 => {
                let ps: Vec<String> = (0..1 + r.below(3)).map(|_| path(&mut r)).collect();
                let to = names[r.below(names.len())];
                let _ = e.transfer(s, &ps, to, None, now());
            }
            8 => {
                let ps: Vec<String> = (0..1 + r.below(3)).map(|_| path(&mut r)).collect();
                let _ = match r.below(3) {
                    0 => e.accept(s, &ps, now()),
                    1 => e.decline(s, &ps, now()),
                    _ => e.withdraw(s, &ps, now()),
                };
            }
            9 => {
                let q = path(&mut r);
                if e.check_rename(s, &p, &q, false, now()).is_ok() {
                    e.rename(s, &p, &q, false, stamp(i as u64), now());
                }
            }
            10 => {
                let (a, b) = (format!("d{}", r.below(4)), format!("d{}", r.below(4)));
                if a != b && e.check_rename(s, &a, &b, true, now()).is_ok() {
                    e.rename(s, &a, &b, true, None, now());
                }
            }
            11 => {
                e.observe(&p, stamp(r.next() % 5), now());
            }
            12 => {
                e.evict(Timestamp::from_millis(T0 + 48 * 3600 * 1000));
                let _ = e.status(None);
                let _ = e.inbox(s);
            }
            13 => {
                e.session_gone(s, now());
            }
            14 => {
                if r.below(20) == 0 {
                    j.checkpoint(&e).unwrap();
                }
            }
            _ => {
                let _ = e.check_write(s, &p, Route::Setattr, now());
                let _ = e.handoff(s, &p);
                let _ = e.version(&p);
            }
        }
    }
}

#[test]
fn no_deadlock_under_concurrent_load_and_the_log_rebuilds_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let final_state = {
        let o = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
        let (tx, rx) = mpsc::channel();
        for t in 0..THREADS {
            let (e, j, tx) = (o.engine.clone(), o.journal.clone(), tx.clone());
            std::thread::spawn(move || {
                worker(e, j, t as u64 + 1);
                tx.send(t).unwrap();
            });
        }
        drop(tx);
        for _ in 0..THREADS {
            match rx.recv_timeout(Duration::from_secs(120)) {
                Ok(_) => {}
                Err(e) => panic!("worker threads did not finish: deadlock? ({e})"),
            }
        }
        o.engine.durable_state()
    };
    assert!(final_state.seq > 1000);
    let o = Journal::open(dir.path(), Config::default(), JournalOptions::default()).unwrap();
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert_eq!(o.engine.durable_state(), final_state);
}
