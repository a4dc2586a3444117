//! Tracked paths in a real mount (docs/design.md#versions, docs/design.md#handoff `not_tracked`):
//! git's own files, what `.gitignore` ignores and what `.coherentignore` matches pass through with
//! no version and no event; `!pattern` re-includes; `--track-ignored` tracks the `.gitignore` part;
//! a change to an ignore file through the mount applies at once; a transfer of an untracked
//! path is refused `not_tracked` with a why that says how to track it.

use crate::coherent;
use crate::common;

use coherent::*;
use common::Mount;
use serde_json::Value;

/// Every logged event whose path (or rename source) is `p` or lies under a directory
/// matching `under`.
fn events_under(m: &Vol, under: impl Fn(&str) -> bool) -> Vec<Value> {
    events(m)
        .into_iter()
        .filter(|e| {
            [&e["path"], &e["from"]]
                .iter()
                .any(|v| v.as_str().is_some_and(&under))
        })
        .collect()
}

fn in_git_dir(p: &str) -> bool {
    p == ".git" || p.starts_with(".git/") || p.contains("/.git/") || p.ends_with("/.git")
}

/// Writes `marker` as `who` and waits for its commit: every event of the calls before it
/// (their RELEASEs included) is in the log by then.
fn settle(m: &Vol, who: &str, marker: &str) {
    sh_ok(m, Some(who), &format!("echo done > {marker}"));
    assert_eq!(
        await_events(m, "commit", marker, Some(who), 1).len(),
        1,
        "no commit of {marker}"
    );
}

#[test]
fn git_in_the_mount_logs_nothing_under_git_and_no_external_change() {
    let m = mount(true);
    let script = r#"
set -e
git init -q -b main .
# The volume's own control directory is not part of the project.
echo .coherent/ >> .git/info/exclude
git config user.email a@example.com
git config user.name alice
for i in $(seq 1 12); do
  echo "line $i" >> notes.md
  echo "$i" > "f$i.txt"
  git add -A
  git commit -q -m "commit $i"
done
git checkout -q -b side
echo side > side.txt
echo "side edit" >> notes.md
git add -A && git commit -q -m side
git checkout -q main
echo "main edit" > f1.txt
git add -A && git commit -q -m "main edit"
git merge -q --no-edit side
git gc -q
git status --porcelain
"#;
    let out = sh_ok(&m, Some("alice"), script);
    assert_eq!(out.trim(), "", "the work tree is not clean after the merge");
    settle(&m, "alice", "marker.txt");
    let git = events_under(&m, in_git_dir);
    assert!(
        git.is_empty(),
        "{} event(s) under .git/, first: {}",
        git.len(),
        git[0]
    );
    let external: Vec<Value> = events(&m)
        .into_iter()
        .filter(|e| e["event"] == "external_change")
        .collect();
    assert!(
        external.is_empty(),
        "{} external_change event(s), first: {}",
        external.len(),
        external[0]
    );
    // The work tree itself is tracked: git's checkout and merge wrote it as alice.
    assert!(!events_of(&m, "commit", "notes.md", Some("alice")).is_empty());
    assert!(!events_of(&m, "commit", "side.txt", Some("alice")).is_empty());
    assert!(version(&m, "notes.md").is_some());
    assert_eq!(version(&m, ".git/HEAD"), None, "a version under .git/");
}

#[test]
fn a_gitignored_build_dir_has_no_versions_and_no_events() {
    let m = mount(true);
    sh_ok(&m, Some("alice"), "printf 'build/\\n*.tmp\\n' > .gitignore");
    sh_ok(
        &m,
        Some("alice"),
        "mkdir -p build/obj && echo o > build/obj/a.o && mv build/obj/a.o build/obj/b.o \
         && echo x > build/out.bin && ln build/out.bin build/hard && rm build/obj/b.o \
         && echo t > scratch.tmp && echo c > main.c",
    );
    settle(&m, "alice", "marker.txt");
    let ignored = events_under(&m, |p| p.starts_with("build/") || p == "scratch.tmp");
    assert!(ignored.is_empty(), "events of ignored paths: {ignored:?}");
    assert_eq!(version(&m, "build/out.bin"), None);
    assert_eq!(version(&m, "scratch.tmp"), None);
    assert_eq!(version(&m, "main.c"), Some(1));
    assert_eq!(events_of(&m, "commit", "main.c", Some("alice")).len(), 1);
    // Moving a file out of the ignored dir makes it tracked; moving one in removes it.
    sh_ok(
        &m,
        Some("alice"),
        "mv build/out.bin out.bin && mv main.c build/main.c",
    );
    assert_eq!(
        await_events(&m, "commit", "out.bin", Some("alice"), 1).len(),
        1
    );
    let gone = await_events(&m, "commit", "main.c", Some("alice"), 2);
    assert_eq!(gone.len(), 2, "{gone:?}");
    assert_eq!(gone[1]["op"], "rename_away", "{}", gone[1]);
    // (out.bin's commit names its source in `from`; no event is about a path in build/.)
    let inside: Vec<Value> = events(&m)
        .into_iter()
        .filter(|e| e["path"].as_str().is_some_and(|p| p.starts_with("build/")))
        .collect();
    assert!(inside.is_empty(), "{inside:?}");
}

#[test]
fn coherentignore_adds_patterns_and_a_bang_re_includes_at_once() {
    let m = mount(true);
    sh_ok(
        &m,
        Some("alice"),
        "printf 'gen/\\n' > .gitignore && printf '*.log\\n!keep.log\\n!/gen/\\n' > .coherentignore",
    );
    // Written right after the ignore files, with no pause: the change applies at once.
    sh_ok(
        &m,
        Some("alice"),
        "echo a > a.log && echo k > keep.log && mkdir gen && echo g > gen/g.txt",
    );
    settle(&m, "alice", "marker.txt");
    assert!(events_under(&m, |p| p == "a.log").is_empty());
    assert_eq!(version(&m, "a.log"), None);
    assert_eq!(version(&m, "keep.log"), Some(1));
    // `!/gen/` in .coherentignore re-includes what .gitignore ignores.
    assert_eq!(version(&m, "gen/g.txt"), Some(1));
    // Dropping the pattern through the mount tracks a.log from the next change on.
    sh_ok(&m, Some("alice"), "printf '!keep.log\\n' > .coherentignore");
    sh_ok(&m, Some("alice"), "echo b >> a.log");
    assert_eq!(
        await_events(&m, "commit", "a.log", Some("alice"), 1).len(),
        1
    );
}

#[test]
fn track_ignored_tracks_what_gitignore_ignores_but_never_git() {
    let m = mount_with(Mount::builder().arg("--track-ignored"));
    sh_ok(&m, Some("alice"), "printf 'build/\\n' > .gitignore");
    sh_ok(
        &m,
        Some("alice"),
        "mkdir -p build .git && echo x > build/out.bin && echo ref > .git/HEAD",
    );
    settle(&m, "alice", "marker.txt");
    assert_eq!(version(&m, "build/out.bin"), Some(1));
    assert_eq!(
        events_of(&m, "commit", "build/out.bin", Some("alice")).len(),
        1
    );
    assert!(events_under(&m, in_git_dir).is_empty());
    assert_eq!(version(&m, ".git/HEAD"), None);
}

#[test]
fn a_transfer_of_an_untracked_path_is_refused_not_tracked() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(
        &m,
        Some("alice"),
        "printf 'build/\\n' > .gitignore && mkdir -p build .git && echo x > build/out.bin \
         && echo ref > .git/HEAD && cat build/out.bin .git/HEAD >/dev/null",
    );
    // The CLI: refused, exit 2.
    let (code, v) = cli_json(
        &m,
        Some("alice"),
        &["transfer", "--to", "bob", "build/out.bin"],
    );
    assert_eq!(code, Some(2), "{v}");
    assert_eq!(v["reason"], "not_tracked", "{v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("!/build/")
            && msg.contains(".coherentignore")
            && msg.contains("--track-ignored"),
        "the why does not say how to track it: {msg}"
    );
    // The control file: the write fails EACCES with the same reason.
    let (errno, v) = ctl(&m, Some("alice"), "transfer --to bob .git/HEAD");
    assert_eq!(errno, libc::EACCES, "{v}");
    assert_eq!(v["reason"], "not_tracked", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or_default()
            .contains("git directory"),
        "{v}"
    );
    // .coherent/why tells the giver the latest refusal.
    assert!(why(&m, Some("alice")).contains(".git/HEAD is not tracked"));
    assert!(records(&m, "build/out.bin").is_empty());
    assert!(events_of(&m, "transfer", ".git/HEAD", None).is_empty());
}

#[test]
fn ignoring_a_handed_file_does_not_lift_the_fence() {
    let m = mount(true);
    touch_session(&m, "bob");
    sh_ok(
        &m,
        Some("alice"),
        "echo plan > plan.md && cat plan.md >/dev/null",
    );
    transfer(&m, "alice", "bob", &["plan.md"]);
    sh_ok(&m, Some("alice"), "echo plan.md > .coherentignore");
    let r = sh(&m, Some("alice"), "printf x >> plan.md");
    assert!(
        r.denied(),
        "ignoring the file lifted the fence: {}",
        r.show()
    );
    assert_eq!(
        std::fs::read_to_string(m.backing_path("plan.md")).unwrap(),
        "plan\n"
    );
    let d = events_of(&m, "denied", "plan.md", Some("alice"));
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["reason"], "fenced");
    // The successor still takes it over, which ends the record; then the file is ignored.
    sh_ok(&m, Some("bob"), "echo taken >> plan.md");
    assert_eq!(
        await_events(&m, "completed", "plan.md", Some("bob"), 1).len(),
        1
    );
    let before = events_of(&m, "commit", "plan.md", Some("alice")).len();
    sh_ok(&m, Some("alice"), "echo again >> plan.md");
    settle(&m, "alice", "marker.txt");
    assert_eq!(
        events_of(&m, "commit", "plan.md", Some("alice")).len(),
        before
    );
}
