//! `coherent install claude-code [DIR]`: on an empty directory, on one with settings of its
//! own, twice, and `--uninstall` (which must leave exactly what was there before).

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output};

use crate::common::CLI;

/// A PATH with `coherent` on it (a link to the built binary), and a HOME of its own.
struct Env {
    _tmp: tempfile::TempDir,
    bin: std::path::PathBuf,
    home: std::path::PathBuf,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        let home = tmp.path().join("home");
        std::fs::create_dir(&bin).unwrap();
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::symlink(CLI, bin.join("coherent")).unwrap();
        Env {
            _tmp: tmp,
            bin,
            home,
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(CLI);
        c.env("PATH", &self.bin)
            .env("HOME", &self.home)
            .env_remove("CODEX_HOME");
        c
    }
}

fn install(dir: &Path, extra: &[&str]) -> Output {
    let env = Env::new();
    let out = env
        .cmd()
        .args(["install", "claude-code"])
        .arg(dir)
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn read(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The hook commands of `event` in a settings object.
fn commands(settings: &Value, event: &str) -> Vec<String> {
    settings["hooks"][event]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["hooks"].as_array().cloned().unwrap_or_default())
        .filter_map(|h| h["command"].as_str().map(String::from))
        .collect()
}

#[test]
fn install_on_an_empty_dir_then_again_then_uninstall() {
    let d = tempfile::tempdir().unwrap();
    let out = install(d.path(), &[]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("coherent run --session NAME -- claude"),
        "{said}"
    );
    let settings = read(&d.path().join(".claude/settings.json"));
    // `coherent` as found on PATH, not the build directory's binary
    let hook = "coherent hook claude-code".to_string();
    for event in [
        "PreToolUse",
        "PostToolUse",
        "PostToolUseFailure",
        "SessionStart",
        "UserPromptSubmit",
    ] {
        assert_eq!(
            commands(&settings, event),
            vec![hook.clone()],
            "{event}: {settings}"
        );
    }
    assert_eq!(
        settings["hooks"]["PreToolUse"][0]["matcher"],
        "Write|Edit|MultiEdit|NotebookEdit|Bash"
    );
    assert_eq!(settings["hooks"]["PostToolUse"][0]["matcher"], "Bash");
    // issue 38: a tool the volume refused fails, and only this hook is told of it
    assert_eq!(
        settings["hooks"]["PostToolUseFailure"][0]["matcher"],
        "Write|Edit|MultiEdit|NotebookEdit|Bash"
    );
    let mcp = read(&d.path().join(".mcp.json"));
    assert_eq!(
        mcp["mcpServers"]["coherent"],
        json!({"type": "stdio", "command": "coherent", "args": ["mcp"]})
    );

    // twice: byte-identical files
    let before = (
        std::fs::read(d.path().join(".claude/settings.json")).unwrap(),
        std::fs::read(d.path().join(".mcp.json")).unwrap(),
    );
    let out = install(d.path(), &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("already installed"));
    assert_eq!(
        before,
        (
            std::fs::read(d.path().join(".claude/settings.json")).unwrap(),
            std::fs::read(d.path().join(".mcp.json")).unwrap(),
        )
    );

    // uninstall: back to the empty directory
    install(d.path(), &["--uninstall"]);
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // and once more: nothing to remove, still exit 0
    let out = install(d.path(), &["--uninstall"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to remove"));
}

#[test]
fn install_keeps_existing_settings_and_uninstall_restores_them() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join(".claude")).unwrap();
    let settings = json!({
        "model": "opus",
        "permissions": { "allow": ["Bash(ls:*)"] },
        "hooks": {
            "PreToolUse": [
                { "matcher": "Bash", "hooks": [{ "type": "command", "command": "my-guard" }] }
            ],
            "Stop": [ { "hooks": [{ "type": "command", "command": "notify-me" }] } ]
        }
    });
    let mcp = json!({ "mcpServers": { "db": { "command": "db-mcp", "args": [] } } });
    let sp = d.path().join(".claude/settings.json");
    let mp = d.path().join(".mcp.json");
    std::fs::write(&sp, serde_json::to_string_pretty(&settings).unwrap()).unwrap();
    std::fs::write(&mp, serde_json::to_string_pretty(&mcp).unwrap()).unwrap();

    // from inside the directory, with no DIR
    let out = Command::new(CLI)
        .args(["install", "claude-code"])
        .current_dir(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let s = read(&sp);
    assert_eq!(s["model"], "opus");
    assert_eq!(s["permissions"], settings["permissions"]);
    assert_eq!(s["hooks"]["Stop"], settings["hooks"]["Stop"]);
    let pre = commands(&s, "PreToolUse");
    assert_eq!(pre.len(), 2, "{s}");
    assert_eq!(pre[0], "my-guard");
    assert!(pre[1].ends_with("coherent hook claude-code"), "{s}");
    let m = read(&mp);
    assert_eq!(m["mcpServers"]["db"], mcp["mcpServers"]["db"]);
    assert_eq!(m["mcpServers"]["coherent"]["args"], json!(["mcp"]));

    install(d.path(), &["--uninstall"]);
    assert_eq!(read(&sp), settings);
    assert_eq!(read(&mp), mcp);
}

#[test]
fn install_refuses_to_clobber() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join(".claude")).unwrap();
    std::fs::write(d.path().join(".claude/settings.json"), "{ not json").unwrap();
    let out = Command::new(CLI)
        .args(["install", "claude-code"])
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid JSON"));
    assert_eq!(
        std::fs::read_to_string(d.path().join(".claude/settings.json")).unwrap(),
        "{ not json"
    );
    assert!(!d.path().join(".mcp.json").exists());

    // an MCP server of the same name that is not ours is left alone
    let e = tempfile::tempdir().unwrap();
    let theirs = json!({ "mcpServers": { "coherent": { "command": "something-else" } } });
    std::fs::write(e.path().join(".mcp.json"), theirs.to_string()).unwrap();
    let out = Command::new(CLI)
        .args(["install", "claude-code"])
        .arg(e.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(read(&e.path().join(".mcp.json")), theirs);
    let out = Command::new(CLI)
        .args(["install", "claude-code", "--uninstall"])
        .arg(e.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(read(&e.path().join(".mcp.json")), theirs);
}

fn ok(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Never a build directory's path: `coherent` when on PATH, and when not, still `coherent`
/// with a warning; an older install that named a build directory is brought up to date.
#[test]
fn install_names_coherent_never_a_build_directory() {
    let env = Env::new();
    let d = tempfile::tempdir().unwrap();
    let sp = d.path().join(".claude/settings.json");
    let mp = d.path().join(".mcp.json");
    // an older install, by the build directory's path
    std::fs::create_dir(d.path().join(".claude")).unwrap();
    let old = json!({"hooks": {"PreToolUse": [{"matcher": "Write", "hooks": [
        {"type": "command", "command": format!("{CLI} hook claude-code")}]}]}});
    std::fs::write(&sp, serde_json::to_string_pretty(&old).unwrap()).unwrap();
    std::fs::write(
        &mp,
        json!({"mcpServers": {"coherent": {"type": "stdio", "command": CLI, "args": ["mcp"]}}})
            .to_string(),
    )
    .unwrap();
    // not on PATH: `coherent` and a warning
    let out = env
        .cmd()
        .env("PATH", d.path().join("nowhere"))
        .args(["install", "claude-code"])
        .arg(d.path())
        .output()
        .unwrap();
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`coherent` is not on PATH"), "{err}");
    for p in [&sp, &mp] {
        let t = std::fs::read_to_string(p).unwrap();
        assert!(!t.contains("target/"), "{}: {t}", p.display());
        assert!(!t.contains(CLI), "{}: {t}", p.display());
    }
    assert_eq!(
        commands(&read(&sp), "PreToolUse"),
        ["coherent hook claude-code"]
    );
    assert_eq!(read(&mp)["mcpServers"]["coherent"]["command"], "coherent");
    // on PATH: no warning
    let out = env
        .cmd()
        .args(["install", "claude-code"])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(ok(&out).contains("already installed"));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--user`: the user's settings (~/.claude/settings.json, the MCP server in
/// ~/.claude.json), not the project's; everything else in them kept, byte for byte after
/// an uninstall.
#[test]
fn install_user_writes_the_user_settings() {
    let env = Env::new();
    let d = tempfile::tempdir().unwrap();
    // ~/.claude.json is Claude Code's own state file: keys in its order, other state
    let state = "{\n  \"numStartups\": 12,\n  \"zeta\": true,\n  \"autoUpdates\": false,\n  \
                 \"projects\": {\n    \"/w\": {\n      \"allowedTools\": []\n    }\n  }\n}\n";
    std::fs::write(env.home.join(".claude.json"), state).unwrap();
    let out = env
        .cmd()
        .args(["install", "claude-code", "--user"])
        .current_dir(d.path())
        .output()
        .unwrap();
    ok(&out);
    let settings = read(&env.home.join(".claude/settings.json"));
    assert_eq!(
        commands(&settings, "SessionStart"),
        ["coherent hook claude-code"]
    );
    let text = std::fs::read_to_string(env.home.join(".claude.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["mcpServers"]["coherent"],
        json!({"type": "stdio", "command": "coherent", "args": ["mcp"]})
    );
    let order: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        order,
        [
            "numStartups",
            "zeta",
            "autoUpdates",
            "projects",
            "mcpServers"
        ]
    );
    assert!(
        text.starts_with(&state[..state.find("\"projects\"").unwrap()]),
        "{text}"
    );
    // the project was not touched
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    // `--user` with a DIR is a usage error
    let out = env
        .cmd()
        .args(["install", "claude-code", "--user"])
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    // uninstall: ~/.claude.json as it was, byte for byte; the settings file made gone
    let out = env
        .cmd()
        .args(["install", "claude-code", "--user", "--uninstall"])
        .output()
        .unwrap();
    ok(&out);
    assert_eq!(
        std::fs::read_to_string(env.home.join(".claude.json")).unwrap(),
        state
    );
    assert!(!env.home.join(".claude").exists());
}

/// The user's key order and formatting (indentation, final newline) are kept; nothing is
/// sorted; an uninstall gives back the very bytes.
#[test]
fn install_keeps_key_order_and_formatting() {
    let env = Env::new();
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join(".claude")).unwrap();
    let settings = "{\n    \"permissions\": {\n        \"deny\": [],\n        \"allow\": [\n            \
                    \"Bash(ls:*)\"\n        ]\n    },\n    \"hooks\": {\n        \"Stop\": [\n            \
                    {\n                \"hooks\": [\n                    {\n                        \
                    \"type\": \"command\",\n                        \"command\": \"notify-me\"\n                    \
                    }\n                ]\n            }\n        ]\n    },\n    \"model\": \"opus\"\n}";
    let mcp = "{\"mcpServers\":{\"zz\":{\"command\":\"zz-mcp\",\"args\":[]},\"aa\":{\"command\":\"aa\"}}}\n";
    let sp = d.path().join(".claude/settings.json");
    let mp = d.path().join(".mcp.json");
    std::fs::write(&sp, settings).unwrap();
    std::fs::write(&mp, mcp).unwrap();
    ok(&env
        .cmd()
        .args(["install", "claude-code"])
        .arg(d.path())
        .output()
        .unwrap());
    let s = std::fs::read_to_string(&sp).unwrap();
    let at = |k: &str| s.find(k).unwrap_or_else(|| panic!("{k} in {s}"));
    assert!(
        at("\"permissions\"") < at("\"hooks\"") && at("\"hooks\"") < at("\"model\""),
        "{s}"
    );
    assert!(at("\"deny\"") < at("\"allow\""), "{s}");
    assert!(at("\"Stop\"") < at("\"PreToolUse\""), "{s}");
    assert!(
        s.starts_with("{\n    \"permissions\": {\n        \"deny\""),
        "{s}"
    );
    assert!(!s.ends_with('\n'), "the file had no final newline");
    let m = std::fs::read_to_string(&mp).unwrap();
    assert!(!m.trim_end().contains('\n'), "one line stays one line: {m}");
    assert!(m.find("\"zz\"").unwrap() < m.find("\"aa\"").unwrap(), "{m}");
    assert!(
        m.find("\"aa\"").unwrap() < m.find("\"coherent\"").unwrap(),
        "{m}"
    );
    ok(&env
        .cmd()
        .args(["install", "claude-code", "--uninstall"])
        .arg(d.path())
        .output()
        .unwrap());
    assert_eq!(std::fs::read_to_string(&sp).unwrap(), settings);
    assert_eq!(std::fs::read_to_string(&mp).unwrap(), mcp);
}

/// `coherent install codex [DIR]`: `[mcp_servers.coherent]` in Codex's config.toml (the
/// rest of it, comments included, untouched) and a marked section in DIR/AGENTS.md; twice
/// changes nothing; `--uninstall` gives back both files byte for byte.
#[test]
fn install_codex_registers_the_server_and_the_guidance() {
    let env = Env::new();
    let d = tempfile::tempdir().unwrap();
    let codex = env.home.join(".codex");
    std::fs::create_dir(&codex).unwrap();
    let config = "# my codex config\nmodel = \"o3\"  # the default\n\n[mcp_servers.db]\n\
                  command = \"db-mcp\"\nargs = [ \"--ro\" ]\n\n[profiles.fast]\nmodel = \"mini\"\n";
    let agents = "# Project rules\n\nRun `make test` before you commit.\n";
    std::fs::write(codex.join("config.toml"), config).unwrap();
    std::fs::write(d.path().join("AGENTS.md"), agents).unwrap();
    let run = |extra: &[&str]| {
        ok(&env
            .cmd()
            .args(["install", "codex"])
            .arg(d.path())
            .args(extra)
            .output()
            .unwrap())
    };
    let said = run(&[]);
    assert!(
        said.contains("coherent run --session NAME -- codex"),
        "{said}"
    );
    let text = std::fs::read_to_string(codex.join("config.toml")).unwrap();
    // the server table goes next to its sibling, the hooks after the rest; everything
    // else is as it was
    let (head, _hooks) = text
        .split_once("\n[[hooks.")
        .unwrap_or_else(|| panic!("no hooks: {text}"));
    assert_eq!(
        head.replace(
            "[mcp_servers.coherent]\ncommand = \"coherent\"\nargs = [\"mcp\"]\n\
             env_vars = [\"COHERENT_SESSION\"]\ntool_timeout_sec = 86460.0\n\n",
            ""
        ),
        config,
        "the rest of the file is kept: {text}"
    );
    let doc: toml_edit::DocumentMut = text.parse().unwrap();
    assert_eq!(
        doc["mcp_servers"]["coherent"]["command"].as_str(),
        Some("coherent")
    );
    let args: Vec<&str> = doc["mcp_servers"]["coherent"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(args, ["mcp"]);
    assert!(text.contains("[mcp_servers.coherent]"), "{text}");
    let md = std::fs::read_to_string(d.path().join("AGENTS.md")).unwrap();
    assert!(md.starts_with(agents), "{md}");
    assert!(md.contains("coherent run --session NAME -- codex"), "{md}");
    assert_eq!(md.matches("<!-- coherent: begin").count(), 1);
    // twice: the same bytes
    assert!(run(&[]).contains("already installed"));
    assert_eq!(
        std::fs::read_to_string(codex.join("config.toml")).unwrap(),
        text
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join("AGENTS.md")).unwrap(),
        md
    );
    // uninstall: both as they were
    run(&["--uninstall"]);
    assert_eq!(
        std::fs::read_to_string(codex.join("config.toml")).unwrap(),
        config
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join("AGENTS.md")).unwrap(),
        agents
    );
    assert!(run(&["--uninstall"]).contains("nothing to remove"));

    // nothing there before, and $CODEX_HOME: made, then removed again
    let e = tempfile::tempdir().unwrap();
    let ch = e.path().join("codex-home");
    let out = env
        .cmd()
        .env("CODEX_HOME", &ch)
        .args(["install", "codex"])
        .arg(e.path())
        .output()
        .unwrap();
    ok(&out);
    let text = std::fs::read_to_string(ch.join("config.toml")).unwrap();
    assert!(
        text.starts_with(
            "[mcp_servers.coherent]\ncommand = \"coherent\"\nargs = [\"mcp\"]\n\
             env_vars = [\"COHERENT_SESSION\"]\ntool_timeout_sec = 86460.0\n\n\
             [[hooks.PreToolUse]]\n"
        ),
        "{text}"
    );
    assert!(e.path().join("AGENTS.md").exists());
    ok(&env
        .cmd()
        .env("CODEX_HOME", &ch)
        .args(["install", "codex", "--uninstall"])
        .arg(e.path())
        .output()
        .unwrap());
    assert!(!ch.join("config.toml").exists());
    assert!(!e.path().join("AGENTS.md").exists());

    // a server of that name that is not ours is left alone; `--user` is claude-code's
    let theirs = "[mcp_servers.coherent]\ncommand = \"something-else\"\n";
    std::fs::write(codex.join("config.toml"), theirs).unwrap();
    let out = env
        .cmd()
        .args(["install", "codex"])
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not `coherent mcp`"));
    assert_eq!(
        std::fs::read_to_string(codex.join("config.toml")).unwrap(),
        theirs
    );
    let out = env
        .cmd()
        .args(["install", "codex", "--user"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

/// The hook events Codex documents (developers.openai.com/codex/hooks, "Hooks" table of
/// when each runs), and the fields of a matcher group and of a command handler ("Config
/// shape": `[[hooks.EVENT]]` is a group `{ matcher?, hooks }`, `[[hooks.EVENT.hooks]]` a
/// handler `{ type = "command", command, timeout? (seconds), statusMessage? }`).
/// `state` is the table Codex keeps its trust decisions in, not an event.
const CODEX_EVENTS: [&str; 12] = [
    "PreToolUse",
    "PermissionRequest",
    "PostToolUse",
    "PreCompact",
    "PostCompact",
    "UserPromptSubmit",
    "SubagentStop",
    "Stop",
    "SessionStart",
    "SubagentStart",
    "SessionEnd",
    "state",
];
const CODEX_GROUP_FIELDS: [&str; 2] = ["matcher", "hooks"];
const CODEX_HANDLER_FIELDS: [&str; 4] = ["type", "command", "timeout", "statusMessage"];

/// Every `[hooks]` entry in `doc` has the documented shape; returns (event, matcher,
/// command) of each handler.
fn codex_handlers(doc: &toml_edit::DocumentMut) -> Vec<(String, Option<String>, String)> {
    let mut found = Vec::new();
    let hooks = doc["hooks"].as_table().expect("[hooks] is a table");
    for (event, groups) in hooks.iter() {
        assert!(CODEX_EVENTS.contains(&event), "undocumented event {event}");
        if event == "state" {
            continue;
        }
        let groups = groups
            .as_array_of_tables()
            .unwrap_or_else(|| panic!("hooks.{event} is not [[hooks.{event}]] tables"));
        for g in groups.iter() {
            for (k, _) in g.iter() {
                assert!(CODEX_GROUP_FIELDS.contains(&k), "{event}: group field {k}");
            }
            let matcher = g.get("matcher").map(|m| {
                m.as_str()
                    .unwrap_or_else(|| panic!("{event}: matcher is not a string"))
                    .to_string()
            });
            let hs = g["hooks"]
                .as_array_of_tables()
                .unwrap_or_else(|| panic!("{event}: hooks is not [[hooks.{event}.hooks]]"));
            assert!(!hs.is_empty(), "{event}: a group with no handler");
            for h in hs.iter() {
                for (k, _) in h.iter() {
                    assert!(CODEX_HANDLER_FIELDS.contains(&k), "{event}: field {k}");
                }
                assert_eq!(h["type"].as_str(), Some("command"), "{event}");
                if let Some(t) = h.get("timeout") {
                    assert!(t.as_integer().is_some_and(|t| t > 0), "{event}: {t}");
                }
                let cmd = h["command"].as_str().expect("command is a string");
                found.push((event.to_string(), matcher.clone(), cmd.to_string()));
            }
        }
    }
    found
}

/// `coherent install codex` writes its hooks in Codex's documented shape, next to the
/// user's own hooks and features; the MCP server's `tool_timeout_sec` outlasts the longest
/// `wait`; a second install changes nothing; `--uninstall` gives the file back byte for
/// byte, the user's own hooks included.
#[test]
fn install_codex_hooks_follow_codex_documented_schema() {
    let env = Env::new();
    let d = tempfile::tempdir().unwrap();
    let ch = d.path().join("codex-home");
    std::fs::create_dir(&ch).unwrap();
    let config = "model = \"o3\"\n\n[features]\nhooks = true\n\n\
                  # my own guard\n[[hooks.PreToolUse]]\nmatcher = \"^Bash$\"\n\n\
                  [[hooks.PreToolUse.hooks]]\ntype = \"command\"\ncommand = \"my-guard\"\n";
    std::fs::write(ch.join("config.toml"), config).unwrap();
    let run = |extra: &[&str]| {
        ok(&env
            .cmd()
            .env("CODEX_HOME", &ch)
            .args(["install", "codex"])
            .arg(d.path())
            .args(extra)
            .output()
            .unwrap())
    };
    let said = run(&[]);
    assert!(said.contains("/hooks"), "tells the user to trust: {said}");
    let text = std::fs::read_to_string(ch.join("config.toml")).unwrap();
    let doc: toml_edit::DocumentMut = text.parse().unwrap();
    let handlers = codex_handlers(&doc);
    let ours = |event: &str| -> Vec<Option<String>> {
        handlers
            .iter()
            .filter(|(e, _, c)| e == event && c == "coherent hook codex")
            .map(|(_, m, _)| m.clone())
            .collect()
    };
    // PreToolUse: the shell and apply_patch, each matched whole
    let pre = ours("PreToolUse");
    assert_eq!(pre.len(), 1, "{text}");
    let m = pre[0].clone().expect("PreToolUse has a matcher");
    for tool in ["Bash", "apply_patch"] {
        assert!(
            m.starts_with('^') && m.ends_with('$') && m.contains(tool),
            "{m} must match {tool}"
        );
    }
    assert_eq!(ours("PostToolUse"), [Some("^Bash$".to_string())]);
    // issue 38: Codex 0.169 has PostCompact and SessionEnd, registered too
    for event in [
        "SessionStart",
        "UserPromptSubmit",
        "PreCompact",
        "PostCompact",
        "SessionEnd",
    ] {
        assert_eq!(ours(event), [None], "{event}: {text}");
    }
    // Codex starts MCP servers with a filtered environment: the session is passed on
    let vars: Vec<&str> = doc["mcp_servers"]["coherent"]["env_vars"]
        .as_array()
        .unwrap_or_else(|| panic!("no env_vars: {text}"))
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(vars, ["COHERENT_SESSION"], "{text}");
    // the user's hook is still there, first
    assert_eq!(
        handlers[0],
        (
            "PreToolUse".to_string(),
            Some("^Bash$".to_string()),
            "my-guard".to_string()
        )
    );
    // the longest wait is WAIT_MAX_SECS (86400 s): Codex must wait longer for the tool
    let t = doc["mcp_servers"]["coherent"]["tool_timeout_sec"]
        .as_float()
        .expect("tool_timeout_sec is a number of seconds");
    assert!(t > 86_400.0, "{t}");
    // twice: the same bytes
    assert!(run(&[]).contains("already installed"));
    assert_eq!(
        std::fs::read_to_string(ch.join("config.toml")).unwrap(),
        text
    );
    // uninstall: byte for byte, the user's hook and features kept
    run(&["--uninstall"]);
    assert_eq!(
        std::fs::read_to_string(ch.join("config.toml")).unwrap(),
        config
    );
}
