//! Identity (docs/design.md#identity): `st_ino` and `d_ino` are the backing file's and stay
//! so while the kernel forgets inodes (`drop_caches`, which evicts every unused dentry and
//! inode of the host: harmless to others, and the FUSE forgets are real), across a
//! remount, and through the tools that compare them (tar, rsync -H, git's index).

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{run_timeout, Mount, Remount};

/// Make the kernel forget every unused inode of the mount (FUSE_FORGET for each).
fn forget_all() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop caches (needs root)");
}

/// Forget inodes over and over while `f` runs.
fn forgetting<T>(f: impl FnOnce() -> T) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let t = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            // No sync: dentries and inodes need none, and it would slow the loop down.
            std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop caches");
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let r = f();
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    r
}

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .ino()
}

/// Every name's `d_ino` in `dir` (a plain `getdents`, what `readdir(3)` gives).
fn d_inos(dir: &Path) -> BTreeMap<String, u64> {
    let out = Command::new("python3")
        .arg("-c")
        .arg("import os,sys\nfor e in os.scandir(sys.argv[1]): print(e.name, e.inode())")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (n, i) = l.rsplit_once(' ').unwrap();
            (n.to_owned(), i.parse().unwrap())
        })
        .collect()
}

const NAMES: [&str; 6] = ["", "a", "a/b", "a/b/c", "a/f", "a/g"];

fn tree(m: &Mount) {
    m.sh_ok("mkdir -p a/b/c && echo x > a/f && ln a/f a/g && ln -s f a/l");
}

#[test]
fn st_ino_is_the_backing_files_and_survives_forgets() {
    let m = Mount::new(true);
    tree(&m);
    let before: Vec<u64> = NAMES.iter().map(|n| ino(&m.path(n))).collect();
    let backing: Vec<u64> = NAMES.iter().map(|n| ino(&m.backing_path(n))).collect();
    assert_eq!(before, backing, "st_ino of {NAMES:?}: the backing files'");
    assert_eq!(before[4], before[5], "both names of a hard link");
    forget_all();
    let after: Vec<u64> = NAMES.iter().map(|n| ino(&m.path(n))).collect();
    assert_eq!(after, before, "st_ino after the kernel forgot the inodes");
    // Through the other name first this time.
    forget_all();
    assert_eq!(ino(&m.path("a/g")), before[5]);
    assert_eq!(ino(&m.path("a/f")), before[4]);
}

#[test]
fn d_ino_is_st_ino() {
    let m = Mount::new(false);
    tree(&m);
    for dir in ["", "a"] {
        forget_all();
        let listed = d_inos(&m.path(dir));
        assert!(!listed.is_empty());
        for (name, d) in &listed {
            let p = m.path(dir).join(name);
            assert_eq!(*d, ino(&p), "d_ino of {} vs its st_ino", p.display());
            assert_eq!(
                *d,
                ino(&m.backing_path(dir).join(name)),
                "and the backing's"
            );
        }
        // The order the other way round: stat first, forget, then list.
        let stated: BTreeMap<String, u64> = listed
            .keys()
            .map(|n| (n.clone(), ino(&m.path(dir).join(n))))
            .collect();
        forget_all();
        assert_eq!(d_inos(&m.path(dir)), stated);
    }
}

#[test]
fn st_ino_is_the_same_after_a_remount() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Remount::start(dir.path(), &[]);
    Command::new("sh")
        .arg("-c")
        .arg("mkdir -p a/b/c && echo x > a/f && ln a/f a/g")
        .current_dir(&r.mnt)
        .status()
        .unwrap();
    let before: Vec<u64> = NAMES.iter().map(|n| ino(&r.mnt.join(n))).collect();
    r.stop_with(libc::SIGTERM);
    drop(r);
    let r = Remount::start(dir.path(), &[]);
    // Looked up in the other order: a number handed out in lookup order would differ.
    let mut after: Vec<u64> = NAMES.iter().rev().map(|n| ino(&r.mnt.join(n))).collect();
    after.reverse();
    assert_eq!(after, before, "st_ino of {NAMES:?} across a remount");
}

/// `dirs` directories of `per` files each, every other file with a second hard link.
fn make_tree(root: &Path, dirs: usize, per: usize) {
    for d in 0..dirs {
        let dir = root.join(format!("d{:03}/sub", d));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..per {
            let p = dir.join(format!("f{f}"));
            std::fs::write(&p, format!("{d}/{f}\n")).unwrap();
            if f % 2 == 0 {
                std::fs::hard_link(&p, dir.join(format!("h{f}"))).unwrap();
            }
        }
    }
}

fn run(cmd: &mut Command) -> (bool, String) {
    let o = run_timeout(cmd, Duration::from_secs(300));
    let mut text = String::from_utf8_lossy(&o.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&o.stdout));
    (o.status.success(), text)
}

#[test]
fn tar_extracts_a_large_tree_with_no_warning_while_inodes_are_forgotten() {
    let m = Mount::new(true);
    let src = tempfile::tempdir().unwrap();
    make_tree(src.path(), 200, 16); // 3200 files and 1600 hard links in 400 directories
    let archive = src.path().join("t.tar");
    let (ok, out) = run(Command::new("tar")
        .args(["-cf"])
        .arg(&archive)
        .arg("-C")
        .arg(src.path())
        .args(["--exclude=t.tar", "."]));
    assert!(ok, "{out}");
    for round in 0..2 {
        let dest = m.path(format!("x{round}"));
        std::fs::create_dir(&dest).unwrap();
        let (ok, out) = forgetting(|| {
            run(Command::new("tar")
                .arg("-xf")
                .arg(&archive)
                .arg("-C")
                .arg(&dest))
        });
        assert!(ok && out.is_empty(), "tar -x round {round}: {out}");
        // tar -c stores a second name of a file as a link to the first, known by its
        // (st_dev, st_ino).
        let again = src.path().join(format!("again{round}.tar"));
        let (ok, out) = forgetting(|| {
            run(Command::new("tar")
                .arg("-cf")
                .arg(&again)
                .arg("-C")
                .arg(&dest)
                .arg("."))
        });
        assert!(ok && out.is_empty(), "tar -c round {round}: {out}");
        let (ok, list) = run(Command::new("tar").arg("-tvf").arg(&again));
        assert!(ok, "{list}");
        let links = list.lines().filter(|l| l.contains(" link to ")).count();
        assert_eq!(links, 1600, "hard links tar -c found, round {round}");
    }
}

#[test]
fn rsync_keeps_hard_links_while_inodes_are_forgotten() {
    let m = Mount::new(true);
    make_tree(&m.path("src"), 100, 20);
    let dest = tempfile::tempdir().unwrap();
    let (ok, out) = forgetting(|| {
        run(Command::new("rsync")
            .arg("-aH")
            .arg(format!("{}/", m.path("src").display()))
            .arg(dest.path()))
    });
    assert!(ok, "rsync: {out}");
    for d in 0..100 {
        let dir = dest.path().join(format!("d{d:03}/sub"));
        for f in (0..20).step_by(2) {
            assert_eq!(
                ino(&dir.join(format!("f{f}"))),
                ino(&dir.join(format!("h{f}"))),
                "{}/f{f} and h{f}: one file after rsync -H",
                dir.display()
            );
        }
    }
}

#[test]
fn git_status_after_forgets_finds_the_index_up_to_date() {
    let m = Mount::new(true);
    let git = |args: &str| {
        m.sh_ok(&format!(
            "git -c user.name=t -c user.email=t@t -c core.fsmonitor=false {args}"
        ))
    };
    m.sh_ok("git init -q . && mkdir -p src && for i in $(seq 1 200); do echo $i > src/f$i; done");
    git("add -A");
    git("commit -qm init");
    git("status --porcelain");
    let index = git("ls-files --debug");
    forget_all();
    // trace2's perf stream counts the files whose stat no longer matches the index, which
    // git therefore reads again to compare (`refresh/sum_scan`).
    let o = m.sh_env(
        &[("GIT_TRACE2_PERF", "1")],
        "git -c core.fsmonitor=false status --porcelain 2>&1 >/dev/null",
    );
    let trace = String::from_utf8_lossy(&o.stdout);
    let again = git("ls-files --debug");
    assert_eq!(
        again, index,
        "the index's stat data, ino included, after forgets"
    );
    // Every entry's recorded inode is what stat says now.
    for i in [1, 100, 200] {
        let want = ino(&m.path(format!("src/f{i}")));
        let entry = again
            .split(&format!("src/f{i}\n"))
            .nth(1)
            .and_then(|s| s.lines().find_map(|l| l.trim().strip_prefix("dev: ")))
            .unwrap_or_else(|| panic!("no entry for src/f{i} in {again}"));
        let recorded: u64 = entry.split("ino: ").nth(1).unwrap().trim().parse().unwrap();
        assert_eq!(recorded, want & 0xffff_ffff, "src/f{i}");
    }
    let scans: Vec<&str> = trace
        .lines()
        .filter_map(|l| l.split("refresh/sum_scan:").nth(1))
        .collect();
    assert_eq!(scans, ["0"], "files git read again after forgets: {trace}");
}

/// Export handles are declined up front (`EOPNOTSUPP`), as libfuse's passthrough_hp does:
/// a handle of a node id could not be opened again once the kernel forgot the node
/// (ESTALE, xfstests 426, 467, 477, 756, 777).
#[test]
fn name_to_handle_at_is_declined() {
    let m = Mount::new(true);
    std::fs::write(m.path("f"), b"x").unwrap();
    let p = std::ffi::CString::new(m.path("f").into_os_string().into_encoded_bytes()).unwrap();
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        f: [u8; 128],
    }
    let mut h = Handle {
        bytes: 128,
        kind: 0,
        f: [0; 128],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `h` has room for the 128 bytes it declares; the path is NUL-terminated.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            p.as_ptr(),
            &mut h as *mut Handle,
            &mut mount_id as *mut libc::c_int,
            0,
        )
    };
    let e = std::io::Error::last_os_error().raw_os_error();
    assert_eq!((r, e), (-1, Some(libc::EOPNOTSUPP)));
}
