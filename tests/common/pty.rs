//! A program in a real pseudo-terminal (nix's `openpty`), its screen kept by a vt100
//! parser as the bytes arrive, so a test reads what a person would see and knows when
//! the bytes that showed it came.
//!
//! ```ignore
//! #[path = "common/pty.rs"]
//! mod pty;
//! let mut t = pty::Pty::spawn(Command::new("coherent").arg("top"), 40, 160);
//! t.wait_for(Duration::from_secs(10), |s| s.contains("files")).expect("drawn");
//! t.send(b"q");
//! ```
#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

struct Screen {
    parser: vt100::Parser,
    /// When the last bytes arrived.
    at: Instant,
    /// The reader has stopped (the program closed the terminal).
    closed: bool,
}

pub struct Pty {
    child: Child,
    master: File,
    screen: Arc<(Mutex<Screen>, Condvar)>,
}

impl Pty {
    /// Starts `cmd` as the session leader of a new `rows` x `cols` terminal: stdin, stdout
    /// and stderr are the terminal, which is its controlling terminal.
    pub fn spawn(cmd: &mut Command, rows: u16, cols: u16) -> Pty {
        let size = nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None).expect("openpty");
        let slave: OwnedFd = pty.slave;
        let io = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup the terminal"));
        cmd.stdin(io(&slave)).stdout(io(&slave)).stderr(io(&slave));
        cmd.env("TERM", "xterm-256color");
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn in the terminal");
        // only the child keeps the terminal's slave side: its end is our end-of-file
        drop(slave);
        let master = File::from(pty.master);
        let screen = Arc::new((
            Mutex::new(Screen {
                parser: vt100::Parser::new(rows, cols, 0),
                at: Instant::now(),
                closed: false,
            }),
            Condvar::new(),
        ));
        let mut reader = master.try_clone().expect("dup the master");
        let shared = screen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) | Err(_) => 0,
                    Ok(n) => n,
                };
                let (lock, cond) = &*shared;
                let mut s = lock.lock().unwrap();
                if n == 0 {
                    s.closed = true;
                    cond.notify_all();
                    return;
                }
                s.parser.process(&buf[..n]);
                s.at = Instant::now();
                cond.notify_all();
            }
        });
        Pty {
            child,
            master,
            screen,
        }
    }

    /// Types `keys` into the terminal.
    pub fn send(&mut self, keys: &[u8]) {
        self.master.write_all(keys).expect("write to the terminal");
    }

    /// The screen's text now, rows separated by newlines.
    pub fn contents(&self) -> String {
        self.screen.0.lock().unwrap().parser.screen().contents()
    }

    /// Waits until the screen's text satisfies `f`: the time the bytes that made it so
    /// arrived, or None after `timeout` (or once the program closed the terminal).
    pub fn wait_for(&self, timeout: Duration, f: impl Fn(&str) -> bool) -> Option<Instant> {
        let end = Instant::now() + timeout;
        let (lock, cond) = &*self.screen;
        let mut s = lock.lock().unwrap();
        loop {
            if f(&s.parser.screen().contents()) {
                return Some(s.at);
            }
            let now = Instant::now();
            if now >= end || s.closed {
                return None;
            }
            s = cond.wait_timeout(s, end - now).unwrap().0;
        }
    }

    /// Waits for the program to exit, killing it after `timeout`.
    pub fn exit(mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return Some(st);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn master_fd(&self) -> i32 {
        self.master.as_raw_fd()
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
