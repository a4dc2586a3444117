//! `coherent top` through a real pseudo-terminal against a real mount: the screen read with
//! a vt100 parser as a person sees it, keys typed into the terminal (docs/board.md).

use crate::coherent;
use crate::common;
use crate::pty;
use common::users;

use coherent::*;
use std::process::Command;
use std::time::{Duration, Instant};

const SHOW: Duration = Duration::from_secs(10);

/// The `coherent` that draws the board: this build's, or `COHERENT_TOP_BIN` (to measure
/// a release build: `COHERENT_TOP_BIN=target/release/coherent cargo test --test top`).
fn top_bin() -> String {
    std::env::var("COHERENT_TOP_BIN").unwrap_or_else(|_| CLI.to_string())
}

/// `coherent top` in the mount root in a 50x200 terminal, as `who` (None: unattributed).
fn board(m: &impl Root, who: Who) -> pty::Pty {
    let mut c = Command::new(top_bin());
    c.arg("top");
    for t in TAGS {
        c.env_remove(t);
    }
    shown(m, who, c)
}

/// The same as the test user `u`. Not through [`users::User::argv`]: its `timeout` puts the
/// program in a process group of its own, which a terminal treats as a background job (it
/// is stopped as soon as it sets the terminal up).
fn board_as(m: &impl Root, u: &users::User, who: Who) -> pty::Pty {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={}", u.uid))
        .arg(format!("--regid={}", u.gid))
        .args(["--init-groups", "--", &top_bin(), "top"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", "/");
    shown(m, who, c)
}

fn shown(m: &impl Root, who: Who, mut c: Command) -> pty::Pty {
    c.current_dir(m.root());
    if let Some(w) = who {
        c.env("COHERENT_SESSION", w);
    }
    let t = pty::Pty::spawn(&mut c, 50, 200);
    wait_screen(&t, "the board", |s| {
        s.contains(" files ") && s.contains(" refusals ")
    });
    t
}

/// The screen line holding `needle`.
fn line_of(screen: &str, needle: &str) -> Option<String> {
    screen
        .lines()
        .find(|l| l.contains(needle))
        .map(str::to_string)
}

/// Waits until the screen satisfies `f`; fails the test (at the caller's line) with the
/// screen after [`SHOW`].
#[track_caller]
fn wait_screen(t: &pty::Pty, what: &str, f: impl Fn(&str) -> bool) -> Instant {
    match t.wait_for(SHOW, f) {
        Some(at) => at,
        None => panic!(
            "{what}: not on the screen within {SHOW:?}:\n{}",
            t.contents()
        ),
    }
}

/// Waits until a line holding `needle` also holds every one of `want`.
#[track_caller]
fn wait_row(t: &pty::Pty, needle: &str, want: &[&str]) -> Instant {
    wait_screen(t, &format!("a line with {needle:?} and {want:?}"), |s| {
        line_of(s, needle).is_some_and(|l| want.iter().all(|w| l.contains(w)))
    })
}

#[test]
fn the_board_shows_a_transfer_and_the_refused_write_of_its_giver() {
    let m = mount(false);
    sh_ok(&m, Some("alice"), "echo one > plan.md");
    touch_session(&m, "bob");
    let t = board(&m, None);
    transfer_with(
        &m,
        "alice",
        &["--to", "bob", "--note", "your turn\nsecond line", "plan.md"],
    );
    wait_row(
        &t,
        "plan.md",
        &["v1", "alice -> bob", "pending", "your turn"],
    );
    let s = t.contents();
    assert!(
        !s.contains("second line"),
        "only the note's first line:\n{s}"
    );
    assert!(
        line_of(&s, "alice waits on bob (1 file(s))").is_some(),
        "{s}"
    );
    let fenced = format!("alice {} FENCED 1", short_of("alice"));
    assert!(line_of(&s, &fenced).is_some(), "{s}");

    // the giver's write is refused: it shows under refusals, by session and route
    let r = sh(&m, Some("alice"), "echo two >> plan.md");
    assert!(r.denied(), "{}", r.show());
    wait_row(&t, "alice open_write 1/min", &["1 total: fenced plan.md"]);

    // the successor writes: the record completes and ends, the fence lifts
    sh_ok(&m, Some("bob"), "echo three >> plan.md");
    wait_row(&t, "plan.md", &["v2", "bob M", "completed"]);
    let s = t.contents();
    assert!(!s.contains("FENCED"), "{s}");
}

#[test]
fn without_a_terminal_it_says_what_to_use_instead() {
    let m = mount(false);
    let r = cli(&m, None, &["top"]);
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(
        r.err.contains("not one") && r.err.contains("coherent watch"),
        "{}",
        r.show()
    );
}

#[test]
fn outside_a_volume_it_exits_4() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(top_bin());
    let r = run_in(dir.path(), &[], c.arg("top"));
    assert_eq!(r.code, Some(4), "{}", r.show());
    assert!(r.err.contains("no coherent volume here"), "{}", r.show());
}

#[test]
fn the_filter_narrows_the_rows_to_a_session_or_a_path() {
    let m = mount(false);
    sh_ok(&m, Some("alice"), "echo a > a.md");
    sh_ok(&m, Some("carol"), "echo b > b.md");
    touch_session(&m, "bob");
    touch_session(&m, "dave");
    transfer(&m, "alice", "bob", &["a.md"]);
    transfer(&m, "carol", "dave", &["b.md"]);
    let mut t = board(&m, None);
    wait_row(&t, "a.md", &["alice -> bob"]);
    wait_row(&t, "b.md", &["carol -> dave"]);
    assert!(t.contents().contains(" files 1/2 "), "{}", t.contents());

    t.send(b"/dave\r");
    wait_screen(&t, "the filter narrowing to b.md", |s| {
        s.contains(" files 1/1 ") && !s.contains("a.md")
    });
    wait_row(&t, "b.md", &["carol -> dave"]);
    assert!(t.contents().contains("filter dave (1 row(s))"));

    // by path, after Esc cleared the session filter
    t.send(b"\x1b");
    wait_screen(&t, "both rows after Esc", |s| {
        s.contains("/2 ") && s.contains("a.md")
    });
    t.send(b"/a.m\r");
    wait_screen(&t, "the path filter narrowing to a.md", |s| {
        s.contains(" files 1/1 ") && !s.contains("b.md")
    });
    wait_row(&t, "a.md", &["alice -> bob"]);
}

#[test]
fn w_then_y_withdraws_the_selected_record_and_n_does_not() {
    let m = mount(false);
    sh_ok(&m, Some("alice"), "echo one > plan.md");
    touch_session(&m, "bob");
    transfer(&m, "alice", "bob", &["plan.md"]);
    // the giver's own board: the verbs go to ctl as its session
    let mut t = board(&m, Some("alice"));
    wait_row(&t, "plan.md", &["alice -> bob", "pending"]);

    t.send(b"w");
    wait_screen(&t, "the confirmation", |s| {
        s.contains("withdraw plan.md? y/n")
    });
    t.send(b"n");
    wait_screen(&t, "cancelled", |s| s.contains("cancelled"));
    assert_eq!(record(&m, "plan.md").unwrap()["status"], "pending");

    t.send(b"w");
    wait_screen(&t, "the confirmation", |s| {
        s.contains("withdraw plan.md? y/n")
    });
    t.send(b"y");
    wait_row(&t, "plan.md", &["alice -> bob", "withdrawn"]);
    wait_screen(&t, "the reply", |s| s.contains("withdrew plan.md"));
    let rec = record(&m, "plan.md").unwrap();
    assert_eq!(
        (rec["status"].as_str(), rec["live"].as_bool()),
        (Some("withdrawn"), Some(false))
    );
    sh_ok(&m, Some("alice"), "echo two >> plan.md");

    // a verb the volume refuses says why: bob's board cannot withdraw alice's handoff
    transfer(&m, "alice", "bob", &["plan.md"]);
    let mut b = board(&m, Some("bob"));
    wait_row(&b, "plan.md", &["pending"]);
    b.send(b"wy");
    wait_screen(&b, "the refusal", |s| {
        s.contains("refused (handoff_not_giver)")
    });
    assert_eq!(live_record(&m, "plan.md").unwrap()["status"], "pending");
    t.send(b"q");
    assert!(t.exit(SHOW).is_some_and(|s| s.success()), "q did not quit");
}

/// Event to screen: from a `coherent transfer` returning to the board showing its record,
/// 20 times; prints the median (docs/board.md) and holds it to the issue's 100 ms.
#[test]
fn a_transfer_reaches_the_screen_within_100_ms() {
    let m = mount(false);
    let files: Vec<String> = (0..20).map(|i| format!("f{i:02}.md")).collect();
    sh_ok(
        &m,
        Some("alice"),
        &files
            .iter()
            .map(|f| format!("echo x > {f}"))
            .collect::<Vec<_>>()
            .join("; "),
    );
    touch_session(&m, "bob");
    let t = board(&m, None);
    let mut lat = Vec::new();
    for f in &files {
        transfer(&m, "alice", "bob", &[f]);
        let returned = Instant::now();
        let shown = wait_row(&t, f, &["pending"]);
        lat.push(shown.saturating_duration_since(returned));
    }
    lat.sort();
    let median = lat[lat.len() / 2];
    println!(
        "event to screen over 20 transfers: median {median:?}, min {:?}, max {:?}",
        lat[0],
        lat[lat.len() - 1]
    );
    assert!(
        median <= Duration::from_millis(100),
        "median {median:?}: {lat:?}"
    );
}

/// The board reads what the volume gives its reader: a user who cannot look a path up
/// sees neither its row nor its note, while its owner sees both.
#[test]
fn each_reader_sees_only_the_paths_it_could_look_up() {
    let (u1, u2) = (users::u1(), users::u2());
    let m = mount(false);
    // other users reach the mount root (the harness's temporary directories are 0700)
    for (dir, mode) in [(m.mnt.parent().unwrap(), 0o755), (m.mnt.as_path(), 0o777)] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let (alice, bob) = (unique("alice"), unique("bob"));
    let run = |u: &users::User, who: &str, cmd: &str| {
        let o = u.sh(m.root(), &[("COHERENT_SESSION", who)], cmd);
        assert!(o.status.success(), "{cmd}: {o:?}");
    };
    run(
        &u1,
        &alice,
        "mkdir -m 700 private && echo s > private/hidden.md && cat private/hidden.md && \
         echo p > public.md && chmod 644 public.md",
    );
    run(&u1, &bob, &format!("{CLI} register"));
    run(
        &u1,
        &alice,
        &format!(
            "{CLI} transfer --to {bob} --note secret-note-7f3a private/hidden.md && \
             {CLI} transfer --to {bob} --note open-note public.md"
        ),
    );
    let owner = board_as(&m, &u1, Some(&alice));
    wait_row(
        &owner,
        "private/hidden.md",
        &["pending", "secret-note-7f3a"],
    );
    wait_row(&owner, "public.md", &["pending", "open-note"]);

    let other = board_as(&m, &u2, None);
    wait_row(&other, "public.md", &["pending", "open-note"]);
    let s = other.contents();
    assert!(!s.contains("hidden") && !s.contains("secret-note"), "{s}");
    assert!(s.contains(" files 1/1 "), "{s}");
}

/// The same over a board of 10 000 live records: the board reads them from the log and
/// status at start, then each new transfer is one more event and one redraw. Printed for
/// docs/board.md; held to a looser bound than the small board's, since every redraw of a
/// debug build passes over the 10 000 records.
#[test]
fn a_transfer_reaches_a_board_of_ten_thousand_records() {
    let m = mount(false);
    sh_ok(
        &m,
        Some("alice"),
        "mkdir d && for i in $(seq -w 0 9999); do echo x > d/f$i.md; done && \
         for i in $(seq -w 0 19); do echo x > a$i.md; done",
    );
    touch_session(&m, "bob");
    let r = sh(
        &m,
        Some("alice"),
        &format!("{CLI} transfer --to bob d/*.md >/dev/null"),
    );
    assert!(r.ok(), "{}", r.show());
    let started = Instant::now();
    let t = board(&m, None);
    wait_screen(&t, "10 000 live records", |s| {
        s.contains(" 10000 live record(s)")
    });
    println!(
        "a board of 10000 live records up in {:?}",
        started.elapsed()
    );
    let mut lat = Vec::new();
    for i in 0..20 {
        let f = format!("a{i:02}.md");
        transfer(&m, "alice", "bob", &[&f]);
        let returned = Instant::now();
        // the newest live records sort first by path: a.. before d/..
        let shown = wait_row(&t, &f, &["pending"]);
        lat.push(shown.saturating_duration_since(returned));
    }
    lat.sort();
    let median = lat[lat.len() / 2];
    println!(
        "event to screen with 10000 live records, 20 transfers: median {median:?}, min {:?}, \
         max {:?}",
        lat[0],
        lat[lat.len() - 1]
    );
    assert!(
        median <= Duration::from_millis(250),
        "median {median:?}: {lat:?}"
    );
}

/// A file name holding a newline or an escape sequence is one escaped, quoted row: it can
/// neither fake a row of its own nor clear the screen.
#[test]
fn a_name_cannot_forge_a_row_or_steer_the_terminal() {
    let m = mount(false);
    let (newline, escape) = ("a\nb.md", "\x1b[2Jc.md");
    sh_ok(
        &m,
        Some("alice"),
        r#"printf x > "$(printf 'a\nb.md')" && printf x > "$(printf '\033[2Jc.md')""#,
    );
    touch_session(&m, "bob");
    let t = board(&m, None);
    transfer(&m, "alice", "bob", &[newline, escape]);
    wait_row(&t, r#""a\nb.md""#, &["alice -> bob", "pending"]);
    wait_row(&t, r#""\u{001B}[2Jc.md""#, &["alice -> bob", "pending"]);
    let s = t.contents();
    assert!(!s.lines().any(|l| l.starts_with("│b.md")), "{s}");
    assert!(s.contains(" files 1/2 "), "the screen was cleared:\n{s}");
}
