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
DEV=${COMPAT_DEVICE:-urdma0}

# has_table LOG: a line starting with a number follows the "#bytes" header.
# shellcheck disable=SC2317  # called indirectly by pair_result
has_table() {
    awk '/#bytes/ { hdr = 1; next }
         hdr && /^[[:space:]]*[0-9]+[[:space:]]+[0-9]+/ { found = 1 }
         END { exit !found }' "$1"
}

TESTS=(ib_send_lat ib_send_bw ib_write_lat ib_write_bw ib_read_lat ib_read_bw)
# -F: do not fail on differing per-core "cpu MHz" values (VMs).
VARIANTS=("defaults|" "all sizes|-a -n 100")

port=$PORT_BASE
for t in "${TESTS[@]}"; do
    need_cmd "$t" perftest
    for v in "${VARIANTS[@]}"; do
        vname=${v%%|*}
        vargs=${v#*|}
        name="$t ($vname)"
        budget_left "$name" || continue
        port=$(free_port "$port")
        log "== $name"
        run_pair "$name" "$T" "$port" \
            "$URDMA run $t -d $DEV -p $port -F $vargs" \
            "$URDMA run $t -d $DEV -p $port -F $vargs 127.0.0.1"
        if pair_result "$name" '#bytes' has_table; then
            awk '/#bytes/ { hdr = 1 } hdr' "$PAIR_CLI_LOG" | grep -vE '^-+$' | head -n 30 | sed 's/^/  | /'
        fi
        port=$((port + 1))
    done
done

finish
