#!/usr/bin/env bash
# Parallel clients on one mount: 1, 2, 4 and 8 agents at once, each in its own tree and
# session (COHERENT_SESSION=bench-cI), on native and on each mount, interleaved. Per
# workload, the wall time from starting the clients until the last one ends, median of
# RUNS rounds, with its ratio to native at the same client count; and the daemon's CPU
# (utime + stime of /proc/PID/stat over the workload) per operation as clients grow.
#
# Workloads (each client at once, in its own directory cI/ of the mount):
#   untar       tar -xf of a tarball of the generated tree (gen-tree.py; FILES files)
#   rg          rg -l COHERENT_NEEDLE over that tree (checks it finds every needle)
#   git_status  git status --porcelain x5 in the client's clone of this repository
#   make        make -j JOBS of a C tree (libfuse's lib/, example/ and util/ from the fuse3
#               source that scripts/cref.sh keeps; a generated Makefile, objects only)
#
# Usage: scripts/bench-parallel.sh [--runs N] [--clients "1 2 4 8"] [--modes "native coherent bindfs cref"]
#                                  [--files N] [--dirs N] [--jobs J] [--sample] [--no-build]
#   --jobs J    make -j J in each client (default: the number of cores)
#   --sample    after the timed rounds, each workload again and again for BENCH_SAMPLE_SECS
#               (20) at the most clients on the coherent mount, untimed, sampling the daemon's request threads: state
#               and kernel wait channel (/proc/PID/task/*/wchan) every 20 ms, and every tenth
#               time all stacks (gdb): how often one waits in a lock, and in which function
#   --no-build  use target/release/coherent-mount as it is (COHERENT_NO_BUILD=1)
# Env: BENCH_DIR (where to work; default under target/), BENCH_NICE (-10), BENCH_TIMEOUT
#      (600 s per workload round), COHERENT_CREF (a passthrough_hp binary).
# Output: Markdown on stdout and target/bench/parallel-table-STAMP.md; every round in
# target/bench/parallel-raw-STAMP.tsv (mode, clients, workload, run, seconds, daemon CPU s).
set -uo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# One client's share of a workload: client I in directory D (its own cI/).
client() {
    local w=$1 d=$2 n
    case $w in
    untar) mkdir "$d/untar" && tar -xf "$TARBALL" -C "$d/untar" ;;
    rg)
        n=$(rg -l COHERENT_NEEDLE "$d/untar" | wc -l)
        ((n == NEEDLES)) || { echo "rg found the needle in $n files of $d, expected $NEEDLES" >&2; return 1; }
        ;;
    git_status)
        for ((i = 0; i < 5; i++)); do git -C "$d/repo" status --porcelain >/dev/null || return 1; done
        ;;
    make) make -s -C "$d/csrc" -j "$JOBS" >/dev/null ;;
    *) return 2 ;;
    esac
}

# Internal: --clients-run WORKLOAD T N: N clients at once (client I in T/cI as session
# bench-cI); prints the wall seconds until the last ends; fails if any client failed.
if [[ ${1:-} == --clients-run ]]; then
    w=$2 t=$3 n=$4 pids=() rc=0
    t0=$EPOCHREALTIME
    for ((i = 1; i <= n; i++)); do
        COHERENT_SESSION=bench-c$i client "$w" "$t/c$i" >&2 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    t1=$EPOCHREALTIME
    ((rc == 0)) || exit 1
    awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.4f\n", b-a}'
    exit 0
fi

if [[ -z ${BENCH_NICED:-} && ${BENCH_NICE:--10} != 0 && $EUID -eq 0 ]]; then
    BENCH_NICED=1 exec nice -n "${BENCH_NICE:--10}" bash "$REPO_ROOT/scripts/bench-parallel.sh" "$@"
fi

RUNS=3 CLIENTS="1 2 4 8" MODES="native coherent bindfs cref" FILES=1000 DIRS=100 JOBS=$(nproc)
SAMPLE= SAMPLE_SECS=${BENCH_SAMPLE_SECS:-20} TIMEOUT=${BENCH_TIMEOUT:-600}
while (($#)); do
    case $1 in
    --runs | --clients | --modes | --files | --dirs | --jobs)
        (($# >= 2)) || die "$1 wants a value (see --help)" ;;&
    --runs) RUNS=$2; shift ;;
    --clients) CLIENTS=$2; shift ;;
    --modes) MODES=$2; shift ;;
    --files) FILES=$2; shift ;;
    --dirs) DIRS=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    --sample) SAMPLE=1 ;;
    --no-build) export COHERENT_NO_BUILD=1 ;;
    -h | --help) sed -n '2,/^# Output/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done
read -r -a MODES <<<"$MODES"
read -r -a CLIENTS <<<"$CLIENTS"
[[ ${MODES[0]} == native ]] || die "the first mode must be native (ratios are against it)"
for x in "$RUNS" "$FILES" "$DIRS" "$JOBS" "${CLIENTS[@]}"; do
    [[ $x =~ ^[1-9][0-9]*$ ]] || die "--runs, --clients, --files, --dirs and --jobs want positive integers, not '$x'"
done
MAXC=$(printf '%s\n' "${CLIENTS[@]}" | sort -n | tail -1)
for mode in "${MODES[@]}"; do
    mode_known "$mode" || mode_command "$mode" / / # dies
    [[ $mode != *inplace* ]] || die "$mode: bench-parallel mounts over separate backing directories; no in-place modes"
done
[[ $EUID -eq 0 ]] || die "run as root (mounts)"
need_tools python3 findmnt timeout tar rg git make gcc
[[ -z $SAMPLE ]] || need_tools gdb
need_mode_tools "${MODES[@]}"

OUT=$REPO_ROOT/target/bench
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUT/parallel-raw-$STAMP.tsv
LOGF=$OUT/parallel-$STAMP.log
CLK_TCK=$(getconf CLK_TCK)
mkdir -p "$OUT" || die "cannot create $OUT"
WORK=$(mktemp -d "${BENCH_DIR:-$REPO_ROOT/target}/bench-parallel.XXXXXX") || die "mktemp failed"
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

# --- inputs (untimed) ------------------------------------------------------------------
export TARBALL=$WORK/tree.tar NEEDLES=$(((FILES + 49) / 50)) JOBS
log "generating the tree ($FILES files, $DIRS dirs) and its tarball"
python3 "$REPO_ROOT/scripts/gen-tree.py" "$WORK/tree" "$FILES" "$DIRS" 42 2>"$WORK/gen.log" ||
    die "tree generation failed: $(cat "$WORK/gen.log")"
tar -cf "$TARBALL" -C "$WORK/tree" . || die "tar -cf failed"
rm -rf "$WORK/tree"

top=$(git -C "$REPO_ROOT" rev-parse --show-toplevel) || die "$REPO_ROOT is not a git repository"
git clone -q --no-hardlinks "$top" "$WORK/repo" || die "git clone $top failed"
REPO_FILES=$(git -C "$WORK/repo" ls-files | wc -l)

# The C tree: libfuse's sources from the fuse3 source package scripts/cref.sh unpacked
# (real code, on disk without the network once cref.sh has run), with a generated Makefile
# that compiles every file that builds without meson's configuration (objects, no link).
cref_bin
FUSE_SRC=$(dirname "$CREF_BIN")/src/fuse3
[[ -d $FUSE_SRC/lib && -d $FUSE_SRC/include ]] ||
    die "no fuse3 source in $FUSE_SRC (run scripts/cref.sh --rebuild to fetch it again)"
C=$WORK/csrc
mkdir -p "$C" && cp -a "$FUSE_SRC/lib" "$FUSE_SRC/include" "$FUSE_SRC/example" "$FUSE_SRC/util" "$C/" ||
    die "cannot copy $FUSE_SRC"
# What meson would have configured, for this Linux.
cat >"$C/fuse_config.h" <<'EOF'
#define PACKAGE_VERSION "3"
#define FUSERMOUNT_DIR "/usr/bin"
#define HAVE_SETXATTR 1
#define HAVE_UTIMENSAT 1
#define HAVE_POSIX_FALLOCATE 1
#define HAVE_PIPE2 1
#define HAVE_SPLICE 1
#define HAVE_VMSPLICE 1
#define HAVE_COPY_FILE_RANGE 1
#define HAVE_FDATASYNC 1
#define HAVE_STRUCT_STAT_ST_ATIM 1
EOF
echo '#define FUSE_USE_VERSION 35' >"$C/libfuse_config.h"
# lib/fuse.c and fuse_loop_mt.c want more of meson's configuration, mount_bsd.c is BSD's,
# fusermount.c wants its own: left out.
SRCS=$(cd "$C" && ls lib/*.c lib/modules/*.c example/*.c util/mount.fuse.c |
    grep -v -e '^lib/fuse\.c$' -e '^lib/fuse_loop_mt\.c$' -e '^lib/mount_bsd\.c$' | tr '\n' ' ')
CFILES=$(wc -w <<<"$SRCS")
cat >"$C/Makefile" <<EOF
# generated by scripts/bench-parallel.sh: objects only, with header dependencies
SRCS = $SRCS
OBJS = \$(SRCS:.c=.o)
CFLAGS = -O0 -w -MMD -MP -D_REENTRANT -D_GNU_SOURCE -DFUSE_USE_VERSION=35 -I. -Iinclude -Ilib
all: \$(OBJS)
%.o: %.c
	\$(CC) \$(CFLAGS) -c \$< -o \$@
clean:
	rm -f \$(OBJS) \$(OBJS:.o=.d)
-include \$(OBJS:.o=.d)
EOF
make -s -C "$C" -j "$JOBS" >"$WORK/make.log" 2>&1 || die "the C tree does not build natively: $(tail -5 "$WORK/make.log")"
make -s -C "$C" clean >/dev/null
C_LINES=$(cd "$C" && cat $SRCS | wc -l)

# --- mounts and each client's directory (untimed) -------------------------------------
declare -A TARGET=() DAEMON=() FAILED_MOUNT=()
for mode in "${MODES[@]}"; do
    dir=$WORK/$mode
    mkdir -p "$dir/backing" "$dir/mnt"
    if [[ $mode == native ]]; then TARGET[$mode]=$dir/backing; else TARGET[$mode]=$dir/mnt; fi
    if ! mount_mode "$mode" "$dir/backing" "$dir/mnt" "$OUT/parallel-mount-$mode-$STAMP.log"; then
        FAILED_MOUNT[$mode]=1
        continue
    fi
    DAEMON[$mode]=${_MOUNT_PID[$dir/mnt]:-}
    log "$(mode_label "$mode"): $MAXC clients' clones and C trees"
    for ((i = 1; i <= MAXC; i++)); do
        d=${TARGET[$mode]}/c$i
        mkdir -p "$d" &&
            COHERENT_SESSION=bench-c$i git clone -q --no-hardlinks "$WORK/repo" "$d/repo" &&
            COHERENT_SESSION=bench-c$i cp -a "$C" "$d/csrc" ||
            { log "$mode: setting up client $i failed"; FAILED_MOUNT[$mode]=1; break; }
    done
done

# prepare WORKLOAD T N: untimed, before each round.
prepare() {
    local i
    for ((i = 1; i <= $3; i++)); do
        case $1 in
        untar) rm -rf "$2/c$i/untar" ;;
        make) make -s -C "$2/c$i/csrc" clean >/dev/null ;;
        esac
    done
}

# ops WORKLOAD: the operations of one client, for the daemon's CPU per operation.
ops() {
    case $1 in
    untar | rg) echo "$FILES" ;;
    git_status) echo 5 ;;
    make) echo "$CFILES" ;;
    esac
}

WORKLOADS=(untar rg git_status make)
printf 'mode\tclients\tworkload\trun\tseconds\tdaemon_cpu_seconds\n' >"$RAW"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
turn=0
for ((run = 1; run <= RUNS; run++)); do
    for n in "${CLIENTS[@]}"; do
        # the mode that starts a turn rotates, so that none always runs first (just after
        # another client count's set-up) or last
        order=("${MODES[@]:turn % ${#MODES[@]}}" "${MODES[@]:0:turn % ${#MODES[@]}}")
        turn=$((turn + 1))
        for mode in "${order[@]}"; do
            [[ -z ${FAILED_MOUNT[$mode]:-} ]] || continue
            log "run $run/$RUNS, $n clients: $(mode_label "$mode")"
            pid=${DAEMON[$mode]:-}
            for w in "${WORKLOADS[@]}"; do
                prepare "$w" "${TARGET[$mode]}" "$n"
                c0=
                [[ -z $pid ]] || c0=$(daemon_ticks "$pid")
                if run_bounded "$TIMEOUT" bash "$REPO_ROOT/scripts/bench-parallel.sh" --clients-run \
                    "$w" "${TARGET[$mode]}" "$n" >"$WORK/seconds" 2>>"$LOGF"; then
                    secs=$(cat "$WORK/seconds")
                else
                    log "$mode, $n clients: $w failed or timed out (run $run); see $LOGF"
                    secs=FAILED
                fi
                cpu=
                if [[ -n $c0 ]] && c1=$(daemon_ticks "$pid"); then
                    cpu=$(awk -v d=$((c1 - c0)) -v hz="$CLK_TCK" 'BEGIN{printf "%.3f", d / hz}')
                fi
                printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$n" "$w" "$run" "$secs" "$cpu" >>"$RAW"
            done
        done
    done
done

# --- where the daemon's threads wait (--sample) ----------------------------------------
SAMPLES=
if [[ -n $SAMPLE && -n ${DAEMON[coherent]:-} && -z ${FAILED_MOUNT[coherent]:-} ]]; then
    SAMPLES=$OUT/parallel-samples-$STAMP.txt
    pid=${DAEMON[coherent]}
    : >"$SAMPLES"
    for w in "${WORKLOADS[@]}"; do
        log "sampling the coherent daemon's threads: $w, $MAXC clients, for ${SAMPLE_SECS}s"
        # the workload over and over (a round can be shorter than one gdb sample)
        (
            end=$((SECONDS + SAMPLE_SECS))
            while ((SECONDS < end)); do
                prepare "$w" "${TARGET[coherent]}" "$MAXC"
                bash "$REPO_ROOT/scripts/bench-parallel.sh" --clients-run "$w" "${TARGET[coherent]}" "$MAXC" \
                    >/dev/null 2>>"$LOGF" || break
            done
        ) &
        load=$!
        k=0
        while kill -0 "$load" 2>/dev/null; do
            # kernel side: every thread's state and wait channel
            for task in /proc/"$pid"/task/*; do
                printf 'wchan\t%s\t%s\t%s\t%s\n' "$w" "$(cat "$task/comm" 2>/dev/null)" \
                    "$(sed 's/.*) //' "$task/stat" 2>/dev/null | cut -d' ' -f1)" "$(cat "$task/wchan" 2>/dev/null)"
            done >>"$SAMPLES"
            # user side, every 10th sample (0.2 s plus gdb's own time): the stacks of all threads
            if ((k++ % 10 == 0)); then
                timeout 20 gdb -p "$pid" -batch -nx -ex 'set pagination off' \
                    -ex 'thread apply all bt 25' 2>/dev/null | sed "s/^/gdb\t$w\t/" >>"$SAMPLES"
            fi
            sleep 0.02
        done
        wait "$load"
    done
fi

# --- tables ---------------------------------------------------------------------------
export LOAD_START
{
    echo "Parallel clients $(date -u '+%Y-%m-%d %H:%M UTC') — $(nproc) cores, kernel $(uname -r), load average $LOAD_START at start and $(cut -d' ' -f1-3 /proc/loadavg) at end (the machine was shared); one mount per mode over a separate backing directory on $(findmnt -rn -o FSTYPE -T "$WORK"); $RUNS interleaved rounds, medians. Each client in its own directory and session: untar of $FILES files ($(du -m "$TARBALL" | cut -f1) MB tar), rg -l over them, git status x5 in its clone ($REPO_FILES files), make -j $JOBS of $CFILES C files of libfuse ($C_LINES lines)."
    echo
    python3 - "$RAW" "$FILES" "$CFILES" "${MODES[@]}" <<'EOF'
import csv, statistics, sys
raw, files, cfiles, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
ops = {"untar": files, "rg": files, "git_status": 5, "make": cfiles}
unit = {"untar": "file", "rg": "file", "git_status": "status", "make": "C file"}
t, cpu, clients, works = {}, {}, [], []
for r in csv.DictReader(open(raw), delimiter="\t"):
    k = (r["mode"], int(r["clients"]), r["workload"])
    if int(r["clients"]) not in clients: clients.append(int(r["clients"]))
    if r["workload"] not in works: works.append(r["workload"])
    if r["seconds"] != "FAILED": t.setdefault(k, []).append(float(r["seconds"]))
    if r["daemon_cpu_seconds"]: cpu.setdefault(k, []).append(float(r["daemon_cpu_seconds"]))
def spread(xs):  # median absolute deviation
    m = statistics.median(xs); return statistics.median(abs(x - m) for x in xs)
labels = {"native": "native", "coherent": "coherent", "bindfs": "bindfs", "cref": "C ref."}
for w in works:
    print(f"### {w}: wall seconds until the last client ends (ratio to native), median ± MAD\n")
    print("| clients | " + " | ".join(labels.get(m, m) for m in modes) + " |")
    print("|---:|" + "---:|" * len(modes))
    for n in clients:
        cells = []
        nat = t.get(("native", n, w))
        for m in modes:
            v = t.get((m, n, w))
            if not v: cells.append("failed"); continue
            c = f"{statistics.median(v):.2f} ± {spread(v):.2f}"
            if m != "native" and nat: c += f" ({statistics.median(v) / statistics.median(nat):.2f}x)"
            cells.append(c)
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()
print("### daemon CPU per operation (µs, user + system, median over the rounds)\n")
fuse = [m for m in modes if m != "native"]
print("| workload | per | clients | " + " | ".join(labels.get(m, m) for m in fuse) + " |")
print("|---|---|---:|" + "---:|" * len(fuse))
for w in works:
    for n in clients:
        cells = []
        for m in fuse:
            v = cpu.get((m, n, w))
            cells.append(f"{statistics.median(v) / (n * ops[w]) * 1e6:.0f}" if v else "–")
        print(f"| {w} | {unit[w]} | {n} | " + " | ".join(cells) + " |")
print()
EOF
    if [[ -n $SAMPLES ]]; then
        echo "### where the coherent daemon's threads were ($MAXC clients; $SAMPLES)"
        echo
        python3 - "$SAMPLES" <<'EOF'
import collections, re, sys
# kernel side, the FUSE request threads (fuser-N) only: running, waiting for a request
# (fuse_dev_do_read), blocked on a futex (a lock, or a condition variable) or elsewhere
states = collections.defaultdict(collections.Counter)
locks = collections.defaultdict(collections.Counter)
stacks = collections.Counter()
work, stack = None, []
def frame_fn(f):
    m = re.match(r"#\d+\s+(?:0x[0-9a-f]+ in )?(\S+)", f)
    return m.group(1) if m else ""
def flush(w):
    # a thread in a lock's slow path (std's futex Mutex/RwLock, parking_lot; not a
    # condition variable's idle wait): the first frame of our own code above it
    stacks[w] += 1
    fns = [frame_fn(f) for f in stack]
    if not any(re.search(r"lock_contended|read_contended|write_contended|lock_slow|lock_shared_slow|lock_exclusive_slow", f) for f in fns):
        return
    for f in fns:
        if f.startswith(("coherent::", "<coherent::")):
            locks[w][re.sub(r"::h[0-9a-f]{16}$", "", f)] += 1
            return
    locks[w]["(no coherent frame)"] += 1
for line in open(sys.argv[1], errors="replace"):
    kind, w, rest = line.rstrip("\n").split("\t", 2)
    if kind == "wchan":
        comm, st, wchan = (rest.split("\t") + ["", ""])[:3]
        if not comm.startswith("fuser"):
            continue
        if st == "R": k = "running"
        elif wchan == "fuse_dev_do_read": k = "waiting for a request"
        elif wchan.startswith("futex"): k = "futex (lock or condvar)"
        else: k = f"{st} {wchan or '-'}"
        states[w][k] += 1
    else:
        if rest.startswith("Thread "):
            if stack: flush(work)
            stack, work = [], w
            if '"fuser' not in rest: stack, work = [], None
        elif rest.startswith("#") and work:
            stack.append(rest)
if stack and work: flush(work)
for w in dict.fromkeys(list(states) + list(stacks)):
    total = sum(states[w].values()) or 1
    top = ", ".join(f"{k} {v * 100 / total:.0f} %" for k, v in states[w].most_common(4))
    print(f"- {w}: request threads (every 20 ms): {top}")
    held = sum(locks[w].values())
    where = ", ".join(f"`{k}` ×{v}" for k, v in locks[w].most_common(4))
    print(f"  - gdb stacks of request threads: {held} of {stacks[w]} in a lock's slow path" + (f": {where}" if held else ""))
print()
EOF
    fi
} | tee "$OUT/parallel-table-$STAMP.md"
log "raw: $RAW; table: $OUT/parallel-table-$STAMP.md; failures: $LOGF"
