#!/usr/bin/env bash
# The scale bench: an agent's day on a tree of a real repository's size (the Linux 6.1
# source, 78k files, or a generated tree of the same shape), natively and on each mount,
# the modes taking turns in rounds (sync and drop caches between), medians of the rounds,
# printed as a Markdown table (seconds, ratio against native) with the daemons' CPU per
# phase and RSS per path.
#
# Usage: scripts/bench-scale.sh [--files N] [--rounds R] [--modes "..."] [--tar FILE]
#   --files N   a generated tree of N files (N/16 directories, scripts/gen-tree.py) instead
#               of the Linux source: --files 5000 is a quick run
#   --rounds R  rounds (3; the median of each phase over them)
#   --modes M   default "native coherent coherent-inplace bindfs cref" (scripts/lib.sh;
#               cref only when scripts/cref.sh builds the C reference; its descriptor limit
#               is raised to the hard limit)
#   --tar FILE  the tree to untar (a .tar); default: the Linux source from Debian's
#               linux-source-6.1 (apt-get download, cached in BENCH_SCALE_CACHE)
# Phases, each timed in the tree T: untar (tar -xf), find_stat (cold: caches dropped
# first; find + stat of every file), git_commit (git init, add -A, commit), git_status
# (x3), git_status_hook (x3 after `coherent install git`, coherent modes only), rg (rg -l
# over the tree), agent_edit (a second session appends a line to 1,000 files), rm_rf.
# Env: BENCH_SCALE_DIR (where to work; default target/bench-scale), BENCH_SCALE_CACHE
#      (the unpacked tar; default target/bench-scale/cache), BENCH_NICE (10: the run is
#      niced, the machine may be shared), BENCH_TIMEOUT (1800 s per phase).
# Output: target/bench-scale/raw-TS.tsv (mode round phase secs daemon_ticks), table-TS.md.
set -uo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FILES=
ROUNDS=3
MODES="native coherent coherent-inplace bindfs cref"
TAR=
while (($#)); do
    case $1 in
    --files) FILES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --tar) TAR=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds wants a positive number, not '$ROUNDS'"
[[ -z $FILES || $FILES =~ ^[1-9][0-9]*$ ]] || die "--files wants a positive number, not '$FILES'"

WORK=${BENCH_SCALE_DIR:-$REPO_ROOT/target/bench-scale}
CACHE=${BENCH_SCALE_CACHE:-$WORK/cache}
TIMEOUT=${BENCH_TIMEOUT:-1800}
TS=$(date +%Y%m%d-%H%M%S)
RAW=$WORK/raw-$TS.tsv
TABLE=$WORK/table-$TS.md
COHERENT_CLI=${COHERENT_CLI:-$REPO_ROOT/target/release/coherent}
mkdir -p "$WORK" "$CACHE"
need_tools tar find stat git rg xargs
renice -n "${BENCH_NICE:-10}" $$ >/dev/null 2>&1 || true

# The tree: a tar to untar in each mode.
if [[ -z $TAR && -n $FILES ]]; then
    TAR=$CACHE/gen-$FILES.tar
    if [[ ! -s $TAR ]]; then
        log "generating a tree of $FILES files, $((FILES / 16)) dirs"
        rm -rf "$CACHE/gen-$FILES" &&
            python3 "$REPO_ROOT/scripts/gen-tree.py" "$CACHE/gen-$FILES/tree" "$FILES" $((FILES / 16)) &&
            tar -cf "$TAR" -C "$CACHE/gen-$FILES" tree && rm -rf "$CACHE/gen-$FILES" ||
            die "could not generate the tree"
    fi
elif [[ -z $TAR ]]; then
    TAR=$CACHE/linux-source-6.1.tar
    if [[ ! -s $TAR ]]; then
        log "fetching Debian's linux-source-6.1 (apt-get download)"
        (cd "$CACHE" && apt-get download linux-source-6.1 >/dev/null 2>&1) ||
            die "apt-get download linux-source-6.1 failed: run with --files N for a generated tree"
        dpkg-deb --fsys-tarfile "$CACHE"/linux-source-6.1_*.deb |
            tar -xO ./usr/src/linux-source-6.1.tar.xz | xz -dc >"$TAR.part" &&
            mv "$TAR.part" "$TAR" || die "could not unpack linux-source-6.1"
        rm -f "$CACHE"/linux-source-6.1_*.deb
    fi
fi
[[ -s $TAR ]] || die "no tree: $TAR"
NPATHS=$(tar -tf "$TAR" | wc -l)
log "tree: $TAR ($NPATHS paths)"

# Modes: cref only when it can be built.
keep=()
for m in $MODES; do
    mode_known "$m" || die "unknown mode $m (known: $KNOWN_MODES)"
    if [[ $m == cref* ]] && ! CREF_BIN=${COHERENT_CREF:-$("$REPO_ROOT/scripts/cref.sh" 2>/dev/null)}; then
        log "no C reference (scripts/cref.sh failed): $m left out"
        continue
    fi
    keep+=("$m")
done
MODES="${keep[*]}"
need_mode_tools $MODES

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }

trap 'stop_child; cleanup_mounts' EXIT
trap 'exit 130' INT TERM

# phase NAME CMD...: times CMD in the current mode, with the daemon's CPU ticks.
phase() {
    local name=$1 t0 t1 c0=0 c1=0 rc
    shift
    [[ -n $PID ]] && c0=$(daemon_ticks "$PID")
    t0=$(date +%s.%N)
    # In a shell of its own: the workloads are the functions below (exported).
    run_bounded "$TIMEOUT" bash -c '"$@"' phase "$@"
    rc=$?
    t1=$(date +%s.%N)
    [[ -n $PID ]] && c1=$(daemon_ticks "$PID")
    ((rc == 0)) || log "$MODE round $ROUND: $name failed (exit $rc)"
    printf '%s\t%s\t%s\t%s\t%s\n' "$MODE" "$ROUND" "$name" \
        "$(awk -v a="$t0" -v b="$t1" -v rc="$rc" 'BEGIN{if (rc) print "nan"; else printf "%.3f", b-a}')" \
        "$((c1 - c0))" >>"$RAW"
}

# The workloads, each a command run in the tree's directory T.
git_commit() {
    cd "$1" && git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm tree
}
git_status3() { for _ in 1 2 3; do git -C "$1" status --porcelain >/dev/null || return 1; done; }
find_stat() { find "$1" -type f -print0 | xargs -0 stat --format=%s >/dev/null; }
agent_edit() {
    # A second agent (its own session) appends to 1,000 tracked files.
    cd "$1" && git ls-files | sed -n 1,1000p |
        COHERENT_SESSION=agent2 xargs -d '\n' sh -c 'for f; do echo "/* agent2 */" >>"$f" || exit 1; done' sh
}
rg_l() { rg -l --no-ignore -e 'coherent_needle_never_there|COHERENT_NEEDLE|module_init' "$1" >/dev/null; }
export -f git_commit git_status3 find_stat agent_edit rg_l

printf 'mode\tround\tphase\tsecs\tdaemon_ticks\n' >"$RAW"
declare -A RSS=()
MODES_A=($MODES)
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    # Rotate the order each round, so no mode always runs first (or after the same one).
    n=${#MODES_A[@]}
    for ((k = 0; k < n; k++)); do
        MODE=${MODES_A[$(((k + ROUND - 1) % n))]}
        base=$WORK/run-$MODE
        rm -rf "$base" "$WORK/state-mnt-$MODE"
        mkdir -p "$base/backing" "$base/mnt-$MODE"
        mnt=$base/mnt-$MODE
        drop_caches
        if [[ $MODE == cref* ]]; then
            ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
        fi
        mount_mode "$MODE" "$base/backing" "$mnt" "$base/daemon.log" || die "mount of $MODE failed"
        PID=${_MOUNT_PID[$mnt]:-}
        T=$mnt
        [[ $MODE == native ]] && T=$base/backing
        log "round $ROUND/$ROUNDS: $MODE"
        phase untar tar -xf "$TAR" -C "$T"
        drop_caches
        phase find_stat find_stat "$T"
        top=$(find "$T" -mindepth 1 -maxdepth 1 -type d | head -1)
        # Debian's source tarball ignores everything at its top (its packaging's rule):
        # the repository an agent works in tracks the tree.
        [[ -f $top/.gitignore ]] && sed -i '/^# Debian packaging/,$d' "$top/.gitignore"
        phase git_commit git_commit "$top"
        [[ -n $PID ]] && RSS[$MODE]+="$(awk '/VmRSS/ {print $2}' "/proc/$PID/status") "
        phase git_status git_status3 "$top"
        if [[ $MODE == coherent* ]]; then
            (cd "$top" && "$COHERENT_CLI" install git >/dev/null) || log "coherent install git failed in $MODE"
            git_status3 "$top" # the first status after the install fills the caches
            phase git_status_hook git_status3 "$top"
        fi
        phase rg rg_l "$T"
        phase agent_edit agent_edit "$top"
        phase rm_rf rm -rf "$top"
        unmount "$mnt"
        rm -rf "$base"
    done
done

# The table: median seconds per phase and mode, the ratio to native, the daemon's CPU.
{
    echo "Tree: $(basename "$TAR") ($NPATHS paths), $ROUNDS rounds, load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, $(uname -r)"
    echo
    printf '| phase |'
    for m in $MODES; do printf ' %s |' "$(mode_label "$m")"; done
    echo
    printf '|---|'
    for _ in $MODES; do printf -- '---:|'; done
    echo
    for p in untar find_stat git_commit git_status git_status_hook rg agent_edit rm_rf; do
        printf '| %s |' "$p"
        nat=$(awk -F'\t' -v p="$p" '$1=="native" && $3==p {print $4}' "$RAW" | median)
        for m in $MODES; do
            v=$(awk -F'\t' -v p="$p" -v m="$m" '$1==m && $3==p {print $4}' "$RAW" | median)
            if [[ $v == nan ]]; then
                printf ' — |'
            elif [[ $m == native || $nat == nan ]]; then
                printf ' %.2f |' "$v"
            else
                printf ' %.2f (%.2f×) |' "$v" "$(awk -v a="$v" -v b="$nat" 'BEGIN{print (b>0)?a/b:0}')"
            fi
        done
        echo
    done
    echo
    tck=$(getconf CLK_TCK)
    echo "Daemon CPU per phase (median ms; per path for untar and rm_rf):"
    echo
    for m in $MODES; do
        [[ $m == native ]] && continue
        printf -- '- %s:' "$(mode_label "$m")"
        for p in untar find_stat git_commit git_status git_status_hook rg agent_edit rm_rf; do
            v=$(awk -F'\t' -v p="$p" -v m="$m" '$1==m && $3==p {print $5}' "$RAW" | median)
            [[ $v == nan ]] && continue
            ms=$(awk -v t="$v" -v h="$tck" 'BEGIN{printf "%.0f", t*1000/h}')
            case $p in
            untar | rm_rf) printf ' %s %s ms (%.3f ms/path);' "$p" "$ms" "$(awk -v a="$ms" -v n="$NPATHS" 'BEGIN{print a/n}')" ;;
            *) printf ' %s %s ms;' "$p" "$ms" ;;
            esac
        done
        rss=$(printf '%s\n' ${RSS[$m]:-} | median)
        [[ $rss != nan ]] && printf ' RSS after the commit %.0f MB (%.0f bytes/path)' \
            "$(awk -v r="$rss" 'BEGIN{print r/1024}')" "$(awk -v r="$rss" -v n="$NPATHS" 'BEGIN{print r*1024/n}')"
        echo
    done
} | tee "$TABLE"
log "raw: $RAW; table: $TABLE"
