#!/usr/bin/python3
"""checker.py RUN_DIR: check a history run; reads only RUN_DIR/history.jsonl
and RUN_DIR/final.json (the final state of the database).

A write operation is one transaction on one or two resources: an increment
of a counter, a transfer between two accounts, or an append of rows to a
log (and of its head).  Its history record says which tokens and holders it
wrote under, what it read and what it wrote, and whether PostgreSQL
acknowledged it (ok), refused it (fail) or left it unknown (info).  The
final state holds hist.witness: one row per committed write and resource,
numbered in commit order (seq), and the final values.

Violations (each printed with the operations involved):
  lost-ack        an acknowledged write is not in the database
  failed-but-committed  a write reported failed is in the database
  ack-mismatch    the database holds other values than were acknowledged
  stale-accepted  in commit order a resource's token went down
  holder-conflict in commit order one token was used by two holders
  realtime-stale  a write was acknowledged with a token lower than one
                  already acknowledged for that resource before it began
  lost-update     a write read a value other than the one written before it
  final-value     a resource's final value is not the last value written
  total           the sum of a service's balances changed
  append-rows     a log holds other rows than its committed appends wrote
  count           a counter's final value is outside [acknowledged,
                  acknowledged + unknown] increments
Exit status: 0 if there is no violation (with --expect-violations: if there
is at least one), 1 otherwise or if a --require-* condition failed.
"""

import argparse
import bisect
import collections
import json
import os
import sys

WRITES = ("counter", "transfer", "append")


def load(run):
    """Stream the history: keep the write operations (their invocation's
    time and their completion), count the faults; then the final state."""
    ops, faults, first, last = {}, collections.Counter(), None, 0.0
    with open(os.path.join(run, "history.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            first = e["time"] if first is None else first
            last = e["time"]
            if e["process"] == "nemesis" and e["type"] == "ok":
                faults[e["f"]] += 1         # a fault injected and healed
            if e["f"] not in WRITES:
                continue
            if e["type"] == "invoke":
                keep = ("time", "process", "f", "op", "resource", "token", "holder")
                ops[e["op"]] = {"invoke": {k: e[k] for k in keep if k in e}, "done": None}
            else:
                ops[e["op"]]["done"] = e
    for o in ops.values():          # never completed: the run ended mid-write
        if o["done"] is None:
            o["done"] = dict(o["invoke"], type="info", error="no completion")
    with open(os.path.join(run, "final.json")) as f:
        final = json.load(f)
    return ops, faults, last - (first or 0.0), final


def describe(o):
    d = o["done"]
    return (f"{d['op']} ({d['process']}, {d['f']} {d['type']}, "
            f"t={o['invoke']['time']:.3f}..{d['time']:.3f}s, "
            f"token {d.get('token')}, holder {d.get('holder')})")


class Checker:
    def __init__(self, ops, final):
        self.ops, self.final = ops, final
        self.violations = []
        self.witness = collections.defaultdict(list)     # op -> witness rows
        for seq, op, res, token, holder, read, written in final["witness"]:
            self.witness[op].append({"seq": seq, "op": op, "resource": res, "token": token,
                                     "holder": holder, "read": read, "written": written})

    def violation(self, kind, text, *ops):
        lines = [f"{kind}: {text}"]
        for o in ops:
            # the witness rows' seq: where the database put the write in
            # commit order, to be read against the times of the history
            seq = "".join(f", seq {r['seq']} on {r['resource']}" for r in self.witness.get(o, []))
            lines.append("    " + (describe(self.ops[o]) if o in self.ops
                                   else f"{o} (not in the history)") + seq)
        self.violations.append("\n".join(lines))

    def check_outcomes(self):
        """What the history says was acknowledged or refused, the database confirms."""
        for op, o in self.ops.items():
            d, rows = o["done"], self.witness.get(op, [])
            if d["type"] == "ok":
                if len(rows) != len(d["resource"]):
                    self.violation("lost-ack", "an acknowledged write is missing after the run", op)
                    continue
                got = {r["resource"]: (r["token"], r["read"], r["written"]) for r in rows}
                want = {res: (d["token"][i], d["read"][i], d["write"][i])
                        for i, res in enumerate(d["resource"])}
                if got != want:
                    self.violation("ack-mismatch", f"acknowledged {want}, database has {got}", op)
            elif d["type"] == "fail" and rows:
                self.violation("failed-but-committed", f"refused ({d.get('error')}) but committed", op)

    def check_commit_order(self):
        """Per resource, along commit order: tokens never go down, an equal
        token has one holder, each write read what the previous one wrote,
        and the final value is the last one written."""
        by_resource = collections.defaultdict(list)
        for rows in self.witness.values():
            for r in rows:
                by_resource[r["resource"]].append(r)
        for res, value in self.final["initial"].items():
            prev = None
            for r in sorted(by_resource.get(res, []), key=lambda r: r["seq"]):
                if prev is not None and r["token"] is not None and prev["token"] is not None:
                    if r["token"] < prev["token"]:
                        self.violation("stale-accepted", f"{res}: token {r['token']} committed "
                                       f"after token {prev['token']}", prev["op"], r["op"])
                    elif (r["token"] == prev["token"] and r["holder"] != prev["holder"]
                          and None not in (r["holder"], prev["holder"])):
                        self.violation("holder-conflict", f"{res}: token {r['token']} committed by "
                                       f"{prev['holder']} and by {r['holder']}", prev["op"], r["op"])
                if r["read"] != value:
                    self.violation("lost-update", f"{res}: read {r['read']}, but the last committed "
                                   f"value was {value}", *([prev["op"]] if prev else []), r["op"])
                value, prev = r["written"], r
            if self.final["cells"].get(res) != value:
                self.violation("final-value", f"{res}: final value {self.final['cells'].get(res)}, "
                               f"last written {value}", *([prev["op"]] if prev else []))

    def check_realtime(self):
        """Without the witness: a write acknowledged with a token below one
        acknowledged for the same resource before it was even invoked."""
        done = collections.defaultdict(list)        # resource -> [(end time, token, op)]
        for op, o in self.ops.items():
            d = o["done"]
            if d["type"] == "ok":
                for res, tok in zip(d["resource"], d["token"]):
                    done[res].append((d["time"], tok, op))
        for res, lst in done.items():
            lst.sort()
            ends = [t for t, _, _ in lst]
            best, best_op = [], []       # running maximum of the tokens by end time
            for _, tok, op in lst:
                if best and best[-1] >= tok:
                    best.append(best[-1]), best_op.append(best_op[-1])
                else:
                    best.append(tok), best_op.append(op)
            for t_end, tok, op in lst:
                i = bisect.bisect_left(ends, self.ops[op]["invoke"]["time"]) - 1
                if i >= 0 and best[i] > tok:
                    self.violation("realtime-stale", f"{res}: token {tok} acknowledged after "
                                   f"token {best[i]} had been", best_op[i], op)

    def check_workloads(self):
        for service in {r.split("/")[0] for r in self.final["initial"]}:
            accts = [r for r in self.final["initial"] if r.startswith(service + "/acct/")]
            before = sum(self.final["initial"][r] for r in accts)
            after = sum(self.final["cells"][r] for r in accts)
            if before != after:
                self.violation("total", f"{service}: the balances summed to {before}, now {after}")
        rows = {(op, res): (n, tokens) for op, res, n, tokens in self.final["log"]}
        appended = collections.Counter()
        for op, wrows in self.witness.items():
            for w in wrows:
                if "/log/" not in w["resource"]:
                    continue
                n, tokens = rows.pop((op, w["resource"]), (0, []))
                appended[w["resource"]] += n
                if n != w["written"] - w["read"] or tokens != [w["token"]]:
                    self.violation("append-rows", f"{w['resource']}: {n} rows with tokens {tokens}, "
                                   f"head moved by {w['written'] - w['read']} under token {w['token']}", op)
        for (op, res), (n, tokens) in rows.items():
            self.violation("append-rows", f"{res}: {n} rows of a write that did not commit", op)
        kinds = collections.Counter()
        for o in self.ops.values():
            if o["invoke"]["f"] == "counter":
                kinds[(o["invoke"]["resource"][0], o["done"]["type"])] += 1
        for res in self.final["initial"]:
            if res.endswith("/counter"):
                ok, info = kinds[(res, "ok")], kinds[(res, "info")]
                if not ok <= self.final["cells"][res] <= ok + info:
                    self.violation("count", f"{res}: final {self.final['cells'][res]}, but "
                                   f"{ok} increments acknowledged and {info} unknown")

    def run(self):
        self.check_outcomes()
        self.check_commit_order()
        self.check_realtime()
        self.check_workloads()
        return self.violations


def summary(ops, faults, span, violations, final):
    done = [o["done"] for o in ops.values()]
    by_type = collections.Counter(d["type"] for d in done)
    rejected = sum(1 for d in done if d["type"] == "fail" and (d.get("error") or "")[:5] in
                   ("LF001", "LF002", "LF003"))
    mode = "fenced" if final["fenced"] else "self-check (no fence)"
    return (f"history {mode}: {len(ops)} operations, {by_type['ok']} acknowledged "
            f"({by_type['ok'] / max(span, 1):.0f}/s over {span:.0f} s), {by_type['fail']} failed "
            f"of which {rejected} stale writes rejected by the fence, {by_type['info']} unknown; "
            f"faults: {', '.join(f'{k} {v}' for k, v in sorted(faults.items())) or 'none'}; "
            f"violations: {len(violations)}"), by_type["ok"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--expect-violations", action="store_true",
                    help="self-check: succeed only if violations are found")
    ap.add_argument("--require-ok", type=int, default=0)
    ap.add_argument("--require-all-faults", action="store_true")
    a = ap.parse_args()
    ops, faults, span, final = load(a.run)
    checker = Checker(ops, final)
    violations = checker.run()
    with open(os.path.join(a.run, "violations.txt"), "w") as f:
        f.write("\n".join(violations) + "\n" if violations else "")
    shown = violations if not a.expect_violations else violations[:25]
    for v in shown:
        print(v)
    if len(shown) < len(violations):
        print(f"... and {len(violations) - len(shown)} more in violations.txt")
    line, acked = summary(ops, faults, span, violations, final)
    print(line)
    failed = []
    if a.expect_violations and not violations:
        failed.append("the self-check found no violation: the checker cannot fail")
    if not a.expect_violations and violations:
        failed.append(f"{len(violations)} violations")
    if acked < a.require_ok:
        failed.append(f"only {acked} acknowledged operations, {a.require_ok} required")
    if a.require_all_faults:
        missing = sorted(set(final["fault_kinds"]) - set(faults))
        if missing:
            failed.append(f"faults never injected: {', '.join(missing)}")
    for f in failed:
        print(f"history: FAILED: {f}")
    if a.expect_violations and violations:
        print("history: self-check ok: without the fence the checker reports violations")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
