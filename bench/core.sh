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
#	      <= 1.3x the unprotected time, >= 3x faster than PL/pgSQL.
#
#	  The machine is shared and noisy, so all variants run interleaved in
#	  one run: ROUNDS short rounds, the order of the variants rotating from
#	  round to round, each run preceded by VACUUM and CHECKPOINT so that
#	  every run starts from the same state.  A ratio is the median of the
#	  per-round ratios (each compares runs made seconds apart); the spread
#	  is the lowest and highest per-round ratio.
#
#	  Run as root.  It sets up everything itself, in a temp folder that is
#	  removed at exit: a private copy of the system PostgreSQL 15 with the
#	  extension built from this tree and installed into it (or, with
#	  PG_CONFIG set, the extension is installed into that installation,
#	  which must be a private one), and a throwaway server run as user
#	  postgres on a free port and a private unix socket.
#
#	  Settings (environment): ROUNDS (5), DURATION (seconds per pgbench
#	  run, 8), BULK_ROWS (100000), PG_CONFIG, KEEP=1 keeps the temp folder.
#
# IDENTIFICATION
#	  bench/core.sh
#

set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-8}
BULK_ROWS=${BULK_ROWS:-100000}
CLIENTS=4
JOBS=2

die() { echo "core.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run me as root (the server runs as user postgres)"
id postgres >/dev/null 2>&1 || die "user postgres does not exist"

TREE=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$TREE/lockfence.control" ] || die "$TREE is not a lockfence tree"

WORK=$(mktemp -d /tmp/lockfence-bench.XXXXXX)
chmod 755 "$WORK"
SERVER_STARTED=
BIN=

cleanup() {
	local rc=$?
	if [ -n "$SERVER_STARTED" ]; then
		runuser -u postgres -- "$BIN/pg_ctl" -D "$WORK/data" -m immediate \
			-w stop >/dev/null 2>&1 || true
	fi
	if [ "${KEEP:-0}" = 1 ]; then
		echo "core.sh: kept $WORK" >&2
	else
		rm -rf "$WORK"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "# $*" >&2; }

# ---------------------------------------------------------------------------
# PostgreSQL with the extension from this tree
# ---------------------------------------------------------------------------
if [ -z "${PG_CONFIG:-}" ]; then
	X=$WORK/pg
	log "private PostgreSQL copy in $X"
	mkdir -p "$X/usr/lib/postgresql" "$X/usr/share/postgresql"
	cp -a /usr/lib/postgresql/15 "$X/usr/lib/postgresql/"
	cp -a /usr/share/postgresql/15 "$X/usr/share/postgresql/"
	ln -s /usr/include "$X/usr/include"
	PG_CONFIG=$X/usr/lib/postgresql/15/bin/pg_config
else
	[ -x "$PG_CONFIG" ] || die "PG_CONFIG=$PG_CONFIG is not executable"
	case "$("$PG_CONFIG" --pkglibdir)" in
		/usr/lib/postgresql/*)
			die "PG_CONFIG points at the system PostgreSQL; give a private copy or leave PG_CONFIG unset" ;;
	esac
fi
BIN=$("$PG_CONFIG" --bindir)

log "building lockfence from $TREE"
mkdir -p "$WORK/build/src" "$WORK/build/sql"
cp "$TREE/Makefile" "$TREE/lockfence.control" "$WORK/build/"
cp "$TREE"/src/*.c "$TREE"/src/*.h "$WORK/build/src/"
cp "$TREE"/sql/*.sql "$WORK/build/sql/"
make -C "$WORK/build" PG_CONFIG="$PG_CONFIG" >"$WORK/build.log" 2>&1 &&
	make -C "$WORK/build" PG_CONFIG="$PG_CONFIG" install >>"$WORK/build.log" 2>&1 ||
	{ cat "$WORK/build.log" >&2; die "build failed"; }

# ---------------------------------------------------------------------------
# Throwaway server
# ---------------------------------------------------------------------------
port_in_use() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

SOCK=$WORK/sock
LOGDIR=$WORK/log
mkdir -p "$WORK/data" "$SOCK" "$LOGDIR"
chown postgres: "$WORK/data" "$SOCK" "$LOGDIR"
runuser -u postgres -- "$BIN/initdb" -D "$WORK/data" -A trust -U postgres \
	--no-sync >"$WORK/initdb.log" 2>&1 || { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
cat >>"$WORK/data/postgresql.conf" <<EOF
# lockfence bench: defaults, except what keeps runs comparable
unix_socket_directories = '$SOCK'
autovacuum = off			# VACUUM is run between runs instead
max_wal_size = 4GB			# CHECKPOINT is run between runs instead
checkpoint_timeout = 30min
max_connections = 20
EOF

PORT=
for attempt in 1 2 3 4 5 6 7 8; do
	p=$((20000 + RANDOM % 40000))
	port_in_use "$p" && continue
	if runuser -u postgres -- "$BIN/pg_ctl" -D "$WORK/data" -w -t 60 \
		-l "$LOGDIR/server.log" -o "-p $p -c listen_addresses=127.0.0.1" \
		start >/dev/null 2>&1; then
		PORT=$p
		SERVER_STARTED=1
		break
	fi
done
[ -n "$PORT" ] || { cat "$LOGDIR/server.log" >&2 || true; die "server did not start"; }
log "server on port $PORT, socket $SOCK"

# Every client command runs as postgres against the throwaway server.
as_pg() {
	runuser -u postgres -- env PGHOST="$SOCK" PGPORT="$PORT" PGDATABASE=bench \
		PGUSER=postgres "$@"
}
psql_q() {
	as_pg "$BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}

as_pg "$BIN/createdb" bench

# ---------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------
# b1_*: 250 rows per client, row id % 4 = client, resource 'client-N'.
# Client N always presents token 1000 + N, already recorded in the fence
# (the steady state: a lock holder writing under the lock it holds).
# bulk_*: BULK_ROWS rows, all of resource 'bulk', token 5000.
log "creating tables"
psql_q >/dev/null <<EOF
CREATE EXTENSION lockfence;

-- The check users write by hand today, with their own fence table: lock
-- the fence row, compare, advance if higher, raise if lower.  Simpler than
-- lockfence (no holder, no check that the write sets the token itself, no
-- re-check after a concurrent insert), so its cost is a lower bound.
CREATE TABLE plpgsql_fences (
    resource    text PRIMARY KEY,
    token       bigint NOT NULL,
    accepted_at timestamptz NOT NULL
);

CREATE FUNCTION plpgsql_fence_trigger() RETURNS trigger
LANGUAGE plpgsql AS \$\$
DECLARE
    tok bigint := NEW.fence_token;
    cur bigint;
BEGIN
    IF tok IS NULL THEN
        RAISE EXCEPTION 'write carries no fencing token' USING ERRCODE = 'LF002';
    END IF;
    SELECT f.token INTO cur FROM plpgsql_fences f
     WHERE f.resource = NEW.resource FOR SHARE;
    IF NOT FOUND THEN
        INSERT INTO plpgsql_fences VALUES (NEW.resource, tok, now())
        ON CONFLICT (resource) DO UPDATE SET token = excluded.token
        WHERE plpgsql_fences.token < excluded.token;
    ELSIF tok < cur THEN
        RAISE EXCEPTION 'stale fencing token % for resource %, % accepted',
            tok, NEW.resource, cur USING ERRCODE = 'LF001';
    ELSIF tok > cur THEN
        UPDATE plpgsql_fences SET token = tok, accepted_at = now()
         WHERE resource = NEW.resource;
    END IF;
    RETURN NEW;
END
\$\$;

CREATE FUNCTION make_bench_table(tbl text, nrows int, resource_expr text,
                                 token_expr text, fence text)
RETURNS void LANGUAGE plpgsql AS \$\$
BEGIN
    EXECUTE format('CREATE TABLE %I (id int PRIMARY KEY, resource text NOT NULL,'
                   ' fence_token bigint, val int NOT NULL DEFAULT 0)', tbl);
    EXECUTE format('INSERT INTO %I (id, resource, fence_token)'
                   ' SELECT g, %s, %s FROM generate_series(0, %s - 1) g',
                   tbl, resource_expr, token_expr, nrows);
    IF fence = 'lockfence' THEN
        PERFORM lockfence.protect(tbl::regclass, resource_column => 'resource',
                                  token_column => 'fence_token');
    ELSIF fence = 'plpgsql' THEN
        EXECUTE format('CREATE TRIGGER fence BEFORE INSERT OR UPDATE ON %I'
                       ' FOR EACH ROW EXECUTE FUNCTION plpgsql_fence_trigger()', tbl);
    END IF;
END
\$\$;

SELECT make_bench_table('b1_' || v, $((CLIENTS * 250)), '''client-'' || g % $CLIENTS',
                        '1000 + g % $CLIENTS', v)
  FROM unnest(ARRAY['none', 'lockfence', 'plpgsql']) v;
SELECT make_bench_table('bulk_' || v, $BULK_ROWS, '''bulk''', '5000', v)
  FROM unnest(ARRAY['none', 'lockfence', 'plpgsql']) v;

SELECT lockfence.fence('client-' || c, 1000 + c) FROM generate_series(0, $CLIENTS - 1) c;
SELECT lockfence.fence('bulk', 5000);
INSERT INTO plpgsql_fences
SELECT 'client-' || c, 1000 + c, now() FROM generate_series(0, $CLIENTS - 1) c
UNION ALL SELECT 'bulk', 5000, now();
VACUUM ANALYZE;
EOF

# ---------------------------------------------------------------------------
# Both triggers must really fence, or the benchmark measures nothing.
# ---------------------------------------------------------------------------
expect_sqlstate() {
	local want=$1 sql=$2 got
	got=$(as_pg "$BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 \
		-v VERBOSITY=verbose -c "$sql" 2>&1 || true)
	case "$got" in
		*"ERROR:  $want:"*) ;;
		*) die "expected SQLSTATE $want from: $sql; got: $got" ;;
	esac
}
for t in b1_lockfence b1_plpgsql; do
	expect_sqlstate LF001 "UPDATE $t SET fence_token = 999 WHERE id = 0"
done
expect_sqlstate LF002 "UPDATE b1_lockfence SET val = val + 1 WHERE id = 0"
[ "$(psql_q -c "SELECT count(*) FROM lockfence.fences")" = $((CLIENTS + 1)) ] ||
	die "unexpected lockfence.fences contents"

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
VARIANTS=(none lockfence plpgsql)

# Put the cluster into the same state before every measured run.
settle() {
	psql_q -c "VACUUM $1" -c "CHECKPOINT" >/dev/null
}

cat >"$WORK/b1.sql.in" <<'EOF'
\set r random(0, 249)
\set id 4 * :r + :client_id
\set tok 1000 + :client_id
UPDATE TABLE SET val = val + 1, fence_token = :tok WHERE id = :id;
EOF
[ "$CLIENTS" = 4 ] || die "b1.sql assumes 4 clients"
for v in "${VARIANTS[@]}"; do
	sed "s/TABLE/b1_$v/" "$WORK/b1.sql.in" >"$WORK/b1_$v.sql"
done
chown postgres: "$WORK"/b1_*.sql

# One pgbench run; prints its TPS.
run_b1() {
	local v=$1 out
	settle "b1_$v"
	out=$(as_pg "$BIN/pgbench" -n -M prepared -c "$CLIENTS" -j "$JOBS" \
		-T "$DURATION" -f "$WORK/b1_$v.sql" 2>&1) ||
		{ echo "$out" >&2; die "pgbench failed for $v"; }
	case "$out" in
		*"number of failed transactions: 0 "*) ;;
		*) echo "$out" >&2; die "pgbench reported failed transactions for $v" ;;
	esac
	echo "$out" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p'
}

# One bulk UPDATE of all rows in one transaction; prints its time in ms.
run_b3() {
	local v=$1 out
	settle "bulk_$v"
	out=$(as_pg "$BIN/psql" -X -q -v ON_ERROR_STOP=1 2>&1 <<EOF
BEGIN;
\\timing on
UPDATE bulk_$v SET val = val + 1, fence_token = 5000;
\\timing off
COMMIT;
EOF
	) || { echo "$out" >&2; die "bulk update failed for $v"; }
	echo "$out" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'
}

median() {
	sort -g | awk '{ a[NR] = $1 } END {
		if (NR % 2) printf "%.4f\n", a[(NR + 1) / 2];
		else printf "%.4f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# Per-round ratios a/b of two sample files: "median min max".
ratio_stats() {
	paste "$1" "$2" | awk '{ printf "%.4f\n", $1 / $2 }' >"$WORK/ratios"
	echo "$(median <"$WORK/ratios") $(sort -g "$WORK/ratios" | head -1) $(sort -g "$WORK/ratios" | tail -1)"
}

# ---------------------------------------------------------------------------
# Measure
# ---------------------------------------------------------------------------
log "B1/B2: $ROUNDS rounds x ${#VARIANTS[@]} variants x ${DURATION}s pgbench -c $CLIENTS -j $JOBS"
for ((round = 0; round < ROUNDS; round++)); do
	for ((i = 0; i < ${#VARIANTS[@]}; i++)); do
		v=${VARIANTS[$(((i + round) % ${#VARIANTS[@]}))]}
		tps=$(run_b1 "$v")
		[ -n "$tps" ] || die "no TPS from pgbench for $v"
		echo "$tps" >>"$WORK/b1_$v.tps"
		log "round $((round + 1)) b1 $v: $tps tps"
	done
done

log "B3: $ROUNDS rounds x ${#VARIANTS[@]} variants, UPDATE of $BULK_ROWS rows in one transaction"
for ((round = 0; round < ROUNDS; round++)); do
	for ((i = 0; i < ${#VARIANTS[@]}; i++)); do
		v=${VARIANTS[$(((i + round) % ${#VARIANTS[@]}))]}
		ms=$(run_b3 "$v")
		[ -n "$ms" ] || die "no time from the bulk update of $v"
		echo "$ms" >>"$WORK/b3_$v.ms"
		log "round $((round + 1)) b3 $v: $ms ms"
	done
done

# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------
# check NAME DESCRIPTION STATS OP TARGET
MET_ALL=1
check() {
	local name=$1 desc=$2 stats=$3 op=$4 target=$5 med lo hi ok
	read -r med lo hi <<<"$stats"
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
echo "PostgreSQL $("$BIN/postgres" --version | awk '{ print $3 }'), fsync on, synchronous_commit on;" \
	"pgbench -M prepared -c $CLIENTS -j $JOBS -T $DURATION; $ROUNDS rounds"
echo
echo "Medians (all samples):"
for v in "${VARIANTS[@]}"; do
	printf '  B1 %-10s %9.1f tps   (%s)\n' "$v" "$(median <"$WORK/b1_$v.tps")" "$(samples "$WORK/b1_$v.tps")"
done
for v in "${VARIANTS[@]}"; do
	printf '  B3 %-10s %9.1f ms    (%s)\n' "$v" "$(median <"$WORK/b3_$v.ms")" "$(samples "$WORK/b3_$v.ms")"
done
echo
printf '%-3s %-44s %7s  %-13s  %s\n' "" "ratio (median of per-round ratios)" "median" "[min-max]" "target"
check B1 "TPS lockfence / TPS no trigger" \
	"$(ratio_stats "$WORK/b1_lockfence.tps" "$WORK/b1_none.tps")" ">=" 0.90
check B2 "TPS lockfence / TPS PL/pgSQL trigger" \
	"$(ratio_stats "$WORK/b1_lockfence.tps" "$WORK/b1_plpgsql.tps")" ">=" 1.00
check B3 "time lockfence / time no trigger" \
	"$(ratio_stats "$WORK/b3_lockfence.ms" "$WORK/b3_none.ms")" "<=" 1.30
check B3 "time PL/pgSQL trigger / time lockfence" \
	"$(ratio_stats "$WORK/b3_plpgsql.ms" "$WORK/b3_lockfence.ms")" ">=" 3.00
echo
if [ "$MET_ALL" = 1 ]; then
	echo "all targets met"
else
	echo "some targets NOT met"
fi
