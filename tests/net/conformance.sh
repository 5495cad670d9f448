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

# The transport's own decision that an application spins on memory (its
# debug log): taken for a target that received a Send and spun while the
# Write behind it came, never for one that only paused with nothing coming
# (that decision makes each later round trip unpark: two system calls).
spins_decisions() {  # CASE: the decisions logged while conf_one_sided runs it
    local f=$WORK/spins.$1.log
    run_check "spins.$1" "$T" env URDMA_TRANSPORT="$TRANSPORT" \
        URDMA_LOG_LEVEL=debug URDMA_LOG_FILE="$f" "$BUILD/bin/conf_one_sided" "$1"
    SPINS_N=$(grep -c 'the application spins on memory' "$f" 2>/dev/null)
    [ "$CHECK_RC" -eq 0 ] || SPINS_N=error
}
if [ "$TRANSPORT" = tcp ] && budget_left "spins decisions"; then
    spins_decisions rdma_write_target_received_then_spins
    yes=$SPINS_N
    spins_decisions rdma_write_target_received_paused_then_spins
    no=$SPINS_N
    if [ "$yes" != error ] && [ "$yes" -ge 1 ] && [ "$no" = 0 ]; then
        pass "spins decisions ($yes when spinning, $no when paused)"
    else
        fail "spins decisions" "$yes when spinning (want >= 1), $no when paused (want 0)"
    fi
fi

finish
