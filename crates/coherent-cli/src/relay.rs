//! The relay: before an agent's context is compacted (or its session ends), the session
//! offers the files it was working on to any session, with a note built from its own recent
//! events, so a fresh session can claim them (`coherent accept PATH`) and go on. The giver
//! is fenced from the offer on, as for any transfer, so no write of the old context can
//! land after the new one took over.
//!
//! The note goes into the volume's state (and its log), readable by other sessions: a line
//! that looks like a credential is left out of it, and the user is told.

use crate::call;
use coherent_wire::control::Request;
use coherent_wire::names::display_name;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// How many of the log's last events the note is built from: the recent work, not a
/// whole history (a long-lived volume's log can be large).
const RECENT_EVENTS: usize = 5000;

/// What the session did, from its own recent events.
#[derive(Default, Debug, PartialEq)]
pub(crate) struct Work {
    /// Files it acquired or committed, with its commits to each, first touched first.
    pub changed: Vec<(String, u32)>,
    /// Files it handed on: (path, to whom).
    pub gave: Vec<(String, String)>,
    /// Files it accepted or claimed: (path, from whom when the event says).
    pub took: Vec<(String, Option<String>)>,
}

/// The session `me`'s work in the log `text` (one JSON event a line). A file another
/// session acquired or committed after `me` last did is not `me`'s any more: it is left out.
pub(crate) fn recent_work(text: &str, me: &str) -> Work {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(RECENT_EVENTS);
    let mut w = Work::default();
    let mut changed: BTreeMap<String, (usize, u32)> = BTreeMap::new();
    for (i, line) in lines[start..].iter().enumerate() {
        let Ok(ev) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let s = |k: &str| ev.get(k).and_then(Value::as_str);
        let (Some(event), Some(path)) = (s("event"), s("path")) else {
            continue;
        };
        let mine = s("session") == Some(me);
        match event {
            "acquire" | "commit" if mine => {
                let e = changed.entry(path.to_string()).or_insert((i, 0));
                if event == "commit" {
                    e.1 += 1;
                }
            }
            "acquire" | "commit" => {
                changed.remove(path);
            }
            "transfer" if mine => {
                let to = s("successor").unwrap_or("any");
                w.gave.push((path.to_string(), to.to_string()));
            }
            "accept" if mine => w
                .took
                .push((path.to_string(), s("giver").map(String::from))),
            _ => {}
        }
    }
    let mut changed: Vec<_> = changed.into_iter().collect();
    changed.sort_by_key(|(_, (i, _))| *i);
    w.changed = changed.into_iter().map(|(p, (_, n))| (p, n)).collect();
    w
}

/// How many files each list of a note names: past it, a count. A note travels with each
/// file offered and into other sessions' context.
const NOTE_CAP: usize = 20;

/// `items` as note lines, at most [`NOTE_CAP`], then how many more.
fn capped<T>(items: &[T], line: impl Fn(&T) -> String) -> Vec<String> {
    let mut out: Vec<String> = items.iter().take(NOTE_CAP).map(line).collect();
    if items.len() > NOTE_CAP {
        out.push(format!(
            "- and {} more (coherent status lists them)",
            items.len() - NOTE_CAP
        ));
    }
    out
}

/// The note's lines for `work`, `why` saying what is ending.
fn note_lines(me: &str, why: &str, work: &Work) -> Vec<String> {
    let mut out = vec![format!(
        "Relay from session {}: {why}. These files are offered to any session; the one that \
         claims them (coherent accept PATH) carries the work on.",
        display_name(me)
    )];
    if !work.changed.is_empty() {
        out.push("Changed:".into());
        out.extend(capped(&work.changed, |(p, n)| {
            format!("- {} ({n} commits)", display_name(p))
        }));
    }
    if !work.gave.is_empty() {
        out.push("Handed on earlier (open or done, see coherent status PATH):".into());
        out.extend(capped(&work.gave, |(p, to)| {
            format!("- {} to {}", display_name(p), display_name(to))
        }));
    }
    if !work.took.is_empty() {
        out.push("Handed to it:".into());
        out.extend(capped(&work.took, |(p, from)| match from {
            Some(g) => format!("- {} from {}", display_name(p), display_name(g)),
            None => format!("- {}", display_name(p)),
        }));
    }
    out
}

/// Offers this session's files to any session; the message for the user, or None when
/// there is nothing to hand on.
pub(crate) fn offer(root: &Path, me: &str, why: &str) -> Option<String> {
    let log = std::fs::read_to_string(root.join(".coherent/events")).ok()?;
    let mut work = recent_work(&log, me);
    // only files that exist: an editor's temporary file (`notes.md.tmp.PID.HEX`, renamed
    // over the file) was committed under its own name, and is gone
    work.changed.retain(|(p, _)| root.join(p).is_file());
    let handed = own_live_paths(root, me);
    let files: Vec<String> = work
        .changed
        .iter()
        .map(|(p, _)| p.clone())
        // still there, not already handed on, and not the volume's own files
        .filter(|p| !handed.contains(p) && !p.starts_with(".coherent"))
        .filter(|p| root.join(p).is_file())
        .collect();
    if files.is_empty() {
        return None;
    }
    let (kept, dropped) = without_secrets(&note_lines(me, why, &work));
    let note = kept.join("\n");
    let mut offered = Vec::new();
    let mut failed = Vec::new();
    for p in &files {
        let req = Request::Transfer {
            paths: vec![p.clone()],
            to: "any".into(),
            note: Some(note.clone()),
        };
        match call(root, &req) {
            Ok(r) if r.is_ok() => offered.push(display_name(p)),
            Ok(r) => failed.push(format!("{} ({})", display_name(p), r.message())),
            Err(e) => failed.push(format!("{} ({})", display_name(p), e.message)),
        }
    }
    let mut msg = Vec::new();
    if !offered.is_empty() {
        msg.push(format!(
            "coherent relay: offered to any session ({why}): {}. A fresh session claims \
             them with `coherent accept PATH`; this session can no longer write them \
             (`coherent withdraw PATH` takes one back). The note sent:",
            offered.join(", ")
        ));
        msg.extend(kept.iter().map(|l| format!("> {l}")));
    }
    if dropped > 0 {
        msg.push(format!(
            "{dropped} line(s) were left out of the note: they looked like a credential."
        ));
    }
    if !failed.is_empty() {
        msg.push(format!("Not offered: {}.", failed.join(", ")));
    }
    Some(msg.join("\n"))
}

/// Before the context goes (compaction, or the session's end): every wait of this session
/// in flight (`.coherent/waits`, `"standing": false`) is left with the volume as a standing
/// wait, so its outcome reaches the next context (see [`report_waits`]). The message for
/// the user, or None when nothing was waiting.
pub(crate) fn keep_waits(root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(root.join(".coherent/waits")).ok()?;
    let waits: Vec<Value> = serde_json::from_str(text.trim()).ok()?;
    let mut kept = Vec::new();
    let mut failed = Vec::new();
    for w in waits
        .iter()
        .filter(|w| w.get("standing").and_then(Value::as_bool) == Some(false))
    {
        let (Some(path), Some(until)) = (
            w.get("path").and_then(Value::as_str),
            w.get("until")
                .and_then(Value::as_str)
                .and_then(coherent::coherence::Until::parse),
        ) else {
            continue;
        };
        let req = Request::WaitStanding {
            path: path.to_string(),
            until,
        };
        let shown = format!("{} (until {})", display_name(path), until.as_str());
        match call(root, &req) {
            Ok(r) if r.is_ok() => kept.push(shown),
            Ok(r) => failed.push(format!("{shown}: {}", r.message())),
            Err(e) => failed.push(format!("{shown}: {}", e.message)),
        }
    }
    let mut msg = Vec::new();
    if !kept.is_empty() {
        msg.push(format!(
            "coherent: the wait(s) of this session on {} stay with the volume as standing \
             waits; the next prompt after one resolves is told its outcome.",
            kept.join(", ")
        ));
    }
    if !failed.is_empty() {
        msg.push(format!("Waits not kept: {}.", failed.join("; ")));
    }
    (!msg.is_empty()).then(|| msg.join("\n"))
}

/// The standing waits of this session that resolved since the last report, taken from
/// the volume (so each is reported once): the lines for the agent's context, or None.
pub(crate) fn report_waits(root: &Path) -> Option<String> {
    let reply = call(root, &Request::WaitReport).ok()?;
    let waits = reply.body().get("waits")?.as_array()?;
    if waits.is_empty() {
        return None;
    }
    let mut out = vec![format!(
        "Standing waits of this session on the coherent volume {} that resolved:",
        display_name(&root.to_string_lossy())
    )];
    for w in waits {
        if let Some(line) = w.get("line").and_then(Value::as_str) {
            out.push(format!("- {line}"));
        }
    }
    Some(out.join("\n"))
}

/// `lines` without those that look like a credential, and how many were left out.
pub(crate) fn without_secrets(lines: &[String]) -> (Vec<String>, usize) {
    let kept: Vec<String> = lines
        .iter()
        .filter(|l| !looks_like_credential(l))
        .cloned()
        .collect();
    let dropped = lines.len() - kept.len();
    (kept, dropped)
}

/// Does `line` hold text that looks like a secret: a private key block, a cloud or forge
/// token by its known shape, or a long random-looking token? Errs on the side of "yes":
/// a line wrongly left out of a note costs little, a key sent to other sessions a lot.
pub(crate) fn looks_like_credential(line: &str) -> bool {
    if line.contains("-----BEGIN") && line.contains("PRIVATE KEY") {
        return true;
    }
    let lower = line.to_ascii_lowercase();
    // a password given as a value: `password=...`, `passwd: ...`
    for key in ["password", "passwd", "pwd"] {
        for (i, _) in lower.match_indices(key) {
            let rest = lower[i + key.len()..].trim_start_matches(['"', '\'']);
            let rest = rest.trim_start();
            if let Some(v) = rest.strip_prefix(['=', ':']) {
                if !v.trim().trim_matches(['"', '\'']).is_empty() {
                    return true;
                }
            }
        }
    }
    // a JSON web token, however short: three base64url parts, the first `eyJ` (`{"`)
    if line
        .split(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
        .any(is_jwt)
    {
        return true;
    }
    let keyed = [
        "token",
        "key",
        "secret",
        "auth",
        "bearer",
        "credential",
        "api",
    ]
    .iter()
    .any(|k| lower.contains(k));
    line.split(|c: char| !(c.is_ascii_alphanumeric() || "+/_-".contains(c)))
        .any(|t| token_is_secret(t) || (keyed && is_hex40(t)))
}

/// `header.payload.signature`, base64url, the header a JSON object (`eyJ`).
fn is_jwt(t: &str) -> bool {
    let parts: Vec<&str> = t.split('.').collect();
    parts.len() == 3
        && parts[0].starts_with("eyJ")
        && parts[0].len() >= 10
        && parts[1].len() >= 4
        && parts[2].len() >= 4
        && parts.iter().all(|p| {
            p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        })
}

/// A 40-hex-digit token (a classic forge or CI token, a SHA-1 too): a secret on a line
/// that calls it a token, key, secret or the like. A commit id on its own passes.
fn is_hex40(t: &str) -> bool {
    t.len() == 40 && t.chars().all(|c| c.is_ascii_hexdigit())
}

fn token_is_secret(t: &str) -> bool {
    let rest_len = |prefix: &str| t.strip_prefix(prefix).map(str::len);
    // AWS access key ids: AKIA/ASIA and 16 more upper-case letters or digits
    if (t.starts_with("AKIA") || t.starts_with("ASIA"))
        && t.len() == 20
        && t[4..]
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
    {
        return true;
    }
    const PREFIXED: [(&str, usize); 14] = [
        ("glpat-", 20),
        ("xoxa-", 10),
        ("xoxr-", 10),
        ("xoxs-", 10),
        ("xapp-", 10),
        ("ghp_", 20),
        ("gho_", 20),
        ("ghu_", 20),
        ("ghs_", 20),
        ("ghr_", 20),
        ("github_pat_", 20),
        ("sk-", 20),
        ("xoxb-", 10),
        ("xoxp-", 10),
    ];
    if PREFIXED
        .iter()
        .any(|(p, n)| rest_len(p).is_some_and(|l| l >= *n))
    {
        return true;
    }
    high_entropy(t)
}

/// A token of 32 characters or more mixing upper case, lower case and digits, with the
/// spread of characters random text has (a path or an identifier has far less).
fn high_entropy(t: &str) -> bool {
    if t.len() < 32 {
        return false;
    }
    let classes = [
        t.chars().any(|c| c.is_ascii_uppercase()),
        t.chars().any(|c| c.is_ascii_lowercase()),
        t.chars().any(|c| c.is_ascii_digit()),
    ];
    if classes.iter().filter(|x| **x).count() < 3 {
        return false;
    }
    let mut counts = [0usize; 256];
    for b in t.bytes() {
        counts[b as usize] += 1;
    }
    let n = t.len() as f64;
    let bits: f64 = counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = *c as f64 / n;
            -p * p.log2()
        })
        .sum();
    bits >= 4.0
}

/// The paths of the live records `me` gave.
fn own_live_paths(root: &Path, me: &str) -> Vec<String> {
    own_live_transfers(root, me)
        .unwrap_or_default()
        .iter()
        .filter_map(|r| r.get("path").and_then(Value::as_str).map(String::from))
        .collect()
}

/// The live records `me` gave, from `status`.
pub(crate) fn own_live_transfers(root: &Path, me: &str) -> Option<Vec<Value>> {
    let reply = call(root, &Request::Status { path: None }).ok()?;
    let live = reply.body().get("status")?.get("live")?.as_array()?;
    Some(
        live.iter()
            .filter(|r| r.get("giver").and_then(Value::as_str) == Some(me))
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_recognised() {
        for s in [
            "key AKIAIOSFODNN7EXAMPLE here",
            "-----BEGIN RSA PRIVATE KEY-----",
            "-----BEGIN OPENSSH PRIVATE KEY-----",
            "token=ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "github_pat_11ABCDEFG0123456789_abcdefghijkl",
            "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx",
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "xoxb-123456789012-abcdefghij",
            // issue 38: these passed
            "db password=hunter2",
            "PASSWORD: \"correct horse\"",
            "CI_TOKEN=glpat-AbCdEfGhIjKlMnOpQrSt",
            "GITHUB_TOKEN=0123456789abcdef0123456789abcdef01234567",
            "auth eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln",
            "slack xoxa-2-1234567890-abcdef",
        ] {
            assert!(looks_like_credential(s), "{s}");
        }
    }

    #[test]
    fn ordinary_lines_pass() {
        for s in [
            "Relay from session alice: its context was about to be compacted.",
            "- src/bin/coherent/very_long_module_name_for_the_relay.rs (3 commits)",
            "- docs/a-page-about-the-relay-and-how-it-works-today.md to bob",
            "commit 0123456789abcdef0123456789abcdef01234567",
            "ask-for-review and task-list",
            "AKIA is the prefix of an access key id",
            "- password-reset.md (2 commits)",
            "the password field is documented in auth.md",
            "- src/jwt.rs to eyJ-reviewer",
        ] {
            assert!(!looks_like_credential(s), "{s}");
        }
    }

    #[test]
    fn a_long_list_in_a_note_is_capped_with_a_count() {
        let work = Work {
            changed: (0..150).map(|i| (format!("f{i}.md"), 1)).collect(),
            ..Work::default()
        };
        let lines = note_lines("s1", "it ended", &work);
        assert_eq!(lines.len(), 1 + 1 + NOTE_CAP + 1, "{lines:?}");
        assert_eq!(
            lines.last().unwrap(),
            "- and 130 more (coherent status lists them)"
        );
    }

    #[test]
    fn a_secret_line_is_dropped_and_counted() {
        let lines = vec![
            "Changed:".to_string(),
            "- notes.md with sk-abcdefghijklmnopqrstuvwxyz".to_string(),
            "- plan.md (1 commits)".to_string(),
        ];
        let (kept, dropped) = without_secrets(&lines);
        assert_eq!(kept, vec!["Changed:", "- plan.md (1 commits)"]);
        assert_eq!(dropped, 1);
    }

    #[test]
    fn work_is_the_sessions_own_and_not_overtaken() {
        let log = [
            r#"{"event":"acquire","path":"a","session":"s1"}"#,
            r#"{"event":"commit","path":"a","session":"s1"}"#,
            r#"{"event":"commit","path":"b","session":"s1"}"#,
            r#"{"event":"commit","path":"b","session":"s2"}"#,
            r#"{"event":"commit","path":"c","session":"s1"}"#,
            r#"{"event":"transfer","path":"d","session":"s1","successor":"bob"}"#,
            r#"{"event":"accept","path":"e","session":"s1","giver":"s0"}"#,
            "not json",
        ]
        .join("\n");
        let w = recent_work(&log, "s1");
        assert_eq!(w.changed, vec![("a".into(), 1), ("c".into(), 1)]);
        assert_eq!(w.gave, vec![("d".into(), "bob".into())]);
        assert_eq!(w.took, vec![("e".into(), Some("s0".into()))]);
    }
}
