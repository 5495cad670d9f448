#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install the Debian packages a target needs; as root it installs them, as
# anyone else it names them.  Usage: scripts/deps.sh build|check|bench|fuzz
set -u
need_build=(cmake gcc make pkg-config libibverbs-dev librdmacm-dev libuv1-dev)
need_check=(ibverbs-utils rdmacm-utils perftest iproute2 procps tshark)
need_bench=(ucx-utils libfabric-bin iperf3 sockperf)
need_fuzz=(clang libclang-rt-14-dev)
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
pkgs=("${need_build[@]}")
case "${1:-build}" in
check) pkgs+=("${need_check[@]}") ;;
bench) pkgs+=("${need_check[@]}" "${need_bench[@]}") ;;
fuzz) pkgs+=("${need_fuzz[@]}") ;;
esac
missing=()
for p in "${pkgs[@]}"; do have "$p" || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "urdma needs these Debian packages: ${missing[*]}" >&2
	echo "install them with: sudo apt-get install ${missing[*]}" >&2
	exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null
