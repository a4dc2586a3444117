//! Requests to `.coherent/ctl` (docs/design.md#control-surface): the bytes of one `write(2)` → a
//! typed [`Request`], or a [`RequestError`] to reply with.
//!
//! # Plain-line syntax
//!
//! `VERB ARG...`, arguments separated by blanks. An argument may be quoted:
//! `"..."` with backslash escapes (`\"`, `\\`, `\n`, `\t`, `\r`; any other `\c` is `c`), or
//! `'...'` taken literally. Outside quotes a backslash makes the next character literal.
//! One request per write: a trailing newline is fine, a second line is not (a newline may
//! only appear inside quotes). Options may come before or after the paths; `--` ends them.
//!
//! ```text
//! transfer --to SESSION [--note TEXT] PATH...      (also: transfer PATH... --to SESSION)
//! accept PATH...   decline PATH...   withdraw PATH...
//! status [PATH]    whoami            register [NAME]
//! wait PATH [accepted|completed|ended] [--timeout SECS]
//! wait PATH [accepted|completed|ended] --standing      wait --report
//! ```
//!
//! `wait` answers when PATH's record reaches the state (default `ended`), or after
//! `--timeout` (at most [`MAX_WAIT_SECS`], also the default) with `"reached": false`: the
//! client sends it again to wait longer.
//!
//! `wait PATH --standing` answers at once and leaves a *standing wait* with the volume, kept
//! for the session across the agent's restarts and the daemon's (docs/agents.md#standing-waits);
//! `wait --report` answers the session's standing waits that resolved since they were last
//! reported, and marks them reported.
//!
//! # JSON syntax
//!
//! `{"verb":"transfer","paths":["plan.md"],"to":"bob","note":"..."}`; single-path verbs also
//! take `"path":"x"`; `status` takes an optional `"path"`, `register` an optional `"name"`,
//! `wait` a `"path"`, an optional `"until"` and an optional `"timeout"` (seconds, a number),
//! or `"standing": true` instead of the timeout, or `"report": true` alone.
//! Unknown fields are refused so a misspelt field never silently changes a request.

use super::{CONTROL_DIR, MAX_NAME, MAX_NOTE, MAX_PATH, MAX_REQUEST, USAGE};
use crate::control::Until;
use crate::error::{Reason, Refusal};
use crate::names::quote_for_message;
use serde_json::{json, Map, Value};

mod json;
mod line;

use json::parse_json;
use line::parse_line;
pub use line::tokenize;

/// A control verb (the wire names of docs/design.md#control-surface).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Register,
    Transfer,
    Accept,
    Decline,
    Withdraw,
    Status,
    Whoami,
    Wait,
}

/// The longest one `wait` request waits (seconds): the server's cap, so no request stays
/// unanswered for long (a client that wants longer sends it again).
pub const MAX_WAIT_SECS: f64 = 30.0;

impl Verb {
    pub const ALL: [Verb; 8] = [
        Verb::Register,
        Verb::Transfer,
        Verb::Accept,
        Verb::Decline,
        Verb::Withdraw,
        Verb::Status,
        Verb::Whoami,
        Verb::Wait,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Register => "register",
            Verb::Transfer => "transfer",
            Verb::Accept => "accept",
            Verb::Decline => "decline",
            Verb::Withdraw => "withdraw",
            Verb::Status => "status",
            Verb::Whoami => "whoami",
            Verb::Wait => "wait",
        }
    }

    /// Case-insensitive, so `TRANSFER` typed in a hurry still works.
    pub fn parse(s: &str) -> Option<Verb> {
        Verb::ALL
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(s))
    }

    /// The plain-line form of this verb, for error messages.
    pub fn usage(self) -> &'static str {
        match self {
            Verb::Register => "register [NAME]",
            Verb::Transfer => "transfer --to SESSION [--note TEXT] PATH...",
            Verb::Accept => "accept PATH...",
            Verb::Decline => "decline PATH...",
            Verb::Withdraw => "withdraw PATH...",
            Verb::Status => "status [PATH]",
            Verb::Whoami => "whoami",
            Verb::Wait => {
                "wait PATH [accepted|completed|ended] [--timeout SECS | --standing], or wait --report"
            }
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One parsed `ctl` request. Paths are normalised (see [`normalize_path`]), non-empty and
/// without duplicates (first occurrence kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Register a session: the caller's own (`None`) or one named ahead of its first process.
    Register {
        name: Option<String>,
    },
    Transfer {
        paths: Vec<String>,
        /// The successor as given: a session name, a full agent id or an id prefix.
        to: String,
        /// `None` when absent or empty.
        note: Option<String>,
    },
    Accept {
        paths: Vec<String>,
    },
    Decline {
        paths: Vec<String>,
    },
    Withdraw {
        paths: Vec<String>,
    },
    /// The whole volume, or one path.
    Status {
        path: Option<String>,
    },
    Whoami,
    /// Answer when the record on `path` reaches `until`, or after `timeout_ms` (capped at
    /// [`MAX_WAIT_SECS`]).
    Wait {
        path: String,
        until: Until,
        timeout_ms: Option<u64>,
    },
    /// `wait PATH [UNTIL] --standing`: keep a standing wait for the session, answer now.
    WaitStanding {
        path: String,
        until: Until,
    },
    /// `wait --report`: the session's standing waits resolved and not yet reported.
    WaitReport,
}

impl Request {
    pub fn verb(&self) -> Verb {
        match self {
            Request::Register { .. } => Verb::Register,
            Request::Transfer { .. } => Verb::Transfer,
            Request::Accept { .. } => Verb::Accept,
            Request::Decline { .. } => Verb::Decline,
            Request::Withdraw { .. } => Verb::Withdraw,
            Request::Status { .. } => Verb::Status,
            Request::Whoami => Verb::Whoami,
            Request::Wait { .. } | Request::WaitStanding { .. } | Request::WaitReport => Verb::Wait,
        }
    }

    /// The paths the request names (empty for verbs without paths).
    pub fn paths(&self) -> &[String] {
        match self {
            Request::Transfer { paths, .. }
            | Request::Accept { paths }
            | Request::Decline { paths }
            | Request::Withdraw { paths } => paths,
            Request::Status { path: Some(p) }
            | Request::Wait { path: p, .. }
            | Request::WaitStanding { path: p, .. } => std::slice::from_ref(p),
            _ => &[],
        }
    }

    /// The JSON form of this request (what the CLI writes; parses back to `self`).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("verb".into(), self.verb().as_str().into());
        match self {
            Request::Register { name } => {
                if let Some(n) = name {
                    m.insert("name".into(), n.clone().into());
                }
            }
            Request::Transfer { paths, to, note } => {
                m.insert("paths".into(), json!(paths));
                m.insert("to".into(), to.clone().into());
                if let Some(n) = note {
                    m.insert("note".into(), n.clone().into());
                }
            }
            Request::Accept { paths }
            | Request::Decline { paths }
            | Request::Withdraw { paths } => {
                m.insert("paths".into(), json!(paths));
            }
            Request::Status { path } => {
                if let Some(p) = path {
                    m.insert("path".into(), p.clone().into());
                }
            }
            Request::Whoami => {}
            Request::Wait {
                path,
                until,
                timeout_ms,
            } => {
                m.insert("path".into(), path.clone().into());
                m.insert("until".into(), until.as_str().into());
                if let Some(t) = timeout_ms {
                    m.insert("timeout".into(), json!(*t as f64 / 1000.0));
                }
            }
            Request::WaitStanding { path, until } => {
                m.insert("path".into(), path.clone().into());
                m.insert("until".into(), until.as_str().into());
                m.insert("standing".into(), true.into());
            }
            Request::WaitReport => {
                m.insert("report".into(), true.into());
            }
        }
        Value::Object(m)
    }
}

/// A request that could not be parsed: a `bad_request` (or `handoff_successor_malformed`)
/// refusal, with the verb and path when they were recognised, for the reply envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    pub verb: Option<Verb>,
    pub path: Option<String>,
    pub refusal: Refusal,
}

impl RequestError {
    fn bad(verb: Option<Verb>, what: impl std::fmt::Display) -> Self {
        let hint = match verb {
            Some(v) => format!("expected `{}` (or its JSON form)", v.usage()),
            None => USAGE.to_string(),
        };
        RequestError {
            verb,
            path: None,
            refusal: Refusal::new(Reason::BadRequest, format!("bad request: {what}; {hint}")),
        }
    }
}

impl From<RequestError> for Refusal {
    fn from(e: RequestError) -> Refusal {
        e.refusal
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.refusal.fmt(f)
    }
}

impl std::error::Error for RequestError {}

/// Normalise a path given in a request to the form the engine keys on: relative to the mount
/// root, no `.` or empty components, `..` resolved lexically (the mount root has no parent
/// here, and symlinks are never followed: the path names the link itself).
///
/// Refused (`bad_request`): empty, NUL, absolute, leaving the root, naming the root itself,
/// naming anything under `.coherent/`, longer than [`MAX_PATH`].
pub fn normalize_path(raw: &str) -> Result<String, Refusal> {
    let bad = |what: &str| {
        Refusal::new(
            Reason::BadRequest,
            format!(
                "bad request: path {}{what}; paths are relative to the mount root, \
                 e.g. `plan.md` or `src/lib.rs`",
                quote_for_message(raw)
            ),
        )
    };
    if raw.is_empty() {
        return Err(bad("is empty"));
    }
    if raw.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    if raw.starts_with('/') {
        return Err(bad(
            " is absolute (the coherent CLI turns paths into mount-relative ones)",
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for comp in raw.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(bad(" leaves the mount root"));
                }
            }
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return Err(bad(" names the mount root, not a file"));
    }
    if parts[0] == CONTROL_DIR {
        return Err(bad(" is inside the control directory .coherent/"));
    }
    let out = parts.join("/");
    if out.len() > MAX_PATH {
        return Err(bad(&format!(" is longer than {MAX_PATH} bytes")));
    }
    Ok(out)
}

/// Parse the bytes of one `write(2)` to `.coherent/ctl`.
pub fn parse_request(bytes: &[u8]) -> Result<Request, RequestError> {
    if bytes.len() > MAX_REQUEST {
        return Err(RequestError::bad(
            None,
            format!(
                "request of {} bytes is larger than the limit of {MAX_REQUEST} bytes",
                bytes.len()
            ),
        ));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| RequestError::bad(None, format!("request is not UTF-8 text ({e})")))?;
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(RequestError::bad(None, "empty request"));
    }
    if trimmed.starts_with('{') {
        parse_json(trimmed)
    } else {
        if trimmed.contains('\0') {
            return Err(RequestError::bad(None, "request contains a NUL byte"));
        }
        parse_line(trimmed)
    }
}

/// The flags of `wait` beyond its timeout: `--standing` and `--report`.
#[derive(Default, Clone, Copy)]
struct WaitFlags {
    standing: bool,
    report: bool,
}

/// Check the arguments of a verb and build the request (shared by both syntaxes).
fn build(
    verb: Verb,
    positional: Vec<String>,
    to: Option<String>,
    note: Option<String>,
    timeout: Option<String>,
    flags: WaitFlags,
) -> Result<Request, RequestError> {
    let paths = |raw: Vec<String>| -> Result<Vec<String>, RequestError> {
        if raw.is_empty() {
            return Err(RequestError::bad(Some(verb), "no path given"));
        }
        // A set keeps a 1 MiB request of tiny paths linear, not quadratic.
        let mut seen = std::collections::HashSet::with_capacity(raw.len());
        let mut out: Vec<String> = Vec::with_capacity(raw.len());
        for r in raw {
            let p = normalize_path(&r).map_err(|refusal| RequestError {
                verb: Some(verb),
                path: Some(r.clone()),
                refusal,
            })?;
            if seen.insert(p.clone()) {
                out.push(p);
            }
        }
        Ok(out)
    };
    match verb {
        Verb::Transfer => {
            let to = match to {
                None => return Err(RequestError::bad(Some(verb), "missing --to SESSION")),
                Some(t) if t.trim().is_empty() => {
                    return Err(RequestError::bad(Some(verb), "--to is empty"))
                }
                Some(t) => t,
            };
            if to.len() > MAX_NAME || to.chars().any(char::is_control) {
                let refusal = Refusal::new(
                    Reason::HandoffSuccessorMalformed,
                    format!(
                        "the successor {} is not a session name, an agent id or an id prefix \
                         of 8+ hex digits (no control characters, at most {MAX_NAME} bytes)",
                        quote_for_message(&to)
                    ),
                );
                return Err(RequestError {
                    verb: Some(verb),
                    path: None,
                    refusal,
                });
            }
            let note = note.filter(|n| !n.is_empty());
            if let Some(n) = &note {
                if n.len() > MAX_NOTE {
                    return Err(RequestError::bad(
                        Some(verb),
                        format!("the note is {} bytes; the limit is {MAX_NOTE}", n.len()),
                    ));
                }
                if n.contains('\0') {
                    return Err(RequestError::bad(
                        Some(verb),
                        "the note contains a NUL byte",
                    ));
                }
            }
            Ok(Request::Transfer {
                paths: paths(positional)?,
                to,
                note,
            })
        }
        Verb::Accept => Ok(Request::Accept {
            paths: paths(positional)?,
        }),
        Verb::Decline => Ok(Request::Decline {
            paths: paths(positional)?,
        }),
        Verb::Withdraw => Ok(Request::Withdraw {
            paths: paths(positional)?,
        }),
        Verb::Status => match positional.len() {
            0 => Ok(Request::Status { path: None }),
            1 => {
                let mut p = paths(positional)?;
                Ok(Request::Status { path: p.pop() })
            }
            n => Err(RequestError::bad(
                Some(verb),
                format!("status takes at most one path, got {n}"),
            )),
        },
        Verb::Wait if flags.report => {
            if flags.standing || timeout.is_some() || !positional.is_empty() {
                return Err(RequestError::bad(
                    Some(verb),
                    "wait --report takes no path, state, --standing or --timeout",
                ));
            }
            Ok(Request::WaitReport)
        }
        Verb::Wait => {
            if flags.standing && timeout.is_some() {
                return Err(RequestError::bad(
                    Some(verb),
                    "wait --standing answers at once and waits on in the volume: give no --timeout",
                ));
            }
            let (path, until) = match positional.as_slice() {
                [p] => (p.clone(), Until::default()),
                [p, u] => match Until::parse(u) {
                    Some(u) => (p.clone(), u),
                    None => {
                        return Err(RequestError::bad(
                            Some(verb),
                            format!(
                                "unknown state {}: wait for accepted, completed or ended",
                                quote_for_message(u)
                            ),
                        ))
                    }
                },
                [] => return Err(RequestError::bad(Some(verb), "no path given")),
                _ => {
                    return Err(RequestError::bad(
                        Some(verb),
                        "wait takes one path and at most one state",
                    ))
                }
            };
            let timeout_ms = match timeout {
                None => None,
                Some(t) => match t.parse::<f64>() {
                    Ok(secs) if secs.is_finite() && secs >= 0.0 => {
                        Some((secs.min(MAX_WAIT_SECS) * 1000.0).round() as u64)
                    }
                    _ => {
                        return Err(RequestError::bad(
                            Some(verb),
                            format!(
                                "--timeout {}: give a number of seconds",
                                quote_for_message(&t)
                            ),
                        ))
                    }
                },
            };
            let path = paths(vec![path])?.pop().expect("one path");
            if flags.standing {
                return Ok(Request::WaitStanding { path, until });
            }
            Ok(Request::Wait {
                path,
                until,
                timeout_ms,
            })
        }
        Verb::Whoami => {
            if positional.is_empty() {
                Ok(Request::Whoami)
            } else {
                Err(RequestError::bad(Some(verb), "whoami takes no arguments"))
            }
        }
        Verb::Register => match positional.as_slice() {
            [] => Ok(Request::Register { name: None }),
            [name] => {
                // The names module's message as is: the CLI's `run --session` says the same.
                crate::names::validate_session_name(name).map_err(|e| RequestError {
                    verb: Some(verb),
                    path: None,
                    refusal: Refusal::new(Reason::BadRequest, e),
                })?;
                Ok(Request::Register {
                    name: Some(name.clone()),
                })
            }
            _ => Err(RequestError::bad(
                Some(verb),
                "register takes at most one name",
            )),
        },
    }
}
