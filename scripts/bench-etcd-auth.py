#!/usr/bin/env python3
"""What securing etcd costs (docs/multi-host.md#securing-etcd): a mount's start (spawn to
mounted, which includes connecting, logging in, registering and catching up) and the
`transfer --to bob` / `withdraw` round trips, against a 1-member etcd started by
scripts/etcd.sh with its secure default (TLS, client certificates, authentication) and
one started with --insecure (plain http). Modes take turns round by round; prints medians.

Usage: COHERENT_SESSION=alice python3 scripts/bench-etcd-auth.py [--rounds 9] [--pairs 50]
                                                                  [--bin target/release]
(the session: the transfers are alice's; the helpers come from scripts/bench-coord.py.)
"""
import argparse, importlib.util, os, shutil, signal, statistics, subprocess, sys, tempfile, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ETCD_SH = os.path.join(REPO, "scripts", "etcd.sh")
_spec = importlib.util.spec_from_file_location("bench_coord", os.path.join(REPO, "scripts", "bench-coord.py"))
bc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bc)


def mounted(mnt):
    with open("/proc/self/mounts") as f:
        return any(l.split()[1] == mnt and l.split()[2].startswith("fuse") for l in f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--pairs", type=int, default=50, help="transfer+withdraw pairs per round")
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release"))
    args = ap.parse_args()
    if not os.environ.get("COHERENT_SESSION"):
        bc.die("run it as a session: COHERENT_SESSION=alice python3 scripts/bench-etcd-auth.py")
    base = tempfile.mkdtemp(prefix="coherent-bench-auth-")
    procs, urls = [], {}

    def start_mount(mode, tag):
        bk, mnt, st = (os.path.join(base, f"{mode}-{tag}-{x}") for x in ("b", "m", "s"))
        os.makedirs(bk, exist_ok=True)
        os.mkdir(mnt)
        t0 = time.perf_counter()
        p = subprocess.Popen(
            [os.path.join(args.bin, "coherent-mount"), bk, mnt, "--state-dir", st,
             "--coordinator", urls[mode], "--host-id", f"{mode}-{tag}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(base, f"{mode}-{tag}.log"), "w"))
        procs.append(p)
        while not mounted(mnt):
            if p.poll() is not None:
                bc.die(f"coherent-mount ({mode}) exited; log: {base}/{mode}-{tag}.log")
            time.sleep(0.002)  # polling /proc/self/mounts is the event here
        return p, mnt, time.perf_counter() - t0

    def stop(p):
        p.send_signal(signal.SIGTERM)
        p.wait(30)

    def turns(r):
        return list(urls) if r % 2 == 0 else list(reversed(list(urls)))

    try:
        for mode, extra in (("plain", ["--insecure"]), ("tls+auth", [])):
            urls[mode] = subprocess.run(
                ["bash", ETCD_SH, "start", "--dir", os.path.join(base, "etcd-" + mode.replace("+", "-"))] + extra,
                check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
        # Transfers first: the start runs below leave leases a transfer would wait out.
        mounts = {m: start_mount(m, "xfer") for m in urls}
        ctls = {m: bc.Ctl(mounts[m][1]) for m in urls}
        for m in urls:
            bc.as_bob(os.path.join(mounts[m][1], "x"), 0)
        tr = {m: [] for m in urls}
        wd = {m: [] for m in urls}
        for r in range(args.rounds):
            for m in turns(r):
                t, w = bc.transfer_pairs(ctls[m], mounts[m][1], "plan.md", args.pairs)
                tr[m].append(t)
                wd[m].append(w)
        for m in urls:
            os.close(ctls[m].fd)
            stop(mounts[m][0])
        starts = {m: [] for m in urls}
        for r in range(args.rounds):
            for m in turns(r):
                p, _, dt = start_mount(m, f"s{r}")
                starts[m].append(dt)
                stop(p)
        print("| etcd | mount start (ms) | transfer (ms) | withdraw (ms) |")
        print("|---|---|---|---|")
        for m in urls:
            print(f"| {m} | {statistics.median(starts[m]) * 1e3:.1f} | "
                  f"{statistics.median(tr[m]) * 1e3:.2f} | {statistics.median(wd[m]) * 1e3:.2f} |")
    finally:
        for p in procs:
            if p.poll() is None:
                stop(p)
        for mode in urls:
            subprocess.run(["bash", ETCD_SH, "stop", "--dir", os.path.join(base, "etcd-" + mode.replace("+", "-"))],
                           stdout=subprocess.DEVNULL)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
