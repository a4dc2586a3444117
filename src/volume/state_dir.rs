//! The default state directory (docs/design.md#mounting): `$XDG_STATE_HOME/coherent/<id>`,
//! else `~/.local/state/coherent/<id>`, else for root `/var/lib/coherent/<id>`, one folder
//! per backing directory.
//!
//! `<id>` is the backing directory's base name (for a human browsing the folder) and 16
//! hex digits of a hash of its canonical path (two workspaces named `app` never share
//! state): `/work/app` → `app-1f3c0d2e9a7b4c55`. The hash is FNV-1a 64, fixed here so the
//! folder stays the same across builds.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The folder name for a backing directory (pass its canonical path).
pub fn state_id(backing: &Path) -> String {
    let base: String = backing
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    format!("{base}-{:016x}", fnv1a64(backing.as_os_str().as_bytes()))
}

/// The state root from the environment: `$XDG_STATE_HOME/coherent` (when absolute), else
/// `$HOME/.local/state/coherent`. None when neither is usable.
pub fn state_root(xdg_state_home: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    if let Some(x) = xdg_state_home.filter(|x| x.starts_with('/')) {
        return Some(Path::new(x).join("coherent"));
    }
    let home = home.filter(|h| h.starts_with('/'))?;
    Some(Path::new(home).join(".local/state/coherent"))
}

/// Where root keeps state when neither variable is set: mount(8) and systemd start a mount
/// helper with a bare environment.
pub const SYSTEM_STATE_ROOT: &str = "/var/lib/coherent";

/// The default state directory of the backing directory `backing` (canonical).
pub fn default_state_dir(backing: &Path) -> Option<PathBuf> {
    let xdg = std::env::var("XDG_STATE_HOME").ok();
    let home = std::env::var("HOME").ok();
    let root = state_root(xdg.as_deref(), home.as_deref()).or_else(|| {
        nix::unistd::geteuid()
            .is_root()
            .then(|| PathBuf::from(SYSTEM_STATE_ROOT))
    })?;
    Some(root.join(state_id(backing)))
}

// ---- paths only root or this daemon's user can change -----------------------------------
//
// A root daemon that names its state directory or log file by a path some other user can
// change (a directory of theirs on the way) would follow their symlink: append its log to
// a root file, `chmod 700` a root directory, load another volume's state. As sshd and
// systemd do, the path is refused unless every directory on it, from `/`, is owned by root
// or this daemon's user and writable by nobody else (a sticky directory such as /tmp is
// fine: there only an entry's owner may replace it, and that owner is checked next). Then
// no other user can change what the path names, and the final opens add O_NOFOLLOW.

/// The uids trusted with the daemon's own files: root and this process's effective uid.
fn trusted(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Why `md` (of `p`) lets a user other than root and this daemon's user change what is
/// under it, or None.
fn unsafe_entry(p: &Path, md: &std::fs::Metadata) -> Option<String> {
    let me = nix::unistd::geteuid().as_raw();
    if !trusted(md.uid()) {
        return Some(format!(
            "{} is owned by uid {}, not by root or this daemon's uid {me}, so that user \
             could replace what it names (by a symlink to anywhere)",
            crate::names::display_name(&p.to_string_lossy()),
            md.uid()
        ));
    }
    let mode = md.mode();
    if md.file_type().is_dir() && mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Some(format!(
            "{} can be written by {} (mode {:o}) and is not sticky, so another user could \
             replace what it holds",
            crate::names::display_name(&p.to_string_lossy()),
            if mode & 0o002 != 0 {
                "anyone"
            } else {
                "its group"
            },
            mode & 0o7777
        ));
    }
    None
}

/// Checks that no user but root and this daemon's user can change what `path` names: each
/// existing component from `/` (a symlink, then the path it leads to, included) is owned by
/// one of them and, when a directory, writable by nobody else unless sticky. Components
/// that do not exist yet are left to the caller, which makes them inside the last existing
/// one (checked) and checks again. The error is one line naming the component.
pub fn check_trusted_path(path: &Path) -> Result<(), String> {
    let path = std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut todo = path;
    // each round follows one symlink (as the kernel does, at most 40)
    for _ in 0..40 {
        match check_components(&todo)? {
            None => return Ok(()),
            Some(next) => todo = next,
        }
    }
    Err(format!("{}: too many levels of symlinks", todo.display()))
}

/// One pass of [`check_trusted_path`] over `path` (absolute), lstat by lstat: None when
/// done, or the path to check next when a component is a symlink (its target joined with
/// the rest).
fn check_components(path: &Path) -> Result<Option<PathBuf>, String> {
    let comps: Vec<Component> = path.components().collect();
    let mut at = PathBuf::from("/");
    let root = std::fs::symlink_metadata(&at).map_err(|e| format!("cannot check /: {e}"))?;
    if let Some(why) = unsafe_entry(&at, &root) {
        return Err(why);
    }
    for (i, c) in comps.iter().enumerate() {
        match c {
            Component::RootDir | Component::Prefix(_) => {}
            Component::CurDir => continue,
            Component::ParentDir => {
                at.pop();
                continue;
            }
            Component::Normal(n) => at.push(n),
        }
        let md = match std::fs::symlink_metadata(&at) {
            Ok(md) => md,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot check {}: {e}", at.display())),
        };
        if let Some(why) = unsafe_entry(&at, &md) {
            return Err(why);
        }
        if md.file_type().is_symlink() {
            let target = std::fs::read_link(&at)
                .map_err(|e| format!("cannot read the symlink {}: {e}", at.display()))?;
            let mut next = match at.parent() {
                Some(dir) => dir.join(target),
                None => target,
            };
            for c in &comps[i + 1..] {
                next.push(c.as_os_str());
            }
            return Ok(Some(next));
        }
    }
    Ok(None)
}

/// Opens the log file `path` of a daemon for appending, created 0600: refused unless
/// [`check_trusted_path`] holds for it, never through a symlink (`O_NOFOLLOW`), and only
/// a regular file owned by root or this daemon's user.
pub fn open_log_file(path: &Path) -> Result<std::fs::File, String> {
    check_trusted_path(path)?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => format!("{} is a symlink", path.display()),
            _ => format!("cannot open {}: {e}", path.display()),
        })?;
    let md = f
        .metadata()
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    if !md.file_type().is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if let Some(why) = unsafe_entry(path, &md) {
        return Err(why);
    }
    // checked again now that it exists: nobody swapped a directory on the way meanwhile
    check_trusted_path(path)?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_folder_per_backing_directory() {
        let a = state_id(Path::new("/work/app"));
        let b = state_id(Path::new("/tmp/app"));
        assert!(a.starts_with("app-") && b.starts_with("app-"));
        assert_ne!(a, b);
        assert_eq!(a, state_id(Path::new("/work/app")));
        assert_eq!(a.len(), "app-".len() + 16);
        assert!(state_id(Path::new("/")).starts_with("root-"));
        assert!(state_id(Path::new("/x/we ird:name")).starts_with("we_ird_name-"));
    }

    #[test]
    fn xdg_first_then_home() {
        assert_eq!(
            state_root(Some("/s"), Some("/h")),
            Some(PathBuf::from("/s/coherent"))
        );
        assert_eq!(
            state_root(Some("relative"), Some("/h")),
            Some(PathBuf::from("/h/.local/state/coherent"))
        );
        assert_eq!(state_root(None, None), None);
    }
}
