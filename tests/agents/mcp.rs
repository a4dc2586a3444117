//! `coherent mcp` through a real MCP client: rmcp's client spawns the server as a child
//! process in a real mount, tagged with a session, and speaks MCP over its stdio.

use crate::coherent;
use crate::common;

use coherent::{cli, inbox, read_ctl_file, sh, sh_ok, wait_event, Root, CLI, TAGS};
use common::Mount;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, CancelTaskParams, ClientCapabilities, ClientInfo,
    ClientRequest, ErrorCode, ErrorData, GetTaskParams, GetTaskPayloadParams, Implementation,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResult, Request, ResourceContents,
    ResourceUpdatedNotificationParam, SubscribeRequestParams, TaskMetadata,
    TaskStatusNotificationParam, TaskSupport, TasksCapability, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::ClientHandler;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

type Client = RunningService<RoleClient, ()>;

/// `coherent mcp` started in `dir` as session `who`, with an initialized client.
async fn connect(dir: &Path, who: &str) -> Client {
    connect_with(dir, who, ()).await
}

/// [`connect`] with a client handler of its own (to hear notifications).
async fn connect_with<H: ClientHandler>(
    dir: &Path,
    who: &str,
    handler: H,
) -> RunningService<RoleClient, H> {
    let mut cmd = tokio::process::Command::new(CLI);
    cmd.arg("mcp").current_dir(dir);
    for t in TAGS {
        cmd.env_remove(t);
    }
    cmd.env("COHERENT_SESSION", who);
    let transport = TokioChildProcess::new(cmd).expect("spawn coherent mcp");
    tokio::time::timeout(Duration::from_secs(20), handler.serve(transport))
        .await
        .expect("initialize within 20 s")
        .expect("initialize")
}

async fn call<H: ClientHandler>(
    c: &RunningService<RoleClient, H>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
    let r = tokio::time::timeout(Duration::from_secs(30), c.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("{tool} answered within 30 s"))
        .unwrap_or_else(|e| panic!("{tool}: protocol error {e}"));
    // Every structured result, refusals included, follows the tool's declared output
    // schema (the MCP spec: a server that declares one MUST conform to it).
    if let Some(got) = &r.structured_content {
        let tools = c.list_all_tools().await.expect("tools/list");
        let t = tools
            .iter()
            .find(|t| t.name == tool)
            .expect("the tool is listed");
        let schema = Value::Object((**t.output_schema.as_ref().expect("an output schema")).clone());
        if let Err(e) = conforms(got, &schema, "$") {
            panic!("{tool}: structured content does not follow its output schema: {e}\n{got}");
        }
    }
    r
}

/// The subset of JSON Schema the output schemas use: `type` (one or a list), `properties`,
/// `required`, `items`, `enum`.
fn conforms(v: &Value, schema: &Value, at: &str) -> Result<(), String> {
    let type_ok = |t: &str| match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "null" => v.is_null(),
        other => panic!("{at}: a schema type this checker does not know: {other}"),
    };
    match &schema["type"] {
        Value::String(t) if !type_ok(t) => return Err(format!("{at}: not a {t}: {v}")),
        Value::Array(ts) if !ts.iter().any(|t| type_ok(t.as_str().unwrap())) => {
            return Err(format!("{at}: none of {ts:?}: {v}"))
        }
        _ => {}
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(v) {
            return Err(format!("{at}: {v} is not one of {allowed:?}"));
        }
    }
    if let (Some(obj), Some(props)) = (v.as_object(), schema["properties"].as_object()) {
        for k in schema["required"].as_array().into_iter().flatten() {
            let k = k.as_str().unwrap();
            if !obj.contains_key(k) {
                return Err(format!("{at}: `{k}` is required"));
            }
        }
        for (k, sub) in props {
            if let Some(x) = obj.get(k) {
                conforms(x, sub, &format!("{at}.{k}"))?;
            }
        }
    }
    if let (Some(items), Some(sub)) = (v.as_array(), schema.get("items")) {
        for (i, x) in items.iter().enumerate() {
            conforms(x, sub, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A successful result: not an error, and its text is the structured reply.
fn ok(tool: &str, r: &CallToolResult) -> Value {
    assert_ne!(r.is_error, Some(true), "{tool} failed: {}", text(r));
    let s = r.structured_content.clone().expect("structured content");
    assert_eq!(s["ok"], json!(true), "{tool}: {s}");
    let t: Value = serde_json::from_str(&text(r)).expect("the text is the JSON reply");
    assert_eq!(t, s, "{tool}: text and structured content differ");
    s
}

/// A refusal: a tool error whose text starts with the reason code.
fn refused(tool: &str, r: &CallToolResult, reason: &str) -> Value {
    assert_eq!(
        r.is_error,
        Some(true),
        "{tool} was not refused: {}",
        text(r)
    );
    assert!(
        text(r).starts_with(&format!("{reason}: ")),
        "{tool}: expected {reason}, got {}",
        text(r)
    );
    let s = r.structured_content.clone().unwrap_or(Value::Null);
    if !s.is_null() {
        assert_eq!(s["reason"], json!(reason), "{tool}: {s}");
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_session_drives_every_tool() {
    let m = Mount::new(true);
    let root = m.root().to_path_buf();
    std::fs::create_dir(root.join("sub")).unwrap();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && echo notes > notes.md && echo draft > draft.md",
    );

    let alice = connect(&root, "alice").await;
    let info = alice.peer_info().expect("server info");
    assert_eq!(info.server_info.name, "coherent");
    assert!(info.capabilities.tools.is_some());
    let mut names: Vec<String> = alice
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| {
            assert!(t.description.is_some(), "{} has no description", t.name);
            t.name.to_string()
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "accept", "decline", "diff", "inbox", "log", "show", "status", "transfer", "undo",
            "wait", "whoami", "withdraw"
        ]
    );

    let me = ok("whoami", &call(&alice, "whoami", json!({})).await);
    assert_eq!(me["session"], "alice", "{me}");

    // the history tools: the versions of a file, one version's bytes, a session's diff,
    // and an undo (docs/history.md)
    sh_ok(&m, Some("carol"), "echo draft two > draft.md");
    let log = ok(
        "log",
        &call(&alice, "log", json!({"path": "draft.md"})).await,
    );
    let vs = log["versions"].as_array().expect("versions");
    assert_eq!(vs.len(), 2, "{log}");
    let v1 = vs[0]["version"].as_u64().unwrap();
    let shown = ok(
        "show",
        &call(&alice, "show", json!({"path": "draft.md", "version": v1})).await,
    );
    assert_eq!(shown["content"], "draft\n", "{shown}");
    let d = ok(
        "diff",
        &call(&alice, "diff", json!({"session": "carol"})).await,
    );
    assert_eq!(
        d["diff"], "--- a/draft.md\n+++ b/draft.md\n@@ -1 +1 @@\n-draft\n+draft two\n",
        "{d}"
    );
    let u = ok(
        "undo",
        &call(&alice, "undo", json!({"session": "carol"})).await,
    );
    assert_eq!(u["refused"], json!([]), "{u}");
    assert_eq!(
        std::fs::read_to_string(root.join("draft.md")).unwrap(),
        "draft\n"
    );
    refused(
        "show",
        &call(&alice, "show", json!({"path": "draft.md", "version": 99})).await,
        "no_such_path",
    );

    // transfer by `paths`, with a note; the volume then fences alice's own shell writes
    let r = ok(
        "transfer",
        &call(
            &alice,
            "transfer",
            json!({"paths": ["plan.md", "notes.md"], "to": "bob", "note": "your turn"}),
        )
        .await,
    );
    let recs = r["records"].as_array().expect("records");
    assert_eq!(recs.len(), 2, "{r}");
    assert!(recs.iter().all(|x| x["status"] == "pending"), "{r}");
    assert!(sh(&m, Some("alice"), "echo x >> plan.md").denied());

    // refusals are tool errors with the reason code
    refused(
        "transfer",
        &call(
            &alice,
            "transfer",
            json!({"path": "draft.md", "to": "alice"}),
        )
        .await,
        "handoff_to_self",
    );
    refused(
        "transfer",
        &call(
            &alice,
            "transfer",
            json!({"path": "draft.md", "to": "nobody"}),
        )
        .await,
        "handoff_successor_unknown",
    );
    refused(
        "transfer",
        &call(&alice, "transfer", json!({"to": "bob"})).await,
        "bad_request",
    );

    let st = ok(
        "status",
        &call(&alice, "status", json!({"path": "plan.md"})).await,
    );
    assert_eq!(st["status"]["live"][0]["path"], "plan.md", "{st}");
    let all = ok("status", &call(&alice, "status", json!({})).await);
    assert_eq!(
        all["status"]["live"].as_array().map(Vec::len),
        Some(2),
        "{all}"
    );

    // bob, started in a subdirectory: relative paths from there, absolute paths
    let bob = connect(&root.join("sub"), "bob").await;
    let inbox = ok("inbox", &call(&bob, "inbox", json!({})).await);
    let paths: Vec<&str> = inbox["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["plan.md", "notes.md"], "{inbox}");
    assert_eq!(inbox["records"][0]["note"], "your turn", "{inbox}");
    let r = ok(
        "accept",
        &call(&bob, "accept", json!({"path": "../plan.md"})).await,
    );
    assert_eq!(r["records"][0]["status"], "completed", "{r}");
    let abs = root.join("notes.md").to_string_lossy().into_owned();
    let r = ok(
        "decline",
        &call(&bob, "decline", json!({"paths": [abs]})).await,
    );
    assert_eq!(r["records"][0]["status"], "declined", "{r}");
    refused(
        "decline",
        &call(&bob, "decline", json!({"path": "../draft.md"})).await,
        "handoff_not_live",
    );
    refused(
        "accept",
        &call(&bob, "accept", json!({"path": "../missing.md"})).await,
        "no_such_path",
    );

    // withdraw: of a declined record refused (docs/design.md#handoff: a record no longer live
    // answers handoff_not_live), of a live one done
    let r = call(&alice, "withdraw", json!({"path": "notes.md"})).await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).starts_with("handoff_not_live: "), "{}", text(&r));
    ok(
        "transfer",
        &call(&alice, "transfer", json!({"path": "draft.md", "to": "bob"})).await,
    );
    let r = ok(
        "withdraw",
        &call(&alice, "withdraw", json!({"path": "draft.md"})).await,
    );
    assert_eq!(r["records"][0]["status"], "withdrawn", "{r}");
    assert!(sh(&m, Some("alice"), "echo again >> draft.md").ok());

    // wait: sent as `wait PATH UNTIL` on ctl; a daemon without the verb refuses it, and
    // the refusal comes back as a tool error with a reason code, promptly
    let t0 = Instant::now();
    let w = call(
        &alice,
        "wait",
        json!({"path": "plan.md", "until": "ended", "timeout_s": 5}),
    )
    .await;
    assert!(t0.elapsed() < Duration::from_secs(10));
    if w.is_error == Some(true) {
        let t = text(&w);
        let code = t.split(':').next().unwrap();
        assert!(
            !code.is_empty() && code.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{t}"
        );
    }
    refused(
        "wait",
        &call(&alice, "wait", json!({"path": "plan.md", "until": "soon"})).await,
        "bad_request",
    );

    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_outside_a_volume_is_a_tool_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let c = connect(dir.path(), "alice").await;
    let r = call(&c, "whoami", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("no coherent volume here"), "{}", text(&r));
    // the server is still there
    let r = call(&c, "status", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    // the resources are listed, but reading or subscribing says there is no volume
    assert_eq!(c.list_all_resources().await.unwrap().len(), 2);
    let e = read_resource(&c, "coherent://inbox")
        .await
        .expect_err("no volume");
    assert!(e.to_string().contains("no coherent volume here"), "{e}");
    let e = c
        .subscribe(SubscribeRequestParams::new("coherent://records"))
        .await
        .expect_err("no volume");
    assert!(e.to_string().contains("no coherent volume here"), "{e}");
    let r = call(&c, "whoami", json!({})).await;
    assert!(text(&r).contains("no coherent volume here"), "{}", text(&r));
    c.cancel().await.unwrap();
}

/// The `wait` tool: answered when the successor accepts (the daemon's answer, not a poll),
/// and a tool error after `timeout_s` when nothing happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_wait_returns_on_the_accept_and_times_out() {
    let m = Mount::builder().env("RUST_LOG", "debug").start();
    let root = m.root().to_path_buf();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    let r = cli(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    let alice = connect(&root, "alice").await;

    // nothing happens: a tool error after about timeout_s
    let t0 = Instant::now();
    let w = call(&alice, "wait", json!({"path": "plan.md", "timeout_s": 1})).await;
    assert_eq!(w.is_error, Some(true), "{}", text(&w));
    assert!(text(&w).starts_with("timeout"), "{}", text(&w));
    assert!(t0.elapsed() < Duration::from_secs(10));

    let pending_before = m.log().matches("wait pending").count();
    let waiter = {
        let alice = &alice;
        async move {
            call(
                alice,
                "wait",
                json!({"path": "plan.md", "until": "accepted", "timeout_s": 20}),
            )
            .await
        }
    };
    let accept = async {
        // the daemon's log says when the wait is pending
        let t = Instant::now();
        while m.log().matches("wait pending").count() <= pending_before {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the wait never became pending"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let r = cli(&m, Some("bob"), &["accept", "plan.md"]);
        assert!(r.ok(), "{}", r.show());
    };
    let (w, ()) = tokio::join!(waiter, accept);
    let v = ok("wait", &w);
    assert_eq!(v["reached"], true, "{v}");
    assert_eq!(v["record"]["status"], "completed", "{v}");
    alice.cancel().await.unwrap();
}

// ---- the wire itself: raw JSON-RPC lines on the server's stdin and stdout ----------------

/// `coherent mcp` spoken to line by line, without a client library in between.
struct Raw {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<Value>,
    /// The answer to `initialize`.
    init: Value,
}

impl Raw {
    /// Started in `dir` as session `who`, initialized.
    fn start(dir: &Path, who: &str) -> Raw {
        use std::io::BufRead;
        let mut cmd = std::process::Command::new(CLI);
        cmd.arg("mcp")
            .current_dir(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        for t in TAGS {
            cmd.env_remove(t);
        }
        cmd.env("COHERENT_SESSION", who);
        let mut child = cmd.spawn().expect("spawn coherent mcp");
        let stdin = child.stdin.take().unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                let v = serde_json::from_str(&line).unwrap_or_else(|e| {
                    panic!("the server wrote a line that is not JSON ({e}): {line}")
                });
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let mut raw = Raw {
            child,
            stdin: Some(stdin),
            lines,
            init: Value::Null,
        };
        raw.send(
            json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        );
        let r = raw
            .recv(Duration::from_secs(20))
            .expect("initialize answered");
        assert_eq!(r["id"], "init", "{r}");
        raw.init = r;
        raw.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        raw
    }

    fn send_bytes(&mut self, bytes: &[u8]) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(bytes).expect("the server reads its stdin");
        stdin.flush().unwrap();
    }

    fn send(&mut self, v: Value) {
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        self.send_bytes(&line);
    }

    fn recv(&self, within: Duration) -> Option<Value> {
        self.lines.recv_timeout(within).ok()
    }

    /// The next message that is not a notification.
    fn reply(&self, within: Duration) -> Option<Value> {
        let end = Instant::now() + within;
        loop {
            let v = self.recv(end.saturating_duration_since(Instant::now()))?;
            if v.get("method").is_none() {
                return Some(v);
            }
        }
    }

    /// Close the server's stdin: the client is gone.
    fn close_input(&mut self) {
        self.stdin = None;
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// A `ping` is answered: the server still serves.
    fn assert_serving(&mut self, id: &str) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "ping"}));
        let r = self.reply(Duration::from_secs(20)).expect("ping answered");
        assert_eq!(r["id"], id, "{r}");
        assert!(r.get("result").is_some(), "{r}");
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn error_code(v: &Value) -> Option<i64> {
    v.get("error")?.get("code")?.as_i64()
}

#[test]
fn mcp_answers_every_malformed_frame_with_its_jsonrpc_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Raw::start(dir.path(), "alice");
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes();
    let cases: Vec<(Vec<u8>, i64, Value, &str)> = vec![
        (b"{not json".to_vec(), -32700, Value::Null, "Parse error"),
        (b"".to_vec(), -32700, Value::Null, "empty line"),
        (b"   \t".to_vec(), -32700, Value::Null, "empty line"),
        (
            b"\xff\xfe{\"a\":1}".to_vec(),
            -32700,
            Value::Null,
            "not UTF-8",
        ),
        (deep(100_000), -32700, Value::Null, "recursion limit"),
        (
            br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#.to_vec(),
            -32600,
            Value::Null,
            "`id`",
        ),
        (
            br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#.to_vec(),
            -32600,
            Value::Null,
            "`id`",
        ),
        (b"[]".to_vec(), -32600, Value::Null, "batches"),
        (b"42".to_vec(), -32600, Value::Null, "JSON object"),
        (
            br#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#.to_vec(),
            -32600,
            json!(7),
            "jsonrpc",
        ),
        (
            br#"{"jsonrpc":"2.0","id":8}"#.to_vec(),
            -32600,
            json!(8),
            "neither",
        ),
        (
            br#"{"jsonrpc":"2.0","id":"m","method":5}"#.to_vec(),
            -32600,
            json!("m"),
            "`method`",
        ),
        (
            br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":5}"#.to_vec(),
            -32602,
            json!(9),
            "Invalid params",
        ),
    ];
    for (frame, code, id, says) in cases {
        let mut line = frame.clone();
        line.push(b'\n');
        s.send_bytes(&line);
        let shown = String::from_utf8_lossy(&frame[..frame.len().min(80)]).into_owned();
        let r = s
            .reply(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("no reply to {shown:?}"));
        assert_eq!(r["jsonrpc"], "2.0", "{shown:?}: {r}");
        assert_eq!(error_code(&r), Some(code), "{shown:?}: {r}");
        assert_eq!(r["id"], id, "{shown:?}: {r}");
        let msg = r["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(says), "{shown:?}: {r}");
    }
    // a line over the limit is answered, with the limit, and skipped
    let mut big = br#"{"jsonrpc":"2.0","id":10,"method":"ping","params":{"x":""#.to_vec();
    big.resize(17 << 20, b'a');
    big.extend_from_slice(b"\"}}\n");
    s.send_bytes(&big);
    let r = s
        .reply(Duration::from_secs(30))
        .expect("a reply to the huge line");
    assert_eq!(error_code(&r), Some(-32600), "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("the limit is {} bytes", 16 << 20)),
        "{r}"
    );
    // a notification rmcp cannot read gets no reply (JSON-RPC never answers one)
    s.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 5}));
    s.assert_serving("after");
    assert!(s.alive());
}

/// Issue 29, item 8: a frame with a key twice (at the top, in `params`, deeper) is
/// answered -32600 naming the key, never left unanswered; the id is echoed only when it is
/// not the repeated key.
#[test]
fn mcp_answers_a_frame_with_a_repeated_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Raw::start(dir.path(), "alice");
    let cases: [(&[u8], Value, &str); 4] = [
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"ping"}"#,
            json!(1),
            "\"method\"",
        ),
        (
            br#"{"jsonrpc":"2.0","id":2,"id":3,"method":"ping"}"#,
            Value::Null,
            "\"id\"",
        ),
        (
            br#"{"jsonrpc":"2.0","id":"t","method":"tools/call","params":{"name":"status","name":"whoami"}}"#,
            json!("t"),
            "\"name\"",
        ),
        (
            br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"status","arguments":{"path":[{"a":1,"a":2}]}}}"#,
            json!(4),
            "\"a\"",
        ),
    ];
    for (frame, id, key) in cases {
        let shown = String::from_utf8_lossy(frame).into_owned();
        let mut line = frame.to_vec();
        line.push(b'\n');
        s.send_bytes(&line);
        let r = s
            .reply(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("no reply to {shown}"));
        assert_eq!(error_code(&r), Some(-32600), "{shown}: {r}");
        assert_eq!(r["id"], id, "{shown}: {r}");
        let msg = r["error"]["message"].as_str().unwrap_or("");
        assert!(
            msg.contains(&format!("the key {key} appears twice")),
            "{shown}: {r}"
        );
    }
    // equal keys in different objects are fine
    s.send_bytes(
        b"{\"jsonrpc\":\"2.0\",\"id\":\"p\",\"method\":\"ping\",\"params\":{\"_meta\":{\"id\":1}}}\n",
    );
    let r = s.reply(Duration::from_secs(20)).expect("ping answered");
    assert_eq!(r["id"], "p", "{r}");
    assert!(r.get("result").is_some(), "{r}");
    s.assert_serving("after");
}

/// Limits and bad arguments are tool errors with the reason code `bad_request` and say
/// which limit; no argument panics the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_limits_and_bad_paths_are_bad_requests() {
    let m = Mount::new(true);
    let root = m.root().to_path_buf();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(&m, Some("alice"), "echo plan > plan.md && ln -s /etc esc");
    let alice = connect(&root, "alice").await;
    let says = |r: &CallToolResult, s: &str| {
        assert!(text(r).contains(s), "expected {s:?} in {}", text(r));
    };

    let note = "n".repeat(10 << 20);
    let r = call(
        &alice,
        "transfer",
        json!({"path": "plan.md", "to": "bob", "note": note}),
    )
    .await;
    refused("transfer", &r, "bad_request");
    says(&r, "the note is 10485760 bytes; the limit is 65536 bytes");
    let r = call(
        &alice,
        "transfer",
        json!({"path": "x".repeat(2 << 20), "to": "bob"}),
    )
    .await;
    refused("transfer", &r, "bad_request");
    says(&r, "the limit is 1048576 bytes");

    for (tool, args) in [
        ("status", json!({"path": ""})),
        ("accept", json!({"path": ""})),
        ("transfer", json!({"paths": ["plan.md", ""], "to": "bob"})),
        ("wait", json!({"path": ""})),
    ] {
        let r = call(&alice, tool, args).await;
        refused(tool, &r, "bad_request");
        says(&r, "the path is empty");
    }
    for p in [
        "../../etc/passwd",
        "/etc/passwd",
        "esc/passwd",
        "../../no/such/file",
    ] {
        for tool in ["status", "accept", "withdraw", "wait"] {
            let r = call(&alice, tool, json!({ "path": p })).await;
            refused(tool, &r, "bad_request");
            says(&r, &format!("{p}: outside the volume"));
        }
    }
    let r = call(&alice, "accept", json!({"paths": []})).await;
    refused("accept", &r, "bad_request");
    let r = call(&alice, "transfer", json!({"path": "plan.md", "to": ""})).await;
    refused("transfer", &r, "bad_request");

    for t in [json!(1e300), json!(-1), json!("soon"), json!(86_401)] {
        let r = call(&alice, "wait", json!({"path": "plan.md", "timeout_s": t})).await;
        refused("wait", &r, "bad_request");
        says(&r, "`timeout_s` is a number of seconds from 0 to 86400");
    }
    // still serving after all of it
    ok("whoami", &call(&alice, "whoami", json!({})).await);
    alice.cancel().await.unwrap();
}

/// The tools say what they do (MCP annotations), and their schemas carry no top-level
/// `oneOf`/`anyOf`/`allOf`, which the Anthropic API refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_are_annotated_and_their_schemas_travel() {
    let dir = tempfile::tempdir().unwrap();
    let c = connect(dir.path(), "alice").await;
    for t in c.list_all_tools().await.unwrap() {
        let name = t.name.to_string();
        let a = t
            .annotations
            .clone()
            .unwrap_or_else(|| panic!("{name} has no annotations"));
        let read_only =
            ["whoami", "status", "inbox", "wait", "log", "show", "diff"].contains(&name.as_str());
        let idempotent = name != "transfer" && name != "undo";
        assert_eq!(a.read_only_hint, Some(read_only), "{name}");
        assert_eq!(a.idempotent_hint, Some(idempotent), "{name}");
        assert_eq!(a.destructive_hint, Some(false), "{name}");
        assert_eq!(a.open_world_hint, Some(false), "{name}");
        let out = Value::Object((**t.output_schema.as_ref().expect("an output schema")).clone());
        assert_eq!(out["type"], "object", "{name}: {out}");
        assert_eq!(
            out["required"],
            json!(["ok", "verb", "message"]),
            "{name}: {out}"
        );
        let schema = Value::Object((*t.input_schema).clone());
        for k in ["oneOf", "anyOf", "allOf"] {
            assert!(schema.get(k).is_none(), "{name}: top-level {k}: {schema}");
        }
        assert_eq!(schema["type"], "object", "{name}");
        if ["transfer", "accept", "decline", "withdraw"].contains(&name.as_str()) {
            assert_eq!(schema["properties"]["paths"]["minItems"], 1, "{name}");
            assert_eq!(schema["properties"]["path"]["minLength"], 1, "{name}");
        }
        if name == "wait" {
            assert_eq!(
                schema["properties"]["timeout_s"]["maximum"], 86400.0,
                "{schema}"
            );
            let d = schema["properties"]["timeout_s"]["description"]
                .as_str()
                .unwrap();
            assert!(d.contains("default 50"), "{d}");
        }
    }
    c.cancel().await.unwrap();
}

/// `wait` sends progress notifications for the caller's progress token while it waits, and
/// a cancelled call stops waiting: the server goes on answering, and sends no more progress.
#[test]
fn mcp_wait_reports_progress_and_honours_cancellation() {
    let m = Mount::new(true);
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    assert!(cli(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]).ok());
    let mut s = Raw::start(m.root(), "alice");
    let t0 = Instant::now();
    s.send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "wait", "arguments": {"path": "plan.md", "until": "accepted", "timeout_s": 60},
        "_meta": {"progressToken": "p1"}}}),
    );
    let mut progress = Vec::new();
    while progress.len() < 2 {
        let v = s
            .recv(Duration::from_secs(15))
            .expect("progress within 15 s");
        assert_eq!(v["method"], "notifications/progress", "{v}");
        assert_eq!(v["params"]["progressToken"], "p1", "{v}");
        assert_eq!(v["params"]["total"], 60.0, "{v}");
        progress.push(v["params"]["progress"].as_f64().unwrap());
    }
    assert!(progress[0] < progress[1], "{progress:?}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    s.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 1, "reason": "test"}}),
    );
    let cancelled = Instant::now();
    s.assert_serving("after-cancel");
    // whatever comes for the cancelled call comes at once; no progress after it
    let end = Instant::now() + Duration::from_secs(8);
    while let Some(v) = s.recv(end.saturating_duration_since(Instant::now())) {
        assert_ne!(
            v["method"], "notifications/progress",
            "progress after the cancel: {v}"
        );
        assert_eq!(v["id"], 1, "{v}");
        assert!(v.get("error").is_some(), "{v}");
        assert!(cancelled.elapsed() < Duration::from_secs(2), "{v}");
    }
    // the record is still pending: the cancelled wait did nothing
    let r = cli(&m, Some("alice"), &["status", "--json", "plan.md"]);
    assert!(r.out.contains("pending"), "{}", r.show());
}

/// A bounded, seeded fuzz of the wire: a few hundred frames, valid and malformed, mixed.
/// Every frame that calls for an answer gets exactly one (with its id when it has a
/// readable one), notifications get none, and the server never dies.
#[test]
fn mcp_fuzz_answers_every_request_shaped_frame_and_never_dies() {
    let seed: u64 = std::env::var("COHERENT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_c0de);
    let frames: usize = 400;
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let dir = tempfile::tempdir().unwrap();
    let mut s = Raw::start(dir.path(), "alice");
    let tools = [
        "whoami", "status", "inbox", "transfer", "accept", "decline", "withdraw", "wait", "nope",
    ];
    let junk_values = [
        json!(null),
        json!(true),
        json!(-1),
        json!(1e300),
        json!("../../etc/passwd"),
        json!(""),
        json!([]),
        json!(["a", 1]),
        json!({"x": {}}),
        json!("plan.md"),
    ];
    let keys = ["path", "paths", "to", "note", "until", "timeout_s", "zzz"];
    let mut want_ids: std::collections::HashSet<String> = Default::default();
    let mut want_null = 0usize;
    for i in 0..frames {
        let id = if next() % 2 == 0 {
            json!(i)
        } else {
            json!(format!("s{i}"))
        };
        let pick = |n: u64, r: u64| (r % n) as usize;
        let kind = next() % 10;
        let mut line: Vec<u8> = match kind {
            // a valid request: ping, tools/list, or a tool call with random arguments
            0..=3 => {
                let v = match next() % 3 {
                    0 => json!({"jsonrpc": "2.0", "id": id, "method": "ping"}),
                    1 => json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}),
                    _ => {
                        let mut args = serde_json::Map::new();
                        for _ in 0..next() % 4 {
                            let k = keys[pick(keys.len() as u64, next())];
                            let v = junk_values[pick(junk_values.len() as u64, next())].clone();
                            args.insert(k.into(), v);
                        }
                        let tool = tools[pick(tools.len() as u64, next())];
                        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                               "params": {"name": tool, "arguments": args}})
                    }
                };
                want_ids.insert(id.to_string());
                v.to_string().into_bytes()
            }
            // an unknown method, a wrong version, params of the wrong type: answered by id
            4 => {
                let v = match next() % 3 {
                    0 => json!({"jsonrpc": "2.0", "id": id, "method": "no/such"}),
                    1 => json!({"jsonrpc": "3.0", "id": id, "method": "ping"}),
                    _ => json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": [1]}),
                };
                want_ids.insert(id.to_string());
                v.to_string().into_bytes()
            }
            // a notification: no answer
            5 => json!({"jsonrpc": "2.0", "method": "notifications/whatever", "params": {}})
                .to_string()
                .into_bytes(),
            // a valid frame cut short
            6 => {
                let full = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": "status", "arguments": {"path": "a"}}})
                .to_string();
                want_null += 1;
                full.as_bytes()[..pick(full.len() as u64 - 1, next())].to_vec()
            }
            // random bytes (never a newline, never an object)
            7 => {
                want_null += 1;
                (0..next() % 300)
                    .map(|_| match (next() % 256) as u8 {
                        b'\n' | b'{' => b'x',
                        b => b,
                    })
                    .collect()
            }
            // deep nesting
            8 => {
                want_null += 1;
                let n = 100 + pick(200_000, next());
                let (o, c) = if next() % 2 == 0 {
                    ("[", "]")
                } else {
                    ("{\"a\":", "}")
                };
                format!("{}1{}", o.repeat(n), c.repeat(n)).into_bytes()
            }
            // an id that is not one
            _ => {
                want_null += 1;
                let bad = [json!({}), json!([1]), json!(1.5), json!(true), json!(null)];
                json!({"jsonrpc": "2.0", "id": bad[pick(5, next())], "method": "ping"})
                    .to_string()
                    .into_bytes()
            }
        };
        line.push(b'\n');
        s.send_bytes(&line);
    }
    let (mut got_null, mut got_ids) = (0usize, std::collections::HashSet::new());
    let end = Instant::now() + Duration::from_secs(120);
    while got_null < want_null || got_ids.len() < want_ids.len() {
        let Some(v) = s.reply(end.saturating_duration_since(Instant::now())) else {
            break;
        };
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        if v["id"].is_null() {
            assert!(matches!(error_code(&v), Some(-32700 | -32600)), "{v}");
            got_null += 1;
        } else {
            let id = v["id"].to_string();
            assert!(want_ids.contains(&id), "a reply to no request: {v}");
            assert!(got_ids.insert(id), "two replies: {v}");
        }
    }
    let missing: Vec<_> = want_ids.difference(&got_ids).take(10).collect();
    assert!(
        missing.is_empty(),
        "seed {seed}: no reply to ids {missing:?}"
    );
    assert_eq!(got_null, want_null, "seed {seed}: id-less error replies");
    assert!(s.alive(), "seed {seed}: the server died");
    s.assert_serving("end");
    eprintln!(
        "fuzz seed {seed}: {frames} frames, {} replies by id, {} id-less errors",
        got_ids.len(),
        got_null
    );
}

// ---- resources: the live records and the inbox --------------------------------------------

const RECORDS: &str = "coherent://records";
const INBOX: &str = "coherent://inbox";

/// A client that passes on the URI of every `notifications/resources/updated` it hears.
struct Updates(tokio::sync::mpsc::UnboundedSender<String>);

impl ClientHandler for Updates {
    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(params.uri);
    }
}

async fn read_resource<H: ClientHandler>(
    c: &RunningService<RoleClient, H>,
    uri: &str,
) -> Result<ReadResourceResult, ServiceError> {
    tokio::time::timeout(
        Duration::from_secs(30),
        c.read_resource(ReadResourceRequestParams::new(uri)),
    )
    .await
    .unwrap_or_else(|_| panic!("read {uri} answered within 30 s"))
}

/// A resource's one content: JSON text, of type application/json, for its URI.
async fn resource_json<H: ClientHandler>(c: &RunningService<RoleClient, H>, uri: &str) -> Value {
    let r = read_resource(c, uri)
        .await
        .unwrap_or_else(|e| panic!("read {uri}: {e}"));
    assert_eq!(r.contents.len(), 1, "{uri}: {r:?}");
    let ResourceContents::TextResourceContents {
        uri: got,
        mime_type,
        text,
        ..
    } = &r.contents[0]
    else {
        panic!("{uri}: not text: {r:?}")
    };
    assert_eq!(got, uri);
    assert_eq!(mime_type.as_deref(), Some("application/json"), "{uri}");
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{uri} is not JSON ({e}): {text}"))
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// `resources/list` names both resources; `resources/read` gives what `.coherent/inbox` and
/// the `live` records of `.coherent/status` say to the server's session; an unknown URI is
/// JSON-RPC error -32002 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_resources_list_and_read_the_records_and_the_inbox() {
    let m = Mount::new(true);
    let root = m.root().to_path_buf();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && echo x > other.md",
    );
    let r = cli(
        &m,
        Some("alice"),
        &[
            "transfer",
            "--to",
            "bob",
            "--note",
            "over to you",
            "plan.md",
        ],
    );
    assert!(r.ok(), "{}", r.show());

    let bob = connect(&root, "bob").await;
    let caps = bob.peer_info().expect("server info").capabilities.clone();
    let res = caps.resources.expect("the resources capability");
    assert_eq!(res.subscribe, Some(true));
    assert_eq!(res.list_changed, Some(false));
    let mut listed = bob.list_all_resources().await.unwrap();
    listed.sort_by(|a, b| a.uri.cmp(&b.uri));
    let uris: Vec<&str> = listed.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(uris, [INBOX, RECORDS]);
    for r in &listed {
        assert!(!r.name.is_empty(), "{r:?}");
        assert!(
            r.description.as_deref().is_some_and(|d| !d.is_empty()),
            "{r:?}"
        );
        assert_eq!(r.mime_type.as_deref(), Some("application/json"), "{r:?}");
    }

    // bob's inbox: the handoff with its note, as .coherent/inbox shows it to bob
    let got = resource_json(&bob, INBOX).await;
    assert_eq!(got, json_of(&inbox(&m, Some("bob"))));
    assert_eq!(got[0]["path"], "plan.md", "{got}");
    assert_eq!(got[0]["note"], "over to you", "{got}");
    let got = resource_json(&bob, RECORDS).await;
    let live = json_of(&read_ctl_file(&m, Some("bob"), "status"))["live"].clone();
    assert_eq!(got, live);
    assert_eq!(got.as_array().map(Vec::len), Some(1), "{got}");
    assert_eq!(got[0]["successor"], "bob", "{got}");

    // alice (the giver): the same live record, and an empty inbox
    let alice = connect(&root, "alice").await;
    let got = resource_json(&alice, INBOX).await;
    assert_eq!(got, json_of(&inbox(&m, Some("alice"))));
    assert_eq!(got, json!([]));
    assert_eq!(resource_json(&alice, RECORDS).await, live);

    for uri in ["coherent://nope", "file:///etc/passwd", ""] {
        let e = read_resource(&bob, uri).await.expect_err(uri);
        let ServiceError::McpError(e) = e else {
            panic!("{uri}: not a JSON-RPC error: {e}")
        };
        assert_eq!(e.code.0, -32002, "{uri}: {e:?}");
        assert!(e.message.contains(uri), "{uri}: {e:?}");
        assert_eq!(e.data, Some(json!({ "uri": uri })), "{uri}: {e:?}");
    }
    // a subscription to an unknown URI is refused the same way
    let e = bob
        .subscribe(SubscribeRequestParams::new("coherent://nope"))
        .await
        .expect_err("subscribe to an unknown URI");
    assert!(
        matches!(&e, ServiceError::McpError(e) if e.code.0 == -32002),
        "{e}"
    );
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
}

/// The next URI heard, within `within`.
async fn next_update(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    within: Duration,
) -> Option<String> {
    tokio::time::timeout(within, rx.recv()).await.ok().flatten()
}

/// After `resources/subscribe` of the inbox, a transfer to this session by another (through
/// the CLI) is heard as `notifications/resources/updated` for the inbox, whose content then
/// has the record; nothing is heard for the records, not subscribed. After
/// `resources/unsubscribe`, a later transfer is heard of no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_inbox_subscription_hears_a_transfer_until_unsubscribed() {
    let m = Mount::new(true);
    let root = m.root().to_path_buf();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && echo notes > notes.md && echo x > other.md",
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let bob = connect_with(&root, "bob", Updates(tx)).await;
    assert_eq!(resource_json(&bob, INBOX).await, json!([]));
    bob.subscribe(SubscribeRequestParams::new(INBOX))
        .await
        .expect("subscribe to the inbox");

    // changes that are not bob's inbox's (another file written, a handoff to carol) are
    // heard of not at all: not for the inbox, and not for the records (not subscribed)
    assert!(cli(&m, Some("carol"), &["register"]).ok());
    sh_ok(&m, Some("alice"), "echo y >> other.md");
    let r = cli(
        &m,
        Some("alice"),
        &["transfer", "--to", "carol", "other.md"],
    );
    assert!(r.ok(), "{}", r.show());
    let seen = wait_event(&m, Duration::from_secs(10), |e| {
        e["event"] == "transfer" && e["path"] == "other.md"
    });
    assert!(seen.is_some(), "the transfer to carol is not in the log");
    if let Some(u) = next_update(&mut rx, Duration::from_millis(1000)).await {
        panic!("a notification for a change that is not bob's inbox: {u}");
    }

    let r = cli(
        &m,
        Some("alice"),
        &["transfer", "--to", "bob", "--note", "plan it", "plan.md"],
    );
    assert!(r.ok(), "{}", r.show());
    let t0 = Instant::now();
    let uri = next_update(&mut rx, Duration::from_secs(20))
        .await
        .expect("notifications/resources/updated within 20 s of the transfer");
    assert_eq!(uri, INBOX);
    eprintln!("heard the transfer after {:?}", t0.elapsed());
    let got = resource_json(&bob, INBOX).await;
    assert_eq!(got[0]["path"], "plan.md", "{got}");
    assert_eq!(got[0]["note"], "plan it", "{got}");
    assert_eq!(got[0]["giver"], "alice", "{got}");
    // one burst, one notification: nothing else queued for it (and never the records)
    if let Some(u) = next_update(&mut rx, Duration::from_millis(800)).await {
        panic!("a second notification for the same transfer: {u}");
    }

    // bob declines: the inbox changes again, and is heard again
    let r = cli(&m, Some("bob"), &["decline", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    let uri = next_update(&mut rx, Duration::from_secs(20))
        .await
        .expect("an update after the decline");
    assert_eq!(uri, INBOX);
    assert_eq!(resource_json(&bob, INBOX).await, json!([]));

    bob.unsubscribe(UnsubscribeRequestParams::new(INBOX))
        .await
        .expect("unsubscribe");
    let r = cli(&m, Some("alice"), &["transfer", "--to", "bob", "notes.md"]);
    assert!(r.ok(), "{}", r.show());
    // the transfer is in the log; then a grace of several poll periods of the server
    let seen = wait_event(&m, Duration::from_secs(10), |e| {
        e["event"] == "transfer" && e["path"] == "notes.md"
    });
    assert!(seen.is_some(), "the second transfer is not in the log");
    if let Some(u) = next_update(&mut rx, Duration::from_millis(1500)).await {
        panic!("a notification after the unsubscribe: {u}");
    }
    let got = resource_json(&bob, INBOX).await;
    assert_eq!(got[0]["path"], "notes.md", "{got}");

    // subscribed again (the follower stopped with the last subscription: it starts again)
    bob.subscribe(SubscribeRequestParams::new(INBOX))
        .await
        .expect("subscribe again");
    let r = cli(&m, Some("alice"), &["withdraw", "notes.md"]);
    assert!(r.ok(), "{}", r.show());
    let uri = next_update(&mut rx, Duration::from_secs(20))
        .await
        .expect("an update after the withdraw");
    assert_eq!(uri, INBOX);
    assert_eq!(resource_json(&bob, INBOX).await, json!([]));
    bob.cancel().await.unwrap();
}

/// A subscription to the records hears a record change status (an accept) and end by a
/// commit of its path (no record event: the version moves), each as one update, and the
/// read after each shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_records_subscription_hears_an_accept_and_the_commit_that_ends_it() {
    let m = Mount::new(true);
    let root = m.root().to_path_buf();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    let r = cli(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let alice = connect_with(&root, "alice", Updates(tx)).await;
    alice
        .subscribe(SubscribeRequestParams::new(RECORDS))
        .await
        .expect("subscribe to the records");
    assert_eq!(resource_json(&alice, RECORDS).await[0]["status"], "pending");
    // bob's first open (a read) is logged, `handoff_seen`, before the accept: the commit
    // below then comes with no record event at all
    sh_ok(&m, Some("bob"), "cat plan.md");
    let seen = wait_event(&m, Duration::from_secs(10), |e| {
        e["event"] == "handoff_seen" && e["path"] == "plan.md"
    });
    assert!(seen.is_some(), "no handoff_seen for bob's read");

    let r = cli(&m, Some("bob"), &["accept", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    let uri = next_update(&mut rx, Duration::from_secs(20))
        .await
        .expect("an update after the accept");
    assert_eq!(uri, RECORDS);
    let got = resource_json(&alice, RECORDS).await;
    assert_eq!(got[0]["status"], "completed", "{got}");
    // whatever the read and the accept still bring is heard now, not after the commit
    while let Some(u) = next_update(&mut rx, Duration::from_millis(500)).await {
        assert_eq!(u, RECORDS);
    }

    sh_ok(&m, Some("bob"), "echo done >> plan.md");
    let uri = next_update(&mut rx, Duration::from_secs(20))
        .await
        .expect("an update after bob's commit");
    assert_eq!(uri, RECORDS);
    assert_eq!(resource_json(&alice, RECORDS).await, json!([]));

    // a transfer of three files at once: a burst of three events, one update
    sh_ok(
        &m,
        Some("alice"),
        "echo a > a.md && echo b > b.md && echo c > c.md",
    );
    let r = cli(
        &m,
        Some("alice"),
        &["transfer", "--to", "bob", "a.md", "b.md", "c.md"],
    );
    assert!(r.ok(), "{}", r.show());
    let uri = next_update(&mut rx, Duration::from_secs(20))
        .await
        .expect("an update after the transfer of three files");
    assert_eq!(uri, RECORDS);
    let seen = wait_event(&m, Duration::from_secs(10), |e| {
        e["event"] == "transfer" && e["path"] == "c.md"
    });
    assert!(seen.is_some(), "the transfer of c.md is not in the log");
    if let Some(u) = next_update(&mut rx, Duration::from_millis(800)).await {
        panic!("a second update for one transfer of three files: {u}");
    }
    let got = resource_json(&alice, RECORDS).await;
    assert_eq!(got.as_array().map(Vec::len), Some(3), "{got}");
    alice.cancel().await.unwrap();
}

/// On the wire: the capability is `resources: {subscribe: true, listChanged: false}`, and a
/// server with a subscription (its follower running) still ends when its input does.
#[test]
fn mcp_with_a_subscription_ends_with_its_input() {
    let m = Mount::new(true);
    let mut s = Raw::start(m.root(), "alice");
    assert_eq!(
        s.init["result"]["capabilities"]["resources"],
        json!({"subscribe": true, "listChanged": false}),
        "{}",
        s.init
    );
    s.send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe",
        "params": {"uri": "coherent://records"}}),
    );
    let r = s
        .reply(Duration::from_secs(20))
        .expect("subscribe answered");
    assert_eq!(r["id"], 2, "{r}");
    assert_eq!(r["result"], json!({}), "{r}");
    s.close_input();
    let ended = common::wait_child(&mut s.child, Duration::from_secs(10));
    assert!(ended.is_some(), "the server did not end with its input");
}

// ---- protocol revisions and `wait` as a task -------------------------------------------

/// A client that asks for a protocol revision of its choice, declares tasks, and passes on
/// every `notifications/tasks/status` it hears (as JSON).
struct TaskClient {
    info: ClientInfo,
    status: tokio::sync::mpsc::UnboundedSender<Value>,
}

impl ClientHandler for TaskClient {
    fn get_info(&self) -> ClientInfo {
        self.info.clone()
    }

    async fn on_task_status(
        &self,
        params: TaskStatusNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.status.send(serde_json::to_value(&params).unwrap());
    }
}

/// [`TaskClient`] asking for `version` at `initialize`, with the task statuses it hears.
async fn connect_version(
    dir: &Path,
    who: &str,
    version: &str,
) -> (
    RunningService<RoleClient, TaskClient>,
    tokio::sync::mpsc::UnboundedReceiver<Value>,
) {
    let version: ProtocolVersion = serde_json::from_value(json!(version)).unwrap();
    let mut caps = ClientCapabilities::default();
    caps.tasks = Some(TasksCapability::client_default());
    let info = ClientInfo::new(caps, Implementation::new("coherent-tests", "0"))
        .with_protocol_version(version);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let c = connect_with(dir, who, TaskClient { info, status: tx }).await;
    (c, rx)
}

/// One request as the client sends it, its result as JSON (a task request's result types
/// share shapes, so the JSON is what is compared), or the protocol error.
async fn request<H: ClientHandler>(
    c: &RunningService<RoleClient, H>,
    req: ClientRequest,
) -> Result<Value, ErrorData> {
    match tokio::time::timeout(Duration::from_secs(30), c.send_request(req))
        .await
        .expect("an answer within 30 s")
    {
        Ok(r) => Ok(serde_json::to_value(&r).unwrap()),
        Err(ServiceError::McpError(e)) => Err(e),
        Err(e) => panic!("not a protocol answer: {e}"),
    }
}

fn task_call(args: Value) -> ClientRequest {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let mut p = CallToolRequestParams::new("wait").with_arguments(args);
    p.task = Some(TaskMetadata::new().with_ttl(60_000));
    ClientRequest::CallToolRequest(Request::new(p))
}

fn task_get(id: &str) -> ClientRequest {
    ClientRequest::GetTaskRequest(Request::new(GetTaskParams::new(id)))
}

fn task_result(id: &str) -> ClientRequest {
    ClientRequest::GetTaskPayloadRequest(Request::new(GetTaskPayloadParams::new(id)))
}

fn task_cancel(id: &str) -> ClientRequest {
    ClientRequest::CancelTaskRequest(Request::new(CancelTaskParams::new(id)))
}

/// Until the daemon's log has more than `before` pending waits.
async fn wait_pending(m: &Mount, before: usize) {
    let t = Instant::now();
    while m.log().matches("wait pending").count() <= before {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the wait never became pending"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The server speaks 2026-07-28 and 2025-11-25, each to the client that asks for it, and
/// answers a revision it does not know with its latest, 2026-07-28. Under each: the tools
/// are listed (`wait` may run as a task, the others may not), `whoami` answers, and a task
/// call of a tool that takes none is refused -32602.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_negotiates_2026_07_28_and_2025_11_25() {
    let m = Mount::new(true);
    let root = m.root().to_path_buf();
    for (asked, served) in [
        ("2026-07-28", "2026-07-28"),
        ("2025-11-25", "2025-11-25"),
        ("2099-01-01", "2026-07-28"),
    ] {
        let (c, _) = connect_version(&root, "alice", asked).await;
        let info = c.peer_info().expect("server info").clone();
        assert_eq!(info.protocol_version.as_str(), served, "asked {asked}");
        let tasks = info
            .capabilities
            .tasks
            .clone()
            .expect("the tasks capability");
        assert!(
            tasks.supports_tools_call() && tasks.supports_cancel(),
            "{tasks:?}"
        );
        let tools = c.list_all_tools().await.expect("tools/list");
        let mut names: Vec<&str> = tools.iter().map(|t| &*t.name).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "accept", "decline", "diff", "inbox", "log", "show", "status", "transfer", "undo",
                "wait", "whoami", "withdraw"
            ],
            "asked {asked}"
        );
        for t in &tools {
            let want = if t.name == "wait" {
                TaskSupport::Optional
            } else {
                TaskSupport::Forbidden
            };
            assert_eq!(t.task_support(), want, "{}: asked {asked}", t.name);
        }
        let v = ok("whoami", &call(&c, "whoami", json!({})).await);
        assert_eq!(v["session"], "alice", "asked {asked}: {v}");
        let mut p = CallToolRequestParams::new("whoami");
        p.task = Some(TaskMetadata::new());
        let e = request(&c, ClientRequest::CallToolRequest(Request::new(p)))
            .await
            .expect_err("whoami as a task");
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "asked {asked}: {e:?}");
        // the revision is in force: an unknown resource is -32602 from 2026-07-28 on
        // (SEP-2164), -32002 before
        let e = match read_resource(&c, "coherent://nothing").await {
            Err(ServiceError::McpError(e)) => e,
            other => panic!("asked {asked}: an unknown resource read: {other:?}"),
        };
        let want = if served == "2026-07-28" {
            -32602
        } else {
            -32002
        };
        assert_eq!(e.code.0, want, "asked {asked}: {e:?}");
        c.cancel().await.unwrap();
    }
}

/// `wait` as a task, under both revisions: the call answers at once with a working task;
/// `tasks/result` blocks until another session accepts, then gives the wait's result (the
/// record completed) naming the task; the task is then completed and cannot be cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_wait_as_a_task_reaches_its_result() {
    let m = Mount::builder().env("RUST_LOG", "debug").start();
    let root = m.root().to_path_buf();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    for version in ["2026-07-28", "2025-11-25"] {
        let file = format!("plan-{version}.md");
        sh_ok(&m, Some("alice"), &format!("echo plan > {file}"));
        let r = cli(&m, Some("alice"), &["transfer", "--to", "bob", &file]);
        assert!(r.ok(), "{}", r.show());
        let (alice, mut heard) = connect_version(&root, "alice", version).await;
        let pending = m.log().matches("wait pending").count();
        let t0 = Instant::now();
        let created = request(
            &alice,
            task_call(json!({"path": file, "until": "accepted", "timeout_s": 60})),
        )
        .await
        .expect("a task");
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{version}: the call blocked"
        );
        assert_eq!(created["task"]["status"], "working", "{version}: {created}");
        let id = created["task"]["taskId"]
            .as_str()
            .expect("a task id")
            .to_string();
        let got = request(&alice, task_get(&id)).await.expect("tasks/get");
        assert_eq!(got["status"], "working", "{version}: {got}");
        assert_eq!(got["taskId"], json!(id), "{version}: {got}");

        // tasks/result blocks until the wait ends; the accept ends it
        let result = request(&alice, task_result(&id));
        let accept = async {
            wait_pending(&m, pending).await;
            let r = cli(&m, Some("bob"), &["accept", &file]);
            assert!(r.ok(), "{}", r.show());
        };
        let (result, ()) = tokio::join!(result, accept);
        let result = result.expect("tasks/result");
        assert_ne!(result["isError"], true, "{version}: {result}");
        let s = &result["structuredContent"];
        assert_eq!(s["reached"], true, "{version}: {result}");
        assert_eq!(s["record"]["status"], "completed", "{version}: {result}");
        assert_eq!(
            result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
            json!(id),
            "{version}: {result}"
        );
        let got = request(&alice, task_get(&id)).await.expect("tasks/get");
        assert_eq!(got["status"], "completed", "{version}: {got}");
        // and the client heard it end, without polling
        let note = tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await
            .expect("a task status notification within 10 s")
            .expect("the client is there");
        assert_eq!(note["taskId"], json!(id), "{version}: {note}");
        assert_eq!(note["status"], "completed", "{version}: {note}");
        let listed = request(&alice, ClientRequest::ListTasksRequest(Default::default()))
            .await
            .expect("tasks/list");
        assert!(
            listed["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["taskId"] == json!(id)),
            "{version}: {listed}"
        );
        let e = request(&alice, task_cancel(&id))
            .await
            .expect_err("cancel a completed task");
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{version}: {e:?}");
        alice.cancel().await.unwrap();
    }
}

/// A cancelled task ends the server's wait: `tasks/cancel` answers `cancelled`, the task
/// stays so and has no result, no new wait reaches the volume after it (one ctl step may
/// be in flight), the record is untouched and the server serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_wait_task_cancel_ends_the_wait() {
    let m = Mount::builder().env("RUST_LOG", "debug").start();
    let root = m.root().to_path_buf();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    assert!(cli(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]).ok());
    let (alice, _) = connect_version(&root, "alice", "2026-07-28").await;
    let pending = m.log().matches("wait pending").count();
    let created = request(
        &alice,
        task_call(json!({"path": "plan.md", "until": "accepted", "timeout_s": 120})),
    )
    .await
    .expect("a task");
    let id = created["task"]["taskId"].as_str().unwrap().to_string();
    wait_pending(&m, pending).await;
    let blocked = request(&alice, task_result(&id));
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        request(&alice, task_cancel(&id)).await
    };
    let (blocked, cancelled) = tokio::join!(blocked, cancel);
    let cancelled = cancelled.expect("tasks/cancel");
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    // the blocked tasks/result ends with the cancel, without a result
    let e = blocked.expect_err("a cancelled task has no result");
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{e:?}");
    let at_cancel = m.log().matches("wait pending").count();
    let got = request(&alice, task_get(&id)).await.expect("tasks/get");
    assert_eq!(got["status"], "cancelled", "{got}");
    // a running wait asks the volume again every 5 s (its ctl step): over 12 s a live one
    // would have asked twice more
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = m.log().matches("wait pending").count();
    assert!(
        after <= at_cancel + 1,
        "the wait went on after the cancel: {at_cancel} -> {after}"
    );
    let got = request(&alice, task_get(&id)).await.expect("tasks/get");
    assert_eq!(got["status"], "cancelled", "{got}");
    let r = cli(&m, Some("alice"), &["status", "--json", "plan.md"]);
    assert!(r.out.contains("pending"), "{}", r.show());
    let v = ok("whoami", &call(&alice, "whoami", json!({})).await);
    assert_eq!(v["session"], "alice", "{v}");
    alice.cancel().await.unwrap();
}

/// Issue 38, item 3: Codex starts MCP servers with a filtered environment, so the server
/// can start without `COHERENT_SESSION` though its client runs as a session. It takes the
/// tag from its client process: `whoami` and `inbox` answer as bob, not as the user's
/// anonymous `uid:N` (which would say no handoff waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_started_with_a_filtered_environment_answers_as_its_clients_session() {
    let m = Mount::new(false);
    let root = m.root().to_path_buf();
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    let r = cli(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    // the client (a shell standing for Codex) is bob; the server's own environment has
    // no tag (`; exit` keeps the shell from exec-ing the server: it stays the parent)
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "env -u COHERENT_SESSION -u CLAUDE_CODE_SESSION_ID '{CLI}' mcp; exit $?"
        ))
        .current_dir(&root);
    for t in TAGS {
        cmd.env_remove(t);
    }
    cmd.env("COHERENT_SESSION", "bob");
    let transport = TokioChildProcess::new(cmd).expect("spawn");
    let c = tokio::time::timeout(Duration::from_secs(20), ().serve(transport))
        .await
        .expect("initialize within 20 s")
        .expect("initialize");
    let me = ok("whoami", &call(&c, "whoami", json!({})).await);
    assert_eq!(me["session"], "bob", "{me}");
    let inbox = ok("inbox", &call(&c, "inbox", json!({})).await);
    let paths: Vec<&str> = inbox["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["plan.md"], "{inbox}");
}
