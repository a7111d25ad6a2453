#!/bin/bash
#
# bench/core.sh
#	  Core benchmarks of lockfence: the cost of the fence trigger on a
#	  protected table, against no trigger and against the hand-written
#	  PL/pgSQL trigger users write today.
#
#	  B1  pgbench, 4 clients, one single-row UPDATE per transaction of a
#	      protected table (resource_column, one resource and one constant
#	      token per client) vs the same UPDATE of an unprotected table.
#	      Target: TPS ratio >= 0.90.
#	  B2  the same workload, lockfence vs a PL/pgSQL trigger doing the
#	      equivalent check.  Target: lockfence TPS >= PL/pgSQL TPS.
#	  B3  one transaction updating BULK_ROWS (100,000) rows under one
#	      token, vs no trigger and vs the PL/pgSQL trigger.  Targets:
#	      <= 1.3x the unprotected time, >= 3x faster than PL/pgSQL.  A
#	      no-op C trigger is timed too: the floor of any row trigger.
#
#	  The machine is shared and noisy, so all variants run interleaved in
#	  one run: ROUNDS short rounds (B3_ROUNDS for B3), the order of the
#	  variants rotating from round to round, each run preceded by VACUUM
#	  and CHECKPOINT so that every run starts from the same state.  A ratio
#	  is the median of the per-round ratios (each compares runs made
#	  seconds apart); the spread is the lowest and highest per-round ratio.
#	  B1 runs each variant with fsync'ed commits and with
#	  synchronous_commit = off ("async", CPU-bound), and reports besides
#	  TPS the server's CPU time per transaction; B3 reports besides the
#	  wall-clock time the backend's CPU time.  CPU time is what the load
#	  of others on the machine disturbs least.  docs/bench-core.md has
#	  the figures and how to read them.
#
#	  Run as root.  It sets up everything itself, in a temp folder that is
#	  removed at exit: a private copy of the system PostgreSQL 15 with the
#	  extension built from this tree and installed into it (or, with
#	  PG_CONFIG set, the extension is installed into that installation,
#	  which must be a private one), and a throwaway server run as user
#	  postgres on a free port and a private unix socket.
#
#	  Settings (environment): ROUNDS (5), DURATION (seconds per pgbench
#	  run, 5), B3_ROUNDS (2 * ROUNDS + 1), BULK_ROWS (100000), B1_FORM
#	  (set: how B1's lockfence statement calls fence(), see bench_update
#	  in setup.sh; cte the form measured before 2026-12-03), PG_CONFIG,
#	  PRELOAD (1: lockfence in shared_preload_libraries, its metrics on),
#	  KEEP=1 keeps the temp folder.
#
#	  Ends with one "RESULT name=ID median=M min=LO max=HI n=N" line per
#	  ratio of the table, which bench/all.sh reads.
#
# IDENTIFICATION
#	  bench/core.sh
#

set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
B3_ROUNDS=${B3_ROUNDS:-$((2 * ROUNDS + 1))}
BULK_ROWS=${BULK_ROWS:-100000}
B1_FORM=${B1_FORM:-set}
CLIENTS=4
JOBS=2

. "$(dirname "$0")/setup.sh"

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
VARIANTS=(none lockfence plpgsql)
# B3 also measures a no-op C trigger: the floor of any row trigger.
B3_VARIANTS=(none lockfence plpgsql ctrig)

# Put the cluster into the same state before every measured run.
settle() {
	psql_q -c "VACUUM $1" -c "CHECKPOINT" >/dev/null
}

[ "$CLIENTS" = 4 ] || die "b1.sql assumes 4 clients"
for v in "${VARIANTS[@]}"; do
	{
		echo '\set r random(0, 249)'
		echo '\set id 4 * :r + :client_id'
		echo '\set tok 1000 + :client_id'
		bench_update "$v" "b1_$v" "'client-' || :client_id" :tok "id = :id" "$B1_FORM"
	} >"$WORK/b1_$v.sql"
done
chown postgres: "$WORK"/b1_*.sql

# CPU time of the postmaster's exited children, in clock ticks: a backend's
# CPU time is added when it exits.  Read while no backend is running.
PMPID=$(head -1 "$WORK/data/postmaster.pid")
TICKS=$(getconf CLK_TCK)
children_cpu() {
	awk '{ print $16 + $17 }' "/proc/$PMPID/stat"
}
# Wait until only the auxiliary processes of an idle server are left.
wait_backends_gone() {
	local deadline=$((SECONDS + 60))
	while [ "$(pgrep -c -P "$PMPID")" -gt "$AUX_PROCS" ]; do
		[ $SECONDS -lt $deadline ] || die "backends did not exit"
		sleep 0.05
	done
}
sleep 1
AUX_PROCS=$(pgrep -c -P "$PMPID")

# One pgbench run; prints its TPS and the CPU time (user + system) its
# backends spent per transaction, in microseconds.  TPS on a machine
# shared with others' fsyncs and CPU loads is noisy; the CPU time the
# server spends per transaction is much less so.
run_b1() {
	local v=$1 opts=$2 out cpu0 cpu1 tps xacts
	settle "b1_$v"
	wait_backends_gone
	cpu0=$(children_cpu)
	out=$(as_pg env PGOPTIONS="$opts" "$BIN/pgbench" -n -M prepared -c "$CLIENTS" -j "$JOBS" \
		-T "$DURATION" -f "$WORK/b1_$v.sql" 2>&1) ||
		{ echo "$out" >&2; die "pgbench failed for $v"; }
	wait_backends_gone
	cpu1=$(children_cpu)
	case "$out" in
		*"number of failed transactions: 0 "*) ;;
		*) echo "$out" >&2; die "pgbench reported failed transactions for $v" ;;
	esac
	tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p')
	xacts=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p')
	[ -n "$tps" ] && [ -n "$xacts" ] && [ "$xacts" -gt 0 ] ||
		{ echo "$out" >&2; die "no result from pgbench for $v"; }
	echo "$tps $(awk -v c=$((cpu1 - cpu0)) -v t="$TICKS" -v n="$xacts" \
		'BEGIN { printf "%.2f", c / t * 1e6 / n }')"
}

# One bulk UPDATE of all rows in one transaction; prints its wall-clock
# time and the CPU time (user + system) its backend spent on it, in ms.
# The CPU time, from log_statement_stats, is what the noise of a shared
# machine (other processes taking the CPUs) disturbs least.
run_b3() {
	local v=$1 wall cpu
	settle "bulk_$v"
	as_pg env PGOPTIONS="-c log_statement_stats=on -c client_min_messages=log" \
		"$BIN/psql" -X -q -v ON_ERROR_STOP=1 >"$WORK/b3.out" 2>"$WORK/b3.err" <<EOF ||
BEGIN;
\\timing on
$(bench_update "$v" "bulk_$v" "'bulk'" 5000 true cte)
\\timing off
COMMIT;
EOF
		{ cat "$WORK/b3.out" "$WORK/b3.err" >&2; die "bulk update failed for $v"; }
	wall=$(sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' "$WORK/b3.out")
	# The usage block of the second statement (BEGIN, UPDATE, COMMIT).
	cpu=$(awk '/ s user, .* s system, .* s elapsed/ { n++; if (n == 2)
		printf "%.3f\n", ($2 + $5) * 1000 }' "$WORK/b3.err")
	[ -n "$wall" ] && [ -n "$cpu" ] ||
		{ cat "$WORK/b3.out" "$WORK/b3.err" >&2; die "no timing from the bulk update of $v"; }
	echo "$wall $cpu"
}

# median, ratio_stats and result: in report.sh (sourced by setup.sh).

# ---------------------------------------------------------------------------
# Measure
# ---------------------------------------------------------------------------
# Each B1 variant runs twice a round: as is (fsync'ed commits: the disk,
# not the trigger, sets the pace), and with synchronous_commit = off
# ("async"), where the backends' CPU does and any overhead shows in full.
B1_RUNS=()
for v in "${VARIANTS[@]}"; do
	B1_RUNS+=("$v" "$v:async")
done
log "B1/B2: $ROUNDS rounds x ${#B1_RUNS[@]} runs x ${DURATION}s pgbench -c $CLIENTS -j $JOBS"
for ((round = 0; round < ROUNDS; round++)); do
	for ((i = 0; i < ${#B1_RUNS[@]}; i++)); do
		run=${B1_RUNS[$(((i + round) % ${#B1_RUNS[@]}))]}
		v=${run%:async}
		if [ "$run" = "$v" ]; then
			opts="" suffix=""
		else
			opts="-c synchronous_commit=off" suffix=_async
		fi
		read -r tps cpu <<<"$(run_b1 "$v" "$opts")"
		echo "$tps" >>"$WORK/b1_$v$suffix.tps"
		echo "$cpu" >>"$WORK/b1_$v$suffix.cpu"
		log "round $((round + 1)) b1 $run: $tps tps, $cpu us CPU per transaction"
	done
done

log "B3: $B3_ROUNDS rounds x ${#B3_VARIANTS[@]} variants, UPDATE of $BULK_ROWS rows in one transaction"
for ((round = 0; round < B3_ROUNDS; round++)); do
	for ((i = 0; i < ${#B3_VARIANTS[@]}; i++)); do
		v=${B3_VARIANTS[$(((i + round) % ${#B3_VARIANTS[@]}))]}
		read -r wall cpu <<<"$(run_b3 "$v")"
		echo "$wall" >>"$WORK/b3_$v.ms"
		echo "$cpu" >>"$WORK/b3_$v.cpu"
		log "round $((round + 1)) b3 $v: $wall ms wall-clock, $cpu ms CPU"
	done
done

# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------
# check NAME DESCRIPTION STATS OP TARGET ID: a row of the table, and a
# RESULT line named ID (printed at the end) for bench/all.sh.
MET_ALL=1
RESULTS=
check() {
	local name=$1 desc=$2 stats=$3 op=$4 target=$5 id=$6 med lo hi n ok
	read -r med lo hi n <<<"$stats"
	RESULTS+="$(result "$id" "$stats")"$'\n'
	if awk -v m="$med" -v t="$target" -v op="$op" \
		'BEGIN { exit !((op == ">=") ? (m >= t) : (m <= t)) }'; then
		ok=met
	else
		ok="NOT MET"
		MET_ALL=0
	fi
	printf '%-3s %-44s %7.3f  [%5.3f-%5.3f]  %s %-5s %s\n' \
		"$name" "$desc" "$med" "$lo" "$hi" "$op" "$target" "$ok"
}

samples() { tr '\n' ' ' <"$1" | sed 's/ $//'; }

echo
echo "lockfence core benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -srm)"
echo "PostgreSQL $("$BIN/postgres" --version | awk '{ print $3 }'), lockfence preloaded: $([ "${PRELOAD:-1}" = 1 ] && echo yes || echo no)," \
	"fsync on, synchronous_commit on (async: off);" \
	"pgbench -M prepared -c $CLIENTS -j $JOBS -T $DURATION;"
echo "B1/B2 $ROUNDS rounds; B3 $B3_ROUNDS rounds of one UPDATE of $BULK_ROWS rows (the statement's"
echo "wall-clock time, and its backend's CPU time user + system)"
echo
echo "Medians (all samples):"
for suffix in "" _async; do
	for v in "${VARIANTS[@]}"; do
		printf '  B1 %-16s %9.1f tps   (%s)\n' "$v${suffix/_/ }" "$(median <"$WORK/b1_$v$suffix.tps")" \
			"$(samples "$WORK/b1_$v$suffix.tps")"
	done
	for v in "${VARIANTS[@]}"; do
		printf '  B1 %-16s %9.1f us CPU per transaction (%s)\n' "$v${suffix/_/ }" \
			"$(median <"$WORK/b1_$v$suffix.cpu")" "$(samples "$WORK/b1_$v$suffix.cpu")"
	done
done
for v in "${B3_VARIANTS[@]}"; do
	printf '  B3 %-10s %9.1f ms    (%s)\n' "$v" "$(median <"$WORK/b3_$v.ms")" "$(samples "$WORK/b3_$v.ms")"
done
for v in "${B3_VARIANTS[@]}"; do
	printf '  B3 %-10s %9.1f ms CPU (%s)\n' "$v" "$(median <"$WORK/b3_$v.cpu")" "$(samples "$WORK/b3_$v.cpu")"
done
echo
printf '%-3s %-44s %7s  %-13s  %s\n' "" "ratio (median of per-round ratios)" "median" "[min-max]" "target"
check B1 "TPS lockfence / TPS no trigger" \
	"$(ratio_stats "$WORK/b1_lockfence.tps" "$WORK/b1_none.tps")" ">=" 0.90 B1_tps_ratio
check B2 "TPS lockfence / TPS PL/pgSQL trigger" \
	"$(ratio_stats "$WORK/b1_lockfence.tps" "$WORK/b1_plpgsql.tps")" ">=" 1.00 B2_tps_ratio
check B1 "CPU/xact no trigger / CPU/xact lockfence" \
	"$(ratio_stats "$WORK/b1_none.cpu" "$WORK/b1_lockfence.cpu")" ">=" 0.90 B1_cpu_ratio
check B2 "CPU/xact PL/pgSQL / CPU/xact lockfence" \
	"$(ratio_stats "$WORK/b1_plpgsql.cpu" "$WORK/b1_lockfence.cpu")" ">=" 1.00 B2_cpu_ratio
check B1 "async: TPS lockfence / TPS no trigger" \
	"$(ratio_stats "$WORK/b1_lockfence_async.tps" "$WORK/b1_none_async.tps")" ">=" 0.90 B1_async_tps_ratio
check B2 "async: TPS lockfence / TPS PL/pgSQL" \
	"$(ratio_stats "$WORK/b1_lockfence_async.tps" "$WORK/b1_plpgsql_async.tps")" ">=" 1.00 B2_async_tps_ratio
check B1 "async: CPU/xact none / CPU/xact lockfence" \
	"$(ratio_stats "$WORK/b1_none_async.cpu" "$WORK/b1_lockfence_async.cpu")" ">=" 0.90 B1_async_cpu_ratio
check B2 "async: CPU/xact PL/pgSQL / CPU/xact lf" \
	"$(ratio_stats "$WORK/b1_plpgsql_async.cpu" "$WORK/b1_lockfence_async.cpu")" ">=" 1.00 B2_async_cpu_ratio
for m in ms cpu; do
	[ $m = ms ] && what="wall-clock" || what="CPU"
	check B3 "$what lockfence / no trigger" \
		"$(ratio_stats "$WORK/b3_lockfence.$m" "$WORK/b3_none.$m")" "<=" 1.30 "B3_${m}_ratio"
	check B3 "$what PL/pgSQL trigger / lockfence" \
		"$(ratio_stats "$WORK/b3_plpgsql.$m" "$WORK/b3_lockfence.$m")" ">=" 3.00 "B3_${m}_plpgsql_ratio"
	# issue 21: lockfence at most 1.05x the no-op C trigger
	check B3 "$what lockfence / no-op C trigger" \
		"$(ratio_stats "$WORK/b3_lockfence.$m" "$WORK/b3_ctrig.$m")" "<=" 1.05 "B3_${m}_vs_ctrig"
done
echo "For reference, the floor of any row trigger and the most any trigger could reach:"
for m in ms cpu; do
	[ $m = ms ] && what="wall-clock" || what="CPU"
	for pair in "ctrig none no-op C trigger / no trigger" "plpgsql none PL/pgSQL trigger / no trigger"; do
		read -r a b desc <<<"$pair"
		read -r med lo hi _ <<<"$(ratio_stats "$WORK/b3_$a.$m" "$WORK/b3_$b.$m")"
		printf '%-3s %-44s %7.3f  [%5.3f-%5.3f]\n' "(B3" "$what $desc)" "$med" "$lo" "$hi"
	done
done
if [ "${PRELOAD:-1}" = 1 ]; then
	accepted=$(psql_q -c "SELECT value FROM lockfence.read_metrics() WHERE name = 'fence_accepted_total'")
	echo "lockfence metrics on: fence_accepted_total = $accepted"
	[ "${accepted:-0}" -gt 0 ] || die "the preloaded metrics counted no accepted check"
fi
echo
if [ "$MET_ALL" = 1 ]; then
	echo "all targets met"
else
	echo "some targets NOT met"
fi
echo
printf '%s' "$RESULTS"
