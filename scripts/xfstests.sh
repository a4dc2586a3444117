#!/usr/bin/env bash
# xfstests' generic group against coherent-mount, through mount(8) and the mount helper
# (docs/posix.md#xfstests).
#
#   scripts/xfstests.sh [GROUP] [--fast] [-- TEST...]   GROUP: quick (default) or auto
#
# --fast also leaves out the tests in scripts/xfstests-slow (CI runs `quick --fast`).
# Tests in scripts/xfstests-known run and count as failed, each with its cause there; the
# exit status is 1 only for a failure not listed, and a listed test that passes is named.
#
# Builds kdave/xfstests at a pinned commit: from the tarball XFSTESTS_TARBALL (a `git
# archive` of that commit) when set, else by cloning it (needs a network). Its build and
# run deps are Debian packages, installed here if missing (DEPS). Runs as root: it installs a
# helper link /sbin/mount.fuse.coherent-xfstests (removed at the end), creates the users
# xfstests needs (fsgqa, 123456-fsgqa, fsgqa2) if missing, and keeps everything else under
# $XFSTESTS_WORK (default target/xfstests): the build, the backing directories (on the
# host's filesystem), the mount points, the state and the results.
#
# The `auto` group has more tests that fill the scratch filesystem: for it, put
# XFSTESTS_WORK on a filesystem of its own. Excluded tests are listed in
# scripts/xfstests-exclude, each with its reason. The last
# line printed is the count: `xfstests GROUP: ran N passed N failed N not-run N excluded N`.
# Exit status 1 when a test not excluded failed.
set -euo pipefail

COMMIT=63a29724a85f1999e49bf0a9bf0d22643b6116e5
REPO=https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GROUP=${1:-quick}
shift || true
FAST=0
[ "${1:-}" = "--fast" ] && FAST=1 && shift
[ "${1:-}" = "--" ] && shift
WORK=${XFSTESTS_WORK:-$ROOT/target/xfstests}
SRC=$WORK/xfstests-${COMMIT:0:8}
SUBTYPE=coherent-xfstests
HELPER=/sbin/mount.fuse.$SUBTYPE
BIN=${COHERENT_MOUNT:-$ROOT/target/release/coherent-mount}

case $GROUP in quick | auto) ;; *)
    echo "xfstests.sh: group $GROUP: use quick or auto" >&2
    exit 2
    ;;
esac
if [ "$(id -u)" != 0 ]; then
    echo "xfstests.sh: run as root (xfstests mounts and unmounts, and runs tests as other users)" >&2
    exit 2
fi
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release --bin coherent-mount)

# xfstests' README list for Debian (less lvm2 and the kernel headers: no block devices
# here), and pkg-config, without which its configure script fails on a minimal root.
DEPS=(xfslibs-dev uuid-dev libtool libtool-bin e2fsprogs automake gcc libuuid1 quota attr acl
    make libacl1-dev libaio-dev xfsprogs libgdbm-dev libgdbm-compat-dev gawk fio dbench
    uuid-runtime python3 sqlite3 liburing-dev libcap-dev pkg-config bc indent psmisc dump
    file sed)
missing=()
for p in "${DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "xfstests.sh: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# The build, once per commit.
if [ ! -x "$SRC/ltp/fsstress" ]; then
    rm -rf "$SRC" && mkdir -p "$SRC"
    if [ -n "${XFSTESTS_TARBALL:-}" ]; then
        tar -xzf "$XFSTESTS_TARBALL" -C "$SRC" --strip-components=1
    else
        git clone -q "$REPO" "$SRC"
        git -C "$SRC" checkout -q "$COMMIT"
    fi
    start=$(date +%s)
    make -C "$SRC" -j"$(nproc)" >"$WORK/build.log" 2>&1 || {
        tail -30 "$WORK/build.log" >&2
        echo "xfstests.sh: the build failed (log: $WORK/build.log)" >&2
        exit 1
    }
    echo "xfstests built in $(($(date +%s) - start)) s"
fi

for u in fsgqa fsgqa2; do id "$u" >/dev/null 2>&1 || useradd -m "$u"; done
id 123456-fsgqa >/dev/null 2>&1 || useradd -m -g fsgqa 123456-fsgqa 2>/dev/null || true

# Backing directories on the host's filesystem, mount points, state.
for d in test-backing scratch-backing test scratch state; do mkdir -p "$WORK/$d"; done
# xfstests names its "devices" and unmounts by those names (umount DEV): the helper is a
# wrapper that mounts the backing directory of each name, shown under that name.
cat >"$HELPER" <<EOF
#!/bin/bash
src=\$1
shift
case \$src in
coherent-xfstests-test) dir=$WORK/test-backing ;;
coherent-xfstests-scratch) dir=$WORK/scratch-backing ;;
*) dir=\$src ;;
esac
exec -a "\$0" "$BIN" "\$dir" "\$@" -o "fsname=\$src"
EOF
chmod 755 "$HELPER"
cleanup() {
    for m in "$WORK/test" "$WORK/scratch"; do
        mountpoint -q "$m" && umount "$m" 2>/dev/null || true
    done
    rm -f "$HELPER"
}
trap cleanup EXIT

cat >"$SRC/local.config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.$SUBTYPE
export TEST_DEV=coherent-xfstests-test
export TEST_DIR=$WORK/test
export SCRATCH_DEV=coherent-xfstests-scratch
export SCRATCH_MNT=$WORK/scratch
export TEST_FS_MOUNT_OPTS="-o state_dir=$WORK/state/test"
export MOUNT_OPTIONS="-o state_dir=$WORK/state/scratch"
export RESULT_BASE=$WORK/results
EOF

# Exclusions: "generic/NNN  # reason" lines; the reason is required.
EXCLUDE=$ROOT/scripts/xfstests-exclude
lists=("$EXCLUDE")
((FAST)) && lists+=("$ROOT/scripts/xfstests-slow")
for f in "${lists[@]}" "$ROOT/scripts/xfstests-known"; do
    awk -v f="${f##*/}" '!/^[[:space:]]*(#|$)/ && !/#[[:space:]]*[^[:space:]]/ { print f " line " NR " has no reason: " $0; bad=1 } END { exit bad }' "$f" >&2
done
cat "${lists[@]}" | grep -oE "^generic/[0-9]+" >"$WORK/exclude.list" || true
grep -oE "^generic/[0-9]+" "$ROOT/scripts/xfstests-known" >"$WORK/known.list" || true
# generic/504 reads a dead flock owner's lock in /proc/locks, which the kernel shows only in
# the initial pid namespace (4026531836 is its fixed inode): in one of its own (the clean
# room) the lock is hidden on any filesystem. Excluded there, and said so.
if [ "$(stat -L -c %i /proc/self/ns/pid)" != 4026531836 ]; then
    echo "xfstests: generic/504 excluded: this pid namespace is not the initial one, whose /proc/locks alone shows a dead owner's lock"
    echo generic/504 >>"$WORK/exclude.list"
fi

rm -rf "$WORK/results"
start=$(date +%s)
set +e
# The run's output is kept outside $WORK, where no test's cleanup can reach it.
out=$(mktemp /tmp/xfstests-run.XXXXXX)
(cd "$SRC" && ./check -E "$WORK/exclude.list" ${*:-"-g" "$GROUP"}) 2>&1 | tee "$out"
cp "$out" "$WORK/check.log" 2>/dev/null || true
set -e
took=$(($(date +%s) - start))

# Counts from check's summary: "Ran: ...", "Not run: ...", "Failures: ...".
list() { { grep -E "^$1:" "$out" || true; } | tail -1 | cut -d: -f2- | wc -w; }
names() { { grep -E "^$1:" "$out" || true; } | tail -1 | cut -d: -f2- | tr ' ' '\n' | grep . || true; }
ran=$(list Ran)
# No summary means the counts below would say nothing: fail, never pass silently.
if [ "$ran" = 0 ]; then
    echo "xfstests: check printed no 'Ran:' line (output: $out)" >&2
    exit 1
fi
notrun=$(list "Not run")
failed=$(list Failures)
excluded=$(wc -l <"$WORK/exclude.list")
if [ -n "${*:-}" ]; then excluded=0; fi
unexpected=$(names Failures | grep -vxF -f "$WORK/known.list" || true)
for t in $(names Ran); do
    if grep -qxF "$t" "$WORK/known.list" && ! names Failures | grep -qxF "$t" && ! names "Not run" | grep -qxF "$t"; then
        echo "xfstests: $t passes now: take it off scripts/xfstests-known"
    fi
done
[ -z "$unexpected" ] || echo "xfstests: failed, not known: $(echo $unexpected)"
known=$((failed - $(echo "$unexpected" | grep -c . || true)))
echo "xfstests $GROUP$( ((FAST)) && echo ' --fast') in ${took} s: ran $ran passed $((ran - notrun - failed)) failed $failed (known $known) not-run $notrun excluded $excluded"
[ -z "$unexpected" ]
