//! `coherent log PATH`, `coherent show PATH@vN`, `coherent diff --session S [--since T]`,
//! `coherent undo --session S [--since T] [--dry-run]` (docs/history.md).
//!
//! `undo` asks the volume for the plan and the bytes, then writes each file itself,
//! through the volume: the undo is this process's write, in its session, fenced and
//! permission-checked as any other, and each file is written only if it is still at the
//! version the plan saw.

use std::io::Write;
use std::path::Path;

use coherent::history::b64;
use coherent_wire::control::Reply;
use coherent_wire::names::{display_name, one_line};
use serde_json::{json, Value};

use super::{call_bytes, locate, locate_cwd, Fail, EXIT_REFUSED};

pub(super) fn request(root: &Path, v: Value) -> Result<Reply, Fail> {
    let mut bytes = serde_json::to_vec(&v).expect("JSON");
    bytes.push(b'\n');
    call_bytes(root, &bytes)
}

fn refused(reply: &Reply) -> Fail {
    let reason = reply.body()["reason"].as_str().unwrap_or("unknown");
    Fail::refused(reason, reply.message())
}

fn print_json_or_fail(reply: &Reply) -> Result<(), Fail> {
    println!("{}", reply.body());
    if reply.is_ok() {
        Ok(())
    } else {
        Err(Fail {
            code: EXIT_REFUSED,
            message: String::new(),
        })
    }
}

fn bytes_of(v: &Value) -> Option<Vec<u8>> {
    if let Some(s) = v["content"].as_str() {
        return Some(s.as_bytes().to_vec());
    }
    b64::decode(v["content_base64"].as_str()?)
}

pub(super) fn log(path: &Path, json: bool) -> Result<(), Fail> {
    let (root, rel) = locate(path)?;
    let reply = request(&root, json!({"verb": "log", "path": rel}))?;
    if json {
        return print_json_or_fail(&reply);
    }
    if !reply.is_ok() {
        return Err(refused(&reply));
    }
    for v in reply.body()["versions"].as_array().into_iter().flatten() {
        let who = match v["session"].as_str() {
            Some(s) => display_name(s),
            None => "(as first seen)".into(),
        };
        let what = if v["removed"] == true {
            "removed".to_string()
        } else {
            let d = v["digest"].as_str().unwrap_or("");
            format!(
                "{} bytes {}{}",
                v["size"],
                &d[..d.len().min(12)],
                if v["kept"] == true { "" } else { " (not kept)" }
            )
        };
        println!(
            "v{}  {}  {}  {}  {}",
            v["version"],
            v["ts"].as_str().unwrap_or(""),
            one_line(&who),
            v["op"].as_str().unwrap_or(""),
            what
        );
    }
    Ok(())
}

pub(super) fn show(spec: &str, json: bool) -> Result<(), Fail> {
    let Some((p, n)) = coherent_wire::control::history::split_at_version(spec) else {
        return Err(Fail::usage(format!(
            "{} names no version: write PATH@vN (coherent log PATH lists them)",
            display_name(spec)
        )));
    };
    let (root, rel) = locate(Path::new(p))?;
    let reply = request(&root, json!({"verb": "show", "path": rel, "version": n}))?;
    if json {
        return print_json_or_fail(&reply);
    }
    if !reply.is_ok() {
        return Err(refused(&reply));
    }
    let bytes = bytes_of(reply.body()).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)
        .and_then(|()| out.flush())
        .map_err(|e| Fail::usage(format!("cannot write the version out: {e}")))
}

pub(super) fn session_req(verb: &str, session: &str, since: Option<&str>) -> Value {
    let mut v = json!({"verb": verb, "session": session});
    if let Some(s) = since {
        v["since"] = s.into();
    }
    v
}

pub(super) fn diff(session: &str, since: Option<&str>, json: bool) -> Result<(), Fail> {
    let root = locate_cwd()?;
    let reply = request(&root, session_req("diff", session, since))?;
    if json {
        return print_json_or_fail(&reply);
    }
    if !reply.is_ok() {
        return Err(refused(&reply));
    }
    print!("{}", reply.body()["diff"].as_str().unwrap_or(""));
    for f in reply.body()["files"].as_array().into_iter().flatten() {
        if f["reason"] == "not_kept" {
            eprintln!(
                "coherent: {}",
                one_line(f["message"].as_str().unwrap_or(""))
            );
        }
    }
    Ok(())
}

/// Why the volume refused this process's write of `rel` (its `why` names a fence).
fn why_refused(root: &Path, rel: &str, e: &std::io::Error) -> (&'static str, String) {
    let why = std::fs::read_to_string(root.join(".coherent/why")).unwrap_or_default();
    let first = why.lines().next().unwrap_or("").to_string();
    if first.contains("you handed") || first.contains("you offered") {
        return ("fenced", first);
    }
    (
        "denied",
        format!("{}: the volume refused the write: {e}", display_name(rel)),
    )
}

/// The version the file is at now (None: not there).
fn version_now(p: &Path) -> Option<u64> {
    let mut buf = [0u8; 32];
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str())).ok()?;
    // SAFETY: a NUL-terminated path and a buffer as long as we say.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"user.coherent.version".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return None;
    }
    std::str::from_utf8(&buf[..n as usize])
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Puts one file back; the refusal (reason, message) if it cannot.
fn apply(root: &Path, f: &Value) -> Result<String, (String, String)> {
    let rel = f["path"].as_str().unwrap_or("");
    let p = root.join(rel);
    let current = f["current"].as_u64();
    // An open for read gives this session its view of the file before the version check,
    // so the write below overwrites no one's newer version unseen: without it the stale
    // guard refuses an undoer that never read the file, and a commit after the check is
    // still refused as stale.
    let _view = std::fs::File::open(&p);
    let now = version_now(&p);
    if now.is_some() && now != current {
        return Err((
            "changed_after".into(),
            format!(
                "{} is at v{} now, not v{}: changed since the plan; not undone",
                display_name(rel),
                now.unwrap_or(0),
                current.unwrap_or(0)
            ),
        ));
    }
    let res = if f["action"] == "remove" {
        std::fs::remove_file(&p).map(|()| format!("removed {}", display_name(rel)))
    } else {
        let bytes = bytes_of(f).ok_or_else(|| {
            (
                "bad_reply".to_string(),
                format!("the volume sent no bytes for {}", display_name(rel)),
            )
        })?;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .and_then(|mut o| o.write_all(&bytes))
            .map(|()| {
                format!(
                    "restored {} to v{}",
                    display_name(rel),
                    f["restore_version"].as_u64().unwrap_or(0)
                )
            })
    };
    res.map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => {
            let (r, m) = why_refused(root, rel, &e);
            (r.to_string(), m)
        }
        _ => ("io_error".into(), format!("{}: {e}", display_name(rel))),
    })
}

/// Asks for the plan and, unless `dry_run`, puts the files back: the outcome as the JSON
/// `coherent undo --json` prints (`ok` false when a file was refused), or the volume's
/// refusal of the whole request.
pub(super) fn undo_run(
    root: &Path,
    session: &str,
    since: Option<&str>,
    dry_run: bool,
) -> Result<Result<Value, Reply>, Fail> {
    let mut req = session_req("undo", session, since);
    req["dry_run"] = dry_run.into();
    let reply = request(root, req)?;
    if !reply.is_ok() {
        return Ok(Err(reply));
    }
    let body = reply.body();
    let mut done = Vec::new();
    let mut refusals: Vec<Value> = body["refused"].as_array().cloned().unwrap_or_default();
    for f in body["files"].as_array().into_iter().flatten() {
        if dry_run {
            done.push(json!({"path": f["path"], "action": f["action"],
                "restore_version": f["restore_version"]}));
            continue;
        }
        match apply(root, f) {
            Ok(line) => done.push(json!({"path": f["path"], "action": f["action"],
                "restore_version": f["restore_version"], "message": line})),
            Err((reason, message)) => {
                refusals.push(json!({"path": f["path"], "reason": reason, "message": message}))
            }
        }
    }
    let message = format!(
        "{} file(s) {}, {} refused",
        done.len(),
        if dry_run { "to put back" } else { "put back" },
        refusals.len()
    );
    Ok(Ok(
        json!({"ok": refusals.is_empty(), "verb": "undo", "session": session,
            "dry_run": dry_run, "files": done, "refused": refusals, "message": message}),
    ))
}

pub(super) fn undo(
    session: &str,
    since: Option<&str>,
    dry_run: bool,
    json: bool,
) -> Result<(), Fail> {
    let root = locate_cwd()?;
    let out = match undo_run(&root, session, since, dry_run)? {
        Ok(v) => v,
        Err(reply) if json => return print_json_or_fail(&reply),
        Err(reply) => return Err(refused(&reply)),
    };
    let empty = Vec::new();
    let done = out["files"].as_array().unwrap_or(&empty);
    let refusals = out["refused"].as_array().unwrap_or(&empty);
    if json {
        println!("{out}");
    } else {
        for d in done {
            let line = match d["message"].as_str() {
                Some(m) => m.to_string(),
                None => format!(
                    "would {} {}{}",
                    d["action"].as_str().unwrap_or(""),
                    display_name(d["path"].as_str().unwrap_or("")),
                    d["restore_version"]
                        .as_u64()
                        .map_or(String::new(), |v| format!(" to v{v}"))
                ),
            };
            println!("{}", one_line(&line));
        }
        for r in refusals {
            eprintln!(
                "coherent: refused ({}): {}",
                r["reason"].as_str().unwrap_or(""),
                one_line(r["message"].as_str().unwrap_or(""))
            );
        }
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(Fail {
            code: EXIT_REFUSED,
            message: String::new(),
        })
    }
}
