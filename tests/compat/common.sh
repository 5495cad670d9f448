# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Helpers shared by the real-client compatibility tests (sourced, not run).
#
#   compat_init BUILD_DIR   set BUILD, URDMA, WORK (temp dir), install traps
#   need_cmd CMD PACKAGE    make sure CMD exists (apt-get install as root,
#                           otherwise exit 77 naming the package)
#   need_header CC HEADER PACKAGE   the same for a header CC must find
#   run_check NAME TIMEOUT CMD...      run one command, record PASS/FAIL
#   run_pair NAME TIMEOUT PORT "SERVER CMD" "CLIENT CMD"
#                           server + client on loopback (the server's port is
#                           awaited in network namespace $PAIR_NETNS if set);
#                           sets PAIR_SRV_LOG, PAIR_CLI_LOG, PAIR_SRV_RC, PAIR_CLI_RC
#   run_cases SHOW CASE...  client/server pairs from a table (see below)
#   pass NAME / fail NAME WHY   record a result
#   finish                  print the summary, exit 0 or 1
#
# Every process runs under `timeout`; every background process is recorded
# and killed on exit.

set -u

COMPAT_PASS=0
COMPAT_FAIL=0
COMPAT_FAILED_NAMES=()
COMPAT_BG_PIDS=()
COMPAT_START=$SECONDS
# Total time budget of one script (seconds); cases starting after it are
# reported as failed without being run, so the script ends before ctest's
# TIMEOUT kills it and the report stays readable.
COMPAT_BUDGET=${COMPAT_BUDGET:-270}

log() { printf '%s\n' "$*"; }

compat_cleanup() {
    local pid
    for pid in "${COMPAT_BG_PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            # timeout(1) forwards TERM to its child.
            kill -TERM "$pid" 2>/dev/null
        fi
    done
    sleep 0.2
    for pid in "${COMPAT_BG_PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    done
    if [ -n "${WORK:-}" ] && [ -d "$WORK" ]; then
        if [ "${COMPAT_KEEP_LOGS:-0}" = 1 ]; then
            log "logs kept in $WORK"
        else
            rm -rf "$WORK"
        fi
    fi
}

compat_init() {
    BUILD=${1:-}
    if [ -z "$BUILD" ]; then
        log "usage: $0 BUILD_DIR"
        exit 2
    fi
    BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { log "FAIL: build dir '$1' not found"; exit 1; }
    URDMA=$BUILD/bin/urdma
    if [ ! -x "$URDMA" ]; then
        log "FAIL: $URDMA not found (build the 'urdma' target)"
        exit 1
    fi
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/urdma-compat.XXXXXX")
    trap compat_cleanup EXIT
    trap 'exit 1' INT TERM HUP
    need_cmd timeout coreutils
    need_cmd ss iproute2
}

# need_cmd CMD PACKAGE: make sure CMD is available.
need_cmd() {
    local cmd=$1 pkg=$2
    command -v "$cmd" >/dev/null 2>&1 && return 0
    need_pkg "$pkg" "'$cmd'" "command -v $cmd"
}

# need_header CC HEADER PACKAGE: make sure CC finds <HEADER>.  (Debian's
# openmpi-bin brings mpicc without mpi.h, which libopenmpi-dev has.)
need_header() {
    local cc=$1 hdr=$2 pkg=$3
    has_header "$cc" "$hdr" && return 0
    need_pkg "$pkg" "<$hdr>" "has_header $cc $hdr"
}

has_header() {
    printf '#include <%s>\n' "$2" | "$1" -E -x c - >/dev/null 2>&1
}

# need_pkg PACKAGE WHAT CHECK: install PACKAGE (root), then CHECK must
# pass; else skip (exit 77), saying WHAT is missing.
need_pkg() {
    local pkg=$1 what=$2 check=$3
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing package $pkg (for $what)"
        DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y "$pkg" >"$WORK/apt.log" 2>&1 ||
            { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update >>"$WORK/apt.log" 2>&1 &&
              DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y "$pkg" >>"$WORK/apt.log" 2>&1; }
        $check >/dev/null 2>&1 && return 0
        tail -n 5 "$WORK/apt.log"
        log "SKIP: $what is missing and installing package '$pkg' failed"
        exit 77
    fi
    log "SKIP: $what not found; install the Debian package '$pkg' (apt-get install -y $pkg) as root"
    exit 77
}

# mpi_build: compile tests/compat/mpi_check.c into $WORK/mpi_check with
# mpicc; 1 (said) if it fails.
mpi_build() {
    mpicc -O2 -o "$WORK/mpi_check" "$(dirname "${BASH_SOURCE[0]}")/mpi_check.c" \
        >"$WORK/mpicc.log" 2>&1 && return 0
    log "FAIL: mpicc mpi_check.c"
    show_log "$WORK/mpicc.log" "mpicc output"
    return 1
}

# mpi_result NAME: the last run_check ran mpi_check: PASS if it exited 0
# and said ok (every byte and element checked).
mpi_result() {
    if [ "$CHECK_RC" -eq 0 ] && grep -qE '^mpi_check: ok:' "$CHECK_LOG"; then
        pass "$1"
        grep -E '^mpi_check' "$CHECK_LOG" | sed 's/^/  | /'
    else
        fail "$1" "exit status $CHECK_RC"
        show_log "$CHECK_LOG" "mpirun output"
    fi
}

pass() {
    COMPAT_PASS=$((COMPAT_PASS + 1))
    log "PASS: $1"
}

fail() {
    COMPAT_FAIL=$((COMPAT_FAIL + 1))
    COMPAT_FAILED_NAMES+=("$1")
    log "FAIL: $1${2:+ -- $2}"
}

finish() {
    log "----"
    log "summary: $COMPAT_PASS passed, $COMPAT_FAIL failed ($((SECONDS - COMPAT_START)) s)"
    if [ "$COMPAT_FAIL" -ne 0 ]; then
        local n
        for n in "${COMPAT_FAILED_NAMES[@]}"; do log "  failed: $n"; done
        exit 1
    fi
    if [ "$COMPAT_PASS" -eq 0 ]; then
        log "FAIL: nothing was checked"
        exit 1
    fi
    exit 0
}

# budget_left NAME: true if there is time left to run case NAME; otherwise
# records it as failed.
budget_left() {
    if [ $((SECONDS - COMPAT_START)) -ge "$COMPAT_BUDGET" ]; then
        fail "$1" "not run: time budget of ${COMPAT_BUDGET}s exhausted"
        return 1
    fi
    return 0
}

# show_log FILE: print the tail of a log, indented.
show_log() {
    local f=$1 label=${2:-$1} n
    n=$(wc -l <"$f" 2>/dev/null || echo 0)
    # A program's stderr comes before its buffered stdout: what it said
    # when it failed is often at the top of a long log.
    if [ "$n" -gt 25 ]; then
        log "  --- $label (first 10 lines) ---"
        head -n 10 "$f" | sed 's/^/  | /'
    fi
    log "  --- $label (last 25 lines) ---"
    tail -n 25 "$f" 2>/dev/null | sed 's/^/  | /'
}

# The network namespace run_pair's servers listen in (empty: this one; the
# multi-host tests in tests/net/ set it).
PAIR_NETNS=""

port_listening() {
    local -a ns=()
    local opt=-Hltn p=$1
    [ -n "$PAIR_NETNS" ] && ns=(ip netns exec "$PAIR_NETNS")
    case $p in udp:*) opt=-Hlun; p=${p#udp:} ;; esac # (a bound UDP socket)
    "${ns[@]}" ss "$opt" "sport = :$p" 2>/dev/null | grep -q .
}

# free_port BASE: print the first port >= BASE nobody listens on.
free_port() {
    local p=$1
    while port_listening "$p"; do p=$((p + 1)); done
    printf '%s\n' "$p"
}

# wait_listen PORT PID SECONDS: wait until PORT listens while PID lives.
wait_listen() {
    local port=$1 pid=$2 limit=$3 i=0
    while [ "$i" -lt $((limit * 20)) ]; do
        port_listening "$port" && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.05
        i=$((i + 1))
    done
    return 1
}

# q CMD...: the command as a readable, shell-quoted string.
q() {
    local out="" a
    for a in "$@"; do
        if [[ $a =~ ^[A-Za-z0-9_./:=,+@-]+$ ]]; then out+="$a "; else out+="$(printf '%q' "$a") "; fi
    done
    printf '%s' "${out% }"
}

# run_check NAME TIMEOUT CMD...: run CMD (bounded); output in $CHECK_LOG,
# status in $CHECK_RC.  Does not record a result.
run_check() {
    local name=$1 t=$2
    shift 2
    CHECK_LOG=$WORK/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_').log
    log "RUN: $(q "$@")"
    timeout -k 2 "$t" "$@" >"$CHECK_LOG" 2>&1
    CHECK_RC=$?
    if [ "$CHECK_RC" -eq 124 ]; then
        log "  (timed out after ${t}s)"
    fi
    return 0
}

# run_pair NAME TIMEOUT PORT SERVER_ARGV_STRING CLIENT_ARGV_STRING
# The argv strings are split on whitespace (no quoting needed by callers).
# The server starts first; once PORT listens the client starts.  If the
# client cannot connect (it exits quickly while the server is still up) it
# is retried a few times.  Both run under `timeout TIMEOUT`.
run_pair() {
    local name=$1 t=$2 port=$3 srv_s=$4 cli_s=$5
    local -a srv cli
    local base spid cpid attempt=1 t0
    read -r -a srv <<<"$srv_s"
    read -r -a cli <<<"$cli_s"
    base=$WORK/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_')
    PAIR_SRV_LOG=$base.server.log
    PAIR_CLI_LOG=$base.client.log
    PAIR_SRV_RC=-1
    PAIR_CLI_RC=-1
    PAIR_T0=${EPOCHREALTIME:-$SECONDS}

    PAIR_SECS=""
    log "RUN server: $(q "${srv[@]}")"
    timeout -k 2 "$t" "${srv[@]}" >"$PAIR_SRV_LOG" 2>&1 &
    spid=$!
    COMPAT_BG_PIDS+=("$spid")
    if ! wait_listen "$port" "$spid" 15; then
        log "  server did not listen on TCP port $port"
        if kill -0 "$spid" 2>/dev/null; then kill -TERM "$spid" 2>/dev/null; fi
        wait "$spid" 2>/dev/null
        PAIR_SRV_RC=$?
        return 0
    fi
    while :; do
        log "RUN client: $(q "${cli[@]}")"
        t0=$SECONDS
        timeout -k 2 "$t" "${cli[@]}" >"$PAIR_CLI_LOG" 2>&1 &
        cpid=$!
        COMPAT_BG_PIDS+=("$cpid")
        wait "$cpid"
        PAIR_CLI_RC=$?
        if [ "$PAIR_CLI_RC" -ne 0 ] && [ "$attempt" -lt 4 ] &&
           [ $((SECONDS - t0)) -le 2 ] && kill -0 "$spid" 2>/dev/null &&
           grep -qiE "couldn't connect|unable to (open|connect)|connection refused|failed to connect" "$PAIR_CLI_LOG"; then
            log "  client could not connect (attempt $attempt), retrying"
            attempt=$((attempt + 1))
            sleep 0.5
            continue
        fi
        break
    done
    if [ "$PAIR_CLI_RC" -ne 0 ]; then
        # The client failed: give the server a moment, then stop it.
        local i=0
        while kill -0 "$spid" 2>/dev/null && [ "$i" -lt 40 ]; do sleep 0.05; i=$((i + 1)); done
        kill -0 "$spid" 2>/dev/null && kill -TERM "$spid" 2>/dev/null
    fi
    wait "$spid"
    PAIR_SRV_RC=$?
    PAIR_SECS=$(awk -v a="$PAIR_T0" -v b="${EPOCHREALTIME:-$SECONDS}" 'BEGIN { printf "%.1f", b - a }')
    [ "$PAIR_SRV_RC" -eq 124 ] && log "  server timed out after ${t}s"
    [ "$PAIR_CLI_RC" -eq 124 ] && log "  client timed out after ${t}s"
    return 0
}

# pair_result NAME PATTERN [CHECKFN]: PASS if both sides exited 0, the client
# log matches the extended regex PATTERN (no check if PATTERN is empty) and,
# if given, `CHECKFN CLIENT_LOG` succeeds.  PAIR_NOTE is added to the PASS
# line; PAIR_SHOW names the function that shows the logs of a failure.
pair_result() {
    local name=$1 pat=$2 fn=${3:-} why=""
    if [ "$PAIR_SRV_RC" -ne 0 ]; then why="server exit status $PAIR_SRV_RC"; fi
    if [ "$PAIR_CLI_RC" -eq -1 ]; then why="${why:+$why, }client not started"
    elif [ "$PAIR_CLI_RC" -ne 0 ]; then why="${why:+$why, }client exit status $PAIR_CLI_RC"; fi
    if [ -z "$why" ] && [ -n "$pat" ] && ! grep -qE "$pat" "$PAIR_CLI_LOG"; then
        why="client output lacks /$pat/"
    fi
    if [ -z "$why" ] && [ -n "$fn" ] && ! "$fn" "$PAIR_CLI_LOG"; then
        why="client output fails check $fn"
    fi
    if [ -z "$why" ]; then
        pass "$name (${PAIR_SECS:-?} s${PAIR_NOTE:+, $PAIR_NOTE})"
        return 0
    fi
    fail "$name" "$why"
    "${PAIR_SHOW:-show_log}" "$PAIR_SRV_LOG" "server output"
    "${PAIR_SHOW:-show_log}" "$PAIR_CLI_LOG" "client output"
    return 1
}

# run_cases SHOW CASE...: one server/client pair per CASE, a string
# "name|program and arguments, both sides".  The server runs
# "$SRV_RUN PROGRAM ARGS -p PORT $SRV_ARGS", the client the same with
# $CLI_RUN and $CLI_ARGS, then $TARGET (the server's address).  Names get
# $CASE_PREFIX and $CASE_SUFFIX; ports start at $PORT_BASE and go on from
# one call to the next; each process has $T seconds.  A pair passes when
# both exit 0 and the client's log matches $RESULT_RE (and $RESULT_CHECK,
# a function of the log, if set); SHOW LOG then prints what to keep of it.
run_cases() {
    local show=$1 c name
    shift
    CASE_PORT=${CASE_PORT:-$PORT_BASE}
    for c in "$@"; do
        name="${CASE_PREFIX:-}${c%%|*}${CASE_SUFFIX:-}"
        budget_left "$name" || continue
        CASE_PORT=$(free_port "$CASE_PORT")
        log "== $name"
        run_pair "$name" "$T" "$CASE_PORT" \
            "$SRV_RUN ${c#*|} -p $CASE_PORT ${SRV_ARGS:-}" \
            "$CLI_RUN ${c#*|} -p $CASE_PORT ${CLI_ARGS:-} $TARGET"
        if pair_result "$name" "$RESULT_RE" "${RESULT_CHECK:-}"; then
            "$show" "$PAIR_CLI_LOG"
        fi
        CASE_PORT=$((CASE_PORT + 1))
    done
}

# run_multi NAME N PROGRAM_AND_ARGS: one server and N clients at once (a
# program whose server serves several clients, as ibv_xsrq_pingpong -c N),
# the commands built as run_cases builds them.  PASS when every process exits
# 0 and each client's log matches $RESULT_RE.
run_multi() {
    local name=$1 n=$2 prog=$3 port base spid rc i why=""
    local -a srv cli cpids=()
    budget_left "$name" || return 0
    CASE_PORT=$(free_port "${CASE_PORT:-$PORT_BASE}")
    port=$CASE_PORT
    CASE_PORT=$((port + 1))
    log "== $name"
    read -r -a srv <<<"$SRV_RUN $prog -p $port ${SRV_ARGS:-}"
    read -r -a cli <<<"$CLI_RUN $prog -p $port ${CLI_ARGS:-} $TARGET"
    base=$WORK/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_')
    log "RUN server: $(q "${srv[@]}")"
    timeout -k 2 "$T" "${srv[@]}" >"$base.server.log" 2>&1 &
    spid=$!
    COMPAT_BG_PIDS+=("$spid")
    if ! wait_listen "$port" "$spid" 15; then
        kill -TERM "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        fail "$name" "server did not listen on TCP port $port"
        show_log "$base.server.log" "server output"
        return 0
    fi
    for ((i = 1; i <= n; i++)); do
        log "RUN client $i: $(q "${cli[@]}")"
        timeout -k 2 "$T" "${cli[@]}" >"$base.client$i.log" 2>&1 &
        cpids+=("$!")
        COMPAT_BG_PIDS+=("$!")
    done
    for ((i = 1; i <= n; i++)); do
        wait "${cpids[i - 1]}"
        rc=$?
        if [ "$rc" -ne 0 ]; then
            why="${why:+$why, }client $i exit status $rc"
        elif [ -n "$RESULT_RE" ] && ! grep -qE "$RESULT_RE" "$base.client$i.log"; then
            why="${why:+$why, }client $i output lacks /$RESULT_RE/"
        fi
    done
    [ -n "$why" ] && kill -TERM "$spid" 2>/dev/null
    wait "$spid"
    rc=$?
    [ "$rc" -ne 0 ] && why="${why:+$why, }server exit status $rc"
    if [ -z "$why" ]; then
        pass "$name"
        return 0
    fi
    fail "$name" "$why"
    show_log "$base.server.log" "server output"
    for ((i = 1; i <= n; i++)); do show_log "$base.client$i.log" "client $i output"; done
}

# qp_type_perftest_cases DEVICE: perftest over XRC (-c XRC: send, Write,
# Read and atomics through an XRC target QP into an XRC SRQ) and UC (-c UC:
# send and Write; -n 500, fewer than the receives the server posts, as UC
# drops what finds none), as run_cases cases in QPT_PERFTEST_CASES; over UD
# (-c UD: Sends, the rate with -n 500 for the same reason) in
# UD_PERFTEST_CASES.
qp_type_perftest_cases() {
    local t
    UD_PERFTEST_CASES=(
        "ib_send_lat (UD)|ib_send_lat -d $1 -F -c UD -n 2000"
        "ib_send_lat (UD, all sizes)|ib_send_lat -d $1 -F -c UD -a -n 200"
        "ib_send_bw (UD)|ib_send_bw -d $1 -F -c UD -n 500"
    )
    QPT_PERFTEST_CASES=()
    for t in ib_send_bw ib_send_lat ib_write_bw ib_write_lat ib_read_bw \
             ib_read_lat ib_atomic_bw ib_atomic_lat; do
        need_cmd "$t" perftest
        QPT_PERFTEST_CASES+=("$t (XRC)|$t -d $1 -F -c XRC -n 500")
        case $t in ib_send_lat)
            QPT_PERFTEST_CASES+=("$t (XRC, CQ events)|$t -d $1 -F -c XRC -e -n 2000") ;;
        esac
        case $t in ib_send_* | ib_write_*)
            QPT_PERFTEST_CASES+=("$t (UC)|$t -d $1 -F -c UC -n 500") ;;
        esac
    done
}
show_nothing() { :; }

# Tables and checks shared by the loopback and the two-host scripts.
# ibv_rc_pingpong prints its rates; perftest a results table: a numeric row
# under the "#bytes" header.
RC_RESULT_RE='[0-9]+ bytes in [0-9.]+ seconds'
show_rc_rates() { grep -E 'bytes in|iters in' "$1" | sed 's/^/  | /'; }
# shellcheck disable=SC2317  # called through RESULT_CHECK
perftest_has_table() {
    awk '/#bytes/ { hdr = 1; next }
         hdr && /^[[:space:]]*[0-9]+[[:space:]]+[0-9]+/ { found = 1 }
         END { exit !found }' "$1"
}
show_perftest_table() {
    awk '/#bytes/ { hdr = 1 } hdr' "$1" | grep -vE '^-+$' | head -n 30 | sed 's/^/  | /'
}
# perftest_cases DEVICE: each ib_{send,write,read}_{lat,bw} with default
# parameters and with -a (all sizes, -n 100), and the _bw ones both ways at
# once with 1 MiB messages (-b: each side's sends wait for the other side to
# read), and the send and read tests sleeping on CQ events (-e; one channel
# for both CQs in Debian's perftest: a receive's event must not come before
# the event of the send it answers), and the send tests receiving through an
# SRQ (--use-srq; ib_send_lat also sleeping on events: perftest takes an
# event, arms, polls once, so an event for a completion it already polled
# breaks it), as run_cases cases in PERFTEST_CASES.
# -F: don't fail on differing per-core "cpu MHz" (VMs).
perftest_cases() {
    local t v
    PERFTEST_CASES=()
    for t in ib_send_lat ib_send_bw ib_write_lat ib_write_bw ib_read_lat ib_read_bw; do
        need_cmd "$t" perftest
        for v in "defaults|" "all sizes|-a -n 100" "both ways, 1 MiB|-b -s 1048576 -n 500" \
                "CQ events|-e -n 2000" "SRQ|--use-srq" "SRQ, CQ events|--use-srq -e -n 2000"; do
            case $t,$v in *_lat,both* | ib_write_*,CQ* | ib_write_*,SRQ* | ib_read_*,SRQ* | ib_send_bw,SRQ,*) continue ;; esac
            PERFTEST_CASES+=("$t (${v%%|*})|$t -d $1 -F ${v#*|}")
        done
    done
}
