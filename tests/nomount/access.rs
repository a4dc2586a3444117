//! `coherent::access` against the kernel itself: for real users (`coh-u1`, `coh-u2`) on a
//! real tree with modes, a supplementary group and POSIX ACLs, `may_write` and
//! `may_look_up` must answer what the user's own shell gets (`test -w`, `stat`).

use crate::common;

use common::users;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::Command;

use coherent::access::{may_look_up, may_write, Who};
use users::User;

fn who(u: &User) -> Who {
    Who {
        uid: u.uid,
        gid: u.gid,
        groups: u.groups.clone(),
    }
}

fn run(cmd: &mut Command) {
    let o = cmd.output().expect("spawn");
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn chown(p: &Path, owner: &str) {
    run(Command::new("chown").arg(owner).arg(p));
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn setfacl(p: &Path, spec: &str) {
    run(Command::new("setfacl").args(["-m", spec]).arg(p));
}

fn file(root: &Path, rel: &str, mode: u32) {
    let p = root.join(rel);
    fs::write(&p, "x").unwrap();
    chmod(&p, mode);
}

fn dir(root: &Path, rel: &str, mode: u32) {
    let p = root.join(rel);
    fs::create_dir(&p).unwrap();
    chmod(&p, mode);
}

/// The tree (root-owned unless said):
/// - `pub/` 0755: `ro` 0644; `mine` 0644 of coh-u1; `shared` 0660 group coh-shared;
///   `acl` 0644 + ACL `u:coh-u2:rw`; `world` 0666; `lnk -> world`
/// - `u1home/` 0700 of coh-u1: `x` 0666
/// - `aclsearch/` 0700 + ACL `u:coh-u2:x`: `z` 0666
/// - `grp/` 0710 group coh-shared: `w` 0666
/// - `out -> /root`
fn tree() -> (tempfile::TempDir, OwnedFd) {
    let (u1, _u2) = (users::u1(), users::u2());
    let d = tempfile::tempdir().unwrap();
    chmod(d.path(), 0o755);
    let r = d.path().join("root");
    fs::create_dir(&r).unwrap();
    chmod(&r, 0o755);
    dir(&r, "pub", 0o755);
    file(&r, "pub/ro", 0o644);
    file(&r, "pub/mine", 0o644);
    chown(&r.join("pub/mine"), &u1.name);
    file(&r, "pub/shared", 0o660);
    chown(
        &r.join("pub/shared"),
        &format!("root:{}", users::SHARED_GROUP),
    );
    file(&r, "pub/acl", 0o644);
    setfacl(&r.join("pub/acl"), "u:coh-u2:rw");
    file(&r, "pub/world", 0o666);
    symlink("world", r.join("pub/lnk")).unwrap();
    dir(&r, "u1home", 0o700);
    file(&r, "u1home/x", 0o666);
    chown(&r.join("u1home"), &u1.name);
    dir(&r, "aclsearch", 0o700);
    file(&r, "aclsearch/z", 0o666);
    setfacl(&r.join("aclsearch"), "u:coh-u2:x");
    dir(&r, "grp", 0o710);
    file(&r, "grp/w", 0o666);
    chown(&r.join("grp"), &format!("root:{}", users::SHARED_GROUP));
    symlink("/root", r.join("out")).unwrap();
    let fd = fs::File::open(&r).unwrap().into();
    (d, fd)
}

/// What the user's own shell says: may it open `rel` for writing (`test -w`)?
fn shell_can_write(u: &User, root: &Path, rel: &str) -> bool {
    u.sh(root, &[], &format!("test -w '{rel}'"))
        .status
        .success()
}

/// What the user's own `stat` says: can it look `rel` up (found, or "No such file", but not
/// "Permission denied")?
fn shell_can_look_up(u: &User, root: &Path, rel: &str) -> bool {
    let o = u.sh(root, &[], &format!("stat -- '{rel}' >/dev/null"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() || err.contains("Permission denied") || err.contains("No such file"),
        "stat {rel} as {}: {err}",
        u.name
    );
    !err.contains("Permission denied")
}

#[test]
fn may_write_agrees_with_the_kernel() {
    let (d, root) = tree();
    let rp = d.path().join("root");
    let (u1, u2) = (users::u1(), users::u2());
    // (path, coh-u1 may write, coh-u2 may write)
    let cases = [
        ("pub/ro", false, false),
        ("pub/mine", true, false),
        ("pub/shared", true, false),
        ("pub/acl", false, true),
        ("pub/world", true, true),
        ("u1home/x", true, false),
        ("aclsearch/z", false, true),
        ("grp/w", true, false),
    ];
    for (rel, w1, w2) in cases {
        for (u, want) in [(&u1, w1), (&u2, w2)] {
            assert_eq!(
                shell_can_write(u, &rp, rel),
                want,
                "kernel: {} writes {rel}",
                u.name
            );
            let got = may_write(root.as_fd(), Path::new(rel), &who(u)).unwrap();
            assert_eq!(got, want, "may_write: {} writes {rel}", u.name);
        }
        assert!(may_write(root.as_fd(), Path::new(rel), &Who::root()).unwrap());
    }
    // A symlink's path names the link: writing it is replacing it in `pub/` (root's 0755).
    assert!(!may_write(root.as_fd(), Path::new("pub/lnk"), &who(&u1)).unwrap());
    // Nothing there, or outside: errors, never a yes or a check of a host file.
    let errno = |rel: &str, u: &User| {
        may_write(root.as_fd(), Path::new(rel), &who(u))
            .unwrap_err()
            .raw_os_error()
    };
    assert_eq!(errno("pub/nope", &u1), Some(libc::ENOENT));
    assert_eq!(errno("out/.bashrc", &u1), Some(libc::EXDEV));
    assert_eq!(errno("out/no-such-file", &u1), Some(libc::EXDEV));
}

#[test]
fn may_look_up_agrees_with_the_kernel() {
    let (d, root) = tree();
    let rp = d.path().join("root");
    let (u1, u2) = (users::u1(), users::u2());
    // (path, coh-u1 may look it up, coh-u2 may)
    let cases = [
        ("pub/ro", true, true),
        ("pub/nope", true, true),
        ("u1home/x", true, false),
        ("u1home/nope", true, false),
        ("aclsearch/z", false, true),
        ("aclsearch/nope", false, true),
        ("grp/w", true, false),
        ("grp/nope", true, false),
        ("top-level-nope", true, true),
    ];
    for (rel, l1, l2) in cases {
        for (u, want) in [(&u1, l1), (&u2, l2)] {
            assert_eq!(
                shell_can_look_up(u, &rp, rel),
                want,
                "kernel: {} looks up {rel}",
                u.name
            );
            let got = may_look_up(root.as_fd(), Path::new(rel), &who(u));
            assert_eq!(got, want, "may_look_up: {} looks up {rel}", u.name);
        }
        assert!(may_look_up(root.as_fd(), Path::new(rel), &Who::root()));
    }
    // A parent that is gone or outside: no one but root.
    for rel in ["nodir/x", "out/.bashrc", "out/no-such-file"] {
        assert!(
            !may_look_up(root.as_fd(), Path::new(rel), &who(&u1)),
            "{rel}"
        );
    }
}

#[test]
fn checks_leave_the_thread_as_root() {
    let (d, root) = tree();
    let u2 = users::u2();
    let groups = || {
        let mut buf = vec![0 as libc::gid_t; 256];
        // SAFETY: getgroups into a buffer of the length given.
        let n = unsafe { libc::getgroups(buf.len() as i32, buf.as_mut_ptr()) };
        buf.truncate(n as usize);
        buf
    };
    let before = groups();
    assert!(may_write(root.as_fd(), Path::new("pub/acl"), &who(&u2)).unwrap());
    assert!(!may_look_up(root.as_fd(), Path::new("u1home/x"), &who(&u2)));
    assert_eq!(groups(), before);
    // Root's capabilities are back: this thread writes into coh-u1's 0700 directory.
    fs::write(d.path().join("root/u1home/by-root"), "r").unwrap();
}

#[test]
fn a_log_view_shows_only_lines_the_reader_may_see() {
    use coherent::visibility::LogView;
    let (_d, root) = tree();
    let (u1, u2) = (users::u1(), users::u2());
    let lines = [
        r#"{"seq":1,"event":"session_seen","session":"a"}"#,
        r#"{"seq":2,"event":"commit","path":"u1home/x"}"#,
        r#"{"seq":3,"event":"commit","path":"pub/ro"}"#,
        r#"{"seq":4,"event":"commit","path":"pub/moved","from":"u1home/y"}"#,
        r#"{"seq":5,"event":"transfer","path":"grp/w","note":"n"}"#,
        r#"{"seq":6,"event":"commit","path":"top"}"#,
    ];
    let log: Vec<u8> = lines
        .iter()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect();
    let raw = |off: u64, max: usize| -> std::io::Result<(u64, Vec<u8>)> {
        let end = log.len().min(off as usize + max.min(11));
        Ok((off, log.get(off as usize..end).unwrap_or_default().to_vec()))
    };
    let read_all = |who: Who| {
        let mut v = LogView::new(who);
        let mut got = Vec::new();
        loop {
            let b = v.read(root.as_fd(), got.len() as u64, 13, raw).unwrap();
            if b.is_empty() {
                break String::from_utf8(got).unwrap();
            }
            got.extend(b);
        }
    };
    let seqs = |text: String| -> Vec<u64> {
        text.lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(seqs(read_all(Who::root())), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(seqs(read_all(who(&u1))), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(seqs(read_all(who(&u2))), vec![1, 3, 6]);
}
