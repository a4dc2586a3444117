#!/usr/bin/env python3
"""Round trips per operation: mount coherent-mount (in place, and over a separate backing
directory), do each operation with plain syscalls, and count the FUSE requests the daemon
served for it (its per-opcode counters, logged on SIGUSR1). Prints a Markdown table.

Usage: python3 scripts/roundtrips.py [path/to/coherent-mount] (default target/release)."""
import os, re, signal, subprocess, sys, tempfile, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "target/release/coherent-mount")


def counters(proc, logf):
    before = open(logf).read().count("stats:")
    proc.send_signal(signal.SIGUSR1)
    for _ in range(500):
        log = open(logf).read()
        if log.count("stats:") > before:
            line = [l for l in log.splitlines() if "stats:" in l][-1]
            return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line.split("requests: ")[1])}
        time.sleep(0.01)
    raise SystemExit("no stats line from the daemon")


def ops(mnt):
    f, g = os.path.join(mnt, "f"), os.path.join(mnt, "g")
    def read(path):
        fd = os.open(path, os.O_RDONLY); os.read(fd, 4096); os.close(fd)
    def create(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.write(fd, b"x"); os.close(fd)
    t = os.path.join(mnt, "t")
    return [
        ("stat, first time", lambda: os.stat(f)),
        ("stat again (warm)", lambda: os.stat(f)),
        ("stat 1.5 s later (past the 1 s TTL)", lambda: (time.sleep(1.5), os.stat(f))),
        ("stat of an absent name, twice", lambda: [os.path.exists(os.path.join(mnt, "nope")) for _ in range(2)]),
        ("open+read+close", lambda: read(f)),
        ("open+read+close again", lambda: read(f)),
        ("create+write+close (new file)", lambda: create(g)),
        ("open for write+write+close (existing)", lambda: create(g)),
        ("unlink", lambda: os.unlink(g)),
        ("create+write+close, then stat", lambda: (create(g), os.stat(g))),
        ("rm -rf of a tree not seen before (2 dirs, 4 files)", lambda: subprocess.run(["rm", "-rf", t], check=True)),
        ("listdir (opendir+readdir) twice", lambda: [os.listdir(mnt) for _ in range(2)]),
    ]


def measure(in_place):
    with tempfile.TemporaryDirectory(prefix="roundtrips-") as d:
        backing = os.path.join(d, "b"); os.mkdir(backing)
        with open(os.path.join(backing, "f"), "w") as fh:
            fh.write("hello\n")
        for sub in ("t", "t/a"):
            os.mkdir(os.path.join(backing, sub))
            for n in ("1", "2"):
                open(os.path.join(backing, sub, n), "w").close()
        mnt = backing if in_place else os.path.join(d, "m")
        if not in_place:
            os.mkdir(mnt)
        logf = os.path.join(d, "log")
        cmd = [BIN, backing] + ([] if in_place else [mnt]) + ["--state-dir", os.path.join(d, "state")]
        proc = subprocess.Popen(cmd, stderr=open(logf, "w"), stdout=subprocess.DEVNULL)
        try:
            for _ in range(500):
                if "mounted and ready" in open(logf).read():
                    break
                time.sleep(0.01)
            rows = []
            for name, op in ops(mnt):
                a = counters(proc, logf)
                op()
                # RELEASE (and FORGET) are sent after close(2)/unlink(2) return: let them land.
                time.sleep(0.2)
                b = counters(proc, logf)
                diff = {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) != a.get(k, 0)}
                rows.append((name, sum(diff.values()), " ".join(f"{k} {v}" for k, v in sorted(diff.items()))))
            return rows
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)


sep, inp = measure(False), measure(True)
print("| operation | separate backing (1 s TTL): requests | which | in place: requests | which |")
print("|---|---:|---|---:|---|")
for (n, c1, w1), (_, c2, w2) in zip(sep, inp):
    print(f"| {n} | {c1} | {w1} | {c2} | {w2} |")
