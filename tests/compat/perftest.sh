#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's perftest on urdma, server and client as two processes on loopback:
# ib_{send,write,read}_{lat,bw}, each with default parameters and with -a
# (all message sizes, -n 100), and a few with --use_hugepages.  Both sides must exit 0 and the client must
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
# --use_hugepages: SysV SHM_HUGETLB buffers, which stay in place (direct MRs,
# reached with a system call per access).  If no huge pages are reserved, as
# root the kernel may lend some for the run (surplus pages, given back when
# freed); the setting is restored on exit.
HUGE_KNOB=/proc/sys/vm/nr_overcommit_hugepages
HUGE_WAS=
huge_restore() { [ -n "$HUGE_WAS" ] && echo "$HUGE_WAS" > "$HUGE_KNOB"; compat_cleanup; }
if [ "$(id -u)" = 0 ] && [ -w "$HUGE_KNOB" ] && [ "$(cat "$HUGE_KNOB")" -lt 64 ]; then
    HUGE_WAS=$(cat "$HUGE_KNOB")
    trap huge_restore EXIT
    echo 64 > "$HUGE_KNOB"
fi
if [ -n "$HUGE_WAS" ] || [ "$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)" -ge 32 ]; then
    for t in ib_write_bw ib_read_lat ib_atomic_lat; do
        need_cmd "$t" perftest
        PERFTEST_CASES+=("$t (huge pages)|$t -d ${COMPAT_DEVICE:-urdma0} -F --use_hugepages -n 500")
    done
else
    log "no huge pages to lend (not root): --use_hugepages cases left out"
fi
run_cases show_perftest_table "${PERFTEST_CASES[@]}"
finish
