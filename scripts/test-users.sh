#!/usr/bin/env bash
# Creates the users the multi-user tests run as (tests/common/users.rs). Idempotent; run as
# root (scripts/deps.sh calls it).
#   coh-u1  primary group coh-u1, also in coh-shared
#   coh-u2  primary group coh-u2, not in coh-shared
# So a file of group coh-shared (0660) is writable by coh-u1 through a supplementary group
# only, and never by coh-u2.
set -euo pipefail

die() {
    echo "test-users.sh: error: $*" >&2
    exit 1
}
[[ $EUID -eq 0 ]] || die "must run as root (useradd)"

getent group coh-shared >/dev/null || groupadd --system coh-shared || die "groupadd coh-shared failed"
for u in coh-u1 coh-u2; do
    if ! getent passwd "$u" >/dev/null; then
        echo "test-users.sh: creating test user $u" >&2
        useradd --system --user-group --no-create-home --home-dir / \
            --shell /bin/sh "$u" || die "useradd $u failed"
    fi
done
# Membership is part of the contract above: set it every time (idempotent).
usermod -a -G coh-shared coh-u1 || die "usermod coh-u1 failed"
if id -nG coh-u2 | tr ' ' '\n' | grep -qx coh-shared; then
    gpasswd -d coh-u2 coh-shared >/dev/null || die "gpasswd -d coh-u2 coh-shared failed"
fi
exit 0
