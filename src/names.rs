//! Session names: the one rule (docs/design.md#sessions) and its one message, used by the CLI
//! (`coherent run --session`, `register`), the control surface's parser and identity alike,
//! so a name one of them accepts is never refused (or silently ignored) by another.
//!
//! A valid session name is 1 to [`MAX_SESSION_NAME`] characters from `A-Z a-z 0-9 . _ : @ -`
//! is not `.` or `..`, is not `any` (the successor of an offer to anyone, docs/design.md#handoff),
//! and does not start with `uid:` (reserved for unattributed sessions, so no tag can pose as one).
//! Such a name is also a valid cgroup directory segment (`coherent-session-NAME`).

use std::fmt;

/// The successor named by an offer to anyone (`transfer --to any`): never a session name.
pub const ANY: &str = "any";

/// The longest valid session name.
pub const MAX_SESSION_NAME: usize = 128;

/// Why a string is not a valid session name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadName {
    Empty,
    TooLong(usize),
    BadChar(char),
    /// `uid:...` names only unattributed sessions.
    Reserved,
    /// `any` names the successor of an offer to anyone.
    Any,
    /// `.` and `..` cannot name a cgroup directory.
    Dots,
}

impl fmt::Display for BadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadName::Empty => f.write_str("a session name cannot be empty"),
            BadName::TooLong(n) => write!(
                f,
                "a session name has at most {MAX_SESSION_NAME} characters, not {n}"
            ),
            BadName::BadChar(c) => write!(
                f,
                "a session name may hold only letters, digits and . _ : @ -, not {c:?}"
            ),
            BadName::Reserved => f.write_str("session names starting with uid: are reserved"),
            BadName::Any => f.write_str(
                "`any` is reserved: `transfer --to any` offers a file to whichever session claims it",
            ),
            BadName::Dots => f.write_str("a session name cannot be . or .."),
        }
    }
}

impl std::error::Error for BadName {}

/// Check a session name against the rule in the module doc.
pub fn check_session_name(name: &str) -> Result<(), BadName> {
    if name.is_empty() {
        return Err(BadName::Empty);
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-')))
    {
        return Err(BadName::BadChar(c));
    }
    if name.len() > MAX_SESSION_NAME {
        return Err(BadName::TooLong(name.len()));
    }
    if name.starts_with("uid:") {
        return Err(BadName::Reserved);
    }
    if name == "." || name == ".." {
        return Err(BadName::Dots);
    }
    if name == ANY {
        return Err(BadName::Any);
    }
    Ok(())
}

pub fn is_valid_session_name(name: &str) -> bool {
    check_session_name(name).is_ok()
}

/// The one message for a refused session name, naming it: what `register NAME`,
/// `coherent run --session NAME` and the daemon's log of an ignored tag all say.
pub fn invalid_name_message(name: &str, why: &BadName) -> String {
    format!("invalid session name {}: {why}", quote_for_message(name))
}

/// [`check_session_name`] with the refusal as [`invalid_name_message`].
pub fn validate_session_name(name: &str) -> Result<(), String> {
    check_session_name(name).map_err(|why| invalid_name_message(name, &why))
}

/// A value quoted for a message (a name here, any request argument in `control`),
/// shortened so a huge value never floods a reply or a log.
pub fn quote_for_message(s: &str) -> String {
    const MAX: usize = 120;
    if s.len() <= MAX {
        return format!("{s:?}");
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &s[..end], s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_value_and_the_rule() {
        assert_eq!(
            validate_session_name("a b").unwrap_err(),
            "invalid session name \"a b\": a session name may hold only letters, digits \
             and . _ : @ -, not ' '"
        );
        assert!(validate_session_name("alice@host:1").is_ok());
        assert_eq!(check_session_name("any"), Err(BadName::Any));
        assert!(check_session_name("any2").is_ok() && check_session_name("ANY").is_ok());
        let long = validate_session_name(&"x".repeat(500)).unwrap_err();
        assert!(long.contains("(500 bytes)") && long.len() < 250, "{long}");
    }
}
