#!/usr/bin/env python3
"""Deterministic source tree for scripts/bench.sh.

gen-tree.py ROOT [FILES] [DIRS] [SEED]: FILES text files (sizes log-uniform between 1 KiB
and 256 KiB, so mostly small, like a source tree) spread over DIRS nested directories.
Every 50th file carries the word COHERENT_NEEDLE, which the grep workload looks for.
Same arguments, same bytes: random.Random with an integer seed is stable across Pythons.
"""
import math
import os
import random
import sys


def main() -> None:
    # A root that looks like an option (`--help`) is a mistake, not a directory to fill.
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    root = sys.argv[1]
    nfiles = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    ndirs = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 42)

    letters = "abcdefghijklmnopqrstuvwxyz_"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 12))) for _ in range(4000)]
    # A 4 MiB pool of text lines; each file is a slice of it at a random offset.
    lines, size = [], 0
    while size < 4 << 20:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) + "\n"
        lines.append(line)
        size += len(line)
    pool = "".join(lines).encode()

    # Nested directories: each new one goes under the root or an earlier one.
    dirs = [root]
    os.makedirs(root, exist_ok=False)
    for i in range(ndirs):
        d = os.path.join(rng.choice(dirs[: 1 + len(dirs) // 2] if i % 3 else dirs), f"d{i:03d}")
        os.mkdir(d)
        dirs.append(d)

    lo, hi = math.log(1024), math.log(256 * 1024)
    total = 0
    for i in range(nfiles):
        n = int(math.exp(rng.uniform(lo, hi)))
        off = rng.randrange(len(pool) - n)
        data = pool[off : off + n]
        if i % 50 == 0:
            data = b"COHERENT_NEEDLE\n" + data[16:]
        with open(os.path.join(rng.choice(dirs[1:]), f"f{i:05d}.txt"), "wb") as f:
            f.write(data)
        total += n
    print(f"{nfiles} files, {ndirs} dirs, {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
