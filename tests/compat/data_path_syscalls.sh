#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# No system call per message on the shared-memory data path: Debian's
# perftest ib_{send,write,read,atomic}_lat and UD ib_send_lat (-n 2000,
# both processes on this host) with the client under `strace -f -c`.  A
# case fails when any system call was made N/4 times or more (set-up
# makes fewer than 100 of each).
# Over TCP, a stream of small messages (ib_send_bw, ib_write_bw -s 8, -n
# NSMALL) goes in few writes: the client's sendto, sendmsg, write and
# writev calls together, counted by perf stat, fewer than NSMALL/2 (one a
# message before the transport held small messages back: tx_hold; 0.08 a
# message, 0.09-0.13 beside two busy loops).  Not by strace: its stop at
# each write slows the sender enough for the 50 us timer to push more
# often, and its counts went from 0.15 to 0.94 a message with the load.
# And a 64 KiB ib_send_lat over TCP wakes the progress thread rarely, nor
# does ib_send_lat -e over shared memory (RC and UD).
# Usage: data_path_syscalls.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd ib_send_lat perftest
need_cmd strace strace
need_cmd perf linux-perf

N=2000
PORT_BASE=${COMPAT_SYSCALLS_PORT:-18780}
T=${COMPAT_SYSCALLS_TIMEOUT:-60}
SRV_RUN="$URDMA run"
CLI_RUN="$URDMA run strace -f -c -U calls,name"
TARGET=127.0.0.1
RESULT_RE='#bytes'

# The strace summary in the client's log: at most N/4 calls of each.
few_syscalls() {
    awk -v max=$((N / 4)) '
        /^-+ -+/ { table = 1; next }
        table && $1 ~ /^[0-9]+$/ && $2 != "total" && $1 >= max {
            printf "  %s: %d calls for %d messages\n", $2, $1, '"$N"'; bad = 1 }
        END { exit bad }' "$1"
}
RESULT_CHECK=few_syscalls
show_calls() { grep -A12 -E '^ *calls +syscall' "$1" | sed 's/^/  | /'; }

CASES=()
for t in ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat; do
    need_cmd "$t" perftest
    CASES+=("$t|$t -d ${COMPAT_DEVICE:-urdma0} -F -n $N")
done
# (a UD Send took getpid for the ring's lock: a system call each)
CASES+=("ib_send_lat, UD|ib_send_lat -d ${COMPAT_DEVICE:-urdma0} -F -n $N -c UD")
run_cases show_calls "${CASES[@]}"

NSMALL=20000
WRITES="sendto sendmsg write writev"
few_sends() {
    awk -F, -v max=$((NSMALL / 2)) -v want="$(wc -w <<<"$WRITES")" '
        $1 ~ /^[0-9]+$/ && $3 ~ /^syscalls:sys_enter_/ { s += $1; n++ }
        END { if (n != want) { print "  no count by perf stat"; exit 1 }
              if (s >= max) printf "  %d writes for %d messages\n", s, '"$NSMALL"'
              exit s >= max }' "$1"
}
show_counts() {
    awk -F, '$3 ~ /^syscalls:sys_enter_/ { printf "  | %8s %s\n", $1, substr($3, 20) }' "$1"
}
RESULT_CHECK=few_sends
SRV_RUN="env URDMA_TRANSPORT=tcp $URDMA run"
CLI_RUN="env URDMA_TRANSPORT=tcp $URDMA run perf stat -x , -e $(printf 'syscalls:sys_enter_%s,' $WRITES | sed 's/,$//') --"
CASES=()
for t in ib_send_bw ib_write_bw; do
    need_cmd "$t" perftest
    CASES+=("$t over TCP, 8 B|$t -d ${COMPAT_DEVICE:-urdma0} -F -s 8 -n $NSMALL")
done
run_cases show_counts "${CASES[@]}"

# A 64 KiB ping-pong over TCP is received by the polling application, not
# handed to the progress thread part way through each message: the
# client's epoll waits (the progress thread's) fewer than N/4 (0.7 a
# message when a poll that took the first segments unparked the stream;
# 0.03 now).
WAITS_DIV=4
few_waits() {
    awk -v max=$((N / WAITS_DIV)) '
        /^-+ -+/ { table = 1; next }
        table && $1 ~ /^[0-9]+$/ && $2 ~ /^epoll_/ { s += $1 }
        END { if (s >= max) printf "  %d epoll waits for %d messages\n", s, '"$N"'
              exit s >= max }' "$1"
}
RESULT_CHECK=few_waits
# Each side on a CPU of its own, as the benchmarks run (unpinned, the
# progress thread often found the other CPU free, and 0.16 a message).
PIN_SRV="" PIN_CLI=""
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    PIN_SRV="taskset -c 1" PIN_CLI="taskset -c 0"
fi
SRV_RUN="env URDMA_TRANSPORT=tcp $PIN_SRV $URDMA run"
CLI_RUN="env URDMA_TRANSPORT=tcp $PIN_CLI $URDMA run strace -f -c -U calls,name --seccomp-bpf -e trace=epoll_wait,epoll_pwait,epoll_pwait2"
run_cases show_calls "ib_send_lat over TCP, 64 KiB|ib_send_lat -d ${COMPAT_DEVICE:-urdma0} -F -s 65536 -n $N"
# In events mode over shared memory the peer wakes the thread asleep in
# ibv_get_cq_event itself, not our progress thread first (core/wake.c):
# the client's epoll waits fewer than N/2 (about one a message before).
# Not fewer: a sleeper of under WAKE_DIRECT_NS is left to the progress
# thread, so the count follows the machine's load.  RC: 15-22 by hand,
# 581 in one make check run; UD: 20-490 by hand (the libraries of eece00b
# and 30589ec alike), 746 in one make check run.  Counted under strace,
# which slows the sleeper past WAKE_DIRECT_NS: unslowed (perf stat), RC
# made 16 to 5,136 waits in 2,000 messages and UD 3,315 to 7,079, at the
# same latency.  So these cases catch a return to one wake-up a message
# under strace only; why the unslowed count varies so is not known.
WAITS_DIV=2
SRV_RUN="$PIN_SRV $URDMA run"
CLI_RUN="$PIN_CLI $URDMA run strace -f -c -U calls,name --seccomp-bpf -e trace=epoll_wait,epoll_pwait,epoll_pwait2"
run_cases show_calls "ib_send_lat -e|ib_send_lat -d ${COMPAT_DEVICE:-urdma0} -F -n $N -e"
run_cases show_calls "ib_send_lat -e, UD|ib_send_lat -d ${COMPAT_DEVICE:-urdma0} -F -n $N -e -c UD"
finish
