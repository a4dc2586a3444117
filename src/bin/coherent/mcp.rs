//! `coherent mcp`: the verbs as MCP tools, over stdio (docs/design.md#control-surface).
//!
//! The server is started by the agent (from `.mcp.json`), so it is one of the agent's
//! processes and the volume resolves its requests to the agent's session. Each tool sends
//! one request on `.coherent/ctl` through the CLI's own client code; the result carries the
//! reply object both as text and as structured content. A refusal is a tool error
//! (`isError`) whose text starts with the reason code, then the volume's explanation.

use crate::{call, call_bytes, locate, locate_cwd, locate_paths, Fail};
use coherent::control::{shell_word, Reply, Request};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, Implementation, InitializeResult,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const INSTRUCTIONS: &str = "This workspace is a coherent volume: files are handed between \
agent sessions. After you transfer a file you can no longer write it (EACCES) until the \
successor writes or declines it or you withdraw it. Check `inbox` for files handed to you \
(with the giver's note) and `status` for a file's handoff. Paths are relative to the \
server's working directory or absolute.";

/// Run the server on stdin/stdout until the client closes it.
pub fn serve() -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(async {
        let service = Coherent
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| format!("initialize failed: {e}"))?;
        service
            .waiting()
            .await
            .map(|_| ())
            .map_err(|e| format!("the session ended with an error: {e}"))
    })
}

struct Coherent;

fn schema(properties: Value, required: &[&str]) -> Arc<JsonObject> {
    let mut s = json!({ "type": "object", "properties": properties });
    if !required.is_empty() {
        s["required"] = json!(required);
    }
    match s {
        Value::Object(m) => Arc::new(m),
        _ => unreachable!("built as an object"),
    }
}

fn paths_props() -> Value {
    json!({
        "path": { "type": "string", "description": "One file on the volume (relative to the server's working directory, or absolute)." },
        "paths": { "type": "array", "items": { "type": "string" }, "description": "Several files on the volume, all-or-nothing." }
    })
}

fn tools() -> Vec<Tool> {
    let mut transfer_props = paths_props();
    transfer_props["to"] = json!({ "type": "string", "description": "The successor: a session name, its agent id, or an id prefix of 8+ hex digits." });
    transfer_props["note"] = json!({ "type": "string", "description": "A note for the successor (what to do next; up to 64 KiB)." });
    vec![
        Tool::new(
            "whoami",
            "Which session this agent is on the volume, its agent id, and how it was resolved.",
            schema(json!({}), &[]),
        ),
        Tool::new(
            "status",
            "Sessions and handoff records of the volume, or of one path.",
            schema(
                json!({ "path": { "type": "string", "description": "A file on the volume (default: the whole volume)." } }),
                &[],
            ),
        ),
        Tool::new(
            "inbox",
            "Files handed to this session that are still live, with the giver's notes.",
            schema(json!({}), &[]),
        ),
        Tool::new(
            "transfer",
            "Hand files to another session with an optional note. Afterwards this session \
             can no longer write them until the successor writes or declines them, or you \
             withdraw them.",
            schema(transfer_props, &["to"]),
        ),
        Tool::new(
            "accept",
            "Accept files handed to this session (the giver stays fenced until the file changes).",
            schema(paths_props(), &[]),
        ),
        Tool::new(
            "decline",
            "Decline files handed to this session (the giver can write them again).",
            schema(paths_props(), &[]),
        ),
        Tool::new(
            "withdraw",
            "Take back files this session handed on (it can write them again).",
            schema(paths_props(), &[]),
        ),
        Tool::new(
            "wait",
            "Wait until a file's handoff reaches a state (accepted, completed or ended), at \
             most timeout_s seconds.",
            schema(
                json!({
                    "path": { "type": "string", "description": "A file on the volume." },
                    "until": { "type": "string", "enum": ["accepted", "completed", "ended"], "description": "The state to wait for (default: ended)." },
                    "timeout_s": { "type": "number", "description": "Give up after this many seconds (default 600)." }
                }),
                &["path"],
            ),
        ),
    ]
}

/// The text and structured content of a reply; a refusal is a tool error.
fn from_reply(reply: &Reply) -> CallToolResult {
    let body = reply.body().clone();
    if reply.is_ok() {
        let mut r = CallToolResult::structured(body.clone());
        r.content = vec![ContentBlock::text(body.to_string())];
        r
    } else {
        let reason = body["reason"].as_str().unwrap_or("refused").to_string();
        let mut r = CallToolResult::structured_error(body);
        r.content = vec![ContentBlock::text(format!("{reason}: {}", reply.message()))];
        r
    }
}

/// A failure before or instead of a reply (no volume here, a bad argument, ...).
fn from_fail(f: Fail) -> CallToolResult {
    let text = f.message.trim_start_matches("coherent: ").to_string();
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn usage(text: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("bad_request: {text}"))])
}

fn string_arg(args: &JsonObject, key: &str) -> Result<Option<String>, CallToolResult> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(usage(&format!("`{key}` must be a string"))),
    }
}

/// `path` or `paths`, exactly one of them, at least one path.
fn path_list(args: &JsonObject) -> Result<Vec<PathBuf>, CallToolResult> {
    let one = string_arg(args, "path")?;
    let many = match args.get("paths") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|v| v.as_str().map(PathBuf::from))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| usage("`paths` must be an array of strings"))?,
        ),
        Some(_) => return Err(usage("`paths` must be an array of strings")),
    };
    match (one, many) {
        (Some(p), None) => Ok(vec![PathBuf::from(p)]),
        (None, Some(v)) if !v.is_empty() => Ok(v),
        (Some(_), Some(_)) => Err(usage("give `path` or `paths`, not both")),
        _ => Err(usage("give `path` (one file) or `paths` (a list)")),
    }
}

/// One tool call, run off the async runtime (ctl calls are blocking file I/O).
fn run_tool(name: &str, args: &JsonObject) -> CallToolResult {
    let result = (|| -> Result<CallToolResult, CallToolResult> {
        let reply = match name {
            "whoami" => call(&locate_cwd().map_err(from_fail)?, &Request::Whoami),
            "status" => match string_arg(args, "path")? {
                Some(p) => {
                    let (root, rel) = locate(&PathBuf::from(p)).map_err(from_fail)?;
                    let path = (!rel.is_empty()).then_some(rel);
                    call(&root, &Request::Status { path })
                }
                None => call(
                    &locate_cwd().map_err(from_fail)?,
                    &Request::Status { path: None },
                ),
            },
            "inbox" => return inbox(),
            "transfer" => {
                let to = string_arg(args, "to")?.ok_or_else(|| usage("`to` is required"))?;
                let note = string_arg(args, "note")?;
                let (root, paths) = locate_paths(&path_list(args)?).map_err(from_fail)?;
                call(&root, &Request::Transfer { paths, to, note })
            }
            "accept" | "decline" | "withdraw" => {
                let (root, paths) = locate_paths(&path_list(args)?).map_err(from_fail)?;
                let req = match name {
                    "accept" => Request::Accept { paths },
                    "decline" => Request::Decline { paths },
                    _ => Request::Withdraw { paths },
                };
                call(&root, &req)
            }
            "wait" => {
                let path = string_arg(args, "path")?.ok_or_else(|| usage("`path` is required"))?;
                let until = string_arg(args, "until")?.unwrap_or_else(|| "ended".into());
                if !["accepted", "completed", "ended"].contains(&until.as_str()) {
                    return Err(usage("`until` is one of accepted, completed, ended"));
                }
                let (root, rel) = locate(&PathBuf::from(path)).map_err(from_fail)?;
                // The daemon caps each request and then replies `"reached": false`: ask
                // again until our own timeout.
                let deadline = Instant::now() + Duration::from_secs_f64(wait_secs(args));
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let line = format!(
                        "wait {} {until} --timeout {:.3}\n",
                        shell_word(&rel),
                        left.as_secs_f64()
                    );
                    let r = call_bytes(&root, line.as_bytes()).map_err(from_fail)?;
                    if !(r.is_ok() && r.body()["reached"] == Value::Bool(false)) {
                        break Ok(r);
                    }
                    if Instant::now() >= deadline {
                        return Err(CallToolResult::error(vec![ContentBlock::text(format!(
                            "timeout: the record did not reach the state in time; {}",
                            r.message()
                        ))]));
                    }
                }
            }
            other => return Err(usage(&format!("no tool named `{other}`"))),
        };
        Ok(from_reply(&reply.map_err(from_fail)?))
    })();
    result.unwrap_or_else(|e| e)
}

/// The `timeout_s` of a `wait` call (default 600 s).
fn wait_secs(args: &serde_json::Map<String, Value>) -> f64 {
    args.get("timeout_s")
        .and_then(Value::as_f64)
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(600.0)
}

/// `.coherent/inbox` of the session, as `{"ok": true, "verb": "inbox", "records": [...]}`.
fn inbox() -> Result<CallToolResult, CallToolResult> {
    let root = locate_cwd().map_err(from_fail)?;
    let text = std::fs::read_to_string(root.join(".coherent/inbox"))
        .map_err(|e| usage(&format!("cannot read .coherent/inbox: {e}")))?;
    let records: Value = serde_json::from_str(text.trim())
        .map_err(|e| usage(&format!(".coherent/inbox is not JSON: {e}")))?;
    let n = records.as_array().map_or(0, Vec::len);
    let body = json!({
        "ok": true,
        "verb": "inbox",
        "message": format!("{n} handoff(s) waiting for this session"),
        "records": records,
    });
    Ok(from_reply(
        &Reply::from_json(body).expect("an ok reply object"),
    ))
}

impl ServerHandler for Coherent {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("coherent", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let name = request.name.to_string();
        let args = request.arguments.unwrap_or_default();
        if name == "wait" {
            // the daemon answers when the state is reached; the timeout is ours
            // run_tool keeps the timeout itself; this is a safety net over it
            let secs = wait_secs(&args) + 5.0;
            let job = tokio::task::spawn_blocking(move || run_tool("wait", &args));
            return match tokio::time::timeout(Duration::from_secs_f64(secs), job).await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => Err(McpError::internal_error(e.to_string(), None)),
                Err(_) => Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "timeout: the record did not reach the state within {secs} s"
                ))])),
            };
        }
        tokio::task::spawn_blocking(move || run_tool(&name, &args))
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))
    }
}
