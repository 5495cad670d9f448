# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Debian's rdmacm-utils and perftest (-R) clients on urdma's librdmacm.so.1:
# the cases and their checks, shared by tests/rdmacm/clients.sh (one host) and
# tests/net/rdmacm.sh (two network namespaces).  Sourced after
# tests/compat/common.sh and compat_init; the caller sets SRV_RUN and CLI_RUN
# (command prefixes, as for run_pair), PAIR_NETNS (the server's namespace or
# empty), CASE_PORT (the first port to try) and T (seconds per process).
#
#   cm_cases ADDR CASE...   one server/client pair per CASE, "name|kind"; the
#                           client reaches the server at ADDR (see cm_case)
#   cm_fault_killed ADDR    rping: the server SIGKILLed mid-run
#   cm_fault_unreachable ADDR   rping to a port nobody listens on
#
# Each case passes when both sides exit 0 and their output shows the work was
# done (ping data on both sides, "test complete", result tables...).

# The CM port is a TCP port: one still in TIME_WAIT from the previous case
# can't be bound again, so a free port is one no TCP socket uses at all.
cm_free_port() {
    local p=$1
    local -a ns=()
    [ -n "${PAIR_NETNS:-}" ] && ns=(ip netns exec "$PAIR_NETNS")
    while "${ns[@]}" ss -Htuan "sport = :$p" 2>/dev/null | grep -q . ||
          ss -Htuan "sport = :$p" 2>/dev/null | grep -q .; do
        p=$((p + 1))
    done
    printf '%s\n' "$p"
}

# ---- checks (of the client log $1; the server's is $PAIR_SRV_LOG) ----------

# rping -v -V -C N -S SIZE: N lines "ping data: rdma-ping-I: ..." of SIZE - 1
# characters after the label on the client (-V: it compared them with what it
# sent), N lines "server ping data: ..." on the server.
# shellcheck disable=SC2317  # called through CM_CHECK
rping_ok() {
    local cli=$1 n ns len
    n=$(awk -v want=$((RPING_SIZE + 10)) '/^ping data: rdma-ping-[0-9]+: / && length($0) == want { c++ }
            END { print c + 0 }' "$cli")
    ns=$(grep -c '^server ping data: rdma-ping-' "$PAIR_SRV_LOG")
    if [ "$n" -ne "$RPING_COUNT" ] || [ "$ns" -ne "$RPING_COUNT" ]; then
        len=$(awk '/^ping data/ { print length($0); exit }' "$cli")
        log "  client printed $n ping lines of $((RPING_SIZE + 10)) characters (first: ${len:-none})," \
            "server $ns, expected $RPING_COUNT"
        return 1
    fi
    if grep -q 'data mismatch' "$cli"; then
        log "  rping -V found a data mismatch"
        return 1
    fi
}
show_rping() {
    grep -m 1 '^ping data' "$1" | cut -c 1-90 | sed 's/^/  | /'
    grep '^ping data' "$1" | tail -n 1 | cut -c 1-90 | sed 's/^/  | /'
}

# shellcheck disable=SC2317
ucmatose_ok() {
    grep -q '^test complete' "$1" && grep -q '^return status 0' "$1" &&
        grep -q '^test complete' "$PAIR_SRV_LOG" && grep -q '^return status 0' "$PAIR_SRV_LOG"
}
show_ucmatose() { grep -E 'complete|status' "$1" | sed 's/^/  | /'; }

# shellcheck disable=SC2317
rdma_cs_ok() { grep -q 'rdma_client: end 0' "$1" && grep -q 'rdma_server: end 0' "$PAIR_SRV_LOG"; }
show_rdma_cs() { sed 's/^/  | /' "$1"; }

# cmtime prints one row per step: name ":" total ms, max ms, min us, us/conn.
CMTIME_STEPS=("create id" "resolve addr" "resolve route" "create qp" "connect" "disconnect" "destroy")
# shellcheck disable=SC2317
cmtime_ok() {
    local s
    for s in "${CMTIME_STEPS[@]}"; do
        grep -qE "^$s *: +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+\$" "$1" || { log "  no '$s' row"; return 1; }
    done
}
show_cmtime() { grep -E '^(step|[a-z ]+ *:)' "$1" | sed 's/^/  | /'; }

# rstream prints one row per test: name bytes xfers iters total time Gb/sec
# usec/xfer; errors of calls are perror lines (it may still exit 0).
RSTREAM_ROW_RE='[0-9.]+s +[0-9.]+ +[0-9.]+$'
# shellcheck disable=SC2317
rstream_ok() {
    local n
    n=$(grep -cE "$RSTREAM_ROW_RE" "$1")
    if [ "$n" -ne "$RSTREAM_ROWS" ]; then
        log "  $n result rows, expected $RSTREAM_ROWS"
        return 1
    fi
    if grep -qE '^(rpoll|rsend|rrecv|rconnect|raccept|rbind|rlisten|rsocket|async rconnect)|verification failed' \
            "$1" "$PAIR_SRV_LOG"; then
        log "  an error was reported"
        return 1
    fi
}
show_rstream() { grep -E "$RSTREAM_ROW_RE" "$1" | sed 's/^/  | /'; }

# udpong (datagram rsockets) prints rows as rstream's: name bytes xfers total
# time Gb/sec usec/xfer, xfers being what the server counted; errors are
# perror lines.  Every row must have moved something.  Only its bandwidth
# runs (-S and -C without -T e) are cases: its echo loop waits 1 ms for an
# answer and then sends again, and once a late answer arrives (a 1 ms
# hiccup: this 2-core machine has a few per 100,000 round trips, over
# kernel UDP too) it keeps that answer's sequence number in the message it
# sends again, so it waits for ever for a number the server never echoes.
# shellcheck disable=SC2317
udpong_ok() {
    rstream_ok "$1" || return 1
    if grep -E "$RSTREAM_ROW_RE" "$1" | awk '$3 == "0" { bad = 1 } END { exit !bad }'; then
        log "  a test moved no datagram"
        return 1
    fi
    if grep -qE '^(rsocket failed|rsend|rrecv|rbind)' "$PAIR_SRV_LOG"; then
        log "  the server reported an error"
        return 1
    fi
}

# ---- pairs -----------------------------------------------------------------

# cm_pair NAME SERVER CLIENT STAYS: like run_pair (same variables set), but
# the client is never started again (perftest's client would then meet a
# server that waits for its second connection), and with STAYS=1 the server
# (cmtime's, which runs until stopped) is stopped once the client is done: it
# must still be running then.
cm_pair() {
    local name=$1 srv_s=$2 cli_s=$3 stays=$4
    local -a srv cli
    local spid base i=0
    read -r -a srv <<<"$srv_s"
    read -r -a cli <<<"$cli_s"
    base=$WORK/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_')
    PAIR_SRV_LOG=$base.server.log
    PAIR_CLI_LOG=$base.client.log
    PAIR_SRV_RC=-1
    PAIR_CLI_RC=-1
    PAIR_SECS=""
    PAIR_T0=${EPOCHREALTIME:-$SECONDS}
    log "RUN server: $(q "${srv[@]}")"
    timeout -k 2 "$T" "${srv[@]}" >"$PAIR_SRV_LOG" 2>"$PAIR_SRV_LOG.err" &
    spid=$!
    COMPAT_BG_PIDS+=("$spid")
    if [ "${CM_PORT:-}" = none ]; then
        sleep 0.5 # (no port to wait for: it joins a group at once)
    elif ! wait_listen "${CM_PORT:-$CASE_PORT}" "$spid" 15; then
        log "  server did not listen on port ${CM_PORT:-$CASE_PORT}"
        kill -TERM "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        PAIR_SRV_RC=$?
        cm_join_err "$PAIR_SRV_LOG"
        return 0
    fi
    log "RUN client: $(q "${cli[@]}")"
    # (In a group with stderr to /dev/null: the shell reports nothing itself
    # when the client dies of a signal; we do.)
    { timeout -k 2 "$T" "${cli[@]}" >"$PAIR_CLI_LOG" 2>"$PAIR_CLI_LOG.err"; } 2>/dev/null
    PAIR_CLI_RC=$?
    if [ "$PAIR_CLI_RC" -gt 128 ] && [ "$PAIR_CLI_RC" -lt 160 ]; then
        log "  the client died of signal $((PAIR_CLI_RC - 128)) ($(kill -l $((PAIR_CLI_RC - 128)) 2>/dev/null))"
    fi
    if [ "$stays" = 1 ]; then
        if kill -0 "$spid" 2>/dev/null; then
            kill -TERM "$spid" 2>/dev/null
            wait "$spid" 2>/dev/null
            PAIR_SRV_RC=0
        else
            wait "$spid"
            PAIR_SRV_RC=$?
            log "  the server exited (status $PAIR_SRV_RC) before it was stopped"
            [ "$PAIR_SRV_RC" -eq 0 ] && PAIR_SRV_RC=1
        fi
    else
        if [ "$PAIR_CLI_RC" -ne 0 ]; then
            # The client failed: give the server a moment (none if it waits
            # for the connection perftest's race lost), then stop it.
            grep -q "$PERFTEST_RACE_RE" "$PAIR_CLI_LOG" && i=40
            while kill -0 "$spid" 2>/dev/null && [ "$i" -lt 40 ]; do sleep 0.05; i=$((i + 1)); done
            kill -0 "$spid" 2>/dev/null && kill -TERM "$spid" 2>/dev/null
        fi
        { wait "$spid"; } 2>/dev/null
        PAIR_SRV_RC=$?
        if [ "$PAIR_SRV_RC" -gt 128 ] && [ "$PAIR_SRV_RC" -lt 160 ] && [ "$PAIR_CLI_RC" -eq 0 ]; then
            log "  the server died of signal $((PAIR_SRV_RC - 128)) ($(kill -l $((PAIR_SRV_RC - 128)) 2>/dev/null))"
        fi
        [ "$PAIR_SRV_RC" -eq 124 ] && log "  server timed out after ${T}s"
    fi
    PAIR_SECS=$(awk -v a="$PAIR_T0" -v b="${EPOCHREALTIME:-$SECONDS}" 'BEGIN { printf "%.1f", b - a }')
    [ "$PAIR_CLI_RC" -eq 124 ] && log "  client timed out after ${T}s"
    cm_join_err "$PAIR_SRV_LOG"
    cm_join_err "$PAIR_CLI_LOG"
    return 0
}

# cm_join_err LOG: append LOG.err (the program's stderr, kept apart so that
# its messages don't land inside rping's long lines of stdout) to LOG.
cm_join_err() {
    if [ -s "$1.err" ]; then
        printf -- '--- stderr ---\n' >>"$1"
        cat "$1.err" >>"$1"
    fi
    rm -f "$1.err"
}

# cm_show_log FILE LABEL: show_log with long lines (rping's) cut.
cm_show_log() {
    log "  --- $2 (last 25 lines) ---"
    tail -n 25 "$1" 2>/dev/null | cut -c 1-160 | sed 's/^/  | /'
}

# cm_result NAME PATTERN CHECKFN: pair_result with cm_show_log and CM_NOTE.
cm_result() {
    PAIR_NOTE=${CM_NOTE:-} PAIR_SHOW=cm_show_log pair_result "$@"
}

# perftest -R: the server's rdma_listen for the test connection comes after a
# handshake over a first connection, and the client connects right after that
# handshake too (perftest_communication.c, create_rdma_cm_connection).  When
# the client is first, the connection is refused (an iWARP peer says the same:
# UNREACHABLE, -ECONNREFUSED) and perftest 4.5-0.17's retry then segfaults in
# rdma_resolve_addr on the id it has just destroyed.  The race is perftest's.
# Over urdma's TCP transport the server's last handshake Send completes only
# when the client's answer to its flush Read comes back; the client held that
# answer back for its next message on that QP (commit b7a149b) and so won the
# race in 12 of 30 runs with 8 MiB messages (0 of 30 before).  The answer now
# goes when the client calls the connection manager (tcp_release): 0 of 20
# lost with 8 MiB (12 of 20 without); with the default size 16 of 20
# without, 2-7 of 20 with it, then 0 of 60 and 1 of 60 at c280b0d and 0 of
# 30 at 245cbf1 (-n 1000).  The cross-namespace cases keep 8 MiB messages,
# so that perftest's client allocates and registers its buffers before it
# connects.
# A lost race runs the whole pair again, for up to PERFTEST_RETRY_SECS
# seconds; the PASS line says which run passed.
PERFTEST_RACE_RE='RDMA_CM_EVENT_UNREACHABLE; error: -111'
PERFTEST_RETRY_SECS=${PERFTEST_RETRY_SECS:-30}

# cm_cmds KIND ADDR PORT: set CM_SRV and CM_CLI (program and arguments), and
# CM_RE, CM_CHECK, CM_SHOW, CM_STAYS, CM_RETRY, CM_PORT (where the server
# listens) for the case kind:
#   rping:COUNT:SIZE     rping -s / rping -c -a ADDR, -v -V -C COUNT -S SIZE
#   ucmatose[:ARGS]      ucmatose ARGS / ucmatose ARGS -s ADDR (ARGS: "-c 4 -S 4096")
#   udaddy[:ARGS]        udaddy ARGS / udaddy ARGS -s ADDR (RDMA_PS_UDP ids, UD
#                        QPs; on its own port, 7174: its -p is the port space)
#   mckey:GROUP[:ARGS]   mckey -m GROUP -b ADDR ARGS / the same with -s (sender),
#                        bound to CM_CLI_BIND (default ADDR): multicast
#   rdma_cs              rdma_server / rdma_client -s ADDR
#   cmtime:CONNS         cmtime -c CONNS / cmtime -c CONNS -s ADDR (server stopped after)
#   perftest:TEST[:ARGS] TEST ARGS -R -F / TEST ARGS -R -F ADDR (ib_send_bw, ...)
#   rstream:ROWS:ARGS    rstream ARGS / rstream ARGS -s ADDR, ROWS result rows
#   udpong:ROWS[:ARGS]   udpong ARGS -b ADDR / udpong ARGS -s ADDR (datagram
#                        rsockets, UDP port; the server stopped after)
# CM_CHECK_ALSO, if set, names a second check of the client log.
cm_cmds() {
    local kind=$1 addr=$2 p=$3 args
    CM_RE=""
    CM_PORT=$p
    CM_STAYS=0
    CM_RETRY=0
    case $kind in
        rping:*)
            RPING_COUNT=$(cut -d: -f2 <<<"$kind")
            RPING_SIZE=$(cut -d: -f3 <<<"$kind")
            args="-v -V -C $RPING_COUNT -S $RPING_SIZE -p $p"
            CM_SRV="rping -s $args"; CM_CLI="rping -c $args -a $addr"
            CM_CHECK=rping_ok; CM_SHOW=show_rping ;;
        ucmatose*)
            args=${kind#ucmatose}; args=${args#:}
            CM_SRV="ucmatose $args -p $p"; CM_CLI="ucmatose $args -p $p -s $addr"
            CM_CHECK=ucmatose_ok; CM_SHOW=show_ucmatose ;;
        mckey:*) # (the same output as ucmatose's; no port: a group)
            local grp
            grp=$(cut -d: -f2 <<<"$kind")
            args=$(cut -d: -f3- <<<"$kind")
            CM_SRV="mckey -m $grp -b $addr $args"
            CM_CLI="mckey -m $grp -b ${CM_CLI_BIND:-$addr} -s $args"; CM_PORT=none
            CM_CHECK=ucmatose_ok; CM_SHOW=show_ucmatose ;;
        udaddy*) # (the same output as ucmatose's)
            args=${kind#udaddy}; args=${args#:}
            CM_SRV="udaddy $args"; CM_CLI="udaddy $args -s $addr"; CM_PORT=7174
            CM_CHECK=ucmatose_ok; CM_SHOW=show_ucmatose ;;
        rdma_cs)
            CM_SRV="rdma_server -p $p"; CM_CLI="rdma_client -p $p -s $addr"
            CM_CHECK=rdma_cs_ok; CM_SHOW=show_rdma_cs ;;
        cmtime:*)
            CM_SRV="cmtime -c ${kind#cmtime:} -p $p"; CM_CLI="cmtime -c ${kind#cmtime:} -p $p -s $addr"
            CM_CHECK=cmtime_ok; CM_SHOW=show_cmtime; CM_STAYS=1 ;;
        perftest:*)
            args=$(cut -d: -f2 <<<"$kind")
            [[ $kind == perftest:*:* ]] && args+=" $(cut -d: -f3- <<<"$kind")"
            CM_SRV="$args -R -F -p $p"; CM_CLI="$args -R -F -p $p $addr"
            CM_RE='#bytes'; CM_CHECK=perftest_has_table; CM_SHOW=show_perftest_table
            CM_RETRY=1 ;;
        rstream:*)
            RSTREAM_ROWS=$(cut -d: -f2 <<<"$kind")
            args=$(cut -d: -f3- <<<"$kind")
            CM_SRV="rstream $args -p $p"; CM_CLI="rstream $args -p $p -s $addr"
            CM_CHECK=rstream_ok; CM_SHOW=show_rstream ;;
        udpong:*)
            RSTREAM_ROWS=$(cut -d: -f2 <<<"$kind")
            args=$(cut -d: -f3- <<<"$kind")
            CM_SRV="udpong $args -b $addr -p $p"; CM_CLI="udpong $args -s $addr -p $p"
            CM_PORT=udp:$p; CM_STAYS=1
            CM_CHECK=udpong_ok; CM_SHOW=show_rstream ;;
        *) return 1 ;;
    esac
}

# cm_checks LOG: $CM_CHECK, then $CM_CHECK_ALSO if set.
# shellcheck disable=SC2317  # called through cm_result
cm_checks() {
    "$CM_CHECK" "$1" || return 1
    [ -z "${CM_CHECK_ALSO:-}" ] || "$CM_CHECK_ALSO" "$1"
}

# cm_case NAME KIND ADDR: one case on port $CASE_PORT (see cm_cmds).
cm_case() {
    local name=$1 kind=$2 addr=$3 try=1 start=$SECONDS
    if ! cm_cmds "$kind" "$addr" "$CASE_PORT"; then
        fail "$name" "unknown case kind '$kind'"
        return 0
    fi
    while :; do
        cm_pair "$name" "$SRV_RUN $CM_SRV" "$CLI_RUN $CM_CLI" "$CM_STAYS"
        if [ "$CM_RETRY" = 1 ] && [ $((SECONDS - start)) -lt "$PERFTEST_RETRY_SECS" ] &&
           [ "$PAIR_CLI_RC" -ne 0 ] && grep -q "$PERFTEST_RACE_RE" "$PAIR_CLI_LOG" &&
           ! grep -q '#bytes' "$PAIR_CLI_LOG"; then
            log "  run $try lost perftest's race (its client connected before its server listened again): again"
            try=$((try + 1))
            CASE_PORT=$(cm_free_port $((CASE_PORT + 1)))
            cm_cmds "$kind" "$addr" "$CASE_PORT"
            continue
        fi
        break
    done
    CM_NOTE=""
    [ "$try" -gt 1 ] && CM_NOTE="run $try of the pair"
    if cm_result "$name" "$CM_RE" cm_checks; then
        "$CM_SHOW" "$PAIR_CLI_LOG"
    fi
}

# cm_cases ADDR CASE...: CASE is "name|kind" (see cm_case); names get
# $CASE_PREFIX and $CASE_SUFFIX; ports go on from $CASE_PORT.
cm_cases() {
    local addr=$1 c name
    shift
    for c in "$@"; do
        name="${CASE_PREFIX:-}${c%%|*}${CASE_SUFFIX:-}"
        budget_left "$name" || continue
        CASE_PORT=$(cm_free_port "$CASE_PORT")
        log "== $name"
        cm_case "$name" "${c#*|}" "$addr"
        CASE_PORT=$((CASE_PORT + 1))
    done
}

# The usual tables: every client on address ADDR.
cm_all_cases() {
    cm_cases "$1" \
        "rping 23 B x 100|rping:100:23" \
        "rping 64 B x 100|rping:100:64" \
        "rping 4096 B x 100|rping:100:4096" \
        "rping 65535 B x 100|rping:100:65535" \
        "ucmatose|ucmatose" \
        "ucmatose 4 connections 4 KiB x 50|ucmatose:-c 4 -S 4096 -C 50" \
        "udaddy|udaddy" \
        "udaddy 4 connections 1 KiB x 50|udaddy:-c 4 -S 1024 -C 50" \
        "mckey multicast|mckey:239.1.2.3" \
        "mckey 2 groups x 50, 1 KiB|mckey:239.1.2.4:-c 2 -C 50 -S 1024" \
        "udpong 1 KiB x 10000|udpong:1:-S 1024 -C 10000" \
        "udpong 64 B x 20000 rpoll|udpong:1:-S 64 -C 20000 -T a" \
        "udpong 2 KiB x 5000 blocking|udpong:1:-S 2048 -C 5000 -T b" \
        "rdma_server/rdma_client|rdma_cs" \
        "cmtime 50 connections|cmtime:50" \
        "ib_send_bw -R|perftest:ib_send_bw" \
        "ib_write_lat -R|perftest:ib_write_lat" \
        "ib_read_bw -R|perftest:ib_read_bw"
}

# ---- faults ----------------------------------------------------------------

# elapsed T0: seconds since EPOCHREALTIME T0, one decimal.
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# cm_fault_killed ADDR: an rping pair runs; once the client has printed 20
# pings the server process gets SIGKILL.  The client must report the
# disconnection and exit within CM_FAULT_LIMIT seconds (not hang).
CM_FAULT_LIMIT=${CM_FAULT_LIMIT:-10}
cm_fault_killed() {
    local addr=$1 name="${CASE_PREFIX:-}rping: server killed (SIGKILL) mid-run${CASE_SUFFIX:-}"
    local -a srv cli
    local spid tpid cpid rpid i t0 secs slog clog
    budget_left "$name" || return 0
    CASE_PORT=$(cm_free_port "$CASE_PORT")
    log "== $name"
    slog=$WORK/killed.server.log
    clog=$WORK/killed.client.log
    read -r -a srv <<<"$SRV_RUN rping -s -v -p $CASE_PORT"
    read -r -a cli <<<"$CLI_RUN rping -c -v -a $addr -p $CASE_PORT"
    CASE_PORT=$((CASE_PORT + 1))
    log "RUN server: $(q "${srv[@]}")"
    # In a group whose stderr is /dev/null: timeout kills itself with the
    # signal that killed rping, and the shell would report it.
    { timeout -k 2 "$T" "${srv[@]}" >"$slog" 2>&1; } 2>/dev/null &
    spid=$!
    COMPAT_BG_PIDS+=("$spid")
    sleep 0.1
    tpid=$(pgrep -P "$spid" | head -n 1)
    [ -n "$tpid" ] && COMPAT_BG_PIDS+=("$tpid")
    if ! wait_listen $((CASE_PORT - 1)) "$spid" 15; then
        fail "$name" "the server did not listen"
        cm_show_log "$slog" "server output"
        return 0
    fi
    log "RUN client: $(q "${cli[@]}")"
    timeout -k 2 "$T" "${cli[@]}" >"$clog" 2>"$clog.err" &
    cpid=$!
    COMPAT_BG_PIDS+=("$cpid")
    for i in $(seq 200); do
        [ "$(grep -c '^ping data' "$clog")" -ge 20 ] && break
        kill -0 "$cpid" 2>/dev/null || break
        sleep 0.05
    done
    # timeout runs rping as its child (urdma run, ip netns exec and env exec).
    rpid=""
    [ -n "$tpid" ] && rpid=$(pgrep -P "$tpid" | head -n 1)
    if [ "$(grep -c '^ping data' "$clog")" -lt 20 ] || [ -z "$rpid" ]; then
        fail "$name" "the pair was not running (client pings: $(grep -c '^ping data' "$clog"))"
        cm_join_err "$clog"
        cm_show_log "$slog" "server output"
        cm_show_log "$clog" "client output"
        return 0
    fi
    log "  killing the server (pid $rpid) after $(grep -c '^ping data' "$clog") pings"
    kill -KILL "$rpid"
    t0=$EPOCHREALTIME
    for i in $(seq $((CM_FAULT_LIMIT * 20))); do
        kill -0 "$cpid" 2>/dev/null || break
        sleep 0.05
    done
    secs=$(elapsed "$t0")
    if kill -0 "$cpid" 2>/dev/null; then
        kill -TERM "$cpid" 2>/dev/null
        wait "$cpid" 2>/dev/null
        fail "$name" "the client still ran ${CM_FAULT_LIMIT}s after the server was killed"
        cm_join_err "$clog"
        cm_show_log "$clog" "client output"
        return 0
    fi
    wait "$cpid"
    i=$?
    wait "$spid" 2>/dev/null
    # rping's own report (stdout or stderr), not just any word of urdma's
    local said=0
    grep -qE 'DISCONNECT EVENT|cma event|cq completion failed' "$clog" "$clog.err" \
        2>/dev/null && said=1
    cm_join_err "$clog"
    if [ "$said" -eq 0 ]; then
        fail "$name" "the client exited (status $i) without reporting the disconnection"
        cm_show_log "$clog" "client output"
        return 0
    fi
    pass "$name (client gone ${secs} s after SIGKILL, status $i)"
    grep -E 'DISCONNECT|cma event|error|failed|wait for' "$clog" | head -n 5 | sed 's/^/  | /'
}

# cm_fault_unreachable ADDR: rping to a port nobody listens on (at ADDR) must
# fail promptly with UNREACHABLE, -ECONNREFUSED (docs/rdmacm.md), not hang.
# cm_fault_silent NS DEV ADDR: rping from namespace NS (CLI_RUN) to ADDR, an
# address of DEV's subnet whose neighbour entry there names a MAC nobody has:
# its SYNs vanish, and the connect deadline (CMA_CONNECT_TIMEOUT_MS, 10 s)
# ends it with RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT (-110), in 9-15 s.
cm_fault_silent() {
    local ns=$1 dev=$2 addr=$3 name="${CASE_PREFIX:-}rping: a host that never answers${CASE_SUFFIX:-}" t0 secs
    budget_left "$name" || return 0
    if ! ip -n "$ns" neigh replace "$addr" lladdr 02:00:5e:00:00:77 dev "$dev" nud permanent; then
        fail "$name" "could not add the neighbour entry"
        return 0
    fi
    log "== $name"
    t0=$EPOCHREALTIME
    # shellcheck disable=SC2086  # CLI_RUN is a command prefix
    run_check "silent" 20 $CLI_RUN rping -c -v -C 1 -a "$addr" -p "$CASE_PORT"
    secs=$(elapsed "$t0")
    ip -n "$ns" neigh del "$addr" dev "$dev" 2>/dev/null
    if [ "$CHECK_RC" -eq 124 ] || [ "$CHECK_RC" -eq 137 ]; then
        fail "$name" "no answer within 20 s"
    elif ! grep -qE 'RDMA_CM_EVENT_UNREACHABLE, error -110' "$CHECK_LOG"; then
        fail "$name" "status $CHECK_RC without RDMA_CM_EVENT_UNREACHABLE, error -110"
    elif awk -v s="$secs" 'BEGIN { exit !(s < 9 || s > 15) }'; then
        fail "$name" "the error came after $secs s, not 10"
    else
        pass "$name (error after ${secs} s, status $CHECK_RC)"
        return 0
    fi
    cm_show_log "$CHECK_LOG" "client output"
}

cm_fault_unreachable() {
    local addr=$1 name="${CASE_PREFIX:-}rping: nobody listening${CASE_SUFFIX:-}" t0 secs
    budget_left "$name" || return 0
    CASE_PORT=$(cm_free_port "$CASE_PORT")
    log "== $name"
    t0=$EPOCHREALTIME
    # shellcheck disable=SC2086  # CLI_RUN is a command prefix
    run_check "unreachable" "$CM_FAULT_LIMIT" $CLI_RUN rping -c -v -C 1 -a "$addr" -p "$CASE_PORT"
    secs=$(elapsed "$t0")
    CASE_PORT=$((CASE_PORT + 1))
    if [ "$CHECK_RC" -eq 124 ] || [ "$CHECK_RC" -eq 137 ]; then
        fail "$name" "no answer within ${CM_FAULT_LIMIT}s"
    elif [ "$CHECK_RC" -eq 0 ]; then
        fail "$name" "rping exited 0"
    elif ! grep -qE 'RDMA_CM_EVENT_UNREACHABLE, error -111' "$CHECK_LOG"; then
        fail "$name" "status $CHECK_RC without RDMA_CM_EVENT_UNREACHABLE, error -111"
    else
        pass "$name (error after ${secs} s, status $CHECK_RC)"
        grep -E 'cma event' "$CHECK_LOG" | sed 's/^/  | /'
        return 0
    fi
    cm_show_log "$CHECK_LOG" "client output"
}
