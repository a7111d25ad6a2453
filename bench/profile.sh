#!/bin/bash
#
# bench/profile.sh
#	  Instruction counts of the lockfence hot paths, measured with
#	  valgrind --tool=callgrind in a single-user backend (deterministic:
#	  unlike core.sh's timings, the noise of a shared machine does not
#	  reach them).
#
#	  b1: the B1 statement (single-row UPDATE that sets the token, one
#	      transaction each, prepared) run N1 and N2 times; the difference divided by
#	      N2 - N1 is the cost of one transaction, without backend start-up.
#	  b3: one UPDATE of all BULK_ROWS rows under one token; the difference
#	      to the unprotected table divided by the rows is the cost per row.
#
#	  Variants: none (no trigger), lockfence, plpgsql (the hand-written
#	  trigger of core.sh), ctrig (a built-in no-op C trigger, the floor of
#	  any row trigger; in B1 its statement calls no fence()); for B1 also
#	  shape (on request: the lockfence variant's statement form, B1_FORM
#	  (set or cte, see bench_update in setup.sh), calling a volatile
#	  built-in instead of fence() on the unprotected table: the share of
#	  the statement's form in lockfence's difference to none).
#
#	  Run as root.  Prints a table; the callgrind files and the
#	  callgrind_annotate reports of the lockfence runs are kept in OUT
#	  (default /tmp/lockfence-profile).  Settings: N1 (200), N2 (1200),
#	  BULK_ROWS (20000), PG_CONFIG (see core.sh), B1_VARIANTS ("none
#	  lockfence plpgsql ctrig") and B3_VARIANTS ("none lockfence plpgsql
#	  ctrig"):
#	  "none" must stay in both (the differences are to it).
#
# IDENTIFICATION
#	  bench/profile.sh
#

set -euo pipefail

N1=${N1:-200}
B1_FORM=${B1_FORM:-set}
N2=${N2:-1200}
BULK_ROWS=${BULK_ROWS:-20000}
# shellcheck disable=SC2034  # read by setup.sh
CLIENTS=4
OUT=${OUT:-/tmp/lockfence-profile}

command -v valgrind >/dev/null || { echo "profile.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }

. "$(dirname "$0")/setup.sh"

# The runs below use a single-user backend: stop the server.
runuser -u postgres -- "$BIN/pg_ctl" -D "$WORK/data" -m fast -w stop >/dev/null
# shellcheck disable=SC2034  # read by the EXIT trap of setup.sh
SERVER_STARTED=

rm -rf "$OUT"
mkdir -p "$OUT"
chown postgres: "$OUT"

# callgrind_run NAME INPUT: run a single-user backend on INPUT; prints the
# instructions it executed.
callgrind_run() {
	local name=$1 input=$2
	runuser -u postgres -- valgrind --tool=callgrind \
		--callgrind-out-file="$OUT/$name.cg" \
		"$BIN/postgres" --single -D "$WORK/data" bench \
		<"$input" >"$OUT/$name.stdout" 2>"$OUT/$name.valgrind" ||
		die "callgrind run $name failed; see $OUT/$name.valgrind"
	# A single-user backend reports errors on stderr (with valgrind's own
	# lines, which start with ==PID==), not between its prompts.
	if grep -q 'ERROR:' "$OUT/$name.stdout" "$OUT/$name.valgrind"; then
		die "run $name: a statement failed; see $OUT/$name.valgrind"
	fi
	sed -n 's/^summary: \([0-9]*\).*/\1/p' "$OUT/$name.cg"
}

repeat_stmt() {
	local n=$1 stmt=$2 i
	for ((i = 0; i < n; i++)); do
		echo "$stmt"
	done
}

B1_VARIANTS=${B1_VARIANTS:-none lockfence plpgsql ctrig}
B3_VARIANTS=${B3_VARIANTS:-none lockfence plpgsql ctrig}
case " $B1_VARIANTS " in *" none "*) ;; *) die "B1_VARIANTS must include none" ;; esac
case " $B3_VARIANTS " in *" none "*) ;; *) die "B3_VARIANTS must include none" ;; esac

declare -A B1 B3
for v in $B1_VARIANTS; do
	# A prepared statement, as pgbench -M prepared runs it in core.sh.
	if [ "$v" = shape ]; then
		# The lockfence variant's statement form on the unprotected
		# table, with a volatile call that does nothing in place of
		# fence(): what the form costs, without lockfence.
		case "$B1_FORM" in
			cte) prep="PREPARE u AS WITH f AS (SELECT pg_catalog.random()) UPDATE b1_none SET val = val + 1, fence_token = 1000 WHERE id = 0 AND EXISTS (SELECT FROM f);" ;;
			*) prep="PREPARE u AS UPDATE b1_none SET val = val + 1, fence_token = 1000 + pg_catalog.random()::int * 0 WHERE id = 0;" ;;
		esac
	else
		prep="PREPARE u AS $(bench_update "$v" "b1_$v" "'client-0'" 1000 "id = 0" "$B1_FORM")"
	fi
	{ echo "$prep"; repeat_stmt "$N1" "EXECUTE u"; } >"$WORK/p_b1_${v}_n1.sql"
	{ echo "$prep"; repeat_stmt "$N2" "EXECUTE u"; } >"$WORK/p_b1_${v}_n2.sql"
	i1=$(callgrind_run "b1_${v}_n1" "$WORK/p_b1_${v}_n1.sql")
	i2=$(callgrind_run "b1_${v}_n2" "$WORK/p_b1_${v}_n2.sql")
	B1[$v]=$(((i2 - i1) / (N2 - N1)))
	log "b1 $v: ${B1[$v]} instructions per transaction"
done

for v in $B3_VARIANTS; do
	bench_update "$v" "bulk_$v" "'bulk'" 5000 true cte >"$WORK/p_b3_$v.sql"
	B3[$v]=$(callgrind_run "b3_$v" "$WORK/p_b3_$v.sql")
	log "b3 $v: ${B3[$v]} instructions"
done

for name in b1_lockfence_n2 b1_plpgsql_n2 b3_lockfence b3_ctrig; do
	[ -f "$OUT/$name.cg" ] || continue
	callgrind_annotate --inclusive=yes "$OUT/$name.cg" >"$OUT/$name.inclusive.txt" 2>/dev/null || true
	callgrind_annotate "$OUT/$name.cg" >"$OUT/$name.self.txt" 2>/dev/null || true
done

echo
echo "lockfence instruction counts (callgrind, single-user backend), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "B1 statement, per transaction (N2 - N1 = $((N2 - N1)) transactions):"
for v in $B1_VARIANTS; do
	printf '  %-10s %9d instr  %+9d vs none  (x%.3f)\n' "$v" "${B1[$v]}" \
		$((B1[$v] - B1[none])) "$(awk -v a="${B1[$v]}" -v b="${B1[none]}" 'BEGIN { print a / b }')"
done
echo
echo "B3 UPDATE of $BULK_ROWS rows, per row (whole run / rows, difference to none / rows):"
for v in $B3_VARIANTS; do
	printf '  %-10s %9d instr  %+9d vs none  (x%.3f)\n' "$v" $((B3[$v] / BULK_ROWS)) \
		$(((B3[$v] - B3[none]) / BULK_ROWS)) \
		"$(awk -v a="${B3[$v]}" -v b="${B3[none]}" 'BEGIN { print a / b }')"
done
echo
echo "callgrind files and annotations: $OUT"
