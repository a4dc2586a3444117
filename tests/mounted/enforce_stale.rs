//! The stale-write guard on a real mount (docs/design.md#holds,
//! docs/versions-and-holds.md#the-stale-write-guard): `guard` (the default) refuses a stale write that can overwrite and lets a stale append
//! through with `stale_write`; `strict` refuses every stale write until the session reads
//! again; `warn` logs `stale_write` and allows; `off` does neither. A blind write is never
//! stale. A late giver (its successor wrote since its view) is refused under every mode but
//! `off`.

use crate::coherent;
use crate::common;

use coherent::*;
use common::Mount;

/// alice reads f at v1, bob commits v2.
fn outdated(stale: Option<&str>) -> Vol {
    let mut b = Mount::builder();
    if let Some(s) = stale {
        b = b.args(["--stale", s]);
    }
    let m = mount_with(b);
    std::fs::write(m.backing_path("f"), "v1\n").unwrap();
    sh_ok(&m, Some("alice"), "cat f >/dev/null");
    sh_ok(&m, Some("bob"), "echo bob >> f");
    assert_eq!(version(&m, "f"), Some(2));
    m
}

#[test]
fn strict_refuses_a_stale_write_until_the_session_reads_again() {
    let m = outdated(Some("strict"));
    for cmd in ["echo alice >> f", "python3 -c \"open('f','a').write('x')\""] {
        sh_refused(&m, "alice", cmd, "f", "stale_view");
    }
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "v1\nbob\n");
    assert_eq!(version(&m, "f"), Some(2));
    let w = why(&m, Some("alice"));
    assert!(
        w.contains("v2") && w.contains("v1") && w.contains("f"),
        "{w:?}"
    );
    let d = await_events(&m, "denied", "f", Some("alice"), 1);
    assert!(
        d.iter().any(|e| e["reason"] == "stale_view"),
        "no denied/stale_view event: {d:?}"
    );
    // a blind write (carol never read f) is never stale
    sh_ok(&m, Some("carol"), "echo carol >> f");
    assert_eq!(version(&m, "f"), Some(3));
    // bob's view is his own commit (v2); carol's blind write moved f to v3 since, so bob
    // is stale now too
    sh_refused(&m, "bob", "echo bob2 >> f", "f", "stale_view");
    // reading again clears it
    sh_ok(&m, Some("alice"), "cat f >/dev/null");
    sh_ok(&m, Some("alice"), "echo alice >> f");
    assert_eq!(version(&m, "f"), Some(4));
    // the log is in order: once the last commit shows, a stale_write would show too
    assert_eq!(await_committed_version(&m, "f", 4), Some(4));
    assert!(events_of(&m, "stale_write", "f", None).is_empty());
}

#[test]
fn warn_logs_a_stale_write_and_allows_it() {
    let m = outdated(Some("warn"));
    sh_ok(&m, Some("alice"), "echo alice >> f");
    assert_eq!(version(&m, "f"), Some(3));
    let ev = await_events(&m, "stale_write", "f", Some("alice"), 1);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (&ev[0]["view"], &ev[0]["version"]),
        (&1.into(), &2.into()),
        "{ev:?}"
    );
    assert_eq!(await_committed_version(&m, "f", 3), Some(3));
    assert!(events_of(&m, "denied", "f", None).is_empty());
    // a current view is not stale
    sh_ok(&m, Some("alice"), "echo again >> f");
    assert_eq!(await_committed_version(&m, "f", 4), Some(4));
    assert_eq!(events_of(&m, "stale_write", "f", None).len(), 1);
}

#[test]
fn off_says_nothing() {
    let m = outdated(Some("off"));
    sh_ok(&m, Some("alice"), "echo alice >> f");
    assert_eq!(version(&m, "f"), Some(3));
    assert_eq!(await_committed_version(&m, "f", 3), Some(3));
    assert!(events_of(&m, "stale_write", "f", None).is_empty());
    assert!(events_of(&m, "denied", "f", None).is_empty());
}

/// The default (`guard`, also spelled out): a stale write that can overwrite is refused
/// `stale_view` whatever tool makes it (a truncating redirection, python's
/// write-temp-and-rename, `truncate`, an `r+` open), the file keeps bob's line; a stale `>>`
/// goes on with `stale_write`; a blind writer is never stale; reading again clears it.
#[test]
fn guard_is_the_default_it_refuses_stale_overwrites_and_lets_appends_through() {
    for stale in [None, Some("guard")] {
        let m = outdated(stale);
        let save = "python3 -c \"import os; open('f.tmp','w').write('alice\\n'); \
                    os.replace('f.tmp','f')\"";
        for cmd in [
            "echo alice > f",
            save,
            "truncate -s 0 f",
            "python3 -c \"open('f','r+').write('alice')\"",
        ] {
            sh_refused(&m, "alice", cmd, "f", "stale_view");
            assert_eq!(
                std::fs::read_to_string(m.path("f")).unwrap(),
                "v1\nbob\n",
                "{stale:?} `{cmd}`"
            );
        }
        let _ = std::fs::remove_file(m.path("f.tmp"));
        let w = why(&m, Some("alice"));
        assert!(
            w.contains("f is at v2")
                && w.contains("last saw v1")
                && w.contains("(bob) changed it since")
                && w.contains("Read f again"),
            "{w:?}"
        );
        let d = await_events(&m, "denied", "f", Some("alice"), 1);
        assert_eq!(
            (&d[0]["view"], &d[0]["version"], &d[0]["counterparty"]),
            (&1.into(), &2.into(), &"bob".into()),
            "{d:?}"
        );
        // a stale append adds to bob's line: allowed, counted
        sh_ok(&m, Some("alice"), "echo alice >> f");
        assert_eq!(
            std::fs::read_to_string(m.path("f")).unwrap(),
            "v1\nbob\nalice\n"
        );
        let ev = await_events(&m, "stale_write", "f", Some("alice"), 1);
        assert_eq!((&ev[0]["view"], &ev[0]["version"]), (&1.into(), &2.into()));
        // carol never read f: her overwrite is blind, never stale
        sh_ok(&m, Some("carol"), "echo carol > f");
        // alice reads again: her overwrite goes on
        sh_ok(&m, Some("alice"), "cat f >/dev/null && echo alice2 > f");
        assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "alice2\n");
    }
}

/// The mission's own case (issue 42): alice hands plan.md to bob; her write is fenced;
/// bob reads and writes (the record completes and ends, the fence lifts); alice then
/// writes from her old view. Refused `stale_view` under every `--stale` but `off`, appends
/// included; the deny text names bob, the version and what to do; bob's line stays.
#[test]
fn a_late_giver_is_refused_after_the_successor_wrote() {
    for stale in [None, Some("warn"), Some("strict")] {
        let mut b = Mount::builder();
        if let Some(s) = stale {
            b = b.args(["--stale", s]);
        }
        let m = mount_with(b);
        std::fs::write(m.backing_path("plan.md"), "v1\n").unwrap();
        touch_session(&m, "bob");
        sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
        transfer(&m, "alice", "bob", &["plan.md"]);
        sh_refused(&m, "alice", "echo early >> plan.md", "plan.md", "fenced");
        sh_ok(
            &m,
            Some("bob"),
            "cat plan.md >/dev/null && echo bob >> plan.md",
        );
        assert_eq!(await_committed_version(&m, "plan.md", 2), Some(2));
        let r = record(&m, "plan.md").expect("the record");
        assert_eq!(
            (&r["status"], &r["live"]),
            (&"completed".into(), &false.into())
        );
        for cmd in ["echo late >> plan.md", "echo late > plan.md"] {
            sh_refused(&m, "alice", cmd, "plan.md", "stale_view");
            assert_eq!(
                std::fs::read_to_string(m.path("plan.md")).unwrap(),
                "v1\nbob\n",
                "{stale:?} `{cmd}`"
            );
        }
        let d = await_events(&m, "denied", "plan.md", Some("alice"), 3);
        assert_eq!(
            (&d[2]["successor"], &d[2]["version"], &d[2]["view"]),
            (&"bob".into(), &2.into(), &1.into()),
            "{d:?}"
        );
        let w = why(&m, Some("alice"));
        let short = short_of("bob");
        assert!(
            w.contains(&format!("you handed plan.md to agent {short} (bob) at v1"))
                && w.contains("bob has changed it since (it is at v2 now)")
                && w.contains("Read plan.md again"),
            "{w:?}"
        );
        // alice reads bob's version: from then on she writes as anyone does
        sh_ok(
            &m,
            Some("alice"),
            "cat plan.md >/dev/null && echo alice >> plan.md",
        );
        assert_eq!(
            std::fs::read_to_string(m.path("plan.md")).unwrap(),
            "v1\nbob\nalice\n"
        );
    }
}

/// `--stale off` checks nothing, a late giver included (the one setting that admits it).
#[test]
fn off_lets_a_late_giver_write() {
    let m = mount_with(Mount::builder().args(["--stale", "off"]));
    std::fs::write(m.backing_path("plan.md"), "v1\n").unwrap();
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    transfer(&m, "alice", "bob", &["plan.md"]);
    sh_ok(&m, Some("bob"), "echo bob >> plan.md");
    assert_eq!(await_committed_version(&m, "plan.md", 2), Some(2));
    sh_ok(&m, Some("alice"), "echo late >> plan.md");
    assert_eq!(await_committed_version(&m, "plan.md", 3), Some(3));
    assert!(events_of(&m, "denied", "plan.md", Some("alice"))
        .iter()
        .all(|e| e["reason"] != "stale_view"));
}

/// False refusals of the default `guard` on real tools (issue 42): two sessions take turns
/// on the same files, each working normally (its tool reads the file, or the agent reads it,
/// before writing), right after the other one changed it. Every step must go on: an editor's
/// save (`vi`: vim-tiny from deps.sh, or vim), python's write-temp-and-rename, `sed -i`,
/// `perl -pi`, `ed`, a `>` after a read, `>>` from an old view, `cp` after a read,
/// `rustfmt`, `cargo fmt`, `cargo build`,
/// and git's `checkout`/`rebase` over files the other session committed. No `denied` event.
#[test]
fn real_tools_working_normally_are_never_refused() {
    let m = mount_with(Mount::builder());
    let setup = "git init -q -b main && git config user.email a@example.com && \
                 git config user.name a && mkdir src && \
                 printf '[package]\\nname = \"tiny\"\\nversion = \"0.1.0\"\\nedition = \"2021\"\\n' \
                 > Cargo.toml && printf '/target\\n' > .gitignore && \
                 printf 'pub fn  f()->u32{1}\\n' > src/lib.rs && printf 'old line\\n' > notes.md && \
                 printf 'other\\n' > other.md && git add -A && git commit -qm init";
    sh_ok(&m, Some("alice"), setup);
    // (the session that changes the file first, then the one that works on it)
    let steps: &[(&str, &str)] = &[
        ("bob", "echo bob1 >> notes.md"),
        (
            "alice",
            "vi -u NONE -i NONE -es -c '%s/old/new/' -c wq notes.md",
        ),
        ("bob", "echo bob2 >> notes.md"),
        (
            "alice",
            "python3 -c \"import os; t=open('notes.md').read(); \
             open('.notes.tmp','w').write(t+'py\\n'); os.replace('.notes.tmp','notes.md')\"",
        ),
        ("bob", "echo bob3 >> notes.md"),
        ("alice", "sed -i 's/bob3/sed/' notes.md"),
        ("bob", "echo bob4 >> notes.md"),
        ("alice", "perl -pi -e 's/bob4/perl/' notes.md"),
        ("bob", "echo bob5 >> notes.md"),
        ("alice", "printf ',s/bob5/ed/\\nw\\nq\\n' | ed -s notes.md"),
        ("bob", "echo bob6 >> notes.md"),
        (
            "alice",
            "t=$(cat notes.md) && printf '%s\\nredir\\n' \"$t\" > notes.md",
        ),
        ("bob", "echo bob7 >> notes.md"),
        ("alice", "echo append-from-an-old-view >> notes.md"),
        ("bob", "echo bob8 >> other.md"),
        ("alice", "cat other.md >/dev/null && cp notes.md other.md"),
        ("bob", "echo 'pub fn g() -> u32 { 2 }' >> src/lib.rs"),
        ("alice", "rustfmt --edition 2021 src/lib.rs"),
        ("bob", "echo 'pub fn  h()->u32{3}' >> src/lib.rs"),
        ("alice", "cargo fmt"),
        ("bob", "echo 'pub fn i() -> u32 { 4 }' >> src/lib.rs"),
        ("alice", "cargo build -q --offline"),
        (
            "bob",
            "echo 'pub fn j() -> u32 { 5 }' >> src/lib.rs && cargo build -q --offline",
        ),
        (
            "alice",
            "git add -A && git commit -qm alice && git checkout -q -b side",
        ),
        (
            "alice",
            "echo side >> notes.md && git commit -qam side && git checkout -q main",
        ),
        (
            "bob",
            "echo 'pub fn k() -> u32 { 6 }' >> src/lib.rs && git commit -qam bob",
        ),
        (
            "alice",
            "git checkout -q side && git rebase -q main && git checkout -q main",
        ),
        (
            "bob",
            "git merge -q --ff-only side && echo bob9 >> notes.md",
        ),
        (
            "alice",
            "git stash -q && git stash pop -q; cat notes.md >/dev/null",
        ),
    ];
    let mut refused = Vec::new();
    for (who, cmd) in steps {
        let r = sh(&m, Some(who), cmd);
        if !r.ok() {
            refused.push(format!("{who} `{cmd}`: {}", r.show()));
        }
    }
    let denied = events(&m)
        .into_iter()
        .filter(|e| e["event"] == "denied")
        .collect::<Vec<_>>();
    assert!(
        refused.is_empty() && denied.is_empty(),
        "false refusals:\n{}\ndenied: {denied:?}",
        refused.join("\n")
    );
    // the tools' work is there: bob's lines and alice's edits both
    let notes = std::fs::read_to_string(m.path("notes.md")).unwrap();
    for want in [
        "new line",
        "bob1",
        "py",
        "sed",
        "perl",
        "ed",
        "redir",
        "append-from",
    ] {
        assert!(notes.contains(want), "{want} missing from {notes:?}");
    }
}

/// A quick seed of the lost-work benchmark (scripts/bench-lostwork.py, docs/lost-work.md)
/// on a real mount of this build: three agents, each its own session, on shared files, with
/// read-modify-writes, appends, `sed -i`, blind creates and handoffs with late writes, the
/// agents doing what the deny text says. No token may be lost to a late write or a stale
/// overwrite, and no append or blind create may be refused `stale_view`.
#[test]
fn the_lost_work_bench_loses_nothing_to_late_or_stale_writes() {
    let bin = std::path::Path::new(crate::common::BIN).parent().unwrap();
    let out = tempfile::NamedTempFile::new().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench-lostwork.py");
    let r = std::process::Command::new("python3")
        .args([
            script,
            "--agents",
            "3",
            "--seeds",
            "2",
            "--rounds",
            "8",
            "--no-plain",
        ])
        .arg("--bin")
        .arg(format!("this={}", bin.display()))
        .arg("--json")
        .arg(out.path())
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path()).unwrap()).unwrap();
    for run in runs.as_array().unwrap() {
        let lost = &run["lost_by_cause"];
        assert_eq!(
            (
                &lost["late_write"],
                &lost["stale_overwrite"],
                &run["false_refusals"]
            ),
            (
                &serde_json::Value::Null,
                &serde_json::Value::Null,
                &0.into()
            ),
            "{run}"
        );
        assert!(run["writes_ok"].as_u64().unwrap() > 10, "{run}");
        let handoffs =
            run["transfers_ok"].as_u64().unwrap() + run["transfers_refused"].as_u64().unwrap();
        assert!(handoffs > 0, "the schedule has handoffs: {run}");
    }
}

/// The default guard is for agent sessions: an unattributed process (a person at a
/// terminal, a tool of another uid, a POSIX test suite) overwrites from an old view as on
/// any filesystem, and the volume counts it (`stale_write`) rather than refuse it. `strict`
/// refuses it too.
#[test]
fn guard_counts_an_unattributed_stale_overwrite_and_strict_refuses_it() {
    for (stale, refused) in [(None, false), (Some("strict"), true)] {
        let mut b = Mount::builder();
        if let Some(s) = stale {
            b = b.args(["--stale", s]);
        }
        let m = mount_with(b);
        std::fs::write(m.backing_path("f"), "v1\n").unwrap();
        sh_ok(&m, None, "cat f >/dev/null");
        sh_ok(&m, Some("bob"), "echo bob >> f");
        let r = sh(&m, None, "echo mine > f");
        assert_eq!(!r.ok(), refused, "{stale:?}: {}", r.show());
        // The log is written in groups: wait for the event the mode must leave, then the
        // other one has had its chance too.
        let (counted, denied) = if refused {
            let d = await_events(&m, "denied", "f", Some("uid:0"), 1);
            (events_of(&m, "stale_write", "f", Some("uid:0")), d)
        } else {
            let c = await_events(&m, "stale_write", "f", Some("uid:0"), 1);
            (c, events_of(&m, "denied", "f", Some("uid:0")))
        };
        if refused {
            assert_eq!(denied.len(), 1, "{denied:?}");
            assert_eq!(denied[0]["reason"], "stale_view");
        } else {
            assert_eq!(
                (counted.len(), denied.len()),
                (1, 0),
                "{counted:?} {denied:?}"
            );
            assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "mine\n");
        }
    }
}
