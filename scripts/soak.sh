#!/usr/bin/env bash
# An agent's day on one volume (docs/design.md#speed; not part of CI, ~10 min on 2 cores):
#   the daemon runs under `ulimit -n 1024`; 200k files are created through the mount and
#   read back; this repository is cloned into the mount and built there (offline, its
#   target dir inside the mount); git work (commits, a branch, a merge, gc); 1,000 handoffs
#   among 8 sessions through the CLI with a `kill -9` of the daemon and a restart midway;
#   100k files created and removed. Prints the daemon's RSS and descriptors, the state
#   dir size (and its content history's share), restart times and the acknowledged
#   records lost (must be 0).
# Exit 0: no error anywhere and nothing acknowledged lost. Exit 1: a check failed.
#
# Usage: scripts/soak.sh
# Env:   SOAK_FILES (200000), SOAK_CHURN (100000), SOAK_HANDOFFS (1000), SOAK_BUILD (1: build
#        the clone; 0: skip), SOAK_NOFILE (1024), COHERENT_NO_BUILD (use the built binaries)
set -uo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FILES=${SOAK_FILES:-200000}
CHURN=${SOAK_CHURN:-100000}
HANDOFFS=${SOAK_HANDOFFS:-1000}
BUILD=${SOAK_BUILD:-1}
NOFILE=${SOAK_NOFILE:-1024}
CLI=$REPO_ROOT/target/release/coherent
SESSIONS=(ada bea cy dot eve fay gus hal)

[[ $EUID -eq 0 ]] || die "run as root (FUSE passthrough and allow_other)"
need_tools git python3 findmnt cargo
if [[ -z ${COHERENT_NO_BUILD:-} ]]; then
    log "cargo build --release (coherent-mount and coherent)"
    (cd "$REPO_ROOT" && cargo build --release --quiet --bins) || die "build failed"
fi
[[ -x $COHERENT_MOUNT && -x $CLI ]] || die "binaries missing under target/release"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/coherent-soak.XXXXXX") || die "mktemp failed"
BACKING=$WORK/backing MNT=$WORK/mnt STATE=$WORK/state DLOG=$WORK/daemon.log
mkdir -p "$BACKING" "$MNT"
PID=
FAILED=0

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID"
        wait "$PID" 2>/dev/null
    fi
    mountpoint -q "$MNT" && umount -l "$MNT"
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

fail() {
    printf 'FAIL: %s\n' "$*" >&2
    FAILED=1
}
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$PID/status"; }
fds() { find "/proc/$PID/fd" -mindepth 1 -maxdepth 1 | wc -l; }
state_kib() { du -sk "$STATE" | cut -f1; }
now_ms() { date +%s%3N; }

# start_daemon: mounts under the descriptor limit; sets PID and START_MS (time to mount).
start_daemon() {
    local t0
    t0=$(now_ms)
    (
        ulimit -n "$NOFILE"
        exec "$COHERENT_MOUNT" "$BACKING" "$MNT" --state-dir "$STATE" \
            -o allow_other,default_permissions
    ) 2>>"$DLOG" &
    PID=$!
    while ! findmnt -n -M "$MNT" -t fuse,fuse.coherent >/dev/null 2>&1 &&
        ! findmnt -n -M "$MNT" | grep -q fuse; do
        kill -0 "$PID" 2>/dev/null || die "coherent-mount exited; log: $(tail -5 "$DLOG")"
        sleep 0.01
    done
    START_MS=$(($(now_ms) - t0))
}

as() { # as SESSION CMD...: run CMD in the mount as that session
    local who=$1
    shift
    (cd "$MNT" && COHERENT_SESSION=$who "$@")
}

report() { printf '%-46s %s\n' "$1" "$2"; }

start_daemon
report "mount (fresh state)" "${START_MS} ms"
RSS0=$(rss_kib)
report "daemon RSS at start" "${RSS0} KiB"

# --- 1. many files under a low descriptor limit -------------------------------------------
log "creating $FILES files through the mount (daemon under ulimit -n $NOFILE)"
t0=$(now_ms)
python3 - "$MNT/many" "$FILES" <<'EOF' || fail "creating/reading $FILES files"
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for d in range(200):
    os.makedirs(f"{root}/d{d}", exist_ok=True)
for i in range(n):
    with open(f"{root}/d{i % 200}/f{i}", "w") as f:
        f.write(str(i))
for i in range(n):
    p = f"{root}/d{i % 200}/f{i}"
    os.stat(p)
    with open(p) as f:
        assert f.read() == str(i), p
EOF
report "$FILES files created and read back" "$((($(now_ms) - t0) / 1000)) s"
report "daemon descriptors after that" "$(fds) (limit $NOFILE)"
report "daemon RSS after that" "$(rss_kib) KiB"
rm -rf "$MNT/many" || fail "removing the $FILES files"

# --- 2. clone and build this repository inside the mount -----------------------------------
log "cloning the repository into the mount"
git clone -q "$REPO_ROOT" "$MNT/coherent" || fail "git clone into the mount"
if ((BUILD)); then
    log "cargo build --offline inside the mount (target dir inside too)"
    t0=$(now_ms)
    (cd "$MNT/coherent" && CARGO_TARGET_DIR=$MNT/coherent/target cargo build --offline -q 2>&1 | tail -5) ||
        fail "cargo build in the mount"
    [[ -x $MNT/coherent/target/debug/coherent-mount ]] || fail "the build in the mount made no binary"
    report "cargo build inside the mount" "$((($(now_ms) - t0) / 1000)) s"
fi

# --- 3. git work --------------------------------------------------------------------------
log "git: 40 commits, a branch, a merge, gc"
(
    set -e
    cd "$MNT/coherent"
    git config user.email soak@example.com
    git config user.name soak
    git checkout -q -b soak-work
    for i in $(seq 1 20); do
        echo "// soak $i" >>src/lib.rs
        git commit -qam "soak $i"
    done
    git checkout -q -
    git checkout -q -b soak-side
    for i in $(seq 1 20); do
        echo "soak side $i" >>README.md
        git commit -qam "side $i"
    done
    git merge -q --no-edit soak-work
    git gc -q
    git fsck --no-progress --no-dangling
) || fail "git work in the mount"
report "git log length after the merge" "$(cd "$MNT/coherent" && git rev-list --count HEAD)"

# --- 4. handoffs with a kill -9 midway --------------------------------------------------------
log "$HANDOFFS handoffs among ${#SESSIONS[@]} sessions, kill -9 and restart midway"
ACKED=$WORK/acked
: >"$ACKED"
for s in "${SESSIONS[@]}"; do
    as "$s" "$CLI" register >/dev/null || fail "register $s"
done
mkdir -p "$MNT/handoffs"
handoff() { # handoff I: giver writes hN.md, transfers it, the successor accepts
    local i=$1 g=${SESSIONS[$((i % 8))]} r=${SESSIONS[$(((i + 1) % 8))]} p=handoffs/h$1.md
    as "$g" sh -c "echo 'plan $i' > $p" || { fail "write $p as $g"; return; }
    local tries=0
    until as "$g" "$CLI" transfer --to "$r" --note "step $i" "$p" >/dev/null 2>"$WORK/err"; do
        # The close may reach the daemon just after the shell returns (handoff_in_flight).
        if grep -q in_flight "$WORK/err" && ((tries++ < 100)); then sleep 0.01; continue; fi
        fail "transfer $p $g -> $r: $(cat "$WORK/err")"
        return
    done
    echo "transfer $p $g $r" >>"$ACKED"
    if as "$r" "$CLI" accept "$p" >/dev/null 2>"$WORK/err"; then
        echo "accept $p $g $r" >>"$ACKED"
    else
        fail "accept $p by $r: $(cat "$WORK/err")"
    fi
}
t0=$(now_ms)
for ((i = 0; i < HANDOFFS / 2; i++)); do handoff "$i"; done
report "daemon RSS before kill -9" "$(rss_kib) KiB"
kill -9 "$PID"
wait "$PID" 2>/dev/null
umount -l "$MNT"
start_daemon
report "restart after kill -9 (to mounted)" "${START_MS} ms"
for ((i = HANDOFFS / 2; i < HANDOFFS; i++)); do handoff "$i"; done
report "$HANDOFFS handoffs (transfer + accept)" "$((($(now_ms) - t0) / 1000)) s"

# --- 5. churn ------------------------------------------------------------------------------
log "$CHURN files created and removed"
RSS_CHURN0=$(rss_kib)
report "daemon RSS before the churn" "${RSS_CHURN0} KiB"
t0=$(now_ms)
python3 - "$MNT/churn" "$CHURN" <<'EOF' || fail "churn"
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
os.makedirs(root, exist_ok=True)
for i in range(n):
    p = f"{root}/f{i}"
    with open(p, "w") as f:
        f.write("x")
    os.unlink(p)
EOF
report "$CHURN files created and removed" "$((($(now_ms) - t0) / 1000)) s"
# The mount compacts at its next upkeep (every 5 s): wait for the log to shrink.
for _ in $(seq 1 300); do
    (($(stat -c %s "$STATE/events.log") < 8 * 1024 * 1024)) && break
    sleep 0.1
done
RSS1=$(rss_kib)
report "daemon RSS at the end" "${RSS1} KiB (+$((RSS1 - RSS_CHURN0)) KiB over the churn)"
report "daemon descriptors at the end" "$(fds)"
report "state dir at the end" "$(state_kib) KiB"
# The content history (docs/history.md) lives in the state dir: its share, and its blobs.
if [[ -d $STATE/history ]]; then
    report "history store at the end" "$(du -sk "$STATE/history" | cut -f1) KiB in $(find "$STATE/history" -type f | wc -l) files"
fi

# --- 6. nothing acknowledged lost, and a clean restart ---------------------------------------
kill -TERM "$PID"
wait "$PID" 2>/dev/null
start_daemon
report "restart (to mounted)" "${START_MS} ms"
LOST=$(python3 - "$MNT/.coherent/status" "$ACKED" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
recs = st.get("live", []) + st.get("ended", [])
have = {(r["path"], r["giver"], r["successor"]): r for r in recs}
lost = 0
for line in open(sys.argv[2]):
    verb, path, giver, succ = line.split()
    r = have.get((path, giver, succ))
    if r is None or (verb == "accept" and r["status"] not in ("accepted", "completed")):
        lost += 1
        print(f"lost: {line.strip()} -> {r}", file=sys.stderr)
print(lost)
EOF
) || fail "reading the records back"
report "acknowledged verbs" "$(wc -l <"$ACKED")"
report "acknowledged records lost" "$LOST"
[[ $LOST == 0 ]] || fail "$LOST acknowledged records lost"
if grep -Ei "too many open files|no longer durable|panicked" "$DLOG"; then
    fail "the daemon log has errors (above)"
fi
((FAILED)) && exit 1
log "soak passed"
