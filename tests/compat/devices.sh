#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Debian's ibverbs-utils device tools on urdma:
#   ibv_devices lists urdma0; ibv_devinfo (-v) shows an active Ethernet port
#   with active_mtu 4096; ibv_asyncwatch starts and keeps waiting for events.
# Usage: devices.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd ibv_devices ibverbs-utils
need_cmd ibv_devinfo ibverbs-utils
need_cmd ibv_asyncwatch ibverbs-utils

# 0. urdma's own listing (linked directly against urdma's library).
run_check urdma_devices 20 "$URDMA" devices
if [ "$CHECK_RC" -eq 0 ] && grep -q '^urdma0$' "$CHECK_LOG"; then
    pass "urdma devices lists urdma0"
    sed 's/^/  | /' "$CHECK_LOG"
else
    fail "urdma devices lists urdma0" "exit status $CHECK_RC"
    show_log "$CHECK_LOG"
fi

# 1. ibv_devices
run_check ibv_devices 20 "$URDMA" run ibv_devices
if [ "$CHECK_RC" -eq 0 ] && grep -qE '^[[:space:]]*urdma0[[:space:]]' "$CHECK_LOG"; then
    pass "ibv_devices lists urdma0"
else
    fail "ibv_devices lists urdma0" "exit status $CHECK_RC"
    show_log "$CHECK_LOG"
fi

# 2. ibv_devinfo (short and verbose)
run_check ibv_devinfo 20 "$URDMA" run ibv_devinfo
if [ "$CHECK_RC" -eq 0 ] && grep -qE 'hca_id:[[:space:]]*urdma0' "$CHECK_LOG"; then
    pass "ibv_devinfo"
else
    fail "ibv_devinfo" "exit status $CHECK_RC"
    show_log "$CHECK_LOG"
fi

run_check ibv_devinfo_v 20 "$URDMA" run ibv_devinfo -v
if [ "$CHECK_RC" -ne 0 ]; then
    fail "ibv_devinfo -v" "exit status $CHECK_RC"
    show_log "$CHECK_LOG"
else
    pass "ibv_devinfo -v exits 0"
    for pat in 'hca_id:[[:space:]]*urdma0' 'state:[[:space:]]*PORT_ACTIVE' \
               'active_mtu:[[:space:]]*4096' 'link_layer:[[:space:]]*Ethernet'; do
        if grep -qE "$pat" "$CHECK_LOG"; then
            pass "ibv_devinfo -v shows /$pat/"
        else
            fail "ibv_devinfo -v shows /$pat/" "not in output"
            show_log "$CHECK_LOG"
        fi
    done
fi

# 3. ibv_asyncwatch must start and block waiting for async events.
log "RUN: $(q "$URDMA" run ibv_asyncwatch) (expect it to keep running)"
AW_LOG=$WORK/asyncwatch.log
timeout -k 2 20 "$URDMA" run ibv_asyncwatch >"$AW_LOG" 2>&1 &
AW_PID=$!
COMPAT_BG_PIDS+=("$AW_PID")
sleep 1
if kill -0 "$AW_PID" 2>/dev/null; then
    kill -TERM "$AW_PID" 2>/dev/null
    wait "$AW_PID" 2>/dev/null
    pass "ibv_asyncwatch still waiting after 1 s"
    sed 's/^/  | /' "$AW_LOG"
else
    wait "$AW_PID"
    fail "ibv_asyncwatch still waiting after 1 s" "exited early with status $?"
    show_log "$AW_LOG"
fi

finish
