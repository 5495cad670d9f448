#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# libfabric's verbs provider on urdma (Debian's libfabric-bin): fi_pingpong
# with a verbs MSG endpoint and with an RxM RDM endpoint over verbs
# ("verbs;ofi_rxm"), every message size, the data checked (-c), server and
# client as two processes on loopback, over shared memory and over TCP.
# Usage: libfabric.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
COMPAT_BUDGET=${COMPAT_BUDGET:-150}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd fi_pingpong libfabric-bin

PORT=${COMPAT_FI_PORT:-18950}
T=${COMPAT_FI_TIMEOUT:-40}     # per process, seconds
# The last line of fi_pingpong's table: 1 MiB, every iteration acknowledged.
FI_RESULT_RE='^1m +200 +=200 '
show_fi_table() { grep -E '^(bytes|[0-9]+[kmg]? )' "$1" | sed 's/^/  | /'; }

for tr in shm tcp; do
    for ep in "msg|verbs" "rdm|verbs;ofi_rxm"; do
        name="fi_pingpong $tr ${ep%%|*}"
        budget_left "$name" || continue
        PORT=$(free_port "$PORT")
        log "== $name"
        run_pair "$name" "$T" "$PORT" \
            "env URDMA_TRANSPORT=$tr $URDMA run fi_pingpong -p ${ep#*|} -e ${ep%%|*} -I 200 -c -B $PORT" \
            "env URDMA_TRANSPORT=$tr $URDMA run fi_pingpong -p ${ep#*|} -e ${ep%%|*} -I 200 -c -P $PORT 127.0.0.1"
        pair_result "$name" "$FI_RESULT_RE" && show_fi_table "$PAIR_CLI_LOG"
        PORT=$((PORT + 1))
    done
done
finish
