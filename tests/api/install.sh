#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What `make install` gives a user of the urdma API: install the build into
# a temporary prefix, build examples/echo_client.c with nothing but
# `pkg-config urdma`, run it (under the installed `urdma run`) against the
# build's echo server.
# Usage: install.sh BUILD_DIR   (exit 0 pass, 1 fail)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
EXAMPLES_SOURCED=1
# shellcheck source-path=SCRIPTDIR source=examples.sh
. "$HERE/examples.sh"
compat_init "${1:-}"
need_cmd pkg-config pkg-config

PREFIX=$WORK/prefix
run_check install 120 cmake --install "$BUILD" --prefix "$PREFIX"
if [ "$CHECK_RC" -ne 0 ]; then
    fail "cmake --install" "exit status $CHECK_RC"
    show_log "$CHECK_LOG"
    finish
fi
pass "cmake --install into a fresh prefix"

PCDIR=$(dirname "$(find "$PREFIX" -name urdma.pc | head -n 1)")
export PKG_CONFIG_PATH=$PCDIR
flags=$(pkg-config --cflags --libs urdma)
read -r -a flagv <<<"${flags:-}"
if [ -n "${flags:-}" ] &&
    run_check build-client 60 cc -std=c11 -Wall -Werror -o "$WORK/echo_client" \
        "$SRC/examples/echo_client.c" "${flagv[@]}" && [ "$CHECK_RC" -eq 0 ]; then
    pass "cc examples/echo_client.c \$(pkg-config --cflags --libs urdma)"
else
    fail "building against the installed urdma.pc" "flags '${flags:-}'"
    show_log "${CHECK_LOG:-/dev/null}"
fi
if pkg-config --exists urdma-verbs; then pass "urdma-verbs.pc installed"; else
    fail "urdma-verbs.pc" "not found in $PCDIR"
fi

port=$(free_port 19950)
why=""
if [ ! -x "$WORK/echo_client" ]; then
    why="no client built"
elif ! ex_server "installed client" "$port" "$BUILD/bin/urdma_echo_server" "$port"; then
    why="the build's echo server did not listen on port $port"
else
    run_check "installed client" 30 "$PREFIX/bin/urdma" run -- "$WORK/echo_client" \
        "127.0.0.1:$port" installed
    [ "$CHECK_RC" -eq 0 ] && [ "$(cat "$CHECK_LOG")" = installed ] ||
        why="client exit status $CHECK_RC, output: $(head -c 200 "$CHECK_LOG")"
    ex_stop
fi
if [ -z "$why" ]; then pass "the installed client echoes through the build's server"; else
    fail "the installed client" "$why"
fi

finish
