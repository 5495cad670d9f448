# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# What bench.sh and middleware.sh share (sourced).

say() { printf '%s\n' "$*" >&2; }

is_num() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }

# VALS[KEY] holds the values measured for KEY, space-separated.
declare -A VALS=()
med() {  # KEY -> median or n/a
    # shellcheck disable=SC2086  # word splitting of the value list is wanted
    median ${VALS[$1]:-}
}

ratio() {  # URDMA PEER -> urdma/peer, or n/a
    awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f\n", a / b; else print "n/a" }'
}

median() {  # values... -> median or n/a
    [ $# -eq 0 ] && { echo n/a; return; }
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
        if (NR % 2) m = v[(NR + 1) / 2]; else m = (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.3f\n", m }'
}
