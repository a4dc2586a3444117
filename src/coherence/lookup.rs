//! Finding a known session from a command argument (docs/design.md#sessions): the session name, the
//! full agent id, or an unambiguous id prefix of at least 8 hex digits.

use crate::error::{Reason, Refusal};
use crate::identity::Session;
use std::collections::HashMap;
use uuid::Uuid;

/// Shortest id prefix accepted.
pub const MIN_PREFIX: usize = 8;

/// Resolves `arg` among `known` (keyed by session name). Unattributed sessions are never
/// candidates (they cannot receive a handoff).
///
/// - an exact name wins;
/// - a full UUID names the session with that agent id;
/// - a hex string of 8..32 digits is an id prefix; it must match exactly one session;
/// - a hex string shorter than 8 digits, an ambiguous prefix, or an argument that is empty
///   or has whitespace/control characters is `handoff_successor_malformed`;
/// - anything else well formed that matches nothing is `handoff_successor_unknown`.
pub fn resolve_session<H: std::hash::BuildHasher>(
    known: &HashMap<String, Session, H>,
    arg: &str,
) -> Result<Session, Refusal> {
    let malformed = |why: &str| {
        Refusal::new(
            Reason::HandoffSuccessorMalformed,
            format!("'{arg}' does not name a session: {why}"),
        )
    };
    let unknown = || {
        Refusal::new(
            Reason::HandoffSuccessorUnknown,
            format!(
                "no known session is '{arg}'; the successor must have touched this volume or run `coherent register` first"
            ),
        )
    };
    if arg.is_empty() || arg.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(malformed("empty or contains whitespace"));
    }
    if let Some(s) = known.get(arg) {
        return if s.is_attributed() {
            Ok(s.clone())
        } else {
            Err(unknown())
        };
    }
    let candidates = || known.values().filter(|s| s.is_attributed());
    if arg.len() == 36 {
        if let Ok(id) = Uuid::parse_str(arg) {
            return candidates()
                .find(|s| s.agent_id == id)
                .cloned()
                .ok_or_else(unknown);
        }
    }
    let hex = arg.bytes().all(|c| c.is_ascii_hexdigit());
    if !hex {
        return Err(unknown());
    }
    if arg.len() < MIN_PREFIX {
        return Err(malformed("an id prefix needs at least 8 hex digits"));
    }
    if arg.len() > 32 {
        return Err(malformed("longer than an agent id"));
    }
    let prefix = arg.to_ascii_lowercase();
    let mut found = candidates().filter(|s| s.agent_id.simple().to_string().starts_with(&prefix));
    match (found.next(), found.next()) {
        (None, _) => Err(unknown()),
        (Some(s), None) => Ok(s.clone()),
        (Some(_), Some(_)) => Err(malformed("the id prefix matches more than one session")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{SessionInfo, Via};
    use std::sync::Arc;

    fn known(names: &[&str]) -> HashMap<String, Session> {
        names
            .iter()
            .map(|n| {
                let s = Arc::new(SessionInfo::from_tag(
                    Some("COHERENT_SESSION"),
                    n,
                    Via::Env {
                        var: "COHERENT_SESSION".into(),
                    },
                ));
                (n.to_string(), s)
            })
            .chain(std::iter::once((
                "uid:0".to_string(),
                Arc::new(SessionInfo::unattributed(0)),
            )))
            .collect()
    }

    #[test]
    fn by_name_id_and_prefix() {
        let k = known(&["alice", "bob"]);
        let alice = k["alice"].clone();
        assert_eq!(resolve_session(&k, "alice").unwrap(), alice);
        assert_eq!(
            resolve_session(&k, &alice.agent_id.to_string()).unwrap(),
            alice
        );
        assert_eq!(resolve_session(&k, &alice.short_id()).unwrap(), alice);
        assert_eq!(
            resolve_session(&k, &alice.short_id().to_uppercase()).unwrap(),
            alice
        );
        // alice's id is 27a468b0-...
        assert_eq!(resolve_session(&k, "27a468b07fa2").unwrap().name, "alice");
    }

    #[test]
    fn refusals() {
        let k = known(&["alice", "bob"]);
        let r = |a: &str| resolve_session(&k, a).unwrap_err().reason;
        assert_eq!(r("27a4"), Reason::HandoffSuccessorMalformed);
        assert_eq!(r(""), Reason::HandoffSuccessorMalformed);
        assert_eq!(r("a b"), Reason::HandoffSuccessorMalformed);
        assert_eq!(r("carol"), Reason::HandoffSuccessorUnknown);
        assert_eq!(r("00000000"), Reason::HandoffSuccessorUnknown);
        assert_eq!(
            r("00000000-0000-0000-0000-000000000000"),
            Reason::HandoffSuccessorUnknown
        );
        // The unattributed session is never a successor.
        assert_eq!(r("uid:0"), Reason::HandoffSuccessorUnknown);
    }

    #[test]
    fn ambiguous_prefix() {
        // Find two names whose ids share the first 8 hex digits' first digit... instead
        // build sessions with crafted ids sharing an 8-digit prefix.
        let mut k = known(&[]);
        for (n, id) in [
            ("x", "12345678-0000-5000-8000-000000000001"),
            ("y", "12345678-0000-5000-8000-000000000002"),
        ] {
            k.insert(
                n.into(),
                Arc::new(SessionInfo {
                    name: n.into(),
                    agent_id: Uuid::parse_str(id).unwrap(),
                    via: Via::Registered,
                }),
            );
        }
        assert_eq!(
            resolve_session(&k, "12345678").unwrap_err().reason,
            Reason::HandoffSuccessorMalformed
        );
        assert_eq!(
            resolve_session(&k, "12345678000050008000000000000002")
                .unwrap()
                .name,
            "y"
        );
    }
}
