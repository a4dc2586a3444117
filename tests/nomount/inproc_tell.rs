//! Telling the writer (docs/design.md#handoff, docs/design.md#control-surface,
//! docs/design.md#state-log), through the filesystem type with the real volume policy and no
//! mount (tests/common/inproc.rs): `.coherent/why` shows the latest refusal or stale write
//! with its time and versions, and `no refusal` when there is none; a `denied` event, a
//! verb's events and `handoff_seen` are in `.coherent/events` when the call returns (read
//! once, right after the call, through the filesystem: no retry, no flush).

use crate::coherent;
use crate::common;

use ::coherent::coherence::StaleMode;
use ::coherent::store::SetAttr;
use coherent::check_deny_text;
use common::inproc::{Agent, InProc, Setup};

const W: i32 = libc::O_WRONLY;
const APPEND: i32 = W | libc::O_APPEND | libc::O_CREAT;

/// alice creates plan.md (v1) and hands it to bob, who registered.
fn handed() -> (InProc, Agent, Agent) {
    let f = InProc::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.ctl(&bob, "register").unwrap();
    f.write(&alice, "plan.md", W | libc::O_CREAT, Some(b"plan\n"))
        .unwrap();
    f.ctl(&alice, "transfer --to bob plan.md").unwrap();
    (f, alice, bob)
}

/// The events of `kind` on `path` in `.coherent/events` as `a` reads it now.
fn read_count(f: &InProc, a: &Agent, kind: &str, path: &str) -> usize {
    f.read_events(a)
        .iter()
        .filter(|e| e["event"] == kind && e["path"] == path)
        .count()
}

#[test]
fn why_says_no_refusal_then_the_latest_one_with_its_time() {
    let f = InProc::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    let fresh = f.why(&alice);
    assert!(fresh.starts_with("no refusal"), "{fresh:?}");
    f.ctl(&bob, "register").unwrap();
    f.write(&alice, "plan.md", W | libc::O_CREAT, Some(b"plan\n"))
        .unwrap();
    f.ctl(&alice, "transfer --to bob plan.md").unwrap();
    assert_eq!(
        f.write(&alice, "plan.md", APPEND, Some(b"more\n")),
        Err(libc::EACCES)
    );
    let w = f.why(&alice);
    if let Some(e) = check_deny_text(&w, "plan.md", "bob", 1) {
        panic!("{e}");
    }
    let when = w
        .lines()
        .find_map(|l| l.strip_prefix("(at ").and_then(|l| l.strip_suffix(')')))
        .unwrap_or_else(|| panic!("no time in {w:?}"));
    assert!(
        chrono_like(when),
        "the time is not RFC 3339: {when:?} in {w:?}"
    );
    // A later refusal (a verb) replaces it.
    let (r, reply) = f.ctl_reply(&alice, "transfer --to nobody-here plan.md");
    assert_eq!(
        (r, reply["reason"].as_str()),
        (Err(libc::ESRCH), Some("handoff_successor_unknown")),
        "{reply}"
    );
    let w2 = f.why(&alice);
    assert!(
        !w2.contains("you handed plan.md"),
        "an old refusal stayed: {w2:?}"
    );
    assert!(w2.contains("nobody-here"), "{w2:?}");
    // Another session never refused still has none.
    assert!(f.why(&bob).starts_with("no refusal"));
}

/// `2026-12-01T03:43:16.551Z` and the like.
fn chrono_like(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && s.ends_with('Z')
}

#[test]
fn a_stale_writer_under_warn_is_told_with_both_versions() {
    let f = InProc::with(Setup {
        stale: StaleMode::Warn,
        ..Setup::default()
    });
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.write(&alice, "doc.md", W | libc::O_CREAT, Some(b"one\n"))
        .unwrap();
    f.read(&bob, "doc.md").unwrap();
    f.write(&alice, "doc.md", W | libc::O_TRUNC, Some(b"two\n"))
        .unwrap();
    assert_eq!(f.committed_version("doc.md"), Some(2));
    // bob saw v1; his write goes on, and he is told.
    assert_eq!(f.write(&bob, "doc.md", APPEND, Some(b"three\n")), Ok(()));
    let w = f.why(&bob);
    assert!(
        w.contains("stale write") && w.contains("doc.md is at v2") && w.contains("last saw v1"),
        "{w:?}"
    );
    assert!(w.contains("(at "), "{w:?}");
    let ev: Vec<_> = f
        .events_of("stale_write", "bob")
        .into_iter()
        .filter(|e| e["path"] == "doc.md")
        .collect();
    assert_eq!(ev.len(), 1, "{ev:?}");
}

/// A write of `plan.md` by a session, as the kernel sends it for a tool.
type Try = fn(&InProc, &Agent) -> Result<(), i32>;

/// Each write a shell's builtins or a coreutil makes of a handed file, as the kernel sends
/// it (`>>`, `: >` as an open or as a create over it, `>` with bytes, `mv`, `rm`,
/// `truncate -s 0`'s open and a truncate by path): refused, and its `denied` event is in
/// `.coherent/events` when the call returns.
#[test]
fn a_denied_event_is_in_the_log_when_the_call_returns() {
    let (f, alice, _bob) = handed();
    let tries: &[(&str, Try)] = &[
        ("printf x >> plan.md", |f, a| {
            f.write(a, "plan.md", APPEND, Some(b"x"))
        }),
        (": > plan.md (an open)", |f, a| {
            f.write(a, "plan.md", W | libc::O_TRUNC, None)
        }),
        (": > plan.md (a create over it)", |f, a| {
            let (dir, name) = f.at(a, "plan.md");
            let flags = W | libc::O_CREAT | libc::O_TRUNC;
            let made = f.fs.create(&a.caller(), dir, name, 0o644, 0, flags);
            made.map(drop).map_err(|e| e.errno())
        }),
        ("printf y > plan.md", |f, a| {
            f.write(a, "plan.md", W | libc::O_TRUNC, Some(b"y"))
        }),
        ("mv plan.md gone.md", |f, a| {
            f.rename(a, "plan.md", "gone.md", 0)
        }),
        ("rm plan.md", |f, a| f.unlink(a, "plan.md")),
        ("truncate -s 0 plan.md (its open)", |f, a| {
            f.write(a, "plan.md", W | libc::O_CREAT, None)
        }),
        ("truncate(2) plan.md", |f, a| {
            let trunc = SetAttr {
                size: Some(0),
                ..SetAttr::default()
            };
            f.setattr(a, "plan.md", &trunc)
        }),
    ];
    for (i, (what, call)) in tries.iter().enumerate() {
        assert_eq!(call(&f, &alice), Err(libc::EACCES), "`{what}` was allowed");
        let n = read_count(&f, &alice, "denied", "plan.md");
        assert_eq!(
            n,
            i + 1,
            "after `{what}` returned the log held {n} denied event(s)"
        );
    }
    assert_eq!(f.content("plan.md").as_deref(), Some("plan\n"));
}

#[test]
fn a_verbs_events_are_in_the_log_when_it_returns() {
    let f = InProc::new();
    let (alice, bob) = (Agent::new("alice"), Agent::new("bob"));
    f.ctl(&bob, "register").unwrap();
    f.write(&alice, "plan.md", W | libc::O_CREAT, Some(b"plan\n"))
        .unwrap();
    f.read(&alice, "plan.md").unwrap();
    let (r, v) = f.ctl_reply(&alice, "transfer --to bob plan.md");
    assert_eq!(r, Ok(()), "{v}");
    assert_eq!(v["records"][0]["status"], "pending", "{v}");
    assert_eq!(f.ctl(&bob, "accept plan.md"), Ok(()));
    assert_eq!(
        read_count(&f, &bob, "accept", "plan.md"),
        1,
        "the accept event was not in the log when the verb returned"
    );
}

#[test]
fn handoff_seen_is_in_the_log_when_the_successors_open_returns() {
    let (f, _alice, bob) = handed();
    f.read(&bob, "plan.md").unwrap();
    assert_eq!(
        read_count(&f, &bob, "handoff_seen", "plan.md"),
        1,
        "handoff_seen was not in the log when the open returned"
    );
}
