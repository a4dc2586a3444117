#!/usr/bin/env bash
# A local etcd (one member or a three-member cluster on 127.0.0.1) for the tests of the
# etcd coordinator and for trying it by hand. Only ever touches the members it started
# (found by their pid files and checked by their command line), never a system etcd.
#
#   scripts/etcd.sh start [--members 1|3] [--dir DIR] [--base-port N] [--volume NAME]
#                         [--insecure] [--listen-ip IPV4]
#       Starts the member(s), waits until each answers `endpoint health`, prints one line,
#       the value for coherent-mount --coordinator:
#       etcds://127.0.0.1:A[,127.0.0.1:B,...]/NAME?auth=DIR/auth. Client ports N, N+2, N+4;
#       peer ports N+1, N+3, N+5 (default N: the first free block at or above 23790). DIR
#       (default: a fresh mktemp -d under /tmp; mode 0700) gets endpoints, cluster,
#       member-K.pid, member-K.log and member-K.data/.
#       Secure by default: whoever can write the key space can lift every fence, so clients
#       and peers speak TLS with certificates of a CA made for this cluster (DIR/tls/), a
#       client must present a certificate of that CA, and authentication is on: user root
#       (password in DIR/root-auth) and user coherent-NAME, whose role may read and write
#       only /coherent/NAME/ (NAME: --volume, default "default"). DIR/auth (mode 0600) is
#       the --coordinator-auth file for the mounts; DIR/root-auth the same for root.
#       --insecure: plain http, no authentication; prints etcd://127.0.0.1:A[,...].
#       --listen-ip IPV4: the members also serve clients on IPV4 (an address of this host,
#       e.g. one reachable from network namespaces), advertise it, and their certificate
#       names it; the printed line is the same (127.0.0.1), use IPV4 in its place elsewhere.
#   scripts/etcd.sh stop    [--dir DIR] [--member K]   SIGTERM, wait for exit (all or one)
#   scripts/etcd.sh kill    [--dir DIR] --member K     SIGKILL one member, wait for exit
#   scripts/etcd.sh restart [--dir DIR] [--member K]   start stopped member(s) again (same
#                                                      data and ports), wait until healthy
#   scripts/etcd.sh status  [--dir DIR]                which members run; endpoint health
#                                                      (exit 0 only if all run and answer)
# Without --dir, stop/kill/restart/status use the DIR of the last start by this user.
# A start that finds a port of its block bound meanwhile (another user's cluster) takes the
# next free block, up to five times (not with --base-port).
# This script's own state (that DIR, the port blocks it handed out) is kept in a 0700
# directory of the caller: $ETCD_SH_STATE if set, else $XDG_RUNTIME_DIR/coherent-etcd,
# else /tmp/coherent-etcd-UID; one another user owns or can write is refused.
# Tunables: ETCD_SH_TIMEOUT (seconds to wait for health or exit, default 30).
set -euo pipefail

# STATE/last: the DIR of the last start. STATE/ports: port blocks handed out by `start`,
# one file per base port holding its DIR; a block is taken while that DIR still has its
# cluster file (so a stopped cluster keeps its ports for `restart`). The lock makes
# choosing a block and claiming it one step. (Another user's clusters are seen only by
# their sockets: a stopped one of theirs may lose its ports.)
STATE='' LAST='' CLAIMS=''
DEFAULT_BASE=23790
TIMEOUT=${ETCD_SH_TIMEOUT:-30}
# Fast failure detection for tests: heartbeat 50 ms, election 500 ms.
HEARTBEAT_MS=50
ELECTION_MS=500

die() {
    echo "etcd.sh: error: $*" >&2
    exit 1
}
usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}
say() { echo "etcd.sh: $*" >&2; }

# This script's own settings are read before the clean-up below removes them.
SH_STATE=${ETCD_SH_STATE:-}
# Our members must not pick up settings meant for another etcd or etcdctl.
for v in "${!ETCD_@}"; do unset "$v"; done
for v in "${!ETCDCTL_@}"; do unset "$v"; done
export ETCDCTL_API=3

need_tools() {
    command -v etcd >/dev/null ||
        die "etcd not found; install it with: sudo bash scripts/deps.sh (Debian package etcd-server)"
    command -v etcdctl >/dev/null ||
        die "etcdctl not found; install it with: sudo bash scripts/deps.sh (Debian package etcd-client)"
}

# --- this script's own state ---------------------------------------------------------------
# Never a fixed name in /tmp: a local user who made it first could have this script (run by
# root, say) truncate a file through a symlink, or point `stop` at another cluster. So a
# directory of the caller's alone, checked before anything in it is used.
use_state() {
    local d=$SH_STATE
    if [[ -z $d ]]; then
        if [[ -n ${XDG_RUNTIME_DIR:-} && -d $XDG_RUNTIME_DIR && -O $XDG_RUNTIME_DIR && ! -L $XDG_RUNTIME_DIR ]]; then
            d=$XDG_RUNTIME_DIR/coherent-etcd
        else
            d=/tmp/coherent-etcd-$(id -u)
        fi
    fi
    [[ -e $d || -L $d ]] || (umask 077 && mkdir -- "$d") 2>/dev/null || true
    local fix="remove it, or set ETCD_SH_STATE to a directory of your own"
    [[ ! -L $d ]] || die "$d (this script's state) is a symbolic link: $fix"
    [[ -d $d ]] || die "$d (this script's state) is not a directory: $fix"
    [[ -O $d ]] || die "$d (this script's state) belongs to another user: $fix"
    local mode
    mode=$(stat -c %a -- "$d") || die "cannot stat $d"
    if (((8#$mode & 8#077) != 0)); then
        chmod 0700 -- "$d" || die "cannot make $d private (chmod 0700): $fix"
    fi
    STATE=$d LAST=$d/last CLAIMS=$d/ports
}

# --- the cluster directory ---------------------------------------------------------------
# DIR/cluster holds members=, base_port= and token= (written once by start).
load_cluster() {
    [[ -f $DIR/cluster ]] || die "$DIR is not a cluster directory made by 'etcd.sh start' (no $DIR/cluster)"
    MEMBERS='' BASE='' TOKEN='' SECURE=0 VOLUME='' LISTEN_IP=''
    local k v
    while IFS='=' read -r k v; do
        case $k in
        members) MEMBERS=$v ;;
        base_port) BASE=$v ;;
        token) TOKEN=$v ;;
        secure) SECURE=$v ;;
        volume) VOLUME=$v ;;
        listen_ip) LISTEN_IP=$v ;;
        esac
    done <"$DIR/cluster"
    [[ $MEMBERS =~ ^[13]$ && $BASE =~ ^[0-9]+$ && -n $TOKEN && $SECURE =~ ^[01]$ ]] ||
        die "$DIR/cluster is damaged"
    use_credentials
}

# --- TLS and authentication (the secure default) -----------------------------------------
# etcdctl of this script speaks to a secure cluster with the cluster's CA, the client
# certificate and, once authentication is on, as root. The password goes by environment
# (readable by this user alone), never on a command line other users can see in ps.
use_credentials() {
    ((SECURE)) || return 0
    export ETCDCTL_CACERT="$DIR/tls/ca.pem" ETCDCTL_CERT="$DIR/tls/client.pem"
    export ETCDCTL_KEY="$DIR/tls/client-key.pem"
    if [[ -f $DIR/root-auth ]]; then
        local pw
        pw=$(sed -n 's/^password=//p' "$DIR/root-auth")
        export ETCDCTL_USER="root:$pw"
    fi
}

# A CA for this cluster, one certificate for every member (as server and as peer client:
# 127.0.0.1 and localhost) and one for the clients (CN coherent-client: no such etcd user,
# so the certificate lets a client in but grants nothing; the password does).
make_certs() {
    command -v openssl >/dev/null ||
        die "openssl not found; install it with: sudo bash scripts/deps.sh (or use --insecure)"
    local t="$DIR/tls" days=3650 san='IP:127.0.0.1,DNS:localhost'
    [[ -z $LISTEN_IP ]] || san+=",IP:$LISTEN_IP"
    (umask 077 && mkdir -p "$t")
    (
        umask 077
        cd "$t"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
            -keyout ca-key.pem -out ca.pem -subj "/CN=coherent etcd CA" \
            -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
        issue() { # NAME CN EXTENSIONS
            openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
                -keyout "$1-key.pem" -out "$1.csr" -subj "/CN=$2"
            printf '%s\n' "$3" >"$1.ext"
            openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
                -days "$days" -out "$1.pem" -extfile "$1.ext"
            rm -f "$1.csr" "$1.ext"
        }
        issue member coherent-etcd-member \
            "$(printf '%s\n' 'basicConstraints=CA:FALSE' 'keyUsage=critical,digitalSignature' \
                'extendedKeyUsage=serverAuth,clientAuth' "subjectAltName=$san")"
        issue client coherent-client \
            "$(printf '%s\n' 'basicConstraints=CA:FALSE' 'keyUsage=critical,digitalSignature' \
                'extendedKeyUsage=clientAuth')"
        rm -f ca.srl
        chmod 0600 ./*
    ) >"$DIR/tls.log" 2>&1 || { cat "$DIR/tls.log" >&2; die "making the certificates failed (log above)"; }
}

# Root and the volume's user (its role: read and write /coherent/VOLUME/ only), then
# authentication on. Passwords are random, given to etcdctl on stdin, kept in DIR/root-auth
# and DIR/auth (0600, the --coordinator-auth format).
enable_auth() {
    local ep root_pw vol_pw user="coherent-$VOLUME"
    ep=$(endpoints_of $(all_members))
    root_pw=$(openssl rand -hex 24)
    vol_pw=$(openssl rand -hex 24)
    ctl() { etcdctl --endpoints="$ep" --dial-timeout=2s --command-timeout=5s "$@" >/dev/null; }
    {
        printf '%s\n' "$root_pw" | ctl user add root --interactive=false &&
            ctl user grant-role root root &&
            ctl role add "$user" &&
            ctl role grant-permission --prefix=true "$user" readwrite "/coherent/$VOLUME/" &&
            printf '%s\n' "$vol_pw" | ctl user add "$user" --interactive=false &&
            ctl user grant-role "$user" "$user" &&
            ctl auth enable
    } 2>"$DIR/auth.log" || { cat "$DIR/auth.log" >&2; return 1; }
    (
        umask 077
        printf '# coherent-mount --coordinator-auth for volume %s (etcd.sh start)\n' "$VOLUME"
        printf 'user=%s\npassword=%s\nca=%s\ncert=%s\nkey=%s\n' "$user" "$vol_pw" \
            "$DIR/tls/ca.pem" "$DIR/tls/client.pem" "$DIR/tls/client-key.pem"
    ) >"$DIR/auth.tmp" && mv "$DIR/auth.tmp" "$DIR/auth"
    (
        umask 077
        printf '# etcd root of this cluster (etcdctl --user root); not for mounts\n'
        printf 'user=root\npassword=%s\nca=%s\ncert=%s\nkey=%s\n' "$root_pw" \
            "$DIR/tls/ca.pem" "$DIR/tls/client.pem" "$DIR/tls/client-key.pem"
    ) >"$DIR/root-auth.tmp" && mv "$DIR/root-auth.tmp" "$DIR/root-auth"
    chmod 0600 "$DIR/auth" "$DIR/root-auth"
    use_credentials
}

client_port() { echo $((BASE + 2 * ($1 - 1))); }
peer_port() { echo $((BASE + 2 * ($1 - 1) + 1)); }
member_data() { echo "$DIR/member-$1.data"; }
scheme() { if ((SECURE)); then echo https; else echo http; fi; }

# The pid of member K if it runs (a live etcd with our data dir on its command line).
member_pid() {
    local pidf="$DIR/member-$1.pid" pid
    [[ -f $pidf ]] || return 1
    pid=$(<"$pidf")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    pid_is_member "$pid" "$1" || return 1
    echo "$pid"
}

# Is PID a live (not zombie) etcd whose command line names member K's data dir? Guards
# against pid reuse: we signal nothing else.
pid_is_member() {
    local pid=$1 k=$2 cmd
    proc_alive "$pid" || return 1
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmd == *etcd* && $cmd == *"--data-dir $(member_data "$k") "* ]]
}

# Does PID exist and is it no zombie? (Members outlive this script and are reparented to
# an init that may never reap them.)
proc_alive() {
    local stat state
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    state=${stat##*) }
    state=${state%% *}
    [[ $state != Z && $state != X ]]
}

hostports_of() { # K... → 127.0.0.1:A,127.0.0.1:B
    local out='' k
    for k in "$@"; do out+="${out:+,}127.0.0.1:$(client_port "$k")"; done
    echo "$out"
}
endpoints_of() { # K... → etcdctl's --endpoints (https://127.0.0.1:A,... when secure)
    local out='' k pfx=''
    ((SECURE)) && pfx=https://
    for k in "$@"; do out+="${out:+,}${pfx}127.0.0.1:$(client_port "$k")"; done
    echo "$out"
}

all_members() { seq 1 "$MEMBERS"; }

# Is member K answering (a linearizable read through it: it is in a cluster with a leader)?
healthy() {
    etcdctl --endpoints="$(endpoints_of "$1")" --dial-timeout=1s --command-timeout=2s \
        endpoint health >/dev/null 2>&1
}

# Launch member K detached (own session, immune to the caller's hangup), record its pid.
launch() {
    local k=$1 cluster='' j log="$DIR/member-$1.log"
    for j in $(all_members); do
        cluster+="${cluster:+,}m$j=$(scheme)://127.0.0.1:$(peer_port "$j")"
    done
    local tls=()
    if ((SECURE)); then
        tls=(--cert-file "$DIR/tls/member.pem" --key-file "$DIR/tls/member-key.pem"
            --trusted-ca-file "$DIR/tls/ca.pem" --client-cert-auth
            --peer-cert-file "$DIR/tls/member.pem" --peer-key-file "$DIR/tls/member-key.pem"
            --peer-trusted-ca-file "$DIR/tls/ca.pem" --peer-client-cert-auth)
    fi
    local client_urls advertise
    client_urls="$(scheme)://127.0.0.1:$(client_port "$k")"
    advertise=$client_urls
    if [[ -n $LISTEN_IP ]]; then
        # Clients elsewhere (another network namespace) learn only the address they reach.
        advertise="$(scheme)://$LISTEN_IP:$(client_port "$k")"
        client_urls+=",$advertise"
    fi
    # With an existing data dir etcd ignores the --initial-* flags and rejoins as before.
    echo "=== etcd.sh: launching member $k at $(date -u +%FT%TZ)" >>"$log"
    setsid nohup etcd \
        --name "m$k" \
        --data-dir "$(member_data "$k")" \
        --listen-client-urls "$client_urls" \
        --advertise-client-urls "$advertise" \
        --listen-peer-urls "$(scheme)://127.0.0.1:$(peer_port "$k")" \
        --initial-advertise-peer-urls "$(scheme)://127.0.0.1:$(peer_port "$k")" \
        --initial-cluster "$cluster" \
        --initial-cluster-token "$TOKEN" \
        --initial-cluster-state new \
        --heartbeat-interval "$HEARTBEAT_MS" \
        --election-timeout "$ELECTION_MS" \
        --logger zap --log-outputs stderr \
        "${tls[@]}" \
        </dev/null >>"$log" 2>&1 9>&- &
    # setsid execs in place (a background job of this script is no group leader), so $!
    # is etcd's own pid.
    echo $! >"$DIR/member-$k.pid"
}

# Wait until every member K given answers; fail (with its log) if one dies or time runs out.
wait_healthy() {
    local end=$((SECONDS + TIMEOUT)) k pending=("$@") left
    while ((${#pending[@]})); do
        left=()
        for k in "${pending[@]}"; do
            # Just launched by us, so still our child: its pid cannot be reused, and right
            # after the fork it may not have exec'd etcd yet (so no command line check).
            if ! proc_alive "$(<"$DIR/member-$k.pid")"; then
                tail -20 "$DIR/member-$k.log" >&2 || true
                die "member $k exited while starting (log above, full log: $DIR/member-$k.log)"
            fi
            healthy "$k" || left+=("$k")
        done
        pending=("${left[@]}")
        ((${#pending[@]})) || break
        if ((SECONDS >= end)); then
            for k in "${pending[@]}"; do tail -5 "$DIR/member-$k.log" >&2 || true; done
            die "member(s) ${pending[*]} not healthy after ${TIMEOUT}s (logs: $DIR/member-K.log;" \
                "a member of three answers only while two of them run)"
        fi
        sleep 0.05 # bounded poll of the health probe
    done
}

# Wait until PID is gone (or a zombie); false on timeout.
wait_gone() {
    local pid=$1 k=$2 end=$((SECONDS + TIMEOUT))
    while pid_is_member "$pid" "$k"; do
        ((SECONDS < end)) || return 1
        sleep 0.02
    done
}

# Send SIG to each member K given that runs, then wait for each to exit (SIGKILL after
# the timeout). All are signalled first so stopping a cluster takes one member's time.
signal_members() {
    local sig=$1 k pid pids=()
    shift
    for k in "$@"; do
        pid=$(member_pid "$k") || pid=''
        pids+=("$pid")
        [[ -z $pid ]] || kill "-$sig" "$pid" 2>/dev/null || true
    done
    for k in "$@"; do
        pid=${pids[0]}
        pids=("${pids[@]:1}")
        if [[ -n $pid ]] && ! wait_gone "$pid" "$k"; then
            say "member $k (pid $pid) still runs ${TIMEOUT}s after SIG$sig; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone "$pid" "$k" || die "member $k (pid $pid) does not exit even after SIGKILL"
        fi
        rm -f "$DIR/member-$k.pid"
    done
}

# --- free ports --------------------------------------------------------------------------
# Local ports of the TCP sockets on this host, one per line, decimal. TIME_WAIT (06) ones
# are left out: etcd listens with SO_REUSEADDR, so they do not block it.
used_ports() {
    local f _ local_addr _remote state _rest
    for f in /proc/net/tcp /proc/net/tcp6; do
        [[ -r $f ]] || continue
        while read -r _ local_addr _remote state _rest; do
            [[ $local_addr == *:* && $state != 06 ]] || continue # also skips the header
            echo $((16#${local_addr##*:}))
        done <"$f"
    done
}

# Is the block of 6 ports at BASE free of sockets and of claims by a live cluster dir?
block_free() {
    local base=$1 used=$2 p claim
    for ((p = base; p < base + 6; p++)); do
        grep -qx "$p" <<<"$used" && return 1
    done
    claim="$CLAIMS/$base"
    if [[ -f $claim ]]; then
        local owner
        owner=$(<"$claim")
        [[ -f $owner/cluster && $owner != "$DIR" ]] && return 1
    fi
    return 0
}

# --- commands ----------------------------------------------------------------------------
cmd_start() {
    need_tools
    [[ $MEMBERS_OPT =~ ^[13]$ ]] || die "--members must be 1 or 3 (got '$MEMBERS_OPT')"
    MEMBERS=$MEMBERS_OPT
    [[ $VOLUME_OPT =~ ^[A-Za-z0-9._-]+$ ]] ||
        die "--volume may hold only letters, digits, '.', '_' and '-' (got '$VOLUME_OPT')"
    VOLUME=$VOLUME_OPT
    SECURE=$((INSECURE ? 0 : 1))
    LISTEN_IP=$LISTEN_IP_OPT
    if [[ -n $LISTEN_IP ]]; then
        [[ $LISTEN_IP =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] ||
            die "--listen-ip must be an IPv4 address (got '$LISTEN_IP')"
        # Not `ip | grep -q`: grep's early exit would fail the pipeline (pipefail).
        [[ $(ip -o addr show 2>/dev/null) == *" inet $LISTEN_IP/"* ]] ||
            die "--listen-ip $LISTEN_IP is no address of this host (ip addr add it first)"
    fi
    if [[ -z $DIR ]]; then
        DIR=$(mktemp -d /tmp/coherent-etcd.XXXXXX)
    else
        mkdir -p "$DIR"
        DIR=$(cd "$DIR" && pwd)
        [[ ! -e $DIR/cluster ]] ||
            die "$DIR already holds a cluster; use 'etcd.sh restart --dir $DIR' or remove it"
    fi
    # Keys, passwords and data: this user's alone.
    chmod 0700 "$DIR"
    TOKEN="coherent-$(basename "$DIR")-$$"
    if ((SECURE)); then
        rm -rf "$DIR/tls" "$DIR/auth" "$DIR/root-auth"
        make_certs
        use_credentials
    fi

    use_state
    (umask 077 && mkdir -p "$CLAIMS")
    exec 9>"$CLAIMS/.lock"
    flock 9
    local used claim
    for claim in "$CLAIMS"/[0-9]*; do # forget blocks whose cluster dir is gone
        [[ -f $claim && ! -f $(<"$claim")/cluster ]] && rm -f "$claim"
    done
    used=$(used_ports)
    local k attempt
    for attempt in 1 2 3 4 5; do
        if [[ -n $BASE_OPT ]]; then
            [[ $BASE_OPT =~ ^[0-9]+$ ]] && ((BASE_OPT >= 1024 && BASE_OPT <= 65529)) ||
                die "--base-port must be a number in 1024..65529 (got '$BASE_OPT')"
            block_free "$BASE_OPT" "$used" ||
                die "ports $BASE_OPT..$((BASE_OPT + 5)) are in use; pick another --base-port or omit it"
            BASE=$BASE_OPT
        else
            BASE=$DEFAULT_BASE
            until block_free "$BASE" "$used"; do
                BASE=$((BASE + 10))
                # Stay below the kernel's ephemeral ports (32768 up), where clients bind.
                ((BASE + 5 < 32768)) || die "no free block of 6 ports in $DEFAULT_BASE..32767"
            done
        fi
        echo "$DIR" >"$CLAIMS/$BASE"
        printf 'members=%s\nbase_port=%s\ntoken=%s\nsecure=%s\nvolume=%s\n' \
            "$MEMBERS" "$BASE" "$TOKEN" "$SECURE" "$VOLUME" >"$DIR/cluster"
        [[ -z $LISTEN_IP ]] || printf 'listen_ip=%s\n' "$LISTEN_IP" >>"$DIR/cluster"
        echo "$DIR" >"$LAST"
        for k in $(all_members); do launch "$k"; done
        # Keep the lock until the members listen, so a parallel start cannot take these ports.
        if (wait_healthy $(all_members)) && { ((!SECURE)) || enable_auth; }; then
            break
        fi
        # Leave DIR as if never started (logs kept), so the same start can be retried.
        signal_members KILL $(all_members)
        for k in $(all_members); do rm -rf "$(member_data "$k")"; done
        rm -f "$DIR/cluster" "$CLAIMS/$BASE"
        # Another user's cluster (whose claims are in their own state directory) bound a
        # port of the block between the check and the start: the next block, a few times.
        if [[ -z $BASE_OPT ]] && ((attempt < 5)) &&
            grep -qs 'address already in use' "$DIR"/member-*.log; then
            say "ports $BASE..$((BASE + 5)) were taken meanwhile; trying the next block"
            for k in $(all_members); do mv -f "$DIR/member-$k.log" "$DIR/member-$k.log.try$attempt"; done
            for ((k = BASE; k < BASE + 6; k++)); do used+=$'\n'$k; done
            continue
        fi
        exit 1
    done
    local url
    if ((SECURE)); then
        url="etcds://$(hostports_of $(all_members))/$VOLUME?auth=$DIR/auth"
    else
        url="etcd://$(hostports_of $(all_members))"
    fi
    echo "$url" >"$DIR/endpoints"
    flock -u 9
    echo "$url"
}

pick_dir() {
    if [[ -z $DIR ]]; then
        use_state
        [[ -f $LAST ]] || die "no --dir given and no earlier 'etcd.sh start' ($LAST missing)"
        DIR=$(<"$LAST")
    fi
    [[ -d $DIR ]] || die "cluster directory $DIR does not exist"
    load_cluster
}

# The members to act on: --member K or all (sets TARGETS).
pick_targets() {
    if [[ -n $MEMBER ]]; then
        [[ $MEMBER =~ ^[0-9]+$ ]] && ((MEMBER >= 1 && MEMBER <= MEMBERS)) ||
            die "--member must be 1..$MEMBERS for this cluster (got '$MEMBER')"
        TARGETS=("$MEMBER")
    else
        mapfile -t TARGETS < <(all_members)
    fi
}

# "ID IS_LEADER" of member K as it reports itself (fails if it does not answer).
member_status() {
    local ep id _ver _size is_leader _rest
    IFS=', ' read -r ep id _ver _size is_leader _rest < <(
        etcdctl --endpoints="$(endpoints_of "$1")" --dial-timeout=1s --command-timeout=2s \
            endpoint status 2>/dev/null
    ) || return 1
    [[ -n $id ]] && echo "$id $is_leader"
}

# SIGTERM member K and wait. A stopping leader first hands leadership to a peer it still
# believes alive and waits up to 6 s (our tunables) if that peer has in fact just stopped.
# So a leader is relieved first: leadership moved to a running member, or, when it is the
# last one running, we wait until it steps down for want of a quorum (~1 s).
stop_member() {
    local k=$1 j id is_leader other='' oid _l end
    if member_pid "$k" >/dev/null && read -r id is_leader < <(member_status "$k"); then
        for j in $(all_members); do
            [[ $j != "$k" ]] && member_pid "$j" >/dev/null && other=$j && break
        done
        if [[ $is_leader == true && -n $other ]]; then
            read -r oid _l < <(member_status "$other") &&
                etcdctl --endpoints="$(endpoints_of "$k")" --dial-timeout=1s \
                    --command-timeout=3s move-leader "$oid" >/dev/null 2>&1 || true
        elif [[ $is_leader == true && $MEMBERS -gt 1 ]]; then
            end=$((SECONDS + 5))
            while ((SECONDS < end)) && read -r id is_leader < <(member_status "$k") &&
                [[ $is_leader == true ]]; do
                sleep 0.05 # bounded poll for the step-down
            done
        fi
    fi
    signal_members TERM "$k"
}

cmd_stop() {
    pick_dir
    pick_targets
    local k
    for k in "${TARGETS[@]}"; do stop_member "$k"; done
}

cmd_kill() {
    pick_dir
    [[ -n $MEMBER ]] || die "kill needs --member K"
    pick_targets
    signal_members KILL "${TARGETS[@]}"
}

cmd_restart() {
    need_tools
    pick_dir
    pick_targets
    local k started=()
    for k in "${TARGETS[@]}"; do
        member_pid "$k" >/dev/null && continue
        [[ -d $(member_data "$k") ]] ||
            die "member $k has no data dir $(member_data "$k"); it was never started"
        launch "$k"
        started+=("$k")
    done
    ((${#started[@]} == 0)) || wait_healthy "${started[@]}"
}

cmd_status() {
    pick_dir
    local k pid ok=0
    echo "cluster $DIR: $MEMBERS member(s), $(cat "$DIR/endpoints" 2>/dev/null || echo 'no endpoints')"
    for k in $(all_members); do
        if pid=$(member_pid "$k"); then
            if healthy "$k"; then
                echo "member $k: running (pid $pid), 127.0.0.1:$(client_port "$k") healthy"
            else
                echo "member $k: running (pid $pid), 127.0.0.1:$(client_port "$k") NOT healthy"
                ok=1
            fi
        else
            echo "member $k: stopped"
            ok=1
        fi
    done
    return "$ok"
}

# --- arguments ---------------------------------------------------------------------------
(($#)) || usage
CMD=$1
shift
DIR='' MEMBER='' MEMBERS_OPT=1 BASE_OPT='' VOLUME_OPT=default INSECURE=0 SECURE=0
LISTEN_IP_OPT='' LISTEN_IP=''
while (($#)); do
    case $1 in
    --dir) DIR=${2:?--dir needs a value} && shift 2 ;;
    --member) MEMBER=${2:?--member needs a value} && shift 2 ;;
    --members) MEMBERS_OPT=${2:?--members needs a value} && shift 2 ;;
    --base-port) BASE_OPT=${2:?--base-port needs a value} && shift 2 ;;
    --volume) VOLUME_OPT=${2:?--volume needs a value} && shift 2 ;;
    --insecure) INSECURE=1 && shift ;;
    --listen-ip) LISTEN_IP_OPT=${2:?--listen-ip needs a value} && shift 2 ;;
    -h | --help) usage ;;
    *) die "unknown argument '$1' (see: scripts/etcd.sh --help)" ;;
    esac
done
[[ $CMD == start || -z $LISTEN_IP_OPT ]] || die "--listen-ip is an option of start only"
case $CMD in
start)
    [[ -z $MEMBER ]] || die "start takes --members N, not --member"
    cmd_start
    ;;
stop) cmd_stop ;;
kill) cmd_kill ;;
restart) cmd_restart ;;
status) cmd_status ;;
-h | --help | help) usage ;;
*) die "unknown command '$CMD' (start, stop, kill, restart, status)" ;;
esac
