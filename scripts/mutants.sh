#!/usr/bin/env bash
# Mutation testing of the decision code (docs/design.md#write-routes) with cargo-mutants: every
# one-line change cargo-mutants can make in a part of the code is built and run against the test
# binaries that guard that part; a mutant the tests let through ("missed") is a gap or an
# equivalent mutant (README lists the equivalent ones and why).
#
# Not in CI. Sized for a 2-core machine: one part, optionally one shard, at a time.
#
#   scripts/mutants.sh PART [K/N] [cargo-mutants args...]
#
#   PART  coherence  src/coherence/ minus time.rs (the engine, verbs, ops, queries, lookup)
#         time       src/coherence/time.rs (timestamps, durations)
#         volume     the route mapping and commit logic of src/volume.rs
#         control    crates/coherent-wire/src/control/ (request parsing, replies)
#   K/N   run shard K of N (0-based), e.g. 0/4; each shard ~20-30 min here
#
# Examples:
#   scripts/mutants.sh coherence 0/4
#   scripts/mutants.sh volume "" --list          # what would run
#   scripts/mutants.sh coherence "" --in-diff <(git diff main)   # only what a change touched
#
# Results: target/mutants/PART[-K-of-N]/mutants.out/{caught,missed,timeout,unviable}.txt
set -euo pipefail
cd "$(dirname "$0")/.."

part=${1:?usage: scripts/mutants.sh coherence|time|volume|control [K/N] [args...]}
shard=${2:-}
shift $(($# >= 2 ? 2 : 1))

if ! command -v cargo-mutants >/dev/null 2>&1; then
    cargo install --locked cargo-mutants
fi

# The tests that guard each part: the fast core tests, and the mount tests that pin the
# behaviours earlier mutants got past (enforce_mutants). Test binaries as cargo args (only
# they are built), the modules of those binaries as test-name filters (`tests::` keeps the
# unit tests of --lib); docs/tests.md lists which binary holds which module.
core=(--lib --test nomount)
core_filters=(tests:: core_model:: core_scenarios:: core_contract:: core_offers:: core_wait:: core_journal::)
case $part in
coherence)
    files=(-f 'src/coherence/*.rs' -f 'src/coherence/*/*.rs' -e src/coherence/time.rs)
    tests=("${core[@]}" --test mounted)
    filters=("${core_filters[@]}" volume_policy:: inproc_decisions:: enforce_mutants:: enforce_hardlink:: enforce_users:: inproc_unresolved::)
    ;;
time)
    files=(-f src/coherence/time.rs)
    tests=(--lib --test nomount)
    filters=(tests:: core_journal:: core_scenarios::)
    ;;
volume)
    # Only the functions that map a FUSE request to a route and a commit.
    files=(-f src/volume/policy.rs -f 'src/volume/policy/*.rs' -F 'before_write|after_write|on_open|on_flush|on_release|exchange|refused')
    tests=(--test nomount --test mounted)
    filters=(volume_policy:: inproc_decisions:: inproc_versions:: enforce_mutants:: enforce_routes:: enforce_versions:: enforce_handoff::)
    ;;
control)
    # The wire is a package of its own: cargo-mutants mutates only the packages named.
    files=(--package coherent-wire -f 'crates/coherent-wire/src/control/*.rs')
    tests=(--lib --test mounted --test agents)
    filters=(tests:: enforce_surface:: cli_mount::)
    ;;
*)
    echo "unknown part $part" >&2
    exit 1
    ;;
esac

out=target/mutants/$part
shard_args=()
if [ -n "$shard" ]; then
    shard_args=(--shard "$shard")
    out=$out-${shard/\//-of-}
fi
mkdir -p "$out"

# As cargo args, not test args: the build phase then builds only these test binaries. The
# daemon and the CLI are other packages of the workspace: the binaries' own `usage` tests
# make cargo build them in the scratch tree too (the mount tests refuse stale binaries).
test_args=(--cargo-arg=--test=usage)
for a in "${tests[@]}"; do
    test_args+=("--cargo-arg=$a")
done

# A private target dir copied into the scratch tree (the mutated builds never touch the
# developer's), one job (the machine is shared), generous timeouts (a loaded 2-core box).
# The unmutated baseline runs first: a red tree says nothing about mutants.
env -u CARGO_TARGET_DIR cargo mutants \
    "${files[@]}" \
    "${test_args[@]}" \
    "${shard_args[@]}" \
    --jobs 1 \
    --timeout 300 \
    --build-timeout 900 \
    --no-shuffle \
    --copy-target=true \
    --test-workspace=true \
    --output "$out" \
    "$@" \
    -- -- "${filters[@]}"
