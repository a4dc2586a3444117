//! uring-probe: one toy filesystem, two FUSE transports, the same metadata
//! workload against each (docs/design.md#speed). One run mounts once, measures, unmounts,
//! and prints one JSON line; `run.py` interleaves runs and takes medians.

mod model;
mod via_fuser;
mod via_uring;

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use model::{Counters, OPS, Op};

struct Args {
    transport: String,
    threads: usize,
    files: u64,
    stats: u64,
    opens: u64,
    clients: u64,
    depth: u16,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        transport: String::new(),
        threads: 2,
        files: 10_000,
        stats: 200_000,
        opens: 50_000,
        clients: 1,
        depth: 16,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--transport" => a.transport = v,
            "--threads" => a.threads = num(&v)? as usize,
            "--files" => a.files = num(&v)?,
            "--stats" => a.stats = num(&v)?,
            "--opens" => a.opens = num(&v)?,
            "--clients" => a.clients = num(&v)?.max(1),
            "--depth" => a.depth = num(&v)? as u16,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.transport != "fuser" && a.transport != "uring" {
        return Err(
            "usage: uring-probe --transport fuser|uring [--threads N] [--files N] \
                    [--stats N] [--opens N] [--clients N] [--depth N]"
                .into(),
        );
    }
    Ok(a)
}

enum Mounted {
    Fuser(via_fuser::Mounted),
    Uring(via_uring::Mounted),
}

impl Mounted {
    fn unmount(self) -> std::io::Result<()> {
        match self {
            Mounted::Fuser(m) => m.unmount(),
            Mounted::Uring(m) => m.unmount(),
        }
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// What one phase cost: wall time and the requests the daemon answered.
struct Phase {
    calls: u64,
    wall: Duration,
    /// CPU time of this whole process (clients and daemon, user and kernel);
    /// steadier than wall time on a loaded machine.
    cpu: Duration,
    requests: [u64; 7],
    clients: u64,
}

impl Phase {
    fn json(&self, name: &str) -> String {
        let total: u64 = self.requests.iter().sum();
        // Per-call latency as one client sees it; per round trip divides by requests per call.
        let us_per_call = self.wall.as_secs_f64() * 1e6 * self.clients as f64 / self.calls as f64;
        let rt_per_call = total as f64 / self.calls as f64;
        let cpu_us_per_call = self.cpu.as_secs_f64() * 1e6 / self.calls as f64;
        let by_op: Vec<String> = OPS
            .iter()
            .filter(|op| self.requests[**op as usize] > 0)
            .map(|op| format!("\"{}\":{}", op.name(), self.requests[*op as usize]))
            .collect();
        format!(
            "\"{name}\":{{\"calls\":{},\"wall_s\":{:.4},\"us_per_call\":{:.3},\
             \"requests_per_call\":{:.3},\"us_per_round_trip\":{},\"cpu_us_per_call\":{:.3},\
             \"cpu_us_per_round_trip\":{},\"requests\":{{{}}}}}",
            self.calls,
            self.wall.as_secs_f64(),
            us_per_call,
            rt_per_call,
            per_round_trip(us_per_call, rt_per_call),
            cpu_us_per_call,
            per_round_trip(cpu_us_per_call, rt_per_call),
            by_op.join(",")
        )
    }
}

/// A cost split over the round trips of a call, or JSON null when none reached the daemon.
fn per_round_trip(us: f64, round_trips: f64) -> String {
    if round_trips > 0.0 {
        format!("{:.3}", us / round_trips)
    } else {
        "null".into()
    }
}

/// Run `calls` calls of `one` spread over `clients` threads, all started together.
fn phase(
    counters: &Counters,
    paths: &Arc<Vec<CString>>,
    calls: u64,
    clients: u64,
    one: fn(&CString),
) -> Phase {
    let barrier = Arc::new(Barrier::new(clients as usize + 1));
    let per = calls / clients;
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let (paths, barrier) = (paths.clone(), barrier.clone());
            std::thread::spawn(move || {
                let n = paths.len() as u64;
                barrier.wait();
                // Clients walk disjoint stretches of names.
                let start = c * n / clients;
                for i in 0..per {
                    one(&paths[((start + i) % n) as usize]);
                }
            })
        })
        .collect();
    let before = counters.snapshot();
    let cpu0 = cpu_time();
    barrier.wait();
    let t = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    let wall = t.elapsed();
    let cpu = cpu_time() - cpu0;
    let after = counters.snapshot();
    Phase {
        calls: per * clients,
        wall,
        cpu,
        requests: std::array::from_fn(|i| after[i] - before[i]),
        clients,
    }
}

fn cpu_time() -> Duration {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn do_stat(p: &CString) {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::stat(p.as_ptr(), &mut st) } != 0 {
        panic!("stat {p:?}: {}", std::io::Error::last_os_error());
    }
}

fn do_open_close(p: &CString) {
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        panic!("open {p:?}: {}", std::io::Error::last_os_error());
    }
    unsafe { libc::close(fd) };
}

/// Whether reads of `pt` bypass the daemon: the bytes must be the backing
/// file's (the daemon would serve a different pattern) and no READ may arrive.
fn passthrough_check(mnt: &Path, counters: &Counters, backing: &[u8]) -> String {
    let before = counters.snapshot()[Op::Read as usize];
    let mut got = Vec::new();
    if let Err(e) = File::open(mnt.join("pt")).and_then(|mut f| f.read_to_end(&mut got)) {
        return format!("error: {e}");
    }
    let reads = counters.snapshot()[Op::Read as usize] - before;
    if got == backing && reads == 0 {
        "passthrough".into()
    } else {
        format!(
            "not passthrough ({} daemon reads, backing bytes {})",
            reads,
            if got == backing { "match" } else { "differ" }
        )
    }
}

/// A regular file read through the daemon must return the daemon's bytes.
fn data_check(mnt: &Path, files: u64) -> String {
    let mut got = Vec::new();
    match File::open(mnt.join("f0")).and_then(|mut f| f.read_to_end(&mut got)) {
        Err(e) => format!("error: {e}"),
        Ok(_) if got == model::content(2, 0, model::FILE_SIZE as usize) && files > 0 => "ok".into(),
        Ok(n) => format!("wrong bytes ({n} read)"),
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn run(a: &Args) -> Result<String, String> {
    let base = std::env::temp_dir().join(format!("uring-probe.{}", std::process::id()));
    let mnt = base.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
    // The passthrough backing file lives on tmpfs (stack depth 0).
    let backing_path = PathBuf::from(format!("/dev/shm/uring-probe.{}", std::process::id()));
    let backing_bytes: Vec<u8> = b"backing file bytes\n".repeat(200);
    std::fs::File::create(&backing_path)
        .and_then(|mut f| f.write_all(&backing_bytes))
        .map_err(|e| format!("backing file: {e}"))?;
    let backing = File::open(&backing_path).map_err(|e| format!("backing file: {e}"))?;
    let _ = std::fs::remove_file(&backing_path);

    let counters = Arc::new(Counters::default());
    let mounted = match a.transport.as_str() {
        "fuser" => via_fuser::mount(&mnt, a.files, a.threads, backing, counters.clone())
            .map(Mounted::Fuser),
        _ => via_uring::mount(&mnt, a.files, a.threads, a.depth, backing, counters.clone())
            .map(Mounted::Uring),
    }
    .map_err(|e| format!("mount: {e}"))?;

    // The first request waits for FUSE_INIT; a failed INIT aborts the connection.
    let result = (|| -> Result<String, String> {
        std::fs::metadata(&mnt).map_err(|e| format!("first stat of the mount: {e}"))?;
        let paths: Arc<Vec<CString>> = Arc::new(
            (0..a.files)
                .map(|i| cpath(&mnt.join(format!("f{i}"))))
                .collect(),
        );
        let data = data_check(&mnt, a.files);
        let pt = passthrough_check(&mnt, &counters, &backing_bytes);
        // Warm pass: every dentry exists before the timed stat phase.
        phase(&counters, &paths, a.files, 1, do_stat);
        let load_before = load();
        let stat = phase(&counters, &paths, a.stats, a.clients, do_stat);
        let open = phase(&counters, &paths, a.opens, a.clients, do_open_close);
        Ok(format!(
            "{{\"transport\":\"{}\",\"threads\":{},\"clients\":{},\"depth\":{},\"load\":\"{}\",\
             \"data\":\"{}\",\"passthrough\":\"{}\",{},{}}}",
            a.transport,
            a.threads,
            a.clients,
            a.depth,
            load_before,
            data,
            pt,
            stat.json("stat"),
            open.json("open_close")
        ))
    })();
    let unmounted = mounted.unmount();
    let _ = std::fs::remove_dir(&mnt);
    let _ = std::fs::remove_dir(&base);
    match (result, unmounted) {
        (Ok(line), Ok(())) => Ok(line),
        (Ok(_), Err(e)) => Err(format!("unmount: {e}")),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(session)) => Err(format!("{e}; session: {session}")),
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    match run(&args) {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("uring-probe ({}): {e}", args.transport);
            std::process::exit(1);
        }
    }
}
