#!/bin/bash
#
# etcd_cycle.sh - run the etcd lock/unlock cycle benchmark end to end.
#
# Starts a private single-member etcd (Debian's etcd-server, fsync on) and a
# private PostgreSQL (from $PG_CONFIG's bindir, where lockfence must be
# installed) in a temporary folder on loopback, then runs etcd_cycle.py,
# which measures lockfence from SQL against floor clients side by side: the
# C floors in bench/etcd_floor.c (built here with cc and libcurl: a lease
# per cycle, a session lease uncontended, etcd's lock service on a session
# lease, the Mutex protocol with a synced watch) and the same synced-watch
# Mutex client in Python.  Everything started here is stopped on exit,
# whatever happens.
#
# Usage: PG_CONFIG=/path/to/pg_config bench/etcd_cycle.sh [etcd_cycle.py options]
#   e.g. bench/etcd_cycle.sh --holders 1,8,32 --seconds 5 --rounds 3
#        bench/etcd_cycle.sh --clients lockfence,watch-c --holders 8
# Run as root it re-runs itself as user postgres (initdb refuses root).
#
# IDENTIFICATION
#	  bench/etcd_cycle.sh
#
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}

if [ "$(id -u)" = 0 ]; then
	exec runuser -u postgres -- env PG_CONFIG="$PG_CONFIG" "$0" "$@"
fi

BIN=$("$PG_CONFIG" --bindir)
T=$(mktemp -d /tmp/lf_etcd_bench.XXXXXX)
ETCD_PID=

cleanup()
{
	set +e
	if [ -n "$ETCD_PID" ]; then
		kill "$ETCD_PID" 2>/dev/null
		wait "$ETCD_PID" 2>/dev/null
	fi
	if [ -f "$T/pg/postmaster.pid" ]; then
		"$BIN/pg_ctl" -D "$T/pg" -m immediate stop >/dev/null 2>&1
	fi
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port()
{
	/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

CP=$(free_port)
PP=$(free_port)
while [ "$PP" = "$CP" ]; do PP=$(free_port); done
PGP=$(free_port)

etcd --name bench --data-dir "$T/etcd" \
	--listen-client-urls "http://127.0.0.1:$CP" --advertise-client-urls "http://127.0.0.1:$CP" \
	--listen-peer-urls "http://127.0.0.1:$PP" --initial-advertise-peer-urls "http://127.0.0.1:$PP" \
	--initial-cluster "bench=http://127.0.0.1:$PP" >"$T/etcd.log" 2>&1 &
ETCD_PID=$!

for i in $(seq 1 100); do
	if ETCDCTL_API=3 etcdctl --endpoints="http://127.0.0.1:$CP" endpoint health >/dev/null 2>&1; then
		break
	fi
	[ "$i" = 100 ] && { echo "etcd did not start"; tail "$T/etcd.log"; exit 1; }
	sleep 0.1
done

"$BIN/initdb" -D "$T/pg" -A trust -U postgres >"$T/initdb.log" 2>&1
cat >>"$T/pg/postgresql.conf" <<EOF
listen_addresses = ''
port = $PGP
unix_socket_directories = '$T'
max_connections = 80
lockfence.etcd_endpoints = 'http://127.0.0.1:$CP'
EOF
"$BIN/pg_ctl" -D "$T/pg" -l "$T/pg.log" -w start >/dev/null
"$BIN/psql" -X -q -h "$T" -p "$PGP" -U postgres -d postgres -c 'CREATE EXTENSION lockfence'

# The floors: minimal C clients (libcurl, kept-alive connections), and the
# C driver of lockfence (libpq).
PQLIB=$("$PG_CONFIG" --libdir)
cc -O2 -Wall -I"$("$PG_CONFIG" --includedir)" -o "$T/etcd_floor" "$HERE/etcd_floor.c" \
	$(curl-config --libs) -L"$PQLIB" -Wl,-rpath,"$PQLIB" -lpq

echo "etcd $(etcd --version | head -1 | awk '{print $3}'), PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 "$HERE/etcd_cycle.py" --etcd "http://127.0.0.1:$CP" --floor-bin "$T/etcd_floor" \
	--dsn "host=$T port=$PGP user=postgres dbname=postgres" "$@"
