//! `coherent doctor [DIR]`: does this install work? One line per check (ok, warn or FAIL),
//! each problem with its fix (docs/install.md#doctor).
//!
//! Every check looks at the real thing rather than at a file that says it should work: the
//! mount answers `.coherent/whoami`, the hook command registered in Claude Code's settings
//! is run with a synthetic `SessionStart` and must answer hook JSON (Codex's, from its
//! config.toml, with only the fields Codex documents), the MCP server is
//! started and must list its tools, the binaries on PATH are asked their version.

use crate::install::probe;
use crate::{call, find_root, Fail};
use coherent_wire::control::Request;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Exit code when a check failed (1 is a usage error, 2 a refusal, 4 no volume).
pub const EXIT_FAILED: u8 = 3;

/// How long a probed program (hook, MCP server, `--version`) may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The tools `coherent mcp` must list (docs/control.md).
const MCP_TOOLS: [&str; 8] = [
    "whoami", "status", "inbox", "transfer", "accept", "decline", "withdraw", "wait",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        }
    }
}

/// One check's verdict.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub level: Level,
    pub message: String,
    /// What to do about it (warn and FAIL only).
    pub fix: Option<String>,
}

fn ok(name: &'static str, message: impl Into<String>) -> Check {
    Check {
        name,
        level: Level::Ok,
        message: message.into(),
        fix: None,
    }
}

fn warn(name: &'static str, message: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name,
        level: Level::Warn,
        message: message.into(),
        fix: Some(fix.into()),
    }
}

fn failed(name: &'static str, message: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name,
        level: Level::Fail,
        message: message.into(),
        fix: Some(fix.into()),
    }
}

/// `coherent doctor [DIR] [--json]`: exit 0 unless a check FAILed ([`EXIT_FAILED`]).
pub fn run(dir: Option<&Path>, json: bool) -> Result<(), Fail> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_dir()
            .map_err(|e| Fail::usage(format!("cannot read the current directory: {e}")))?,
    };
    let dir = dir.canonicalize().map_err(|e| {
        Fail::usage(format!(
            "{}: {e} (name a directory on the volume)",
            dir.display()
        ))
    })?;
    // A probed hook that exits before reading its input (a command not found) closes the
    // pipe the probe writes to: with SIGPIPE's default action that write would kill the
    // doctor. Ignored, the write fails with EPIPE and the probe reports the exit status.
    crate::set_sigpipe(libc::SIG_IGN);
    let checks = checks(&dir);
    let mut stdout = std::io::stdout().lock();
    if json {
        let list: Vec<Value> = checks
            .iter()
            .map(|c| {
                json!({
                    "check": c.name,
                    "level": c.level.word().to_ascii_lowercase(),
                    "message": c.message,
                    "fix": c.fix,
                })
            })
            .collect();
        let failed = checks.iter().any(|c| c.level == Level::Fail);
        // a reader that went away (`| head`) is not the doctor's failure
        let _ = writeln!(
            stdout,
            "{}",
            json!({"dir": dir.display().to_string(), "ok": !failed, "checks": list})
        );
    } else {
        for c in &checks {
            if writeln!(stdout, "{}", line(c)).is_err() {
                break;
            }
        }
    }
    if checks.iter().any(|c| c.level == Level::Fail) {
        return Err(Fail {
            code: EXIT_FAILED,
            message: String::new(),
        });
    }
    Ok(())
}

/// `LEVEL  NAME: MESSAGE; fix: FIX`, one line (names from the disk are quoted by the
/// checks that show them).
fn line(c: &Check) -> String {
    let mut s = format!(
        "{:<4}  {}: {}",
        c.level.word(),
        c.name,
        one_line(&c.message)
    );
    if let Some(f) = &c.fix {
        s.push_str("; fix: ");
        s.push_str(&one_line(f));
    }
    s
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every check, in the order a person would fix them.
fn checks(dir: &Path) -> Vec<Check> {
    let mut out = Vec::new();
    let root = mount_check(dir, &mut out);
    if let Some(root) = &root {
        volume_checks(root, &mut out);
    }
    binaries(&mut out);
    out.push(mount_helper());
    hooks(dir, root.is_some(), &mut out);
    codex_hooks(dir, root.is_some(), &mut out);
    out.push(mcp(dir));
    out.push(fsmonitor(dir));
    out.push(passthrough_kernel());
    out.push(landlock());
    out.push(request_timeout(
        read_sysctl("default_request_timeout"),
        read_sysctl("max_request_timeout"),
    ));
    out
}

// ---- the mount ----------------------------------------------------------------------------

/// The volume at `dir` answers `.coherent/whoami`: its root, or a FAIL.
fn mount_check(dir: &Path, out: &mut Vec<Check>) -> Option<PathBuf> {
    let root = match find_root(dir, dir) {
        Ok(r) => r,
        Err(f) => {
            // The fix goes on its own; the CLI's message carries one in its text.
            let msg = f.message.trim_start_matches("coherent: ");
            let msg = msg.split("; unmount it").next().unwrap_or(msg).to_string();
            let fix = if msg.contains("not answering") || msg.contains("daemon") {
                format!(
                    "the daemon behind it is gone: `fusermount3 -u {0}` (or `umount -l {0}`), \
                     then mount it again",
                    dir.display()
                )
            } else {
                format!(
                    "mount the workspace: `coherent-mount {0}` (in place) or `coherent-mount \
                     BACKING {0}`",
                    dir.display()
                )
            };
            out.push(failed("mount", msg, fix));
            return None;
        }
    };
    match std::fs::read_to_string(root.join(".coherent/whoami")) {
        Ok(text) => {
            let who: Value = serde_json::from_str(text.trim()).unwrap_or(Value::Null);
            let session = who["session"].as_str().unwrap_or("?");
            let via = who["via"]["kind"].as_str().unwrap_or("?");
            out.push(ok(
                "mount",
                format!(
                    "{} answers (you are session {} via {via})",
                    root.display(),
                    quote(session)
                ),
            ));
            Some(root)
        }
        Err(e) => {
            out.push(failed(
                "mount",
                format!("{}/.coherent/whoami cannot be read: {e}", root.display()),
                format!(
                    "the daemon behind it is gone or stuck: `fusermount3 -u {0}` (or `umount \
                     -l {0}`), then mount it again",
                    root.display()
                ),
            ));
            None
        }
    }
}

/// What the volume's `status` says of itself: the data mode and the coordinator.
fn volume_checks(root: &Path, out: &mut Vec<Check>) {
    let status = match call(root, &Request::Status { path: None }) {
        Ok(r) if r.is_ok() => r.body().get("status").cloned().unwrap_or(Value::Null),
        Ok(r) => {
            out.push(failed(
                "status",
                format!("the volume refused `status`: {}", r.body()),
                "see the daemon's log",
            ));
            return;
        }
        Err(f) => {
            out.push(failed("status", f.message, "see the daemon's log"));
            return;
        }
    };
    out.push(data_mode(status.get("data_mode").and_then(Value::as_str)));
    if let Some(c) = status.get("coordinator") {
        out.push(coordinator(c));
    }
}

/// How file data flows, and whether that is what it could be.
pub fn data_mode(mode: Option<&str>) -> Check {
    const N: &str = "data mode";
    let Some(mode) = mode else {
        return warn(
            N,
            "the daemon does not say how file data flows (a coherent-mount older than this \
             coherent)",
            "remount with the coherent-mount of this version",
        );
    };
    if mode.starts_with("passthrough") {
        return ok(N, mode);
    }
    if mode.contains("--no-passthrough") || mode.contains("multi-host") {
        // Chosen, or required by the fence: nothing to fix.
        return ok(N, mode);
    }
    let fix = if mode.contains("CAP_SYS_ADMIN") {
        "mount as root (FUSE passthrough needs CAP_SYS_ADMIN); reads and writes work either way"
    } else if mode.contains("kernel") {
        "a 6.9+ kernel gives FUSE passthrough; reads and writes work either way"
    } else {
        "see the daemon's log (`data mode:` lines)"
    };
    warn(N, mode, fix)
}

/// A multi-host volume: etcd reached, over TLS, with a user.
pub fn coordinator(c: &Value) -> Check {
    const N: &str = "etcd";
    let eps = c["endpoints"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let tls = c["tls"].as_bool() == Some(true);
    let user = c["user"].as_str();
    if c["connected"].as_bool() != Some(true) {
        return failed(
            N,
            format!(
                "etcd {eps} is not reachable ({}): transfers fail coordinator_unavailable and \
                 writes to handed files are refused",
                c["error"].as_str().unwrap_or("no error given")
            ),
            "start etcd or fix the network to it; `coherent status` shows when it is back",
        );
    }
    if !tls {
        return failed(
            N,
            format!(
                "etcd {eps} is reached without TLS{}: whoever can reach it can read the \
                 credentials or lift fences",
                if user.is_some() {
                    ""
                } else {
                    " and without a user"
                }
            ),
            "mount with --coordinator etcds://... and --coordinator-auth FILE (ca=, \
             user=, password=; docs/multi-host.md)",
        );
    }
    match user {
        Some(u) => ok(
            N,
            format!("etcd {eps} reached over TLS as user {}", quote(u)),
        ),
        None => warn(
            N,
            format!("etcd {eps} reached over TLS without an etcd user"),
            "give it a user in --coordinator-auth (user=, password=) or client certificates \
             (cert=, key=): whoever can write the key space can lift fences",
        ),
    }
}

// ---- binaries -----------------------------------------------------------------------------

/// `coherent` and `coherent-mount` on PATH, and both of this version.
fn binaries(out: &mut Vec<Check>) {
    let mine = env!("CARGO_PKG_VERSION");
    let install = "install both from one build: `cargo install --path .` (then make sure \
                   ~/.cargo/bin is on PATH) or the Debian package";
    let mut versions = Vec::new();
    for name in ["coherent", "coherent-mount"] {
        let check_name = if name == "coherent" {
            "coherent on PATH"
        } else {
            "coherent-mount on PATH"
        };
        let Some(path) = probe::which(name) else {
            let why = if name == "coherent" {
                "the hooks and the MCP server run it by that name"
            } else {
                "mount(8) helpers, the systemd unit and the docs run it by that name"
            };
            out.push(failed(
                check_name,
                format!("`{name}` is not on PATH: {why}"),
                install,
            ));
            continue;
        };
        match version_of(&path) {
            Some(v) => {
                versions.push((name, v.clone()));
                if v == mine {
                    out.push(ok(check_name, format!("{} {v}", path.display())));
                } else {
                    out.push(failed(
                        check_name,
                        format!("{} is version {v}, this coherent is {mine}", path.display()),
                        install,
                    ));
                }
            }
            None => out.push(failed(
                check_name,
                format!("{} does not answer --version", path.display()),
                install,
            )),
        }
    }
}

/// The version a `coherent` or `coherent-mount` binary reports (`NAME VERSION`).
fn version_of(bin: &Path) -> Option<String> {
    let o = output_within(Command::new(bin).arg("--version"), None, PROBE_TIMEOUT).ok()?;
    let text = String::from_utf8_lossy(&o.stdout);
    text.split_whitespace().nth(1).map(String::from)
}

/// The mount helper mount(8) runs for type `fuse.coherent-mount`.
fn mount_helper() -> Check {
    const N: &str = "mount helper";
    let fix = "ln -s \"$(command -v coherent-mount)\" /usr/sbin/mount.fuse.coherent-mount \
               (the Debian package installs it)";
    for p in [
        "/usr/sbin/mount.fuse.coherent-mount",
        "/sbin/mount.fuse.coherent-mount",
    ] {
        let p = Path::new(p);
        if p.symlink_metadata().is_err() {
            continue;
        }
        return match version_of(p) {
            Some(v) => ok(N, format!("{} (coherent-mount {v})", p.display())),
            None => failed(
                N,
                format!(
                    "{} does not run (a dangling link?): `mount -t fuse.coherent-mount` fails",
                    p.display()
                ),
                fix,
            ),
        };
    }
    warn(
        N,
        "no /usr/sbin/mount.fuse.coherent-mount: `mount -t fuse.coherent-mount` and fstab \
         lines go through mount.fuse3, which finds coherent-mount only on its own PATH",
        fix,
    )
}

// ---- Claude Code ----------------------------------------------------------------------------

/// The Claude Code settings files that apply to a session started in `dir`.
fn claude_settings(dir: &Path) -> Vec<PathBuf> {
    let mut v = vec![
        dir.join(".claude/settings.json"),
        dir.join(".claude/settings.local.json"),
    ];
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        v.push(PathBuf::from(home).join(".claude/settings.json"));
    }
    v
}

/// Our hook commands in one settings file, by event.
fn our_hooks(settings: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(hooks) = settings.get("hooks").and_then(Value::as_object) else {
        return out;
    };
    for (event, groups) in hooks {
        for g in groups.as_array().into_iter().flatten() {
            for h in g
                .get("hooks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(cmd) = h.get("command").and_then(Value::as_str) {
                    if probe::is_claude_hook(cmd) {
                        out.push((event.clone(), cmd.to_string()));
                    }
                }
            }
        }
    }
    out
}

/// The hooks registered (for every event an install adds) and firing (a live probe).
fn hooks(dir: &Path, volume: bool, out: &mut Vec<Check>) {
    const N: &str = "claude hooks";
    let install = format!("coherent install claude-code {}", dir.display());
    let mut found: Vec<(PathBuf, Vec<(String, String)>)> = Vec::new();
    let mut bad = Vec::new();
    for f in claude_settings(dir) {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => {
                let ours = our_hooks(&v);
                if !ours.is_empty() {
                    found.push((f, ours));
                }
            }
            Err(e) => bad.push(failed(
                N,
                format!(
                    "{} is not valid JSON ({e}): Claude Code ignores it",
                    f.display()
                ),
                format!("fix the file, then `{install}`"),
            )),
        }
    }
    out.extend(bad);
    if found.is_empty() && !claude_in_use(dir) {
        out.push(ok(
            N,
            "Claude Code is not set up here (not on PATH, no settings)",
        ));
        return;
    }
    if found.is_empty() {
        out.push(warn(
            N,
            format!(
                "no coherent hooks in {}: a Claude Code agent meets EACCES without being \
                 told why",
                claude_settings(dir)
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            install,
        ));
        return;
    }
    let all: Vec<(String, String)> = found.iter().flat_map(|(_, h)| h.clone()).collect();
    let files = found
        .iter()
        .map(|(f, _)| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let fire_fix = format!(
        "the command must be `coherent hook claude-code` naming the `coherent` on PATH (the \
         doctor runs no other program): `{install}` writes it so"
    );
    let agent = AgentHooks {
        registered: N,
        fire: "hooks fire",
        agent: "claude-code",
        events: probe::claude_hook_events(),
        probe: probe_hook,
        fire_fix,
        install,
    };
    agent.check(&files, &all, volume, dir, out);
}

/// One agent's hooks as the doctor checks them once they are found: every event an
/// install adds is registered, and each distinct command fires (run as the agent runs it).
struct AgentHooks {
    /// The check's names: registered, and firing.
    registered: &'static str,
    fire: &'static str,
    /// The agent word of `coherent hook AGENT`.
    agent: &'static str,
    /// The events `coherent install` registers for this agent.
    events: Vec<&'static str>,
    /// Run a vetted `coherent` binary as the hook with a synthetic `SessionStart` and
    /// judge its answer.
    probe: fn(&Path, &Path) -> Result<String, String>,
    /// The fix when a command does not fire, and the install command.
    fire_fix: String,
    install: String,
}

impl AgentHooks {
    fn check(
        &self,
        shown: &str,
        hooks: &[(String, String)],
        volume: bool,
        dir: &Path,
        out: &mut Vec<Check>,
    ) {
        let missing: Vec<&str> = self
            .events
            .iter()
            .copied()
            .filter(|e| !hooks.iter().any(|(ev, _)| ev == e))
            .collect();
        out.push(if missing.is_empty() {
            ok(self.registered, format!("registered in {shown}"))
        } else {
            failed(
                self.registered,
                format!(
                    "{shown} has coherent hooks but none for {}",
                    missing.join(", ")
                ),
                self.install.clone(),
            )
        });
        let mut cmds: Vec<&str> = hooks.iter().map(|(_, c)| c.as_str()).collect();
        cmds.sort_unstable();
        cmds.dedup();
        if !volume {
            out.push(warn(
                self.fire,
                "not probed: no volume answers here",
                "mount the workspace first",
            ));
            return;
        }
        for cmd in cmds {
            // The command line is never given to a shell: its program is resolved as the
            // agent would and run only when it is a `coherent` the doctor trusts.
            let bin = probe::hook_program(cmd, self.agent)
                .ok_or_else(|| "not a `coherent hook` command line".to_string())
                .and_then(|prog| vetted(&prog));
            let shown = quote(cmd);
            out.push(match bin.and_then(|b| (self.probe)(&b, dir)) {
                Ok(what) => ok(self.fire, format!("`{shown}` answers SessionStart: {what}")),
                Err(why) => failed(
                    self.fire,
                    format!("`{shown}` with a SessionStart input: {why}"),
                    self.fire_fix.clone(),
                ),
            });
        }
    }
}

/// The `coherent` binaries the doctor runs: the one on PATH (what the agents run by that
/// name) and itself, by their real paths. Nothing a repository's files name is added.
fn trusted_coherents() -> Vec<PathBuf> {
    [probe::which("coherent"), std::env::current_exe().ok()]
        .into_iter()
        .flatten()
        .filter_map(|p| p.canonicalize().ok())
        .collect()
}

/// The program `prog` (as a hook command or an MCP server entry names it) resolved as the
/// agent would resolve it, when that is a `coherent` the doctor trusts
/// ([`trusted_coherents`]); else why it is not run. A repository's settings can name any
/// program, and the doctor often runs as root in a fresh clone: it runs none of them.
fn vetted(prog: &str) -> Result<PathBuf, String> {
    let path = Path::new(prog);
    let found = if path.is_absolute() {
        path.canonicalize()
            .map_err(|e| format!("{} does not exist or cannot be reached ({e})", quote(prog)))?
    } else if prog.contains('/') {
        return Err(format!(
            "{} is a path relative to the directory the agent starts in: the doctor does not              run it (a repository can put any program there)",
            quote(prog)
        ));
    } else {
        probe::which(prog)
            .and_then(|p| p.canonicalize().ok())
            .ok_or_else(|| format!("`{}` is not on PATH", quote(prog)))?
    };
    if trusted_coherents().contains(&found) {
        Ok(found)
    } else {
        Err(format!(
            "{} is not the `coherent` on PATH nor this doctor's own binary: not run (a              repository's settings can name any program)",
            quote(&found.display().to_string())
        ))
    }
}

/// Run a vetted `coherent` as Claude Code's hook with a synthetic `SessionStart` and check
/// its answer is the hook JSON of that event.
fn probe_hook(bin: &Path, dir: &Path) -> Result<String, String> {
    let input = json!({
        "session_id": "coherent-doctor-probe",
        "hook_event_name": "SessionStart",
        "source": "startup",
        "cwd": dir.display().to_string(),
    });
    let o = output_within(
        Command::new(bin)
            .args(["hook", "claude-code"])
            .current_dir(dir)
            .env("CLAUDE_PROJECT_DIR", dir),
        Some(format!("{input}\n").as_bytes()),
        PROBE_TIMEOUT,
    )?;
    if !o.status.success() {
        return Err(format!(
            "exit {} ({})",
            o.status
                .code()
                .map_or("by a signal".into(), |c| c.to_string()),
            first_line(&o.stderr)
        ));
    }
    let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| {
        format!(
            "its answer is not hook JSON ({e}): {:?}",
            first_line(&o.stdout)
        )
    })?;
    let out = &v["hookSpecificOutput"];
    if out["hookEventName"] != "SessionStart" || !out["additionalContext"].is_string() {
        return Err(format!("its answer is not a SessionStart answer: {v}"));
    }
    Ok("hook JSON with the session's context".into())
}

// ---- Codex --------------------------------------------------------------------------------

/// The fields Codex documents for a `SessionStart` hook's answer (its hooks reference, the
/// `session-start.command.output` schema; the objects there are closed): top level, then
/// `hookSpecificOutput`. Codex counts an answer with any other field as a failed hook and
/// goes on without its context.
const CODEX_SESSION_START: (&[&str], &[&str]) = (
    &[
        "continue",
        "stopReason",
        "suppressOutput",
        "systemMessage",
        "hookSpecificOutput",
    ],
    &["hookEventName", "additionalContext", "env"],
);

/// The tables of an item written as `[[x]]` or as an inline array `x = [{...}]`.
fn tables(item: &toml_edit::Item) -> Vec<&dyn toml_edit::TableLike> {
    if let Some(a) = item.as_array_of_tables() {
        return a.iter().map(|t| t as &dyn toml_edit::TableLike).collect();
    }
    item.as_array()
        .into_iter()
        .flat_map(|a| a.iter())
        .filter_map(|v| v.as_inline_table())
        .map(|t| t as &dyn toml_edit::TableLike)
        .collect()
}

/// Our hook commands in Codex's config (`[[hooks.EVENT]]` groups, each with `hooks`
/// handlers), by event.
fn our_codex_hooks(doc: &toml_edit::DocumentMut) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(hooks) = doc.get("hooks").and_then(toml_edit::Item::as_table_like) else {
        return out;
    };
    for (event, groups) in hooks.iter() {
        for g in tables(groups) {
            for h in g.get("hooks").map(tables).unwrap_or_default() {
                if let Some(cmd) = h.get("command").and_then(|c| c.as_str()) {
                    if probe::is_codex_hook(cmd) {
                        out.push((event.to_string(), cmd.to_string()));
                    }
                }
            }
        }
    }
    out
}

/// Codex's hooks as `coherent install codex` writes them: registered (every event an
/// install adds) and firing (a live probe, its answer held to Codex's documented fields).
fn codex_hooks(dir: &Path, volume: bool, out: &mut Vec<Check>) {
    const N: &str = "codex hooks";
    let install = format!("coherent install codex {}", dir.display());
    let config = match probe::codex_config() {
        Ok(c) => c,
        Err(_) => {
            out.push(warn(
                N,
                "neither CODEX_HOME nor HOME is set: Codex's config.toml cannot be found",
                "set HOME (or CODEX_HOME) as Codex has it",
            ));
            return;
        }
    };
    let shown = quote(&config.display().to_string());
    let text = match std::fs::read_to_string(&config) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            out.push(failed(
                N,
                format!("cannot read {shown}: {e}"),
                "make it readable by the user Codex runs as",
            ));
            return;
        }
    };
    let doc = match text.parse::<toml_edit::DocumentMut>() {
        Ok(d) => d,
        Err(e) => {
            out.push(failed(
                N,
                format!(
                    "{shown} is not valid TOML ({}): Codex cannot read it",
                    one_line(&e.to_string())
                ),
                format!("fix the file, then `{install}`"),
            ));
            return;
        }
    };
    let ours = our_codex_hooks(&doc);
    if ours.is_empty() {
        let server = doc
            .get("mcp_servers")
            .and_then(|m| m.get(probe::MCP_SERVER))
            .is_some_and(probe::is_codex_server);
        out.push(if server {
            // installed for Codex, but before the hooks (or they were taken out)
            failed(
                N,
                format!(
                    "{shown} registers the coherent MCP server but none of its hooks: a Codex \
                     agent meets EACCES without being told why"
                ),
                install,
            )
        } else if probe::which("codex").is_some() {
            warn(
                N,
                format!("no coherent hooks in {shown}: a Codex agent meets EACCES without being told why"),
                install,
            )
        } else {
            ok(N, format!("Codex is not set up here (nothing of coherent's in {shown})"))
        });
        return;
    }
    let fire_fix = format!(
        "the command must be `coherent hook codex` naming the `coherent` on PATH (the doctor \
         runs no other program) and answer only what Codex documents: `{install}` writes it \
         so"
    );
    let trust = codex_trust(dir, &config, &install);
    let agent = AgentHooks {
        registered: N,
        fire: "codex hooks fire",
        agent: "codex",
        events: probe::codex_hook_events(),
        probe: probe_codex_hook,
        fire_fix,
        install,
    };
    agent.check(&shown, &ours, volume, dir, out);
    out.push(trust);
}

/// Whether Codex runs the coherent hooks: Codex skips, without a word, a hook whose
/// definition the user has not trusted (or changed since). Asked of Codex itself (its app
/// server's `hooks/list`: each hook's trust as Codex decides it), never worked out here.
fn codex_trust(dir: &Path, config: &Path, install: &str) -> Check {
    const N: &str = "codex hooks trusted";
    let Some(codex) = probe::which("codex") else {
        return warn(
            N,
            "no `codex` on PATH to ask whether it trusts the coherent hooks (Codex skips an \
             untrusted hook without a word)",
            format!("with codex on PATH: `{install}` (trusts them through Codex), or trust them in /hooks in Codex"),
        );
    };
    let source = format!("{}:", config.display());
    let hooks = match crate::codex_trust::list(&codex, dir) {
        Ok(h) => h,
        Err(e) => {
            return warn(
                N,
                format!("cannot ask Codex ({}): {e}", codex.display()),
                "run `codex` once and look at /hooks",
            )
        }
    };
    let ours: Vec<_> = hooks
        .iter()
        .filter(|h| probe::is_codex_hook(&h.command) && h.key.starts_with(&source))
        .collect();
    if ours.is_empty() {
        return failed(
            N,
            format!(
                "Codex lists none of the coherent hooks of {}",
                quote(&config.display().to_string())
            ),
            install.to_string(),
        );
    }
    let each: Vec<String> = ours
        .iter()
        .map(|h| {
            let word = match h.trust.as_str() {
                "trusted" => "Trusted",
                "untrusted" => "Untrusted",
                "modified" => "Modified",
                other => other,
            };
            format!("{} {word}", h.event)
        })
        .collect();
    if ours.iter().all(|h| h.trust == "trusted") {
        ok(N, format!("Codex runs them: {}", each.join(", ")))
    } else {
        failed(
            N,
            format!(
                "Codex skips the ones not Trusted, without a word: {}",
                each.join(", ")
            ),
            format!(
                "`{install}` (trusts them through Codex itself), or trust them in /hooks in Codex"
            ),
        )
    }
}

/// Run a Codex hook command with a synthetic `SessionStart` (Codex's input shape) and
/// check the answer: exit 0, and hook JSON with only the fields Codex documents.
fn probe_codex_hook(bin: &Path, dir: &Path) -> Result<String, String> {
    let input = json!({
        "session_id": "coherent-doctor-probe",
        "transcript_path": null,
        "cwd": dir.display().to_string(),
        "hook_event_name": "SessionStart",
        "model": "coherent-doctor",
        "source": "startup",
    });
    let o = output_within(
        Command::new(bin).args(["hook", "codex"]).current_dir(dir),
        Some(format!("{input}\n").as_bytes()),
        PROBE_TIMEOUT,
    )?;
    if !o.status.success() {
        return Err(format!(
            "exit {} ({})",
            o.status
                .code()
                .map_or("by a signal".into(), |c| c.to_string()),
            first_line(&o.stderr)
        ));
    }
    let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| {
        format!(
            "its answer is not hook JSON ({e}): {:?}",
            first_line(&o.stdout)
        )
    })?;
    codex_documented(&v)?;
    if !v["hookSpecificOutput"]["additionalContext"].is_string() {
        return Err(format!("its answer has no context for the session: {v}"));
    }
    Ok("hook JSON with the session's context, only documented fields".into())
}

/// Ok when `v` is a `SessionStart` answer with only the fields Codex documents, each of
/// its type; else the first one that is not.
fn codex_documented(v: &Value) -> Result<(), String> {
    let (top, specific) = CODEX_SESSION_START;
    let o = v
        .as_object()
        .ok_or_else(|| format!("its answer is not a JSON object: {v}"))?;
    for (k, x) in o {
        if !top.contains(&k.as_str()) {
            return Err(format!(
                "its answer has `{}`, a field Codex does not document for SessionStart (Codex \
                 fails the hook): {v}",
                quote(k)
            ));
        }
        let typed = match k.as_str() {
            "continue" | "suppressOutput" => x.is_boolean(),
            "hookSpecificOutput" => x.is_object(),
            _ => x.is_string(),
        };
        if !typed {
            return Err(format!("its `{k}` has the wrong type: {v}"));
        }
    }
    if let Some(h) = o.get("hookSpecificOutput").and_then(Value::as_object) {
        if h.get("hookEventName") != Some(&json!("SessionStart")) {
            return Err(format!("its answer is not a SessionStart answer: {v}"));
        }
        for (k, x) in h {
            if !specific.contains(&k.as_str()) {
                return Err(format!(
                    "its answer has `hookSpecificOutput.{}`, a field Codex does not document \
                     for SessionStart (Codex fails the hook): {v}",
                    quote(k)
                ));
            }
            if k != "env" && !x.is_string() {
                return Err(format!("its `hookSpecificOutput.{k}` is not a string: {v}"));
            }
        }
    }
    Ok(())
}

// ---- MCP ----------------------------------------------------------------------------------

/// Where each agent the user has is told of the MCP server: (where, the command it names,
/// which agent). Claude Code: the project's `.mcp.json`, then `~/.claude.json`; Codex:
/// its config.toml.
fn mcp_registrations(dir: &Path) -> Vec<(String, String, &'static str)> {
    let mut out = Vec::new();
    let mut files = vec![dir.join(".mcp.json")];
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        files.push(PathBuf::from(home).join(".claude.json"));
    }
    for f in files {
        let Some(v) = std::fs::read_to_string(&f)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        else {
            continue;
        };
        let Some(s) = v["mcpServers"].get(probe::MCP_SERVER) else {
            continue;
        };
        if !probe::is_mcp_server(s) {
            continue;
        }
        if let Some(cmd) = s["command"].as_str() {
            out.push((f.display().to_string(), cmd.to_string(), CLAUDE));
            // the project's entry wins over the user's
            break;
        }
    }
    if let Ok(config) = probe::codex_config() {
        let doc = std::fs::read_to_string(&config)
            .ok()
            .and_then(|t| t.parse::<toml_edit::DocumentMut>().ok());
        if let Some(server) = doc
            .as_ref()
            .and_then(|d| d.get("mcp_servers"))
            .and_then(|m| m.get(probe::MCP_SERVER))
            .filter(|s| probe::is_codex_server(s))
        {
            if let Some(cmd) = server.get("command").and_then(|c| c.as_str()) {
                out.push((config.display().to_string(), cmd.to_string(), CODEX));
            }
            if !probe::codex_server_passes_session(server) {
                // Codex filters the server's environment: said by `mcp` below
                out.push((config.display().to_string(), String::new(), NO_SESSION));
            }
        }
    }
    out
}

const CLAUDE: &str = "Claude Code";
/// A Codex registration without `env_vars = ["COHERENT_SESSION"]`.
const NO_SESSION: &str = "no session";
const CODEX: &str = "Codex";

/// Claude Code is in use here: on PATH, or its settings exist (the user's or the
/// project's).
fn claude_in_use(dir: &Path) -> bool {
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from);
    probe::which("claude").is_some()
        || dir.join(".claude").is_dir()
        || home.is_some_and(|h| h.join(".claude").is_dir() || h.join(".claude.json").is_file())
}

/// Codex is in use here: on PATH, or its config exists.
fn codex_in_use() -> bool {
    probe::which("codex").is_some() || probe::codex_config().is_ok_and(|c| c.is_file())
}

/// The install command for one agent.
fn install_for(agent: &str, dir: &Path) -> String {
    let word = if agent == CODEX {
        "codex"
    } else {
        "claude-code"
    };
    format!("coherent install {word} {}", dir.display())
}

/// The MCP server starts and lists its tools, as each agent the user has is told to start
/// it; advice only about the agents in use.
fn mcp(dir: &Path) -> Check {
    const N: &str = "mcp server";
    let mut regs = mcp_registrations(dir);
    let no_session = regs.iter().any(|r| r.2 == NO_SESSION);
    regs.retain(|r| r.2 != NO_SESSION);
    let mut told = Vec::new();
    let mut bin = None;
    for (place, cmd, agent) in &regs {
        match vetted(cmd) {
            Ok(b) => {
                told.push(format!("{agent} (from {})", quote(place)));
                bin.get_or_insert(b);
            }
            Err(why) => {
                return failed(
                    N,
                    format!("`{} mcp` (from {}): {why}", quote(cmd), quote(place)),
                    install_for(agent, dir),
                )
            }
        }
    }
    let Some(bin) = bin.or_else(|| trusted_coherents().into_iter().next()) else {
        return failed(
            N,
            "no `coherent` to start it with",
            "install coherent (the Debian package, or cargo install --path .)",
        );
    };
    let shown = format!("{} mcp", bin.display());
    let what = match probe_mcp(&bin, dir) {
        Ok(w) => w,
        Err(why) => {
            return failed(
                N,
                format!("`{shown}`: {why}"),
                "see `coherent mcp`'s own error",
            )
        }
    };
    let mut untold: Vec<&str> = Vec::new();
    if claude_in_use(dir) && !regs.iter().any(|r| r.2 == CLAUDE) {
        untold.push(CLAUDE);
    }
    if codex_in_use() && !regs.iter().any(|r| r.2 == CODEX) {
        untold.push(CODEX);
    }
    if no_session {
        return warn(
            N,
            format!(
                "`{shown}` {what}, but Codex starts it without `COHERENT_SESSION` (its config \
                 has no `env_vars` for it): the server finds the session from its client \
                 process, and otherwise answers as the user's anonymous session"
            ),
            install_for(CODEX, dir),
        );
    }
    if untold.is_empty() {
        if told.is_empty() {
            return ok(
                N,
                format!("`{shown}` {what}; no Claude Code or Codex here to tell of it"),
            );
        }
        return ok(N, format!("`{shown}` {what}; told to {}", told.join(", ")));
    }
    warn(
        N,
        format!(
            "`{shown}` {what}, but {} is not told of it",
            untold.join(" and ")
        ),
        untold
            .iter()
            .map(|a| install_for(a, dir))
            .collect::<Vec<_>>()
            .join("; "),
    )
}

/// Spawn the server, `initialize`, `notifications/initialized`, `tools/list`.
fn probe_mcp(bin: &Path, dir: &Path) -> Result<String, String> {
    let mut child = Command::new(bin)
        .arg("mcp")
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("does not start ({e})"))?;
    let mut stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let reply = |id: &str| -> Result<Value, String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(v) if v["id"] == id => return Ok(v),
                Ok(_) => continue,
                Err(_) => return Err(format!("no answer to `{id}` within {PROBE_TIMEOUT:?}")),
            }
        }
    };
    let mut send = |v: Value| {
        let _ = writeln!(stdin, "{v}");
        let _ = stdin.flush();
    };
    let result = (|| {
        send(
            json!({"jsonrpc": "2.0", "id": "initialize", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "coherent-doctor", "version": env!("CARGO_PKG_VERSION")}}}),
        );
        let init = reply("initialize")?;
        let info = &init["result"]["serverInfo"];
        if info.is_null() {
            return Err(format!("`initialize` was answered with {init}"));
        }
        send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        send(json!({"jsonrpc": "2.0", "id": "tools", "method": "tools/list"}));
        let list = reply("tools")?;
        let names: Vec<&str> = list["result"]["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|x| x["name"].as_str()).collect())
            .unwrap_or_default();
        let missing: Vec<&str> = MCP_TOOLS
            .iter()
            .copied()
            .filter(|t| !names.contains(t))
            .collect();
        if !missing.is_empty() {
            return Err(format!("tools/list lacks {}", missing.join(", ")));
        }
        Ok(format!(
            "starts ({} {}, protocol {}) and lists {} tools",
            info["name"].as_str().unwrap_or("?"),
            info["version"].as_str().unwrap_or("?"),
            init["result"]["protocolVersion"].as_str().unwrap_or("?"),
            names.len()
        ))
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

// ---- git ----------------------------------------------------------------------------------

/// The fsmonitor hook of the repository at `dir`, if it has one of ours.
fn fsmonitor(dir: &Path) -> Check {
    const N: &str = "git fsmonitor";
    // git with the repository's own programs switched off (reading config runs none;
    // this keeps it so whatever git does)
    let git = |args: &[&str]| {
        output_within(crate::safegit::git(dir).args(args), None, PROBE_TIMEOUT)
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(top) = git(&["rev-parse", "--show-toplevel"]) else {
        return ok(N, "no git repository here: nothing to check");
    };
    // the repository's value, not the override above
    let Some(value) = git(&["config", "--local", "core.fsmonitor"]) else {
        return ok(
            N,
            format!(
                "not installed in {top} (optional: `coherent install git` makes `git status` \
                 ask the volume what changed)"
            ),
        );
    };
    if !probe::is_fsmonitor(&value) {
        return ok(N, format!("core.fsmonitor is another hook ({value})"));
    }
    let fix = format!("coherent install git --uninstall && coherent install git (in {top})");
    // Run it as git does: `PROG 2 TOKEN`; an unknown token is answered with a fresh
    // token and `/`. Only a `coherent` the doctor trusts: the value is the repository's.
    let prog = value
        .trim()
        .trim_end_matches(" fsmonitor")
        .trim_matches('\'');
    let bin = match vetted(prog) {
        Ok(b) => b,
        Err(why) => return failed(N, format!("core.fsmonitor {}: {why}", quote(&value)), fix),
    };
    let o = match output_within(
        Command::new(bin)
            .args(["fsmonitor", "2", "doctor"])
            .current_dir(&top),
        None,
        PROBE_TIMEOUT,
    ) {
        Ok(o) => o,
        Err(e) => return failed(N, format!("core.fsmonitor {value} does not run: {e}"), fix),
    };
    if !o.status.success() || !o.stdout.starts_with(b"c1:") {
        return failed(
            N,
            format!(
                "core.fsmonitor {value} answered {:?} (exit {:?})",
                first_line(&o.stdout),
                o.status.code()
            ),
            fix,
        );
    }
    if git(&["config", "--bool", "core.untrackedCache"]).as_deref() != Some("true") {
        return warn(
            N,
            format!("core.fsmonitor is {value}, but core.untrackedCache is off"),
            format!("git -C {top} config core.untrackedCache true"),
        );
    }
    ok(N, format!("core.fsmonitor {value} answers"))
}

// ---- the kernel ---------------------------------------------------------------------------

/// FUSE passthrough: Linux 6.9+.
fn passthrough_kernel() -> Check {
    const N: &str = "fuse passthrough";
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut nums = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    let (major, minor) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    if (major, minor) >= (6, 9) {
        ok(
            N,
            format!("kernel {release} offers it (a mount as root uses it)"),
        )
    } else {
        warn(
            N,
            format!("kernel {release} has no FUSE passthrough: file data goes through the daemon"),
            "a 6.9+ kernel; everything works without it, only slower",
        )
    }
}

/// The Landlock ABI `coherent run` restricts writes with.
fn landlock() -> Check {
    const N: &str = "landlock";
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with the VERSION flag and no attributes the call only returns a number.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    let fix = "a kernel with Landlock enabled (5.19+ for ABI 2, 6.2+ for ABI 3; boot with \
               lsm=...,landlock if it is built but off)";
    match abi {
        a if a >= 3 => ok(
            N,
            format!("ABI {a}: `coherent run` keeps agents' writes on the volume"),
        ),
        a if a >= 1 => warn(
            N,
            format!("ABI {a}: `coherent run` restricts writes, but not truncate (needs ABI 3)"),
            fix,
        ),
        _ => warn(
            N,
            format!(
                "not available ({}): `coherent run` cannot keep agents from writing the \
                 backing directory behind the volume",
                std::io::Error::last_os_error()
            ),
            fix,
        ),
    }
}

fn read_sysctl(name: &str) -> Option<u64> {
    std::fs::read_to_string(Path::new("/proc/sys/fs/fuse").join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The kernel's FUSE request timeout (`fs.fuse.default_request_timeout`, capped by
/// `max_request_timeout`): past it the kernel aborts the whole connection. The volume
/// answers a request it holds (a `wait`) before then, with `"reached": false`, and the
/// client asks again; what it cannot shorten is a daemon stalled on something else (a
/// slow disk under fsync, etcd), so a timeout set is a warning.
pub fn request_timeout(default: Option<u64>, max: Option<u64>) -> Check {
    const N: &str = "fuse request timeout";
    let Some(default) = default else {
        return ok(N, "this kernel has no FUSE request timeout");
    };
    let max = max.unwrap_or(0);
    // What a connection that asks for no timeout of its own gets (the volume asks none).
    let effective = match (default, max) {
        (0, m) => m,
        (d, 0) => d,
        (d, m) => d.min(m),
    };
    if effective == 0 {
        return ok(N, "not set (fs.fuse.default_request_timeout = 0)");
    }
    warn(
        N,
        format!(
            "the kernel aborts a mount whose daemon takes over {effective} s on one request \
             (fs.fuse.default_request_timeout = {default}, max_request_timeout = {max}; a \
             mount keeps the value it was made with): the volume answers a `wait` before \
             then (\"reached\": false, and the client asks again), but a daemon stalled \
             longer (a slow disk, etcd) cuts every agent off the mount (ENOTCONN)"
        ),
        "sysctl -w fs.fuse.default_request_timeout=0 fs.fuse.max_request_timeout=0, then \
         remount (or keep it well above the slowest fsync and etcd round trip)",
    )
}

// ---- helpers ------------------------------------------------------------------------------

/// Run `cmd` with `input` on stdin; kill it after `limit`.
fn output_within(
    cmd: &mut Command,
    input: Option<&[u8]>,
    limit: Duration,
) -> Result<std::process::Output, String> {
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run it ({e})"))?;
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stdout.read_to_end(&mut b);
        b
    });
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stderr.read_to_end(&mut b);
        b
    });
    let end = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {limit:?} (killed)"));
            }
        }
    };
    Ok(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

fn first_line(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

/// A name from the volume, with control characters, line separators and bidi overrides
/// escaped, so it cannot forge a line.
fn quote(s: &str) -> String {
    s.escape_debug().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_timeout_is_ok_unset_and_a_warning_when_set_with_the_effective_value() {
        assert_eq!(request_timeout(None, None).level, Level::Ok);
        assert_eq!(request_timeout(Some(0), Some(0)).level, Level::Ok);
        let long = request_timeout(Some(600), Some(0));
        assert_eq!(long.level, Level::Warn, "{long:?}");
        assert!(long.message.contains("over 600 s"), "{long:?}");
        // The cap decides when it is lower than the default, and alone applies to all.
        let capped = request_timeout(Some(600), Some(40));
        assert!(capped.message.contains("over 40 s"), "{capped:?}");
        let max_only = request_timeout(Some(0), Some(20));
        assert_eq!(max_only.level, Level::Warn);
        assert!(max_only.message.contains("over 20 s"), "{max_only:?}");
        assert!(request_timeout(Some(20), None)
            .fix
            .unwrap()
            .contains("default_request_timeout=0"));
    }

    #[test]
    fn data_mode_warns_only_when_passthrough_was_wanted_and_missed() {
        assert_eq!(data_mode(Some("passthrough (reads ...)")).level, Level::Ok);
        assert_eq!(
            data_mode(Some("through the daemon (--no-passthrough)")).level,
            Level::Ok
        );
        let cap = data_mode(Some(
            "through the daemon (FUSE passthrough needs CAP_SYS_ADMIN)",
        ));
        assert_eq!(cap.level, Level::Warn);
        assert!(cap.fix.unwrap().contains("root"));
        assert_eq!(data_mode(None).level, Level::Warn);
    }

    #[test]
    fn etcd_without_tls_fails_and_unreachable_fails() {
        let base = json!({"endpoints": ["10.0.0.1:2379"], "connected": true, "tls": true,
                          "user": "coh"});
        assert_eq!(coordinator(&base).level, Level::Ok);
        let mut plain = base.clone();
        plain["tls"] = json!(false);
        let c = coordinator(&plain);
        assert_eq!(c.level, Level::Fail);
        assert!(c.fix.unwrap().contains("etcds://"));
        let mut nouser = base.clone();
        nouser["user"] = Value::Null;
        assert_eq!(coordinator(&nouser).level, Level::Warn);
        let mut down = base;
        down["connected"] = json!(false);
        down["error"] = json!("connection refused");
        let c = coordinator(&down);
        assert_eq!(c.level, Level::Fail);
        assert!(c.message.contains("connection refused"));
    }

    #[test]
    fn a_codex_session_start_answer_has_only_documented_fields_of_their_types() {
        let good = json!({"systemMessage": "m", "hookSpecificOutput":
            {"hookEventName": "SessionStart", "additionalContext": "c"}});
        assert_eq!(codex_documented(&good), Ok(()));
        assert_eq!(codex_documented(&json!({})), Ok(()));
        let bad = [
            (json!({"decision": "block"}), "`decision`"),
            (
                json!({"hookSpecificOutput": {"hookEventName": "SessionStart", "permissionDecision": "allow"}}),
                "`hookSpecificOutput.permissionDecision`",
            ),
            (json!({"continue": "yes"}), "wrong type"),
            (
                json!({"hookSpecificOutput": {"hookEventName": "PreToolUse"}}),
                "not a SessionStart answer",
            ),
            (
                json!({"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": 1}}),
                "not a string",
            ),
            (json!([1]), "not a JSON object"),
        ];
        for (v, why) in bad {
            let e = codex_documented(&v).expect_err(&v.to_string());
            assert!(e.contains(why), "{v}: {e}");
        }
    }

    #[test]
    fn a_line_is_one_line_with_its_fix() {
        let c = failed("x", "two\nlines", "do\nthis");
        assert_eq!(line(&c), "FAIL  x: two lines; fix: do this");
    }
}
