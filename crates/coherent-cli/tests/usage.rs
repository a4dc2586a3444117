//! The `coherent` command's own surface, no volume needed: usage errors and help. (The
//! workspace's tests at the root run this binary against real mounts.)

use std::path::Path;
use std::process::{Command, Output};

fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coherent"))
        .args(args)
        .current_dir(dir)
        .env_remove("COHERENT_SESSION")
        .output()
        .expect("spawn coherent")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn usage_errors_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &[][..],
        &["bogus"],
        &["transfer", "plan.md"],
        &["transfer", "--to", "bob"],
        &["accept"],
        &["decline"],
        &["withdraw"],
        &["status", "a", "b"],
        &["whoami", "extra"],
        // flags only where they do something: `run` has no reply to print as JSON
        &["--json", "run", "--session", "x", "--", "true"],
        &["run", "--json", "--session", "x", "--", "true"],
        &["run", "-v", "--json", "--session", "x"],
        &["status", "-v"],
        &["hook"],
        &["hook", "cursor"],
        &["install", "bogus"],
        &["install", "git", "--user"],
        &["fsmonitor"],
        &["fsmonitor", "1", "token"],
        &["completions", "tcsh"],
        &["mcp", "extra"],
        &["wait"],
        &["wait", "plan.md", "--until", "soon"],
        &["wait", "plan.md", "--timeout", "-1"],
        &["wait", "plan.md", "--timeout", "soon"],
        // past what a `Duration` holds, or not a number at all: a usage error, no panic
        &["wait", "plan.md", "--timeout", "1e300"],
        &["wait", "plan.md", "--timeout", "1e20"],
        &["wait", "plan.md", "--timeout", "inf"],
        &["wait", "plan.md", "--timeout", "nan"],
        &["wait", "plan.md", "--timeout", "86401"],
        &["run", "--", "true"],
        &["run", "--session", "a/b", "--", "true"],
        &["run", "--session", "..", "--", "true"],
        &["run", "--session", "", "--", "true"],
        &["watch", "--all", "-n", "3"],
        &["--no-such-flag", "status"],
    ] {
        let out = run_in(dir.path(), args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: stdout {} stderr {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(!out.stderr.is_empty(), "{args:?} says nothing");
    }
}

#[test]
fn help_lists_every_verb_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(dir.path(), &["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for verb in [
        "transfer", "accept", "decline", "withdraw", "status", "whoami", "watch", "run",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(verb)),
            "{verb} missing from:\n{help}"
        );
    }
    assert!(help.contains("--json"), "{help}");
    assert!(help.contains("4 no coherent volume here"), "{help}");
    let out = run_in(dir.path(), &["transfer", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    assert!(
        help.contains("--to <SESSION>") && help.contains("--note <TEXT>"),
        "{help}"
    );
    let out = run_in(dir.path(), &["--version"]);
    assert_eq!(out.status.code(), Some(0));
}
