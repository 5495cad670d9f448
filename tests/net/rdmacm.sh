#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's rdmacm-utils and perftest unmodified on urdma's librdmacm.so.1
# between two hosts: the server in network namespace A, the client in B
# reaching A's address over a veth pair.  No URDMA_TRANSPORT: the connection
# manager sees that the peer's GID is not local and libibverbs takes
# iWARP/TCP (checked in the first rping case's debug log).  Cases: rping
# -v -V -C 100 with sizes 23, 64, 4096, 65535; ucmatose, also 4 connections
# with 4 KiB messages; rdma_server/rdma_client; cmtime with 50 connections;
# perftest ib_send_bw -R, ib_write_lat -R, ib_read_bw -R with 8 MiB
# messages (see PERFTEST_RACE_RE in cases.sh for why); rstream
# (rsockets) in a few modes; the rping server killed with SIGKILL mid-run;
# rping to a port nobody listens on; rping to a host that never answers
# (the connect deadline: UNREACHABLE, -ETIMEDOUT, after 10 s).
# Usage: rdmacm.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip: not root)
# URDMA_NET_TRANSPORT=tcp forces TCP on both sides; =shm runs both sides in
# namespace A over shared memory (a check of this script itself).
COMPAT_BUDGET=${COMPAT_BUDGET:-170}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$HERE/netns.sh"
# shellcheck source-path=SCRIPTDIR source=../rdmacm/cases.sh
. "$HERE/../rdmacm/cases.sh"
compat_init "${1:-}"
for c in rping ucmatose udaddy udpong mckey rdma_server rdma_client cmtime rstream; do need_cmd "$c" rdmacm-utils; done
for c in ib_send_bw ib_write_lat ib_read_bw; do need_cmd "$c" perftest; done
if [ ! -e "$BUILD/lib/librdmacm.so.1" ]; then
    log "FAIL: $BUILD/lib/librdmacm.so.1 not built"
    exit 1
fi
netns_setup_or_skip
URDMA_NET_TRANSPORT=${URDMA_NET_TRANSPORT:-auto}
net_hosts || exit 1
PAIR_NETNS=$SRV_NS

CASE_PORT=${NET_RDMACM_PORT:-19800}
T=${NET_RDMACM_TIMEOUT:-40}     # per process, seconds
CASE_PREFIX="net "

# The first case also shows which transport the client's QP took.
# shellcheck disable=SC2317  # called through CM_CHECK_ALSO
qp_transport_ok() {
    local want=tcp
    [ "$NET_TRANSPORT" = shm ] && want=shm
    if ! grep -q "urdma_pick_transport: .*transport $want" "$1"; then
        log "  the client's QP did not take transport $want:"
        grep 'urdma_pick_transport' "$1" | sed 's/^/  | /'
        return 1
    fi
}
CM_CHECK_ALSO=qp_transport_ok
CLI_RUN_SAVED=$CLI_RUN
CLI_RUN="${CLI_RUN/ env / env URDMA_LOG_LEVEL=debug }"
cm_cases "$SRV_IP" "rping 64 B x 100, QP transport|rping:100:64"
CLI_RUN=$CLI_RUN_SAVED
CM_CHECK_ALSO=""
CM_CLI_BIND=$CLI_IP # (mckey: each side joins from its own address)

cm_cases "$SRV_IP" \
    "rping 23 B x 100|rping:100:23" \
    "rping 4096 B x 100|rping:100:4096" \
    "rping 65535 B x 100|rping:100:65535" \
    "ucmatose|ucmatose" \
    "ucmatose 4 connections 4 KiB x 50|ucmatose:-c 4 -S 4096 -C 50" \
    "udaddy|udaddy" \
    "udaddy 4 connections 1 KiB x 50|udaddy:-c 4 -S 1024 -C 50" \
    "mckey multicast|mckey:239.1.2.3" \
    "mckey 2 groups x 50, 1 KiB|mckey:239.1.2.4:-c 2 -C 50 -S 1024" \
    "rdma_server/rdma_client|rdma_cs" \
    "cmtime 50 connections|cmtime:50" \
    "ib_send_bw -R 8 MiB|perftest:ib_send_bw:-s 8388608 -n 20" \
    "ib_write_lat -R 8 MiB|perftest:ib_write_lat:-s 8388608 -n 20" \
    "ib_read_bw -R 8 MiB|perftest:ib_read_bw:-s 8388608 -n 20"

# rsockets over the same path (rstream: its own short runs, one row each;
# udpong: datagram rsockets, bandwidth runs, see udpong_ok).
cm_cases "$SRV_IP" \
    "rstream 4 KiB x 1000|rstream:1:-S 4096 -C 1000" \
    "rstream 1 MB x 20 blocking verify|rstream:1:-S 1000000 -C 20 -T b -T v" \
    "rstream 100 B x 2000 rpoll verify|rstream:1:-S 100 -C 2000 -T a -T v" \
    "udpong 1 KiB x 10000|udpong:1:-S 1024 -C 10000" \
    "udpong 64 B x 20000 rpoll|udpong:1:-S 64 -C 20000 -T a"

cm_fault_killed "$SRV_IP"
cm_fault_unreachable "$SRV_IP"
if [ "$CLI_NS" = "$NS_B" ]; then cli_dev=$VETH_B; else cli_dev=$VETH_A; fi
cm_fault_silent "$CLI_NS" "$cli_dev" "${SRV_IP%.*}.77"
finish
