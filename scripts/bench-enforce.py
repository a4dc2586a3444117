#!/usr/bin/env python3
"""Enforcement measurements: transfer round trip (CLI and raw ctl) and a small-file
create storm / read storm on the enforcing mount vs --no-coherence vs native."""
import os, subprocess, sys, time, statistics, tempfile, shutil

REL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "target", "release")
MOUNT = f"{REL}/coherent-mount"
CLI = f"{REL}/coherent"


def mount(back, mnt, extra):
    p = subprocess.Popen([MOUNT, back, mnt] + extra, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(500):
        if os.path.ismount(mnt):
            return p
        time.sleep(0.01)
    raise SystemExit("mount failed")


def unmount(p, mnt):
    p.terminate()
    p.wait(timeout=20)


def storm(root, n, tag):
    d = os.path.join(root, tag)
    os.mkdir(d)
    t0 = time.perf_counter()
    for i in range(n):
        fd = os.open(f"{d}/f{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"x" * 100)
        os.close(fd)
    t1 = time.perf_counter()
    for i in range(n):
        fd = os.open(f"{d}/f{i}", os.O_RDONLY)
        os.read(fd, 4096)
        os.close(fd)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def storms(root, runs, n):
    c, r = [], []
    for k in range(runs):
        a, b = storm(root, n, f"run{k}-{time.time_ns()}")
        c.append(a)
        r.append(b)
    return statistics.median(c), statistics.median(r)


def main():
    if os.environ.get("COHERENT_SESSION") != "alice":
        # the volume reads the session from /proc/PID/environ: set it at exec
        os.execve(sys.executable, [sys.executable] + sys.argv,
                  dict(os.environ, COHERENT_SESSION="alice"))
    base = tempfile.mkdtemp(prefix="coh-bench-")
    back, mnt, st = (os.path.join(base, x) for x in ("b", "m", "s"))
    for x in (back, mnt):
        os.mkdir(x)
    runs, n = 7, 2000

    # ---- create/read storm: native, plain passthrough volume, enforcing volume,
    # interleaved run by run (the machine is shared: noise hits all three alike)
    b1, m1 = os.path.join(base, "b1"), os.path.join(base, "m1")
    os.mkdir(b1); os.mkdir(m1)
    p1 = mount(b1, m1, ["--no-coherence"])
    p = mount(back, mnt, ["--state-dir", st])
    roots = {"native": os.path.join(base, "native"), "no-coherence": m1, "enforcing": mnt}
    os.mkdir(roots["native"])
    res = {k: ([], []) for k in roots}
    for k in range(runs):
        order = list(roots.items())
        order = order[k % 3:] + order[:k % 3]
        for name, root in order:
            a, b = storm(root, n, f"run{k}")
            res[name][0].append(a)
            res[name][1].append(b)
    unmount(p1, m1)
    med = {k: (statistics.median(c), statistics.median(r)) for k, (c, r) in res.items()}
    for k, (c, r) in med.items():
        print(f"{k:13s} create {n}: {c*1000:8.1f} ms ({c/n*1e6:6.1f} us/file)   "
              f"open+read {n}: {r*1000:8.1f} ms ({r/n*1e6:6.1f} us/file)", flush=True)
    pc, pr = med["no-coherence"]
    ec, er = med["enforcing"]
    print(f"enforcement cost vs plain volume: create {100*(ec/pc-1):+.1f}%, "
          f"read {100*(er/pr-1):+.1f}%", flush=True)

    # ---- transfer round trips
    f = os.path.join(mnt, "plan.md")
    with open(f, "w") as h:
        h.write("plan\n")
    ctl = os.path.join(mnt, ".coherent/ctl")
    N = 200
    # each successor registers itself (a process registers only its own session)
    for i in range(N):
        subprocess.run([CLI, "register"], check=True, stdout=subprocess.DEVNULL, cwd=mnt,
                       env=dict(os.environ, COHERENT_SESSION=f"s{i}"))
    cli, raw = [], []
    for i in range(N):
        open(f).read()  # a view (S hold) at the current version
        t0 = time.perf_counter()
        subprocess.run([CLI, "transfer", "--to", f"s{i}", f], check=True, stdout=subprocess.DEVNULL)
        cli.append(time.perf_counter() - t0)
        subprocess.run([CLI, "withdraw", f], check=True, stdout=subprocess.DEVNULL)
    # move the version: the CLI loop's (withdrawn) transfers ended at the old one
    with open(f, "a") as h:
        h.write("x\n")
    time.sleep(0.05)
    for i in range(N):
        open(f).read()
        t0 = time.perf_counter()
        fd = os.open(ctl, os.O_RDWR)
        os.write(fd, f"transfer --to s{i} plan.md".encode())
        rep = os.pread(fd, 65536, 0)
        os.close(fd)
        raw.append(time.perf_counter() - t0)
        assert b'"ok":true' in rep, rep
        fd = os.open(ctl, os.O_RDWR)
        os.write(fd, b"withdraw plan.md")
        os.close(fd)
    q = lambda xs: (statistics.median(xs) * 1e3, sorted(xs)[int(len(xs) * 0.9)] * 1e3)
    print("coherent transfer (CLI process) round trip: median %.2f ms, p90 %.2f ms" % q(cli))
    print("raw ctl open+write+pread+close (transfer):   median %.3f ms, p90 %.3f ms" % q(raw))
    unmount(p, mnt)
    shutil.rmtree(base, ignore_errors=True)


main()
