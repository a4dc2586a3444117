#!/usr/bin/env bash
# The differential fuzzer (tests/volume/fuzz.rs), long: OPS operations per mode, niced, one
# mode after another, then the allow-list's shared FUSE limits reproduced on libfuse's
# passthrough_hp (scripts/cref.sh builds it; skipped with --no-cref).
#
# Usage: scripts/fuzz.sh [--ops N] [--seed S] [--seq L] [--modes "daemon passthrough in-place unattributed"] [--no-cref]
#   --ops N     operations per mode (default 1000000)
#   --seed S    first seed (one sequence per seed, counting up; default: the built-in ones)
#   --seq L     operations per sequence (default 150)
# A divergence not on tests/data/fuzz-allow.txt ends the run with its shrunk reproducer
# and the seed that replays it. Output: target/fuzz/MODE.log; a summary on stdout.
# Exit 0: no divergence but those allowed; 1: a divergence (see the log); 2: setup error.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OPS=1000000 SEED= SEQ= MODES="daemon passthrough in-place unattributed" CREF=1
while (($#)); do
    case $1 in
    --ops) OPS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --no-cref) CREF=; shift ;;
    -h | --help) sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) printf 'error: unknown argument %s (see --help)\n' "$1" >&2; exit 2 ;;
    esac
done
[[ $EUID -eq 0 ]] || { echo "error: run as root (it mounts)" >&2; exit 2; }

cd "$ROOT" || exit 2
OUT=$ROOT/target/fuzz
mkdir -p "$OUT"
# The test binary, copied: a rebuild during a long run must not pull it away from under
# the workers it starts.
BIN=$(CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2} cargo test --test volume --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "volume":
        print(m["executable"])' | tail -1)
[[ -x $BIN ]] || { echo "error: cannot build the volume test binary" >&2; exit 2; }
cp "$BIN" "$OUT/volume" || exit 2
CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2} cargo build --bin coherent-mount -q || exit 2

declare -A TEST=([daemon]=fuzz_daemon [passthrough]=fuzz_passthrough [in-place]=fuzz_in_place
    [unattributed]=fuzz_unattributed_beside_an_agent)
export COHERENT_FUZZ_OPS=$OPS
[[ -n $SEED ]] && export COHERENT_FUZZ_SEED=$SEED
[[ -n $SEQ ]] && export COHERENT_FUZZ_SEQ=$SEQ
status=0
for mode in $MODES; do
    t=${TEST[$mode]:-}
    [[ -n $t ]] || { echo "error: unknown mode $mode" >&2; exit 2; }
    start=$(date +%s)
    nice -n 10 "$OUT/volume" --exact "fuzz::$t" --test-threads=1 --nocapture >"$OUT/$mode.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    if ((rc == 0)); then
        grep -h "fuzz (" "$OUT/$mode.log" | sed 's/^.*fuzz (/fuzz (/'
        grep -h "^  allowed" "$OUT/$mode.log"
        echo "  ($secs s)"
    else
        echo "fuzz ($mode): FAILED after $secs s; the reproducer:"
        sed -n '/divergence in the sequence/,/^-> /p' "$OUT/$mode.log"
        status=1
    fi
done
if [[ -n $CREF ]]; then
    if P=$("$ROOT/scripts/cref.sh"); then
        COHERENT_CREF=$P "$OUT/volume" --exact fuzz::shared_limits_on_passthrough_hp --ignored \
            --nocapture >"$OUT/passthrough_hp.log" 2>&1 || status=1
        grep -h "reproduced" "$OUT/passthrough_hp.log" | sed 's/^.*reproduced/reproduced on passthrough_hp:/'
    else
        echo "error: no passthrough_hp (scripts/cref.sh): the shared limits were not reproduced" >&2
        status=2
    fi
fi
exit $status
