# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Two "hosts" for the multi-host tests: Linux network namespaces joined by a
# veth pair (sourced, not run; needs root).  Self-contained: the tests source
# tests/compat/common.sh first, bench/bench.sh sources this file alone.
#
#   netns_setup             create NS_A and NS_B (names unique to this run), the
#                           veth pair VETH_A (in NS_A, IP_A = 10.233.X.1/24) and
#                           VETH_B (in NS_B, IP_B = 10.233.X.2/24), lo and links
#                           up; install the EXIT trap that removes them.  Returns 1
#                           with the reason in NETNS_ERROR (not root, no CAP_NET_ADMIN)
#   netns_setup_or_skip     netns_setup, or print SKIP and exit 77
#   netns_cleanup           kill what still runs in the namespaces, delete them
#   in_ns NS CMD...         run CMD in namespace NS (NS empty: in this one)
#   netns_link_down / netns_link_up     take the veth pair down / up (VETH_A in NS_A)
#   netns_gid_index NS IPV4 print urdma's GID index of ::ffff:IPV4 as seen in NS
#                           (each namespace has its own GID table); needs $URDMA
#   net_hosts               the urdma roles of the net tests (server in NS_A, client
#                           in NS_B), see below; needs $URDMA and $WORK

NS_A=""
NS_B=""

netns_cleanup() {
    local ns pid
    for ns in $NS_A $NS_B; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null; done
    done
    for _ in $(seq 20); do
        [ -z "$(for ns in $NS_A $NS_B; do ip netns pids "$ns" 2>/dev/null; done)" ] && break
        sleep 0.1
    done
    for ns in $NS_A $NS_B; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    done
    # Deleting the veth explicitly removes both ends now; a namespace's own
    # devices otherwise go away asynchronously after `ip netns del`.
    [ -n "$NS_A" ] && ip -n "$NS_A" link del "$VETH_A" 2>/dev/null
    for ns in $NS_A $NS_B; do ip netns del "$ns" 2>/dev/null; done
    NS_A=""
    NS_B=""
    return 0
}

# netns_trap: run netns_cleanup on exit, before any EXIT trap already set, and
# make INT/TERM/HUP exit (through that trap) unless the caller handles them.
netns_trap() {
    local prev
    prev=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT\$/\\1/")
    # shellcheck disable=SC2064  # expand the previous trap now
    trap "netns_cleanup${prev:+; $prev}" EXIT
    local sig
    for sig in INT TERM HUP; do
        [ -n "$(trap -p "$sig")" ] || trap 'exit 1' "$sig"
    done
}

netns_setup() {
    local x err
    NETNS_ERROR=""
    if [ "$(id -u)" != 0 ]; then
        NETNS_ERROR="creating network namespaces needs root"
        return 1
    fi
    if ! command -v ip >/dev/null 2>&1; then
        NETNS_ERROR="'ip' not found (Debian package iproute2)"
        return 1
    fi
    # X from the PID: parallel runs get different subnets (each pair of
    # namespaces is isolated anyway; this keeps captures and logs distinct).
    x=$(($$ % 254 + 1))
    IP_A=10.233.$x.1
    IP_B=10.233.$x.2
    VETH_A=veth-a-$$
    VETH_B=veth-b-$$
    netns_trap
    NS_A=urdma-a-$$
    if ! err=$(ip netns add "$NS_A" 2>&1); then
        NS_A=""
        NETNS_ERROR="'ip netns add' failed (no CAP_NET_ADMIN, e.g. in a container?): $err"
        return 1
    fi
    NS_B=urdma-b-$$
    if ! err=$(ip netns add "$NS_B" 2>&1); then
        NS_B=""
        netns_cleanup
        NETNS_ERROR="'ip netns add' failed: $err"
        return 1
    fi
    if ! err=$({ ip link add "$VETH_A" netns "$NS_A" type veth peer name "$VETH_B" netns "$NS_B" &&
                 ip -n "$NS_A" addr add "$IP_A/24" dev "$VETH_A" &&
                 ip -n "$NS_B" addr add "$IP_B/24" dev "$VETH_B" &&
                 ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up &&
                 ip -n "$NS_A" link set "$VETH_A" up && ip -n "$NS_B" link set "$VETH_B" up; } 2>&1); then
        netns_cleanup
        NETNS_ERROR="setting up the veth pair failed: $err"
        return 1
    fi
    return 0
}

netns_setup_or_skip() {
    if ! netns_setup; then
        printf 'SKIP: %s\n' "$NETNS_ERROR"
        exit 77
    fi
    printf 'hosts: %s (%s on %s) and %s (%s on %s)\n' \
        "$NS_A" "$IP_A" "$VETH_A" "$NS_B" "$IP_B" "$VETH_B"
}

in_ns() {
    local ns=$1
    shift
    if [ -n "$ns" ]; then
        ip netns exec "$ns" "$@"
    else
        "$@"
    fi
}

netns_link_down() { ip -n "$NS_A" link set "$VETH_A" down; }
netns_link_up() { ip -n "$NS_A" link set "$VETH_A" up; }

netns_gid_index() {
    local ns=$1 ip=$2
    in_ns "$ns" "$URDMA" devices 2>/dev/null |
        sed -nE "s/^[[:space:]]*\[[[:space:]]*([0-9]+)\][[:space:]]+::ffff:${ip//./\\.}([[:space:]].*)?\$/\\1/p" |
        head -n 1 | grep .
}

# net_hosts: the roles of the urdma processes in the net tests.
#   NET_TRANSPORT   URDMA_TRANSPORT of both sides: $URDMA_NET_TRANSPORT, default tcp
#   SRV_NS, SRV_IP  the server: NS_A, IP_A
#   CLI_NS, CLI_IP  the client: NS_B, IP_B -- or NS_A, IP_A when NET_TRANSPORT is
#                   shm (shared memory does not cross hosts: that mode checks the
#                   test scripts themselves, both processes in one namespace)
#   SRV_GID, CLI_GID  each side's GID index of its own IPv4 address
#   SRV_RUN, CLI_RUN  command prefix (a string, for run_pair) running a program
#                   as that side: in its namespace, with its own URDMA_SHM_DIR (a
#                   host's shared memory is its own: nothing can pass through it)
# Returns 1 (with a message) if a GID index is not found.
net_hosts() {
    NET_TRANSPORT=${URDMA_NET_TRANSPORT:-tcp}
    SRV_NS=$NS_A
    SRV_IP=$IP_A
    if [ "$NET_TRANSPORT" = shm ]; then
        CLI_NS=$NS_A
        CLI_IP=$IP_A
    else
        CLI_NS=$NS_B
        CLI_IP=$IP_B
    fi
    # shellcheck disable=SC2034  # for the scripts that source this file
    SRV_RUN="ip netns exec $SRV_NS env URDMA_TRANSPORT=$NET_TRANSPORT URDMA_SHM_DIR=$WORK/shm-$SRV_NS $URDMA run"
    # shellcheck disable=SC2034
    CLI_RUN="ip netns exec $CLI_NS env URDMA_TRANSPORT=$NET_TRANSPORT URDMA_SHM_DIR=$WORK/shm-$CLI_NS $URDMA run"
    if ! SRV_GID=$(netns_gid_index "$SRV_NS" "$SRV_IP") || ! CLI_GID=$(netns_gid_index "$CLI_NS" "$CLI_IP"); then
        printf 'FAIL: no GID of %s or %s in urdma devices inside the namespaces:\n' "$SRV_IP" "$CLI_IP"
        in_ns "$SRV_NS" "$URDMA" devices 2>&1 | sed 's/^/  | /'
        return 1
    fi
    printf 'transport %s: server in %s (%s, GID index %s), client in %s (%s, GID index %s)\n' \
        "$NET_TRANSPORT" "$SRV_NS" "$SRV_IP" "$SRV_GID" "$CLI_NS" "$CLI_IP" "$CLI_GID"
}
