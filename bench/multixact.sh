#!/bin/bash
#
# bench/multixact.sh
#	  B4: many transactions writing under one token (issue 21, item 2).
#	  A leader holds one lock and writes through a pool of connections:
#	  CLIENTS_LIST (8 and 32) pgbench clients, each transaction fencing the
#	  resource 'hot' with the same token and holder, in the UPDATE of its
#	  client's own row of a table protected by that resource:
#
#	    UPDATE mx_lockfence SET v = v + 1,
#	           tok = lockfence.fence('hot', 1, 'leader')
#	     WHERE id = :client_id;
#
#	  (B4_FORM=cte: WITH f AS (SELECT lockfence.fence(...)) UPDATE ...
#	  SET ..., tok = 1 WHERE ... AND EXISTS (SELECT FROM f), the form
#	  measured before 2026-12-03; B4_FORM=explicit: BEGIN; SELECT
#	  lockfence.fence(...); UPDATE ...; COMMIT, four round trips), against
#	  the same UPDATE of an unprotected table:
#
#	    UPDATE mx_none SET v = v + 1, tok = 1 WHERE id = :client_id;
#
#	  Concurrent share locks on one row (the fence row) make PostgreSQL
#	  create a MultiXact for every new locker: what this measures besides
#	  the TPS.  Per run: MultiXacts created (next_multixact_id of
#	  pg_control_checkpoint(), read after a CHECKPOINT before and after
#	  the run), per 1,000 transactions; and the MultiXact SLRU pages
#	  zeroed (pg_stat_slru, 'MultiXactOffset' + 'MultiXactMember',
#	  blks_zeroed, reset before the run).  At the end, mxid_age() of the
#	  database's datminmxid (every MultiXact of the whole run: VACUUM
#	  freezes none this young) and of lockfence.fences' relminmxid.
#
#	  Targets: TPS lockfence / TPS unprotected >= 0.90 for each client
#	  count; MultiXacts per 1,000 transactions, lockfence minus
#	  unprotected, <= 0 (growing no faster than unprotected), and the
#	  same for SLRU pages zeroed per run.
#
#	  Method as bench/core.sh: every variant in every round, the order
#	  rotating from round to round, each run preceded by VACUUM and
#	  CHECKPOINT; fsync'ed commits (synchronous_commit = on); a ratio is
#	  the median of the per-round ratios, the spread the lowest and
#	  highest per-round ratio.  The server and the extension come from
#	  bench/setup.sh (a private PostgreSQL copy, or PG_CONFIG's, which
#	  must be a private one).  Run as root.
#
#	  Settings (environment): ROUNDS (5), DURATION (seconds per pgbench
#	  run, 5), CLIENTS_LIST ("8 32"), B4_FORM (set), PG_CONFIG, PRELOAD
#	  (1), KEEP=1 keeps the temp folder, SYNC_COMMIT (on; off makes the
#	  runs CPU-bound rather than bound by the commits' WAL flush: a
#	  diagnostic, not the targets' setting).
#
#	  Ends with "RESULT name=ID median=M min=LO max=HI n=N" lines, which
#	  bench/all.sh reads.
#
# IDENTIFICATION
#	  bench/multixact.sh
#

set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CLIENTS_LIST=${CLIENTS_LIST:-8 32}
B4_FORM=${B4_FORM:-set}
JOBS=2
# setup.sh's own tables (B1's and B3's), kept small: unused here.
CLIENTS=4
BULK_ROWS=1000
MAXC=0
for c in $CLIENTS_LIST; do
	[ "$c" -gt "$MAXC" ] && MAXC=$c
done
MAX_CONNECTIONS=$((MAXC + 10))

. "$(dirname "$0")/setup.sh"

VARIANTS=(none lockfence)
SYNC_COMMIT=${SYNC_COMMIT:-on}
case "$SYNC_COMMIT" in on | off) ;; *) die "SYNC_COMMIT must be on or off" ;; esac

log "B4 tables"
psql_q >/dev/null <<EOF
CREATE TABLE mx_none (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, tok bigint);
CREATE TABLE mx_lockfence (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, tok bigint);
INSERT INTO mx_none (id) SELECT g FROM generate_series(0, $MAXC - 1) g;
INSERT INTO mx_lockfence (id) SELECT g FROM generate_series(0, $MAXC - 1) g;
SELECT lockfence.protect('mx_lockfence', resource => 'hot');
SELECT lockfence.fence('hot', 1, 'leader');
VACUUM ANALYZE mx_none, mx_lockfence;
ALTER SYSTEM SET synchronous_commit = $SYNC_COMMIT;
SELECT pg_reload_conf();
EOF
# The protected table must really be fenced.
expect_sqlstate LF002 "UPDATE mx_lockfence SET v = v + 1 WHERE id = 0"
expect_sqlstate LF001 "BEGIN; SELECT lockfence.fence('hot', 0, 'leader'); UPDATE mx_lockfence SET v = v + 1 WHERE id = 0; COMMIT"

case "$B4_FORM" in
	set)
		echo "UPDATE mx_lockfence SET v = v + 1, tok = lockfence.fence('hot', 1, 'leader') WHERE id = :client_id;" \
			>"$WORK/b4_lockfence.sql" ;;
	cte)
		echo "WITH f AS (SELECT lockfence.fence('hot', 1, 'leader')) UPDATE mx_lockfence SET v = v + 1, tok = 1 WHERE id = :client_id AND EXISTS (SELECT FROM f);" \
			>"$WORK/b4_lockfence.sql" ;;
	explicit)
		printf '%s\n' 'BEGIN;' "SELECT lockfence.fence('hot', 1, 'leader');" \
			'UPDATE mx_lockfence SET v = v + 1, tok = 1 WHERE id = :client_id;' 'COMMIT;' \
			>"$WORK/b4_lockfence.sql" ;;
	*) die "B4_FORM must be set, cte or explicit" ;;
esac
echo 'UPDATE mx_none SET v = v + 1, tok = 1 WHERE id = :client_id;' >"$WORK/b4_none.sql"
chown postgres: "$WORK"/b4_*.sql

PMPID=$(head -1 "$WORK/data/postmaster.pid")
# Wait until only the auxiliary processes of an idle server are left (a
# backend's statistics reach pg_stat_slru when it exits).
wait_backends_gone() {
	local deadline=$((SECONDS + 60))
	while [ "$(pgrep -c -P "$PMPID")" -gt "$AUX_PROCS" ]; do
		[ $SECONDS -lt $deadline ] || die "backends did not exit"
		sleep 0.05
	done
}
sleep 1
AUX_PROCS=$(pgrep -c -P "$PMPID")

next_mxid() {
	psql_q -c "SELECT next_multixact_id::text FROM pg_control_checkpoint()"
}
slru_zeroed() {
	psql_q -c "SELECT coalesce(sum(blks_zeroed), 0) FROM pg_stat_slru
	            WHERE name IN ('MultiXactOffset', 'MultiXactMember')"
}

# One pgbench run; prints TPS, MultiXacts per 1,000 transactions, and the
# MultiXact SLRU pages zeroed.
run_b4() {
	local v=$1 c=$2 out tps xacts mx0 mx1 zeroed
	psql_q -c "VACUUM mx_$v" -c "VACUUM lockfence.fences" -c "CHECKPOINT" >/dev/null
	wait_backends_gone
	mx0=$(next_mxid)
	psql_q -c "SELECT pg_stat_reset_slru(NULL)" >/dev/null
	wait_backends_gone
	out=$(as_pg "$BIN/pgbench" -n -M prepared -c "$c" -j "$JOBS" \
		-T "$DURATION" -f "$WORK/b4_$v.sql" 2>&1) ||
		{ echo "$out" >&2; die "pgbench failed for $v, $c clients"; }
	wait_backends_gone
	zeroed=$(slru_zeroed)
	psql_q -c "CHECKPOINT" >/dev/null
	mx1=$(next_mxid)
	case "$out" in
		*"number of failed transactions: 0 "*) ;;
		*) echo "$out" >&2; die "pgbench reported failed transactions for $v" ;;
	esac
	tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p')
	xacts=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p')
	[ -n "$tps" ] && [ -n "$xacts" ] && [ "$xacts" -gt 0 ] ||
		{ echo "$out" >&2; die "no result from pgbench for $v"; }
	echo "$tps $(awk -v a="$mx0" -v b="$mx1" -v n="$xacts" \
		'BEGIN { printf "%.2f", (b - a) * 1000 / n }') $zeroed $((mx1 - mx0))"
}

# ---------------------------------------------------------------------------
# Measure
# ---------------------------------------------------------------------------
RUNS=()
for c in $CLIENTS_LIST; do
	for v in "${VARIANTS[@]}"; do
		RUNS+=("$v:$c")
	done
done
log "B4: $ROUNDS rounds x ${#RUNS[@]} runs x ${DURATION}s pgbench -c {${CLIENTS_LIST// /,}} -j $JOBS ($B4_FORM)"
MX_TOTAL_NONE=0 MX_TOTAL_LF=0
for ((round = 0; round < ROUNDS; round++)); do
	for ((i = 0; i < ${#RUNS[@]}; i++)); do
		run=${RUNS[$(((i + round) % ${#RUNS[@]}))]}
		v=${run%:*} c=${run#*:}
		read -r tps mxk zeroed mx <<<"$(run_b4 "$v" "$c")"
		echo "$tps" >>"$WORK/b4_c${c}_$v.tps"
		echo "$mxk" >>"$WORK/b4_c${c}_$v.mxk"
		echo "$zeroed" >>"$WORK/b4_c${c}_$v.slru"
		if [ "$v" = none ]; then
			MX_TOTAL_NONE=$((MX_TOTAL_NONE + mx))
		else
			MX_TOTAL_LF=$((MX_TOTAL_LF + mx))
		fi
		log "round $((round + 1)) b4 $v, $c clients: $tps tps, $mx MultiXacts ($mxk per 1000 xacts), $zeroed MultiXact SLRU pages zeroed"
	done
done
MXID_AGE_DB=$(psql_q -c "SELECT mxid_age(datminmxid) FROM pg_database WHERE datname = current_database()")
MXID_AGE_FENCES=$(psql_q -c "SELECT mxid_age(relminmxid) FROM pg_class WHERE oid = 'lockfence.fences'::regclass")
TOKEN=$(psql_q -c "SELECT token FROM lockfence.fences WHERE resource = 'hot'")
[ "$TOKEN" = 1 ] || die "the fence of 'hot' moved to $TOKEN"

# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------
MET_ALL=1
RESULTS=
check() {
	local desc=$1 stats=$2 op=$3 target=$4 id=$5 med lo hi n ok
	read -r med lo hi n <<<"$stats"
	RESULTS+="$(result "$id" "$stats")"$'\n'
	if awk -v m="$med" -v t="$target" -v op="$op" \
		'BEGIN { exit !((op == ">=") ? (m >= t) : (m <= t)) }'; then
		ok=met
	else
		ok="NOT MET"
		MET_ALL=0
	fi
	printf '%-3s %-52s %9.3f  [%.3f-%.3f]  %s %-5s %s\n' \
		B4 "$desc" "$med" "$lo" "$hi" "$op" "$target" "$ok"
}
samples() { tr '\n' ' ' <"$1" | sed 's/ $//'; }

echo
echo "lockfence B4, many transactions under one token, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -srm)"
echo "PostgreSQL $("$BIN/postgres" --version | awk '{ print $3 }'), lockfence preloaded: $([ "${PRELOAD:-1}" = 1 ] && echo yes || echo no)," \
	"fsync on, synchronous_commit $SYNC_COMMIT; pgbench -M prepared -j $JOBS -T $DURATION; $ROUNDS rounds; form $B4_FORM"
echo
echo "Medians (all samples):"
for c in $CLIENTS_LIST; do
	for v in "${VARIANTS[@]}"; do
		printf '  B4 %2s clients %-10s %9.1f tps  (%s)\n' "$c" "$v" \
			"$(median <"$WORK/b4_c${c}_$v.tps")" "$(samples "$WORK/b4_c${c}_$v.tps")"
		printf '  B4 %2s clients %-10s %9.1f MultiXacts per 1000 xacts  (%s)\n' "$c" "$v" \
			"$(median <"$WORK/b4_c${c}_$v.mxk")" "$(samples "$WORK/b4_c${c}_$v.mxk")"
		printf '  B4 %2s clients %-10s %9.1f MultiXact SLRU pages zeroed per run  (%s)\n' "$c" "$v" \
			"$(median <"$WORK/b4_c${c}_$v.slru")" "$(samples "$WORK/b4_c${c}_$v.slru")"
	done
done
echo "  MultiXacts created in all runs: unprotected $MX_TOTAL_NONE, lockfence $MX_TOTAL_LF"
echo "  at the end: mxid_age(datminmxid) $MXID_AGE_DB, mxid_age(relminmxid) of lockfence.fences $MXID_AGE_FENCES"
echo
printf '%-3s %-52s %9s  %-13s  %s\n' "" "measure (median of per-round values)" "median" "[min-max]" "target"
for c in $CLIENTS_LIST; do
	check "$c clients: TPS lockfence / TPS unprotected" \
		"$(ratio_stats "$WORK/b4_c${c}_lockfence.tps" "$WORK/b4_c${c}_none.tps")" ">=" 0.90 "B4_c${c}_tps_ratio"
	check "$c clients: MultiXacts/1000 xacts, lockfence - unprot." \
		"$(diff_stats "$WORK/b4_c${c}_lockfence.mxk" "$WORK/b4_c${c}_none.mxk")" "<=" 0 "B4_c${c}_mxact_excess"
	check "$c clients: SLRU pages zeroed/run, lockfence - unprot." \
		"$(diff_stats "$WORK/b4_c${c}_lockfence.slru" "$WORK/b4_c${c}_none.slru")" "<=" 0 "B4_c${c}_slru_excess"
	RESULTS+="$(result "B4_c${c}_mxact_lockfence" "$(stats "$WORK/b4_c${c}_lockfence.mxk")")"$'\n'
	RESULTS+="$(result "B4_c${c}_mxact_none" "$(stats "$WORK/b4_c${c}_none.mxk")")"$'\n'
done
RESULTS+="RESULT name=B4_mxid_age_db median=$MXID_AGE_DB min=$MXID_AGE_DB max=$MXID_AGE_DB n=1"$'\n'
echo
if [ "$MET_ALL" = 1 ]; then
	echo "all targets met"
else
	echo "some targets NOT met"
fi
echo
printf '%s' "$RESULTS"
