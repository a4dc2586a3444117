//! `coherent install claude-code [DIR]`: on an empty directory, on one with settings of its
//! own, twice, and `--uninstall` (which must leave exactly what was there before).

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output};

const CLI: &str = env!("CARGO_BIN_EXE_coherent");

fn install(dir: &Path, extra: &[&str]) -> Output {
    let out = Command::new(CLI)
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
    let hook = format!("{CLI} hook claude-code");
    for event in [
        "PreToolUse",
        "PostToolUse",
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
        "Write|Edit|MultiEdit|NotebookEdit"
    );
    assert_eq!(settings["hooks"]["PostToolUse"][0]["matcher"], "Bash");
    let mcp = read(&d.path().join(".mcp.json"));
    assert_eq!(
        mcp["mcpServers"]["coherent"],
        json!({"type": "stdio", "command": CLI, "args": ["mcp"]})
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
