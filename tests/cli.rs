//! The `coherent` CLI where no mount is needed: usage errors, "no volume here", `run`.
//! (End-to-end tests against a mounted volume live with the mount's tests.)

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn coherent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coherent"))
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    coherent()
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
        &["run", "--session", "x"],
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

#[test]
fn no_volume_here_exits_4_and_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("a/b");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("plan.md"), "x").unwrap();
    // a `.coherent/ctl` in a plain directory is not a volume: it must be a FUSE mount root
    std::fs::create_dir_all(dir.path().join(".coherent")).unwrap();
    std::fs::write(dir.path().join(".coherent/ctl"), "").unwrap();
    let canon = std::fs::canonicalize(&sub).unwrap();
    for args in [
        &["status"][..],
        &["status", "plan.md"],
        &["whoami"],
        &["register"],
        &["watch"],
        &["transfer", "--to", "bob", "plan.md"],
        &["accept", "plan.md"],
        &["decline", "plan.md", "--json"],
        &["withdraw", "plan.md"],
        &["accept", "does/not/exist.md"],
    ] {
        let out = run_in(&sub, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {err}");
        assert!(err.contains("no coherent volume here"), "{args:?}: {err}");
        assert!(
            err.contains(&canon.display().to_string()),
            "{args:?}: {err}"
        );
        assert!(err.contains("coherent-mount DIR"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        // the plain directory was left alone
        assert_eq!(
            std::fs::read(dir.path().join(".coherent/ctl")).unwrap(),
            b"",
            "{args:?} wrote to a fake ctl"
        );
    }
}

#[test]
fn run_sets_the_session_env_and_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("clitest{}", std::process::id());
    let out = coherent()
        .args(["run", "-v", "--session", &name, "--", "sh", "-c"])
        .arg("echo \"$COHERENT_SESSION\"; cat /proc/self/cgroup")
        .current_dir(dir.path())
        .env("COHERENT_SESSION", "outer")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    let cg = common::writable_cgroup2();
    common::remove_session_cgroups(&name, Duration::ZERO);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout.lines().next(), Some(name.as_str()), "{stdout}");
    let v2 = stdout
        .lines()
        .find(|l| l.starts_with("0::"))
        .unwrap_or_default()
        .to_string();
    if cg.is_some() {
        assert!(
            v2.split('/')
                .any(|seg| seg == format!("coherent-session-{name}")),
            "cgroup v2 is writable but the child is in {v2:?}; stderr: {stderr}"
        );
        assert!(stderr.contains("joined cgroup"), "{stderr}");
    } else {
        assert!(!v2.contains("coherent-session-"), "{v2}");
        assert!(stderr.contains("COHERENT_SESSION only"), "{stderr}");
    }
}

#[test]
fn run_is_quiet_without_v_and_passes_the_exit_code() {
    let name = format!("clitestq{}", std::process::id());
    let out = coherent()
        .args(["run", "--session", &name, "--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    common::remove_session_cgroups(&name, Duration::ZERO);
    assert_eq!(out.status.code(), Some(7));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));

    // arguments after CMD, including ones that look like options, go to CMD untouched
    let out = coherent()
        .args([
            "run",
            "--session",
            &name,
            "--",
            "echo",
            "--json",
            "-v",
            "a b",
        ])
        .output()
        .unwrap();
    common::remove_session_cgroups(&name, Duration::ZERO);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "--json -v a b\n");

    let out = coherent()
        .args(["run", "--session", &name, "--", "/no/such/program"])
        .output()
        .unwrap();
    common::remove_session_cgroups(&name, Duration::ZERO);
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("/no/such/program"));
}
