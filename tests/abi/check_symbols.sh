#!/bin/bash
# SPDX-License-Identifier: MIT
#
# check_symbols.sh LIB - check that LIB (urdma's drop-in libibverbs or
# librdmacm) has the same dynamic ABI as Debian 12's real libibverbs.so.1 or
# librdmacm.so.1 (rdma-core 44).  For libibverbs:
#
#   1. SONAME is libibverbs.so.1;
#   2. the version definitions (names and parents) are the real ones:
#      14 entries = the base libibverbs.so.1 + IBVERBS_1.0 .. 1.14 and
#      IBVERBS_PRIVATE_34;
#   3. the default-version exports ("name@@NODE", with their symbol type)
#      are exactly the real ones: nothing missing, nothing extra, nothing
#      in the wrong node, and no unversioned export leaks;
#   4. load test: Debian's real provider libraries libmlx5.so.1 and
#      libefa.so.1 dlopen() with RTLD_NOW on top of LIB (they import
#      IBVERBS_PRIVATE_34 and call verbs_register_driver_34 from their
#      constructors).  Skipped if they are not installed.
#
# The 34 non-default "@IBVERBS_1.0"/"@IBVERBS_1.1" compat aliases of the
# real library are intentionally not compared (see libibverbs.map).
#
# Exit status: 0 pass, 1 fail (differences printed), 77 skip (the real
# library or readelf is not available).
#
# Environment: REAL_LIBIBVERBS overrides the reference library, CC the C
# compiler used for the load test.

set -u

MULTIARCH_DIR=/usr/lib/x86_64-linux-gnu

if [ $# -ne 1 ]; then
	echo "usage: $0 path/to/our/libibverbs.so|librdmacm.so" >&2
	exit 2
fi
OURS=$1
case "$(basename "$OURS")" in
librdmacm*)
	# RDMACM_1.0 .. 1.3 and the base entry; no providers to load.
	REAL=${REAL_LIBRDMACM:-$MULTIARCH_DIR/librdmacm.so.1}
	SONAME=librdmacm.so.1
	EXPECTED_VERDEFS=5
	PROVIDERS=""
	;;
*)
	REAL=${REAL_LIBIBVERBS:-$MULTIARCH_DIR/libibverbs.so.1}
	SONAME=libibverbs.so.1
	EXPECTED_VERDEFS=14
	PROVIDERS="$MULTIARCH_DIR/libmlx5.so.1 $MULTIARCH_DIR/libefa.so.1"
	;;
esac

if [ ! -e "$REAL" ]; then
	echo "SKIP: reference library $REAL is not installed (Debian package libibverbs1)"
	exit 77
fi
if ! command -v readelf >/dev/null 2>&1; then
	echo "SKIP: readelf (binutils) is not installed"
	exit 77
fi
if [ ! -f "$OURS" ]; then
	echo "FAIL: $OURS does not exist"
	exit 1
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/urdma-abi.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

status=0
fail() {
	echo "FAIL: $*"
	status=1
}

# --- helpers ---------------------------------------------------------

soname_of() {
	readelf -d -W "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p'
}

# Version definitions, one per line: "NAME" or "NAME <- PARENT..." for
# ordinary nodes, "BASE NAME" for the file's base entry.
verdefs_of() {
	readelf -V -W "$1" | awk '
		/^Version definition section/ { in_def = 1; next }
		/^Version (needs|symbols) section/ { in_def = 0 }
		!in_def { next }
		/ Name: / {
			flush()
			cur = $NF
			base = ($0 ~ /Flags: BASE/)
			parents = ""
			next
		}
		/ Parent [0-9]+: / { parents = parents " <- " $NF }
		function flush() {
			if (cur == "")
				return
			print (base ? "BASE " cur : cur parents)
			cur = ""
		}
		END { flush() }'
}

# Defined dynamic symbols: "name@@NODE TYPE" for default-version exports,
# "name@NODE TYPE" for hidden compat versions, "name TYPE" for unversioned
# ones.  The ABS symbols that merely name a version node are dropped.
# readelf --dyn-syms -W columns: Num Value Size Type Bind Vis Ndx Name.
defined_syms_of() {
	readelf --dyn-syms -W "$1" | awk '
		$1 ~ /^[0-9]+:$/ && NF >= 8 && $7 != "UND" && $5 != "LOCAL" {
			if ($7 == "ABS" && $8 !~ /@/ && $3 == 0)
				next	# version node name
			print $8, $4
		}' | LC_ALL=C sort -u
}

# --- 1. SONAME -------------------------------------------------------

our_soname=$(soname_of "$OURS")
if [ "$our_soname" = "$SONAME" ]; then
	echo "ok: SONAME $our_soname"
else
	fail "SONAME is '${our_soname:-<none>}', expected '$SONAME'"
fi

# --- 2. version definitions -------------------------------------------

verdefs_of "$REAL" >"$TMP/real.verdef"
verdefs_of "$OURS" >"$TMP/ours.verdef"
# The base entry is named after the SONAME, checked above.
grep -v '^BASE ' "$TMP/real.verdef" >"$TMP/real.nodes"
grep -v '^BASE ' "$TMP/ours.verdef" >"$TMP/ours.nodes"
n_ours=$(wc -l <"$TMP/ours.verdef")
n_real=$(wc -l <"$TMP/real.verdef")

if [ "$n_real" -ne "$EXPECTED_VERDEFS" ]; then
	echo "note: the reference library has $n_real version definitions, not $EXPECTED_VERDEFS (not Debian 12's rdma-core 44?)"
fi
if ! grep -qx "BASE $SONAME" "$TMP/ours.verdef"; then
	fail "no base version definition named $SONAME (is the library versioned at all?)"
fi
if diff -u --label "real ($REAL)" --label "ours ($OURS)" \
	"$TMP/real.nodes" "$TMP/ours.nodes" >"$TMP/verdef.diff"; then
	echo "ok: $n_ours version definitions, same names and parents as the real library:" \
		"$(sed 's/ <- .*//' "$TMP/ours.nodes" | paste -sd ' ' -)"
else
	fail "version definitions differ (node <- parent):"
	cat "$TMP/verdef.diff"
fi

# --- 3. default-version exports ---------------------------------------

defined_syms_of "$REAL" >"$TMP/real.all"
defined_syms_of "$OURS" >"$TMP/ours.all"
grep '@@' "$TMP/real.all" >"$TMP/real.syms"
grep '@@' "$TMP/ours.all" >"$TMP/ours.syms"

# Field 1 "name@@NODE", field 2 TYPE  ->  "name NODE TYPE"
split_syms() {
	sed 's/@@/ /' "$1" | LC_ALL=C sort -k1,1
}
split_syms "$TMP/real.syms" >"$TMP/real.split"
split_syms "$TMP/ours.syms" >"$TMP/ours.split"

LC_ALL=C join -a1 -a2 -e - -o 0,1.2,1.3,2.2,2.3 \
	"$TMP/real.split" "$TMP/ours.split" | awk '
	$2 == "-" { printf "  extra:      %s@@%s (%s)\n", $1, $4, $5; next }
	$4 == "-" { printf "  missing:    %s@@%s (%s)\n", $1, $2, $3; next }
	$2 != $4 { printf "  wrong node: %s is @@%s, real library has @@%s\n", $1, $4, $2 }
	$3 != $5 { printf "  wrong type: %s is %s, real library has %s\n", $1, $5, $3 }
	' >"$TMP/sym.report"

n_real_syms=$(wc -l <"$TMP/real.syms")
n_ours_syms=$(wc -l <"$TMP/ours.syms")
if [ -s "$TMP/sym.report" ]; then
	fail "default-version exports differ (real $n_real_syms, ours $n_ours_syms):"
	sort -s -k1,1 "$TMP/sym.report"
	echo "  diff (real -> ours):"
	diff -u --label real --label ours "$TMP/real.syms" "$TMP/ours.syms" |
		sed -n '/^[-+][^-+]/s/^/    /p'
else
	echo "ok: $n_ours_syms default-version exports identical to the real library (name, node, type)"
fi

# Unversioned exports mean the version script did not cover a symbol.
grep -v '@' "$TMP/ours.all" >"$TMP/ours.unversioned"
if [ -s "$TMP/ours.unversioned" ]; then
	fail "unversioned exports leak out of our library:"
	sed 's/^/  /' "$TMP/ours.unversioned"
fi

# --- 4. load test: real providers on top of our library --------------

present=()
for p in $PROVIDERS; do
	if [ -e "$p" ]; then
		present+=("$p")
	else
		echo "note: $p is not installed, not load-tested"
	fi
done

CC=${CC:-cc}
if [ -z "$PROVIDERS" ]; then
	:	# librdmacm: Debian's rdmacm-utils load it in tests/rdmacm
elif [ ${#present[@]} -eq 0 ]; then
	echo "skip: load test (no provider library installed)"
elif ! command -v "$CC" >/dev/null 2>&1; then
	echo "skip: load test (no C compiler '$CC')"
else
	# Let the loader find our library by its SONAME, whatever the file
	# name given to us (CMake passes libibverbs.so.1.14.44.0).
	mkdir "$TMP/lib"
	ln -s "$(readlink -f "$OURS")" "$TMP/lib/$SONAME"

	cat >"$TMP/loadtest.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* argv[1]: our library's real path; argv[2..]: providers to dlopen. */
int main(int argc, char **argv)
{
	char want[PATH_MAX], got[PATH_MAX];
	Dl_info info;
	void *ibv, *sym;
	int rc = 0;

	ibv = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!ibv) {
		printf("cannot load libibverbs.so.1: %s\n", dlerror());
		return 1;
	}
	sym = dlsym(ibv, "verbs_register_driver_34");
	if (!sym || !dladdr(sym, &info) || !realpath(info.dli_fname, got) ||
	    !realpath(argv[1], want) || strcmp(got, want)) {
		printf("libibverbs.so.1 resolved to %s, not to %s\n",
		       sym ? info.dli_fname : "?", argv[1]);
		return 1;
	}
	for (int i = 2; i < argc; i++) {
		if (dlopen(argv[i], RTLD_NOW | RTLD_LOCAL)) {
			printf("loaded %s\n", argv[i]);
		} else {
			printf("cannot load %s: %s\n", argv[i], dlerror());
			rc = 1;
		}
	}
	return rc;
}
EOF
	if ! "$CC" -o "$TMP/loadtest" "$TMP/loadtest.c" -ldl >"$TMP/cc.log" 2>&1; then
		fail "cannot compile the load test:"
		cat "$TMP/cc.log"
	else
		# A sanitizer build of our library needs its runtime first.
		preload=""
		asan=$(readelf -d -W "$OURS" | sed -n 's/.*(NEEDED).*\[\(libasan\.so[^]]*\)\].*/\1/p')
		if [ -n "$asan" ]; then
			preload=$("$CC" -print-file-name="$asan")
		fi
		LD_LIBRARY_PATH="$TMP/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
		LD_PRELOAD="$preload" ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}" \
			"$TMP/loadtest" "$(readlink -f "$OURS")" "${present[@]}" \
			>"$TMP/load.out" 2>"$TMP/load.err"
		rc=$?
		if [ $rc -ne 0 ]; then
			fail "providers do not load on top of our library (exit $rc):"
			cat "$TMP/load.out" "$TMP/load.err"
		elif grep -q . "$TMP/load.err"; then
			# e.g. "no version information available"
			fail "the loader complained while loading the providers:"
			cat "$TMP/load.out" "$TMP/load.err"
		else
			echo "ok: load test:" "$(sed -n 's/^loaded //p' "$TMP/load.out" | paste -sd ' ' -)"
		fi
	fi
fi

if [ $status -eq 0 ]; then
	echo "PASS: $OURS matches the ABI of $REAL"
else
	echo "FAIL: $OURS does not match the ABI of $REAL"
fi
exit $status
