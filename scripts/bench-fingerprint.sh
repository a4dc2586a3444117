#!/usr/bin/env bash
# What content fingerprints cost (docs/versions-and-holds.md#content): through one mount
# (--no-passthrough, backing under /var/tmp), times a create storm (3000 `echo x > f`), a
# sequential 1 GiB `dd ... conv=fsync`, the `transfer` of a small and of a 1 GiB file (each
# takes a fingerprint), and the first look at the big file after `touch -a` behind the
# volume (reads it once) and the one after. Checks that the giver stays fenced.
#
# Usage (as root): scripts/bench-fingerprint.sh [COHERENT-MOUNT [COHERENT]]
#   default: target/debug/coherent-mount and target/debug/coherent; give main's binaries to
#   compare the first two rows.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$(realpath "${1:-$here/target/debug/coherent-mount}")
CLI=$(realpath "${2:-$here/target/debug/coherent}")
W=$(mktemp -d /var/tmp/coherent-fp-XXXX)
trap 'cd /; kill "$D" 2>/dev/null; wait "$D" 2>/dev/null; rm -rf "$W"' EXIT
mkdir -p "$W/b" "$W/m" "$W/s"
"$BIN" "$W/b" "$W/m" --state-dir "$W/s" --no-passthrough 2>"$W/log" &
D=$!
for _ in $(seq 100); do mountpoint -q "$W/m" && break; sleep 0.1; done
cd "$W/m" || exit 1
# secs CMD...: the wall time of CMD, in seconds.
secs() {
    local s e
    s=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    e=$(date +%s.%N)
    echo "$e - $s" | bc
}
echo "create_storm_3000 $(secs env COHERENT_SESSION=alice sh -c 'for i in $(seq 3000); do echo x > c$i; done')"
echo "seq_write_1GiB $(secs env COHERENT_SESSION=alice dd if=/dev/zero of=big bs=1M count=1024 conv=fsync)"
"$CLI" --help 2>/dev/null | grep -q transfer || exit 0
COHERENT_SESSION=bob "$CLI" whoami >/dev/null 2>&1
echo small > small
COHERENT_SESSION=alice cat small big >/dev/null
echo "transfer_small $(secs env COHERENT_SESSION=alice "$CLI" transfer small --to bob)"
echo "transfer_1GiB $(secs env COHERENT_SESSION=alice "$CLI" transfer big --to bob)"
touch -a "$W/b/big"
echo "look_after_touch_a_1GiB $(secs getfattr -n user.coherent.version big)"
echo "look_after_that_1GiB $(secs getfattr -n user.coherent.version big)"
if COHERENT_SESSION=alice sh -c 'echo x >> big' 2>/dev/null; then
    echo "FENCE BROKEN: the giver wrote the handed file"
    exit 1
fi
echo "giver still fenced"
