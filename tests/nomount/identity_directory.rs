//! The directory of known sessions, and how commands name one: name, full agent id, or an
//! 8+ digit id prefix, resolved by the one rule (`coherence::resolve_session`) over the
//! sessions the directory knows.

use coherent::coherence::resolve_session;
use coherent::error::{Reason, Refusal};
use coherent::identity::{
    check_session_name, session_of_cgroup, BadName, Session, SessionDirectory, SessionInfo, Via,
    CLAUDE_VAR,
};
use std::collections::HashMap;
use std::sync::Arc;
use uuid::Uuid;

fn env(var: &str) -> Via {
    Via::Env { var: var.into() }
}

fn with_id(name: &str, id: &str) -> Arc<SessionInfo> {
    Arc::new(SessionInfo {
        name: name.into(),
        agent_id: Uuid::parse_str(id).unwrap(),
        via: Via::Registered,
    })
}

/// A command's argument resolved among the sessions `d` knows, as the engine does.
fn lookup(d: &SessionDirectory, q: &str) -> Result<Session, Refusal> {
    let known: HashMap<String, Session> = d
        .sessions()
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
    resolve_session(&known, q)
}

fn reason(d: &SessionDirectory, q: &str) -> Reason {
    lookup(d, q).expect_err(q).reason
}

#[test]
fn lookup_by_name_full_id_and_prefix() {
    let d = SessionDirectory::new();
    let alice = d.record(SessionInfo::from_tag(
        None,
        "alice",
        env("COHERENT_SESSION"),
    ));
    let claude = d.record(SessionInfo::from_tag(
        Some(CLAUDE_VAR),
        "abc",
        env(CLAUDE_VAR),
    ));
    assert_eq!(d.len(), 2);
    assert_eq!(lookup(&d, "alice").unwrap(), alice);
    assert_eq!(lookup(&d, "abc").unwrap(), claude);
    for q in [
        "27a468b0-7fa2-5c0d-a2ba-2dac753b2070",
        "27a468b07fa25c0da2ba2dac753b2070",
        "27a468b0",
        "27A468B0",
        "27a468b07fa",
    ] {
        assert_eq!(lookup(&d, q).unwrap(), alice, "{q}");
    }
    assert_eq!(lookup(&d, "54c1e55e").unwrap(), claude);
    assert_eq!(
        lookup(&d, "54c1e55e-b8fa-534a-93fc-0c4393bd8424").unwrap(),
        claude
    );
    assert_eq!(d.by_id(&claude.agent_id).unwrap(), claude);
}

#[test]
fn refusals_map_to_the_handoff_reasons() {
    let d = SessionDirectory::new();
    d.record(SessionInfo::from_tag(
        None,
        "alice",
        env("COHERENT_SESSION"),
    ));
    // Too short to be a prefix, empty, whitespace, longer than an id: malformed (EINVAL).
    for q in [
        "27a468b",
        "",
        "   ",
        " alice",
        "27a468b07fa25c0da2ba2dac753b20700",
    ] {
        assert_eq!(reason(&d, q), Reason::HandoffSuccessorMalformed, "{q:?}");
    }
    assert_eq!(Reason::HandoffSuccessorMalformed.errno(), libc::EINVAL);
    // Well formed, unknown: ESRCH.
    for q in [
        "bob",
        "27a468b1",
        "00000000-0000-0000-0000-000000000000",
        "zz-top",
    ] {
        assert_eq!(reason(&d, q), Reason::HandoffSuccessorUnknown, "{q:?}");
    }
    assert_eq!(Reason::HandoffSuccessorUnknown.errno(), libc::ESRCH);
}

#[test]
fn ambiguous_prefixes_are_malformed() {
    let d = SessionDirectory::new();
    let a = with_id("p", "12345678-9abc-5000-8000-000000000001");
    let b = with_id("q", "12345678-9abd-5000-8000-000000000002");
    assert!(d.insert(&a));
    assert!(d.insert(&b));
    assert!(!d.insert(&b), "already known");
    assert_eq!(reason(&d, "12345678"), Reason::HandoffSuccessorMalformed);
    let msg = lookup(&d, "12345678").unwrap_err().message;
    assert!(msg.contains("more than one session"), "{msg}");
    assert_eq!(lookup(&d, "123456789abc").unwrap(), a);
    assert_eq!(lookup(&d, "123456789abd").unwrap(), b);
    // Ids right next to the prefix do not match it.
    let c = with_id("r", "12345679-0000-5000-8000-000000000000");
    let e = with_id("s", "12345677-ffff-5fff-bfff-ffffffffffff");
    d.insert(&c);
    d.insert(&e);
    assert_eq!(lookup(&d, "12345679").unwrap(), c);
    assert_eq!(lookup(&d, "12345677").unwrap(), e);
    assert_eq!(lookup(&d, "123456789abc5000").unwrap(), a);
}

#[test]
fn unattributed_sessions_cannot_be_named_as_successors() {
    let d = SessionDirectory::new();
    let u = d.record(SessionInfo::unattributed(1000));
    assert_eq!(d.by_name("uid:1000").unwrap(), u);
    assert_eq!(reason(&d, "uid:1000"), Reason::HandoffSuccessorUnknown);
    assert_eq!(
        reason(&d, &u.agent_id.to_string()),
        Reason::HandoffSuccessorUnknown
    );
}

#[test]
fn interning_shares_one_arc_per_identity() {
    let d = SessionDirectory::new();
    let a1 = d.record(SessionInfo::from_tag(None, "x", env("COHERENT_SESSION")));
    let a2 = d.record(SessionInfo::from_tag(None, "x", env("COHERENT_SESSION")));
    assert!(Arc::ptr_eq(&a1, &a2));
    // The same session reached through a cgroup is another Arc (its `via` differs) but
    // the same known session.
    let c = d.record(SessionInfo::from_tag(
        None,
        "x",
        Via::Cgroup {
            path: "/coherent-session-x".into(),
        },
    ));
    assert_eq!(c.agent_id, a1.agent_id);
    assert_eq!(d.len(), 1);
    assert_eq!(d.by_name("x").unwrap().agent_id, a1.agent_id);
    // A name shared by two different ids (a COHERENT_SESSION and a Claude id alike): no
    // one session by that name; each by its id.
    let cl = d.record(SessionInfo::from_tag(
        Some(CLAUDE_VAR),
        "x",
        env(CLAUDE_VAR),
    ));
    assert_eq!(d.len(), 2);
    assert!(d.by_name("x").is_none());
    assert_eq!(d.by_id(&cl.agent_id).unwrap(), cl);
    assert_eq!(d.sessions().len(), 2);
}

#[test]
fn session_names_rule() {
    for ok in [
        "a",
        "alice",
        "A-b_c.d:e@f",
        "54c1e55e-b8fa-534a-93fc-0c4393bd8424",
        &"x".repeat(128),
    ] {
        assert_eq!(check_session_name(ok), Ok(()), "{ok}");
    }
    assert_eq!(check_session_name(""), Err(BadName::Empty));
    assert_eq!(
        check_session_name(&"x".repeat(129)),
        Err(BadName::TooLong(129))
    );
    assert_eq!(check_session_name("a/b"), Err(BadName::BadChar('/')));
    assert_eq!(check_session_name("a b"), Err(BadName::BadChar(' ')));
    assert_eq!(check_session_name("a\u{7}"), Err(BadName::BadChar('\u{7}')));
    assert_eq!(check_session_name("é"), Err(BadName::BadChar('é')));
    assert_eq!(check_session_name("uid:0"), Err(BadName::Reserved));
    assert_eq!(
        session_of_cgroup("/user.slice/coherent-session-a/coherent-session-b/x"),
        Some("b")
    );
    assert_eq!(
        session_of_cgroup("/coherent-session-a/coherent-session-b c"),
        Some("a")
    );
    assert_eq!(session_of_cgroup("/coherent-session-"), None);
    assert_eq!(session_of_cgroup("/"), None);
    assert_eq!(session_of_cgroup("/session-a"), None);
}
