#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Faults between two hosts (issue #3): urdma's TCP transport when the peer
# process dies or the link goes away.  Server in network namespace A, client
# in B (tests/net/netns.sh), both sides build/bin/fault_peer (tests/net/
# fault_peer.c: one RC QP, QPN/PSN/GID exchanged over a plain TCP socket, QP
# timeout 14 = 67 ms per try and retry_cnt 3: a retry budget of 268 ms).
#
#   ok           baseline: a fresh pair does WRITE + READ rounds, data checked
#   kill         the server keeps RDMA WRITEs and SENDs flowing to the client
#                (receives posted); the client is SIGKILLed mid-transfer.  The
#                server must see its first outstanding WR fail with
#                RETRY_EXC_ERR, every other one with WR_FLUSH_ERR, none left,
#                its QP in ERR, within the retry budget + slack of the kill; and
#                its open fd count, once the QP is destroyed, back to what it
#                was before the connection (the leak check)
#   link-peer    the client keeps RDMA WRITEs and READs flowing to the server;
#                `ip link set` takes the server's veth (namespace A) down: the
#                client must get RETRY_EXC_ERR between budget/2 and budget +
#                slack after it, every WR completed, its QP in ERR, and both
#                processes' fd counts back after destroying their QPs; the link
#                comes back up and a fresh pair (new QPs) must transfer (after
#                every link case: "after-link-...")
#   link-local   the same with the client's own veth (namespace B) taken down
#   link-late-rts  link-peer with a client that waits 100 ms between its
#                modifies to RTR and to RTS (the QP's timeout and retry_cnt are
#                RTS attributes; the TCP stream comes up at RTR)
#   link-reads   link-peer with a client that posts RDMA READs only
#   link-acked   link-reads, but the server's process is stopped (SIGSTOP) for
#                0.3 s before the link goes down and continued right after: the
#                client's requests are all acknowledged by TCP, only the
#                responses are lost
# Each fault_peer prints its measured times (RESULT ...) and fd counts (FDS
# ...); the summary repeats them.  The script sends the active side SIGUSR1
# (the "fault mark" times are measured from) and waits until it has taken it
# before each fault.
#
# Usage: faults.sh BUILD_DIR       (exit 0 pass, 1 fail, 77 skip: not root)
# Environment: NET_FAULTS_QP_TIMEOUT (14), NET_FAULTS_QP_RETRY (3),
# NET_FAULTS_SLACK_MS (1000), NET_FAULTS_HARD_S (10: a fault_peer gives up
# waiting for its WRs this long after the fault and reports a HANG),
# NET_FAULTS_TIMEOUT (60, per process), NET_FAULTS_PORT (19100),
# URDMA_LOG_LEVEL=debug for the transport's own account in the logs,
# COMPAT_KEEP_LOGS=1 to keep them, NET_FAULTS_CASES="kill link-peer ..." to
# run only those cases.  When the client is still waiting 3 s after
# a link fault the script prints its TCP sockets (ss -tnoi), link counters and
# each socket's TCP_USER_TIMEOUT.
# URDMA_NET_TRANSPORT=shm runs both sides in namespace A over shared memory
# (a check of the script; the link cases are not run then).
COMPAT_BUDGET=${COMPAT_BUDGET:-150}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$HERE/netns.sh"
compat_init "${1:-}"
FP=$BUILD/bin/fault_peer
if [ ! -x "$FP" ]; then
    log "FAIL: $FP not found (build the 'fault_peer' target)"
    exit 1
fi
netns_setup_or_skip
net_hosts || exit 1
PAIR_NETNS=$SRV_NS

PORT=${NET_FAULTS_PORT:-19100}
T=${NET_FAULTS_TIMEOUT:-60}    # per process, seconds (> 3 x NET_FAULTS_HARD_S)
QP_TIMEOUT=${NET_FAULTS_QP_TIMEOUT:-14}
QP_RETRY=${NET_FAULTS_QP_RETRY:-3}
SLACK_MS=${NET_FAULTS_SLACK_MS:-1000}
HARD_S=${NET_FAULTS_HARD_S:-10}   # fault_peer's bound of everything after a fault
FP_OPTS=(--timeout "$QP_TIMEOUT" --retry "$QP_RETRY" --slack-ms "$SLACK_MS" --hard-ms $((HARD_S * 1000)))
SUMMARY=()

# fp_start srv|cli TAG ARGS...: fault_peer as the server (namespace A) or the
# client, in the background under `timeout`.  Sets FP_BG (the timeout
# process), FP_LOG, FP_PIDF (where fault_peer writes its own pid).
fp_start() {
    local side=$1 tag=$2 run
    local -a pre
    shift 2
    if [ "$side" = srv ]; then run=$SRV_RUN; else run=$CLI_RUN; fi
    read -r -a pre <<<"$run"
    FP_LOG=$WORK/$tag.$side.log
    FP_PIDF=$WORK/$tag.$side.pid
    rm -f "$FP_PIDF"
    log "RUN $side: $(q "${pre[@]}" "$FP" "$@" --pidfile "$FP_PIDF")"
    timeout -k 2 "$T" "${pre[@]}" "$FP" "$@" --pidfile "$FP_PIDF" >"$FP_LOG" 2>&1 &
    FP_BG=$!
    COMPAT_BG_PIDS+=("$FP_BG")
}

# pid_of PIDFILE BGPID: fault_peer's own pid (for signals), once written.
pid_of() {
    local f=$1 bg=$2 i=0
    while [ ! -s "$f" ] && [ "$i" -lt 100 ] && kill -0 "$bg" 2>/dev/null; do
        sleep 0.05
        i=$((i + 1))
    done
    [ -s "$f" ] && cat "$f"
}

# wait_line FILE REGEX BGPID SECONDS: until FILE has a line matching REGEX.
wait_line() {
    local f=$1 re=$2 bg=$3 limit=$4 i=0
    while [ "$i" -lt $((limit * 20)) ]; do
        grep -qE "$re" "$f" 2>/dev/null && return 0
        kill -0 "$bg" 2>/dev/null || { grep -qE "$re" "$f" 2>/dev/null; return; }
        sleep 0.05
        i=$((i + 1))
    done
    return 1
}

# wait_gone BGPID SECONDS: true if BGPID ended within SECONDS.
wait_gone() {
    local bg=$1 limit=$2 i=0
    while kill -0 "$bg" 2>/dev/null && [ "$i" -lt $((limit * 20)) ]; do
        sleep 0.05
        i=$((i + 1))
    done
    ! kill -0 "$bg" 2>/dev/null
}

# wait_exit BGPID SECONDS: its exit status in WAIT_RC (stopped after SECONDS).
wait_exit() {
    local bg=$1 limit=$2 i=0
    while kill -0 "$bg" 2>/dev/null && [ "$i" -lt $((limit * 20)) ]; do
        sleep 0.05
        i=$((i + 1))
    done
    if kill -0 "$bg" 2>/dev/null; then
        log "  (process $bg still running after ${limit}s: stopping it)"
        kill -TERM "$bg" 2>/dev/null
        sleep 1
        kill -0 "$bg" 2>/dev/null && kill -KILL "$bg" 2>/dev/null
    fi
    wait "$bg"
    WAIT_RC=$?
}

# tcp_user_timeouts PID: TCP_USER_TIMEOUT of each TCP socket of PID (through
# pidfd_getfd, Linux >= 5.6; nothing without python3).
tcp_user_timeouts() {
    command -v python3 >/dev/null 2>&1 || return 0
    python3 - "$1" <<'PY' 2>&1
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
pfd = libc.syscall(434, pid, 0)  # pidfd_open
for fd in sorted(int(x) for x in os.listdir("/proc/%d/fd" % pid)):
    try:
        if not os.readlink("/proc/%d/fd/%d" % (pid, fd)).startswith("socket:"):
            continue
    except OSError:
        continue
    nfd = libc.syscall(438, pfd, fd, 0)  # pidfd_getfd
    if nfd < 0:
        continue
    s = socket.socket(fileno=nfd)
    try:
        if s.type == socket.SOCK_STREAM:
            try:
                peer = s.getpeername()[:2]
            except OSError:
                peer = "-"
            print("fd %d (peer %s): TCP_USER_TIMEOUT %d ms" %
                  (fd, peer, s.getsockopt(socket.IPPROTO_TCP, 18)))
    finally:
        s.detach()
        os.close(nfd)
PY
}

# show_result NAME LOG: the measured lines of a fault_peer log.
show_result() {
    grep -E '\] (RESULT|FDS|FAIL|first failed|later failed|QP state|async event|  [0-9]+ x |flow:|fault mark|ibv_post_send failed|HANG)' "$2" |
        sed 's/^/  | /'
}

# field LOG KEY: KEY=value from the RESULT or FDS line.
field() {
    grep -hoE "(^| )$2=[^ ]+" "$1" | tail -n 1 | sed 's/.*=//'
}

stop_bg() {
    local bg
    for bg in "$@"; do
        kill -0 "$bg" 2>/dev/null && kill -TERM "$bg" 2>/dev/null
    done
    for bg in "$@"; do wait "$bg" 2>/dev/null; done
}

# case_ok NAME: a fresh server/client pair must transfer (WRITE + READ rounds).
case_ok() {
    local name=$1 s c slog clog why=""
    budget_left "$name" || return
    log "== $name"
    PORT=$(free_port "$PORT")
    fp_start srv "$name" server "$PORT" --mode ok "${FP_OPTS[@]}"
    s=$FP_BG slog=$FP_LOG
    if ! wait_listen "$PORT" "$s" 15; then
        stop_bg "$s"
        fail "$name" "server did not listen on port $PORT"
        show_log "$slog" "server output"
        PORT=$((PORT + 1))
        return
    fi
    fp_start cli "$name" client "$SRV_IP" "$PORT" --mode ok --count 300 "${FP_OPTS[@]}"
    c=$FP_BG clog=$FP_LOG
    wait_exit "$c" 40
    local crc=$WAIT_RC
    wait_exit "$s" 20
    local src=$WAIT_RC
    PORT=$((PORT + 1))
    [ "$crc" -ne 0 ] && why="client exit status $crc"
    [ "$src" -ne 0 ] && why="${why:+$why, }server exit status $src"
    show_result "$name" "$clog"
    if [ -z "$why" ]; then
        pass "$name ($(field "$clog" rounds) rounds of $(field "$clog" bytes) B WRITE+READ in $(field "$clog" time_ms) ms)"
    else
        fail "$name" "$why"
        show_log "$slog" "server output"
        show_log "$clog" "client output"
    fi
}

# fp_flowing NAME MODE SIDE [CLIENT ARGS...]: a server/client pair in MODE,
# 0.3 s into its transfer (SIDE, srv or cli, says whose log shows it
# FLOWING).  Sets s c slog clog spid cpid of the caller (bash's dynamic
# scope); on failure records it, stops the pair and returns 1.
fp_flowing() {
    local name=$1 mode=$2 side=$3 spidf cpidf
    shift 3
    PORT=$(free_port "$PORT")
    fp_start srv "$name" server "$PORT" --mode "$mode" "${FP_OPTS[@]}"
    s=$FP_BG slog=$FP_LOG spidf=$FP_PIDF
    if ! wait_listen "$PORT" "$s" 15; then
        stop_bg "$s"
        fail "$name" "server did not listen on port $PORT"
        show_log "$slog" "server output"
        return 1
    fi
    fp_start cli "$name" client "$SRV_IP" "$PORT" --mode "$mode" "${FP_OPTS[@]}" "$@"
    c=$FP_BG clog=$FP_LOG cpidf=$FP_PIDF
    PORT=$((PORT + 1))
    local flog=$slog bg=$s
    [ "$side" = cli ] && flog=$clog bg=$c
    if ! wait_line "$flog" '\] FLOWING' "$bg" 20; then
        stop_bg "$c" "$s"
        fail "$name" "the transfer never got going"
        show_log "$slog" "server output"
        show_log "$clog" "client output"
        return 1
    fi
    sleep 0.3 # mid-transfer
    spid=$(pid_of "$spidf" "$s")
    cpid=$(pid_of "$cpidf" "$c")
    if [ -z "$spid" ] || [ -z "$cpid" ]; then
        stop_bg "$c" "$s"
        fail "$name" "no pid files"
        return 1
    fi
}

# case_kill: SIGKILL the receiving client while the server sends.
case_kill() {
    local name=kill s c slog clog spid cpid why=""
    budget_left "$name" || return
    log "== $name: SIGKILL the client while the server WRITEs and SENDs to it"
    fp_flowing "$name" kill srv || return
    # (stderr: no "Killed" line from the shell when it reaps the client)
    {
        kill -USR1 "$spid"
        # the server has taken the mark before the fault it measures
        wait_line "$slog" 'fault mark \(SIGUSR1\)' "$s" 5
        kill -KILL "$cpid"
        log "  sent the server the fault mark, SIGKILLed the client (pid $cpid)"
        wait_exit "$c" 10
    } 2>/dev/null
    local crc=$WAIT_RC
    wait_exit "$s" $((HARD_S + 20))
    local src=$WAIT_RC
    show_result "$name" "$slog"
    [ "$crc" -ne 137 ] && why="client exit status $crc, not 137 (SIGKILL)"
    if [ "$src" -ne 0 ]; then
        if [ "$src" -gt 128 ] && [ "$src" -lt 160 ]; then
            why="${why:+$why, }server killed by signal $((src - 128)) ($(kill -l $((src - 128)) 2>/dev/null))"
        else
            why="${why:+$why, }server exit status $src"
        fi
    fi
    if [ -z "$(field "$slog" first_error)" ] || [ "$(field "$slog" first_error)" = none ]; then
        SUMMARY+=("kill: the server got no error completion ($(field "$slog" outstanding_left) WRs left outstanding); fds before connection $(field "$slog" before_connection), after destroy_qp $(field "$slog" after_destroy_qp)")
    else
        SUMMARY+=("kill: server's first error $(field "$slog" first_error) $(field "$slog" error_after_mark_ms) ms after the kill, all outstanding WRs done after $(field "$slog" all_done_after_mark_ms) ms (budget $(field "$slog" budget_ms) ms, bound $(field "$slog" bound_ms) ms); fds before connection $(field "$slog" before_connection), after destroy_qp $(field "$slog" after_destroy_qp)")
    fi
    if [ -z "$why" ]; then
        pass "$name (first error $(field "$slog" error_after_mark_ms) ms after the kill)"
    else
        fail "$name" "$why"
        show_log "$slog" "server output"
        show_log "$clog" "client output"
    fi
}

# case_link peer|local NAME [CLIENT_ARGS...]: take a veth down while the
# client WRITEs and READs.
case_link() {
    local where=$1 name=$2 s c slog clog spid cpid why="" ns dev
    shift 2
    if [ "$where" = peer ]; then ns=$NS_A dev=$VETH_A; else ns=$NS_B dev=$VETH_B; fi
    budget_left "$name" || return
    log "== $name: $dev down (in $ns) while the client WRITEs and READs"
    fp_flowing "$name" link cli "$@" || return
    if [ "${LINK_STOP_SERVER:-0}" = 1 ]; then
        # The server's process (its responder) stops: its kernel still
        # acknowledges the client's requests, the responses wait.
        kill -STOP "$spid"
        sleep 0.3
        log "  stopped the server (SIGSTOP) for 0.3 s"
    fi
    kill -USR1 "$cpid"
    wait_line "$clog" 'fault mark \(SIGUSR1\)' "$c" 5
    ip -n "$ns" link set "$dev" down
    log "  sent the client the fault mark, took $dev down"
    if [ "${LINK_STOP_SERVER:-0}" = 1 ]; then
        kill -CONT "$spid"
        log "  server continued (SIGCONT)"
    fi
    if ! wait_gone "$c" 3; then
        # Bound + 2 s gone by: what TCP is doing (for the report).
        log "  client still running 3 s after the fault; its TCP sockets and link:"
        ip netns exec "$CLI_NS" ss -tnoi 2>&1 | grep -v cgroup2 | sed 's/^/  | /'
        ip -n "$CLI_NS" -s link show 2>&1 | sed 's/^/  | /'
        tcp_user_timeouts "$cpid" | sed 's/^/  | /'
    fi
    wait_exit "$c" $((HARD_S + 20))
    local crc=$WAIT_RC
    ip -n "$ns" link set "$dev" up
    log "  $dev up again"
    kill -USR2 "$spid" 2>/dev/null
    wait_exit "$s" 20
    local src=$WAIT_RC
    show_result "$name" "$clog"
    log "  server:"
    show_result "$name" "$slog"
    if [ "$crc" -ne 0 ]; then
        if [ "$crc" -gt 128 ] && [ "$crc" -lt 160 ]; then
            why="client killed by signal $((crc - 128)) ($(kill -l $((crc - 128)) 2>/dev/null))"
        else
            why="client exit status $crc"
        fi
    fi
    [ "$src" -ne 0 ] && why="${why:+$why, }server exit status $src"
    if [ -z "$(field "$clog" first_error)" ] || [ "$(field "$clog" first_error)" = none ]; then
        SUMMARY+=("$name: HANG: the client got no error completion in ${HARD_S} s after the link went down, $(field "$clog" outstanding_left) WRs left outstanding; client fds $(field "$clog" before_connection) -> $(field "$clog" after_destroy_qp), server fds $(field "$slog" before_connection) -> $(field "$slog" after_destroy_qp)")
    else
        SUMMARY+=("$name: client's first error $(field "$clog" first_error) on a $(field "$clog" first_wr) $(field "$clog" error_after_mark_ms) ms after the link went down ($(field "$clog" error_after_last_ok_ms) ms after its last success), all done after $(field "$clog" all_done_after_mark_ms) ms (budget $(field "$clog" budget_ms) ms, bound $(field "$clog" bound_ms) ms); client fds $(field "$clog" before_connection) -> $(field "$clog" after_destroy_qp), server fds $(field "$slog" before_connection) -> $(field "$slog" after_destroy_qp)")
    fi
    if [ -z "$why" ]; then
        pass "$name (RETRY_EXC_ERR $(field "$clog" error_after_mark_ms) ms after the link went down)"
    else
        fail "$name" "$why"
        show_log "$slog" "server output"
        show_log "$clog" "client output"
    fi
    case_ok "after-$name"
}

# want NAME: NAME is among $NET_FAULTS_CASES (default: all cases).
want() {
    [ -z "${NET_FAULTS_CASES:-}" ] || [[ " $NET_FAULTS_CASES " == *" $1 "* ]]
}

log "QP timeout $QP_TIMEOUT, retry_cnt $QP_RETRY: budget $(awk -v t="$QP_TIMEOUT" -v r="$QP_RETRY" 'BEGIN { printf "%.1f", 4.096e-3 * 2^t * (r + 1) }') ms, slack $SLACK_MS ms"
want baseline && case_ok baseline
want kill && case_kill
if [ "$NET_TRANSPORT" = shm ]; then
    log "(transport shm: no link between the sides, link cases not run)"
else
    want link-peer && case_link peer link-peer
    want link-local && case_link local link-local
    # An application may take its time between the modifies to RTR and to
    # RTS (the TCP stream comes up at RTR; timeout/retry_cnt come at RTS).
    want link-late-rts && case_link peer link-late-rts --rts-delay-ms 100
    # Only READs: once the link is gone the client has nothing unacknowledged
    # in TCP (its small requests got through; the responses are what is lost).
    want link-reads && case_link peer link-reads --reads-only
    # The same with every request of the client acknowledged by TCP before the
    # link goes down (the server's process stopped for 0.3 s just before, its
    # kernel still ACKing): only the responses are lost, and the client's TCP
    # has nothing unacknowledged that could time out.
    want link-acked && LINK_STOP_SERVER=1 case_link peer link-acked --reads-only
fi
log "----"
for l in "${SUMMARY[@]}"; do log "measured: $l"; done
finish
