//! `coherent top`: a live board of a volume in the terminal (docs/board.md).
//!
//! It reads the log as it is, then one `status` (sessions, records, hosts), then follows
//! the log (the same [`crate::follow`] as `coherent watch`) and redraws once per batch of
//! events: nothing else is asked of the volume, except the verbs a person confirms and a
//! `status` again when they press `r`. What it shows is what the volume lets its reader
//! see: it reads the same files with the reader's own credentials.
//!
//! Threads: one follows the log, one reads the keyboard, one runs each confirmed verb;
//! they all send to the loop that owns the board and the screen.

mod board;
mod view;

use crate::follow::{Follower, Step};
use crate::{call, human_lines, Fail};
use board::Board;
use coherent_wire::control::{Reply, Request, Verb};
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::{execute, terminal};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use std::io::{self, IsTerminal};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// How long the follower sleeps at the end of the log: the most an event waits to be seen.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(20);

/// Redraw at least this often, for the ages and the refusal rates.
const TICK: Duration = Duration::from_secs(1);

enum Msg {
    Lines(Vec<Vec<u8>>),
    Gone(String),
    Key(KeyEvent),
    Resized,
    /// A verb's outcome, as the line to show.
    Done(String),
}

/// A verb the board sends for the selected file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Action {
    Withdraw,
    Accept,
    Decline,
}

impl Action {
    pub(crate) fn verb(self) -> Verb {
        match self {
            Action::Withdraw => Verb::Withdraw,
            Action::Accept => Verb::Accept,
            Action::Decline => Verb::Decline,
        }
    }
    fn request(self, path: String) -> Request {
        let paths = vec![path];
        match self {
            Action::Withdraw => Request::Withdraw { paths },
            Action::Accept => Request::Accept { paths },
            Action::Decline => Request::Decline { paths },
        }
    }
}

pub(crate) enum Mode {
    Normal,
    /// Typing the filter.
    Filter,
    /// Waiting for y/n on a verb for a path.
    Confirm(Action, String),
}

/// The board and what the person did with it.
pub(crate) struct App {
    pub root: PathBuf,
    pub board: Board,
    pub mode: Mode,
    /// Rows whose path or sessions contain it.
    pub filter: String,
    /// The selected row's path (kept by path, so rows coming and going do not move it).
    pub selected: Option<String>,
    pub cursor: usize,
    pub offset: usize,
    pub message: String,
    quit: bool,
    /// The rows, kept until the board or the filter changes.
    rows: Option<(u64, String, std::rc::Rc<Vec<String>>)>,
    /// The summary, kept until the board changes.
    summary: Option<(u64, std::rc::Rc<board::Summary>)>,
    /// For tests: a fixed clock (ms).
    clock: Option<i64>,
}

impl App {
    pub(crate) fn new(root: &Path, board: Board) -> App {
        App {
            root: root.to_path_buf(),
            board,
            mode: Mode::Normal,
            filter: String::new(),
            selected: None,
            cursor: 0,
            offset: 0,
            message: String::new(),
            quit: false,
            rows: None,
            summary: None,
            clock: None,
        }
    }

    pub(crate) fn now(&self) -> i64 {
        self.clock
            .unwrap_or_else(|| coherent::coherence::Timestamp::now().millis())
    }

    pub(crate) fn summary(&mut self) -> std::rc::Rc<board::Summary> {
        match &self.summary {
            Some((g, s)) if *g == self.board.generation => s.clone(),
            _ => {
                let s = std::rc::Rc::new(self.board.summary());
                self.summary = Some((self.board.generation, s.clone()));
                s
            }
        }
    }

    /// The paths shown, in order: files with a live record, then with an ended one, then
    /// the rest, each by path; only those the filter matches.
    pub(crate) fn rows(&mut self) -> std::rc::Rc<Vec<String>> {
        if let Some((g, f, rows)) = &self.rows {
            if *g == self.board.generation && *f == self.filter {
                return rows.clone();
            }
        }
        let filter = self.filter.as_str();
        let mut tiers: [Vec<String>; 3] = Default::default();
        for (p, f) in &self.board.files {
            let names = f
                .live
                .iter()
                .chain(f.ended.iter())
                .flat_map(|r| [r.giver.as_str(), r.successor.as_str()])
                .chain(f.writers.iter().map(String::as_str))
                .chain(f.maker.as_deref());
            let matches =
                filter.is_empty() || p.contains(filter) || { names }.any(|n| n.contains(filter));
            if matches {
                let tier = if f.live.is_some() {
                    0
                } else if f.ended.is_some() {
                    1
                } else {
                    2
                };
                tiers[tier].push(p.clone());
            }
        }
        let [mut a, b, c] = tiers;
        a.extend(b);
        a.extend(c);
        let rows = std::rc::Rc::new(a);
        self.rows = Some((self.board.generation, self.filter.clone(), rows.clone()));
        rows
    }

    /// Places the cursor on the selected path (or the nearest row) and scrolls so it is
    /// within the `height` rows shown.
    pub(crate) fn fit(&mut self, n: usize, height: usize) {
        let rows = self.rows();
        if let Some(sel) = &self.selected {
            if let Some(i) = rows.iter().position(|p| p == sel) {
                self.cursor = i;
            }
        }
        self.cursor = self.cursor.min(n.saturating_sub(1));
        self.selected = rows.get(self.cursor).cloned();
        let height = height.max(1);
        if self.cursor < self.offset {
            self.offset = self.cursor;
        } else if self.cursor >= self.offset + height {
            self.offset = self.cursor + 1 - height;
        }
        self.offset = self.offset.min(n.saturating_sub(height.min(n)));
    }

    fn move_by(&mut self, delta: isize) {
        let rows = self.rows();
        if rows.is_empty() {
            return;
        }
        let i = (self.cursor as isize + delta).clamp(0, rows.len() as isize - 1) as usize;
        self.cursor = i;
        self.selected = Some(rows[i].clone());
    }

    /// One key; a verb to send once confirmed.
    fn key(&mut self, k: KeyEvent) -> Option<(Action, String)> {
        if k.kind != KeyEventKind::Press {
            return None;
        }
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            self.quit = true;
            return None;
        }
        match std::mem::replace(&mut self.mode, Mode::Normal) {
            Mode::Filter => {
                match k.code {
                    KeyCode::Enter => {}
                    KeyCode::Esc => self.filter.clear(),
                    KeyCode::Backspace => {
                        self.filter.pop();
                        self.mode = Mode::Filter;
                    }
                    KeyCode::Char(c) => {
                        self.filter.push(c);
                        self.mode = Mode::Filter;
                    }
                    _ => self.mode = Mode::Filter,
                }
                None
            }
            Mode::Confirm(action, path) => match k.code {
                KeyCode::Char('y') | KeyCode::Char('Y') => {
                    self.message = format!("{} {}...", action.verb().as_str(), view::q(&path));
                    Some((action, path))
                }
                _ => {
                    self.message = "cancelled".into();
                    None
                }
            },
            Mode::Normal => {
                self.message.clear();
                let page = 10;
                match k.code {
                    KeyCode::Char('q') => self.quit = true,
                    KeyCode::Esc => self.filter.clear(),
                    KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
                    KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
                    KeyCode::PageUp => self.move_by(-page),
                    KeyCode::PageDown => self.move_by(page),
                    KeyCode::Home => self.move_by(isize::MIN / 2),
                    KeyCode::End => self.move_by(isize::MAX / 2),
                    KeyCode::Char('/') => self.mode = Mode::Filter,
                    KeyCode::Char(c @ ('w' | 'a' | 'd')) => {
                        let action = match c {
                            'w' => Action::Withdraw,
                            'a' => Action::Accept,
                            _ => Action::Decline,
                        };
                        self.ask(action);
                    }
                    _ => {}
                }
                None
            }
        }
    }

    /// Asks to confirm `action` on the selected file's live record.
    fn ask(&mut self, action: Action) {
        let Some(path) = self.selected.clone() else {
            self.message = "no file selected".into();
            return;
        };
        match self.board.files.get(&path).and_then(|f| f.live.as_ref()) {
            Some(_) => self.mode = Mode::Confirm(action, path),
            None => {
                self.message = format!(
                    "{} has no live handoff record to {}",
                    view::q(&path),
                    action.verb().as_str()
                )
            }
        }
    }
}

/// The line for a verb's reply: the CLI's own words for it.
fn outcome(verb: Verb, reply: &Reply) -> String {
    if reply.is_ok() {
        view::plain(&human_lines(verb, reply, &|p: &str| p.to_string()).join(" | "))
    } else {
        let reason = reply.body()["reason"].as_str().unwrap_or("unknown");
        view::plain(&format!("refused ({reason}): {}", reply.message()))
    }
}

/// Reads `status` through ctl (it names the hosts, which `.coherent/status` does not).
fn read_status(root: &Path, board: &mut Board) -> Result<(), Fail> {
    let reply = call(root, &Request::Status { path: None })?;
    if !reply.is_ok() {
        let reason = reply.body()["reason"].as_str().unwrap_or("unknown");
        return Err(Fail::refused(reason, reply.message()));
    }
    board.apply_status(&reply.body()["status"]);
    Ok(())
}

/// Puts the terminal back as it was (also on a panic, so a bug never leaves it raw).
fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(
        io::stdout(),
        terminal::LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

pub(crate) fn run(root: &Path) -> Result<(), Fail> {
    if !io::stdout().is_terminal() || !io::stdin().is_terminal() {
        return Err(Fail::usage(
            "top draws a board in a terminal, and this is not one; for a stream of \
             events use `coherent watch`, for one look `coherent status`",
        ));
    }
    let mut log = Follower::open(root)?;
    let mut board = Board::default();
    // the log as it is first (holders, versions, refusals), then status over it: events
    // read after status may repeat what it already says, which changes nothing
    loop {
        match log.step() {
            Ok(Step::Lines(lines)) => lines.iter().for_each(|l| {
                board.apply_line(l);
            }),
            Ok(Step::AtEnd) => break,
            Err(message) => return Err(Fail::no_volume(message)),
        }
    }
    read_status(root, &mut board)?;
    let (tx, rx) = mpsc::channel();
    follow(log, tx.clone());
    keyboard(tx.clone());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        hook(info)
    }));
    terminal::enable_raw_mode()
        .map_err(|e| Fail::usage(format!("cannot use the terminal: {e}")))?;
    let _ = execute!(io::stdout(), terminal::EnterAlternateScreen);
    let result = Terminal::new(CrosstermBackend::new(io::stdout()))
        .map_err(|e| Fail::usage(format!("cannot use the terminal: {e}")))
        .and_then(|mut t| main_loop(&mut t, App::new(root, board), &rx, &tx));
    restore();
    result
}

fn main_loop(
    term: &mut Terminal<CrosstermBackend<io::Stdout>>,
    mut app: App,
    rx: &Receiver<Msg>,
    tx: &Sender<Msg>,
) -> Result<(), Fail> {
    let failed = |e: io::Error| Fail::usage(format!("cannot draw on the terminal: {e}"));
    loop {
        term.draw(|f| view::render(f, &mut app)).map_err(failed)?;
        let first = match rx.recv_timeout(TICK) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        // everything already waiting is one batch: one redraw
        for m in std::iter::once(first).chain(rx.try_iter()) {
            match m {
                Msg::Lines(lines) => lines.iter().for_each(|l| {
                    app.board.apply_line(l);
                }),
                Msg::Gone(message) => return Err(Fail { code: 0, message }),
                Msg::Key(k) if matches!(app.mode, Mode::Normal) && k.code == KeyCode::Char('r') => {
                    app.message = match read_status(&app.root, &mut app.board) {
                        Ok(()) => "status read again".into(),
                        Err(f) => view::plain(&f.message),
                    };
                }
                Msg::Key(k) => {
                    if let Some((action, path)) = app.key(k) {
                        send(&app.root, action, path, tx.clone());
                    }
                }
                Msg::Resized => term.autoresize().map_err(failed)?,
                Msg::Done(line) => app.message = line,
            }
        }
        if app.quit {
            return Ok(());
        }
    }
}

/// Sends a confirmed verb through ctl from its own thread (a multi-host verb may take a
/// while; the board goes on meanwhile).
fn send(root: &Path, action: Action, path: String, tx: Sender<Msg>) {
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        let line = match call(&root, &action.request(path)) {
            Ok(reply) => outcome(action.verb(), &reply),
            Err(f) => view::plain(&f.message),
        };
        let _ = tx.send(Msg::Done(line));
    });
}

/// Follows the log from where the first read stopped; each read up to the log's end is
/// one batch.
fn follow(mut log: Follower, tx: Sender<Msg>) {
    std::thread::spawn(move || {
        let mut batch = Vec::new();
        loop {
            let step = log.step();
            let sent = match step {
                Ok(Step::Lines(lines)) => {
                    batch.extend(lines);
                    Ok(())
                }
                Ok(Step::AtEnd) if !batch.is_empty() => {
                    tx.send(Msg::Lines(std::mem::take(&mut batch)))
                }
                Ok(Step::AtEnd) => match log.idle(FOLLOW_INTERVAL) {
                    Ok(()) => Ok(()),
                    Err(m) => {
                        let _ = tx.send(Msg::Gone(m));
                        return;
                    }
                },
                Err(m) => {
                    let _ = tx.send(Msg::Gone(m));
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
        }
    });
}

fn keyboard(tx: Sender<Msg>) {
    std::thread::spawn(move || loop {
        let m = match event::read() {
            Ok(Event::Key(k)) => Msg::Key(k),
            Ok(Event::Resize(..)) => Msg::Resized,
            Ok(_) => continue,
            Err(_) => return,
        };
        if tx.send(m).is_err() {
            return;
        }
    });
}

#[cfg(test)]
mod tests;
