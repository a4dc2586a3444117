//! SQLite writers of one database through several paths (mounts of one backing directory,
//! hosts, the directory itself): the file-lock tests (docs/locks.md).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// Inserts rows `0..N` tagged TAG, one transaction each, retrying while the database is
/// busy; prints how many commits were answered OK.
pub const WRITER: &str = r#"
import sqlite3, sys
db, tag, n, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
c = sqlite3.connect(db, timeout=120, isolation_level=None)
# Switching the mode takes the write lock; SQLite answers busy at once, without its busy
# timeout, when another connection holds a lock it would wait on: try again.
while True:
    try:
        c.execute(f"PRAGMA journal_mode={mode}")
        break
    except sqlite3.OperationalError as e:
        if "locked" not in str(e) and "busy" not in str(e):
            print(0, e)
            sys.exit(1)
acked = 0
for i in range(n):
    while True:
        try:
            c.execute("BEGIN IMMEDIATE")
            c.execute("INSERT INTO t(tag, i) VALUES (?, ?)", (tag, i))
            c.execute("COMMIT")
            acked += 1
            break
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                try:
                    c.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                continue
            print(acked, e)
            sys.exit(1)
print(acked)
"#;

pub const ROWS: usize = 150;

/// Writers of one database at once, each through its own path (mounts, the backing
/// directory last, where the table is made), `env[k]` the environment of writer `k` (a
/// session, say): every acknowledged row is there and the database is intact.
pub fn sqlite_writers(paths: &[PathBuf], env: &[&[(&str, &str)]], mode: &str) {
    let backing_db = &paths[paths.len() - 1];
    let made = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('CREATE TABLE t(tag TEXT, i INT)'); c.commit()")
        .arg(backing_db)
        .status()
        .unwrap();
    assert!(made.success());
    let writers: Vec<(String, Child)> = paths
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let tag = format!("w{k}");
            let c = Command::new("python3")
                .envs(env.get(k).copied().unwrap_or(&[]).iter().copied())
                .arg("-c")
                .arg(WRITER)
                .arg(p)
                .arg(&tag)
                .arg(ROWS.to_string())
                .arg(mode)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            (tag, c)
        })
        .collect();
    let mut acked = Vec::new();
    for (tag, c) in writers {
        let out = c.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(out.status.success(), "{mode}: writer {tag} failed: {said}");
        acked.push((tag, said.parse::<usize>().unwrap()));
    }
    let check = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
             print(c.execute('PRAGMA integrity_check').fetchone()[0]); \
             [print(t, n) for t, n in c.execute('SELECT tag, COUNT(*) FROM t GROUP BY tag ORDER BY tag')]",
        )
        .arg(backing_db)
        .output()
        .unwrap();
    let got = String::from_utf8_lossy(&check.stdout).to_string();
    let want = std::iter::once("ok".to_string())
        .chain(acked.iter().map(|(t, n)| format!("{t} {n}")))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(got.trim(), want, "{mode}: rows acknowledged vs present");
    assert!(acked.iter().all(|(_, n)| *n == ROWS));
}
