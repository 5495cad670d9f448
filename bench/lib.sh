# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# What bench.sh and middleware.sh share (sourced).

say() { printf '%s\n' "$*" >&2; }

is_num() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }

median() {  # values... -> median or n/a
    [ $# -eq 0 ] && { echo n/a; return; }
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
        if (NR % 2) m = v[(NR + 1) / 2]; else m = (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.3f\n", m }'
}
