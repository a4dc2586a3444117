#!/usr/bin/env bash
# The C reference for bench.sh: libfuse's `passthrough_hp` example, built from the Debian
# `fuse3` source package of the same version as the installed libfuse3-dev, and printed as
# a path on stdout (everything else goes to stderr).
#
# Usage: scripts/cref.sh [--rebuild]
# Env:   COHERENT_CREF_CACHE (default /var/cache/coherent-cref: shared by every worktree),
#        COHERENT_CREF_MIRROR (default http://deb.debian.org/debian),
#        COHERENT_CREF_SECURITY (default http://deb.debian.org/debian-security).
#
# The host's apt sources are left as they are (they have no deb-src lines): the source
# index is fetched into a private list directory with a private deb-src source, then
# `apt-get source --download-only`. What is checked: apt checks the files' hashes against
# the Sources index, which the Debian archive key signs; dpkg-source checks them against
# the .dsc when unpacking; and the upstream tarball's own signature is checked against the
# key the package ships (debian/upstream/signing-key.asc) when gpg is present.
# Exit 0: the path is printed; 2: it cannot be had (the reason on stderr).
set -uo pipefail

CACHE=${COHERENT_CREF_CACHE:-/var/cache/coherent-cref}
MIRROR=${COHERENT_CREF_MIRROR:-http://deb.debian.org/debian}
SECURITY=${COHERENT_CREF_SECURITY:-http://deb.debian.org/debian-security}
REBUILD=
case ${1:-} in
--rebuild) REBUILD=1 ;;
"") ;;
-h | --help) sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) printf 'error: unknown argument %s (see --help)\n' "$1" >&2; exit 2 ;;
esac

log() { printf '[cref] %s\n' "$*" >&2; }
die() {
    printf 'error: cannot have the C reference (passthrough_hp): %s\n' "$*" >&2
    exit 2
}

[[ $EUID -eq 0 ]] || die "run as root (it installs libfuse3-dev and writes $CACHE)"
[[ -r /etc/os-release ]] || die "no /etc/os-release"
# shellcheck source=/dev/null
. /etc/os-release
[[ ${ID:-} == debian && -n ${VERSION_CODENAME:-} ]] ||
    die "this host is ${PRETTY_NAME:-unknown}, not Debian: build passthrough_hp from libfuse by hand"

installed() { dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null | grep -q '^ii'; }
apt_install() {
    local missing=() p
    for p in "$@"; do installed "$p" || missing+=("$p"); done
    ((${#missing[@]})) || return 0
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2 ||
        { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2; } ||
        die "apt-get install ${missing[*]} failed"
}
# libfuse3-dev: the headers and library the example links against; g++ builds it;
# dpkg-dev has dpkg-source; pkg-config gives the flags.
apt_install libfuse3-dev g++ dpkg-dev pkg-config

VERSION=$(dpkg-query -W -f='${Version}' libfuse3-dev) || die "libfuse3-dev has no version"
DIR=$CACHE/fuse3-$VERSION
BIN=$DIR/passthrough_hp
mkdir -p "$CACHE" || die "cannot create $CACHE"
# One builder at a time (several worktrees share the cache).
exec 9>"$CACHE/.lock"
flock 9 || die "cannot lock $CACHE/.lock"

# (built-from records the recipe; a binary built with other flags is rebuilt)
if [[ -z $REBUILD && -x $BIN ]] && grep -q HAVE_UTIMENSAT "$DIR/built-from" 2>/dev/null; then
    printf '%s\n' "$BIN"
    exit 0
fi
rm -rf "$DIR"
mkdir -p "$DIR/apt/sources.d" "$DIR/apt/lists/partial" "$DIR/src" || die "cannot create $DIR"

# A private deb-src source for this suite (and its updates and security suites, where a
# newer libfuse3-dev may come from), signed by the Debian archive key.
: >"$DIR/apt/sources.list"
cat >"$DIR/apt/sources.d/fuse3-src.sources" <<EOF
Types: deb-src
URIs: $MIRROR
Suites: $VERSION_CODENAME $VERSION_CODENAME-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: $SECURITY
Suites: $VERSION_CODENAME-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
APT=(apt-get -q -o "Dir::Etc::SourceList=$DIR/apt/sources.list"
    -o "Dir::Etc::SourceParts=$DIR/apt/sources.d" -o "Dir::State::Lists=$DIR/apt/lists"
    -o APT::Sandbox::User=root)
log "apt-get update (private deb-src list for $VERSION_CODENAME)"
"${APT[@]}" update >&2 || die "apt-get update of the deb-src index from $MIRROR failed (is the registry reachable?)"
# apt-get update exits 0 when an index could not be fetched (a warning only)
compgen -G "$DIR/apt/lists/*_Sources*" >/dev/null ||
    die "no deb-src index could be fetched from $MIRROR (is the registry reachable? apt-get's output above says why)"
log "apt-get source --download-only fuse3=$VERSION"
(cd "$DIR/src" && "${APT[@]}" source --download-only "fuse3=$VERSION" >&2) ||
    die "apt-get source fuse3=$VERSION failed: Debian's archive has no source for the installed libfuse3-dev"
DSC=$DIR/src/fuse3_${VERSION#*:}.dsc
[[ -s $DSC ]] || die "no $DSC after apt-get source"
grep -qx "Version: $VERSION" "$DSC" || die "$DSC is not version $VERSION"

# dpkg-source verifies every file against the .dsc's checksums (it fails on a mismatch);
# without debian-keyring it only warns that the .dsc's own signature cannot be checked:
# apt's check of the hashes against the signed Sources index stands for it.
log "dpkg-source -x $(basename "$DSC")"
dpkg-source -x "$DSC" "$DIR/src/fuse3" >&2 || die "dpkg-source -x $DSC failed"
KEY=$DIR/src/fuse3/debian/upstream/signing-key.asc
ORIG=$(find "$DIR/src" -maxdepth 1 -name 'fuse3_*.orig.tar.*' ! -name '*.asc' | head -1)
if [[ -s $KEY && -s $ORIG.asc ]] && command -v gpg >/dev/null && command -v gpgv >/dev/null; then
    gpg --dearmor <"$KEY" >"$DIR/upstream-key.gpg" 2>/dev/null &&
        gpgv --keyring "$DIR/upstream-key.gpg" "$ORIG.asc" "$ORIG" 2>"$DIR/gpgv.log" ||
        die "the upstream signature of $(basename "$ORIG") does not verify: $(cat "$DIR/gpgv.log")"
    SIG="upstream signature good ($(sed -n 's/.*Good signature from //p' "$DIR/gpgv.log"))"
else
    SIG="upstream signature not checked (no key, signature or gpg)"
fi
log "$SIG"

SRC=$DIR/src/fuse3/example/passthrough_hp.cc
[[ -s $SRC ]] || die "fuse3 $VERSION has no example/passthrough_hp.cc"
# As upstream's meson builds it (C++17, -O2, its C++ defines), against the installed
# library, plus the feature macros libfuse's configure finds on glibc: in 3.14 the example
# includes no config header, so without them its setattr fails every time change on a path
# (cp -a, tar, git) with EOPNOTSUPP, and fallocate and xattrs are off.
read -r -a FLAGS <<<"$(pkg-config --cflags --libs fuse3)" || die "pkg-config fuse3 failed"
DEFS=(-D_REENTRANT -D_GNU_SOURCE -DHAVE_UTIMENSAT -DHAVE_POSIX_FALLOCATE -DHAVE_SETXATTR)
log "g++ -std=c++17 -O2 ${DEFS[*]} passthrough_hp.cc (about 30 s)"
nice g++ -std=c++17 -O2 -pthread "${DEFS[@]}" -o "$BIN.tmp" "$SRC" "${FLAGS[@]}" >&2 ||
    die "g++ failed on $SRC"
mv "$BIN.tmp" "$BIN"
printf 'fuse3 %s (Debian source package, %s), example/passthrough_hp.cc, g++ -std=c++17 -O2 %s, %s\n' \
    "$VERSION" "$VERSION_CODENAME" "${DEFS[*]}" "$SIG" >"$DIR/built-from"
printf '%s\n' "$BIN"
