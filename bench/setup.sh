# shellcheck shell=bash
#
# bench/setup.sh
#	  Shared setup of the lockfence benchmarks, sourced by core.sh,
#	  multixact.sh and profile.sh: a private PostgreSQL 15 with the extension built from this
#	  tree, a throwaway server run as user postgres, the benchmark tables,
#	  and a check that both fence triggers really reject stale writes.
#
#	  Expects CLIENTS and BULK_ROWS; MAX_CONNECTIONS (20) for more clients;
#	  PRELOAD=0 leaves lockfence out of
#	  shared_preload_libraries (default: in, so its metrics count).  Sets
#	  BIN, WORK, SOCK, PORT, as_pg and psql_q.  The EXIT trap stops the server and removes WORK.
#
# IDENTIFICATION
#	  bench/setup.sh
#

die() { echo "${0##*/}: $*" >&2; exit 1; }

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
		echo "${0##*/}: kept $WORK" >&2
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
# The install and upgrade scripts (the Makefile's DATA): without them the
# installation keeps whatever scripts an earlier install left there.
cp "$TREE"/lockfence--*.sql "$WORK/build/"
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
max_connections = ${MAX_CONNECTIONS:-20}
EOF
# With the library preloaded its metrics count every check (shared-memory
# atomics): the configuration docs/metrics.md describes, and the costlier one.
if [ "${PRELOAD:-1}" = 1 ]; then
	echo "shared_preload_libraries = 'lockfence'" >>"$WORK/data/postgresql.conf"
fi

PORT=
for _ in 1 2 3 4 5 6 7 8; do
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
# bench_update (below) is the measured UPDATE of each variant.
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
    ELSIF fence = 'ctrig' THEN
        -- A built-in C row trigger that does next to nothing here (the
        -- rows always change): what the trigger machinery alone costs.
        EXECUTE format('CREATE TRIGGER noop BEFORE UPDATE ON %I FOR EACH ROW'
                       ' EXECUTE FUNCTION suppress_redundant_updates_trigger()', tbl);
    END IF;
END
\$\$;

SELECT make_bench_table('b1_' || v, $((CLIENTS * 250)), '''client-'' || g % $CLIENTS',
                        '1000 + g % $CLIENTS', v)
  FROM unnest(ARRAY['none', 'lockfence', 'plpgsql', 'ctrig']) v;
SELECT make_bench_table('bulk_' || v, $BULK_ROWS, '''bulk''', '5000', v)
  FROM unnest(ARRAY['none', 'lockfence', 'plpgsql', 'ctrig']) v;

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

# bench_update VARIANT TABLE RESOURCE TOKEN CONDITION FORM: the measured
# UPDATE, setting the token column to TOKEN, which the rows and the fence
# already hold.  lockfence counts a row token equal to the fence only once
# the transaction has fenced it (otherwise it may be a copy), so its
# variant calls lockfence.fence() in the same statement, keeping one round
# trip per transaction, in one of two forms:
#   set  the token column is set to what lockfence.fence() returns (the
#        token): the call is evaluated with the row's new values, before
#        the row trigger; once per row written (B1: one row).
#   cte  a CTE calls it once, in a one-time filter before any row is read;
#        every row is then a hit in the transaction's cache (B3: 100,000
#        rows under one token).
bench_update() {
	local v=$1 tbl=$2 res=$3 tok=$4 cond=$5 form=$6
	if [ "$v" != lockfence ]; then
		echo "UPDATE $tbl SET val = val + 1, fence_token = $tok WHERE $cond;"
		return
	fi
	case "$form" in
		set) echo "UPDATE $tbl SET val = val + 1, fence_token = lockfence.fence($res, $tok) WHERE $cond;" ;;
		cte) echo "WITH f AS (SELECT lockfence.fence($res, $tok)) UPDATE $tbl SET val = val + 1, fence_token = $tok WHERE $cond AND EXISTS (SELECT FROM f);" ;;
		*) die "bench_update: form must be set or cte, not '$form'" ;;
	esac
}

# ---------------------------------------------------------------------------
# Helpers of the reports: bench/report.sh
# ---------------------------------------------------------------------------
. "$(dirname "${BASH_SOURCE[0]}")/report.sh"
