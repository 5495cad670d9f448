#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's perftest on urdma between two hosts: ib_{send,write,read}_{lat,bw},
# server in network namespace A, client in namespace B connecting to A's
# address over a veth pair, URDMA_TRANSPORT=tcp, -x <GID index of the side's
# own IPv4 address>; each with default parameters and with -a (all message
# sizes, -n 100).  Both sides must exit 0 and the client must print its
# results table.
# Usage: perftest.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip: not root)
# URDMA_NET_TRANSPORT=shm runs both sides in namespace A over shared memory (a
# check of this script itself).
COMPAT_BUDGET=${COMPAT_BUDGET:-140}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$HERE/netns.sh"
compat_init "${1:-}"
need_cmd ib_send_lat perftest
netns_setup_or_skip
net_hosts || exit 1
PAIR_NETNS=$SRV_NS

PORT_BASE=${NET_PERFTEST_PORT:-18700}
T=${NET_PERFTEST_TIMEOUT:-40}    # per process, seconds
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
        name="net $t (${v%%|*})"
        vargs=${v#*|}
        budget_left "$name" || continue
        port=$(free_port "$port")
        log "== $name"
        run_pair "$name" "$T" "$port" \
            "$SRV_RUN $t -d $DEV -p $port -F -x $SRV_GID $vargs" \
            "$CLI_RUN $t -d $DEV -p $port -F -x $CLI_GID $vargs $SRV_IP"
        if pair_result "$name" '#bytes' has_table; then
            awk '/#bytes/ { hdr = 1 } hdr' "$PAIR_CLI_LOG" | grep -vE '^-+$' | head -n 30 | sed 's/^/  | /'
        fi
        port=$((port + 1))
    done
done

finish
