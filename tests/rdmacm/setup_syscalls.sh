#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Connection set-up without waste: Debian's cmtime with N connections (QPs
# over shared memory), server and client on 127.0.0.1, the client under
# `strace -f -c`.  Per connection the client may make at most
#   - 1.25 reads of a QP record (pread64): the one urdma_pick_transport reads
#     is the one the transport attaches with;
#   - 2.25 connect calls: its CM socket and the route's UDP socket, no knock
#     on a peer context's socket it is already connected to;
#   - 0.25 sendmsg: a context hands its memory to a peer once (SCM_RIGHTS),
#     not to every knock;
#   - 0.25 fallocate: a small QP block freed is zeroed in place and kept,
#     not punched out of the memfd (a TLB shoot-down in every process);
#   - 0.5 mmap and 0.25 munmap: the QP and CM id (1.5-2.5 KiB) come from
#     the library's slabs, not a mapping each;
#   - SETUP_BUDGET (55) system calls in all, futex and sched_yield left out (lock
#     hand-offs, and cmtime's own wait for its steps, vary with timing).
# Usage: setup_syscalls.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=cases.sh
. "$HERE/cases.sh"
compat_init "${1:-}"
need_cmd cmtime rdmacm-utils
need_cmd strace strace

N=${SETUP_CONNS:-200}
SETUP_BUDGET=${SETUP_BUDGET:-55}
CASE_PORT=${RDMACM_SETUP_PORT:-19760}
T=${RDMACM_SETUP_TIMEOUT:-60}
STRACE_OUT=$WORK/strace.txt

cm_pair "cmtime $N" "$URDMA run cmtime -c $N -p $CASE_PORT" \
    "$URDMA run strace -f -c -U calls,errors,name -o $STRACE_OUT cmtime -c $N -p $CASE_PORT -s 127.0.0.1" 1

# per_conn: "NAME CALLS/N" for every system call of the summary.
per_conn() {
    awk -v n="$N" '/^-+ -+/ { t = 1; next }
        t && $1 ~ /^[0-9]+$/ && $NF != "total" { printf "%s %.2f\n", $NF, $1 / n }' "$STRACE_OUT"
}
# over NAME LIMIT: prints why when NAME's calls per connection pass LIMIT.
over() {
    per_conn | awk -v s="$1" -v max="$2" '$1 == s && $2 > max {
        printf "%s: %.2f calls per connection (at most %s)", s, $2, max }'
}

name="cmtime $N connections: system calls per connection"
if [ "$PAIR_CLI_RC" -ne 0 ] || [ "$PAIR_SRV_RC" -ne 0 ] || ! cmtime_ok "$PAIR_CLI_LOG" || [ ! -s "$STRACE_OUT" ]; then
    fail "$name" "cmtime failed (client $PAIR_CLI_RC, server $PAIR_SRV_RC)"
    show_log "$PAIR_CLI_LOG" "client"
    show_log "$PAIR_SRV_LOG" "server"
else
    total=$(per_conn | awk '$1 != "futex" && $1 != "sched_yield" { s += $2 } END { printf "%.1f", s }')
    why=""
    # (each connection connects its CM socket: else the summary was not read)
    if ! per_conn | awk '$1 == "connect" && $2 >= 1 { ok = 1 } END { exit !ok }'; then
        why="no connect per connection in the strace summary: it was not read"
    fi
    for lim in "pread64 1.25" "connect 2.25" "sendmsg 0.25" "fallocate 0.25" \
    "mmap 0.5" "munmap 0.25"; do
        # shellcheck disable=SC2086  # (two words: name and limit)
        w=$(over $lim)
        [ -n "$w" ] && why+="${why:+; }$w"
    done
    if awk -v t="$total" -v b="$SETUP_BUDGET" 'BEGIN { exit !(t > b) }'; then
        why+="${why:+; }$total system calls per connection (at most $SETUP_BUDGET)"
    fi
    if [ -z "$why" ]; then
        pass "$name ($total, futex and sched_yield aside)"
    else
        fail "$name" "$why"
    fi
    per_conn | sort -k2 -rn | head -n 15 | sed 's/^/  | /'
fi
finish
