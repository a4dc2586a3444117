//! Issue 20, item 3: no way around the fence through another name. Every name of a handed
//! inode is fenced for the giver, tracked or not (a hard link made before the transfer into
//! an ignored directory included); changes made through the mount to other names of the
//! inode, or to its atime alone, are not changes of the handed content and relabel nothing.

use crate::coherent;

use coherent::*;

/// alice creates plan.md and, before handing it to bob, links it as `alias` (`build/` is
/// ignored by .gitignore); carol is a bystander.
fn linked(alias: &str) -> Vol {
    let m = mount(true);
    touch_session(&m, "bob");
    touch_session(&m, "carol");
    sh_ok(
        &m,
        Some("alice"),
        &format!("echo 'build/' > .gitignore && mkdir -p build && echo plan > plan.md && ln plan.md {alias}"),
    );
    transfer(&m, "alice", "bob", &["plan.md"]);
    m
}

/// The version has not moved, nothing was counted behind the volume's back, the record is
/// still live.
fn live_at_v1(m: &Vol) -> serde_json::Value {
    sh_ok(m, Some("carol"), "cat plan.md >/dev/null");
    assert_eq!(version(m, "plan.md"), Some(1));
    assert!(events_of(m, "external_change", "plan.md", None).is_empty());
    live_record(m, "plan.md").expect("still live")
}

/// The record is as the transfer left it and the version has not moved.
fn untouched(m: &Vol) {
    sh_ok(m, Some("carol"), "cat plan.md >/dev/null");
    assert_eq!(version(m, "plan.md"), Some(1));
    assert!(events_of(m, "external_change", "plan.md", None).is_empty());
    let r = live_record(m, "plan.md").expect("still live");
    assert_eq!(r["status"], "pending", "{r}");
}

fn fenced(m: &Vol, name: &str) {
    for cmd in [
        format!("echo evil >> {name}"),
        format!("truncate -s 0 {name}"),
    ] {
        let r = sh(m, Some("alice"), &cmd);
        assert!(r.denied(), "alice `{cmd}`: {}", r.show());
    }
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\n"
    );
}

#[test]
fn a_link_into_an_ignored_directory_is_fenced_for_the_giver() {
    let m = linked("build/p.alias");
    fenced(&m, "build/p.alias");
    fenced(&m, "plan.md");
    // The refusal is the fence's, with its deny text naming the handed path.
    if let Some(e) = check_deny_text(&why(&m, Some("alice")), "plan.md", "bob", 1) {
        panic!("{e}");
    }
    // Nor can the giver drop the handed inode's other name, or rename it.
    let r = sh(&m, Some("alice"), "rm build/p.alias");
    assert!(r.denied(), "{}", r.show());
    let r = sh(&m, Some("alice"), "mv build/p.alias build/q");
    assert!(r.denied(), "{}", r.show());
    // Anyone else writes through it as before (a bystander's change: it overtakes).
    sh_ok(&m, Some("carol"), "cat build/p.alias >/dev/null");
    untouched(&m);
    // After the handoff ends the giver writes through it again.
    verb_ok(&m, "alice", &["withdraw", "plan.md"]);
    sh_ok(&m, Some("alice"), "echo ok >> build/p.alias");
}

#[test]
fn a_bystanders_rm_of_another_name_does_not_lift_the_fence() {
    for alias in ["g.alias", "build/g.alias"] {
        let m = linked(alias);
        sh_ok(&m, Some("carol"), &format!("rm {alias}"));
        untouched(&m);
        fenced(&m, "plan.md");
    }
}

#[test]
fn a_bystanders_link_into_an_ignored_directory_does_not_lift_the_fence() {
    let m = linked("build/first");
    sh_ok(&m, Some("carol"), "ln plan.md build/second");
    untouched(&m);
    fenced(&m, "plan.md");
    fenced(&m, "build/second");
}

#[test]
fn a_bystanders_atime_only_change_is_not_a_commit() {
    // `touch -a` opens the file for writing (an acquire of the name the volume attributes
    // the inode to: the fence stays) and changes its atime (and so its ctime) only: no
    // commit, nothing counted behind the volume's back.
    for alias in ["g.alias", "build/g.alias"] {
        let m = linked(alias);
        sh_ok(&m, Some("carol"), "touch -a plan.md");
        let r = live_at_v1(&m);
        assert!(
            r["status"] == "pending" || r["status"] == "overtaken",
            "{r}"
        );
        assert!(events_of(&m, "commit", "plan.md", Some("carol")).is_empty());
        sh_ok(&m, Some("carol"), &format!("touch -a {alias}"));
        live_at_v1(&m);
        // a path utimes (no open) relabels nothing
        sh_ok(
            &m,
            Some("carol"),
            "python3 -c \"import os; os.utime('plan.md')\"",
        );
        live_at_v1(&m);
        fenced(&m, "plan.md");
    }
}

/// A hard link made in the backing directory, outside the volume, before the transfer:
/// the giver is fenced through it too.
#[test]
fn a_link_made_behind_the_volume_before_the_transfer_is_fenced_too() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(
        &m,
        Some("alice"),
        "echo 'build/' > .gitignore && mkdir -p build && echo plan > plan.md",
    );
    std::fs::hard_link(m.backing_path("plan.md"), m.backing_path("build/p.alias")).unwrap();
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    transfer(&m, "alice", "bob", &["plan.md"]);
    fenced(&m, "build/p.alias");
    fenced(&m, "plan.md");
    let r = sh(&m, Some("alice"), "rm build/p.alias");
    assert!(r.denied(), "{}", r.show());
}
