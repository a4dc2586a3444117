//! The MCP resources of `coherent mcp`: the live handoff records (`coherent://records`, the
//! `live` records of `.coherent/status` as this session sees them) and this session's inbox
//! (`coherent://inbox`, `.coherent/inbox`), both JSON.
//!
//! A client may subscribe to either. While anything is subscribed, one thread follows
//! `.coherent/events` from one open handle (which follows the log across compactions, as
//! `coherent watch` does). The volume offers no blocking read of the log, so the thread
//! polls the size and mtime of that handle (an `fstat`, never `status`) and reads the new
//! lines when they move. An event that can change a subscribed resource (a record event, or
//! a change of a path that the resource shows a record for) makes the thread read that
//! resource again; if its content differs from what the client was last told, the client
//! gets `notifications/resources/updated` for its URI. A burst of events is one read and at
//! most one notification per resource. Nothing is sent for a resource that is not
//! subscribed, and nothing after its `resources/unsubscribe` has been answered: the check
//! and the send are made under the same lock as the unsubscribe.

use crate::{locate_cwd, Fail};
use rmcp::model::{
    ErrorCode, ListResourcesResult, ReadResourceResult, Resource, ResourceContents,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::Peer;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex};

pub const RECORDS_URI: &str = "coherent://records";
pub const INBOX_URI: &str = "coherent://inbox";
const MIME: &str = "application/json";

/// How often the follower looks at the size of the log while it is quiet.
const POLL: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Res {
    Records,
    Inbox,
}

impl Res {
    pub fn from_uri(uri: &str) -> Option<Res> {
        match uri {
            RECORDS_URI => Some(Res::Records),
            INBOX_URI => Some(Res::Inbox),
            _ => None,
        }
    }

    pub fn uri(self) -> &'static str {
        match self {
            Res::Records => RECORDS_URI,
            Res::Inbox => INBOX_URI,
        }
    }
}

pub fn list() -> ListResourcesResult {
    let records = Resource::new(RECORDS_URI, "records")
        .with_title("Live handoff records")
        .with_description(
            "The live handoff records of the volume that this session may see, as JSON (an \
             array of records, as `live` in .coherent/status): path, giver, successor, \
             version_at_transfer, status, note, ... Subscribe to hear when it changes.",
        )
        .with_mime_type(MIME);
    let inbox = Resource::new(INBOX_URI, "inbox")
        .with_title("This session's inbox")
        .with_description(
            "Files handed to this session that are still live, and open offers to anyone, \
             with the givers' notes, as JSON (an array of records, as .coherent/inbox). \
             Subscribe to hear when a file is handed to this session or a handoff to it ends.",
        )
        .with_mime_type(MIME);
    ListResourcesResult::with_all_items(vec![records, inbox])
}

pub fn not_found(uri: &str) -> McpError {
    McpError::new(
        ErrorCode::RESOURCE_NOT_FOUND,
        format!("resource not found: {uri} (this server has {RECORDS_URI} and {INBOX_URI})"),
        Some(json!({ "uri": uri })),
    )
}

fn no_volume(f: Fail) -> McpError {
    McpError::internal_error(f.message.trim_start_matches("coherent: ").to_string(), None)
}

/// A resource's content now: its JSON text, and the paths of the records in it.
pub struct Content {
    pub text: String,
    paths: HashSet<String>,
}

fn read_json(root: &Path, file: &str) -> Result<Value, String> {
    let path = root.join(".coherent").join(file);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(text.trim()).map_err(|e| format!("{} is not JSON: {e}", path.display()))
}

/// Read `res` from the volume at `root`, as the server's own session sees it.
pub fn content(root: &Path, res: Res) -> Result<Content, String> {
    let records = match res {
        Res::Inbox => read_json(root, "inbox")?,
        Res::Records => read_json(root, "status")?["live"].take(),
    };
    let Value::Array(list) = &records else {
        return Err(format!("{}: not a list of records: {records}", res.uri()));
    };
    let paths = list
        .iter()
        .filter_map(|r| r["path"].as_str().map(String::from))
        .collect();
    Ok(Content {
        text: coherent_wire::names::json_text(&records),
        paths,
    })
}

/// `resources/read`, off the async runtime.
pub fn read(uri: &str) -> Result<ReadResourceResult, McpError> {
    let res = Res::from_uri(uri).ok_or_else(|| not_found(uri))?;
    let root = locate_cwd().map_err(no_volume)?;
    let c = content(&root, res).map_err(|e| McpError::internal_error(e, None))?;
    Ok(ReadResourceResult::new(vec![ResourceContents::text(
        c.text, uri,
    )
    .with_mime_type(MIME)]))
}

/// The subscriptions of one client, with what it was last told of each resource.
#[derive(Default)]
pub struct Subs {
    known: HashMap<Res, Content>,
    /// A follower thread runs (it ends, and clears this, when nothing is subscribed).
    following: bool,
    /// To the task that sends the notifications; made at the first subscribe.
    notify: Option<mpsc::UnboundedSender<Res>>,
}

pub type Shared = Arc<Mutex<Subs>>;

/// `resources/subscribe`: the content now is what the client knows from here on (it was
/// read before the answer, so a change after it is a change the client hears of).
pub async fn subscribe(subs: &Shared, uri: &str, peer: &Peer<RoleServer>) -> Result<(), McpError> {
    let res = Res::from_uri(uri).ok_or_else(|| not_found(uri))?;
    let mut g = subs.lock().await;
    let joined = |e: tokio::task::JoinError| McpError::internal_error(e.to_string(), None);
    // a follower not yet running starts at the end of the log as it is now, before the
    // content is read: every later event is one it sees
    let start = if g.following {
        None
    } else {
        let (root, log) = tokio::task::spawn_blocking(|| -> Result<_, McpError> {
            let root = locate_cwd().map_err(no_volume)?;
            let log = Log::open(&root).map_err(|e| McpError::internal_error(e, None))?;
            Ok((root, log))
        })
        .await
        .map_err(joined)??;
        Some((root, log))
    };
    let c = tokio::task::spawn_blocking(move || -> Result<Content, McpError> {
        let root = locate_cwd().map_err(no_volume)?;
        content(&root, res).map_err(|e| McpError::internal_error(e, None))
    })
    .await
    .map_err(joined)??;
    g.known.insert(res, c);
    let tx = match &g.notify {
        Some(tx) => tx.clone(),
        None => {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(notifier(subs.clone(), peer.clone(), rx));
            g.notify = Some(tx.clone());
            tx
        }
    };
    if let Some((root, log)) = start {
        // the thread takes the lock only once this subscribe has let it go
        let shared = subs.clone();
        let spawned = std::thread::Builder::new()
            .name("mcp-follow".into())
            .spawn(move || follow(root, log, shared, tx));
        if let Err(e) = spawned {
            g.known.remove(&res);
            let msg = format!("cannot follow the log: {e}");
            return Err(McpError::internal_error(msg, None));
        }
        g.following = true;
    }
    Ok(())
}

/// `resources/unsubscribe`: once answered, nothing more is sent for the URI.
pub async fn unsubscribe(subs: &Shared, uri: &str) -> Result<(), McpError> {
    let res = Res::from_uri(uri).ok_or_else(|| not_found(uri))?;
    subs.lock().await.known.remove(&res);
    Ok(())
}

/// Sends `notifications/resources/updated`, for resources still subscribed, coalescing
/// what is queued.
async fn notifier(subs: Shared, peer: Peer<RoleServer>, mut rx: mpsc::UnboundedReceiver<Res>) {
    while let Some(first) = rx.recv().await {
        let mut due = vec![first];
        while let Ok(r) = rx.try_recv() {
            if !due.contains(&r) {
                due.push(r);
            }
        }
        let g = subs.lock().await;
        for r in due {
            if g.known.contains_key(&r) {
                let p = ResourceUpdatedNotificationParam::new(r.uri());
                if peer.notify_resource_updated(p).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// `.coherent/events`, open, read up to its end.
pub struct Log {
    file: File,
    pending: Vec<u8>,
    seen: (u64, i64, i64),
}

impl Log {
    fn open(root: &Path) -> Result<Log, String> {
        let path = root.join(".coherent/events");
        let file = File::open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let mut log = Log {
            file,
            pending: Vec::new(),
            seen: (0, 0, 0),
        };
        log.seen = log
            .stamp()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        log.lines()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(log)
    }

    /// Size and mtime of the log: they move when it grows or is compacted.
    fn stamp(&self) -> std::io::Result<(u64, i64, i64)> {
        let m = self.file.metadata()?;
        Ok((m.size(), m.mtime(), m.mtime_nsec()))
    }

    /// The whole lines readable now.
    fn lines(&mut self) -> std::io::Result<Vec<Vec<u8>>> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut out = Vec::new();
        loop {
            let n = match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.pending.extend_from_slice(&buf[..n]);
            while let Some(nl) = self.pending.iter().position(|&c| c == b'\n') {
                out.push(self.pending.drain(..=nl).collect());
            }
        }
        Ok(out)
    }

    /// Wait until the log moves; false when nothing is subscribed any more (the follower
    /// is then marked stopped, under the lock a subscribe checks it under) or the log
    /// cannot be read.
    fn wait(&mut self, subs: &Shared) -> bool {
        loop {
            std::thread::sleep(POLL);
            {
                let mut g = subs.blocking_lock();
                if g.known.is_empty() {
                    g.following = false;
                    return false;
                }
            }
            match self.stamp() {
                Ok(s) if s != self.seen => {
                    self.seen = s;
                    return true;
                }
                Ok(_) => {}
                Err(_) => {
                    subs.blocking_lock().following = false;
                    return false;
                }
            }
        }
    }
}

/// What one event line can change.
#[derive(Debug, PartialEq)]
enum Touches {
    Nothing,
    /// Any record (a record event, or a line that is not understood).
    Records,
    /// These paths (and what is below them): a record of one of them may end.
    Paths(Vec<String>),
}

fn touches(line: &[u8]) -> Touches {
    let Ok(ev) = serde_json::from_slice::<Value>(line) else {
        return Touches::Records;
    };
    match ev["event"].as_str() {
        Some("session_seen" | "denied" | "stale_write") => Touches::Nothing,
        Some(
            "transfer" | "handoff_seen" | "accept" | "decline" | "withdraw" | "completed"
            | "overtaken" | "superseded" | "evict",
        ) => Touches::Records,
        // commit, external_change, acquire, release, reclaim, and what is new: the records
        // of their paths (a rename: also of its source)
        _ => {
            let paths: Vec<String> = ["path", "from"]
                .iter()
                .filter_map(|k| ev[*k].as_str().map(String::from))
                .collect();
            if paths.is_empty() {
                Touches::Records
            } else {
                Touches::Paths(paths)
            }
        }
    }
}

/// Does a change of `changed` touch the record of `shown` (the path itself, or a directory
/// above it)?
fn under(shown: &str, changed: &str) -> bool {
    shown == changed
        || (shown.len() > changed.len()
            && shown.starts_with(changed)
            && shown.as_bytes()[changed.len()] == b'/')
}

/// The follower thread: reads the new events, re-reads the resources they can change, and
/// queues a notification for each whose content changed.
fn follow(root: PathBuf, mut log: Log, subs: Shared, tx: mpsc::UnboundedSender<Res>) {
    while let Ok(lines) = log.lines() {
        let mut all = false;
        let mut paths: Vec<String> = Vec::new();
        for line in &lines {
            match touches(line) {
                Touches::Nothing => {}
                Touches::Records => all = true,
                Touches::Paths(p) => paths.extend(p),
            }
        }
        if all || !paths.is_empty() {
            let due: Vec<Res> = {
                let g = subs.blocking_lock();
                g.known
                    .iter()
                    .filter(|(_, c)| {
                        all || c.paths.iter().any(|s| paths.iter().any(|p| under(s, p)))
                    })
                    .map(|(r, _)| *r)
                    .collect()
            };
            for r in due {
                let Ok(now) = content(&root, r) else { continue };
                let mut g = subs.blocking_lock();
                let Some(known) = g.known.get_mut(&r) else {
                    continue;
                };
                if known.text != now.text {
                    *known = now;
                    let _ = tx.send(r);
                }
            }
        }
        if !log.wait(&subs) {
            return;
        }
    }
    // the log cannot be read (the volume went away): a later subscribe starts again
    subs.blocking_lock().following = false;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_event_touches() {
        assert_eq!(
            touches(br#"{"event":"transfer","path":"a"}"#),
            Touches::Records
        );
        assert_eq!(
            touches(br#"{"event":"session_seen","session":"a"}"#),
            Touches::Nothing
        );
        assert_eq!(
            touches(br#"{"event":"commit","path":"b","from":"a"}"#),
            Touches::Paths(vec!["b".into(), "a".into()])
        );
        assert_eq!(touches(b"not json"), Touches::Records);
        assert!(under("d/x", "d"));
        assert!(under("d", "d"));
        assert!(!under("dx", "d"));
        assert!(!under("d", "d/x"));
    }
}
