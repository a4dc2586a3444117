#!/usr/bin/env bash
# The handoff, played in a terminal (docs/design.md#handoff-docs/design.md#control-surface).
#
# Builds coherent, mounts a throwaway workspace, and lets session alice hand plan.md to
# session bob with a note. Every write alice then tries (>>, truncate, cp, mv, python) must be
# denied with EACCES, and alice reads why; bob reads his inbox and the handoff xattr, writes,
# and the record says completed. A second scene shows a bystander (carol) overtaking a
# handoff. Then the status and the state log (as a table), and everything is unmounted and
# removed.
#
# Usage: scripts/demo.sh [--no-build]
# Env:   DEMO_PAUSE=SECONDS  pause between steps (default 0.7 on a terminal, else 0)
#        COHERENT_BIN_DIR=DIR  take the binaries from DIR (default target/release)
#
# Needs: root or user FUSE (/dev/fuse, fusermount3), getfattr (apt-get install attr),
# python3, sed. Exits non-zero, loudly, as soon as anything differs from the contract.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=1
for arg in "$@"; do
    case $arg in
    --no-build) BUILD=0 ;;
    -h | --help)
        sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "demo.sh: unknown argument $arg (try --help)" >&2
        exit 1
        ;;
    esac
done

# ---- presentation ----------------------------------------------------------------------
if [[ -t 1 ]]; then
    B=$'\e[1m' DIM=$'\e[2m' RED=$'\e[31m' GRN=$'\e[32m' YEL=$'\e[33m' BLU=$'\e[34m'
    MAG=$'\e[35m' CYN=$'\e[36m' OFF=$'\e[0m'
    PAUSE=${DEMO_PAUSE:-0.7}
else
    B='' DIM='' RED='' GRN='' YEL='' BLU='' MAG='' CYN='' OFF=''
    PAUSE=${DEMO_PAUSE:-0}
fi

scene() { printf '\n%s== %s ==%s\n' "$B$BLU" "$*" "$OFF"; }
say() {
    printf '%s# %s%s\n' "$YEL" "$*" "$OFF"
    sleep "$PAUSE"
}
ok() { printf '%s   ok: %s%s\n' "$GRN" "$*" "$OFF"; }
fail() {
    printf '%sdemo FAILED: %s%s\n' "$B$RED" "$*" "$OFF" >&2
    exit 1
}
colour_of() {
    case $1 in
    alice) printf '%s' "$MAG" ;;
    bob) printf '%s' "$CYN" ;;
    *) printf '%s' "$B" ;;
    esac
}
prompt() { printf '%s%s$%s %s\n' "$(colour_of "$1")" "$1" "$OFF" "$2"; }
indent() { sed 's/^/    /'; }

# ---- build and mount -------------------------------------------------------------------
for tool in getfattr python3 sed fusermount3; do
    command -v "$tool" >/dev/null ||
        fail "$tool is not installed (apt-get install -y attr python3 sed fuse3)"
done

if ((BUILD)); then
    scene "build"
    say "cargo build --release (coherent-mount and the coherent CLI)"
    (cd "$ROOT" && cargo build --release --quiet --bin coherent-mount --bin coherent)
fi
BIN=${COHERENT_BIN_DIR:-$ROOT/target/release}
[[ -x $BIN/coherent-mount && -x $BIN/coherent ]] ||
    fail "no binaries in $BIN (run without --no-build)"
export PATH="$BIN:$PATH"

# Beside the checkout, wherever it is: from a clone under /tmp, `coherent run` leaves /tmp
# (which then holds the backing directory) out of the agents' writable places and gives
# each session a TMPDIR of its own (docs/sessions.md).
mkdir -p "$ROOT/target"
WORK=$(mktemp -d "$ROOT/target/coherent-demo.XXXXXX")
BACKING=$WORK/backing
MNT=$WORK/workspace
STATE=$WORK/state
LOG=$WORK/coherent-mount.log
mkdir -p "$BACKING" "$MNT" "$STATE"
MOUNT_PID=''
CGROUP2=$(awk -F' - ' '{ split($1, a, " "); split($2, b, " ");
                         if (b[1] == "cgroup2") { print a[5]; exit } }' /proc/self/mountinfo)

is_mounted() { awk -v m="$MNT" '$2 == m { found = 1 } END { exit !found }' /proc/mounts; }

cleanup() {
    local rc=$?
    set +e
    cd /
    if [[ -n $MOUNT_PID ]] && kill -0 "$MOUNT_PID" 2>/dev/null; then
        # SIGINT is the daemon's clean unmount (docs/design.md#mounting)
        kill -INT "$MOUNT_PID" 2>/dev/null
        for _ in $(seq 50); do
            kill -0 "$MOUNT_PID" 2>/dev/null || break
            sleep 0.1
        done
    fi
    if is_mounted; then
        fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null
    fi
    if [[ -n $MOUNT_PID ]] && kill -0 "$MOUNT_PID" 2>/dev/null; then
        kill -KILL "$MOUNT_PID" 2>/dev/null
    fi
    [[ -n $MOUNT_PID ]] && wait "$MOUNT_PID" 2>/dev/null
    if ((rc != 0)) && [[ -s $LOG ]]; then
        printf '%s--- last lines of the coherent-mount log:%s\n' "$DIM" "$OFF" >&2
        tail -n 30 "$LOG" >&2
    fi
    if is_mounted; then
        printf 'demo: %s is still mounted; unmount it with: fusermount3 -u %s\n' "$MNT" "$MNT" >&2
        rc=1
    else
        rm -rf "$WORK"
    fi
    # the session cgroups `coherent run` made, once empty
    if [[ -n $CGROUP2 ]]; then
        for s in alice bob carol; do rmdir "$CGROUP2/coherent-session-$s" 2>/dev/null; done
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

scene "mount"
say "a throwaway workspace: $BACKING mounted at $MNT, state in $STATE"
prompt you "coherent-mount $BACKING $MNT --state-dir $STATE &"
coherent-mount "$BACKING" "$MNT" --state-dir "$STATE" 2>"$LOG" &
MOUNT_PID=$!
for _ in $(seq 100); do
    [[ -e $MNT/.coherent/ctl ]] && break
    kill -0 "$MOUNT_PID" 2>/dev/null || fail "coherent-mount exited before mounting"
    sleep 0.1
done
[[ -e $MNT/.coherent/ctl ]] || fail "no $MNT/.coherent/ctl after 10 s"
ok "mounted; the control files are in $MNT/.coherent/"
cd "$MNT"

# ---- helpers that run commands in a session --------------------------------------------
# run_as SESSION 'shell code': shows it like a prompt, runs it in the session, must succeed.
run_as() {
    local out rc=0
    prompt "$1" "$2"
    out=$(coherent run --session "$1" -- sh -c "$2" 2>&1) || rc=$?
    [[ -z $out ]] || printf '%s\n' "$out" | indent
    ((rc == 0)) || fail "$1: '$2' failed (exit $rc)"
}
# out_as SESSION 'shell code': runs it quietly and prints its output, for checks.
out_as() {
    coherent run --session "$1" -- sh -c "$2" || fail "$1: '$2' failed (exit $?)"
}
version() { getfattr --only-values -n user.coherent.version -- "$1"; }
# log_table < events: one row per event, the fields that matter for the story.
log_table() {
    python3 -c '
import json, sys
skip = {"seq", "ts", "event", "path", "session", "agent", "stamp", "successor_agent", "via", "record"}
rows = [("#", "time", "event", "path", "session", "details")]
for line in sys.stdin:
    try:
        e = json.loads(line)
    except ValueError:
        continue
    details = []
    for k, v in e.items():
        if k in skip or v is None:
            continue
        if isinstance(v, str) and len(v) > 40:
            v = v[:37] + "..."
        details.append(f"{k}={v}")
    rows.append((str(e.get("seq", "")), e.get("ts", "")[11:23], e.get("event", ""),
                 e.get("path") or "", e.get("session", ""), " ".join(details)))
widths = [max(len(r[i]) for r in rows) for i in range(5)]
for r in rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[5])
'
}
digest() { sha256sum -- "$1" | cut -d' ' -f1; }

# denied SESSION 'shell code' FILE: the write must fail with EACCES, and FILE's bytes and
# version must not move.
denied() {
    local who=$1 code=$2 file=$3 out before_sum before_v
    before_sum=$(digest "$file")
    before_v=$(version "$file")
    prompt "$who" "$code"
    if out=$(coherent run --session "$who" -- sh -c "$code" 2>&1); then
        printf '%s\n' "$out" | indent
        fail "$who's '$code' succeeded, but $who handed $file on: it must be denied"
    fi
    printf '%s%s%s\n' "$RED" "$(printf '%s\n' "$out" | indent)" "$OFF"
    grep -qi 'permission denied' <<<"$out" ||
        fail "'$code' failed, but not with EACCES (Permission denied): $out"
    [[ $(digest "$file") == "$before_sum" ]] || fail "$file's bytes changed after a denied write"
    [[ $(version "$file") == "$before_v" ]] || fail "$file's version moved after a denied write"
    ok "denied (EACCES); $file unchanged at v$before_v"
}

# status_json PATH: the volume's status of one path as JSON (asked by a session, since
# unattributed processes may be refused verbs).
status_json() { out_as alice "coherent --json status '$1'"; }

# ---- scene 1: the handoff completes ----------------------------------------------------
scene "scene 1: alice hands plan.md to bob"
say "bob registers, so that others can hand files to him"
run_as bob 'coherent register'

say "each session is resolved from its process: coherent run puts it in a cgroup and sets COHERENT_SESSION"
run_as alice 'coherent whoami'

say "alice writes the plan"
run_as alice 'printf "# Plan\n1. design the API\n" > plan.md'
v=$(version plan.md)
ok "plan.md is at v$v"

say "alice hands it to bob, with a note"
run_as alice 'coherent transfer --to bob --note "Please review section 1, then merge." plan.md'

say "alice can still read plan.md, but every way of writing it is now refused:"
run_as alice 'cat plan.md'
denied alice 'echo "2. one more thing" >> plan.md' plan.md
denied alice 'truncate -s 0 plan.md' plan.md
run_as alice 'printf "# Draft\n" > draft.md'
denied alice 'cp draft.md plan.md' plan.md
denied alice 'mv draft.md plan.md' plan.md
denied alice "python3 -c \"open('plan.md', 'w')\"" plan.md

say "alice asks the volume why"
run_as alice 'cat .coherent/why'
why=$(out_as alice 'cat .coherent/why')
for word in bob "v$v" withdraw; do
    grep -q -- "$word" <<<"$why" || fail ".coherent/why does not mention '$word': $why"
done
ok ".coherent/why names bob, v$v and the ways out"

say "bob looks at what was handed to him"
run_as bob 'cat .coherent/inbox'
grep -q 'Please review section 1' <<<"$(out_as bob 'cat .coherent/inbox')" ||
    fail "bob's inbox does not show alice's note"
run_as bob 'getfattr -n user.coherent.handoff plan.md'
handoff=$(out_as bob 'getfattr --only-values -n user.coherent.handoff plan.md')
grep -q '"role": *"successor"' <<<"$handoff" || fail "bob's role is not successor: $handoff"
ok "bob sees the record as its successor"

say "bob writes plan.md: the handoff completes, and the version moves"
run_as bob 'cat plan.md > /dev/null && echo "2. reviewed by bob" >> plan.md'
[[ $(version plan.md) -gt $v ]] || fail "plan.md's version did not move after bob's write"
run_as bob 'coherent status plan.md'
grep -q '"completed"' <<<"$(status_json plan.md)" || fail "the record is not completed"
ok "the record says completed; plan.md is at v$(version plan.md)"

say "alice reads the new version and can write again"
run_as alice 'cat plan.md && echo "3. alice again" >> plan.md'
ok "alice's write went through"

# ---- scene 2: a bystander overtakes ----------------------------------------------------
scene "scene 2: carol writes a file alice handed to bob"
run_as alice 'printf "notes\n" > notes.md'
run_as alice 'coherent transfer --to bob notes.md'
denied alice 'echo "more notes" >> notes.md' notes.md
say "carol is neither giver nor successor: nothing stops her"
run_as carol 'echo "carol was here" >> notes.md'
run_as carol 'coherent status notes.md'
s=$(status_json notes.md)
grep -q '"overtaken"' <<<"$s" || fail "the record is not overtaken: $s"
grep -q '"counterparty": *"carol"' <<<"$s" || fail "the record does not name carol: $s"
ok "the record says overtaken by carol; her commit moved the version, so alice's fence lifted"
run_as alice 'cat notes.md > /dev/null && echo "alice again" >> notes.md'

# ---- the record ------------------------------------------------------------------------
scene "status and the state log"
run_as alice 'coherent status'
say "the state log (.coherent/events; coherent watch follows it live), as a table:"
prompt you "cat .coherent/events    # one JSON object per line, shown here as a table"
log_table <.coherent/events | indent
say "uid:$(id -u) is this script itself (\"you\"): it reads versions and checksums from outside any session, so the volume shows it as the unattributed uid:$(id -u)"
for ev in transfer denied completed overtaken; do
    grep -q "\"event\": *\"$ev\"" .coherent/events || fail "no '$ev' event in the state log"
done
ok "the log has the transfer, the denials, completed and overtaken"

scene "done"
say "unmounting and removing $WORK"
