#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The urdma tool itself: help, version, exit codes, `urdma run` environment.
# Usage: tool.sh BUILD_DIR     (exit 0 pass, 1 fail)
# shellcheck disable=SC2016  # the single-quoted $LD_LIBRARY_PATH is for sh -c
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"

expect_rc() {  # NAME WANT_RC CMD...
    local name=$1 want=$2
    shift 2
    run_check "$name" 10 "$@"
    if [ "$CHECK_RC" -eq "$want" ]; then
        pass "$name (exit $want)"
    else
        fail "$name" "exit status $CHECK_RC, expected $want"
        show_log "$CHECK_LOG"
    fi
}

expect_rc "urdma --help" 0 "$URDMA" --help
for v in URDMA_LOG_LEVEL URDMA_LOG_FILE URDMA_LIBDIR 'run' 'devices'; do
    if grep -q -- "$v" "$CHECK_LOG"; then pass "--help mentions $v"; else fail "--help mentions $v"; fi
done
expect_rc "urdma help" 0 "$URDMA" help
expect_rc "urdma --version" 0 "$URDMA" --version
if grep -qE '^urdma [0-9]+\.[0-9]+' "$CHECK_LOG"; then
    pass "--version prints 'urdma X.Y'"
else
    fail "--version prints 'urdma X.Y'"
    show_log "$CHECK_LOG"
fi
expect_rc "urdma (no arguments)" 2 "$URDMA"
expect_rc "urdma bogus-command" 2 "$URDMA" bogus-command
expect_rc "urdma run (no program)" 2 "$URDMA" run
expect_rc "urdma run missing program" 127 "$URDMA" run urdma-no-such-program-xyz
expect_rc "urdma run propagates exit status" 3 "$URDMA" run sh -c 'exit 3'

# LD_LIBRARY_PATH: urdma's library directory first, the old value kept.
run_check "urdma run LD_LIBRARY_PATH" 10 env LD_LIBRARY_PATH=/old/dir "$URDMA" run -- sh -c 'printf "%s\n" "$LD_LIBRARY_PATH"'
first=$(head -n 1 "$CHECK_LOG" | cut -d: -f1)
if [ "$CHECK_RC" -eq 0 ] && [ -f "$first/libibverbs.so.1" ] &&
   [ "$(cd "$first" && pwd -P)" = "$(cd "$BUILD/lib" && pwd -P)" ] &&
   head -n 1 "$CHECK_LOG" | grep -q ':/old/dir$'; then
    pass "urdma run sets LD_LIBRARY_PATH=$(head -n 1 "$CHECK_LOG")"
else
    fail "urdma run sets LD_LIBRARY_PATH" "got '$(head -n 1 "$CHECK_LOG")', status $CHECK_RC"
fi

# URDMA_LIBDIR overrides; a directory without the library is an error.
run_check "URDMA_LIBDIR override" 10 env URDMA_LIBDIR="$BUILD/lib" LD_LIBRARY_PATH= "$URDMA" run sh -c 'printf "%s\n" "$LD_LIBRARY_PATH"'
if [ "$CHECK_RC" -eq 0 ] && [ "$(head -n 1 "$CHECK_LOG")" = "$(cd "$BUILD/lib" && pwd -P)" ]; then
    pass "URDMA_LIBDIR override"
else
    fail "URDMA_LIBDIR override" "got '$(head -n 1 "$CHECK_LOG")', status $CHECK_RC"
fi
run_check "URDMA_LIBDIR without the library" 10 env URDMA_LIBDIR="$WORK" "$URDMA" run true
if [ "$CHECK_RC" -ne 0 ] && grep -q 'libibverbs.so.1' "$CHECK_LOG"; then
    pass "URDMA_LIBDIR without the library is an error (exit $CHECK_RC)"
else
    fail "URDMA_LIBDIR without the library is an error" "status $CHECK_RC"
    show_log "$CHECK_LOG"
fi

finish
