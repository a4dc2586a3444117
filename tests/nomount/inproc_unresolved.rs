//! Fail closed (docs/design.md#sessions) through the filesystem type with the real volume
//! policy and no mount (tests/common/inproc.rs): a caller the volume cannot resolve (pid 0,
//! what FUSE sends for a process outside the daemon's pid namespace) is refused on a path
//! with a live record, never admitted as `uid:0`; its other writes and its reads go on.
//!
//! tests/mounted/enforce_unresolved.rs keeps what only the kernel shows: that a process
//! outside the daemon's pid namespace does arrive as such a caller, and one inside resolves.

use crate::common;

use common::inproc::{Agent, InProc};

const APPEND: i32 = libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT;

#[test]
fn an_unresolvable_caller_is_refused_on_a_handed_file_and_only_there() {
    let f = InProc::new();
    let (alice, bob, outside) = (Agent::new("alice"), Agent::new("bob"), Agent::outside());
    f.ctl(&bob, "register").unwrap();
    let create = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
    f.write(&alice, "plan.md", create, Some(b"plan\n")).unwrap();
    f.write(&alice, "other.md", create, Some(b"o\n")).unwrap();
    f.ctl(&alice, "transfer --to bob plan.md").unwrap();
    // Nobody can tell who this is: the handed path is refused, as unresolved.
    assert_eq!(
        f.write(&outside, "plan.md", APPEND, Some(b"x")),
        Err(libc::EACCES),
        "an unresolvable append was admitted"
    );
    assert_eq!(f.content("plan.md").as_deref(), Some("plan\n"));
    assert_eq!(
        f.rename(&outside, "other.md", "plan.md", 0),
        Err(libc::EACCES)
    );
    let denied = f.events_on("denied", "plan.md");
    assert_eq!(denied.len(), 2, "{denied:?}");
    for d in &denied {
        assert_eq!(d["reason"], "unresolved", "{d}");
        assert_eq!(d["session"], "uid:0", "{d}");
    }
    assert_eq!(denied[0]["route"], "open_write");
    assert_eq!(denied[1]["route"], "rename_target");
    // Nothing overtook the handoff.
    let ev = f.events();
    assert!(ev.iter().all(|e| e["event"] != "overtaken"), "{ev:?}");
    let st = f.status(&alice);
    assert_eq!(st["live"][0]["status"], "pending", "{st}");
    // Other writes and every read go on.
    assert_eq!(
        f.write(&outside, "other.md", APPEND, Some(b"more\n")),
        Ok(())
    );
    assert_eq!(f.cat(&outside, "plan.md").as_deref(), Ok("plan\n"));
    assert_eq!(f.write(&outside, "new.md", create, Some(b"new\n")), Ok(()));
    assert_eq!(f.content("other.md").as_deref(), Some("o\nmore\n"));
    assert_eq!(f.content("new.md").as_deref(), Some("new\n"));
    // A session that resolves is fenced as usual; the successor takes the file over.
    assert_eq!(
        f.write(&alice, "plan.md", APPEND, Some(b"x")),
        Err(libc::EACCES)
    );
    assert_eq!(f.write(&bob, "plan.md", APPEND, Some(b"taken\n")), Ok(()));
    assert_eq!(f.content("plan.md").as_deref(), Some("plan\ntaken\n"));
}
