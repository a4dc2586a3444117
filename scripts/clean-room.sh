#!/usr/bin/env bash
# Runs a command in a brand-new machine's root: a minimal Debian (mmdebstrap, minbase) that
# has nothing this host was given by hand. What a test or build needs must come from
# scripts/deps.sh inside the room, so a green run here means a new machine works too.
#
# Usage: scripts/clean-room.sh [--refresh] [--keep] [--] CMD...
#   CMD runs as root in a copy of this checkout (/src/coherent in the room), with bash -c
#   when it is one word containing spaces, e.g.
#     scripts/clean-room.sh 'bash scripts/deps.sh && bash scripts/demo.sh'
#   --refresh  build the cached root tarball again (else reused; rebuilt after 7 days)
#   --keep     leave the room's directory behind (its path is printed) for a look
#
# The room: its own mount and pid namespaces; `/` is the room's directory bound onto
# itself and made the namespace's root (pivot_root), so mount tables read inside, and
# namespaces entered from inside, look like a machine's; fresh /proc, the host's /sys and /dev (with /dev/fuse), a tmpfs /run; the
# host's Rust toolchain read-only at /opt/rust with a fresh CARGO_HOME; the certificate
# authorities the host trusts (the registries are reached through the host's network
# setup) and its resolv.conf. When CMD ends, every process of the room ends with it.
# Env: CLEAN_ROOM_CACHE (default /var/cache/coherent-clean-room), CLEAN_ROOM_DIR (where
# rooms are made, default /var/tmp), CLEAN_ROOM_SUITE (default: this host's Debian suite).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${CLEAN_ROOM_CACHE:-/var/cache/coherent-clean-room}
ROOMS=${CLEAN_ROOM_DIR:-/var/tmp}

say() { echo "clean-room: $*" >&2; }
die() {
    echo "clean-room: error: $*" >&2
    exit 2
}

refresh=0 keep=0
while (($#)); do
    case $1 in
    --refresh) refresh=1 ;;
    --keep) keep=1 ;;
    --) shift && break ;;
    -h | --help)
        sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    -*) die "unknown option $1 (try --help)" ;;
    *) break ;;
    esac
    shift
done
(($#)) || die "no command given (try --help)"
[[ $EUID -eq 0 ]] || die "must run as root (namespaces, mounts, chroot)"
[[ -c /dev/fuse ]] || die "/dev/fuse is missing on this host (modprobe fuse)"

suite=${CLEAN_ROOM_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}
[[ -n $suite ]] || die "cannot tell this host's Debian suite; set CLEAN_ROOM_SUITE (e.g. bookworm)"

# --- the host's tools for making the room ---------------------------------------------
need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v unshare >/dev/null || need+=(util-linux)
if ((${#need[@]})); then
    say "apt-get install ${need[*]} (on the host, to make the room)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } \
        >/tmp/clean-room-apt.log 2>&1 || { tail -20 /tmp/clean-room-apt.log >&2; die "apt-get install ${need[*]} failed"; }
fi

sysroot=$(rustc --print sysroot 2>/dev/null) || die "no Rust toolchain on the host (rustc --print sysroot failed)"
[[ -x $sysroot/bin/cargo ]] || die "no cargo in the toolchain $sysroot"

# The host's trusted authorities: the bundle named by the environment, else Debian's.
ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[[ -s $ca ]] || die "no CA bundle at $ca (set SSL_CERT_FILE to the host's bundle)"

# --- the cached minimal root ----------------------------------------------------------
mkdir -p "$CACHE"
tarball=$CACHE/$suite-minbase.tar
# A cache that is not a tar file (an older script's directory) is made again.
[[ -e $tarball && ! -f $tarball ]] && rm -rf --one-file-system "$tarball"
if ((refresh)) || [[ ! -s $tarball ]] || [[ -n $(find "$tarball" -mtime +7 2>/dev/null) ]]; then
    say "making a minimal $suite root with mmdebstrap (cached in $tarball)"
    start=$SECONDS
    # The format is named: mmdebstrap reads it from the file name otherwise, and a
    # `.tmp` name makes a directory.
    rm -rf --one-file-system "$tarball.tmp"
    mmdebstrap --variant=minbase --format=tar --quiet "$suite" "$tarball.tmp" >/tmp/clean-room-mmdebstrap.log 2>&1 ||
        { tail -20 /tmp/clean-room-mmdebstrap.log >&2; rm -rf "$tarball.tmp"; die "mmdebstrap failed"; }
    mv "$tarball.tmp" "$tarball"
    say "root made in $((SECONDS - start)) s"
fi

# --- the room -------------------------------------------------------------------------
room=$(mktemp -d "$ROOMS/coherent-clean-room.XXXXXX")
cleanup() {
    local rc=$?
    if ((keep)); then
        say "kept the room at $room/root"
    elif [[ -d $room ]]; then
        # Mounts were made in the room's own namespace and ended with it; never remove
        # anything while a host mount is still beneath the room.
        if findmnt -rn -o TARGET | grep -q "^$room/"; then
            say "mounts remain under $room: left in place"
        else
            rm -rf --one-file-system "$room"
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
r=$room/root
mkdir -p "$r"
tar -xf "$tarball" -C "$r"

# The checkout (with its git history, without build output) and the host facts.
mkdir -p "$r/src/coherent" "$r/opt/rust" "$r/root/.cargo" "$r/etc/coherent-clean-room"
tar -C "$ROOT" --exclude=./target -cf - . | tar -C "$r/src/coherent" -xf -
install -m 0644 "$ca" "$r/etc/coherent-clean-room/ca.crt"
# Debian's own bundle is rebuilt when ca-certificates is installed; the host's authorities
# are added to what it is built from, so they stay trusted afterwards too.
mkdir -p "$r/usr/local/share/ca-certificates"
install -m 0644 "$ca" "$r/usr/local/share/ca-certificates/coherent-host.crt"
mkdir -p "$r/etc/ssl/certs"
install -m 0644 "$ca" "$r/etc/ssl/certs/ca-certificates.crt"
cp -L /etc/resolv.conf "$r/etc/resolv.conf" 2>/dev/null || true
cp /etc/hosts "$r/etc/hosts" 2>/dev/null || true
echo "clean-room" >"$r/etc/hostname"

# The command, as one script the room runs.
if (($# == 1)); then
    cmd=$1
else
    cmd=$(printf '%q ' "$@")
fi
cat >"$r/etc/coherent-clean-room/run" <<EOF
#!/bin/bash
cd /src/coherent
$cmd
EOF
chmod 0755 "$r/etc/coherent-clean-room/run"

caf=/etc/coherent-clean-room/ca.crt
envs=(HOME=/root USER=root LOGNAME=root SHELL=/bin/bash LANG=C.UTF-8 TERM="${TERM:-dumb}"
    PATH=/root/.cargo/bin:/opt/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    CARGO_HOME=/root/.cargo RUSTUP_TOOLCHAIN= CARGO_TERM_COLOR=never
    SSL_CERT_FILE=$caf CARGO_HTTP_CAINFO=$caf GIT_SSL_CAINFO=$caf CURL_CA_BUNDLE=$caf
    PIP_CERT=$caf REQUESTS_CA_BUNDLE=$caf NODE_EXTRA_CA_CERTS=$caf)
for v in CI http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY RUST_BACKTRACE; do
    [[ -n ${!v:-} ]] && envs+=("$v=${!v}")
done

say "room $r: running: $cmd"
start=$SECONDS
set +e
unshare --mount --pid --fork --propagation private -- /bin/bash -euc '
    r=$1 sysroot=$2
    shift 2
    mount --bind "$r" "$r"
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount --make-rslave "$r/sys"
    mount --rbind /dev "$r/dev"
    mount --make-rslave "$r/dev"
    mount -t tmpfs -o mode=0755 tmpfs "$r/run"
    mount --bind "$sysroot" "$r/opt/rust"
    mount -o remount,bind,ro "$r/opt/rust"
    # pivot_root, not chroot: the room is the root of its mount namespace, so a process
    # that enters a mount namespace (nsenter --mount, setns) lands in the room too.
    mkdir -p "$r/.old-root"
    cd "$r"
    pivot_root . .old-root
    umount -l /.old-root
    rmdir /.old-root
    cd /
    exec /usr/bin/env -i "$@" /etc/coherent-clean-room/run
' clean-room "$r" "$sysroot" "${envs[@]}"
rc=$?
set -e
say "command exited $rc after $((SECONDS - start)) s"
exit "$rc"
