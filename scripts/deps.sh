#!/usr/bin/env bash
# Installs what the tests, scripts/conformance.sh and scripts/bench.sh need on a fresh
# Debian machine (run as root). Idempotent and quiet: does nothing slow when all is there.
#   apt:   fuse3 (fusermount3), bindfs (the FUSE peer), fio, attr (getfattr/setfattr),
#          rsync, git and ripgrep (the copy, tracking and listing tests),
#          acl + libacl1-dev (pjdfstest links libacl); gcc, python3, nodejs and npm if missing;
#          etcd-server + etcd-client (etcd and etcdctl: scripts/etcd.sh, the etcd coordinator's
#          tests; if the package's own etcd service starts on port 2379 it is left alone,
#          nothing of ours uses it), protobuf-compiler and libprotobuf-dev (protoc and the
#          .proto files it imports: the etcd-client crate's build), openssl (scripts/etcd.sh
#          makes each cluster's CA and certificates), ed and vim-tiny (`vi`: the real tools
#          of tests/mounted/enforce_stale.rs), iproute2 (ip and tc: the network
#          namespaces, cut links and slowed links of tests/multihost/partition.rs), tmux (a server
#          outside `coherent run` that its sandbox cannot close: tests/agents/run_landlock.rs)
#   cargo: pjdfstest, fsx (pinned versions, from crates.io)
#   user:  'tests' (pjdfstest switches to nobody and tests); coh-u1, coh-u2 and group
#          coh-shared (the multi-user tests, scripts/test-users.sh)
#   /dev/fuse (loads the fuse module if needed)
set -euo pipefail

APT_PACKAGES=(fuse3 bindfs fio attr acl libacl1-dev rsync git ripgrep etcd-server etcd-client protobuf-compiler libprotobuf-dev openssl ed vim-tiny iproute2 tmux)
CARGO_CRATES=(pjdfstest@0.2.2 fsx@0.3.2)

die() {
    echo "deps.sh: error: $*" >&2
    exit 1
}
say() { echo "deps.sh: $*" >&2; }

[[ $EUID -eq 0 ]] || die "must run as root (apt-get, useradd, modprobe)"
export PATH="$HOME/.cargo/bin:$PATH"

# --- apt ------------------------------------------------------------------------------
missing=()
command -v cc >/dev/null || missing+=(gcc libc6-dev)
command -v python3 >/dev/null || missing+=(python3) # bench.sh's tree generator
command -v node >/dev/null || missing+=(nodejs)     # a fenced node process (tests/agents/cli.rs)
command -v npm >/dev/null || missing+=(npm)         # test-clients.sh installs the agents with it
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    command -v apt-get >/dev/null || die "apt-get not found; install by hand: ${missing[*]}"
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/tmp/deps-apt.log 2>&1 || { cat /tmp/deps-apt.log >&2; die "apt-get update failed"; }
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/deps-apt.log 2>&1 ||
        { tail -20 /tmp/deps-apt.log >&2; die "apt-get install ${missing[*]} failed"; }
fi

# --- cargo ----------------------------------------------------------------------------
command -v cargo >/dev/null || die "cargo not found (install Rust first)"
installed=$(cargo install --list 2>/dev/null || true)
for spec in "${CARGO_CRATES[@]}"; do
    name=${spec%@*} version=${spec#*@}
    if grep -q "^$name v$version:" <<<"$installed" && command -v "$name" >/dev/null; then
        continue
    fi
    say "cargo install --locked $name@$version (a few minutes)"
    log=/tmp/deps-cargo-$name.log
    cargo install --locked --quiet "$name@$version" >"$log" 2>&1 ||
        { tail -30 "$log" >&2; die "cargo install $name@$version failed (log: $log)"; }
done

# --- pjdfstest's second user ----------------------------------------------------------
if ! getent passwd tests >/dev/null; then
    say "creating system user 'tests' for pjdfstest"
    useradd --system --user-group --no-create-home --home-dir / \
        --shell /usr/sbin/nologin tests || die "useradd tests failed"
fi
getent passwd nobody >/dev/null || die "user 'nobody' missing (pjdfstest needs it)"

# --- the multi-user tests' users (coh-u1, coh-u2, group coh-shared) -------------------
bash "$(dirname "$0")/test-users.sh" || die "scripts/test-users.sh failed"

# --- FUSE -----------------------------------------------------------------------------
if [[ ! -c /dev/fuse ]]; then
    modprobe fuse 2>/dev/null || true
    [[ -c /dev/fuse ]] || die "/dev/fuse missing and 'modprobe fuse' did not create it"
fi
command -v fusermount3 >/dev/null || die "fusermount3 still missing after installing fuse3"
for tool in etcd:etcd-server etcdctl:etcd-client protoc:protobuf-compiler; do
    command -v "${tool%%:*}" >/dev/null || die "${tool%%:*} still missing after installing ${tool#*:}"
done
exit 0
