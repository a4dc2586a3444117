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

/// The probe: `python3 -c PROBE DIR [BEHIND]`. BEHIND is the same directory reached
/// around the mount (its backing directory; natively DIR itself): a file grown there is
/// grown behind the kernel's back, and an append must still go after it.
const PROBE: &str = r#"
import fcntl, mmap, os, sys
d = sys.argv[1]
behind = sys.argv[2] if len(sys.argv) > 2 else None
def content(name):
    with open(os.path.join(behind or d, name), "rb") as f:
        return f.read().decode()
A = os.O_APPEND
# A store into a shared mapping of a file opened O_APPEND, written back by msync.
p = os.path.join(d, "mapped")
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC | A, 0o644)
os.write(fd, b"0123456789")
m = mmap.mmap(fd, 10)
m[0:1] = b"X"
m.flush()
m.close()
os.close(fd)
print("mapped", content("mapped"))
# Two descriptors appending in turn; pwrite on an O_APPEND descriptor appends too.
p = os.path.join(d, "log")
a = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | A, 0o644)
b = os.open(p, os.O_WRONLY | A)
os.write(a, b"a"); os.write(b, b"bb"); os.pwrite(a, b"c", 0); os.write(b, b"d")
print("appends", content("log"), os.lseek(b, 0, os.SEEK_CUR))
# O_APPEND taken off and put back with fcntl: the flags of each write count.
fl = fcntl.fcntl(a, fcntl.F_GETFL)
fcntl.fcntl(a, fcntl.F_SETFL, fl & ~A)
os.pwrite(a, b"Z", 0)
fcntl.fcntl(a, fcntl.F_SETFL, fl)
os.write(a, b"e")
print("fcntl", content("log"))
os.close(a); os.close(b)
# A mapping through a read-write descriptor while another appends.
p = os.path.join(d, "both")
w = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
ap = os.open(p, os.O_WRONLY | A)
os.write(w, b"abcdefgh")
m = mmap.mmap(w, 8)
m[7:8] = b"H"
os.write(ap, b"++")
m.flush(); m.close()
print("both", content("both"))
os.close(w); os.close(ap)
if behind:
    # The file grows behind the kernel's back; the next append goes after that growth.
    p = os.path.join(d, "grown")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | A, 0o644)
    os.write(fd, b"0123456789")
    os.fsync(fd)
    with open(os.path.join(behind, "grown"), "ab") as f:
        f.write(b"ABCDE")
    os.write(fd, b"x")
    os.close(fd)
    print("grown", content("grown"))
"#;

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
