//! Standing waits on a real mount (docs/agents.md#standing-waits): a wait in flight becomes
//! a standing one at PreCompact, outlives the process that waited, and the next
//! UserPromptSubmit of a fresh hook process of the session reports its outcome once; it
//! survives a `kill -9` of the daemon; another user's session neither sees nor takes it;
//! bad input gets the answers of `wait`. The hooks run as the agents run them: a new
//! `coherent hook claude-code` process, the agent's JSON on stdin, its JSON on stdout.

use crate::coherent;
use crate::common;

use coherent::{cli, cli_json, ctl, mount, read_ctl_file, sh_ok, unique, Remount, Root, CLI, TAGS};
use common::users::{self, User};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The hook's answer for `event` as session `who` (as `user`, or root): None when it says
/// nothing. It must exit 0 with a quiet stderr.
fn hook(user: Option<&User>, root: &Path, who: &str, event: &str) -> Option<Value> {
    let mut c = match user {
        Some(u) => u.argv(
            root,
            &[("COHERENT_SESSION", who)],
            &[CLI, "hook", "claude-code"],
        ),
        None => {
            let mut c = Command::new(CLI);
            c.args(["hook", "claude-code"]).current_dir(root);
            for t in TAGS {
                c.env_remove(t);
            }
            c.env("COHERENT_SESSION", who);
            c
        }
    };
    let input = json!({
        "session_id": "abc123",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": root,
        "hook_event_name": event,
        "trigger": "auto",
        "source": "startup",
        "prompt": "go on",
    });
    let o = common::run_with_stdin(&mut c, &input.to_string());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{event}: {err}");
    assert!(err.is_empty(), "{event}: stderr {err}");
    let out = String::from_utf8_lossy(&o.stdout);
    let out = out.trim();
    (!out.is_empty()).then(|| {
        serde_json::from_str(out).unwrap_or_else(|e| panic!("{event}: not JSON ({e}): {out:?}"))
    })
}

/// The context a UserPromptSubmit answer adds (empty when the hook said nothing).
fn prompt_context(user: Option<&User>, root: &Path, who: &str) -> String {
    hook(user, root, who, "UserPromptSubmit")
        .map(|v| {
            assert_eq!(
                v["hookSpecificOutput"]["hookEventName"], "UserPromptSubmit",
                "{v}"
            );
            v["hookSpecificOutput"]["additionalContext"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default()
}

/// `.coherent/waits` as session `who` (of `user`, or root) reads it.
fn waits(user: Option<&User>, m: &impl Root, who: &str) -> Vec<Value> {
    let text = match user {
        Some(u) => u.sh_ok(
            m.root(),
            &[("COHERENT_SESSION", who)],
            "cat .coherent/waits",
        ),
        None => read_ctl_file(m, Some(who), "waits"),
    };
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("waits: {e}: {text:?}"))
}

/// The one wait of `who` on `path` in `.coherent/waits`, once `f` holds for it.
fn await_wait(
    user: Option<&User>,
    m: &impl Root,
    who: &str,
    path: &str,
    f: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Vec::new();
    let ok = common::wait_until(common::TIMEOUT, || {
        last = waits(user, m, who);
        last.iter().any(|w| w["path"] == path && f(w))
    });
    assert!(ok, "{who}'s waits never got there: {last:?}");
    last.into_iter().find(|w| w["path"] == path).unwrap()
}

/// `plan.md` written by `alice` and handed to `bob`, pending.
fn handed(m: &impl Root, alice: &str, bob: &str) {
    assert!(cli(m, Some(bob), &["register"]).ok());
    sh_ok(m, Some(alice), "echo plan > plan.md");
    let (code, v) = cli_json(m, Some(alice), &["transfer", "--to", bob, "plan.md"]);
    assert_eq!(code, Some(0), "{v}");
}

/// `coherent wait plan.md --until accepted` as `who`, left running: the agent's wait.
fn wait_in_flight(m: &impl Root, who: &str) -> Child {
    let mut c = Command::new(CLI);
    c.args(["wait", "plan.md", "--until", "accepted"])
        .current_dir(m.root())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for t in TAGS {
        c.env_remove(t);
    }
    c.env("COHERENT_SESSION", who).spawn().unwrap()
}

#[test]
fn a_wait_in_flight_outlives_the_compaction_and_is_reported_once() {
    let m = mount(true);
    let root = m.root().to_path_buf();
    let (alice, bob) = (unique("alice-sw"), unique("bob-sw"));
    handed(&*m, &alice, &bob);
    let mut agent = wait_in_flight(&*m, &alice);
    let w = await_wait(None, &*m, &alice, "plan.md", |w| w["standing"] == false);
    assert_eq!(
        (w["until"].as_str(), w["state"].as_str()),
        (Some("accepted"), Some("waiting")),
        "{w}"
    );

    // the context is about to be compacted: the wait stays with the volume
    let pre = hook(None, &root, &alice, "PreCompact").expect("PreCompact says what it kept");
    let msg = pre["systemMessage"].as_str().unwrap_or_default();
    assert!(
        msg.contains("plan.md (until accepted) stay with the volume as standing waits"),
        "{pre}"
    );
    let w = await_wait(None, &*m, &alice, "plan.md", |w| w["standing"] == true);
    assert_eq!(w["state"], "waiting", "{w}");
    // the agent's process is gone
    agent.kill().unwrap();
    agent.wait().unwrap();
    let w = await_wait(None, &*m, &alice, "plan.md", |w| w["standing"] == true);
    assert_eq!(
        waits(None, &*m, &alice).len(),
        1,
        "only the standing wait is left: {w}"
    );
    // nothing to report while it waits
    assert!(!prompt_context(None, &root, &alice).contains("your wait on"));

    assert!(cli(&*m, Some(&bob), &["accept", "plan.md"]).ok());
    let w = await_wait(None, &*m, &alice, "plan.md", |w| w["state"] == "reached");
    assert_eq!(w["record"]["status"], "completed", "{w}");

    let t0 = std::time::Instant::now();
    let first = prompt_context(None, &root, &alice);
    eprintln!("UserPromptSubmit with a report: {:?}", t0.elapsed());
    assert!(
        first.contains(&format!(
            "your wait on plan.md (until accepted) was reached: accepted by session {bob} at "
        )),
        "{first}"
    );
    let t0 = std::time::Instant::now();
    let second = prompt_context(None, &root, &alice);
    eprintln!("UserPromptSubmit without: {:?}", t0.elapsed());
    assert!(!second.contains("your wait on"), "told twice: {second}");
    assert!(waits(None, &*m, &alice).is_empty());
}

#[test]
fn a_standing_wait_survives_kill_9_of_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let (alice, bob) = (unique("alice-sk"), unique("bob-sk"));
    let mut m = Remount::start(&base, &[]);
    handed(&m, &alice, &bob);
    let (code, v) = cli_json(
        &m,
        Some(&alice),
        &["wait", "plan.md", "--until", "accepted", "--standing"],
    );
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(
        (v["standing"].as_bool(), v["state"].as_str()),
        (Some(true), Some("waiting")),
        "{v}"
    );

    m.stop_with(libc::SIGKILL);
    drop(m);
    let mut m = Remount::start(&base, &[]);
    let w = await_wait(None, &m, &alice, "plan.md", |w| w["standing"] == true);
    assert_eq!(w["state"], "waiting", "{w}");
    assert!(cli(&m, Some(&bob), &["accept", "plan.md"]).ok());
    await_wait(None, &m, &alice, "plan.md", |w| w["state"] == "reached");

    // resolved, not yet reported, and the daemon dies again
    m.stop_with(libc::SIGKILL);
    drop(m);
    let m = Remount::start(&base, &[]);
    let root = m.mnt.clone();
    let first = prompt_context(None, &root, &alice);
    assert!(
        first.contains(&format!(
            "your wait on plan.md (until accepted) was reached: accepted by session {bob} at "
        )),
        "{first}"
    );
    assert!(!prompt_context(None, &root, &alice).contains("your wait on"));
}

#[test]
fn another_users_session_neither_sees_nor_takes_it() {
    use std::os::unix::fs::PermissionsExt;
    let (u1, u2) = (users::u1(), users::u2());
    let m = mount(true);
    let root = m.root().to_path_buf();
    std::fs::set_permissions(
        root.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (alice, bob, carol) = (unique("alice-su"), unique("bob-su"), unique("carol-su"));
    let as_u = |u: &User, who: &str, cmd: &str| u.sh_ok(&root, &[("COHERENT_SESSION", who)], cmd);
    as_u(&u1, &bob, &format!("{CLI} register"));
    as_u(&u2, &carol, &format!("{CLI} register"));
    // public.md anyone may look up; private/ is u1's alone
    as_u(
        &u1,
        &alice,
        "echo p > public.md && chmod 644 public.md && mkdir -m 700 private && echo plan > private/plan.md",
    );
    for p in ["public.md", "private/plan.md"] {
        as_u(&u1, &alice, &format!("{CLI} transfer --to {bob} {p}"));
        as_u(&u1, &alice, &format!("{CLI} wait {p} --standing"));
        as_u(&u1, &bob, &format!("{CLI} decline {p}"));
    }
    await_wait(Some(&u1), &*m, &alice, "public.md", |w| {
        w["state"] == "reached"
    });
    await_wait(Some(&u1), &*m, &alice, "private/plan.md", |w| {
        w["state"] == "reached"
    });

    // carol (u2) sees none of alice's waits and is told nothing; a wait of hers on the
    // private path is refused as for a path that does not exist
    let theirs = u2.sh_ok(
        &root,
        &[("COHERENT_SESSION", &carol)],
        "cat .coherent/waits",
    );
    assert_eq!(theirs.trim(), "[]");
    assert!(!prompt_context(Some(&u2), &root, &carol).contains("your wait on"));
    let o = u2.sh(
        &root,
        &[("COHERENT_SESSION", &carol)],
        &format!("{CLI} --json wait private/plan.md --standing"),
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert_eq!(
        (o.status.code(), v["reason"].as_str()),
        (Some(2), Some("no_such_path")),
        "{v}"
    );
    // u2 carrying alice's session name is not alice: it takes nothing
    assert!(!prompt_context(Some(&u2), &root, &alice).contains("your wait on"));

    // a path alice can no longer look up is not told (nor taken) until she can again
    as_u(&u1, &alice, "chmod 000 private");
    let told = prompt_context(Some(&u1), &root, &alice);
    let line = |p: &str| {
        format!("your wait on {p} (until ended) was reached: declined by session {bob} at ")
    };
    assert!(told.contains(&line("public.md")), "{told}");
    assert!(!told.contains("private/plan.md"), "{told}");
    as_u(&u1, &alice, "chmod 700 private");
    let told = prompt_context(Some(&u1), &root, &alice);
    assert!(told.contains(&line("private/plan.md")), "{told}");
    assert!(!told.contains("public.md"), "told twice: {told}");
}

#[test]
fn bad_input_gets_the_answers_of_wait() {
    let m = mount(true);
    let (alice, bob) = (unique("alice-sb"), unique("bob-sb"));
    handed(&*m, &alice, &bob);
    sh_ok(&*m, Some(&alice), "echo x > loose.md");
    for (req, errno, reason) in [
        ("wait nowhere.md --standing", libc::ENOENT, "no_such_path"),
        ("wait loose.md --standing", libc::EACCES, "handoff_not_live"),
        ("wait plan.md soon --standing", libc::EINVAL, "bad_request"),
        (
            "wait plan.md --standing --timeout 1",
            libc::EINVAL,
            "bad_request",
        ),
        ("wait plan.md --report", libc::EINVAL, "bad_request"),
        ("wait ../out.md --standing", libc::EINVAL, "bad_request"),
    ] {
        let (e, v) = ctl(&*m, Some(&alice), req);
        assert_eq!(
            (e, v["reason"].as_str()),
            (errno, Some(reason)),
            "{req}: {v}"
        );
        // the same as a plain wait, where there is one
        if !req.contains("--timeout") && !req.contains("--report") {
            let plain = req.replace(" --standing", " --timeout 0");
            let (pe, pv) = ctl(&*m, Some(&alice), &plain);
            assert_eq!((pe, &pv["reason"]), (e, &v["reason"]), "{plain}: {pv}");
        }
    }
    // a record that can never reach the state: handoff_ended, with its status
    assert!(cli(&*m, Some(&bob), &["decline", "plan.md"]).ok());
    let (e, v) = ctl(&*m, Some(&alice), "wait plan.md completed --standing");
    assert_eq!(
        (e, v["reason"].as_str(), v["status"].as_str()),
        (libc::EACCES, Some("handoff_ended"), Some("declined")),
        "{v}"
    );
    assert!(
        waits(None, &*m, &alice).is_empty(),
        "a refused wait left a standing one"
    );
    // JSON form: `standing` must be a boolean
    let (e, v) = ctl(
        &*m,
        Some(&alice),
        r#"{"verb":"wait","path":"plan.md","standing":"yes"}"#,
    );
    assert_eq!(
        (e, v["reason"].as_str()),
        (libc::EINVAL, Some("bad_request")),
        "{v}"
    );
}

/// A standing wait whose outcome the session already heard from an ordinary `wait` is not
/// told again.
#[test]
fn a_wait_answered_to_the_session_is_not_told_again() {
    let m = mount(true);
    let root = m.root().to_path_buf();
    let (alice, bob) = (unique("alice-sa"), unique("bob-sa"));
    handed(&*m, &alice, &bob);
    let r = cli(
        &*m,
        Some(&alice),
        &["wait", "plan.md", "--until", "accepted", "--standing"],
    );
    assert!(r.ok(), "{}", r.show());
    assert!(cli(&*m, Some(&bob), &["accept", "plan.md"]).ok());
    await_wait(None, &*m, &alice, "plan.md", |w| w["state"] == "reached");
    let r = cli(
        &*m,
        Some(&alice),
        &["wait", "plan.md", "--until", "accepted"],
    );
    assert!(r.ok(), "{}", r.show());
    assert!(waits(None, &*m, &alice).is_empty());
    assert!(!prompt_context(None, &root, &alice).contains("your wait on"));
}

/// `tools/call` of each of `calls` on `coherent mcp` run as session `who` in `root`: the
/// answers (JSON-RPC over stdio, as an agent speaks it).
fn mcp_calls(root: &Path, who: &str, calls: &[Value]) -> Vec<Value> {
    use std::io::{BufRead, Write};
    let mut c = Command::new(CLI);
    c.arg("mcp").current_dir(root);
    for t in TAGS {
        c.env_remove(t);
    }
    let mut child = c
        .env("COHERENT_SESSION", who)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = |v: Value| {
        stdin.write_all(format!("{v}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    };
    let mut answer = |id: u64| loop {
        let l = lines.next().expect("an answer").unwrap();
        let v: Value = serde_json::from_str(&l).unwrap();
        if v["id"] == id {
            break v;
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}}),
    );
    answer(0);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let mut out = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        let id = i as u64 + 1;
        send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": call}));
        out.push(answer(id)["result"].clone());
    }
    drop(stdin);
    let _ = child.wait();
    out
}

#[test]
fn the_mcp_wait_leaves_a_standing_wait_when_it_times_out() {
    let m = mount(true);
    let root = m.root().to_path_buf();
    let (alice, bob) = (unique("alice-sm"), unique("bob-sm"));
    handed(&*m, &alice, &bob);
    let wait = json!({"name": "wait", "arguments": {"path": "plan.md", "until": "accepted", "timeout_s": 0}});
    let r = &mcp_calls(&root, &alice, &[wait])[0];
    assert_eq!(r["isError"], true, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("timeout"), "{r}");
    assert!(
        text.contains("A standing wait stays with the volume"),
        "{r}"
    );
    // the MCP server (and with it the agent) is gone; the wait is not
    assert_eq!(waits(None, &*m, &alice).len(), 1);
    assert!(cli(&*m, Some(&bob), &["accept", "plan.md"]).ok());
    await_wait(None, &*m, &alice, "plan.md", |w| w["state"] == "reached");
    let inbox = json!({"name": "inbox", "arguments": {}});
    let r = &mcp_calls(&root, &alice, &[inbox])[0];
    let w = &r["structuredContent"]["waits"][0];
    assert_eq!(
        (
            w["path"].as_str(),
            w["state"].as_str(),
            w["standing"].as_bool()
        ),
        (Some("plan.md"), Some("reached"), Some(true)),
        "{r}"
    );
    let told = prompt_context(None, &root, &alice);
    assert!(
        told.contains(&format!(
            "your wait on plan.md (until accepted) was reached: accepted by session {bob} at "
        )),
        "{told}"
    );
    assert!(!prompt_context(None, &root, &alice).contains("your wait on"));
}

/// The daemon resolves a standing wait when its record changes, not when someone reads
/// it: a wait until `accepted` that was reached stays reached when the giver withdraws
/// right after.
#[test]
fn a_wait_is_resolved_as_the_record_changes() {
    let m = coherent::mount_with(common::Mount::builder().env("RUST_LOG", "debug"));
    let root = m.root().to_path_buf();
    let (alice, bob) = (unique("alice-sr"), unique("bob-sr"));
    handed(&*m, &alice, &bob);
    let r = cli(
        &*m,
        Some(&alice),
        &["wait", "plan.md", "--until", "accepted", "--standing"],
    );
    assert!(r.ok(), "{}", r.show());
    let before = m.log().matches("standing wait resolved").count();
    let t0 = std::time::Instant::now();
    assert!(cli(&*m, Some(&bob), &["accept", "plan.md"]).ok());
    // the wait thread wakes on the change (its idle look is 5 s: well past this bound)
    assert!(
        common::wait_until(std::time::Duration::from_millis(2500), || m
            .log()
            .matches("standing wait resolved")
            .count()
            > before),
        "not resolved within 2.5 s of the accept ({:?})",
        t0.elapsed()
    );
    // the daemon's own stamps: when the accept changed the record, when the wait resolved
    let w = await_wait(None, &*m, &alice, "plan.md", |w| w["state"] == "reached");
    let ms = |k: &str| {
        let t = w.pointer(k).and_then(Value::as_str).unwrap_or_default();
        chrono_ms(t)
    };
    eprintln!(
        "standing wait resolved {} ms after the accept",
        ms("/resolved") - ms("/record/updated")
    );
    assert!(cli(&*m, Some(&alice), &["withdraw", "plan.md"]).ok());
    let told = prompt_context(None, &root, &alice);
    assert!(
        told.contains(&format!(
            "your wait on plan.md (until accepted) was reached: accepted by session {bob} at "
        )),
        "{told}"
    );
}

/// Milliseconds of an RFC 3339 UTC stamp as the volume writes them
/// (`2026-12-03T16:33:45.248Z`), within a day: enough to subtract two of them.
fn chrono_ms(t: &str) -> i64 {
    let hms = t
        .split('T')
        .nth(1)
        .unwrap_or_default()
        .trim_end_matches('Z');
    let mut it = hms.split(':');
    let (h, m, s) = (it.next(), it.next(), it.next());
    let num = |x: Option<&str>| x.and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    ((num(h) * 3600.0 + num(m) * 60.0 + num(s)) * 1000.0).round() as i64
}
