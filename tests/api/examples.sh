#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The urdma API's example programs, run as a user would: the echo client
# against the epoll echo server and against the libuv one (one client, then
# 20 at once, each checking its own message came back), and the one-sided
# counter (two clients adding 100 each at once: the server's counter ends at
# 200, each client reads back the line it wrote on the board).
# Usage: examples.sh BUILD_DIR   (exit 0 pass, 1 fail)
# tests/net/api.sh sources it (EXAMPLES_SOURCED=1) and runs example_cases
# across two network namespaces.
HERE_EX=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# ex_server NAME PORT CMD...: start a server (bounded), wait for its port.
ex_server() {
    local name=$1 port=$2
    shift 2
    EX_SLOG=$WORK/$name.server.log
    log "RUN server: $(q "$@")"
    timeout -k 2 60 "$@" >"$EX_SLOG" 2>&1 &
    EX_SPID=$!
    COMPAT_BG_PIDS+=("$EX_SPID")
    wait_listen "$port" "$EX_SPID" 15
}

# ex_stop: stop the server with SIGTERM; true if it then exited 0.
ex_stop() {
    kill -TERM "$EX_SPID" 2>/dev/null
    wait "$EX_SPID"
}

# ex_clients N LOG CMD...: N copies of CMD at once, the i-th with its
# arguments' "%i" replaced by i; true if all exited 0.  Outputs in LOG.i.
ex_clients() {
    local n=$1 out=$2 i rc=0
    local -a pids=() cmd
    shift 2
    for i in $(seq "$n"); do
        cmd=("${@//%i/$i}")
        timeout -k 2 30 "${cmd[@]}" >"$out.$i" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
    return "$rc"
}

# example_cases HOST: the cases, servers run with $SRV_RUN in $PAIR_NETNS,
# clients with $CLI_RUN, reaching the server at HOST.
example_cases() {
    local host=$1 port name srv i why
    local -a srv_run cli_run
    read -r -a srv_run <<<"${SRV_RUN:-}"
    read -r -a cli_run <<<"${CLI_RUN:-}"
    port=$(free_port "${EXAMPLES_PORT:-19900}")
    for srv in urdma_echo_server urdma_echo_server_uv; do
        name="${CASE_PREFIX:-}echo, $srv"
        why=""
        if ! ex_server "$name" "$port" "${srv_run[@]}" "$BUILD/bin/$srv" "$port"; then
            why="the server did not listen on port $port"
        elif ! ex_clients 1 "$WORK/$srv.one" "${cli_run[@]}" \
                "$BUILD/bin/urdma_echo_client" "$host:$port" "hello across"; then
            why="the client failed"
        elif [ "$(cat "$WORK/$srv.one.1")" != "hello across" ]; then
            why="the client printed something else than its message"
        elif ! ex_clients 20 "$WORK/$srv.many" "${cli_run[@]}" \
                "$BUILD/bin/urdma_echo_client" "$host:$port" "message %i"; then
            why="one of 20 clients at once failed"
        else
            for i in $(seq 20); do
                [ "$(cat "$WORK/$srv.many.$i")" = "message $i" ] ||
                    why="client $i of 20 got something else back"
            done
        fi
        if ! ex_stop && [ -z "$why" ]; then why="the server did not stop cleanly"; fi
        if [ -z "$why" ]; then pass "$name: 1 client, then 20 at once"; else
            fail "$name" "$why"
            show_log "$EX_SLOG" "server output"
            for f in "$WORK/$srv".*; do show_log "$f" "client output $f"; done
        fi
        port=$((port + 1))
    done

    name="${CASE_PREFIX:-}counter: fetch-and-add, write, read"
    why=""
    if ! ex_server "$name" "$port" "${srv_run[@]}" "$BUILD/bin/urdma_counter" serve "$port"; then
        why="the server did not listen on port $port"
    elif ! ex_clients 2 "$WORK/counter" "${cli_run[@]}" \
            "$BUILD/bin/urdma_counter" "$host:$port" 100; then
        why="a client failed"
    else
        for i in 1 2; do
            grep -qE '^counter: [0-9]+ -> [0-9]+ after 100 fetch-and-adds$' "$WORK/counter.$i" &&
                grep -qE '^board: "process [0-9]+ was here"$' "$WORK/counter.$i" ||
                why="client $i printed something else"
        done
        sleep 0.5 # the server reports each client's close
        grep -q '^a client left: counter 200,' "$EX_SLOG" ||
            why="${why:+$why; }the server's counter did not reach 200"
    fi
    if ! ex_stop && [ -z "$why" ]; then why="the server did not stop cleanly"; fi
    if [ -z "$why" ]; then pass "$name: two clients, counter 200"; else
        fail "$name" "$why"
        show_log "$EX_SLOG" "server output"
        for f in "$WORK"/counter.[0-9]; do show_log "$f" "client output $f"; done
    fi
}

if [ -z "${EXAMPLES_SOURCED:-}" ]; then
    # shellcheck source-path=SCRIPTDIR source=../compat/common.sh
    . "$HERE_EX/../compat/common.sh"
    compat_init "${1:-}"
    example_cases 127.0.0.1
    finish
fi
