#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# qp_scale (tests/scale/qp_scale.c) on urdma:
#   shm: 16,384 connected RC QPs, each carrying a Write that the target
#        checks; the same with the process's mappings nearly used up (a QP
#        takes none); QPs up to max_qp, then ENOMEM.
#   tcp: 16,384 QPs (a stream and an fd each: fewer if the hard fd limit
#        is lower); 4,096 with the writer stopped for 1.5 s after its
#        posts; then with the fds nearly used up:
#        ibv_modify_qp fails with EMFILE, or the Write completes in error,
#        never a silent success.
#   cq_scale: 4,096 QPs feeding one receive CQ, from one SRQ and from
#        rings of their own: a poll and an arm cost what they cost with
#        one QP, every message taken once.
# Usage: scale.sh BUILD_DIR     (exit 0 pass, 1 fail)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
compat_init "${1:-}"
QS=$BUILD/bin/qp_scale
CQS=$BUILD/bin/cq_scale

# prog_case NAME TRANSPORT TIMEOUT PROG ARGS...: PROG (qp_scale or
# cq_scale) must exit 0 and print its lines.
prog_case() {
    local name=$1 tr=$2 t=$3 prog=$4 tag
    shift 4
    tag=$(basename "$prog")
    run_check "$name" "$t" env URDMA_TRANSPORT="$tr" "$URDMA" run "$prog" "$@"
    if [ "$CHECK_RC" -eq 0 ] && grep -q "^$tag" "$CHECK_LOG"; then
        pass "$name"
        grep "^$tag" "$CHECK_LOG" | sed 's/^/  | /'
    else
        fail "$name" "exit status $CHECK_RC"
        show_log "$CHECK_LOG"
    fi
}

# scale_case NAME TRANSPORT TIMEOUT ARGS...: qp_scale must exit 0.
scale_case() {
    local name=$1 tr=$2 t=$3
    shift 3
    prog_case "$name" "$tr" "$t" "$QS" "$@"
}

scale_case "shm: 16384 QPs" shm 120 16384
# One receive CQ behind 4,096 QPs, on one SRQ as UCX and MPI have it, or
# each with its own receives.  On the SRQ an empty poll took 7,500 times as
# long as with one QP, a message 950 times (the poll walked every QP, and
# the SRQ's taker searched its QPs' list for each completion); with rings
# of their own 4,900 and 480 times (the walk), until the CQ's bell; and
# an arm 7,500 times (it wrote every QP's block) until one notify word.
cq_case() {
    local name=$1 t=$2
    shift 2
    prog_case "$name" shm "$t" "$CQS" "$@"
}
cq_case "shm: a CQ behind 4096 QPs on an SRQ polls and arms as behind 1" 60 4096 srq
cq_case "shm: a CQ behind 4096 QPs with own rings polls and arms as behind 1" 60 4096 ring
scale_case "shm: 2048 QPs, mappings nearly used up" shm 60 2048 --limit maps
# A QP takes no mapping (its blocks are in the identity memfd): all of them
# must connect and write, not only fail cleanly.
if [ "$(grep -c ' 2048 connected .* 2048 written, 0 failed' "$CHECK_LOG")" != 2 ]; then
    fail "shm: every QP connected with the mappings nearly used up" "see above"
fi
scale_case "shm: max_qp, then ENOMEM" shm 120 --max
# The Writes go right after RTS, while the streams still come up (3,000 to
# 5,000 a second here), at the default timeout 14 (a retry budget of
# 0.54 s): a WR waiting for a stream does not fail while streams keep
# coming up (tcp_setup_moving); when the budget ran from the post, 11,014
# of 16,384 Writes failed.
NTCP=16384
HARD=$(ulimit -Hn)
if [ "$HARD" != unlimited ] && [ "$HARD" -lt $((NTCP + 1000)) ]; then
    NTCP=$((HARD > 2000 ? HARD - 1000 : 1000))
    log "note: hard fd limit $HARD: $NTCP QPs over TCP"
fi
scale_case "tcp: $NTCP QPs" tcp 150 "$NTCP"
# A busy host may not run the process for a second: the writer stopped
# (SIGSTOP) for 1.5 s with its Writes posted.  On waking it found no stream
# had come up for that long; with the budget counted from the post, 3,500
# of 4,096 Writes failed at once (RETRY_EXC_ERR), before its progress thread
# had a turn.  1 in 12 runs of the case above failed one Write that way.
QS_STALL_MS=1500 scale_case "tcp: 4096 QPs, the writer stopped 1.5 s" tcp 60 4096
scale_case "tcp: 600 QPs, fds nearly used up" tcp 120 600 --limit fds
if [ "$CHECK_RC" -eq 0 ] && ! grep -q 'Too many open files' "$CHECK_LOG"; then
    fail "tcp: fds used up: EMFILE reported" "no EMFILE in the log"
fi

finish
