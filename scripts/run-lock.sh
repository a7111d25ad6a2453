# scripts/run-lock.sh: sourced by test/run-all.sh and demo/run.sh.
#
# One of them at a time per machine: both install lockfence into the
# machine's PostgreSQL installations (the host's 15, the chroots' 17 and
# 18), so two at once would test each other's libraries (a subset started
# beside a full run once failed that run's timing lane on 15).
#
# take_run_lock NAME waits for the lock, saying so, and holds it for as
# long as the calling shell lives (tail --pid ends within a second of it):
#  - in a process of its own, in a session of its own (setsid), so that a
#    Ctrl-C or a signal to the caller's process group does not give the
#    lock up while the caller's traps still stop servers and unmount;
#  - that the caller's children do not inherit (flock -o), so a server
#    left behind cannot keep the next run waiting;
#  - in /run, which only root may write: a lock file in /tmp could be
#    created, or held, by any user.
# A script started by one that holds the lock (the demonstration inside
# run-all.sh) finds LOCKFENCE_RUN_LOCK_HELD set and takes nothing.

take_run_lock() {
	local who=$1 dir=/run lock line

	[ -n "${LOCKFENCE_RUN_LOCK_HELD:-}" ] && return 0
	[ -d "$dir" ] || dir=/var/cache
	lock=$dir/lockfence-run-all.lock
	if ! flock -n -o "$lock" true; then
		echo "$who: another test/run-all.sh or demo/run.sh is using this machine's PostgreSQL installations; waiting for it to end" >&2
	fi
	exec {RUN_LOCK_FD}< <(exec setsid flock -o "$lock" \
		sh -c 'echo held; exec tail --pid="$1" -f /dev/null' _ "$$")
	if ! read -r line <&"$RUN_LOCK_FD" || [ "$line" != held ]; then
		echo "$who: could not take the lock $lock" >&2
		return 1
	fi
	export LOCKFENCE_RUN_LOCK_HELD=1
}
