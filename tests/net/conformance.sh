#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The verbs conformance suite (every $BUILD/bin/conf_* binary; each forks both
# sides itself) with URDMA_TRANSPORT=tcp, on this host over loopback.
# Usage: conformance.sh BUILD_DIR     (exit 0 if every binary passes)
# URDMA_NET_TRANSPORT overrides the transport.
COMPAT_BUDGET=${COMPAT_BUDGET:-540}   # seconds, for all binaries
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
compat_init "${1:-}"

TRANSPORT=${URDMA_NET_TRANSPORT:-tcp}
T=${NET_CONF_TIMEOUT:-120}    # per binary, seconds (as in tests/conformance)

shopt -s nullglob
bins=("$BUILD"/bin/conf_*)
if [ ${#bins[@]} -eq 0 ]; then
    log "FAIL: no conformance binaries in $BUILD/bin (build the conf_* targets)"
    exit 1
fi
for bin in "${bins[@]}"; do
    name="${bin##*/} (URDMA_TRANSPORT=$TRANSPORT)"
    budget_left "$name" || continue
    run_check "$name" "$T" env URDMA_TRANSPORT="$TRANSPORT" "$bin"
    case $CHECK_RC in
        0) pass "$name" ;;
        77) log "SKIP: $name"; show_log "$CHECK_LOG" ;;
        *) fail "$name" "exit status $CHECK_RC"; show_log "$CHECK_LOG" ;;
    esac
done

finish
