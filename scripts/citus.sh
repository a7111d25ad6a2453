#!/usr/bin/env bash
# citus.sh: Citus, built from its released source, for lockfence's Citus
# test suites (test/t/96_citus.pl).  Citus is used by the tests only: it is
# never linked into lockfence nor shipped with it (AGPL-3.0).
#
#   scripts/citus.sh check           is a build possible (or cached)?  Prints
#                                    the reason and exits 3 when not, so the
#                                    test command counts the Citus suites as
#                                    SKIPPED with that reason
#   scripts/citus.sh build           build it unless a finished build exists
#   scripts/citus.sh install PG_CONFIG
#                                    copy the staged library and extension
#                                    files into that installation (works for
#                                    relocated copies such as /opt/pg-NAME)
#   scripts/citus.sh path            print the staged build's directory
#
# The source is taken from $CITUS_SRC, else from ../shared/vendor/citus
# beside the repository, else from /work/shared/vendor/citus.  A source
# directory holds citus-<version>.tar.gz with a SHA256SUMS file (checked
# before anything is unpacked), or is an unpacked Citus tree (has
# configure; not checked).
#
# The build is against the host's PostgreSQL 15 ($CITUS_BUILD_PG_CONFIG,
# default /usr/lib/postgresql/15/bin/pg_config), installed into a stage
# (make install DESTDIR=...), and kept in
# $LOCKFENCE_CITUS_CACHE/<version>-pg<major>/ (default
# /var/cache/lockfence-citus).  It is built under a lock in a scratch
# directory and renamed into place when complete, so an interrupted build
# leaves nothing that looks finished and two runs never build at once.
#
# Must run as root for build and install.
set -euo pipefail

CITUS_VERSION=${CITUS_VERSION:-13.2.2}
CITUS_CACHE=${LOCKFENCE_CITUS_CACHE:-/var/cache/lockfence-citus}
CITUS_BUILD_PG_CONFIG=${CITUS_BUILD_PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
CITUS_JOBS=${CITUS_JOBS:-2}
# Bump when the recipe below changes in a way the directory name cannot see.
CITUS_RECIPE_REV=1

citus_say() { echo "citus: $*" >&2; }

citus_repo() { cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd; }

citus_pg_major() {
	local v
	v=$("$CITUS_BUILD_PG_CONFIG" --version 2>/dev/null) ||
		{ citus_say "no pg_config at $CITUS_BUILD_PG_CONFIG"; return 1; }
	v=${v#PostgreSQL }
	echo "${v%%.*}"
}

citus_dir() {
	local major
	major=$(citus_pg_major) || return 1
	echo "$CITUS_CACHE/$CITUS_VERSION-pg$major"
}

# The first source directory that holds this version's archive or tree.
citus_src() {
	local repo d
	repo=$(citus_repo)
	for d in ${CITUS_SRC:+"$CITUS_SRC"} "$repo/../shared/vendor/citus" /work/shared/vendor/citus; do
		[ -d "$d" ] || continue
		if [ -f "$d/citus-$CITUS_VERSION.tar.gz" ] || [ -x "$d/configure" ]; then
			(cd "$d" && pwd)
			return 0
		fi
	done
	return 1
}

citus_built() {
	local dir
	dir=$(citus_dir) || return 1
	[ -f "$dir/done" ] && [ "$(cat "$dir/done")" = "$CITUS_RECIPE_REV" ]
}

citus_check() {
	citus_built && { echo "citus $CITUS_VERSION: built in $(citus_dir)"; return 0; }
	citus_pg_major >/dev/null || { echo "no PostgreSQL at $CITUS_BUILD_PG_CONFIG to build Citus against"; return 3; }
	local src
	if ! src=$(citus_src); then
		echo "no Citus $CITUS_VERSION source: set CITUS_SRC to a directory holding citus-$CITUS_VERSION.tar.gz and SHA256SUMS (or an unpacked tree), or put them in ../shared/vendor/citus"
		return 3
	fi
	echo "citus $CITUS_VERSION: source in $src, not built yet"
}

citus_build() {
	local dir src tmp start major
	dir=$(citus_dir) || return 1
	major=$(citus_pg_major)
	mkdir -p "$CITUS_CACHE"
	exec {CITUS_LOCK_FD}>"$CITUS_CACHE/.lock"
	if ! flock -n "$CITUS_LOCK_FD"; then
		citus_say "another run is building Citus; waiting for it"
		flock "$CITUS_LOCK_FD"
	fi
	if citus_built; then
		citus_say "already built: $dir"
		return 0
	fi
	src=$(citus_src) || { citus_check >&2; return 3; }
	for b in make gcc tar sha256sum; do
		command -v "$b" >/dev/null || { citus_say "$b missing: run scripts/install-deps.sh"; return 1; }
	done
	for h in lz4.h zstd.h curl/curl.h krb5.h openssl/ssl.h; do
		[ -f "/usr/include/$h" ] || [ -f "/usr/include/x86_64-linux-gnu/$h" ] ||
			{ citus_say "$h missing: run scripts/install-deps.sh"; return 1; }
	done
	start=$(date +%s)
	tmp=$(mktemp -d "$CITUS_CACHE/.build.XXXXXX")
	mkdir "$tmp/src"
	if [ -f "$src/citus-$CITUS_VERSION.tar.gz" ]; then
		[ -f "$src/SHA256SUMS" ] || { citus_say "$src has no SHA256SUMS"; rm -rf "$tmp"; return 1; }
		(cd "$src" && grep " citus-$CITUS_VERSION.tar.gz\$" SHA256SUMS | sha256sum -c --quiet -) ||
			{ citus_say "checksum of $src/citus-$CITUS_VERSION.tar.gz does not match SHA256SUMS"; rm -rf "$tmp"; return 1; }
		tar -xzf "$src/citus-$CITUS_VERSION.tar.gz" -C "$tmp/src"
	else
		cp -a "$src/." "$tmp/src/"
	fi
	citus_say "building Citus $CITUS_VERSION against PostgreSQL $major in $tmp (a few minutes)"
	(cd "$tmp/src" &&
		./configure PG_CONFIG="$CITUS_BUILD_PG_CONFIG" &&
		nice -n 10 make -j"$CITUS_JOBS" with_llvm=no &&
		make install with_llvm=no DESTDIR="$tmp/stage") >"$tmp/build.log" 2>&1 ||
		{ citus_say "build failed, see $tmp/build.log"; tail -20 "$tmp/build.log" >&2; return 1; }
	local pkglib share
	pkglib=$("$CITUS_BUILD_PG_CONFIG" --pkglibdir)
	share=$("$CITUS_BUILD_PG_CONFIG" --sharedir)
	[ -f "$tmp/stage$pkglib/citus.so" ] && [ -f "$tmp/stage$share/extension/citus.control" ] ||
		{ citus_say "the stage lacks citus.so or citus.control"; return 1; }
	mkdir -p "$tmp/files/lib" "$tmp/files/extension"
	cp -a "$tmp/stage$pkglib/." "$tmp/files/lib/"
	cp -a "$tmp/stage$share/extension/." "$tmp/files/extension/"
	rm -rf "$tmp/files/lib/bitcode"
	echo "$(($(date +%s) - start))" >"$tmp/build-seconds"
	rm -rf "$tmp/src" "$tmp/stage"
	echo "$CITUS_RECIPE_REV" >"$tmp/done"
	chmod -R a+rX "$tmp"
	rm -rf "$dir"
	mv "$tmp" "$dir"
	citus_say "built in $(cat "$dir/build-seconds") s: $dir"
}

citus_install() {
	local pgc=${1:-} dir pkglib share
	[ -n "$pgc" ] || { citus_say "usage: $0 install PG_CONFIG"; return 2; }
	citus_built || { citus_say "not built: run scripts/citus.sh build"; return 1; }
	dir=$(citus_dir)
	local major
	major=$("$pgc" --version) && major=${major#PostgreSQL } && major=${major%%.*}
	[ "$major" = "$(citus_pg_major)" ] ||
		{ citus_say "$pgc is PostgreSQL $major, the build is for $(citus_pg_major)"; return 1; }
	pkglib=$("$pgc" --pkglibdir)
	share=$("$pgc" --sharedir)
	cp -a "$dir/files/lib/." "$pkglib/"
	cp -a "$dir/files/extension/." "$share/extension/"
	citus_say "installed Citus $CITUS_VERSION into $pkglib and $share/extension"
}

case "${1:-}" in
check) citus_check ;;
build) citus_build ;;
install) citus_install "${2:-}" ;;
path) citus_built || { citus_say "not built: run scripts/citus.sh build"; exit 1; }; citus_dir ;;
*)
	echo "usage: $0 check|build|install PG_CONFIG|path" >&2
	exit 2
	;;
esac
