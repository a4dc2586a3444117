//! git's fsmonitor on the volume (docs/git.md), with a real mount and real git:
//! `git status` with `coherent fsmonitor` as core.fsmonitor (and the untracked cache)
//! must say what plain `git status` says, after every step of a seeded random sequence of
//! changes made through the mount; and the hook answers "everything may have changed"
//! (`/`) whenever it cannot vouch: after a restart, over a separate backing directory,
//! with a process inside the directory at mount time, for a token not of ours, outside a
//! volume.
//!
//! `FSMONITOR_SEED=N` replays one seed; `FSMONITOR_STEPS=N` sets the number of steps.

use crate::common;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::rng::Rng;
use common::{spawn_mounted, Mount, BIN};

use crate::common::CLI as COHERENT;

fn git(dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()
        .expect("run git")
}

fn git_ok(dir: &Path, args: &[&str]) -> String {
    let o = git(dir, args);
    assert!(
        o.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `coherent ARGS` in `dir`.
fn coherent(dir: &Path, args: &[&str]) -> Output {
    Command::new(COHERENT)
        .current_dir(dir)
        .args(args)
        .env("HOME", dir)
        .output()
        .expect("run coherent")
}

/// The hook's answer in `dir` to `TOKEN`: (token, paths); paths is `["/"]` for
/// "everything may have changed".
fn hook(dir: &Path, token: &str) -> (String, Vec<String>) {
    let o = coherent(dir, &["fsmonitor", "2", token]);
    assert!(o.status.success(), "hook failed: {o:?}");
    let mut parts = o.stdout.split(|&b| b == 0);
    let tok = String::from_utf8(parts.next().unwrap().to_vec()).unwrap();
    let paths = parts
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8(p.to_vec()).unwrap())
        .collect();
    (tok, paths)
}

fn everything() -> Vec<String> {
    vec!["/".to_string()]
}

/// A git repository at the root of `dir` with one commit, the hook installed.
fn repo(dir: &Path) {
    git_ok(dir, &["init", "-q", "-b", "main", "."]);
    std::fs::write(dir.join("README"), "seed\n").unwrap();
    std::fs::write(dir.join(".gitignore"), "*.log\n").unwrap();
    git_ok(dir, &["add", "-A"]);
    git_ok(dir, &["commit", "-qm", "seed"]);
    let o = coherent(dir, &["install", "git"]);
    assert!(o.status.success(), "install git: {o:?}");
}

/// `git status` with the hook (it may write the index and its token), and git's trace
/// said whether the hook's answer was "everything" (trivial).
fn status_hooked(dir: &Path, trace: &Path, untracked: &str) -> (String, bool) {
    let _ = std::fs::remove_file(trace);
    let o = Command::new("git")
        .current_dir(dir)
        .args(["status", "--porcelain", untracked])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .env("GIT_TRACE2_EVENT", trace)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let t = std::fs::read_to_string(trace).unwrap_or_default();
    (
        String::from_utf8(o.stdout).unwrap(),
        t.contains("query/trivial-response"),
    )
}

/// Plain `git status`: no hook, no untracked cache, and the index left alone.
fn status_plain(dir: &Path, untracked: &str) -> String {
    git_ok(
        dir,
        &[
            "--no-optional-locks",
            "-c",
            "core.fsmonitor=",
            "-c",
            "core.untrackedCache=false",
            "status",
            "--porcelain",
            untracked,
        ],
    )
}

/// Files and directories under `root` (relative, not `.git`, not `.coherent`).
fn walk(root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut files, mut dirs) = (Vec::new(), vec![PathBuf::new()]);
    let mut i = 0;
    while i < dirs.len() {
        let d = dirs[i].clone();
        i += 1;
        let mut names: Vec<_> = std::fs::read_dir(root.join(&d))
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let rel = d.join(e.file_name());
            if rel == Path::new(".git") {
                continue;
            }
            let t = e.file_type().unwrap();
            if t.is_dir() {
                dirs.push(rel);
            } else {
                files.push(rel);
            }
        }
    }
    (files, dirs)
}

/// One random change through the mount at `root`; returns what it did.
fn step(r: &mut Rng, root: &Path, held: &mut Option<(PathBuf, std::fs::File)>, n: usize) -> String {
    let (files, dirs) = walk(root);
    let regular: Vec<PathBuf> = files
        .iter()
        .filter(|f| root.join(f).symlink_metadata().unwrap().is_file())
        .cloned()
        .collect();
    let dir = r.choose(&dirs).cloned().unwrap_or_default();
    let fresh = |ext: &str| dir.join(format!("n{n}{ext}"));
    match r.below(13) {
        0 | 1 => {
            let p = fresh(if r.below(4) == 0 { ".log" } else { ".txt" });
            std::fs::write(root.join(&p), format!("{n}\n")).unwrap();
            format!("create {}", p.display())
        }
        2 | 3 => {
            let Some(f) = r.choose(&regular) else {
                return "nothing".into();
            };
            let mut h = OpenOptions::new().append(true).open(root.join(f)).unwrap();
            writeln!(h, "more {n}").unwrap();
            format!("append {}", f.display())
        }
        4 | 5 => {
            let Some(f) = r.choose(&files).cloned() else {
                return "nothing".into();
            };
            // Onto a new name, or over an existing file.
            let to = match r.below(3) {
                0 => r.choose(&regular).cloned().unwrap_or_else(|| fresh(".txt")),
                _ => fresh(".txt"),
            };
            if f == to {
                return "nothing".into();
            }
            std::fs::rename(root.join(&f), root.join(&to)).unwrap();
            format!("rename {} {}", f.display(), to.display())
        }
        6 => {
            let Some(f) = r.choose(&files) else {
                return "nothing".into();
            };
            std::fs::remove_file(root.join(f)).unwrap();
            format!("delete {}", f.display())
        }
        7 => {
            // Some directories git ignores (`*.log`), as build directories are.
            let p = fresh(if r.below(3) == 0 { "d.log" } else { "d" });
            std::fs::create_dir(root.join(&p)).unwrap();
            // A directory git shows needs something in it.
            if r.below(2) == 0 {
                std::fs::write(root.join(&p).join("f"), "in a new dir\n").unwrap();
            }
            format!("mkdir {}", p.display())
        }
        8 => {
            let Some(f) = r.choose(&regular) else {
                return "nothing".into();
            };
            let p = root.join(f);
            let mode = p.metadata().unwrap().permissions().mode() ^ 0o111;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            format!("chmod {}", f.display())
        }
        9 => {
            let p = fresh(".lnk");
            let target = r
                .choose(&files)
                .cloned()
                .unwrap_or_else(|| "nowhere".into());
            std::os::unix::fs::symlink(&target, root.join(&p)).unwrap();
            format!("symlink {} -> {}", p.display(), target.display())
        }
        10 => {
            // A file kept open for writing across statuses: with passthrough its writes
            // never reach the daemon.
            match held {
                Some((p, h)) if r.below(3) > 0 => {
                    writeln!(h, "held {n}").unwrap();
                    format!("write held {}", p.display())
                }
                _ => {
                    let Some(f) = r.choose(&regular).cloned() else {
                        return "nothing".into();
                    };
                    let h = OpenOptions::new().append(true).open(root.join(&f)).unwrap();
                    *held = Some((f.clone(), h));
                    format!("hold {}", f.display())
                }
            }
        }
        11 => {
            let empty: Vec<&PathBuf> = dirs
                .iter()
                .filter(|d| !d.as_os_str().is_empty())
                .filter(|d| std::fs::read_dir(root.join(d)).unwrap().next().is_none())
                .collect();
            if let Some(d) = r.choose(&empty) {
                std::fs::remove_dir(root.join(d)).unwrap();
                return format!("rmdir {}", d.display());
            }
            let sub: Vec<&PathBuf> = dirs.iter().filter(|d| !d.as_os_str().is_empty()).collect();
            let Some(d) = r.choose(&sub).cloned() else {
                return "nothing".into();
            };
            // An ignored directory renamed to an ignored name (rustc's incremental
            // sessions), or any directory to a name git sees.
            let ignored = d.extension().is_some_and(|e| e == "log");
            let to = match ignored && r.below(3) > 0 {
                true => d.with_file_name(format!("r{n}.log")),
                false => PathBuf::from(format!("moved{n}")),
            };
            std::fs::rename(root.join(d), root.join(&to)).unwrap();
            format!("rename dir {} {}", d.display(), to.display())
        }
        _ => {
            git_ok(root, &["add", "-A"]);
            git_ok(
                root,
                &["commit", "-qm", &format!("step {n}"), "--allow-empty"],
            );
            "commit -A".into()
        }
    }
}

/// Every untracked file named (`-uall`), as git's untracked cache keeps them.
#[test]
fn git_status_with_the_hook_matches_plain_git_status() {
    random_changes("--untracked-files=all", 300);
}

/// git's default: an untracked directory shown as one line.
#[test]
fn git_status_with_the_hook_matches_plain_git_status_untracked_dirs_collapsed() {
    random_changes("--untracked-files=normal", 150);
}

fn random_changes(untracked: &str, default_steps: usize) {
    let seed: u64 = std::env::var("FSMONITOR_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let steps: usize = std::env::var("FSMONITOR_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_steps);
    let m = Mount::builder().in_place().start();
    let root = m.mnt.clone();
    repo(&root);
    let trace = m.backing.parent().unwrap().join("trace2.json");
    let mut r = Rng(seed);
    let mut held = None;
    let mut trusted = 0;
    let mut log = Vec::new();
    for n in 0..steps {
        log.push(step(&mut r, &root, &mut held, n));
        let (hooked, trivial) = status_hooked(&root, &trace, untracked);
        let plain = status_plain(&root, untracked);
        assert_eq!(
            hooked,
            plain,
            "seed {seed} (FSMONITOR_SEED={seed}), {untracked}, after step {n}: with the hook \
             (left) and plain (right) differ; steps:\n{}",
            log.join("\n")
        );
        trusted += usize::from(!trivial);
    }
    // The hook's answers were used, not "everything" at each step (a directory renamed
    // answers "everything" once; the first status after install too).
    assert!(
        trusted > steps / 2,
        "seed {seed}: only {trusted} of {steps} statuses used the hook's answer"
    );
    drop(held);
}

#[test]
fn a_restart_answers_everything_and_a_change_made_meanwhile_shows() {
    let dir = tempfile::Builder::new()
        .prefix("coherent-fsmon-")
        .tempdir()
        .unwrap();
    let base = dir.path().canonicalize().unwrap();
    let w = base.join("w");
    std::fs::create_dir(&w).unwrap();
    let state = base.join("state");
    let mount = |log: &str| {
        let mut cmd = Command::new(BIN);
        cmd.arg(&w).arg("--state-dir").arg(&state);
        spawn_mounted(cmd, &w, &base.join(log))
    };
    let mut child = mount("1.log");
    repo(&w);
    let (t1, first) = hook(&w, "1733000000000000000");
    assert_eq!(first, everything(), "git's own first token is not ours");
    std::fs::write(w.join("README"), "changed through the volume\n").unwrap();
    let (t2, paths) = hook(&w, &t1);
    assert_eq!(paths, vec!["README".to_string()]);
    // The same instance with nothing new: the same token back, nothing changed (once the
    // write's RELEASE, which FUSE sends after close returned, has come in).
    let mut t2 = t2;
    assert!(common::wait_until(common::TIMEOUT, || {
        let (t3, paths) = hook(&w, &t2);
        let same = t3 == t2 && paths.is_empty();
        t2 = t3;
        same
    }));

    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    common::wait_child(&mut child, common::TIMEOUT).expect("the daemon exits");
    assert!(common::wait_until(common::TIMEOUT, || {
        common::mount_fstype(&w).is_none()
    }));
    // Behind the volume's back while it is not mounted.
    std::fs::write(w.join("README"), "changed while unmounted\n").unwrap();
    let mut child = mount("2.log");
    // The new instance counts from 0 again: go past the old token's number, so only the
    // instance tells the two apart.
    let seq_of = |t: &str| t.rsplit(':').next().unwrap().parse::<u64>().unwrap();
    let mut n = 0;
    while seq_of(&hook(&w, "x").0) <= seq_of(&t2) {
        std::fs::write(w.join(format!("n{n}.log")), "x").unwrap();
        n += 1;
    }
    let (t4, after) = hook(&w, &t2);
    assert_eq!(
        after,
        everything(),
        "a token of the previous mount instance"
    );
    assert_ne!(t4, t2);
    assert_eq!(git_ok(&w, &["status", "--porcelain"]), " M README\n");
    assert_eq!(hook(&w, &t4).1, Vec::<String>::new());
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    common::wait_child(&mut child, common::TIMEOUT).expect("the daemon exits");
}

#[test]
fn a_separate_backing_directory_answers_everything() {
    let m = Mount::new(true);
    let root = m.mnt.clone();
    repo(&root);
    let (t1, _) = hook(&root, "x");
    assert!(t1.starts_with("c1:") && t1 != "c1:none", "{t1}");
    // Others write the backing directory behind the volume's back.
    std::fs::write(m.backing_path("README"), "behind its back\n").unwrap();
    assert_eq!(hook(&root, &t1).1, everything());
    // Seen through the mount within the cache time of a separate backing (docs/cache.md).
    let len = "behind its back\n".len() as u64;
    assert!(common::wait_until(common::TIMEOUT, || {
        std::fs::metadata(root.join("README")).is_ok_and(|m| m.len() == len)
    }));
    assert_eq!(git_ok(&root, &["status", "--porcelain"]), " M README\n");
}

#[test]
fn a_process_inside_at_mount_time_makes_every_answer_everything_until_it_leaves() {
    let dir = tempfile::Builder::new()
        .prefix("coherent-fsmon-")
        .tempdir()
        .unwrap();
    let w = dir.path().canonicalize().unwrap().join("w");
    std::fs::create_dir(&w).unwrap();
    // A process whose cwd is inside keeps writing the directory underneath the mount.
    let mut inside = Command::new("sleep")
        .arg("60")
        .current_dir(&w)
        .spawn()
        .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg(&w).arg("--state-dir").arg(dir.path().join("state"));
    let mut child = spawn_mounted(cmd, &w, &dir.path().join("d.log"));
    repo(&w);
    let (t1, _) = hook(&w, "x");
    std::fs::write(w.join("README"), "x\n").unwrap();
    let (t2, paths) = hook(&w, &t1);
    assert_eq!(paths, everything());
    assert_eq!(hook(&w, &t2).1, everything(), "it is still inside");
    let _ = inside.kill();
    let _ = inside.wait();
    // Gone: what it may have done meanwhile is not known, what comes next is.
    let (t3, paths) = hook(&w, &t2);
    assert_eq!(paths, everything());
    std::fs::write(w.join("README"), "y\n").unwrap();
    assert_eq!(hook(&w, &t3).1, vec!["README".to_string()]);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    common::wait_child(&mut child, common::TIMEOUT).expect("the daemon exits");
}

#[test]
fn bad_input_answers_everything_or_fails_clearly() {
    let m = Mount::builder().in_place().start();
    let root = m.mnt.clone();
    repo(&root);
    let (tok, _) = hook(&root, "x");
    let inst = tok.split(':').nth(1).unwrap().to_string();
    for bad in [
        "",
        "garbage",
        "c1:none",
        "c1:0123456789abcdef:1",
        &format!("c1:{inst}:notanumber"),
        &format!("c1:{inst}:999999999"),
        &format!("c1:{inst}:18446744073709551615"),
    ] {
        let (t, paths) = hook(&root, bad);
        assert_eq!(paths, everything(), "token {bad:?}");
        assert_eq!(
            t.split(':').nth(1),
            Some(inst.as_str()),
            "a fresh token of this mount"
        );
    }
    // No token at all.
    let o = coherent(&root, &["fsmonitor", "2"]);
    assert!(o.stdout.ends_with(b"\0/\0"), "{o:?}");
    // git's direct form (core.fsmonitor = the binary alone).
    let o = coherent(&root, &["2", &tok]);
    assert!(
        o.status.success() && o.stdout.starts_with(tok.as_bytes()),
        "{o:?}"
    );
    // Protocol versions other than 2: a clear failure, which git takes as "everything".
    for v in ["1", "3"] {
        let o = coherent(&root, &["fsmonitor", v, &tok]);
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(o.stdout.is_empty());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("only 2"),
            "{o:?}"
        );
    }
    // Outside any volume.
    let o = coherent(Path::new("/"), &["fsmonitor", "2", &tok]);
    assert_eq!(o.stdout, b"c1:none\0/\0");
    // The file is reachable by name but not listed.
    let listed: Vec<_> = std::fs::read_dir(root.join(".coherent"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!listed.iter().any(|n| n == "changes"), "{listed:?}");
    assert!(root.join(".coherent/changes").is_file());
}

#[test]
fn install_git_refuses_outside_a_volume_or_a_repository_and_uninstalls() {
    let plain = tempfile::tempdir().unwrap();
    git_ok(plain.path(), &["init", "-q", "."]);
    let o = coherent(plain.path(), &["install", "git"]);
    assert_eq!(o.status.code(), Some(4), "not on a volume: {o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no coherent volume"));

    let m = Mount::builder().in_place().start();
    let root = m.mnt.clone();
    std::fs::create_dir(root.join("notrepo")).unwrap();
    let o = coherent(&root.join("notrepo"), &["install", "git"]);
    assert_eq!(o.status.code(), Some(1), "not a repository: {o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("not in a git repository"));

    repo(&root);
    let fsm = git_ok(&root, &["config", "core.fsmonitor"]);
    // The binary alone: git runs it with no shell.
    let exe = Path::new(COHERENT).canonicalize().unwrap();
    assert_eq!(fsm.trim(), exe.to_str().unwrap());
    assert_eq!(
        git_ok(&root, &["config", "core.untrackedCache"]).trim(),
        "true"
    );
    // Again: nothing changes.
    assert!(coherent(&root, &["install", "git"]).status.success());
    let o = coherent(&root, &["install", "git", "--uninstall"]);
    assert!(o.status.success(), "{o:?}");
    assert!(!git(&root, &["config", "core.fsmonitor"]).status.success());
    assert!(!git(&root, &["config", "core.untrackedCache"])
        .status
        .success());
    // Someone else's hook is left alone.
    git_ok(
        &root,
        &["config", "core.fsmonitor", "/usr/bin/watchman-hook"],
    );
    let o = coherent(&root, &["install", "git"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(coherent(&root, &["install", "git", "--uninstall"])
        .status
        .success());
    assert_eq!(
        git_ok(&root, &["config", "core.fsmonitor"]).trim(),
        "/usr/bin/watchman-hook"
    );
}

#[test]
fn a_repository_below_the_mount_root_gets_its_own_paths() {
    let m = Mount::builder().in_place().start();
    let top = m.mnt.join("projects/one");
    std::fs::create_dir_all(top.join("src")).unwrap();
    repo(&top);
    let trace = m.backing.parent().unwrap().join("trace2.json");
    // The first status after install gets "everything" and stores a token of ours.
    status_hooked(&top, &trace, "--untracked-files=all");
    let (tok, _) = hook(&top, "x");
    std::fs::write(m.mnt.join("outside.txt"), "not this repository's\n").unwrap();
    std::fs::write(top.join("src/new.rs"), "fn main() {}\n").unwrap();
    std::fs::write(top.join("README"), "changed\n").unwrap();
    let (_, mut paths) = hook(&top, &tok);
    paths.sort();
    paths.dedup();
    assert_eq!(paths, vec!["README".to_string(), "src/new.rs".to_string()]);
    // git runs the hook in the worktree's top directory, wherever status is run from.
    let sub = top.join("src");
    let (out, trivial) = status_hooked(&sub, &trace, "--untracked-files=all");
    assert!(!trivial, "the hook's answer was used");
    assert_eq!(out, status_plain(&sub, "--untracked-files=all"));
    assert_eq!(out, " M README\n?? src/new.rs\n");
}

#[test]
fn a_workspace_shared_with_other_hosts_answers_everything() {
    let etcd = common::etcd::Etcd::start(1);
    let m = Mount::builder()
        .in_place()
        .args(["--coordinator", etcd.url()])
        .start();
    let root = m.mnt.clone();
    repo(&root);
    let (t1, first) = hook(&root, "x");
    assert_eq!(first, everything());
    std::fs::write(root.join("README"), "changed\n").unwrap();
    assert_eq!(
        hook(&root, &t1).1,
        everything(),
        "another host may have written it too"
    );
}

/// git's untracked cache trusts what it knew of a directory while the hook does not name
/// it: a directory moved onto a name git has seen before must not show the old contents.
#[test]
fn a_directory_moved_onto_a_known_name_shows_its_own_contents() {
    let m = Mount::builder().in_place().start();
    let root = m.mnt.clone();
    repo(&root);
    let trace = m.backing.parent().unwrap().join("trace2.json");
    for d in ["y/sub", "x/sub"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("y/sub/u"), "only in y\n").unwrap();
    std::fs::write(root.join("x/sub/v"), "only in x\n").unwrap();
    // A tracked file beside them, so git lists (and caches) their contents.
    std::fs::write(root.join("y/t"), "tracked\n").unwrap();
    std::fs::write(root.join("x/t"), "tracked\n").unwrap();
    git_ok(&root, &["add", "y/t", "x/t"]);
    git_ok(&root, &["commit", "-qm", "t"]);
    for _ in 0..3 {
        let (out, _) = status_hooked(&root, &trace, "--untracked-files=all");
        assert_eq!(out, status_plain(&root, "--untracked-files=all"));
    }
    std::fs::rename(root.join("y"), root.join("z")).unwrap();
    std::fs::rename(root.join("x"), root.join("y")).unwrap();
    let (out, _) = status_hooked(&root, &trace, "--untracked-files=all");
    assert_eq!(out, status_plain(&root, "--untracked-files=all"));
    assert_eq!(
        out,
        " D x/t\n?? y/sub/v\n?? z/\n".replace("?? z/\n", "?? z/sub/u\n?? z/t\n")
    );
}

#[test]
fn a_directory_renamed_is_named_only_when_git_ignores_both_names() {
    let m = Mount::builder().in_place().start();
    let root = m.mnt.clone();
    repo(&root);
    for d in ["s-1.log/x", "plain/x"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let (t, _) = hook(&root, "x");
    // As rustc does with its incremental session directory (`*.log` is ignored here).
    std::fs::rename(root.join("s-1.log"), root.join("s-2.log")).unwrap();
    let (t2, mut paths) = hook(&root, &t);
    paths.sort();
    assert_eq!(paths, vec!["s-1.log/".to_string(), "s-2.log/".to_string()]);
    std::fs::rename(root.join("plain"), root.join("moved")).unwrap();
    assert_eq!(hook(&root, &t2).1, everything());
}
