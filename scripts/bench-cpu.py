#!/usr/bin/env python3
"""The daemon's own CPU per operation: a create storm and an `rm -rf` on tmpfs.

Each mode mounts a fresh directory on one tmpfs; the workloads run in the mount; the
daemon's CPU time is read before and after each workload and divided by the operations
it made. Modes take turns round by round (interleaved), medians over the rounds.

Modes:
  coherent   `coherent-mount DIR` over its own directory (as agents use it; as root:
             allow_other,default_permissions), its state beside it
  plain      the same, `--no-coherence` (a passthrough without sessions or versions)
  bindfs     `bindfs -f --multithreaded BACKING MNT` (the packaged FUSE peer)
  base       `coherent-mount DIR` of another build (--base BINARY): before/after in one run

Workloads (the writer carries COHERENT_SESSION=--session, as an agent's shell would):
  idle       --idle seconds with nothing to do (CPU per second: timers, background threads)
  create     one bash process: `printf ... > small/sI.txt` N times (create+write+close)
  rm         `rm -rf` of small/ and of a tree made untimed beforehand (N files in N/50
             directories): CPU per removed entry (files and directories)

CPU is read two ways: utime+stime of /proc/PID/stat (clock ticks: 10 ms steps, exited
threads included) and the sum of /proc/PID/task/*/schedstat (ns, live threads only). The
tables use schedstat (precise); the tick column is the cross-check.

Usage (root): scripts/bench-cpu.py [--rounds 5] [--files 2000] [--modes coherent,plain,bindfs]
              [--binary target/release/coherent-mount] [--base OTHER/coherent-mount]
              [--session bench] [--threads N] [--idle 2]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def mounted_fuse(mnt):
    """Is the topmost mount at `mnt` a FUSE one? (mountinfo: field 5 is the mount point.)"""
    top = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == mnt:
                sep = fields.index("-")
                top = fields[sep + 1]
    return top is not None and top.startswith("fuse")


def cpu_ns(pid):
    """(schedstat sum over live threads in ns, utime+stime in ns at tick resolution)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass  # a thread that just exited
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    ticks = int(rest[11]) + int(rest[12])  # fields 14 and 15
    return total, ticks * 1_000_000_000 // TICK


def settled_cpu(pid):
    """The daemon's CPU once it is idle: RELEASE and FORGET reach it after close(2) and
    unlink(2) return, so wait until two readings 30 ms apart agree (at most 2 s)."""
    prev = cpu_ns(pid)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        time.sleep(0.03)
        now = cpu_ns(pid)
        if now[0] == prev[0]:
            return now
        prev = now
    return prev


class Mount:
    def __init__(self, mode, root, args):
        self.mode = mode
        self.base = os.path.join(root, mode)
        os.mkdir(self.base)
        self.mnt = os.path.join(self.base, "w")
        os.mkdir(self.mnt)
        state = os.path.join(self.base, "state")
        threads = ["--threads", str(args.threads)] if args.threads else []
        if mode == "bindfs":
            backing = os.path.join(self.base, "b")
            os.mkdir(backing)
            cmd = ["bindfs", "-f", "--multithreaded", backing, self.mnt]
        elif mode == "plain":
            cmd = [args.binary, self.mnt, "--no-coherence"] + threads
        else:
            binary = args.base if mode == "base" else args.binary
            cmd = [binary, self.mnt, "--state-dir", state] + threads
        self.log = open(os.path.join(self.base, "log"), "w")
        env = dict(os.environ, NO_COLOR="1")
        env.pop("COHERENT_SESSION", None)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=self.log, env=env)
        deadline = time.monotonic() + 20
        while not mounted_fuse(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{mode}: not mounted; see {self.log.name}")
            time.sleep(0.01)

    def close(self):
        subprocess.run(["umount", self.mnt], check=False)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.base, ignore_errors=True)


def run(cmd, env):
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    return time.perf_counter() - t


def one_round(mode, root, args, env):
    m = Mount(mode, root, args)
    try:
        pid, d, n = m.proc.pid, m.mnt, args.files
        create = (f"mkdir {d}/small && for ((i = 0; i < {n}; i++)); do "
                  f"printf 'small file %d\\n' $i > {d}/small/s$i.txt || exit 1; done")
        # Idle: what the daemon burns with nothing to do (timers, background threads).
        before = settled_cpu(pid)
        time.sleep(args.idle)
        idle = [(a - b) / args.idle for a, b in zip(cpu_ns(pid), before)]
        before = settled_cpu(pid)
        wall_c = run(["bash", "-c", create], env)
        after = settled_cpu(pid)
        create_cpu = [(a - b) / n for a, b in zip(after, before)]
        # The tree for rm, untimed: N files in N/50 directories.
        dirs = max(1, n // 50)
        tree = (f"for ((j = 0; j < {dirs}; j++)); do mkdir -p {d}/tree/d$j; "
                f"for ((i = 0; i < 50; i++)); do echo x > {d}/tree/d$j/f$i; done; done")
        run(["bash", "-c", tree], env)
        # Removed: small/ and its N files, tree/ and its directories and files.
        entries = 1 + n + 1 + dirs + dirs * 50
        before = settled_cpu(pid)
        wall_r = run(["rm", "-rf", f"{d}/small", f"{d}/tree"], env)
        after = settled_cpu(pid)
        rm_cpu = [(a - b) / entries for a, b in zip(after, before)]
        return {"create": create_cpu, "rm": rm_cpu, "idle": idle, "create_wall": wall_c / n,
                "rm_wall": wall_r / entries}
    finally:
        m.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--modes", default="coherent,plain,bindfs")
    ap.add_argument("--binary", default=os.path.join(REPO, "target/release/coherent-mount"))
    ap.add_argument("--base", help="another coherent-mount build for the `base` mode")
    ap.add_argument("--session", default="bench",
                    help="COHERENT_SESSION of the workloads ('' for none: unattributed)")
    ap.add_argument("--threads", type=int, default=0, help="--threads of coherent-mount")
    ap.add_argument("--idle", type=float, default=2.0,
                    help="seconds of idle mount measured before the workloads")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if args.base and "base" not in modes:
        modes.append("base")
    if os.geteuid() != 0:
        raise SystemExit("run as root (mounts, allow_other)")
    env = dict(os.environ)
    if args.session:
        env["COHERENT_SESSION"] = args.session
    else:
        env.pop("COHERENT_SESSION", None)
    root = tempfile.mkdtemp(prefix="coh-bench-cpu-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", root], check=True)
    results = {m: [] for m in modes}
    try:
        for r in range(args.rounds):
            # Rotate the order so no mode always runs first (a cold machine) or last.
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                results[mode].append(one_round(mode, root, args, env))
                c, x = results[mode][-1]["create"], results[mode][-1]["rm"]
                print(f"round {r + 1} {mode:8} create {c[0] / 1e3:7.1f} us  "
                      f"rm {x[0] / 1e3:7.1f} us", file=sys.stderr)
    finally:
        subprocess.run(["umount", root], check=False)
        os.rmdir(root)

    def med(mode, key, i=None):
        vals = [x[key][i] if i is not None else x[key] for x in results[mode]]
        return statistics.median(vals)

    print(f"Daemon CPU per operation (us), median of {args.rounds} interleaved rounds, "
          f"{args.files} creates, tmpfs, session {args.session or '(none)'}:\n")
    print("| mode | CPU/create | CPU/create (ticks) | CPU/rm entry | CPU/rm entry (ticks) "
          "| wall/create | wall/rm entry | idle CPU (us/s) |")
    print("|---|---|---|---|---|---|---|---|")
    for m in modes:
        print(f"| {m} | {med(m, 'create', 0) / 1e3:.1f} | {med(m, 'create', 1) / 1e3:.1f} "
              f"| {med(m, 'rm', 0) / 1e3:.1f} | {med(m, 'rm', 1) / 1e3:.1f} "
              f"| {med(m, 'create_wall') * 1e6:.1f} | {med(m, 'rm_wall') * 1e6:.1f} "
              f"| {med(m, 'idle', 0) / 1e3:.0f} |")


if __name__ == "__main__":
    main()
