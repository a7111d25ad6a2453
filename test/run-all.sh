#!/usr/bin/env bash
# run-all.sh: build lockfence and run every test suite, as root on Debian 12.
#
# Installs what is missing with apt-get, builds warning-free (-Wall -Wextra
# -Werror), installs the extension into the system PostgreSQL 15, then runs
# as the postgres user, in a scratch copy of the tree:
#   pg_regress (private server), isolation specs (private server), and the
#   TAP suites (PostgreSQL, etcd, ... servers started by the tests themselves
#   on 127.0.0.1 free ports),
# and finally the end-to-end demonstration.  Prints "N passed, N failed" and
# exits non-zero if any suite failed.
#
# For quick iterations:
#   SUITES="regress tap"          only these of: regress isolation tap demo
#   PROVE_TESTS="test/t/20_*.pl"  only these TAP files
#   PG_CONFIG=/path/to/pg_config  another PostgreSQL installation
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [ "$(id -u)" -ne 0 ]; then
	echo "run-all.sh: run as root (it installs packages and the extension)" >&2
	exit 1
fi

"$repo/scripts/install-deps.sh" || { echo "dependency installation failed" >&2; exit 1; }

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export PATH="$("$PG_CONFIG" --bindir):$PATH"

# A scratch copy owned by postgres: the servers and pg_regress refuse to run
# as root and must be able to write results next to the tests.
work=$(mktemp -d /tmp/lockfence-test.XXXXXX)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
chmod 755 "$work"
tar -C "$repo" --exclude=.git -cf - . | tar -C "$work" -xf -
make -C "$work" -s clean >/dev/null 2>&1

passed=0
failed=0
failures=()

suite() {
	local name=$1
	shift
	echo "=== $name"
	if "$@"; then
		passed=$((passed + 1))
		echo "=== $name: passed"
	else
		failed=$((failed + 1))
		failures+=("$name")
		echo "=== $name: FAILED"
	fi
}

build() {
	make -C "$work" -s PG_CONFIG="$PG_CONFIG" \
		PG_CFLAGS='-Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers' &&
		make -C "$work" -s PG_CONFIG="$PG_CONFIG" install
}

as_postgres_make() {
	chown -R postgres: "$work"
	runuser -u postgres -- env PATH="$PATH" make -C "$work" PG_CONFIG="$PG_CONFIG" "$@"
}

show_diffs() {
	local f
	for f in "$work/regression.diffs" "$work/output_iso/regression.diffs"; do
		[ -s "$f" ] && { echo "--- $f"; head -200 "$f"; }
	done
	for f in "$work"/tmp_check/log/regress_log_*; do
		[ -f "$f" ] && grep -q "not ok" "$f" && { echo "--- $f"; tail -60 "$f"; }
	done
	return 1
}

regress() { as_postgres_make installcheck ISOLATION= TAP_TESTS= || show_diffs; }
isolation() { as_postgres_make installcheck REGRESS= TAP_TESTS= || show_diffs; }
tap() {
	as_postgres_make installcheck REGRESS= ISOLATION= \
		PROVE_FLAGS='-I test/perl --timer' ${PROVE_TESTS:+PROVE_TESTS="$PROVE_TESTS"} ||
		show_diffs
}

SUITES=${SUITES:-regress isolation tap demo}
wanted() { [[ " $SUITES " == *" $1 "* ]]; }

suite "build and install (-Wall -Wextra -Werror)" build
if [ $failed -eq 0 ]; then
	wanted regress && suite "pg_regress" regress
	wanted isolation && suite "isolation" isolation
	wanted tap && suite "TAP" tap
	if wanted demo && [ -x "$work/demo/run.sh" ]; then
		suite "demonstration (demo/run.sh)" bash "$work/demo/run.sh"
	fi
fi

echo
[ $failed -gt 0 ] && printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
