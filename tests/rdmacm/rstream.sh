#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's rsocket clients (rdmacm-utils) unmodified on urdma's librdmacm.so.1
# (`urdma run`), server and client on 127.0.0.1: rstream in its default mode
# (non-blocking, spinning), blocking (-T b), with rpoll (-T a), with data
# verification (-T v) and several custom sizes; riostream (riomap/riowrite)
# in the same modes; rcopy copying a file (compared byte for byte).  The
# QPs run over shared memory, and a few cases again over TCP
# (URDMA_TRANSPORT=tcp).
# Usage: rstream.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
COMPAT_BUDGET=${COMPAT_BUDGET:-540}
compat_init "${1:-}"
need_cmd rstream rdmacm-utils
need_cmd riostream rdmacm-utils
need_cmd rcopy rdmacm-utils
if [ ! -e "$BUILD/lib/librdmacm.so.1" ]; then
    log "FAIL: $BUILD/lib/librdmacm.so.1 not built"
    exit 1
fi

PORT_BASE=${RSTREAM_PORT:-19400}
T=${RSTREAM_TIMEOUT:-120}    # per process, seconds

# A port no TCP socket uses at all: the CM port is a TCP port, and one
# still in TIME_WAIT from the previous case can't be bound again.
free_port() {
    local p=$1
    while ss -Htan "sport = :$p" 2>/dev/null | grep -q .; do p=$((p + 1)); done
    printf '%s\n' "$p"
}

# rstream and riostream print one line per test:
#   name  bytes  xfers  iters  total  time  Gb/sec  usec/xfer
RESULT_RE='[0-9.]+s +[0-9.]+ +[0-9.]+$'
show_rows() { grep -E "$RESULT_RE" "$1" | sed 's/^/  | /'; }
# The run is complete: EXPECT_ROWS result rows and no error from a call
# (the clients report errors with perror and may still exit 0).
# shellcheck disable=SC2317  # called through RESULT_CHECK
rows_ok() {
    local n
    n=$(grep -cE "$RESULT_RE" "$1")
    if [ "$n" -lt "$EXPECT_ROWS" ]; then
        log "  $n result rows, expected $EXPECT_ROWS"
        return 1
    fi
    if grep -qE '^(rpoll|rsend|rrecv|riowrite|riomap|rconnect|raccept|rbind|rlisten|rsocket|async rconnect)|verification failed' "$1" ||
       grep -qE '^(rpoll|rsend|rrecv|riowrite|riomap|raccept|rbind|rlisten)|verification failed' "$PAIR_SRV_LOG"; then
        log "  an error was reported"
        return 1
    fi
    return 0
}
RESULT_CHECK=rows_ok

SRV_RUN="$URDMA run"
CLI_RUN="$URDMA run"
CLI_ARGS="-s"
TARGET=127.0.0.1

# Full runs: 4 latency and 4 bandwidth rows (64 B, 4 KiB, 64 KiB, 1 MiB).
EXPECT_ROWS=8
run_cases show_rows \
    "rstream default (non-blocking)|rstream" \
    "rstream blocking|rstream -T b" \
    "rstream rpoll|rstream -T a" \
    "rstream rpoll blocking verify|rstream -T a -T b -T v" \
    "riostream default (non-blocking)|riostream" \
    "riostream blocking|riostream -T b" \
    "riostream rpoll verify|riostream -T a -T v"

# Custom sizes: one row each.
EXPECT_ROWS=1
run_cases show_rows \
    "rstream 1 B x 20000|rstream -S 1 -C 20000" \
    "rstream 1000 B x 10000 verify|rstream -S 1000 -C 10000 -T v" \
    "rstream 100 KB x 500 blocking verify|rstream -S 100000 -C 500 -T b -T v" \
    "rstream 3 MiB x 20 rpoll verify|rstream -S 3145728 -C 20 -T a -T v" \
    "rstream 64 KiB x 200 small buffers|rstream -S 65536 -C 200 -B 16384 -T v" \
    "rstream 4 KiB x 5000 inline 0|rstream -S 4096 -C 5000 -i 0 -T b -T v" \
    "riostream 777 B x 3000|riostream -S 777 -C 3000 -T b"

# Over TCP (iWARP) instead of shared memory.
SRV_RUN="env URDMA_TRANSPORT=tcp $URDMA run"
CLI_RUN="env URDMA_TRANSPORT=tcp $URDMA run"
CASE_SUFFIX=" (TCP)"
run_cases show_rows \
    "rstream 1 B x 5000|rstream -S 1 -C 5000" \
    "rstream 1 MiB x 50 blocking verify|rstream -S 1048576 -C 50 -T b -T v" \
    "rstream 64 KiB x 300 rpoll verify|rstream -S 65536 -C 300 -T a -T v" \
    "riostream 100 KB x 200 blocking|riostream -S 100000 -C 200 -T b"
CASE_SUFFIX=""

# rcopy: the server serves copies until stopped; the client copies a file.
rcopy_case() {
    local name=$1 size=$2 port spid
    budget_left "$name" || return 0
    log "== $name"
    port=$(free_port "$CASE_PORT")
    CASE_PORT=$((port + 1))
    head -c "$size" /dev/urandom >"$WORK/rcopy.src"
    rm -f "$WORK/rcopy.dst"
    timeout -k 2 "$T" $SRV_RUN rcopy -p "$port" >"$WORK/rcopy.server.log" 2>&1 &
    spid=$!
    COMPAT_BG_PIDS+=("$spid")
    if ! wait_listen "$port" "$spid" 15; then
        fail "$name" "the rcopy server did not listen on port $port"
        show_log "$WORK/rcopy.server.log" "server output"
        return 0
    fi
    run_check "$name" "$T" $CLI_RUN rcopy "$WORK/rcopy.src" "127.0.0.1:$WORK/rcopy.dst" -p "$port"
    kill -TERM "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    if [ "$CHECK_RC" -ne 0 ]; then
        fail "$name" "rcopy exit status $CHECK_RC"
        show_log "$CHECK_LOG" "client output"
        show_log "$WORK/rcopy.server.log" "server output"
    elif ! cmp -s "$WORK/rcopy.src" "$WORK/rcopy.dst"; then
        fail "$name" "the copy differs from the source"
    else
        pass "$name"
        grep -E 'bytes in' "$CHECK_LOG" | sed 's/^/  | /'
    fi
}
SRV_RUN="$URDMA run"
CLI_RUN="$URDMA run"
rcopy_case "rcopy 1 byte" 1
rcopy_case "rcopy 25 MB" 25000000
SRV_RUN="env URDMA_TRANSPORT=tcp $URDMA run"
CLI_RUN="env URDMA_TRANSPORT=tcp $URDMA run"
rcopy_case "rcopy 25 MB (TCP)" 25000000
finish
