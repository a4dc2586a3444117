#!/usr/bin/env python3
"""Revoke latency across hosts (docs/multi-host.md): two mounts of one backing directory
(hosts A and B) on one etcd. N times: alice reads plan.md on A and hands it to bob there;
from the moment A acknowledges the transfer, alice's open for writing on B is tried until
it is refused (EACCES, reason fenced). Then alice withdraws and appends (untimed) so the
next transfer is a new one.

Prints p50/p90/p99/max of the transfer's round trip on A and of the revoke latency (A's
acknowledgement to the first refusal on B), and how many writes B admitted after the
acknowledgement (must be 0). Raw numbers go to target/bench/revoke-raw.tsv.

Usage: python3 scripts/bench-revoke.py [--transfers 1000] [--ttl 5s] [--bin target/release]
"""
import argparse, errno, importlib.util, os, shutil, signal, statistics, sys, tempfile, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The mounts, etcd and the ctl descriptor are bench-coord's: one owner.
_spec = importlib.util.spec_from_file_location(
    "bench_coord", os.path.join(REPO, "scripts", "bench-coord.py"))
bc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bc)


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def refused_on(path):
    """alice's open for writing on the other host: True when refused EACCES."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as e:
        if e.errno == errno.EACCES:
            return True
        bc.die(f"open {path}: unexpected {e}")
    os.close(fd)
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transfers", type=int, default=1000)
    ap.add_argument("--ttl", default="5s", help="--coordinator-ttl of both hosts")
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release"))
    args = ap.parse_args()
    if os.environ.get("COHERENT_SESSION") != "alice":
        # the volume reads the session from /proc/PID/environ: set it at exec
        os.execve(sys.executable, [sys.executable] + sys.argv,
                  dict(os.environ, COHERENT_SESSION="alice"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    base = tempfile.mkdtemp(prefix="coh-bench-revoke-")
    b = bc.Bench(args)
    try:
        run(b, args, base)
    finally:
        b.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def run(b, args, base):
    url = b.start_etcd(base)
    back = os.path.join(base, "backing")
    os.mkdir(back)
    mnts = {}
    for h in ("A", "B"):
        mnt, st = os.path.join(base, f"mnt-{h}"), os.path.join(base, f"state-{h}")
        os.mkdir(mnt)
        b.mount(back, mnt, st, ["--coordinator", url, "--host-id", h,
                                "--coordinator-ttl", args.ttl], os.path.join(base, f"{h}.log"))
        mnts[h] = mnt
    bc.as_bob(os.path.join(mnts["A"], "x"), 0)  # bob registers
    ctl = bc.Ctl(mnts["A"])
    on_a, on_b = (os.path.join(mnts[h], "plan.md") for h in ("A", "B"))
    bc.write_settled(on_a, "w", "plan\n")
    trans, revoke, admitted = [], [], 0
    for i in range(args.transfers):
        bc.read_file(on_a)
        trans.append(bc.transfer(ctl, "plan.md"))
        acked = time.perf_counter()
        tries = 0
        while not refused_on(on_b):
            admitted += 1  # an open B admitted after A acknowledged: the fence leaked
            tries += 1
            if tries > 10000:
                bc.die("B never refused the giver")
        revoke.append(time.perf_counter() - acked)
        err, rep = ctl.call("withdraw plan.md")
        if err or not rep.get("ok"):
            bc.die(f"withdraw: errno {err} {rep}")
        bc.write_settled(on_a, "a", ".")
    out = os.path.join(REPO, "target", "bench")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "revoke-raw.tsv"), "w") as f:
        f.write("i\ttransfer_s\trevoke_s\n")
        for i, (t, r) in enumerate(zip(trans, revoke)):
            f.write(f"{i}\t{t:.6f}\t{r:.6f}\n")
    ms = lambda x: f"{x * 1000:.2f}"
    print(f"{args.transfers} transfers on A, giver's open on B after each acknowledgement")
    print("| measure | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    for name, xs in (("transfer (A)", trans), ("revoke: ack on A to refusal on B", revoke)):
        print(f"| {name} | {ms(pct(xs, 50))} | {ms(pct(xs, 90))} | {ms(pct(xs, 99))} | "
              f"{ms(max(xs))} |")
    print(f"writes admitted on B after an acknowledgement: {admitted}")
    print(f"transfers retried (giver's close not yet seen): {sum(bc.RETRIES.values())}")
    if admitted:
        sys.exit(1)


if __name__ == "__main__":
    main()
