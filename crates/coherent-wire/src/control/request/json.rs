//! The JSON syntax of a request: one object, its fields checked (unknown ones refused).

use super::{build, Request, RequestError, Verb, WaitFlags};
use crate::names::quote_for_message;
use serde_json::Value;

pub(super) fn parse_json(text: &str) -> Result<Request, RequestError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| RequestError::bad(None, format!("invalid JSON ({e})")))?;
    let Value::Object(obj) = value else {
        return Err(RequestError::bad(None, "the JSON request is not an object"));
    };
    let verb = match obj.get("verb") {
        Some(Value::String(s)) => Verb::parse(s).ok_or_else(|| {
            RequestError::bad(None, format!("unknown verb {}", quote_for_message(s)))
        })?,
        Some(_) => return Err(RequestError::bad(None, "\"verb\" must be a string")),
        None => return Err(RequestError::bad(None, "the JSON request has no \"verb\"")),
    };
    let allowed: &[&str] = match verb {
        Verb::Transfer => &["verb", "paths", "path", "to", "note"],
        Verb::Accept | Verb::Decline | Verb::Withdraw | Verb::Status => &["verb", "paths", "path"],
        Verb::Register => &["verb", "name"],
        Verb::Whoami => &["verb"],
        Verb::Wait => &["verb", "path", "until", "timeout", "standing", "report"],
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(RequestError::bad(
            Some(verb),
            format!(
                "unknown field {} for {verb} (allowed: {})",
                quote_for_message(k),
                allowed.join(", ")
            ),
        ));
    }
    let string_field = |key: &str| -> Result<Option<String>, RequestError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(RequestError::bad(
                Some(verb),
                format!("\"{key}\" must be a string"),
            )),
        }
    };
    let mut positional = Vec::new();
    match obj.get("paths") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::String(s) => positional.push(s.clone()),
                    _ => {
                        return Err(RequestError::bad(
                            Some(verb),
                            "\"paths\" must be an array of strings",
                        ))
                    }
                }
            }
        }
        Some(_) => {
            return Err(RequestError::bad(
                Some(verb),
                "\"paths\" must be an array of strings",
            ))
        }
    }
    if let Some(p) = string_field("path")? {
        if obj.get("paths").is_some_and(|v| !v.is_null()) {
            return Err(RequestError::bad(
                Some(verb),
                "give either \"path\" or \"paths\", not both",
            ));
        }
        positional.push(p);
    }
    if let Some(n) = string_field("name")? {
        positional.push(n);
    }
    if let Some(u) = string_field("until")? {
        positional.push(u);
    }
    let timeout = match obj.get("timeout") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(RequestError::bad(
                Some(verb),
                "\"timeout\" must be a number of seconds",
            ))
        }
    };
    let flag = |key: &str| -> Result<bool, RequestError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(RequestError::bad(
                Some(verb),
                format!("\"{key}\" must be true or false"),
            )),
        }
    };
    let flags = WaitFlags {
        standing: flag("standing")?,
        report: flag("report")?,
    };
    build(
        verb,
        positional,
        string_field("to")?,
        string_field("note")?,
        timeout,
        flags,
    )
}
