#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# XRC and UC queue pairs with Debian's clients on loopback, over shared
# memory and over TCP (URDMA_TRANSPORT): ibv_xsrq_pingpong (server and
# client open the same XRC domain, /tmp/xrc_domain; each has its own XRC
# SRQ), with 3 clients at once (the server sends round robin on its send
# QPs, so a client's target QP receives messages for another client's SRQ,
# in another process), ibv_uc_pingpong, ibv_ud_pingpong, and perftest
# -c XRC, -c UC and -c UD (qp_type_perftest_cases).
# Usage: qp_types.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
COMPAT_BUDGET=${COMPAT_BUDGET:-240}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd ibv_xsrq_pingpong ibverbs-utils
qp_type_perftest_cases "${COMPAT_DEVICE:-urdma0}"
need_cmd ibv_ud_pingpong ibverbs-utils

PORT_BASE=${COMPAT_QPT_PORT:-18800}
T=${COMPAT_QPT_TIMEOUT:-30}     # per process, seconds
TARGET=127.0.0.1
for tr in shm tcp; do
    SRV_RUN="env URDMA_TRANSPORT=$tr $URDMA run"
    CLI_RUN=$SRV_RUN
    CASE_PREFIX="$tr "
    RESULT_RE='^success$'
    RESULT_CHECK=""
    run_cases show_nothing \
        "xsrq_pingpong|ibv_xsrq_pingpong" \
        "xsrq_pingpong 4 KiB x 2000|ibv_xsrq_pingpong -s 4096 -n 2000"
    run_multi "${tr} xsrq_pingpong 3 clients" 3 "ibv_xsrq_pingpong -c 3 -n 200"
    RESULT_RE=$RC_RESULT_RE
    run_cases show_rc_rates \
        "uc_pingpong|ibv_uc_pingpong" \
        "uc_pingpong events|ibv_uc_pingpong -e -n 2000" \
        "uc_pingpong 64 KiB|ibv_uc_pingpong -s 65536 -n 200"
    # UD: datagrams over shared memory, or over UDP with
    # URDMA_TRANSPORT=tcp.  ibv_ud_pingpong: LID addressing, then GID
    # addressing (a GRH in each receive) with CQ events, one MTU.
    run_cases show_rc_rates \
        "ud_pingpong|ibv_ud_pingpong" \
        "ud_pingpong GRH, events|ibv_ud_pingpong -g 1 -e -n 2000" \
        "ud_pingpong 4 KiB|ibv_ud_pingpong -s 4096 -n 500"
    RESULT_RE='#bytes'
    RESULT_CHECK=perftest_has_table
    run_cases show_perftest_table "${QPT_PERFTEST_CASES[@]}" \
        "${UD_PERFTEST_CASES[@]}"
done
finish
