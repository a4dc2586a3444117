//! Which paths the volume tracks (`coherent::tracking`), on real directories.

use coherent::tracking::{Tracking, Untracked, DEFAULT_RECHECK};
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

/// Writes `files` (path, contents) under a fresh temp dir.
fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (p, text) in files {
        write(d.path(), p, text);
    }
    d
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// A tracker that never re-stats by itself, so only `invalidate` can make it see a change.
fn no_recheck(root: &Path, track_ignored: bool) -> Tracking {
    Tracking::open(root, track_ignored)
        .unwrap()
        .with_recheck(Duration::from_secs(3600))
}

fn assert_tracked(t: &Tracking, paths: &[(&str, bool)], want: bool) {
    for (p, is_dir) in paths {
        assert_eq!(
            t.is_tracked(p, *is_dir),
            want,
            "{p} (dir: {is_dir}) should be {}tracked; why: {:?}",
            if want { "" } else { "un" },
            t.why_untracked(p, *is_dir)
        );
    }
}

#[test]
fn nested_gitignores_and_negation() {
    let d = tree(&[
        (
            ".gitignore",
            "target/\n*.log\n# a comment\n*.tmp\n!important.tmp\n",
        ),
        ("sub/.gitignore", "!keep.log\n/local\nbuild/\n"),
        ("sub/deeper/.gitignore", "*.rs\n!main.rs\n"),
    ]);
    let t = no_recheck(d.path(), false);
    assert_tracked(
        &t,
        &[
            ("src/lib.rs", false),
            ("README.md", false),
            ("important.tmp", false),
            ("a/b/important.tmp", false),
            // the deepest .gitignore with a match decides
            ("sub/keep.log", false),
            // `/local` is anchored to sub/
            ("sub/x/local", false),
            ("local", false),
            // `build/` matches directories only
            ("sub/build", false),
            ("sub/deeper/main.rs", false),
            ("sub/deeper/e/main.rs", false),
            (".gitignore", false),
            ("sub", true),
        ],
        true,
    );
    assert_tracked(
        &t,
        &[
            ("target", true),
            ("target/debug/deps/libfoo.rlib", false),
            ("a/target", true),
            ("a/b/c/d/e.log", false),
            ("x.tmp", false),
            ("sub/other.log", false),
            ("sub/local", false),
            ("sub/local", true),
            ("sub/build", true),
            ("sub/x/build/out.o", false),
            ("sub/deeper/lib.rs", false),
            ("sub/deeper/e/f/lib.rs", false),
        ],
        false,
    );
}

#[test]
fn nothing_inside_an_ignored_directory_is_re_included_by_a_gitignore() {
    // git: "It is not possible to re-include a file if a parent directory is excluded."
    let d = tree(&[
        (".gitignore", "out/\n!out/keep.txt\n"),
        ("out/.gitignore", "!*\n"),
    ]);
    let t = no_recheck(d.path(), false);
    assert!(!t.is_tracked("out/keep.txt", false));
    assert!(!t.is_tracked("out/a/b.txt", false));
}

#[test]
fn git_directories_at_any_depth_are_untracked() {
    let d = tree(&[("a/b/.git/config", ""), (".git/HEAD", "")]);
    let t = no_recheck(d.path(), false);
    assert_tracked(
        &t,
        &[
            (".git", true),
            (".git/HEAD", false),
            (".git/objects/ab/cdef", false),
            ("a/b/.git", true),
            ("a/b/.git/config", false),
            ("x/y/z/.git/refs/heads/main", false),
            // a worktree's `.git` is a file
            ("wt/.git", false),
        ],
        false,
    );
    assert_tracked(
        &t,
        &[
            (".github/workflows/ci.yml", false),
            ("x.git", false),
            ("a/.gitx/y", false),
        ],
        true,
    );
    assert_eq!(
        t.why_untracked("a/b/.git/objects/x", false),
        Some(Untracked::GitDir {
            git_dir: "a/b/.git".into()
        })
    );
}

#[test]
fn coherentignore_adds_patterns_and_re_includes() {
    let d = tree(&[
        (".gitignore", "target/\n*.log\n"),
        (
            ".coherentignore",
            "secrets/\n*.bak\n!/target/\n!important.log\n",
        ),
        ("sub/.coherentignore", "*.md\n"),
    ]);
    let t = no_recheck(d.path(), false);
    assert_tracked(
        &t,
        &[
            ("target", true),
            ("target/debug/app", false),
            ("important.log", false),
            ("a/important.log", false),
            // only the root's .coherentignore counts
            ("sub/notes.md", false),
        ],
        true,
    );
    assert_tracked(
        &t,
        &[
            ("secrets", true),
            ("secrets/key.pem", false),
            ("a/b/c.bak", false),
            ("other.log", false),
        ],
        false,
    );
}

#[test]
fn track_ignored_drops_gitignore_but_keeps_git_and_coherentignore() {
    let d = tree(&[
        (".gitignore", "target/\n*.log\n"),
        ("a/.gitignore", "*\n"),
        (".coherentignore", "node_modules/\n"),
    ]);
    let t = no_recheck(d.path(), true);
    assert_tracked(
        &t,
        &[("target/x", false), ("x.log", false), ("a/anything", false)],
        true,
    );
    assert_tracked(
        &t,
        &[
            (".git/HEAD", false),
            ("web/node_modules/react/index.js", false),
        ],
        false,
    );
    // and the same workspace without the flag
    let t = no_recheck(d.path(), false);
    assert_tracked(
        &t,
        &[("target/x", false), ("x.log", false), ("a/anything", false)],
        false,
    );
}

#[test]
fn why_names_the_file_the_pattern_and_the_remedy() {
    let d = tree(&[
        (".gitignore", "target/\n"),
        ("web/.gitignore", "*.cache\n"),
        (".coherentignore", "*.bak\n"),
    ]);
    let t = no_recheck(d.path(), false);
    assert_eq!(t.why_untracked("src/main.rs", false), None);

    let why = t.why_untracked("target/debug/app", false).unwrap();
    assert_eq!(
        why,
        Untracked::Ignored {
            path: "target".into(),
            is_dir: true,
            file: ".gitignore".into(),
            pattern: "target/".into()
        }
    );
    let msg = why.to_string();
    assert!(
        msg.contains("`!/target/`") && msg.contains("--track-ignored"),
        "{msg}"
    );
    assert!(msg.contains(".coherentignore"), "{msg}");

    let why = t.why_untracked("web/a/b.cache", false).unwrap();
    assert_eq!(
        why,
        Untracked::Ignored {
            path: "web/a/b.cache".into(),
            is_dir: false,
            file: "web/.gitignore".into(),
            pattern: "*.cache".into()
        }
    );

    let why = t.why_untracked("x/y.bak", false).unwrap();
    assert!(why.by_coherentignore());
    let msg = why.to_string();
    assert!(
        msg.contains("`*.bak`") && !msg.contains("--track-ignored"),
        "{msg}"
    );

    // The remedy the message gives works.
    let why = t.why_untracked("target/debug/app", false).unwrap();
    write(
        d.path(),
        ".coherentignore",
        &format!("*.bak\n{}\n", why.reinclude_pattern().unwrap()),
    );
    t.invalidate(".coherentignore");
    assert!(t.is_tracked("target/debug/app", false));
}

#[test]
fn invalidate_applies_a_change_made_through_the_mount_at_once() {
    let d = tree(&[(".gitignore", "*.log\n"), ("sub/x.txt", "")]);
    let t = no_recheck(d.path(), false);
    assert!(!t.is_tracked("sub/a.log", false));
    assert!(t.is_tracked("sub/a.o", false));

    // Without invalidate the cached answer stands (the recheck is an hour away)...
    write(d.path(), ".gitignore", "*.o\n");
    assert!(!t.is_tracked("sub/a.log", false));
    // ...and with it the new text applies.
    t.invalidate(".gitignore");
    assert!(t.is_tracked("sub/a.log", false));
    assert!(!t.is_tracked("sub/a.o", false));

    // A new nested .gitignore in a directory already cached.
    write(d.path(), "sub/.gitignore", "*.txt\n");
    t.invalidate("sub/.gitignore");
    assert!(!t.is_tracked("sub/x.txt", false));
    assert!(!t.is_tracked("sub/deep/er/x.txt", false));
    assert!(t.is_tracked("x.txt", false));

    // Removed again.
    fs::remove_file(d.path().join("sub/.gitignore")).unwrap();
    t.invalidate("/sub/.gitignore");
    assert!(t.is_tracked("sub/deep/er/x.txt", false));

    // .coherentignore created.
    write(d.path(), ".coherentignore", "sub/\n");
    t.invalidate(".coherentignore");
    assert!(!t.is_tracked("sub/x.txt", false));

    // A directory renamed: its old and new names are invalidated.
    write(d.path(), "a/.gitignore", "*.md\n");
    let t = no_recheck(d.path(), false);
    assert!(!t.is_tracked("a/r.md", false));
    assert!(t.is_tracked("b/r.md", false));
    fs::rename(d.path().join("a"), d.path().join("b")).unwrap();
    t.invalidate("a");
    t.invalidate("b");
    assert!(t.is_tracked("a/r.md", false));
    assert!(!t.is_tracked("b/r.md", false));
}

#[test]
fn a_change_behind_the_back_applies_within_the_recheck_bound() {
    let d = tree(&[(".gitignore", "*.log\n"), ("a/b/c/.gitignore", "")]);
    // recheck zero: every call re-stats, so the change applies at once
    let t = Tracking::open(d.path(), false)
        .unwrap()
        .with_recheck(Duration::ZERO);
    assert!(!t.is_tracked("a/b/c/d/x.log", false));
    write(d.path(), "a/b/c/.gitignore", "!x.log\n");
    assert!(t.is_tracked("a/b/c/d/x.log", false));
    write(d.path(), ".coherentignore", "a/\n");
    assert!(!t.is_tracked("a/b/c/d/x.log", false));

    // the default bound: seen within DEFAULT_RECHECK (plus the coarse clock's tick)
    let t = Tracking::open(d.path(), false).unwrap();
    assert!(!t.is_tracked("a/b/c/d/x.log", false));
    assert!(!t.is_tracked("q.log", false));
    fs::remove_file(d.path().join(".coherentignore")).unwrap();
    // a new .gitignore in a directory cached without one
    write(d.path(), "a/b/c/d/.gitignore", "*.txt\n");
    assert!(
        !t.is_tracked("a/b/c/d/x.log", false),
        "cached: not seen yet"
    );
    let start = Instant::now();
    while !t.is_tracked("a/b/c/d/x.log", false) || t.is_tracked("a/b/c/d/y.txt", false) {
        assert!(
            start.elapsed() < DEFAULT_RECHECK + Duration::from_millis(500),
            "change behind the back not seen within the bound"
        );
        std::thread::yield_now();
    }
}

#[test]
fn symlinked_and_odd_ignore_files_are_not_followed() {
    let d = tree(&[("elsewhere/rules", "*\n")]);
    std::os::unix::fs::symlink("elsewhere/rules", d.path().join(".gitignore")).unwrap();
    fs::create_dir(d.path().join("dir")).unwrap();
    // A FIFO named .gitignore must not block the caller.
    nix::unistd::mkfifo(
        &d.path().join("dir/.gitignore"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let t = no_recheck(d.path(), false);
    assert!(t.is_tracked("src/a.rs", false));
    assert!(t.is_tracked("dir/a.rs", false));
}

#[test]
fn concurrent_lookups_and_invalidations_agree() {
    let d = tree(&[(".gitignore", "*.log\n")]);
    let t = no_recheck(d.path(), false);
    std::thread::scope(|s| {
        for i in 0..4 {
            let t = &t;
            s.spawn(move || {
                for j in 0..2000 {
                    let p = format!("d{i}/e{}/f.log", j % 50);
                    assert!(!t.is_tracked(&p, false));
                    assert!(t.is_tracked(&format!("d{i}/e{}/f.rs", j % 50), false));
                }
            });
        }
        s.spawn(|| {
            for _ in 0..200 {
                t.invalidate(".gitignore");
                t.invalidate("d1");
            }
        });
    });
}
