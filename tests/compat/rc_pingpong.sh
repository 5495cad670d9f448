#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's ibv_rc_pingpong on urdma, server and client as two processes on
# loopback: default, -e -n 20000 (CQ events; long enough to hit a lost wake-up), -s 1/4096/64 KiB/1 MiB, -n 10000, -c
# (data check); each without a GID (LID addressing) and with -g <index of the
# IPv4-mapped ::ffff:127.0.0.1 GID> (RoCE v2 addressing).
# Usage: rc_pingpong.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd ibv_rc_pingpong ibverbs-utils

PORT_BASE=${COMPAT_RC_PORT:-18600}
T=${COMPAT_RC_TIMEOUT:-25}     # per process, seconds

# GID index of ::ffff:127.0.0.1 (falls back to 1, the documented layout).
GID_IDX=$("$URDMA" devices 2>/dev/null |
          sed -nE 's/^[[:space:]]*\[[[:space:]]*([0-9]+)\][[:space:]]+::ffff:127\.0\.0\.1([[:space:]].*)?$/\1/p' |
          head -n 1)
if [ -z "$GID_IDX" ]; then
    log "note: no ::ffff:127.0.0.1 entry in 'urdma devices'; using GID index 1"
    GID_IDX=1
else
    log "GID index of ::ffff:127.0.0.1: $GID_IDX"
fi

# name | extra arguments (both sides)
CASES=(
    "default|"
    "events|-e -n 20000"
    "size1|-s 1"
    "size4096|-s 4096"
    "size65536|-s 65536 -n 500"
    "size1048576|-s 1048576 -n 100"
    "iters10000|-n 10000"
    "chk|-c"
)

port=$PORT_BASE
for gid in "" "-g $GID_IDX"; do
    for c in "${CASES[@]}"; do
        name="rc_pingpong ${c%%|*}${gid:+ $gid}"
        args="${c#*|}${gid:+ $gid}"
        budget_left "$name" || continue
        port=$(free_port "$port")
        log "== $name"
        run_pair "$name" "$T" "$port" \
            "$URDMA run ibv_rc_pingpong -p $port $args" \
            "$URDMA run ibv_rc_pingpong -p $port $args 127.0.0.1"
        if pair_result "$name" '[0-9]+ bytes in [0-9.]+ seconds'; then
            grep -E 'bytes in|iters in' "$PAIR_CLI_LOG" | sed 's/^/  | /'
        fi
        port=$((port + 1))
    done
done

finish
