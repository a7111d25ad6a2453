#!/usr/bin/env bash
# install-deps.sh: install, with apt-get, everything lockfence needs to build
# and to run its tests and demonstration on Debian 12.  Idempotent: packages
# already present are not fetched again.  Must run as root.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps.sh: run as root (it uses apt-get)" >&2
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive

packages=(
	make gcc
	debootstrap	# the PostgreSQL 17 and 18 chroot (scripts/chroot.sh)
	postgresql-15 postgresql-client-15
	libcurl4-openssl-dev
	libipc-run-perl
	etcd-server etcd-client
	pgbouncer
	redis-server
	zookeeper
	python3-psycopg python3-redis python3-kazoo python3-yaml
	prometheus-postgres-exporter prometheus
	pgbouncer
	patroni python3-etcd
	postgresql-15-repmgr repmgr	# test/t/90_repmgr_failover_floor.pl
	openssl
	pgbouncer
	# the assert-enabled PostgreSQL of scripts/pg-assert.sh: apt-get source
	# (dpkg-dev) and PostgreSQL's build needs; valgrind for its
	# memcheck.h (USE_VALGRIND) and the valgrind suite
	dpkg-dev bison flex libreadline-dev zlib1g-dev perl valgrind
	# the fuzzers (fuzz/run.sh): clang and libFuzzer with its sanitizer
	# runtimes (-fsanitize=fuzzer needs libclang-rt-14-dev on Debian 12)
	clang libclang-rt-14-dev
	# Citus' build (scripts/citus.sh), for the Citus suites
	liblz4-dev libzstd-dev libkrb5-dev libssl-dev
	stress-ng	# STRESS=1 bash test/run-all.sh: the run under a CPU hog
)

installed() {
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=()
for p in "${packages[@]}"; do
	installed "$p" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ] || ! installed postgresql-server-dev-15; then
	apt-get update -qq
	if [ ${#missing[@]} -gt 0 ]; then
		apt-get install -y -qq "${missing[@]}" >/dev/null
	fi
fi

# The server headers must match the installed server exactly: an unpinned
# install of postgresql-server-dev-15 would upgrade the server as well.
if ! installed postgresql-server-dev-15; then
	server_version=$(dpkg-query -W -f='${Version}' postgresql-15)
	apt-get install -y -qq \
		"postgresql-server-dev-15=$server_version" >/dev/null
fi
