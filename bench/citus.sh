#!/bin/bash
#
# bench/citus.sh
#	  C1: the cost of a fence on Citus (issue 22, item 5).  A coordinator
#	  and two workers (Citus 13, citus.shard_count 4), each preloading
#	  citus, lockfence and pg_stat_statements; pgbench, CLIENTS (4)
#	  clients through the coordinator, client N with its own resource r-N,
#	  its constant token and a random one of its 250 rows, on a table
#	  distributed by resource and protected, with lockfence.fences
#	  distributed by resource and co-located with it
#	  (lockfence.citus_distribute, docs/citus.md), against its unprotected
#	  twin.  Every transaction routes to the one shard of r-N.
#
#	  The target pair (RESULT C1_delegated_tps_ratio >= 0.85): the same
#	  write, fenced and unfenced, one statement per transaction each,
#
#	    delegated        SELECT c1_fenced_update('r-N', TOKEN, 'h-N', :id);
#	    delegated_plain  SELECT c1_plain_update('r-N', TOKEN, 'h-N', :id);
#
#	  c1_fenced_update() is docs/citus.md's recipe "One round trip": a
#	  PL/pgSQL function (fence(), then an UPDATE of the row in c1_fenced)
#	  made a distributed function delegated by its resource argument,
#	  co-located with c1_fenced, with force_delegation.  The coordinator
#	  sends the call to the worker holding r-N's shards, which fences and
#	  writes there, locally, in one transaction: each transaction is a
#	  fence and one single-row UPDATE routed to one shard, as the issue
#	  asks, with one client round trip and one coordinator-to-worker round
#	  trip, as an unfenced write has.  c1_plain_update() is the same
#	  function without the fence() call, on the unprotected twin, made a
#	  distributed function the same way: the same write unfenced.  Their
#	  ratio is what lockfence costs; that is why it is the target.
#
#	  Diagnostics (not targets):
#	    delegated_plain / update, and delegated / update
#	                      against the bare statement UPDATE c1_plain SET
#	                      val = val + 1, token = TOKEN, holder = 'h-N'
#	                      WHERE resource = 'r-N' AND id = :id: what the
#	                      function form costs on Citus (delegation, the
#	                      PL/pgSQL call, the UPDATE planned by Citus on the
#	                      worker), with and without lockfence
#	                      (RESULT C1_plain_function_vs_update_tps_ratio,
#	                      C1_delegated_vs_update_tps_ratio)
#	    fenced / plain    BEGIN; SELECT lockfence.fence('r-N', TOKEN,
#	                      'h-N'); UPDATE c1_fenced ...; COMMIT; against
#	                      BEGIN; UPDATE c1_plain ...; COMMIT;, statement
#	                      by statement: the fence() call is a statement of
#	                      its own, one more client round trip and one more
#	                      coordinator-to-worker round trip
#	                      (RESULT C1_tps_ratio, the first target)
#	    fenced1 / plain1  the same, each transaction sent as one compound
#	                      query (pgbench's \;): the client's round trips
#	                      equal (RESULT C1_compound_tps_ratio)
#
#	  Method as bench/core.sh: every variant in every round, the order
#	  alternating from round to round (the machine is shared and noisy),
#	  each run preceded by VACUUM and CHECKPOINT on every node; fsync'ed
#	  commits; a ratio is the median of the per-round ratios, the spread
#	  the lowest and highest per-round ratio.
#
#	  Then the claim that the fence adds no round trip between nodes to a
#	  single-shard write: STMT_XACTS (200) transactions per client of each
#	  variant with pg_stat_statements (track = top: the statements the
#	  coordinator sent, not those a delegated function runs inside) and
#	  pg_stat_database reset on the workers; per transaction: statements
#	  the workers ran, of them PREPARE TRANSACTION / COMMIT PREPARED
#	  (two-phase commit), and sessions opened on the workers.  Printed per
#	  variant, with the statements by kind.
#
#	  PG_CONFIG (required) must be a private PostgreSQL 15 installation
#	  with Citus installed (scripts/citus.sh build && scripts/citus.sh
#	  install PG_CONFIG); this tree's lockfence is built and installed into
#	  it.  Without Citus' support for fences (lockfence.citus_distribute,
#	  protect() on a distributed table) only the unfenced runs are made,
#	  the reason is printed, and the ratios' RESULT lines are missing (FAIL
#	  rows in bench/all.sh).  Without Citus installed in PG_CONFIG's
#	  PostgreSQL it exits with status 3 and the reason (bench/all.sh then
#	  shows the C1 rows as SKIP with that reason).  Run as root; servers on
#	  free ports on 127.0.0.1, run as postgres, stopped by the EXIT trap.
#
#	  Settings (environment): ROUNDS (5), DURATION (seconds per pgbench
#	  run, 5), CLIENTS (4), STMT_XACTS (200), KEEP=1 keeps the temp folder.
#
#	  Ends with "RESULT name=ID median=M min=LO max=HI n=N" lines, which
#	  bench/all.sh reads.
#
# IDENTIFICATION
#	  bench/citus.sh
#

set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CLIENTS=${CLIENTS:-4}
JOBS=2
STMT_XACTS=${STMT_XACTS:-200}
ROWS=250

die() { echo "${0##*/}: $*" >&2; exit 1; }
log() { echo "# $*" >&2; }

[ "$(id -u)" = 0 ] || die "run me as root (the servers run as user postgres)"
[ -n "${PG_CONFIG:-}" ] && [ -x "$PG_CONFIG" ] ||
	die "set PG_CONFIG to a private PostgreSQL 15 with Citus installed (scripts/citus.sh install PG_CONFIG)"
case "$("$PG_CONFIG" --pkglibdir)" in
	/usr/lib/postgresql/*) die "PG_CONFIG points at the system PostgreSQL; give a private copy" ;;
esac
# No Citus is not a failure of lockfence: status 3, as scripts/citus.sh
# check, so that bench/all.sh can say SKIP and why.
if [ ! -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ] ||
	[ ! -f "$("$PG_CONFIG" --sharedir)/extension/citus.control" ]; then
	echo "${0##*/}: SKIP: Citus is not installed in $("$PG_CONFIG" --pkglibdir) (scripts/citus.sh build && scripts/citus.sh install PG_CONFIG)" >&2
	exit 3
fi
BIN=$("$PG_CONFIG" --bindir)
TREE=$(cd "$(dirname "$0")/.." && pwd)

WORK=$(mktemp -d /tmp/lockfence-citus-bench.XXXXXX)
chmod 755 "$WORK"
NODES=(coord w1 w2)
declare -A PORT=()

cleanup() {
	local rc=$? n
	for n in "${NODES[@]}"; do
		[ -f "$WORK/$n/postmaster.pid" ] &&
			runuser -u postgres -- "$BIN/pg_ctl" -D "$WORK/$n" -m immediate -w stop >/dev/null 2>&1
	done
	if [ "${KEEP:-0}" = 1 ]; then
		echo "${0##*/}: kept $WORK" >&2
	else
		rm -rf "$WORK"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building lockfence from $TREE into $PG_CONFIG's installation"
tar -C "$TREE" --exclude=.git --exclude=bench/results --exclude='*.o' --exclude='*.so' \
	--exclude='*.bc' -cf - . | tar -C "$WORK" --one-top-level=build -xf -
{ make -C "$WORK/build" -s PG_CONFIG="$PG_CONFIG" >"$WORK/build.log" 2>&1 &&
	make -C "$WORK/build" -s PG_CONFIG="$PG_CONFIG" install >>"$WORK/build.log" 2>&1; } ||
	{ cat "$WORK/build.log" >&2; die "build failed"; }

# ---------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------
free_ports() {
	/usr/bin/python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}
read -r PORT[coord] PORT[w1] PORT[w2] < <(free_ports 3)

for n in "${NODES[@]}"; do
	install -d -o postgres -g postgres -m 700 "$WORK/$n"
	runuser -u postgres -- "$BIN/initdb" -D "$WORK/$n" -A trust -U postgres --no-sync \
		>"$WORK/initdb-$n.log" 2>&1 || { cat "$WORK/initdb-$n.log" >&2; die "initdb failed"; }
	cat >>"$WORK/$n/postgresql.conf" <<EOF
# lockfence bench/citus.sh: defaults, except what Citus needs and what
# keeps runs comparable
listen_addresses = '127.0.0.1'
port = ${PORT[$n]}
unix_socket_directories = '$WORK/$n'
shared_preload_libraries = 'citus,lockfence,pg_stat_statements'
max_connections = 100
max_prepared_transactions = 50
citus.shard_count = 4
citus.shard_replication_factor = 1
# the statements a node received, not those a function ran inside them
pg_stat_statements.track = top
autovacuum = off
max_wal_size = 4GB
checkpoint_timeout = 30min
EOF
	install -o postgres -g postgres -m 644 /dev/null "$WORK/$n.log"
	runuser -u postgres -- "$BIN/pg_ctl" -D "$WORK/$n" -l "$WORK/$n.log" -w -t 120 start >/dev/null ||
		{ cat "$WORK/$n.log" >&2; die "$n did not start"; }
done

# psql_on NODE ARGS...: psql as postgres on a node, database postgres
psql_on() {
	local n=$1
	shift
	runuser -u postgres -- "$BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 \
		-h 127.0.0.1 -p "${PORT[$n]}" -U postgres -d postgres "$@"
}

for n in "${NODES[@]}"; do
	psql_on "$n" -c 'CREATE EXTENSION citus' -c 'CREATE EXTENSION pg_stat_statements' >/dev/null
done
psql_on coord -c "SELECT citus_set_coordinator_host('127.0.0.1', ${PORT[coord]})" >/dev/null
for n in w1 w2; do
	psql_on coord -c "SELECT citus_add_node('127.0.0.1', ${PORT[$n]})" >/dev/null
done
psql_on coord -c 'CREATE EXTENSION lockfence' >/dev/null
log "coordinator :${PORT[coord]}, workers :${PORT[w1]} :${PORT[w2]}"

# ---------------------------------------------------------------------------
# The tables: c1_plain and c1_fenced, distributed by resource
# ---------------------------------------------------------------------------
for t in c1_plain c1_fenced; do
	psql_on coord >/dev/null <<EOF
CREATE TABLE $t (resource text NOT NULL, id int NOT NULL, token bigint, holder text,
                 val int NOT NULL DEFAULT 0, PRIMARY KEY (resource, id));
SELECT create_distributed_table('$t', 'resource');
INSERT INTO $t (resource, id, token, holder)
SELECT 'r-' || c, g, 1000 + c, 'h-' || c
  FROM generate_series(0, $CLIENTS - 1) c, generate_series(0, $ROWS - 1) g;
EOF
done

FENCED=1
WHY=
if ! out=$(psql_on coord -c "SELECT lockfence.citus_distribute('public.c1_fenced')" \
	-c "SELECT lockfence.protect('c1_fenced', resource_column => 'resource', token_column => 'token', holder_column => 'holder')" 2>&1); then
	FENCED=0
	WHY=$(echo "$out" | grep -m1 ERROR || echo "$out" | head -1)
	log "NO FENCED RUNS: lockfence cannot fence a distributed table here: $WHY"
fi

expect_sqlstate() {
	local want=$1 sql=$2 got
	got=$(psql_on coord -v VERBOSITY=verbose -c "$sql" 2>&1 || true)
	case "$got" in
		*"ERROR:  $want:"*) ;;
		*) die "expected SQLSTATE $want from: $sql; got: $got" ;;
	esac
}
if [ $FENCED = 1 ]; then
	# Every client's fence recorded (on the node of its resource), and the
	# fence must really refuse, or the benchmark measures nothing.
	# (a statement of its own with constants: Citus delegates it)
	for ((c = 0; c < CLIENTS; c++)); do
		psql_on coord -c "SELECT lockfence.fence('r-$c', $((1000 + c)), 'h-$c')" >/dev/null
	done
	expect_sqlstate LF001 "UPDATE c1_fenced SET token = 999, holder = 'h-0' WHERE resource = 'r-0' AND id = 0"
	expect_sqlstate LF002 "UPDATE c1_fenced SET val = val + 1 WHERE resource = 'r-0' AND id = 0"
	[ "$(psql_on coord -c "SELECT count(*) FROM lockfence.fences")" = "$CLIENTS" ] ||
		die "unexpected lockfence.fences contents"

	# The one-round-trip form (docs/citus.md, "One round trip"): fence()
	# and the UPDATE in one function, delegated by its resource to the
	# node of the resource's shards; with force_delegation it is also
	# delegated inside BEGIN ... COMMIT.
	psql_on coord >/dev/null <<'EOF'
CREATE FUNCTION c1_fenced_update(p_resource text, p_token bigint, p_holder text, p_id int)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    PERFORM lockfence.fence(p_resource, p_token, p_holder);
    UPDATE c1_fenced SET val = val + 1, token = p_token, holder = p_holder
     WHERE resource = p_resource AND id = p_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
SELECT create_distributed_function('c1_fenced_update(text,bigint,text,int)', 'p_resource',
                                   colocate_with => 'c1_fenced', force_delegation => true);
EOF
	# It must fence, or the target pair measures nothing: a stale token
	# refused, the current one accepted (fenced in the same call).
	expect_sqlstate LF001 "SELECT c1_fenced_update('r-0', 999, 'h-0', 0)"
	[ "$(psql_on coord -c "SELECT c1_fenced_update('r-0', 1000, 'h-0', 0)")" = 1 ] ||
		die "c1_fenced_update() with the current token did not update its row"
fi
# The same function without the fence() call, on the unprotected twin:
# what the delegated form costs on Citus without lockfence (diagnostic
# pair delegated / delegated_plain: lockfence's own share of it).
psql_on coord >/dev/null <<'EOF'
CREATE FUNCTION c1_plain_update(p_resource text, p_token bigint, p_holder text, p_id int)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    UPDATE c1_plain SET val = val + 1, token = p_token, holder = p_holder
     WHERE resource = p_resource AND id = p_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
SELECT create_distributed_function('c1_plain_update(text,bigint,text,int)', 'p_resource',
                                   colocate_with => 'c1_plain', force_delegation => true);
EOF
psql_on coord -c 'VACUUM ANALYZE' >/dev/null

# The transactions.  pgbench -M simple substitutes :client_id into the
# text, so Citus routes each statement by a constant (its fast path).
fence_sql="SELECT lockfence.fence('r-:client_id', :tok, 'h-:client_id')"
update_sql() {
	echo "UPDATE c1_$1 SET val = val + 1, token = :tok, holder = 'h-:client_id' WHERE resource = 'r-:client_id' AND id = :id"
}
# The target pair: one statement per transaction each.
{
	echo "\\set id random(0, $((ROWS - 1)))"
	echo "\\set tok 1000 + :client_id"
	echo "$(update_sql plain);"
} >"$WORK/c1_update.sql"
{
	echo "\\set id random(0, $((ROWS - 1)))"
	echo "\\set tok 1000 + :client_id"
	echo "SELECT c1_fenced_update('r-:client_id', :tok, 'h-:client_id', :id);"
} >"$WORK/c1_delegated.sql"
{
	echo "\\set id random(0, $((ROWS - 1)))"
	echo "\\set tok 1000 + :client_id"
	echo "SELECT c1_plain_update('r-:client_id', :tok, 'h-:client_id', :id);"
} >"$WORK/c1_delegated_plain.sql"
# The diagnostic pairs: BEGIN; [fence();] UPDATE; COMMIT, statement by
# statement and as one compound query.
for v in plain fenced; do
	{
		echo "\\set id random(0, $((ROWS - 1)))"
		echo "\\set tok 1000 + :client_id"
		echo "BEGIN;"
		[ $v = fenced ] && echo "$fence_sql;"
		echo "$(update_sql $v);"
		echo "COMMIT;"
	} >"$WORK/c1_$v.sql"
	{
		echo "\\set id random(0, $((ROWS - 1)))"
		echo "\\set tok 1000 + :client_id"
		if [ $v = fenced ]; then
			echo "BEGIN \\; $fence_sql \\; $(update_sql $v) \\; COMMIT;"
		else
			echo "BEGIN \\; $(update_sql $v) \\; COMMIT;"
		fi
	} >"$WORK/c1_${v}1.sql"
done
chown postgres: "$WORK"/c1_*.sql
VARIANTS=(update delegated_plain plain plain1)
[ $FENCED = 1 ] && VARIANTS=(update delegated delegated_plain plain fenced plain1 fenced1)

settle() {
	local n
	for n in "${NODES[@]}"; do
		psql_on "$n" -c 'VACUUM' -c 'CHECKPOINT' >/dev/null
	done
}

# pgbench VARIANT ARGS...: one run through the coordinator; prints its output
pgbench_run() {
	local v=$1
	shift
	runuser -u postgres -- "$BIN/pgbench" -n -M simple -h 127.0.0.1 -p "${PORT[coord]}" \
		-U postgres -c "$CLIENTS" -j "$JOBS" "$@" -f "$WORK/c1_$v.sql" postgres 2>&1 ||
		{ echo "pgbench failed for $v" >&2; return 1; }
}

run_c1() {
	local v=$1 out tps
	settle
	out=$(pgbench_run "$v" -T "$DURATION") || { echo "$out" >&2; die "pgbench failed for $v"; }
	case "$out" in
		*"number of failed transactions: 0 "*) ;;
		*) echo "$out" >&2; die "pgbench reported failed transactions for $v" ;;
	esac
	tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p')
	[ -n "$tps" ] || { echo "$out" >&2; die "no result from pgbench for $v"; }
	echo "$tps"
}

# median, stats, ratio_stats and result
. "$(dirname "$0")/report.sh"

# ---------------------------------------------------------------------------
# Measure: TPS, the variants alternating
# ---------------------------------------------------------------------------
log "C1: $ROUNDS rounds x ${#VARIANTS[@]} variants x ${DURATION}s pgbench -c $CLIENTS -j $JOBS"
for ((round = 0; round < ROUNDS; round++)); do
	for ((i = 0; i < ${#VARIANTS[@]}; i++)); do
		v=${VARIANTS[$(((i + round) % ${#VARIANTS[@]}))]}
		tps=$(run_c1 "$v")
		echo "$tps" >>"$WORK/c1_$v.tps"
		log "round $((round + 1)) $v: $tps tps"
	done
done

# ---------------------------------------------------------------------------
# Measure: what the workers run per transaction
# ---------------------------------------------------------------------------
worker_sql() {
	local n sum=0 x
	for n in w1 w2; do
		x=$(psql_on "$n" -c "$1")
		sum=$((sum + ${x:-0}))
	done
	echo $sum
}
for v in "${VARIANTS[@]}"; do
	settle
	for n in w1 w2; do
		psql_on "$n" -c 'SELECT pg_stat_statements_reset()' -c 'SELECT pg_stat_reset()' >/dev/null
	done
	out=$(pgbench_run "$v" -t "$STMT_XACTS") || { echo "$out" >&2; die "pgbench failed for $v"; }
	xacts=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\)\/.*$/\1/p')
	[ -n "$xacts" ] && [ "$xacts" -gt 0 ] || { echo "$out" >&2; die "no transactions counted for $v"; }
	sleep 1		# the statistics of the sessions that just ended
	# statement kinds on the workers (maintenance of Citus and of this
	# script excluded: only statements on the c1 shards or in transactions)
	for n in w1 w2; do
		psql_on "$n" -F ' ' -c "
SELECT CASE WHEN query ~* 'c1_fenced_update' THEN 'SELECT c1_fenced_update (delegated: fence and UPDATE inside)'
            WHEN query ~* 'c1_plain_update' THEN 'SELECT c1_plain_update (delegated: UPDATE inside)'
            WHEN query ~* '^update (public\\.)?c1_' THEN 'UPDATE (the shard)'
            WHEN query ~* 'lockfence\\.fence' THEN 'SELECT lockfence.fence'
            WHEN query ~* '^begin' THEN 'BEGIN'
            WHEN query ~* 'assign_distributed_transaction_id' THEN 'assign_distributed_transaction_id'
            WHEN query ~* '^prepare transaction' THEN 'PREPARE TRANSACTION'
            WHEN query ~* '^commit prepared' THEN 'COMMIT PREPARED'
            WHEN query ~* '^commit' THEN 'COMMIT'
            ELSE 'other: ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 60) END, sum(calls)
  FROM pg_stat_statements GROUP BY 1"
	done | awk '{ c = $NF; $NF = ""; k[$0] += c } END { for (q in k) print k[q], q }' |
		sort -k2 >"$WORK/stmts_$v"
	sessions=$(worker_sql "SELECT sum(sessions) FROM pg_stat_database")
	total=$(awk '$2 !~ /^other/ { s += $1 } END { print s + 0 }' "$WORK/stmts_$v")
	prep=$(awk '/PREPARE TRANSACTION|COMMIT PREPARED/ { s += $1 } END { print s + 0 }' "$WORK/stmts_$v")
	awk -v x="$xacts" -v t="$total" 'BEGIN { printf "%.3f\n", t / x }' >"$WORK/c1_${v}_stmts"
	awk -v x="$xacts" -v p="$prep" 'BEGIN { printf "%.3f\n", p / x }' >"$WORK/c1_${v}_2pc"
	awk -v x="$xacts" -v s="$sessions" 'BEGIN { printf "%.3f\n", s / x }' >"$WORK/c1_${v}_sessions"
	{
		echo "  $v: $xacts transactions; on the workers, per transaction:" \
			"$(cat "$WORK/c1_${v}_stmts") statements," \
			"$(cat "$WORK/c1_${v}_2pc") of them two-phase commit," \
			"$(cat "$WORK/c1_${v}_sessions") sessions opened"
		awk -v x="$xacts" '{ c = $1; $1 = ""; printf "      %8.3f per transaction  %s\n", c / x, $0 }' "$WORK/stmts_$v"
	} >"$WORK/report_$v"
done

# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------
samples() { tr '\n' ' ' <"$1" | sed 's/ $//'; }
echo
echo "lockfence on Citus, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "PostgreSQL $("$BIN/postgres" --version | awk '{ print $3 }'), Citus $(psql_on coord -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'"), a coordinator and 2 workers,"
echo "citus.shard_count 4; fsync on; pgbench -M simple -c $CLIENTS -j $JOBS -T $DURATION, $ROUNDS rounds alternating"
echo
for v in "${VARIANTS[@]}"; do
	printf '  C1 %-9s %9.1f tps   (%s)\n' "$v" "$(median <"$WORK/c1_$v.tps")" "$(samples "$WORK/c1_$v.tps")"
done
echo
echo "Statements the workers ran ($STMT_XACTS transactions per client, pg_stat_statements, top level):"
for v in "${VARIANTS[@]}"; do
	cat "$WORK/report_$v"
done
echo
# per-transaction figure of a variant, and the difference of two
fig() { cat "$WORK/c1_${1}_$2"; }
diff_fig() {
	awk -v a="$(fig "$1" "$3")" -v b="$(fig "$2" "$3")" 'BEGIN { printf "%.3f", a - b }'
}
MET=1
if [ $FENCED = 1 ]; then
	echo "The target is the same write fenced and unfenced in the form that adds no round trip:"
	echo "fence() and a single-row UPDATE in one function delegated to the shard's node, against"
	echo "the same function without fence() on the unprotected twin; one statement each."
	read -r med lo hi n <<<"$(ratio_stats "$WORK/c1_delegated.tps" "$WORK/c1_delegated_plain.tps")"
	if awk -v m="$med" 'BEGIN { exit !(m >= 0.85) }'; then ok=met; else ok="NOT MET"; MET=0; fi
	printf 'C1 TARGET: TPS delegated / TPS delegated_plain (median of per-round ratios) %.3f  [%.3f-%.3f]  >= 0.85 %s\n' \
		"$med" "$lo" "$hi" "$ok"
	d=$(diff_fig delegated update stmts)
	if awk -v d="$d" 'BEGIN { exit !(d <= 0) }'; then ok=met; else ok="NOT MET"; MET=0; fi
	echo "C1 TARGET: statements on the workers per transaction, delegated - update: $d (<= 0 $ok);" \
		"two-phase commit statements per delegated transaction: $(fig delegated 2pc)," \
		"sessions opened per transaction delegated: $(fig delegated sessions), update: $(fig update sessions)"
	p=$(fig delegated 2pc)
	if ! awk -v p="$p" 'BEGIN { exit !(p <= 0) }'; then MET=0; fi
	read -r med lo hi n <<<"$(ratio_stats "$WORK/c1_delegated_plain.tps" "$WORK/c1_update.tps")"
	printf 'C1 diagnostic: the function without fence() / the UPDATE alone (the form on Citus, no lockfence) %.3f  [%.3f-%.3f]\n' \
		"$med" "$lo" "$hi"
	read -r med lo hi n <<<"$(ratio_stats "$WORK/c1_delegated.tps" "$WORK/c1_update.tps")"
	printf 'C1 diagnostic: the function with fence() / the UPDATE alone %.3f  [%.3f-%.3f]\n' \
		"$med" "$lo" "$hi"
	read -r med lo hi n <<<"$(ratio_stats "$WORK/c1_fenced.tps" "$WORK/c1_plain.tps")"
	printf 'C1 diagnostic: BEGIN; fence(); UPDATE; COMMIT / BEGIN; UPDATE; COMMIT, statement by statement %.3f  [%.3f-%.3f]\n' \
		"$med" "$lo" "$hi"
	read -r med lo hi n <<<"$(ratio_stats "$WORK/c1_fenced1.tps" "$WORK/c1_plain1.tps")"
	printf 'C1 diagnostic: the same, each transaction one compound query %.3f  [%.3f-%.3f]\n' \
		"$med" "$lo" "$hi"
	echo "C1 diagnostic: statements on the workers per transaction, fenced - plain: $(diff_fig fenced plain stmts);" \
		"two-phase commit statements per transaction fenced: $(fig fenced 2pc), plain: $(fig plain 2pc);" \
		"sessions opened per transaction fenced: $(fig fenced sessions), plain: $(fig plain sessions)"
else
	echo "C1 TPS fenced / TPS unfenced: NOT MEASURED: $WHY"
	MET=0
fi
echo
[ $MET = 1 ] && echo "all targets met" || echo "some targets NOT met"
echo
result C1_update_tps "$(stats "$WORK/c1_update.tps")"
result C1_plain_tps "$(stats "$WORK/c1_plain.tps")"
if [ $FENCED = 1 ]; then
	result C1_delegated_tps_ratio "$(ratio_stats "$WORK/c1_delegated.tps" "$WORK/c1_delegated_plain.tps")"
	result C1_delegated_tps "$(stats "$WORK/c1_delegated.tps")"
	d=$(diff_fig delegated update stmts)
	result C1_delegated_extra_worker_stmts "$d $d $d 1"
	p=$(fig delegated 2pc)
	result C1_delegated_2pc_per_xact "$p $p $p 1"
	result C1_delegated_vs_update_tps_ratio "$(ratio_stats "$WORK/c1_delegated.tps" "$WORK/c1_update.tps")"
	result C1_plain_function_vs_update_tps_ratio "$(ratio_stats "$WORK/c1_delegated_plain.tps" "$WORK/c1_update.tps")"
	result C1_tps_ratio "$(ratio_stats "$WORK/c1_fenced.tps" "$WORK/c1_plain.tps")"
	result C1_fenced_tps "$(stats "$WORK/c1_fenced.tps")"
	result C1_compound_tps_ratio "$(ratio_stats "$WORK/c1_fenced1.tps" "$WORK/c1_plain1.tps")"
	d=$(diff_fig fenced plain stmts)
	result C1_extra_worker_stmts "$d $d $d 1"
	p=$(fig fenced 2pc)
	result C1_fenced_2pc_per_xact "$p $p $p 1"
	s=$(diff_fig fenced plain sessions)
	result C1_extra_worker_sessions "$s $s $s 1"
fi
exit 0
