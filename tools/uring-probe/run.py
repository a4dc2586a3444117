#!/usr/bin/env python3
"""Interleave uring-probe runs over transports, thread counts and client counts;
print the medians as a Markdown table.

Needs root (mounts; FUSE passthrough; writes /sys/module/fuse/parameters/enable_uring,
which is set to Y for the duration and restored afterwards).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PARAM = "/sys/module/fuse/parameters/enable_uring"


def configs(quick):
    out = []
    for clients in (1, 4):
        for t in (1, 2, 4, 8):
            out.append(("fuser", t, clients))
        # fractal-fuse caps workers at the number of possible CPUs (one ring queue per CPU).
        for t in (1, 2):
            out.append(("uring", t, clients))
    return out[:4] if quick else out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stats", type=int, default=200_000)
    ap.add_argument("--opens", type=int, default=50_000)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="fuser only, one client: a smoke run")
    ap.add_argument("--only", help="comma-separated TRANSPORT:THREADS to keep, e.g. fuser:2,uring:2")
    ap.add_argument("--json", help="append every run's JSON line to this file")
    args = ap.parse_args()

    binary = os.path.join(HERE, "target", "release", "uring-probe")
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=HERE, check=True,
                   env={**os.environ, "CARGO_TARGET_DIR": os.path.join(HERE, "target")})
    with open(PARAM) as f:
        original = f.read().strip()
    runs = {}
    cfgs = configs(args.quick)
    if args.only:
        keep = {tuple(x.split(":")) for x in args.only.split(",")}
        cfgs = [c for c in cfgs if (c[0], str(c[1])) in keep]
    try:
        with open(PARAM, "w") as f:
            f.write("Y")
        for r in range(args.rounds):
            # Rotate the order so no configuration always runs first in a round.
            order = cfgs[r % len(cfgs):] + cfgs[:r % len(cfgs)]
            for transport, threads, clients in order:
                cmd = [binary, "--transport", transport, "--threads", str(threads),
                       "--clients", str(clients), "--files", str(args.files),
                       "--stats", str(args.stats), "--opens", str(args.opens)]
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                if p.returncode != 0:
                    sys.exit(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
                line = json.loads(p.stdout)
                # The figures only mean something if every call was a round trip and the
                # transport served data and passthrough correctly.
                bad = [f"{k}={line[k]!r}" for k, want in
                       (("data", "ok"), ("passthrough", "passthrough")) if line[k] != want]
                if line["stat"]["requests_per_call"] < 2:
                    bad.append(f"stat requests_per_call={line['stat']['requests_per_call']}")
                if bad:
                    sys.exit(f"{' '.join(cmd)}: {', '.join(bad)}")
                runs.setdefault((transport, threads, clients), []).append(line)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(p.stdout)
                print(f"round {r + 1} {transport} t={threads} c={clients}: "
                      f"stat {line['stat']['us_per_call']:.1f} us, "
                      f"open+close {line['open_close']['us_per_call']:.1f} us, "
                      f"load {line['load']}", file=sys.stderr)
    finally:
        with open(PARAM, "w") as f:
            f.write(original)

    print("| transport | threads | clients | stat µs/call | µs/round trip | CPU µs/round trip "
          "| open+close µs/call | µs/round trip | CPU µs/round trip "
          "| round trips (stat / open+close) | passthrough | load (1-min) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (transport, threads, clients), ls in runs.items():
        med = lambda ph, k: statistics.median(x[ph][k] for x in ls)
        loads = [float(x["load"].split()[0]) for x in ls]
        pts = sorted({x["passthrough"] for x in ls})
        print(f"| {transport} | {threads} | {clients} | {med('stat', 'us_per_call'):.1f} "
              f"| {med('stat', 'us_per_round_trip'):.1f} | {med('stat', 'cpu_us_per_round_trip'):.1f} "
              f"| {med('open_close', 'us_per_call'):.1f} "
              f"| {med('open_close', 'us_per_round_trip'):.1f} "
              f"| {med('open_close', 'cpu_us_per_round_trip'):.1f} "
              f"| {med('stat', 'requests_per_call'):.2f} / {med('open_close', 'requests_per_call'):.2f} "
              f"| {', '.join(pts)} | {min(loads):.1f}–{max(loads):.1f} |")


if __name__ == "__main__":
    main()
