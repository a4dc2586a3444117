//! Detaching, readiness and where the log goes.
//!
//! Ready means usable: a thread stats the mount's root (its `.coherent/` when the volume
//! enforces) through the kernel once the request loop runs, and only then is readiness
//! told: to the `--daemon` parent (which exits 0, so `coherent-mount --daemon && ls MNT`
//! and mount(8) see a working mount) and to systemd (`READY=1` on `NOTIFY_SOCKET`, for
//! `Type=notify` units). Logs go to stderr until then; a detached daemon writes them to
//! `--log-file` (default: `coherent-mount.log` in the state directory), never to nowhere.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Mutex;

use super::{fail, Fail};

/// Where the log goes: stderr (keeping the first lines when a log file will follow, so
/// the file tells the whole start), then the log file.
enum Dest {
    /// `quiet`: only warnings and errors reach stderr (a mount helper speaks only when
    /// something is wrong, like other mount helpers).
    Stderr {
        early: Option<Vec<u8>>,
        quiet: bool,
    },
    File(File),
}

/// Lines kept for the log file before it is opened, at most.
const EARLY_MAX: usize = 1 << 20;

static LOG: Mutex<Dest> = Mutex::new(Dest::Stderr {
    early: None,
    quiet: false,
});

fn log() -> std::sync::MutexGuard<'static, Dest> {
    LOG.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `tracing` writer: stderr, or the log file once the daemon has detached.
#[derive(Clone, Copy, Default)]
pub struct Sink;

impl Sink {
    /// Keep what is logged until [`Sink::to_file`], to write it there first; `quiet`:
    /// meanwhile show only warnings and errors on stderr.
    pub fn keep_early(quiet: bool) {
        *log() = Dest::Stderr {
            early: Some(Vec::new()),
            quiet,
        };
    }

    /// Sends every later line to `f` (the log file, opened by
    /// [`coherent::volume::state_dir::open_log_file`]), after the lines kept since
    /// [`Sink::keep_early`].
    pub fn to_file(mut f: File) -> std::io::Result<()> {
        let mut dest = log();
        if let Dest::Stderr {
            early: Some(early), ..
        } = &*dest
        {
            f.write_all(early)?;
        }
        *dest = Dest::File(f);
        Ok(())
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut *log() {
            Dest::File(f) => f.write(buf),
            Dest::Stderr { early, quiet } => {
                if let Some(e) = early.as_mut().filter(|e| e.len() + buf.len() <= EARLY_MAX) {
                    e.extend_from_slice(buf);
                }
                if !*quiet || is_alarm(buf) {
                    std::io::stderr().write_all(buf)?;
                }
                Ok(buf.len())
            }
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match &mut *log() {
            Dest::File(f) => f.flush(),
            Dest::Stderr { .. } => std::io::stderr().flush(),
        }
    }
}

/// A formatted line at WARN or ERROR level (the level is the word after the time stamp).
fn is_alarm(line: &[u8]) -> bool {
    let line = String::from_utf8_lossy(line);
    matches!(line.split_whitespace().nth(1), Some("WARN" | "ERROR"))
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = Sink;
    fn make_writer(&'a self) -> Sink {
        Sink
    }
}

/// Fork; the parent waits until the child reports the mount usable (exit 0) or fails
/// (exit 1: the child has printed why). Returns the write end of the readiness pipe in
/// the child.
pub fn daemonize() -> Result<OwnedFd, Fail> {
    let (r, w) = nix::unistd::pipe().map_err(|e| Fail(format!("pipe: {e}")))?;
    // SAFETY: the daemon forks during start-up, before it starts a thread of its own (the
    // one `with_progress` starts has been joined): the child's one thread holds no lock
    // another thread could have been holding at the fork.
    match unsafe { nix::unistd::fork() } {
        Err(e) => fail(format!("fork: {e}")),
        Ok(nix::unistd::ForkResult::Parent { .. }) => {
            drop(w);
            let mut f = File::from(r);
            let mut b = [0u8; 1];
            let ok = matches!(f.read(&mut b), Ok(1) if b[0] == b'R');
            std::process::exit(if ok { 0 } else { 1 });
        }
        Ok(nix::unistd::ForkResult::Child) => {
            drop(r);
            let _ = nix::unistd::setsid();
            Ok(w)
        }
    }
}

/// What to do once the mount answers.
pub struct Readiness {
    /// The path whose stat proves the request loop serves (inside the mount).
    pub probe: PathBuf,
    /// The `--daemon` parent's pipe.
    pub parent: Option<OwnedFd>,
    /// Where a detached daemon logs: the path and the file, opened before the mount.
    pub log_file: Option<(PathBuf, File)>,
}

impl Readiness {
    /// Waits (on its own thread) until the mount answers, then tells the parent and
    /// systemd, and detaches from the terminal. Failing to answer is left to the request
    /// loop's own error.
    pub fn spawn(self) -> Result<(), Fail> {
        std::thread::Builder::new()
            .name("ready".into())
            .spawn(move || self.wait())
            .map(|_| ())
            .map_err(|e| Fail(format!("thread: {e}")))
    }

    fn wait(self) {
        if let Err(e) = std::fs::metadata(&self.probe) {
            tracing::error!("the mount does not answer ({}: {e})", self.probe.display());
            return;
        }
        let mut to_file = false;
        if let Some((path, f)) = self.log_file {
            match Sink::to_file(f) {
                Ok(()) => {
                    to_file = true;
                    tracing::info!("logging to {}", path.display());
                }
                Err(e) => tracing::warn!(
                    "cannot log to {} ({e}); the log stays on stderr",
                    path.display()
                ),
            }
        }
        tracing::info!("mounted and ready: {} answers", self.probe.display());
        // systemd: READY=1 on NOTIFY_SOCKET (nothing happens without one).
        if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
            tracing::warn!("cannot tell systemd the mount is ready: {e}");
        }
        if let Some(w) = self.parent {
            let mut f = File::from(w);
            let _ = f.write_all(b"R");
            drop(f);
            // A daemon whose log has nowhere else to go keeps stderr.
            if to_file {
                detach_stdio();
            }
        }
    }
}

/// Detach stdio (after readiness, so errors before it still reach the terminal).
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
}

/// Runs `f`, the start-up step `what`; when it takes over a second, says so every second
/// until it is done, and how long it took: a mount that takes a while is never silent.
pub fn with_progress<T>(what: &str, f: impl FnOnce() -> T) -> T {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    use std::time::{Duration, Instant};
    let start = Instant::now();
    let (done, wait) = channel::<()>();
    let label = what.to_string();
    // The ticker logs where this thread logs.
    let dispatch = tracing::dispatcher::get_default(|d| d.clone());
    let ticker = std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || {
            tracing::dispatcher::with_default(&dispatch, || {
                while let Err(RecvTimeoutError::Timeout) = wait.recv_timeout(Duration::from_secs(1))
                {
                    tracing::info!("{label}: still at it ({} s)", start.elapsed().as_secs());
                }
            })
        });
    let r = f();
    drop(done);
    if let Ok(t) = ticker {
        let _ = t.join();
    }
    let took = start.elapsed();
    if took >= Duration::from_secs(1) {
        tracing::info!("{what}: done in {:.1} s", took.as_secs_f64());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A writer into a shared buffer, for reading what was logged.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(f: impl FnOnce()) -> String {
        let buf = Buf::default();
        let out = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(sub, f);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn a_slow_step_says_so_every_second_and_a_quick_one_is_quiet() {
        // The step itself is the slow thing under test: 2.3 s of work, ticks at 1 s and 2 s.
        let text = logged(|| {
            with_progress("loading the state", || {
                std::thread::sleep(std::time::Duration::from_millis(2300))
            })
        });
        // One tick a second; a loaded machine may wake the ticker late for the second.
        let ticks = text.matches("loading the state: still at it").count();
        assert!((1..=2).contains(&ticks), "{text}");
        assert!(text.contains("loading the state: done in 2."), "{text}");
        let text = logged(|| with_progress("quick", || ()));
        assert!(text.is_empty(), "{text}");
    }

    #[test]
    fn only_warnings_and_errors_are_alarms() {
        assert!(is_alarm(b"2026-12-02T03:01:33.335246Z  WARN coherent: x\n"));
        assert!(is_alarm(b"2026-12-02T03:01:33.335246Z ERROR coherent: x\n"));
        assert!(!is_alarm(
            b"2026-12-02T03:01:33.335246Z  INFO coherent: WARN x\n"
        ));
    }
}
