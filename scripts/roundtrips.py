#!/usr/bin/env python3
"""Round trips per operation: mount coherent-mount (in place, and over a separate backing
directory), do each operation with plain syscalls, and count the FUSE requests the daemon
served for it (its per-opcode counters, logged on SIGUSR1). Prints a Markdown table.

Each operation runs in a process of its own, as root (the owner of everything) and, in a
third column, as a user who owns neither the mount root nor the files read in it (`coh-u2`,
scripts/test-users.sh), for whom the kernel also asks for POSIX ACLs (docs/permissions.md).

Usage: python3 scripts/roundtrips.py [path/to/coherent-mount] (default target/release)."""
import os, pwd, re, signal, subprocess, sys, tempfile, time

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
        ("5 creates in a row (new files), in one process", lambda: [create(os.path.join(mnt, f"c{i}")) for i in range(5)]),
        ("5 unlinks in a row, in one process", lambda: [os.unlink(os.path.join(mnt, f"c{i}")) for i in range(5)]),
        ("rm -rf of a tree not seen before (2 dirs, 4 files)", lambda: subprocess.run(["rm", "-rf", t], check=True)),
        ("listdir (opendir+readdir) twice", lambda: [os.listdir(mnt) for _ in range(2)]),
        ("open+read+close of `.coherent/status`", lambda: read(os.path.join(mnt, ".coherent", "status"))),
    ]


def as_user(user, op):
    """Run `op` in a child process, as `user` when given (a fresh process each time, as a
    shell command would be)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if user:
                pw = pwd.getpwnam(user)
                os.setgroups([]); os.setgid(pw.pw_gid); os.setuid(pw.pw_uid)
            op(); code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit(f"an operation failed (as {user or 'root'}), status {status}")


def measure(in_place, user=None):
    with tempfile.TemporaryDirectory(prefix="roundtrips-") as d:
        os.chmod(d, 0o755)
        backing = os.path.join(d, "b"); os.mkdir(backing)
        # A shared workspace: anyone may create in it, the mount root is root's.
        os.chmod(backing, 0o1777)
        with open(os.path.join(backing, "f"), "w") as fh:
            fh.write("hello\n")
        owner = pwd.getpwnam(user) if user else None
        for sub in ("t", "t/a"):
            os.mkdir(os.path.join(backing, sub))
            for n in ("1", "2"):
                open(os.path.join(backing, sub, n), "w").close()
        if owner:
            # The tree `rm -rf` removes is the user's own.
            for root, dirs, files in os.walk(os.path.join(backing, "t")):
                for n in [root] + [os.path.join(root, x) for x in files]:
                    os.chown(n, owner.pw_uid, owner.pw_gid)
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
                as_user(user, op)
                # RELEASE (and FORGET) are sent after close(2)/unlink(2) return: let them land.
                time.sleep(0.2)
                b = counters(proc, logf)
                diff = {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) != a.get(k, 0)}
                rows.append((name, sum(diff.values()), " ".join(f"{k} {v}" for k, v in sorted(diff.items()))))
            return rows
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)


if os.geteuid() != 0:
    raise SystemExit("roundtrips.py: run as root (it mounts, and runs the third column as coh-u2)")
try:
    pwd.getpwnam("coh-u2")
except KeyError:
    raise SystemExit("roundtrips.py: no user coh-u2 for the third column: run scripts/test-users.sh first")
sep, inp, other = measure(False), measure(True), measure(True, "coh-u2")
print("| operation | separate backing (1 s TTL): requests | which | in place: requests | which "
      "| in place, as coh-u2 (owns neither the root nor `f`): requests | which |")
print("|---|---:|---|---:|---|---:|---|")
for (n, c1, w1), (_, c2, w2), (_, c3, w3) in zip(sep, inp, other):
    print(f"| {n} | {c1} | {w1} | {c2} | {w2} | {c3} | {w3} |")
