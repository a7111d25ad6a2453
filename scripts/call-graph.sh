#!/bin/bash
#
# call-graph.sh - list lockfence's file-to-file calls and fail on a cycle.
#
# Reads the symbol tables of the built objects (src/*.o, so run it after
# make): a file "calls" another when it references (nm: U) a function or
# variable the other defines (nm: T, D, B, R).  Static functions never
# appear, so this is the graph of what the files export to each other.
# Prints one "a -> b" line per edge, then every cycle found (a strongly
# connected component of more than one file), and exits 1 if there is one.
#
# Usage: scripts/call-graph.sh [objdir]     (default: src, next to this script)
#   --dot   print the graph in Graphviz dot form instead
#
# IDENTIFICATION
#	  scripts/call-graph.sh
#
set -euo pipefail

dot=0
if [ "${1:-}" = "--dot" ]; then
	dot=1
	shift
fi
dir=${1:-$(cd "$(dirname "$0")/.." && pwd)/src}

shopt -s nullglob
objs=("$dir"/*.o)
if [ ${#objs[@]} -eq 0 ]; then
	echo "call-graph.sh: no object files in $dir (run make first)" >&2
	exit 2
fi

# One line per symbol: "file kind symbol", kind D (defined) or U (used).
for o in "${objs[@]}"; do
	f=$(basename "$o" .o)
	nm "$o" | awk -v f="$f" '
		$1 == "U" { print f, "U", $2; next }
		NF == 3 && $2 ~ /^[TDBRVW]$/ { print f, "D", $3 }'
done | python3 -c '
import sys
dot = sys.argv[1] == "1"
defs, uses = {}, []
for line in sys.stdin:
    f, kind, sym = line.split()
    if kind == "D":
        defs[sym] = f
    else:
        uses.append((f, sym))
edges = {}
for f, sym in uses:
    g = defs.get(sym)
    if g is not None and g != f:
        edges.setdefault(f, {}).setdefault(g, set()).add(sym)
nodes = sorted(set(defs.values()) | set(f for f, _ in uses))

if dot:
    print("digraph lockfence {")
    for a in sorted(edges):
        for b in sorted(edges[a]):
            print("  \"%s\" -> \"%s\";" % (a, b))
    print("}")
else:
    for a in sorted(edges):
        for b in sorted(edges[a]):
            print("%s -> %s  (%s)" % (a, b, ", ".join(sorted(edges[a][b]))))

# The verdict goes to stderr: the listing must be out first, also when
# both go to one pipe (stdout is block-buffered there; in the chroot a run of
# TAP 99 got the verdict glued to the middle of a listing line).
sys.stdout.flush()

# Tarjan: strongly connected components.
index, low, stack, on, comps = {}, {}, [], set(), []
sys.setrecursionlimit(10000)
def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v); on.add(v)
    for w in edges.get(v, {}):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1:
            comps.append(sorted(comp))
for v in nodes:
    if v not in index:
        visit(v)
if comps:
    for c in comps:
        print("cycle: " + " ".join(c), file=sys.stderr)
        for a in c:
            for b in sorted(edges.get(a, {})):
                if b in c:
                    print("  %s -> %s  (%s)" % (a, b, ", ".join(sorted(edges[a][b]))), file=sys.stderr)
    sys.exit(1)
print("no cycle between %d files" % len(nodes), file=sys.stderr)
' "$dot"
