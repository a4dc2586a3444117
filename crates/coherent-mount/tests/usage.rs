//! `coherent-mount` refuses bad arguments with one line that names the problem, and mounts
//! nothing. (A busy mountpoint, which needs a volume mounted first, is tested with the
//! workspace's mount tests.)

use std::path::Path;
use std::process::Command;

fn mounts_at(p: &Path) -> usize {
    coherent::sys::mounts()
        .unwrap()
        .iter()
        .filter(|m| m.mount_point == p)
        .count()
}

fn refused(args: &[&Path], want: &str) {
    let before: Vec<usize> = args.iter().map(|a| mounts_at(a)).collect();
    let o = Command::new(env!("CARGO_BIN_EXE_coherent-mount"))
        .args(args)
        .output()
        .expect("spawn coherent-mount");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("coherent-mount:"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(want),
        "{:?} does not say {want:?}",
        lines[0]
    );
    let after: Vec<usize> = args.iter().map(|a| mounts_at(a)).collect();
    assert_eq!(before, after, "{args:?}: something got mounted");
}

#[test]
fn bad_paths_are_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().canonicalize().unwrap();
    let (b, mnt, file) = (d.join("b"), d.join("m"), d.join("file"));
    std::fs::create_dir(&b).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(&file, b"").unwrap();
    refused(&[&d.join("missing"), &mnt], "does not exist");
    refused(&[&file, &mnt], "is not a directory");
    refused(&[&b, &d.join("nomnt")], "does not exist");
    refused(&[&b, &file], "is not a directory");
    std::fs::create_dir(b.join("inner")).unwrap();
    refused(&[&b, &b.join("inner")], "inside the backing directory");
    refused(&[&b.join("inner"), &b], "inside the mountpoint");
    refused(&[&d.join("missing")], "does not exist");
}
