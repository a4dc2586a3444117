//! The `coherent` CLI where no mount is needed: usage errors, "no volume here", `run`,
//! help, completions and the man page; at the end, the session behaviours that need a real
//! mount (the `export` trap warning of `whoami`, a node process under `coherent run`).
//! (The verbs end to end live with the mount's tests.)

use crate::coherent;
use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn coherent() -> Command {
    Command::new(crate::common::CLI)
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
        &["wait", "plan.md"],
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

#[test]
fn run_without_a_command_starts_the_shell_in_the_session() {
    let name = format!("clitests{}", std::process::id());
    let mut child = coherent()
        .args(["run", "--session", &name])
        .env("SHELL", "/bin/sh")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"echo \"in $COHERENT_SESSION\"; exit 3\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if let Some(m) = common::writable_cgroup2() {
        let _ = std::fs::remove_dir(m.join(format!("coherent-session-{name}")));
    }
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out.stdout), format!("in {name}\n"));
}

#[test]
fn every_argument_has_help_and_completions_and_man_page_print() {
    let dir = tempfile::tempdir().unwrap();
    for verb in [
        "transfer",
        "accept",
        "decline",
        "withdraw",
        "status",
        "whoami",
        "register",
        "watch",
        "run",
        "mcp",
        "hook",
        "install",
        "fsmonitor",
        "completions",
        "man",
    ] {
        let out = run_in(dir.path(), &[verb, "-h"]);
        assert_eq!(out.status.code(), Some(0), "{verb}");
        let help = text(&out.stdout);
        // clap prints an argument with no help as its name alone on the line
        for line in help.lines().map(str::trim) {
            let bare = (line.starts_with('<') || line.starts_with('[') || line.starts_with('-'))
                && !line.contains("  ");
            assert!(!bare, "{verb}: `{line}` has no help:\n{help}");
        }
        // --json only where there is a reply to print
        let has_json = help.contains("--json");
        let wants_json = !matches!(
            verb,
            "run" | "mcp" | "hook" | "install" | "fsmonitor" | "completions" | "man"
        );
        assert_eq!(has_json, wants_json, "{verb}:\n{help}");
        assert_eq!(help.contains("--verbose"), verb == "run", "{verb}:\n{help}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let out = run_in(dir.path(), &["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = text(&out.stdout);
        assert!(
            script.contains("coherent") && script.contains("transfer"),
            "{shell}"
        );
    }
    // the bash script loads in bash and completes a verb
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source <({} completions bash) && COMP_WORDS=(coherent tra) COMP_CWORD=1 && \
             _coherent coherent tra coherent && echo \"${{COMPREPLY[@]}}\"",
            crate::common::CLI
        ))
        .output()
        .unwrap();
    assert!(
        text(&out.stdout).contains("transfer"),
        "{}",
        text(&out.stderr)
    );
    let out = run_in(dir.path(), &["man"]);
    assert_eq!(out.status.code(), Some(0));
    let roff = text(&out.stdout);
    assert!(roff.contains(".TH coherent 1"), "{roff}");
    assert!(
        roff.contains("transfer") && roff.contains("Exit codes"),
        "{roff}"
    );
}

#[test]
fn whoami_warns_about_the_export_trap() {
    use coherent::{sh_env, Root};
    let m = common::Mount::new(true);
    let cli = coherent::CLI;
    // a shell started with no session exports one: the shell itself is still uid:N
    let r = sh_env(
        &m,
        &[],
        &format!("export COHERENT_SESSION=alice; {cli} whoami; true"),
    );
    assert!(r.ok(), "{}", r.show());
    assert!(r.out.contains("you are session alice"), "{}", r.show());
    assert!(r.err.contains("warning"), "{}", r.show());
    assert!(
        r.err.contains("coherent run --session alice"),
        "{}",
        r.show()
    );
    // the same shell started in the session, or `coherent run`: no warning
    let r = sh_env(
        &m,
        &[("COHERENT_SESSION", "alice")],
        &format!("{cli} whoami; true"),
    );
    assert!(r.ok() && r.err.is_empty(), "{}", r.show());
    let r = coherent::run_in(
        m.root(),
        &[],
        Command::new(cli)
            .args(["run", "--session", "alice", "--", "sh", "-c"])
            .arg(format!("{cli} whoami; true")),
    );
    assert!(r.ok() && r.err.is_empty(), "{}", r.show());
    assert!(r.out.contains("you are session alice"), "{}", r.show());
}

#[test]
fn a_node_process_under_coherent_run_is_fenced_like_a_shell() {
    use coherent::{cli, sh_ok, Root};
    assert!(
        Command::new("node").arg("--version").output().is_ok(),
        "node is not installed (bash scripts/deps.sh installs nodejs)"
    );
    let m = common::Mount::new(true);
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    assert!(cli(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]).ok());
    let node = |who: &str| {
        coherent::run_in(
            m.root(),
            &[],
            Command::new(coherent::CLI)
                .args(["run", "--session", who, "--", "node", "-e"])
                .arg("require('fs').appendFileSync('plan.md', 'x\\n')"),
        )
    };
    let r = node("alice");
    assert_ne!(r.code, Some(0), "{}", r.show());
    assert!(r.err.contains("EACCES"), "{}", r.show());
    let r = node("bob");
    assert!(r.ok(), "{}", r.show());
    if let Some(cg) = common::writable_cgroup2() {
        for s in ["alice", "bob"] {
            let _ = std::fs::remove_dir(cg.join(format!("coherent-session-{s}")));
        }
    }
}

#[test]
fn wait_on_a_path_without_a_record_is_refused_promptly() {
    use coherent::{cli, sh_ok};
    let m = common::Mount::new(true);
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    let t0 = std::time::Instant::now();
    let r = cli(&m, Some("alice"), &["wait", "plan.md", "--timeout", "20"]);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(15),
        "{}",
        r.show()
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(r.err.contains("refused ("), "{}", r.show());
    let r = cli(
        &m,
        Some("alice"),
        &["wait", "--json", "plan.md", "--timeout", "20"],
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert_eq!(r.json()["ok"], serde_json::json!(false), "{}", r.show());
}

/// Runs `coherent ARGS` in `dir` with stdout a pipe whose reader is already gone (as after
/// `| head -1` has read its line): the first write fails with EPIPE.
fn into_closed_pipe(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just created and are owned here alone.
    let (read, write) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    drop(read);
    let mut cmd = coherent();
    cmd.args(args)
        .current_dir(dir)
        .env_remove("COHERENT_SESSION")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(write)
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn coherent");
    drop(cmd);
    let mut stderr = Vec::new();
    std::io::Read::read_to_end(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let status = common::wait_child(&mut child, Duration::from_secs(30)).expect("coherent ends");
    std::process::Output {
        status,
        stdout: Vec::new(),
        stderr,
    }
}

/// Quiet: killed by SIGPIPE (the shell's 141, as `yes | head -1`; `run` passes on its
/// command's 141) or exit 0, and no panic,
/// no "Broken pipe" message, no backtrace on stderr.
fn assert_quiet_on_closed_pipe(args: &[&str], out: &std::process::Output) {
    use std::os::unix::process::ExitStatusExt;
    let err = text(&out.stderr);
    assert!(
        out.status.signal() == Some(libc::SIGPIPE) || matches!(out.status.code(), Some(0 | 141)),
        "{args:?}: {:?}, stderr {err}",
        out.status
    );
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe") && !err.contains("backtrace"),
        "{args:?}: stderr {err}"
    );
}

#[test]
fn a_closed_pipe_ends_every_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["completions", "bash"][..],
        &["completions", "zsh"],
        &["man"],
        &["--help"],
        &["status", "--help"],
        &["--version"],
    ] {
        let out = into_closed_pipe(dir.path(), &[], args);
        assert_quiet_on_closed_pipe(args, &out);
    }
    // the same on a volume: a verb's reply, the state log, and `run`'s own command
    use coherent::{cli, sh_ok, Root};
    let m = common::Mount::new(true);
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    assert!(cli(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]).ok());
    for args in [
        &["status", "plan.md"][..],
        &["status"],
        &["status", "--json"],
        &["whoami"],
        &["watch", "--all"],
        &["watch", "--all", "--json"],
        &["wait", "plan.md", "--until", "accepted", "--timeout", "0"],
    ] {
        let out = into_closed_pipe(m.root(), &[("COHERENT_SESSION", "alice")], args);
        assert_quiet_on_closed_pipe(args, &out);
    }
    // `coherent run` leaves its command the default SIGPIPE action too (without its
    // sandbox: this mount's backing directory is under /tmp, a scratch place)
    let out = into_closed_pipe(
        m.root(),
        &[],
        &[
            "run",
            "--no-landlock",
            "--session",
            "alice",
            "--",
            "sh",
            "-c",
            "yes",
        ],
    );
    assert_quiet_on_closed_pipe(&["run", "yes"], &out);
}
