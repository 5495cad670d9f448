#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's rdmacm-utils and perftest unmodified on urdma's librdmacm.so.1
# (`urdma run`), server and client on one host: rping -v -V -C 100 with
# sizes 23 (its minimum), 64, 4096 and 65535 (its maximum); ucmatose and
# udaddy (UD, RDMA_PS_UDP), udpong (datagram rsockets), also
# with 4 connections and 4 KiB messages; rdma_server/rdma_client; cmtime with
# 50 connections; perftest ib_send_bw -R, ib_write_lat -R, ib_read_bw -R.
# All on 127.0.0.1, then a subset on the host's own address (its first global
# IPv4 address, if it has one).  Faults: the rping server killed with SIGKILL
# mid-run (the client must report it and exit), rping to a port nobody
# listens on (RDMA_CM_EVENT_UNREACHABLE with -111, ECONNREFUSED, promptly).
# Usage: clients.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=cases.sh
. "$HERE/cases.sh"
COMPAT_BUDGET=${COMPAT_BUDGET:-150}
compat_init "${1:-}"
for c in rping ucmatose udaddy udpong mckey rdma_server rdma_client cmtime; do need_cmd "$c" rdmacm-utils; done
for c in ib_send_bw ib_write_lat ib_read_bw; do need_cmd "$c" perftest; done
if [ ! -e "$BUILD/lib/librdmacm.so.1" ]; then
    log "FAIL: $BUILD/lib/librdmacm.so.1 not built"
    exit 1
fi

CASE_PORT=${RDMACM_CLIENTS_PORT:-19700}
T=${RDMACM_CLIENTS_TIMEOUT:-40}    # per process, seconds
SRV_RUN="$URDMA run"
CLI_RUN="$URDMA run"

CASE_SUFFIX=" (127.0.0.1)"
cm_all_cases 127.0.0.1
cm_fault_killed 127.0.0.1
cm_fault_unreachable 127.0.0.1

HOST_IP=$(ip -4 -o addr show scope global 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4; exit }')
if [ -n "$HOST_IP" ]; then
    CASE_SUFFIX=" ($HOST_IP)"
    cm_cases "$HOST_IP" \
        "rping 4096 B x 100|rping:100:4096" \
        "ucmatose 4 connections|ucmatose:-c 4" \
        "rdma_server/rdma_client|rdma_cs" \
        "cmtime 20 connections|cmtime:20" \
        "ib_write_lat -R|perftest:ib_write_lat"
    cm_fault_unreachable "$HOST_IP"
else
    log "note: no global IPv4 address on this host; only 127.0.0.1 was tested"
fi
finish
