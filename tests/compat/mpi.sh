#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Open MPI (Debian's openmpi-bin 4.1) on urdma, two ranks on one host:
# mpi_check.c (a ping-pong of every size to 4 MiB, each message checked,
# then MPI_Allreduce of up to 262,144 longs, every element checked) with
# `--mca pml ucx` over UCX's rc_verbs and ud_verbs, and over ud_verbs alone.
# Debian's openib BTL is not a case: it was built without librdmacm, so its
# only connection scheme is udcm, which refuses a port whose link layer is
# Ethernet (urdma's, as a RoCE NIC's: it fails there the same way).
# Usage: mpi.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip)
COMPAT_BUDGET=${COMPAT_BUDGET:-150}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"
compat_init "${1:-}"
need_cmd mpirun openmpi-bin
need_cmd mpicc libopenmpi-dev

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
finish
