#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# UCX and Open MPI on urdma between two hosts (network namespaces A and B
# over a veth pair): ucx_perftest, the server in A and the client in B,
# over UCT rc_verbs (am_lat, put_bw zero copy), UCT ud_verbs (am_lat) and
# UCP (tag_lat, tag_bw, ucp_put_bw, ucp_get); then mpirun, started in A, with one rank in each namespace
# (its rsh agent is a script that runs the command in B's namespace: no
# ssh), mpi_check.c with `--mca pml ucx`, every byte checked, and with
# `--mca pml ob1 --mca btl openib,self` on URDMA_LINK_LAYER=ib.  UCX is told
# nothing of GIDs: its own choice (the first RoCE v2 IPv4 GID) is the
# host's address, which urdma lists before loopback's.
# Usage: middleware.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
COMPAT_BUDGET=${COMPAT_BUDGET:-200}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$HERE/netns.sh"
compat_init "${1:-}"
need_cmd ucx_perftest ucx-utils
need_cmd mpirun openmpi-bin
need_cmd mpicc libopenmpi-dev
need_header mpicc mpi.h libopenmpi-dev
netns_setup_or_skip
net_hosts || exit 1
PAIR_NETNS=$SRV_NS

PORT=${NET_MW_PORT:-18700}
T=${NET_MW_TIMEOUT:-60}     # per process, seconds
UCX_RE='^Final: +[0-9]+ '

for c in \
    "uct rc_verbs am_lat|-d urdma0:1 -x rc_verbs|-t am_lat -n 5000" \
    "uct rc_verbs put_bw 1 MiB zcopy|-d urdma0:1 -x rc_verbs|-t put_bw -D zcopy -s 1048576 -n 200" \
    "uct ud_verbs am_lat|-d urdma0:1 -x ud_verbs|-t am_lat -n 5000" \
    "ucp tag_lat|UCP|-t tag_lat -n 5000" \
    "ucp tag_bw 256 KiB|UCP|-t tag_bw -s 262144 -n 300" \
    "ucp ucp_put_bw 256 KiB|UCP|-t ucp_put_bw -s 262144 -n 300" \
    "ucp ucp_get 64 KiB|UCP|-t ucp_get -s 65536 -n 500"; do
    IFS='|' read -r name sargs cargs <<<"$c"
    name="net ucx $name"
    [ "$sargs" = UCP ] && sargs=""
    budget_left "$name" || continue
    PORT=$(free_port "$PORT")
    log "== $name"
    run_pair "$name" "$T" "$PORT" \
        "$SRV_RUN env UCX_NET_DEVICES=urdma0:1 UCX_TLS=rc_verbs,ud_verbs,self ucx_perftest -p $PORT $sargs" \
        "$CLI_RUN env UCX_NET_DEVICES=urdma0:1 UCX_TLS=rc_verbs,ud_verbs,self ucx_perftest -p $PORT $sargs $cargs $SRV_IP"
    pair_result "$name" "$UCX_RE" && grep -E "$UCX_RE" "$PAIR_CLI_LOG" | sed 's/^/  | /'
    PORT=$((PORT + 1))
done

# mpirun in A; B's rank through an rsh agent that enters B's namespace.
name="net mpi pml ucx, one rank per namespace"
if budget_left "$name"; then
    log "== $name"
    if ! mpi_build; then
        fail "$name" "mpicc mpi_check.c"
    else
        cat >"$WORK/agent.sh" <<AGENT
#!/bin/sh
# mpirun's rsh agent: "host" $IP_B is namespace $CLI_NS
host=\$1; shift
[ "\$host" = "$CLI_IP" ] || { echo "agent: unknown host \$host" >&2; exit 1; }
exec ip netns exec $CLI_NS env URDMA_TRANSPORT=$NET_TRANSPORT URDMA_SHM_DIR=$WORK/shm-$CLI_NS sh -c "\$*"
AGENT
        chmod +x "$WORK/agent.sh"
        # (--bind-to none: each "host" would bind its rank to its first core,
        # both ranks to core 0 of this one machine)
        run_check "$name" "$T" ip netns exec "$SRV_NS" env URDMA_TRANSPORT="$NET_TRANSPORT" \
            URDMA_SHM_DIR="$WORK/shm-$SRV_NS" mpirun --allow-run-as-root -np 2 --bind-to none \
            --host "$SRV_IP,$CLI_IP" --mca plm_rsh_agent "$WORK/agent.sh" --mca pml ucx \
            -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=urdma0:1 \
            "$URDMA" run "$WORK/mpi_check"
        mpi_result "$name"
    fi
fi

# openib (udcm) needs an InfiniBand port, and addresses the other rank by
# its LID alone: urdma learns the LID's GID from udcm's UD address handle.
name="net mpi pml ob1, btl openib (URDMA_LINK_LAYER=ib), one rank per namespace"
if budget_left "$name"; then
    log "== $name"
    if [ ! -x "$WORK/mpi_check" ] || [ ! -x "$WORK/agent.sh" ]; then
        fail "$name" "mpi_check or the agent was not built (see above)"
    else
        run_check "$name" "$T" ip netns exec "$SRV_NS" env URDMA_TRANSPORT="$NET_TRANSPORT" \
            URDMA_SHM_DIR="$WORK/shm-$SRV_NS" URDMA_LINK_LAYER=ib mpirun --allow-run-as-root \
            -np 2 --bind-to none --host "$SRV_IP,$CLI_IP" --mca plm_rsh_agent "$WORK/agent.sh" \
            --mca pml ob1 --mca btl openib,self --mca btl_openib_allow_ib 1 \
            --mca btl_openib_warn_no_device_params_found 0 -x URDMA_LINK_LAYER \
            "$URDMA" run "$WORK/mpi_check"
        mpi_result "$name"
    fi
fi
finish
