//! scripts/etcd.sh and the test harness on top of it (tests/common/etcd.rs) against the
//! real etcd: one member and three, put/get, a member killed, stop and restart keeping the
//! data, the guard that never signals a process it did not start, and the error when etcd
//! is not installed.

use crate::common;

use std::process::Command;

use common::etcd::{Etcd, SCRIPT};
use common::{run_timeout, wait_until, TIMEOUT};
use std::time::Duration;

/// Is `pid` a live (not zombie) process? (Members are reparented away from us, so an
/// exited one can linger as a zombie nobody reaps.)
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(") ").next().unwrap_or("").chars().next();
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(_) => false,
    }
}

fn member_pid(e: &Etcd, k: usize) -> Option<u32> {
    std::fs::read_to_string(e.dir().join(format!("member-{k}.pid")))
        .ok()
        .map(|s| s.trim().parse().expect("pid file holds a pid"))
}

/// etcdctl (as root, over TLS) through member `k` alone.
fn member_ctl(e: &Etcd, k: usize, args: &[&str]) -> std::process::Output {
    let ep = format!("https://{}", e.member_endpoint(k));
    run_timeout(e.ctl_command_to(true, &ep).args(args), TIMEOUT)
}

/// `etcdctl endpoint health` through member `k` alone.
fn member_healthy(e: &Etcd, k: usize) -> bool {
    let o = member_ctl(e, k, &["endpoint", "health"]);
    if !o.status.success() {
        eprintln!(
            "member {k} not healthy: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    o.status.success()
}

/// Member `k` answers at once: `start`/`restart` return only once every member is up
/// (a connect, no retry: etcdctl itself would retry and hide a start that returns early).
fn assert_up(e: &Etcd, k: usize) {
    if let Err(err) = std::net::TcpStream::connect(e.member_endpoint(k)) {
        panic!("member {k} ({}) not up: {err}", e.member_endpoint(k));
    }
}

/// Member `k`'s client port is closed (nothing listens there any more).
fn assert_refused(e: &Etcd, k: usize) {
    let err = std::net::TcpStream::connect(e.member_endpoint(k)).map_err(|e| e.kind());
    assert_eq!(
        err.err(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "member {k}'s port {} is closed",
        e.member_endpoint(k)
    );
}

fn kv(k: &str, v: &str) -> (String, String) {
    (k.to_string(), v.to_string())
}

#[test]
fn one_member_put_get_prefix() {
    let e = Etcd::start(1);
    assert!(
        e.url().starts_with("etcds://127.0.0.1:")
            && e.url()
                .ends_with(&format!("/default?auth={}", e.auth_file().display())),
        "secure by default, with the auth file for the mounts: {}",
        e.url()
    );
    let port: u16 = e
        .endpoints()
        .strip_prefix("127.0.0.1:")
        .expect("127.0.0.1:PORT")
        .parse()
        .expect("one port");
    assert!(port >= 23790, "default ports start at 23790, got {port}");
    assert_eq!(
        std::fs::read_to_string(e.dir().join("endpoints"))
            .unwrap()
            .trim(),
        e.url(),
        "DIR/endpoints holds the printed line"
    );
    assert_up(&e, 1);
    let pid = member_pid(&e, 1).expect("member-1.pid");
    assert!(alive(pid), "member 1 (pid {pid}) runs");

    e.put("/coh/a", "one1");
    e.put("/coh/b", "-two words\nand a line");
    e.put("/other", "x");
    assert_eq!(
        e.get_prefix("/coh/"),
        vec![kv("/coh/a", "one1"), kv("/coh/b", "-two words\nand a line")]
    );
    assert_eq!(e.get_prefix("/none/"), vec![]);

    let dir = e.dir();
    drop(e);
    assert!(!alive(pid), "drop stops the member (pid {pid})");
    assert!(!dir.exists(), "drop removes {}", dir.display());
}

#[test]
fn three_members_survive_one_killed() {
    let e = Etcd::start(3);
    (1..=3).for_each(|k| assert_up(&e, k));
    let eps: Vec<&str> = e.endpoints().split(',').collect();
    assert_eq!(eps.len(), 3, "three endpoints in {}", e.url());
    let ports: Vec<u16> = eps
        .iter()
        .map(|ep| ep.strip_prefix("127.0.0.1:").unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        ports,
        vec![ports[0], ports[0] + 2, ports[0] + 4],
        "client ports N, N+2, N+4"
    );
    e.put("/c/before", "1");

    let pid2 = member_pid(&e, 2).expect("member-2.pid");
    e.kill_member(2);
    assert!(!alive(pid2), "member 2 (pid {pid2}) is gone after kill");
    assert!(
        !e.log(2).contains("received signal; shutting down"),
        "kill is SIGKILL, not a graceful stop: {}",
        e.log(2)
    );
    assert_refused(&e, 2);
    // Once they have elected a leader among themselves (etcdctl's login is a proposal,
    // which fails "leader changed" during the election instead of waiting it out).
    assert!(
        wait_until(TIMEOUT, || member_healthy(&e, 1) && member_healthy(&e, 3)),
        "1 and 3 keep a quorum"
    );

    // Writes and linearizable reads go on through the two left (all endpoints given).
    e.put("/c/during", "2");
    assert_eq!(
        e.get_prefix("/c/"),
        vec![kv("/c/before", "1"), kv("/c/during", "2")]
    );

    // Restarted, member 2 rejoins with its old data and catches up on what it missed.
    e.restart_member(2);
    assert_up(&e, 2);
    let pid2b = member_pid(&e, 2).expect("member-2.pid after restart");
    assert!(pid2b != pid2 && alive(pid2b), "member 2 runs again");
    let out = member_ctl(&e, 2, &["get", "--print-value-only", "/c/during"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.stdout, b"2\n",
        "member 2 alone serves the write it missed"
    );
}

#[test]
fn stop_restart_keeps_data_and_never_signals_strangers() {
    let e = Etcd::start(1);
    e.put("/k", "kept");
    let pid = member_pid(&e, 1).unwrap();
    e.stop();
    assert!(!alive(pid), "stop waits for the member (pid {pid}) to exit");
    assert!(
        e.log(1).contains("received signal; shutting down"),
        "stop is a graceful SIGTERM: {}",
        e.log(1)
    );
    assert_refused(&e, 1);

    // A stale pid file naming a process we did not start: kill and stop leave it alone,
    // and restart starts the real member anyway.
    let mut stranger = Command::new("sleep").arg("300").spawn().unwrap();
    std::fs::write(e.dir().join("member-1.pid"), stranger.id().to_string()).unwrap();
    let out = run_timeout(
        Command::new("bash")
            .arg(SCRIPT)
            .args(["kill", "--member", "1", "--dir"])
            .arg(e.dir()),
        TIMEOUT,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    e.stop();
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "etcd.sh signalled a process it did not start"
    );
    stranger.kill().unwrap();
    stranger.wait().unwrap();

    e.restart();
    assert_up(&e, 1);
    let pid2 = member_pid(&e, 1).unwrap();
    assert!(alive(pid2), "member runs again (pid {pid2})");
    assert_eq!(e.get_prefix("/k"), vec![kv("/k", "kept")], "data survives");
    let status = run_timeout(
        Command::new("bash")
            .arg(SCRIPT)
            .arg("status")
            .arg("--dir")
            .arg(e.dir()),
        TIMEOUT,
    );
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "status: {text}");
    assert!(
        text.contains(&format!("member 1: running (pid {pid2})")) && text.contains("healthy"),
        "status says member 1 runs: {text}"
    );
}

#[test]
fn missing_etcd_says_run_deps() {
    // Run the script with a PATH that has no etcd ($BASH: the running bash, by full path).
    let dir = tempfile::tempdir().unwrap();
    let out = run_timeout(
        Command::new("bash")
            .args([
                "-c",
                "PATH=/nonexistent exec \"$BASH\" \"$0\" start --dir \"$1\"",
            ])
            .arg(SCRIPT)
            .arg(dir.path().join("c")),
        TIMEOUT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("etcd not found") && err.contains("scripts/deps.sh"),
        "the error says to run scripts/deps.sh: {err}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout when start fails");
}

/// Issue 30 item 5: the script keeps no fixed names in /tmp. A local user who creates the
/// names older versions used (`/tmp/coherent-etcd.ports/` with `.lock` a symlink to a file
/// of root's, `/tmp/coherent-etcd.last` naming a directory of theirs) before root starts a
/// cluster changes nothing: the file is not truncated, and `status`/`stop` without `--dir`
/// act on root's cluster. The script's own state is a 0700 directory of root's; one made
/// first by another user is refused with a line saying what to do. Run in a private mount
/// namespace with its own /tmp, so the names are free whatever else runs on the machine.
#[test]
fn a_local_user_creating_the_scripts_names_first_changes_nothing() {
    let u1 = common::users::u1();
    let script = std::fs::canonicalize(SCRIPT).unwrap();
    let body = format!(
        r#"
set -u
# a copy outside /tmp: a checkout under /tmp is hidden by the tmpfs below
S=$(mktemp /dev/shm/coherent-etcd-sh.XXXXXX) && cp {script} "$S" || exit 89
mount -t tmpfs -o mode=1777 tmpfs /tmp || exit 90
trap 'bash $S stop >/dev/null 2>&1 || true; rm -f $S' EXIT
echo precious >/tmp/victim
runuser -u {user} -- sh -c 'mkdir /tmp/coherent-etcd.ports &&
    ln -s /tmp/victim /tmp/coherent-etcd.ports/.lock &&
    mkdir /tmp/theirs && echo /tmp/theirs >/tmp/coherent-etcd.last' || exit 91
bash $S start --insecure >/tmp/url || exit 92
echo "url=$(cat /tmp/url)"
bash $S status >/tmp/status 2>&1
echo "status=$?"
grep -q "member 1: running" /tmp/status && echo status-ours
bash $S stop && echo stopped
echo "victim=$(cat /tmp/victim)"
echo "state=$(stat -c '%U %a' /tmp/coherent-etcd-0)"
# The new name, made first by the other user: refused.
rm -rf /tmp/coherent-etcd-0
runuser -u {user} -- mkdir -m 0777 /tmp/coherent-etcd-0
bash $S start --insecure >/dev/null 2>/tmp/err
echo "refused=$? $(cat /tmp/err)"
# ... and the way out the error names works.
mkdir -m 0700 /tmp/mine
ETCD_SH_STATE=/tmp/mine bash $S start --insecure >/dev/null 2>/tmp/err
echo "override=$? $(test -s /tmp/mine/last && echo used) $(cat /tmp/err)"
ETCD_SH_STATE=/tmp/mine bash $S stop >/dev/null 2>&1
"#,
        script = script.display(),
        user = u1.name,
    );
    let out = run_timeout(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "bash", "-c", &body])
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("ETCD_SH_STATE"),
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the run failed ({:?}): {text}\n{err}",
        out.status.code()
    );
    let line = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k}= in: {text}\n{err}"))
            .to_string()
    };
    assert!(line("url").starts_with("etcd://127.0.0.1:"), "{text}");
    assert_eq!(
        line("victim"),
        "precious",
        "root's file through the symlink: {text}\n{err}"
    );
    assert_eq!(line("status"), "0", "status without --dir: {text}\n{err}");
    assert!(
        text.contains("status-ours\n") && text.contains("stopped\n"),
        "{text}\n{err}"
    );
    assert_eq!(line("state"), "root 700", "the script's state directory");
    let refused = line("refused");
    assert!(
        refused.starts_with("1 ")
            && refused.contains("belongs to another user")
            && refused.contains("ETCD_SH_STATE"),
        "a state directory made by another user: {refused}"
    );
    assert!(
        line("override").starts_with("0 used"),
        "ETCD_SH_STATE as the error says: {}",
        line("override")
    );
}

/// Port blocks are claimed in the caller's own state directory, so another user's start
/// does not see this user's claims: a port of the block chosen can be bound by someone
/// else between the check and the members' start. `start` then takes the next block (a
/// few times). In a private network namespace (only `lo`) and /tmp, ports 23791 and 23801
/// (the peer ports of the first two blocks) are bound by a process that never listens, so
/// the socket check cannot see them: the cluster comes up on the third block.
#[test]
fn start_moves_to_the_next_block_when_a_port_was_taken_meanwhile() {
    let script = std::fs::canonicalize(SCRIPT).unwrap();
    let body = format!(
        r#"
set -u
ip link set lo up || exit 90
# a copy outside /tmp: a checkout under /tmp is hidden by the tmpfs below
S=$(mktemp /dev/shm/coherent-etcd-sh.XXXXXX) && cp {script} "$S" || exit 89
mount -t tmpfs -o mode=1777 tmpfs /tmp || exit 91
python3 -c '
import socket, sys, time
held = []
for p in (23791, 23801):
    s = socket.socket()
    s.bind(("127.0.0.1", p))
    held.append(s)
print("bound", flush=True)
time.sleep(120)
' >/tmp/bound &
holder=$!
trap 'bash $S stop >/dev/null 2>&1 || true; kill $holder; rm -f $S' EXIT
for _ in $(seq 100); do grep -q bound /tmp/bound && break; sleep 0.05; done
url=$(bash $S start --insecure 2>/tmp/err) || {{ cat /tmp/err; exit 92; }}
echo "url=$url"
echo "retries=$(grep -c 'were taken meanwhile' /tmp/err)"
"#,
        script = script.display(),
    );
    let out = run_timeout(
        Command::new("unshare")
            .args([
                "--net",
                "--mount",
                "--propagation",
                "private",
                "bash",
                "-c",
                &body,
            ])
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("ETCD_SH_STATE"),
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "({:?}) {text}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("url=etcd://127.0.0.1:23810\n"), "{text}");
    assert!(text.contains("retries=2\n"), "{text}");
}
