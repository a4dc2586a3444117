//! `coherent hook claude-code`: Claude Code's hook JSON on stdin, its answer on stdout.
//!
//! The hook runs as a child of Claude Code, so the volume sees it as the agent's session.
//! - `PreToolUse` of a file-writing tool: when this session is fenced on the file (the
//!   `user.coherent.handoff` xattr says role giver, live), deny with the deny text before
//!   the tool runs; otherwise say nothing.
//! - `PostToolUse` of `Bash` whose output shows a permission error on a file this session
//!   handed on: add `.coherent/why` as context, so the agent learns why instead of retrying.
//! - `SessionStart`, `UserPromptSubmit`: add the handoffs waiting for this session (with
//!   their notes) and its own live transfers; if the session is unattributed, how to fix it.
//!
//! The volume enforces either way, so the hook must never get in the way: on any error
//! (bad input, no volume, a panic) it prints nothing and exits 0.

use crate::{call, locate_cwd};
use coherent::coherence::deny_text;
use coherent::control::{shell_word, Request, NO_REFUSAL};
use coherent::identity::{SessionInfo, Via};
use serde_json::{json, Value};
use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The tools that write the file named in their input.
const WRITE_TOOLS: [&str; 4] = ["Write", "Edit", "MultiEdit", "NotebookEdit"];

pub fn claude_code() {
    // a panic would print to stderr and exit 101: the hook says nothing instead
    std::panic::set_hook(Box::new(|_| {}));
    let answer = std::panic::catch_unwind(|| {
        let mut input = String::new();
        std::io::stdin().read_to_string(&mut input).ok()?;
        let event: Value = serde_json::from_str(&input).ok()?;
        answer(&event)
    });
    if let Ok(Some(out)) = answer {
        println!("{out}");
    }
}

/// The hook's output for one event, or None to say nothing.
fn answer(ev: &Value) -> Option<Value> {
    let name = ev.get("hook_event_name")?.as_str()?;
    // relative paths and the volume are found from the agent's directory
    if let Some(cwd) = ev.get("cwd").and_then(Value::as_str) {
        std::env::set_current_dir(cwd).ok()?;
    }
    match name {
        "PreToolUse" => pre_tool_use(ev),
        "PostToolUse" => post_tool_use(ev),
        "SessionStart" | "UserPromptSubmit" => {
            let context = session_context(name == "SessionStart")?;
            Some(json!({
                "hookSpecificOutput": { "hookEventName": name, "additionalContext": context }
            }))
        }
        _ => None,
    }
}

fn pre_tool_use(ev: &Value) -> Option<Value> {
    let tool = ev.get("tool_name")?.as_str()?;
    if !WRITE_TOOLS.contains(&tool) {
        return None;
    }
    let input = ev.get("tool_input")?;
    let file = input
        .get("file_path")
        .or_else(|| input.get("notebook_path"))?
        .as_str()?;
    let rec = handoff_of(Path::new(file))?;
    if rec.get("role")?.as_str()? != "giver" || rec.get("live")?.as_bool() != Some(true) {
        return None;
    }
    let mut reason = fence_text(&rec)?;
    if let Some(note) = rec.get("note").and_then(Value::as_str) {
        reason.push_str(&format!(" Your note to them was: {note}"));
    }
    Some(json!({
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }))
}

/// The deny text for a live record this session gave (the same text the volume keeps in
/// `.coherent/why` after a denied write).
fn fence_text(rec: &Value) -> Option<String> {
    let successor = SessionInfo {
        name: rec.get("successor")?.as_str()?.to_string(),
        agent_id: rec.get("successor_agent")?.as_str()?.parse().ok()?,
        via: Via::Registered,
    };
    let version = rec.get("version_at_transfer")?.as_u64()?;
    Some(deny_text(rec.get("path")?.as_str()?, &successor, version))
}

/// The `user.coherent.handoff` record of `path` as the caller sees it, if it has one.
fn handoff_of(path: &Path) -> Option<Value> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let name = c"user.coherent.handoff";
    let mut buf = vec![0u8; 128 * 1024];
    // SAFETY: both strings are NUL-terminated and buf is valid for buf.len() bytes.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    serde_json::from_slice(&buf).ok()
}

fn post_tool_use(ev: &Value) -> Option<Value> {
    if ev.get("tool_name")?.as_str()? != "Bash" {
        return None;
    }
    let output = match ev.get("tool_response") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => ["stdout", "stderr", "output", "error"]
            .iter()
            .filter_map(|k| o.get(*k).and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => return None,
    };
    if !output.contains("Permission denied") && !output.contains("EACCES") {
        return None;
    }
    let root = locate_cwd().ok()?;
    let me = whoami(&root)?;
    // only a permission error naming a file this session is fenced on
    let fenced = own_live_transfers(&root, &me.0)?;
    let hit = fenced.iter().find(|r| {
        r.get("path")
            .and_then(Value::as_str)
            .and_then(|p| Path::new(p).file_name())
            .is_some_and(|name| output.contains(&*name.to_string_lossy()))
    })?;
    let why = std::fs::read_to_string(root.join(".coherent/why")).unwrap_or_default();
    let why = match why.trim() {
        w if w.is_empty() || w.starts_with(NO_REFUSAL) => fence_text(hit)?,
        w => w.to_string(),
    };
    Some(json!({
        "hookSpecificOutput": {
            "hookEventName": "PostToolUse",
            "additionalContext": format!("coherent volume at {}: {why}", root.display()),
        }
    }))
}

/// (session name, attributed) of this process, as the volume resolves it.
fn whoami(root: &Path) -> Option<(String, bool)> {
    let reply = call(root, &Request::Whoami).ok()?;
    let body = reply.body();
    let name = body.get("session")?.as_str()?.to_string();
    let unattributed = body
        .get("via")
        .and_then(|v| v.get("kind"))
        .and_then(Value::as_str)
        == Some("uid");
    Some((name, !unattributed))
}

/// The live records `me` gave, from `status`.
fn own_live_transfers(root: &Path, me: &str) -> Option<Vec<Value>> {
    let reply = call(root, &Request::Status { path: None }).ok()?;
    let live = reply.body().get("status")?.get("live")?.as_array()?;
    Some(
        live.iter()
            .filter(|r| r.get("giver").and_then(Value::as_str) == Some(me))
            .cloned()
            .collect(),
    )
}

/// What the agent should know at the start of a session and before each prompt. None
/// when there is nothing to say (or no volume here).
fn session_context(start: bool) -> Option<String> {
    let root = locate_cwd().ok()?;
    let (me, attributed) = whoami(&root)?;
    let mut out = Vec::new();
    if !attributed {
        // only once per session: the fix needs a restart anyway
        if !start {
            return None;
        }
        return Some(format!(
            "This workspace is a coherent volume ({root}), but this Claude Code session is \
             not attributed to a session on it (it resolves to {me}): files cannot be handed \
             to it or by it, and its writes count as an anonymous user's. To fix it, quit and \
             start Claude Code in its own session: coherent run --session NAME -- claude",
            root = root.display()
        ));
    }
    let inbox: Vec<Value> = std::fs::read_to_string(root.join(".coherent/inbox"))
        .ok()
        .and_then(|t| serde_json::from_str(t.trim()).ok())
        .unwrap_or_default();
    if !inbox.is_empty() {
        out.push(format!(
            "Files handed to you (session {me}) on the coherent volume {}:",
            root.display()
        ));
        for r in &inbox {
            out.push(inbox_line(r));
        }
        // Name only the ways that work: an open offer is claimed by `accept` (declining
        // it, or writing it unclaimed, does not answer it).
        let offered = |r: &Value| {
            r.get("offer").and_then(Value::as_bool) == Some(true) && r.get("claimed_by").is_none()
        };
        if inbox.iter().any(|r| !offered(r)) {
            out.push(
                "Writing a file handed to you completes its handoff; `coherent accept PATH` \
                 or `coherent decline PATH` (or the MCP tools) answer it without writing."
                    .into(),
            );
        }
        if inbox.iter().any(offered) {
            out.push(
                "A file offered to any session is yours once you claim it: `coherent accept \
                 PATH` (then write it, or decline it)."
                    .into(),
            );
        }
    }
    let mine = own_live_transfers(&root, &me).unwrap_or_default();
    if !mine.is_empty() {
        out.push(format!(
            "Files you (session {me}) handed on and can no longer write (EACCES), paths \
             relative to {}:",
            root.display()
        ));
        for r in &mine {
            let path = r.get("path").and_then(Value::as_str).unwrap_or("?");
            out.push(format!(
                "- {path}: to {} at v{}, {}; `coherent withdraw {}` takes it back",
                r.get("successor").and_then(Value::as_str).unwrap_or("?"),
                r.get("version_at_transfer")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
                r.get("status").and_then(Value::as_str).unwrap_or("?"),
                shell_word(path)
            ));
        }
    }
    if out.is_empty() && start {
        out.push(format!(
            "This workspace is a coherent volume ({}); you are session {me}. Files handed \
             to you appear in `coherent status` and the MCP `inbox` tool.",
            root.display()
        ));
    }
    (!out.is_empty()).then(|| out.join("\n"))
}

fn inbox_line(r: &Value) -> String {
    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("?");
    let mut line = format!(
        "- {} from {} (v{}, {})",
        s("path"),
        s("giver"),
        r.get("version_at_transfer")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        s("status")
    );
    if r.get("offer").and_then(Value::as_bool) == Some(true) && r.get("claimed_by").is_none() {
        line.push_str(", offered to any session");
    }
    if let Some(note) = r.get("note").and_then(Value::as_str) {
        line.push_str(&format!("; note: {note}"));
    }
    line
}
