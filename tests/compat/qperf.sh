#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's qperf on urdma: every RDMA test this build of qperf has (RC, UC
# and UD Send/Receive, RDMA Write and Read, atomics and their verification)
# against one qperf server, on one host over shared memory and over TCP,
# in qperf's default mode (it sleeps on completion events), a few polling
# (-cp1) and a few with the connection manager (-cm1).  A test passes when
# the client exits 0 and every figure it prints is above zero: qperf's
# bi_bw tests on UC and UD once printed "recv_bw = 0 bytes/sec" (no
# receive was ever polled, conf_cq_turns).
# Usage: qperf.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
COMPAT_BUDGET=${COMPAT_BUDGET:-170}   # seconds, for all cases
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd qperf qperf

PORT=$(free_port "${COMPAT_QPERF_PORT:-19100}")
SECS=${COMPAT_QPERF_SECS:-1} # each test's length (qperf -t: whole seconds; 0.5 never ends)
TESTS=(rc_lat rc_bw rc_bi_bw uc_lat uc_bw uc_bi_bw ud_lat ud_bw ud_bi_bw
       rc_rdma_write_lat rc_rdma_write_poll_lat rc_rdma_write_bw
       rc_rdma_read_lat rc_rdma_read_bw uc_rdma_write_lat
       uc_rdma_write_poll_lat uc_rdma_write_bw rc_compare_swap_mr
       rc_fetch_add_mr ver_rc_compare_swap ver_rc_fetch_add)
POLLED=(rc_lat rc_bi_bw uc_bi_bw ud_bi_bw rc_rdma_read_bw)
WITH_CM=(rc_lat rc_bw rc_rdma_write_bw ud_bw)

# figures_ok LOG: a "name = value unit" line per figure, every value > 0.
figures_ok() {
    awk '$2 == "=" { n++; if ($3 + 0 <= 0) bad++ }
         END { exit !(n > 0 && !bad) }' "$1"
}

# qperf -cm1: the server sends the client the port of its id, and only
# then calls rdma_listen (qperf 0.4.11, rdma.c cm_open_server).  A client
# that connects first is refused (UNREACHABLE, as from an iWARP peer); on a
# NIC its address and route resolution take longer than that window, on
# urdma they do not.  The race is qperf's: such a run goes again, up to
# CM_TRIES times in all (lost in 3 of 16 -cm1 runs here: with 3 tries a
# test run would fail about once in 20).
CM_TRIES=8
CM_RACE_RE='unexpected event from RDMA CM: Event unreachable'

# qperf_case NAME TEST [OPTION...]: one client run against the server.
qperf_case() {
    local name=$1 test=$2 try=1
    shift 2
    budget_left "$name" || return 0
    log "== $name"
    while :; do
        run_check "$name" 30 "$URDMA" run qperf -lp "$PORT" -t "$SECS" "$@" 127.0.0.1 "$test"
        [ "$CHECK_RC" -ne 0 ] && [ "$try" -lt "$CM_TRIES" ] &&
            grep -q "$CM_RACE_RE" "$CHECK_LOG" || break
        log "  (lost qperf's own race: its server listens after sending its port)"
        try=$((try + 1))
    done
    if [ "$CHECK_RC" -ne 0 ]; then
        fail "$name" "client exit status $CHECK_RC"
        show_log "$CHECK_LOG" "client output"
    elif ! figures_ok "$CHECK_LOG"; then
        fail "$name" "a figure is missing or zero"
        show_log "$CHECK_LOG" "client output"
    else
        [ "$try" -gt 1 ] && name="$name, run $try"
        pass "$name: $(awk '$2 == "=" { printf "%s %s %s  ", $1, $3, $4 }' "$CHECK_LOG")"
    fi
}

for transport in shm tcp; do
    export URDMA_TRANSPORT=$transport
    log "RUN server ($transport): $URDMA run qperf -lp $PORT"
    timeout -k 2 200 "$URDMA" run qperf -lp "$PORT" >"$WORK/server.$transport.log" 2>&1 &
    spid=$!
    COMPAT_BG_PIDS+=("$spid")
    if ! wait_listen "$PORT" "$spid" 15; then
        fail "qperf server ($transport)" "did not listen on TCP port $PORT"
        show_log "$WORK/server.$transport.log" "server output"
        continue
    fi
    for t in "${TESTS[@]}"; do
        qperf_case "$t ($transport)" "$t"
    done
    for t in "${POLLED[@]}"; do
        qperf_case "$t -cp1 ($transport)" "$t" -cp1
    done
    for t in "${WITH_CM[@]}"; do
        qperf_case "$t -cm1 ($transport)" "$t" -cm1
    done
    # The server serves any number of clients until it is told to quit.
    run_check "quit ($transport)" 10 "$URDMA" run qperf -lp "$PORT" 127.0.0.1 quit
    for ((i = 0; i < 100; i++)); do
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$spid" 2>/dev/null; then
        fail "qperf server ($transport)" "did not end on quit"
        kill -TERM "$spid" 2>/dev/null
    fi
    wait "$spid"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "qperf server ($transport)" "exit status $rc"
        show_log "$WORK/server.$transport.log" "server output"
    fi
done
unset URDMA_TRANSPORT
finish
