#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's ibv_rc_pingpong on urdma, server and client as two processes on
# loopback: default, -e -n 20000 (CQ events; long enough to hit a lost wake-up), -s 1/4096/64 KiB/1 MiB, -n 10000, -c
# (data check), and ibv_srq_pingpong (16 QPs on one SRQ; -e; 64 QPs);
# each without a GID (LID addressing) and with -g <index of the
# IPv4-mapped ::ffff:127.0.0.1 GID> (RoCE v2 addressing).
# Usage: rc_pingpong.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd ibv_rc_pingpong ibverbs-utils

PORT_BASE=${COMPAT_RC_PORT:-18600}
T=${COMPAT_RC_TIMEOUT:-25}     # per process, seconds

# GID index of ::ffff:127.0.0.1 (else 1: on one host, any of ours works).
GID_IDX=$("$URDMA" devices 2>/dev/null |
          sed -nE 's/^[[:space:]]*\[[[:space:]]*([0-9]+)\][[:space:]]+::ffff:127\.0\.0\.1([[:space:]].*)?$/\1/p' |
          head -n 1)
if [ -z "$GID_IDX" ]; then
    log "note: no ::ffff:127.0.0.1 entry in 'urdma devices'; using GID index 1"
    GID_IDX=1
else
    log "GID index of ::ffff:127.0.0.1: $GID_IDX"
fi

SRV_RUN="$URDMA run"
CLI_RUN="$URDMA run"
TARGET=127.0.0.1
CASE_PREFIX="rc_pingpong "
RESULT_RE=$RC_RESULT_RE
for gid in "" "-g $GID_IDX"; do
    SRV_ARGS=$gid
    CLI_ARGS=$gid
    CASE_SUFFIX=${gid:+ $gid}
    run_cases show_rc_rates \
        "default|ibv_rc_pingpong" \
        "events|ibv_rc_pingpong -e -n 20000" \
        "size1|ibv_rc_pingpong -s 1" \
        "size4096|ibv_rc_pingpong -s 4096" \
        "size65536|ibv_rc_pingpong -s 65536 -n 500" \
        "size1048576|ibv_rc_pingpong -s 1048576 -n 100" \
        "iters10000|ibv_rc_pingpong -n 10000" \
        "chk|ibv_rc_pingpong -c" \
        "srq|ibv_srq_pingpong" \
        "srq events|ibv_srq_pingpong -e -n 5000" \
        "srq 64 QPs|ibv_srq_pingpong -q 64 -r 200 -n 2000"
done
finish
