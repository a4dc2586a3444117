//! Every write route of docs/design.md#write-routes through real programs on a real mount, one
//! table row per route. Each row is tried on its own handed-off file (alice hands `tN.md` to bob):
//! by the fenced giver (refused with EACCES, bytes and version unchanged, `.coherent/why`
//! is the deny text of docs/design.md#handoff), by the successor (allowed; a commit completes the
//! record) and by a bystander (allowed; an acquire or a commit overtakes the record). One mount per
//! role keeps the suite fast; all failures of a role are reported together.

use crate::coherent;

use coherent::*;

use crate::common::routes::{check_after, check_record, report, set_backing_xattr, After};

struct Row {
    name: &'static str,
    /// Shell command; `{t}` is the handed-off file (content `orig\n`), `{o}` a helper file
    /// (content `other\n`) that nobody handed on.
    cmd: &'static str,
    /// When allowed: the target afterwards.
    after: After,
    /// When allowed: how many commits the route makes on the target (docs/design.md#versions).
    commits: u64,
    /// When allowed: the route opens the target for writing (an acquire).
    acquires: bool,
}

const fn row(
    name: &'static str,
    cmd: &'static str,
    after: After,
    commits: u64,
    acquires: bool,
) -> Row {
    Row {
        name,
        cmd,
        after,
        commits,
        acquires,
    }
}

use After::*;

const PY_EXCHANGE: &str = "python3 -c \"import ctypes,os,sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.renameat2(-100, b'{o}', -100, b'{t}', 2) != 0:
    e = ctypes.get_errno(); sys.exit('exchange: ' + os.strerror(e))\"";

// `commits`: one per tool run. A shell redirection `> f` and `dd of=f` open the file with
// `O_TRUNC`, dup2 it onto fd 1 and close the original descriptor before writing; that
// early flush must not count the truncation as a commit of its own (it joins the handle's
// next change), while an `O_TRUNC` open with no write at all (python_open_w) is one commit.
const ROWS: &[Row] = &[
    row("redirect", "echo new > {t}", Bytes("new\n"), 1, true),
    row("append", "echo new >> {t}", Bytes("orig\nnew\n"), 1, true),
    row(
        "tee",
        "echo new | tee {t} >/dev/null",
        Bytes("new\n"),
        1,
        true,
    ),
    row(
        "tee_append",
        "echo new | tee -a {t} >/dev/null",
        Bytes("orig\nnew\n"),
        1,
        true,
    ),
    row("sed_i", "sed -i s/orig/new/ {t}", Bytes("new\n"), 1, false),
    row("cp_onto", "cp {o} {t}", Bytes("other\n"), 1, true),
    row("mv_onto", "mv {o} {t}", Bytes("other\n"), 1, false),
    row("mv_away", "mv {t} {t}.away", Gone, 1, false),
    row("rm", "rm {t}", Gone, 1, false),
    row("ln_hard", "ln -f {o} {t}", Bytes("other\n"), 1, false),
    row("ln_symlink", "ln -sf {o} {t}", Symlink, 1, false),
    row("truncate", "truncate -s 0 {t}", Bytes(""), 1, true),
    row("touch", "touch {t}", Bytes("orig\n"), 1, true),
    row("chmod", "chmod 600 {t}", Bytes("orig\n"), 0, false),
    row(
        "setfattr",
        "setfattr -n user.test -v 1 {t}",
        Bytes("orig\n"),
        0,
        false,
    ),
    row(
        "setfattr_remove",
        "setfattr -x user.keep {t}",
        Bytes("orig\n"),
        0,
        false,
    ),
    row(
        "dd",
        "printf new | dd of={t} status=none",
        Bytes("new"),
        1,
        true,
    ),
    row(
        "python_open_w",
        "python3 -c \"open('{t}','w')\"",
        Bytes(""),
        1,
        true,
    ),
    row(
        "python_write",
        "python3 -c \"open('{t}','w').write('py\\n')\"",
        Bytes("py\n"),
        1,
        true,
    ),
    row(
        "python_rdwr_no_write",
        "python3 -c \"open('{t}','r+')\"",
        Bytes("orig\n"),
        0,
        true,
    ),
    row(
        "editor_atomic_save",
        "printf 'new\\n' > .{t}.swp && mv .{t}.swp {t}",
        Bytes("new\n"),
        1,
        false,
    ),
    row("rename_exchange", PY_EXCHANGE, Bytes("other\n"), 1, false),
    row(
        "child",
        "sh -c 'echo new >> {t}'",
        Bytes("orig\nnew\n"),
        1,
        true,
    ),
    row(
        "grandchild",
        "sh -c 'sh -c \"echo new >> {t}\"'",
        Bytes("orig\nnew\n"),
        1,
        true,
    ),
    row(
        "through_a_symlink",
        "ln -s {t} {t}.lnk && echo new >> {t}.lnk",
        Bytes("orig\nnew\n"),
        1,
        true,
    ),
    row(
        "background_child",
        "(sleep 0.05; echo new >> {t}) & wait $!",
        Bytes("orig\nnew\n"),
        1,
        true,
    ),
];

fn target(i: usize) -> String {
    format!("t{i}.md")
}
fn helper(i: usize) -> String {
    format!("o{i}.txt")
}
fn cmd_of(r: &Row, i: usize) -> String {
    r.cmd.replace("{t}", &target(i)).replace("{o}", &helper(i))
}

/// A mount where alice has read `tN.md` (v1) for every row and handed them all to bob.
fn handed_off(passthrough: bool) -> Vol {
    let m = mount(passthrough);
    for i in 0..ROWS.len() {
        std::fs::write(m.backing_path(target(i)), "orig\n").unwrap();
        std::fs::write(m.backing_path(helper(i)), "other\n").unwrap();
        set_backing_xattr(&m.backing_path(target(i)), "user.keep", "1");
    }
    touch_session(&m, "bob");
    touch_session(&m, "carol");
    sh_ok(&m, Some("alice"), "cat t*.md > /dev/null");
    let paths: Vec<String> = (0..ROWS.len()).map(target).collect();
    let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
    transfer(&m, "alice", "bob", &refs);
    for p in &paths {
        let r = live_record(&m, p).unwrap_or_else(|| panic!("no live record of {p}"));
        assert_eq!(r["giver"], "alice", "{r}");
        assert_eq!(r["successor"], "bob", "{r}");
        assert_eq!(r["status"], "pending", "{r}");
        assert_eq!(r["version_at_transfer"], 1, "{r}");
        assert_eq!(version(&m, p), Some(1), "{p}");
    }
    m
}

#[test]
fn the_giver_is_fenced_on_every_route() {
    giver_is_fenced(handed_off(true));
}

/// The fence is decided at open and in the metadata calls, so it holds the same when the
/// data goes through the daemon.
#[test]
fn the_giver_is_fenced_on_every_route_without_passthrough() {
    giver_is_fenced(handed_off(false));
}

fn giver_is_fenced(m: Vol) {
    // Reads are never refused.
    let out = sh_ok(
        &m,
        Some("alice"),
        "cat t0.md && stat t0.md >/dev/null && ls >/dev/null && head -c1 t0.md",
    );
    assert!(out.starts_with("orig\n"), "{out:?}");

    let mut failures = Vec::new();
    for (i, r) in ROWS.iter().enumerate() {
        let t = target(i);
        let cmd = cmd_of(r, i);
        let denied_before = events_of(&m, "denied", &t, Some("alice")).len();
        let run = sh(&m, Some("alice"), &cmd);
        let mut bad = Vec::new();
        if !run.denied() {
            bad.push(format!("not denied with EACCES: {}", run.show()));
        }
        match std::fs::symlink_metadata(m.path(&t)) {
            Ok(md) if md.file_type().is_file() => {
                let bytes = std::fs::read_to_string(m.path(&t)).unwrap_or_default();
                if bytes != "orig\n" {
                    bad.push(format!("bytes changed to {bytes:?}"));
                }
            }
            other => bad.push(format!("target is no longer the file: {other:?}")),
        }
        let v = version(&m, &t);
        if v != Some(1) {
            bad.push(format!("version moved to {v:?}"));
        }
        if let Some(e) = check_deny_text(&why(&m, Some("alice")), &t, "bob", 1) {
            bad.push(e);
        }
        let d = await_events(&m, "denied", &t, Some("alice"), denied_before + 1);
        match d.get(denied_before) {
            None => bad.push("no `denied` event for alice".into()),
            Some(e) if e["reason"] != "fenced" => bad.push(format!("denied, not fenced: {e}")),
            Some(_) => {}
        }
        if live_record(&m, &t).is_none() {
            bad.push("the record is no longer live".into());
        }
        if !bad.is_empty() {
            failures.push(format!("  {} (`{cmd}`): {}", r.name, bad.join("; ")));
        }
    }
    report("giver", ROWS.len(), failures);
}

/// The successor or a bystander runs every route: allowed, with the effect and the
/// version change of the row, and the record moves as docs/design.md#handoff says.
fn others_may_write(who: &str) {
    let m = handed_off(true);
    let mut failures = Vec::new();
    for (i, r) in ROWS.iter().enumerate() {
        let t = target(i);
        let cmd = cmd_of(r, i);
        let run = sh(&m, Some(who), &cmd);
        let mut bad = Vec::new();
        if !run.ok() {
            bad.push(format!("refused: {}", run.show()));
        }
        bad.extend(check_after(r.after, &m.path(&t), &helper(i)));
        let want_v = 1 + r.commits;
        let got_v = match r.after {
            Bytes(_) => version(&m, &t),
            _ => await_committed_version(&m, &t, want_v),
        };
        if got_v != Some(want_v) {
            bad.push(format!("version {got_v:?}, want {want_v}"));
        }
        bad.extend(check_record(
            record(&m, &t).as_ref(),
            who,
            r.commits,
            r.acquires,
        ));
        if !bad.is_empty() {
            failures.push(format!("  {} (`{cmd}`): {}", r.name, bad.join("; ")));
        }
    }
    report(who, ROWS.len(), failures);
}

#[test]
fn the_successor_may_write_on_every_route() {
    others_may_write("bob");
}

#[test]
fn a_bystander_may_write_on_every_route() {
    others_may_write("carol");
}
