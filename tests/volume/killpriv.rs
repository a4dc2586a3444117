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

both_modes!(same_as_native);

/// In place, where the kernel keeps attributes for 24 h: the mode it shows after each
/// step must be the new one.
#[test]
fn same_as_native_in_place() {
    same_as_native(&Mount::builder().in_place().start());
}
