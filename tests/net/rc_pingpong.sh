#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's ibv_rc_pingpong on urdma between two hosts: the server in network
# namespace A, the client in namespace B connecting to A's address over a veth
# pair, URDMA_TRANSPORT=tcp, each side with -g <its GID index of its own IPv4
# address>.  Cases: default, -e, -s 1, -s 4096, -s 64 KiB -n 500,
# -s 1 MiB -n 100, -e -n 5000.
# Usage: rc_pingpong.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip: not root)
# URDMA_NET_TRANSPORT=shm runs both sides in namespace A over shared memory (a
# check of this script itself).
COMPAT_BUDGET=${COMPAT_BUDGET:-240}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$HERE/netns.sh"
compat_init "${1:-}"
need_cmd ibv_rc_pingpong ibverbs-utils
netns_setup_or_skip
net_hosts || exit 1
PAIR_NETNS=$SRV_NS

PORT_BASE=${NET_RC_PORT:-18600}
T=${NET_RC_TIMEOUT:-40}     # per process, seconds
SRV_ARGS="-g $SRV_GID"
CLI_ARGS="-g $CLI_GID"
TARGET=$SRV_IP
CASE_PREFIX="net rc_pingpong "
RESULT_RE=$RC_RESULT_RE
run_cases show_rc_rates \
    "default|ibv_rc_pingpong" \
    "events|ibv_rc_pingpong -e" \
    "size1|ibv_rc_pingpong -s 1" \
    "size4096|ibv_rc_pingpong -s 4096" \
    "size65536|ibv_rc_pingpong -s 65536 -n 500" \
    "size1048576|ibv_rc_pingpong -s 1048576 -n 100" \
    "events5000|ibv_rc_pingpong -e -n 5000" \
    "srq|ibv_srq_pingpong" \
    "srq events|ibv_srq_pingpong -e -n 2000"
finish
