# shellcheck shell=bash
#
# bench/report.sh
#	  The report helpers of the lockfence benchmarks, sourced by setup.sh
#	  (so by core.sh, multixact.sh and profile.sh) and by citus.sh: medians,
#	  spreads and per-round ratios of sample files, and the RESULT lines
#	  bench/all.sh reads.  Expects WORK, a scratch folder.
#
# IDENTIFICATION
#	  bench/report.sh
#

# The median of the numbers on standard input, one a line.
median() {
	sort -g | awk '{ a[NR] = $1 } END {
		if (NR % 2) printf "%.4f\n", a[(NR + 1) / 2];
		else printf "%.4f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# The samples of a file (one a line): "median min max n".
stats() {
	echo "$(median <"$1") $(sort -g "$1" | head -1) $(sort -g "$1" | tail -1) $(wc -l <"$1")"
}

# Per-round ratios a/b of two sample files: "median min max n".
ratio_stats() {
	paste "$1" "$2" | awk '{ printf "%.4f\n", $1 / $2 }' >"$WORK/ratios"
	stats "$WORK/ratios"
}

# Per-round differences a-b of two sample files: "median min max n".
diff_stats() {
	paste "$1" "$2" | awk '{ printf "%.4f\n", $1 - $2 }' >"$WORK/diffs"
	stats "$WORK/diffs"
}

# result NAME "median min max n": one machine-readable line for bench/all.sh.
result() {
	local med lo hi n
	read -r med lo hi n <<<"$2"
	echo "RESULT name=$1 median=$med min=$lo max=$hi n=$n"
}
