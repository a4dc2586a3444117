//! `coherent`: the command-line client of a coherent volume (docs/design.md#control-surface).
//!
//! A thin client of `.coherent/ctl`: it finds the volume from the given paths (or the current
//! directory), turns each path into one relative to the mount root, writes one JSON request
//! in one `write(2)`, reads the reply back from the same descriptor and prints one line.
//! Exit codes: 0 done, 1 usage, 2 refused, 4 no coherent volume here.

use clap::{Args, CommandFactory, Parser, Subcommand};

mod codex_trust;
mod doctor;
mod follow;
mod fsmonitor;
mod history;
mod hook;
mod install;
mod mcp;
mod relay;
mod safegit;
mod sandbox;
mod shellwrites;
mod top;
mod whoami;
use coherent::{identity, sys};
use coherent_wire::control::{self, describe_record, describe_record_from, Reply, Request, Verb};
use coherent_wire::error::Reason;
use coherent_wire::names;
use coherent_wire::names::{display_name, one_line};
use serde_json::Value;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const EXIT_USAGE: u8 = 1;
/// `wait` only: the state was not reached in time (shares 1 with usage errors, as specified).
const EXIT_TIMEOUT: u8 = 1;
const EXIT_REFUSED: u8 = 2;
const EXIT_NO_VOLUME: u8 = 4;

#[derive(Parser)]
#[command(
    name = "coherent",
    version,
    about = "Hand files between agent sessions on a coherent volume",
    after_help = "Exit codes: 0 done, 1 usage, 2 refused, 4 no coherent volume here.\n\
                  Mount a volume with: coherent-mount DIR"
)]
struct Cli {
    /// Print the volume's JSON reply instead of a human line (same as VERB --json).
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

/// `--json`, on the subcommands whose output is a volume reply or the event log.
#[derive(Args)]
struct JsonFlag {
    /// Print the volume's JSON reply instead of a human line.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Hand PATHs to another session; you can no longer write them until it ends.
    Transfer {
        /// The successor: a session name, its agent id, or an id prefix of 8+ hex digits.
        #[arg(long, value_name = "SESSION")]
        to: String,
        /// A note for the successor (up to 64 KiB).
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
        /// Files on the volume to hand on (relative to the current directory or absolute).
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Accept PATHs handed to you (the giver stays fenced until the file changes).
    Accept(PathArgs),
    /// Decline PATHs handed to you (the giver can write them again).
    Decline(PathArgs),
    /// Take back PATHs you handed on (you can write them again).
    Withdraw(PathArgs),
    /// Sessions and handoffs of the volume, or of one PATH.
    Status {
        /// A file on the volume (default: the whole volume of the current directory).
        #[arg(value_name = "PATH")]
        path: Option<PathBuf>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Which session this process belongs to, and how it was resolved.
    ///
    /// Also warns when the shell it was started from resolves to another session than
    /// this process (after `export COHERENT_SESSION=...` in a running shell, the shell's
    /// own redirections still carry the old session).
    Whoami {
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Register this session (or NAME) so others can hand files to it.
    Register {
        /// The session to register (default: the caller's own; only your own is accepted).
        #[arg(value_name = "NAME")]
        name: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Follow the volume's state log (.coherent/events), one readable line per event.
    Watch {
        /// A directory on the volume (default: the current directory).
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Show the last N existing events first (0: only new ones).
        #[arg(short = 'n', long, default_value_t = 10, value_name = "N")]
        lines: usize,
        /// Show every existing event first.
        #[arg(long, conflicts_with = "lines")]
        all: bool,
        /// Print each event as its raw JSON line.
        #[arg(long)]
        json: bool,
    },
    /// A live board of the volume: files, handoffs, fenced sessions, offers, waits,
    /// refusals and hosts, with keys to filter and to withdraw, accept or decline.
    ///
    /// Keys: up/down move, / filter by session or path, w/a/d withdraw/accept/decline the
    /// selected file's handoff (y confirms), r reads the status again, q quits.
    Top {
        /// A directory on the volume (default: the current directory).
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Run CMD (default: $SHELL) in session NAME (env tag, and a cgroup where possible).
    ///
    /// Sets COHERENT_SESSION=NAME and, where cgroup v2 is writable, moves into a
    /// coherent-session-NAME cgroup under the cgroup v2 mount before running CMD (-v says
    /// which). Without CMD it starts your login shell ($SHELL, else /bin/sh), so an
    /// interactive shell and everything it starts is that session. Exits with CMD's exit
    /// code (127 if it cannot be found).
    ///
    /// Started inside a coherent volume, CMD and everything it starts may write only under
    /// the volume's mount and scratch places (Landlock): /tmp, /var/tmp, /dev, $TMPDIR,
    /// the cache, config and data directories, ~/.claude and ~/.claude.json, or the
    /// `:`-separated list in COHERENT_RUN_WRITABLE, plus --allow-write; never under the
    /// volume's backing directory. It refuses to start when a writable place contains the
    /// backing directory.
    Run {
        /// The session name (no `/`, no control characters, at most 200 bytes).
        #[arg(long, value_name = "NAME")]
        session: String,
        /// Say on stderr whether the cgroup and the Landlock ruleset could be used.
        #[arg(short, long)]
        verbose: bool,
        /// Also allow writes under PATH (repeatable).
        #[arg(long, value_name = "PATH")]
        allow_write: Vec<PathBuf>,
        /// Do not restrict where CMD may write (no Landlock ruleset).
        #[arg(long)]
        no_landlock: bool,
        /// The command and its arguments (put them after `--`).
        #[arg(trailing_var_arg = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// Wait until PATH's handoff reaches a state: exit 0 reached, 1 timed out, 2 refused.
    ///
    /// The volume answers when the record changes (no polling). On a timeout the record's
    /// current status is printed.
    Wait {
        /// A file on the volume with a handoff record.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// The state to wait for: accepted, completed, or ended (any status but pending).
        #[arg(long, value_enum, default_value_t = Until::Ended, value_name = "STATE")]
        until: Until,
        /// Give up after SECS seconds, at most 86400 (default: wait as long as it takes).
        #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
        timeout: Option<f64>,
        /// Do not block: leave a standing wait with the volume for this session. It
        /// outlives this process, the agent's context and a restart of the volume, and
        /// the agent's hook reports it once on the next prompt after it resolves.
        #[arg(long, conflicts_with = "timeout")]
        standing: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// The versions of PATH the volume keeps: number, time, session, what made it, digest.
    Log {
        /// A file on the volume.
        path: PathBuf,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Print the bytes of one version of a file: PATH@vN (see `coherent log PATH`).
    Show {
        /// PATH@vN, e.g. src/lib.rs@v3.
        #[arg(value_name = "PATH@vN")]
        spec: String,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// The unified diff of what session S committed: per file, from the version before its
    /// first change (in the window) to its last version.
    Diff {
        /// The session whose work to show.
        #[arg(long, value_name = "S")]
        session: String,
        /// Only changes since T: an RFC 3339 time or a span back (30m, 2h, 1d).
        #[arg(long, value_name = "T")]
        since: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Put back every file session S changed (in the window) as it was before S's first
    /// change, as new versions written by you. A file another session changed after S is
    /// refused (exit 2), naming who and which version.
    Undo {
        /// The session whose work to undo.
        #[arg(long, value_name = "S")]
        session: String,
        /// Only changes since T: an RFC 3339 time or a span back (30m, 2h, 1d).
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// Say what would be put back and what refused; write nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// An MCP server on stdin/stdout, with the verbs as tools (for agents).
    ///
    /// Start it as a child of the agent (e.g. from .mcp.json) so the volume sees the
    /// agent's session. Paths are relative to its working directory or absolute.
    Mcp,
    /// Agent hooks: read the hook's JSON on stdin, print the answer on stdout.
    Hook {
        /// Which agent's hook protocol to speak.
        #[arg(value_enum, value_name = "AGENT")]
        agent: Agent,
    },
    /// git's core.fsmonitor hook (protocol 2): the paths changed since TOKEN.
    ///
    /// Prints a token, NUL, then the NUL-separated paths (relative to the worktree, the
    /// current directory) changed through the volume since TOKEN, or `/` when the volume
    /// cannot vouch for them (restart, changes it cannot name, a separate backing
    /// directory, no volume). Set it up with `coherent install git`.
    Fsmonitor {
        /// The hook protocol version (2).
        #[arg(value_name = "VERSION")]
        version: OsString,
        /// The token of git's previous answer.
        #[arg(value_name = "TOKEN")]
        token: Option<OsString>,
    },
    /// Install the hooks and the MCP server into an agent's settings, or the fsmonitor
    /// hook into a git repository.
    ///
    /// claude-code: hooks in DIR/.claude/settings.json, the MCP server in DIR/.mcp.json
    /// (with --user: ~/.claude/settings.json and ~/.claude.json). codex: the hooks and the MCP
    /// server in ~/.codex/config.toml ($CODEX_HOME/config.toml) and a short guidance section in
    /// DIR/AGENTS.md. The settings name `coherent` as found on PATH. git: core.fsmonitor
    /// (this binary, by its absolute path) and core.untrackedCache in the repository of
    /// DIR, which must be on a coherent volume.
    Install {
        /// Which agent to install for.
        #[arg(value_enum, value_name = "AGENT")]
        agent: InstallAgent,
        /// The project directory (default: the current directory).
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Remove exactly what an install added, and nothing else.
        #[arg(long)]
        uninstall: bool,
        /// claude-code only: the user's own settings instead of a project's.
        #[arg(long, conflicts_with = "dir")]
        user: bool,
    },
    /// Check that this install works: the mount, data mode, binaries, hooks (registered and
    /// firing), the MCP server, git's fsmonitor, kernel features, etcd.
    ///
    /// One line per check (ok, warn or FAIL), each problem with its fix. Exit 0 unless a
    /// check FAILed (3).
    Doctor {
        /// A directory on the volume, where the agents start (default: the current one).
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Print the checks as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (e.g. `coherent completions bash >
    /// /etc/bash_completion.d/coherent`).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the manual page as roff (e.g. `coherent man | man -l -`).
    Man,
}

/// What `wait` waits for.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Until {
    /// The successor accepted it (or claimed an offer).
    Accepted,
    /// The successor accepted or wrote it.
    Completed,
    /// It reached any final status.
    Ended,
}

impl Until {
    fn as_str(self) -> &'static str {
        match self {
            Until::Accepted => "accepted",
            Until::Completed => "completed",
            Until::Ended => "ended",
        }
    }
}

/// The agents `hook` and `install` know.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Agent {
    /// Claude Code (hooks in .claude/settings.json, MCP server in .mcp.json).
    ClaudeCode,
    /// OpenAI Codex CLI (hooks and MCP server in ~/.codex/config.toml).
    Codex,
}

/// The agents `coherent install` knows.
#[derive(Clone, Copy, clap::ValueEnum)]
enum InstallAgent {
    /// Claude Code: hooks and the MCP server.
    ClaudeCode,
    /// OpenAI Codex CLI: hooks and the MCP server (config.toml), AGENTS.md guidance.
    Codex,
    /// git: the volume as the repository's fsmonitor (core.fsmonitor, core.untrackedCache).
    Git,
}

#[derive(Args)]
struct PathArgs {
    /// Files on the volume (relative to the current directory or absolute).
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    #[command(flatten)]
    out: JsonFlag,
}

/// Why the command stopped: an exit code and what to say on stderr.
struct Fail {
    code: u8,
    message: String,
}

impl Fail {
    fn usage(message: impl Into<String>) -> Fail {
        Fail {
            code: EXIT_USAGE,
            message: format!("coherent: {}", message.into()),
        }
    }
    fn no_volume(message: impl Into<String>) -> Fail {
        Fail {
            code: EXIT_NO_VOLUME,
            message: format!("coherent: {}", message.into()),
        }
    }
    fn refused(reason: &str, message: &str) -> Fail {
        Fail {
            code: EXIT_REFUSED,
            message: format!("coherent: refused ({reason}): {}", one_line(message)),
        }
    }
}

fn main() -> ExitCode {
    // A closed stdout (`coherent status | head -3`, `coherent man | less` quit early) ends
    // the program quietly, as it does `cat` and `ls`: the default SIGPIPE action, not Rust's
    // "failed printing to stdout" panic. The MCP server and the hook keep SIGPIPE ignored:
    // they see EPIPE as an error and end (or say nothing) on their own terms.
    set_sigpipe(libc::SIG_DFL);
    // git's fsmonitor hook runs at every `git status`: answered before the parse.
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(code) = fsmonitor::direct(&args) {
        return code;
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout and succeed; every other parse error is a usage
            // error, exit 1 (clap's own default would be 2, which here means "refused").
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    if matches!(cli.cmd, Cmd::Mcp | Cmd::Hook { .. }) {
        set_sigpipe(libc::SIG_IGN);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if !f.message.is_empty() {
                // a name in a message never starts a line of its own
                eprintln!("{}", coherent_wire::names::lines_only(&f.message));
            }
            ExitCode::from(f.code)
        }
    }
}

fn set_sigpipe(action: libc::sighandler_t) {
    // SAFETY: setting a signal's disposition to SIG_DFL or SIG_IGN, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, action);
    }
}

fn run(cli: Cli) -> Result<(), Fail> {
    // `coherent --json VERB` and `coherent VERB --json` are the same; `run`, `mcp`, ... have
    // no reply to print, so a top-level --json there is a usage error, not silently ignored
    let top_json = cli.json;
    let json = |out: JsonFlag| top_json || out.json;
    let no_json = |verb: &str| -> Result<(), Fail> {
        if top_json {
            Err(Fail::usage(format!("--json does nothing for `{verb}`")))
        } else {
            Ok(())
        }
    };
    match cli.cmd {
        Cmd::Transfer {
            to,
            note,
            paths,
            out,
        } => {
            let (root, paths) = locate_paths(&paths)?;
            let req = Request::Transfer { paths, to, note };
            verb_call_again(&root, &req, json(out), unconfirmed)
        }
        Cmd::Accept(a) => {
            let (root, paths) = locate_paths(&a.paths)?;
            verb_call(&root, &Request::Accept { paths }, json(a.out))
        }
        Cmd::Decline(a) => {
            let (root, paths) = locate_paths(&a.paths)?;
            verb_call(&root, &Request::Decline { paths }, json(a.out))
        }
        Cmd::Withdraw(a) => {
            let (root, paths) = locate_paths(&a.paths)?;
            verb_call(&root, &Request::Withdraw { paths }, json(a.out))
        }
        Cmd::Status { path, out } => {
            let (root, rel) = match path {
                Some(p) => {
                    let (root, rel) = locate(&p)?;
                    // `coherent status .` at the mount root means the whole volume
                    (root, (!rel.is_empty()).then_some(rel))
                }
                None => (locate_cwd()?, None),
            };
            verb_call(&root, &Request::Status { path: rel }, json(out))
        }
        Cmd::Whoami { out } => {
            let root = locate_cwd()?;
            let json = json(out);
            let result = verb_call(&root, &Request::Whoami, json);
            if result.is_ok() {
                if let Some(warning) = whoami::parent_mismatch() {
                    eprintln!("{warning}");
                }
            }
            result
        }
        Cmd::Register { name, out } => {
            verb_call(&locate_cwd()?, &Request::Register { name }, json(out))
        }
        Cmd::Watch {
            dir,
            lines,
            all,
            json: raw,
        } => {
            let root = match dir {
                Some(d) => locate(&d)?.0,
                None => locate_cwd()?,
            };
            watch(&root, if all { usize::MAX } else { lines }, top_json || raw)
        }
        Cmd::Top { dir } => {
            no_json("top")?;
            let root = match dir {
                Some(d) => locate(&d)?.0,
                None => locate_cwd()?,
            };
            top::run(&root)
        }
        Cmd::Run {
            session,
            verbose,
            allow_write,
            no_landlock,
            cmd,
        } => {
            no_json("run")?;
            let sandbox = (!no_landlock).then_some(allow_write.as_slice());
            run_in_session(&session, &cmd, verbose, sandbox)
        }
        Cmd::Wait {
            path,
            until,
            standing: true,
            out,
            ..
        } => wait_standing(&path, until, json(out)),
        Cmd::Wait {
            path,
            until,
            timeout,
            out,
            ..
        } => wait(&path, until, timeout, json(out)),
        Cmd::Log { path, out } => history::log(&path, json(out)),
        Cmd::Show { spec, out } => history::show(&spec, json(out)),
        Cmd::Diff {
            session,
            since,
            out,
        } => history::diff(&session, since.as_deref(), json(out)),
        Cmd::Undo {
            session,
            since,
            dry_run,
            out,
        } => history::undo(&session, since.as_deref(), dry_run, json(out)),
        Cmd::Mcp => {
            no_json("mcp")?;
            mcp::inherit_session();
            mcp::serve().map_err(|e| Fail {
                code: EXIT_USAGE,
                message: format!("coherent mcp: {e}"),
            })
        }
        Cmd::Hook { agent } => {
            no_json("hook")?;
            match agent {
                Agent::ClaudeCode => hook::claude_code(),
                Agent::Codex => hook::codex(),
            }
            Ok(())
        }
        Cmd::Install {
            agent,
            dir,
            uninstall,
            user,
        } => {
            no_json("install")?;
            match agent {
                InstallAgent::ClaudeCode => install::claude_code(dir.as_deref(), uninstall, user),
                InstallAgent::Codex if user => Err(Fail::usage(
                    "--user is for claude-code: Codex's MCP servers are always the user's \
                     (~/.codex/config.toml)",
                )),
                InstallAgent::Codex => install::codex(dir.as_deref(), uninstall),
                InstallAgent::Git if user => Err(Fail::usage(
                    "--user is for claude-code: git's settings go into a repository",
                )),
                InstallAgent::Git => install::git(dir.as_deref(), uninstall),
            }
        }
        Cmd::Fsmonitor { version, token } => {
            no_json("fsmonitor")?;
            match fsmonitor::run(&version, token.as_deref()) {
                c if c == ExitCode::SUCCESS => Ok(()),
                _ => Err(Fail {
                    code: EXIT_USAGE,
                    message: String::new(),
                }),
            }
        }
        Cmd::Doctor { dir, json } => doctor::run(dir.as_deref(), top_json || json),
        Cmd::Completions { shell } => {
            no_json("completions")?;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "coherent", &mut io::stdout());
            Ok(())
        }
        Cmd::Man => {
            no_json("man")?;
            clap_mangen::Man::new(Cli::command())
                .render(&mut io::stdout())
                .map_err(|e| Fail::usage(format!("cannot write the man page: {e}")))
        }
    }
}

/// `wait PATH UNTIL` on ctl; the daemon replies when the state is reached, or after the
/// time this request may still wait (it caps each request at [`control::MAX_WAIT_SECS`]
/// and replies `"reached": false`): then it is sent again, until the client's timeout.
fn wait(path: &Path, until: Until, timeout: Option<f64>, json: bool) -> Result<(), Fail> {
    // The MCP `wait` tool's range: a longer one is a typo, and past u64 seconds
    // `Duration` cannot even hold it.
    let timeout = match timeout {
        Some(t) if !(t.is_finite() && (0.0..=mcp::WAIT_MAX_SECS).contains(&t)) => {
            return Err(Fail::usage(format!(
                "--timeout {t:?}: give a number of seconds from 0 to {}, or leave --timeout \
                 out to wait as long as it takes",
                mcp::WAIT_MAX_SECS
            )))
        }
        t => t.map(Duration::from_secs_f64),
    };
    let (root, rel) = locate(path)?;
    if rel.is_empty() {
        return Err(Fail::usage("name a file on the volume, not its root"));
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let got = loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let mut line = format!("wait {} {}", control::shell_word(&rel), until.as_str());
        if let Some(left) = left {
            line.push_str(&format!(" --timeout {:.3}", left.as_secs_f64()));
        }
        line.push('\n');
        let reply = call_bytes(&root, line.as_bytes())?;
        let more = reply.is_ok() && reply.body()["reached"] == Value::Bool(false);
        if !more {
            break Some(reply);
        }
        if left.is_some_and(|l| l.is_zero()) || deadline.is_some_and(|d| Instant::now() >= d) {
            break None;
        }
    };
    match got {
        Some(reply) => {
            if json {
                println!("{}", reply.body());
            } else if reply.is_ok() {
                println!("{}", reply.message());
            }
            if reply.is_ok() {
                Ok(())
            } else if json {
                Err(Fail {
                    code: EXIT_REFUSED,
                    message: String::new(),
                })
            } else {
                let reason = reply.body()["reason"].as_str().unwrap_or("unknown");
                Err(Fail::refused(reason, reply.message()))
            }
        }
        None => {
            // timed out: say where the record stands
            let status = call(&root, &Request::Status { path: Some(rel) })?;
            if json {
                println!("{}", status.body());
            } else {
                for line in status_lines(&status) {
                    println!("{line}");
                }
            }
            Err(Fail {
                code: EXIT_TIMEOUT,
                message: format!(
                    "coherent: timed out after {} s waiting for {}",
                    timeout.map_or(0.0, |t| t.as_secs_f64()),
                    until.as_str()
                ),
            })
        }
    }
}

/// `wait PATH --standing`: registered (or refused) at once; the hook reports it later.
fn wait_standing(path: &Path, until: Until, json: bool) -> Result<(), Fail> {
    let (root, rel) = locate(path)?;
    if rel.is_empty() {
        return Err(Fail::usage("name a file on the volume, not its root"));
    }
    let reply = call(
        &root,
        &Request::WaitStanding {
            path: rel,
            until: coherent::coherence::Until::parse(until.as_str()).expect("the same names"),
        },
    )?;
    if json {
        println!("{}", reply.body());
    } else if reply.is_ok() {
        println!("{}", reply.message());
    }
    if reply.is_ok() {
        Ok(())
    } else if json {
        Err(Fail {
            code: EXIT_REFUSED,
            message: String::new(),
        })
    } else {
        let reason = reply.body()["reason"].as_str().unwrap_or("unknown");
        Err(Fail::refused(reason, reply.message()))
    }
}

// ---- finding the volume -----------------------------------------------------------------

/// The mounts visible to this process, in mount order (later entries are on top).
fn mounts() -> Option<Vec<sys::MountEntry>> {
    sys::mounts().ok()
}

/// The absolute form of `p` without following its last component (a symlink on the volume
/// is a path of its own): the deepest existing ancestor is canonicalised, the rest appended.
fn absolute(p: &Path) -> io::Result<PathBuf> {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    // lexical `.`/`..` first, as the shell would for a path typed relative to $PWD
    let mut lexical = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                lexical.pop();
            }
            Component::Normal(n) => lexical.push(n),
            _ => {}
        }
    }
    let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
    let mut anc: &Path = &lexical;
    // never canonicalise the path itself unless it is a directory (the mount root, `.`)
    if !lexical.is_dir() || lexical.is_symlink() {
        if let (Some(parent), Some(name)) = (lexical.parent(), lexical.file_name()) {
            rest.push(name);
            anc = parent;
        }
    }
    loop {
        match std::fs::canonicalize(anc) {
            Ok(mut c) => {
                for r in rest.iter().rev() {
                    c.push(r);
                }
                return Ok(c);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Err(e),
            Err(e) => match (anc.parent(), anc.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name);
                    anc = parent;
                }
                _ => return Err(e),
            },
        }
    }
}

/// The mount root of the coherent volume holding `abs`, searching `abs` and its parents.
fn find_root(abs: &Path, searched: &Path) -> Result<PathBuf, Fail> {
    let not_found = || {
        Fail::no_volume(format!(
            "no coherent volume here: searched {} and its parents for a FUSE mount with \
             .coherent/ctl; mount one with: coherent-mount DIR",
            searched.display()
        ))
    };
    let table = mounts();
    for anc in abs.ancestors() {
        let ctl = anc.join(".coherent/ctl");
        match &table {
            Some(table) => {
                // the topmost mount at this point decides which filesystem `anc` is on
                let Some(m) = table.iter().rev().find(|m| m.mount_point == anc) else {
                    continue;
                };
                if !m.is_fuse() {
                    return Err(not_found());
                }
                return match std::fs::symlink_metadata(&ctl) {
                    Ok(_) => Ok(anc.to_path_buf()),
                    Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(gone(anc, &e)),
                    Err(_) => Err(not_found()),
                };
            }
            None => {
                if ctl.exists() {
                    return Ok(anc.to_path_buf());
                }
            }
        }
    }
    Err(not_found())
}

fn gone(root: &Path, e: &io::Error) -> Fail {
    Fail::no_volume(format!(
        "the coherent volume at {} is not answering ({e}); unmount it with \
         `fusermount3 -u {}` and mount it again",
        root.display(),
        root.display()
    ))
}

/// The volume root and the mount-relative path of `p` ("" for the root itself).
fn locate(p: &Path) -> Result<(PathBuf, String), Fail> {
    let abs = absolute(p).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            Fail::no_volume(format!(
                "the volume holding {} is not answering ({e})",
                p.display()
            ))
        } else {
            Fail::usage(format!("cannot resolve {}: {e}", p.display()))
        }
    })?;
    let root = find_root(&abs, &abs)?;
    let rel = abs
        .strip_prefix(&root)
        .expect("a root found among the ancestors is a prefix");
    let rel = rel
        .to_str()
        .ok_or_else(|| Fail::usage(format!("{} is not valid UTF-8", p.display())))?;
    Ok((root, rel.to_string()))
}

fn locate_cwd() -> Result<PathBuf, Fail> {
    let cwd = std::env::current_dir()
        .map_err(|e| Fail::no_volume(format!("cannot read the current directory ({e})")))?;
    find_root(&cwd, &cwd)
}

/// All paths must be on one volume; none may be its root.
fn locate_paths(paths: &[PathBuf]) -> Result<(PathBuf, Vec<String>), Fail> {
    let mut root: Option<PathBuf> = None;
    let mut rels = Vec::with_capacity(paths.len());
    for p in paths {
        let (r, rel) = locate(p)?;
        if rel.is_empty() {
            return Err(Fail::usage(format!(
                "{} is the mount root; name files on the volume",
                p.display()
            )));
        }
        match &root {
            Some(first) if *first != r => {
                return Err(Fail::usage(format!(
                    "{} is on the volume at {}, but {} is on {}; run once per volume",
                    p.display(),
                    r.display(),
                    paths[0].display(),
                    first.display()
                )))
            }
            Some(_) => {}
            None => root = Some(r),
        }
        rels.push(rel);
    }
    Ok((root.expect("clap requires at least one path"), rels))
}

// ---- talking to ctl ---------------------------------------------------------------------

/// Send one request; the reply, or the failure to report.
fn call(root: &Path, req: &Request) -> Result<Reply, Fail> {
    let mut bytes = serde_json::to_vec(&req.to_json()).expect("requests serialise");
    bytes.push(b'\n');
    call_bytes(root, &bytes)
}

/// Send one request already in its wire form (a JSON object or a `VERB ARG...` line).
fn call_bytes(root: &Path, bytes: &[u8]) -> Result<Reply, Fail> {
    // the volume reads one request of at most MAX_REQUEST bytes: a longer one would arrive
    // cut and be answered "invalid JSON"; say which limit it is instead
    if bytes.len() > control::MAX_REQUEST {
        return Err(Fail::usage(format!(
            "coherent: bad_request: the request is {} bytes; the limit is {} bytes",
            bytes.len(),
            control::MAX_REQUEST
        )));
    }
    let ctl = root.join(".coherent/ctl");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&ctl)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTCONN) | Some(libc::ENODEV) => gone(root, &e),
            _ => Fail::no_volume(format!("cannot open {}: {e}", ctl.display())),
        })?;
    // one request is one write(2): a short write would cut it, so it counts as a failure
    let write_err = match (&file).write(bytes) {
        Ok(n) if n == bytes.len() => None,
        Ok(n) => Some(io::Error::other(format!(
            "short write to ctl ({n} of {} bytes)",
            bytes.len()
        ))),
        Err(e) => Some(e),
    };
    let reply = read_all_at(&file)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(Reply::from_json);
    match (write_err, reply) {
        (None, Some(r)) => Ok(r),
        (None, None) => Err(Fail::refused(
            "no_reply",
            &format!("the volume at {} sent no readable reply", root.display()),
        )),
        // the write failed: its reply explains why, if the volume stored one
        (Some(_), Some(r)) if !r.is_ok() => Ok(r),
        (Some(e), _) => Err(errno_failure(root, &e)),
    }
}

/// A failed `write(2)` with no reply: the errno says what it can (docs/design.md#control-surface).
fn errno_failure(root: &Path, e: &io::Error) -> Fail {
    let reason = match e.raw_os_error() {
        Some(libc::ENOTCONN) | Some(libc::ENODEV) | Some(libc::ECONNABORTED) => {
            return gone(root, e)
        }
        Some(libc::EINVAL) => Reason::BadRequest.as_str(),
        Some(libc::ENOENT) => Reason::NoSuchPath.as_str(),
        Some(libc::ESRCH) => Reason::HandoffSuccessorUnknown.as_str(),
        Some(libc::EBUSY) => Reason::HandoffInFlight.as_str(),
        Some(libc::EACCES) => "denied",
        _ => "error",
    };
    Fail::refused(
        reason,
        &format!("the volume failed the request with no reply: {e}"),
    )
}

fn read_all_at(file: &File) -> io::Result<Vec<u8>> {
    // replies are small; the cap only stops a broken volume from feeding us forever
    const CAP: usize = 256 << 20;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match file.read_at(&mut buf, out.len() as u64) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 || out.len() + n > CAP {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// How long `coherent transfer` sends a transfer again while other hosts have not
/// confirmed it (the volume answers each request within the kernel's request timeout; the
/// wait it stands for lasts up to a host's lease, 10 s by default).
const ACK_WAIT: Duration = Duration::from_secs(60);

/// A transfer recorded but not yet confirmed by every host (`coordinator_unavailable`
/// with the record `pending`): send it again, for up to [`ACK_WAIT`].
fn unconfirmed(reply: &Reply) -> bool {
    !reply.is_ok()
        && reply.body()["reason"] == "coordinator_unavailable"
        && reply.body()["status"] == "pending"
}

fn verb_call(root: &Path, req: &Request, json: bool) -> Result<(), Fail> {
    verb_call_again(root, req, json, |_| false)
}

/// One verb; sent again while `again` says so (for up to [`ACK_WAIT`]).
fn verb_call_again(
    root: &Path,
    req: &Request,
    json: bool,
    again: impl Fn(&Reply) -> bool,
) -> Result<(), Fail> {
    let start = Instant::now();
    let mut reply = call(root, req)?;
    while again(&reply) && start.elapsed() < ACK_WAIT {
        reply = call(root, req)?;
    }
    if json {
        println!("{}", reply.body());
        return if reply.is_ok() {
            Ok(())
        } else {
            Err(Fail {
                code: EXIT_REFUSED,
                message: String::new(),
            })
        };
    }
    if !reply.is_ok() {
        let reason = reply.body()["reason"].as_str().unwrap_or("unknown");
        return Err(Fail::refused(reason, reply.message()));
    }
    for line in human_lines(req.verb(), &reply, &hint_mapper(root)) {
        println!("{}", one_line(&line));
    }
    Ok(())
}

/// How suggested commands name a mount-relative path: relative to the current directory
/// when it is on the volume, else absolute.
fn hint_mapper(root: &Path) -> impl Fn(&str) -> String {
    let cwd_rel = std::env::current_dir()
        .ok()
        .and_then(|c| std::fs::canonicalize(c).ok())
        .and_then(|c| c.strip_prefix(root).ok().map(Path::to_path_buf))
        .and_then(|r| r.to_str().map(String::from));
    let root = root.to_path_buf();
    move |p: &str| match &cwd_rel {
        Some(from) => control::relative_from(p, from),
        None => root.join(p).to_string_lossy().into_owned(),
    }
}

/// What a person reads after a successful verb.
fn human_lines(verb: Verb, reply: &Reply, hint: &dyn Fn(&str) -> String) -> Vec<String> {
    let body = reply.body();
    match verb {
        Verb::Transfer | Verb::Accept | Verb::Decline | Verb::Withdraw => {
            match body.get("records").and_then(Value::as_array) {
                Some(recs) if !recs.is_empty() => recs
                    .iter()
                    .map(|r| describe_record_from(verb, r, hint))
                    .collect(),
                _ => vec![one_line(reply.message()).into_owned()],
            }
        }
        Verb::Whoami if body.get("session").is_some() => vec![control::whoami_text(body)],
        Verb::Status => status_lines(reply),
        _ => vec![one_line(reply.message()).into_owned()],
    }
}

/// The status object, read defensively: sessions, records (under `records`, `live` or
/// `ended`), counts; anything else is shown as JSON.
fn status_lines(reply: &Reply) -> Vec<String> {
    let mut out = Vec::new();
    if !reply.message().is_empty() {
        out.push(one_line(reply.message()).into_owned());
    }
    let status = &reply.body()["status"];
    let Some(obj) = status.as_object() else {
        if !status.is_null() {
            out.push(status.to_string());
        }
        return out;
    };
    let mut shown = false;
    if let Some(sessions) = obj.get("sessions").and_then(Value::as_array) {
        let names: Vec<String> = sessions
            .iter()
            .map(|s| {
                let name = s
                    .get("session")
                    .or_else(|| s.get("name"))
                    .and_then(Value::as_str)
                    .or(s.as_str())
                    .unwrap_or("?");
                let name = display_name(name);
                match s.get("agent").and_then(Value::as_str) {
                    Some(a) => format!("{name} ({})", control::short_id(a)),
                    None => name,
                }
            })
            .collect();
        out.push(format!(
            "sessions: {}",
            if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            }
        ));
        shown = true;
    }
    for key in ["records", "live", "ended"] {
        if let Some(recs) = obj.get(key).and_then(Value::as_array) {
            for r in recs.iter().filter(|r| r.get("path").is_some()) {
                out.push(format!("  {}", describe_record(Verb::Status, r)));
            }
            shown = true;
        }
    }
    if let Some(counts) = obj.get("counts").and_then(Value::as_object) {
        let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push(format!("counts: {}", parts.join(" ")));
        shown = true;
    }
    if let Some(c) = obj.get("coordinator").and_then(Value::as_object) {
        out.push(describe_coordinator(c));
    }
    if !shown {
        out.push(status.to_string());
    }
    out
}

/// One line on the coordinator of a multi-host volume: this host, whether it is in
/// touch and confirmed, and the live hosts.
fn describe_coordinator(c: &serde_json::Map<String, Value>) -> String {
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("?");
    let yes = |k: &str| c.get(k).and_then(Value::as_bool) == Some(true);
    let hosts: Vec<&str> = c
        .get("hosts")
        .and_then(Value::as_array)
        .map(|h| h.iter().filter_map(|x| x["host"].as_str()).collect())
        .unwrap_or_default();
    let state = match (yes("connected"), yes("confirmed")) {
        (true, true) => "connected".to_string(),
        (false, true) => format!("cannot reach etcd ({}); fences hold", s("error")),
        _ => format!(
            "cannot reach etcd ({}); lease not confirmed, agent writes refused",
            s("error")
        ),
    };
    // How it is reached: a user reading this should see at once an etcd open to anyone.
    let how = match (yes("tls"), c.get("user").and_then(Value::as_str)) {
        (true, Some(u)) => format!("over TLS as etcd user {u}"),
        (true, None) => "over TLS, no etcd user".to_string(),
        (false, Some(u)) => format!("as etcd user {u}, NOT over TLS"),
        (false, None) => "with NO TLS and NO authentication".to_string(),
    };
    let steps = c.get("steps").map_or(String::new(), |st| {
        format!(
            "; steps agreed {}, decided here {}",
            st["agreed"].as_u64().unwrap_or(0),
            st["local"].as_u64().unwrap_or(0)
        )
    });
    format!(
        "coordinator: etcd {} {how} as host {}: {state}; live hosts: {}{steps}",
        c.get("endpoints")
            .and_then(Value::as_array)
            .map(|e| e
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(","))
            .unwrap_or_default(),
        s("host"),
        if c.get("hosts_known").and_then(Value::as_bool) == Some(false) {
            "unknown while cut off from etcd".into()
        } else if hosts.is_empty() {
            "none".into()
        } else {
            hosts.join(", ")
        }
    )
}

// ---- watch ------------------------------------------------------------------------------

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// SIGINT/SIGTERM set STOP; without SA_RESTART a blocked read returns EINTR at once.
fn install_stop_handler() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let _ = sigaction(sig, &action);
        }
    }
}

fn watch(root: &Path, backlog: usize, json: bool) -> Result<(), Fail> {
    install_stop_handler();
    let mut log = follow::Follower::open(root)?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    // the existing log: keep only its last `backlog` lines
    let mut first: std::collections::VecDeque<Vec<u8>> = std::collections::VecDeque::new();
    let mut caught_up = false;
    loop {
        if STOP.load(Ordering::SeqCst) {
            return Ok(());
        }
        let step = log.step().and_then(|step| {
            if matches!(step, follow::Step::AtEnd) && caught_up {
                log.idle(Duration::from_millis(200))?;
            }
            Ok(step)
        });
        match step {
            Ok(follow::Step::Lines(lines)) => {
                for line in lines {
                    if caught_up {
                        if !emit(&mut out, &line, json) {
                            return Ok(());
                        }
                    } else if backlog > 0 {
                        if first.len() == backlog {
                            first.pop_front();
                        }
                        first.push_back(line);
                    }
                }
            }
            Ok(follow::Step::AtEnd) => {
                if !caught_up {
                    caught_up = true;
                    for line in first.drain(..) {
                        if !emit(&mut out, &line, json) {
                            return Ok(());
                        }
                    }
                }
            }
            Err(message) => {
                eprintln!("{message}");
                return Ok(());
            }
        }
    }
}

/// Print one event; false when stdout is gone (e.g. piped into `head`).
fn emit(out: &mut impl Write, line: &[u8], json: bool) -> bool {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\n', '\r']);
    let shown = if json {
        text.to_string()
    } else {
        event_line(text)
    };
    writeln!(out, "{shown}").and_then(|_| out.flush()).is_ok()
}

/// `12:00:01 #7 transfer plan.md by alice (27a468b0): successor=bob version=2`
fn event_line(raw: &str) -> String {
    let Ok(Value::Object(ev)) = serde_json::from_str::<Value>(raw) else {
        return raw.to_string();
    };
    let s = |k: &str| ev.get(k).and_then(Value::as_str);
    let mut line = String::new();
    if let Some(ts) = s("ts") {
        line.push_str(ts.get(11..19).unwrap_or(ts));
        line.push(' ');
    }
    if let Some(seq) = ev.get("seq") {
        line.push_str(&format!("#{seq} "));
    }
    line.push_str(s("event").unwrap_or("?"));
    if let Some(p) = s("path") {
        line.push_str(&format!(" {}", display_name(p)));
    }
    if let Some(sess) = s("session") {
        line.push_str(&format!(" by {}", display_name(sess)));
        if let Some(a) = s("agent") {
            line.push_str(&format!(" ({})", control::short_id(a)));
        }
    }
    // keys in order, but a (long) note last
    let mut keys: Vec<(&String, &Value)> = ev.iter().collect();
    keys.sort_by_key(|(k, _)| k.as_str() == "note");
    let extra: Vec<String> = keys
        .into_iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "seq" | "ts" | "event" | "path" | "session" | "agent"
            )
        })
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            // a string as a name is shown (quoted when it holds a space or anything that
            // could forge a line), anything else as JSON
            let shown = match v {
                Value::String(t) if !t.contains(' ') => display_name(t),
                other => one_line(&other.to_string()).into_owned(),
            };
            format!("{k}={}", shorten(&shown, 80))
        })
        .collect();
    if !extra.is_empty() {
        line.push_str(": ");
        line.push_str(&extra.join(" "));
    }
    line
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}...")
}

// ---- run --------------------------------------------------------------------------------

/// Restricts this process, before it execs the session's command, to writing under the
/// mount of the volume around the current directory and the scratch places (see
/// [`sandbox`]). Outside a volume nothing is restricted (said on stderr).
/// The session's own TMPDIR, when the default temporary directory had to be left out.
fn sandbox_run(extra: &[PathBuf], verbose: bool) -> Result<Option<PathBuf>, Fail> {
    let root = match locate_cwd() {
        Ok(r) => r,
        Err(f) => {
            if verbose {
                eprintln!(
                    "coherent: run: not inside a coherent volume ({}): where it may write is \
                     not restricted",
                    f.message
                );
            }
            return Ok(None);
        }
    };
    let refuse = |message: String| Fail {
        code: EXIT_REFUSED,
        message: format!("coherent: run: {message}; or run with --no-landlock"),
    };
    let backing = sandbox::backing_of(&root).map_err(refuse)?;
    let mut writable = sandbox::writable(extra);
    // A default scratch place holding the backing directory (a checkout under /tmp) is
    // left out, and the session gets a temporary directory of its own instead; a place
    // the user named is refused below.
    let named = std::env::var_os(sandbox::WRITABLE_ENV).is_some();
    let mut tmpdir = None;
    while let Some(w) = sandbox::conflict(&root, &backing, &writable) {
        if named || extra.contains(&w) {
            break;
        }
        writable.retain(|p| *p != w);
        if tmpdir.is_none() && sandbox::is_temp_dir(&w) {
            let private = sandbox::private_tmp(&root, &backing, &writable).map_err(refuse)?;
            writable.push(private.clone());
            tmpdir = Some(private);
        }
        if verbose {
            eprintln!(
                "coherent: run: {} holds the backing directory {}: left out of the writable \
                 places{}",
                w.display(),
                backing.display(),
                tmpdir
                    .as_ref()
                    .map(|t| format!("; temporary files go to TMPDIR={}", t.display()))
                    .unwrap_or_default()
            );
        }
    }
    if let Some(w) = sandbox::conflict(&root, &backing, &writable) {
        return Err(refuse(format!(
            "the writable place {} contains or lies inside the backing directory {} of the \
             volume at {}, so the session could write its files behind the volume's back; \
             leave it out (COHERENT_RUN_WRITABLE, --allow-write)",
            w.display(),
            backing.display(),
            root.display()
        )));
    }
    match sandbox::restrict(&root, &writable).map_err(refuse)? {
        sandbox::Outcome::Enforced { truncate, ipc } => {
            if verbose {
                eprintln!(
                    "coherent: run: writes only under {} and {} (Landlock){}",
                    root.display(),
                    writable
                        .iter()
                        .filter(|p| p.exists())
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    if ipc {
                        "; no abstract unix socket or signal reaches outside the session"
                    } else {
                        ""
                    }
                );
            }
            if !truncate {
                eprintln!(
                    "coherent: run: warning: this kernel's Landlock lacks part of the ruleset \
                     (ABI < 3: truncate is not restricted); writes elsewhere than under {} are \
                     partly restricted",
                    root.display()
                );
            }
            if !ipc {
                eprintln!(
                    "coherent: run: warning: this kernel's Landlock cannot scope abstract unix \
                     sockets and signals (ABI < 6, Linux < 6.12), so the session can still ask \
                     a process of the same user started outside it to write the backing \
                     directory {} for it",
                    backing.display()
                );
            }
        }
        sandbox::Outcome::Unsupported => eprintln!(
            "coherent: run: warning: this kernel has no Landlock, so the session can still \
             write the backing directory {} directly (behind the volume's back)",
            backing.display()
        ),
    }
    Ok(tmpdir)
}

fn run_in_session(
    name: &str,
    cmd: &[OsString],
    verbose: bool,
    sandbox: Option<&[PathBuf]>,
) -> Result<(), Fail> {
    // The volume's own rule and message, so a name the volume would ignore (running the
    // command as `uid:UID`) is refused here exactly as `coherent register NAME` is.
    names::validate_session_name(name).map_err(|e| Fail {
        code: EXIT_USAGE,
        message: Fail::refused(Reason::BadRequest.as_str(), &e).message,
    })?;
    match identity::join_session_cgroup(name, std::process::id()) {
        Ok(dir) if verbose => {
            eprintln!("coherent: session {name}: joined cgroup {}", dir.display())
        }
        Ok(_) => {}
        Err(why) if verbose => eprintln!(
            "coherent: session {name}: cgroup v2 not writable here ({why}); \
             using COHERENT_SESSION only"
        ),
        Err(_) => {}
    }
    let tmpdir = match sandbox {
        Some(extra) => sandbox_run(extra, verbose)?,
        None => None,
    };
    // no command: the user's shell, so an interactive shell is the session from its start
    // (an `export COHERENT_SESSION=...` inside a running shell cannot do that)
    let shell;
    let cmd = if cmd.is_empty() {
        shell = [std::env::var_os("SHELL")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| OsString::from("/bin/sh"))];
        &shell[..]
    } else {
        cmd
    };
    let mut command = std::process::Command::new(&cmd[0]);
    command.args(&cmd[1..]).env("COHERENT_SESSION", name);
    if let Some(t) = &tmpdir {
        command.env("TMPDIR", t);
    }
    let err = command.exec();
    // exec only returns on failure; shells use 127 for not found, 126 for not runnable
    let code = if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    Err(Fail {
        code,
        message: format!("coherent: cannot run {}: {err}", cmd[0].to_string_lossy()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_argument_and_flag_has_help() {
        fn walk(cmd: &clap::Command, at: &str) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(arg.get_help().is_some(), "{at} {id} has no help");
            }
            for sub in cmd.get_subcommands() {
                assert!(
                    sub.get_about().is_some(),
                    "{at} {} has no about",
                    sub.get_name()
                );
                walk(sub, &format!("{at} {}", sub.get_name()));
            }
        }
        walk(&Cli::command(), "coherent");
    }

    #[test]
    fn event_lines_are_readable() {
        let line = event_line(
            r#"{"seq":7,"ts":"2026-11-30T12:00:01.5Z","event":"transfer","path":"plan.md","session":"alice","agent":"27a468b0-7fa2-5c0d-a2ba-2dac753b2070","successor":"bob","version":2,"note":"two words","x":null}"#,
        );
        assert_eq!(
            line,
            "12:00:01 #7 transfer plan.md by alice (27a468b0): successor=bob version=2 \
             note=\"two words\""
        );
        assert_eq!(event_line("not json"), "not json");
        assert!(
            event_line(&format!(r#"{{"event":"x","note":"{}"}}"#, "y".repeat(500))).len() < 120
        );
    }
}
