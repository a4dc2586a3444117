#!/usr/bin/env python3
"""Flame graph of a `perf script` dump, as a standalone SVG (no JavaScript needed; each
box's full name and share is in its tooltip).

  perf script -i perf.data | scripts/flame.py --title "create storm" > docs/flame-create.svg
  scripts/flame.py --folded < perf.script > stacks.folded     # the folded stacks only
  scripts/flame.py --top 25 < perf.script                      # self/total cost table

Stacks are folded root first (`a;b;c count`), weighted by the sample period (ns with
perf's default cpu-clock event). Rust
symbols lose their hash suffix; legacy-mangled ones (`_ZN...E`) are demangled here.
`--keep-thread` keeps the thread name as the root frame (default: merge threads);
`--cut REGEX` drops the frames below the last one matching it (the thread start and the
request loop every stack shares), so the SVG stays small; boxes narrower than 2.5 px (a
sample or two) are left out.
"""
import argparse
import html
import re
import sys
from collections import defaultdict

HEADER = re.compile(r"^(\S.*?)\s+(\d+)(?:/(\d+))?\s+.*?:\s*(\d+)?\s*\S+:\s*$")
FRAME = re.compile(r"^\s+([0-9a-f]+)\s+(.*?)(?:\s+\((.*)\))?$")
ESCAPES = {"$SP$": "@", "$BP$": "*", "$RF$": "&", "$LT$": "<", "$GT$": ">", "$LP$": "(",
           "$RP$": ")", "$C$": ",", "$u7e$": "~", "$u20$": " ", "$u27$": "'", "$u5b$": "[",
           "$u5d$": "]", "$u7b$": "{", "$u7d$": "}", "$u3b$": ";", "$u2b$": "+", "$u22$": '"'}


def demangle(sym):
    """Legacy Rust mangling: `_ZN` then length-prefixed segments then `E`."""
    m = re.match(r"_?_ZN(.*)E$", sym)
    if not m:
        return sym
    rest, parts = m.group(1), []
    while rest:
        n = re.match(r"(\d+)", rest)
        if not n:
            return sym
        k = int(n.group(1))
        start = len(n.group(1))
        parts.append(rest[start:start + k])
        rest = rest[start + k:]
    if parts and re.fullmatch(r"h[0-9a-f]{16}", parts[-1]):
        parts.pop()
    out = "::".join(parts)
    for k, v in ESCAPES.items():
        out = out.replace(k, v)
    return out.replace("..", "::")


def clean(sym, dso):
    if not sym or sym == "[unknown]":
        return f"[{dso.rsplit('/', 1)[-1]}]" if dso else "[unknown]"
    sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
    sym = demangle(sym)
    sym = re.sub(r"::h[0-9a-f]{16}$", "", sym)
    return sym.replace(";", ":")


def fold(lines, keep_thread, cut=None):
    stacks = defaultdict(int)
    frames, weight, comm = [], 1, ""
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if frames or comm:
                stack = list(reversed(frames))
                if cut:
                    hits = [i for i, f in enumerate(stack) if cut.search(f)]
                    if hits:
                        stack = stack[hits[-1]:]
                if keep_thread:
                    stack.insert(0, comm)
                if stack:
                    stacks[";".join(stack)] += weight
            frames, weight, comm = [], 1, ""
            continue
        if not line[0].isspace():
            h = HEADER.match(line)
            comm = h.group(1) if h else line.split()[0]
            w = re.search(r"\s(\d+)\s+\S+:\s*$", line)
            weight = int(w.group(1)) if w else 1
            continue
        f = FRAME.match(line)
        if f:
            frames.append(clean(f.group(2), f.group(3)))
    if frames:
        stacks[";".join(reversed(frames))] += weight
    return stacks


def tree(stacks):
    root = {"name": "all", "value": 0, "children": {}}
    for stack, n in stacks.items():
        root["value"] += n
        node = root
        for name in stack.split(";"):
            node = node["children"].setdefault(name, {"name": name, "value": 0,
                                                      "children": {}})
            node["value"] += n
    return root


def color(name):
    h = sum(map(ord, name)) % 60
    if name.startswith("coherent::"):
        return f"rgb({220 + h % 35},{120 + h},{40})"
    if name.startswith("[k]") or name.startswith("__") or name.islower() and "::" not in name:
        return f"rgb({200 + h % 55},{90 + h},{90})"
    return f"rgb({225 + h % 30},{160 + h},{60 + h})"


def svg(root, title, width=1200, row=16, min_px=2.5):
    total = root["value"] or 1
    boxes, depth_max = [], 0

    def walk(node, x, depth):
        nonlocal depth_max
        w = node["value"] / total * (width - 20)
        if w < min_px:
            return
        depth_max = max(depth_max, depth)
        boxes.append((x, depth, w, node["name"], node["value"]))
        cx = x
        for child in sorted(node["children"].values(), key=lambda c: c["name"]):
            walk(child, cx, depth + 1)
            cx += child["value"] / total * (width - 20)

    walk(root, 10, 0)
    height = (depth_max + 1) * row + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           f'<rect width="100%" height="100%" fill="#fdfdf5"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15">'
           f'{html.escape(title)}</text>']
    for x, depth, w, name, value in boxes:
        y = height - 20 - (depth + 1) * row
        pct = 100 * value / total
        tip = html.escape(f"{name} ({value / 1e6:.1f} ms of CPU, {pct:.2f}%)")
        out.append(f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
                   f'height="{row - 1}" fill="{color(name)}"/>')
        chars = int(w / 6.6)
        if chars >= 3:
            label = name if len(name) <= chars else name[:chars - 2] + ".."
            out.append(f'<text x="{x + 3:.1f}" y="{y + row - 4}">{html.escape(label)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def top(stacks, n):
    total = sum(stacks.values()) or 1
    self_cost, incl = defaultdict(int), defaultdict(int)
    for stack, w in stacks.items():
        frames = stack.split(";")
        self_cost[frames[-1]] += w
        for f in set(frames):
            incl[f] += w
    print(f"{'self %':>7} {'total %':>8}  function")
    for name, w in sorted(self_cost.items(), key=lambda x: -x[1])[:n]:
        print(f"{100 * w / total:7.2f} {100 * incl[name] / total:8.2f}  {name}")
    print()
    print(f"{'total %':>8}  function (inclusive, coherent:: only)")
    ours = [(k, v) for k, v in incl.items() if k.startswith("coherent::")]
    for name, w in sorted(ours, key=lambda x: -x[1])[:n]:
        print(f"{100 * w / total:8.2f}  {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--title", default="flame graph")
    ap.add_argument("--folded", action="store_true", help="print folded stacks, no SVG")
    ap.add_argument("--top", type=int, default=0, help="print the N costliest functions")
    ap.add_argument("--keep-thread", action="store_true")
    ap.add_argument("--cut", type=re.compile, help="start stacks at the last frame matching")
    args = ap.parse_args()
    stacks = fold(sys.stdin, args.keep_thread, args.cut)
    if args.folded:
        for s, n in sorted(stacks.items()):
            print(f"{s} {n}")
    elif args.top:
        top(stacks, args.top)
    else:
        print(svg(tree(stacks), args.title))


if __name__ == "__main__":
    main()
