//! Several users on one mount (`-o allow_other,default_permissions`): permission checks
//! as on the backing filesystem, and files owned by whoever created them.

use crate::common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::Mount;

const NOBODY: u32 = 65534;

fn multi_user(passthrough: bool) -> Mount {
    Mount::builder()
        .passthrough(passthrough)
        .arg("-o")
        .arg("allow_other,default_permissions")
        .start()
}

/// Run `cmd` in the mount as uid/gid 65534 with the given supplementary groups.
fn as_nobody(m: &Mount, groups: &str, cmd: &str) -> std::process::Output {
    let groups = if groups.is_empty() {
        "--clear-groups".to_string()
    } else {
        format!("--groups={groups}")
    };
    m.sh(&format!(
        "setpriv --reuid={NOBODY} --regid={NOBODY} {groups} sh -c '{}' 2>&1",
        cmd.replace('\'', "'\\''")
    ))
}

fn ok(o: &std::process::Output) -> bool {
    o.status.success()
}

fn permissions(m: &Mount) {
    fs::set_permissions(&m.backing, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(
        m.backing.parent().unwrap(),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    // A world-writable directory owned by nobody's work area.
    fs::create_dir(m.path("pub")).unwrap();
    fs::set_permissions(m.path("pub"), fs::Permissions::from_mode(0o777)).unwrap();
    // Creations by nobody are owned by nobody.
    let o = as_nobody(
        m,
        "",
        "cd pub && echo hi > file && mkdir dir && ln -s file link && mkfifo fifo && cp file copy",
    );
    assert!(ok(&o), "{}", String::from_utf8_lossy(&o.stdout));
    for name in ["file", "dir", "link", "fifo", "copy"] {
        let md = fs::symlink_metadata(m.backing_path(format!("pub/{name}"))).unwrap();
        assert_eq!((md.uid(), md.gid()), (NOBODY, NOBODY), "{name}");
    }
    // Root's files: readable, not writable; root's directory: no creating in it.
    fs::write(m.path("rootfile"), b"root").unwrap();
    fs::set_permissions(m.path("rootfile"), fs::Permissions::from_mode(0o644)).unwrap();
    let o = as_nobody(m, "", "cat rootfile");
    assert!(ok(&o));
    assert_eq!(o.stdout, b"root");
    let o = as_nobody(m, "", "echo x >> rootfile");
    assert!(!ok(&o) && String::from_utf8_lossy(&o.stdout).contains("Permission denied"));
    assert_eq!(fs::read(m.path("rootfile")).unwrap(), b"root");
    let o = as_nobody(m, "", "touch newfile");
    assert!(!ok(&o) && String::from_utf8_lossy(&o.stdout).contains("Permission denied"));
    assert!(!m.backing_path("newfile").exists());
    // chmod/chown of someone else's file.
    assert!(!ok(&as_nobody(m, "", "chmod 777 rootfile")));
    assert!(
        !ok(&as_nobody(m, "", "chown 0 pub/file")),
        "only root may give files away"
    );
    assert!(ok(&as_nobody(m, "", "chmod 600 pub/file")));
    assert_eq!(
        fs::metadata(m.backing_path("pub/file")).unwrap().mode() & 0o777,
        0o600
    );
    // A 0600 root file is not readable.
    fs::write(m.path("secret"), b"s").unwrap();
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let o = as_nobody(m, "", "cat secret");
    assert!(!ok(&o) && String::from_utf8_lossy(&o.stdout).contains("Permission denied"));
    // Supplementary groups count: a group-writable directory of group 4242.
    fs::create_dir(m.path("team")).unwrap();
    std::os::unix::fs::chown(m.path("team"), Some(0), Some(4242)).unwrap();
    fs::set_permissions(m.path("team"), fs::Permissions::from_mode(0o775)).unwrap();
    assert!(!ok(&as_nobody(m, "", "touch team/a")));
    let o = as_nobody(m, "4242", "touch team/a");
    assert!(ok(&o), "{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(
        fs::metadata(m.backing_path("team/a")).unwrap().uid(),
        NOBODY
    );
    // A setgid directory gives its group to new files.
    fs::set_permissions(m.path("team"), fs::Permissions::from_mode(0o2775)).unwrap();
    assert!(ok(&as_nobody(m, "4242", "touch team/b && mkdir team/c")));
    let md = fs::metadata(m.backing_path("team/b")).unwrap();
    assert_eq!((md.uid(), md.gid()), (NOBODY, 4242));
    let md = fs::metadata(m.backing_path("team/c")).unwrap();
    assert_eq!(md.gid(), 4242);
    assert!(md.mode() & 0o2000 != 0, "subdirectory inherits setgid");
    // Sticky directory: nobody cannot remove root's file in it.
    fs::create_dir(m.path("sticky")).unwrap();
    fs::set_permissions(m.path("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(m.path("sticky/rootowned"), b"").unwrap();
    assert!(!ok(&as_nobody(m, "", "rm -f sticky/rootowned")));
    assert!(m.backing_path("sticky/rootowned").exists());
    assert!(ok(&as_nobody(m, "", "touch sticky/mine && rm sticky/mine")));
}

#[test]
fn permissions_passthrough() {
    permissions(&multi_user(true));
}

#[test]
fn permissions_daemon() {
    permissions(&multi_user(false));
}

/// With --private (no allow_other), other users cannot use the mount at all (the default,
/// run as root, lets them in: docs/design.md#mounting, tests/mounted/enforce_users.rs).
#[test]
fn other_users_are_kept_out_of_a_private_mount() {
    let m = Mount::builder().arg("--private").start();
    fs::set_permissions(&m.backing, fs::Permissions::from_mode(0o755)).unwrap();
    let o = as_nobody(&m, "", "ls .");
    assert!(!ok(&o));
}
