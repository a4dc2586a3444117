//! The default state directory (docs/design.md#mounting): `$XDG_STATE_HOME/coherent/<id>`,
//! else `~/.local/state/coherent/<id>`, else for root `/var/lib/coherent/<id>`, one folder
//! per backing directory.
//!
//! `<id>` is the backing directory's base name (for a human browsing the folder) and 16
//! hex digits of a hash of its canonical path (two workspaces named `app` never share
//! state): `/work/app` → `app-1f3c0d2e9a7b4c55`. The hash is FNV-1a 64, fixed here so the
//! folder stays the same across builds.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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
