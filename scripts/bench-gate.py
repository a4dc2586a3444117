#!/usr/bin/env python3
"""The regression gate of scripts/bench.sh (--record, --check): rows and their comparison.

A row is one workload on one mount column of one backing, as a ratio to native: the
median of the column's runs over the median of native's runs (the table's ratio). Its
spread is the median absolute deviation of the per-round ratios (column run i over native
run i: the rounds are interleaved, so both saw the same load) from their median: how far a
round typically strays, in the ratio's own unit.

  bench-gate.py rows RAW BACKING
      RAW is bench.sh's raw-*.tsv (backing, mode, workload, run, seconds). Prints the rows of
      BACKING as TSV: backing, workload, mode, ratio, spread, runs (ratio empty when a side
      has no successful run).
  bench-gate.py compare BASELINE CURRENT [--threshold 0.10]
      Both files in the rows format ('#' lines are a header and are ignored). A row is
      WORSE when its ratio grew by more than the threshold (relative to the baseline's
      ratio) AND by more than the two runs' spreads added (the baseline's and this run's:
      a move inside the noise of either is not a regression). A row of the baseline with
      no ratio now (not run, failed) is MISSING. Prints a Markdown table of every row and a
      verdict line; exit 0 when no row is worse or missing, 1 when one is, 2 on bad input.
"""
import csv
import statistics
import sys

FIELDS = ["backing", "workload", "mode", "ratio", "spread", "runs"]


def die(msg):
    print(f"bench-gate: {msg}", file=sys.stderr)
    sys.exit(2)


def mad(xs):
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


def rows(raw_path, backing):
    """The rows of one backing from a raw timings file."""
    times = {}  # (mode, workload) -> {run: seconds}
    order = []  # workloads in the order they ran
    modes = []
    try:
        with open(raw_path, newline="") as f:
            for r in csv.DictReader(f, delimiter="\t"):
                if r["backing"] != backing:
                    continue
                if r["workload"] not in order:
                    order.append(r["workload"])
                if r["mode"] not in modes:
                    modes.append(r["mode"])
                if r["seconds"] == "FAILED":
                    continue
                times.setdefault((r["mode"], r["workload"]), {})[r["run"]] = float(r["seconds"])
    except (OSError, KeyError, ValueError) as e:
        die(f"cannot read {raw_path} as bench.sh raw timings: {e}")
    out = []
    for w in order:
        native = times.get(("native", w), {})
        for m in modes:
            if m == "native":
                continue
            col = times.get((m, w), {})
            ratio = spread = ""
            if native and col and statistics.median(native.values()) > 0:
                ratio = "%.4f" % (statistics.median(col.values()) / statistics.median(native.values()))
                paired = [col[k] / native[k] for k in col if k in native and native[k] > 0]
                spread = "%.4f" % (mad(paired) if paired else 0.0)
            out.append([backing, w, m, ratio, spread, str(len(col))])
    return out


def load(path):
    """Rows of a baseline or current file: {(workload, mode): (ratio or None, spread)}."""
    try:
        with open(path, newline="") as f:
            lines = [ln for ln in f if not ln.startswith("#") and ln.strip()]
    except OSError as e:
        die(f"cannot read {path}: {e}")
    if not lines or lines[0].rstrip("\n").split("\t") != FIELDS:
        die(f"{path}: expected a header line '{chr(9).join(FIELDS)}' (a file written by bench.sh --record)")
    out = {}
    for n, r in enumerate(csv.DictReader(lines, delimiter="\t"), start=2):
        try:
            ratio = float(r["ratio"]) if r["ratio"] else None
            spread = float(r["spread"]) if r["spread"] else 0.0
        except (TypeError, ValueError):
            die(f"{path}: row {n} has a ratio or spread that is not a number: {r}")
        out[(r["workload"], r["mode"])] = (ratio, spread)
    return out


def compare(base_path, cur_path, threshold):
    base, cur = load(base_path), load(cur_path)
    print("| workload | mode | baseline | now | change | spreads (base + now) | verdict |")
    print("|---|---|---:|---:|---:|---:|---|")
    worse = missing = checked = 0
    for key, (b, bs) in base.items():
        w, m = key
        c, cs = cur.get(key, (None, 0.0))
        if b is None:
            print(f"| {w} | {m} | failed | {'' if c is None else '%.3f' % c} | | | no baseline |")
            continue
        if c is None:
            missing += 1
            print(f"| {w} | {m} | {b:.3f} | – | | | MISSING |")
            continue
        checked += 1
        change = c / b - 1
        noise = bs + cs
        if change > threshold and c - b > noise:
            verdict, worse = "WORSE", worse + 1
        elif change < -threshold and b - c > noise:
            verdict = "better"
        elif abs(change) > threshold:
            verdict = "within spread"
        else:
            verdict = "ok"
        print(f"| {w} | {m} | {b:.3f} | {c:.3f} | {change:+.1%} | {noise:.3f} | {verdict} |")
    for key, (c, _) in cur.items():
        if key not in base:
            print(f"| {key[0]} | {key[1]} | – | {'' if c is None else '%.3f' % c} | | | new (not gated) |")
    print()
    failed = worse + missing
    print(f"gate: {checked} rows compared, {worse} worse by more than {threshold:.0%} and their spread, "
          f"{missing} missing: {'FAIL' if failed else 'pass'}")
    return 1 if failed else 0


def main(argv):
    if len(argv) >= 1 and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) == 3 and argv[0] == "rows":
        w = csv.writer(sys.stdout, delimiter="\t", lineterminator="\n")
        w.writerow(FIELDS)
        w.writerows(rows(argv[1], argv[2]))
        return 0
    if len(argv) in (3, 5) and argv[0] == "compare":
        threshold = 0.10
        if len(argv) == 5:
            if argv[3] != "--threshold":
                die(f"unknown argument {argv[3]} (see --help)")
            try:
                threshold = float(argv[4])
            except ValueError:
                die(f"--threshold wants a fraction such as 0.10, not {argv[4]}")
        return compare(argv[1], argv[2], threshold)
    die("usage: bench-gate.py rows RAW BACKING | compare BASELINE CURRENT [--threshold 0.10] (see --help)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
