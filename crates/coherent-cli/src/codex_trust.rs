//! Codex runs a hook only once the user has trusted its definition: it keeps, per hook,
//! the hash of the definition the user trusted (`[hooks.state."KEY"] trusted_hash`), and
//! skips a hook whose current hash differs, without a word (`codex exec` included). Both
//! the hash and the write are Codex's own: its app server (`codex app-server`, JSON-RPC
//! over stdio) lists each hook with its `key`, `currentHash` and `trustStatus`
//! (`hooks/list`), and writes configuration (`config/batchWrite`) as its own `/hooks`
//! screen does. coherent computes no hash of its own: a Codex that hashes otherwise is
//! still answered right.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the app server may take to answer one request.
const TIMEOUT: Duration = Duration::from_secs(20);

/// One hook as Codex lists it.
#[derive(Debug, Clone)]
pub struct Hook {
    pub key: String,
    /// `preToolUse`, `sessionEnd`, ...
    pub event: String,
    pub command: String,
    pub current_hash: String,
    /// `trusted`, `untrusted`, `modified` (trusted once, changed since), or what a later
    /// Codex says.
    pub trust: String,
}

/// A running `codex app-server`, initialized.
struct Server {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<Value>,
    next: u64,
}

impl Server {
    fn start(codex: &Path) -> Result<Server, String> {
        let mut child = Command::new(codex)
            .arg("app-server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start `{} app-server` ({e})", codex.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        let mut s = Server {
            child,
            stdin,
            lines,
            next: 1,
        };
        s.call(
            "initialize",
            json!({"clientInfo": {"name": "coherent", "version": env!("CARGO_PKG_VERSION")}}),
        )?;
        s.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}))?;
        Ok(s)
    }

    fn send(&mut self, v: Value) -> Result<(), String> {
        writeln!(self.stdin, "{v}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("the app server went away ({e})"))
    }

    /// A request and its result (an error reply is an error).
    fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let end = Instant::now() + TIMEOUT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let v = self
                .lines
                .recv_timeout(left)
                .map_err(|_| format!("no answer to `{method}` within {TIMEOUT:?}"))?;
            if v.get("id") != Some(&json!(id)) {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Err(format!("`{method}` failed: {e}"));
            }
            return Ok(v.get("result").cloned().unwrap_or(Value::Null));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn list_with(s: &mut Server, cwd: &Path) -> Result<Vec<Hook>, String> {
    let r = s.call("hooks/list", json!({"cwds": [cwd]}))?;
    let mut out = Vec::new();
    for entry in r["data"].as_array().into_iter().flatten() {
        for h in entry["hooks"].as_array().into_iter().flatten() {
            let f = |k: &str| h[k].as_str().unwrap_or("").to_string();
            if h["handlerType"] != "command" {
                continue;
            }
            out.push(Hook {
                key: f("key"),
                event: f("eventName"),
                command: f("command"),
                current_hash: f("currentHash"),
                trust: f("trustStatus"),
            });
        }
    }
    Ok(out)
}

/// The hooks Codex would run in `cwd`, as it lists them.
pub fn list(codex: &Path, cwd: &Path) -> Result<Vec<Hook>, String> {
    let mut s = Server::start(codex)?;
    list_with(&mut s, cwd)
}

/// Trust the hooks `ours` picks among those Codex lists for `cwd` and has not trusted in
/// their current form, writing Codex's own hash through Codex; then list again. The hooks
/// of ours as Codex now lists them.
pub fn trust(codex: &Path, cwd: &Path, ours: impl Fn(&Hook) -> bool) -> Result<Vec<Hook>, String> {
    let mut s = Server::start(codex)?;
    let hooks: Vec<Hook> = list_with(&mut s, cwd)?.into_iter().filter(&ours).collect();
    let state: serde_json::Map<String, Value> = hooks
        .iter()
        .filter(|h| h.trust != "trusted" && !h.key.is_empty() && !h.current_hash.is_empty())
        .map(|h| (h.key.clone(), json!({"trusted_hash": h.current_hash})))
        .collect();
    if !state.is_empty() {
        s.call(
            "config/batchWrite",
            json!({"edits": [{"keyPath": "hooks.state", "value": state,
                              "mergeStrategy": "upsert"}]}),
        )?;
    }
    Ok(list_with(&mut s, cwd)?.into_iter().filter(ours).collect())
}
