//! Privileges a write, truncate or chown removes (the mount takes `FUSE_HANDLE_KILLPRIV_V2`,
//! so the daemon removes them, src/fs/killpriv.rs): the same steps by root and by a real
//! plain user (`coh-u1`) on a native directory and on a mount, with passthrough and
//! without, must leave the same modes and file capabilities.

use crate::common;

use common::{users, Mount};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn root_sh(dir: &Path, cmd: &str) -> String {
    let o = Command::new("sh")
        .args(["-c", cmd])
        .current_dir(dir)
        .output()
        .expect("sh");
    assert!(
        o.status.success(),
        "`{cmd}` as root: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Set the files up as root, act, and report each file's mode and capabilities.
fn scenario(dir: &Path) -> String {
    let u1 = users::u1();
    let own = format!("{}:{}", u1.uid, u1.gid);
    // 6775: set-user-ID, and set-group-ID with group execute (any plain writer clears
    // both). 2764: set-group-ID without group execute, group root (u1 is not in it).
    root_sh(
        dir,
        &format!(
            "for f in write trunc otrunc rootwrite chgrp; do echo data > $f; chown {own} $f; chmod 6775 $f; done; \
             echo data > notingroup; chown {u1}:0 notingroup; chmod 2764 notingroup; \
             for f in cap rootcap; do echo data > $f; chown {own} $f; chmod 755 $f; setcap cap_net_raw+ep $f; done",
            u1 = u1.uid
        ),
    );
    let shared = users::shared_gid();
    u1.sh_ok(
        dir,
        &[],
        &format!(
            "echo more >> write && truncate -s 1 trunc && : > otrunc && chgrp {shared} chgrp && \
             echo more >> notingroup && echo more >> cap"
        ),
    );
    root_sh(dir, "echo more >> rootwrite && echo more >> rootcap");
    root_sh(
        dir,
        "for f in write trunc otrunc rootwrite chgrp notingroup cap rootcap; do \
         echo \"$f $(stat -c %a $f) caps=[$(getcap $f | cut -d' ' -f2-)]\"; done",
    )
}

fn same_as_native(m: &Mount) {
    let native = tempfile::tempdir().unwrap();
    std::fs::set_permissions(native.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let base = m.mnt.parent().unwrap();
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&m.mnt, std::fs::Permissions::from_mode(0o777)).unwrap();
    let want = scenario(native.path());
    // What Linux does, so that a native run that changed its rules shows up here first.
    assert_eq!(
        want,
        "write 775 caps=[]\ntrunc 775 caps=[]\notrunc 775 caps=[]\nrootwrite 6775 caps=[]\n\
         chgrp 775 caps=[]\nnotingroup 764 caps=[]\ncap 755 caps=[]\nrootcap 755 caps=[]\n",
        "native"
    );
    assert_eq!(scenario(&m.mnt), want, "mount log:\n{}", m.log());
}

/// `chown` has its own rule, distinct from a write's: set-user-ID goes on anything but a
/// directory whoever the caller (root too), set-group-ID when the group may execute or
/// the caller is neither root nor in the file's group; `chown(f, -1, -1)`, which changes
/// nothing, too. Files, FIFOs and set-group-ID directories, by root and by coh-u1, each
/// the native result of the same steps.
fn chown_scenario(dir: &Path) -> String {
    let u1 = users::u1();
    let shared = users::shared_gid();
    // r*: root's, u*: coh-u1's; f: file, p: FIFO, d: directory. `g0`: group root, which
    // coh-u1 is not in.
    root_sh(
        dir,
        &format!(
            "for k in f p d; do for m in 4755 2755 2745 6745 4644; do for w in r u ru ug n ng; do \
               n=$w-$k-$m; case $k in f) echo data > $n;; p) mkfifo $n;; d) mkdir $n;; esac; \
               case $w in u|ug) chown {u}:{g} $n;; ng) chown 0:{g} $n;; esac; chmod $m $n; done; done; \
               n=u-$k-2745-g0; case $k in f) echo data > $n;; p) mkfifo $n;; d) mkdir $n;; esac; \
               chown {u}:0 $n; chmod 2745 $n; done",
            u = u1.uid,
            g = u1.gid,
        ),
    );
    const SAME: &str = "import os, sys\nfor p in sys.argv[1:]: os.chown(p, -1, -1)";
    // chown(f, -1, -1) by root and by the owner; a real change of owner by root, of group
    // by the owner (to a group it is in).
    root_sh(
        dir,
        &format!("python3 -c '{SAME}' r-* && chown {} ru-*", u1.uid),
    );
    // Not the owner: refused where a bit would go (root's files, n-*; ng-* in coh-u1's
    // group, where set-group-ID without group execute stays), as natively.
    const TRY: &str = "import os, sys\nfor p in sys.argv[1:]:\n  try: os.chown(p, -1, -1); print(p, 0)\n  except OSError as e: print(p, e.errno)";
    let refused = u1.sh_ok(
        dir,
        &[],
        &format!("python3 -c '{SAME}' u-* && chgrp {shared} ug-* && python3 -c '{TRY}' n-* ng-*"),
    );
    root_sh(dir, "stat -c '%n %a' * | sort") + &refused
}

fn chown_same_as_native(m: &Mount) {
    let native = tempfile::tempdir().unwrap();
    std::fs::set_permissions(native.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let base = m.mnt.parent().unwrap();
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&m.mnt, std::fs::Permissions::from_mode(0o777)).unwrap();
    let want = chown_scenario(native.path());
    // What Linux does, so that a native run that changed its rules shows up here first.
    for line in [
        "r-f-4755 755",
        "r-f-2755 755",
        "r-f-2745 2745",
        "r-f-6745 2745",
        "r-p-4755 755",
        "r-p-2755 755",
        "r-d-2755 2755",
        "r-d-4755 4755",
        "u-f-2745 2745",
        "u-f-2745-g0 745",
        "u-p-2745-g0 745",
        "u-d-2745-g0 2745",
        "ru-f-2745 2745",
        "ug-p-6745 2745",
        "n-f-4755 1",
        "n-d-4755 0",
        "n-p-4755 1",
        "n-p-4644 1",
        "ng-f-2745 0",
        "ng-f-2755 1",
    ] {
        assert!(
            want.lines().any(|l| l == line),
            "native: no `{line}` in\n{want}"
        );
    }
    assert_eq!(chown_scenario(&m.mnt), want, "mount log:\n{}", m.log());
}

both_modes!(same_as_native, chown_same_as_native);

/// In place, where the kernel keeps attributes for 24 h: the mode it shows after each
/// step must be the new one.
#[test]
fn same_as_native_in_place() {
    same_as_native(&Mount::builder().in_place().start());
}

#[test]
fn chown_same_as_native_in_place() {
    chown_same_as_native(&Mount::builder().in_place().start());
}
