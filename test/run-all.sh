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
#           once, kept in /var/cache/lockfence-pg-assert): TAP runs on
#           it as on 15, and so do regress and isolation unless the
#           Valgrind lane runs them (on the same build, its Asserts on);
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
#   valgrind  pg_regress, the isolation specs and two TAP files under
#             Valgrind memcheck on the 15-assert build, side by side, in a
#             lane of its own that starts when the demonstration and the
#             history test's fenced run are done (beside them on 2 cores
#             it slowed the history test below its 10,000 operations); see
#             docs/testing-tools.md
#
# Independent suites run side by side, each in its own "lane" (a
# background job whose output goes to its own log): per major, one lane
# with pg_regress, the isolation specs and the TAP files that bound no
# time (prove -j$TAP_JOBS), niced; another with the timing-sensitive TAP
# files (TIMING_TAP below), one at a time, not niced, each holding one of
# TIMING_SLOTS slots shared by the whole run (the chroot's lanes too); the
# demonstration and the history test; the fuzzers; the chroot's 17 and 18
# side by side.  Everything that must be done once comes first, serially:
# dependencies, the chroot, the assert build, each major's build and
# install.  A line is printed as each lane ends; then every lane's log, in
# a fixed order, never interleaved.  TAP servers of parallel files never
# share a port: PostgreSQL::Test::Cluster and test/perl's helpers reserve
# theirs in one port lock folder for the whole run (PG_TEST_PORT_DIR).
#
# Prints one "N passed, N failed" line over all suites and majors, last
# (", N skipped" appended when a suite or TAP file could not run, each
# listed with why: a TAP file's "skip_all", or checks it skipped), and
# exits non-zero if any suite failed.  Everything it mounted or started
# is unmounted and stopped when it exits, also on failure or interrupt.
#
# Tuning (see docs/testing.md):
#   TAP_JOBS=2        prove -j for the TAP files that bound no time
#   TIMING_SLOTS=2    timing-sensitive TAP files running at once, run-wide
#   STRESS=1          keep a CPU hog running meanwhile (stress-ng --cpu
#                     $STRESS_CPUS, default 2; stopped at exit), for the
#                     "never flaky" runs of issue 18
#   LOCKFENCE_KEEP_RUN=1  keep the run's folder (lane logs, scratch trees)
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

# One run (or demo/run.sh) at a time per machine: scripts/run-lock.sh.
. "$repo/scripts/run-lock.sh"
take_run_lock run-all.sh || exit 1

SUITES_GIVEN=${SUITES:+1}
SUITES=${SUITES:-regress isolation tap demo history fuzz valgrind}
# Valgrind (in the default SUITES) adds about 18 minutes to a run on 2
# cores.  When the preparation took longer than this many seconds (a new
# machine: the chroot, the assert build and Citus were built), the default
# run leaves it out, counted as skipped with the reason, so that the run
# stays within CI's 90 minutes; SUITES naming valgrind runs it anyway.
VALGRIND_MAX_PREP=${VALGRIND_MAX_PREP:-600}
wanted() { [[ " $SUITES " == *" $1 "* ]]; }

# A file named in PROVE_TESTS that does not exist is a mistake, not a
# smaller run: stop before anything starts.
for f in ${PROVE_TESTS:-}; do
	[ -f "$repo/$f" ] || { echo "run-all.sh: PROVE_TESTS names $f, which does not exist" >&2; exit 2; }
done
TAP_JOBS=${TAP_JOBS:-2}
TIMING_SLOTS=${TIMING_SLOTS:-2}
# Niceness of the work that bounds no time (pg_regress, isolation, the
# TAP files outside TIMING_TAP, fuzzers, Valgrind), and of the client
# suites (demonstration, history test: their workers must still reach
# their operation counts, so less).  The timing-sensitive TAP files run at
# the caller's priority, ahead of all of it.
BULK_NICE=${BULK_NICE:-10}
CLIENT_NICE=${CLIENT_NICE:-5}
# The timing-sensitive TAP files (and the servers they start) run ahead of
# everything else on the machine, this run's other lanes and any CPU hog
# at normal priority (STRESS=1): their bounds (a wait_timeout fired < 100
# ms late, a lease renewed within its TTL) are promises of the code, and a
# bound missed because the test's backend waited for a CPU says nothing
# about them (61 missed by 64 ms with the fuzzers at normal priority).
TIMING_NICE=${TIMING_NICE:--5}
ORIG_PATH=$PATH
host_major=15

# TAP files (by number) with checks that bound a time: a reaction within
# 100 ms (14, 61, 68) or within a second or two (23, 25, 60, 62, 66, 70,
# 73), TTLs of a few seconds that a late renewal or a late check would
# break (12, 15, 17, 26, 83), errors "within the request timeout" (10,
# 13, 16, 19, 20, 22, 24, 63, 64, 69).  They run one at a time per major, at
# TIMING_NICE, and at most TIMING_SLOTS of them at once in the whole run.  The
# other files only wait for conditions (poll_until) or bound times far
# above what they need (18: 20 s, 21: 30 s, 81: 10 s); they run with
# prove -j.
TIMING_TAP="10 12 13 14 15 16 17 19 20 22 23 24 25 26 60 61 62 63 64 66 68 69 70 73 83"
# Of those, the files whose bounds are 100 ms (a wait_timeout fired < 100
# ms late, a cancel answered within 100 ms) run alone among the timing
# files: with another timing file and its servers beside them at the same
# priority, 61 and 68 saw the server raise a wait_timeout 106 and 127 ms
# late in a full run.
STRICT_TIMING_TAP="14 61 68"

# The TAP files run on 15-assert (ASSERT_ALL_TAP=1: every file).
ASSERT_PROVE_TESTS="test/t/01_crash_recovery.pl test/t/03_row_token_load_time.pl
	test/t/08_multi_fence_stress.pl test/t/10_etcd_basic.pl
	test/t/16_etcd_xact_scope.pl test/t/17_etcd_commit_check.pl
	test/t/24_etcd_malformed_replies.pl test/t/63_etcd_lock_many.pl
	test/t/64_etcd_commit_faults.pl test/t/69_etcd_given_up_lease.pl
	test/t/70_leases.pl
	test/t/72_lease_client_gone.pl test/t/81_check.pl
	test/t/87_floor_ends_leases.pl test/t/88_promotion_guard.pl
	test/t/89_differential_paths.pl"
ASSERT_PROVE_TESTS=$(echo $ASSERT_PROVE_TESTS)

# The deployment suites that drive Debian 12's pgbouncer, Prometheus
# (promtool), Patroni and repmgr test those tools against the extension,
# not the major: they run on the host only.  So do the Citus suites (94, 96):
# Citus is built for the host's 15 only.  And 07, the release archive (make
# dist's file list, and that its sources build): the archive is the same
# whatever the major, and each major's lane builds those sources first.
CHROOT_LEAVE_OUT="07 73 83 84 85 90 94 96"

# ---------------------------------------------------------------------------
# Outcomes.  Each lane appends "outcome name" lines to its own file
# ($results); the totals are counted from all of them at the end.
# ---------------------------------------------------------------------------
results=

record() {
	printf '%s %s\n' "$1" "$2" >>"$results"
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

# ---------------------------------------------------------------------------
# Lanes: background jobs, each with its own log and outcome file.
# ---------------------------------------------------------------------------
RUN_DIR=
LANE_NAMES=()
LANE_PIDS=()
LANE_T0=()

# start_lane NAME CMD...: run CMD (a function) in the background.
start_lane() {
	local name=$1 n=${#LANE_NAMES[@]}
	shift
	local base
	base=$(printf '%s/lane%02d' "$RUN_DIR" "$n")
	: >"$base.results"
	(
		results=$base.results
		"$@"
	) >"$base.log" 2>&1 </dev/null &
	LANE_PIDS+=("$!")
	LANE_NAMES+=("$name")
	LANE_T0+=("$SECONDS")
}

lane_counts() {
	local f=$1
	printf '%d passed, %d failed, %d skipped' \
		"$(grep -c '^passed ' "$f")" "$(grep -c '^failed ' "$f")" "$(grep -c '^skipped ' "$f")"
}

# Wait for every lane, saying which ended when; then print their logs in
# the order they were started.
wait_lanes() {
	local left=${#LANE_PIDS[@]} pid i base
	declare -A took=()
	while [ "$left" -gt 0 ]; do
		pid=
		wait -n -p pid
		if [ -z "$pid" ]; then
			[ -n "$(jobs -p)" ] || break	# no lane left (cannot happen)
			continue
		fi
		for i in "${!LANE_PIDS[@]}"; do
			[ "${LANE_PIDS[$i]}" = "$pid" ] || continue
			base=$(printf '%s/lane%02d' "$RUN_DIR" "$i")
			took[$i]=$((SECONDS - LANE_T0[i]))
			echo "run-all.sh: lane ${LANE_NAMES[$i]} ended after ${took[$i]} s ($(lane_counts "$base.results"))"
			left=$((left - 1))
		done
	done
	for i in "${!LANE_PIDS[@]}"; do
		base=$(printf '%s/lane%02d' "$RUN_DIR" "$i")
		echo
		echo "################ ${LANE_NAMES[$i]} (${took[$i]} s)"
		cat "$base.log"
	done
}

# Stop a lane and everything it started (by process id, children first).
kill_tree() {
	local c
	for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
		kill_tree "$c"
	done
	kill -TERM "$1" 2>/dev/null
}

# On interrupt: stop the lanes, give them 10 s to end (the demonstration
# and the history test stop their servers from their own traps), then
# stop what is left running from the run's folder: PostgreSQL nodes of
# TAP files whose perl was killed before its END block (only
# LockfenceTest::EtcdCluster turns a signal into a clean exit), pgbouncer.
# Found by command line or working folder under $RUN_DIR, stopped by pid.
stop_lanes() {
	local p i left pids=()
	for p in "${LANE_PIDS[@]}"; do
		kill -0 "$p" 2>/dev/null && kill_tree "$p"
	done
	for ((i = 0; i < 20; i++)); do
		left=
		for p in "${LANE_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
		[ -z "$left" ] && break
		sleep 0.5
	done
	[ -n "$RUN_DIR" ] || return 0
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		[ "$p" = "$$" ] && continue
		if { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -q -F "$RUN_DIR/" ||
			[[ "$(readlink "/proc/$p/cwd" 2>/dev/null)" == "$RUN_DIR"/* ]]; then
			pids+=("$p")
		fi
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	echo "run-all.sh: stopping ${#pids[@]} process(es) left from the run" >&2
	kill -TERM "${pids[@]}" 2>/dev/null
	for ((i = 0; i < 10; i++)); do
		left=
		for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
		[ -z "$left" ] && return 0
		sleep 0.5
	done
	kill -KILL "${pids[@]}" 2>/dev/null
	return 0
}

# ---------------------------------------------------------------------------
# One PostgreSQL major.
# ---------------------------------------------------------------------------

# prepare_major LABEL PG_CONFIG: copy the tree to $RUN_DIR/work-LABEL,
# build it warning-free and install it (serially: two installs into one
# PostgreSQL must never overlap a test that loads the library), and copy
# the built tree for the timing lane.  Returns non-zero if the build
# failed.
prepare_major() {
	local label=$1 pgc=$2 work=$RUN_DIR/work-$1
	mkdir "$work"
	chmod 755 "$work"
	tar -C "$repo" --exclude=.git -cf - . | tar -C "$work" -xf -
	make -C "$work" -s clean >/dev/null 2>&1
	# JIT bitcode (clang over every file again, half of a build's CPU) is
	# built and installed by the host's release build only: the other
	# majors' servers never inline lockfence's functions in a test, and
	# the host's build already proves every file compiles with clang.
	local -a bitcode=()
	[ "$label" = "$host_major" ] || bitcode=(with_llvm=no)
	build() {
		make -C "$work" -s PG_CONFIG="$pgc" LOCKFENCE_TEST_HOOKS=1 "${bitcode[@]}" \
			PG_CFLAGS='-Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers' &&
			make -C "$work" -s PG_CONFIG="$pgc" "${bitcode[@]}" install
	}
	echo "##### PostgreSQL $label: $("$pgc" --version)"
	local before
	before=$(grep -c '^failed ' "$results")
	suite "[$label] build and install (-Wall -Wextra -Werror)" build
	[ "$(grep -c '^failed ' "$results")" -eq "$before" ] || return 1
	# Per-major preparation: what a major's suites need installed next to
	# lockfence (built once, serially, before any lane starts).  Citus
	# 13.2.2 for the Citus suites (test/t/94_citus_history.pl and
	# 96_citus.pl) on the host's release build only: it is built against
	# Debian's server, not the assert build, and 14.0.1 for the chroot's
	# majors is not built (docs/citus.md).  Without Citus' source the
	# suite is counted as skipped, with the reason; 94 and 96 then skip
	# themselves (plan skip_all), which the TAP lane counts as skipped.
	if [ "$label" = "$host_major" ] && wanted tap; then
		local why
		if why=$("$repo/scripts/citus.sh" check 2>&1); then
			suite "[$label] Citus 13.2.2 built and installed (scripts/citus.sh)" \
				bash -c '"$1"/scripts/citus.sh build && "$1"/scripts/citus.sh install "$2"' _ "$repo" "$pgc"
		else
			skip "[$label] Citus (test/t/94_citus_history.pl, 96_citus.pl)" "$why"
		fi
	fi
	chown -R postgres: "$work"
	cp -a "$work" "$work.timing"
}

# The TAP files LABEL runs, relative to the tree, one a line.
tap_files() {
	local label=$1 list f n
	if [ -n "${PROVE_TESTS:-}" ]; then
		list=$PROVE_TESTS
	elif [ "$label" = "$host_major-assert" ] && [ -z "${ASSERT_ALL_TAP:-}" ]; then
		list=$ASSERT_PROVE_TESTS
	else
		list=test/t/*.pl
	fi
	(
		cd "$RUN_DIR/work-$label" || exit 1
		for f in $list; do
			[ -f "$f" ] || { echo "run-all.sh: no TAP file $f" >&2; continue; }
			n=${f##*/}
			n=${n%%_*}
			if [ -z "${PROVE_TESTS:-}" ]; then
				# pg_upgrade only where the previous major is there (18).
				[ "$n" = 51 ] && [ -z "${LOCKFENCE_UPGRADE_FROM:-}" ] && continue
				[ -n "${LOCKFENCE_IN_CHROOT:-}" ] && [[ " $CHROOT_LEAVE_OUT " == *" $n "* ]] && continue
			fi
			echo "$f"
		done
	)
}

is_timing() {
	local n=${1##*/}
	[[ " $TIMING_TAP " == *" ${n%%_*} "* ]]
}

# Lane state, set by major_env: label, pg_config, tree, PATH.
major_env() {
	label=$1 pgc=$2 work=$3
	bindir=$("$pgc" --bindir)
	pgxs_top=$(cd "$(dirname "$("$pgc" --pgxs)")/../.." && pwd)
	PATH="$bindir:$ORIG_PATH"
	export PATH
	crash_seen=$work.crashes
	: >"$crash_seen"
}

# as_postgres CMD...: run CMD as postgres, niced by NICE_LEVEL, behind the
# command words in RUN_PREFIX (a lock).
NICE_LEVEL=0
RUN_PREFIX=()
as_postgres() {
	"${RUN_PREFIX[@]}" nice -n "$NICE_LEVEL" runuser -u postgres -- env PATH="$PATH" PG_TEST_PORT_DIR="$SHARED_DIR/ports" \
		${LOCKFENCE_UPGRADE_FROM:+LOCKFENCE_UPGRADE_FROM="$LOCKFENCE_UPGRADE_FROM"} "$@"
}

show_diffs() {
	local f
	for f in "$work/regression.diffs" "$work/output_iso/regression.diffs"; do
		[ -s "$f" ] && { echo "--- $f"; head -200 "$f"; }
	done
	return 1
}

# show_tap_logs [FILE...]: what led to each failed check in the TAP logs
# (of the given test files, default all), and the end of the log.  A test
# that died says so at its end instead, in Perl's "... at FILE line N."
# when it died before its first check (a helper's croak in the setup).
show_tap_logs() {
	local f t
	local logs=()
	if [ $# -gt 0 ]; then
		for t in "$@"; do
			t=${t##*/}
			logs+=("$work/tmp_check/log/regress_log_${t%.pl}")
		done
	else
		logs=("$work"/tmp_check/log/regress_log_*)
	fi
	for f in "${logs[@]}"; do
		[ -f "$f" ] && grep -q -e "not ok" -e "exited with" -e "error running SQL" -e "died" -e ' line [0-9][0-9]*\.$' "$f" &&
			{ echo "--- $f"; grep -B40 -A10 "not ok" "$f" | head -300; grep -A2 "error running SQL" "$f" | head -20; echo "..."; tail -40 "$f"; }
	done
	return 1
}

# A failed Assert or a crashed backend fails the suite even when the tests
# passed (a crash in a session the test does not look at, in a background
# worker, at backend exit): the server logs under DIR are searched for it.
# SIGKILL (signal 9) is left out: the crash tests (01, 12, 40) kill
# backends with it on purpose.  Lines already reported are not counted
# again.
no_crash() {
	local found
	found=$(grep -r -H -a -e 'TRAP: ' -e 'terminated by signal' \
		--include='*.log' --include='postmaster.log*' "${1:-$work}" 2>/dev/null |
		grep -v -e 'terminated by signal 9:' | grep -v -F -x -f "$crash_seen")
	[ -z "$found" ] && return 0
	echo "--- server logs report a failed Assert or a crashed process:"
	echo "$found" | head -40
	echo "$found" >>"$crash_seen"
	return 1
}

regress() {
	{ NICE_LEVEL=$BULK_NICE as_postgres make -C "$work" PG_CONFIG="$pgc" installcheck ISOLATION= TAP_TESTS= ||
		show_diffs; } && no_crash "$work/log"
}
isolation() {
	{ NICE_LEVEL=$BULK_NICE as_postgres make -C "$work" PG_CONFIG="$pgc" installcheck REGRESS= TAP_TESTS= ||
		show_diffs; } && no_crash "$work/output_iso"
}

# prove FILE... in the tree as PGXS's installcheck does (the environment
# of prove_installcheck, PostgreSQL 15 and 17+), with the port lock folder
# of the run; output also appended to $work/prove.out.
run_prove() {
	as_postgres env TESTDIR="$work" TESTDATADIR="$work/tmp_check" TESTLOGDIR="$work/tmp_check/log" \
		PATH="$bindir:$work:$PATH" PGPORT="65432" PG_REGRESS="$pgxs_top/src/test/regress/pg_regress" \
		bash -c 'cd "$1" && shift && exec prove "$@"' _ "$work" \
		-I "$pgxs_top/src/test/perl/" -I . -I test/perl --timer "$@" 2>&1 | tee -a "$work/prove.out"
}

# Files prove skipped whole (plan skip_all), and checks skipped inside a
# file (SKIP blocks), each recorded as skipped with its reason: never
# counted as passed.
record_tap_skips() {
	local f why n
	while IFS=$'\t' read -r f why; do
		record skipped "[$label] TAP ${f##*/} (skipped: $why)"
	done < <(sed -n -E 's/^(\[[0-9:]+\] )?(test\/t\/[^ ]+) \.+ skipped: (.*)$/\2\t\3/p' "$work/prove.out")
	for f in "$work"/tmp_check/log/regress_log_*; do
		[ -f "$f" ] || continue
		# (log lines start with "[time](elapsed) ")
		n=$(grep -c -E '^(\[[^]]*\]\([^)]*\) )?ok [0-9]+ # skip' "$f")
		[ "$n" -gt 0 ] || continue
		why=$(grep -m1 -E '^(\[[^]]*\]\([^)]*\) )?ok [0-9]+ # skip' "$f" |
			sed -E 's/^(\[[^]]*\]\([^)]*\) )?ok [0-9]+ # skip *//')
		record skipped "[$label] TAP ${f##*/regress_log_}.pl: $n check(s) skipped ($why)"
	done
}

tap_prepare() {
	rm -rf "$work/tmp_check" "$work/prove.out"
	mkdir -p "$work/tmp_check"
	chown postgres: "$work/tmp_check"
}

# The TAP files that bound no time, prove -j$TAP_JOBS, niced.
tap_bulk() {
	tap_prepare
	local rc=0
	NICE_LEVEL=$BULK_NICE run_prove -j"$TAP_JOBS" "$@" || rc=1
	record_tap_skips
	[ $rc -eq 0 ] || show_tap_logs
	no_crash "$work/tmp_check" || rc=1
	return $rc
}

# prove_in_slot FILE: take a timing slot (one of TIMING_SLOTS lock files
# in the run's shared folder; the chroot's lanes use the same files) and
# prove FILE holding it.  flock -o: the test and the servers it starts do
# not inherit the lock.
prove_in_slot() {
	local i rc n=${1##*/}
	n=${n%%_*}
	if [[ " $STRICT_TIMING_TAP " == *" $n "* ]]; then
		# all the slots (taken in order, waiting): no other timing file
		# runs beside it
		RUN_PREFIX=()
		for ((i = 1; i <= TIMING_SLOTS; i++)); do
			RUN_PREFIX+=(flock -o "$SHARED_DIR/timing-slot.$i")
		done
		NICE_LEVEL=$TIMING_NICE run_prove "$1"
		rc=$?
		RUN_PREFIX=()
		return $rc
	fi
	while :; do
		for ((i = 1; i <= TIMING_SLOTS; i++)); do
			RUN_PREFIX=(flock -n -o -E 200 "$SHARED_DIR/timing-slot.$i")
			NICE_LEVEL=$TIMING_NICE run_prove "$1"
			rc=$?
			RUN_PREFIX=()
			[ $rc -ne 200 ] && return $rc
		done
		sleep 0.3
	done
}

# The timing-sensitive files, one at a time, each holding a slot.
tap_timing() {
	tap_prepare
	local f rc=0
	for f in "$@"; do
		if ! prove_in_slot "$f"; then
			rc=1
			show_tap_logs "$f"
		fi
	done
	record_tap_skips
	no_crash "$work/tmp_check" || rc=1
	return $rc
}

# Wait until the demonstration has installed lockfence into the host's
# PostgreSQL (it builds and installs its own copy first): an install must
# not overlap a test that loads the library.
wait_demo_installed() {
	[ -n "${DEMO_LANE_PID:-}" ] && [ "$label" = "$host_major" ] || return 0
	while [ ! -e "$RUN_DIR/demo-installed" ] && kill -0 "$DEMO_LANE_PID" 2>/dev/null; do
		sleep 0.5
	done
}

# Lane: pg_regress, isolation and the TAP files that bound no time.
lane_major() {
	major_env "$@"
	local files=() f
	wait_demo_installed
	# On the assert build, pg_regress and the isolation specs run in the
	# Valgrind lane (the same binaries, their Asserts on): not twice.
	if [ "$label" = "$host_major-assert" ] && [ -n "$valgrind_ok" ]; then
		echo "[$label] pg_regress and isolation: in the Valgrind lane, on this build"
	else
		wanted regress && suite "[$label] pg_regress" regress
		wanted isolation && suite "[$label] isolation" isolation
	fi
	if wanted tap; then
		while read -r f; do is_timing "$f" || files+=("$f"); done < <(tap_files "$label")
		[ ${#files[@]} -gt 0 ] &&
			suite "[$label] TAP (${#files[@]} files, prove -j$TAP_JOBS)" tap_bulk "${files[@]}"
	fi
	return 0
}

# Lane: the timing-sensitive TAP files, in the second copy of the tree.
lane_major_timing() {
	major_env "$@"
	local files=() f
	wait_demo_installed
	while read -r f; do is_timing "$f" && files+=("$f"); done < <(tap_files "$label")
	[ ${#files[@]} -gt 0 ] &&
		suite "[$label] TAP, timing-sensitive (${#files[@]} files, one at a time)" tap_timing "${files[@]}"
	return 0
}

# start_major_lanes LABEL PG_CONFIG
start_major_lanes() {
	local f bulk= timing=
	if wanted tap; then
		while read -r f; do
			if is_timing "$f"; then timing=1; else bulk=1; fi
		done < <(tap_files "$1")
	fi
	if wanted regress || wanted isolation || [ -n "$bulk" ]; then
		start_lane "[$1]" lane_major "$1" "$2" "$RUN_DIR/work-$1"
	fi
	if [ -n "$timing" ]; then
		start_lane "[$1] timing-sensitive TAP" lane_major_timing "$1" "$2" "$RUN_DIR/work-$1.timing"
	fi
}

make_shared_dir() {
	SHARED_DIR=$1
	mkdir -p "$SHARED_DIR/ports"
	chmod 1777 "$SHARED_DIR" "$SHARED_DIR/ports"
}

# The lines that say why each failed lane failed, last in the output (a
# CI record may keep only the run's tail): prove's failed checks with what
# they got, the message of a TAP file that died (Perl's "... at FILE line
# N.", a helper's "exited with value"), pg_regress's failed tests,
# crashes.  The whole logs are above.
failure_digest() {
	local i base
	for i in "${!LANE_PIDS[@]}"; do
		base=$(printf '%s/lane%02d' "$RUN_DIR" "$i")
		grep -q '^failed ' "$base.results" 2>/dev/null || continue
		echo
		echo "---- why ${LANE_NAMES[$i]} failed (from its log above):"
		grep -a -E -A4 \
			-e '^#[[:space:]]+Failed test' -e '(Wstat|Dubious|No plan found|Bail out)' \
			-e '\.\.\. FAILED' -e '^not ok' -e 'TRAP: ' -e 'terminated by signal' \
			-e '^=== .*: FAILED' -e 'did not complete' -e 'timed out' \
			-e '^[^#].* at [^ ]+ line [0-9]+\.$' -e 'exited with value' "$base.log" |
			head -60
	done
}

# Counted from the outcome files, in order.
closing_line() {
	local passed failed skipped
	cat "$@" >"$RUN_DIR/all.results" 2>/dev/null
	passed=$(grep -c '^passed ' "$RUN_DIR/all.results")
	failed=$(grep -c '^failed ' "$RUN_DIR/all.results")
	skipped=$(grep -c '^skipped ' "$RUN_DIR/all.results")
	echo
	[ "$failed" -gt 0 ] && sed -n 's/^failed /failed: /p' "$RUN_DIR/all.results"
	[ "$skipped" -gt 0 ] && sed -n 's/^skipped /skipped: /p' "$RUN_DIR/all.results"
	if [ "$skipped" -gt 0 ]; then
		echo "$passed passed, $failed failed, $skipped skipped"
	else
		echo "$passed passed, $failed failed"
	fi
	[ "$failed" -eq 0 ]
}

# ---------------------------------------------------------------------------
# Inside the chroot (started by the run below): the chroot's majors, side
# by side.  Its outcomes go to $LOCKFENCE_RESULTS for the run outside.
# ---------------------------------------------------------------------------
if [ -n "${LOCKFENCE_IN_CHROOT:-}" ]; then
	RUN_DIR=$(mktemp -d /tmp/lockfence-inner.XXXXXX)
	chmod 755 "$RUN_DIR"
	SHARED_DIR=$LOCKFENCE_SHARED_DIR
	trap 'stop_lanes' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	results=$RUN_DIR/prep.results
	: >"$results"
	declare -A upgrade_from=()
	ready=()
	for m in $PG_MAJORS; do
		pgc=/usr/lib/postgresql/$m/bin/pg_config
		if [ ! -x "$pgc" ]; then
			suite "[$m] PostgreSQL $m in the chroot" false
			continue
		fi
		# pg_upgrade is tested on the newest major, from the one before
		# (lockfence built and installed there first).
		old=/usr/lib/postgresql/$((m - 1))/bin/pg_config
		if [ "$m" = 18 ] && [ -x "$old" ] && wanted tap; then
			if [[ " $PG_MAJORS " != *" $((m - 1)) "* ]]; then
				prepare_major "$((m - 1))" "$old"
			fi
			upgrade_from[$m]=$("$old" --bindir)
		fi
		prepare_major "$m" "$pgc" && ready+=("$m")
	done
	for m in "${ready[@]}"; do
		LOCKFENCE_UPGRADE_FROM=${upgrade_from[$m]:-}
		export LOCKFENCE_UPGRADE_FROM
		start_major_lanes "$m" "/usr/lib/postgresql/$m/bin/pg_config"
	done
	LOCKFENCE_UPGRADE_FROM=
	wait_lanes
	cat "$RUN_DIR/prep.results" "$RUN_DIR"/lane*.results >>"$LOCKFENCE_RESULTS"
	echo "done" >>"$LOCKFENCE_RESULTS.done"
	rm -rf "$RUN_DIR"
	exit 0
fi

# ---------------------------------------------------------------------------
# On the host: the host's majors here, the others in the chroot.
# ---------------------------------------------------------------------------
host_pg_config=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
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
STRESS_PID=
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_lanes
	[ -n "${CHROOT_CHILD:-}" ] && kill -TERM "$CHROOT_CHILD" 2>/dev/null
	[ -n "$STRESS_PID" ] && kill -TERM "$STRESS_PID" 2>/dev/null
	chroot_leave
	[ -n "$chroot_work" ] && rm -rf "$chroot_work"
	if [ -n "$RUN_DIR" ]; then
		if [ -n "${LOCKFENCE_KEEP_RUN:-}" ]; then
			echo "run-all.sh: the run's folder is kept: $RUN_DIR" >&2
		else
			rm -rf "$RUN_DIR"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'echo "run-all.sh: interrupted" >&2; exit 130' INT
trap 'echo "run-all.sh: terminated" >&2; exit 143' TERM

RUN_DIR=$(mktemp -d /tmp/lockfence-run.XXXXXX)
chmod 755 "$RUN_DIR"
results=$RUN_DIR/prep.results
: >"$results"
t_start=$SECONDS

# --- Serially, once: dependencies, chroot, assert build, builds. ----------
host_majors=()
chroot_majors=()
deps_ok=
for m in $PG_MAJORS; do
	if [ "$m" = "$host_major" ] || [ "$m" = "$host_major-assert" ]; then
		if [ -z "$deps_ok" ]; then
			if "$repo/scripts/install-deps.sh"; then
				deps_ok=1
			else
				suite "[$m] dependencies (scripts/install-deps.sh)" false
				deps_ok=0
			fi
		fi
		[ "$deps_ok" = 1 ] && host_majors+=("$m")
	elif [[ " $CHROOT_MAJORS " == *" $m "* ]]; then
		chroot_majors+=("$m")
	else
		echo "run-all.sh: PostgreSQL $m is not in the matrix (15 15-assert $CHROOT_MAJORS)" >&2
		suite "[$m] PostgreSQL $m available" false
	fi
done

if [ -n "${STRESS:-}" ] && [ "$STRESS" != 0 ]; then
	if ! command -v stress-ng >/dev/null; then
		echo "run-all.sh: STRESS needs stress-ng (scripts/install-deps.sh)" >&2
		exit 1
	fi
	# A safety timeout too, should this script be killed without its trap.
	stress-ng --cpu "${STRESS_CPUS:-2}" --timeout 4h --quiet &
	STRESS_PID=$!
	echo "run-all.sh: STRESS: stress-ng --cpu ${STRESS_CPUS:-2} running (pid $STRESS_PID) until the end of the run"
fi

chroot_ok=
if [ ${#chroot_majors[@]} -gt 0 ]; then
	echo "##### PostgreSQL ${chroot_majors[*]} in the chroot $CHROOT_ROOT"
	if chroot_ensure && chroot_enter; then
		chroot_ok=1
	else
		suite "[${chroot_majors[*]}] chroot (scripts/chroot.sh)" false
	fi
fi

# The folder every lane shares (port reservations, timing slots): inside
# the chroot's /tmp when the chroot runs, so its lanes see the same files.
if [ -n "$chroot_ok" ]; then
	make_shared_dir "$CHROOT_ROOT/tmp/lockfence-shared.$$"
else
	make_shared_dir "$RUN_DIR/shared"
fi

prepared=()
for m in "${host_majors[@]}"; do
	if [ "$m" = "$host_major" ]; then
		prepare_major "$m" "$host_pg_config" && prepared+=("$m:$host_pg_config")
	else
		# Every TAP file runs here too with ASSERT_ALL_TAP=1: the
		# deployment suites find the server through pg_config on PATH,
		# which is the assert build's.
		if ! "$repo/scripts/pg-assert.sh" build; then
			suite "[$m] assert-enabled build (scripts/pg-assert.sh)" false
		else
			apgc=$("$repo/scripts/pg-assert.sh" path)
			prepare_major "$m" "$apgc" && prepared+=("$m:$apgc")
		fi
	fi
done

fuzz_ok=
if wanted fuzz; then
	if "$repo/fuzz/run.sh" check >/dev/null 2>&1; then
		fuzz_ok=1
	else
		skip "[host] fuzzers" "$("$repo/fuzz/run.sh" check 2>&1 | tail -1)"
	fi
fi
prep_seconds=$((SECONDS - t_start))
echo "run-all.sh: prepared in $prep_seconds s; the suites run side by side now"
valgrind_ok=
if wanted valgrind; then
	if [ -z "$SUITES_GIVEN" ] && [ "$prep_seconds" -gt "$VALGRIND_MAX_PREP" ]; then
		skip "[host] Valgrind" "the preparation took $prep_seconds s (over VALGRIND_MAX_PREP=$VALGRIND_MAX_PREP: caches were built); with Valgrind the run would near CI's limit; SUITES=valgrind bash test/run-all.sh runs it"
	else
		valgrind_ok=1
	fi
fi

# --- Side by side. ----------------------------------------------------------

# The demonstration and the history test, on 15 only: they exercise the
# client side (Python, Redis, ZooKeeper) against the extension, which the
# other suites already cover on every major.  One after the other (their
# servers take free ports the same way).
lane_clients() {
	local pgc=$1 tree=$RUN_DIR/clients
	mkdir "$tree"
	tar -C "$repo" --exclude=.git -cf - . | tar -C "$tree" -xf -
	if wanted demo && [ -x "$tree/demo/run.sh" ]; then
		demo() {
			# LOCKFENCE_TEST_HOOKS=1 (make reads it from the environment):
			# the demonstration's build replaces the one the host's lanes
			# installed, and their TAP files 40, 41 and 89 need the test
			# hooks in it (without, they failed with exit 29 in a full run)
			nice -n "$CLIENT_NICE" env PG_CONFIG="$pgc" LOCKFENCE_TEST_HOOKS=1 bash "$tree/demo/run.sh" &
			local dpid=$! self=$RUN_DIR/lane00.log
			# It installs lockfence first, then says it starts its servers.
			while kill -0 "$dpid" 2>/dev/null && ! grep -q '^demo: starting PostgreSQL' "$self"; do
				sleep 0.5
			done
			touch "$RUN_DIR/demo-installed"
			wait "$dpid"
		}
		suite "[$host_major] demonstration (demo/run.sh)" demo
	fi
	touch "$RUN_DIR/demo-installed"
	if wanted history; then
		suite "[$host_major] fault history (test/history/run.sh)" \
			nice -n "$CLIENT_NICE" env PG_CONFIG="$pgc" LOCKFENCE_HISTORY_NO_BUILD=1 \
			bash "$tree/test/history/run.sh"
	fi
	touch "$RUN_DIR/clients-done"
	return 0
}

DEMO_LANE_PID=
CLIENTS_LANE=
for p in "${prepared[@]}"; do
	if [ "${p%%:*}" = "$host_major" ] && { wanted demo || wanted history; }; then
		# First lane (lane00: its log is watched for the demo's install).
		start_lane "[$host_major] demonstration and history test" lane_clients "${p#*:}"
		CLIENTS_LANE=${LANE_PIDS[0]}
		wanted demo && DEMO_LANE_PID=${LANE_PIDS[0]}
	fi
done

for p in "${prepared[@]}"; do
	start_major_lanes "${p%%:*}" "${p#*:}"
done
DEMO_LANE_PID=

lane_chroot() {
	chroot_work=$(mktemp -d "$CHROOT_ROOT/tmp/lockfence-matrix.XXXXXX")
	local inner=/tmp/${chroot_work##*/}
	# The tree in src/, the suites' outcomes next to it.
	mkdir "$chroot_work/src"
	tar -C "$repo" --exclude=.git -cf - . | tar -C "$chroot_work/src" -xf -
	chroot_exec env LOCKFENCE_IN_CHROOT=1 PG_MAJORS="${chroot_majors[*]}" \
		SUITES="$SUITES" ${PROVE_TESTS:+PROVE_TESTS="$PROVE_TESTS"} \
		${ASSERT_ALL_TAP:+ASSERT_ALL_TAP="$ASSERT_ALL_TAP"} \
		TAP_JOBS="$TAP_JOBS" TIMING_SLOTS="$TIMING_SLOTS" BULK_NICE="$BULK_NICE" TIMING_NICE="$TIMING_NICE" \
		LOCKFENCE_SHARED_DIR="/tmp/${SHARED_DIR##*/}" \
		LOCKFENCE_RESULTS="$inner/results" \
		bash "$inner/src/test/run-all.sh"
	cat "$chroot_work/results" >>"$results" 2>/dev/null
	if [ ! -s "$chroot_work/results.done" ]; then
		record failed "[${chroot_majors[*]}] chroot run did not complete"
	fi
	rm -rf "$chroot_work"
}
if [ -n "$chroot_ok" ]; then
	start_lane "[${chroot_majors[*]}] in the chroot" lane_chroot
fi

if [ -n "$fuzz_ok" ]; then
	start_lane "[host] fuzzers" suite "[host] fuzzers (fuzz/run.sh, ${FUZZ_SECONDS:-30} s each)" \
		nice -n "$BULK_NICE" "$repo/fuzz/run.sh"
fi
# Valgrind starts when the demonstration and the history test's fenced
# run are done: beside them on 2 cores it took the CPU their workers need
# to reach their operation counts (the history test did 7,177 of its
# 10,000 operations).  The history test's self-check counts no operations
# (it must find violations, and found 108 in a full run of f9a1a25), so
# Valgrind runs beside it: the self-check's 98 s came off the run's end.
lane_valgrind() {
	if [ -n "$CLIENTS_LANE" ]; then
		while [ ! -e "$RUN_DIR/clients-done" ] && kill -0 "$CLIENTS_LANE" 2>/dev/null &&
			! grep -q '^history: fenced run took' "$RUN_DIR/lane00.log"; do
			sleep 2
		done
	fi
	suite "[host] Valgrind memcheck on 15-assert (scripts/pg-assert.sh valgrind)" \
		nice -n "$BULK_NICE" "$repo/scripts/pg-assert.sh" valgrind
}
if [ -n "$valgrind_ok" ]; then
	start_lane "[host] Valgrind" lane_valgrind
fi

wait_lanes
failure_digest
echo
echo "run-all.sh: $((SECONDS - t_start)) s in all"
closing_line "$RUN_DIR/prep.results" "$RUN_DIR"/lane*.results
