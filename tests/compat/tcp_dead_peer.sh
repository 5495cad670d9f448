#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A peer killed mid-run over TCP (issue 17): Debian's ibv_rc_pingpong
# -s 65536 with URDMA_TRANSPORT=tcp on loopback; one side is SIGKILLed
# (client and server in turn, after 0.3 to 1.2 s).  The survivor must be
# told (its QP to ERR, its receives flushed) and exit, within 5 s: a
# survivor idle between messages used to stay in RTS for ever in about 1
# run of 10, spinning in epoll_ctl.  Ten rounds.
# Usage: tcp_dead_peer.sh BUILD_DIR   (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd ibv_rc_pingpong ibverbs-utils

PORT=${COMPAT_DEAD_PORT:-18660}
RUN="env URDMA_TRANSPORT=tcp $URDMA run --"
for round in $(seq 10); do
    name="kill_round_$round"
    victim=client
    [ $((round % 2)) = 0 ] && victim=server
    port=$((PORT + round))
    slog=$WORK/$name.server.log
    clog=$WORK/$name.client.log
    timeout -k 2 30 $RUN ibv_rc_pingpong -p "$port" -s 65536 -n 1000000 >"$slog" 2>&1 &
    spid=$!
    COMPAT_BG_PIDS+=("$spid")
    wait_listen "$port" "$spid" 15 || { fail "$name" "server did not listen"; continue; }
    timeout -k 2 30 $RUN ibv_rc_pingpong -p "$port" -s 65536 -n 1000000 127.0.0.1 >"$clog" 2>&1 &
    cpid=$!
    COMPAT_BG_PIDS+=("$cpid")
    sleep "$(awk -v r="$round" 'BEGIN { printf "%.2f", 0.3 + (r % 4) * 0.3 }')"
    # The program, not timeout(1) around it (-P: its child).
    if [ $victim = client ]; then pkill -KILL -P "$cpid"; sur=$spid; slog_s=$slog; else pkill -KILL -P "$spid"; sur=$cpid; slog_s=$clog; fi
    t0=$SECONDS
    i=0
    while kill -0 "$sur" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 "$sur" 2>/dev/null; then
        fail "$name" "the $([ $victim = client ] && echo server || echo client) still runs 5 s after its peer was killed"
        show_log "$slog_s" survivor
        kill -KILL "$sur" 2>/dev/null
    else
        pass "$name (the $victim killed; the other side ended after $((SECONDS - t0)) s or less)"
    fi
    wait "$spid" "$cpid" 2>/dev/null
done
finish
