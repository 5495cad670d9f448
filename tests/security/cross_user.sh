#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two users on one host (issue 17): a user this test creates, and root.
#
#  - root and the other user run ibv_rc_pingpong and rping against each
#    other, both ways: they work, over TCP on loopback (processes of two
#    users never share memory), and root's log says so at info level;
#  - a host directory that another user made (a directory, or a link to
#    one) is refused by root: shared memory is off, with an error that says
#    why, and root's programs still work (over TCP);
#  - a file of a third party, which the other user tries to make root write
#    through files planted in that directory, is untouched;
#  - a TCP QP of root's accepts only the peer it was given: the other user
#    connecting from loopback and claiming to be that peer (a QP of root's)
#    is refused, and so is anyone from another address than the peer's
#    (tcp_impostor; root claiming it from the right address is accepted,
#    which shows what refuses the others).
# The user and everything it made are removed at the end.  Root only (exit
# 77 otherwise).  Usage: cross_user.sh BUILD_DIR
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
compat_init "${1:-}"
[ "$(id -u)" = 0 ] || { log "SKIP: needs root (it creates a user)"; exit 77; }
need_cmd ibv_rc_pingpong ibverbs-utils
need_cmd rping rdmacm-utils
need_cmd useradd passwd
need_cmd runuser util-linux

T=25
TU=urdma-x$$
cleanup_user() {
    local uid
    uid=$(id -u "$TU" 2>/dev/null) || return 0
    pkill -KILL -u "$TU" 2>/dev/null
    sleep 0.2
    rm -rf "/dev/shm/urdma-$uid"
    userdel "$TU" 2>/dev/null
}
XNS=urdma-xu-$$ # tcp_wrong_address's own network namespace (below)
trap 'cleanup_user; ip netns del "$XNS" 2>/dev/null; compat_cleanup' EXIT
useradd -M -r -s /usr/sbin/nologin "$TU" || { log "FAIL: useradd $TU"; exit 1; }
TUID=$(id -u "$TU")

# The other user may not reach the build tree (a home directory): a copy of
# the tool and the libraries it can run.
chmod 755 "$WORK"
mkdir -p "$WORK/u/bin" "$WORK/u/lib/urdma"
cp "$URDMA" "$WORK/u/bin/urdma"
cp "$BUILD/bin/tcp_impostor" "$WORK/u/bin/"
cp -a "$BUILD"/lib/lib*.so* "$WORK/u/lib/urdma/"
chmod -R a+rX "$WORK/u"
U=$WORK/u/bin/urdma
ROOT_RUN="env URDMA_LOG_LEVEL=info $U run --"
USER_RUN="runuser -u $TU -- env URDMA_LOG_LEVEL=info $U run --"

GID_IDX=$("$URDMA" devices 2>/dev/null |
          sed -nE 's/^[[:space:]]*\[[[:space:]]*([0-9]+)\][[:space:]]+::ffff:127\.0\.0\.1([[:space:]].*)?$/\1/p' |
          head -n 1)
GID_IDX=${GID_IDX:-1}

# pingpong NAME PORT "SERVER PREFIX" "CLIENT PREFIX" EXTRA_ARGS SRV_LOG_RE:
# both sides exit 0, the client's result line is there and the server's log
# matches SRV_LOG_RE.
pingpong() {
    local name=$1 port=$2 srv=$3 cli=$4 args=$5 re=$6
    budget_left "$name" || return 0
    run_pair "$name" "$T" "$port" "$srv ibv_rc_pingpong -p $port $args" \
        "$cli ibv_rc_pingpong -p $port $args 127.0.0.1"
    if [ "$PAIR_SRV_RC" = 0 ] && [ "$PAIR_CLI_RC" = 0 ] &&
       grep -q "iters in" "$PAIR_CLI_LOG" && grep -qE "$re" "$PAIR_SRV_LOG"; then
        pass "$name"
    else
        fail "$name" "server rc $PAIR_SRV_RC, client rc $PAIR_CLI_RC"
        show_log "$PAIR_SRV_LOG" server
        show_log "$PAIR_CLI_LOG" client
    fi
}

LOOPBACK="not one of this user's: TCP over loopback"
pingpong root_server_user_client 18640 "$ROOT_RUN" "$USER_RUN" "-n 200 -c" "$LOOPBACK"
pingpong user_server_root_client 18641 "$USER_RUN" "$ROOT_RUN" "-n 200 -c" "$LOOPBACK"
pingpong root_user_gid 18642 "$ROOT_RUN" "$USER_RUN" "-n 200 -g $GID_IDX" \
    "not one of this user's: TCP over its address"

# rdma_cm: rping, both ways.
for dir in root_user user_root; do
    name=rping_$dir
    budget_left "$name" || continue
    if [ $dir = root_user ]; then srv=$ROOT_RUN cli=$USER_RUN; else srv=$USER_RUN cli=$ROOT_RUN; fi
    run_pair "$name" "$T" 18643 "$srv rping -s -a 127.0.0.1 -p 18643 -C 20 -v" \
        "$cli rping -c -a 127.0.0.1 -p 18643 -C 20 -v"
    if [ "$PAIR_SRV_RC" = 0 ] && [ "$PAIR_CLI_RC" = 0 ] &&
       [ "$(grep -c 'ping data' "$PAIR_CLI_LOG")" -ge 20 ]; then
        pass "$name"
    else
        fail "$name" "server rc $PAIR_SRV_RC, client rc $PAIR_CLI_RC"
        show_log "$PAIR_SRV_LOG" server
        show_log "$PAIR_CLI_LOG" client
    fi
done

# impostor NAME DGID JOINER WANT_JOIN WANT_VICTIM: root's victim QP expects
# its peer at DGID; JOINER ("root" or "user") claims to be that peer.  Both
# run in network namespace $IMPOSTOR_NS if it is set.
impostor() {
    local name=$1 dgid=$2 who=$3 want_join=$4 want_victim=$5 a b vpid jrc vrc
    local run="$ROOT_RUN" ns=""
    [ "$who" = user ] && run="$USER_RUN"
    [ -n "${IMPOSTOR_NS:-}" ] && ns="ip netns exec $IMPOSTOR_NS"
    budget_left "$name" || return 0
    $ns env URDMA_TRANSPORT=tcp timeout 20 $ROOT_RUN "$WORK/u/bin/tcp_impostor" victim "$dgid" 3 \
        >"$WORK/$name.victim" 2>&1 &
    vpid=$!
    COMPAT_BG_PIDS+=("$vpid")
    for _ in $(seq 50); do [ -s "$WORK/$name.victim" ] && break; sleep 0.1; done
    read -r a b <"$WORK/$name.victim"
    $ns timeout 20 $run "$WORK/u/bin/tcp_impostor" join "$a" "$b" >"$WORK/$name.join" 2>&1
    jrc=$?
    wait "$vpid"
    vrc=$?
    if [ "$jrc" = "$want_join" ] && [ "$vrc" = "$want_victim" ]; then
        pass "$name"
    else
        fail "$name" "join exit $jrc (want $want_join), victim exit $vrc (want $want_victim)"
        show_log "$WORK/$name.victim" victim
        show_log "$WORK/$name.join" join
    fi
}
impostor tcp_user_claims_root_peer lid user 0 0
# (in a namespace of its own, with loopback only: 192.0.2.99 has no route
# there, so nothing the victim's QP tries leaves the host)
if ip netns add "$XNS" 2>/dev/null && ip -n "$XNS" link set lo up; then
    IMPOSTOR_NS=$XNS impostor tcp_wrong_address 192.0.2.99 root 0 0
    ip netns del "$XNS"
else
    fail tcp_wrong_address "no network namespace of its own"
fi
impostor tcp_root_claims_root_peer lid root 3 3

# A host directory the other user made, with what they planted in it: a
# record for every QPN root's QPs could take is not possible, but a few
# records and a "context socket" naming the other user's own process are;
# a third party's file is what they would like root to write.
PUB=$WORK/pub # like /tmp: anyone may create there
mkdir -m 1777 "$PUB"
FOREIGN=$PUB/foreign
VICTIM=$WORK/third-party
printf 'third party\n' >"$VICTIM"
chown nobody "$VICTIM" 2>/dev/null
chmod 644 "$VICTIM"
SUM0=$(sha256sum "$VICTIM")
runuser -u "$TU" -- mkdir -m 777 "$FOREIGN"
runuser -u "$TU" -- sh -c "for q in 1 2 3; do printf 'urma' > $FOREIGN/qp-\$q; done; mkfifo $FOREIGN/ctx-51"
runuser -u "$TU" -- ln -s /dev/shm "$PUB/link"
[ -d "$FOREIGN" ] && [ -L "$PUB/link" ] || { fail foreign_setup "the other user's files"; finish; }
for d in "$FOREIGN" "$PUB/link"; do
    name=foreign_dir_$(basename "$d")
    FOREIGN_RUN="env URDMA_LOG_LEVEL=info URDMA_SHM_DIR=$d $U run --"
    pingpong "$name" 18644 "$FOREIGN_RUN" "$FOREIGN_RUN" "-n 200 -c" "shared memory is off"
done
if [ "$(sha256sum "$VICTIM")" = "$SUM0" ]; then
    pass third_party_file_untouched
else
    fail third_party_file_untouched "it changed"
fi
# Nothing of root's was created in the other user's directory.
if [ -z "$(find "$FOREIGN" -user 0 2>/dev/null)" ]; then
    pass nothing_of_root_in_foreign_dir
else
    fail nothing_of_root_in_foreign_dir "$(find "$FOREIGN" -user 0)"
fi
finish
