//! `coherent run` closes the way around the mount: the command it starts, and
//! everything that command starts, runs under a Landlock ruleset (unprivileged, inherited,
//! enforced by the kernel) that allows writes only under the volume's mount and a few
//! scratch places, never under the backing directory. Reads and execution stay as they
//! were. A giver whose writes all go through the mount cannot go around its fence by
//! writing the backing files directly, through an old working directory inside an
//! in-place mount's directory, or by any other name of the backing directory.
//!
//! Where the kernel has Landlock ABI 6 the ruleset is also scoped: the session
//! cannot connect to an abstract unix socket nor signal a process created outside it, so
//! it cannot ask a helper of the same user started outside (a server listening on an
//! abstract socket) to write for it. What stays open is listed in docs/sessions.md.

use coherent::sys;
use landlock::{
    path_beneath_rules, Access, AccessFs, CompatLevel, Compatible, LandlockStatus, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::{Path, PathBuf};

/// The variable that replaces the default scratch list: paths separated by `:` (empty:
/// only the mount).
pub const WRITABLE_ENV: &str = "COHERENT_RUN_WRITABLE";

/// The write rights the ruleset handles (ABI 3: `truncate` included). Reads, execution
/// and device ioctls are not restricted.
fn write_access() -> landlock::BitFlags<AccessFs> {
    AccessFs::from_write(ABI::V3)
}

/// Always writable: `/dev` (null, tty, pts, shm).
const ALWAYS: &[&str] = &["/dev"];

/// The scratch places writable by default: temporary directories, the user's config,
/// cache and data directories, Claude Code's and Codex's files. Missing ones are left out. Not
/// `~/.local/state`: a volume's state directory lives there.
pub fn default_writable() -> Vec<PathBuf> {
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from);
    let xdg = |var: &str, rel: &str| -> Option<PathBuf> {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(rel)))
    };
    let mut out: Vec<PathBuf> = ["/tmp", "/var/tmp"].iter().map(PathBuf::from).collect();
    out.extend(
        std::env::var_os("TMPDIR")
            .filter(|t| !t.is_empty())
            .map(PathBuf::from),
    );
    out.extend(xdg("XDG_CACHE_HOME", ".cache"));
    out.extend(xdg("XDG_CONFIG_HOME", ".config"));
    out.extend(xdg("XDG_DATA_HOME", ".local/share"));
    if let Some(h) = &home {
        out.push(h.join(".claude"));
        out.push(h.join(".claude.json"));
        // Codex keeps its sessions, logs and config there
        out.push(h.join(".codex"));
    }
    out.extend(
        std::env::var_os("CODEX_HOME")
            .filter(|c| !c.is_empty())
            .map(PathBuf::from),
    );
    out
}

/// What may be written besides the mount: `/dev`; the scratch list,
/// `COHERENT_RUN_WRITABLE` when set (replacing the defaults), else [`default_writable`];
/// then the `--allow-write` paths.
pub fn writable(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ALWAYS.iter().map(PathBuf::from).collect();
    out.extend(match std::env::var_os(WRITABLE_ENV) {
        Some(v) => std::env::split_paths(&v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect::<Vec<_>>(),
        None => default_writable(),
    });
    out.extend(extra.iter().cloned());
    out
}

/// Is `p` a temporary directory of the defaults (`/tmp`, `/var/tmp`, `$TMPDIR`)?
pub fn is_temp_dir(p: &Path) -> bool {
    p == Path::new("/tmp")
        || p == Path::new("/var/tmp")
        || std::env::var_os("TMPDIR").is_some_and(|t| Path::new(&t) == p)
}

/// A temporary directory for the session alone when the usual one holds the backing
/// directory (a checkout under /tmp): `coherent-run-XXXXXX`, mode 0700, in the first of
/// `/tmp`, `/var/tmp`, `/dev/shm` where it neither holds nor lies in the backing directory.
/// Left behind at the end, like any temporary directory, for the system to clear.
pub fn private_tmp(root: &Path, backing: &Path, writable: &[PathBuf]) -> Result<PathBuf, String> {
    let mut last = String::new();
    for parent in ["/tmp", "/var/tmp", "/dev/shm"] {
        let template = Path::new(parent).join("coherent-run-XXXXXX");
        let dir = match nix::unistd::mkdtemp(&template) {
            Ok(d) => d,
            Err(e) => {
                last = format!("{parent}: {e}");
                continue;
            }
        };
        let mut with = writable.to_vec();
        with.push(dir.clone());
        if conflict(root, backing, &with).is_none() {
            return Ok(dir);
        }
        let _ = std::fs::remove_dir(&dir);
    }
    Err(format!(
        "no temporary directory apart from the backing directory {} ({last})",
        backing.display()
    ))
}

/// The backing directory of the coherent volume mounted at `root`, from
/// `/proc/self/mountinfo` (`coherent-mount` names its mounts `coherent:BACKING`).
pub fn backing_of(root: &Path) -> Result<PathBuf, String> {
    let mounts = sys::mounts().map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    // The last mount on that point is the one seen there.
    match mounts.into_iter().rev().find(|m| m.mount_point == root) {
        Some(m) if m.fstype.starts_with("fuse") => {
            let src = m.source.to_string_lossy();
            match src.strip_prefix("coherent:") {
                Some(b) if b.starts_with('/') => Ok(PathBuf::from(b)),
                _ => Err(format!(
                    "the volume at {} does not name its backing directory (mount source \
                     {src:?}; was it mounted with -o fsname=...?)",
                    root.display()
                )),
            }
        }
        _ => Err(format!(
            "{} is not a mounted coherent volume",
            root.display()
        )),
    }
}

/// The allowed entry that would let writes reach the backing directory `backing`: one
/// that contains it, or (for a mount that is not in place) lies inside it. Paths are
/// compared as the kernel resolves them (`canonicalize`).
pub fn conflict(root: &Path, backing: &Path, writable: &[PathBuf]) -> Option<PathBuf> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let in_place = canon(root) == canon(backing);
    // The backing directory as its own path names it: for an in-place mount that path
    // resolves through the mount now, so compare the path as given.
    let b = if in_place {
        backing.to_path_buf()
    } else {
        canon(backing)
    };
    writable.iter().find_map(|w| {
        let c = canon(w);
        let inside = !in_place && c.starts_with(&b);
        (b.starts_with(&c) || inside).then(|| w.clone())
    })
}

/// What [`restrict`] did.
pub enum Outcome {
    /// Enforced. `truncate`: writes by truncation are covered (ABI >= 3); `ipc`: abstract
    /// unix sockets and signals are scoped to the session (ABI >= 6).
    Enforced { truncate: bool, ipc: bool },
    /// The kernel has no Landlock: nothing restricted.
    Unsupported,
}

/// Restricts this process (and what it execs) to writing under `root` and `writable`,
/// and, where the kernel can, to reaching no abstract unix socket and signalling no
/// process made outside the ruleset.
pub fn restrict(root: &Path, writable: &[PathBuf]) -> Result<Outcome, String> {
    let access = write_access();
    let mut paths: Vec<PathBuf> = vec![root.to_path_buf()];
    paths.extend(writable.iter().filter(|p| p.exists()).cloned());
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(access)
        .and_then(|r| r.scope(Scope::from_all(ABI::V6)))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(&paths, access)))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("cannot set up the Landlock ruleset: {e}"))?;
    // Best effort drops what the kernel lacks; the ABI it ran with says what was kept.
    let abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => effective_abi,
        _ => ABI::Unsupported,
    };
    Ok(match status.ruleset {
        RulesetStatus::NotEnforced => Outcome::Unsupported,
        _ => Outcome::Enforced {
            truncate: abi >= ABI::V3,
            ipc: abi >= ABI::V6,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_containing_the_backing_directory_conflicts() {
        let d = tempfile::tempdir().unwrap();
        let (b, m, s) = (d.path().join("b"), d.path().join("m"), d.path().join("s"));
        for p in [&b, &m, &s] {
            std::fs::create_dir(p).unwrap();
        }
        assert_eq!(conflict(&m, &b, std::slice::from_ref(&s)), None);
        assert_eq!(
            conflict(&m, &b, &[s.clone(), d.path().to_path_buf()]),
            Some(d.path().to_path_buf())
        );
        assert_eq!(conflict(&m, &b, &[b.join("x")]), Some(b.join("x")));
        // In place: the mount itself is the way in; what contains it is not.
        assert_eq!(conflict(&m, &m, &[m.join("cache")]), None);
        assert_eq!(
            conflict(&m, &m, &[d.path().to_path_buf()]),
            Some(d.path().to_path_buf())
        );
    }
}
