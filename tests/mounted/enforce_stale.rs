//! The stale-write guard on a real mount (docs/design.md#holds): `--stale strict` refuses a write
//! from an outdated view until the session reads again, `warn` (the default) logs
//! `stale_write` and allows, `off` does neither. A blind write is never stale.

use crate::coherent;
use crate::common;

use coherent::*;
use common::Mount;

/// alice reads f at v1, bob commits v2.
fn outdated(stale: Option<&str>) -> Vol {
    let mut b = Mount::builder();
    if let Some(s) = stale {
        b = b.args(["--stale", s]);
    }
    let m = mount_with(b);
    std::fs::write(m.backing_path("f"), "v1\n").unwrap();
    sh_ok(&m, Some("alice"), "cat f >/dev/null");
    sh_ok(&m, Some("bob"), "echo bob >> f");
    assert_eq!(version(&m, "f"), Some(2));
    m
}

#[test]
fn strict_refuses_a_stale_write_until_the_session_reads_again() {
    let m = outdated(Some("strict"));
    for cmd in ["echo alice >> f", "python3 -c \"open('f','a').write('x')\""] {
        sh_refused(&m, "alice", cmd, "f", "stale_view");
    }
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "v1\nbob\n");
    assert_eq!(version(&m, "f"), Some(2));
    let w = why(&m, Some("alice"));
    assert!(
        w.contains("v2") && w.contains("v1") && w.contains("f"),
        "{w:?}"
    );
    let d = await_events(&m, "denied", "f", Some("alice"), 1);
    assert!(
        d.iter().any(|e| e["reason"] == "stale_view"),
        "no denied/stale_view event: {d:?}"
    );
    // a blind write (carol never read f) is never stale
    sh_ok(&m, Some("carol"), "echo carol >> f");
    assert_eq!(version(&m, "f"), Some(3));
    // bob's view is his own commit (v2); carol's blind write moved f to v3 since, so bob
    // is stale now too
    sh_refused(&m, "bob", "echo bob2 >> f", "f", "stale_view");
    // reading again clears it
    sh_ok(&m, Some("alice"), "cat f >/dev/null");
    sh_ok(&m, Some("alice"), "echo alice >> f");
    assert_eq!(version(&m, "f"), Some(4));
    // the log is in order: once the last commit shows, a stale_write would show too
    assert_eq!(await_committed_version(&m, "f", 4), Some(4));
    assert!(events_of(&m, "stale_write", "f", None).is_empty());
}

#[test]
fn warn_logs_a_stale_write_and_allows_it() {
    let m = outdated(None);
    sh_ok(&m, Some("alice"), "echo alice >> f");
    assert_eq!(version(&m, "f"), Some(3));
    let ev = await_events(&m, "stale_write", "f", Some("alice"), 1);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (&ev[0]["view"], &ev[0]["version"]),
        (&1.into(), &2.into()),
        "{ev:?}"
    );
    assert_eq!(await_committed_version(&m, "f", 3), Some(3));
    assert!(events_of(&m, "denied", "f", None).is_empty());
    // a current view is not stale
    sh_ok(&m, Some("alice"), "echo again >> f");
    assert_eq!(await_committed_version(&m, "f", 4), Some(4));
    assert_eq!(events_of(&m, "stale_write", "f", None).len(), 1);
}

#[test]
fn warn_is_the_explicit_default_and_off_says_nothing() {
    let m = outdated(Some("warn"));
    sh_ok(&m, Some("alice"), "echo alice >> f");
    assert_eq!(
        await_events(&m, "stale_write", "f", Some("alice"), 1).len(),
        1
    );

    let m = outdated(Some("off"));
    sh_ok(&m, Some("alice"), "echo alice >> f");
    assert_eq!(version(&m, "f"), Some(3));
    assert_eq!(await_committed_version(&m, "f", 3), Some(3));
    assert!(events_of(&m, "stale_write", "f", None).is_empty());
    assert!(events_of(&m, "denied", "f", None).is_empty());
}
