//! The plain-line syntax of a request: split into arguments (quotes and escapes), then
//! options and paths (syntax in the parent module's docs).

use super::{build, Request, RequestError, Verb, WaitFlags};
use crate::names::quote_for_message;

/// Split a plain line into arguments (syntax in the module docs).
pub fn tokenize(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_token = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\n' => return Err("one request per write: found a second line".into()),
            c if c.is_whitespace() => {
                if in_token {
                    out.push(std::mem::take(&mut cur));
                    in_token = false;
                }
            }
            '\\' => {
                in_token = true;
                match chars.next() {
                    Some(n) => cur.push(n),
                    None => return Err("the line ends with a lone backslash".into()),
                }
            }
            '"' => {
                in_token = true;
                loop {
                    match chars.next() {
                        None => return Err("unterminated double quote".into()),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            None => return Err("unterminated double quote".into()),
                            Some('n') => cur.push('\n'),
                            Some('t') => cur.push('\t'),
                            Some('r') => cur.push('\r'),
                            Some(o) => cur.push(o),
                        },
                        Some(o) => cur.push(o),
                    }
                }
            }
            '\'' => {
                in_token = true;
                loop {
                    match chars.next() {
                        None => return Err("unterminated single quote".into()),
                        Some('\'') => break,
                        Some(o) => cur.push(o),
                    }
                }
            }
            c => {
                in_token = true;
                cur.push(c);
            }
        }
    }
    if in_token {
        out.push(cur);
    }
    Ok(out)
}

pub(super) fn parse_line(line: &str) -> Result<Request, RequestError> {
    let tokens = tokenize(line).map_err(|e| RequestError::bad(None, e))?;
    let Some((first, rest)) = tokens.split_first() else {
        return Err(RequestError::bad(None, "empty request"));
    };
    let verb = Verb::parse(first).ok_or_else(|| {
        RequestError::bad(None, format!("unknown verb {}", quote_for_message(first)))
    })?;

    // Options (`--to X`, `--to=X`, `--note X`, `--note=X`) may appear anywhere before `--`.
    let mut to: Option<String> = None;
    let mut note: Option<String> = None;
    let mut timeout: Option<String> = None;
    let mut flags = WaitFlags::default();
    let mut positional: Vec<String> = Vec::new();
    let mut it = rest.iter();
    let mut options_done = false;
    while let Some(tok) = it.next() {
        if options_done || !tok.starts_with('-') || tok == "-" {
            positional.push(tok.clone());
            continue;
        }
        if tok == "--" {
            options_done = true;
            continue;
        }
        if verb == Verb::Wait && (tok == "--standing" || tok == "--report") {
            let flag = if tok == "--standing" {
                &mut flags.standing
            } else {
                &mut flags.report
            };
            if *flag {
                return Err(RequestError::bad(Some(verb), format!("{tok} given twice")));
            }
            *flag = true;
            continue;
        }
        let (name, inline) = match tok.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (tok.as_str(), None),
        };
        let slot = match (verb, name) {
            (Verb::Transfer, "--to") => &mut to,
            (Verb::Transfer, "--note") => &mut note,
            (Verb::Wait, "--timeout") => &mut timeout,
            _ => {
                return Err(RequestError::bad(
                    Some(verb),
                    format!(
                        "unknown option {} for {verb} (a path starting with `-` goes after `--`)",
                        quote_for_message(tok)
                    ),
                ))
            }
        };
        if slot.is_some() {
            return Err(RequestError::bad(Some(verb), format!("{name} given twice")));
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| RequestError::bad(Some(verb), format!("{name} needs a value")))?,
        };
        *slot = Some(value);
    }
    build(verb, positional, to, note, timeout, flags)
}
