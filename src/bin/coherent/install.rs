//! `coherent install claude-code [DIR]`: the hooks into `DIR/.claude/settings.json`, the MCP
//! server into `DIR/.mcp.json`, keeping everything else in both files. Running it again
//! changes nothing; `--uninstall` removes exactly the entries it adds (recognised by their
//! command, `coherent hook claude-code` and `coherent mcp`, wherever the binary lives).

use crate::Fail;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// (event, matcher) pairs the hook is installed for.
const HOOKS: [(&str, Option<&str>); 4] = [
    ("PreToolUse", Some("Write|Edit|MultiEdit|NotebookEdit")),
    ("PostToolUse", Some("Bash")),
    ("SessionStart", None),
    ("UserPromptSubmit", None),
];

const SERVER: &str = "coherent";

pub fn claude_code(dir: Option<&Path>, uninstall: bool) -> Result<(), Fail> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_dir()
            .map_err(|e| Fail::usage(format!("cannot read the current directory: {e}")))?,
    };
    if !dir.is_dir() {
        return Err(Fail::usage(format!("{} is not a directory", dir.display())));
    }
    let settings_path = dir.join(".claude/settings.json");
    let mcp_path = dir.join(".mcp.json");
    let mut settings = load(&settings_path)?;
    let mut mcp = load(&mcp_path)?;
    let exe = program();
    if uninstall {
        let a = remove_hooks(&mut settings);
        let b = remove_server(&mut mcp);
        save_or_remove(&settings_path, &settings, a)?;
        save_or_remove(&mcp_path, &mcp, b)?;
        if a || b {
            println!(
                "removed the coherent hooks from {} and the MCP server from {}",
                settings_path.display(),
                mcp_path.display()
            );
        } else {
            println!(
                "nothing to remove: no coherent hooks or MCP server in {}",
                dir.display()
            );
        }
        return Ok(());
    }
    let a = add_hooks(&mut settings, &format!("{} hook claude-code", quoted(&exe)))?;
    let b = add_server(&mut mcp, &exe)?;
    if a {
        std::fs::create_dir_all(dir.join(".claude"))
            .map_err(|e| Fail::usage(format!("cannot create {}/.claude: {e}", dir.display())))?;
        save(&settings_path, &settings)?;
    }
    if b {
        save(&mcp_path, &mcp)?;
    }
    println!(
        "{}: hooks in {} ({}), MCP server `{SERVER}` in {}",
        if a || b {
            "installed"
        } else {
            "already installed"
        },
        settings_path.display(),
        HOOKS.map(|(e, _)| e).join(", "),
        mcp_path.display()
    );
    println!(
        "One thing left: start Claude Code in its own session, so its tools and every shell \
         it spawns are one session:\n    coherent run --session NAME -- claude"
    );
    Ok(())
}

/// This binary, absolute, as the hook command and the MCP server command.
fn program() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().map(String::from))
        .unwrap_or_else(|| "coherent".into())
}

fn quoted(s: &str) -> String {
    coherent::control::shell_word(s)
}

/// Is `cmd` (a shell command line) ours: `.../coherent hook claude-code`?
fn is_our_hook(cmd: &str) -> bool {
    let Some(prog) = cmd.strip_suffix(" hook claude-code") else {
        return false;
    };
    let prog = prog.trim().trim_matches('\'');
    Path::new(prog).file_name().is_some_and(|n| n == "coherent")
}

fn is_our_server(v: &Value) -> bool {
    let cmd = v.get("command").and_then(Value::as_str).unwrap_or("");
    Path::new(cmd).file_name().is_some_and(|n| n == "coherent")
        && v.get("args") == Some(&json!(["mcp"]))
}

fn load(path: &Path) -> Result<Value, Fail> {
    match std::fs::read_to_string(path) {
        Ok(t) if t.trim().is_empty() => Ok(json!({})),
        Ok(t) => match serde_json::from_str::<Value>(&t) {
            Ok(v @ Value::Object(_)) => Ok(v),
            Ok(_) => Err(Fail::usage(format!(
                "{} is not a JSON object; fix or move it, then run again",
                path.display()
            ))),
            Err(e) => Err(Fail::usage(format!(
                "{} is not valid JSON ({e}); fix or move it, then run again",
                path.display()
            ))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(json!({})),
        Err(e) => Err(Fail::usage(format!("cannot read {}: {e}", path.display()))),
    }
}

/// Write through a temporary file and a rename, so a crash never leaves half a file.
fn save(path: &Path, v: &Value) -> Result<(), Fail> {
    let mut text = serde_json::to_string_pretty(v).expect("JSON values serialise");
    text.push('\n');
    let tmp = PathBuf::from(format!("{}.coherent-tmp", path.display()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Fail::usage(format!("cannot write {}: {e}", path.display()))
        })
}

/// After an uninstall: a file left as `{}` is removed (the install made it), else saved.
fn save_or_remove(path: &Path, v: &Value, changed: bool) -> Result<(), Fail> {
    if !changed {
        return Ok(());
    }
    if v.as_object().is_some_and(Map::is_empty) {
        std::fs::remove_file(path)
            .map_err(|e| Fail::usage(format!("cannot remove {}: {e}", path.display())))?;
        if let Some(parent) = path.parent().filter(|p| p.ends_with(".claude")) {
            let _ = std::fs::remove_dir(parent); // only if empty
        }
        return Ok(());
    }
    save(path, v)
}

fn object<'a>(v: &'a mut Value, key: &str, file: &str) -> Result<&'a mut Map<String, Value>, Fail> {
    let slot = v
        .as_object_mut()
        .expect("loaded as an object")
        .entry(key)
        .or_insert_with(|| json!({}));
    slot.as_object_mut()
        .ok_or_else(|| Fail::usage(format!("`{key}` in {file} is not an object")))
}

/// Add the hook for each event unless it is there; true if anything changed.
fn add_hooks(settings: &mut Value, command: &str) -> Result<bool, Fail> {
    let hooks = object(settings, "hooks", ".claude/settings.json")?;
    let mut changed = false;
    for (event, matcher) in HOOKS {
        let groups = hooks.entry(event).or_insert_with(|| json!([]));
        let groups = groups.as_array_mut().ok_or_else(|| {
            Fail::usage(format!(
                "hooks.{event} in .claude/settings.json is not a list"
            ))
        })?;
        let present = groups.iter().any(|g| {
            g.get("hooks").and_then(Value::as_array).is_some_and(|hs| {
                hs.iter().any(|h| {
                    h.get("command")
                        .and_then(Value::as_str)
                        .is_some_and(is_our_hook)
                })
            })
        });
        if present {
            continue;
        }
        let mut group = json!({ "hooks": [{ "type": "command", "command": command }] });
        if let Some(m) = matcher {
            group["matcher"] = json!(m);
        }
        groups.push(group);
        changed = true;
    }
    Ok(changed)
}

/// Remove our hook commands, then the groups and events they leave empty.
fn remove_hooks(settings: &mut Value) -> bool {
    let Some(hooks) = settings.get_mut("hooks").and_then(Value::as_object_mut) else {
        return false;
    };
    let mut changed = false;
    for (event, _) in HOOKS {
        let Some(groups) = hooks.get_mut(event).and_then(Value::as_array_mut) else {
            continue;
        };
        for g in groups.iter_mut() {
            if let Some(hs) = g.get_mut("hooks").and_then(Value::as_array_mut) {
                let before = hs.len();
                hs.retain(|h| {
                    !h.get("command")
                        .and_then(Value::as_str)
                        .is_some_and(is_our_hook)
                });
                if hs.len() != before {
                    changed = true;
                    if hs.is_empty() {
                        // mark the group we emptied; others stay as they are
                        *g = Value::Null;
                    }
                }
            }
        }
        groups.retain(|g| !g.is_null());
        if groups.is_empty() {
            hooks.remove(event);
        }
    }
    if changed && hooks.is_empty() {
        settings.as_object_mut().expect("an object").remove("hooks");
    }
    changed
}

fn add_server(mcp: &mut Value, exe: &str) -> Result<bool, Fail> {
    let servers = object(mcp, "mcpServers", ".mcp.json")?;
    let ours = json!({ "type": "stdio", "command": exe, "args": ["mcp"] });
    match servers.get(SERVER) {
        Some(v) if *v == ours => Ok(false),
        Some(v) if !is_our_server(v) => Err(Fail::usage(format!(
            "an MCP server named `{SERVER}` in .mcp.json is not `coherent mcp`; rename or \
             remove it, then run again"
        ))),
        _ => {
            servers.insert(SERVER.into(), ours);
            Ok(true)
        }
    }
}

fn remove_server(mcp: &mut Value) -> bool {
    let Some(servers) = mcp.get_mut("mcpServers").and_then(Value::as_object_mut) else {
        return false;
    };
    if !servers.get(SERVER).is_some_and(is_our_server) {
        return false;
    }
    servers.remove(SERVER);
    if servers.is_empty() {
        mcp.as_object_mut().expect("an object").remove("mcpServers");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_only_its_own_entries() {
        assert!(is_our_hook("/usr/local/bin/coherent hook claude-code"));
        assert!(is_our_hook("'/a b/coherent' hook claude-code"));
        assert!(is_our_hook("coherent hook claude-code"));
        assert!(!is_our_hook("other hook claude-code"));
        assert!(!is_our_hook("coherent hook claude-code --x"));
        assert!(is_our_server(
            &json!({"command": "/x/coherent", "args": ["mcp"]})
        ));
        assert!(!is_our_server(
            &json!({"command": "/x/coherent", "args": ["mcp", "-x"]})
        ));
    }
}
