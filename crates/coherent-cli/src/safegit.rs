//! git as the hook and `coherent doctor` run it: in a tree they did not choose (the agent's
//! directory, a fresh clone, a vendored tarball with its `.git`), so with every program the
//! repository's configuration could name switched off. Reading a repository must not run
//! its code: `core.fsmonitor`, a `filter.*.clean`/`smudge`/`process` driver, a diff
//! `textconv` or external diff, hooks, and a lazy fetch of a partial clone (which runs
//! the transport's ssh command). What git reads (the index, objects, plain config) it
//! still reads.

use std::path::Path;
use std::process::{Command, Stdio};

/// The (key, value) overrides that switch off what git would run for a read-only command
/// in `dir`: the fixed ones, and every filter driver the configuration (any scope) names,
/// emptied. Given as `GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n` they are command-line
/// configuration: they win over every file, reach git's own children, and take any
/// driver name (a `-c NAME=VALUE` splits a name with `=` in it wrongly).
fn overrides(dir: &Path) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = [
        ("core.fsmonitor", "false"),
        ("core.hooksPath", "/dev/null"),
        ("diff.external", ""),
        ("core.pager", "cat"),
        ("core.sshCommand", "false"),
        ("protocol.allow", "never"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for driver in filter_drivers(dir) {
        for key in ["clean", "smudge", "process"] {
            out.push((format!("filter.{driver}.{key}"), String::new()));
        }
        out.push((format!("filter.{driver}.required"), "false".into()));
    }
    out
}

/// The filter drivers the configuration seen from `dir` names (`filter.NAME.KEY`). Reading
/// configuration runs nothing.
fn filter_drivers(dir: &Path) -> Vec<String> {
    let o = bare(dir)
        .args([
            "config",
            "--null",
            "--name-only",
            "--get-regexp",
            r"^filter\.",
        ])
        .stdout(Stdio::piped())
        .output();
    let Ok(o) = o else { return Vec::new() };
    let mut names: Vec<String> = o
        .stdout
        .split(|b| *b == 0)
        .filter_map(|k| std::str::from_utf8(k).ok())
        .filter_map(|k| k.strip_prefix("filter."))
        .filter_map(|k| k.rsplit_once('.').map(|(name, _)| name.to_string()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// git in `dir` with nothing of the environment's own choosing for it: no prompt, no lazy
/// fetch, stdin and stderr closed.
fn bare(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(dir)
        .arg("--no-pager")
        .env("GIT_NO_LAZY_FETCH", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_EXTERNAL_DIFF")
        .env_remove("GIT_PAGER")
        .env_remove("GIT_CONFIG_PARAMETERS")
        .env_remove("GIT_CONFIG_COUNT")
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// `git -C dir` with the repository's executable configuration switched off: what runs
/// is git alone. A command that compares the work tree (`diff`) also gets
/// `--no-ext-diff --no-textconv --ignore-submodules=all` from the caller.
pub fn git(dir: &Path) -> Command {
    let mut c = bare(dir);
    let o = overrides(dir);
    c.env("GIT_CONFIG_COUNT", o.len().to_string());
    for (i, (k, v)) in o.iter().enumerate() {
        c.env(format!("GIT_CONFIG_KEY_{i}"), k)
            .env(format!("GIT_CONFIG_VALUE_{i}"), v);
    }
    c
}

/// The options a `git diff` run through [`git`] adds, so no configured program compares
/// files and no submodule's own repository (with a configuration of its own) is entered.
pub const DIFF_SAFE: [&str; 3] = ["--no-ext-diff", "--no-textconv", "--ignore-submodules=all"];
