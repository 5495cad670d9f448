#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# urdma under middleware, next to the middleware's own transports, in the
# same run (a benchmark: exits 0 unless misused).  bench.sh runs it last
# (BENCH_MW=0 leaves it out); it also runs alone: middleware.sh [BUILD_DIR].
#
#   Open MPI, two ranks, tests/compat/mpi_check.c's 8 B one-way latency and
#   1 MiB bandwidth: on one host, `--mca pml ucx` over urdma (rc_verbs) next
#   to ob1 with vader (Open MPI's shared memory); between two network
#   namespaces, pml ucx over urdma next to ob1 with tcp.
#   UCX UCP tag_lat 8 B (p50) and tag_bw 1 MiB: over urdma (rc_verbs) next to
#   UCX's posix (one host) and tcp (one host, and between namespaces).
#
# BENCH_MW_REPS (default 3) repetitions, interleaved; medians printed as a
# Markdown table (stdout).  Goals (issue 22): MPI 8 B latency on one host
# within 1.5x of vader; between namespaces ahead of tcp.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${1:-$HERE/../build}
BUILD=$(cd "$BUILD" && pwd) || exit 2
URDMA=$BUILD/bin/urdma
REPS=${BENCH_MW_REPS:-3}
WORK=$(mktemp -d /tmp/urdma-bench-mw.XXXXXX)
PORT=${BENCH_MW_PORT:-18900}
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
# shellcheck source-path=SCRIPTDIR source=../tests/net/netns.sh
. "$HERE/../tests/net/netns.sh"
trap 'rm -rf "$WORK"' EXIT

for c in mpirun mpicc ucx_perftest; do
    if ! command -v "$c" >/dev/null; then
        say "bench middleware: '$c' not found (openmpi-bin, libopenmpi-dev, ucx-utils): rows n/a"
        exit 0
    fi
done
mpicc -O2 -o "$WORK/mpi_check" "$HERE/../tests/compat/mpi_check.c" 2>"$WORK/mpicc.log" || {
    say "bench middleware: mpicc failed (see $WORK/mpicc.log)"; exit 0; }

VETH=0
if netns_setup; then
    VETH=1
    cat >"$WORK/agent.sh" <<AGENT
#!/bin/sh
host=\$1; shift
exec ip netns exec $NS_B env URDMA_SHM_DIR=$WORK/shm-b sh -c "\$*"
AGENT
    chmod +x "$WORK/agent.sh"
else
    say "bench middleware: namespace rows n/a: $NETNS_ERROR"
fi

keep() { is_num "$2" && VALS[$1]="${VALS[$1]:-} $2"; }

# mpi KEY ENV-and-mpirun-args...: latency into KEY.lat, bandwidth into KEY.bw
mpi() {
    local key=$1 line
    shift
    line=$(timeout 120 "$@" 2>/dev/null | grep '^mpi_check: ok')
    keep "$key.lat" "$(sed -nE 's/.*latency ([0-9.]+) us.*/\1/p' <<<"$line")"
    keep "$key.bw" "$(sed -nE 's/.*bandwidth ([0-9.]+) MB.*/\1/p' <<<"$line")"
}

# ucp KEY TEST SIZE ENV...: ucx_perftest loopback (or across namespaces when
# KEY starts with veth), p50 latency in usec or bandwidth in MB/s
ucp() {
    local key=$1 t=$2 s=$3 srv cli out col=2 dst spid end ns=()
    shift 3
    PORT=$((PORT + 1))
    if [[ $key == veth* ]]; then
        srv=(ip netns exec "$NS_A" env URDMA_SHM_DIR="$WORK/shm-a" "$@")
        cli=(ip netns exec "$NS_B" env URDMA_SHM_DIR="$WORK/shm-b" "$@")
        dst=$IP_A
        ns=(ip netns exec "$NS_A")
    else
        srv=(env "$@")
        cli=(env "$@")
        dst=127.0.0.1
    fi
    timeout 90 "${srv[@]}" ucx_perftest -p "$PORT" >"$WORK/srv.log" 2>&1 &
    spid=$!
    end=$((SECONDS + 10))  # until the server listens: the client does not retry
    until "${ns[@]}" ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q . ||
          [ $SECONDS -ge $end ]; do
        sleep 0.05
    done
    out=$(timeout 60 "${cli[@]}" ucx_perftest -p "$PORT" -t "$t" -s "$s" -n "$([ "$t" = tag_lat ] && echo 20000 || echo 300)" "$dst" 2>/dev/null |
          awk '/^Final:/ { print }')
    wait "$spid" 2>/dev/null
    [ "$t" = tag_bw ] && col=6
    keep "$key" "$(awk -v c="$col" '{ print $(c + 1) }' <<<"$out")"
}

URUN=("$URDMA" run)
UCX_URDMA=("UCX_TLS=rc_verbs,ud_verbs,self" "UCX_NET_DEVICES=urdma0:1")
MPIRUN=(mpirun --allow-run-as-root -np 2)
for rep in $(seq "$REPS"); do
    say "bench middleware: repetition $rep of $REPS"
    mpi lo.urdma "${URUN[@]}" "${MPIRUN[@]}" --mca pml ucx -x UCX_TLS=rc_verbs,ud_verbs,self \
        -x UCX_NET_DEVICES=urdma0:1 "$WORK/mpi_check"
    mpi lo.vader "${MPIRUN[@]}" --mca pml ob1 --mca btl vader,self "$WORK/mpi_check"
    ucp lo.ucp_lat.urdma tag_lat 8 "${UCX_URDMA[@]}" "${URUN[@]}"
    ucp lo.ucp_lat.posix tag_lat 8 UCX_TLS=posix,self
    ucp lo.ucp_lat.tcp tag_lat 8 UCX_TLS=tcp,self
    ucp lo.ucp_bw.urdma tag_bw 1048576 "${UCX_URDMA[@]}" "${URUN[@]}"
    ucp lo.ucp_bw.posix tag_bw 1048576 UCX_TLS=posix,self
    ucp lo.ucp_bw.tcp tag_bw 1048576 UCX_TLS=tcp,self
    if [ "$VETH" = 1 ]; then
        mpi veth.urdma ip netns exec "$NS_A" env URDMA_SHM_DIR="$WORK/shm-a" "${MPIRUN[@]}" \
            --bind-to none --host "$IP_A,$IP_B" --mca plm_rsh_agent "$WORK/agent.sh" --mca pml ucx \
            -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=urdma0:1 \
            "${URUN[@]}" "$WORK/mpi_check"
        mpi veth.tcp ip netns exec "$NS_A" "${MPIRUN[@]}" --bind-to none --host "$IP_A,$IP_B" \
            --mca plm_rsh_agent "$WORK/agent.sh" --mca pml ob1 --mca btl tcp,self "$WORK/mpi_check"
        ucp veth.ucp_lat.urdma tag_lat 8 "${UCX_URDMA[@]}" "${URUN[@]}"
        ucp veth.ucp_lat.tcp tag_lat 8 UCX_TLS=tcp,self
        ucp veth.ucp_bw.urdma tag_bw 1048576 "${UCX_URDMA[@]}" "${URUN[@]}"
        ucp veth.ucp_bw.tcp tag_bw 1048576 UCX_TLS=tcp,self
    fi
done

row() { printf '| %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$(ratio "$2" "$4")"; }
echo
echo "### Middleware on urdma ($REPS repetitions, medians)"
echo
echo "| metric | urdma | peer | peer value | urdma/peer |"
echo "|---|---|---|---|---|"
row "MPI 8 B one-way latency, µs, one host (goal ≤ 1.5)" "$(med lo.urdma.lat)" "ob1 vader" "$(med lo.vader.lat)"
row "MPI 1 MiB bandwidth, MB/s, one host" "$(med lo.urdma.bw)" "ob1 vader" "$(med lo.vader.bw)"
row "UCP tag_lat 8 B p50, µs, one host" "$(med lo.ucp_lat.urdma)" "UCX posix" "$(med lo.ucp_lat.posix)"
row "UCP tag_lat 8 B p50, µs, one host" "$(med lo.ucp_lat.urdma)" "UCX tcp" "$(med lo.ucp_lat.tcp)"
row "UCP tag_bw 1 MiB, MB/s, one host" "$(med lo.ucp_bw.urdma)" "UCX posix" "$(med lo.ucp_bw.posix)"
row "UCP tag_bw 1 MiB, MB/s, one host" "$(med lo.ucp_bw.urdma)" "UCX tcp" "$(med lo.ucp_bw.tcp)"
if [ "$VETH" = 1 ]; then
    row "MPI 8 B one-way latency, µs, namespaces (goal < 1)" "$(med veth.urdma.lat)" "ob1 tcp" "$(med veth.tcp.lat)"
    row "MPI 1 MiB bandwidth, MB/s, namespaces" "$(med veth.urdma.bw)" "ob1 tcp" "$(med veth.tcp.bw)"
    row "UCP tag_lat 8 B p50, µs, namespaces" "$(med veth.ucp_lat.urdma)" "UCX tcp" "$(med veth.ucp_lat.tcp)"
    row "UCP tag_bw 1 MiB, MB/s, namespaces" "$(med veth.ucp_bw.urdma)" "UCX tcp" "$(med veth.ucp_bw.tcp)"
fi
echo
echo "urdma: pml ucx and UCP over UCX_TLS=rc_verbs,ud_verbs on urdma0 (shared memory on one" \
     "host, TCP between namespaces). Latency: lower is better; bandwidth: higher is better."
exit 0
