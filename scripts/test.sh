#!/usr/bin/env bash
# The project's test command (README "Test"): lint, the cargo test suite (unit, core,
# real-FUSE integration, differential), the real agent clients (scripts/test-clients.sh),
# then the public conformance suites against a mount.
# Needs root and /dev/fuse (scripts/deps.sh installs the rest).
set -euo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --quiet --all-targets -- -D warnings
echo "== cargo build --release (binaries used by the scripts)"
cargo build --quiet --release --bins
echo "== cargo test"
# Tests that mount FUSE run in parallel across test binaries' threads; each mount is private.
set +e
cargo test --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

read -r passed failed < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i }
  } END { print p + 0, f + 0 }' "$log")

echo "== scripts/test-clients.sh (Claude Code and Codex from npm, a scripted model on loopback)"
clog=$(mktemp)
trap 'rm -f "$log" "$clog"' EXIT
set +e
bash scripts/test-clients.sh 2>&1 | tee "$clog"
clients=${PIPESTATUS[0]}
set -e
# Its closing line: "claude X, codex Y: N passed, M failed (Ts)"; each row counts as a test.
read -r cp cf < <(sed -nE 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/p' "$clog" | tail -1) || true
if [ -z "${cp:-}" ]; then cp=0 cf=1; fi
passed=$((passed + cp)) failed=$((failed + cf))

echo "== scripts/conformance.sh"
conf=0
bash scripts/conformance.sh || conf=$?

echo
[ "$clients" -eq 0 ] || echo "clients: FAILED (exit $clients)"
[ "$conf" -eq 0 ] || echo "conformance: FAILED (exit $conf)"
echo "tests: $passed passed, $failed failed"
[ "$status" -eq 0 ] && [ "$clients" -eq 0 ] && [ "$conf" -eq 0 ]
