#!/usr/bin/env bash
# patroni-on-role-change.sh: Patroni callback that raises lockfence's fences
# to a floor when this node becomes the primary.
#
# Why: after a failover to an asynchronous standby that was behind, fence
# advances the old primary acknowledged are lost, and tokens it rejected
# would be accepted again.  Raising every fence above every token issued
# before the failover rejects them again (their holders must acquire their
# locks again: LF001).  Since lockfence 1.4 the promoted server refuses every
# fenced write and lease operation (LF004) from the promotion until this
# runs, so no superseded token is accepted in between; raising the floor
# (without LOCKFENCE_RESOURCES) lifts that refusal.  See docs/ha.md.
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
#                        each database, and the floor of every name without
#                        a row.  Use it when other resources take tokens
#                        from another lock service: fenced writes then stay
#                        refused (LF004) until an operator raises the other
#                        resources and calls lockfence.accept_promotion().
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

# Run psql with bounded connect and statement time, the script on standard
# input; prints unaligned tuples only.
run_psql() {
	local db=$1 left
	left=$(remaining)
	[ "$left" -gt 0 ] || return 124
	PGCONNECT_TIMEOUT=$((left < 10 ? (left < 2 ? 2 : left) : 10)) \
		PGOPTIONS="-c statement_timeout=${left}s -c lock_timeout=${left}s ${PGOPTIONS:-}" \
		psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$db" -f -
}

# One session per database: wait for the end of recovery (Patroni calls us
# right after pg_ctl promote, without waiting: the floor must be read and
# written after the promotion, never before), then raise the floor if the
# database has lockfence ("raised:..."; "none:" if not).  With list=1, first
# print the other databases to visit ("db:NAME").  Each statement is its
# own transaction: one begun during recovery could not write.
raise_in() {
	local db=$1 list=$2
	{
		# raise_floor refuses a transaction snapshot (a database or role
		# may default to REPEATABLE READ)
		echo "SET default_transaction_isolation = 'read committed';"
		echo 'DO $w$ BEGIN WHILE pg_catalog.pg_is_in_recovery() LOOP PERFORM pg_catalog.pg_sleep(0.02); END LOOP; END $w$;'
		if [ "$list" = 1 ]; then
			echo "SELECT 'db:' || datname FROM pg_catalog.pg_database WHERE datallowconn AND datname <> pg_catalog.current_database() ORDER BY datname;"
		fi
		echo "SELECT count(*) = 1 AS has_lockfence FROM pg_catalog.pg_extension WHERE extname = 'lockfence' \\gset"
		echo '\if :has_lockfence'
		echo "$floor_sql;"
		echo '\else'
		echo "SELECT 'none:';"
		echo '\endif'
	} | run_psql "$db"
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
	floor_sql="SELECT 'raised:floor=' || floor || ' raised=' || raised
	             FROM lockfence.etcd_raise_floor($resources_sql)"
	;;
'' | *[!0-9]*)
	log "LOCKFENCE_FLOOR must be etcd, off or a number, not \"$floor\""
	exit 1
	;;
*)
	floor_sql="SELECT 'raised:floor=$floor raised=' || lockfence.raise_floor($floor, $resources_sql)"
	;;
esac

log "promoted (cluster \"$cluster\"): raising lockfence fences (floor: $floor, at most ${timeout}s)"

# Until the floor is raised (or accept_promotion() called) the promoted
# server refuses every fenced write and lease operation with LF004, so
# writers are safe meanwhile; raising it lifts the refusal.  One connection
# for the first database; with LOCKFENCE_DATABASES unset, it lists the others
# too, visited one connection each.
status=0
found=0
first=${PGDATABASE:-postgres}
list=1
todo=()
if [ -n "${LOCKFENCE_DATABASES:-}" ]; then
	read -r -a todo <<<"$LOCKFENCE_DATABASES"
	first=${todo[0]}
	todo=("${todo[@]:1}")
	list=0
fi

# Log the outcome of raise_in for database $1 (output $2, exit status $3).
report() {
	local db=$1 out=$2 rc=$3 line
	if [ "$rc" -ne 0 ]; then
		log "database \"$db\": FAILED, fences not raised: $(echo "$out" | tr '\n' ' ')"
		status=1
		return
	fi
	line=$(grep -m1 '^raised:' <<<"$out")
	if [ -n "$line" ]; then
		log "database \"$db\": ${line#raised:}"
		found=$((found + 1))
	fi
}

# The first connection may be refused while the server starts: retry it.
while :; do
	out=$(raise_in "$first" "$list" 2>&1)
	rc=$?
	[ $rc -eq 0 ] && break
	if [ "$(remaining)" -le 0 ]; then
		log "gave up: database \"$first\" did not answer, or the server did not leave recovery, within ${timeout}s (last answer: $(echo "${out:-none}" | tr '\n' ' '))"
		exit 1
	fi
	case "$out" in
	*"could not connect"* | *"the database system is"* | *"Connection refused"*) sleep 0.2 ;;
	*) break ;;
	esac
done
report "$first" "$out" $rc
if [ "$list" = 1 ]; then
	while IFS= read -r line; do
		case "$line" in db:?*) todo+=("${line#db:}") ;; esac
	done <<<"$out"
fi

for db in "${todo[@]}"; do
	out=$(raise_in "$db" 0 2>&1)
	report "$db" "$out" $?
done

if [ $found -eq 0 ] && [ $status -eq 0 ]; then
	log "no database has the lockfence extension: nothing to raise"
	exit 0
fi
if [ -n "${LOCKFENCE_RESOURCES:-}" ] && [ $status -eq 0 ]; then
	log "only LOCKFENCE_RESOURCES were raised: fenced writes stay refused (LF004) until lockfence.raise_floor(N) or, once the other resources are safe, lockfence.accept_promotion() runs in each database"
fi
exit $status
