//! `coherent mcp` through a real MCP client: rmcp's client spawns the server as a child
//! process in a real mount, tagged with a session, and speaks MCP over its stdio.

#[path = "common/coherent.rs"]
mod coherent;
mod common;

use coherent::{cli, sh, sh_ok, Root, CLI, TAGS};
use common::Mount;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

type Client = RunningService<RoleClient, ()>;

/// `coherent mcp` started in `dir` as session `who`, with an initialized client.
async fn connect(dir: &Path, who: &str) -> Client {
    let mut cmd = tokio::process::Command::new(CLI);
    cmd.arg("mcp").current_dir(dir);
    for t in TAGS {
        cmd.env_remove(t);
    }
    cmd.env("COHERENT_SESSION", who);
    let transport = TokioChildProcess::new(cmd).expect("spawn coherent mcp");
    tokio::time::timeout(Duration::from_secs(20), ().serve(transport))
        .await
        .expect("initialize within 20 s")
        .expect("initialize")
}

async fn call(c: &Client, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
    tokio::time::timeout(Duration::from_secs(30), c.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("{tool} answered within 30 s"))
        .unwrap_or_else(|e| panic!("{tool}: protocol error {e}"))
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
        ["accept", "decline", "inbox", "status", "transfer", "wait", "whoami", "withdraw"]
    );

    let me = ok("whoami", &call(&alice, "whoami", json!({})).await);
    assert_eq!(me["session"], "alice", "{me}");

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

    // withdraw: of a declined record refused (§5: a record no longer live answers
    // handoff_not_live), of a live one done
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
