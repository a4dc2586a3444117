#!/usr/bin/env bash
# Benchmark: the same workloads on the native backing directory and on each mount, median
# of RUNS runs, printed as a Markdown table (seconds, ratio against native) on stdout.
# Raw timings go to target/bench/raw-TIMESTAMP.tsv, the table to target/bench/table-*.md.
#
# Usage: scripts/bench.sh [--runs N] [--modes "native bindfs coherent coherent-nopt"]
#                         [--files N] [--dirs N] [--big-mib N]
# Env:   BENCH_MODES, BENCH_RUNS (5), BENCH_FILES (3000), BENCH_DIRS (300),
#        BENCH_BIG_MIB (1024), BENCH_DIR (where to work; default under target/),
#        BENCH_NICE (-10: priority of the run and its daemons), BENCH_TIMEOUT (600 s per
#        workload), COHERENT_MOUNT_OPTS, COHERENT_NO_BUILD.
# Modes and their mount commands: scripts/lib.sh (mode_command).
set -uo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SMALL_FILES=2000

# workload NAME T: the timed command (T is the directory under test; SRC the tree).
workload() {
    local t=$2
    local fio=(fio --output-format=json --output="$FIO_JSON" --ioengine=psync
        --filename="$t/big.dat" --size="${BIG_MIB}m")
    case $1 in
    copy_in) cp -a "$SRC" "$t/tree" ;;
    find_stat) find "$t/tree" -type f -print0 | xargs -0 stat --format=%s >/dev/null ;;
    read_all) find "$t/tree" -type f -print0 | xargs -0 cat >/dev/null ;;
    grep)
        # gen-tree.py puts the needle in every 50th file: check the count, not just speed
        local n
        n=$(grep -r -l COHERENT_NEEDLE "$t/tree" | wc -l)
        ((n == NEEDLES)) || { echo "grep -r found $n files with the needle, expected $NEEDLES" >&2; return 1; }
        ;;
    create_small)
        mkdir "$t/small" || return 1
        for ((i = 0; i < SMALL_FILES; i++)); do
            printf 'small file %d\n' "$i" >"$t/small/s$i.txt" || return 1
        done
        ;;
    rm_rf) rm -rf "$t/tree" "$t/small" ;;
    # dd for sequential I/O: fio at bs=1m runs at a fraction of dd's speed from the page
    # cache here (both on native), which would hide the filesystem's own cost.
    seq_write) dd if=/dev/zero of="$t/big.dat" bs=1M count="$BIG_MIB" status=none ;;
    seq_read_cold | seq_read_warm) dd if="$t/big.dat" of=/dev/null bs=1M status=none ;;
    # fio drops the file's cached pages before a job unless told not to (invalidate=0)
    rand_read) "${fio[@]}" --name=randread --rw=randread --bs=4k --randseed=42 --invalidate=0 ;;
    *) return 2 ;;
    esac
}

# Internal: bench.sh --run-workload NAME T, run by the main loop under a timeout in its
# own process; prints the seconds the workload took (its own output goes to stderr).
# For fio that is fio's own job runtime: its start-up (~0.4 s here) is not the filesystem.
if [[ ${1:-} == --run-workload ]]; then
    FIO_JSON=$(mktemp) || exit 1
    t0=$EPOCHREALTIME
    workload "$2" "$3" >&2 || { rm -f "$FIO_JSON"; exit 1; }
    t1=$EPOCHREALTIME
    if [[ -s $FIO_JSON ]]; then
        python3 -c 'import json, sys; print("%.4f" % (json.load(open(sys.argv[1]))["jobs"][0]["job_runtime"] / 1000))' "$FIO_JSON"
    else
        awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.4f\n", b-a}'
    fi
    rm -f "$FIO_JSON"
    exit 0
fi

# Run at a higher priority than the other work on the machine (compiles): a FUSE request
# waits for the daemon to be scheduled, so background load hits the mounts far harder
# than native and would swamp what is measured. Every column gets the same priority.
if [[ -z ${BENCH_NICED:-} && ${BENCH_NICE:--10} != 0 && $EUID -eq 0 ]]; then
    BENCH_NICED=1 exec nice -n "${BENCH_NICE:--10}" bash "$REPO_ROOT/scripts/bench.sh" "$@"
fi

MODES=${BENCH_MODES:-native bindfs coherent coherent-nopt}
RUNS=${BENCH_RUNS:-5}
FILES=${BENCH_FILES:-3000}
DIRS=${BENCH_DIRS:-300}
BIG_MIB=${BENCH_BIG_MIB:-1024}
TIMEOUT=${BENCH_TIMEOUT:-600}

while (($#)); do
    case $1 in
    --runs) RUNS=$2; shift ;;
    --modes) MODES=$2; shift ;;
    --files) FILES=$2; shift ;;
    --dirs) DIRS=$2; shift ;;
    --big-mib) BIG_MIB=$2; shift ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done
read -r -a MODES <<<"$MODES"
[[ ${MODES[0]} == native ]] || die "the first mode must be native (ratios are against it)"
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "--runs wants a positive integer"
[[ $EUID -eq 0 ]] || die "run as root (mounts, and dropping the page cache)"
need_tools fio python3 findmnt timeout
need_mode_tools "${MODES[@]}"

OUT=$REPO_ROOT/target/bench
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUT/raw-$STAMP.tsv
mkdir -p "$OUT" || die "cannot create $OUT"
# On the same filesystem as the repo by default (the backing directory of a real workspace).
WORK=$(mktemp -d "${BENCH_DIR:-$REPO_ROOT/target}/bench-work.XXXXXX") || die "mktemp failed"
chmod 755 "$WORK"

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_child
    cleanup_mounts
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM
cd / || exit 2

export SRC=$WORK/src BIG_MIB NEEDLES=$(((FILES + 49) / 50))
log "generating the tree ($FILES files, $DIRS dirs)"
python3 "$REPO_ROOT/scripts/gen-tree.py" "$SRC" "$FILES" "$DIRS" 42 2>"$WORK/gen.log" ||
    die "tree generation failed: $(cat "$WORK/gen.log")"
TREE_DESC=$(cat "$WORK/gen.log")

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# Workloads, in the order they run (each leaves what the next needs).
# name|description
WORKLOADS=(
    "copy_in|copy the tree in (cp -a)"
    "find_stat|find -type f + stat all"
    "read_all|read all files (cat)"
    "grep|grep -r (warm)"
    "create_small|create+write+close $SMALL_FILES small files"
    "rm_rf|rm -rf the tree and the small files"
    "seq_write|sequential write ${BIG_MIB} MiB (dd bs=1M, buffered)"
    "seq_read_cold|sequential read ${BIG_MIB} MiB (dd bs=1M, after drop_caches)"
    "seq_read_warm|sequential read ${BIG_MIB} MiB (dd bs=1M, warm)"
    "rand_read|4 KiB random reads, ${BIG_MIB} MiB in total (fio, warm)"
)

# prepare NAME T: untimed set-up before a workload.
prepare() {
    case $1 in
    copy_in)
        # the source is read from a warm cache in every run (seq_read_cold drops it)
        rm -rf "$2/tree" "$2/small" "$2/big.dat"
        find "$SRC" -type f -print0 | xargs -0 cat >/dev/null
        sync
        ;;
    seq_write) rm -f "$2/big.dat"; sync ;;
    seq_read_cold) drop_caches ;;
    # No sync between the tree workloads: on this ext4 an rm -rf right after a sync costs
    # 10x more and varies 2x from run to run, which would drown what is measured.
    *) ;;
    esac
}

# one_run MODE T RUN: every workload once; appends "mode workload run seconds" to RAW.
one_run() {
    local mode=$1 t=$2 run=$3 w name t0 t1
    for w in "${WORKLOADS[@]}"; do
        name=${w%%|*}
        prepare "$name" "$t"
        if ! run_bounded "$TIMEOUT" bash "$REPO_ROOT/scripts/bench.sh" --run-workload "$name" "$t" \
            >"$WORK/seconds" 2>>"$OUT/bench-$STAMP.log"; then
            log "$mode: $name failed or timed out (run $run); see $OUT/bench-$STAMP.log"
            printf '%s\t%s\t%s\tFAILED\n' "$mode" "$name" "$run" >>"$RAW"
            continue
        fi
        printf '%s\t%s\t%s\t%s\n' "$mode" "$name" "$run" "$(cat "$WORK/seconds")" >>"$RAW"
    done
    rm -f "$t/big.dat"
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
printf 'mode\tworkload\trun\tseconds\n' >"$RAW"
# All modes are mounted for the whole run and take turns run by run, so that a burst of
# load from other work on the machine falls on every column rather than on one.
declare -A MOUNT_FAILED=() TARGET=()
for mode in "${MODES[@]}"; do
    dir=$WORK/$mode
    mkdir -p "$dir/backing" "$dir/mnt"
    if [[ $mode == native ]]; then TARGET[$mode]=$dir/backing; else TARGET[$mode]=$dir/mnt; fi
    mount_mode "$mode" "$dir/backing" "$dir/mnt" "$OUT/mount-$mode-$STAMP.log" || MOUNT_FAILED[$mode]=1
done
for ((run = 1; run <= RUNS; run++)); do
    for mode in "${MODES[@]}"; do
        [[ -z ${MOUNT_FAILED[$mode]:-} ]] || continue
        log "$(mode_label "$mode"): run $run/$RUNS"
        one_run "$mode" "${TARGET[$mode]}" "$run"
    done
done
for mode in "${MODES[@]}"; do unmount "$WORK/$mode/mnt"; done

# --- table ----------------------------------------------------------------------------
med() { awk -F'\t' -v m="$1" -v w="$2" '$1 == m && $2 == w && $4 != "FAILED" {print $4}' "$RAW" | median; }

table() {
    local w name desc mode v n cell
    echo "Benchmark $(date -u '+%Y-%m-%d %H:%M UTC') — $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), $(findmnt -rn -o FSTYPE -T "$REPO_ROOT") backing, load average $LOAD_START at start and $(cut -d' ' -f1-3 /proc/loadavg) at end; median of $RUNS runs, seconds (ratio to native). Tree: $TREE_DESC."
    echo
    printf '| workload |'
    for mode in "${MODES[@]}"; do printf ' %s |' "$(mode_label "$mode")"; done
    printf '\n|---|'
    for mode in "${MODES[@]}"; do printf -- '---:|'; done
    echo
    for w in "${WORKLOADS[@]}"; do
        name=${w%%|*} desc=${w#*|}
        n=$(med native "$name")
        printf '| %s |' "$desc"
        for mode in "${MODES[@]}"; do
            v=$(med "$mode" "$name")
            if [[ -n ${MOUNT_FAILED[$mode]:-} ]]; then cell="mount failed"
            elif [[ $v == nan ]]; then cell="failed"
            elif [[ $mode == native ]]; then cell=$(printf '%.3f' "$v")
            else cell=$(awk -v v="$v" -v n="$n" 'BEGIN{ if (n > 0 && n != "nan") printf "%.3f (%.2fx)", v, v/n; else printf "%.3f", v }')
            fi
            printf ' %s |' "$cell"
        done
        echo
    done
}
table | tee "$OUT/table-$STAMP.md"
log "raw timings: $RAW"
