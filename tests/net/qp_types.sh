#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# XRC, UC and UD between two hosts: the server in network namespace A, clients
# in namespace B, over TCP.  ibv_xsrq_pingpong with one client and with two
# (both in B: the server's round robin makes one client's target QP receive
# for the other's SRQ, which the TCP receive path places through the other
# process), ibv_uc_pingpong, ibv_ud_pingpong (UD datagrams over UDP), and
# perftest -c XRC, -c UC and -c UD (qp_type_perftest_cases).
# Usage: qp_types.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip: not root)
# URDMA_NET_TRANSPORT=shm runs both sides in namespace A over shared memory (a
# check of this script itself).
COMPAT_BUDGET=${COMPAT_BUDGET:-200}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$HERE/netns.sh"
compat_init "${1:-}"
need_cmd ibv_xsrq_pingpong ibverbs-utils
qp_type_perftest_cases "${COMPAT_DEVICE:-urdma0}"
netns_setup_or_skip
net_hosts || exit 1
PAIR_NETNS=$SRV_NS

PORT_BASE=${NET_QPT_PORT:-18900}
T=${NET_QPT_TIMEOUT:-40}    # per process, seconds
TARGET=$SRV_IP
CASE_PREFIX="net "
SRV_ARGS="-g $SRV_GID"
CLI_ARGS="-g $CLI_GID"
RESULT_RE='^success$'
run_cases show_nothing "xsrq_pingpong|ibv_xsrq_pingpong"
run_multi "net xsrq_pingpong 2 clients" 2 "ibv_xsrq_pingpong -c 2 -n 200"
RESULT_RE=$RC_RESULT_RE
run_cases show_rc_rates "uc_pingpong|ibv_uc_pingpong" \
    "uc_pingpong events|ibv_uc_pingpong -e -n 2000" \
    "ud_pingpong|ibv_ud_pingpong" \
    "ud_pingpong events, 4 KiB|ibv_ud_pingpong -e -s 4096 -n 500"
SRV_ARGS="-x $SRV_GID"
CLI_ARGS="-x $CLI_GID"
RESULT_RE='#bytes'
RESULT_CHECK=perftest_has_table
run_cases show_perftest_table "${QPT_PERFTEST_CASES[@]}" "${UD_PERFTEST_CASES[@]}"
finish
