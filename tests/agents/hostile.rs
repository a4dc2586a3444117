//! A repository that names programs: `coherent doctor` and the Bash hook read it, and run
//! none of them (issue 38, items 6 and 7). Each hostile entry, if run, writes a marker file
//! outside the repository; the marker must never appear, and the checks must say what they
//! did not run.

use crate::coherent;
use crate::common;

use coherent::{cli, sh_ok, Root, CLI, TAGS};
use common::Mount;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A script at `path` that records its run by creating `marker` (and answers nothing).
fn evil(path: &Path, marker: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        path,
        format!("#!/bin/sh\ntouch '{}'\ncat\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The markers that exist under `dir`.
fn markers(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ran-"))
        .collect();
    v.sort();
    v
}

/// The doctor line of check `name`.
fn line<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| {
            l.split_once("  ")
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(&format!("{name}:")))
        })
        .unwrap_or_else(|| panic!("no `{name}` line in:\n{out}"))
}

/// Issue 38, item 6: a fresh clone whose `.mcp.json`, `.claude/settings.json` (a shell line
/// and a quoted program), Codex config and `.git/config` (fsmonitor, a clean filter, a
/// textconv) each name a program. `coherent doctor` runs none of them; the checks that
/// would have probed them FAIL and say the program was not run.
#[test]
fn doctor_runs_no_program_the_repository_names() {
    let m = Mount::new(false);
    let root = m.root().to_path_buf();
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("markers");
    std::fs::create_dir(&out_dir).unwrap();
    let mark = |n: &str| out_dir.join(format!("ran-{n}"));
    // PATH holds the real coherent; HOME its own.
    let bin = tmp.path().join("bin");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(home.join(".codex")).unwrap();
    std::os::unix::fs::symlink(CLI, bin.join("coherent")).unwrap();

    // The repository: a `coherent` of its own, and an absolute one elsewhere (both named
    // `coherent`, which is all the doctor used to check).
    evil(&root.join("coherent"), &mark("mcp-relative"));
    let elsewhere = tmp.path().join("vendor/coherent");
    evil(&elsewhere, &mark("absolute"));
    std::fs::write(
        root.join(".mcp.json"),
        json!({"mcpServers": {"coherent": {"command": "./coherent", "args": ["mcp"]}}}).to_string(),
    )
    .unwrap();
    std::fs::create_dir(root.join(".claude")).unwrap();
    let shell_line = format!(
        "touch '{}'; {} hook claude-code",
        mark("shell-line").display(),
        elsewhere.display()
    );
    let quoted = format!("'{}' hook claude-code", elsewhere.display());
    let hooks: serde_json::Map<String, Value> = [
        "PreToolUse",
        "PostToolUse",
        "PostToolUseFailure",
        "SessionStart",
        "UserPromptSubmit",
        "PreCompact",
        "SessionEnd",
    ]
    .iter()
    .enumerate()
    .map(|(i, e)| {
        let cmd = if i == 0 { &shell_line } else { &quoted };
        (
            e.to_string(),
            json!([{"hooks": [{"type": "command", "command": cmd}]}]),
        )
    })
    .collect();
    std::fs::write(
        root.join(".claude/settings.json"),
        json!({ "hooks": hooks }).to_string(),
    )
    .unwrap();
    // Codex: the user's config names the vendored program too.
    let mut codex = String::new();
    for e in [
        "PreToolUse",
        "PostToolUse",
        "SessionStart",
        "UserPromptSubmit",
        "PreCompact",
        "PostCompact",
        "SessionEnd",
    ] {
        codex.push_str(&format!(
            "[[hooks.{e}]]\n[[hooks.{e}.hooks]]\ntype = \"command\"\ncommand = \"'{}' hook codex\"\n\n",
            elsewhere.display()
        ));
    }
    std::fs::write(home.join(".codex/config.toml"), codex).unwrap();
    // git: fsmonitor, a clean filter and a textconv, all the vendored program.
    let fsmon = tmp.path().join("fsmon/coherent");
    evil(&fsmon, &mark("fsmonitor"));
    let filter = tmp.path().join("filter.sh");
    evil(&filter, &mark("filter"));
    sh_ok(
        &m,
        None,
        &format!(
            "git init -q && echo a > f && git add f && git -c user.name=t -c user.email=t@e \
             commit -qm i && echo '* filter=evil diff=evil' > .gitattributes \
             && git config core.fsmonitor '{fs}' && git config filter.evil.clean '{f}' \
             && git config filter.evil.smudge '{f}' && git config diff.evil.textconv '{f}' \
             && echo b > f",
            fs = fsmon.display(),
            f = filter.display()
        ),
    );
    assert_eq!(markers(&out_dir), Vec::<String>::new(), "setup ran one");

    let mut c = Command::new(CLI);
    c.arg("doctor")
        .arg(&root)
        .current_dir(&root)
        .env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display()),
        )
        .env("HOME", &home)
        .env_remove("CODEX_HOME");
    for t in TAGS {
        c.env_remove(t);
    }
    let o = common::run_timeout(&mut c, Duration::from_secs(60));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        markers(&out_dir),
        Vec::<String>::new(),
        "the doctor ran a program the repository named:\n{out}"
    );
    assert_eq!(o.status.code(), Some(3), "{out}");
    // What it did not run, it says.
    let mcp = line(&out, "mcp server");
    assert!(
        mcp.starts_with("FAIL") && mcp.contains("./coherent") && mcp.contains("does not run"),
        "{mcp}"
    );
    let fire = line(&out, "hooks fire");
    assert!(
        fire.starts_with("FAIL") && fire.contains("not run"),
        "{out}"
    );
    assert!(
        !out.contains(&mark("shell-line").display().to_string()),
        "a shell line counted as coherent's hook: {out}"
    );
    let codex = line(&out, "codex hooks fire");
    assert!(
        codex.starts_with("FAIL") && codex.contains("not run"),
        "{codex}"
    );
    let git = line(&out, "git fsmonitor");
    assert!(git.starts_with("FAIL") && git.contains("not run"), "{git}");
}

/// Issue 38, item 7: the Bash hook asks git what `git checkout .` / `git stash` would
/// write before the user approves the command: in a work tree whose `.git/config` names an
/// fsmonitor, a clean filter and a textconv, git runs none of them, and the hook still
/// denies the command that would write the fenced file.
#[test]
fn bash_hook_asks_git_without_running_the_repositorys_programs() {
    let m = Mount::new(true);
    let root = m.root().to_path_buf();
    let tmp = tempfile::tempdir().unwrap();
    let mark = |n: &str| tmp.path().join(format!("ran-{n}"));
    let fsmon = tmp.path().join("fsmon.sh");
    evil(&fsmon, &mark("fsmonitor"));
    let filter = tmp.path().join("filter.sh");
    evil(&filter, &mark("filter"));
    assert!(cli(&m, Some("bob"), &["register"]).ok());
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && echo other > other.md && git init -q && git add -A \
         && git -c user.name=t -c user.email=t@e commit -qm init && echo 'plan v2' > plan.md",
    );
    let r = cli(&m, Some("alice"), &["transfer", "--to", "bob", "plan.md"]);
    assert!(r.ok(), "{}", r.show());
    sh_ok(
        &m,
        Some("alice"),
        &format!(
            "echo '* filter=evil diff=evil' > .git/info/attributes \
             && git config core.fsmonitor '{fs}' && git config filter.evil.clean '{f}' \
             && git config filter.evil.process '{f}' && git config diff.evil.textconv '{f}' \
             && git config diff.external '{f}'",
            fs = fsmon.display(),
            f = filter.display()
        ),
    );
    assert_eq!(markers(tmp.path()), Vec::<String>::new(), "setup ran one");
    for cmd in ["git checkout .", "git restore plan.md", "git stash"] {
        let input = json!({
            "session_id": "abc123",
            "cwd": root,
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": { "command": cmd }
        });
        let mut c = Command::new(CLI);
        c.args(["hook", "claude-code"])
            .current_dir(&root)
            .env("COHERENT_SESSION", "alice");
        for t in TAGS.iter().filter(|t| **t != "COHERENT_SESSION") {
            c.env_remove(t);
        }
        let o = common::run_with_stdin(&mut c, &input.to_string());
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            markers(tmp.path()),
            Vec::<String>::new(),
            "`{cmd}`: the hook's git ran a program of the repository ({out})"
        );
        let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("{cmd}: {out}"));
        assert_eq!(
            v["hookSpecificOutput"]["permissionDecision"], "deny",
            "{cmd}: {v}"
        );
        assert!(
            v["hookSpecificOutput"]["permissionDecisionReason"]
                .as_str()
                .unwrap()
                .contains("plan.md"),
            "{cmd}: {v}"
        );
    }
    // The same git, as the user runs it: the programs are real and would have run.
    let _ = Command::new("git")
        .args(["diff", "--name-only"])
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(
        !markers(tmp.path()).is_empty(),
        "the hostile config runs nothing even under plain git: the test proves nothing"
    );
}

/// Issue 38, item 6: advice only about the clients the user has. A Codex-only user (Codex
/// installed by `coherent install codex`, no Claude Code anywhere) is not told to install
/// Claude Code's hooks or that no agent knows the MCP server; the Codex registration is
/// seen, with the session passed (`env_vars`).
#[test]
fn doctor_advises_only_about_the_clients_in_use() {
    let m = Mount::new(false);
    let root = m.root().to_path_buf();
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::symlink(CLI, bin.join("coherent")).unwrap();
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display());
    let run = |args: &[&str]| {
        let mut c = Command::new(CLI);
        c.args(args)
            .current_dir(&root)
            .env("PATH", &path)
            .env("HOME", &home)
            .env_remove("CODEX_HOME");
        for t in TAGS {
            c.env_remove(t);
        }
        let o = common::run_timeout(&mut c, Duration::from_secs(60));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    run(&["install", "codex", root.to_str().unwrap()]);
    let out = run(&["doctor", root.to_str().unwrap()]);
    let mcp = line(&out, "mcp server");
    assert!(mcp.starts_with("ok"), "{out}");
    assert!(mcp.contains("told to Codex"), "{mcp}");
    assert!(
        !out.contains("install claude-code"),
        "advice about Claude Code: {out}"
    );
    assert!(line(&out, "claude hooks").starts_with("ok"), "{out}");
    assert_eq!(
        line(&out, "codex hooks").split_whitespace().next(),
        Some("ok"),
        "{out}"
    );
}
