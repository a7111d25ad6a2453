#!/usr/bin/env bash
# repmgr-promote.sh: promote this repmgr standby, then raise lockfence's
# fence floor in every database that has the extension.
#
# Why: repmgr's default replication is asynchronous, so a failover can lose
# fence advances the old primary acknowledged.  Since lockfence 1.4 the
# promoted server refuses every fenced write and lease operation (LF004)
# until the floor is raised: this script raises it as soon as the promotion
# completed (see docs/ha.md, "Per manager").
#
# Use it where `repmgr standby promote` would run, with the same arguments:
#
#   repmgr.conf (repmgrd):
#     promote_command='/usr/local/bin/repmgr-promote.sh -f /etc/repmgr.conf --log-to-file'
#   by hand, on the standby to promote:
#     repmgr-promote.sh -f /etc/repmgr.conf
#
# It runs `repmgr standby promote "$@"`, and when that succeeded,
# patroni-on-role-change.sh (next to this script, or LOCKFENCE_ON_ROLE_CHANGE)
# as if Patroni had made this node the primary: the same settings apply
# (LOCKFENCE_FLOOR, LOCKFENCE_DATABASES, LOCKFENCE_RESOURCES,
# LOCKFENCE_TIMEOUT, LOCKFENCE_LOG, and PGHOST, PGPORT, PGUSER... for how
# psql reaches the local server as a superuser or a role granted the floor
# functions).  Also:
#   REPMGR     the repmgr program (default: repmgr on PATH).
#
# Exit status: repmgr's.  A floor that could not be raised is logged but
# does not fail the promotion (repmgrd would take the node for unpromoted):
# the server then keeps refusing fenced writes with LF004, which is safe,
# and lockfence's floor_required gauge and LockfenceFloorNotRaised alert
# tell an operator to run the floor by hand.
set -uo pipefail

repmgr=${REPMGR:-repmgr}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
callback=${LOCKFENCE_ON_ROLE_CHANGE:-$here/patroni-on-role-change.sh}

"$repmgr" standby promote "$@"
rc=$?
if [ $rc -ne 0 ]; then
	echo "repmgr-promote.sh: repmgr standby promote failed (exit $rc): lockfence floor not raised" >&2
	exit $rc
fi

if ! "$callback" on_role_change primary repmgr; then
	echo "repmgr-promote.sh: promoted, but the lockfence floor was not raised: fenced writes get LF004 until an operator raises it (docs/ha.md)" >&2
fi
exit 0
