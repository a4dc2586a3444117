#!/usr/bin/env bash
# The Debian package of coherent: both binaries, the mount helper, the manual pages, the
# shell completions and the systemd unit.
#
# Usage: scripts/deb.sh [build] [--no-build]   builds target/deb/coherent_VERSION_ARCH.deb
#        scripts/deb.sh check                  installs it with dpkg -i, mounts a workspace
#                                              through it (mount -t, fstab), plays a handoff
#                                              with the installed CLI, unmounts, removes it
# Needs: root for check; dpkg-deb (Debian, Ubuntu).
#
# What the package installs:
#   /usr/bin/coherent, /usr/bin/coherent-mount
#   /usr/sbin/mount.fuse.coherent-mount   (-> coherent-mount: mount -t fuse.coherent-mount,
#                                          fstab lines of type fuse.coherent-mount)
#   /usr/lib/systemd/system/coherent-mount@.service
#   /usr/share/man/man1/coherent.1.gz, coherent-mount.1.gz
#   bash, zsh and fish completions of coherent
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
say() { echo "deb.sh: $*" >&2; }
die() {
    echo "deb.sh: error: $*" >&2
    exit 1
}

action=build build=1
for a in "$@"; do
    case $a in
    build | check) action=$a ;;
    --no-build) build=0 ;;
    -h | --help)
        sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument $a (try --help)" ;;
    esac
done

command -v dpkg-deb >/dev/null || die "dpkg-deb not found (a Debian or Ubuntu machine builds the package)"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
deb=$ROOT/target/deb/coherent_${version}_${arch}.deb

build_deb() {
    if ((build)); then
        say "cargo build --release"
        cargo build --quiet --release --bin coherent --bin coherent-mount
    fi
    local rel=$ROOT/target/release
    [[ -x $rel/coherent && -x $rel/coherent-mount ]] || die "no release binaries (run without --no-build)"
    local stage=$ROOT/target/deb/stage
    rm -rf "$stage"
    install -d "$stage/DEBIAN" "$stage/usr/bin" "$stage/usr/sbin" \
        "$stage/usr/lib/systemd/system" "$stage/usr/share/man/man1" \
        "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
        "$stage/usr/share/fish/vendor_completions.d" "$stage/usr/share/doc/coherent"
    install -m 0755 "$rel/coherent" "$rel/coherent-mount" "$stage/usr/bin/"
    # The symbols stay in target/release; the package ships lean binaries.
    if command -v strip >/dev/null; then
        strip --strip-debug "$stage/usr/bin/coherent" "$stage/usr/bin/coherent-mount"
    fi
    ln -s ../bin/coherent-mount "$stage/usr/sbin/mount.fuse.coherent-mount"
    install -m 0644 packaging/coherent-mount@.service "$stage/usr/lib/systemd/system/"
    "$rel/coherent" man | gzip -9n >"$stage/usr/share/man/man1/coherent.1.gz"
    "$rel/coherent-mount" --man | gzip -9n >"$stage/usr/share/man/man1/coherent-mount.1.gz"
    "$rel/coherent" completions bash >"$stage/usr/share/bash-completion/completions/coherent"
    "$rel/coherent" completions zsh >"$stage/usr/share/zsh/vendor-completions/_coherent"
    "$rel/coherent" completions fish >"$stage/usr/share/fish/vendor_completions.d/coherent.fish"
    install -m 0644 README.md "$stage/usr/share/doc/coherent/README.md"
    printf 'coherent %s\nLicense: MIT\n' "$version" >"$stage/usr/share/doc/coherent/copyright"
    local size
    size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
    cat >"$stage/DEBIAN/control" <<EOF
Package: coherent
Version: $version
Architecture: $arch
Maintainer: coherent developers <coherent@localhost>
Depends: fuse3, libc6
Installed-Size: $size
Section: utils
Priority: optional
Description: FUSE-mounted coherent volume for AI coding agents
 coherent-mount mounts a workspace through FUSE, maps every process to its agent
 session, counts a version per file and refuses (EACCES) every write of an agent
 that handed a file on to another, until the successor writes or declines or the
 giver withdraws. coherent is its command-line client, MCP server and hooks.
EOF
    dpkg-deb --root-owner-group -Zgzip --build "$stage" "$deb" >/dev/null
    say "built $deb ($(du -h "$deb" | cut -f1))"
}

# check: the package as a user gets it, on this machine.
check_deb() {
    [[ $EUID -eq 0 ]] || die "check needs root (dpkg -i, mount)"
    # Always the package of this tree (an older .deb may be lying in target/deb).
    build_deb
    say "dpkg -i $deb"
    dpkg -i "$deb" >/tmp/deb-check-dpkg.log 2>&1 || { cat /tmp/deb-check-dpkg.log >&2; die "dpkg -i failed"; }
    local work
    work=$(mktemp -d /tmp/coherent-deb-check.XXXXXX)
    mkdir -p "$work/b" "$work/m" "$work/f"
    local ok=0
    (
        set -e
        export PATH=/usr/sbin:/usr/bin:/sbin:/bin
        [[ $(command -v coherent) == /usr/bin/coherent ]]
        man -w coherent-mount >/dev/null 2>&1 || [[ -s /usr/share/man/man1/coherent-mount.1.gz ]]
        # mount -t, through the packaged helper
        mount -t fuse.coherent-mount "$work/b" "$work/m" -o "state_dir=$work/s1,stale=strict"
        findmnt -n "$work/m" >/dev/null
        cd "$work/m"
        COHERENT_SESSION=bob coherent register >/dev/null
        COHERENT_SESSION=alice sh -c 'echo plan > plan.md && coherent transfer --to bob plan.md'
        if COHERENT_SESSION=alice sh -c 'echo again >> plan.md' 2>/dev/null; then
            echo "deb.sh: the giver's write went through the packaged mount" >&2
            exit 1
        fi
        COHERENT_SESSION=alice cat .coherent/why | grep -q 'handed plan.md'
        cd /
        umount "$work/m"
        # fstab, through the same helper
        printf '%s %s fuse.coherent-mount defaults,_netdev,state_dir=%s 0 0\n' \
            "$work/b" "$work/f" "$work/s2" >"$work/fstab"
        mount -T "$work/fstab" "$work/f"
        [[ $(COHERENT_SESSION=bob cat "$work/f/plan.md") == plan ]]
        umount "$work/f"
    ) && ok=1
    findmnt -n "$work/m" >/dev/null 2>&1 && umount -l "$work/m"
    findmnt -n "$work/f" >/dev/null 2>&1 && umount -l "$work/f"
    dpkg -r coherent >/dev/null 2>&1 || true
    [[ ! -e /usr/sbin/mount.fuse.coherent-mount ]] || die "dpkg -r left the mount helper behind"
    rm -rf "$work"
    ((ok)) || die "the installed package did not mount and fence a workspace"
    say "package check passed: installed, mounted (mount -t and fstab), fenced, unmounted, removed"
}

case $action in
build) build_deb ;;
check) check_deb ;;
esac
