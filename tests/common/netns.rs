//! Hosts in their own network namespaces, for the partition tests: each host is a
//! namespace with one veth pair to the root namespace, where etcd listens on an address
//! added to `lo` (reached from every namespace through its veth). A host's link can be cut
//! and healed (`ip link set down/up` on its root-side end) and slowed or made lossy (`tc`
//! on both ends). Everything is removed when dropped.
//!
//! A daemon runs in a namespace through `nsenter --net=/run/netns/NAME` (which changes only
//! the network namespace: `ip netns exec` also unshares the mount namespace, so the FUSE
//! mount would be invisible to the test).
//!
//! Never skips: without `ip`, `tc` or `nsenter` it panics saying what to install.
#![allow(dead_code)]

use std::process::Command;

/// Run one command line; panics with its stderr unless it succeeds.
fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    assert!(
        out.status.success(),
        "`{}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Run one command line, ignoring how it ends (cleanup).
fn run_quiet(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Panics unless `ip`, `tc` and `nsenter` are installed (iproute2, util-linux).
pub fn require_tools() {
    for (tool, package) in [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("nsenter", "util-linux"),
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "the partition tests need `{tool}`: install the Debian package {package} \
             (sudo bash scripts/deps.sh does)"
        );
    }
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the partition tests make network namespaces: run them as root"
    );
}

/// How a degraded link behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Degrade {
    /// Every packet late (netem: 150 ms ± 50 ms).
    Delay,
    /// Some packets dropped (netem: 25 %).
    Loss,
}

/// One host's namespace and link.
pub struct Link {
    pub ns: String,
    /// The root-side end of the veth pair (cut here).
    pub outer: String,
    /// The namespace-side end.
    pub inner: String,
    pub host_ip: String,
}

/// The namespaces of one test run and the address etcd serves them on.
pub struct Net {
    /// The address on the root namespace's `lo` (etcd's `--listen-ip`).
    pub etcd_ip: String,
    pub links: Vec<Link>,
    /// netem is in this kernel; otherwise delay and loss are made with tbf (below).
    pub netem: bool,
}

impl Net {
    /// Namespaces for `hosts` (names of one letter or digit), with addresses in
    /// 10.88.X.0/24 and etcd at 10.89.X.1, X chosen from this process's pid and the
    /// number of this call in the process, so neither two runs at once nor two tests of
    /// one test binary collide.
    pub fn new(hosts: &[&str]) -> Net {
        static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        require_tools();
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let x = (pid + 83 * n) % 250 + 1;
        // Interface names stay within 15 bytes: `cp` + 5 + `x` + n + host + `o`.
        let tag = format!("cp{}x{n}", pid % 100_000);
        let etcd_ip = format!("10.89.{x}.1");
        // A leftover of a run killed before its cleanup (same pid, much later) is removed.
        run_quiet(&["ip", "addr", "del", &format!("{etcd_ip}/32"), "dev", "lo"]);
        run(&["ip", "addr", "add", &format!("{etcd_ip}/32"), "dev", "lo"]);
        let mut net = Net {
            etcd_ip,
            links: Vec::new(),
            netem: false,
        };
        for (i, h) in hosts.iter().enumerate() {
            let ns = format!("{tag}-{h}");
            let outer = format!("{tag}{h}o");
            let inner = format!("{tag}{h}i");
            let (root_ip, host_ip) = (
                format!("10.88.{x}.{}", 4 * i + 1),
                format!("10.88.{x}.{}", 4 * i + 2),
            );
            run_quiet(&["ip", "netns", "del", &ns]);
            run(&["ip", "netns", "add", &ns]);
            // Pushed first, so a failure below still removes the namespace.
            net.links.push(Link {
                ns: ns.clone(),
                outer: outer.clone(),
                inner: inner.clone(),
                host_ip: host_ip.clone(),
            });
            run(&[
                "ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &ns,
            ]);
            run(&["ip", "addr", "add", &format!("{root_ip}/30"), "dev", &outer]);
            run(&["ip", "link", "set", &outer, "up"]);
            let inside = |args: &[&str]| {
                let mut a = vec!["ip", "-n", &ns];
                a.extend_from_slice(args);
                run(&a);
            };
            inside(&["addr", "add", &format!("{host_ip}/30"), "dev", &inner]);
            inside(&["link", "set", &inner, "up"]);
            inside(&["link", "set", "lo", "up"]);
            inside(&["route", "add", "default", "via", &root_ip]);
        }
        net.netem = net.probe_netem();
        net
    }

    fn link(&self, k: usize) -> &Link {
        &self.links[k]
    }

    /// `nsenter --net=/run/netns/NS PROGRAM`: a command that runs in host `k`'s namespace
    /// (nsenter execs the program, so the child's pid is the program's).
    pub fn command(&self, k: usize, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.link(k).ns))
            .arg("--")
            .arg(program);
        c
    }

    /// Cut host `k` off (its root-side veth down: nothing reaches etcd, no error at once,
    /// connections simply stall as on a real partition).
    pub fn cut(&self, k: usize) {
        run(&["ip", "link", "set", &self.link(k).outer, "down"]);
    }

    pub fn heal(&self, k: usize) {
        run(&["ip", "link", "set", &self.link(k).outer, "up"]);
    }

    /// Slow or lossy link for host `k`, both directions.
    pub fn degrade(&self, k: usize, how: Degrade) {
        let l = self.link(k);
        for (ns, dev) in [(None, &l.outer), (Some(&l.ns), &l.inner)] {
            let mut a: Vec<&str> = vec!["tc"];
            if let Some(ns) = ns {
                a.extend(["-n", ns]);
            }
            a.extend(["qdisc", "replace", "dev", dev, "root"]);
            a.extend(self.qdisc(how));
            run(&a);
        }
    }

    /// The qdisc for `how`. netem when the kernel has it; otherwise (a kernel built without
    /// sch_netem, as some VM kernels are) a token bucket: a slow rate with a long queue
    /// delays every packet, a slow rate with a short queue drops what does not fit.
    fn qdisc(&self, how: Degrade) -> Vec<&'static str> {
        match (self.netem, how) {
            (true, Degrade::Delay) => vec!["netem", "delay", "150ms", "50ms"],
            (true, Degrade::Loss) => vec!["netem", "loss", "25%"],
            (false, Degrade::Delay) => {
                vec![
                    "tbf", "rate", "256kbit", "burst", "1600", "latency", "400ms",
                ]
            }
            (false, Degrade::Loss) => {
                vec!["tbf", "rate", "128kbit", "burst", "1600", "latency", "15ms"]
            }
        }
    }

    pub fn restore(&self, k: usize) {
        let l = self.link(k);
        run_quiet(&["tc", "qdisc", "del", "dev", &l.outer, "root"]);
        run_quiet(&["tc", "-n", &l.ns, "qdisc", "del", "dev", &l.inner, "root"]);
    }

    /// Can a netem qdisc be made here (on the first host's inner end, removed at once)?
    fn probe_netem(&self) -> bool {
        let l = &self.links[0];
        let ok = run_quiet(&[
            "tc", "-n", &l.ns, "qdisc", "add", "dev", &l.inner, "root", "netem", "delay", "1ms",
        ]);
        run_quiet(&["tc", "-n", &l.ns, "qdisc", "del", "dev", &l.inner, "root"]);
        ok
    }

    /// How delay and loss are made, for the run's summary.
    pub fn degrade_kind(&self) -> &'static str {
        if self.netem {
            "tc netem (delay 150ms±50ms, loss 25%)"
        } else {
            "tc tbf (this kernel has no sch_netem: delay = 256 kbit/s with a 400 ms queue, \
             loss = 128 kbit/s with a 15 ms queue)"
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth end, and with it the pair.
        for l in &self.links {
            run_quiet(&["ip", "link", "del", &l.outer]);
            run_quiet(&["ip", "netns", "del", &l.ns]);
        }
        run_quiet(&[
            "ip",
            "addr",
            "del",
            &format!("{}/32", self.etcd_ip),
            "dev",
            "lo",
        ]);
    }
}
