#!/usr/bin/env bash
# chroot.sh: the Debian chroot in which lockfence is tested on PostgreSQL
# 17 (Debian 13 "trixie") and 18 (Debian unstable "sid", pinned low), on a
# Debian 12 machine whose own PostgreSQL is 15.
#
#   scripts/chroot.sh build          build the chroot unless it is cached
#   scripts/chroot.sh run CMD...     run CMD inside it as root (mounts, runs,
#                                    unmounts)
#   scripts/chroot.sh shell          an interactive shell inside it
#   scripts/chroot.sh path           print its folder
#
# test/run-all.sh sources this file and uses the chroot_* functions.
#
# The chroot is made with debootstrap from the mirror this machine's apt
# already uses (/etc/apt/sources.list.d/debian.sources or sources.list): no
# host name is written here.  It is cached in $LOCKFENCE_CHROOT_CACHE
# (default /var/cache/lockfence-chroots) and reused by later runs.  A stamp
# file, written only after a complete build and holding a hash of the
# recipe below, marks it usable: a half-built chroot (interrupted build) or
# one built from an older recipe is thrown away and rebuilt.
#
# Inside, the server needs /proc and /dev/shm; they are mounted while a
# command runs and always unmounted afterwards, also on failure or
# interrupt (the caller's trap calls chroot_leave).  Use of the chroot is
# serialised with a lock, so two runs never unmount under each other.
#
# etcd: Debian 12's etcd 3.4 (the gateway the extension speaks, see the
# notes) is what every major is tested against.  trixie's etcd-server is
# 3.5; instead of installing it, the host's static etcd and etcdctl
# binaries are copied into the chroot each time it is entered.

LOCKFENCE_CHROOT_CACHE=${LOCKFENCE_CHROOT_CACHE:-/var/cache/lockfence-chroots}
CHROOT_SUITE=trixie
CHROOT_ROOT=$LOCKFENCE_CHROOT_CACHE/$CHROOT_SUITE
CHROOT_STAMP=$CHROOT_ROOT/.lockfence-chroot-complete

# What the suites need.  Changing these lists changes the recipe hash, so
# cached chroots are rebuilt.
CHROOT_PACKAGES=(
	make gcc libc6-dev libcurl4-openssl-dev libipc-run-perl perl
	openssl python3 python3-yaml procps ca-certificates
	prometheus-postgres-exporter
	pgbouncer	# 19, 71 (pgbouncer in transaction pooling)
	git	# 07 (make dist archives the git HEAD)
	postgresql-17 postgresql-server-dev-17
)
CHROOT_SID_PACKAGES=(postgresql-18 postgresql-server-dev-18)
# The majors the chroot holds, for callers (test/run-all.sh).
# shellcheck disable=SC2034
CHROOT_MAJORS="17 18"

chroot_say() { printf 'chroot: %s\n' "$*" >&2; }

# The recipe: any change to it invalidates cached chroots.
chroot_recipe() {
	printf '%s\n' "suite=$CHROOT_SUITE" "packages=${CHROOT_PACKAGES[*]}" \
		"sid=${CHROOT_SID_PACKAGES[*]}" "recipe=3" | sha256sum | cut -c1-16
}

# The Debian mirror this machine's apt uses, from deb822 sources (URIs:)
# or a one-line sources.list, the first one that is not a security mirror.
chroot_mirror() {
	local f uri
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }' "$f" |
			grep -v -- '-security' | head -1)
		[ -n "$uri" ] && { echo "$uri"; return 0; }
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break } }' "$f" |
			grep -v -- '-security' | head -1)
		[ -n "$uri" ] && { echo "$uri"; return 0; }
	done
	return 1
}

# Mount points under DIR, deepest first.
chroot_mounts_under() {
	awk -v d="$1" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r
}

chroot_umount_all() {
	local dir=$1 m
	for m in $(chroot_mounts_under "$dir"); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null ||
			chroot_say "could not unmount $m"
	done
}

# Stop every process whose root is the chroot (servers a suite started and
# left behind when it was interrupted): by pid, TERM then KILL.
chroot_kill_inside() {
	local dir=$1 p pids=() root
	for p in /proc/[0-9]*; do
		root=$(readlink "$p/root" 2>/dev/null) || continue
		[ "$root" = "$dir" ] && pids+=("${p#/proc/}")
	done
	[ ${#pids[@]} -eq 0 ] && return 0
	chroot_say "stopping ${#pids[@]} process(es) left inside the chroot"
	kill -TERM "${pids[@]}" 2>/dev/null
	local alive=()
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		alive=()
		for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
		[ ${#alive[@]} -eq 0 ] && return 0
		sleep 0.5
	done
	kill -KILL "${alive[@]}" 2>/dev/null
	return 0
}

# Remove a chroot folder safely: never while something is mounted in it
# (a bind-mounted /dev/shm would otherwise be emptied on the host).
chroot_remove() {
	local dir=$1
	[ -e "$dir" ] || return 0
	chroot_kill_inside "$dir"
	chroot_umount_all "$dir"
	if [ -n "$(chroot_mounts_under "$dir")" ]; then
		chroot_say "refusing to remove $dir: still mounted"
		return 1
	fi
	rm -rf --one-file-system "$dir"
}

chroot_apt() {
	chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
		DEBIAN_FRONTEND=noninteractive apt-get -q -y \
		-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false \
		"${@:2}"
}

# Build the chroot into a temporary folder, then move it into place and
# write the stamp: only a complete build is ever used.
chroot_build() {
	local mirror tmp=$CHROOT_ROOT.building t0=$SECONDS
	mirror=$(chroot_mirror) || { chroot_say "no Debian mirror found in /etc/apt"; return 1; }
	command -v debootstrap >/dev/null || {
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
			{ chroot_say "cannot install debootstrap"; return 1; }
	}
	chroot_remove "$tmp" || return 1
	chroot_remove "$CHROOT_ROOT" || return 1
	mkdir -p "$LOCKFENCE_CHROOT_CACHE"
	chroot_say "building $CHROOT_SUITE chroot in $CHROOT_ROOT (mirror from /etc/apt)"
	CHROOT_BUILDING=$tmp
	debootstrap --variant=minbase "$CHROOT_SUITE" "$tmp" "$mirror" >"$LOCKFENCE_CHROOT_CACHE/debootstrap.log" 2>&1 ||
		{ chroot_say "debootstrap failed, see $LOCKFENCE_CHROOT_CACHE/debootstrap.log"; tail -20 "$LOCKFENCE_CHROOT_CACHE/debootstrap.log" >&2; return 1; }
	cat >"$tmp/etc/apt/sources.list" <<-EOF
		deb $mirror $CHROOT_SUITE main
		deb $mirror sid main
	EOF
	rm -f "$tmp"/etc/apt/sources.list.d/*.sources
	# sid only for what is asked for explicitly (-t unstable).
	cat >"$tmp/etc/apt/preferences.d/sid" <<-EOF
		Package: *
		Pin: release n=sid
		Pin-Priority: 100
	EOF
	# Nothing is started by package installation inside the chroot.
	printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
	chmod 755 "$tmp/usr/sbin/policy-rc.d"
	# No cluster is created by the server packages: the tests make their own.
	mkdir -p "$tmp/etc/postgresql-common/createcluster.d"
	echo "create_main_cluster = false" >"$tmp/etc/postgresql-common/createcluster.d/lockfence.conf"
	cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null
	mount -t proc proc "$tmp/proc" || return 1
	chroot_apt "$tmp" update >/dev/null &&
		chroot_apt "$tmp" install "${CHROOT_PACKAGES[@]}" >/dev/null &&
		chroot_apt "$tmp" install -t unstable "${CHROOT_SID_PACKAGES[@]}" >/dev/null &&
		chroot_apt "$tmp" clean
	local rc=$?
	chroot_umount_all "$tmp"
	[ $rc -eq 0 ] || { chroot_say "package installation failed"; return 1; }
	mv "$tmp" "$CHROOT_ROOT" || return 1
	CHROOT_BUILDING=
	chroot_recipe >"$CHROOT_STAMP"
	chroot_say "chroot built in $((SECONDS - t0)) s"
}

chroot_is_built() {
	[ -f "$CHROOT_STAMP" ] && [ "$(cat "$CHROOT_STAMP")" = "$(chroot_recipe)" ]
}

# Take the lock (held until the calling process exits) and build the
# chroot if it is missing, half-built or from an older recipe.
chroot_ensure() {
	mkdir -p "$LOCKFENCE_CHROOT_CACHE"
	exec {CHROOT_LOCK_FD}>"$LOCKFENCE_CHROOT_CACHE/.lock"
	if ! flock -n "$CHROOT_LOCK_FD"; then
		chroot_say "waiting for another run using the chroot"
		flock "$CHROOT_LOCK_FD" || return 1
	fi
	chroot_is_built || chroot_build
}

# Empty the chroot's /tmp: only runs holding the lock use the chroot, so
# whatever is there was left by an earlier run (sockets folders of
# interrupted tests).
chroot_clean_tmp() {
	find "$CHROOT_ROOT/tmp" -mindepth 1 -maxdepth 1 -xdev -exec rm -rf --one-file-system {} + 2>/dev/null
	return 0
}

# Mount what the server needs and install the host's etcd binaries, and
# promtool (docs/monitoring.md's rule tests, TAP 95): Go binaries that need
# only libc, whose chroot copy (trixie's) is newer than the host's.  Copied
# rather than installed, so the chroot's recipe (and cache) is unchanged.
chroot_enter() {
	CHROOT_ENTERED=1
	chroot_clean_tmp
	mountpoint -q "$CHROOT_ROOT/proc" || mount -t proc proc "$CHROOT_ROOT/proc" || return 1
	mkdir -p "$CHROOT_ROOT/dev/shm"
	mountpoint -q "$CHROOT_ROOT/dev/shm" || mount -t tmpfs -o mode=1777 shm "$CHROOT_ROOT/dev/shm" || return 1
	cp /etc/resolv.conf "$CHROOT_ROOT/etc/resolv.conf" 2>/dev/null
	local b
	for b in etcd etcdctl promtool; do
		[ -x "/usr/bin/$b" ] && cp -p "/usr/bin/$b" "$CHROOT_ROOT/usr/bin/$b"
	done
	return 0
}

# Undo chroot_enter (and a build in progress): stop leftovers, unmount.
# Safe to call more than once and from a trap.
chroot_leave() {
	if [ -n "${CHROOT_ENTERED:-}" ]; then
		chroot_kill_inside "$CHROOT_ROOT"
		chroot_umount_all "$CHROOT_ROOT"
		chroot_clean_tmp
		CHROOT_ENTERED=
	fi
	if [ -n "${CHROOT_BUILDING:-}" ]; then
		chroot_kill_inside "$CHROOT_BUILDING"
		chroot_umount_all "$CHROOT_BUILDING"
		CHROOT_BUILDING=
	fi
}

# Run a command inside the entered chroot, in the background and waited
# for, so that the caller's INT/TERM trap runs at once.
chroot_exec() {
	# (the run inside is part of the caller's, which holds the run lock:
	# scripts/run-lock.sh)
	chroot "$CHROOT_ROOT" env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		LANG=C.UTF-8 HOME=/root TERM="${TERM:-dumb}" \
		LOCKFENCE_RUN_LOCK_HELD="${LOCKFENCE_RUN_LOCK_HELD:-}" "$@" &
	CHROOT_CHILD=$!
	wait "$CHROOT_CHILD"
	local rc=$?
	CHROOT_CHILD=
	return $rc
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -uo pipefail
	[ "$(id -u)" -eq 0 ] || { chroot_say "run as root"; exit 1; }
	trap 'chroot_leave' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	case "${1:-}" in
	build) chroot_ensure ;;
	path) echo "$CHROOT_ROOT" ;;
	run)
		shift
		chroot_ensure && chroot_enter && chroot_exec "$@"
		;;
	shell)
		chroot_ensure && chroot_enter && chroot "$CHROOT_ROOT" /bin/bash
		;;
	*)
		echo "usage: $0 build | run CMD... | shell | path" >&2
		exit 2
		;;
	esac
fi
