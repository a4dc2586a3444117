#!/usr/bin/env bash
# `git status` in a clone of this project: native, in an in-place coherent mount without
# the fsmonitor hook, and in one with it (`coherent install git`: core.fsmonitor and
# core.untrackedCache). One sample is N `git status` in a row; ROUNDS interleaved rounds
# (native, plain, hook, native, ...); medians, and ratios to native, as a Markdown table.
#
# Usage: scripts/bench-git.sh [SOURCE]   (SOURCE: the repository to clone, default this one)
# Environment: ROUNDS (5), N (20), COHERENT_BIN_DIR (target/release, else target/debug),
#              BENCH_DIR (a temporary directory under /var/tmp),
#              GEN_FILES (instead of a clone: a repository of that many generated files,
#              scripts/gen-tree.py, in GEN_FILES/10 directories).
# Needs root (FUSE mounts). The coherent binaries are used as built: no build here.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SOURCE=${1:-$REPO_ROOT}
ROUNDS=${ROUNDS:-5}
N=${N:-20}
BIN_DIR=${COHERENT_BIN_DIR:-}
if [[ -z $BIN_DIR ]]; then
    BIN_DIR=$REPO_ROOT/target/release
    [[ -x $BIN_DIR/coherent-mount && -x $BIN_DIR/coherent ]] || BIN_DIR=$REPO_ROOT/target/debug
fi
BIN_DIR=$(cd "$BIN_DIR" && pwd)
MOUNT_BIN=$BIN_DIR/coherent-mount
CLI_BIN=$BIN_DIR/coherent
[[ -x $MOUNT_BIN && -x $CLI_BIN ]] || die "no coherent binaries in $BIN_DIR (cargo build --release)"
command -v git >/dev/null || die "git is needed"

WORK=${BENCH_DIR:-$(mktemp -d /var/tmp/coherent-bench-git.XXXXXX)}
mkdir -p "$WORK"
PIDS=()
cleanup() {
    for d in "$WORK/plain" "$WORK/hook"; do
        if mountpoint -q "$d" 2>/dev/null; then fusermount3 -u "$d" 2>/dev/null || umount -l "$d"; fi
    done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    [[ -n ${BENCH_DIR:-} ]] || rm -rf "$WORK"
}
trap cleanup EXIT

export GIT_CONFIG_NOSYSTEM=1 GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@example.com
export GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@example.com

VARIANTS=(native plain hook)
if [[ -n ${GEN_FILES:-} ]]; then
    log "a repository of $GEN_FILES generated files"
    rm -rf "${WORK:?}/src"
    python3 "$REPO_ROOT/scripts/gen-tree.py" "$WORK/src" "$GEN_FILES" "$((GEN_FILES / 10))" >/dev/null
    git -C "$WORK/src" init -q . && git -C "$WORK/src" add -A && git -C "$WORK/src" commit -qm tree
    SOURCE=$WORK/src
fi
log "cloning $SOURCE ${#VARIANTS[@]} times into $WORK"
for v in "${VARIANTS[@]}"; do
    rm -rf "${WORK:?}/$v"
    git clone -q "$SOURCE" "$WORK/$v"
done
# In place (`coherent-mount DIR`), as agents use it; started from outside the directory,
# so no process is inside it at mount time (else the hook could not vouch for anything).
for v in plain hook; do
    (cd / && exec "$MOUNT_BIN" "$WORK/$v" --state-dir "$WORK/state-$v" 2>"$WORK/$v.log") &
    PIDS+=($!)
done
for v in plain hook; do
    for _ in $(seq 100); do
        [[ -e $WORK/$v/.coherent/ctl ]] && break
        sleep 0.1
    done
    [[ -e $WORK/$v/.coherent/ctl ]] || die "the mount of $WORK/$v did not come up: $(cat "$WORK/$v.log")"
done
(cd "$WORK/hook" && "$CLI_BIN" install git >/dev/null)
log "hook: $(git -C "$WORK/hook" config core.fsmonitor)"

# One sample: N `git status` in DIR, in milliseconds.
sample() {
    local dir=$1 t0 t1
    t0=$(date +%s%N)
    for _ in $(seq "$N"); do git -C "$dir" status --porcelain >/dev/null; done
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# Warm up: the first status writes each index (and the hook's first answer is "/").
for v in "${VARIANTS[@]}"; do git -C "$WORK/$v" status --porcelain >/dev/null; done
declare -A S=()
for r in $(seq "$ROUNDS"); do
    line=""
    for v in "${VARIANTS[@]}"; do
        t=$(sample "$WORK/$v")
        S[$v]+="$t "
        line+=" $v $t"
    done
    log "round $r:$line ms"
done

files=$(git -C "$WORK/native" ls-files | wc -l)
m_native=$(tr ' ' '\n' <<<"${S[native]}" | grep . | median)
echo
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), git $(git --version | cut -d' ' -f3), binaries $BIN_DIR, a clone of $files files; $N × \`git status\`, median of $ROUNDS interleaved rounds:"
echo
echo "| where | ms | ratio to native |"
echo "|---|---|---|"
for v in "${VARIANTS[@]}"; do
    m=$(tr ' ' '\n' <<<"${S[$v]}" | grep . | median)
    case $v in
    native) name="native (no hook)" ;;
    plain) name="coherent in place, no hook" ;;
    hook) name="coherent in place, \`coherent install git\`" ;;
    esac
    echo "| $name | $m | $(awk -v a="$m" -v b="$m_native" 'BEGIN {printf "%.2f", a / b}') |"
done
