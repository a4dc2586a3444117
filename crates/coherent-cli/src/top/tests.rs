use super::*;
use ratatui::backend::TestBackend;
use serde_json::json;
use std::time::Instant;

const T: &str = "2026-12-03T12:00:00.000Z";

/// A board with `n` files, each handed by one of six sessions to the next.
fn board_of(n: usize) -> Board {
    let mut b = Board::default();
    for i in 0..n {
        let (g, s) = (format!("agent{}", i % 6), format!("agent{}", (i + 1) % 6));
        b.apply_event(&json!({"seq": i * 2 + 1, "ts": T, "event": "commit",
            "path": format!("src/f{i:05}.rs"), "session": g, "version": 2}));
        b.apply_event(&json!({"seq": i * 2 + 2, "ts": T, "event": "transfer",
            "path": format!("src/f{i:05}.rs"), "session": g, "successor": s, "version": 2,
            "note": "take it from here\nmore"}));
    }
    b
}

fn screen(app: &mut App, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| view::render(f, app)).unwrap();
    let buf = t.backend().buffer().clone();
    (0..h)
        .map(|y| (0..w).map(|x| buf[(x, y)].symbol()).collect::<String>() + "\n")
        .collect()
}

fn app_of(b: Board) -> App {
    let mut app = App::new(Path::new("/ws"), b);
    app.clock = Some(
        coherent::coherence::Timestamp::parse_rfc3339(T)
            .unwrap()
            .millis()
            + 5000,
    );
    app
}

/// The board's render time with 10k live records (printed; the bound is generous for a
/// debug build on a shared machine, the number is what docs/board.md reports).
#[test]
fn ten_thousand_records_render_in_milliseconds() {
    let mut app = app_of(board_of(10_000));
    let mut t = Terminal::new(TestBackend::new(200, 50)).unwrap();
    let mut times = Vec::new();
    for i in 0..21 {
        // a new event each time, so nothing is reused from the frame before
        app.board.apply_event(&json!({"seq": 100_000 + i, "ts": T, "event": "denied",
            "path": "src/f00001.rs", "session": "agent0", "reason": "fenced", "route": "open_write"}));
        app.move_by(1);
        let start = Instant::now();
        t.draw(|f| view::render(f, &mut app)).unwrap();
        times.push(start.elapsed());
    }
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "render of 10000 live records, 200x50: median {median:?} of 21, max {:?}",
        times[20]
    );
    assert!(median < Duration::from_millis(250), "median {median:?}");
}

#[test]
fn the_screen_shows_records_and_the_filter_narrows_them() {
    let mut app = app_of(board_of(12));
    let s = screen(&mut app, 160, 40);
    assert!(s.contains("src/f00003.rs"), "{s}");
    assert!(s.contains("agent3 -> agent4"), "{s}");
    assert!(s.contains("files 1/12"), "{s}");
    assert!(
        s.contains("take it from here") && !s.contains("more"),
        "{s}"
    );
    for c in "/f0001".chars() {
        app.key(KeyEvent::from(KeyCode::Char(c)));
    }
    app.key(KeyEvent::from(KeyCode::Enter));
    let s = screen(&mut app, 160, 40);
    assert!(s.contains("files 1/2"), "{s}");
    assert!(!s.contains("src/f00003.rs"), "{s}");
}

#[test]
fn a_verb_waits_for_yes() {
    let mut app = app_of(board_of(3));
    screen(&mut app, 160, 40);
    app.key(KeyEvent::from(KeyCode::Down));
    assert_eq!(app.key(KeyEvent::from(KeyCode::Char('w'))), None);
    assert!(screen(&mut app, 160, 40).contains("withdraw src/f00001.rs? y/n"));
    assert_eq!(app.key(KeyEvent::from(KeyCode::Char('n'))), None);
    app.key(KeyEvent::from(KeyCode::Char('d')));
    assert_eq!(
        app.key(KeyEvent::from(KeyCode::Char('y'))),
        Some((Action::Decline, "src/f00001.rs".to_string()))
    );
}

#[test]
fn the_hosts_pane_names_each_host_and_its_lease() {
    let mut b = Board::default();
    b.apply_status(
        &json!({"sessions": [], "live": [], "ended": [], "coordinator": {
        "host": "h1", "connected": true, "confirmed": true,
        "hosts": [{"host": "h1", "applied": 12}, {"host": "h2", "applied": 11}]}}),
    );
    b.apply_event(
        &json!({"seq": 1, "ts": T, "event": "commit", "path": "a", "session": "s",
        "version": 2, "host": "h2"}),
    );
    let s = screen(&mut app_of(b), 200, 40);
    assert!(s.contains("etcd: connected, lease confirmed"), "{s}");
    assert!(s.contains("h1 (this) leased rev 12"), "{s}");
    assert!(s.contains("h2 leased rev 11 last event 5s"), "{s}");

    // a host whose lease ended is no longer listed by status
    let mut b = Board::default();
    b.apply_status(
        &json!({"sessions": [], "live": [], "ended": [], "coordinator": {
        "host": "h1", "connected": false, "confirmed": false, "error": "timed out",
        "hosts": [{"host": "h1", "applied": 12}]}}),
    );
    b.apply_event(
        &json!({"seq": 1, "ts": T, "event": "commit", "path": "a", "session": "s",
        "version": 2, "host": "h2"}),
    );
    let s = screen(&mut app_of(b), 200, 40);
    assert!(s.contains("lease NOT confirmed (timed out)"), "{s}");
    assert!(s.contains("h2 no lease"), "{s}");
}
