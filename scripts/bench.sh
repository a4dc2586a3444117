#!/usr/bin/env bash
# Benchmark: the same workloads on the native backing directory and on each mount, on a disk
# backing (the repo's filesystem, ext4 here), a tmpfs backing and in place on the disk;
# every mode takes turns run by run (interleaved rounds, each run starting one mode further
# on), median of RUNS runs, printed as Markdown tables (seconds, ratio against native) on
# stdout, then the daemons' CPU per workload. Raw timings go to target/bench/raw-TIMESTAMP.tsv (daemon CPU to cpu-*.tsv), the
# tables to target/bench/table-*.md, the ratios to target/bench/ratios-*.tsv.
#
# Usage: scripts/bench.sh [--runs N] [--modes "native coherent bindfs cref"]
#                         [--backing ext4|tmpfs|inplace|loop|both|all] [--files N] [--dirs N]
#                         [--big-mib N] [--no-build] [--no-agent] [--plot FILE.svg]
#                         [--record | --check]
#   --backing   where the backing directories live: ext4 (under target/, the repo's disk),
#               tmpfs (a tmpfs mounted for the run), inplace (the disk, each mount over its
#               own directory: MODE runs as MODE-inplace, modes without one are left out),
#               loop (a new ext4 with the usual journal, in an image file on the disk,
#               mounted for the run: a filesystem every run finds in the same state, where
#               the repo's disk may be aged or made without a journal), both (ext4 and
#               tmpfs), all (ext4, tmpfs, inplace; the default).
#   --no-agent  skip the agent rows (git clone of this repository, git status x20,
#               git checkout back and forth, grep -rn, rg, cargo build)
#   --no-build  skip only the agent's debug `cargo build --offline` (the slow row)
#   --plot F    also draw the ratio table as a bar chart (SVG, scripts/plot.py)
#   --record    write each backing's rows (ratio to native and its spread, per workload and
#               column) to bench/baseline-BACKING.tsv, with the machine, kernel, commit, date
#               and options in its header: the run --check compares with
#   --check     the regression gate: run as the baseline was recorded (its options and
#               modes, on the backings that have one, unless given here), then compare each
#               row with bench/baseline-BACKING.tsv (scripts/bench-gate.py); exit 1 when a row
#               is more than 10 % worse beyond the spreads, or missing
# Env:   BENCH_MODES, BENCH_RUNS (5), BENCH_FILES (3000), BENCH_DIRS (300),
#        BENCH_BIG_MIB (1024), BENCH_BACKING (all), BENCH_DIR (where to work; default under
#        target/), BENCH_TMPFS_SIZE (half the RAM), BENCH_LOOP_SIZE (16G, sparse), BENCH_NICE (-10: priority of the run and
#        its daemons), BENCH_TIMEOUT (600 s per workload), COHERENT_MOUNT_OPTS,
#        COHERENT_NO_BUILD (do not rebuild target/release/coherent-mount), COHERENT_CREF
#        (a passthrough_hp binary instead of scripts/cref.sh's).
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
    # The agent's rows, in a clone of this repository (CLONE_FROM, a snapshot). --no-hardlinks: on the
    # repo's own disk a local clone would otherwise link the objects and skip the copy.
    git_clone) git clone -q --no-hardlinks "$CLONE_FROM" "$t/clone" ;;
    git_status)
        for ((i = 0; i < 20; i++)); do
            git -C "$t/clone" status --porcelain >/dev/null || return 1
        done
        ;;
    git_checkout) git -C "$t/clone" checkout -q "$OLD_REV" && git -C "$t/clone" checkout -q - ;;
    grep_rn)
        local n
        n=$(grep -rn --exclude-dir=.git -e 'fn ' "$t/clone" | wc -l)
        ((n == GREP_LINES)) || { echo "grep -rn found $n lines, expected $GREP_LINES" >&2; return 1; }
        ;;
    rg)
        # ripgrep: parallel, and it skips what .gitignore names (and .git)
        local n
        n=$(rg -n -e 'fn ' "$t/clone" | wc -l)
        ((n == RG_LINES)) || { echo "rg found $n lines, expected $RG_LINES" >&2; return 1; }
        ;;
    cargo_build)
        # The clone's own target dir, inside the directory under test; the caller's
        # CARGO_TARGET_DIR would put it elsewhere.
        (cd "$t/clone" && CARGO_TARGET_DIR=$t/clone/target cargo build --offline --quiet) ;;
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

MODES=${BENCH_MODES:-native coherent bindfs cref}
RUNS=${BENCH_RUNS:-5}
FILES=${BENCH_FILES:-3000}
DIRS=${BENCH_DIRS:-300}
BIG_MIB=${BENCH_BIG_MIB:-1024}
BACKING=${BENCH_BACKING:-all}
TIMEOUT=${BENCH_TIMEOUT:-600}
AGENT=1 BUILD=1 PLOT= GATE= SHAPED= BACKING_SET=
BASELINES=$REPO_ROOT/bench

# parse_args ARG...: the options (also those a baseline was recorded with, for --check).
parse_args() {
    while (($#)); do
        case $1 in
        --runs | --modes | --backing | --files | --dirs | --big-mib | --plot)
            (($# >= 2)) || die "$1 wants a value (see --help)" ;;&
        --runs) RUNS=$2; SHAPED=1; shift ;;
        --modes) MODES=$2; SHAPED=1; shift ;;
        --backing) BACKING=$2; BACKING_SET=1; shift ;;
        --files) FILES=$2; SHAPED=1; shift ;;
        --dirs) DIRS=$2; SHAPED=1; shift ;;
        --big-mib) BIG_MIB=$2; SHAPED=1; shift ;;
        --no-agent) AGENT= SHAPED=1 ;;
        --no-build) BUILD= SHAPED=1 ;;
        --plot) PLOT=$2; shift ;;
        --record | --check)
            [[ -z $GATE || $GATE == "${1#--}" ]] || die "--record and --check exclude each other"
            GATE=${1#--}
            ;;
        -h | --help) sed -n '2,/^# Modes and/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
        esac
        shift
    done
}
parse_args "$@"
# shape_args: the options that decide what a row measures, as a baseline records them.
shape_args() {
    printf -- '--runs %s --files %s --dirs %s --big-mib %s' "$RUNS" "$FILES" "$DIRS" "$BIG_MIB"
    [[ -n $AGENT ]] || printf ' --no-agent'
    [[ -n $BUILD ]] || printf ' --no-build'
}
# baseline_field FILE KEY: the value of the header line '# KEY: value' of a baseline.
baseline_field() { sed -n "s/^# $2: //p" "$1" | head -1; }
# backings_of BACKING: the backings that --backing names.
backings_of() {
    case $1 in
    ext4 | tmpfs | inplace | loop) echo "$1" ;;
    both) echo ext4 tmpfs ;;
    all) echo ext4 tmpfs inplace ;;
    list:*) echo "${1#list:}" ;; # --check: the backings with a baseline
    *) die "--backing wants ext4, tmpfs, inplace, loop, both or all" ;;
    esac
}
if [[ $GATE == check ]]; then
    if [[ -z $BACKING_SET ]]; then
        BACKING=list:
        for b in ext4 tmpfs inplace loop; do [[ ! -f $BASELINES/baseline-$b.tsv ]] || BACKING+=" $b"; done
        [[ $BACKING != list: ]] || die "--check: no recorded run in $BASELINES (record one with scripts/bench.sh --record)"
    fi
    BACKINGS_LIST=$(backings_of "$BACKING") || exit 2
    for b in $BACKINGS_LIST; do
        [[ -f $BASELINES/baseline-$b.tsv ]] ||
            die "--check: no $BASELINES/baseline-$b.tsv (record it with scripts/bench.sh --record --backing $b)"
    done
    # Every backing of one recording shares its options: the first one's header says them.
    read -r first _ <<<"$BACKINGS_LIST"
    first=$BASELINES/baseline-$first.tsv
    recorded_args=$(baseline_field "$first" args) recorded_modes=$(baseline_field "$first" modes)
    [[ -n $recorded_args && -n $recorded_modes ]] || die "--check: $first has no '# args:' or '# modes:' header line"
    if [[ -z $SHAPED ]]; then
        read -r -a recorded <<<"$recorded_args"
        parse_args "${recorded[@]}"
        MODES=$recorded_modes
    elif [[ "$(shape_args)|$(echo $MODES)" != "$recorded_args|$recorded_modes" ]]; then
        die "--check: $first was recorded with '$recorded_args' and modes '$recorded_modes', not '$(shape_args)' and '$(echo $MODES)': leave those options out (--check takes them from the baseline) or --record anew"
    fi
fi
read -r -a MODES <<<"$MODES"
[[ ${MODES[0]} == native ]] || die "the first mode must be native (ratios are against it)"
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "--runs wants a positive integer"
BACKINGS_LIST=$(backings_of "$BACKING") || exit 2
read -r -a BACKINGS <<<"$BACKINGS_LIST"
for mode in "${MODES[@]}"; do mode_known "$mode" || mode_command "$mode" / /; done # dies

# backing_mode BACKING COLUMN: the mode that a column runs on that backing (empty: none).
# In place, every peer is mounted over its own directory: MODE-inplace.
backing_mode() {
    local b=$1 m=$2
    if [[ $b != inplace || $m == native || ${m%@t*} == *-inplace ]]; then printf '%s' "$m"
    elif mode_known "${m%@t*}-inplace"; then
        if [[ $m == *@t* ]]; then printf '%s' "${m%@t*}-inplace@t${m##*@t}"; else printf '%s' "$m-inplace"; fi
    fi
}
RUN_MODES=()
for backing in "${BACKINGS[@]}"; do
    for mode in "${MODES[@]}"; do
        m=$(backing_mode "$backing" "$mode")
        [[ -z $m || " ${RUN_MODES[*]} " == *" $m "* ]] || RUN_MODES+=("$m")
    done
done
[[ $EUID -eq 0 ]] || die "run as root (mounts, and dropping the page cache)"
need_tools fio python3 findmnt timeout
[[ -z $AGENT ]] || need_tools git grep rg
[[ -z $AGENT || -z $BUILD ]] || need_tools cargo
need_mode_tools "${RUN_MODES[@]}"
if [[ -n $PLOT ]]; then
    mkdir -p "$(dirname "$PLOT")" || die "--plot: cannot create the directory of $PLOT"
    PLOT=$(cd "$(dirname "$PLOT")" && pwd)/$(basename "$PLOT")
fi

OUT=$REPO_ROOT/target/bench
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUT/raw-$STAMP.tsv
RATIOS=$OUT/ratios-$STAMP.tsv
CPU=$OUT/cpu-$STAMP.tsv
CLK_TCK=$(getconf CLK_TCK)
mkdir -p "$OUT" || die "cannot create $OUT"
# On the same filesystem as the repo by default (the backing directory of a real workspace).
WORK=$(mktemp -d "${BENCH_DIR:-$REPO_ROOT/target}/bench-work.XXXXXX") || die "mktemp failed"
chmod 755 "$WORK"
DISK_FS=$(findmnt -rn -o FSTYPE -T "$WORK")

# A filesystem mounted for the run (tmpfs, loop), unmounted at the end.
RUN_MNT=
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_child
    cleanup_mounts
    [[ -z $RUN_MNT ]] || umount "$RUN_MNT" 2>/dev/null || umount -l "$RUN_MNT" 2>/dev/null
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

if [[ -n $AGENT ]]; then
    # The agent works in a clone of the repository this script belongs to (its committed
    # HEAD); checkout goes to a commit 40 back (or the first) and returns. Every run clones
    # from one snapshot taken now, so a commit made during the run changes nothing.
    top=$(git -C "$REPO_ROOT" rev-parse --show-toplevel) || die "$REPO_ROOT is not a git repository"
    export CLONE_FROM=$WORK/snapshot OLD_REV GREP_LINES RG_LINES
    git clone -q --no-hardlinks "$top" "$CLONE_FROM" || die "git clone $top failed"
    OLD_REV=$(git -C "$CLONE_FROM" rev-list --max-count=41 HEAD | tail -1)
    GREP_LINES=$(grep -rn --exclude-dir=.git -e 'fn ' "$CLONE_FROM" | wc -l)
    RG_LINES=$(rg -n -e 'fn ' "$CLONE_FROM" | wc -l)
    AGENT_DESC="clone of $(basename "$top") at $(git -C "$CLONE_FROM" rev-parse --short HEAD), $(git -C "$CLONE_FROM" ls-files | wc -l) files; checkout to $(git -C "$CLONE_FROM" rev-parse --short "$OLD_REV") ($(git -C "$CLONE_FROM" diff --shortstat HEAD "$OLD_REV" | sed 's/^ *//')) and back"
fi

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
if [[ -n $AGENT ]]; then
    WORKLOADS+=(
        "git_clone|agent: git clone of this repository (local, --no-hardlinks)"
        "git_status|agent: git status x20"
        "git_checkout|agent: git checkout 40 commits back and return"
        "grep_rn|agent: grep -rn over the clone"
        "rg|agent: rg -n over the clone"
    )
    [[ -z $BUILD ]] || WORKLOADS+=("cargo_build|agent: cargo build --offline (debug, target in the clone)")
fi

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
    git_clone) rm -rf "$2/clone" ;;
    # No sync between the tree workloads: on this ext4 an rm -rf right after a sync costs
    # 10x more and varies 2x from run to run, which would drown what is measured.
    *) ;;
    esac
}

# one_run BACKING MODE T RUN PID: every workload once; appends a line per workload to RAW,
# and, when PID (the mount's daemon) is given, its CPU during the workload to CPU.
one_run() {
    local backing=$1 mode=$2 t=$3 run=$4 pid=${5:-} w name c0 c1
    for w in "${WORKLOADS[@]}"; do
        name=${w%%|*}
        prepare "$name" "$t"
        [[ -z $pid ]] || c0=$(daemon_ticks "$pid")
        if ! run_bounded "$TIMEOUT" bash "$REPO_ROOT/scripts/bench.sh" --run-workload "$name" "$t" \
            >"$WORK/seconds" 2>>"$OUT/bench-$STAMP.log"; then
            log "$backing/$mode: $name failed or timed out (run $run); see $OUT/bench-$STAMP.log"
            printf '%s\t%s\t%s\t%s\tFAILED\n' "$backing" "$mode" "$name" "$run" >>"$RAW"
            continue
        fi
        printf '%s\t%s\t%s\t%s\t%s\n' "$backing" "$mode" "$name" "$run" "$(cat "$WORK/seconds")" >>"$RAW"
        if [[ -n $pid ]] && c1=$(daemon_ticks "$pid"); then
            printf '%s\t%s\t%s\t%s\t%s\n' "$backing" "$mode" "$name" "$run" \
                "$(awk -v d=$((c1 - c0)) -v hz="$CLK_TCK" 'BEGIN{printf "%.3f", d / hz}')" >>"$CPU"
        fi
    done
    # leave nothing behind: on tmpfs every mode shares the memory
    rm -rf "$t/big.dat" "$t/clone"
}

# backing_dir BACKING: where that backing's directories go (mounts the tmpfs or the loop).
backing_dir() {
    case $1 in
    ext4) printf '%s' "$WORK/ext4" ;;
    tmpfs)
        local size=${BENCH_TMPFS_SIZE:-$(awk '/MemTotal/ {printf "%dk", $2/2}' /proc/meminfo)}
        mkdir -p "$WORK/tmpfs" && mount -t tmpfs -o "size=$size,mode=755" tmpfs "$WORK/tmpfs" ||
            die "cannot mount a tmpfs on $WORK/tmpfs"
        printf '%s' "$WORK/tmpfs"
        ;;
    loop)
        need_tools mkfs.ext4 losetup
        truncate -s "${BENCH_LOOP_SIZE:-16G}" "$WORK/ext4.img" &&
            mkfs.ext4 -q -F "$WORK/ext4.img" &&
            mkdir -p "$WORK/loop" && mount -o loop "$WORK/ext4.img" "$WORK/loop" ||
            die "cannot make and mount an ext4 image on $WORK/loop (mkfs.ext4, a free loop device)"
        chmod 755 "$WORK/loop"
        printf '%s' "$WORK/loop"
        ;;
    inplace) printf '%s' "$WORK/inplace" ;;
    esac
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
# what was measured: the checkout as the run starts (a commit made during the run is not it)
COMMIT=$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ -z $(git -C "$REPO_ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]] || COMMIT+=" (with uncommitted changes)"
printf 'backing\tmode\tworkload\trun\tseconds\n' >"$RAW"
printf 'backing\tmode\tworkload\trun\tdaemon_cpu_seconds\n' >"$CPU"
# RAW and CPU name the column (a mode of MODES); on the inplace backing it runs as its
# in-place variant (backing_mode).
declare -A MOUNT_FAILED=() TARGET=() DAEMON=()
for backing in "${BACKINGS[@]}"; do
    base=$(backing_dir "$backing") || exit 2
    [[ $backing != tmpfs && $backing != loop ]] || RUN_MNT=$base # backing_dir ran in a subshell
    # All modes are mounted for the whole run and take turns run by run, so that a burst of
    # load from other work on the machine falls on every column rather than on one.
    for mode in "${MODES[@]}"; do
        m=$(backing_mode "$backing" "$mode")
        [[ -n $m ]] || { log "$backing: $mode has no in-place variant; left out"; continue; }
        dir=$base/$mode
        mkdir -p "$dir/backing" "$dir/mnt"
        if [[ $mode == native ]]; then TARGET[$mode]=$dir/backing; else TARGET[$mode]=$dir/mnt; fi
        mount_mode "$m" "$dir/backing" "$dir/mnt" "$OUT/mount-$backing-$mode-$STAMP.log" ||
            MOUNT_FAILED[$backing/$mode]=1
        DAEMON[$mode]=${_MOUNT_PID[$dir/mnt]:-}
    done
    for ((run = 1; run <= RUNS; run++)); do
        # Each run starts one mode further on, so no mode always follows the same one (a
        # mode right after another's rm -rf pays for the inodes it freed: ext4 searches past
        # recently deleted ones).
        order=()
        for ((i = 0; i < ${#MODES[@]}; i++)); do
            order+=("${MODES[(i + run - 1) % ${#MODES[@]}]}")
        done
        for mode in "${order[@]}"; do
            m=$(backing_mode "$backing" "$mode")
            [[ -n $m && -z ${MOUNT_FAILED[$backing/$mode]:-} ]] || continue
            log "$backing: $(mode_label "$m"): run $run/$RUNS"
            one_run "$backing" "$mode" "${TARGET[$mode]}" "$run" "${DAEMON[$mode]}"
        done
    done
    for mode in "${MODES[@]}"; do
        [[ $mode == native || -z $(backing_mode "$backing" "$mode") ]] || unmount "$base/$mode/mnt"
    done
    if [[ -n $RUN_MNT ]]; then
        umount "$RUN_MNT" || log "umount $RUN_MNT failed"
        RUN_MNT=
        rm -f "$WORK/ext4.img"
    fi
done

# --- tables ---------------------------------------------------------------------------
med() { awk -F'\t' -v b="$1" -v m="$2" -v w="$3" '$1 == b && $2 == m && $3 == w && $5 != "FAILED" {print $5}' "$RAW" | median; }

backing_label() {
    case $1 in
    ext4) echo "$DISK_FS (the repo's disk)" ;;
    inplace) echo "$DISK_FS in place (each mount over its own directory)" ;;
    loop) echo "a new ext4 with a journal (loop device)" ;;
    *) echo "$1" ;;
    esac
}
# the short name of a backing for the chart's panels
backing_short() { case $1 in ext4) echo "$DISK_FS" ;; inplace) echo "$DISK_FS in place" ;; loop) echo "new ext4" ;; *) echo "$1" ;; esac; }

# columns BACKING: sets COLS to the columns that ran on BACKING.
columns() {
    local mode
    COLS=()
    for mode in "${MODES[@]}"; do [[ -z $(backing_mode "$1" "$mode") ]] || COLS+=("$mode"); done
}

table() {
    local backing=$1 w name desc mode v n cell COLS
    columns "$backing"
    echo "### $(backing_label "$backing") backing"
    echo
    printf '| workload |'
    for mode in "${COLS[@]}"; do printf ' %s |' "$(mode_label "$(backing_mode "$backing" "$mode")")"; done
    printf '\n|---|'
    for mode in "${COLS[@]}"; do printf -- '---:|'; done
    echo
    for w in "${WORKLOADS[@]}"; do
        name=${w%%|*} desc=${w#*|}
        n=$(med "$backing" native "$name")
        printf '| %s |' "$desc"
        for mode in "${COLS[@]}"; do
            v=$(med "$backing" "$mode" "$name")
            if [[ -n ${MOUNT_FAILED[$backing/$mode]:-} ]]; then cell="mount failed"
            elif [[ $v == nan ]]; then cell="failed"
            elif [[ $mode == native ]]; then cell=$(printf '%.3f' "$v")
            else cell=$(awk -v v="$v" -v n="$n" 'BEGIN{ if (n > 0 && n != "nan") printf "%.3f (%.2fx)", v, v/n; else printf "%.3f", v }')
            fi
            printf ' %s |' "$cell"
        done
        echo
        # ratios for the plot: backing, workload, mode, ratio (empty when unknown)
        # (the column's own label, so that a peer keeps its colour on every panel)
        for mode in "${COLS[@]:1}"; do
            v=$(med "$backing" "$mode" "$name")
            printf '%s\t%s\t%s\t%s\n' "$(backing_short "$backing")" "$desc" "$(mode_label "$mode")" \
                "$(awk -v v="$v" -v n="$n" 'BEGIN{ if (v != "nan" && n != "nan" && n > 0) printf "%.4f", v/n }')" >>"$RATIOS"
        done
    done
    echo
}

# What one operation of a workload is, for the daemon's CPU per operation: unit|count.
per_op() {
    case $1 in
    copy_in | find_stat | read_all | grep) echo "file|$FILES" ;;
    create_small) echo "file|$SMALL_FILES" ;;
    rm_rf) echo "file|$((FILES + SMALL_FILES))" ;;
    seq_write | seq_read_cold | seq_read_warm | rand_read) echo "MiB|$BIG_MIB" ;;
    git_status) echo "status|20" ;;
    *) echo "run|1" ;;
    esac
}
cpu_med() { awk -F'\t' -v b="$1" -v m="$2" -v w="$3" '$1 == b && $2 == m && $3 == w {print $5}' "$CPU" | median; }

# cpu_table BACKING: each FUSE daemon's CPU (user + system) during each workload, median
# over the runs, in ms, and per operation (the unit in the second column).
cpu_table() {
    local backing=$1 w name desc mode v unit count COLS
    columns "$backing"
    COLS=("${COLS[@]:1}")
    ((${#COLS[@]})) || return 0
    echo "### daemon CPU, $(backing_label "$backing") backing"
    echo
    printf '| workload | per |'
    for mode in "${COLS[@]}"; do printf ' %s |' "$(mode_label "$(backing_mode "$backing" "$mode")")"; done
    printf '\n|---|---|'
    for mode in "${COLS[@]}"; do printf -- '---:|'; done
    echo
    for w in "${WORKLOADS[@]}"; do
        name=${w%%|*} desc=${w#*|}
        IFS='|' read -r unit count <<<"$(per_op "$name")"
        printf '| %s | %s |' "$desc" "$unit"
        for mode in "${COLS[@]}"; do
            v=$(cpu_med "$backing" "$mode" "$name")
            if [[ $v == nan ]]; then printf ' – |'
            elif awk -v v="$v" -v hz="$CLK_TCK" 'BEGIN{exit !(v < 1 / hz)}'; then
                printf ' <%s ms |' $((1000 / CLK_TCK)) # under one tick
            elif ((count == 1)); then awk -v v="$v" 'BEGIN{printf " %.0f ms |", v * 1000}'
            else awk -v v="$v" -v c="$count" 'BEGIN{
                    per = v / c * 1e6; u = "µs"; if (per >= 1000) { per /= 1000; u = "ms" }
                    printf (per < 10 ? " %.0f ms (%.1f %s) |" : " %.0f ms (%.0f %s) |"), v * 1000, per, u }'
            fi
        done
        echo
    done
    echo
}

printf 'backing\tworkload\tmode\tratio\n' >"$RATIOS"
{
    echo "Benchmark $(date -u '+%Y-%m-%d %H:%M UTC') — $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), load average $LOAD_START at start and $(cut -d' ' -f1-3 /proc/loadavg) at end; interleaved rounds, median of $RUNS runs, seconds (ratio to native, lower is better). Tree: $TREE_DESC.${AGENT:+ Agent: $AGENT_DESC.}"
    echo
    for backing in "${BACKINGS[@]}"; do table "$backing"; done
    echo "Daemon CPU: user + system time of the mount's process (all its threads; /proc/PID/stat, $CLK_TCK ticks a second) from just before a workload to just after it, median of $RUNS runs; in parentheses per operation (the unit in the second column). Work the kernel sends the daemon after a workload ends (writeback of cached writes, releases, forgets) falls on the next workload."
    echo
    for backing in "${BACKINGS[@]}"; do cpu_table "$backing"; done
} | tee "$OUT/table-$STAMP.md"
log "raw timings: $RAW; daemon CPU: $CPU; ratios: $RATIOS"
if [[ -n $PLOT ]]; then
    python3 "$REPO_ROOT/scripts/plot.py" "$RATIOS" "$PLOT" \
        --title "Time relative to native (median of $RUNS runs, $(date -u +%Y-%m-%d), $(nproc) cores)" ||
        die "plot failed"
    log "plot: $PLOT"
fi

# --- the regression gate (--record, --check) -------------------------------------------
# Each backing's rows (ratio to native and its spread; scripts/bench-gate.py) for this run.
for backing in "${BACKINGS[@]}"; do
    python3 "$REPO_ROOT/scripts/bench-gate.py" rows "$RAW" "$backing" >"$OUT/rows-$STAMP-$backing.tsv" ||
        die "cannot compute the rows of $backing"
done
if [[ $GATE == record ]]; then
    mkdir -p "$BASELINES" || die "cannot create $BASELINES"
    for backing in "${BACKINGS[@]}"; do
        {
            echo "# coherent bench baseline, $(backing_label "$backing") backing: ratios to native; scripts/bench.sh --check compares with it"
            echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC')"
            echo "# commit: $COMMIT"
            echo "# kernel: $(uname -r)"
            echo "# machine: $(nproc) cores, $(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); load average $LOAD_START at start, $(cut -d' ' -f1-3 /proc/loadavg) at end"
            echo "# args: $(shape_args)"
            echo "# modes: ${MODES[*]}"
            echo "# spread: median absolute deviation of the per-round ratios (mode run i / native run i)"
            cat "$OUT/rows-$STAMP-$backing.tsv"
        } >"$BASELINES/baseline-$backing.tsv"
        log "recorded $BASELINES/baseline-$backing.tsv"
    done
elif [[ $GATE == check ]]; then
    (
    gate=0
    for backing in "${BACKINGS[@]}"; do
        base=$BASELINES/baseline-$backing.tsv
        echo
        echo "### gate, $(backing_label "$backing") backing: this run against the baseline of $(baseline_field "$base" date) ($(baseline_field "$base" commit))"
        [[ $(baseline_field "$base" kernel) == "$(uname -r)" ]] ||
            echo "(the baseline ran on kernel $(baseline_field "$base" kernel), this run on $(uname -r): a move may be the kernel's)"
        [[ $(baseline_field "$base" machine) == "$(nproc) cores, $(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1),"* ]] ||
            echo "(the baseline ran on another machine: $(baseline_field "$base" machine))"
        echo
        python3 "$REPO_ROOT/scripts/bench-gate.py" compare "$base" "$OUT/rows-$STAMP-$backing.tsv"
        rc=$?
        ((rc == 0)) || gate=1
        ((rc < 2)) || log "the gate could not compare $backing (exit $rc)"
    done
    exit "$gate"
    ) | tee "$OUT/gate-$STAMP.md"
    gate=${PIPESTATUS[0]}
    log "gate report: $OUT/gate-$STAMP.md"
    exit "$gate"
fi
