//! docs/design.md#handoff: a bystander's hard link must not lift the fence. A link made through the
//! mount changes the file's ctime; that is not a change behind the volume's back
//! (docs/design.md#versions: link, unlink and rename through the volume never count as one), so the
//! record stays `pending` and the giver stays fenced on every name of the file.

use crate::coherent;
use crate::common;

use coherent::*;
use common::wait_until;

/// alice's `denied` events on plan.md or on `name`.
fn alices_denials(m: &Vol, name: &str) -> Vec<serde_json::Value> {
    events(m)
        .into_iter()
        .filter(|e| e["event"] == "denied" && e["session"] == "alice")
        .filter(|e| e["path"] == "plan.md" || e["path"] == name)
        .collect()
}

#[test]
fn a_bystanders_hard_link_does_not_lift_the_fence() {
    let m = mount(true);
    touch_session(&m, "bob");
    touch_session(&m, "carol");
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    transfer(&m, "alice", "bob", &["plan.md"]);
    sh_ok(&m, Some("carol"), "ln plan.md alias.md");

    // Any open of the file after the link (the next one would find the new ctime).
    sh_ok(&m, Some("carol"), "cat plan.md alias.md >/dev/null");
    assert_eq!(version(&m, "plan.md"), Some(1));
    assert!(events_of(&m, "external_change", "plan.md", None).is_empty());
    let r = live_record(&m, "plan.md").expect("the record is still live after the link");
    assert_eq!(r["status"], "pending", "{r}");
    assert_eq!(r["counterparty"], serde_json::Value::Null, "{r}");

    // The giver is still fenced, through either name: EACCES, reason fenced.
    for name in ["plan.md", "alias.md"] {
        let denied_before = alices_denials(&m, name).len();
        let r = sh(&m, Some("alice"), &format!("echo evil >> {name}"));
        assert!(r.denied(), "alice `echo evil >> {name}`: {}", r.show());
        let mut c = python();
        c.arg("-c").arg(format!(
            "import os\ntry:\n    open('{name}', 'a')\n    print(0)\nexcept OSError as e:\n    print(e.errno)"
        ));
        let py = run_in(m.root(), &[("COHERENT_SESSION", "alice")], &mut c);
        assert_eq!(py.out.trim(), libc::EACCES.to_string(), "{}", py.show());
        let mut d = Vec::new();
        wait_until(SETTLE, || {
            d = alices_denials(&m, name);
            d.len() >= denied_before + 2
        });
        assert!(d.len() >= denied_before + 2, "{d:?}");
        assert_eq!(d.last().unwrap()["reason"], "fenced", "{d:?}");
        assert_eq!(d.last().unwrap()["route"], "open_write", "{d:?}");
    }
    // A rename onto the other name is a write of the handed file, on its target side.
    sh_ok(&m, Some("alice"), "echo mine > other.md");
    let before = alices_denials(&m, "alias.md").len();
    let r = sh(&m, Some("alice"), "mv other.md alias.md");
    assert!(r.denied(), "alice `mv other.md alias.md`: {}", r.show());
    let mut d = Vec::new();
    wait_until(SETTLE, || {
        d = alices_denials(&m, "alias.md");
        d.len() > before
    });
    let last = d.last().expect("a denied event for the rename");
    assert_eq!(last["reason"], "fenced", "{last}");
    assert_eq!(last["route"], "rename_target", "{last}");
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\n"
    );
    assert!(check_deny_text(&why(&m, Some("alice")), "plan.md", "bob", 1).is_none());
}
