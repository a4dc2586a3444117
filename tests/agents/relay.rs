//! The relay end to end: the hooks `coherent install claude-code` and `coherent install
//! codex` write, read back from the installed files and run through `sh -c` with the agent's
//! hook input on stdin, on a real mount. Three sessions in a row carry two files: each one's PreCompact offers them to
//! any session, the next one's SessionStart lists them with the note, it claims and writes.
//! No write is lost, and after each offer the giver's write is refused (EACCES, `fenced`).

use crate::coherent;
use crate::common;

use coherent::{await_events, cli, live_record, sh, sh_ok, Root, CLI, TAGS};
use common::Mount;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// A file name that looks like an OpenAI key: the line naming it must not reach the note.
const SECRET: &str = "sk-proj-Zq8vR2mXw4Lk9Tb7Yc3Nf6Hd1Gs5Ja0Pe";

/// An agent's hook configuration as `coherent install` writes it, with `coherent` on PATH.
struct Installed {
    _tmp: tempfile::TempDir,
    path: String,
    /// (event, command) of each handler the install wrote.
    hooks: Vec<(String, String)>,
}

impl Installed {
    /// `coherent install claude-code`: the hooks in `.claude/settings.json`.
    fn claude_code() -> Installed {
        let (tmp, path) = Installed::install(&["claude-code"]);
        let text = std::fs::read_to_string(tmp.path().join("proj/.claude/settings.json")).unwrap();
        let settings: Value = serde_json::from_str(&text).unwrap();
        let mut hooks = Vec::new();
        for (event, groups) in settings["hooks"].as_object().unwrap() {
            for g in groups.as_array().unwrap() {
                for h in g["hooks"].as_array().unwrap() {
                    hooks.push((event.clone(), h["command"].as_str().unwrap().into()));
                }
            }
        }
        Installed {
            _tmp: tmp,
            path,
            hooks,
        }
    }

    /// `coherent install codex`: the `[[hooks.EVENT]]` tables in `$CODEX_HOME/config.toml`.
    fn codex() -> Installed {
        let (tmp, path) = Installed::install(&["codex"]);
        let text = std::fs::read_to_string(tmp.path().join("codex/config.toml")).unwrap();
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        let mut hooks = Vec::new();
        for (event, groups) in doc["hooks"].as_table().unwrap().iter() {
            for g in groups.as_array_of_tables().unwrap().iter() {
                for h in g["hooks"].as_array_of_tables().unwrap().iter() {
                    hooks.push((event.to_string(), h["command"].as_str().unwrap().into()));
                }
            }
        }
        Installed {
            _tmp: tmp,
            path,
            hooks,
        }
    }

    /// Runs `coherent install ARGS proj` in a scratch home; (the scratch dir, PATH).
    fn install(args: &[&str]) -> (tempfile::TempDir, String) {
        let tmp = tempfile::tempdir().unwrap();
        let [bin, home, proj] = ["bin", "codex", "proj"].map(|d| tmp.path().join(d));
        for d in [&bin, &home, &proj] {
            std::fs::create_dir(d).unwrap();
        }
        std::os::unix::fs::symlink(CLI, bin.join("coherent")).unwrap();
        let path = format!("{}:/usr/bin:/bin", bin.display());
        let out = Command::new(CLI)
            .arg("install")
            .args(args)
            .arg(&proj)
            .env("PATH", &path)
            .env("CODEX_HOME", &home)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        (tmp, path)
    }

    /// Runs the hook installed for `input`'s event as Claude Code does, as session `who`:
    /// its JSON answer, after checking it exits 0 with a quiet stderr.
    fn answer(&self, who: &str, input: &Value) -> Value {
        let event = input["hook_event_name"].as_str().unwrap();
        let command = &self
            .hooks
            .iter()
            .find(|(e, _)| e == event)
            .unwrap_or_else(|| panic!("no {event} hook in {:?}", self.hooks))
            .1;
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(command)
            .env("PATH", &self.path)
            // what the hook keeps (the relays told) stays in the scratch home
            .env("HOME", self._tmp.path())
            .env_remove("XDG_RUNTIME_DIR")
            .current_dir(input["cwd"].as_str().unwrap());
        for t in TAGS {
            c.env_remove(t);
        }
        c.env("COHERENT_SESSION", who);
        let o = common::run_with_stdin(&mut c, &input.to_string());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{event}: {err}");
        assert!(err.is_empty(), "{event}: stderr {err}");
        let out = String::from_utf8_lossy(&o.stdout);
        serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{who} {event}: not JSON ({e}): {out:?}"))
    }
}

/// The agents' hook input for `event` (the common fields and the event's own; Codex adds
/// its model and turn, which the hook ignores).
fn input(root: &Path, event: &str) -> Value {
    let mut v = json!({
        "session_id": "3f2a-claude",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": root,
        "hook_event_name": event,
    });
    match event {
        "PreCompact" => {
            v["turn_id"] = json!("t9");
            v["trigger"] = json!("auto");
            v["custom_instructions"] = json!("");
        }
        "SessionStart" => v["source"] = json!("startup"),
        "SessionEnd" => v["reason"] = json!("logout"),
        _ => {}
    }
    v
}

/// `who` appends its line to both files, once the volume logged both commits.
fn write_both(m: &Mount, who: &str, commits: usize) {
    sh_ok(
        m,
        Some(who),
        &format!("echo {who} >> a.md && echo {who} >> b.md"),
    );
    for f in ["a.md", "b.md"] {
        let got = await_events(m, "commit", f, Some(who), commits);
        assert!(got.len() >= commits, "{who}'s commit of {f} not logged");
    }
}

/// The offer `giver` made of `f`: live, to any session, with a note from the relay.
fn offered(m: &Mount, f: &str, giver: &str) -> Value {
    let r = live_record(m, f).unwrap_or_else(|| panic!("no live record of {f}"));
    assert_eq!(r["giver"], giver, "{r}");
    assert_eq!(r["offer"], true, "{r}");
    let note = r["note"].as_str().unwrap_or_else(|| panic!("no note: {r}"));
    assert!(
        note.contains(&format!("Relay from session {giver}")),
        "{note}"
    );
    r
}

/// `who`'s write of `f` is refused: EACCES, and the volume logs it as `fenced`.
fn fenced(m: &Mount, who: &str, f: &str) {
    let before = coherent::events_of(m, "denied", f, Some(who)).len();
    let r = sh(m, Some(who), &format!("echo late-{who} >> {f}"));
    assert!(
        r.denied(),
        "{who}'s write of {f} after its offer: {}",
        r.show()
    );
    let got = await_events(m, "denied", f, Some(who), before + 1);
    assert_eq!(got.last().unwrap()["reason"], "fenced", "{got:?}");
}

fn system_message(v: &Value) -> String {
    v["systemMessage"]
        .as_str()
        .unwrap_or_else(|| panic!("no systemMessage: {v}"))
        .to_string()
}

fn start_context(v: &Value) -> String {
    assert_eq!(
        v["hookSpecificOutput"]["hookEventName"], "SessionStart",
        "{v}"
    );
    v["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap_or_else(|| panic!("no additionalContext: {v}"))
        .to_string()
}

#[test]
fn a_relay_of_three_sessions_loses_no_write_and_keeps_the_fence() {
    // s1 and s3 are Claude Code sessions, s2 a Codex one: the relay crosses agents
    let claude = Installed::claude_code();
    let codex = Installed::codex();
    let m = Mount::new(true);
    let root = m.root().to_path_buf();

    // s1 works, then its context runs out
    write_both(&m, "s1", 1);
    sh_ok(&m, Some("s1"), &format!("echo key-notes > {SECRET}.txt"));
    await_events(&m, "commit", &format!("{SECRET}.txt"), Some("s1"), 1);
    // a file s1 already handed to a named session stays with it: not offered again
    assert!(cli(&m, Some("rev"), &["register"]).ok());
    sh_ok(&m, Some("s1"), "echo s1 > c.md");
    await_events(&m, "commit", "c.md", Some("s1"), 1);
    let r = cli(&m, Some("s1"), &["transfer", "--to", "rev", "c.md"]);
    assert!(r.ok(), "{}", r.show());
    let msg = system_message(&claude.answer("s1", &input(&root, "PreCompact")));
    let first = msg.lines().next().unwrap();
    assert!(!first.contains("c.md"), "{msg}");
    let c = live_record(&m, "c.md").unwrap();
    assert_eq!(
        (&c["successor"], &c["giver"]),
        (&json!("rev"), &json!("s1")),
        "{c}"
    );
    assert!(first.contains("offered to any session"), "{msg}");
    assert!(first.contains(": a.md, b.md, "), "{msg}");
    assert!(msg.contains("1 line(s) were left out"), "{msg}");
    for f in ["a.md", "b.md"] {
        let r = offered(&m, f, "s1");
        let note = r["note"].as_str().unwrap();
        assert!(note.contains("- a.md (1 commits)"), "{note}");
        assert!(note.contains("- c.md to rev"), "{note}");
        // the credential-looking line stayed out of the volume
        assert!(!note.contains(SECRET), "{note}");
        fenced(&m, "s1", f);
    }
    let r = offered(&m, &format!("{SECRET}.txt"), "s1");
    assert!(!r["note"].as_str().unwrap().contains(SECRET), "{r}");
    // s1 goes on after its compaction (the same session): told how to take its relay
    // back if it carries on with the work itself.
    let ctx = start_context(&claude.answer("s1", &input(&root, "SessionStart")));
    assert!(ctx.contains("is a relay you made"), "{ctx}");
    assert!(ctx.contains("coherent withdraw PATH"), "{ctx}");

    // s2 starts fresh: told what waits, with s1's note quoted, and how to claim it
    let ctx = start_context(&codex.answer("s2", &input(&root, "SessionStart")));
    assert!(ctx.contains("Relays waiting to be claimed"), "{ctx}");
    assert!(ctx.contains("a.md from s1"), "{ctx}");
    assert!(ctx.contains("> Relay from session s1"), "{ctx}");
    assert!(ctx.contains("coherent accept PATH"), "{ctx}");
    let r = cli(&m, Some("s2"), &["accept", "a.md", "b.md"]);
    assert!(r.ok(), "{}", r.show());
    write_both(&m, "s2", 1);
    let v = codex.answer("s2", &input(&root, "PreCompact"));
    // Codex fails a hook whose answer has a field it does not document for the event
    let fields: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(fields, ["systemMessage"], "{v}");
    let msg = system_message(&v);
    assert!(
        msg.lines().next().unwrap().contains(": a.md, b.md."),
        "{msg}"
    );
    for f in ["a.md", "b.md"] {
        let note = offered(&m, f, "s2")["note"].as_str().unwrap().to_string();
        assert!(note.contains("- a.md from s1"), "{note}");
        fenced(&m, "s2", f);
    }

    // s3 claims from s2; s2 stays fenced until s3 writes
    let ctx = start_context(&claude.answer("s3", &input(&root, "SessionStart")));
    assert!(ctx.contains("b.md from s2"), "{ctx}");
    assert!(ctx.contains("> Relay from session s2"), "{ctx}");
    let r = cli(&m, Some("s3"), &["accept", "a.md", "b.md"]);
    assert!(r.ok(), "{}", r.show());
    fenced(&m, "s2", "a.md");
    write_both(&m, "s3", 1);
    for f in ["a.md", "b.md"] {
        let text = std::fs::read_to_string(m.at(f)).unwrap();
        assert_eq!(text, "s1\ns2\ns3\n", "{f}");
    }

    // s3's session ends: the same relay, said as an end
    let msg = system_message(&claude.answer("s3", &input(&root, "SessionEnd")));
    assert!(msg.contains("it ended"), "{msg}");
    for f in ["a.md", "b.md"] {
        offered(&m, f, "s3");
        fenced(&m, "s3", f);
    }
}

/// A session's end with `reason`, as Claude Code sends it (Codex sends `other`, always).
fn session_end(root: &Path, reason: &str) -> Value {
    let mut v = input(root, "SessionEnd");
    v["reason"] = json!(reason);
    v
}

/// Issue 38, item 5: a headless run (`claude -p`, `codex exec`) that simply ends (`reason`
/// `other`) is not a relay: the same session runs again and writes its own file. The user
/// quitting (`prompt_input_exit`) or clearing the context (`clear`) is. The note names only
/// files that exist (not an editor's temporary file renamed over its file).
#[test]
fn a_headless_end_keeps_the_files_and_an_explicit_end_relays() {
    let claude = Installed::claude_code();
    let codex = Installed::codex();
    let m = Mount::new(true);
    let root = m.root().to_path_buf();
    // as Claude Code's Write does: a temporary file, renamed over the file
    sh_ok(
        &m,
        Some("job"),
        "echo v1 > notes.md.tmp.4242.9f3a && mv notes.md.tmp.4242.9f3a notes.md",
    );
    await_events(&m, "commit", "notes.md", Some("job"), 1);
    for (agent, installed) in [("claude", &claude), ("codex", &codex)] {
        let (code, out, err) = run_hook(installed, "job", &session_end(&root, "other"));
        assert_eq!(code, Some(0), "{agent}: {err}");
        assert!(!out.contains("offered"), "{agent}: {out}");
        assert!(
            live_record(&m, "notes.md").is_none(),
            "{agent}: a headless end offered the files"
        );
        // the next run of the same session writes its own file
        sh_ok(&m, Some("job"), &format!("echo {agent} >> notes.md"));
    }
    // the user quits: a relay
    let msg = system_message(&claude.answer("job", &session_end(&root, "prompt_input_exit")));
    assert!(msg.contains("it ended"), "{msg}");
    let r = offered(&m, "notes.md", "job");
    let note = r["note"].as_str().unwrap();
    assert!(note.contains("- notes.md ("), "{note}");
    assert!(
        !note.contains(".tmp."),
        "a temporary name in the note: {note}"
    );
    assert!(!msg.contains(".tmp."), "{msg}");
    fenced(&m, "job", "notes.md");
    // /clear: the context is gone, a relay too
    sh_ok(&m, Some("job2"), "echo x > other.md");
    await_events(&m, "commit", "other.md", Some("job2"), 1);
    let msg = system_message(&claude.answer("job2", &session_end(&root, "clear")));
    assert!(msg.contains("its context was cleared"), "{msg}");
    offered(&m, "other.md", "job2");
}

/// Issue 38, item 8: after one relay of 150 files, another session's context is bounded
/// (one line per offer up to a cap, then a count; the note said once, itself capped), and
/// it is said once per client session: not again before the next prompt, but again to a
/// new client session.
#[test]
fn a_relay_of_150_files_gives_bounded_context_said_once() {
    let claude = Installed::claude_code();
    let m = Mount::new(true);
    let root = m.root().to_path_buf();
    sh_ok(
        &m,
        Some("big"),
        "mkdir d && for i in $(seq 1 150); do echo $i > d/f$i.md; done",
    );
    await_events(&m, "commit", "d/f150.md", Some("big"), 1);
    assert!(
        common::wait_until(common::TIMEOUT, || coherent::events(&m)
            .iter()
            .filter(|e| e["event"] == "commit" && e["session"] == "big")
            .count()
            >= 150),
        "150 commits not logged"
    );
    let msg = system_message(&claude.answer("big", &input(&root, "PreCompact")));
    assert!(msg.contains("offered to any session"), "{msg}");
    let live = coherent::status(&m)["live"].as_array().unwrap().len();
    assert_eq!(live, 150, "every file offered");
    let mut start = input(&root, "SessionStart");
    start["session_id"] = json!("bob-1");
    let ctx = start_context(&claude.answer("bob", &start));
    assert!(ctx.contains("Relays waiting to be claimed"), "{ctx}");
    assert!(ctx.contains("and 130 more offered files"), "{ctx}");
    assert!(
        ctx.contains("> Relay from session big"),
        "the note, once: {ctx}"
    );
    assert_eq!(ctx.matches("Relay from session big").count(), 1, "{ctx}");
    assert!(ctx.len() < 8 * 1024, "{} bytes:\n{ctx}", ctx.len());
    // the next prompt of the same client session: not said again
    let mut prompt = input(&root, "UserPromptSubmit");
    prompt["session_id"] = json!("bob-1");
    prompt["prompt"] = json!("go on");
    let (code, out, _) = run_hook(&claude, "bob", &prompt);
    assert_eq!(code, Some(0));
    assert!(!out.contains("Relays waiting"), "said again: {out}");
    // a new client session of bob: said once more
    prompt["session_id"] = json!("bob-2");
    let (_, out, _) = run_hook(&claude, "bob", &prompt);
    assert!(out.contains("Relays waiting"), "{out}");
    // the giver's own list is capped too
    let mut start = input(&root, "SessionStart");
    start["session_id"] = json!("big-2");
    let ctx = start_context(&claude.answer("big", &start));
    assert!(ctx.contains("and 130 more (`coherent status`"), "{ctx}");
    assert!(ctx.len() < 8 * 1024, "{} bytes", ctx.len());
}

/// The installed hook for `input`'s event run as `who`: (exit code, stdout, stderr).
fn run_hook(i: &Installed, who: &str, input: &Value) -> (Option<i32>, String, String) {
    let event = input["hook_event_name"].as_str().unwrap();
    let command = &i.hooks.iter().find(|(e, _)| e == event).unwrap().1;
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(command)
        .env("PATH", &i.path)
        .env("HOME", i._tmp.path())
        .env_remove("XDG_RUNTIME_DIR")
        .current_dir(input["cwd"].as_str().unwrap());
    for t in TAGS {
        c.env_remove(t);
    }
    c.env("COHERENT_SESSION", who);
    let o = common::run_with_stdin(&mut c, &input.to_string());
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}
