#!/bin/bash
# SPDX-License-Identifier: MIT
#
# hardening.sh FILE... - check that each ELF file is built with the
# hardening Debian gives rdma-core (dpkg-buildflags, hardening=+all):
#   - full RELRO: a GNU_RELRO segment and BIND_NOW (FLAGS BIND_NOW or
#     FLAGS_1 NOW in the dynamic section);
#   - the stack protector: it imports __stack_chk_fail;
#   - _FORTIFY_SOURCE: it imports at least one __*_chk function;
#   - executables are PIE (ELF type DYN).
# Exit status: 0 pass, 1 fail, 77 skip (no readelf).
set -u
command -v readelf >/dev/null || { echo "SKIP: no readelf"; exit 77; }
fail=0
for f in "$@"; do
	hdr=$(readelf -lhd --wide "$f" 2>/dev/null) || { echo "FAIL: $f: not ELF"; fail=1; continue; }
	syms=$(readelf --dyn-syms --wide "$f")
	grep -q GNU_RELRO <<<"$hdr" || { echo "FAIL: $f: no RELRO segment"; fail=1; }
	grep -Eq 'BIND_NOW|FLAGS_1.*NOW' <<<"$hdr" || { echo "FAIL: $f: no BIND_NOW (partial RELRO)"; fail=1; }
	grep -q '__stack_chk_fail' <<<"$syms" || { echo "FAIL: $f: no stack protector"; fail=1; }
	grep -Eq ' __[a-z_]+_chk(@|$)' <<<"$syms" || { echo "FAIL: $f: not fortified"; fail=1; }
	case "$f" in
	*.so*) ;;
	*) grep -q 'Type:.*DYN' <<<"$hdr" || { echo "FAIL: $f: not PIE"; fail=1; } ;;
	esac
	[ $fail = 0 ] && echo "ok: $f"
done
exit $fail
