#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's perftest on urdma, server and client as two processes on loopback:
# ib_{send,write,read}_{lat,bw}, each with default parameters and with -a
# (all message sizes, -n 100).  Both sides must exit 0 and the client must
# print its results table (a numeric row under the "#bytes" header).
# Usage: perftest.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd ib_send_lat perftest

PORT_BASE=${COMPAT_PERFTEST_PORT:-18700}
T=${COMPAT_PERFTEST_TIMEOUT:-40}    # per process, seconds
SRV_RUN="$URDMA run"
CLI_RUN="$URDMA run"
TARGET=127.0.0.1
RESULT_RE='#bytes'
RESULT_CHECK=perftest_has_table
perftest_cases "${COMPAT_DEVICE:-urdma0}"
run_cases show_perftest_table "${PERFTEST_CASES[@]}"
finish
