//! Record locks through the mount are the backing file's (docs/locks.md): they conflict
//! with locks of processes on the backing directory and through another mount of it, so
//! SQLite's writers through two mounts and one on the directory lose nothing.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use common::hosts::Daemon;
use common::sqlite::{sqlite_writers, WRITER};
use common::{Mount, BIN};

/// A process that takes and tests locks on one file as told, one command a line, and
/// answers each with one line: `ok`, `EAGAIN`/`EACCES`, or what F_GETLK found.
const LOCKER: &str = r#"
import errno, fcntl, os, struct, sys
FL = "hhxxxxqqi4x"
fd = None
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == "open":
            fd = os.open(w[1], os.O_RDWR)
        elif w[0] == "openr":
            fd = os.open(w[1], os.O_RDONLY)
        elif w[0] == "close":
            os.close(fd); fd = None
        elif w[0] == "dupclose":
            os.close(os.dup(fd))
        elif w[0] in ("lock", "rlock", "lockw", "ofd", "ofdw", "unlock", "getlk"):
            typ = {"lock": fcntl.F_WRLCK, "rlock": fcntl.F_RDLCK, "lockw": fcntl.F_WRLCK,
                   "ofd": fcntl.F_WRLCK, "ofdw": fcntl.F_WRLCK, "unlock": fcntl.F_UNLCK,
                   "getlk": fcntl.F_WRLCK}[w[0]]
            cmd = {"lock": fcntl.F_SETLK, "rlock": fcntl.F_SETLK, "lockw": fcntl.F_SETLKW,
                   "ofd": 37, "ofdw": 38, "unlock": fcntl.F_SETLK,
                   "getlk": fcntl.F_GETLK}[w[0]]
            start, length = int(w[1]), int(w[2])
            r = fcntl.fcntl(fd, cmd, struct.pack(FL, typ, 0, start, length, 0))
            if w[0] == "getlk":
                t, _, s, l, pid = struct.unpack(FL, r)
                print({fcntl.F_UNLCK: "unlocked", fcntl.F_WRLCK: "write", fcntl.F_RDLCK: "read"}[t], s, l, flush=True)
                continue
        print("ok", flush=True)
    except OSError as e:
        print(errno.errorcode[e.errno], flush=True)
"#;

struct Locker {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
}

impl Locker {
    fn open(path: &Path) -> Locker {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(LOCKER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let to = child.stdin.take().unwrap();
        let from = BufReader::new(child.stdout.take().unwrap());
        let mut l = Locker { child, to, from };
        assert_eq!(l.ask(&format!("open {}", path.display())), "ok");
        l
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.to, "{cmd}").unwrap();
        self.to.flush().unwrap();
    }

    /// The next answer; fails the test if none comes within the harness's timeout (a
    /// lock that never ends its wait).
    fn answer(&mut self) -> String {
        if self.from.buffer().is_empty() {
            let mut p = libc::pollfd {
                fd: self.from.get_ref().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = common::TIMEOUT.as_millis() as i32;
            // SAFETY: one valid pollfd.
            assert_eq!(unsafe { libc::poll(&mut p, 1, ms) }, 1, "no answer in time");
        }
        let mut s = String::new();
        self.from.read_line(&mut s).unwrap();
        s.trim().to_string()
    }

    fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.answer()
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A lock refused for a conflict: F_SETLK says EAGAIN or EACCES.
fn refused(a: &str) -> bool {
    a == "EAGAIN" || a == "EACCES"
}

fn locks_hold_against_the_backing_directory(m: &Mount) {
    std::fs::write(m.path("f"), b"0123456789").unwrap();
    let mut inside = Locker::open(&m.path("f"));
    let mut outside = Locker::open(&m.backing_path("f"));

    // A classic lock through the mount is on the backing file.
    assert_eq!(inside.ask("lock 0 4"), "ok");
    let a = outside.ask("lock 2 1");
    assert!(
        refused(&a),
        "a lock on the backing file ignored the mount's: {a}"
    );
    assert_eq!(outside.ask("getlk 0 0"), "write 0 4");
    assert_eq!(
        outside.ask("lock 4 6"),
        "ok",
        "bytes past the lock are free"
    );
    // ... and the backing directory's locks are seen through the mount.
    assert!(refused(&inside.ask("lock 5 1")));
    assert_eq!(inside.ask("getlk 4 1"), "write 4 6");

    // A close through the mount ends the process's locks (POSIX), on the backing file too.
    // (The kernel may tell the daemon after close returns: wait for it.)
    assert_eq!(inside.ask("close"), "ok");
    assert!(common::wait_until(common::TIMEOUT, || outside
        .ask("lock 0 4")
        == "ok"));
    assert_eq!(outside.ask("unlock 4 6"), "ok");

    // A waiting lock (F_SETLKW) through the mount waits for the backing file's lock and is
    // granted when it goes, while the mount keeps serving.
    assert_eq!(inside.ask(&format!("open {}", m.path("f").display())), "ok");
    inside.send("lockw 0 1");
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"0123456789");
    assert_eq!(outside.ask("unlock 0 0"), "ok");
    assert_eq!(inside.answer(), "ok", "the waiting lock was granted");
    assert!(refused(&outside.ask("lock 0 1")));
    assert_eq!(inside.ask("unlock 0 0"), "ok");

    // An open-file-description lock through the mount, the same.
    assert_eq!(inside.ask("ofd 8 2"), "ok");
    assert!(refused(&outside.ask("lock 9 1")));
    assert_eq!(outside.ask("lock 0 8"), "ok");
    assert!(refused(&inside.ask("ofd 0 1")));
    drop(inside);
    // The killed process's open file went, and its lock with it.
    assert!(common::wait_until(common::TIMEOUT, || outside
        .ask("lock 8 2")
        == "ok"));
}

/// POSIX: a process's classic locks on a file end when it closes any descriptor of it, a
/// dup's too, while the open file stays open (xfstests generic/478). Only a FLUSH tells
/// the daemon of that close; a read-only open asks for one once the file was locked
/// through the mount. The FLUSH is answered before `close` returns: no wait.
fn a_close_of_a_dup_ends_the_process_locks(m: &Mount) {
    std::fs::write(m.path("g"), b"0123456789").unwrap();
    let mut holder = Locker::open(&m.path("g"));
    let mut outside = Locker::open(&m.backing_path("g"));
    assert_eq!(holder.ask("lock 0 4"), "ok");
    assert_eq!(holder.ask("unlock 0 0"), "ok");
    assert_eq!(holder.ask("close"), "ok");
    assert_eq!(
        holder.ask(&format!("openr {}", m.path("g").display())),
        "ok"
    );
    assert_eq!(holder.ask("rlock 0 4"), "ok");
    assert!(refused(&outside.ask("lock 0 1")), "the read lock holds");
    assert_eq!(holder.ask("dupclose"), "ok");
    assert_eq!(
        outside.ask("lock 0 1"),
        "ok",
        "the read lock outlived its process's close of a descriptor of the file"
    );
}

both_modes!(
    locks_hold_against_the_backing_directory,
    a_close_of_a_dup_ends_the_process_locks
);

/// A second daemon serving `m`'s backing directory on a mount point of its own.
fn second_mount(m: &Mount, passthrough: bool) -> (tempfile::TempDir, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let (mnt, state) = (dir.path().join("mnt"), dir.path().join("state"));
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&state).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg(&m.backing).arg(&mnt).arg("--state-dir").arg(&state);
    if !passthrough {
        cmd.arg("--no-passthrough");
    }
    let d = Daemon::spawn(cmd, &mnt, &dir.path().join("daemon.log"));
    (dir, d)
}

fn sqlite_through_two_mounts_and_the_backing_directory(passthrough: bool, mode: &str) {
    let m = Mount::new(passthrough);
    let (_dir, other) = second_mount(&m, passthrough);
    let paths = [
        m.path("t.db"),
        other.mnt.join("t.db"),
        m.backing_path("t.db"),
    ];
    sqlite_writers(&paths, &[], mode);
}

#[test]
fn sqlite_rollback_journal_passthrough() {
    sqlite_through_two_mounts_and_the_backing_directory(true, "DELETE");
}

#[test]
fn sqlite_rollback_journal_daemon() {
    sqlite_through_two_mounts_and_the_backing_directory(false, "DELETE");
}

#[test]
fn sqlite_wal_passthrough() {
    sqlite_through_two_mounts_and_the_backing_directory(true, "WAL");
}

/// WAL's shared-memory index cannot be shared through the daemon's page cache (docs/locks.md):
/// through a mount whose data goes through the daemon, SQLite's WAL fails loudly at the
/// first transaction ("disk I/O error", nothing acknowledged), and the database can go
/// back to a rollback journal, which works.
#[test]
fn sqlite_wal_through_the_daemon_is_refused() {
    let m = Mount::new(false);
    let made = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('CREATE TABLE t(tag TEXT, i INT)'); c.commit()")
        .arg(m.path("t.db"))
        .status()
        .unwrap();
    assert!(made.success());
    let out = Command::new("python3")
        .arg("-c")
        .arg(WRITER)
        .arg(m.path("t.db"))
        .args(["w", "5", "WAL"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "WAL through the daemon worked: {said}"
    );
    assert_eq!(said.trim(), "0 disk I/O error");
    // What was refused lost nothing; one exclusive connection (its WAL index in its own
    // memory) can take the database back to a rollback journal, which then works.
    let back = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); \
             c.execute('PRAGMA locking_mode=EXCLUSIVE'); \
             print(c.execute('SELECT COUNT(*) FROM t').fetchone()[0], \
                   c.execute('PRAGMA journal_mode=DELETE').fetchone()[0])",
        )
        .arg(m.path("t.db"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&back.stdout).trim(), "0 delete");
    let out = Command::new("python3")
        .arg("-c")
        .arg(WRITER)
        .arg(m.path("t.db"))
        .args(["w", "5", "DELETE"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "5");
}
