//! One fence across hosts (docs/design.md#hosts): two `coherent-mount` daemons, each with its own
//! mount point and state directory over one backing directory (two hosts sharing a
//! workspace), against a real etcd started by `scripts/etcd.sh`.

use crate::coherent;
use crate::common;

use coherent::*;
use common::etcd::Etcd;
use common::hosts::Daemon;
use common::netns::Net;
use common::{wait_until, BIN};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// One host: a daemon on its own mount point and state directory.
struct Host {
    name: String,
    mnt: PathBuf,
    state: PathBuf,
    backing: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// The network namespace it runs in (None: the test's own).
    ns: Option<String>,
    daemon: Option<Daemon>,
}

impl Host {
    fn start(base: &Path, backing: &Path, name: &str, url: &str, ttl: &str) -> Host {
        Host::start_env(base, backing, name, url, ttl, &[])
    }

    /// `env`: extra environment of the daemon (e.g. `COHERENT_APPLY_DELAY_MS`, a host
    /// that takes in the others' changes late).
    fn start_env(
        base: &Path,
        backing: &Path,
        name: &str,
        url: &str,
        ttl: &str,
        env: &[(&str, &str)],
    ) -> Host {
        Host::start_in(base, backing, name, url, ttl, env, None)
    }

    /// [`Host::start_env`] in network namespace `ns` (None: the test's own).
    fn start_in(
        base: &Path,
        backing: &Path,
        name: &str,
        url: &str,
        ttl: &str,
        env: &[(&str, &str)],
        ns: Option<String>,
    ) -> Host {
        let mnt = base.join(format!("mnt-{name}"));
        let state = base.join(format!("state-{name}"));
        for d in [&mnt, &state] {
            std::fs::create_dir_all(d).unwrap();
        }
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let args = vec![
            "--coordinator".to_string(),
            url.to_string(),
            "--host-id".to_string(),
            name.to_string(),
            "--coordinator-ttl".to_string(),
            ttl.to_string(),
        ];
        let mut h = Host {
            name: name.to_string(),
            log: base.join(format!("daemon-{name}.log")),
            mnt,
            state,
            backing: backing.to_path_buf(),
            args,
            env,
            ns,
            daemon: None,
        };
        h.spawn();
        h
    }

    fn spawn(&mut self) {
        let mut cmd = match &self.ns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg("--").arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        cmd.arg(&self.backing)
            .arg(&self.mnt)
            .arg("--state-dir")
            .arg(&self.state)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        self.daemon = Some(Daemon::spawn(cmd, &self.mnt, &self.log));
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `kill -9` the daemon (its mount is left dead: unmounted lazily).
    fn kill9(&mut self) {
        self.daemon.as_mut().expect("a daemon").kill9();
    }
}

impl Root for Host {
    fn root(&self) -> &Path {
        &self.mnt
    }
}

/// Two hosts over one backing directory, one etcd. Dropped in order: hosts, then etcd.
/// Dropped in order: hosts, etcd, namespaces.
struct Pair {
    a: Host,
    b: Host,
    etcd: Etcd,
    _net: Option<Net>,
    _dir: tempfile::TempDir,
}

impl Pair {
    fn new(members: usize, ttl: &str) -> Pair {
        Pair::with_b_env(members, ttl, &[])
    }

    /// Host B started with extra environment.
    fn with_b_env(members: usize, ttl: &str, b_env: &[(&str, &str)]) -> Pair {
        let etcd = Etcd::start(members);
        let dir = tempfile::Builder::new()
            .prefix("coherent-mh-")
            .tempdir()
            .unwrap();
        let base = dir.path().canonicalize().unwrap();
        let backing = base.join("backing");
        std::fs::create_dir(&backing).unwrap();
        for f in ["plan.md", "notes.md", "other.md"] {
            std::fs::write(backing.join(f), format!("{f}\n")).unwrap();
        }
        let a = Host::start(&base, &backing, "A", etcd.url(), ttl);
        let b = Host::start_env(&base, &backing, "B", etcd.url(), ttl, b_env);
        Pair {
            a,
            b,
            etcd,
            _net: None,
            _dir: dir,
        }
    }

    /// Two hosts of one directory, each in a network namespace of its own that reaches
    /// etcd over its own link, as two machines sharing a network filesystem would.
    fn apart(members: usize, ttl: &str) -> Pair {
        let net = Net::new(&["a", "b"]);
        let etcd = Etcd::start_listening(members, &net.etcd_ip);
        let url = etcd.url_via(&net.etcd_ip);
        let dir = tempfile::Builder::new()
            .prefix("coherent-mh-")
            .tempdir()
            .unwrap();
        let base = dir.path().canonicalize().unwrap();
        let backing = base.join("backing");
        std::fs::create_dir(&backing).unwrap();
        let start = |name: &str, k: usize| {
            let ns = Some(net.links[k].ns.clone());
            Host::start_in(&base, &backing, name, &url, ttl, &[], ns)
        };
        let (a, b) = (start("A", 0), start("B", 1));
        Pair {
            a,
            b,
            etcd,
            _net: Some(net),
            _dir: dir,
        }
    }
}

/// `who` writes `rel` on host `h` (an append through the shell).
fn write(h: &Host, who: Option<&str>, rel: &str) -> Run {
    sh(
        h,
        who,
        &format!("echo {} >> {rel}", who.unwrap_or("someone")),
    )
}

/// The reason of the last `denied` event of `who` on `path` in `h`'s log.
fn denied_reason(h: &Host, who: &str, path: &str) -> Option<String> {
    events_of(h, "denied", path, Some(who))
        .last()
        .and_then(|e| e["reason"].as_str().map(str::to_string))
}

/// alice reads `path` on `h` (a hold on the current version) and hands it to bob.
fn hand_on(h: &Host, path: &str) -> Value {
    sh_ok(h, Some("alice"), &format!("cat {path} >/dev/null"));
    transfer(h, "alice", "bob", &[path])
}

#[test]
fn a_transfer_on_one_host_fences_the_giver_on_the_other_before_it_returns() {
    // B takes in every change 300 ms late: the transfer must wait for it.
    let p = Pair::with_b_env(1, "5s", &[("COHERENT_APPLY_DELAY_MS", "300")]);
    touch_session(&p.b, "bob");
    hand_on(&p.a, "plan.md");
    // The very next write of the giver, on the other host: refused.
    let r = write(&p.b, Some("alice"), "plan.md");
    assert!(
        r.denied(),
        "giver on B after the transfer on A: {}",
        r.show()
    );
    assert_eq!(
        denied_reason(&p.b, "alice", "plan.md").as_deref(),
        Some("fenced")
    );
    if let Some(bad) = check_deny_text(&why(&p.b, Some("alice")), "plan.md", "bob", 1) {
        panic!("B's why: {bad}");
    }
    // Both hosts show the same record.
    for h in [&p.a, &p.b] {
        let rec = live_record(h, "plan.md").unwrap_or_else(|| panic!("{}: no record", h.name));
        assert_eq!(rec["giver"], "alice");
        assert_eq!(rec["successor"], "bob");
        assert_eq!(rec["status"], "pending");
    }
    // The successor writes on B; A shows the record completed; both agree on the version.
    sh_ok(
        &p.b,
        Some("bob"),
        "cat plan.md >/dev/null; echo bob >> plan.md",
    );
    let rec = record(&p.a, "plan.md").expect("A's record");
    assert_eq!(rec["status"], "completed", "A: {rec}");
    assert_eq!(rec["live"], false);
    let (va, vb) = (version(&p.a, "plan.md"), version(&p.b, "plan.md"));
    assert_eq!(va, Some(2), "A's version");
    assert_eq!(vb, Some(2), "B's version");
    // A's log shows B's events, named by host.
    let done = await_events(&p.a, "completed", "plan.md", Some("bob"), 1);
    assert_eq!(done.len(), 1, "A's log lacks B's completed event");
    assert_eq!(done[0]["host"], "B");
    let t = events_of(&p.b, "transfer", "plan.md", Some("alice"));
    assert_eq!(t.len(), 1, "B's log lacks A's transfer");
    assert_eq!(t[0]["host"], "A");
    // The fence lifted on both hosts. On A alice still has her pre-handoff view: a late
    // giver, refused `stale_view` until she reads bob's version; on B she never read it
    // (a blind write).
    assert!(write(&p.a, Some("alice"), "plan.md").denied());
    assert_eq!(
        denied_reason(&p.a, "alice", "plan.md").as_deref(),
        Some("stale_view")
    );
    let read_then_write = "cat plan.md >/dev/null && echo alice >> plan.md";
    assert!(sh(&p.a, Some("alice"), read_then_write).ok());
    assert!(write(&p.b, Some("alice"), "plan.md").ok());
}

#[test]
fn an_overtake_on_one_host_is_seen_on_the_other() {
    let p = Pair::new(1, "5s");
    touch_session(&p.b, "bob");
    hand_on(&p.a, "notes.md");
    let r = write(&p.b, Some("carol"), "notes.md");
    assert!(r.ok(), "a bystander is never blocked: {}", r.show());
    let rec = record(&p.a, "notes.md").expect("A's record");
    assert_eq!(rec["status"], "overtaken", "A: {rec}");
    assert_eq!(rec["counterparty"], "carol");
    assert_eq!(version(&p.a, "notes.md"), version(&p.b, "notes.md"));
    assert_eq!(version(&p.a, "notes.md"), Some(2));
}

#[test]
fn sessions_belong_to_one_uid_on_every_host() {
    let p = Pair::new(1, "5s");
    touch_session(&p.a, "alice");
    // The name is alice's owner's (root here) on B as well: B knows her without a sight.
    let names = session_names(&p.b);
    assert!(
        names.iter().any(|n| n == "alice"),
        "B's sessions: {names:?}\nA:\n{}\nB:\n{}",
        p.a.log(),
        p.b.log()
    );
    // bob is known only on B, yet A can hand a file to him.
    touch_session(&p.b, "bob");
    hand_on(&p.a, "other.md");
}

#[test]
fn a_giver_with_the_file_open_on_the_other_host_is_in_flight() {
    let p = Pair::new(1, "5s");
    touch_session(&p.b, "bob");
    sh_ok(&p.a, Some("alice"), "cat plan.md >/dev/null");
    let mut open = hold_open(&p.b, Some("alice"), "plan.md", true).expect("open on B");
    let (errno, reply) = ctl(&p.a, Some("alice"), "transfer plan.md --to bob");
    assert_eq!(reply["reason"], "handoff_in_flight", "{reply}");
    assert_eq!(errno, libc::EBUSY);
    assert!(live_record(&p.a, "plan.md").is_none(), "undone on A");
    assert!(live_record(&p.b, "plan.md").is_none(), "undone on B");
    // Closed there, the same transfer goes through (not `handoff_ended`).
    open.close();
    open.exit();
    sh_ok(&p.a, Some("alice"), "cat plan.md >/dev/null");
    transfer(&p.a, "alice", "bob", &["plan.md"]);
    assert!(write(&p.b, Some("alice"), "plan.md").denied());
}

#[test]
fn kill_9_of_one_daemon_leaves_the_fences_of_the_other() {
    let mut p = Pair::new(1, "3s");
    touch_session(&p.b, "bob");
    hand_on(&p.a, "plan.md");
    p.a.kill9();
    let r = write(&p.b, Some("alice"), "plan.md");
    assert!(r.denied(), "giver on B after A died: {}", r.show());
    // B goes on: a new transfer answers once A's lease has ended.
    sh_ok(&p.b, Some("alice"), "cat notes.md >/dev/null");
    transfer(&p.b, "alice", "bob", &["notes.md"]);
    assert!(write(&p.b, Some("alice"), "notes.md").denied());
    // A comes back and takes the shared state in: both fences hold there.
    p.a.spawn();
    for f in ["plan.md", "notes.md"] {
        let r = write(&p.a, Some("alice"), f);
        assert!(
            r.denied(),
            "giver on A after its restart, {f}: {}",
            r.show()
        );
    }
    assert_eq!(
        live_record(&p.a, "notes.md").expect("A knows B's record")["successor"],
        "bob"
    );
}

#[test]
fn with_etcd_stopped_verbs_fail_fences_hold_and_only_unattributed_processes_write() {
    // A long lease: this test is about the time before it ends.
    let p = Pair::new(1, "60s");
    touch_session(&p.b, "bob");
    // Known before etcd goes (a new name needs etcd to be claimed).
    touch_session(&p.a, "carol");
    hand_on(&p.a, "plan.md");
    p.etcd.stop();
    // Verbs: coordinator_unavailable, exit 2, EIO on ctl.
    let (code, v) = cli_json(&p.b, Some("bob"), &["accept", "plan.md"]);
    assert_eq!(code, Some(2), "{v}");
    assert_eq!(v["reason"], "coordinator_unavailable", "{v}");
    sh_ok(&p.a, Some("alice"), "cat notes.md >/dev/null");
    let (errno, reply) = ctl(&p.a, Some("alice"), "transfer notes.md --to bob");
    assert_eq!(reply["reason"], "coordinator_unavailable", "{reply}");
    assert_eq!(errno, libc::EIO);
    // The fence holds on both hosts.
    for h in [&p.a, &p.b] {
        assert!(
            write(h, Some("alice"), "plan.md").denied(),
            "giver on {}",
            h.name
        );
        assert_eq!(
            denied_reason(h, "alice", "plan.md").as_deref(),
            Some("fenced")
        );
    }
    // A write to the handed file is refused (the host's lease went with its link), and
    // why says so.
    let r = write(&p.b, Some("bob"), "plan.md");
    assert!(r.denied(), "successor while etcd is away: {}", r.show());
    assert_eq!(
        denied_reason(&p.b, "bob", "plan.md").as_deref(),
        Some("coordinator_unavailable")
    );
    assert!(
        why(&p.b, Some("bob")).contains("lost its lease"),
        "{}",
        why(&p.b, Some("bob"))
    );
    // A host whose link failed cannot show its lease: agent writes to other files wait
    // too (however long the lease had to run); unattributed processes write.
    for h in [&p.a, &p.b] {
        let r = write(h, Some("carol"), "other.md");
        assert!(r.denied(), "bystander on {}: {}", h.name, r.show());
        assert_eq!(
            denied_reason(h, "carol", "other.md").as_deref(),
            Some("coordinator_unavailable")
        );
        assert!(write(h, None, "new-file.txt").ok());
    }
    // etcd back: the hosts catch up by themselves and verbs work.
    p.etcd.restart();
    let mut last = (None, Value::Null);
    let back = wait_until(Duration::from_secs(30), || {
        last = cli_json(&p.b, Some("bob"), &["accept", "plan.md"]);
        last.0 == Some(0)
    });
    assert!(back, "accept after etcd came back: {:?}", last);
    // A learns of the accept from its watch, after B has answered.
    let seen = wait_until(Duration::from_secs(10), || {
        record(&p.a, "plan.md").is_some_and(|r| r["status"] == "completed")
    });
    assert!(seen, "A: {:?}", record(&p.a, "plan.md"));
    assert!(write(&p.b, Some("bob"), "plan.md").ok());
    let same = wait_until(Duration::from_secs(10), || {
        version(&p.a, "plan.md") == version(&p.b, "plan.md")
    });
    assert!(
        same,
        "{:?} {:?}",
        version(&p.a, "plan.md"),
        version(&p.b, "plan.md")
    );
}

/// Issue 30 item 2: the moment its link to etcd fails a host forgets its lease, however
/// long the lease had to run (60 s here): agent writes wait, unattributed ones go on, and
/// `coherent status` shows no stale list of live hosts. Once etcd is back, all resumes.
#[test]
fn a_host_forgets_its_lease_the_moment_its_link_fails() {
    let p = Pair::new(1, "60s");
    touch_session(&p.b, "bob");
    hand_on(&p.a, "plan.md");
    assert!(write(&p.b, Some("bob"), "plan.md").ok());
    let agreed = version(&p.b, "plan.md").unwrap();
    let hosts = |h: &Host| {
        coordinator_status(h)["hosts"]
            .as_array()
            .map_or(0, |a| a.len())
    };
    assert_eq!(hosts(&p.b), 2, "{}", coordinator_status(&p.b));
    p.etcd.stop();
    let down = wait_until(Duration::from_secs(10), || {
        coordinator_status(&p.b)["connected"] == false
    });
    assert!(down, "B still connected with etcd stopped");
    let c = coordinator_status(&p.b);
    assert_eq!(
        c["confirmed"], false,
        "B's lease, 60 s long, once its link failed: {c}"
    );
    assert_eq!(
        (c["hosts_known"].clone(), hosts(&p.b)),
        (false.into(), 0),
        "{c}"
    );
    let text = cli(&p.b, None, &["status"]);
    assert!(
        text.out
            .contains("live hosts: unknown while cut off from etcd"),
        "{}",
        text.show()
    );
    let r = write(&p.b, Some("bob"), "plan.md");
    assert!(r.denied(), "bob while B is cut off: {}", r.show());
    assert_eq!(
        denied_reason(&p.b, "bob", "plan.md").as_deref(),
        Some("coordinator_unavailable")
    );
    assert!(write(&p.b, None, "other.md").ok(), "an unattributed write");
    p.etcd.restart();
    let back = wait_until(Duration::from_secs(30), || {
        write(&p.b, Some("bob"), "plan.md").ok()
    });
    assert!(back, "bob's writes after etcd came back:\n{}", p.b.log());
    assert_eq!(hosts(&p.b), 2, "{}", coordinator_status(&p.b));
    let now = version(&p.b, "plan.md").unwrap();
    assert!(now > agreed, "B at {now}");
    assert!(
        wait_until(Duration::from_secs(30), || version(&p.a, "plan.md")
            == Some(now)),
        "host A converges once etcd is back: A at {:?}, B at {now}",
        version(&p.a, "plan.md"),
    );
}

#[test]
fn a_host_that_lost_its_lease_refuses_agent_writes_until_it_is_back() {
    let p = Pair::new(1, "2s");
    sh_ok(&p.a, Some("carol"), "echo x >> other.md");
    p.etcd.stop();
    // Once the lease may have ended elsewhere, agent writes wait; humans still write.
    let refused = wait_until(Duration::from_secs(20), || {
        write(&p.a, Some("carol"), "other.md").denied()
    });
    assert!(refused, "carol kept writing with no lease:\n{}", p.a.log());
    assert_eq!(
        denied_reason(&p.a, "carol", "other.md").as_deref(),
        Some("coordinator_unavailable")
    );
    assert!(
        why(&p.a, Some("carol")).contains("lost its lease"),
        "{}",
        why(&p.a, Some("carol"))
    );
    assert!(
        write(&p.a, None, "other.md").ok(),
        "unattributed writes go on"
    );
    p.etcd.restart();
    let back = wait_until(Duration::from_secs(30), || {
        write(&p.a, Some("carol"), "other.md").ok()
    });
    assert!(back, "agent writes after etcd came back:\n{}", p.a.log());
}

#[test]
fn a_three_member_cluster_with_one_member_killed_keeps_working() {
    let p = Pair::new(3, "5s");
    touch_session(&p.b, "bob");
    p.etcd.kill_member(1);
    hand_on(&p.a, "plan.md");
    assert!(write(&p.b, Some("alice"), "plan.md").denied());
    sh_ok(&p.b, Some("bob"), "echo bob >> plan.md");
    assert_eq!(record(&p.a, "plan.md").unwrap()["status"], "completed");
    p.etcd.kill_member(2);
    // Two of three gone: no quorum, verbs fail; the fence of a new record cannot be made.
    sh_ok(&p.a, Some("alice"), "cat notes.md >/dev/null");
    let (code, v) = cli_json(
        &p.a,
        Some("alice"),
        &["transfer", "--to", "bob", "notes.md"],
    );
    assert_eq!(code, Some(2), "{v}");
    assert_eq!(v["reason"], "coordinator_unavailable");
    p.etcd.restart_member(1);
    let ok = wait_until(Duration::from_secs(30), || {
        cli_json(
            &p.a,
            Some("alice"),
            &["transfer", "--to", "bob", "notes.md"],
        )
        .0 == Some(0)
    });
    assert!(ok, "transfer once a quorum is back");
    assert!(write(&p.b, Some("alice"), "notes.md").denied());
}

/// A small deterministic generator (the seed is printed, and `COHERENT_SEED` replays it).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

#[test]
fn random_steps_on_two_hosts_never_admit_a_giver_after_its_transfer() {
    let seed: u64 = std::env::var("COHERENT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64);
    eprintln!("seed {seed} (COHERENT_SEED={seed} replays it)");
    let mut rng = Lcg(seed);
    // B lags behind by 200 ms: each acknowledgement must wait for it.
    let p = Pair::with_b_env(1, "5s", &[("COHERENT_APPLY_DELAY_MS", "200")]);
    let sessions = ["s0", "s1", "s2", "s3"];
    let files = ["plan.md", "notes.md", "other.md"];
    for (i, s) in sessions.iter().enumerate() {
        touch_session(if i % 2 == 0 { &p.a } else { &p.b }, s);
    }
    // The model: per file, the live handoff (giver, successor) the test was told of.
    let mut fenced: std::collections::HashMap<&str, (&str, &str)> = Default::default();
    // Handoffs (file, giver, successor) declined or withdrawn at the file's current version: an
    // exact re-send answers `handoff_ended`, before any other check (docs/design.md#handoff).
    let mut ended: std::collections::HashSet<(&str, &str, &str)> = Default::default();
    // (file, giver) whose successor wrote the file: the giver may be a late giver.
    let mut late: std::collections::HashSet<(&str, &str)> = Default::default();
    let mut admitted_after_ack = Vec::new();
    for step in 0..70 {
        let h = if rng.below(2) == 0 { &p.a } else { &p.b };
        let f = files[rng.below(files.len())];
        let who = sessions[rng.below(sessions.len())];
        let what = rng.below(10);
        let ctx = format!("step {step} (seed {seed}): {who} on {}", h.name);
        match what {
            0..=3 => {
                let r = write(h, Some(who), f);
                if r.ok() {
                    // The version moved: what ended at the old one may be sent again.
                    ended.retain(|e| e.0 != f);
                }
                match fenced.get(f) {
                    Some(&(g, _)) if g == who => {
                        if !r.denied() {
                            admitted_after_ack.push(format!("{ctx} wrote {f}: {}", r.show()));
                        }
                    }
                    // A giver whose successor wrote since, writing from its older view (on a
                    // host where it has one): a late giver, refused `stale_view`
                    // (docs/design.md#holds).
                    _ if r.denied() && late.contains(&(f, who)) => {
                        assert_eq!(
                            denied_reason(h, who, f).as_deref(),
                            Some("stale_view"),
                            "{ctx}"
                        );
                    }
                    _ => {
                        if let Some(&(g, to)) = fenced.get(f) {
                            if to == who && r.ok() {
                                late.insert((f, g));
                            }
                        }
                        assert!(
                            r.ok(),
                            "{ctx}: write {f} refused: {}; why: {}; model: {fenced:?}\n{}",
                            r.show(),
                            why(h, Some(who)),
                            h.log()
                        );
                        // A commit by anyone but the giver moves the version: fence ends.
                        fenced.remove(f);
                    }
                }
            }
            4..=6 => {
                let to = sessions[rng.below(sessions.len())];
                if to == who {
                    continue;
                }
                sh_ok(h, Some(who), &format!("cat {f} >/dev/null"));
                let mut last = (None, Value::Null);
                wait_until(SETTLE, || {
                    last = cli_json(h, Some(who), &["transfer", "--to", to, f]);
                    // A commit the other host made after the last record of the path ended
                    // is published at its next round: one that lands between the read and
                    // the transfer moves the version, and the transfer asks for a read of
                    // it (docs/multi-host.md#copies). The giver reads again, as told.
                    if last.1["reason"] == "handoff_not_held" {
                        sh_ok(h, Some(who), &format!("cat {f} >/dev/null"));
                        return false;
                    }
                    last.1["reason"] != "handoff_in_flight"
                });
                if ended.contains(&(f, who, to)) {
                    assert_eq!(last.1["reason"], "handoff_ended", "{ctx}: {}", last.1);
                    continue;
                }
                match fenced.get(f) {
                    Some(&(g, _)) if g != who => {
                        assert_eq!(
                            last.1["reason"], "handoff_other_holder",
                            "{ctx}: {}",
                            last.1
                        );
                    }
                    // The same handoff, declined or withdrawn at this version: ended.
                    None if last.1["reason"] == "handoff_ended" => {}
                    _ => {
                        assert_eq!(last.0, Some(0), "{ctx}: transfer {f} to {to}: {}", last.1);
                        fenced.insert(f, (who, to));
                        // At once on the other host (the one that lags, when it is B).
                        let other = if h.name == "A" { &p.b } else { &p.a };
                        let r = write(other, Some(who), f);
                        if !r.denied() {
                            admitted_after_ack.push(format!(
                                "{ctx}: right after the transfer, {who} wrote {f} on {}: {}",
                                other.name,
                                r.show()
                            ));
                        }
                    }
                }
            }
            7 => {
                let (code, _) = cli_json(h, Some(who), &["decline", f]);
                if code == Some(0) {
                    assert_eq!(fenced.get(f).map(|x| x.1), Some(who), "{ctx}: declined {f}");
                    if let Some((g, t)) = fenced.remove(f) {
                        ended.insert((f, g, t));
                    }
                }
            }
            8 => {
                let (code, _) = cli_json(h, Some(who), &["withdraw", f]);
                if code == Some(0) {
                    assert_eq!(fenced.get(f).map(|x| x.0), Some(who), "{ctx}: withdrew {f}");
                    if let Some((g, t)) = fenced.remove(f) {
                        ended.insert((f, g, t));
                    }
                }
            }
            _ => {
                // accept: the fence stays until the version moves.
                cli_json(h, Some(who), &["accept", f]);
            }
        }
    }
    assert!(
        admitted_after_ack.is_empty(),
        "giver writes admitted after acknowledged transfers:\n{}",
        admitted_after_ack.join("\n")
    );
}

/// A transfer event of `path` made on host `from`, as `h`'s log has it.
fn others_transfers(h: &Host, from: &str, path: &str) -> Vec<Value> {
    events_of(h, "transfer", path, Some("alice"))
        .into_iter()
        .filter(|e| e["host"] == from)
        .collect()
}

/// etcd's current revision (from the header of a read).
fn etcd_revision(etcd: &Etcd) -> i64 {
    let out = etcd.etcdctl(&["get", "--prefix", "-w", "json", "--", "/coherent/"]);
    assert!(out.status.success(), "etcdctl get: {:?}", out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["header"]["revision"].as_i64().expect("a revision")
}

/// A pair where alice handed notes.md on from A, B logged that, and B was then stopped
/// (and unmounted).
/// Two hosts, once B has logged alice's transfer of `path` to bob on A.
fn pair_after_a_transfer_on_a(path: &str) -> Pair {
    let p = Pair::new(1, "3s");
    touch_session(&p.b, "bob");
    hand_on(&p.a, path);
    assert!(
        wait_event(&p.b, Duration::from_secs(10), |e| e["event"] == "transfer"
            && e["host"] == "A")
        .is_some(),
        "B logs A's transfer while it runs"
    );
    p
}

fn pair_with_b_stopped_after_a_transfer() -> Pair {
    let mut p = pair_after_a_transfer_on_a("notes.md");
    p.b.daemon = None;
    p
}

/// A host that made a transfer and was down while another host ended the record and
/// evicted it (its key gone from etcd) does not bring it back when it restarts: its own log
/// has the transfer and never heard of the end (a seeded lag run showed one host with two
/// live records of one path that way).
#[test]
fn a_record_evicted_while_its_host_was_down_stays_gone_after_its_restart() {
    let mut p = pair_after_a_transfer_on_a("plan.md");
    p.a.daemon = None;
    // B alone: the record ends and is evicted at once.
    p.b.daemon = None;
    p.b.args
        .extend(["--evict-after".to_string(), "1s".to_string()]);
    p.b.spawn();
    verb_ok(&p.b, "alice", &["withdraw", "plan.md"]);
    assert!(
        wait_event(&p.b, Duration::from_secs(20), |e| e["event"] == "evict"
            && e["path"] == "plan.md")
        .is_some(),
        "B evicts the ended record"
    );
    p.a.spawn();
    assert_eq!(
        live_record(&p.a, "plan.md"),
        None,
        "A brought the evicted record back"
    );
    let r = write(&p.b, Some("alice"), "plan.md");
    assert!(r.ok(), "alice on B after the record ended: {}", r.show());
    let r = write(&p.a, Some("alice"), "plan.md");
    assert!(r.ok(), "alice on A after the record ended: {}", r.show());
}

#[test]
fn a_restarted_host_logs_the_other_hosts_events_it_was_away_for_once() {
    let mut p = pair_with_b_stopped_after_a_transfer();
    hand_on(&p.a, "plan.md");
    p.b.spawn();
    let got = wait_event(&p.b, Duration::from_secs(10), |e| {
        e["event"] == "transfer" && e["host"] == "A" && e["path"] == "plan.md"
    });
    let ev = got.expect("B's log has A's transfer made while B was down");
    assert!(
        ev["rev"].as_i64().is_some_and(|r| r > 0),
        "with its revision: {ev}"
    );
    // What B had logged before is not logged again, and no gap is named (none happened).
    assert_eq!(others_transfers(&p.b, "A", "notes.md").len(), 1);
    assert_eq!(others_transfers(&p.b, "A", "plan.md").len(), 1);
    assert!(events(&p.b).iter().all(|e| e["event"] != "events_missed"));
}

#[test]
fn a_host_away_past_etcds_history_names_the_gap_in_its_log() {
    let mut p = pair_with_b_stopped_after_a_transfer();
    // While B is down A hands plan.md on, and etcd's history of it is compacted away.
    hand_on(&p.a, "plan.md");
    let compacted = etcd_revision(&p.etcd);
    let out = p.etcd.etcdctl(&["compact", &compacted.to_string()]);
    assert!(out.status.success(), "etcdctl compact: {:?}", out);
    hand_on(&p.a, "other.md");
    p.b.spawn();
    // B logs what the history still has, and names what it may lack.
    assert!(
        wait_event(&p.b, Duration::from_secs(10), |e| e["event"] == "transfer"
            && e["host"] == "A"
            && e["path"] == "other.md")
        .is_some(),
        "B logs A's transfer made after the compaction"
    );
    let gap = wait_event(&p.b, Duration::from_secs(5), |e| {
        e["event"] == "events_missed"
    })
    .expect("B's log names the gap");
    let (from, to) = (
        gap["from_rev"].as_i64().unwrap(),
        gap["rev"].as_i64().unwrap(),
    );
    assert_eq!(
        to,
        compacted - 1,
        "the gap ends before the compaction: {gap}"
    );
    assert!(from <= to, "{gap}");
    assert!(gap["note"].as_str().unwrap().contains("compacted"), "{gap}");
    assert!(others_transfers(&p.b, "A", "plan.md").is_empty());
    // The state is whole all the same: the giver is fenced on B.
    assert!(write(&p.b, Some("alice"), "plan.md").denied());
    // A second stay away, with no compaction: what A did meanwhile is logged, and no
    // second gap is named.
    p.b.daemon = None;
    std::fs::write(p.a.backing.join("last.md"), "last\n").unwrap();
    hand_on(&p.a, "last.md");
    p.b.spawn();
    assert!(wait_until(Duration::from_secs(10), || {
        others_transfers(&p.b, "A", "last.md").len() == 1
    }));
    assert_eq!(
        events(&p.b)
            .iter()
            .filter(|e| e["event"] == "events_missed")
            .count(),
        1
    );
}

/// alice hands `plan.md` on through A and bob's first write through B completes the
/// record: the version it made.
fn completed_by_bob(p: &Pair) -> u64 {
    touch_session(&p.b, "bob");
    hand_on(&p.a, "plan.md");
    assert!(write(&p.b, Some("bob"), "plan.md").ok());
    version(&p.b, "plan.md").unwrap()
}

/// Waits until A shows `plan.md` at `v`; fails naming both hosts' versions.
fn a_reaches(p: &Pair, v: u64) {
    assert!(
        wait_until(Duration::from_secs(10), || version(&p.a, "plan.md")
            == Some(v)),
        "A at {:?}, B at {:?}, {v} expected",
        version(&p.a, "plan.md"),
        version(&p.b, "plan.md")
    );
}

#[test]
fn commits_counted_on_one_host_and_seen_first_on_the_others_copy_keep_their_count() {
    // B publishes what it counted alone a second late; A looks at the one backing
    // directory meanwhile and finds bob's appends there as a change behind its back.
    let p = Pair::with_b_env(1, "60s", &[("COHERENT_PUBLISH_DELAY_MS", "1000")]);
    let done = completed_by_bob(&p);
    a_reaches(&p, done);
    sh_ok(
        &p.b,
        Some("bob"),
        "for i in $(seq 5); do echo $i >> plan.md; done",
    );
    assert_eq!(version(&p.b, "plan.md"), Some(done + 5));
    sh_ok(&p.a, None, "cat plan.md >/dev/null");
    assert_eq!(
        version(&p.a, "plan.md"),
        Some(done + 1),
        "A counted one change behind its back"
    );
    assert!(
        !events_of(&p.a, "external_change", "plan.md", None).is_empty(),
        "{:?}",
        events(&p.a)
    );
    // B's count of five stands on both hosts, and bob's view of it is still whole.
    a_reaches(&p, done + 5);
    assert_eq!(version(&p.b, "plan.md"), Some(done + 5));
    assert!(write(&p.b, Some("bob"), "plan.md").ok());
    assert_eq!(version(&p.b, "plan.md"), Some(done + 6));
}

#[test]
fn a_host_slow_to_take_in_watched_state_never_goes_back_on_its_own_commits() {
    // B's watch thread takes each state in 50 ms after deciding to: its own publications
    // of bob's commits (every 50 ms) come back through it while bob commits on.
    let p = Pair::with_b_env(1, "60s", &[("COHERENT_ADOPT_DELAY_MS", "50")]);
    let done = completed_by_bob(&p);
    sh_ok(
        &p.b,
        Some("bob"),
        "for i in $(seq 40); do echo $i >> plan.md; sleep 0.01; done",
    );
    assert_eq!(version(&p.b, "plan.md"), Some(done + 40));
    a_reaches(&p, done + 40);
    assert_eq!(version(&p.b, "plan.md"), Some(done + 40));
}

/// The coordinator part of `h`'s status.
fn coordinator_status(h: &Host) -> Value {
    let (_, v) = ctl(h, None, "status");
    v["status"]["coordinator"].clone()
}

#[test]
fn the_successors_commits_after_completing_are_counted_on_its_host_and_published_later() {
    let p = Pair::new(1, "60s");
    touch_session(&p.b, "bob");
    hand_on(&p.a, "plan.md");
    // bob's first write ends the record: a step the hosts agree on.
    assert!(write(&p.b, Some("bob"), "plan.md").ok());
    let done = version(&p.b, "plan.md").unwrap();
    let before = coordinator_status(&p.b)["steps"].clone();
    assert!(before["agreed"].as_u64().unwrap() >= 1, "{before}");
    // Twenty more appends by bob: no fence hangs on them, so none is a step of its own.
    sh_ok(
        &p.b,
        Some("bob"),
        "for i in $(seq 20); do echo $i >> plan.md; done",
    );
    assert_eq!(version(&p.b, "plan.md"), Some(done + 20));
    let after = coordinator_status(&p.b)["steps"].clone();
    assert_eq!(
        after["agreed"], before["agreed"],
        "no agreed step for a commit of a completed file: {before} -> {after}"
    );
    assert!(
        after["local"].as_u64().unwrap() >= before["local"].as_u64().unwrap() + 40,
        "each open and commit decided on B: {before} -> {after}"
    );
    // Host A gets the version all the same, and the fence of the next transfer is exact.
    a_reaches(&p, done + 20);
    assert_eq!(version(&p.b, "plan.md"), Some(done + 20));
    touch_session(&p.a, "carol");
    sh_ok(&p.a, Some("bob"), "cat plan.md >/dev/null");
    transfer(&p.a, "bob", "carol", &["plan.md"]);
    let r = write(&p.b, Some("bob"), "plan.md");
    assert!(r.denied(), "bob fenced on B after handing on: {}", r.show());
    // How etcd is reached is in the status.
    let c = coordinator_status(&p.b);
    assert_eq!(c["tls"], true, "{c}");
    assert!(
        c["user"]
            .as_str()
            .is_some_and(|u| u.starts_with("coherent-")),
        "{c}"
    );
}

/// The fence follows the inode on every host (docs/design.md#write-routes): a giver who
/// hands `plan.md` on host A cannot write it through another name of the file on host B,
/// which never looked at `plan.md` (its stamps are its own: it learns the inode from its
/// own copy, not from A).
#[test]
fn another_name_of_a_handed_file_is_fenced_on_the_other_host() {
    let p = Pair::new(1, "5s");
    std::fs::hard_link(p.a.backing.join("plan.md"), p.a.backing.join("alias.md")).unwrap();
    touch_session(&p.b, "bob");
    hand_on(&p.a, "plan.md");
    let r = write(&p.b, Some("alice"), "alias.md");
    assert!(r.denied(), "giver through another name on B: {}", r.show());
    assert_eq!(
        denied_reason(&p.b, "alice", "plan.md").as_deref(),
        Some("fenced")
    );
    assert_eq!(
        std::fs::read_to_string(p.a.backing.join("plan.md")).unwrap(),
        "plan.md\n"
    );
}

/// SQLite across two hosts of one shared directory (docs/locks.md): a writer through each
/// host's mount (one of them a session, one unattributed) and one on the directory itself,
/// at once, rollback journal: every acknowledged row is there, the database intact. Locks
/// through a mount are the backing file's; without that each host's writers ignored the
/// other's and acknowledged rows were lost.
#[test]
fn sqlite_writers_on_two_hosts_of_one_directory_lose_nothing() {
    let p = Pair::apart(1, "5s");
    let paths = [
        p.a.mnt.join("t.db"),
        p.b.mnt.join("t.db"),
        p.a.backing.join("t.db"),
    ];
    let alice: &[(&str, &str)] = &[("COHERENT_SESSION", "alice")];
    common::sqlite::sqlite_writers(&paths, &[alice, &[], &[]], "DELETE");
}
