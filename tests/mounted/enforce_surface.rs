//! The `.coherent/` control surface of a real mount (docs/design.md#control-surface,
//! docs/design.md#state-log): `status`, `events` (JSON lines, followed by `tail -f`), `whoami`,
//! `why`, `inbox`, the computed xattrs, the directory's protection and a malformed `ctl` request.

use crate::coherent;
use crate::common;

use coherent::*;
use common::Mount;
use serde_json::Value;
use std::io::BufRead;
use std::process::{Command, Stdio};

fn handed() -> Vol {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    let v = transfer(&m, "alice", "bob", &["plan.md"]);
    assert_eq!(v["records"][0]["live"], true, "{v}");
    m
}

#[test]
fn the_control_directory_lists_its_files() {
    let m = mount(true);
    let ls = sh_ok(&m, Some("alice"), "ls -a .coherent");
    for f in ["ctl", "status", "events", "whoami", "why", "inbox"] {
        assert!(ls.lines().any(|l| l == f), "{f} not in {ls:?}");
    }
    // not in the backing directory
    assert!(!m.backing_path(".coherent").exists());
}

/// Issue 20 (docs/design.md#control-surface): `.coherent` is not listed by `readdir` of the
/// root, so tools that walk the workspace (`ls -a`, `find`, `git add -A`, `tar`, `rg`) never
/// see it; it stays reachable by name.
#[test]
fn the_control_directory_is_hidden_from_listings_of_the_root() {
    let m = mount(true);
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && mkdir sub && echo x > sub/x",
    );
    let ls = sh_ok(&m, Some("alice"), "ls -a");
    assert!(ls.lines().any(|l| l == "plan.md"), "{ls}");
    assert!(!ls.contains(".coherent"), "ls -a lists it: {ls}");
    let find = sh_ok(&m, Some("alice"), "find .");
    assert!(find.contains("./sub/x"), "{find}");
    assert!(!find.contains(".coherent"), "find lists it: {find}");
    let tar = sh_ok(&m, Some("alice"), "tar cf - . | tar tf -");
    assert!(
        tar.contains("plan.md") && !tar.contains(".coherent"),
        "{tar}"
    );
    let git = sh_ok(
        &m,
        Some("alice"),
        "git init -q . && git add -A && git status --porcelain",
    );
    assert!(git.contains("plan.md"), "{git}");
    assert!(!git.contains(".coherent"), "git add -A staged it: {git}");
    assert!(
        sh(&m, None, "command -v rg").ok(),
        "rg is not installed (bash scripts/deps.sh installs ripgrep)"
    );
    let rg = sh_ok(&m, Some("alice"), "rg --files --hidden --no-ignore");
    assert!(rg.contains("plan.md") && !rg.contains(".coherent"), "{rg}");
    // reachable by name, as before
    let who = sh_ok(&m, Some("alice"), "cat .coherent/whoami");
    assert!(who.contains("alice"), "{who}");
    sh_ok(
        &m,
        Some("alice"),
        "test -d .coherent && ls .coherent/ctl >/dev/null",
    );
}

#[test]
fn status_lists_sessions_records_and_counts() {
    let m = handed();
    let st = status(&m);
    let sessions = st["sessions"].as_array().expect("sessions");
    for n in ["alice", "bob"] {
        let s = sessions
            .iter()
            .find(|s| s["name"] == n)
            .unwrap_or_else(|| panic!("{n} not in {st}"));
        assert_eq!(s["agent"], agent_of(n), "{s}");
    }
    let live = st["live"].as_array().expect("live");
    assert_eq!(live.len(), 1, "{st}");
    assert_eq!(live[0]["path"], "plan.md");
    assert_eq!(st["counts"]["live"], 1, "{st}");
    assert!(st["counts"]["sessions"].as_u64().unwrap() >= 2, "{st}");
    // the ctl verb answers the same content
    let (errno, r) = ctl(&m, Some("bob"), "status plan.md");
    assert_eq!(errno, 0, "{r}");
    assert_eq!(r["status"]["live"][0]["successor"], "bob", "{r}");
    assert_eq!(r["status"]["version"], 1, "{r}");
}

#[test]
fn events_are_json_lines_with_the_common_fields() {
    let m = handed();
    sh(&m, Some("alice"), "echo x >> plan.md");
    sh_ok(&m, Some("bob"), "echo y >> plan.md");
    await_events(&m, "completed", "plan.md", None, 1);
    let ev = events(&m);
    let mut last_seq = 0;
    for e in &ev {
        for k in ["seq", "ts", "event", "path", "session", "agent"] {
            assert!(e.get(k).is_some(), "{k} missing in {e}");
        }
        let seq = e["seq"].as_u64().expect("seq");
        assert!(seq > last_seq, "seq not increasing at {e}");
        last_seq = seq;
        let ts = e["ts"].as_str().expect("ts");
        assert!(
            ts.len() >= 20 && &ts[4..5] == "-" && &ts[10..11] == "T",
            "ts not RFC 3339: {ts}"
        );
    }
    let names: Vec<&str> = ev.iter().filter_map(|e| e["event"].as_str()).collect();
    for n in ["session_seen", "commit", "transfer", "denied", "completed"] {
        assert!(names.contains(&n), "no {n} event in {names:?}");
    }
    let t = ev.iter().find(|e| e["event"] == "transfer").unwrap();
    assert_eq!(
        (&t["session"], &t["agent"], &t["path"]),
        (
            &"alice".into(),
            &agent_of("alice").into(),
            &"plan.md".into()
        ),
        "{t}"
    );
    let d = ev.iter().find(|e| e["event"] == "denied").unwrap();
    assert_eq!(d["session"], "alice", "{d}");
}

#[test]
fn tail_f_follows_the_events() {
    let m = mount(true);
    let mut tail = Command::new("tail")
        .args(["-n", "+1", "-f", ".coherent/events"])
        .current_dir(&m.mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = tail.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    sh_ok(&m, Some("alice"), "echo a > followed.md");
    let end = std::time::Instant::now() + SETTLE;
    let mut seen = false;
    while let Ok(l) = rx.recv_timeout(end.saturating_duration_since(std::time::Instant::now())) {
        let e: Value = serde_json::from_str(&l).unwrap_or(Value::Null);
        if e["event"] == "commit" && e["path"] == "followed.md" {
            seen = true;
            break;
        }
    }
    let _ = tail.kill();
    let _ = tail.wait();
    assert!(seen, "tail -f did not show the commit within {SETTLE:?}");
}

#[test]
fn whoami_why_and_inbox_are_per_reader() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    let w = whoami(&m, Some("alice"));
    assert_eq!(w["session"], "alice", "{w}");
    assert_eq!(w["agent"], agent_of("alice"), "{w}");
    assert_eq!(w["via"]["kind"], "env", "{w}");
    assert_eq!(w["via"]["var"], "COHERENT_SESSION", "{w}");
    let r = transfer_with(
        &m,
        "alice",
        &["--to", "bob", "--note", "the tests are in t/", "plan.md"],
    );
    assert_eq!(r["records"][0]["note"], "the tests are in t/", "{r}");
    sh_refused(&m, "alice", "echo x > plan.md", "plan.md", "fenced");
    let alice_why = why(&m, Some("alice"));
    if let Some(e) = check_deny_text(&alice_why, "plan.md", "bob", 1) {
        panic!("{e}");
    }
    // any process of the session reads the same text; other sessions do not
    let child = sh_ok(&m, Some("alice"), "sh -c 'cat .coherent/why'");
    assert_eq!(child, alice_why);
    assert!(!why(&m, Some("bob")).contains("plan.md"));
    let ib = inbox(&m, Some("bob"));
    assert!(
        ib.contains("plan.md") && ib.contains("the tests are in t/"),
        "{ib}"
    );
    let parsed: Value = serde_json::from_str(ib.trim()).expect("inbox is JSON");
    assert!(
        parsed.to_string().contains("\"giver\":\"alice\""),
        "{parsed}"
    );
    assert!(!inbox(&m, Some("alice")).contains("plan.md"));
    // a refused verb is also explained in why
    let r = cli(&m, Some("carol"), &["accept", "plan.md"]);
    assert_eq!(r.code, Some(2), "{}", r.show());
    let w = why(&m, Some("carol"));
    assert!(!w.trim().is_empty(), "no why after a refused verb");
}

#[test]
fn the_xattrs_are_computed() {
    let m = handed();
    assert_eq!(version(&m, "plan.md"), Some(1));
    for (who, role) in [
        ("alice", "giver"),
        ("bob", "successor"),
        ("carol", "bystander"),
    ] {
        let h = handoff(&m, Some(who), "plan.md").unwrap_or_else(|| panic!("no handoff for {who}"));
        assert_eq!(h["role"], role, "{h}");
        assert_eq!(h["giver"], "alice", "{h}");
        assert_eq!(h["successor"], "bob", "{h}");
        assert_eq!(h["version_at_transfer"], 1, "{h}");
    }
    // no live record: no handoff xattr
    sh_ok(&m, Some("alice"), "echo o > other.md");
    assert!(handoff(&m, Some("alice"), "other.md").is_none());
    // computed, not stored: not in the backing file, and cannot be set
    let r = sh(
        &m,
        Some("carol"),
        "setfattr -n user.coherent.version -v 99 other.md",
    );
    assert!(r.denied(), "setting user.coherent.version: {}", r.show());
    let r = sh(
        &m,
        Some("carol"),
        "setfattr -x user.coherent.version other.md",
    );
    assert!(r.denied(), "removing user.coherent.version: {}", r.show());
    assert_eq!(version(&m, "other.md"), Some(1));
    // not listed (docs/design.md#control-surface: so copies do not carry them), though readable by
    // name
    let names = sh_ok(&m, Some("carol"), "getfattr --absolute-names -m - plan.md");
    assert!(
        !names.contains("user.coherent."),
        "computed names listed: {names:?}"
    );
    // other xattrs pass through to the backing file
    sh_ok(&m, Some("alice"), "setfattr -n user.mine -v hello other.md");
    let o = Command::new("getfattr")
        .args(["--only-values", "-n", "user.mine"])
        .arg(m.backing_path("other.md"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello");
}

#[test]
fn the_control_directory_cannot_be_changed() {
    let m = mount(true);
    for who in [Some("alice"), None] {
        for cmd in [
            "rm -rf .coherent",
            "rmdir .coherent",
            "mv .coherent gone",
            "mv .coherent/status s",
            "echo x > .coherent/status",
            "echo x >> .coherent/events",
            "touch .coherent/new",
            "mkdir .coherent/d",
            "rm .coherent/ctl",
            "ln -s x .coherent/l",
            "chmod 777 .coherent",
            "mkdir .coherent",
        ] {
            let r = sh(&m, who, cmd);
            assert!(!r.ok(), "{who:?} `{cmd}` succeeded");
        }
    }
    let ls = sh_ok(&m, None, "ls .coherent");
    for f in ["ctl", "status", "events", "whoami", "why", "inbox"] {
        assert!(
            ls.lines().any(|l| l == f),
            "{f} gone after the attempts: {ls:?}"
        );
    }
    assert!(!m.path("gone").exists() && !m.path("s").exists());
}

#[test]
fn a_backing_control_directory_is_hidden() {
    let m = mount(true);
    std::fs::create_dir(m.backing_path(".coherent")).unwrap();
    std::fs::write(m.backing_path(".coherent/secret"), "x").unwrap();
    let ls = sh_ok(&m, None, "ls -a .coherent");
    assert!(!ls.contains("secret"), "{ls}");
    assert!(ls.contains("ctl"), "{ls}");
    assert!(!m.path(".coherent/secret").exists());
}

#[test]
fn a_malformed_request_fails_with_einval_and_a_reply() {
    let m = mount(true);
    for req in [
        "frobnicate plan.md",
        "{\"verb\":",
        "{\"verb\":\"transfer\",\"paths\":[\"a\"],\"to\":\"bob\",\"colour\":\"red\"}",
        "transfer --to bob ../outside",
        "transfer --to bob /etc/passwd",
        "accept",
        "status a b",
    ] {
        let (errno, r) = ctl(&m, Some("alice"), req);
        assert_eq!(errno, libc::EINVAL, "{req:?}: {r}");
        assert_eq!(r["ok"], false, "{req:?}: {r}");
        assert_eq!(r["reason"], "bad_request", "{req:?}: {r}");
        assert!(!r["message"].as_str().unwrap_or("").is_empty(), "{r}");
    }
    // a good request on the same kind of handle answers ok
    let (errno, r) = ctl(&m, Some("alice"), "whoami");
    assert_eq!(errno, 0, "{r}");
    assert_eq!(
        (&r["ok"], &r["session"]),
        (&true.into(), &"alice".into()),
        "{r}"
    );
}

#[test]
fn coherent_watch_follows_the_log() {
    let m = mount(true);
    let mut w = Command::new(CLI)
        .args(["watch", "-n", "0"])
        .current_dir(&m.mnt)
        .env_remove("COHERENT_SESSION")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = w.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let end = std::time::Instant::now() + SETTLE;
    let mut seen = String::new();
    // watch may start after the first write: keep writing until a line names the file
    while std::time::Instant::now() < end && !seen.contains("watched.md") {
        sh_ok(&m, Some("alice"), "echo a >> watched.md");
        while let Ok(l) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
            seen.push_str(&l);
            seen.push('\n');
        }
    }
    let _ = w.kill();
    let _ = w.wait();
    assert!(
        seen.contains("watched.md") && seen.contains("alice"),
        "coherent watch showed: {seen:?}"
    );
}

/// `coherent-mount DIR` over the workspace itself: same paths, same fence, and the CLI
/// finds the volume from the directory.
#[test]
fn an_in_place_mount_enforces_the_same() {
    let m = mount_with(Mount::builder().in_place());
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    transfer(&m, "alice", "bob", &["plan.md"]);
    sh_refused(&m, "alice", "echo x >> plan.md", "plan.md", "fenced");
    let r = cli(&m, Some("alice"), &["status", "plan.md"]);
    assert!(r.ok() && r.out.contains("bob"), "{}", r.show());
    sh_ok(&m, Some("bob"), "echo y >> plan.md");
    assert_eq!(version(&m, "plan.md"), Some(2));
}

/// One descriptor, several requests: after `write(2)`, a plain `read(2)` returns the whole
/// reply from its first byte whatever offset the write left, and the next request on the
/// same descriptor gets its own reply.
#[test]
fn ctl_replies_read_back_on_the_writing_descriptor() {
    let m = mount(true);
    let out = sh_ok(
        &m,
        Some("alice"),
        "exec 3<>.coherent/ctl; echo whoami >&3; cat <&3; echo status >&3; cat <&3",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "two whole replies expected: {out:?}");
    let first: Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(
        (&first["ok"], &first["verb"], &first["session"]),
        (
            &Value::Bool(true),
            &Value::from("whoami"),
            &Value::from("alice")
        ),
        "{first}"
    );
    let second: Value = serde_json::from_str(lines[1]).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(second["verb"], "status", "{second}");
    assert!(second["status"]["sessions"].is_array(), "{second}");
}

/// A name the volume would ignore is refused up front by `coherent run` with the very
/// message `register` gets; a tag that is ignored anyway (set by hand) is logged once per
/// process and explained by `whoami`.
#[test]
fn an_invalid_session_name_is_refused_alike_and_explained_by_whoami() {
    let m = mount(true);
    let want = "coherent: refused (bad_request): invalid session name \"a b\": a session \
                name may hold only letters, digits and . _ : @ -, not ' '";
    let run = cli(&m, None, &["run", "--session", "a b", "--", "true"]);
    assert_eq!(
        (run.code, run.err.trim()),
        (Some(1), want),
        "{}",
        run.show()
    );
    let reg = cli(&m, Some("alice"), &["register", "a b"]);
    assert_eq!(
        (reg.code, reg.err.trim()),
        (Some(2), want),
        "{}",
        reg.show()
    );
    let (errno, reply) = ctl(&m, Some("alice"), "register 'a b'");
    assert_eq!(
        (errno, &reply["reason"]),
        (libc::EINVAL, &Value::from("bad_request"))
    );

    let bad = [("COHERENT_SESSION", "a b")];
    let who = cli_env(&m, &bad, &["whoami"]);
    assert!(who.ok(), "{}", who.show());
    assert!(
        who.out.contains("resolved by uid")
            && who
                .out
                .contains("COHERENT_SESSION was ignored: invalid session name \"a b\""),
        "{}",
        who.show()
    );
    let (_, j) = cli_json(&m, None, &["whoami"]);
    assert!(
        j.get("ignored").is_none(),
        "nothing ignored without a tag: {j}"
    );
    let file = sh_env(&m, &bad, "cat .coherent/whoami");
    let v: Value = serde_json::from_str(file.out.trim()).unwrap();
    assert_eq!(v["ignored"][0]["var"], "COHERENT_SESSION", "{v}");
    assert!(v["session"].as_str().unwrap().starts_with("uid:"), "{v}");

    // Four threads of one process, each resolved cold: one log line for the process.
    let threads = "import threading\n\
                   def f(): open('.coherent/whoami').read()\n\
                   ts = [threading.Thread(target=f) for _ in range(4)]\n\
                   [t.start() for t in ts]\n\
                   [t.join() for t in ts]\n\
                   print(__import__('os').getpid())";
    let r = run_in(
        m.root(),
        &[("COHERENT_SESSION", "x y")],
        python().arg("-c").arg(threads),
    );
    assert!(r.ok(), "{}", r.show());
    let needle = format!("process {}: ignoring COHERENT_SESSION", r.out.trim());
    assert!(
        common::wait_until(SETTLE, || m.log().contains(&needle)),
        "not logged: {}",
        m.log()
    );
    assert_eq!(m.log().matches(&needle).count(), 1, "{}", m.log());
}
