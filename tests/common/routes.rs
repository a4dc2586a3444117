//! The one oracle of the write-route tables (docs/design.md#write-routes): what an allowed
//! route leaves at its target, and where the handoff record stands after it. The table run
//! in process (nomount/inproc_decisions.rs) and the one run by real tools on a mount
//! (mounted/enforce_routes.rs) judge their rows with it, so the two cannot drift apart.

use serde_json::Value;
use std::path::Path;

/// What a route leaves at the target path when it is allowed.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum After {
    /// A regular file with these bytes.
    Bytes(&'static str),
    /// A symlink to the row's helper file.
    Symlink,
    /// Nothing: the path was removed or renamed away.
    Gone,
}

/// What is wrong with `target` on disk (read from the backing directory or the mount)
/// against `want`; `helper` is what a `Symlink` row's link must point to.
pub fn check_after(want: After, target: &Path, helper: &str) -> Option<String> {
    let md = std::fs::symlink_metadata(target);
    match (want, &md) {
        (After::Bytes(b), Ok(md)) if md.file_type().is_file() => {
            let got = std::fs::read_to_string(target).unwrap_or_default();
            (got != b).then(|| format!("bytes {got:?}, want {b:?}"))
        }
        (After::Symlink, Ok(md)) if md.file_type().is_symlink() => {
            let to = std::fs::read_link(target).unwrap();
            (to != Path::new(helper)).then(|| format!("symlink to {to:?}"))
        }
        (After::Gone, Err(_)) => None,
        (want, got) => Some(format!("target is {got:?}, want {want:?}")),
    }
}

/// The record of a file alice handed to bob after `who` ran an allowed route that made
/// `commits` commits and (`acquires`) opened the file for writing: what is wrong with it.
pub fn check_record(
    rec: Option<&Value>,
    who: &str,
    commits: u64,
    acquires: bool,
) -> Option<String> {
    let (want_status, want_live) = match (who, commits > 0, acquires) {
        ("bob", true, _) => ("completed", false),
        // The successor's acquire completes the record; the fence stays.
        ("bob", false, true) => ("completed", true),
        ("bob", false, false) => ("pending", true),
        (_, true, _) => ("overtaken", false),
        (_, false, true) => ("overtaken", true),
        (_, false, false) => ("pending", true),
    };
    match rec {
        Some(rec)
            if rec["status"] == want_status
                && rec["live"] == want_live
                && (want_status != "overtaken" || rec["counterparty"] == who) =>
        {
            None
        }
        other => Some(format!(
            "record {other:?}, want status {want_status} live {want_live}"
        )),
    }
}

/// Set an xattr on a backing file (outside the volume, before it sees it): the rows that
/// check that a route keeps a file's xattrs start from one.
pub fn set_backing_xattr(p: &Path, name: &str, value: &str) {
    let st = std::process::Command::new("setfattr")
        .args(["-n", name, "-v", value])
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success(), "setfattr on {p:?}");
}

/// Fail with every wrong row of a table at once (`rows`: how many the table has).
pub fn report(role: &str, rows: usize, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} of {rows} routes wrong for the {role}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
