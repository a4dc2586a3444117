#!/usr/bin/env python3
"""Draws bench.sh's ratio table as a horizontal bar chart in SVG (stdlib only).

Usage: scripts/plot.py RATIOS.tsv OUT.svg [--title TEXT]

RATIOS.tsv has the header `backing workload mode ratio` (tab-separated), one line per
(backing, workload, mode); an empty ratio means the run failed. One panel per backing,
one group of bars per workload, one bar per mode; the x axis is logarithmic (a bar twice
as long is not twice as slow) with native at 1. A mode keeps its colour on every panel:
bench.sh names a column by its mode, so on the "in place" panel a peer's bar is that peer
mounted over its own directory (coherent-inplace, bindfs-inplace, cref-inplace).
"""

import argparse
import csv
import math
from html import escape

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]
LABEL_W = 330  # workload names (widened to the longest)
PLOT_W = 560
RIGHT_PAD = 70  # room for the value after the longest bar
BAR_H = 11
GROUP_GAP = 9
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    backings, workloads, modes = [], {}, []
    values = {}
    for r in rows:
        b, w, m = r["backing"], r["workload"], r["mode"]
        if b not in backings:
            backings.append(b)
            workloads[b] = []
        if w not in workloads[b]:
            workloads[b].append(w)
        if m not in modes:
            modes.append(m)
        values[(b, w, m)] = float(r["ratio"]) if r["ratio"] else None
    return backings, workloads, modes, values


def nice_ticks(lo, hi):
    ticks = []
    decade = 10.0 ** math.floor(math.log10(lo))
    while decade <= hi * 10:
        for k in (1, 2, 5):
            v = k * decade
            if lo <= v <= hi:
                ticks.append(v)
        decade *= 10
    return ticks


def fmt(v):
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def svg(backings, workloads, modes, values, title):
    global LABEL_W
    longest = max(len(w) for ws in workloads.values() for w in ws)
    LABEL_W = max(LABEL_W, int(longest * 6.3) + 20)
    known = [v for v in values.values() if v]
    lo = min([0.5] + [v * 0.8 for v in known])
    hi = max([2.0] + [v * 1.15 for v in known])
    # start the axis at the 1-2-5 step just below the smallest bar
    e = 10.0 ** math.floor(math.log10(lo))
    lo = max(k * e for k in (1, 2, 5) if k * e <= lo)
    span = math.log10(hi) - math.log10(lo)

    def x(v):
        return LABEL_W + PLOT_W * (math.log10(v) - math.log10(lo)) / span

    group_h = len(modes) * BAR_H + GROUP_GAP
    out, y = [], 34
    # legend
    lx = LABEL_W
    for i, m in enumerate(modes):
        out.append(f"<rect x='{lx}' y='{y}' width='12' height='12' fill='{COLOURS[i % len(COLOURS)]}'/>")
        out.append(f"<text x='{lx + 16}' y='{y + 10}' font-size='12' {FONT}>{escape(m)}</text>")
        lx += 22 + 7 * len(m)
    y += 30
    for b in backings:
        out.append(f"<text x='10' y='{y + 12}' font-size='14' font-weight='bold' {FONT}>{escape(b)} backing</text>")
        y += 22
        top = y
        bottom = y + group_h * len(workloads[b])
        for gi in range(1, len(workloads[b]), 2):
            gy = top + gi * group_h
            out.append(f"<rect x='5' y='{gy - 2}' width='{LABEL_W + PLOT_W + RIGHT_PAD - 5}' height='{group_h - GROUP_GAP + 4}' fill='#f2f2f2'/>")
        for t in nice_ticks(lo, hi):
            tx = x(t)
            colour, width = ("#000", 1.5) if t == 1 else ("#ccc", 1)
            out.append(f"<line x1='{tx:.1f}' y1='{top - 4}' x2='{tx:.1f}' y2='{bottom}' stroke='{colour}' stroke-width='{width}'/>")
            out.append(f"<text x='{tx:.1f}' y='{bottom + 13}' font-size='10' text-anchor='middle' {FONT}>{t:g}x</text>")
        out.append(f"<text x='{x(1) + 3:.1f}' y='{top - 6}' font-size='10' font-weight='bold' {FONT}>native</text>")
        for gi, w in enumerate(workloads[b]):
            gy = top + gi * group_h
            out.append(f"<text x='{LABEL_W - 8}' y='{gy + (group_h - GROUP_GAP) / 2 + 4:.1f}' font-size='11' text-anchor='end' {FONT}>{escape(w)}</text>")
            for mi, m in enumerate(modes):
                v = values.get((b, w, m))
                by = gy + mi * BAR_H
                if v is None:
                    out.append(f"<text x='{LABEL_W + 4}' y='{by + BAR_H - 2}' font-size='9' fill='#888' {FONT}>{escape(m)}: failed</text>")
                    continue
                x0, x1 = x(lo), x(v)
                out.append(f"<rect x='{x0:.1f}' y='{by}' width='{max(x1 - x0, 1):.1f}' height='{BAR_H - 1}' fill='{COLOURS[mi % len(COLOURS)]}'><title>{escape(m)}: {fmt(v)}x</title></rect>")
                out.append(f"<text x='{x1 + 3:.1f}' y='{by + BAR_H - 2}' font-size='9' {FONT}>{fmt(v)}</text>")
        y = bottom + 34
    width = LABEL_W + PLOT_W + RIGHT_PAD
    head = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{y}' viewBox='0 0 {width} {y}'>",
        f"<rect width='{width}' height='{y}' fill='white'/>",
        f"<text x='10' y='20' font-size='15' font-weight='bold' {FONT}>{escape(title)}</text>",
    ]
    return "\n".join(head + out + ["</svg>", ""])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ratios")
    ap.add_argument("out")
    ap.add_argument("--title", default="Time relative to native")
    a = ap.parse_args()
    backings, workloads, modes, values = read(a.ratios)
    if not backings:
        raise SystemExit(f"{a.ratios}: no rows")
    with open(a.out, "w") as f:
        f.write(svg(backings, workloads, modes, values, a.title + " — lower is better"))


if __name__ == "__main__":
    main()
