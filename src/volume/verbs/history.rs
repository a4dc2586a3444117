//! The history verbs on `ctl` (docs/history.md): `log`, `show`, `diff --session`, `undo
//! --session`, answered for the caller. A path is shown only to a caller who could look it
//! up, and a version's bytes (in `show`, `diff`, `undo`) only to one who may read the file
//! now ([`crate::access::may_read`]); to anyone else the answer is the one for a path
//! that does not exist, so the history leaks nothing the workspace would not.
//!
//! `undo` answers the plan and the bytes; the client (the CLI, the MCP server) writes them
//! through the volume, so the undo is the caller's own write: its session's new version,
//! fenced, permission-checked and counted like any other.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::Verbs;
use crate::access::{may_read, Who};
use crate::coherence::Timestamp;
use crate::control::history::{ok, refused, HistoryRequest};
use crate::error::{Reason, Refusal};
use crate::history::{b64, diff, parse_since, plan, Entry, Store};
use crate::names::display_name;
use crate::store::Caller;
use crate::visibility::Sight;

fn not_there(p: &str) -> Refusal {
    Refusal::new(
        Reason::NoSuchPath,
        format!(
            "{} has no history in this volume (or you may not read it)",
            display_name(p)
        ),
    )
    .at(p)
}

fn entry_json(e: &Entry) -> Value {
    json!({
        "version": e.version,
        "session": if e.op == "base" { Value::Null } else { e.session.clone().into() },
        "ts": Timestamp(e.ts).rfc3339(),
        "op": e.op,
        "digest": e.digest,
        "size": e.size,
        "kept": e.kept,
        "removed": e.removed(),
    })
}

/// `content` (UTF-8) or `content_base64`.
fn put_bytes(m: &mut Map<String, Value>, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => m.insert("content".into(), s.into()),
        Err(_) => m.insert("content_base64".into(), b64::encode(bytes).into()),
    };
}

struct Reader<'a> {
    v: &'a Verbs,
    sight: Sight,
    who: Who,
}

impl Reader<'_> {
    /// The path as placed beneath the root (a symlinked directory resolved), if the caller
    /// may read it.
    fn place(&mut self, p: &str) -> Result<String, Refusal> {
        let real = super::placed(self.v, p)?;
        if !self.may_read(&real) {
            return Err(not_there(&real));
        }
        Ok(real)
    }

    fn may_read(&mut self, p: &str) -> bool {
        self.sight.sees(self.v.backing.fd(), p)
            && may_read(self.v.backing.fd(), Path::new(p), &self.who)
    }
}

fn bytes_of(h: &Store, e: &Entry) -> Result<Option<Vec<u8>>, Refusal> {
    if e.removed() {
        return Ok(Some(Vec::new()));
    }
    let Some(d) = e.digest.as_deref().filter(|_| e.kept) else {
        return Ok(None);
    };
    h.bytes(d)
        .map_err(|err| Refusal::new(Reason::IoError, format!("history: {err}")))
}

fn not_kept(p: &str, v: u64) -> Value {
    json!({
        "path": p,
        "reason": "not_kept",
        "version": v,
        "message": format!(
            "the bytes of {}@v{v} are not kept (over the size limit, not a regular file, or \
             past the history's bounds)",
            display_name(p)
        ),
    })
}

impl Verbs {
    /// Serve one history request for `caller`.
    pub(in crate::volume) fn history(&self, caller: &Caller, req: &HistoryRequest) -> Reply {
        let verb = req.verb();
        let Some(h) = self.history.store().cloned() else {
            return refused(
                verb,
                &Refusal::new(
                    Reason::BadRequest,
                    "the history is off on this volume (coherent-mount --history-max 0)",
                ),
            );
        };
        let who = Who::of_task(caller.pid, caller.uid, caller.gid);
        let mut r = Reader {
            v: self,
            sight: Sight::new(who.clone()),
            who,
        };
        let out = match req {
            HistoryRequest::Log { path } => log(&mut r, &h, path),
            HistoryRequest::Show { path, version } => show(&mut r, &h, path, *version),
            HistoryRequest::Diff { session, since } => {
                since_ms(since.as_deref()).and_then(|t| session_diff(&mut r, &h, session, t))
            }
            HistoryRequest::Undo {
                session,
                since,
                dry_run,
            } => since_ms(since.as_deref()).and_then(|t| undo(&mut r, &h, session, t, *dry_run)),
        };
        out.unwrap_or_else(|f| refused(verb, &f))
    }
}

use crate::control::Reply;

fn since_ms(since: Option<&str>) -> Result<i64, Refusal> {
    let Some(s) = since else { return Ok(0) };
    parse_since(s, Timestamp::now())
        .map(|t| t.0)
        .ok_or_else(|| {
            Refusal::new(
                Reason::BadRequest,
                format!(
                    "bad request: --since {} is neither an RFC 3339 time nor a span such as 30m, \
                 2h, 1d",
                    crate::names::quote_for_message(s)
                ),
            )
        })
}

fn log(r: &mut Reader<'_>, h: &Store, path: &str) -> Result<Reply, Refusal> {
    let p = r.place(path)?;
    let v = h.log(&p);
    if v.is_empty() {
        return Err(not_there(&p));
    }
    let n = v.len();
    let mut m = Map::new();
    m.insert("path".into(), p.clone().into());
    m.insert("versions".into(), v.iter().map(entry_json).collect());
    Ok(ok(
        "log",
        m,
        format!("{} versions of {}", n, display_name(&p)),
    ))
}

fn show(r: &mut Reader<'_>, h: &Store, path: &str, version: u64) -> Result<Reply, Refusal> {
    let p = r.place(path)?;
    let log = h.log(&p);
    let Some(e) = log.iter().rev().find(|e| e.version == version) else {
        return Err(Refusal::new(
            Reason::NoSuchPath,
            format!(
                "{} has no version {version} in the history (`coherent log` lists them)",
                display_name(&p)
            ),
        )
        .at(p));
    };
    let Some(bytes) = bytes_of(h, e)? else {
        let f = Refusal::new(
            Reason::NoSuchPath,
            not_kept(&p, version)["message"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
        .at(p);
        return Err(f);
    };
    let mut m = Map::new();
    m.insert("path".into(), p.clone().into());
    m.insert("entry".into(), entry_json(e));
    put_bytes(&mut m, &bytes);
    Ok(ok(
        "show",
        m,
        format!("{}@v{version}: {} bytes", display_name(&p), bytes.len()),
    ))
}

/// The changes of `session` the caller may read.
fn visible(r: &mut Reader<'_>, h: &Store, session: &str, since: i64) -> Vec<plan::Change> {
    plan::changes(h.all(), session, since)
        .into_iter()
        .filter(|c| r.may_read(&c.path))
        .collect()
}

fn session_diff(
    r: &mut Reader<'_>,
    h: &Store,
    session: &str,
    since: i64,
) -> Result<Reply, Refusal> {
    let mut files = Vec::new();
    let mut text = Vec::new();
    for c in visible(r, h, session, since) {
        let from = match &c.before {
            None => Some(Vec::new()),
            Some(b) => bytes_of(h, b)?,
        };
        let to = bytes_of(h, &c.last)?;
        let (Some(a), Some(b)) = (from, to) else {
            files.push(not_kept(
                &c.path,
                c.before.as_ref().map_or(0, |b| b.version),
            ));
            continue;
        };
        let exists_before = c.before.as_ref().is_some_and(|b| !b.removed());
        if !exists_before && c.last.removed() {
            continue; // made and removed in the window (an editor's temporary file)
        }
        let (na, nb) = (
            if exists_before {
                format!("a/{}", c.path)
            } else {
                "/dev/null".into()
            },
            if !c.last.removed() {
                format!("b/{}", c.path)
            } else {
                "/dev/null".into()
            },
        );
        let d = diff::unified(&na, &nb, &a, &b);
        files.push(json!({
            "path": c.path,
            "from_version": c.before.as_ref().map(|b| b.version),
            "to_version": c.last.version,
            "diff": String::from_utf8_lossy(&d),
        }));
        text.extend_from_slice(&d);
    }
    let n = files.len();
    let mut m = Map::new();
    m.insert("session".into(), session.into());
    m.insert("files".into(), files.into());
    m.insert("diff".into(), String::from_utf8_lossy(&text).into());
    Ok(ok(
        "diff",
        m,
        format!("{n} file(s) changed by session {}", display_name(session)),
    ))
}

fn undo(
    r: &mut Reader<'_>,
    h: &Store,
    session: &str,
    since: i64,
    dry_run: bool,
) -> Result<Reply, Refusal> {
    let mut files = Vec::new();
    let mut refusals = Vec::new();
    for c in visible(r, h, session, since) {
        let p = c.path.clone();
        let now = r.v.engine.path_state(&p);
        let current = now.as_ref().map(|s| s.version);
        if let Some(a) = &c.after {
            refusals.push(json!({
                "path": p,
                "reason": "changed_after",
                "session": a.session,
                "version": a.version,
                "message": format!(
                    "{} was changed after session {} by session {} (v{}): not undone. Look \
                     with `coherent diff --session {}`, then undo that session first, put \
                     the file back by hand (`coherent show {}@v{}`), or leave it",
                    display_name(&p),
                    display_name(session),
                    display_name(&a.session),
                    a.version,
                    a.session,
                    p,
                    c.before.as_ref().map_or(0, |b| b.version),
                ),
            }));
            continue;
        }
        if current != Some(c.last.version) {
            refusals.push(json!({
                "path": p,
                "reason": "changed_after",
                "session": Value::Null,
                "version": current,
                "message": format!(
                    "{} is at v{} now, not at session {}'s v{} (changed behind the \
                     volume's back or not kept): not undone",
                    display_name(&p),
                    current.unwrap_or(0),
                    display_name(session),
                    c.last.version
                ),
            }));
            continue;
        }
        let removes = c.before.as_ref().is_none_or(Entry::removed);
        let exists_now = now.as_ref().is_some_and(|s| s.exists);
        if removes && !exists_now {
            continue; // made and removed by the session: nothing to put back
        }
        let mut f = Map::new();
        f.insert("path".into(), p.clone().into());
        f.insert("current".into(), current.into());
        f.insert(
            "restore_version".into(),
            c.before.as_ref().map(|b| b.version).into(),
        );
        if removes {
            f.insert("action".into(), "remove".into());
        } else {
            let b = c.before.as_ref().expect("not removes");
            if b.digest.is_some() && b.digest == c.last.digest {
                continue; // the session's changes cancel out
            }
            f.insert("action".into(), "restore".into());
            f.insert("digest".into(), b.digest.clone().into());
            if !dry_run {
                match bytes_of(h, b)? {
                    Some(bytes) => put_bytes(&mut f, &bytes),
                    None => {
                        refusals.push(not_kept(&p, b.version));
                        continue;
                    }
                }
            } else if !b.kept {
                refusals.push(not_kept(&p, b.version));
                continue;
            }
        }
        files.push(Value::Object(f));
    }
    let (n, k) = (files.len(), refusals.len());
    let mut m = Map::new();
    m.insert("session".into(), session.into());
    m.insert("dry_run".into(), dry_run.into());
    m.insert("files".into(), files.into());
    m.insert("refused".into(), refusals.into());
    Ok(ok(
        "undo",
        m,
        format!(
            "{n} file(s) to put back as before session {}, {k} refused",
            display_name(session)
        ),
    ))
}
