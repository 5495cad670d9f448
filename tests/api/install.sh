#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What `make install` gives a user of the urdma API: install the build into
# a temporary prefix, build examples/echo_client.c with nothing but
# `pkg-config urdma`, run it (under the installed `urdma run`) against the
# build's echo server; the man pages, one per call, without warnings, and
# urdma(7)'s example as in examples/.
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
need_cmd man man-db

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

# The man pages: one per exported call, urdma(7), all clean for man(1).
MANDIR=$(dirname "$(dirname "$(find "$PREFIX" -name urdma.7 | head -n 1)")")
missing="" warned=""
names=$(sed -n 's/^[[:space:]]*\(urdma_[a-z_]*\);$/\1/p' "$SRC/src/api/liburdma.map")
for name in $names; do
    [ -f "$MANDIR/man3/$name.3" ] || missing="$missing $name"
done
for page in "7 urdma" $(for n in $names; do echo "3:$n"; done); do
    page=${page/:/ }
    # shellcheck disable=SC2086 # "SECTION NAME"
    out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -M "$MANDIR" -Tutf8 -Z $page 2>&1 >/dev/null)
    [ -z "$out" ] || warned="$warned [$page: $(head -c 200 <<<"$out")]"
done
if [ -z "$names" ] || [ ! -d "$MANDIR/man3" ]; then
    fail "man pages" "none installed, or no names in liburdma.map"
elif [ -n "$missing$warned" ]; then
    fail "man pages" "missing:${missing:- none}; warnings:${warned:- none}"
else
    pass "a man page for each of the $(wc -w <<<"$names") calls, and urdma(7), without warnings"
fi
# urdma(7) shows examples/echo_client.c as it is, and names every call
ex=$(awk '/^\.EX$/ { on = 1; next } /^\.EE$/ { if (found) exit; on = 0 }
    on && $0 == "/*" { found = 1 } found' "$MANDIR/man7/urdma.7" |
    sed 's/\\e/\\/g; s/\\-/-/g')
src=$(sed '1d' "$SRC/examples/echo_client.c" | expand -t 4)
unnamed=""
for name in $names; do
    grep -q "$name" "$MANDIR/man7/urdma.7" || unnamed="$unnamed $name"
done
readme=$(awk '/^```c$/ { on = 1; next } /^```$/ { if (found) exit; on = 0 }
    on && $0 == "/*" { found = 1 } found' "$SRC/README.md" | expand -t 4)
if [ "$ex" = "$src" ] && [ "$readme" = "$src" ] && [ -z "$unnamed" ]; then
    pass "urdma(7) and the README: the echo client as in examples/; every call named"
else
    fail "urdma(7)" "the example differs from examples/echo_client.c in urdma(7): $([ "$ex" = "$src" ] && echo no || echo yes), in the README: $([ "$readme" = "$src" ] && echo no || echo yes); calls not named in urdma(7):${unnamed:- none}"
    diff <(echo "$ex") <(echo "$src") | head -20 >&2
    diff <(echo "$readme") <(echo "$src") | head -20 >&2
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
