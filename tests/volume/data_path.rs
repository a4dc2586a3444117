//! The daemon's data path against native: where an `O_APPEND` file's data lands. The kernel
//! sends each write with the offset it means, a shared mapping's dirty page included, and
//! an `O_APPEND` write with the caller's flags; the daemon must put the page where its
//! offset says and still append a real append atomically (src/store/sys.rs,
//! `Store::write`). One probe (python3, so a plain user runs the same steps) on a native
//! directory and through every data mode a mount has: passthrough, the daemon
//! (`--no-passthrough`), in place, and a plain user's mount (no CAP_SYS_ADMIN: the daemon
//! serves the data).

use crate::common;

use common::{users, Mount};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The probe (tests/data/append_probe.py): `python3 -c PROBE DIR [BEHIND]`. BEHIND is the same directory reached
/// around the mount (its backing directory; natively DIR itself): a file grown there is
/// grown behind the kernel's back, and an append must still go after it.
const PROBE: &str = include_str!("../data/append_probe.py");

fn probe(dir: &Path, behind: Option<&Path>) -> String {
    let mut c = Command::new("python3");
    c.args(["-c", PROBE]).arg(dir).args(behind);
    let o = common::run_timeout(&mut c, Duration::from_secs(60));
    assert!(
        o.status.success(),
        "probe in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What Linux does natively (checked against a native directory each run).
const NATIVE: &str = "mapped X123456789\nappends abbcd 5\nfcntl Zbbcde\nboth abcdefgH++\n";
const GROWN: &str = "grown 0123456789ABCDEx\n";

fn native() -> String {
    let n = tempfile::tempdir().unwrap();
    let out = probe(n.path(), Some(n.path()));
    assert_eq!(out, format!("{NATIVE}{GROWN}"), "native");
    out
}

/// In passthrough the kernel writes the backing file it opened with the caller's flags at
/// the open: `O_APPEND` taken off later with fcntl still appends there (the kernel's limit,
/// not the daemon's: it never sees these writes).
fn with_passthrough(native: &str) -> String {
    native.replace("fcntl Zbbcde\n", "fcntl abbcdZe\n")
}

fn passthrough(m: &Mount) -> bool {
    m.log().contains("data mode: passthrough")
}

fn same_as_native(m: &Mount) {
    let mut want = native();
    if passthrough(m) {
        want = with_passthrough(&want);
    }
    let got = probe(&m.mnt, Some(&m.backing));
    assert_eq!(got, want, "through the mount; log:\n{}", m.log());
}

both_modes!(same_as_native);

#[test]
fn same_as_native_in_place() {
    native();
    let m = Mount::builder().in_place().start();
    assert!(passthrough(&m), "{}", m.log());
    let got = probe(&m.mnt, None);
    assert_eq!(got, with_passthrough(NATIVE), "log:\n{}", m.log());
}

/// A plain user's mount (through fusermount3, in a mount namespace where coh-u1 may open
/// /dev/fuse): without CAP_SYS_ADMIN the daemon serves every read and write.
#[test]
fn same_as_native_on_a_plain_users_mount() {
    let want = native();
    let u1 = users::u1();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(dir.path().join("probe.py"), PROBE).unwrap();
    let d = dir.path().display();
    let script = format!(
        "set -e; mknod -m 666 {d}/fuse c 10 229; mount --bind {d}/fuse /dev/fuse; \
         as_u1() {{ setpriv --reuid={uid} --regid={gid} --init-groups -- sh -c \"$1\"; }}; \
         as_u1 'mkdir {d}/b {d}/m'; \
         as_u1 'exec {bin} {d}/b {d}/m --state-dir {d}/s' >/dev/null 2>{d}/log & \
         trap \"umount {d}/m || umount -l {d}/m; wait\" EXIT; \
         i=0; until grep -q ' {d}/m ' /proc/self/mountinfo; do \
           i=$((i+1)); [ $i -lt 500 ] || exit 3; sleep 0.01; done; \
         as_u1 'python3 {d}/probe.py {d}/m {d}/b' > {d}/out",
        uid = u1.uid,
        gid = u1.gid,
        bin = common::BIN,
    );
    let o = common::run_timeout(
        Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]),
        Duration::from_secs(60),
    );
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap_or_default();
    assert!(
        o.status.success(),
        "{}\nlog: {}",
        String::from_utf8_lossy(&o.stderr),
        read("log")
    );
    assert!(
        read("log").contains("data mode: through the daemon"),
        "{}",
        read("log")
    );
    assert_eq!(read("out"), want, "log:\n{}", read("log"));
}
