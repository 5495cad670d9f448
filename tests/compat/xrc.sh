#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# XRC with Debian's clients on loopback, over shared memory and over TCP
# (URDMA_TRANSPORT): ibv_xsrq_pingpong (server and client open the same XRC
# domain, /tmp/xrc_domain; each has its own XRC SRQ), with 3 clients at once
# (the server sends round robin on its send QPs, so a client's target QP
# receives messages for another client's SRQ, in another process), and
# perftest -c XRC (xrc_perftest_cases).
# Usage: xrc.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
COMPAT_BUDGET=${COMPAT_BUDGET:-200}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd ibv_xsrq_pingpong ibverbs-utils
xrc_perftest_cases "${COMPAT_DEVICE:-urdma0}"

PORT_BASE=${COMPAT_XRC_PORT:-18800}
T=${COMPAT_XRC_TIMEOUT:-30}     # per process, seconds
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
    RESULT_RE='#bytes'
    RESULT_CHECK=perftest_has_table
    run_cases show_perftest_table "${XRC_PERFTEST_CASES[@]}"
done
finish
