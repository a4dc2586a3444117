#!/usr/bin/env python3
"""What the multi-host write check costs (docs/multi-host.md): sequential writes through a
multi-host mount (a local etcd from scripts/etcd.sh) against one-host mounts, with and
without passthrough, and the backing directory itself. Each run is
`dd if=/dev/zero of=DIR/f.bin bs=1M count=256` as an agent session (COHERENT_SESSION=alice),
buffered; RUNS runs per target, interleaved; prints a markdown table of wall seconds and
medians. Run as root (FUSE, passthrough):

    python3 scripts/bench-multihost-writes.py target/release/coherent-mount [RUNS]
"""
import os, subprocess, sys, time, statistics, shutil
BIN = os.path.abspath(sys.argv[1])
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
D = "/tmp/coherent-bench-multihost"
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
url = subprocess.run(["bash", f"{repo}/scripts/etcd.sh", "start", "--dir", f"{D}/etcd"],
                     check=True, capture_output=True, text=True).stdout.strip()
mounts = {
    "one host, passthrough": [],
    "one host, --no-passthrough": ["--no-passthrough"],
    "multi-host (etcd)": ["--coordinator", url, "--host-id", "bench", "--coordinator-ttl", "10s"],
}
procs = []
dirs = {"native": f"{D}/native"}
os.makedirs(dirs["native"])
try:
    for i, (name, extra) in enumerate(mounts.items()):
        b, m, s = (f"{D}/m{i}/{x}" for x in "bms")
        for x in (b, m, s):
            os.makedirs(x)
        log = open(f"{D}/m{i}.log", "w")
        procs.append(subprocess.Popen([BIN, b, m, "--state-dir", s] + extra, stdout=log, stderr=log))
        for _ in range(200):
            if os.path.ismount(m) and os.path.exists(f"{m}/.coherent/status"):
                break
            time.sleep(0.05)
        else:
            sys.exit(f"{name} did not mount: {open(f'{D}/m{i}.log').read()}")
        dirs[name] = m
    env = dict(os.environ, COHERENT_SESSION="alice")
    times = {k: [] for k in dirs}
    for r in range(RUNS):
        for k, d in dirs.items():
            f = f"{d}/f.bin"
            if os.path.exists(f):
                os.unlink(f)
            subprocess.run(["sync"])
            t = time.monotonic()
            subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=1M", "count=256"],
                           env=env, check=True, capture_output=True)
            times[k].append(time.monotonic() - t)
    base = statistics.median(times["native"])
    print(f"load before: {open('/proc/loadavg').read().split()[:3]}")
    print("| target | runs (s) | median (s) | vs native |")
    print("|---|---|---:|---:|")
    for k, v in times.items():
        med = statistics.median(v)
        print(f"| {k} | {' '.join(f'{x:.3f}' for x in v)} | {med:.3f} | {med / base:.2f}x |")
    for i in range(len(mounts)):
        print("data mode:", [l.split("data mode: ")[1].strip() for l in open(f"{D}/m{i}.log") if "data mode:" in l])
finally:
    for p in procs:
        p.terminate()
        p.wait(timeout=20)
    subprocess.run(["bash", f"{repo}/scripts/etcd.sh", "stop", "--dir", f"{D}/etcd"], capture_output=True)
