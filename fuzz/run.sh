#!/usr/bin/env bash
# fuzz/run.sh: build lockfence's libFuzzer harnesses and run each for a
# bounded time.
#
#   fuzz/run.sh [NAME...]        build, then run each harness (default: all)
#                                for FUZZ_SECONDS (default 30) seconds
#   fuzz/run.sh build [NAME...]  build only
#   fuzz/run.sh check            can the harnesses be built here?  Prints
#                                why not, exits non-zero
#
# Harnesses (fuzz/fuzz_NAME.c): reply, http, watch, endpoints, pwfile; see
# the comment at the top of each and docs/testing.md.  Each is linked with
# the backend objects of the assert-enabled build (scripts/pg-assert.sh,
# built if missing) and lockfence's sources compiled with Debian's clang,
# -fsanitize=fuzzer,address,undefined.  Each run starts from the seed
# corpus fuzz/corpus/NAME (real etcd answers, fuzz/capture-seeds.sh) plus
# what earlier runs found (kept in $FUZZ_BUILD/corpus/NAME).
#
# A crash, a sanitizer report, a failed Assert, an unexpected error or
# WARNING, or a leak fails the run: the input is kept in
# $FUZZ_BUILD/artifacts/ and the command to replay it is printed.
#
# Environment: FUZZ_SECONDS (per harness), FUZZ_BUILD (default
# /var/tmp/lockfence-fuzz), FUZZ_JOBS (make jobs for the objects, 2),
# CLANG (default clang).  Run as root the first time (the assert build);
# after that any user that can write FUZZ_BUILD.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_BUILD=${FUZZ_BUILD:-/var/tmp/lockfence-fuzz}
CLANG=${CLANG:-clang}
ALL="reply http watch endpoints pwfile"

say() { echo "fuzz: $*" >&2; }

check() {
	local t
	command -v "$CLANG" >/dev/null || { say "clang is not installed (scripts/install-deps.sh)"; return 1; }
	command -v curl-config >/dev/null || { say "libcurl4-openssl-dev is not installed"; return 1; }
	t=$(mktemp -d)
	printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' >"$t/t.c"
	if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$t/t.c" -o "$t/t" >/dev/null 2>&1; then
		rm -rf "$t"
		say "$CLANG cannot link -fsanitize=fuzzer (libclang-rt-14-dev missing?)"
		return 1
	fi
	rm -rf "$t"
	if ! "$repo/scripts/pg-assert.sh" path >/dev/null 2>&1 && [ "$(id -u)" -ne 0 ]; then
		say "the assert-enabled build is missing (scripts/pg-assert.sh build, as root)"
		return 1
	fi
	return 0
}

# The backend's objects, less main.o and the loadable modules built from
# the same tree, in one archive.
backend_archive() {
	local src=$1 ar=$FUZZ_BUILD/libpgbackend.a
	if [ -f "$ar" ] && [ "$ar" -nt "$src/src/backend/postgres" ]; then
		return 0
	fi
	say "archiving the backend objects of $src"
	rm -f "$ar"
	(cd "$src/src" && find backend timezone -name '*.o' \
		-not -path 'backend/main/*' \
		-not -path 'backend/replication/libpqwalreceiver/*' \
		-not -path 'backend/replication/pgoutput/*' \
		-not -path 'backend/snowball/*' \
		-not -path 'backend/utils/mb/conversion_procs/*' \
		-not -path 'backend/jit/llvm/*' \
		-not -path 'timezone/zic.o' \
		-print0 | xargs -0 ar qc "$ar") && ranlib "$ar"
}

build() {
	local pgc src inc cflags n srcfile obj objs=()
	check || return 1
	mkdir -p "$FUZZ_BUILD/obj"
	if ! pgc=$("$repo/scripts/pg-assert.sh" path 2>/dev/null); then
		"$repo/scripts/pg-assert.sh" build || return 1
		pgc=$("$repo/scripts/pg-assert.sh" path) || return 1
	fi
	src=$("$repo/scripts/pg-assert.sh" src) || return 1
	[ -f "$src/src/backend/postgres" ] || { say "no built backend in $src"; return 1; }
	backend_archive "$src" || return 1
	inc=$("$pgc" --includedir-server)
	cflags=(-g -O1 -fno-omit-frame-pointer
		-fsanitize=address,undefined -fno-sanitize-recover=undefined
		-Wall -Wno-ignored-attributes -Wno-unused-function -Wno-unused-parameter
		$("$pgc" --cppflags) -I"$repo/src" -I"$inc" $(curl-config --cflags))
	# lockfence's sources, as they are
	for srcfile in "$repo"/src/*.c; do
		obj=$FUZZ_BUILD/obj/$(basename "${srcfile%.c}").o
		if [ ! -f "$obj" ] || [ "$srcfile" -nt "$obj" ] || [ "$repo/src/etcd.h" -nt "$obj" ]; then
			"$CLANG" "${cflags[@]}" -fsanitize=fuzzer-no-link -c "$srcfile" -o "$obj" || return 1
		fi
		objs+=("$obj")
	done
	rm -f "$FUZZ_BUILD/liblockfence.a"
	ar qc "$FUZZ_BUILD/liblockfence.a" "${objs[@]}" && ranlib "$FUZZ_BUILD/liblockfence.a"
	for n in "$@"; do
		say "building fuzz_$n"
		"$CLANG" "${cflags[@]}" -fsanitize=fuzzer -I"$here" "$here/fuzz_$n.c" \
			-Wl,--start-group "$FUZZ_BUILD/liblockfence.a" "$FUZZ_BUILD/libpgbackend.a" \
			"$src/src/common/libpgcommon_srv.a" "$src/src/port/libpgport_srv.a" -Wl,--end-group \
			$(curl-config --libs) $("$pgc" --libs | sed 's/-lpgcommon//; s/-lpgport//') -lm \
			-o "$FUZZ_BUILD/fuzz_$n" || return 1
	done
}

# -timeout: libFuzzer's hang detector, in wall-clock seconds per input.  An
# input takes milliseconds; in the test command, niced below the lanes that
# bound times and beside Valgrind on 2 cores, an input of fuzz_http (a real
# TCP exchange with a thread) can wait seconds for a CPU.  (Its reported
# hangs were the harness's own until 2026-12-04: it waited for a connection
# that a transfer timed out before connecting never made.)  120 s still
# catches a loop that never ends.
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-120}

run_one() {
	local n=$1 corpus=$FUZZ_BUILD/corpus/$1 log=$FUZZ_BUILD/fuzz_$1.log execs rc
	mkdir -p "$corpus" "$FUZZ_BUILD/artifacts"
	say "fuzz_$n for $FUZZ_SECONDS s"
	(cd "$FUZZ_BUILD" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		nice -n 10 ./"fuzz_$n" -max_total_time="$FUZZ_SECONDS" -timeout="$FUZZ_TIMEOUT" \
		-rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
		-artifact_prefix="$FUZZ_BUILD/artifacts/$n-" \
		"$corpus" "$here/corpus/$n") >"$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
	if [ $rc -ne 0 ]; then
		say "fuzz_$n FAILED after ${execs:-?} executions; log $log:"
		grep -E -A40 'ERROR: |lockfence-fuzz:|TRAP:|runtime error|SUMMARY' "$log" | head -80 >&2
		grep -E 'Test unit written to' "$log" >&2
		say "replay: $FUZZ_BUILD/fuzz_$n <that file>"
		return 1
	fi
	say "fuzz_$n: ${execs:-?} executions in $FUZZ_SECONDS s, no finding (corpus $(ls "$corpus" | wc -l) inputs)"
}

case "${1:-}" in
check)
	check
	exit
	;;
build)
	shift
	build ${@:-$ALL}
	exit
	;;
esac

names=${*:-$ALL}
build $names || exit 1
failed=0
for n in $names; do
	run_one "$n" || failed=$((failed + 1))
done
[ $failed -eq 0 ]
