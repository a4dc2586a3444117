//! The history verbs on `ctl` (docs/history.md): `log PATH`, `show PATH@vN`,
//! `diff --session S [--since T]`, `undo --session S [--since T] [--dry-run]`, as a plain
//! line or as JSON (`{"verb":"show","path":"a.md","version":3}`, `{"verb":"undo",
//! "session":"s","since":"1h","dry_run":true}`). A request whose verb is not one of these
//! is left to [`super::parse_request`].

use serde_json::{json, Value};

use super::request::{normalize_path, tokenize};
use super::Reply;
use crate::error::{Reason, Refusal};
use crate::names::quote_for_message;

/// A parsed history request (paths normalised).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryRequest {
    Log {
        path: String,
    },
    Show {
        path: String,
        version: u64,
    },
    Diff {
        session: String,
        since: Option<String>,
    },
    Undo {
        session: String,
        since: Option<String>,
        dry_run: bool,
    },
}

pub const HISTORY_VERBS: [&str; 4] = ["log", "show", "diff", "undo"];

const USAGE: &str = "history requests: `log PATH`, `show PATH@vN`, \
`diff --session S [--since T]`, `undo --session S [--since T] [--dry-run]` \
(T: RFC 3339, or a span back such as 30m, 2h, 1d)";

impl HistoryRequest {
    pub fn verb(&self) -> &'static str {
        match self {
            HistoryRequest::Log { .. } => "log",
            HistoryRequest::Show { .. } => "show",
            HistoryRequest::Diff { .. } => "diff",
            HistoryRequest::Undo { .. } => "undo",
        }
    }
}

/// A refusal in the envelope of the other verbs, for a history verb.
pub fn refused(verb: &str, f: &Refusal) -> Reply {
    let body = json!({
        "ok": false,
        "verb": verb,
        "reason": f.reason.as_str(),
        "errno": f.errno(),
        "path": f.path,
        "message": f.message,
    });
    Reply::from_json(body).expect("a refusal envelope")
}

/// A success: `fields` with `ok`, `verb`, `message`.
pub fn ok(verb: &str, mut fields: serde_json::Map<String, Value>, message: String) -> Reply {
    fields.insert("ok".into(), true.into());
    fields.insert("verb".into(), verb.into());
    fields.insert("message".into(), message.into());
    Reply::from_json(Value::Object(fields)).expect("an ok envelope")
}

fn bad(verb: Option<&str>, msg: String) -> Reply {
    let f = Refusal::new(Reason::BadRequest, format!("bad request: {msg}; {USAGE}"));
    refused(verb.unwrap_or("null"), &f)
}

/// `PATH@vN` (or `PATH@N`): the path and the version.
pub fn split_at_version(s: &str) -> Option<(&str, u64)> {
    let (p, v) = s.rsplit_once('@')?;
    let v = v.strip_prefix('v').unwrap_or(v);
    Some((p, v.parse().ok().filter(|n| *n > 0)?))
}

/// None: not a history verb. Else the request, or the reply refusing it.
pub fn parse_history(bytes: &[u8]) -> Option<Result<HistoryRequest, Reply>> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    if text.starts_with('{') {
        let v: Value = serde_json::from_str(text).ok()?;
        let verb = v.get("verb")?.as_str()?.to_ascii_lowercase();
        let verb = HISTORY_VERBS.into_iter().find(|h| *h == verb)?;
        return Some(from_json(verb, &v));
    }
    let first = text.split_whitespace().next()?.to_ascii_lowercase();
    let verb = HISTORY_VERBS.into_iter().find(|h| *h == first)?;
    Some(from_line(verb, text))
}

fn from_line(verb: &'static str, text: &str) -> Result<HistoryRequest, Reply> {
    let toks = tokenize(text).map_err(|e| bad(Some(verb), e))?;
    let mut session = None;
    let mut since = None;
    let mut dry_run = false;
    let mut pos = Vec::new();
    let mut it = toks.into_iter().skip(1);
    let mut done = false;
    while let Some(t) = it.next() {
        if done || !t.starts_with("--") {
            pos.push(t);
            continue;
        }
        let (name, inline) = match t.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (t.clone(), None),
        };
        match (verb, name.as_str()) {
            (_, "--") => done = true,
            ("undo", "--dry-run") => dry_run = true,
            ("diff" | "undo", "--session" | "--since") => {
                let v = inline
                    .or_else(|| it.next())
                    .ok_or_else(|| bad(Some(verb), format!("{name} needs a value")))?;
                if name == "--session" {
                    session = Some(v);
                } else {
                    since = Some(v);
                }
            }
            _ => {
                return Err(bad(
                    Some(verb),
                    format!("unknown option {} for {verb}", quote_for_message(&t)),
                ))
            }
        }
    }
    build(verb, pos, session, since, dry_run, None)
}

fn from_json(verb: &'static str, v: &Value) -> Result<HistoryRequest, Reply> {
    let allowed: &[&str] = match verb {
        "log" => &["verb", "path"],
        "show" => &["verb", "path", "version"],
        "diff" => &["verb", "session", "since"],
        _ => &["verb", "session", "since", "dry_run"],
    };
    let obj = v.as_object().expect("checked");
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(
            Some(verb),
            format!(
                "unknown field {} for {verb} (allowed: {})",
                quote_for_message(k),
                allowed.join(", ")
            ),
        ));
    }
    let s = |k: &str| -> Result<Option<String>, Reply> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(bad(Some(verb), format!("\"{k}\" must be a string"))),
        }
    };
    let version = match obj.get("version") {
        None | Some(Value::Null) => None,
        Some(n) => Some(
            n.as_u64()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(Some(verb), "\"version\" must be a number ≥ 1".into()))?,
        ),
    };
    let dry_run = match obj.get("dry_run") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return Err(bad(Some(verb), "\"dry_run\" must be true or false".into())),
    };
    let pos: Vec<String> = s("path")?.into_iter().collect();
    build(verb, pos, s("session")?, s("since")?, dry_run, version)
}

fn build(
    verb: &'static str,
    pos: Vec<String>,
    session: Option<String>,
    since: Option<String>,
    dry_run: bool,
    version: Option<u64>,
) -> Result<HistoryRequest, Reply> {
    let norm = |p: &str| normalize_path(p).map_err(|f| refused(verb, &f));
    match verb {
        "log" | "show" => {
            let [p] = pos.as_slice() else {
                return Err(bad(Some(verb), format!("{verb} takes one path")));
            };
            if verb == "log" {
                return Ok(HistoryRequest::Log { path: norm(p)? });
            }
            let (path, version) = match (version, split_at_version(p)) {
                (Some(v), _) => (p.as_str(), v),
                (None, Some((p, v))) => (p, v),
                (None, None) => {
                    return Err(bad(
                        Some(verb),
                        format!("{} names no version: write PATH@vN", quote_for_message(p)),
                    ))
                }
            };
            Ok(HistoryRequest::Show {
                path: norm(path)?,
                version,
            })
        }
        _ => {
            if !pos.is_empty() {
                return Err(bad(Some(verb), format!("{verb} takes no path")));
            }
            let session = session
                .filter(|s| !s.is_empty())
                .ok_or_else(|| bad(Some(verb), format!("{verb} needs --session S")))?;
            Ok(if verb == "diff" {
                HistoryRequest::Diff { session, since }
            } else {
                HistoryRequest::Undo {
                    session,
                    since,
                    dry_run,
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Option<Result<HistoryRequest, Reply>> {
        parse_history(s.as_bytes())
    }

    #[test]
    fn lines_and_json() {
        assert!(p("status a").is_none());
        assert!(p("{\"verb\":\"status\"}").is_none());
        assert_eq!(
            p("log ./src//a.rs").unwrap().unwrap(),
            HistoryRequest::Log {
                path: "src/a.rs".into()
            }
        );
        assert_eq!(
            p("show 'my file@x'@v3").unwrap().unwrap(),
            HistoryRequest::Show {
                path: "my file@x".into(),
                version: 3
            }
        );
        assert_eq!(
            p("{\"verb\":\"show\",\"path\":\"a\",\"version\":2}")
                .unwrap()
                .unwrap(),
            HistoryRequest::Show {
                path: "a".into(),
                version: 2
            }
        );
        assert_eq!(
            p("undo --session=bob --since 1h --dry-run")
                .unwrap()
                .unwrap(),
            HistoryRequest::Undo {
                session: "bob".into(),
                since: Some("1h".into()),
                dry_run: true
            }
        );
        assert_eq!(
            p("{\"verb\":\"diff\",\"session\":\"bob\"}")
                .unwrap()
                .unwrap(),
            HistoryRequest::Diff {
                session: "bob".into(),
                since: None
            }
        );
    }

    #[test]
    fn bad_requests_say_what_to_write() {
        for bad in [
            "show a",
            "show a@v0",
            "log",
            "log a b",
            "diff",
            "diff --dry-run --session s",
            "undo a --session s",
            "show /etc/passwd@v1",
            "log ../x",
            "{\"verb\":\"undo\",\"session\":\"s\",\"force\":true}",
        ] {
            let r = p(bad).unwrap().unwrap_err();
            assert_eq!(r.reason(), Some(Reason::BadRequest), "{bad}");
            assert_eq!(r.errno(), Some(libc::EINVAL), "{bad}");
        }
    }
}
