#!/usr/bin/env bash
# The content history's own numbers (docs/history.md): on one coherent mount (release
# build, history on, default bounds),
#  1. `coherent undo --session S` of a session that changed N files (default 1000) that
#     were in the directory before the volume (so each has a `base` copy too): median of
#     RUNS rounds, each with a fresh session;
#  2. the store's size after the bench's write rows run in the mount: a tree copied in
#     (gen-tree.py, cp -a), 2000 small files created, a 64 MiB sequential write, a git
#     clone of this repository and `git checkout` 40 commits back and return.
# The cost of history on each row is measured by scripts/bench.sh with the modes coherent
# and coherent-nohist (coherent-mount --history-max 0) side by side.
#
# Usage: scripts/bench-history.sh [N] [RUNS]     Env: BENCH_DIR (default under target/)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
N=${1:-1000}
RUNS=${2:-3}
CLI=$REPO_ROOT/target/release/coherent
[[ -x $COHERENT_MOUNT && -x $CLI ]] || die "build first: cargo build --release --bins"
W=${BENCH_DIR:-$REPO_ROOT/target/bench-history}
rm -rf "$W" && mkdir -p "$W/b" "$W/m" "$W/state"
cleanup() {
    cd / # a working directory inside the mount would keep a lazy unmount (and the daemon) alive
    fusermount3 -u "$W/m" 2>/dev/null || umount -l "$W/m" 2>/dev/null || true
    [[ -z ${PID:-} ]] || wait "$PID" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$W/b/src"
for ((i = 0; i < N; i++)); do
    printf 'file %d\nline two\n' "$i" >"$W/b/src/f$i.txt"
done
"$COHERENT_MOUNT" "$W/b" "$W/m" --state-dir "$W/state" 2>"$W/daemon.log" &
PID=$!
for _ in $(seq 100); do [[ -e $W/m/.coherent/ctl ]] && break; sleep 0.1; done
[[ -e $W/m/.coherent/ctl ]] || die "the mount did not come up: $(cat "$W/daemon.log")"
cd "$W/m"

times=()
for ((r = 0; r < RUNS; r++)); do
    s="bench-s$r"
    COHERENT_SESSION=$s python3 -S -c "
import sys
for i in range($N):
    with open('src/f%d.txt' % i, 'a') as f: f.write('changed by $s\n')
"
    t0=$(date +%s.%N)
    COHERENT_SESSION="bench-undo$r" "$CLI" undo --session "$s" >/dev/null
    t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc)")
    # every file is back
    if grep -l "changed by $s" src/*.txt >/dev/null 2>&1; then die "undo left changes of $s"; fi
done
median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "undo of a session that changed $N files: median ${median} s of ${times[*]}"
# What the store takes on disk (allocated blocks: packs are sparse where contents were
# pruned), and how many contents it holds (files of their own, and live pack entries).
store_size() { echo "$(($(du -sk "$W/state/history" | cut -f1) * 1024)) bytes on disk"; }
contents() {
    python3 - "$W/state/history/objects" <<'PY'
import os, sys
d = sys.argv[1]
n = 0
for f in os.listdir(d):
    if f.endswith(".idx"):
        b = open(os.path.join(d, f), "rb").read()
        n += sum(1 for i in range(0, len(b) - 55, 56) if b[i:i + 4] == b"CPK1")
    elif not f.startswith("pack-"):
        n += 1
print(n)
PY
}
echo "store after $RUNS rounds of $N files: $(store_size), $(contents) contents"

# the bench's write rows in the same mount
python3 "$REPO_ROOT/scripts/gen-tree.py" "$W/tree-src" 3000 300 42 2>/dev/null
cp -a "$W/tree-src" tree
mkdir small && for ((i = 0; i < 2000; i++)); do printf 'small file %d\n' "$i" >"small/s$i.txt"; done
dd if=/dev/zero of=big.dat bs=1M count=64 status=none
git clone -q --no-hardlinks "$REPO_ROOT" clone
old=$(git -C clone rev-list --max-count=41 HEAD | tail -1)
git -C clone checkout -q "$old" && git -C clone checkout -q -
sync
echo "store after the bench's write rows (tree $(du -sb tree | cut -f1) bytes, clone \
$(du -sb --exclude=.git clone | cut -f1) bytes of work tree): $(store_size), \
$(contents) contents, index $(wc -l <"$W/state/history/index.jsonl") lines"
