#!/usr/bin/env bash
# patroni-on-role-change.sh: Patroni callback that raises lockfence's fences
# to a floor when this node becomes the primary.
#
# Why: after a failover to an asynchronous standby that was behind, fence
# advances the old primary acknowledged are lost, and tokens it rejected
# would be accepted again.  Raising every fence above every token issued
# before the failover rejects them again (their holders must acquire their
# locks again: LF001).  See docs/ha.md.
#
# Opt-in, in patroni.yml (Patroni appends: ACTION ROLE CLUSTER):
#
#   postgresql:
#     callbacks:
#       on_role_change: /usr/local/bin/patroni-on-role-change.sh
#
# Settings, from the environment (Patroni's own, or an `env NAME=value`
# prefix in the callback line: Patroni splits it like a shell would):
#   LOCKFENCE_FLOOR      "etcd" (default): lockfence.etcd_raise_floor(), the
#                        floor is the revision of the etcd cluster the
#                        locks come from, read through each database's
#                        lockfence.etcd_endpoints; a number N:
#                        lockfence.raise_floor(N), for other lock services
#                        (N must exceed every token issued so far); "off":
#                        log and do nothing.
#   LOCKFENCE_DATABASES  databases to raise (space-separated); default:
#                        every database that has the lockfence extension.
#   LOCKFENCE_RESOURCES  raise only these resources (space-separated),
#                        creating a fence at the floor for those the
#                        failover lost entirely; default: every fence of
#                        each database.  Use it when other resources take
#                        tokens from another lock service.
#   LOCKFENCE_TIMEOUT    seconds the whole run may take (default 60): the
#                        script waits at most that long for the promotion to
#                        complete and for each statement, then gives up.
#   LOCKFENCE_LOG        a file to append the log lines to (they always go
#                        to standard error too, i.e. Patroni's log).
#   PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSFILE...: how psql reaches the local
#                        server (libpq's variables), as a superuser or a role
#                        granted EXECUTE on the floor functions.
#
# Safe to run twice: a floor only ever raises fences.  A second run with
# LOCKFENCE_FLOOR=etcd reads a newer revision, so holders that acquired
# their lock since the first run must acquire it again too.
#
# Exit status: 0 when there was nothing to do or every database was raised;
# 1 otherwise (Patroni logs it; the promotion itself is never blocked:
# Patroni runs callbacks in the background, after pg_ctl promote).
set -uo pipefail

action=${1:-}
role=${2:-}
cluster=${3:-}

floor=${LOCKFENCE_FLOOR:-etcd}
timeout=${LOCKFENCE_TIMEOUT:-60}
logfile=${LOCKFENCE_LOG:-}
started=$(date +%s)

log() {
	local line
	line="$(date -u '+%Y-%m-%d %H:%M:%S UTC') lockfence on_role_change[$$]: $*"
	echo "$line" >&2
	if [ -n "$logfile" ]; then
		echo "$line" >>"$logfile" 2>/dev/null || true
	fi
}

remaining() {
	echo $((started + timeout - $(date +%s)))
}

# Run one SQL statement with bounded connect and statement time; prints
# unaligned tuples only.
run_sql() {
	local db=$1 sql=$2 left
	left=$(remaining)
	[ "$left" -gt 0 ] || return 124
	PGCONNECT_TIMEOUT=$((left < 10 ? (left < 2 ? 2 : left) : 10)) \
		PGOPTIONS="-c statement_timeout=${left}s -c lock_timeout=${left}s ${PGOPTIONS:-}" \
		psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$db" -c "$sql"
}

case "$timeout" in
'' | *[!0-9]*)
	log "LOCKFENCE_TIMEOUT must be a number of seconds, not \"$timeout\""
	exit 1
	;;
esac

if [ "$action" != on_role_change ] || { [ "$role" != master ] && [ "$role" != primary ]; }; then
	log "nothing to do for action \"$action\", role \"$role\" (cluster \"$cluster\")"
	exit 0
fi

# Resources to create at the floor, as an SQL array literal.
resources_sql=NULL
if [ -n "${LOCKFENCE_RESOURCES:-}" ]; then
	read -r -a names <<<"$LOCKFENCE_RESOURCES"
	resources_sql="ARRAY["
	for r in "${names[@]}"; do
		resources_sql+="'${r//\'/\'\'}',"
	done
	resources_sql="${resources_sql%,}]::text[]"
fi

case "$floor" in
off)
	log "promoted (cluster \"$cluster\"), LOCKFENCE_FLOOR=off: fences left as they are"
	exit 0
	;;
etcd)
	floor_sql="SELECT 'floor=' || floor || ' raised=' || raised
	             FROM lockfence.etcd_raise_floor($resources_sql)"
	;;
'' | *[!0-9]*)
	log "LOCKFENCE_FLOOR must be etcd, off or a number, not \"$floor\""
	exit 1
	;;
*)
	floor_sql="SELECT 'floor=$floor raised=' || lockfence.raise_floor($floor, $resources_sql)"
	;;
esac

log "promoted (cluster \"$cluster\"): raising lockfence fences (floor: $floor, at most ${timeout}s)"

# Patroni calls us right after pg_ctl promote, without waiting: the server
# may still be leaving recovery.  The floor must be read and written after
# that, never before.
while :; do
	if out=$(run_sql "${PGDATABASE:-postgres}" "SELECT pg_is_in_recovery()" 2>&1) && [ "$out" = f ]; then
		break
	fi
	if [ "$(remaining)" -le 0 ]; then
		log "gave up: the server did not leave recovery within ${timeout}s (last answer: ${out:-none})"
		exit 1
	fi
	sleep 0.2
done

databases=()
if [ -n "${LOCKFENCE_DATABASES:-}" ]; then
	read -r -a databases <<<"$LOCKFENCE_DATABASES"
else
	if ! list=$(run_sql "${PGDATABASE:-postgres}" "SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname" 2>&1); then
		log "failed: cannot list databases: $list"
		exit 1
	fi
	while IFS= read -r db; do
		[ -n "$db" ] || continue
		if has=$(run_sql "$db" "SELECT count(*) FROM pg_extension WHERE extname = 'lockfence'" 2>&1) && [ "$has" = 1 ]; then
			databases+=("$db")
		fi
	done <<<"$list"
fi

if [ ${#databases[@]} -eq 0 ]; then
	log "no database has the lockfence extension: nothing to raise"
	exit 0
fi

status=0
for db in "${databases[@]}"; do
	if out=$(run_sql "$db" "$floor_sql" 2>&1); then
		log "database \"$db\": $out"
	else
		log "database \"$db\": FAILED, fences not raised: $(echo "$out" | tr '\n' ' ')"
		status=1
	fi
done
exit $status
