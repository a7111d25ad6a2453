#!/bin/bash
#
# bench/lease.sh
#	  Benchmarks of lockfence leases, side by side in one run, each call
#	  made by a client as users make them (one statement, autocommit):
#
#	  L1  uncontended cycle, 1 session: lease_acquire + lease_release
#	      against (a) pg_advisory_lock + pg_advisory_unlock (what users
#	      have; not durable) and (b) two single-row UPDATE transactions
#	      (the floor of any durable lease), same commit settings.  Target:
#	      lease within 1.2x of (b).  Each variant runs ROUNDS times, the
#	      order rotating; a ratio is the median of the per-round ratios.
#	  L2  8 sessions contending for one lease (acquire, hold HOLD_MS,
#	      release): hand-on latency, from a release to the next grant,
#	      both read from the server's clock.  Target: p50 < 5 ms; no lost
#	      wake-up (no hand-on anywhere near the TTL, tokens consecutive).
#	  L3  the L1 cycle on a name drawn from 10 and from 10^5 existing
#	      leases.  Target: no more per operation for 10^5 than for 10.
#
#	  Run as root with PG_CONFIG pointing at a private PostgreSQL
#	  installation (the extension is built from this tree and installed
#	  into it).  A throwaway server (lockfence preloaded) runs as user
#	  postgres in a temp folder that is removed at exit.
#
#	  Settings: ROUNDS (5), DURATION (seconds per pgbench run, 5),
#	  SYNC (on: synchronous_commit for every variant; off for CPU-bound,
#	  but since c7e4540 a grant flushes its commit whatever the setting:
#	  the targets are measured with on),
#	  L2_SECONDS (10), HOLD_MS (1), KEEP=1 keeps the temp folder.
#
#	  Ends with "RESULT name=ID median=M min=LO max=HI n=N" lines, which
#	  bench/all.sh reads.
#
# IDENTIFICATION
#	  bench/lease.sh
#

set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
SYNC=${SYNC:-on}
L2_SECONDS=${L2_SECONDS:-10}
HOLD_MS=${HOLD_MS:-1}

die() { echo "lease.sh: $*" >&2; exit 1; }
log() { echo "# $*" >&2; }

[ "$(id -u)" = 0 ] || die "run me as root (the server runs as user postgres)"
[ -n "${PG_CONFIG:-}" ] && [ -x "$PG_CONFIG" ] || die "set PG_CONFIG to a private PostgreSQL's pg_config"
case "$("$PG_CONFIG" --pkglibdir)" in
	/usr/lib/postgresql/*) die "PG_CONFIG points at the system PostgreSQL; give a private copy" ;;
esac
BIN=$("$PG_CONFIG" --bindir)
TREE=$(cd "$(dirname "$0")/.." && pwd)

WORK=$(mktemp -d /tmp/lockfence-lease-bench.XXXXXX)
chmod 755 "$WORK"
STARTED=
cleanup() {
	local rc=$?
	[ -n "$STARTED" ] && runuser -u postgres -- "$BIN/pg_ctl" -D "$WORK/data" \
		-m immediate -w stop >/dev/null 2>&1 || true
	if [ "${KEEP:-0}" = 1 ]; then echo "lease.sh: kept $WORK" >&2; else rm -rf "$WORK"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building lockfence from $TREE"
tar -C "$TREE" --exclude=.git -cf - . | tar -C "$WORK" --one-top-level=build -xf -
make -C "$WORK/build" -s PG_CONFIG="$PG_CONFIG" >"$WORK/build.log" 2>&1 &&
	make -C "$WORK/build" -s PG_CONFIG="$PG_CONFIG" install >>"$WORK/build.log" 2>&1 ||
	{ cat "$WORK/build.log" >&2; die "build failed"; }

SOCK=$WORK/sock
mkdir -p "$WORK/data" "$SOCK" "$WORK/log"
chown postgres: "$WORK/data" "$SOCK" "$WORK/log"
runuser -u postgres -- "$BIN/initdb" -D "$WORK/data" -A trust -U postgres \
	--no-sync >"$WORK/initdb.log" 2>&1 || { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
cat >>"$WORK/data/postgresql.conf" <<EOF
unix_socket_directories = '$SOCK'
listen_addresses = ''
shared_preload_libraries = 'lockfence'
synchronous_commit = $SYNC
autovacuum = off
max_wal_size = 4GB
checkpoint_timeout = 30min
max_connections = 30
EOF
PORT=$((20000 + RANDOM % 40000))
runuser -u postgres -- "$BIN/pg_ctl" -D "$WORK/data" -w -t 60 -l "$WORK/log/server.log" \
	-o "-p $PORT" start >/dev/null || { cat "$WORK/log/server.log" >&2; die "server did not start"; }
STARTED=1

as_pg() {
	runuser -u postgres -- env PGHOST="$SOCK" PGPORT="$PORT" PGDATABASE=postgres \
		PGUSER=postgres "$@"
}
psql_q() { as_pg "$BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 "$@"; }

psql_q <<'EOF'
CREATE EXTENSION lockfence;
CREATE TABLE floor (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
INSERT INTO floor SELECT g FROM generate_series(0, 99) g;
-- 10^5 existing leases (released), for L3
INSERT INTO lockfence.fences (resource, token, accepted_at, lease_expires_at, lease_ttl)
SELECT 'n' || g, 1, now(), '-infinity', '1 min' FROM generate_series(1, 100000) g;
VACUUM ANALYZE;
EOF

mkdir -p "$WORK/scripts"
S=$WORK/scripts
cat >"$S/lease.sql" <<'EOF'
SELECT token FROM lockfence.lease_acquire('c' || :client_id, '1 min') \gset
SELECT lockfence.lease_release('c' || :client_id, :token);
EOF
cat >"$S/advisory.sql" <<'EOF'
SELECT pg_advisory_lock(:client_id);
SELECT pg_advisory_unlock(:client_id);
EOF
cat >"$S/update.sql" <<'EOF'
UPDATE floor SET v = v + 1 WHERE id = :client_id;
UPDATE floor SET v = v + 1 WHERE id = :client_id;
EOF
for n in 10 100000; do
	cat >"$S/names$n.sql" <<EOF
\set k random(1, $n)
SELECT token FROM lockfence.lease_acquire('n' || :k, '1 min') \gset
SELECT lockfence.lease_release('n' || :k, :token);
EOF
done
chown -R postgres: "$S"

# TPS of one pgbench run of a script, 1 client.
tps() {
	as_pg "$BIN/pgbench" -n -c 1 -j 1 -T "$DURATION" -f "$S/$1.sql" 2>/dev/null |
		sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
settle() { psql_q -c 'VACUUM floor' -c 'VACUUM lockfence.fences' -c 'CHECKPOINT' >/dev/null; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# Rounds of variants in rotating order; prints per-variant median TPS and
# the median per-round ratio of the first variant to each other one.
rounds() {
	local vs=("$@") n=$# r i v
	declare -gA T=()
	for ((r = 0; r < ROUNDS; r++)); do
		for ((i = 0; i < n; i++)); do
			v=${vs[$(((i + r) % n))]}
			settle
			T[$v,$r]=$(tps "$v")
		done
		log "round $r: $(for v in "${vs[@]}"; do printf '%s=%s ' "$v" "${T[$v,$r]}"; done)"
	done
	for v in "${vs[@]}"; do
		printf '  %-12s median %8.1f cycles/s (%6.3f ms per cycle)\n' "$v" \
			"$(for ((r = 0; r < ROUNDS; r++)); do echo "${T[$v,$r]}"; done | median)" \
			"$(for ((r = 0; r < ROUNDS; r++)); do echo "${T[$v,$r]}"; done | median | awk '{print 1000/$1}')"
	done
	for v in "${vs[@]:1}"; do
		local ratios
		ratios=$(for ((r = 0; r < ROUNDS; r++)); do
			awk -v a="${T[${vs[0]},$r]}" -v b="${T[$v,$r]}" 'BEGIN {print b / a}'; done)
		printf '  time per cycle, %s / %s: median %.2fx (rounds %s)\n' "${vs[0]}" "$v" \
			"$(echo "$ratios" | median)" "$(echo "$ratios" | sort -g | awk '{printf "%s%.2f", (NR > 1 ? " " : ""), $1}')"
		RESULTS+="RESULT name=${RESULT_PREFIX}_${vs[0]}_vs_$v median=$(echo "$ratios" | median)"
		RESULTS+=" min=$(echo "$ratios" | sort -g | head -1) max=$(echo "$ratios" | sort -g | tail -1) n=$ROUNDS"$'\n'
	done
}
RESULTS=

echo "lockfence lease benchmark: $(date -u +%Y-%m-%dT%H:%MZ), git $(git -C "$TREE" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'), synchronous_commit=$SYNC, $(nproc) cores, ROUNDS=$ROUNDS DURATION=${DURATION}s"
echo
echo "L1  uncontended cycle, 1 session (two autocommit statements per cycle)"
RESULT_PREFIX=L1 rounds lease advisory update

echo
echo "L2  8 sessions contending for one lease (hold ${HOLD_MS} ms), ${L2_SECONDS} s"
: >"$WORK/l2.result"
chown postgres: "$WORK/l2.result"
as_pg /usr/bin/python3 - "$L2_SECONDS" "$HOLD_MS" "host=$SOCK port=$PORT dbname=postgres user=postgres" \
	"$WORK/l2.result" <<'EOF'
import multiprocessing as mp, sys, time
import psycopg
seconds, hold_ms, dsn = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
TTL = 10.0

def worker(i, q):
    c = psycopg.connect(dsn, autocommit=True)
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tok, granted = c.execute(
            "SELECT token, extract(epoch FROM expires_at) - %s"
            " FROM lockfence.lease_acquire('contended', make_interval(secs => %s), %s)",
            (TTL, TTL, f"w{i}")).fetchone()
        time.sleep(hold_ms / 1000)
        rel, ok = c.execute(
            "SELECT extract(epoch FROM clock_timestamp()), lockfence.lease_release('contended', %s)",
            (tok,)).fetchone()
        assert ok, "release failed"
        out.append((tok, float(granted), float(rel)))
    q.put(out)

q = mp.Queue()
ps = [mp.Process(target=worker, args=(i, q)) for i in range(8)]
for p in ps: p.start()
rows = sorted(r for _ in ps for r in q.get())
for p in ps: p.join()
toks = [r[0] for r in rows]
hand = sorted((rows[k + 1][1] - rows[k][2]) * 1000 for k in range(len(rows) - 1))
def pct(p): return hand[min(len(hand) - 1, int(p * len(hand)))]
print(f"  grants {len(rows)}, tokens {toks[0]}..{toks[-1]}, consecutive: {toks == list(range(toks[0], toks[0] + len(toks)))}")
print(f"  hand-on (release -> next grant): p50 {pct(0.5):.2f} ms, p90 {pct(0.9):.2f} ms, p99 {pct(0.99):.2f} ms, max {hand[-1]:.2f} ms")
print(f"  lost wake-ups (hand-on > 1 s, TTL {TTL:.0f} s): {sum(1 for h in hand if h > 1000)}")
lost = sum(1 for h in hand if h > 1000) + (toks != list(range(toks[0], toks[0] + len(toks))))
with open(sys.argv[4], "w") as f:
    for name, v in (("L2_handon_p50_ms", pct(0.5)), ("L2_handon_p99_ms", pct(0.99)),
                    ("L2_lost_wakeups", lost)):
        f.write(f"RESULT name={name} median={v:.3f} min={v:.3f} max={v:.3f} n=1\n")
EOF

echo
echo "L3  the cycle on a name drawn from 10 vs from 10^5 leases, 1 session"
RESULT_PREFIX=L3 rounds names10 names100000

# For bench/all.sh: the ratios above (time per cycle, median of the
# per-round ratios) and L2's hand-on (one run: n=1).
echo
printf '%s' "$RESULTS"
cat "$WORK/l2.result"
