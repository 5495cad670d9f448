#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# urdma benchmark (a benchmark, not a test: it always exits 0 unless misused).
#
# Runs, interleaved in the same run, urdma (Debian's perftest through
# `urdma run`) and shared-memory peers (UCX ucx_perftest, libfabric
# fi_pingpong) on loopback, server pinned to CPU 1 and client to CPU 0,
# BENCH_REPS times each, and prints one table of medians with the goals:
#
#   8 B ib_send_lat / ib_write_lat one-way latency (t_typical)  vs UCX ucp_am_lat 8 B (p50)
#   1 MiB ib_write_bw (GB/s = 1e9 B/s)   vs UCX UCT cma put_bw zcopy 1 MiB, libfabric shm fi_pingpong 1 MiB
#   8 B ib_send_bw message rate (Mmsg/s), with 1, 2 and 4 QPs (-q), vs UCX
#   ucp_am_bw 8 B message rate
#   the same two sends over UD (-c UD; the rate as received, for 2 s)
#
# Usage: bench.sh [BUILD_DIR]   (default: <source>/build)
# Output: the table on stdout and in BUILD_DIR/bench/results.md; raw logs in
# BUILD_DIR/bench/logs/.
# Then the TCP rows (bench_tcp below: urdma over TCP next to iperf3, sockperf
# and UCX over TCP, on loopback and between two network namespaces;
# BENCH_TCP=0 leaves them out, BENCH_TCP_REPS default 3, BENCH_TCP_BUDGET
# seconds default 240).
# Then the connection manager and rsockets rows (bench_cm below, on
# loopback: cmtime's connection setup rate next to plain TCP connect/accept
# (bench/tcp_connrate.c), rstream on rsockets next to rstream -T s on kernel
# TCP sockets; BENCH_CM=0 leaves them out, BENCH_CM_REPS default 5,
# BENCH_CM_BUDGET seconds default 120, BENCH_CM_CONNS default 200).
# Then ibv_reg_mr and fork cost next to memcpy (bench_reg below, BENCH_REG=0
# leaves it out), 16,384 QPs on each transport (bench_scale below,
# BENCH_SCALE=0 leaves it out), and the urdma API's echo next to kernel TCP
# and raw verbs (bench_api below, BENCH_API=0 leaves it out).  Last, Open MPI and UCX on
# urdma next to their own shared memory and TCP (bench/middleware.sh,
# BENCH_MW=0 leaves it out).
# Environment: BENCH_REPS (default 5), BENCH_BUDGET seconds (default 240;
# no new repetition starts after it), BENCH_DEVICE (default urdma0),
# BENCH_PORT (first TCP port, default 18800).
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${1:-$HERE/../build}
if ! BUILD=$(cd "$BUILD" 2>/dev/null && pwd); then
    echo "bench: build directory '${1:-$HERE/../build}' not found" >&2
    exit 2
fi
URDMA=$BUILD/bin/urdma
OUTDIR=$BUILD/bench
LOGS=$OUTDIR/logs
RESULTS=$OUTDIR/results.md
REPS=${BENCH_REPS:-5}
BUDGET=${BENCH_BUDGET:-240}
DEV=${BENCH_DEVICE:-urdma0}
PORT=${BENCH_PORT:-18800}
START=$SECONDS

mkdir -p "$LOGS"
rm -f "$LOGS"/*.log

BG_PIDS=()
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local pid
    for pid in "${BG_PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
    done
    sleep 0.2
    for pid in "${BG_PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

# keep VALS FAILS KEY WHAT LOGS: VAL, the measurement just made, joins the
# values of KEY in the associative array VALS if it is a number; otherwise
# FAILS counts a failure of KEY (its logs: LOGS).  False on a failure.
keep() {
    local -n kept=$1 failed=$2
    if is_num "$VAL"; then
        kept[$3]="${kept[$3]:-} $VAL"
        say "bench: $4 = $VAL"
        return 0
    fi
    failed[$3]=$((${failed[$3]:-0} + 1))
    say "bench: $4 failed (see $5)"
    return 1
}

# have CMD PACKAGE: true if CMD is available (installing PACKAGE as root).
have() {
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "bench: installing package $2 (for $1)"
        DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y "$2" >"$LOGS/apt-$2.log" 2>&1 ||
            { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update >>"$LOGS/apt-$2.log" 2>&1 &&
              DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y "$2" >>"$LOGS/apt-$2.log" 2>&1; }
        command -v "$1" >/dev/null 2>&1 && return 0
    fi
    say "bench: '$1' not found (Debian package '$2'); its figures will be n/a"
    return 1
}

# CPU pinning: server on CPU 1, client on CPU 0 (no pinning on 1 CPU).
if have taskset util-linux && [ "$(nproc 2>/dev/null || echo 1)" -ge 2 ]; then
    PIN_SRV=(taskset -c 1)
    PIN_CLI=(taskset -c 0)
    PIN_TEXT="server on CPU 1 / client on CPU 0"
else
    say "bench: fewer than 2 CPUs or no taskset: not pinning"
    PIN_SRV=()
    PIN_CLI=()
    PIN_TEXT="not pinned"
fi
have timeout coreutils || exit 2
have ss iproute2 || exit 2

# Command prefixes of pair's server and client (bench_tcp runs them in network
# namespaces), and whether the server runs until stopped (sockperf).
PAIR_SRV_PFX=()
PAIR_CLI_PFX=()
PAIR_SERVER_STAYS=0
port_listening() { "${PAIR_SRV_PFX[@]}" ss -Hltun "sport = :$1" 2>/dev/null | grep -q .; }  # (TCP or UDP)
next_port() {
    PORT=$((PORT + 1))
    while port_listening "$PORT"; do PORT=$((PORT + 1)); done
}

# pair LOGTAG TIMEOUT "ENV..." SERVER_ARGS -- CLIENT_ARGS
#   Runs server (pinned to CPU 1) then, once $PORT listens, the client
#   (pinned to CPU 0), both under `timeout`.  ENV is a space-separated list
#   of VAR=value for both sides.  Leaves the client log in $PAIR_LOG and
#   returns 0 if both sides exited 0 (the client alone if PAIR_SERVER_STAYS=1:
#   then the server is stopped once the client is done).
pair() {
    local tag=$1 t=$2 envs=$3
    shift 3
    local -a srv=() cli=() envv=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do srv+=("$1"); shift; done
    shift
    cli=("$@")
    read -r -a envv <<<"$envs"
    local slog=$LOGS/$tag.server.log spid crc src i=0
    PAIR_LOG=$LOGS/$tag.client.log
    printf 'server: %s\nclient: %s\n' "${srv[*]}" "${cli[*]}" >"$LOGS/$tag.cmd"
    "${PAIR_SRV_PFX[@]}" env "${envv[@]}" timeout -k 2 "$t" "${PIN_SRV[@]}" "${srv[@]}" >"$slog" 2>&1 &
    spid=$!
    BG_PIDS+=("$spid")
    while ! port_listening "$PORT"; do
        if ! kill -0 "$spid" 2>/dev/null || [ "$i" -ge 300 ]; then
            kill -TERM "$spid" 2>/dev/null
            wait "$spid" 2>/dev/null
            echo "server did not listen on port $PORT" >"$PAIR_LOG"
            return 1
        fi
        sleep 0.05
        i=$((i + 1))
    done
    "${PAIR_CLI_PFX[@]}" env "${envv[@]}" timeout -k 2 "$t" "${PIN_CLI[@]}" "${cli[@]}" >"$PAIR_LOG" 2>&1
    crc=$?
    if [ "$PAIR_SERVER_STAYS" = 1 ]; then
        kill -TERM "$spid" 2>/dev/null
        wait "$spid"
        src=0
    else
        if [ "$crc" -ne 0 ]; then
            i=0
            while kill -0 "$spid" 2>/dev/null && [ "$i" -lt 40 ]; do sleep 0.05; i=$((i + 1)); done
            kill -TERM "$spid" 2>/dev/null
        fi
        wait "$spid"
        src=$?
    fi
    printf 'exit status: server %s, client %s\n' "$src" "$crc" >>"$LOGS/$tag.cmd"
    [ "$crc" -eq 0 ] && [ "$src" -eq 0 ]
}

# perftest_row LOG: the first numeric row under the "#bytes" header.
perftest_row() {
    awk '/#bytes/ { hdr = 1; next }
         hdr && /^[[:space:]]*[0-9]+[[:space:]]+[0-9]+/ { print; exit }' "$1"
}
# perftest_col LOG NAME: index (1-based) of the header column starting with NAME.
perftest_col() {
    awk -v want="$2" '/#bytes/ { for (i = 1; i <= NF; i++) if (index($i, want) == 1) { print i; exit } }' "$1"
}

# --- the measurements; each sets VAL to one number (empty on failure) ----
# (They run in the main shell, not in $(...), so PORT and BG_PIDS persist.)

urdma_lat() {  # TEST [ARGS]: median (t_typical) one-way latency in usec, 8 B
    local t=$1 tag=$1${2:+-ud}.$REP col
    shift
    next_port
    pair "$tag" 30 "" "$URDMA" run "$t" -d "$DEV" -p "$PORT" -F -s 8 -n 20000 "$@" -- \
        "$URDMA" run "$t" -d "$DEV" -p "$PORT" -F -s 8 -n 20000 "$@" 127.0.0.1 || return 1
    col=$(perftest_col "$PAIR_LOG" t_typical)
    [ -n "$col" ] || col=5
    VAL=$(perftest_row "$PAIR_LOG" | awk -v c="$col" '{ print $c }')
}

urdma_write_bw() {  # GB/s (1e9), 1 MiB ib_write_bw; perftest MB/sec is MiB/s
    local tag=ib_write_bw.$REP
    next_port
    pair "$tag" 40 "" "$URDMA" run ib_write_bw -d "$DEV" -p "$PORT" -F -s 1048576 -n 5000 -- \
        "$URDMA" run ib_write_bw -d "$DEV" -p "$PORT" -F -s 1048576 -n 5000 127.0.0.1 || return 1
    # #bytes #iterations BW-peak BW-average MsgRate
    VAL=$(perftest_row "$PAIR_LOG" | awk '{ printf "%.3f\n", $4 * 1048576 / 1e9 }')
}

urdma_send_rate() {  # [QPS] -> Mmsg/s, 8 B ib_send_bw (-q QPS: all of them)
    local q=${1:-1} tag=ib_send_bw.$REP
    [ "$q" = 1 ] || tag=ib_send_bw-q$q.$REP
    next_port
    pair "$tag" 40 "" "$URDMA" run ib_send_bw -d "$DEV" -p "$PORT" -F -s 8 -q "$q" -n 1000000 -- \
        "$URDMA" run ib_send_bw -d "$DEV" -p "$PORT" -F -s 8 -q "$q" -n 1000000 127.0.0.1 || return 1
    VAL=$(perftest_row "$PAIR_LOG" | awk '{ printf "%.3f\n", $5 }')
}

urdma_ud_rate() {  # Mmsg/s, 8 B ib_send_bw -c UD for 2 s, as received
    local tag=ib_send_bw-ud.$REP
    next_port
    pair "$tag" 40 "" "$URDMA" run ib_send_bw -d "$DEV" -p "$PORT" -F -c UD -s 8 -D 2 -- \
        "$URDMA" run ib_send_bw -d "$DEV" -p "$PORT" -F -c UD -s 8 -D 2 127.0.0.1 || return 1
    VAL=$(perftest_row "$LOGS/$tag.server.log" | awk '{ printf "%.3f\n", $5 }')
}

# ucx_perftest -f final line: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall
ucx_final() { awk 'NF == 8 && $1 ~ /^[0-9]+$/ { l = $0 } END { if (l != "") print l }' "$1"; }

ucx_am_lat() {  # usec, p50 one-way
    local tag=ucx_am_lat.$REP
    next_port
    pair "$tag" 30 "UCX_TLS=posix,self" ucx_perftest -p "$PORT" -- \
        ucx_perftest 127.0.0.1 -p "$PORT" -t ucp_am_lat -s 8 -n 100000 -f || return 1
    VAL=$(ucx_final "$PAIR_LOG" | awk '{ printf "%.3f\n", $2 }')
}

ucx_am_rate() {  # Mmsg/s
    local tag=ucx_am_bw.$REP
    next_port
    pair "$tag" 30 "UCX_TLS=posix,self" ucx_perftest -p "$PORT" -- \
        ucx_perftest 127.0.0.1 -p "$PORT" -t ucp_am_bw -s 8 -n 2000000 -f || return 1
    VAL=$(ucx_final "$PAIR_LOG" | awk '{ printf "%.3f\n", $8 / 1e6 }')
}

ucx_cma_put() {  # GB/s; ucx_perftest MB/s is MiB/s
    local tag=ucx_cma_put_bw.$REP
    next_port
    pair "$tag" 30 "UCX_TLS=all" ucx_perftest -p "$PORT" -- \
        ucx_perftest 127.0.0.1 -p "$PORT" -x cma -d memory -t put_bw -D zcopy -s 1048576 -n 5000 -f || return 1
    VAL=$(ucx_final "$PAIR_LOG" | awk '{ printf "%.3f\n", $6 * 1048576 / 1e9 }')
}

fi_shm_bw() {  # GB/s; fi_pingpong MB/sec is 1e6 B/s
    local tag=fi_shm_pingpong.$REP
    next_port
    pair "$tag" 30 "" fi_pingpong -p shm -e rdm -B "$PORT" -I 2000 -S 1048576 -- \
        fi_pingpong -p shm -e rdm -P "$PORT" -I 2000 -S 1048576 127.0.0.1 || return 1
    # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    VAL=$(awk '/MB\/sec/ { hdr = 1; next } hdr && NF >= 8 { printf "%.3f\n", $6 / 1000; exit }' "$PAIR_LOG")
}

# --- what can run ----------------------------------------------------------

declare -A VALS=() FAILS=() NOTE=()
ALL=(send_lat write_lat write_bw send_rate send_rate2 send_rate4 ud_lat ud_rate ucx_lat ucx_rate ucx_put fi_bw)
RUNNABLE=()

URDMA_OK=0
if [ ! -x "$URDMA" ]; then
    NOTE[urdma]="$URDMA not built"
elif ! timeout 20 "$URDMA" devices >"$LOGS/urdma-devices.log" 2>&1 ||
     ! grep -q "^$DEV\$" "$LOGS/urdma-devices.log"; then
    NOTE[urdma]="'urdma devices' does not list $DEV (see $LOGS/urdma-devices.log)"
elif ! have ib_send_lat perftest; then
    NOTE[urdma]="perftest not installed"
else
    URDMA_OK=1
    RUNNABLE+=(send_lat write_lat write_bw send_rate send_rate2 send_rate4 ud_lat ud_rate)
fi
[ "$URDMA_OK" = 1 ] || say "bench: urdma figures n/a: ${NOTE[urdma]}"
if have ucx_perftest ucx-utils; then RUNNABLE+=(ucx_lat ucx_rate ucx_put); fi
if have fi_pingpong libfabric-bin; then RUNNABLE+=(fi_bw); fi

measure() {  # KEY -> function
    case $1 in
        send_lat) urdma_lat ib_send_lat ;;
        write_lat) urdma_lat ib_write_lat ;;
        write_bw) urdma_write_bw ;;
        send_rate) urdma_send_rate ;;
        send_rate2) urdma_send_rate 2 ;;
        send_rate4) urdma_send_rate 4 ;;
        ud_lat) urdma_lat ib_send_lat -c UD ;;
        ud_rate) urdma_ud_rate ;;
        ucx_lat) ucx_am_lat ;;
        ucx_rate) ucx_am_rate ;;
        ucx_put) ucx_cma_put ;;
        fi_bw) fi_shm_bw ;;
    esac
}

# Interleaved order: each urdma metric next to its peer.
ORDER=(send_lat ucx_lat write_lat write_bw ucx_put fi_bw send_rate ucx_rate send_rate2 send_rate4 ud_lat ud_rate)
say "bench: $REPS repetitions, budget ${BUDGET}s, logs in $LOGS"
REP=0
DONE_REPS=0
while [ "$REP" -lt "$REPS" ]; do
    REP=$((REP + 1))
    if [ $((SECONDS - START)) -ge "$BUDGET" ]; then
        say "bench: time budget reached, stopping after $DONE_REPS repetitions"
        break
    fi
    for k in "${ORDER[@]}"; do
        [[ " ${RUNNABLE[*]} " == *" $k "* ]] || continue
        # Give up on a metric after two failed runs.
        [ "${FAILS[$k]:-0}" -ge 2 ] && continue
        VAL=""
        measure "$k"
        keep VALS FAILS "$k" "rep $REP $k" "$LOGS/*.$REP.*.log"
    done
    DONE_REPS=$REP
done

count() { local -a a; read -r -a a <<<"${VALS[$1]:-}"; echo "${#a[@]}"; }

goal_met() {  # VALUE OP LIMIT
    [ "$1" = n/a ] && { echo n/a; return; }
    awk -v v="$1" -v op="$2" -v l="$3" 'BEGIN {
        ok = (op == "<=") ? (v <= l) : (v >= l); print ok ? "yes" : "no" }'
}

SL=$(med send_lat); WL=$(med write_lat); WB=$(med write_bw); SR=$(med send_rate)
SR2=$(med send_rate2); SR4=$(med send_rate4)
UL=$(med ucx_lat); UR=$(med ucx_rate); UP=$(med ucx_put); FB=$(med fi_bw)
DL=$(med ud_lat); DR=$(med ud_rate)

row() {  # metric urdma peer-name peer goal-op goal-limit goal-text
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" \
        "$(ratio "$2" "$4")" "$7" "$(goal_met "$2" "$5" "$6")"
}

{
    echo "# urdma benchmark"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -srm), $(nproc) CPUs" \
         "($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), loopback," \
         "$PIN_TEXT, median of up to $DONE_REPS runs" \
         "(runs per metric: send_lat $(count send_lat), write_lat $(count write_lat)," \
         "write_bw $(count write_bw), send_rate $(count send_rate) (-q 2 $(count send_rate2)," \
         "-q 4 $(count send_rate4)), ud_lat $(count ud_lat)," \
         "ud_rate $(count ud_rate), ucx_lat $(count ucx_lat)," \
         "ucx_rate $(count ucx_rate), ucx_put $(count ucx_put), fi_bw $(count fi_bw)); GB = 1e9 B."
    echo
    echo "| metric | urdma | peer | peer figure | urdma/peer | goal | met |"
    echo "|---|---|---|---|---|---|---|"
    row "8 B ib_send_lat one-way latency, µs (t_typical)" "$SL" "UCX ucp_am_lat 8 B p50 (posix)" "$UL" "<=" 1.0 "≤ 1.0 µs"
    row "8 B ib_write_lat one-way latency, µs (t_typical)" "$WL" "UCX ucp_am_lat 8 B p50 (posix)" "$UL" "<=" 1.0 "≤ 1.0 µs"
    row "1 MiB ib_write_bw, GB/s" "$WB" "UCX UCT cma put_bw zcopy 1 MiB" "$UP" ">=" 15 "≥ 15 GB/s"
    row "1 MiB ib_write_bw, GB/s" "$WB" "libfabric shm fi_pingpong 1 MiB" "$FB" ">=" 15 "≥ 15 GB/s"
    row "8 B ib_send_bw message rate, Mmsg/s" "$SR" "UCX ucp_am_bw 8 B rate (posix)" "$UR" ">=" 3 "≥ 3 Mmsg/s"
    row "8 B ib_send_bw -q 2 message rate, Mmsg/s" "$SR2" "UCX ucp_am_bw 8 B rate (posix)" "$UR" ">=" 3 "≥ 3 Mmsg/s"
    row "8 B ib_send_bw -q 4 message rate, Mmsg/s" "$SR4" "UCX ucp_am_bw 8 B rate (posix)" "$UR" ">=" 3 "≥ 3 Mmsg/s"
    row "8 B ib_send_lat -c UD one-way latency, µs (t_typical)" "$DL" "UCX ucp_am_lat 8 B p50 (posix)" "$UL" "<=" 1.0 "≤ 1.0 µs"
    row "8 B ib_send_bw -c UD rate received, Mmsg/s (2 s)" "$DR" "UCX ucp_am_bw 8 B rate (posix)" "$UR" ">=" 3 "≥ 3 Mmsg/s"
    echo
    echo "Latency ratio: lower is better; bandwidth and rate ratio: higher is better."
    [ "$URDMA_OK" = 1 ] || echo "urdma figures n/a: ${NOTE[urdma]}."
    for k in "${ALL[@]}"; do
        if [ "${FAILS[$k]:-0}" -gt 0 ]; then
            echo "$k: ${FAILS[$k]} failed run(s); logs in $LOGS."
        fi
    done
    echo "Total time: $((SECONDS - START)) s."
} | tee "$RESULTS"

# --- urdma over TCP (issue #3) -----------------------------------------------
# bench_tcp: urdma with URDMA_TRANSPORT=tcp next to kernel TCP, on loopback and
# (as root) over a veth pair between two network namespaces, BENCH_TCP_REPS
# times interleaved; appends a table to $RESULTS.  The two urdma sides have
# their own URDMA_SHM_DIR, as two hosts would: nothing passes through shared
# memory, and if the TCP transport is missing the urdma figures are n/a.
#   1 MiB ib_write_bw for 3 s (-D 3)   vs iperf3, one stream, 1 MiB writes, 3 s
#   8 B ib_send_lat / ib_write_lat     vs sockperf ping-pong (14 B, its minimum),
#   one-way latency, median              UCX ucp_am_lat 8 B with UCX_TLS=tcp
#   8 B ib_send_lat -c UD (over UDP)   vs sockperf UDP ping-pong 14 B

# shellcheck source-path=SCRIPTDIR source=../tests/net/netns.sh
. "$HERE/../tests/net/netns.sh"

tcp_path() {  # lo|veth: where pair runs the two sides
    T_PATH=$1
    if [ "$1" = lo ]; then
        PAIR_SRV_PFX=()
        PAIR_CLI_PFX=()
        T_IP=127.0.0.1
        T_SRV_DEV=lo
        T_CLI_DEV=lo
    else
        PAIR_SRV_PFX=(ip netns exec "$NS_A")
        PAIR_CLI_PFX=(ip netns exec "$NS_B")
        T_IP=$IP_A
        T_SRV_DEV=$VETH_A
        T_CLI_DEV=$VETH_B
    fi
    T_SRV=(env URDMA_TRANSPORT=tcp URDMA_SHM_DIR="$OUTDIR/shm-server" "$URDMA" run)
    T_CLI=(env URDMA_TRANSPORT=tcp URDMA_SHM_DIR="$OUTDIR/shm-client" "$URDMA" run)
}

tcp_urdma_lat() {  # TEST [ARGS]: t_typical one-way latency in usec, 8 B
    local t=$1 tag=tcp-$T_PATH.$1${2:+-ud}.$REP col
    shift
    next_port
    pair "$tag" 30 "" "${T_SRV[@]}" "$t" -d "$DEV" -p "$PORT" -F -x "${T_GID[$T_PATH.srv]}" -s 8 -n 20000 "$@" -- \
        "${T_CLI[@]}" "$t" -d "$DEV" -p "$PORT" -F -x "${T_GID[$T_PATH.cli]}" -s 8 -n 20000 "$@" "$T_IP" || return 1
    col=$(perftest_col "$PAIR_LOG" t_typical)
    [ -n "$col" ] || col=5
    VAL=$(perftest_row "$PAIR_LOG" | awk -v c="$col" '{ print $c }')
}

tcp_urdma_write_bw() {  # GB/s, 1 MiB ib_write_bw, as long as iperf3 runs
    local tag=tcp-$T_PATH.ib_write_bw.$REP
    next_port
    pair "$tag" 40 "" "${T_SRV[@]}" ib_write_bw -d "$DEV" -p "$PORT" -F -x "${T_GID[$T_PATH.srv]}" -s 1048576 -D 3 -- \
        "${T_CLI[@]}" ib_write_bw -d "$DEV" -p "$PORT" -F -x "${T_GID[$T_PATH.cli]}" -s 1048576 -D 3 "$T_IP" || return 1
    VAL=$(perftest_row "$PAIR_LOG" | awk '{ printf "%.3f\n", $4 * 1048576 / 1e9 }')
}

tcp_iperf3() {  # GB/s, received, one stream
    local tag=tcp-$T_PATH.iperf3.$REP
    next_port
    pair "$tag" 30 "" iperf3 -s -1 -p "$PORT" -- iperf3 -c "$T_IP" -p "$PORT" -l 1M -t 3 -J || return 1
    VAL=$(awk '/"sum_received"/ { s = 1 } s && /"bits_per_second"/ {
                   gsub(/[^0-9.e+]/, "", $2); printf "%.3f\n", $2 / 8e9; exit }' "$PAIR_LOG")
}

tcp_sockperf() {  # [udp]: usec, p50 one-way (sockperf reports half the round trip)
    local tag=tcp-$T_PATH.sockperf${1:+-udp}.$REP proto=--tcp
    [ "${1:-}" = udp ] && proto=""
    next_port
    PAIR_SERVER_STAYS=1
    # shellcheck disable=SC2086  # proto: a word or none
    pair "$tag" 30 "" sockperf sr $proto -i "$T_IP" -p "$PORT" -- \
        sockperf pp $proto -i "$T_IP" -p "$PORT" -m 14 -t 3
    local rc=$?
    PAIR_SERVER_STAYS=0
    [ "$rc" -eq 0 ] || return 1
    VAL=$(awk '/percentile 50.000 =/ { printf "%.3f\n", $NF; exit }' "$PAIR_LOG")
}

tcp_ucx_lat() {  # usec, p50 one-way, UCX over TCP
    local tag=tcp-$T_PATH.ucx_am_lat.$REP
    next_port
    pair "$tag" 30 "UCX_TLS=tcp" env UCX_NET_DEVICES="$T_SRV_DEV" ucx_perftest -p "$PORT" -- \
        env UCX_NET_DEVICES="$T_CLI_DEV" ucx_perftest "$T_IP" -p "$PORT" -t ucp_am_lat -s 8 -n 20000 -f || return 1
    VAL=$(ucx_final "$PAIR_LOG" | awk '{ printf "%.3f\n", $2 }')
}

declare -A T_GID=() TCP_VALS=() TCP_FAILS=()

tmed() {  # PATH.KEY -> median or n/a
    # shellcheck disable=SC2086  # word splitting of the value list is wanted
    median ${TCP_VALS[$1]:-}
}

tcp_row() {  # path metric urdma peer-name peer
    printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$5" "$(ratio "$3" "$5")"
}

bench_tcp() {
    local reps=${BENCH_TCP_REPS:-3} budget=${BENCH_TCP_BUDGET:-240} start=$SECONDS
    local -a paths=(lo) keys=()
    local p k note=""
    have iperf3 iperf3 && keys+=(iperf3)
    have sockperf sockperf && keys+=(sockperf sockperf_udp)
    have ucx_perftest ucx-utils && keys+=(ucx)
    if netns_setup; then
        paths+=(veth)
        T_GID[veth.srv]=$(netns_gid_index "$NS_A" "$IP_A")
        T_GID[veth.cli]=$(netns_gid_index "$NS_B" "$IP_B")
    else
        note="veth rows n/a: $NETNS_ERROR."
    fi
    T_GID[lo.srv]=$(netns_gid_index "" 127.0.0.1)
    T_GID[lo.cli]=${T_GID[lo.srv]}
    # Guard: is there a TCP transport at all?  (One short run on loopback.)
    tcp_path lo
    next_port
    if [ "$URDMA_OK" = 1 ] &&
       pair tcp-probe 15 "" "${T_SRV[@]}" ib_write_lat -d "$DEV" -p "$PORT" -F -x "${T_GID[lo.srv]}" -n 100 -- \
           "${T_CLI[@]}" ib_write_lat -d "$DEV" -p "$PORT" -F -x "${T_GID[lo.cli]}" -n 100 127.0.0.1; then
        keys=(write_bw send_lat write_lat ud_lat "${keys[@]}")
    else
        note="${note:+$note }urdma over TCP n/a: the probe failed (see $LOGS/tcp-probe.*)."
        say "bench: urdma over TCP n/a (see $LOGS/tcp-probe.*)"
    fi
    say "bench: TCP rows, $reps repetitions, budget ${budget}s"
    REP=0
    while [ "$REP" -lt "$reps" ] && [ $((SECONDS - start)) -lt "$budget" ]; do
        REP=$((REP + 1))
        for p in "${paths[@]}"; do
            tcp_path "$p"
            for k in "${keys[@]}"; do
                [ "${TCP_FAILS[$p.$k]:-0}" -ge 2 ] && continue
                VAL=""
                case $k in
                    write_bw) tcp_urdma_write_bw ;;
                    send_lat) tcp_urdma_lat ib_send_lat ;;
                    write_lat) tcp_urdma_lat ib_write_lat ;;
                    iperf3) tcp_iperf3 ;;
                    sockperf) tcp_sockperf ;;
                    sockperf_udp) tcp_sockperf udp ;;
                    ud_lat) tcp_urdma_lat ib_send_lat -c UD ;;
                    ucx) tcp_ucx_lat ;;
                esac
                keep TCP_VALS TCP_FAILS "$p.$k" "tcp rep $REP $p $k" "$LOGS/tcp-$p.*.$REP.*"
            done
        done
    done
    rm -rf "$OUTDIR/shm-server" "$OUTDIR/shm-client"
    PAIR_SRV_PFX=()
    PAIR_CLI_PFX=()
    {
        echo
        echo "## urdma over TCP (URDMA_TRANSPORT=tcp) and kernel TCP"
        echo
        echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), median of up to $REP runs;" \
             "veth = two network namespaces joined by a veth pair; GB = 1e9 B."
        echo
        echo "| path | metric | urdma | peer | peer figure | urdma/peer |"
        echo "|---|---|---|---|---|---|"
        for p in "${paths[@]}"; do
            tcp_row "$p" "1 MiB ib_write_bw, GB/s" "$(tmed "$p.write_bw")" \
                "iperf3, one stream, 1 MiB writes" "$(tmed "$p.iperf3")"
            for k in send_lat write_lat; do
                tcp_row "$p" "8 B ib_${k}, one-way µs (t_typical)" "$(tmed "$p.$k")" \
                    "sockperf ping-pong 14 B, one-way p50" "$(tmed "$p.sockperf")"
                tcp_row "$p" "8 B ib_${k}, one-way µs (t_typical)" "$(tmed "$p.$k")" \
                    "UCX ucp_am_lat 8 B p50, UCX_TLS=tcp" "$(tmed "$p.ucx")"
            done
            tcp_row "$p" "8 B ib_send_lat -c UD over UDP, one-way µs (t_typical)" \
                "$(tmed "$p.ud_lat")" "sockperf UDP ping-pong 14 B, one-way p50" \
                "$(tmed "$p.sockperf_udp")"
        done
        echo
        echo "Latency ratio: lower is better; bandwidth ratio: higher is better.${note:+ $note}"
        for k in "${!TCP_FAILS[@]}"; do
            echo "$k: ${TCP_FAILS[$k]} failed run(s); logs in $LOGS."
        done
    } | tee -a "$RESULTS"
}

[ "${BENCH_TCP:-1}" = 1 ] && bench_tcp

# --- the connection manager and rsockets (issue #4) --------------------------
# bench_cm: on loopback, BENCH_CM_REPS times interleaved; appends a table to
# $RESULTS.
#   connection setup rate, conn/s: cmtime -c N (N connections in flight; its
#     steps create id, resolve addr, resolve route, create qp and connect, and
#     the connect step alone: REQ, REP, RTU and the QPs' moves to RTS)
#     vs tcp_connrate: N non-blocking connects, each done when the server has
#     accepted it and sent one byte (the server's accept is in the setup, as
#     rdma_accept is in the RDMA CM's)
#   rsocket stream bandwidth, GB/s: rstream -S 1 MiB -C 500 (its custom test:
#     500 transfers one way, then 500 back) vs the same with -T s, kernel TCP
#     sockets (rstream's own baseline, the same program and pattern)
#   rsocket latency, one-way µs: rstream -S 64 -C 1 -I 20000 (ping-pong; its
#     usec/xfer is half a round trip) vs the same with -T s
CM_CONNS=${BENCH_CM_CONNS:-200}

# rstream_custom LOG COLUMN: the column (7 Gb/sec, 8 usec/xfer) of its
# "custom" result row.
rstream_custom() { awk -v c="$2" '$1 == "custom" && NF >= 8 { print $c; exit }' "$1"; }

cm_cmtime() {  # conn/s, setup (steps create id .. connect) and the connect step alone
    local tag=cm-cmtime.$REP
    next_port
    PAIR_SERVER_STAYS=1
    pair "$tag" 60 "" "$URDMA" run cmtime -c "$CM_CONNS" -p "$PORT" -- \
        "$URDMA" run cmtime -c "$CM_CONNS" -p "$PORT" -s 127.0.0.1
    local rc=$?
    PAIR_SERVER_STAYS=0
    [ "$rc" -eq 0 ] || return 1
    # step ":" total ms, max ms, min us, us/conn
    VAL=$(awk -F: -v n="$CM_CONNS" '
        { sub(/ +$/, "", $1) }
        $1 ~ /^(create id|resolve addr|resolve route|create qp|connect)$/ { split($2, f, " "); ms += f[1]; k++ }
        END { if (k == 5 && ms > 0) printf "%.0f\n", n / (ms / 1000) }' "$PAIR_LOG")
    VAL2=$(awk -F: -v n="$CM_CONNS" '
        { sub(/ +$/, "", $1) }
        $1 == "connect" { split($2, f, " "); if (f[1] > 0) printf "%.0f\n", n / (f[1] / 1000) }' "$PAIR_LOG")
}

cm_tcp_connrate() {  # conn/s
    local tag=cm-tcp_connrate.$REP
    next_port
    pair "$tag" 30 "" "$CM_CONNRATE" server "$PORT" "$CM_CONNS" -- \
        "$CM_CONNRATE" client 127.0.0.1 "$PORT" "$CM_CONNS" || return 1
    VAL=$(awk '/conn\/s/ { print $(NF - 1); exit }' "$PAIR_LOG")
}

cm_rstream() {  # KIND bw|lat, WHO urdma|tcp: GB/s or one-way usec
    local kind=$1 who=$2 tag=cm-rstream-$1-$2.$REP
    local -a args run=() opt=()
    if [ "$kind" = bw ]; then args=(-S 1048576 -C 500); else args=(-S 64 -C 1 -I 20000); fi
    if [ "$who" = urdma ]; then run=("$URDMA" run); else opt=(-T s); fi
    next_port
    pair "$tag" 60 "" "${run[@]}" rstream "${opt[@]}" "${args[@]}" -p "$PORT" -- \
        "${run[@]}" rstream "${opt[@]}" "${args[@]}" -p "$PORT" -s 127.0.0.1 || return 1
    if [ "$kind" = bw ]; then
        VAL=$(rstream_custom "$PAIR_LOG" 7 | awk '{ if ($1 > 0) printf "%.3f\n", $1 / 8 }')
    else
        VAL=$(rstream_custom "$PAIR_LOG" 8)
    fi
}

declare -A CM_VALS=() CM_FAILS=()

cmed() {  # KEY -> median or n/a
    # shellcheck disable=SC2086  # word splitting of the value list is wanted
    median ${CM_VALS[$1]:-}
}

bench_cm() {
    local reps=${BENCH_CM_REPS:-5} budget=${BENCH_CM_BUDGET:-120} start=$SECONDS
    local -a keys=()
    local k note=""
    tcp_path lo
    if ! have cmtime rdmacm-utils || ! have rstream rdmacm-utils; then
        note="rdmacm-utils not installed: no figures."
    elif [ ! -e "$BUILD/lib/librdmacm.so.1" ]; then
        note="$BUILD/lib/librdmacm.so.1 not built: no urdma figures."
        keys=(rs_bw_tcp rs_lat_tcp)
    else
        [ "$URDMA_OK" = 1 ] && keys+=(cmtime)
        keys+=(rs_bw_tcp rs_lat_tcp)
        # Guard: do rsockets work?  (One short rstream on loopback.)
        next_port
        if [ "$URDMA_OK" = 1 ] &&
           pair cm-rstream-probe 20 "" "$URDMA" run rstream -S 4096 -C 100 -p "$PORT" -- \
               "$URDMA" run rstream -S 4096 -C 100 -p "$PORT" -s 127.0.0.1 &&
           [ -n "$(rstream_custom "$PAIR_LOG" 7)" ]; then
            keys+=(rs_bw rs_lat)
        else
            note="rsocket rows n/a: the rstream probe failed (see $LOGS/cm-rstream-probe.*)."
            say "bench: rsockets n/a (see $LOGS/cm-rstream-probe.*)"
        fi
    fi
    CM_CONNRATE=$OUTDIR/tcp_connrate
    if ${CC:-cc} -O2 -o "$CM_CONNRATE" "$HERE/tcp_connrate.c" >"$LOGS/tcp_connrate-build.log" 2>&1; then
        keys+=(connrate)
    else
        note="${note:+$note }TCP connection rate n/a: building bench/tcp_connrate.c failed (see $LOGS/tcp_connrate-build.log)."
    fi
    say "bench: connection manager and rsocket rows, $reps repetitions, budget ${budget}s"
    REP=0
    while [ "$REP" -lt "$reps" ] && [ $((SECONDS - start)) -lt "$budget" ]; do
        REP=$((REP + 1))
        for k in "${keys[@]}"; do
            [ "${CM_FAILS[$k]:-0}" -ge 2 ] && continue
            VAL=""
            VAL2=""
            case $k in
                cmtime) cm_cmtime ;;
                connrate) cm_tcp_connrate ;;
                rs_bw) cm_rstream bw urdma ;;
                rs_bw_tcp) cm_rstream bw tcp ;;
                rs_lat) cm_rstream lat urdma ;;
                rs_lat_tcp) cm_rstream lat tcp ;;
            esac
            if keep CM_VALS CM_FAILS "$k" "cm rep $REP $k" "$LOGS/cm-*.$REP.*" &&
               is_num "$VAL2"; then
                VAL=$VAL2
                keep CM_VALS CM_FAILS "$k.connect" "cm rep $REP $k.connect" ""
            fi
        done
    done
    {
        echo
        echo "## The connection manager and rsockets"
        echo
        echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), median of up to $REP runs; loopback, $PIN_TEXT;" \
             "urdma's QPs over ${URDMA_TRANSPORT:-auto (shared memory on one host)}; GB = 1e9 B."
        echo
        echo "| path | metric | urdma | peer | peer figure | urdma/peer |"
        echo "|---|---|---|---|---|---|"
        tcp_row lo "connection setup, conn/s (cmtime -c $CM_CONNS: create id to connected)" "$(cmed cmtime)" \
            "TCP connect + accept + 1 byte, $CM_CONNS in flight" "$(cmed connrate)"
        tcp_row lo "connect step alone, conn/s (cmtime: REQ, REP, RTU)" "$(cmed cmtime.connect)" \
            "TCP connect + accept + 1 byte, $CM_CONNS in flight" "$(cmed connrate)"
        tcp_row lo "rsocket stream 1 MiB x 500, GB/s (rstream)" "$(cmed rs_bw)" \
            "rstream -T s (kernel TCP sockets)" "$(cmed rs_bw_tcp)"
        tcp_row lo "rsocket 64 B ping-pong, one-way µs (rstream)" "$(cmed rs_lat)" \
            "rstream -T s (kernel TCP sockets)" "$(cmed rs_lat_tcp)"
        echo
        echo "Rates and bandwidth: higher is better; latency: lower is better.${note:+ $note}"
        for k in "${!CM_FAILS[@]}"; do
            echo "$k: ${CM_FAILS[$k]} failed run(s); logs in $LOGS."
        done
    } | tee -a "$RESULTS"
}

# Registration and fork cost (bench/reg_bench.c): ibv_reg_mr of fresh memory
# 4 KiB to 1 GiB next to memcpy of the same bytes, and fork + exit with that
# memory registered next to a fork before it.  BENCH_REG=0 leaves it out;
# BENCH_REG_MAX_MIB (default 1024), BENCH_REG_REPS (default 3).
bench_reg() {
    local bin=$OUTDIR/reg_bench
    if ! ${CC:-cc} -O2 -o "$bin" "$HERE/reg_bench.c" -L"$BUILD/lib" \
            -Wl,-rpath,"$BUILD/lib" -l:libibverbs.so.1 >"$LOGS/reg_bench-build.log" 2>&1; then
        say "bench: building bench/reg_bench.c failed (see $LOGS/reg_bench-build.log)"
        return
    fi
    {
        echo
        echo "## Registration and fork"
        echo
        echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), median of ${BENCH_REG_REPS:-3}; fresh private" \
             "anonymous memory, written once; GB = 1e9 B. reg/memcpy: how many memcpys of the" \
             "same bytes one registration costs."
        echo
        timeout 600 "$bin" "${BENCH_REG_MAX_MIB:-1024}" "${BENCH_REG_REPS:-3}" 2>"$LOGS/reg_bench.log"
    } | tee -a "$RESULTS"
}

# The urdma API (bench/api_bench.c): its echo's one-way latency (half the
# round trip) for 8 B and 64 KiB and its rate (echoes per second, 32 in
# flight), next to the same echo over kernel TCP sockets and over rsockets
# (urdma's librdmacm: the same socket code with an r in front); and its
# one-way 8 B message rate (a stream the server only counts).  On loopback
# (urdma over shared memory) next to ib_send_lat / ib_send_bw and UCX's
# ucp_am_lat / ucp_am_bw, measured again in the same loop; across the two
# namespaces (urdma over TCP, as the TCP rows) next to that table's
# ib_send_lat and UCX over TCP.  Both sides block in their library's own
# waits.  BENCH_API=0 leaves it out; BENCH_API_REPS (default 5).
declare -A API_VALS=() API_FAILS=()
api_measure() {  # PATH KEY
    local kind=urdma what=lat size=8 n=20000
    local -a srv=() cli=()
    case $2 in *_tcp) kind=tcp ;; *_rs) kind=rs ;; esac
    case $2 in
        lat64k*) size=65536 n=2000 ;;
        rate8*) what=rate n=200000 ;;
        stream8) what=stream n=1000000 ;;
        # 1,000 connections on each side, the round trips over each in turn
        lat8_c1000) srv=(env API_CONNS=1000) cli=(env API_CONNS=1000) ;;
    esac
    if [ "$1" = veth ]; then
        n=$((n / 4)) # a round trip over TCP is ~40 times longer
        srv=(env URDMA_TRANSPORT=tcp URDMA_SHM_DIR="$OUTDIR/shm-server")
        cli=(env URDMA_TRANSPORT=tcp URDMA_SHM_DIR="$OUTDIR/shm-client")
    fi
    next_port
    PAIR_SERVER_STAYS=1
    pair "api-$1.$2.$REP" 60 "" "${srv[@]}" "$API_BIN" serve "$kind" "$PORT" -- \
        "${cli[@]}" "$API_BIN" "$what" "$kind" "$T_IP:$PORT" "$size" "$n"
    PAIR_SERVER_STAYS=0
    VAL=$(awk '/^result:/ { print $2 }' "$PAIR_LOG")
}
amed() {  # PATH.KEY -> median or n/a
    # shellcheck disable=SC2086  # word splitting of the value list is wanted
    median ${API_VALS[$1]:-}
}
bench_api() {
    local reps=${BENCH_API_REPS:-5} k p note=""
    local -a keys=(lat8 lat8_tcp lat8_rs lat64k lat64k_tcp lat64k_rs rate8 rate8_tcp rate8_rs)
    local -a paths=(lo) peers=()
    # raw verbs and UCX on shared memory, again in this loop: beside each
    # repetition of the API's own rows, as the machine's speed moves
    [[ " ${RUNNABLE[*]} " == *" send_lat "* ]] && peers+=(verbs_lat verbs_rate)
    [[ " ${RUNNABLE[*]} " == *" ucx_lat "* ]] && peers+=(ucx_lat ucx_rate)
    API_BIN=$OUTDIR/api_bench
    if ! ${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -o "$API_BIN" "$HERE/api_bench.c" \
            -I"$HERE/../include" -L"$BUILD/lib" -Wl,-rpath,"$BUILD/lib" -lurdma \
            -l:librdmacm.so.1 >"$LOGS/api_bench-build.log" 2>&1; then
        say "bench: building bench/api_bench.c failed (see $LOGS/api_bench-build.log)"
        return
    fi
    if [ -n "$NS_A" ] || netns_setup; then
        paths+=(veth)
    else
        note="veth rows n/a: $NETNS_ERROR."
    fi
    say "bench: urdma API rows, $reps repetitions"
    for REP in $(seq "$reps"); do
        for p in "${paths[@]}"; do
            tcp_path "$p"
            for k in "${keys[@]}" $([ "$p" = lo ] && echo stream8 lat8_c1000 "${peers[@]}"); do
                [ "${API_FAILS[$p.$k]:-0}" -ge 2 ] && continue
                VAL=""
                case $k in
                    verbs_lat) urdma_lat ib_send_lat ;;
                    verbs_rate) urdma_send_rate ;;
                    ucx_lat) ucx_am_lat ;;
                    ucx_rate) ucx_am_rate ;;
                    *) api_measure "$p" "$k" ;;
                esac
                keep API_VALS API_FAILS "$p.$k" "api rep $REP $p $k" "$LOGS/api-$p.$k.$REP.*"
            done
        done
    done
    rm -rf "$OUTDIR/shm-server" "$OUTDIR/shm-client"
    PAIR_SRV_PFX=()
    PAIR_CLI_PFX=()
    {
        echo
        echo "## The urdma API"
        echo
        echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), median of up to $reps runs; $PIN_TEXT;" \
             "bench/api_bench.c: an echo server and client, each blocking in its library's waits;" \
             "lo: urdma over shared memory; veth: two namespaces, urdma over TCP."
        echo
        echo "| path | metric | urdma API | peer | peer figure | urdma/peer |"
        echo "|---|---|---|---|---|---|"
        for p in "${paths[@]}"; do
            tcp_row "$p" "echo 8 B, one-way µs (half the round trip)" "$(amed "$p.lat8")" \
                "the same echo over kernel TCP" "$(amed "$p.lat8_tcp")"
            tcp_row "$p" "echo 8 B, one-way µs" "$(amed "$p.lat8")" \
                "the same echo over rsockets" "$(amed "$p.lat8_rs")"
            if [ "$p" = lo ]; then
                tcp_row lo "echo 8 B, one-way µs" "$(amed lo.lat8)" \
                    "raw verbs ib_send_lat 8 B (goal ≤ 1.1)" "$(amed lo.verbs_lat)"
                tcp_row lo "echo 8 B, one-way µs" "$(amed lo.lat8)" \
                    "UCX ucp_am_lat 8 B, posix (goal < 1)" "$(amed lo.ucx_lat)"
            else
                tcp_row veth "echo 8 B, one-way µs" "$(amed veth.lat8)" \
                    "raw verbs ib_send_lat 8 B over TCP (above; goal ≤ 1.1)" "$(tmed veth.send_lat)"
                tcp_row veth "echo 8 B, one-way µs" "$(amed veth.lat8)" \
                    "UCX ucp_am_lat 8 B, UCX_TLS=tcp (above; goal < 1)" "$(tmed veth.ucx)"
            fi
            tcp_row "$p" "echo 64 KiB, one-way µs" "$(amed "$p.lat64k")" \
                "the same echo over kernel TCP" "$(amed "$p.lat64k_tcp")"
            tcp_row "$p" "echo 64 KiB, one-way µs" "$(amed "$p.lat64k")" \
                "the same echo over rsockets" "$(amed "$p.lat64k_rs")"
            tcp_row "$p" "echo 8 B, Mmsg/s echoed, 32 in flight" "$(amed "$p.rate8")" \
                "the same echo over kernel TCP" "$(amed "$p.rate8_tcp")"
            tcp_row "$p" "echo 8 B, Mmsg/s echoed, 32 in flight" "$(amed "$p.rate8")" \
                "the same echo over rsockets" "$(amed "$p.rate8_rs")"
        done
        tcp_row lo "echo 8 B over 1,000 connections in turn, one-way µs" \
            "$(amed lo.lat8_c1000)" "the same over 1 connection (above)" "$(amed lo.lat8)"
        tcp_row lo "8 B messages one way, Mmsg/s" "$(amed lo.stream8)" \
            "raw verbs ib_send_bw 8 B (goal ≥ 0.9)" "$(amed lo.verbs_rate)"
        tcp_row lo "8 B messages one way, Mmsg/s" "$(amed lo.stream8)" \
            "UCX ucp_am_bw 8 B, posix (goal > 1)" "$(amed lo.ucx_rate)"
        echo
        echo "Latency: lower is better; rates: higher is better. ib_send_lat is one-way in one" \
             "direction; the echo carries each message there and back. On lo, raw verbs and UCX" \
             "are measured in the same loop as the API's rows (each repetition runs them all);" \
             "on veth they are the TCP table's.${note:+ $note}"
        for k in "${!API_FAILS[@]}"; do
            echo "$k: ${API_FAILS[$k]} failed run(s); logs in $LOGS."
        done
    } | tee -a "$RESULTS"
}

# Many QPs (tests/scale/qp_scale.c): BENCH_QPS (default 16384) RC QPs
# between two processes on each transport, created, connected, a Write each,
# destroyed; rates and memory per idle QP, as qp_scale prints them.  Then
# one receive CQ behind 4,096 QPs over shm (tests/scale/cq_scale.c): an
# empty poll and a Send to its completion, next to the same with 1 QP.
# BENCH_SCALE=0 leaves it out.
bench_scale() {
    local tr n=${BENCH_QPS:-16384}
    {
        echo
        echo "## Many QPs"
        echo
        echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), $n RC QPs in one process pair, one run;" \
             "connect: INIT, RTR, RTS and an 8-byte Write on each, all completed."
        echo
        for tr in shm tcp; do
            echo "$tr:"
            URDMA_TRANSPORT=$tr timeout 300 "$URDMA" run "$BUILD/bin/qp_scale" "$n" \
                2>"$LOGS/qp_scale-$tr.log" | sed 's/^/    /'
        done
        echo "one receive CQ behind 4096 QPs, shm (own receives; one SRQ):"
        for m in ring srq; do
            URDMA_TRANSPORT=shm timeout 120 "$URDMA" run "$BUILD/bin/cq_scale" 4096 "$m" \
                2>>"$LOGS/cq_scale.log" | sed 's/^/    /'
        done
    } | tee -a "$RESULTS"
}

[ "${BENCH_REG:-1}" = 1 ] && bench_reg
[ "${BENCH_SCALE:-1}" = 1 ] && bench_scale
[ "${BENCH_CM:-1}" = 1 ] && bench_cm
[ "${BENCH_API:-1}" = 1 ] && bench_api
[ "${BENCH_MW:-1}" = 1 ] && "$HERE/middleware.sh" "$BUILD" | tee -a "$RESULTS"
say "bench: results written to $RESULTS"
exit 0
