# shellcheck shell=bash
# Shared helpers for conformance.sh and bench.sh (sourced, not executed).
#
# The one place that knows how each "mode" (a column of the comparison) is mounted:
# add a mode by adding a case to mode_command (and, if it needs the coherent-mount
# binary, to mode_needs_binary).

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COHERENT_MOUNT=${COHERENT_MOUNT:-$REPO_ROOT/target/release/coherent-mount}
# Extra FUSE options for coherent-mount (none by default: run as root it already mounts
# with allow_other, so other uids such as pjdfstest's nobody/tests reach the mount, and
# default_permissions, so the kernel checks modes/owners like a native filesystem does).
COHERENT_MOUNT_OPTS=${COHERENT_MOUNT_OPTS:-}
# The -o argument for coherent-mount: empty when there are no extra options.
COHERENT_MOUNT_O=()
[[ -n $COHERENT_MOUNT_OPTS ]] && COHERENT_MOUNT_O=(-o "$COHERENT_MOUNT_OPTS")
export PATH="$HOME/.cargo/bin:$PATH"
export LC_ALL=C # sort/join agree on order; tools behave the same on every machine

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    printf 'error: %s\n' "$*" >&2
    exit 2
}

# state_dir_for MNT: a fresh state directory beside the mount point (removed with it).
state_dir_for() {
    local d
    d="$(dirname "$1")/state-$(basename "$1")"
    rm -rf "$d" && mkdir -p "$d" && printf '%s' "$d"
}

KNOWN_MODES="native bindfs bindfs-inplace cref cref-inplace coherent coherent-inplace coherent-plain coherent-nopt coherent-base coherent-nohist coherent-nohist-inplace"

# mode_known MODE: MODE is one of KNOWN_MODES (without @tN).
mode_known() { [[ " $KNOWN_MODES " == *" ${1%@t*} "* ]]; }

# cref_bin: sets CREF_BIN to the C reference's binary (COHERENT_CREF, else scripts/cref.sh,
# which builds it once and caches it; it dies with the reason when it cannot be had).
CREF_BIN=${COHERENT_CREF:-}
cref_bin() {
    [[ -z $CREF_BIN ]] || return 0
    CREF_BIN=$("$REPO_ROOT/scripts/cref.sh") && [[ -x $CREF_BIN ]] ||
        die "no C reference: scripts/cref.sh failed (its reason is above); leave cref modes out with --modes"
}

# mode_command MODE BACKING MNT: sets the array MODE_CMD to the foreground command that
# mounts BACKING on MNT for MODE (empty for native: the backing directory is used as is).
mode_command() {
    local mode=$1 backing=$2 mnt=$3 threads=()
    MODE_CMD=()
    # MODE@tN: the same mode with N FUSE request threads (for measuring the default).
    if [[ $mode == coherent*@t[0-9]* ]]; then
        threads=(--threads "${mode##*@t}")
        mode=${mode%@t*}
    fi
    case $mode in
    native) ;;
    bindfs)
        # As root bindfs adds allow_other itself; multithreaded to give the peer its best shot.
        MODE_CMD=(bindfs -f --multithreaded "$backing" "$mnt")
        ;;
    bindfs-inplace)
        # bindfs over its own directory (it opens the source before mounting over it).
        MODE_CMD=(bindfs -f --multithreaded "$mnt" "$mnt")
        ;;
    cref)
        # The C reference: libfuse's passthrough_hp example (scripts/cref.sh builds it from
        # Debian's fuse3 source package), with its defaults: multithreaded, 1-day entry and
        # attribute timeouts, writeback cache, keep_cache, splice. It mounts with its own
        # fixed options (default_permissions, no allow_other): the bench runs as root, the
        # mounting user, so none is needed there.
        cref_bin
        MODE_CMD=("$CREF_BIN" --foreground "$backing" "$mnt")
        ;;
    cref-inplace)
        # passthrough_hp over its own directory (it opens the source O_PATH before mounting).
        cref_bin
        MODE_CMD=("$CREF_BIN" --foreground "$mnt" "$mnt")
        ;;
    coherent)
        # The volume as shipped: passthrough and enforcement (its state beside the mount).
        MODE_CMD=("$COHERENT_MOUNT" "$backing" "$mnt" --state-dir "$(state_dir_for "$mnt")"
            "${COHERENT_MOUNT_O[@]}")
        ;;
    coherent-inplace)
        # The volume mounted over its own directory (`coherent-mount DIR`), as agents use
        # it: the kernel may cache long there (the daemon is the only path to the files).
        # The backing directory is unused; the workloads run in MNT, which is both.
        MODE_CMD=("$COHERENT_MOUNT" "$mnt" --state-dir "$(state_dir_for "$mnt")"
            "${COHERENT_MOUNT_O[@]}")
        ;;
    coherent-nohist | coherent-nohist-inplace)
        # The same without the content history (--history-max 0): what keeping every
        # version costs (docs/history.md).
        mode_command "${mode/-nohist/}" "$backing" "$mnt"
        MODE_CMD+=(--history-max 0)
        ;;
    coherent-plain)
        # Passthrough without the coherence layer (hidden --no-coherence): what enforcement costs.
        MODE_CMD=("$COHERENT_MOUNT" "$backing" "$mnt" --no-coherence "${COHERENT_MOUNT_O[@]}")
        ;;
    coherent-nopt)
        MODE_CMD=("$COHERENT_MOUNT" "$backing" "$mnt" --no-passthrough
            --state-dir "$(state_dir_for "$mnt")" "${COHERENT_MOUNT_O[@]}")
        ;;
    coherent-base)
        # Another build of coherent-mount (e.g. main before a change), passthrough: for
        # before/after in one run. COHERENT_MOUNT_BASE=path/to/coherent-mount.
        [[ -x ${COHERENT_MOUNT_BASE:-} ]] || die "coherent-base needs COHERENT_MOUNT_BASE=binary"
        MODE_CMD=("$COHERENT_MOUNT_BASE" "$backing" "$mnt" "${COHERENT_MOUNT_O[@]}")
        ;;
    *) die "unknown mode '$mode' (known: $KNOWN_MODES, coherent modes with @tN)" ;;
    esac
    ((${#threads[@]} == 0)) || MODE_CMD+=("${threads[@]}")
}

mode_label() {
    case $1 in
    native) echo "native" ;;
    bindfs) echo "bindfs" ;;
    bindfs-inplace) echo "bindfs in place" ;;
    cref) echo "C ref. (passthrough_hp)" ;;
    cref-inplace) echo "C ref. in place" ;;
    coherent) echo "coherent (passthrough)" ;;
    coherent-inplace) echo "coherent in place" ;;
    coherent*@t*) echo "$(mode_label "${1%@t*}"), ${1##*@t} threads" ;;
    coherent-plain) echo "coherent (--no-coherence)" ;;
    coherent-nohist) echo "coherent, no history" ;;
    coherent-nohist-inplace) echo "coherent in place, no history" ;;
    coherent-nopt) echo "coherent (--no-passthrough)" ;;
    coherent-base) echo "coherent base build (passthrough)" ;;
    *) echo "$1" ;;
    esac
}

mode_needs_binary() {
    case $1 in coherent*) return 0 ;; *) return 1 ;; esac
}

# build_coherent: (re)build the release binary; cargo makes this a no-op when it is fresh,
# and always building avoids measuring a stale binary.
build_coherent() {
    if [[ -n ${COHERENT_NO_BUILD:-} ]]; then
        [[ -x $COHERENT_MOUNT ]] || die "$COHERENT_MOUNT missing and COHERENT_NO_BUILD is set"
        return
    fi
    log "cargo build --release (in $REPO_ROOT)"
    (cd "$REPO_ROOT" && cargo build --release --quiet --bin coherent-mount) ||
        die "cargo build --release failed"
    [[ -x $COHERENT_MOUNT ]] || die "build finished but $COHERENT_MOUNT is missing"
}

need_tools() {
    local t missing=()
    for t in "$@"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
    ((${#missing[@]} == 0)) || die "missing: ${missing[*]} (run scripts/deps.sh as root)"
}

# need_mode_tools MODE...: the mount programs of these modes exist (coherent-mount is built).
need_mode_tools() {
    local m built=0
    for m in "$@"; do
        if mode_needs_binary "$m"; then
            ((built)) || build_coherent
            built=1
        else
            mode_command "$m" /backing /mnt
            ((${#MODE_CMD[@]} == 0)) || need_tools "${MODE_CMD[0]}"
        fi
    done
}

# run_bounded SECS CMD...: CMD under timeout (which signals CMD's whole process group),
# run in the background and waited for, so that a signal to the script is handled at once
# rather than when CMD ends; stop_child (called by the traps) ends it.
_CHILD=
run_bounded() {
    local secs=$1 rc
    shift
    timeout -k 10 "$secs" "$@" &
    _CHILD=$!
    wait "$_CHILD"
    rc=$?
    _CHILD=
    return "$rc"
}
stop_child() {
    [[ -n $_CHILD ]] || return 0
    kill -TERM "$_CHILD" 2>/dev/null
    wait "$_CHILD" 2>/dev/null
    _CHILD=
}

# --- mounts ---------------------------------------------------------------------------
# Every mount made here is recorded so that cleanup_mounts (run from an EXIT trap) can
# undo it on every exit path.
declare -a _MOUNTS=()
declare -A _MOUNT_PID=()

is_mounted() { findmnt -rn --mountpoint "$1" >/dev/null 2>&1; }

# mount_mode MODE BACKING MNT LOGFILE: mount and wait (bounded) until it is live.
mount_mode() {
    local mode=$1 backing=$2 mnt=$3 logf=$4 i pid
    mode_command "$mode" "$backing" "$mnt"
    ((${#MODE_CMD[@]})) || return 0
    is_mounted "$mnt" && die "$mnt is already a mountpoint"
    NO_COLOR=1 "${MODE_CMD[@]}" >"$logf" 2>&1 </dev/null &
    pid=$!
    _MOUNTS+=("$mnt")
    _MOUNT_PID[$mnt]=$pid
    for ((i = 0; i < 200; i++)); do
        if is_mounted "$mnt" && [[ $(findmnt -rn -o FSTYPE --mountpoint "$mnt") == fuse* ]]; then
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            # A daemonizing command may have exited 0 after mounting; that still counts.
            is_mounted "$mnt" && return 0
            log "mount for $mode exited before mounting; its output:"
            sed 's/^/    /' "$logf" >&2
            return 1
        fi
        sleep 0.1
    done
    log "mount for $mode not live after 20s; its output:"
    sed 's/^/    /' "$logf" >&2
    return 1
}

# abort_fuse MNT: last resort for a wedged daemon, so nothing waiting on it hangs forever.
abort_fuse() {
    local dev minor
    dev=$(findmnt -rn -o MAJ:MIN --mountpoint "$1") || return 0
    minor=${dev#*:}
    [[ -d /sys/fs/fuse/connections ]] || return 0
    [[ -e /sys/fs/fuse/connections/$minor ]] ||
        mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null
    [[ -e /sys/fs/fuse/connections/$minor/abort ]] &&
        echo 1 >"/sys/fs/fuse/connections/$minor/abort" 2>/dev/null
    return 0
}

# unmount MNT: clean unmount, then wait for the daemon; escalate if it hangs.
unmount() {
    local mnt=$1 pid=${_MOUNT_PID[$1]:-} i
    if is_mounted "$mnt"; then
        if ! timeout 20 umount "$mnt" 2>/dev/null; then
            log "umount $mnt failed; aborting the FUSE connection and unmounting lazily"
            abort_fuse "$mnt"
            umount -l "$mnt" 2>/dev/null
        fi
    fi
    if [[ -n $pid ]]; then
        for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            log "daemon $pid for $mnt still alive 10s after unmount; killing it"
            kill -TERM "$pid" 2>/dev/null; sleep 1; kill -KILL "$pid" 2>/dev/null
        fi
        wait "$pid" 2>/dev/null
    fi
    is_mounted "$mnt" && umount -l "$mnt" 2>/dev/null
    unset "_MOUNT_PID[$mnt]"
    local keep=() m
    for m in "${_MOUNTS[@]}"; do [[ $m == "$mnt" ]] || keep+=("$m"); done
    _MOUNTS=("${keep[@]}")
}

cleanup_mounts() {
    local m
    for m in "${_MOUNTS[@]}"; do unmount "$m"; done
}

# daemon_ticks PID: the CPU time (user + system, clock ticks) the process has used so far,
# all its threads, those that ended too (/proc/PID/stat fields 14 and 15).
daemon_ticks() {
    local s f
    s=$(<"/proc/$1/stat") || return 1
    s=${s##*) } # the command name may hold spaces and parentheses
    read -r -a f <<<"$s"
    printf '%s' $((f[11] + f[12]))
}

# median of the numbers on stdin
median() {
    sort -g | awk '{v[NR]=$1} END {if (NR==0) {print "nan"; exit}
        if (NR%2) print v[(NR+1)/2]; else printf "%.6f\n", (v[NR/2]+v[NR/2+1])/2}'
}
