#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Open MPI (Debian's openmpi-bin 4.1) on urdma, two ranks on one host:
# mpi_check.c (a ping-pong of every size to 4 MiB, each message checked,
# then MPI_Allreduce of up to 262,144 longs, every element checked) with
# `--mca pml ucx` over UCX's rc_verbs and ud_verbs, and over ud_verbs alone;
# `--mca pml ob1 --mca btl openib,self` with URDMA_LINK_LAYER=ib: Debian's
# openib was built without librdmacm, so its only connection scheme is udcm,
# which refuses a port whose link layer is Ethernet (urdma's default, as a
# RoCE NIC's), and Open MPI 4.1 takes an InfiniBand port for openib only
# with btl_openib_allow_ib (as on an InfiniBand NIC).
# Usage: mpi.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
COMPAT_BUDGET=${COMPAT_BUDGET:-150}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd mpirun openmpi-bin
need_cmd mpicc libopenmpi-dev
need_header mpicc mpi.h libopenmpi-dev

T=${COMPAT_MPI_TIMEOUT:-60}     # per job, seconds
mpi_build || exit 1
# (root: mpirun wants to be told; oversubscribe: 2 ranks fit on 1 core too)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)

for c in \
    "mpi pml ucx (rc_verbs)|UCX_TLS=rc_verbs,ud_verbs,self" \
    "mpi pml ucx (ud_verbs)|UCX_TLS=ud_verbs,self"; do
    name=${c%%|*}
    budget_left "$name" || continue
    log "== $name"
    run_check "$name" "$T" "$URDMA" run "${MPIRUN[@]}" --mca pml ucx -x "${c#*|}" \
        -x UCX_NET_DEVICES=urdma0:1 "$WORK/mpi_check"
    mpi_result "$name"
done

name="mpi pml ob1, btl openib (URDMA_LINK_LAYER=ib)"
if budget_left "$name"; then
    log "== $name"
    run_check "$name" "$T" env URDMA_LINK_LAYER=ib "$URDMA" run "${MPIRUN[@]}" \
        --mca pml ob1 --mca btl openib,self --mca btl_openib_allow_ib 1 \
        --mca btl_openib_warn_no_device_params_found 0 "$WORK/mpi_check"
    mpi_result "$name"
fi
finish
