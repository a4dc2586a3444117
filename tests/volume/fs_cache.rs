//! The kernel cache policy (docs/cache.md): over a separate backing directory a change
//! made there is seen through the mount within the TTL (1 s by default, `--cache-ttl`);
//! in place the kernel keeps names, attributes and listings, and repeated metadata calls
//! do not reach the daemon (counted by its per-request counters, logged on SIGUSR1).

use crate::coherent;
use crate::common;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use common::{wait_until, Mount, TIMEOUT};

/// Slack on top of a TTL for a loaded 2-core machine (the kernel's jiffies, scheduling).
const SLACK: Duration = Duration::from_secs(2);

/// Poll `f` until true; how long it took, or `None` after `limit`.
fn seen_within(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The daemon's request counters: SIGUSR1, then the new `stats:` line parsed.
fn requests(m: &Mount) -> HashMap<String, u64> {
    let before = m.log().matches("stats:").count();
    m.signal(libc::SIGUSR1);
    assert!(
        wait_until(TIMEOUT, || m.log().matches("stats:").count() > before),
        "no stats line after SIGUSR1:\n{}",
        m.log()
    );
    let log = m.log();
    let line = log.lines().rfind(|l| l.contains("stats:")).unwrap();
    let list = line
        .split("requests: ")
        .nth(1)
        .expect("requests in the stats line");
    list.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

fn served(r: &HashMap<String, u64>, op: &str) -> u64 {
    r.get(op).copied().unwrap_or(0)
}

fn external_change_seen_within(m: &Mount, bound: Duration) {
    fs::write(m.backing_path("f"), b"one").unwrap();
    // Cache the attributes and a negative entry through the mount.
    assert_eq!(fs::metadata(m.path("f")).unwrap().len(), 3);
    assert!(fs::metadata(m.path("new")).is_err());

    fs::write(m.backing_path("f"), b"one two three").unwrap();
    fs::write(m.backing_path("new"), b"n").unwrap();
    let t = seen_within(bound + SLACK, || {
        fs::metadata(m.path("f")).is_ok_and(|a| a.len() == 13)
    });
    assert!(
        t.is_some(),
        "a size changed in the backing directory was not seen through the mount within {:?}",
        bound + SLACK
    );
    let t = seen_within(bound + SLACK, || fs::metadata(m.path("new")).is_ok());
    assert!(
        t.is_some(),
        "a name created in the backing directory after a failed lookup was not seen within {:?}",
        bound + SLACK
    );
    // A file replaced behind the volume's back (new inode under the same name).
    let ino = fs::metadata(m.path("f")).unwrap().ino();
    fs::write(m.backing_path("f.tmp"), b"replaced").unwrap();
    fs::rename(m.backing_path("f.tmp"), m.backing_path("f")).unwrap();
    let t = seen_within(bound + SLACK, || {
        fs::read(m.path("f")).is_ok_and(|d| d == b"replaced")
            && fs::metadata(m.path("f")).is_ok_and(|a| a.ino() != ino && a.len() == 8)
    });
    assert!(
        t.is_some(),
        "a replaced file was not seen within {:?}",
        bound + SLACK
    );
}

#[test]
fn separate_backing_changes_show_within_the_default_ttl() {
    let m = Mount::new(true);
    assert!(m.log().contains("cache ttl 1s"), "{}", m.log());
    external_change_seen_within(&m, Duration::from_secs(1));
}

#[test]
fn cache_ttl_option_bounds_how_late_a_change_is_seen() {
    let m = Mount::builder().args(["--cache-ttl", "3s"]).start();
    assert!(m.log().contains("cache ttl 3s"), "{}", m.log());
    external_change_seen_within(&m, Duration::from_secs(3));
    // And within the bound the kernel did keep it: with a 3 s TTL a stat right after a
    // cached one is answered by the kernel, not the daemon.
    fs::metadata(m.path("f")).unwrap();
    let before = requests(&m);
    for _ in 0..20 {
        fs::metadata(m.path("f")).unwrap();
    }
    let after = requests(&m);
    let calls = |r: &HashMap<String, u64>| served(r, "lookup") + served(r, "getattr");
    assert!(
        calls(&after) - calls(&before) < 5,
        "20 stats within the TTL reached the daemon {} times",
        calls(&after) - calls(&before)
    );
}

#[test]
fn in_place_mount_keeps_names_attributes_and_listings_in_the_kernel() {
    let m = Mount::builder().in_place().start();
    assert!(m.log().contains("cache ttl 86400s"), "{}", m.log());
    m.sh_ok("mkdir -p d && for i in 1 2 3 4 5; do echo $i > d/f$i; done");
    m.sh_ok("ls -l d >/dev/null; stat d/f1 >/dev/null; stat d/absent 2>/dev/null; true");
    // Past the 1 s TTL of a separate backing: what the kernel holds in place is still
    // good, so none of this reaches the daemon again.
    std::thread::sleep(Duration::from_millis(1500));
    let before = requests(&m);
    m.sh_ok("ls -l d >/dev/null; stat d/f1 >/dev/null; stat d/absent 2>/dev/null; true");
    let after = requests(&m);
    for op in ["lookup", "readdir", "readdirplus"] {
        assert_eq!(
            served(&after, op),
            served(&before, op),
            "{op} reached the daemon for a cached name/listing: before {before:?} after {after:?}"
        );
    }
    // One getattr at most: the kernel drops a directory's atime after listing it (unless
    // the mount is noatime), so `ls -l`'s stat of `d` asks once; the files' attributes
    // stay cached.
    assert!(
        served(&after, "getattr") - served(&before, "getattr") <= 1,
        "getattr reached the daemon for cached attributes: before {before:?} after {after:?}"
    );
    // Changes through the mount are seen at once (the kernel drops what they touch).
    m.sh_ok("echo 6 > d/f6 && rm d/f1 && echo more >> d/f2");
    let list = m.sh_ok("ls d");
    assert_eq!(
        list.split_whitespace().collect::<Vec<_>>(),
        ["f2", "f3", "f4", "f5", "f6"]
    );
    assert_eq!(fs::metadata(m.path("d/f2")).unwrap().len(), 7);
    assert!(fs::metadata(m.path("d/f1")).is_err());
}

/// A ctl verb changes no file, name or attribute, only records, shown in the computed
/// xattrs, which the kernel never caches: in place (24 h TTL) a `transfer` is seen at once,
/// and the file's `stat` is what it was.
#[test]
fn in_place_a_ctl_change_is_seen_at_once() {
    use coherent::{handoff, mount_with, sh_ok, touch_session, transfer};
    let m = mount_with(Mount::builder().in_place());
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "echo p > plan.md");
    assert!(handoff(&m, Some("alice"), "plan.md").is_none());
    let before = fs::metadata(m.path("plan.md")).unwrap();
    transfer(&m, "alice", "bob", &["plan.md"]);
    // Read right after the verb answered: no polling, nothing may be served stale.
    let rec = handoff(&m, Some("alice"), "plan.md").expect("the record, seen at once");
    assert_eq!(
        (rec["successor"].as_str(), rec["status"].as_str()),
        (Some("bob"), Some("pending")),
        "{rec}"
    );
    let after = fs::metadata(m.path("plan.md")).unwrap();
    assert_eq!(
        (after.ino(), after.len(), after.mtime(), after.ctime()),
        (before.ino(), before.len(), before.mtime(), before.ctime())
    );
}

/// A write to an untracked path (`.git/`, docs/ignore.md) has no state in the volume, so
/// its close costs no FLUSH round trip; a tracked file's close is its commit and does.
#[test]
fn writes_of_untracked_paths_cost_no_flush() {
    let m = Mount::builder().in_place().start();
    m.sh_ok("mkdir -p .git src");
    let flushes = |cmd: &str| {
        let before = requests(&m);
        m.sh_ok(cmd);
        let after = requests(&m);
        served(&after, "flush") - served(&before, "flush")
    };
    assert!(
        flushes("echo x > src/a.rs") >= 1,
        "no FLUSH for a tracked write"
    );
    assert_eq!(
        flushes("echo x > .git/index.lock && echo y >> .git/index.lock"),
        0
    );
}

/// The files of `.coherent/` commit nothing at close (a request on `ctl` is served at its
/// write, a waiting read at its answer): their close costs no FLUSH round trip either.
#[test]
fn closes_of_control_files_cost_no_flush() {
    let m = Mount::builder().in_place().start();
    let flushes = |cmd: &str| {
        let before = requests(&m);
        m.sh_ok(cmd);
        let after = requests(&m);
        served(&after, "flush") - served(&before, "flush")
    };
    assert_eq!(flushes("cat .coherent/status > /dev/null"), 0);
    assert_eq!(flushes("cat .coherent/status .coherent/why > /dev/null"), 0);
}

/// A write through a shared mapping reaches the backing file without the kernel's cache
/// of the mount's inode knowing (passthrough maps the backing file itself): the close
/// drops the cached attributes, so a `stat` right after shows the new mtime, as natively
/// (xfstests generic/080 and 215), in every mode. The TTL is long so that only the
/// close can make the kernel ask again; `stat(1)` asks for the basic fields only (Rust's
/// `metadata` asks for the birth time too, which FUSE always fetches afresh).
#[test]
fn a_mapped_write_shows_its_mtime_at_once_after_the_close() {
    const PROBE: &str = "head -c 4096 /dev/zero > mapped; stat -c %y mapped; \
        python3 -S -c \"import mmap, os\n\
fd = os.open('mapped', os.O_RDWR)\n\
m = mmap.mmap(fd, 4096)\n\
m[0:5] = b'hello'\n\
m.close()\n\
os.close(fd)\"; stat -c %y mapped";
    let ttl = |b: common::Builder| b.arg("--cache-ttl").arg("10m").start();
    for (name, m, separate) in [
        ("passthrough", ttl(Mount::builder().passthrough(true)), true),
        (
            "through the daemon",
            ttl(Mount::builder().passthrough(false)),
            true,
        ),
        ("in place", Mount::builder().in_place().start(), false),
    ] {
        let out = m.sh_ok(PROBE);
        let seen: Vec<&str> = out.lines().collect();
        assert_eq!(seen.len(), 2, "{name}: {out}");
        assert_ne!(
            seen[0], seen[1],
            "{name}: the mount shows the mtime before the write"
        );
        if separate {
            let backing = m.sh_ok(&format!(
                "stat -c %y {}",
                m.backing_path("mapped").display()
            ));
            assert_eq!(seen[1], backing.trim(), "{name}");
        }
    }
}
