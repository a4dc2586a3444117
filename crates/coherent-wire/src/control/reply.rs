//! Replies read back from `.coherent/ctl`: always one JSON object with `ok`, `verb` and
//! `message` (docs/design.md#control-surface), and [`CtlHandle`], the per-open-handle reply buffer.

use super::describe::{describe_records, whoami_text};
use super::request::{parse_request, Request, RequestError, Verb};
use crate::error::{Reason, Refusal};
use crate::session::SessionInfo;
use serde_json::{json, Map, Value};

impl RequestError {
    /// The refusal reply for this error.
    pub fn reply(&self) -> Reply {
        Reply::refused(self.verb, &self.refusal, self.path.as_deref())
    }
}

/// The reply to one request: always one JSON object with `ok`, `verb` and `message`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    body: Value,
    /// The errno a refused request fails its `write(2)` with, set from the typed refusal
    /// when the reply is built (never read back out of `body`); None on success.
    errno: Option<i32>,
}

impl Reply {
    /// A success with verb-specific `fields` (they cannot override `ok`, `verb`, `message`).
    pub fn ok(verb: Verb, fields: Map<String, Value>, message: impl Into<String>) -> Reply {
        let mut m = Map::new();
        m.insert("ok".into(), true.into());
        m.insert("verb".into(), verb.as_str().into());
        for (k, v) in fields {
            if !matches!(k.as_str(), "ok" | "verb" | "message") {
                m.insert(k, v);
            }
        }
        m.insert("message".into(), message.into().into());
        Reply {
            body: Value::Object(m),
            errno: None,
        }
    }

    /// transfer/accept/decline/withdraw: the records the verb produced (engine record JSON).
    /// The message is one line built from them with `describe_record`.
    pub fn records(verb: Verb, records: Vec<Value>) -> Reply {
        let message = describe_records(verb, &records);
        let mut m = Map::new();
        m.insert("records".into(), Value::Array(records));
        Reply::ok(verb, m, message)
    }

    /// status: the engine's status object, nested under `"status"`.
    pub fn status(status: Value, message: impl Into<String>) -> Reply {
        let mut m = Map::new();
        m.insert("status".into(), status);
        Reply::ok(Verb::Status, m, message)
    }

    /// register: `session`, `agent`, `via` of the registered session.
    pub fn session(verb: Verb, session: &SessionInfo) -> Reply {
        match verb {
            Verb::Whoami => Reply::whoami(session_json(session)),
            _ => Reply::ok(
                verb,
                object(session_json(session)),
                format!("registered session {}", session.display()),
            ),
        }
    }

    /// whoami: the fields of [`session_json`], plus `ignored` (`[{"var","why"}]`) when an
    /// environment tag was set but is not a valid session name.
    pub fn whoami(fields: Value) -> Reply {
        let message = whoami_text(&fields);
        Reply::ok(Verb::Whoami, object(fields), message)
    }

    /// A refusal: `reason`, `errno` (from [`Reason::errno`]), `path` (or null), `message`.
    /// `verb` is null when the request was too malformed to name one.
    pub fn refused(verb: Option<Verb>, refusal: &Refusal, path: Option<&str>) -> Reply {
        // The refusal's own path wins: the core knows which path of the request it is about.
        let path = refusal.path.as_deref().or(path);
        let mut r = Reply::failed(
            verb,
            refusal.reason.as_str(),
            refusal.errno(),
            path,
            &refusal.message,
        );
        if let Some(st) = refusal.status {
            r.body["status"] = json!(st);
        }
        if !refusal.per_path.is_empty() {
            let each: Vec<Value> = refusal
                .per_path
                .iter()
                .map(|p| {
                    json!({
                        "path": p.path,
                        "reason": p.reason.as_str(),
                        "errno": p.errno(),
                        "status": p.status,
                        "message": p.message,
                    })
                })
                .collect();
            r.body["paths"] = Value::Array(each);
        }
        r
    }

    /// A failure that is not a [`Refusal`] of the contract's reasons (the state log cannot
    /// be written: `io_error`, `EIO`): the same envelope, with the errno given.
    pub fn failed(
        verb: Option<Verb>,
        reason: &str,
        errno: i32,
        path: Option<&str>,
        message: &str,
    ) -> Reply {
        Reply {
            body: json!({
                "ok": false,
                "verb": verb.map(Verb::as_str),
                "reason": reason,
                "errno": errno,
                "path": path,
                "message": message,
            }),
            errno: Some(errno),
        }
    }

    /// Wrap an envelope read back from `ctl` (the CLI side, which has only the JSON).
    /// `None` if it is not one.
    pub fn from_json(body: Value) -> Option<Reply> {
        let ok = body.get("ok")?.as_bool()?;
        let errno = if ok {
            None
        } else {
            body.get("reason")?.as_str()?;
            let from_reason = body["reason"]
                .as_str()
                .and_then(Reason::parse)
                .map(Reason::errno);
            let given = body["errno"].as_i64().map(|n| n as i32);
            Some(from_reason.or(given).unwrap_or(libc::EACCES))
        };
        Some(Reply { body, errno })
    }

    pub fn is_ok(&self) -> bool {
        self.body["ok"] == Value::Bool(true)
    }

    /// The errno a refused request fails its `write(2)` with; `None` on success.
    pub fn errno(&self) -> Option<i32> {
        self.errno
    }

    pub fn reason(&self) -> Option<Reason> {
        self.body["reason"].as_str().and_then(Reason::parse)
    }

    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    pub fn body(&self) -> &Value {
        &self.body
    }

    /// The bytes a reader of `ctl` gets: the JSON object and a newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(&self.body).expect("a JSON value always serialises");
        v.push(b'\n');
        v
    }
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// `{"session","agent","via"}` of a session: the whoami reply fields, and the content of
/// `.coherent/whoami`.
pub fn session_json(session: &SessionInfo) -> Value {
    json!({
        "session": session.name,
        "agent": session.agent_id.to_string(),
        "via": serde_json::to_value(&session.via).unwrap_or(Value::Null),
    })
}

/// The reply buffer of one open handle of `ctl`.
///
/// Each `write(2)` is one request (its file offset is ignored); its reply replaces the
/// previous one. The reply is read from its first byte whatever file offset the write left
/// (`exec 3<>ctl; echo whoami >&3; cat <&3` prints it whole): the first read after a
/// request marks where reading starts, and later reads are relative to that mark. A read
/// below the mark (`pread` at 0) is taken as an absolute offset into the reply. The FUSE
/// adapter keeps one per handle and opens `ctl` with direct I/O, so the kernel passes each
/// read's offset through and the reply's size need not be the file's size.
///
/// A request must arrive in one FUSE write: the kernel splits a `write(2)` larger than the
/// mount's `max_write`. fuser asks for 16 MiB and the kernel caps it at its page limit
/// (1 MiB on current kernels), so a request up to [`super::MAX_REQUEST`] arrives whole
/// (`tests/agents/cli_mount.rs` checks it on a real mount).
#[derive(Debug, Default, Clone)]
pub struct CtlHandle {
    reply: Vec<u8>,
    /// The file offset of the first read since the last request: the reply's first byte.
    /// None while the reply has not been read.
    mark: Option<u64>,
}

impl CtlHandle {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serve one write: parse `data`, run `serve` on a well-formed request, store the reply.
    /// `Ok(n)` is the byte count to report written; `Err(errno)` fails the `write(2)` with
    /// the errno of the typed refusal (the reply is stored all the same, to be read back).
    pub fn write(
        &mut self,
        data: &[u8],
        serve: impl FnOnce(&Request) -> Reply,
    ) -> Result<u32, i32> {
        let reply = match parse_request(data) {
            Ok(req) => serve(&req),
            Err(e) => e.reply(),
        };
        self.set_reply(&reply)?;
        Ok(u32::try_from(data.len()).unwrap_or(u32::MAX))
    }

    /// Store a reply (to be read from its first byte); `Err(errno)` if it is a refusal.
    pub fn set_reply(&mut self, reply: &Reply) -> Result<(), i32> {
        self.reply = reply.to_bytes();
        self.mark = None;
        match reply.errno() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// The bytes of a read at file `offset` of at most `size` bytes (empty past the end).
    pub fn read(&mut self, offset: u64, size: u32) -> &[u8] {
        let mark = *self.mark.get_or_insert(offset);
        let at = if offset >= mark {
            offset - mark
        } else {
            offset
        };
        let start = usize::try_from(at)
            .unwrap_or(usize::MAX)
            .min(self.reply.len());
        let end = start.saturating_add(size as usize).min(self.reply.len());
        &self.reply[start..end]
    }

    /// The whole stored reply (empty before the first request).
    pub fn reply(&self) -> &[u8] {
        &self.reply
    }

    pub fn len(&self) -> usize {
        self.reply.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reply.is_empty()
    }
}
