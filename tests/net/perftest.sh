#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's perftest on urdma between two hosts: ib_{send,write,read}_{lat,bw},
# server in network namespace A, client in namespace B connecting to A's
# address over a veth pair, URDMA_TRANSPORT=tcp, -x <GID index of the side's
# own IPv4 address>; each with default parameters and with -a (all message
# sizes, -n 100).  Both sides must exit 0 and the client must print its
# results table.
# Usage: perftest.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip: not root)
# URDMA_NET_TRANSPORT=shm runs both sides in namespace A over shared memory (a
# check of this script itself).
COMPAT_BUDGET=${COMPAT_BUDGET:-140}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$HERE/netns.sh"
compat_init "${1:-}"
need_cmd ib_send_lat perftest
netns_setup_or_skip
net_hosts || exit 1
PAIR_NETNS=$SRV_NS

PORT_BASE=${NET_PERFTEST_PORT:-18700}
T=${NET_PERFTEST_TIMEOUT:-40}    # per process, seconds
SRV_ARGS="-x $SRV_GID"
CLI_ARGS="-x $CLI_GID"
TARGET=$SRV_IP
CASE_PREFIX="net "
RESULT_RE='#bytes'
RESULT_CHECK=perftest_has_table
perftest_cases "${COMPAT_DEVICE:-urdma0}"
run_cases show_perftest_table "${PERFTEST_CASES[@]}"
finish
