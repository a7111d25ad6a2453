#!/bin/bash
#
# demo/run.sh: the lockfence end-to-end demonstration, in one command.
#
# Run as root on a Debian 12 machine:   demo/run.sh
#
# It installs what it needs with apt (only what is missing), builds and
# installs lockfence into the PostgreSQL found through PG_CONFIG (default:
# the system's /usr/lib/postgresql/15/bin/pg_config), starts throwaway
# servers (PostgreSQL, etcd, a Redis primary with one replica, ZooKeeper) in
# one temporary folder on 127.0.0.1 and free ports, and runs the scenarios
# of demo/scenarios.py against them.  Every process it started is stopped
# and the folder removed when it exits, also on failure or Ctrl-C.
#
# Exit status: 0 only when every scenario showed the expected rejections and
# no stale write was accepted.
#
# Environment:
#   PG_CONFIG          pg_config of the PostgreSQL to build against and run
#   LOCKFENCE_DEMO_KEEP=1   keep the temporary folder (logs) after the run
#   LOCKFENCE_DEMO_SCENARIOS  e.g. "0 2" to run only some scenarios

# The cleanup and the readiness probes are called through trap and wait_for.
# shellcheck disable=SC2317

set -euo pipefail

DEMO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$DEMO_DIR/.." && pwd)
PY=/usr/bin/python3

say() { printf '%s\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || die "run me as root (I install packages and start servers as user postgres)"

# It installs lockfence into the host's PostgreSQL, as test/run-all.sh
# does: one of them at a time per machine (scripts/run-lock.sh), unless
# run-all.sh started this demonstration and holds the lock already.
# shellcheck source=../scripts/run-lock.sh
. "$REPO_DIR/scripts/run-lock.sh"
take_run_lock demo || exit 2

# ---------------------------------------------------------------------------
# Packages: install only what is missing; apt-get update only if needed.
# ---------------------------------------------------------------------------
APT_UPDATED=
export DEBIAN_FRONTEND=noninteractive

installed() {
	[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

installed_version() {
	dpkg-query -W -f='${Version}' "$1" 2>/dev/null
}

apt_install() {
	if [ -z "$APT_UPDATED" ]; then
		apt-get update -qq >/dev/null
		APT_UPDATED=1
	fi
	say "demo: apt-get install $*"
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_packages() {
	local missing=() p want

	installed postgresql-15 || apt_install postgresql-15

	# Headers pinned to the installed server: an unpinned install of a newer
	# postgresql-server-dev-15 would upgrade the server under other users.
	want=$(installed_version postgresql-15)
	if ! installed postgresql-server-dev-15; then
		apt_install "postgresql-server-dev-15=$want"
	elif [ "$(installed_version postgresql-server-dev-15)" != "$want" ]; then
		say "demo: warning: postgresql-server-dev-15 $(installed_version postgresql-server-dev-15) does not match postgresql-15 $want; leaving it alone"
	fi

	for p in libcurl4-openssl-dev make gcc etcd-server etcd-client \
		redis-server zookeeper python3-psycopg python3-redis python3-kazoo; do
		installed "$p" || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		apt_install "${missing[@]}"
	fi
}

ensure_packages

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
[ -x "$PG_CONFIG" ] || die "PG_CONFIG=$PG_CONFIG is not executable"
PG_BIN=$("$PG_CONFIG" --bindir)

# ---------------------------------------------------------------------------
# The temporary folder and the cleanup trap.
# ---------------------------------------------------------------------------
T=$(mktemp -d /tmp/lockfence-demo.XXXXXX)
chmod 755 "$T"
PIDS=()		# "pid:start time" of each server started here
PG_STARTED=
# The scenarios' worker processes, recorded by scenarios.py the same way,
# so that none outlives the demo even if the driver itself is killed.
export LOCKFENCE_DEMO_PIDFILE=$T/workers.pids

# start_time PID: the process's start time (field 22 of /proc/PID/stat),
# which tells a process apart from a later one that reuses its pid
start_time() {
	local stat fields
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
	read -r -a fields <<<"${stat##*) }"
	echo "${fields[19]}"
}

# started PID: remember a server started in the background.  It is
# disowned so that bash does not announce the one the Redis scenario kills.
started() {
	PIDS+=("$1:$(start_time "$1")")
	disown "$1"
}

# ours PID:START: is that process still the one we started?
ours() {
	[ -n "${1#*:}" ] && [ "$(start_time "${1%%:*}")" = "${1#*:}" ]
}

cleanup() {
	local rc=$? p

	trap - EXIT INT TERM
	set +e
	if [ -s "$LOCKFENCE_DEMO_PIDFILE" ]; then
		while read -r p; do
			PIDS+=("$p")
		done <"$LOCKFENCE_DEMO_PIDFILE"
	fi
	for p in "${PIDS[@]}"; do
		ours "$p" || continue
		kill -CONT "${p%%:*}" 2>/dev/null
		kill -TERM "${p%%:*}" 2>/dev/null
	done
	if [ -n "$PG_STARTED" ]; then
		runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$T/pg" -m immediate \
			stop >/dev/null 2>&1
	fi
	for p in "${PIDS[@]}"; do
		# give each a few seconds, then insist
		for _ in $(seq 50); do
			ours "$p" || break
			sleep 0.1
		done
		ours "$p" && kill -KILL "${p%%:*}" 2>/dev/null
	done
	if [ "$rc" -ne 0 ] && [ "$rc" -ne 130 ] && [ "$rc" -ne 143 ] && [ -d "$T" ]; then
		for f in "$T"/*.log; do
			[ -s "$f" ] || continue
			printf '\n--- last lines of %s ---\n' "${f##*/}" >&2
			tail -n 15 "$f" >&2
		done
	fi
	if [ -n "${LOCKFENCE_DEMO_KEEP:-}" ]; then
		say "demo: kept $T"
	else
		rm -rf "$T"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------
# Build and install lockfence (from a copy, so the repo gets no root files).
# ---------------------------------------------------------------------------
say "demo: building lockfence with $PG_CONFIG"
mkdir "$T/build"
tar -C "$REPO_DIR" --exclude=.git --exclude='*.o' --exclude='*.bc' \
	--exclude='*.so' --exclude=tmp_check --exclude=tmp_regress \
	--exclude=tmp_isolation --exclude=results --exclude=demo -cf - . |
	tar -C "$T/build" -xf -
make -s -C "$T/build" PG_CONFIG="$PG_CONFIG" >"$T/build.log" 2>&1 ||
	{ cat "$T/build.log" >&2; die "make failed"; }
make -s -C "$T/build" PG_CONFIG="$PG_CONFIG" install >>"$T/build.log" 2>&1 ||
	{ cat "$T/build.log" >&2; die "make install failed"; }

# ---------------------------------------------------------------------------
# Free ports on 127.0.0.1 (all bound at once, so they differ).
# ---------------------------------------------------------------------------
read -r PG_PORT ETCD_PORT ETCD_PEER_PORT REDIS1_PORT REDIS2_PORT ZK_PORT < <(
	"$PY" - <<'EOF'
import socket
socks = []
for _ in range(6):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)

# wait_for DESCRIPTION SECONDS COMMAND...: poll until COMMAND succeeds
wait_for() {
	local what=$1 secs=$2 deadline
	shift 2
	deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || die "$what did not come up within ${secs}s"
		sleep 0.2
	done
}

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------
say "demo: starting PostgreSQL on 127.0.0.1:$PG_PORT, etcd on :$ETCD_PORT, Redis on :$REDIS1_PORT (replica :$REDIS2_PORT), ZooKeeper on :$ZK_PORT"
install -d -o postgres -g postgres -m 700 "$T/pg" "$T/pgsock"
runuser -u postgres -- "$PG_BIN/initdb" -D "$T/pg" -U postgres -A trust \
	--no-sync >"$T/initdb.log" 2>&1 || { cat "$T/initdb.log" >&2; die "initdb failed"; }
chmod 755 "$T/pgsock"
install -o postgres -g postgres -m 644 /dev/null "$T/postgres.log"
# Preloaded so that lockfence.metrics (when built in) has its shared memory.
PG_STARTED=1
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$T/pg" -l "$T/postgres.log" -w -t 60 \
	-o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $T/pgsock -c fsync=off -c shared_preload_libraries=lockfence" \
	start >/dev/null

# ---------------------------------------------------------------------------
# etcd (one member)
# ---------------------------------------------------------------------------
etcd --name demo --data-dir "$T/etcd" \
	--listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-cluster "demo=http://127.0.0.1:$ETCD_PEER_PORT" \
	>"$T/etcd.log" 2>&1 &
started $!
ETCD_PID=$!

# ---------------------------------------------------------------------------
# Redis primary and one replica (no persistence)
# ---------------------------------------------------------------------------
mkdir "$T/redis1" "$T/redis2"
redis-server --bind 127.0.0.1 --port "$REDIS1_PORT" --dir "$T/redis1" \
	--save '' --appendonly no --repl-diskless-sync-delay 0 \
	>"$T/redis-primary.log" 2>&1 &
started $!
REDIS1_PID=$!
redis-server --bind 127.0.0.1 --port "$REDIS2_PORT" --dir "$T/redis2" \
	--save '' --appendonly no --replicaof 127.0.0.1 "$REDIS1_PORT" \
	>"$T/redis-replica.log" 2>&1 &
started $!
REDIS2_PID=$!

# ---------------------------------------------------------------------------
# ZooKeeper, standalone, the way the package's zkServer.sh runs it
# (same main class family and classpath), in the foreground of a subshell.
# ---------------------------------------------------------------------------
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
ZK_CLASSPATH=/usr/share/java/zookeeper.jar
if [ -r /etc/zookeeper/conf_example/environment ]; then
	# shellcheck disable=SC1091
	ZK_CLASSPATH=$(. /etc/zookeeper/conf_example/environment && echo "$CLASSPATH")
fi
java -Xmx256m -Dzookeeper.log.dir="$T/zk" -cp "$ZK_CLASSPATH" \
	org.apache.zookeeper.server.ZooKeeperServerMain "$T/zk/zoo.cfg" \
	>"$T/zookeeper.log" 2>&1 &
started $!
ZK_PID=$!

# ---------------------------------------------------------------------------
# Wait until each server answers.
# ---------------------------------------------------------------------------
etcd_ok() { "$PY" -c "
import json, sys, urllib.request
h = json.load(urllib.request.urlopen('http://127.0.0.1:$ETCD_PORT/health', timeout=2))
sys.exit(0 if h.get('health') == 'true' else 1)"; }
redis_ok() { [ "$(redis-cli -p "$1" ping)" = PONG ]; }
replica_ok() { redis-cli -p "$REDIS2_PORT" info replication | grep -q 'master_link_status:up'; }
zk_ok() { "$PY" -c "
import socket, sys
s = socket.create_connection(('127.0.0.1', $ZK_PORT), 2)
s.sendall(b'ruok')
sys.exit(0 if s.recv(4) == b'imok' else 1)"; }

wait_for etcd 30 etcd_ok
wait_for "Redis primary" 20 redis_ok "$REDIS1_PORT"
wait_for "Redis replica" 20 redis_ok "$REDIS2_PORT"
wait_for "Redis replication" 30 replica_ok
wait_for ZooKeeper 60 zk_ok

# ---------------------------------------------------------------------------
# The scenarios
# ---------------------------------------------------------------------------
export LOCKFENCE_DEMO_PG="host=127.0.0.1 port=$PG_PORT user=postgres dbname=postgres"
export LOCKFENCE_DEMO_ETCD="http://127.0.0.1:$ETCD_PORT"
export LOCKFENCE_DEMO_REDIS_PRIMARY="$REDIS1_PORT:$REDIS1_PID"
export LOCKFENCE_DEMO_REDIS_REPLICA="$REDIS2_PORT:$REDIS2_PID"
export LOCKFENCE_DEMO_ZK="127.0.0.1:$ZK_PORT"
export LOCKFENCE_DEMO_ETCD_PID=$ETCD_PID LOCKFENCE_DEMO_ZK_PID=$ZK_PID

set +e
"$PY" "$DEMO_DIR/scenarios.py" "${LOCKFENCE_DEMO_SCENARIOS:-}"
rc=$?
set -e
exit "$rc"
