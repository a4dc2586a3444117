//! Drawing the board: the files (with their records) as a table of the rows that fit, and
//! under it sessions, offers and waits, refusals, hosts. Every file and session name goes
//! through [`q`], the volume's quoting, so no name can forge a line or steer the terminal.

use super::board::{File, Summary};
use super::{App, Mode};
use ratatui::layout::{Constraint, Direction, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table, TableState};
use ratatui::Frame;

/// From this width on, the panes under the files sit side by side.
const WIDE: u16 = 160;

/// A file or session name as the board shows it: the volume's one rule for names in text
/// (as it is when plain, else quoted with whatever could forge a line escaped).
pub(crate) fn q(name: &str) -> String {
    coherent_wire::names::display_name(name)
}

/// Free text from the volume (a reply's message), kept to its line.
pub(crate) fn plain(text: &str) -> String {
    coherent_wire::names::one_line(text).into_owned()
}

/// A successor as shown: `any` for an unclaimed offer is a keyword, not a name.
fn who(name: &str) -> String {
    if name == coherent_wire::names::ANY {
        name.to_string()
    } else {
        q(name)
    }
}

pub(crate) fn age(now: i64, then: i64) -> String {
    let s = (now - then).max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The holder column: sessions writing it now (`E`), else the maker of its version (`M`).
fn holder(f: &File) -> String {
    if !f.writers.is_empty() {
        let names: Vec<String> = f.writers.iter().map(|w| q(w)).collect();
        format!("{} E", names.join(","))
    } else if let Some(m) = &f.maker {
        format!("{} M", q(m))
    } else {
        String::new()
    }
}

fn file_row<'a>(path: &str, f: &File, now: i64) -> Row<'a> {
    let ver = match (f.version, f.removed) {
        (_, true) => "gone".to_string(),
        (Some(v), _) => format!("v{v}"),
        (None, _) => "?".to_string(),
    };
    let (rec, ended) = match (&f.live, &f.ended) {
        (Some(r), _) => (Some(r), false),
        (None, Some(r)) => (Some(r), true),
        _ => (None, false),
    };
    let mut cells = vec![q(path), ver, holder(f)];
    match rec {
        Some(r) => {
            // who overtook it is its holder (it acquired or wrote the file)
            let status = r.status.clone();
            cells.push(format!("{} -> {}", q(&r.giver), who(&r.successor)));
            cells.push(status);
            cells.push(age(now, r.updated));
            cells.push(r.note_head().map(q).unwrap_or_default());
        }
        None => cells.extend(std::iter::repeat_n(String::new(), 4)),
    }
    let row = Row::new(cells);
    if ended {
        row.style(Style::default().add_modifier(Modifier::DIM))
    } else {
        row
    }
}

/// The files table's columns: heading and width ([`file_row`] gives a cell for each, in
/// this order).
const COLUMNS: &[(&str, Constraint)] = &[
    ("PATH", Constraint::Percentage(24)),
    ("VER", Constraint::Length(5)),
    ("HOLDER", Constraint::Length(16)),
    ("GIVER -> SUCCESSOR", Constraint::Percentage(22)),
    ("STATUS", Constraint::Length(11)),
    ("AGE", Constraint::Length(4)),
    ("NOTE", Constraint::Min(8)),
];

/// What a pane under the files lists, given the lines it has. The app is mutable because
/// the refusal rates are brought up to now as they are drawn.
type Body = fn(&mut App, &Summary, i64, usize) -> Vec<String>;

/// The panes under the files, in the order of the places [`pane_places`] gives: title and
/// body.
const PANES: &[(&str, Body)] = &[
    ("sessions", sessions),
    ("offers (--to any) and waits", offers_and_waits),
    ("refusals", refusals),
    ("hosts", hosts),
];

pub(crate) fn render(frame: &mut Frame, app: &mut App) {
    let area = frame.area();
    // the four panes side by side on a wide terminal, two by two on a narrower one
    let wide = area.width >= WIDE;
    let [head, table, panes, foot] = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Min(5),
            Constraint::Length(if wide { 10 } else { 16 }),
            Constraint::Length(1),
        ])
        .areas(area);
    let now = app.now();
    let rows = app.rows();
    // the files: only the rows that fit are built
    let height = table.height.saturating_sub(3) as usize;
    app.fit(rows.len(), height);
    let sum = app.summary();
    frame.render_widget(Paragraph::new(title(app, &sum, rows.len())), head);
    files(frame, table, app, &rows, height, now);
    let places = pane_places(panes, wide);
    // the panes are of one height: the first's says how many lines each lists
    let lines = places[0].height.saturating_sub(2) as usize;
    for ((title, body), place) in PANES.iter().zip(places) {
        let body = body(app, &sum, now, lines);
        let pane = Paragraph::new(body.into_iter().map(Line::from).collect::<Vec<_>>()).block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!(" {title} ")),
        );
        frame.render_widget(pane, place);
    }
    frame.render_widget(
        Paragraph::new(footer(app)).style(Style::default().add_modifier(Modifier::BOLD)),
        foot,
    );
}

/// The top line: the volume and its counts, what was missed, the filter.
fn title(app: &App, sum: &Summary, rows: usize) -> String {
    let b = &app.board;
    let mut title = format!(
        "coherent top {} | {} session(s), {} file(s), {} live record(s), {} fenced session(s), {} event(s)",
        q(&app.root.to_string_lossy()),
        b.sessions.len(),
        b.files.len(),
        sum.live,
        sum.fenced.len(),
        b.events
    );
    if b.missed {
        title.push_str(" | some other hosts' events were missed: r reloads");
    }
    if !app.filter.is_empty() {
        title.push_str(&format!(" | filter {} ({rows} row(s))", q(&app.filter)));
    }
    title
}

/// The files that fit in `height` rows from the scroll offset, the cursor's selected.
fn files(frame: &mut Frame, area: Rect, app: &App, rows: &[String], height: usize, now: i64) {
    let visible: Vec<Row> = rows
        .iter()
        .skip(app.offset)
        .take(height)
        .map(|p| file_row(p, &app.board.files[p.as_str()], now))
        .collect();
    let header = Row::new(COLUMNS.iter().map(|(h, _)| *h))
        .style(Style::default().add_modifier(Modifier::BOLD));
    let mut state = TableState::default();
    if !rows.is_empty() {
        state.select(Some(app.cursor - app.offset));
    }
    let t = Table::new(visible, COLUMNS.iter().map(|(_, w)| *w))
        .header(header)
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .block(Block::default().borders(Borders::ALL).title(format!(
            " files {}/{} ",
            if rows.is_empty() { 0 } else { app.cursor + 1 },
            rows.len()
        )));
    frame.render_stateful_widget(t, area, &mut state);
}

/// Where the [`PANES`] go: in a row when wide, else two by two with sessions and offers
/// on top, refusals under offers.
fn pane_places(area: Rect, wide: bool) -> [Rect; 4] {
    if wide {
        return Layout::default()
            .direction(Direction::Horizontal)
            .constraints([
                Constraint::Percentage(20),
                Constraint::Percentage(30),
                Constraint::Percentage(30),
                Constraint::Percentage(20),
            ])
            .areas(area);
    }
    let halves = |r| {
        Layout::default()
            .direction(Direction::Horizontal)
            .constraints([Constraint::Percentage(45), Constraint::Percentage(55)])
            .areas::<2>(r)
    };
    let [top, bottom] = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)])
        .areas(area);
    let ([a, b], [c, d]) = (halves(top), halves(bottom));
    [a, b, d, c]
}

/// Sessions, the fenced first.
fn sessions(app: &mut App, sum: &Summary, _now: i64, lines: usize) -> Vec<String> {
    let b = &app.board;
    let mut ss: Vec<(&String, usize)> = b
        .sessions
        .keys()
        .map(|s| (s, sum.fenced.get(s.as_str()).copied().unwrap_or(0)))
        .filter(|(s, _)| app.filter.is_empty() || s.contains(&app.filter))
        .collect();
    ss.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    ss.iter()
        .take(lines)
        .map(|(s, n)| {
            let id = b.sessions[*s]
                .agent
                .as_deref()
                .map(|a| format!(" {}", coherent_wire::control::short_id(a)))
                .unwrap_or_default();
            match n {
                0 => format!("{}{id}", q(s)),
                n => format!("{}{id} FENCED {n}", q(s)),
            }
        })
        .collect()
}

/// Open offers, then who waits on whom.
fn offers_and_waits(app: &mut App, sum: &Summary, now: i64, lines: usize) -> Vec<String> {
    let filter = &app.filter;
    let mut body: Vec<String> = sum
        .offers
        .iter()
        .filter(|(p, r)| filter.is_empty() || p.contains(filter) || r.giver.contains(filter))
        .take(lines)
        .map(|(p, r)| {
            format!(
                "offer {} by {} {}{}",
                q(p),
                q(&r.giver),
                age(now, r.created),
                r.note_head()
                    .map(|n| format!(" {}", q(n)))
                    .unwrap_or_default()
            )
        })
        .collect();
    for (giver, on, n, since) in &sum.waits {
        if body.len() >= lines {
            break;
        }
        if !filter.is_empty() && !giver.contains(filter) && !on.contains(filter) {
            continue;
        }
        body.push(format!(
            "{} waits on {} ({n} file(s)) since {}",
            q(giver),
            who(on),
            age(now, *since)
        ));
    }
    body
}

/// Refusals per minute, by session and route.
fn refusals(app: &mut App, _sum: &Summary, now: i64, lines: usize) -> Vec<String> {
    let filter = &app.filter;
    app.board
        .refusal_rates(now)
        .into_iter()
        .filter(|((s, _), _, r)| {
            filter.is_empty() || s.contains(filter) || r.last_path.contains(filter)
        })
        .take(lines)
        .map(|((s, route), per_min, r)| {
            let stale = match r.last_stale.as_str() {
                "" => String::new(),
                facts => format!(" ({facts})"),
            };
            format!(
                "{} {route} {per_min}/min, {} total: {} {}{stale}",
                q(s),
                r.total,
                r.last_reason,
                q(&r.last_path)
            )
        })
        .collect()
}

/// Hosts and their lease.
fn hosts(app: &mut App, _sum: &Summary, now: i64, lines: usize) -> Vec<String> {
    let b = &app.board;
    let Some(c) = &b.coordinator else {
        return vec!["one host (no --coordinator)".to_string()];
    };
    let etcd = match (c["connected"].as_bool(), c["confirmed"].as_bool()) {
        (Some(true), Some(true)) => "connected, lease confirmed".to_string(),
        (_, Some(true)) => "unreachable, lease confirmed".to_string(),
        _ => format!(
            "lease NOT confirmed ({})",
            plain(c["error"].as_str().unwrap_or("?"))
        ),
    };
    let mut v = vec![format!("etcd: {etcd}")];
    for (name, h) in b.hosts.iter().take(lines.saturating_sub(1)) {
        let mut line = q(name);
        if h.this {
            line.push_str(" (this)");
        }
        line.push_str(if h.leased { " leased" } else { " no lease" });
        if let Some(a) = h.applied {
            line.push_str(&format!(" rev {a}"));
        }
        if let Some(t) = h.last_event {
            line.push_str(&format!(" last event {}", age(now, t)));
        }
        v.push(line);
    }
    v
}

/// The bottom line: what is being typed or confirmed, else the last message or the keys.
fn footer(app: &App) -> String {
    match &app.mode {
        Mode::Filter => format!("/{}  (Enter keeps it, Esc clears)", plain(&app.filter)),
        Mode::Confirm(action, path) => {
            format!("{} {}? y/n", action.verb().as_str(), q(path))
        }
        Mode::Normal if !app.message.is_empty() => app.message.clone(),
        Mode::Normal => {
            "up/down move  / filter  w withdraw  a accept  d decline  r reload  q quit".to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_forge_a_line_or_steer_the_terminal() {
        let evil = "a\nb\u{1b}[2J\u{2028}\u{202e}c";
        for shown in [q(evil), plain(evil)] {
            assert!(
                !shown.chars().any(coherent_wire::names::is_unsafe_char),
                "{shown:?}"
            );
        }
        assert_eq!(q("plan.md"), "plan.md");
    }

    #[test]
    fn ages_read_short() {
        assert_eq!(age(61_000, 0), "1m");
        assert_eq!(age(5_000, 0), "5s");
        assert_eq!(age(0, 5_000), "0s");
    }
}
