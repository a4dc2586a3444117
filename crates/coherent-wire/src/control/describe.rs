//! The human descriptions of control replies and transfer records, shared by the volume's
//! reply messages and the CLI's output.

use super::request::Verb;
use crate::names::display_name;
use serde_json::Value;

/// How a session was resolved, as words, from the `via` JSON of `session_json`.
pub fn via_text(via: &Value) -> String {
    match via {
        Value::String(s) => s.clone(),
        Value::Object(m) => {
            let kind = m.get("kind").and_then(Value::as_str).unwrap_or("unknown");
            let detail = m
                .iter()
                .filter(|(k, _)| k.as_str() != "kind")
                .filter_map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
                .join(" ");
            match kind {
                "env" => format!("environment variable {detail}"),
                "cgroup" => format!("cgroup {detail}"),
                "uid" => "uid (no session tag: unattributed)".to_string(),
                "not_yours" => format!(
                    "uid (unattributed): session {} belongs to uid {}, not to this process's uid",
                    m.get("session").and_then(Value::as_str).unwrap_or("?"),
                    m.get("owner").and_then(Value::as_u64).unwrap_or(0)
                ),
                "registered" => "registration through the control file".to_string(),
                other if detail.is_empty() => other.to_string(),
                other => format!("{other} {detail}"),
            }
        }
        _ => "unknown".to_string(),
    }
}

/// The whoami line from its JSON (`session`, `agent`, `via`, optional `ignored`): who the
/// reader is, how that was found, and which tags were ignored and why.
pub fn whoami_text(body: &Value) -> String {
    let name = display_name(body["session"].as_str().unwrap_or("?"));
    let agent = body["agent"].as_str().unwrap_or("?");
    let mut line = format!(
        "you are session {name} ({}), agent id {agent}, resolved by {}",
        short_id(agent),
        via_text(&body["via"])
    );
    for t in body["ignored"].as_array().into_iter().flatten() {
        line.push_str(&format!(
            "; {} was ignored: {}",
            t["var"].as_str().unwrap_or("?"),
            t["why"].as_str().unwrap_or("?")
        ));
    }
    line
}

/// The first 8 hex digits of an agent id string (as the engine writes it).
pub fn short_id(agent: &str) -> String {
    agent.chars().filter(|c| *c != '-').take(8).collect()
}

/// A path as a shell word, for "run: coherent withdraw PATH" hints.
pub use crate::names::shell_word;

/// `path` (mount-relative) as seen from the directory `from` (mount-relative).
pub fn relative_from(path: &str, from: &str) -> String {
    let p: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let f: Vec<&str> = from.split('/').filter(|c| !c.is_empty()).collect();
    let common = p.iter().zip(&f).take_while(|(a, b)| a == b).count();
    let mut out: Vec<&str> = vec![".."; f.len() - common];
    out.extend_from_slice(&p[common..]);
    if out.is_empty() {
        ".".to_string()
    } else {
        out.join("/")
    }
}

fn field<'a>(rec: &'a Value, key: &str) -> &'a str {
    rec.get(key).and_then(Value::as_str).unwrap_or("?")
}

fn who(rec: &Value, role: &str) -> String {
    let name = display_name(field(rec, role));
    match rec.get(format!("{role}_agent")).and_then(Value::as_str) {
        Some(agent) => format!("{name} ({})", short_id(agent)),
        None => name.to_string(),
    }
}

/// One human line for a transfer record (the engine's record JSON) as seen after `verb`:
/// names the file, the other session (name and short id), the version and what to do next.
pub fn describe_record(verb: Verb, rec: &Value) -> String {
    describe_record_from(verb, rec, |p| p.to_string())
}

/// [`describe_record`] where the suggested command names the path as `hint` maps it (the
/// CLI maps it to the path as seen from the reader's directory, so the command can be
/// pasted as is); the file itself is still named by its mount-relative path.
pub fn describe_record_from(verb: Verb, rec: &Value, hint: impl Fn(&str) -> String) -> String {
    let raw_path = field(rec, "path");
    let path = &display_name(raw_path);
    let version = match rec.get("version_at_transfer").and_then(Value::as_u64) {
        Some(v) => format!("v{v}"),
        None => "v?".to_string(),
    };
    let status = field(rec, "status");
    let live = rec.get("live").and_then(Value::as_bool).unwrap_or(false);
    let giver = &display_name(field(rec, "giver"));
    let successor = &display_name(field(rec, "successor"));
    let (g, s) = (who(rec, "giver"), who(rec, "successor"));
    let hint_path = shell_word(&hint(raw_path));
    let offer = rec.get("offer").and_then(Value::as_bool).unwrap_or(false);
    let claimed_by = rec.get("claimed_by").and_then(Value::as_str);
    match verb {
        Verb::Transfer if live && offer && claimed_by.is_none() => format!(
            "offered {path} ({version}) to any session; you can no longer write it until a \
             session claims it (coherent accept) and writes it, or you run: coherent withdraw \
             {hint_path}"
        ),
        Verb::Accept if claimed_by.is_some() => format!(
            "claimed {path} ({version}), offered by {g}; it is yours to write, and {giver} \
             stays fenced until the file changes (or run: coherent decline {hint_path})"
        ),
        Verb::Transfer if live => format!(
            "handed {path} ({version}) to {s}; you can no longer write it until {successor} \
             writes or declines it, or you run: coherent withdraw {hint_path}"
        ),
        Verb::Transfer => {
            format!("the handoff of {path} ({version}) to {s} is {status}; you can write it again")
        }
        Verb::Accept => format!(
            "accepted {path} ({version}) from {g}; it is yours to write, and {giver} stays \
             fenced until the file changes (or run: coherent decline {hint_path})"
        ),
        Verb::Decline => {
            format!("declined {path} ({version}) from {g}; {giver} can write it again")
        }
        Verb::Withdraw => format!("withdrew {path} ({version}) from {s}; you can write it again"),
        _ => {
            let to = match claimed_by {
                _ if offer && claimed_by.is_none() => "any session (an open offer)".to_string(),
                Some(_) => format!("{s} (claimed an offer)"),
                None => s,
            };
            let mut line = format!("{path} ({version}): {g} -> {to}, {status}");
            if status == "overtaken" {
                if let Some(c) = rec.get("counterparty").and_then(Value::as_str) {
                    line.push_str(&format!(" by {}", display_name(c)));
                }
            }
            line.push_str(if live {
                "; live: the giver is fenced"
            } else {
                "; ended"
            });
            line
        }
    }
}

/// One line for several records: each record's line, separated by ` | `.
pub fn describe_records(verb: Verb, records: &[Value]) -> String {
    if records.is_empty() {
        return format!("{verb}: nothing changed");
    }
    records
        .iter()
        .map(|r| describe_record(verb, r))
        .collect::<Vec<_>>()
        .join(" | ")
}
