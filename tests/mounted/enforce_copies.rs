//! Copies into, within and out of a mount (docs/design.md#control-surface: the computed
//! `user.coherent.*` xattrs are readable by name, not listed): `cp -a`, `shutil.copy2`,
//! `shutil.copytree`, `tar --xattrs` and `rsync -X` finish without an error, keep the files' own
//! xattrs, and no copy carries a `user.coherent.*` attribute.

use crate::coherent;

use coherent::*;
use std::path::Path;

/// A mount holding `src/a.txt` and `src/sub/b.txt` (versions 1 and 2, each with the
/// xattr `user.note`), and an outside directory holding `ext/c.txt` (with `user.note`).
fn setup() -> (Vol, tempfile::TempDir) {
    let m = mount(true);
    sh_ok(
        &m,
        Some("alice"),
        "mkdir -p src/sub && echo a > src/a.txt && echo b > src/sub/b.txt \
         && echo b2 >> src/sub/b.txt && setfattr -n user.note -v mine src/a.txt \
         && setfattr -n user.note -v mine src/sub/b.txt",
    );
    assert_eq!(await_committed_version(&m, "src/sub/b.txt", 2), Some(2));
    // The computed names are there, readable by name.
    assert_eq!(
        xattr(&m, Some("alice"), "src/a.txt", "user.coherent.version").as_deref(),
        Some("1")
    );
    let out = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(out.path().join("ext")).unwrap();
    std::fs::write(out.path().join("ext/c.txt"), "c\n").unwrap();
    let r = std::process::Command::new("setfattr")
        .args(["-n", "user.note", "-v", "mine"])
        .arg(out.path().join("ext/c.txt"))
        .status()
        .unwrap();
    assert!(r.success());
    (m, out)
}

/// Every `user.*` xattr name under `dir` (recursively, as `getfattr -R` prints it).
fn xattr_dump(dir: &Path) -> String {
    let o = std::process::Command::new("getfattr")
        .args(["-R", "-d", "-m", "-", "--absolute-names"])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The copy at `dir` (outside or in the backing directory) has the files' own xattrs and
/// no computed one.
fn check_copy(dir: &Path, files: usize) {
    let dump = xattr_dump(dir);
    assert!(
        !dump.contains("user.coherent."),
        "a copy carries a computed xattr:\n{dump}"
    );
    assert_eq!(
        dump.matches("user.note=\"mine\"").count(),
        files,
        "the files' own xattrs were not copied:\n{dump}"
    );
}

/// Runs `cmd` as alice in the mount root; it must exit 0 and print nothing on stderr.
fn clean(m: &Vol, cmd: &str) {
    let r = sh(m, Some("alice"), cmd);
    assert!(r.ok() && r.err.trim().is_empty(), "`{cmd}`: {}", r.show());
}

#[test]
fn cp_a_copies_in_within_and_out() {
    let (m, out) = setup();
    let o = out.path().display();
    clean(&m, "cp -a src within");
    check_copy(&m.backing_path("within"), 2);
    clean(&m, &format!("cp -a src {o}/cp-out"));
    check_copy(&out.path().join("cp-out"), 2);
    clean(&m, &format!("cp -a {o}/ext cp-in"));
    check_copy(&m.backing_path("cp-in"), 1);
    // The copies inside are new files of the volume, at version 1.
    assert_eq!(version(&m, "within/sub/b.txt"), Some(1));
}

#[test]
fn python_copy2_and_copytree_copy_in_within_and_out() {
    let (m, out) = setup();
    let o = out.path().display();
    let py = format!(
        "import shutil\n\
         shutil.copy2('src/a.txt', 'copy2.txt')\n\
         shutil.copy2('src/a.txt', '{o}/copy2-out.txt')\n\
         shutil.copytree('src', 'tree')\n\
         shutil.copytree('src', '{o}/tree-out')\n\
         shutil.copytree('{o}/ext', 'tree-in')\n"
    );
    let mut c = python();
    c.arg("-c").arg(&py);
    let r = run_in(m.root(), &[("COHERENT_SESSION", "alice")], &mut c);
    assert!(r.ok() && r.err.trim().is_empty(), "{}", r.show());
    let b = m.backing_path("");
    for (dir, n) in [
        (b.join("tree"), 2),
        (out.path().join("tree-out"), 2),
        (b.join("tree-in"), 1),
    ] {
        check_copy(&dir, n);
    }
    for f in [b.join("copy2.txt"), out.path().join("copy2-out.txt")] {
        check_copy(&f, 1);
    }
}

#[test]
fn tar_xattrs_copies_out_and_in() {
    let (m, out) = setup();
    let o = out.path().display();
    clean(
        &m,
        &format!("tar --xattrs --xattrs-include='*' -cf {o}/src.tar src"),
    );
    std::fs::create_dir(out.path().join("untar")).unwrap();
    clean(
        &m,
        &format!("tar --xattrs --xattrs-include='*' -xf {o}/src.tar -C {o}/untar"),
    );
    check_copy(&out.path().join("untar/src"), 2);
    // ...and back into the volume, under another name.
    clean(
        &m,
        &format!("mkdir back && tar --xattrs --xattrs-include='*' -xf {o}/src.tar -C back"),
    );
    check_copy(&m.backing_path("back/src"), 2);
}

#[test]
fn rsync_x_copies_in_within_and_out() {
    let (m, out) = setup();
    let o = out.path().display();
    clean(&m, "rsync -aX src/ rs-within/");
    check_copy(&m.backing_path("rs-within"), 2);
    clean(&m, &format!("rsync -aX src/ {o}/rs-out/"));
    check_copy(&out.path().join("rs-out"), 2);
    clean(&m, &format!("rsync -aX {o}/ext/ rs-in/"));
    check_copy(&m.backing_path("rs-in"), 1);
}
