#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# UCX (Debian's ucx-utils 1.13) on urdma, server and client on loopback:
# `ucx_info -d` lists urdma0:1 with rc_verbs and ud_verbs (through the
# device view `urdma run` preloads) and no mlx5 transport; ucx_perftest
# over UCT rc_verbs (am_lat, put_bw and get with zero copy) and ud_verbs
# (am_lat, am_bw), and over UCP with UCX_TLS=rc_verbs,ud_verbs (tag_lat,
# tag_bw, ucp_put_bw, ucp_get) and ud_verbs alone (tag_bw).
# Usage: ucx.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
COMPAT_BUDGET=${COMPAT_BUDGET:-150}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd ucx_info ucx-utils
need_cmd ucx_perftest ucx-utils

PORT=${COMPAT_UCX_PORT:-18990}
T=${COMPAT_UCX_TIMEOUT:-40}     # per process, seconds
UCX_RE='^Final: +[0-9]+ '
show_final() { grep -E "$UCX_RE" "$1" | sed 's/^/  | /'; }

# ucx_info -d: urdma0's memory domain with both verbs transports on its
# port, and none of the mlx5 ones.
name="ucx_info -d lists urdma0 with rc_verbs and ud_verbs"
log "== $name"
run_check "$name" "$T" "$URDMA" run ucx_info -d
sect=$(sed -n '/Memory domain: urdma0/,/^# Memory domain: [^u]/p' "$CHECK_LOG")
if [ "$CHECK_RC" -ne 0 ]; then
    fail "$name" "ucx_info exit status $CHECK_RC"
elif ! grep -q 'Transport: rc_verbs' <<<"$sect" || ! grep -q 'Transport: ud_verbs' <<<"$sect" ||
     ! grep -q 'Device: urdma0:1' <<<"$sect"; then
    fail "$name" "no urdma0 with rc_verbs and ud_verbs on urdma0:1"
    show_log "$CHECK_LOG" "ucx_info output"
elif grep -qE 'Transport: (rc|dc|ud)_mlx5' "$CHECK_LOG"; then
    fail "$name" "an mlx5 transport is listed"
else
    pass "$name"
    grep -E 'Memory domain: urdma0|Transport: (rc|ud)_verbs|Device: urdma0' "$CHECK_LOG" | sed 's/^/  | /'
fi

# ucx_perftest: NAME|ENV|SERVER ARGS|CLIENT ARGS
for c in \
    "uct rc_verbs am_lat||-d urdma0:1 -x rc_verbs|-t am_lat -n 20000" \
    "uct rc_verbs put_bw 64 KiB zcopy||-d urdma0:1 -x rc_verbs|-t put_bw -D zcopy -s 65536 -n 2000" \
    "uct rc_verbs get 64 KiB zcopy||-d urdma0:1 -x rc_verbs|-t get -D zcopy -s 65536 -n 2000" \
    "uct ud_verbs am_lat||-d urdma0:1 -x ud_verbs|-t am_lat -n 20000" \
    "uct ud_verbs am_bw 1 KiB bcopy||-d urdma0:1 -x ud_verbs|-t am_bw -D bcopy -s 1024 -n 20000" \
    "ucp tag_lat (rc_verbs)|UCX_TLS=rc_verbs,ud_verbs,self||-t tag_lat -n 20000" \
    "ucp tag_bw 1 MiB (rc_verbs)|UCX_TLS=rc_verbs,ud_verbs,self||-t tag_bw -s 1048576 -n 500" \
    "ucp ucp_put_bw 1 MiB (rc_verbs)|UCX_TLS=rc_verbs,ud_verbs,self||-t ucp_put_bw -s 1048576 -n 500" \
    "ucp ucp_get 64 KiB (rc_verbs)|UCX_TLS=rc_verbs,ud_verbs,self||-t ucp_get -s 65536 -n 2000" \
    "ucp tag_bw 64 KiB (ud_verbs)|UCX_TLS=ud_verbs,self||-t tag_bw -s 65536 -n 2000"; do
    IFS='|' read -r name env sargs cargs <<<"$c"
    budget_left "$name" || continue
    PORT=$(free_port "$PORT")
    log "== $name"
    run_pair "$name" "$T" "$PORT" \
        "env UCX_NET_DEVICES=urdma0:1 $env $URDMA run ucx_perftest -p $PORT $sargs" \
        "env UCX_NET_DEVICES=urdma0:1 $env $URDMA run ucx_perftest -p $PORT $sargs $cargs 127.0.0.1"
    pair_result "$name" "$UCX_RE" && show_final "$PAIR_CLI_LOG"
    PORT=$((PORT + 1))
done
finish
