#!/bin/bash
#
# test/history/run.sh: the Jepsen-style history test of lockfence.
#
# As root:  bash test/history/run.sh [--seed N] [--minutes M]
#
# Starts throwaway servers in one temporary folder on free 127.0.0.1 ports
# (PostgreSQL with lockfence preloaded, a 3-member etcd cluster whose peer
# links pass through fault proxies, a Redis primary and replica, ZooKeeper),
# then runs, each followed by the checker:
#   1. the fenced run: workers and a nemesis (harness.py) for about 2.5
#      minutes, or --minutes M; it must reach 10,000 acknowledged operations
#      and every fault kind, with 0 violations;
#   2. the self-check: the same workloads without the fence, shorter; the
#      checker MUST report violations there.
# It also replays the fault schedule from the seed and requires it to be
# identical.  Everything started here is stopped by a trap, also on failure.
#
# Exit status 0 only if all of that held.  Environment:
#   PG_CONFIG                  PostgreSQL to build against and run
#                              (default: the system's PostgreSQL 15)
#   LOCKFENCE_HISTORY_OUT      keep the results (history, picture) there
#   LOCKFENCE_HISTORY_NO_BUILD=1   lockfence is already installed
#   LOCKFENCE_HISTORY_SELFCHECK_MINUTES   length of the self-check (1.5)

# shellcheck disable=SC2317   # cleanup is called through trap
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=/usr/bin/python3
export PYTHONDONTWRITEBYTECODE=1	# no root-owned __pycache__ in the tree
die() { printf 'history: %s\n' "$*" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || die "run me as root (servers run as user postgres)"

SEED=
MINUTES=2.5
MIN_OK=10000
while [ $# -gt 0 ]; do
	case $1 in
	--seed) SEED=$2; shift 2 ;;
	--minutes) MINUTES=$2; MIN_OK=0; shift 2 ;;
	*) die "unknown argument $1 (use --seed N, --minutes M)" ;;
	esac
done
[ -n "$SEED" ] || SEED=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
[ -x "$PG_CONFIG" ] || die "PG_CONFIG=$PG_CONFIG is not executable"
PG_BIN=$("$PG_CONFIG" --bindir)

T=$(mktemp -d /tmp/lockfence-history.XXXXXX)
chmod 755 "$T"
mkdir "$T/run"		# NAME.sh (how to start a server), NAME.pid ("pid start")

# start_time PID: field 22 of /proc/PID/stat, to tell a process from a
# later one that reuses its pid
start_time() { awk '{sub(/.*\) /, ""); print $20}' "/proc/$1/stat" 2>/dev/null; }

# still_ours PIDFILE: is the process recorded there still running?
still_ours() {
	local pid st
	read -r pid st <"$1" 2>/dev/null || return 1
	[ -n "$st" ] && [ "$(start_time "$pid")" = "$st" ]
}

cleanup() {
	local rc=$? f
	trap - EXIT INT TERM
	set +e
	[ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null
	for f in "$T"/run/*.pid; do
		still_ours "$f" || continue
		kill -CONT "$(cut -d' ' -f1 "$f")" 2>/dev/null
		kill -TERM "$(cut -d' ' -f1 "$f")" 2>/dev/null
	done
	runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$T/pg" -m immediate stop >/dev/null 2>&1
	for f in "$T"/run/*.pid; do
		[ -e "$f" ] || continue
		for _ in $(seq 50); do still_ours "$f" || break; sleep 0.1; done
		still_ours "$f" && kill -KILL "$(cut -d' ' -f1 "$f")" 2>/dev/null
	done
	if [ "$rc" -ne 0 ]; then
		for f in "$T"/*.log; do
			[ -s "$f" ] || continue
			printf '\n--- last lines of %s ---\n' "${f##*/}" >&2
			tail -n 8 "$f" >&2
		done
	fi
	if [ -n "${LOCKFENCE_HISTORY_OUT:-}" ]; then
		mkdir -p "$LOCKFENCE_HISTORY_OUT"
		cp -r "$T"/fenced "$T"/selfcheck "$LOCKFENCE_HISTORY_OUT"/ 2>/dev/null
		echo "history: results kept in $LOCKFENCE_HISTORY_OUT"
	fi
	rm -rf "$T"
	exit "$rc"
}
CHILD=
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# in_background COMMAND...: run a long step so that a signal to this
# script is handled at once (bash defers traps while a foreground
# command runs), and the step is stopped with the rest
in_background() {
	"$@" &
	CHILD=$!
	wait "$CHILD"
}

# spawn NAME COMMAND...: write $T/run/NAME.sh and start it in the
# background; harness.py restarts killed servers with the same script.
spawn() {
	local name=$1
	shift
	printf 'exec %s "$@" >>%s 2>&1\n' "$(printf '%q ' "$@")" "$T/$name.log" >"$T/run/$name.sh"
	bash "$T/run/$name.sh" &
	echo "$! $(start_time $!)" >"$T/run/$name.pid"
	disown $!
}

# ---------------------------------------------------------------------------
if [ -z "${LOCKFENCE_HISTORY_NO_BUILD:-}" ]; then
	echo "history: building lockfence with $PG_CONFIG"
	mkdir "$T/build"
	tar -C "$REPO" --exclude=.git --exclude='*.o' --exclude='*.bc' --exclude='*.so' \
		--exclude=tmp_check --exclude=results -cf - . | tar -C "$T/build" -xf -
	{ make -s -C "$T/build" PG_CONFIG="$PG_CONFIG" &&
		make -s -C "$T/build" PG_CONFIG="$PG_CONFIG" install; } >"$T/build.log" 2>&1 ||
		{ cat "$T/build.log" >&2; die "build failed"; }
fi

# 13 free ports, all bound at once so that they differ.  Not from the
# kernel's ephemeral range (bind to port 0): an outgoing connection can
# take such a port between this choice and the server's bind.  Nor from
# 10200-32767, where PostgreSQL::Test::Cluster::get_free_port() (and so
# LockfenceTest::EtcdCluster::free_port) finds ports for the TAP files that
# may run beside this test, reserving them in a port lock folder this
# script does not share: from 3000-10199, below both, from a random start.
read -r PG_PORT C1 C2 C3 P1 P2 P3 X1 X2 X3 R1 R2 ZK_PORT < <("$PY" -c '
import random, socket
lo, hi = 3000, 10199
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        eph_lo, eph_hi = (int(x) for x in f.read().split())
    if eph_lo <= hi and eph_hi >= lo:
        hi = eph_lo - 1
except OSError:
    pass
socks = []
port = random.randint(lo, hi)
for _ in range(max(hi - lo + 1, 0)):
    port = lo if port >= hi else port + 1
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen()
    except OSError:
        s.close()
        continue
    socks.append(s)
    if len(socks) == 13:
        break
print(" ".join(str(s.getsockname()[1]) for s in socks))')
[ -n "${ZK_PORT:-}" ] || die "could not find 13 free ports"

# --- PostgreSQL: fsync on, so that acknowledged commits survive a crash ---
install -d -o postgres -g postgres -m 700 "$T/pg"
runuser -u postgres -- "$PG_BIN/initdb" -D "$T/pg" -U postgres -A trust >"$T/initdb.log" 2>&1 ||
	{ cat "$T/initdb.log" >&2; die "initdb failed"; }
cat >>"$T/pg/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$T/pg'
shared_preload_libraries = 'lockfence'
lockfence.etcd_endpoints = 'http://127.0.0.1:$C1,http://127.0.0.1:$C2,http://127.0.0.1:$C3'
max_connections = 60
fsync = on
synchronous_commit = on
EOF
install -o postgres -g postgres -m 644 /dev/null "$T/postgres.log"
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$T/pg" -l "$T/postgres.log" -w -t 60 start >/dev/null ||
	die "PostgreSQL did not start"

# --- etcd: 3 members; each advertises its fault proxy as its peer URL ---
spawn faultproxy "$PY" "$HERE/faultproxy.py" "$T/run/cut" "$X1:$P1" "$X2:$P2" "$X3:$P3"
CLUSTER="e1=http://127.0.0.1:$X1,e2=http://127.0.0.1:$X2,e3=http://127.0.0.1:$X3"
i=0
for m in "$C1 $P1 $X1" "$C2 $P2 $X2" "$C3 $P3 $X3"; do
	i=$((i + 1))
	read -r c p x <<<"$m"
	spawn "etcd-e$i" etcd --name "e$i" --data-dir "$T/etcd-e$i" \
		--listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
		--listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$x" \
		--initial-cluster "$CLUSTER" --initial-cluster-state new --pre-vote \
		--election-timeout 1500 --heartbeat-interval 150
done

# --- Redis primary + replica (no persistence: a failover loses INCRs) ---
mkdir "$T/redis-a" "$T/redis-b"
spawn redis-a redis-server --bind 127.0.0.1 --port "$R1" --dir "$T/redis-a" --save '' \
	--appendonly no --repl-diskless-sync-delay 0
spawn redis-b redis-server --bind 127.0.0.1 --port "$R2" --dir "$T/redis-b" --save '' \
	--appendonly no --repl-diskless-sync-delay 0 --replicaof 127.0.0.1 "$R1"

# --- ZooKeeper, standalone; short ticks so that sessions can expire fast ---
mkdir -p "$T/zk/data"
cat >"$T/zk/zoo.cfg" <<EOF
tickTime=500
dataDir=$T/zk/data
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
minSessionTimeout=1000
maxSessionTimeout=10000
admin.enableServer=false
4lw.commands.whitelist=ruok
EOF
ZK_CP=/usr/share/java/zookeeper.jar
if [ -r /etc/zookeeper/conf_example/environment ]; then
	# shellcheck disable=SC1091
	ZK_CP=$(. /etc/zookeeper/conf_example/environment && echo "$CLASSPATH")
fi
spawn zookeeper java -Xmx256m -Dzookeeper.log.dir="$T/zk" -cp "$ZK_CP" \
	org.apache.zookeeper.server.ZooKeeperServerMain "$T/zk/zoo.cfg"

export HISTORY_DIR=$T HISTORY_PG_BIN=$PG_BIN HISTORY_PG_PORT=$PG_PORT
export HISTORY_ETCD="$C1 $C2 $C3" HISTORY_REDIS="$R1 $R2" HISTORY_ZK="127.0.0.1:$ZK_PORT"
"$PY" "$HERE/harness.py" --wait-ready || die "the servers did not come up"

# ---------------------------------------------------------------------------
echo "history: seed $SEED (replay: bash test/history/run.sh --seed $SEED)"
"$PY" "$HERE/harness.py" --seed "$SEED" --minutes "$MINUTES" --print-schedule >"$T/plan1"
"$PY" "$HERE/harness.py" --seed "$SEED" --minutes "$MINUTES" --print-schedule >"$T/plan2"
cmp -s "$T/plan1" "$T/plan2" || die "the same seed gave two different fault schedules"

status=0
start=$SECONDS
in_background "$PY" "$HERE/harness.py" --seed "$SEED" --minutes "$MINUTES" --min-ok "$MIN_OK" \
	--out "$T/fenced" || status=1
cmp -s "$T/plan1" "$T/fenced/schedule.txt" ||
	{ echo "history: FAILED: the run did not follow the schedule of its seed"; status=1; }
"$PY" "$HERE/checker.py" "$T/fenced" --require-ok "$MIN_OK" --require-all-faults || status=1
"$PY" "$HERE/timeline.py" "$T/fenced" || status=1
echo "history: fenced run took $((SECONDS - start)) s"

start=$SECONDS
in_background "$PY" "$HERE/harness.py" --seed "$SEED" --no-fence \
	--minutes "${LOCKFENCE_HISTORY_SELFCHECK_MINUTES:-1.5}" --out "$T/selfcheck" || status=1
"$PY" "$HERE/checker.py" "$T/selfcheck" --expect-violations || status=1
"$PY" "$HERE/timeline.py" "$T/selfcheck" || status=1
echo "history: self-check took $((SECONDS - start)) s"

if [ "$status" -eq 0 ]; then
	echo "history: PASSED (seed $SEED)"
else
	echo "history: FAILED (seed $SEED; replay with --seed $SEED)"
fi
exit "$status"
