#!/usr/bin/env bash
# run-all.sh: build lockfence and run every test suite on every tested
# PostgreSQL major, as root on Debian 12.
#
# The matrix (PG_MAJORS, default "15 15-assert 17 18"):
#   15      the machine's own PostgreSQL (Debian 12), dependencies installed
#           by scripts/install-deps.sh;
#   15-assert  the same release built from Debian's source package with
#           --enable-cassert (Assert, CLOBBER_FREED_MEMORY, memory context
#           checks) and Valgrind support, by scripts/pg-assert.sh (built
#           once, kept in /var/cache/lockfence-pg-assert): regress,
#           isolation and TAP run on it as on 15;
#   17, 18  inside a Debian chroot (trixie with PostgreSQL 17, plus 18 from
#           sid) that scripts/chroot.sh builds with debootstrap from this
#           machine's apt mirror and caches in /var/cache/lockfence-chroots
#           (built once; later runs reuse it).
# For each major: build warning-free (-Wall -Wextra -Werror) and install,
# then, as the postgres user in a scratch copy of the tree: pg_regress
# (private server), isolation specs (private server), the TAP suites
# (PostgreSQL, etcd, ... servers started by the tests themselves on
# 127.0.0.1 free ports).  The end-to-end demonstration and the fault
# history test (test/history/run.sh) run on 15 only: they
# exercise the client side (Python, Redis, ZooKeeper) against the
# extension, which the other suites already cover on every major.  In the
# chroot, pg_upgrade from 17 to 18 is tested too (test/t/51_pg_upgrade.pl).
#
# After every suite, the server logs it left are searched for a failed
# Assert ("TRAP:") or a backend killed by a signal: either fails the suite,
# whatever the tests themselves concluded.
#
# On the host only, once, not per major:
#   fuzz      the libFuzzer harnesses of fuzz/ (fuzz/run.sh, FUZZ_SECONDS
#             each, default 30)
#   valgrind  pg_regress and the isolation specs under Valgrind memcheck on
#             the 15-assert build (not in the default SUITES: it takes long;
#             see docs/testing.md)
#
# Prints one "N passed, N failed" line over all suites and majors, last
# (", N skipped" appended when a suite could not run, saying why), and
# exits non-zero if any suite failed.  Everything it mounted or started
# is unmounted and stopped when it exits, also on failure or interrupt.
#
# For quick iterations:
#   PG_MAJORS="17"                only these majors (of 15 15-assert 17 18)
#   SUITES="regress tap"          only these of: regress isolation tap demo
#                                 history fuzz valgrind
#   PROVE_TESTS="test/t/20_*.pl"  only these TAP files
#   PG_CONFIG=/path/to/pg_config  another PostgreSQL installation for the
#                                 host major; given alone (without
#                                 PG_MAJORS), only that major runs
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [ "$(id -u)" -ne 0 ]; then
	echo "run-all.sh: run as root (it installs packages and the extension)" >&2
	exit 1
fi

passed=0
failed=0
skipped=0
failures=()
skips=()

# Inside the chroot, each suite's outcome also goes to this file, which
# the run outside reads to count it.
results=${LOCKFENCE_RESULTS:-}

record() {
	local outcome=$1 name=$2
	if [ "$outcome" = passed ]; then
		passed=$((passed + 1))
	elif [ "$outcome" = skipped ]; then
		skipped=$((skipped + 1))
		skips+=("$name")
	else
		failed=$((failed + 1))
		failures+=("$name")
	fi
	[ -n "$results" ] && printf '%s %s\n' "$outcome" "$name" >>"$results"
	return 0
}

suite() {
	local name=$1
	shift
	echo "=== $name"
	if "$@"; then
		record passed "$name"
		echo "=== $name: passed"
	else
		record failed "$name"
		echo "=== $name: FAILED"
	fi
}

# skip NAME REASON: a suite that cannot run here, counted apart.
skip() {
	echo "=== $1: SKIPPED ($2)"
	record skipped "$1 ($2)"
}

SUITES=${SUITES:-regress isolation tap demo history fuzz}
wanted() { [[ " $SUITES " == *" $1 "* ]]; }

work=
cleanup_work() { [ -n "$work" ] && rm -rf "$work"; work=; }

# run_major LABEL PG_CONFIG: every wanted suite on one PostgreSQL, in a
# fresh scratch copy owned by postgres (the servers and pg_regress refuse
# to run as root and must be able to write results next to the tests).
run_major() {
	local label=$1 pgc=$2 before=$failed
	local PATH
	PATH="$("$pgc" --bindir):$ORIG_PATH"
	export PATH

	cleanup_work
	work=$(mktemp -d /tmp/lockfence-test.XXXXXX)
	chmod 755 "$work"
	tar -C "$repo" --exclude=.git -cf - . | tar -C "$work" -xf -
	make -C "$work" -s clean >/dev/null 2>&1

	build() {
		make -C "$work" -s PG_CONFIG="$pgc" \
			PG_CFLAGS='-Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers' &&
			make -C "$work" -s PG_CONFIG="$pgc" install
	}
	as_postgres_make() {
		chown -R postgres: "$work"
		runuser -u postgres -- env PATH="$PATH" \
			${LOCKFENCE_UPGRADE_FROM:+LOCKFENCE_UPGRADE_FROM="$LOCKFENCE_UPGRADE_FROM"} \
			make -C "$work" PG_CONFIG="$pgc" "$@"
	}
	show_diffs() {
		local f
		for f in "$work/regression.diffs" "$work/output_iso/regression.diffs"; do
			[ -s "$f" ] && { echo "--- $f"; head -200 "$f"; }
		done
		for f in "$work"/tmp_check/log/regress_log_*; do
			# What led to each failed check, and the end of the log.
			# A test that died says so at its end instead.
			[ -f "$f" ] && grep -q -e "not ok" -e "exited with" -e "error running SQL" -e "died" "$f" &&
				{ echo "--- $f"; grep -B40 -A10 "not ok" "$f" | head -300; grep -A2 "error running SQL" "$f" | head -20; echo "..."; tail -40 "$f"; }
		done
		return 1
	}
	# A failed Assert or a crashed backend fails the suite even when the
	# tests passed (a crash in a session the test does not look at, in a
	# background worker, at backend exit): the server logs of the run are
	# searched for it.  SIGKILL (signal 9) is left out: the crash tests
	# (01, 12, 40) kill backends with it on purpose.  Lines already
	# reported by an earlier suite of this major are not counted again.
	crash_seen=$work.crashes
	: >"$crash_seen"
	no_crash() {
		local found
		found=$(grep -r -H -a -e 'TRAP: ' -e 'terminated by signal' \
			--include='*.log' --include='postmaster.log*' "$work" 2>/dev/null |
			grep -v -e 'terminated by signal 9:' | grep -v -F -x -f "$crash_seen")
		[ -z "$found" ] && return 0
		echo "--- server logs report a failed Assert or a crashed process:"
		echo "$found" | head -40
		echo "$found" >>"$crash_seen"
		return 1
	}
	regress() { { as_postgres_make installcheck ISOLATION= TAP_TESTS= || show_diffs; } && no_crash; }
	isolation() { { as_postgres_make installcheck REGRESS= TAP_TESTS= || show_diffs; } && no_crash; }
	# On the assert build, unless PROVE_TESTS says otherwise: the TAP
	# files that drive lockfence's C paths (fast paths, the transaction's
	# cache, leases, the etcd client, commit and abort callbacks, crash
	# and promotion); the deployment suites test other programs against
	# the extension and gain nothing from assertions (see docs/testing.md).
	local prove_tests=${PROVE_TESTS:-}
	if [ -z "$prove_tests" ] && [ "$label" = "$host_major-assert" ] &&
		[ -z "${ASSERT_ALL_TAP:-}" ]; then
		prove_tests=$ASSERT_PROVE_TESTS
	fi
	tap() {
		{ as_postgres_make installcheck REGRESS= ISOLATION= \
			PROVE_FLAGS='-I test/perl --timer' ${prove_tests:+PROVE_TESTS="$prove_tests"} ||
			show_diffs; } && no_crash
	}

	echo "##### PostgreSQL $label: $("$pgc" --version)"
	suite "[$label] build and install (-Wall -Wextra -Werror)" build
	if [ $failed -eq $before ]; then
		wanted regress && suite "[$label] pg_regress" regress
		wanted isolation && suite "[$label] isolation" isolation
		wanted tap && suite "[$label] TAP" tap
		if [ "$label" = 15 ] && wanted demo && [ -x "$work/demo/run.sh" ]; then
			suite "[$label] demonstration (demo/run.sh)" \
				env PG_CONFIG="$pgc" bash "$work/demo/run.sh"
		fi
		if [ "$label" = 15 ] && wanted history; then
			suite "[$label] fault history (test/history/run.sh)" \
				env PG_CONFIG="$pgc" LOCKFENCE_HISTORY_NO_BUILD=1 \
				bash "$work/test/history/run.sh"
		fi
	fi
	cleanup_work
	rm -f "$crash_seen"
	echo "##### PostgreSQL $label: $((failed - before)) suite(s) failed"
}

ORIG_PATH=$PATH
host_major=15

# The TAP files run on 15-assert (ASSERT_ALL_TAP=1: every file).
ASSERT_PROVE_TESTS="test/t/01_crash_recovery.pl test/t/03_row_token_load_time.pl
	test/t/08_multi_fence_stress.pl test/t/10_etcd_basic.pl
	test/t/16_etcd_xact_scope.pl test/t/17_etcd_commit_check.pl
	test/t/24_etcd_malformed_replies.pl test/t/63_etcd_lock_many.pl
	test/t/64_etcd_commit_faults.pl test/t/70_leases.pl
	test/t/72_lease_client_gone.pl test/t/81_check.pl
	test/t/87_floor_ends_leases.pl test/t/88_promotion_guard.pl
	test/t/89_differential_paths.pl"
ASSERT_PROVE_TESTS=$(echo $ASSERT_PROVE_TESTS)

# ---------------------------------------------------------------------------
# Inside the chroot (started by the run below): the chroot's majors.
# ---------------------------------------------------------------------------
if [ -n "${LOCKFENCE_IN_CHROOT:-}" ]; then
	trap cleanup_work EXIT
	# The deployment suites that drive Debian 12's pgbouncer, Prometheus
	# (promtool), Patroni and repmgr test those tools against the
	# extension, not the major: they run on the host only.
	if [ -z "${PROVE_TESTS:-}" ]; then
		PROVE_TESTS=$(cd "$repo" && ls test/t/*.pl |
			grep -v -e '/73_lease_pool_starvation' -e '/83_pgbouncer' \
				-e '/84_alerts' -e '/85_patroni' -e '/90_repmgr' | tr '\n' ' ')
	fi
	for m in $PG_MAJORS; do
		pgc=/usr/lib/postgresql/$m/bin/pg_config
		if [ ! -x "$pgc" ]; then
			suite "[$m] PostgreSQL $m in the chroot" false
			continue
		fi
		# pg_upgrade is tested on the newest major, from the one before
		# (lockfence built and installed there first).
		LOCKFENCE_UPGRADE_FROM=
		old=/usr/lib/postgresql/$((m - 1))/bin/pg_config
		if [ "$m" = 18 ] && [ -x "$old" ] && wanted tap; then
			if [[ " $PG_MAJORS " != *" $((m - 1)) "* ]]; then
				(
					# Only its build is needed; no suites on it.
					# shellcheck disable=SC2030
					SUITES=
					run_major "$((m - 1))" "$old"
				) || true
			fi
			LOCKFENCE_UPGRADE_FROM=$("$old" --bindir)
		fi
		export LOCKFENCE_UPGRADE_FROM
		run_major "$m" "$pgc"
	done
	echo "done" >>"$results.done"
	exit 0
fi

# ---------------------------------------------------------------------------
# On the host: the host's major here, the others in the chroot.
# ---------------------------------------------------------------------------
host_pg_config=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
host_major=15
if [ -z "${PG_MAJORS:-}" ]; then
	if [ -n "${PG_CONFIG:-}" ]; then
		PG_MAJORS=$host_major
	else
		PG_MAJORS="15 15-assert 17 18"
	fi
fi

# shellcheck source=scripts/chroot.sh
. "$repo/scripts/chroot.sh"

chroot_work=
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	[ -n "${CHROOT_CHILD:-}" ] && kill -TERM "$CHROOT_CHILD" 2>/dev/null
	cleanup_work
	chroot_leave
	[ -n "$chroot_work" ] && rm -rf "$chroot_work"
	exit "$rc"
}
trap cleanup EXIT
trap 'echo "run-all.sh: interrupted" >&2; exit 130' INT
trap 'echo "run-all.sh: terminated" >&2; exit 143' TERM

chroot_majors=()
for m in $PG_MAJORS; do
	if [ "$m" = "$host_major" ]; then
		if "$repo/scripts/install-deps.sh"; then
			run_major "$m" "$host_pg_config"
		else
			suite "[$m] dependencies (scripts/install-deps.sh)" false
		fi
	elif [ "$m" = "$host_major-assert" ]; then
		# Every TAP file runs here too: the deployment suites find the
		# server through pg_config on PATH, which is the assert build's.
		if ! "$repo/scripts/install-deps.sh"; then
			suite "[$m] dependencies (scripts/install-deps.sh)" false
		elif ! "$repo/scripts/pg-assert.sh" build; then
			suite "[$m] assert-enabled build (scripts/pg-assert.sh)" false
		else
			run_major "$m" "$("$repo/scripts/pg-assert.sh" path)"
		fi
	elif [[ " $CHROOT_MAJORS " == *" $m "* ]]; then
		chroot_majors+=("$m")
	else
		echo "run-all.sh: PostgreSQL $m is not in the matrix (15 15-assert $CHROOT_MAJORS)" >&2
		suite "[$m] PostgreSQL $m available" false
	fi
done

if [ ${#chroot_majors[@]} -gt 0 ]; then
	echo "##### PostgreSQL ${chroot_majors[*]} in the chroot $CHROOT_ROOT"
	if ! chroot_ensure || ! chroot_enter; then
		suite "[${chroot_majors[*]}] chroot (scripts/chroot.sh)" false
	else
		chroot_work=$(mktemp -d "$CHROOT_ROOT/tmp/lockfence-matrix.XXXXXX")
		inner=/tmp/${chroot_work##*/}
		# The tree in src/, the suites' outcomes next to it.
		mkdir "$chroot_work/src"
		tar -C "$repo" --exclude=.git -cf - . | tar -C "$chroot_work/src" -xf -
		# shellcheck disable=SC2031
		chroot_exec env LOCKFENCE_IN_CHROOT=1 PG_MAJORS="${chroot_majors[*]}" \
			SUITES="$SUITES" ${PROVE_TESTS:+PROVE_TESTS="$PROVE_TESTS"} \
			LOCKFENCE_RESULTS="$inner/results" \
			bash "$inner/src/test/run-all.sh"
		while read -r outcome name; do
			record "$outcome" "$name"
		done < <(cat "$chroot_work/results" 2>/dev/null)
		if [ ! -s "$chroot_work/results.done" ]; then
			record failed "[${chroot_majors[*]}] chroot run did not complete"
		fi
	fi
fi

# ---------------------------------------------------------------------------
# Host-only suites, once.
# ---------------------------------------------------------------------------
if wanted fuzz; then
	if "$repo/fuzz/run.sh" check >/dev/null 2>&1; then
		suite "[host] fuzzers (fuzz/run.sh, ${FUZZ_SECONDS:-30} s each)" "$repo/fuzz/run.sh"
	else
		skip "[host] fuzzers" "$("$repo/fuzz/run.sh" check 2>&1 | tail -1)"
	fi
fi
if wanted valgrind; then
	suite "[host] Valgrind memcheck on 15-assert (scripts/pg-assert.sh valgrind)" \
		"$repo/scripts/pg-assert.sh" valgrind
fi

echo
[ $failed -gt 0 ] && printf 'failed: %s\n' "${failures[@]}"
[ $skipped -gt 0 ] && printf 'skipped: %s\n' "${skips[@]}"
if [ $skipped -gt 0 ]; then
	echo "$passed passed, $failed failed, $skipped skipped"
else
	echo "$passed passed, $failed failed"
fi
[ $failed -eq 0 ]
