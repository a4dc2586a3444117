//! The content history on a real mount (docs/history.md): every version real tools commit
//! (a Bash redirection, `sed -i`, an editor's write-temp-and-rename, `cp`, `git
//! checkout`) is shown byte for byte, after a `kill -9` of the daemon and a remount too;
//! `diff --session` is exact; `undo --session` puts a session's files back and refuses,
//! naming who and which version, the ones another session changed later, and a fenced
//! giver's undo is refused as its write would be; a user who may not read a file gets
//! nothing of its history; the size bound holds under a write storm.

use crate::coherent;
use crate::common;

use coherent::*;
use common::{users, Mount, Remount};
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Runs `cmd` as `who`, then notes the version `rel` is at and its bytes.
fn step(m: &impl Root, who: &str, cmd: &str, rel: &str, seen: &mut Vec<(u64, Vec<u8>)>) {
    sh_ok(m, Some(who), cmd);
    let v = version(m, rel).unwrap_or_else(|| panic!("{rel} has no version after `{cmd}`"));
    let bytes = std::fs::read(m.at(rel)).unwrap();
    if let Some(last) = seen.last() {
        assert!(v > last.0, "`{cmd}` made no new version of {rel} ({v})");
    }
    seen.push((v, bytes));
}

fn show(m: &impl Root, spec: &str) -> Run {
    cli(m, Some("reader"), &["show", spec])
}

/// `coherent show SPEC`'s stdout, as bytes.
fn show_bytes(m: &impl Root, spec: &str) -> Vec<u8> {
    let mut c = std::process::Command::new(CLI);
    c.args(["show", spec]).current_dir(m.root());
    for t in TAGS {
        c.env_remove(t);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "show {spec}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

fn check_all(m: &impl Root, rel: &str, seen: &[(u64, Vec<u8>)]) {
    for (v, bytes) in seen {
        assert_eq!(show_bytes(m, &format!("{rel}@v{v}")), *bytes, "{rel}@v{v}");
    }
}

#[test]
fn every_version_real_tools_commit_is_shown_after_a_crash_and_a_remount() {
    let dir = tempfile::Builder::new()
        .prefix("coherent-history-")
        .tempdir()
        .unwrap();
    let base = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(base.join("backing")).unwrap();
    std::fs::write(base.join("backing/g.txt"), "tracked by git\n").unwrap();
    let mut m = Remount::start(&base, &[]);
    let mut f = Vec::new();
    step(
        &m,
        "alice",
        "printf 'one\\ntwo\\n' > f.txt",
        "f.txt",
        &mut f,
    );
    step(&m, "alice", "sed -i 's/two/TWO/' f.txt", "f.txt", &mut f);
    let save = "import os\nwith open('f.txt.swp','w') as o: o.write('saved by an editor\\n')\n\
                os.rename('f.txt.swp','f.txt')";
    step(
        &m,
        "bob",
        &format!("python3 -S -c \"{save}\""),
        "f.txt",
        &mut f,
    );
    sh_ok(
        &m,
        Some("carol"),
        "printf 'copied\\000bytes\\377' > src.bin",
    );
    step(&m, "carol", "cp src.bin f.txt", "f.txt", &mut f);
    step(&m, "carol", "echo appended >> f.txt", "f.txt", &mut f);
    // git: the checkout puts back the committed bytes over a local change
    let mut g = Vec::new();
    g.push((version(&m, "g.txt").unwrap(), b"tracked by git\n".to_vec()));
    sh_ok(
        &m,
        Some("dave"),
        "git init -q && git add g.txt && git -c user.name=t -c user.email=t@t commit -qm g",
    );
    step(&m, "dave", "echo local change > g.txt", "g.txt", &mut g);
    step(&m, "dave", "git checkout -- g.txt", "g.txt", &mut g);
    // a directory renamed through the volume takes its files' history along
    let mut d = Vec::new();
    sh_ok(&m, Some("erin"), "mkdir dir");
    step(&m, "erin", "echo in a dir > dir/x", "dir/x", &mut d);
    step(&m, "erin", "echo again >> dir/x", "dir/x", &mut d);
    sh_ok(&m, Some("erin"), "mv dir moved");
    // two files swapped in one step (renameat2 RENAME_EXCHANGE): both new versions kept
    sh_ok(&m, Some("erin"), "echo left > l && echo right > r");
    let swap = "import ctypes,os\nlibc=ctypes.CDLL(None,use_errno=True)\n\
                assert libc.renameat2(-100,b'l',-100,b'r',2)==0, os.strerror(ctypes.get_errno())";
    sh_ok(&m, Some("erin"), &format!("python3 -S -c \"{swap}\""));
    let (vl, vr) = (version(&m, "l").unwrap(), version(&m, "r").unwrap());
    assert_eq!(show_bytes(&m, &format!("l@v{vl}")), b"right\n");
    assert_eq!(show_bytes(&m, &format!("r@v{vr}")), b"left\n");
    check_all(&m, "f.txt", &f);
    check_all(&m, "g.txt", &g);
    check_all(&m, "moved/x", &d);
    // The log names who made each version and how.
    let (_, log) = cli_json(&m, Some("reader"), &["log", "f.txt"]);
    let who: Vec<&str> = log["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["session"].as_str().unwrap_or("-"))
        .collect();
    assert_eq!(who, ["alice", "alice", "bob", "carol", "carol"], "{log}");

    m.stop_with(libc::SIGKILL);
    drop(m);
    let m = Remount::start(&base, &[]);
    check_all(&m, "f.txt", &f);
    check_all(&m, "g.txt", &g);
    check_all(&m, "moved/x", &d);
    // and history goes on after the restart
    step(&m, "alice", "echo after >> f.txt", "f.txt", &mut f);
    check_all(&m, "f.txt", &f);
}

/// Files made by `setup`, then changed by alice, and one of them by bob after her.
fn sessions_at_work(m: &impl Root) {
    sh_ok(
        m,
        Some("setup"),
        "printf 'a1\\nsame\\n' > a.txt; printf 'b1\\n' > b.txt; printf 'c1\\n' > c.txt",
    );
    sh_ok(
        m,
        Some("alice"),
        "sed -i 's/a1/a2/' a.txt && echo new > n.txt && echo c2 > c.txt && sed -i 's/a2/a3/' a.txt",
    );
    sh_ok(m, Some("bob"), "echo b2 >> b.txt && echo c3 >> c.txt");
}

#[test]
fn diff_of_a_session_is_exact_and_undo_puts_back_what_nobody_changed_since() {
    let m = mount(true);
    // a file that was there before the volume: its first content is kept before a write
    std::fs::write(m.backing.join("old.txt"), "as found\n").unwrap();
    sessions_at_work(&m);
    sh_ok(&m, Some("alice"), "echo rewritten > old.txt");
    let r = cli(&m, Some("reader"), &["diff", "--session", "alice"]);
    assert!(r.ok(), "{}", r.show());
    assert_eq!(
        r.out,
        "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n-a1\n+a3\n same\n\
         --- a/c.txt\n+++ b/c.txt\n@@ -1 +1 @@\n-c1\n+c2\n\
         --- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+new\n\
         --- a/old.txt\n+++ b/old.txt\n@@ -1 +1 @@\n-as found\n+rewritten\n"
    );
    // bob's diff: b.txt from b1, c.txt from alice's c2
    let r = cli(&m, Some("reader"), &["diff", "--session", "bob"]);
    assert!(r.out.contains(" c2\n+c3"), "{}", r.show());
    // a window after all of alice's work has nothing of hers
    let r = cli(
        &m,
        Some("reader"),
        &["diff", "--session", "alice", "--since", "0s"],
    );
    assert_eq!((r.code, r.out.as_str()), (Some(0), ""), "{}", r.show());

    let (va, vc) = (version(&m, "a.txt").unwrap(), version(&m, "c.txt").unwrap());
    let (code, dry) = cli_json(
        &m,
        Some("carol"),
        &["undo", "--session", "alice", "--dry-run"],
    );
    assert_eq!(code, Some(2), "c.txt is refused: {dry}");
    assert_eq!(version(&m, "a.txt"), Some(va), "a dry run writes nothing");
    assert!(m.at("n.txt").exists());

    let (code, out) = cli_json(&m, Some("carol"), &["undo", "--session", "alice"]);
    assert_eq!(code, Some(2), "{out}");
    assert_eq!(
        std::fs::read_to_string(m.at("a.txt")).unwrap(),
        "a1\nsame\n"
    );
    assert!(!m.at("n.txt").exists(), "alice made n.txt: undo removes it");
    assert_eq!(
        std::fs::read_to_string(m.at("old.txt")).unwrap(),
        "as found\n"
    );
    assert_eq!(std::fs::read_to_string(m.at("c.txt")).unwrap(), "c2\nc3\n");
    let refused = out["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{out}");
    assert_eq!(refused[0]["path"], "c.txt");
    assert_eq!(refused[0]["reason"], "changed_after");
    assert_eq!(refused[0]["session"], "bob");
    assert_eq!(refused[0]["version"], vc);
    // the undo is carol's write: a new version by carol, not a rewind
    assert_eq!(version(&m, "a.txt"), Some(va + 1));
    let (_, log) = cli_json(&m, Some("reader"), &["log", "a.txt"]);
    assert_eq!(
        log["versions"].as_array().unwrap().last().unwrap()["session"],
        "carol"
    );
    assert!(
        events_of(&m, "commit", "a.txt", Some("carol")).len() == 1,
        "one commit by carol"
    );
    // bob's work is untouched, and undoing it now is possible (nobody wrote after him)
    let (code, out) = cli_json(&m, Some("carol"), &["undo", "--session", "bob"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(std::fs::read_to_string(m.at("b.txt")).unwrap(), "b1\n");
    assert_eq!(std::fs::read_to_string(m.at("c.txt")).unwrap(), "c2\n");
}

#[test]
fn a_fenced_givers_undo_is_refused_like_its_write() {
    let m = mount(true);
    sh_ok(&m, Some("setup"), "echo v1 > f");
    sh_ok(&m, Some("alice"), "echo v2 > f && cat f > /dev/null");
    touch_session(&m, "bob");
    transfer(&m, "alice", "bob", &["f"]);
    let (code, out) = cli_json(&m, Some("alice"), &["undo", "--session", "alice"]);
    assert_eq!(code, Some(2), "{out}");
    assert_eq!(out["refused"][0]["reason"], "fenced", "{out}");
    assert_eq!(std::fs::read_to_string(m.at("f")).unwrap(), "v2\n");
    // the successor may undo it: its write completes the handoff
    let (code, out) = cli_json(&m, Some("bob"), &["undo", "--session", "alice"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(std::fs::read_to_string(m.at("f")).unwrap(), "v1\n");
    // the successor's version stays retrievable after a change behind the volume's back
    let v = version(&m, "f").unwrap();
    std::fs::write(m.backing.join("f"), "outside\n").unwrap();
    sh_ok(&m, Some("reader"), "cat f >/dev/null");
    assert_eq!(
        version(&m, "f"),
        Some(v + 1),
        "counted as an external change"
    );
    assert_eq!(show_bytes(&m, &format!("f@v{v}")), b"v1\n");
}

#[test]
fn a_user_who_may_not_read_a_file_gets_nothing_of_its_history() {
    let u1 = users::u1();
    let m = mount_with(Mount::builder());
    let root = m.mnt.parent().unwrap();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&m.mnt, std::fs::Permissions::from_mode(0o777)).unwrap();
    sh_ok(
        &m,
        Some("alice"),
        "umask 077; echo secret one > s.txt; echo secret two > s.txt",
    );
    sh_ok(
        &m,
        Some("alice"),
        "echo open > o.txt; echo open two > o.txt",
    );
    let as_u1 = |args: &[&str]| {
        let mut argv = vec![CLI, "--json"];
        argv.extend_from_slice(args);
        let o = u1.argv(&m.mnt, &[], &argv).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let v: Value = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
        (o.status.code(), v, out)
    };
    let (code, v, _) = as_u1(&["show", "o.txt@v1"]);
    assert_eq!(
        (code, v["content"].as_str()),
        (Some(0), Some("open\n")),
        "{v}"
    );
    for args in [
        &["show", "s.txt@v1"][..],
        &["log", "s.txt"],
        &["show", "none.txt@v1"],
    ] {
        let (code, v, out) = as_u1(args);
        assert_eq!(code, Some(2), "{args:?}: {v}");
        assert_eq!(v["reason"], "no_such_path", "{args:?}: {v}");
        assert!(!out.contains("secret"), "{args:?} leaked: {out}");
    }
    let (_, v, out) = as_u1(&["diff", "--session", "alice"]);
    assert!(!out.contains("secret") && out.contains("open two"), "{v}");
    // root reads it
    let r = show(&m, "s.txt@v1");
    assert_eq!(r.out, "secret one\n", "{}", r.show());
}

/// The bytes the blobs in `dir` take on disk (what `du` counts; the packs keep their
/// blobs' bytes apart from their entries, and a pruned blob is a hole), the packs'
/// entries left out.
fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".idx"))
        .map(|e| std::os::unix::fs::MetadataExt::blocks(&e.metadata().unwrap()) * 512)
        .sum()
}

#[test]
fn the_size_bound_holds_under_a_write_storm() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let m = Remount::start(&base, &["--history-max", "256K"]);
    // 600 versions of 8 KiB, then 400 tiny ones (a few bytes each, a block on disk each).
    let storm = "import os\nfor i in range(150):\n  for n in range(4):\n    \
                 open('w%d' % n, 'wb').write(os.urandom(8192))\n\
                 for i in range(400):\n  open('tiny', 'w').write(str(i))\n";
    sh_ok(&m, Some("storm"), &format!("python3 -S -c \"{storm}\""));
    let objects = m.state.join("history/objects");
    let used = du(&objects);
    // 600 versions of 8 KiB and 400 tiny ones went through; what stays on disk is within
    // the bound (a tiny version counts the block it takes)
    assert!(used <= 256 * 1024, "{used} bytes kept");
    assert!(used >= 128 * 1024, "the bound is used, not emptied: {used}");
    // each file's latest version is there, byte for byte
    for n in 0..4 {
        let rel = format!("w{n}");
        let v = version(&m, &rel).unwrap();
        let (_, j) = cli_json(&m, Some("reader"), &["show", &format!("{rel}@v{v}")]);
        let b = coherent_b64(j["content_base64"].as_str().unwrap());
        assert_eq!(b, std::fs::read(m.at(&rel)).unwrap());
    }
}

fn coherent_b64(s: &str) -> Vec<u8> {
    ::coherent::history::b64::decode(s).unwrap()
}

#[test]
fn keeping_a_version_leaves_the_files_atime_alone() {
    // A read of the backing file to keep a version would move an atime the tool just set
    // (relatime updates one older than the mtime): `touch -d` before the epoch, then the
    // RELEASE that keeps the version (xfstests generic/258 saw it after a remount).
    let m = mount(true);
    sh_ok(&m, Some("alice"), "echo a > f && touch -d @-315619140 f");
    let v = version(&m, "f").expect("f has a version");
    assert_eq!(
        show_bytes(&m, &format!("f@v{v}")),
        b"a\n",
        "the version is kept"
    );
    let md = std::fs::metadata(m.backing.join("f")).unwrap();
    assert_eq!((md.atime(), md.mtime()), (-315619140, -315619140));
}

/// The daemon's descriptors of a removed file named `name` (`/proc/PID/fd` links that end
/// in "(deleted)").
fn held_removed(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|l| {
                    let l = l.to_string_lossy();
                    l.contains(name) && l.ends_with("(deleted)")
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn removing_a_huge_file_frees_it_while_its_digest_is_taken() {
    // A 1 TiB sparse file is over the history's file limit: its digest is taken on a worker
    // thread, which holds a descriptor of it (so its blocks) and reads for minutes. An `rm`
    // stops that read at its next look (64 MiB on), and the blocks go (xfstests 213, a
    // fallocate that filled the disk, then 215 found it still full after the rm).
    let m = mount(true);
    sh_ok(&m, Some("alice"), "truncate -s 1T huge.bin");
    let pid = m.pid();
    assert!(
        common::wait_until(common::TIMEOUT, || std::fs::read_dir(format!(
            "/proc/{pid}/task"
        ))
        .unwrap()
        .filter_map(Result::ok)
        .any(|t| std::fs::read_to_string(t.path().join("comm"))
            .is_ok_and(|c| c.trim() == "coherent-histor"))),
        "no history worker hashing the file"
    );
    sh_ok(&m, Some("alice"), "rm huge.bin");
    assert!(
        common::wait_until(common::TIMEOUT, || held_removed(pid, "huge.bin") == 0),
        "the daemon still holds the removed 1 TiB file: {} descriptor(s)",
        held_removed(pid, "huge.bin")
    );
}
