#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The urdma API between two hosts: api_test with its server side in network
# namespace A and its client side in B (the harness's T_CHILD_NETNS; every
# case but the local ones: cfg_errors, refused), then the example programs
# (tests/api/examples.sh) with their servers in A and clients in B.  No
# URDMA_TRANSPORT: the connection manager sees the peer is on another host
# and the QPs take iWARP/TCP.  About 30 s.
# Usage: api.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip: not root)
COMPAT_BUDGET=${COMPAT_BUDGET:-200}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$HERE/netns.sh"
EXAMPLES_SOURCED=1
# shellcheck source-path=SCRIPTDIR source=../api/examples.sh
. "$HERE/../api/examples.sh"
compat_init "${1:-}"
netns_setup_or_skip
URDMA_NET_TRANSPORT=${URDMA_NET_TRANSPORT:-auto}
net_hosts || exit 1
PAIR_NETNS=$SRV_NS
CASE_PREFIX="net "

name="net api_test: server in A, client in B"
run_check "$name" 240 ip netns exec "$SRV_NS" env URDMA_SHM_DIR="$WORK/shm-$SRV_NS" \
    API_HOST="$SRV_IP" T_CHILD_NETNS="$CLI_NS" T_CHILD_SHM_DIR="$WORK/shm-$CLI_NS" \
    "$BUILD/bin/api_test" echo flow_both_ways flow_small_pool flow_pool_all_receives receiver_keeps_buffers \
    sizes_differ peer_killed one_sided queue_full many_connections threadsafe
if [ "$CHECK_RC" -eq 0 ] && grep -q "11 passed, 0 failed" "$CHECK_LOG"; then
    pass "$name ($(grep -o '[0-9]* connections, one echo each, closed: [0-9]* s' "$CHECK_LOG"))"
else
    fail "$name" "exit status $CHECK_RC"
    show_log "$CHECK_LOG" "api_test output"
fi
example_cases "$SRV_IP"
finish
