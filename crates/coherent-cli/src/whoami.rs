//! The `export COHERENT_SESSION=x` trap: a shell's environment in /proc is the one it was
//! started with, so after an `export` the commands it starts are session x while its own
//! redirections (`echo y >> plan.md`) are still written as the shell's old session.
//! `coherent whoami` compares the shell that started it with what the volume says about
//! the CLI itself, and says what to run when they differ.

use coherent::identity::Resolver;

/// Shells whose builtins (redirections) write files themselves.
const SHELLS: [&str; 8] = [
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "busybox",
];

/// A warning when the parent shell is another session than this process; None when they
/// agree, the parent is no shell, or anything cannot be read.
pub fn parent_mismatch() -> Option<String> {
    let ppid = std::os::unix::process::parent_id();
    let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).ok()?;
    let comm = comm.trim();
    if !SHELLS.contains(&comm) {
        return None;
    }
    let resolver = Resolver::default();
    let parent = resolver.resolve_uncached(ppid).ok()?;
    let me = resolver.resolve_uncached(std::process::id()).ok()?;
    if parent.name == me.name {
        return None;
    }
    Some(format!(
        "coherent: warning: the shell that ran this command ({comm}, pid {ppid}) is session \
         {parent}, not {me}: what it writes itself (`echo x >> file`, `> file`) counts as \
         {parent}, while the commands it starts are {me}. After `export \
         COHERENT_SESSION={me}` in a running shell this is expected; to make the shell itself \
         {me}, start a new one in the session: coherent run --session {word}",
        parent = parent.name,
        me = me.name,
        word = coherent_wire::control::shell_word(&me.name),
    ))
}
