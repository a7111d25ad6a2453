#!/usr/bin/env bash
# pg-assert.sh: an assert-enabled PostgreSQL 15 built from Debian's source
# package of the installed server, for lockfence's tests ("15-assert" in
# test/run-all.sh's matrix) and for Valgrind runs.
#
#   scripts/pg-assert.sh build   build it unless a finished build exists
#   scripts/pg-assert.sh path    print its pg_config (fails if not built)
#   scripts/pg-assert.sh src     print its unpacked source tree
#   scripts/pg-assert.sh valgrind [SUITES]
#                                lockfence's pg_regress and isolation suites
#                                and the TAP files $VALGRIND_TAP (SUITES:
#                                "regress isolation tap", the default) with
#                                every server process under Valgrind
#                                memcheck; fails on any error whose stack
#                                passes through lockfence
#
# The build is kept under $LOCKFENCE_PG_ASSERT_CACHE (default
# /var/cache/lockfence-pg-assert), in a directory named after a hash of the
# recipe: the server version, the configure options and this script's
# recipe revision.  A "done" stamp is written last, so an interrupted build
# is thrown away and redone; a changed recipe builds beside the old one.
#
# The source comes from apt-get source with a private apt state (its own
# sources list and lists directory under the cache), so the host's apt
# configuration is not touched.  The deb-src lines use the URIs and suites
# of the host's own deb822 sources: no host name is written here.
#
# Must run as root (apt-get).  configure and make run as root; the tree is
# left world-readable because initdb and the servers run as postgres.
set -euo pipefail

PG_ASSERT_CACHE=${LOCKFENCE_PG_ASSERT_CACHE:-/var/cache/lockfence-pg-assert}
PG_ASSERT_JOBS=${PG_ASSERT_JOBS:-2}
# Bump when the recipe below changes in a way the hash cannot see.
PG_ASSERT_RECIPE_REV=2
# contrib modules lockfence's tests create (sql/, test/t/).
PG_ASSERT_CONTRIB="hstore amcheck"

pg_assert_say() { echo "pg-assert: $*" >&2; }

pg_assert_version() {
	dpkg-query -W -f='${Version}' postgresql-15 2>/dev/null ||
		{ pg_assert_say "postgresql-15 is not installed"; return 1; }
}

pg_assert_configure_args() {
	# --enable-cassert also turns on CLOBBER_FREED_MEMORY and
	# MEMORY_CONTEXT_CHECKING (pg_config_manual.h): freed memory is wiped
	# with 0x7F, so reads after pfree/context reset show as garbage.
	echo --enable-cassert --enable-debug --enable-tap-tests \
		--without-llvm --without-icu
}

pg_assert_cflags() { echo "-Og -g3 -fno-omit-frame-pointer"; }
pg_assert_cppflags() { echo "-DUSE_VALGRIND"; }

pg_assert_key() {
	local v
	v=$(pg_assert_version) || return 1
	printf '%s\n' "$v" "$PG_ASSERT_RECIPE_REV" "$(pg_assert_configure_args)" \
		"$(pg_assert_cflags)" "$(pg_assert_cppflags)" "$PG_ASSERT_CONTRIB" |
		sha256sum | cut -c1-16
}

pg_assert_dir() { echo "$PG_ASSERT_CACHE/$(pg_assert_key)"; }

# deb-src lines from the host's deb822 sources (and one-line sources).
pg_assert_debsrc() {
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk '
			function flush() {
				if (uris != "" && suites != "")
					for (i = 1; i <= nu; i++)
						for (j = 1; j <= ns; j++)
							print "deb-src " u[i] " " s[j] " " comps
				uris = ""; suites = ""; comps = "main"
			}
			BEGIN { comps = "main" }
			/^[ \t]*$/ { flush(); next }
			/^URIs:/ { uris = $0; nu = 0; for (i = 2; i <= NF; i++) u[++nu] = $i }
			/^Suites:/ { suites = $0; ns = 0; for (i = 2; i <= NF; i++) s[++ns] = $i }
			/^Components:/ { comps = ""; for (i = 2; i <= NF; i++) comps = comps (i > 2 ? " " : "") $i }
			END { flush() }' "$f"
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		awk '$1 == "deb" { $1 = "deb-src"; print }' "$f" | sed 's/\[[^]]*\] //'
	done
}

pg_assert_fetch_source() {
	local dir=$1 v=$2 apt
	apt="$dir/apt"
	mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$dir/src"
	pg_assert_debsrc | sort -u >"$apt/sources.list"
	[ -s "$apt/sources.list" ] || { pg_assert_say "no apt sources found"; return 1; }
	local -a opts=(
		-o "Dir::Etc::SourceList=$apt/sources.list"
		-o "Dir::Etc::SourceParts=-"
		-o "Dir::State::Lists=$apt/lists"
		-o "Dir::Cache::Archives=$apt/archives"
		-o "APT::Sandbox::User=root"
	)
	apt-get "${opts[@]}" update -qq >"$dir/apt-update.log" 2>&1 ||
		{ pg_assert_say "apt-get update failed, see $dir/apt-update.log"; return 1; }
	(cd "$dir/src" && apt-get "${opts[@]}" source -qq "postgresql-15=$v") >"$dir/apt-source.log" 2>&1 ||
		{ pg_assert_say "apt-get source postgresql-15=$v failed, see $dir/apt-source.log"; return 1; }
}

# Debian's patch 50-per-version-dirs hard-codes pkglibdir (and so pgxs,
# the extension libraries, the regression drivers) to
# /usr/lib/postgresql/15/lib, whatever --prefix says: an install would
# overwrite the packaged server's files.  It is reverted; Debian's other
# patches stay.
pg_assert_unpatch_paths() {
	local src=$1 p=debian/patches/50-per-version-dirs.patch
	[ -f "$src/$p" ] || return 0
	(cd "$src" && patch -R -p1 -s <"$p") ||
		{ pg_assert_say "cannot revert $p"; return 1; }
	if grep -q '/usr/lib/postgresql' "$src/src/Makefile.global.in"; then
		pg_assert_say "src/Makefile.global.in still names /usr/lib/postgresql"
		return 1
	fi
}

# One build at a time on the machine: a second run (another test command,
# the fuzzers' lane) would otherwise take the first one's half-built tree
# for a broken one and delete it under it.  The lock is held in a subshell,
# for the build only (not for the Valgrind runs after it).
pg_assert_build() {
	mkdir -p "$PG_ASSERT_CACHE"
	(
		exec {lock_fd}>"$PG_ASSERT_CACHE/.lock"
		if ! flock -n "$lock_fd"; then
			pg_assert_say "another run is building the assert-enabled PostgreSQL; waiting for it"
			flock "$lock_fd"
		fi
		pg_assert_build_unlocked
	)
}

pg_assert_srcdir() {
	local d
	d=$(pg_assert_dir) || return 1
	for s in "$d"/src/postgresql-15-*/; do
		[ -f "$s/configure" ] && { echo "${s%/}"; return 0; }
	done
	return 1
}

pg_assert_build_unlocked() {
	local dir v src prefix start
	v=$(pg_assert_version) || return 1
	dir=$(pg_assert_dir) || return 1
	if [ -f "$dir/done" ]; then
		pg_assert_say "already built: $dir/install"
		return 0
	fi
	for b in bison flex make gcc perl; do
		command -v "$b" >/dev/null || { pg_assert_say "$b missing: run scripts/install-deps.sh"; return 1; }
	done
	[ -f /usr/include/valgrind/memcheck.h ] ||
		{ pg_assert_say "valgrind headers missing: run scripts/install-deps.sh"; return 1; }
	start=$(date +%s)
	pg_assert_say "building PostgreSQL $v with assertions in $dir (a half-built tree is redone)"
	rm -rf "$dir"
	mkdir -p "$dir"
	pg_assert_fetch_source "$dir" "$v" || return 1
	src=$(pg_assert_srcdir) || { pg_assert_say "no source tree after apt-get source"; return 1; }
	pg_assert_unpatch_paths "$src" || return 1
	prefix="$dir/install"
	# shellcheck disable=SC2046
	(cd "$src" &&
		./configure --prefix="$prefix" $(pg_assert_configure_args) \
			CFLAGS="$(pg_assert_cflags)" CPPFLAGS="$(pg_assert_cppflags)" &&
		nice -n 10 make -j"$PG_ASSERT_JOBS" -s) >"$dir/build.log" 2>&1 ||
		{ pg_assert_say "build failed, see $dir/build.log"; tail -20 "$dir/build.log" >&2; return 1; }
	# Installed into a stage first (DESTDIR): nothing may land outside the
	# prefix, which is checked before the stage is moved into place.
	local stage="$dir/stage"
	rm -rf "$stage"
	(cd "$src" &&
		make -j"$PG_ASSERT_JOBS" -s install DESTDIR="$stage" &&
		for c in $PG_ASSERT_CONTRIB; do make -s -C "contrib/$c" install DESTDIR="$stage" || exit 1; done &&
		make -s -C src/test/isolation install DESTDIR="$stage" &&
		make -s -C src/test/regress install DESTDIR="$stage" &&
		make -s -C src/test/perl install DESTDIR="$stage") \
		>>"$dir/install.log" 2>&1 ||
		{ pg_assert_say "install failed, see $dir/install.log"; tail -20 "$dir/install.log" >&2; return 1; }
	local stray
	# (grep finds nothing when all is well: its status 1 must not end the
	# script under set -e and pipefail, as it did, silently, after every
	# build from scratch)
	stray=$(cd "$stage" && find . -mindepth 1 -maxdepth 20 -not -type d | { grep -v -F "./${prefix#/}/" || true; } | head -5)
	if [ -n "$stray" ]; then
		pg_assert_say "the install put files outside $prefix (not installed): $stray"
		return 1
	fi
	rm -rf "$prefix"
	mv "$stage/${prefix#/}" "$prefix" && rm -rf "$stage"
	# pg_regress and isolationtester are found by PGXS next to pgxs.mk.
	local pgxs
	pgxs=$(dirname "$("$prefix/bin/pg_config" --pgxs)")/../..
	case $("$prefix/bin/pg_config" --pkglibdir) in
	"$prefix"/*) ;;
	*) pg_assert_say "pkglibdir is outside $prefix"; return 1 ;;
	esac
	[ -x "$pgxs/src/test/regress/pg_regress" ] &&
		[ -x "$pgxs/src/test/isolation/pg_isolation_regress" ] ||
		{ pg_assert_say "pg_regress or pg_isolation_regress missing after install"; return 1; }
	"$prefix/bin/pg_config" --configure | grep -q -- --enable-cassert ||
		{ pg_assert_say "built server lacks --enable-cassert"; return 1; }
	chmod -R a+rX "$dir"
	echo "$(($(date +%s) - start))" >"$dir/build-seconds"
	touch "$dir/done"
	pg_assert_say "built in $(cat "$dir/build-seconds") s: $prefix/bin/pg_config"
}

pg_assert_path() {
	local dir
	dir=$(pg_assert_dir) || return 1
	[ -f "$dir/done" ] || { pg_assert_say "not built: run scripts/pg-assert.sh build"; return 1; }
	echo "$dir/install/bin/pg_config"
}

# The TAP files run under Valgrind: the etcd client's error paths and the
# calls made in error cleanup (65), the fast path, the resource lock and the
# fence cache under pgbench (92).  Files that bound a time cannot run there.
VALGRIND_TAP=${VALGRIND_TAP:-test/t/65_etcd_quiet_calls.pl test/t/92_no_multixact.pl}

# Run lockfence's pg_regress and isolation suites and $VALGRIND_TAP with
# the servers under Valgrind.  The assert build is copied (it is relocatable) into a scratch
# folder whose bin/postgres is a wrapper running the real binary under
# memcheck with PostgreSQL's suppressions (src/tools/valgrind.supp), one
# log per process; initdb's bootstrap and single-user runs and version
# checks are not traced (they run no lockfence code and would triple the
# time).  The copy keeps the shared build untouched.
pg_assert_valgrind() {
	local suites=${1:-regress isolation tap} repo dir src work rc=0 start vgerr lf s
	local origins= jit= stacks
	# Where an uninitialised value came from: twice the time; for a
	# diagnosis (VALGRIND_ORIGINS=1), not needed to find an error.
	[ "${VALGRIND_ORIGINS:-0}" = 1 ] && origins="--track-origins=yes --read-var-info=yes"
	# Most of the time goes into translating code, not running it: every
	# backend is forked from a postmaster that never ran the parser, the
	# planner or the executor, so each translates them anew, runs them a
	# few times and exits.  Cheaper translations (no chasing across
	# branches, VEX's lighter IR optimisation) cut the run by a fifth to a
	# third.  They change how Valgrind's JIT compiles the code it
	# instruments, not what memcheck checks: every memory access is still
	# checked (docs/testing-lanes.md, "Where the CPU goes").
	# VALGRIND_JIT_DEFAULTS=1 restores Valgrind's defaults.
	[ "${VALGRIND_JIT_DEFAULTS:-0}" = 1 ] || jit="--vex-guest-chase=no --vex-iropt-level=1"
	# An error's report keeps where the block was freed, not where it was
	# allocated: recording a stack at every palloc (a memory context chunk
	# is a Valgrind mempool block) cost about a seventh of the isolation
	# specs' CPU, and "freed at" is what a use-after-free report needs.
	# What memcheck checks, and the stack of the access itself, stay.
	# VALGRIND_ALLOC_STACKS=1 records both (a diagnosis).
	stacks=--keep-stacktraces=free
	[ "${VALGRIND_ALLOC_STACKS:-0}" = 1 ] && stacks=--keep-stacktraces=alloc-and-free
	repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
	command -v valgrind >/dev/null || { pg_assert_say "valgrind is not installed (scripts/install-deps.sh)"; return 1; }
	pg_assert_build || return 1
	dir=$(pg_assert_dir) && src=$(pg_assert_srcdir) || return 1
	start=$(date +%s)
	work=$(mktemp -d /tmp/lockfence-valgrind.XXXXXX)
	chmod 755 "$work"
	cp -a "$dir/install" "$work/pg"
	mkdir "$work/src" "$work/vg"
	tar -C "$repo" --exclude=.git -cf - . | tar -C "$work/src" -xf -
	make -C "$work/src" -s clean >/dev/null 2>&1
	make -C "$work/src" -s PG_CONFIG="$work/pg/bin/pg_config" \
		PG_CFLAGS='-Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers' >"$work/build.log" 2>&1 &&
		make -C "$work/src" -s PG_CONFIG="$work/pg/bin/pg_config" install >>"$work/build.log" 2>&1 ||
		{ pg_assert_say "lockfence build failed, see $work/build.log"; return 1; }
	mv "$work/pg/bin/postgres" "$work/pg/bin/postgres.real"
	cat >"$work/pg/bin/postgres" <<-EOF
		#!/bin/sh
		for a in "\$@"; do
			case "\$a" in
			-V|--version|--boot|--single|-C|--describe-config) exec "$work/pg/bin/postgres.real" "\$@" ;;
			esac
		done
		exec valgrind --quiet --trace-children=yes $origins $jit $stacks \\
			--num-callers=40 --leak-check=no \\
			--gen-suppressions=all --suppressions="$src/src/tools/valgrind.supp" \\
			--error-markers=VALGRINDERROR-BEGIN,VALGRINDERROR-END \\
			--log-file="$work/vg/%p.log" "$work/pg/bin/postgres.real" "\$@"
	EOF
	chmod 755 "$work/pg/bin/postgres"
	chown -R postgres: "$work"
	# The suites side by side, each in its own copy of the tree, with its
	# own private server.  The isolation specs take three times as long
	# as pg_regress under Valgrind, so they run as two halves (alternate
	# specs in name order): three jobs finish together on 2 cores.
	local -a jobs=() args=()
	local -A iso_specs=() pids=()
	local specs half j
	for s in $suites; do
		case $s in
		regress | tap) jobs+=("$s") ;;
		isolation)
			specs=$(cd "$work/src/test/specs" && ls -- *.spec | sed 's/\.spec$//' | sort)
			for half in 1 2; do
				jobs+=("isolation-$half")
				iso_specs[isolation-$half]=$(echo "$specs" |
					awk -v h="$half" '(NR - h) % 2 == 0' | paste -sd' ')
			done
			;;
		*) pg_assert_say "unknown suite $s"; return 1 ;;
		esac
	done
	for j in "${jobs[@]}"; do
		cp -a "$work/src" "$work/src-$j"
	done
	chown -R postgres: "$work"
	for j in "${jobs[@]}"; do
		case $j in
		regress) args=(ISOLATION= TAP_TESTS=) ;;
		tap) args=(REGRESS= ISOLATION= "PROVE_TESTS=$VALGRIND_TAP") ;;
		*) args=(REGRESS= TAP_TESTS= "ISOLATION=${iso_specs[$j]}") ;;
		esac
		pg_assert_say "$j under valgrind (logs in $work/vg)"
		# lockfence_test.time_scale: the few upper time bounds in the
		# specs allow for Valgrind's slowdown (lease_first_grant.spec).
		# Each job notes when it ended: the jobs' lengths say how well
		# they share the run (the longest sets the lane's length).
		{
			runuser -u postgres -- env PATH="$work/pg/bin:$PATH" \
				PGOPTIONS="-c lockfence_test.time_scale=20" \
				make -C "$work/src-$j" PG_CONFIG="$work/pg/bin/pg_config" installcheck "${args[@]}" \
				>"$work/$j.log" 2>&1
			status=$?
			date +%s >"$work/$j.end"
			exit $status
		} &
		pids[$j]=$!
	done
	for j in "${jobs[@]}"; do
		wait "${pids[$j]}" ||
			{ rc=1; pg_assert_say "$j failed under valgrind:"; tail -30 "$work/$j.log" >&2
			  for f in "$work/src-$j/regression.diffs" "$work/src-$j/output_iso/regression.diffs"; do
				[ -s "$f" ] && head -100 "$f" >&2; done; }
	done
	for j in "${jobs[@]}"; do
		[ -s "$work/$j.end" ] && pg_assert_say "$j took $(($(cat "$work/$j.end") - start)) s"
	done
	# Errors, and those of them whose stack passes through lockfence.
	vgerr=$(cat "$work"/vg/*.log 2>/dev/null | grep -c VALGRINDERROR-BEGIN || true)
	lf=$(awk '/VALGRINDERROR-BEGIN/ { e = ""; inerr = 1 }
		inerr { e = e $0 "\n" }
		/VALGRINDERROR-END/ { inerr = 0; if (e ~ /lockfence\.so|\/src\/[a-z_]+\.c:|\((fence|lease|etcd|metrics|check|subxact|lockfence)[a-z_]*\.c:/) { n++; printf "%s", e > "/dev/stderr" } }
		END { print n + 0 }' "$work"/vg/*.log 2>"$work/lockfence-errors.txt")
	pg_assert_say "valgrind: $vgerr error(s) in all, $lf through lockfence, in $(($(date +%s) - start)) s"
	if [ "$lf" -gt 0 ]; then
		head -150 "$work/lockfence-errors.txt" >&2
		rc=1
	elif [ "$vgerr" -gt 0 ]; then
		pg_assert_say "errors outside lockfence (not counted), first of them:"
		awk '/VALGRINDERROR-BEGIN/,/VALGRINDERROR-END/' "$work"/vg/*.log | head -40 >&2
	fi
	if [ $rc -eq 0 ]; then
		rm -rf "$work"
	else
		pg_assert_say "kept $work for inspection"
	fi
	return $rc
}

case "${1:-}" in
build) pg_assert_build ;;
path) pg_assert_path ;;
src) pg_assert_srcdir ;;
valgrind) pg_assert_valgrind "${2:-}" ;;
*)
	echo "usage: $0 build|path|src|valgrind [SUITES]" >&2
	exit 2
	;;
esac
