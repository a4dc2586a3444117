//! Resolution of real processes: env tags, threads, uid, exec, exit, zombies, liveness, and
//! (as root, where cgroup v2 is writable) `coherent-session-NAME` cgroups.

use coherent::identity::{
    agent_id_for_claude, agent_id_for_name, cgroup2_mount, join_session_cgroup,
    remove_session_cgroup, ProcStamp, ResolveError, Resolver, ResolverConfig, StatFile, Via,
    CLAUDE_VAR,
};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed and reaped when dropped, so no test leaves one behind.
struct Kid(Child);

impl Kid {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `spawn` returns once the child is inside `execve` (vfork semantics), possibly before
/// the kernel has set up its new environment block: until then `/proc/PID/environ` reads
/// empty. Wait for the exec to finish (the environment block has an address).
fn exec_done(pid: u32) {
    wait_for("exec to finish", || {
        coherent::identity::procfs::read_stat(pid).is_ok_and(|s| s.stamp.env_end != 0)
    });
}

/// Spawn and wait for the exec to finish.
fn spawn(c: &mut Command) -> Kid {
    let kid = Kid(c.spawn().expect("spawn"));
    exec_done(kid.pid());
    kid
}

/// A command with a clean environment (the test itself may run inside a session).
fn clean(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    c
}

/// `sleep` with the given environment tags.
fn sleeper(env: &[(&str, &str)]) -> Kid {
    let mut c = clean("sleep");
    c.arg("600").envs(env.iter().copied());
    spawn(&mut c)
}

fn python() -> &'static str {
    if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// A Python process with `threads` extra threads, once they all run, and their tids
/// (not the leader's).
fn threaded_python(env: &[(&str, &str)], threads: usize) -> (Kid, Vec<u32>) {
    let script = format!(
        "import threading,time\n\
ev=threading.Event()\n\
for _ in range({threads}): threading.Thread(target=ev.wait,daemon=True).start()\n\
print('ready',flush=True)\n\
time.sleep(600)\n"
    );
    let mut c = clean(python());
    c.args(["-c", &script])
        .envs(env.iter().copied())
        .stdout(Stdio::piped());
    let mut kid = spawn(&mut c);
    let mut line = String::new();
    BufReader::new(kid.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = kid.pid();
    let tids = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|d| d.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .filter(|&t| t != pid)
        .collect();
    (kid, tids)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn start_time(pid: u32) -> u64 {
    coherent::identity::procfs::read_stat(pid)
        .unwrap()
        .stamp
        .start_time
}

#[test]
fn coherent_session_tag() {
    let r = Resolver::default();
    let kid = sleeper(&[("COHERENT_SESSION", "alice")]);
    let s = r.resolve(kid.pid()).unwrap();
    assert_eq!(s.name, "alice");
    assert_eq!(s.agent_id, agent_id_for_name("alice"));
    assert_eq!(
        s.agent_id.to_string(),
        "27a468b0-7fa2-5c0d-a2ba-2dac753b2070"
    );
    assert_eq!(
        s.via,
        Via::Env {
            var: "COHERENT_SESSION".into()
        }
    );
    assert!(s.is_attributed());
    assert!(r.directory().by_name("alice").is_some());
}

#[test]
fn claude_session_id_uses_the_claude_agent_id() {
    let r = Resolver::default();
    let kid = sleeper(&[(CLAUDE_VAR, "abc")]);
    let s = r.resolve(kid.pid()).unwrap();
    assert_eq!(s.name, "abc");
    assert_eq!(
        s.agent_id.to_string(),
        "54c1e55e-b8fa-534a-93fc-0c4393bd8424"
    );
    assert_eq!(s.agent_id, agent_id_for_claude("abc"));
    assert_eq!(s.short_id(), "54c1e55e");
}

#[test]
fn tag_order_empty_and_invalid_values() {
    let r = Resolver::default();
    // COHERENT_SESSION comes first in the default order, whatever the environ order.
    let both = sleeper(&[(CLAUDE_VAR, "abc"), ("COHERENT_SESSION", "bob")]);
    assert_eq!(r.resolve(both.pid()).unwrap().name, "bob");
    // An empty value does not count.
    let empty = sleeper(&[("COHERENT_SESSION", ""), (CLAUDE_VAR, "abc")]);
    let s = r.resolve(empty.pid()).unwrap();
    assert_eq!(
        (s.name.as_str(), s.agent_id),
        ("abc", agent_id_for_claude("abc"))
    );
    // An invalid value is ignored as if absent: the next tag decides...
    let bad = sleeper(&[("COHERENT_SESSION", "a/b c"), (CLAUDE_VAR, "abc")]);
    assert_eq!(r.resolve(bad.pid()).unwrap().name, "abc");
    // ...or nothing does, and a tag cannot pose as an unattributed session.
    for value in ["bad\nname", "uid:0", &"x".repeat(129)] {
        let kid = sleeper(&[("COHERENT_SESSION", value)]);
        let s = r.resolve(kid.pid()).unwrap();
        assert_eq!(s.via, Via::Uid, "{value:?}");
        assert!(!s.is_attributed());
    }
    let longest = "x".repeat(128);
    let kid = sleeper(&[("COHERENT_SESSION", &longest)]);
    assert_eq!(r.resolve(kid.pid()).unwrap().name, longest);
}

#[test]
fn configured_list_replaces_the_default() {
    let r = Resolver::new(ResolverConfig {
        env_vars: vec!["MY_AGENT".into(), CLAUDE_VAR.into()],
        ..ResolverConfig::default()
    });
    let kid = sleeper(&[("COHERENT_SESSION", "x"), ("MY_AGENT", "y")]);
    let s = r.resolve(kid.pid()).unwrap();
    assert_eq!(s.name, "y");
    assert_eq!(
        s.via,
        Via::Env {
            var: "MY_AGENT".into()
        }
    );
    let only_default = sleeper(&[("COHERENT_SESSION", "x")]);
    assert_eq!(r.resolve(only_default.pid()).unwrap().via, Via::Uid);
    let claude = sleeper(&[(CLAUDE_VAR, "abc")]);
    assert_eq!(
        r.resolve(claude.pid()).unwrap().agent_id,
        agent_id_for_claude("abc")
    );
}

#[test]
fn untagged_process_is_unattributed_by_effective_uid() {
    let r = Resolver::default();
    let kid = sleeper(&[]);
    let s = r.resolve(kid.pid()).unwrap();
    let euid = unsafe { libc::geteuid() };
    assert_eq!(s.name, format!("uid:{euid}"));
    assert_eq!(s.via, Via::Uid);
    if euid == 0 {
        let mut c = clean("sleep");
        c.arg("600").uid(65534).gid(65534);
        let nobody = spawn(&mut c);
        assert_eq!(r.resolve(nobody.pid()).unwrap().name, "uid:65534");
        // A tagged process of another user is attributed all the same.
        let mut c = clean("sleep");
        c.arg("600")
            .uid(65534)
            .gid(65534)
            .env("COHERENT_SESSION", "nob");
        let tagged = spawn(&mut c);
        assert_eq!(r.resolve(tagged.pid()).unwrap().name, "nob");
    } else {
        cannot_run(
            "untagged_process_is_unattributed_by_effective_uid (its other-uid part)",
            "not root",
        );
    }
}

#[test]
fn non_leader_thread_ids_resolve() {
    let r = Resolver::default();
    let (kid, tids) = threaded_python(&[("COHERENT_SESSION", "threaded")], 3);
    let pid = kid.pid();
    assert!(tids.len() >= 3, "threads: {tids:?}");
    // Not listed in /proc, yet /proc/TID works.
    let listed: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(listed.contains(&pid.to_string()));
    assert!(!listed.contains(&tids[0].to_string()));
    assert_eq!(r.resolve(pid).unwrap().name, "threaded");
    for &tid in &tids {
        let s = r.resolve(tid).unwrap();
        assert_eq!(s.name, "threaded", "tid {tid}");
    }
    // Every thread is its own cache entry, sharing one session Arc.
    let a = r.resolve(tids[0]).unwrap();
    let b = r.resolve(tids[1]).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    assert!(r.session_alive_cached("threaded"));
    assert!(r.session_alive("threaded"));
}

#[test]
fn warm_lookups_hit_the_cache() {
    let r = Resolver::default();
    let kid = sleeper(&[("COHERENT_SESSION", "warm")]);
    let first = r.resolve(kid.pid()).unwrap();
    let st = r.stats();
    assert_eq!((st.hits, st.misses, st.len), (0, 1, 1));
    for _ in 0..10 {
        let again = r.resolve(kid.pid()).unwrap();
        assert!(std::sync::Arc::ptr_eq(&first, &again));
    }
    let st = r.stats();
    assert_eq!((st.hits, st.misses, st.len), (10, 1, 1));
}

#[test]
fn another_start_time_for_the_same_pid_misses() {
    // What a recycled pid looks like to the cache: same tid, another start time.
    let r = Resolver::default();
    let kid = sleeper(&[("COHERENT_SESSION", "first")]);
    let pid = kid.pid();
    let real = coherent::identity::procfs::read_stat(pid).unwrap().stamp;
    assert_eq!(r.resolve(pid).unwrap().name, "first");
    assert_eq!(r.cache().get(pid, &real).unwrap().name, "first");
    let recycled = ProcStamp {
        start_time: real.start_time + 1,
        ..real
    };
    assert!(r.cache().get(pid, &recycled).is_none());
    // Same start time but another exec image (different env block) misses too.
    let exec = ProcStamp {
        env_start: real.env_start + 4096,
        ..real
    };
    assert!(r.cache().get(pid, &exec).is_none());
    assert_eq!(r.stats().stale, 2);
    // A new process under that key replaces the old answer; the old key is gone.
    let other = r.cache().get(pid, &real).unwrap();
    r.cache().insert(
        pid,
        coherent::identity::CacheEntry {
            stamp: recycled,
            session: r
                .directory()
                .record(coherent::identity::SessionInfo::unattributed(7)),
            owner: (pid, recycled.start_time),
            stat_file: None,
        },
    );
    assert!(r.cache().get(pid, &real).is_none());
    assert_eq!(r.cache().get(pid, &recycled).unwrap().name, "uid:7");
    // And the real process, resolved again, gets its own session back, not "uid:7".
    assert_eq!(r.resolve(pid).unwrap(), other);
}

/// Both ways of validating a hit: a held `stat` file, and opening `/proc/TID/stat` again.
fn both_validations() -> [(&'static str, Resolver); 2] {
    let held = Resolver::default();
    let reopen = Resolver::new(ResolverConfig {
        held_stat_files: 0,
        ..ResolverConfig::default()
    });
    [("held stat file", held), ("reopened stat", reopen)]
}

#[test]
fn exited_child_never_returns_the_stale_session() {
    for (mode, r) in both_validations() {
        let mut kid = sleeper(&[("COHERENT_SESSION", "ghost")]);
        let pid = kid.pid();
        let start = start_time(pid);
        let held = StatFile::open(pid).unwrap();
        assert_eq!(r.resolve(pid).unwrap().name, "ghost", "{mode}");
        assert_eq!(r.resolve(pid).unwrap().name, "ghost", "{mode}");
        assert_eq!(
            r.stats().held_stat_files,
            usize::from(mode == "held stat file"),
            "{mode}"
        );
        kid.0.kill().unwrap();
        kid.0.wait().unwrap();
        // A held stat file is bound to its task, not to the number.
        let e = held.read().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{mode}: {e}");
        match r.resolve(pid) {
            Err(ResolveError::Gone { pid: p }) => assert_eq!(p, pid),
            Err(e) => panic!("{mode}: unexpected error {e}"),
            // The pid was already reused by another process: it must be resolved anew.
            Ok(s) => {
                assert_ne!(start_time(pid), start);
                assert_ne!(s.name, "ghost", "{mode}");
            }
        }
        // The dead task's entry is gone, and with it its held file.
        assert!(r.cache().entries_of("ghost").is_empty(), "{mode}");
        assert_eq!(r.stats().held_stat_files, 0, "{mode}");
        // The mount's entry point maps it to the request's uid, without panicking.
        assert_ne!(r.resolve_request(pid, 4321).name, "ghost", "{mode}");
        assert_eq!(r.resolve_request(0, 99).name, "uid:99");
        assert!(matches!(r.resolve(0), Err(ResolveError::NoPid)));
        assert!(!r.session_alive("ghost"), "{mode}");
    }
}

#[test]
fn exec_with_another_environment_is_resolved_again() {
    // Same pid, same start time, new exec image: the cache must not keep the old tag.
    for (mode, r) in both_validations() {
        let mut c = clean("sh");
        c.args(["-c", "read line; exec env COHERENT_SESSION=after sleep 600"])
            .env("COHERENT_SESSION", "before")
            .stdin(Stdio::piped());
        let mut kid = spawn(&mut c);
        let pid = kid.pid();
        assert_eq!(r.resolve(pid).unwrap().name, "before", "{mode}");
        assert_eq!(r.resolve(pid).unwrap().name, "before", "{mode}");
        let start = start_time(pid);
        kid.0.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        wait_for("exec of sleep", || {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        });
        exec_done(pid);
        assert_eq!(start_time(pid), start);
        assert_eq!(r.resolve(pid).unwrap().name, "after", "{mode}");
        let st = r.stats();
        assert_eq!((st.hits, st.misses, st.stale), (1, 1, 1), "{mode}");
    }
}

#[test]
fn liveness_follows_processes_and_zombies() {
    let r = Resolver::default();
    let mut a = sleeper(&[("COHERENT_SESSION", "live-a")]);
    let mut b = sleeper(&[("COHERENT_SESSION", "live-a")]);
    r.resolve(a.pid()).unwrap();
    r.resolve(b.pid()).unwrap();
    assert!(r.session_alive("live-a"));
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    assert!(r.session_alive("live-a"), "b still runs");
    // Killed but not reaped: a zombie is not alive.
    b.0.kill().unwrap();
    let pid = b.pid();
    wait_for("zombie", || {
        coherent::identity::procfs::read_stat(pid).is_ok_and(|s| s.state == b'Z')
    });
    assert!(!r.session_alive_cached("live-a"));
    assert!(!r.session_alive("live-a"));
    b.0.wait().unwrap();
    assert!(!r.session_alive("live-a"));
    // Dead entries were dropped from the cache.
    assert!(r.cache().entries_of("live-a").is_empty());
    assert!(!r.session_alive("never-seen"));
}

#[test]
fn live_process_the_cache_never_saw_is_found_by_the_scan() {
    let r = Resolver::new(ResolverConfig {
        capacity: 16, // one slot per shard
        ..ResolverConfig::default()
    });
    let kid = sleeper(&[("COHERENT_SESSION", "evicted")]);
    r.resolve(kid.pid()).unwrap();
    // Resolve other processes until ours is evicted (it never is referenced again).
    let mut fillers = Vec::new();
    while !r.cache().entries_of("evicted").is_empty() {
        assert!(fillers.len() < 200, "never evicted: {:?}", r.stats());
        let f = sleeper(&[]);
        r.resolve(f.pid()).unwrap();
        fillers.push(f);
    }
    assert!(r.stats().len <= 16);
    assert!(r.stats().evictions > 0);
    assert!(r.may_have_evicted("evicted"));
    assert!(!r.session_alive_cached("evicted"));
    assert!(r.session_alive("evicted"));
    // A process of the session that never touched the volume counts too.
    let other = sleeper(&[("COHERENT_SESSION", "untouched")]);
    assert!(r.session_alive("untouched"));
    drop(other);
    assert!(!r.session_alive("untouched"));
}

#[test]
fn many_threads_resolve_concurrently() {
    let r = std::sync::Arc::new(Resolver::default());
    let kids: Vec<Kid> = (0..4)
        .map(|i| sleeper(&[("COHERENT_SESSION", &format!("conc-{i}"))]))
        .collect();
    let pids: Vec<u32> = kids.iter().map(Kid::pid).collect();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let r = r.clone();
            let pids = pids.clone();
            std::thread::spawn(move || {
                for n in 0..500 {
                    let i = (n + w) % pids.len();
                    assert_eq!(r.resolve(pids[i]).unwrap().name, format!("conc-{i}"));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let st = r.stats();
    assert_eq!(st.hits + st.misses, 2000);
    assert!(st.misses >= 4 && st.misses <= 16, "{st:?}");
}

// ---- cgroup v2 -------------------------------------------------------------------------

/// A test (or part) that cannot run on this machine: an error where it must run (`CI` set,
/// or running as root, which has every privilege these tests need), else a loud skip.
fn cannot_run(test: &str, why: &str) {
    let root = unsafe { libc::geteuid() } == 0;
    if std::env::var_os("CI").is_some() || root {
        panic!("{test} cannot run ({why}), and it must here (CI set or root)");
    }
    eprintln!("SKIP {test}: {why}");
}

/// A writable cgroup v2 hierarchy, or None with a loud reason (see [`cannot_run`]). The
/// probe directory is named per test: tests of one process run in parallel.
fn writable_cgroup2(test: &str) -> Option<PathBuf> {
    let Some(m) = cgroup2_mount().ok().flatten() else {
        cannot_run(test, "no cgroup v2 hierarchy mounted");
        return None;
    };
    let probe = m
        .mount_point
        .join(format!("coherent-probe-{}-{test}", std::process::id()));
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
            Some(m.mount_point)
        }
        Err(e) => {
            cannot_run(
                test,
                &format!(
                    "cgroup v2 at {} is not writable ({e})",
                    m.mount_point.display()
                ),
            );
            None
        }
    }
}

/// Kills its processes and removes its cgroup when dropped.
struct CgroupGuard {
    dir: PathBuf,
    kids: Vec<Kid>,
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        self.kids.clear();
        let t = Instant::now();
        while !remove_session_cgroup(&self.dir).unwrap_or(true) {
            if t.elapsed() > Duration::from_secs(5) {
                eprintln!("could not remove {}", self.dir.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn cgroup_session_beats_env_tags() {
    if writable_cgroup2("cgroup_session_beats_env_tags").is_none() {
        return;
    }
    let name = format!("cg-{}", std::process::id());
    let kid = sleeper(&[("COHERENT_SESSION", "env-name"), (CLAUDE_VAR, "abc")]);
    let pid = kid.pid();
    let dir = join_session_cgroup(&name, pid).expect("join the session cgroup");
    let mut guard = CgroupGuard {
        dir: dir.clone(),
        kids: vec![kid],
    };
    assert!(dir.ends_with(format!("coherent-session-{name}")));
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
    assert!(procs.lines().any(|l| l == pid.to_string()));
    let r = Resolver::default();
    let s = r.resolve(pid).unwrap();
    assert_eq!(s.name, name);
    assert_eq!(s.agent_id, agent_id_for_name(&name));
    let Via::Cgroup { path } = &s.via else {
        panic!("resolved via {:?}", s.via)
    };
    assert!(
        path.ends_with(&format!("/coherent-session-{name}")),
        "{path}"
    );
    // Joining again (a second process of the session) reuses the directory.
    let second = sleeper(&[]);
    assert_eq!(join_session_cgroup(&name, second.pid()).unwrap(), dir);
    assert_eq!(r.resolve(second.pid()).unwrap().name, name);
    assert!(r.session_alive(&name));
    guard.kids.push(second);
    drop(guard);
    assert!(!dir.exists(), "cgroup removed");
    assert!(!r.session_alive(&name));
}

#[test]
fn nested_and_threaded_processes_in_a_session_cgroup() {
    let Some(root) = writable_cgroup2("nested_and_threaded_processes_in_a_session_cgroup") else {
        return;
    };
    // A session cgroup with a sub-cgroup (as a systemd scope might make): the segment
    // still names the session; an invalid inner segment is ignored.
    let name = format!("nest-{}", std::process::id());
    let outer = root.join(format!("coherent-session-{name}"));
    std::fs::create_dir(&outer).unwrap();
    let inner = outer.join("coherent-session-bad name");
    std::fs::create_dir(&inner).unwrap();
    let (kid, tids) = threaded_python(&[], 1);
    let pid = kid.pid();
    std::fs::write(inner.join("cgroup.procs"), pid.to_string()).unwrap();
    let guard_inner = CgroupGuard {
        dir: inner.clone(),
        kids: vec![kid],
    };
    let r = Resolver::default();
    let tid = tids[0];
    for t in [pid, tid] {
        let s = r.resolve(t).unwrap();
        assert_eq!(s.name, name, "tid {t}");
        assert!(
            matches!(&s.via, Via::Cgroup { path } if path.ends_with("/coherent-session-bad name"))
        );
    }
    drop(guard_inner);
    drop(CgroupGuard {
        dir: outer,
        kids: vec![],
    });
}

#[test]
fn comm_with_spaces_and_parens_parses() {
    // comm is the executable's base name: make it look like stat fields.
    let dir = tempfile::tempdir().unwrap();
    let weird = dir.path().join(") R 1 2 (x");
    let sleep = Command::new("sh")
        .args(["-c", "command -v sleep"])
        .output()
        .unwrap();
    let sleep = String::from_utf8(sleep.stdout).unwrap();
    std::os::unix::fs::symlink(sleep.trim(), &weird).unwrap();
    let mut c = Command::new(&weird);
    c.env_clear().env("COHERENT_SESSION", "weird").arg("600");
    let kid = spawn(&mut c);
    let pid = kid.pid();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert!(comm.contains(") R 1 2 ("), "{comm:?}");
    let st = coherent::identity::procfs::read_stat(pid).unwrap();
    assert!(
        matches!(st.state, b'S' | b'R'),
        "state {}",
        st.state as char
    );
    assert_eq!(st.num_threads, 1);
    let mine = start_time(std::process::id());
    assert!(
        st.stamp.start_time >= mine,
        "{} < {mine}",
        st.stamp.start_time
    );
    assert_ne!(st.stamp.env_start, 0);
    assert!(st.stamp.env_end > st.stamp.env_start);
    let r = Resolver::default();
    assert_eq!(r.resolve(pid).unwrap().name, "weird");
    assert_eq!(r.resolve(pid).unwrap().name, "weird");
    assert_eq!(r.stats().hits, 1);
}
