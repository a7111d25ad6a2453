#!/bin/bash
#
# bench/all.sh
#	  Every benchmark of lockfence in one command, and one table of the
#	  targets of issues 21 (item 5) and 22 (item 5, C1): each measure, its target, this run's
#	  median and spread (lowest and highest per-round value), PASS or FAIL,
#	  with the commit and the date on top.  Runs, one after another:
#
#	    bench/core.sh        B1 (pgbench, one single-row UPDATE per
#	                         transaction), B3 (one UPDATE of 100,000 rows)
#	    bench/multixact.sh   B4 (8 and 32 clients under one token)
#	    bench/lease.sh       the lease cycle, hand-on with 8 sessions
#	    bench/etcd_cycle.sh  the etcd lock cycle, 1, 8 and 32 holders
#	    bench/citus.sh       C1 (issue 22): fence + a single-shard UPDATE
#	                         on a Citus cluster, in one delegated function
#	                         call (the target) and as BEGIN; fence();
#	                         UPDATE; COMMIT (a diagnostic), vs the UPDATE
#	                         alone, and what the workers run per
#	                         transaction (needs Citus installed in
#	                         PG_CONFIG's installation)
#
#	  Each prints "RESULT name=ID median=M min=LO max=HI n=N" lines; this
#	  script reads them from the output.  A measure whose RESULT line is
#	  missing or malformed is a FAIL row, never a silent PASS; so is a
#	  benchmark that exits non-zero.  One exception: without Citus
#	  installed in PG_CONFIG's PostgreSQL the C1 rows are SKIP rows with
#	  the reason (a "SKIP prefix=C1_ reason=..." line in the output, which
#	  --from reads too), and the summary says so.  Exit status 0 only if
#	  every target that was measured is met.
#
#	  The whole output (every benchmark's, then the table) is saved as
#	  bench/results/DATE-COMMIT[-dirty]-all[-quick][-only-SUBSET][-runN].txt.
#
#	  Usage (as root):
#	    PG_CONFIG=/opt/pg-NAME/usr/lib/postgresql/15/bin/pg_config bench/all.sh
#	    QUICK=1 bench/all.sh         short rounds: a smoke test (~10 min)
#	    ONLY="core multixact" bench/all.sh   a subset (the others FAIL)
#	    ONLY=citus bench/all.sh      only the Citus benchmark
#	    bench/all.sh --from FILE...  no benchmark: the table from saved
#	                                 output (checks the parsing; with
#	                                 /dev/null every row is a FAIL)
#
#	  PG_CONFIG must be a private PostgreSQL 15 installation (never the
#	  system one): this tree's extension is built and installed into it.
#	  Unset, a private copy of the system PostgreSQL 15 is made in a temp
#	  folder.  Other settings of the benchmarks (ROUNDS, DURATION, ...) are
#	  set here from QUICK; ETCD_ARGS replaces etcd_cycle.sh's arguments.
#
# IDENTIFICATION
#	  bench/all.sh
#

set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TREE=$(cd "$HERE/.." && pwd)
QUICK=${QUICK:-0}
ONLY=${ONLY:-core multixact lease etcd citus}

die() { echo "all.sh: $*" >&2; exit 2; }

# ---------------------------------------------------------------------------
# The targets: ID|measure|op|target.  op "info" rows are shown, not judged
# (but a missing one still fails: the benchmark did not say it).
# ---------------------------------------------------------------------------
TARGETS=(
	"B1_tps_ratio|B1: TPS protected / unprotected, fsync'ed commits|>=|0.95"
	"B1_async_cpu_ratio|B1: CPU per xact unprotected / protected, synchronous_commit off|>=|0.90"
	"B1_cpu_ratio|B1: CPU per xact unprotected / protected, fsync'ed|info|"
	"B1_async_tps_ratio|B1: TPS protected / unprotected, synchronous_commit off|info|"
	"B3_ms_vs_ctrig|B3: UPDATE of 100,000 rows, time protected / no-op C trigger|<=|1.05"
	"B3_cpu_vs_ctrig|B3: the same, backend CPU protected / no-op C trigger|info|"
	"B3_ms_ratio|B3: time protected / unprotected|info|"
	"B4_c8_tps_ratio|B4: 8 clients, one token: TPS protected / unprotected|>=|0.90"
	"B4_c8_mxact_excess|B4: 8 clients: MultiXacts per 1000 xacts, protected - unprotected|<=|0"
	"B4_c8_slru_excess|B4: 8 clients: MultiXact SLRU pages zeroed per run, protected - unprotected|<=|0"
	"B4_c32_tps_ratio|B4: 32 clients, one token: TPS protected / unprotected|>=|0.90"
	"B4_c32_mxact_excess|B4: 32 clients: MultiXacts per 1000 xacts, protected - unprotected|<=|0"
	"B4_c32_slru_excess|B4: 32 clients: MultiXact SLRU pages zeroed per run, protected - unprotected|<=|0"
	"B4_mxid_age_db|B4: mxid_age(datminmxid) after all B4 runs|info|"
	"E1_p50_vs_session_floor|etcd cycle, 1 holder: p50 / session-lease floor's|<=|1.15"
	"E8_p50_ms|etcd cycle, 8 holders: p50 ms|<=|20"
	"E8_cycles_per_s|etcd cycle, 8 holders: cycles/s|>=|300"
	"E32_p50_vs_watch_c|etcd cycle, 32 holders: p50 / C synced-watch client's|<=|1.10"
	"E32_watch_c_vs_cycles_per_s|etcd cycle, 32 holders: C synced-watch cycles/s / lockfence's|<=|1.10"
	"L1_lease_vs_update|lease cycle: time / two durable single-row UPDATEs|<=|1.20"
	"L2_handon_p50_ms|lease hand-on, 8 sessions: p50 ms|<|1"
	"L2_lost_wakeups|lease hand-on, 8 sessions: lost wake-ups, non-consecutive tokens|<=|0"
	"C1_delegated_tps_ratio|C1 (Citus): TPS fence + single-shard UPDATE in one delegated function / the same function without fence(), unprotected|>=|0.85"
	"C1_plain_function_vs_update_tps_ratio|C1 (Citus) diagnostic: TPS that function without fence() / the bare UPDATE (the form's cost on Citus)|info|"
	"C1_delegated_vs_update_tps_ratio|C1 (Citus) diagnostic: TPS the function with fence() / the bare UPDATE|info|"
	"C1_delegated_extra_worker_stmts|C1 (Citus): statements the workers receive per transaction, delegated call - bare UPDATE|<=|0"
	"C1_delegated_2pc_per_xact|C1 (Citus): two-phase commit statements per delegated call|<=|0"
	"C1_tps_ratio|C1 (Citus) diagnostic: TPS BEGIN; fence(); UPDATE; COMMIT / BEGIN; UPDATE; COMMIT, statement by statement|info|"
	"C1_compound_tps_ratio|C1 (Citus) diagnostic: the same, each transaction sent as one compound query|info|"
	"C1_extra_worker_stmts|C1 (Citus) diagnostic: statements on the workers per transaction, BEGIN; fence(); ... - BEGIN; UPDATE; ...|info|"
	"C1_fenced_2pc_per_xact|C1 (Citus): two-phase commit statements per BEGIN; fence(); UPDATE; COMMIT|<=|0"
	"C1_extra_worker_sessions|C1 (Citus): worker sessions opened per transaction, fenced - unfenced (counts this script's and Citus' own sessions too)|info|"
)

num_re='^-?[0-9]+(\.[0-9]+)?$'

# A figure with 3 or 4 significant digits, never in exponent notation.
fmt() {
	awk -v x="$1" 'BEGIN { a = x < 0 ? -x : x
		if (a >= 1000) printf "%.0f", x; else if (a >= 100) printf "%.1f", x
		else if (a >= 10) printf "%.2f", x; else printf "%.3f", x }'
}

# table LOG...: the table of the targets from the RESULT lines of the logs;
# returns 1 if any target failed or any RESULT line is missing.  A
# "SKIP prefix=P reason=TEXT" line turns the rows whose ID starts with P
# and have no RESULT line into SKIP rows with that reason.
table() {
	local -A R=() SKIP=()
	local line name med lo hi n id desc op target verdict spread failed=0 rest p skipped=0
	while read -r line; do
		p=$(sed -n 's/^SKIP prefix=\([^ ]*\) reason=\(.*\)$/\1/p' <<<"$line")
		[ -n "$p" ] && SKIP[$p]=$(sed -n 's/^SKIP prefix=[^ ]* reason=\(.*\)$/\1/p' <<<"$line")
	done < <(cat "$@" 2>/dev/null | grep -a '^SKIP prefix=' || true)
	while read -r line; do
		name=$(sed -n 's/.* name=\([^ ]*\).*/\1/p' <<<"$line")
		med=$(sed -n 's/.* median=\([^ ]*\).*/\1/p' <<<"$line")
		lo=$(sed -n 's/.* min=\([^ ]*\).*/\1/p' <<<"$line")
		hi=$(sed -n 's/.* max=\([^ ]*\).*/\1/p' <<<"$line")
		n=$(sed -n 's/.* n=\([^ ]*\).*/\1/p' <<<"$line")
		[ -n "$name" ] || continue
		if [[ $med =~ $num_re && $lo =~ $num_re && $hi =~ $num_re && $n =~ ^[0-9]+$ ]]; then
			R[$name]="$med $lo $hi $n"
		else
			R[$name]=malformed
		fi
	done < <(cat "$@" 2>/dev/null | grep -a '^RESULT ' || true)

	echo "| measure | target | median | spread (min to max) | n | |"
	echo "|---|---|---|---|---|---|"
	for t in "${TARGETS[@]}"; do
		IFS='|' read -r id desc op target <<<"$t"
		rest=${R[$id]:-missing}
		if [ "$rest" = missing ]; then
			for p in "${!SKIP[@]}"; do
				[ "${id#"$p"}" != "$id" ] && rest=skip && break
			done
		fi
		if [ "$rest" = skip ]; then
			printf '| %s | %s | %s | | | SKIP (%s) |\n' "$desc" \
				"$([ "$op" = info ] && echo "-" || echo "$op $target")" "-" "${SKIP[$p]}"
			skipped=$((skipped + 1))
			continue
		fi
		if [ "$rest" = missing ] || [ "$rest" = malformed ]; then
			printf '| %s | %s | %s | | | FAIL (%s RESULT line %s) |\n' "$desc" \
				"$([ "$op" = info ] && echo "-" || echo "$op $target")" "-" "$rest" "$id"
			failed=1
			continue
		fi
		read -r med lo hi n <<<"$rest"
		if [ "$op" = info ]; then
			verdict=info
		elif awk -v m="$med" -v t="$target" -v op="$op" 'BEGIN {
				if (op == ">=") exit !(m >= t); if (op == "<=") exit !(m <= t);
				if (op == "<") exit !(m < t); exit 1 }'; then
			verdict=PASS
		else
			verdict=FAIL
			failed=1
		fi
		if [ "$n" = 1 ]; then
			spread="(one run)"
		else
			spread="$(fmt "$lo") to $(fmt "$hi")"
		fi
		printf '| %s | %s | %s | %s | %s | %s |\n' "$desc" \
			"$([ "$op" = info ] && echo "-" || echo "$op $target")" \
			"$(fmt "$med")" "$spread" "$n" "$verdict"
	done
	if [ $skipped -gt 0 ]; then
		echo
		echo "SKIPPED, not measured: $skipped rows (${!SKIP[*]}): $(printf '%s; ' "${SKIP[@]}" | sed 's/; $//')"
	fi
	return $failed
}

if [ "${1:-}" = --from ]; then
	shift
	[ $# -gt 0 ] || die "--from needs a file"
	table "$@"
	exit $?
fi
[ $# = 0 ] || die "usage: [QUICK=1] [ONLY=\"core multixact lease etcd citus\"] bench/all.sh | bench/all.sh --from FILE..."

[ "$(id -u)" = 0 ] || die "run me as root (the servers run as user postgres)"

COMMIT=$(git -C "$TREE" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$TREE" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
	COMMIT="$COMMIT+dirty"
fi
DAY=$(date -u +%Y-%m-%d)
mkdir -p "$HERE/results"
BASE="$HERE/results/$DAY-${COMMIT/+/-}-all$([ "$QUICK" = 1 ] && echo -quick)"
if [ "$ONLY" != "core multixact lease etcd citus" ]; then
	BASE="$BASE-only-$(echo $ONLY | tr ' ' '-')"
fi
OUT=$BASE.txt
k=2
while [ -e "$OUT" ]; do
	OUT=$BASE-run$k.txt
	k=$((k + 1))
done

if [ "$QUICK" = 1 ]; then
	CORE_ENV=(ROUNDS=2 DURATION=2 B3_ROUNDS=3)
	MX_ENV=(ROUNDS=2 DURATION=3)
	LEASE_ENV=(ROUNDS=2 DURATION=2 L2_SECONDS=3)
	ETCD_DEFAULT="--holders 1,8,32 --seconds 2 --rounds 2"
	CITUS_ENV=(ROUNDS=3 DURATION=3 STMT_XACTS=50)
else
	CORE_ENV=(ROUNDS=5 DURATION=5)
	MX_ENV=(ROUNDS=5 DURATION=5)
	LEASE_ENV=(ROUNDS=5 DURATION=5 L2_SECONDS=10)
	ETCD_DEFAULT="--holders 1,8,32 --seconds 5 --rounds 3"
	CITUS_ENV=(ROUNDS=7 DURATION=5)
fi
# The clients the targets need (lockfence from C, the two floors).
ETCD_ARGS=${ETCD_ARGS:-$ETCD_DEFAULT --clients lockfence,session-floor,watch-c}

WORK=$(mktemp -d /tmp/lockfence-all.XXXXXX)
chmod 755 "$WORK"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

main() {
	local rc=0 b st=0
	: >"$WORK/runs.log"
	local -a failed_runs=()
	echo "lockfence bench/all.sh: commit $COMMIT, $(date -u '+%Y-%m-%d %H:%M UTC'), QUICK=$QUICK, ONLY=\"$ONLY\""
	echo "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -srm)"

	if [ -z "${PG_CONFIG:-}" ]; then
		local X=$WORK/pg
		echo "# private PostgreSQL copy in $X" >&2
		mkdir -p "$X/usr/lib/postgresql" "$X/usr/share/postgresql"
		cp -a /usr/lib/postgresql/15 "$X/usr/lib/postgresql/"
		cp -a /usr/share/postgresql/15 "$X/usr/share/postgresql/"
		ln -s /usr/include "$X/usr/include"
		PG_CONFIG=$X/usr/lib/postgresql/15/bin/pg_config
	fi
	[ -x "$PG_CONFIG" ] || die "PG_CONFIG=$PG_CONFIG is not executable"
	case "$("$PG_CONFIG" --pkglibdir)" in
		/usr/lib/postgresql/*) die "PG_CONFIG points at the system PostgreSQL; give a private copy" ;;
	esac
	export PG_CONFIG
	echo "PG_CONFIG=$PG_CONFIG"

	# This tree's extension in PG_CONFIG's installation: etcd_cycle.sh uses
	# what is installed (the others build and install it themselves).
	echo "# building lockfence from $TREE into $PG_CONFIG's installation" >&2
	tar -C "$TREE" --exclude=.git --exclude=bench/results -cf - . |
		tar -C "$WORK" --one-top-level=build -xf -
	{ make -C "$WORK/build" -s PG_CONFIG="$PG_CONFIG" >"$WORK/build.log" 2>&1 &&
		make -C "$WORK/build" -s PG_CONFIG="$PG_CONFIG" install >>"$WORK/build.log" 2>&1; } ||
		{ cat "$WORK/build.log"; die "build failed"; }

	for b in $ONLY; do
		echo
		case "$b" in
			core)
				echo "=== bench/core.sh (${CORE_ENV[*]})"
				env "${CORE_ENV[@]}" bash "$HERE/core.sh" 2>&1 | tee -a "$WORK/runs.log"
				st=${PIPESTATUS[0]} ;;
			multixact)
				echo "=== bench/multixact.sh (${MX_ENV[*]})"
				env "${MX_ENV[@]}" bash "$HERE/multixact.sh" 2>&1 | tee -a "$WORK/runs.log"
				st=${PIPESTATUS[0]} ;;
			lease)
				echo "=== bench/lease.sh (${LEASE_ENV[*]})"
				env "${LEASE_ENV[@]}" bash "$HERE/lease.sh" 2>&1 | tee -a "$WORK/runs.log"
				st=${PIPESTATUS[0]} ;;
			etcd)
				echo "=== bench/etcd_cycle.sh $ETCD_ARGS"
				# shellcheck disable=SC2086
				bash "$HERE/etcd_cycle.sh" $ETCD_ARGS 2>&1 | tee -a "$WORK/runs.log"
				st=${PIPESTATUS[0]} ;;
			citus)
				echo "=== bench/citus.sh (${CITUS_ENV[*]})"
				if [ ! -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ] ||
					[ ! -f "$("$PG_CONFIG" --sharedir)/extension/citus.control" ]; then
					# not a failure of lockfence: the C1 rows are SKIP rows
					echo "SKIP prefix=C1_ reason=Citus is not installed in $("$PG_CONFIG" --pkglibdir) (scripts/citus.sh build && scripts/citus.sh install PG_CONFIG)" |
						tee -a "$WORK/runs.log"
					st=0
				else
					env "${CITUS_ENV[@]}" bash "$HERE/citus.sh" 2>&1 | tee -a "$WORK/runs.log"
					st=${PIPESTATUS[0]}
					if [ "$st" = 3 ]; then
						# citus.sh found no Citus after all: its reason
						echo "SKIP prefix=C1_ reason=$(grep -a -m1 'SKIP: ' "$WORK/runs.log" | sed 's/.*SKIP: //')" |
							tee -a "$WORK/runs.log"
						st=0
					fi
				fi ;;
			*)
				echo "unknown benchmark $b (core, multixact, lease, etcd, citus)"
				st=2 ;;
		esac
		if [ $st != 0 ]; then
			echo "=== $b: exit status $st"
			failed_runs+=("$b (exit $st)")
		fi
	done
	echo
	echo "=== Targets (issues 21, 22): commit $COMMIT, $(date -u '+%Y-%m-%d %H:%M UTC'), bench/all.sh$([ "$QUICK" = 1 ] && echo " QUICK=1")"
	echo
	echo "Medians of per-round values; spread = lowest and highest per-round value; n = rounds."
	echo
	table "$WORK/runs.log" || rc=1
	if [ ${#failed_runs[@]} -gt 0 ]; then
		echo
		echo "FAIL: benchmarks that exited non-zero: ${failed_runs[*]}"
		rc=1
	fi
	echo
	if [ $rc != 0 ]; then
		echo "some targets NOT met (exit status 1)"
	elif grep -q -a '^SKIP prefix=' "$WORK/runs.log"; then
		echo "all measured targets met; some were SKIPPED (above), not measured"
	else
		echo "all targets met"
	fi
	echo "output saved in ${OUT#"$TREE"/}"
	return $rc
}

# Everything goes to the terminal and to the results file.
main 2>&1 | tee "$OUT"
exit "${PIPESTATUS[0]}"
