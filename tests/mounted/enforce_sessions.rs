//! Sessions on a real mount (docs/design.md#sessions): `coherent run --session NAME` (environment
//! and, where cgroup v2 is writable, a cgroup that wins over the environment), the Claude Code
//! tag and its agent id, unattributed processes, `--session-env`, `register`, and naming a
//! successor by full agent id or id prefix.

use crate::coherent;
use crate::common;

use coherent::*;
use common::{writable_cgroup2, Mount};

/// Removes `coherent-session-NAME` cgroups left by `coherent run` (once their processes
/// have exited).
struct CgroupGuard(Vec<String>);

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        for n in &self.0 {
            common::remove_session_cgroups(n, std::time::Duration::from_secs(5));
        }
    }
}

fn run_as(m: &Mount, name: &str, cmd: &str) -> Run {
    let mut c = std::process::Command::new(CLI);
    c.args(["run", "--session", name, "--", "sh", "-c", cmd]);
    run_in(&m.mnt, &[], &mut c)
}

/// `cmd` in session `name` writes plan.md: EACCES, and `denied` with reason `fenced`.
fn refused_as(m: &Mount, name: &str, cmd: &str) {
    let before = events_of(m, "denied", "plan.md", Some(name)).len();
    let d = run_as(m, name, cmd);
    assert!(d.denied(), "`{cmd}` in {name}: {}", d.show());
    let e = await_events(m, "denied", "plan.md", Some(name), before + 1);
    let reason = e.get(before).map(|e| e["reason"].clone());
    assert_eq!(reason, Some("fenced".into()), "`{cmd}` in {name}: {e:?}");
}

#[test]
fn coherent_run_names_the_session() {
    let m = mount(true);
    let dave = unique("dave");
    let _g = CgroupGuard(vec![dave.clone()]);
    let r = run_as(&m, &dave, "cat .coherent/whoami");
    assert!(r.ok(), "{}", r.show());
    let w: serde_json::Value = serde_json::from_str(r.out.trim()).expect("whoami JSON");
    assert_eq!(w["session"], dave.as_str(), "{w}");
    assert_eq!(w["agent"], agent_of(&dave), "{w}");
    let via = &w["via"]["kind"];
    if writable_cgroup2().is_some() {
        assert_eq!(via, "cgroup", "cgroup v2 is writable: {w}");
    } else {
        assert_eq!(via, "env", "{w}");
    }
}

#[test]
fn a_session_run_by_coherent_run_is_fenced_in_every_process() {
    let m = mount(true);
    let alice = unique("ralice");
    let _g = CgroupGuard(vec![alice.clone()]);
    touch_session(&m, "bob");
    let r = run_as(&m, &alice, "echo plan > plan.md");
    assert!(r.ok(), "{}", r.show());
    // retried while the close is still in flight (FUSE RELEASE is asynchronous)
    let mut last = None;
    common::wait_until(SETTLE, || {
        let r = run_as(
            &m,
            &alice,
            &format!("{CLI} --json transfer --to bob plan.md"),
        );
        let done = !r.out.contains("handoff_in_flight");
        last = Some(r);
        done
    });
    let r = last.unwrap();
    assert!(r.ok(), "{}", r.show());
    for cmd in [
        "echo x >> plan.md",
        "sh -c 'sh -c \"echo x >> plan.md\"'",
        "rm plan.md",
    ] {
        refused_as(&m, &alice, cmd);
    }
    // the cgroup decides before the environment: a child that changes its tag stays alice
    if writable_cgroup2().is_some() {
        refused_as(&m, &alice, "COHERENT_SESSION=bob sh -c 'echo x >> plan.md'");
        let w = run_as(&m, &alice, "COHERENT_SESSION=bob cat .coherent/whoami");
        assert!(w.out.contains(&format!("\"{alice}\"")), "{}", w.show());
    }
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\n"
    );
}

#[test]
fn claude_code_sessions_get_the_shared_agent_id() {
    let m = mount(true);
    let env = [("CLAUDE_CODE_SESSION_ID", "abc")];
    std::fs::write(m.backing_path("readme"), "r\n").unwrap();
    sh_env(&m, &env, "cat readme >/dev/null");
    let s = sh_env(&m, &env, "cat .coherent/whoami");
    let w: serde_json::Value = serde_json::from_str(s.out.trim()).expect("whoami JSON");
    assert_eq!(w["agent"], "54c1e55e-b8fa-534a-93fc-0c4393bd8424", "{w}");
    assert_eq!(w["session"], "abc", "{w}");
    assert_eq!(w["via"]["kind"], "env", "{w}");
    assert_eq!(w["via"]["var"], "CLAUDE_CODE_SESSION_ID", "{w}");
    let r = cli_env(&m, &env, &["--json", "whoami"]);
    assert!(r.ok(), "{}", r.show());
    assert_eq!(r.json()["agent"], "54c1e55e-b8fa-534a-93fc-0c4393bd8424");
    // COHERENT_SESSION comes first in the default order
    let both = [
        ("CLAUDE_CODE_SESSION_ID", "abc"),
        ("COHERENT_SESSION", "zoe"),
    ];
    let w = sh_env(&m, &both, "cat .coherent/whoami");
    assert!(w.out.contains("\"zoe\""), "{}", w.show());
    // a Claude session can be handed files by its full agent id or an id prefix
    sh_ok(&m, Some("alice"), "echo a > a.md && echo b > b.md");
    let r = transfer(
        &m,
        "alice",
        "54c1e55e-b8fa-534a-93fc-0c4393bd8424",
        &["a.md"],
    );
    assert_eq!(r["records"][0]["successor"], "abc", "{r}");
    let r = transfer(&m, "alice", "54c1e55e", &["b.md"]);
    assert_eq!(r["records"][0]["successor"], "abc", "{r}");
    // and it is the successor: its write completes the handoff
    sh_env(&m, &env, "echo c >> a.md");
    assert_eq!(record(&m, "a.md").unwrap()["status"], "completed");
}

#[test]
fn an_unattributed_process_is_a_bystander_only() {
    let m = mount(true);
    let w = whoami(&m, None);
    assert_eq!(
        w["session"],
        format!("uid:{}", unsafe { libc::getuid() }),
        "{w}"
    );
    assert_eq!(w["via"]["kind"], "uid", "{w}");
    sh_ok(&m, None, "echo human > h.md");
    assert_eq!(version(&m, "h.md"), Some(1));
    let (code, v) = cli_json(&m, None, &["transfer", "--to", "bob", "h.md"]);
    assert_eq!(
        (code, v["reason"].as_str()),
        (Some(2), Some("unattributed")),
        "{v}"
    );
    // it can write a handed-off file: it overtakes the record
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "echo a > plan.md");
    transfer(&m, "alice", "bob", &["plan.md"]);
    sh_ok(&m, None, "echo human >> plan.md");
    let r = record(&m, "plan.md").unwrap();
    assert_eq!(r["status"], "overtaken", "{r}");
    assert_eq!(r["counterparty"], w["session"], "{r}");
    // an unattributed process can never be named a successor
    let (code, v) = cli_json(
        &m,
        Some("alice"),
        &[
            "transfer",
            "--to",
            w["session"].as_str().unwrap(),
            "plan.md",
        ],
    );
    assert_eq!(code, Some(2), "{v}");
}

#[test]
fn session_env_replaces_the_tag_list() {
    let m = mount_with(Mount::builder().args(["--session-env", "MYTAG", "--session-env", "OTHER"]));
    let w = sh_env(&m, &[("MYTAG", "mia")], "cat .coherent/whoami");
    let w: serde_json::Value = serde_json::from_str(w.out.trim()).unwrap();
    assert_eq!(
        (&w["session"], &w["via"]["var"]),
        (&"mia".into(), &"MYTAG".into()),
        "{w}"
    );
    let w = sh_env(
        &m,
        &[("OTHER", "oli"), ("MYTAG", "mia")],
        "cat .coherent/whoami",
    );
    assert!(
        w.out.contains("\"mia\""),
        "first variable in order wins: {}",
        w.show()
    );
    let w = whoami(&m, Some("notused"));
    assert_eq!(
        w["via"]["kind"], "uid",
        "COHERENT_SESSION is not in the list: {w}"
    );
}

#[test]
fn register_makes_a_successor_known() {
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo a > plan.md");
    let (code, v) = cli_json(&m, Some("alice"), &["transfer", "--to", "zed", "plan.md"]);
    assert_eq!(
        (code, v["reason"].as_str()),
        (Some(2), Some("handoff_successor_unknown")),
        "{v}"
    );
    // Not ahead of its first process by another session (docs/sessions.md: register registers
    // only the caller's own session, so no one can claim a name before its owner) ...
    let (code, v) = cli_json(&m, Some("alice"), &["register", "zed"]);
    assert_eq!(
        (code, v["reason"].as_str()),
        (Some(2), Some("session_not_yours")),
        "{v}"
    );
    // ... but by zed itself, by name or not.
    let r = cli(&m, Some("zed"), &["register", "zed"]);
    assert!(r.ok(), "{}", r.show());
    transfer(&m, "alice", "zed", &["plan.md"]);
    // a session registering itself
    let r = cli(&m, Some("yan"), &["--json", "register"]);
    assert!(r.ok(), "{}", r.show());
    assert_eq!(r.json()["session"], "yan");
    let names = session_names(&m);
    for n in ["alice", "zed", "yan"] {
        assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
    }
}

#[test]
fn a_session_that_touched_the_mount_is_known() {
    let m = mount(true);
    std::fs::write(m.backing_path("readme"), "r\n").unwrap();
    sh_ok(&m, Some("alice"), "echo a > plan.md");
    let (code, v) = cli_json(&m, Some("alice"), &["transfer", "--to", "rita", "plan.md"]);
    assert_eq!(
        (code, v["reason"].as_str()),
        (Some(2), Some("handoff_successor_unknown")),
        "{v}"
    );
    // rita only reads a file: she is known from then on
    sh_ok(&m, Some("rita"), "cat readme >/dev/null");
    let r = transfer(&m, "alice", "rita", &["plan.md"]);
    assert_eq!(r["records"][0]["successor_agent"], agent_of("rita"), "{r}");
    assert!(
        events(&m)
            .iter()
            .any(|e| e["event"] == "session_seen" && e["session"] == "rita"),
        "no session_seen for rita"
    );
}
