//! The Codex hooks as `coherent install codex` writes them: the command read back from the
//! installed config.toml, run through `sh -c` as Codex runs it, fed Codex-shaped hook input
//! in a real mount with a live record. Every answer is checked field by field against the
//! output Codex documents (it fails a hook whose output has a field it does not know).

use crate::coherent;
use crate::common;

use coherent::{cli, sh, sh_ok, Root, CLI, TAGS};
use common::Mount;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The output fields Codex documents for each event (openai/codex
/// `codex-rs/hooks/schema/generated/<event>.command.output.schema.json`, the schemas behind
/// the "Hooks" page's output tables; every object there is `additionalProperties: false`):
/// (event, top-level fields, `hookSpecificOutput` fields; empty: it has none).
const DOCUMENTED: [(&str, &[&str], &[&str]); 5] = [
    (
        "PreToolUse",
        &[
            "continue",
            "stopReason",
            "suppressOutput",
            "systemMessage",
            "hookSpecificOutput",
        ],
        &[
            "hookEventName",
            "permissionDecision",
            "permissionDecisionReason",
            "additionalContext",
            "updatedInput",
        ],
    ),
    (
        "PostToolUse",
        &[
            "continue",
            "decision",
            "reason",
            "stopReason",
            "suppressOutput",
            "systemMessage",
            "hookSpecificOutput",
        ],
        &[
            "hookEventName",
            "additionalContext",
            "updatedMCPToolOutput",
            "updatedToolOutput",
        ],
    ),
    (
        "SessionStart",
        &[
            "continue",
            "stopReason",
            "suppressOutput",
            "systemMessage",
            "hookSpecificOutput",
        ],
        &["hookEventName", "additionalContext", "env"],
    ),
    (
        "UserPromptSubmit",
        &[
            "continue",
            "decision",
            "reason",
            "stopReason",
            "suppressOutput",
            "systemMessage",
            "hookSpecificOutput",
        ],
        &["hookEventName", "additionalContext"],
    ),
    (
        "PreCompact",
        &["continue", "stopReason", "suppressOutput", "systemMessage"],
        &[],
    ),
];

/// Panics unless `v` has only the fields Codex documents for `event`, each of its type.
fn documented(v: &Value, event: &str) {
    let (_, top, specific) = DOCUMENTED
        .iter()
        .find(|(e, _, _)| *e == event)
        .unwrap_or_else(|| panic!("no schema for {event}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    for (k, val) in o {
        assert!(
            top.contains(&k.as_str()),
            "{event}: undocumented field {k}: {v}"
        );
        match k.as_str() {
            "continue" | "suppressOutput" => assert!(val.is_boolean(), "{k}: {v}"),
            "hookSpecificOutput" => {
                let h = val.as_object().unwrap_or_else(|| panic!("{v}"));
                assert_eq!(h.get("hookEventName"), Some(&json!(event)), "{v}");
                for (hk, hv) in h {
                    assert!(
                        specific.contains(&hk.as_str()),
                        "{event}: undocumented hookSpecificOutput.{hk}: {v}"
                    );
                    if hk == "permissionDecision" {
                        assert!(["allow", "deny", "ask"].contains(&hv.as_str().unwrap()));
                    } else if hk != "updatedInput" && hk != "env" {
                        assert!(hv.is_string(), "{hk}: {v}");
                    }
                }
            }
            _ => assert!(val.is_string(), "{k}: {v}"),
        }
    }
}

/// Codex's config installed into a CODEX_HOME of its own, with `coherent` on PATH.
struct Installed {
    _tmp: tempfile::TempDir,
    path: String,
    /// (event, command) of each installed handler that is ours.
    hooks: Vec<(String, String)>,
}

impl Installed {
    fn new() -> Installed {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        let (home, proj) = (tmp.path().join("codex"), tmp.path().join("proj"));
        for d in [&bin, &home, &proj] {
            std::fs::create_dir(d).unwrap();
        }
        std::os::unix::fs::symlink(CLI, bin.join("coherent")).unwrap();
        let path = format!("{}:/usr/bin:/bin", bin.display());
        let out = Command::new(CLI)
            .args(["install", "codex"])
            .arg(&proj)
            .env("PATH", &path)
            .env("CODEX_HOME", &home)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = std::fs::read_to_string(home.join("config.toml")).unwrap();
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

    /// The command installed for `event`.
    fn command(&self, event: &str) -> &str {
        &self
            .hooks
            .iter()
            .find(|(e, _)| e == event)
            .unwrap_or_else(|| panic!("no {event} hook in {:?}", self.hooks))
            .1
    }

    /// Runs the installed hook for `input`'s event as Codex does (`sh -c`, the JSON on
    /// stdin) as session `who`: its stdout, after checking it exits 0 with a quiet stderr.
    fn run(&self, who: Option<&str>, input: &Value) -> String {
        let event = input["hook_event_name"].as_str().unwrap();
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(self.command(event))
            .env("PATH", &self.path)
            .current_dir(input["cwd"].as_str().unwrap());
        for t in TAGS {
            c.env_remove(t);
        }
        if let Some(w) = who {
            c.env("COHERENT_SESSION", w);
        }
        let o = common::run_with_stdin(&mut c, &input.to_string());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{event}: {err}");
        assert!(err.is_empty(), "{event}: stderr {err}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The hook's answer, checked against Codex's documented output for the event.
    fn answer(&self, who: Option<&str>, input: &Value) -> Value {
        let out = self.run(who, input);
        let v: Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {out:?} for {input}"));
        documented(&v, input["hook_event_name"].as_str().unwrap());
        v
    }

    fn silent(&self, who: Option<&str>, input: &Value) {
        let out = self.run(who, input);
        assert!(out.is_empty(), "{who:?} {input}: said {out}");
    }
}

/// Codex's hook input (the "Common input fields" and each event's own).
fn input(root: &Path, event: &str, extra: Value) -> Value {
    let mut v = json!({
        "session_id": "019a-codex",
        "transcript_path": null,
        "cwd": root,
        "hook_event_name": event,
        "model": "gpt-5-codex",
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn tool(root: &Path, event: &str, name: &str, command: &str) -> Value {
    input(
        root,
        event,
        json!({
            "turn_id": "t1",
            "tool_name": name,
            "tool_use_id": "call_1",
            "tool_input": { "command": command },
        }),
    )
}

fn patch(ops: &str) -> String {
    format!("*** Begin Patch\n{ops}*** End Patch\n")
}

fn deny_reason(v: &Value) -> String {
    let h = &v["hookSpecificOutput"];
    assert_eq!(h["permissionDecision"], "deny", "{v}");
    h["permissionDecisionReason"].as_str().unwrap().to_string()
}

fn context(v: &Value) -> String {
    v["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap_or_else(|| panic!("no additionalContext: {v}"))
        .to_string()
}

#[test]
fn installed_codex_hooks_deny_the_givers_shell_and_apply_patch_writes() {
    let hooks = Installed::new();
    let m = Mount::new(true);
    let root: PathBuf = m.root().to_path_buf();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && echo o > other.md",
    );
    let r = cli(
        &m,
        Some("alice"),
        &[
            "transfer",
            "--to",
            "bob",
            "--note",
            "review step 3",
            "plan.md",
        ],
    );
    assert!(r.ok(), "{}", r.show());
    let wants = |why: &str, what: &str| {
        for want in ["plan.md", "(bob)", "at v1", "coherent withdraw plan.md"] {
            assert!(why.contains(want), "{what}: no {want:?} in {why}");
        }
    };

    // the giver's shell write
    let shell = tool(&root, "PreToolUse", "Bash", "echo more >> plan.md");
    let why = deny_reason(&hooks.answer(Some("alice"), &shell));
    wants(&why, "shell");
    assert!(why.contains("this command would write"), "{why}");

    // apply_patch given to Codex's shell (Codex applies it as its apply_patch tool, and
    // asks the hook about a shell command; issue 38: that went through)
    let heredoc = format!(
        "apply_patch <<'EOF'\n{}EOF\n",
        patch("*** Update File: plan.md\n@@\n-plan\n+plan 2\n")
    );
    let why =
        deny_reason(&hooks.answer(Some("alice"), &tool(&root, "PreToolUse", "Bash", &heredoc)));
    wants(&why, "apply_patch through the shell");
    assert!(why.contains("this patch would write plan.md"), "{why}");
    // the same for another file: nothing to say
    let other = format!(
        "apply_patch <<'EOF'\n{}EOF\n",
        patch("*** Update File: other.md\n@@\n-o\n+p\n")
    );
    hooks.silent(Some("alice"), &tool(&root, "PreToolUse", "Bash", &other));

    // the giver's apply_patch: an update, a delete, a move onto the file, each among others
    let edits = [
        "*** Update File: plan.md\n@@\n-plan\n+plan 2\n",
        "*** Add File: new.md\n+hi\n*** Delete File: plan.md\n",
        "*** Update File: other.md\n*** Move to: plan.md\n@@\n-o\n+p\n",
    ];
    for ops in edits {
        let p = tool(&root, "PreToolUse", "apply_patch", &patch(ops));
        let why = deny_reason(&hooks.answer(Some("alice"), &p));
        wants(&why, ops);
        assert!(why.contains("this patch would write plan.md"), "{why}");
        // the giver's own note, quoted as data
        assert!(why.contains("> review step 3"), "{why}");
    }
    // by its absolute path too
    let abs = format!(
        "*** Update File: {}\n@@\n-plan\n+x\n",
        root.join("plan.md").display()
    );
    let p = tool(&root, "PreToolUse", "apply_patch", &patch(&abs));
    wants(&deny_reason(&hooks.answer(Some("alice"), &p)), "absolute");
    // the volume agrees: the same write is refused there
    assert!(sh(&m, Some("alice"), "echo x >> plan.md").denied());

    // allowed: other files for the giver; the successor; a bystander
    let others = tool(
        &root,
        "PreToolUse",
        "apply_patch",
        &patch("*** Add File: new.md\n+hi\n*** Update File: other.md\n@@\n-o\n+p\n"),
    );
    hooks.silent(Some("alice"), &others);
    hooks.silent(
        Some("alice"),
        &tool(&root, "PreToolUse", "Bash", "echo x > other.md"),
    );
    for who in ["bob", "carol"] {
        hooks.silent(Some(who), &shell);
        hooks.silent(
            Some(who),
            &tool(&root, "PreToolUse", "apply_patch", &patch(edits[0])),
        );
    }

    // PostToolUse of the giver's refused shell write: why, as context
    let post = tool(&root, "PostToolUse", "Bash", "echo more >> plan.md");
    let mut post = post;
    post["tool_response"] = json!("sh: 1: cannot create plan.md: Permission denied\n");
    let ctx = context(&hooks.answer(Some("alice"), &post));
    assert!(ctx.contains("refused writing plan.md"), "{ctx}");

    // SessionStart: the successor's inbox, with the note quoted; the giver's own transfer
    let start = input(&root, "SessionStart", json!({ "source": "startup" }));
    let bob = context(&hooks.answer(Some("bob"), &start));
    assert!(bob.contains("plan.md from alice"), "{bob}");
    assert!(bob.contains("> review step 3"), "{bob}");
    let alice = context(&hooks.answer(Some("alice"), &start));
    assert!(alice.contains("plan.md: to bob at v1, pending"), "{alice}");
    // UserPromptSubmit: the same, before each prompt
    let prompt = input(
        &root,
        "UserPromptSubmit",
        json!({ "turn_id": "t2", "prompt": "go on" }),
    );
    assert!(context(&hooks.answer(Some("bob"), &prompt)).contains("plan.md from alice"));
    // unattributed: how to start Codex in a session
    let anon = context(&hooks.answer(None, &start));
    assert!(
        anon.contains("coherent run --session NAME -- codex"),
        "{anon}"
    );

    // PreCompact: a message for the user, no field Codex does not know for it
    let compact = input(
        &root,
        "PreCompact",
        json!({ "turn_id": "t3", "trigger": "auto" }),
    );
    let v = hooks.answer(Some("alice"), &compact);
    let msg = v["systemMessage"].as_str().unwrap();
    assert!(msg.contains("plan.md: to bob at v1"), "{msg}");

    // the fence lifted: the giver's patch passes
    assert!(cli(&m, Some("alice"), &["withdraw", "plan.md"]).ok());
    hooks.silent(
        Some("alice"),
        &tool(&root, "PreToolUse", "apply_patch", &patch(edits[0])),
    );
}
