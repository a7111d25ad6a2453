#!/usr/bin/python3
"""etcd_cycle.py - lock/unlock cycle latency: lockfence from SQL vs a floor client.

Measures the full acquire+release cycle of an etcd lock under contention:
N concurrent holders (default 8, one process each) loop on ONE lock name.

  floor      a minimal client outside PostgreSQL (etcd_floor.c with
             --floor-bin, else the Python client below): one kept-alive
             HTTP/1.1 connection per holder, the fewest etcd gateway
             requests the lock protocol needs for a fenced cycle:
               lease/grant -> lock/lock -> kv/range (token = create_revision
               of the lock key; etcd 3.4 needs this read, see
               shared notes) -> lease/revoke (deletes the key: releases)
  lockfence  one PostgreSQL session per holder (psycopg, autocommit,
             prepared statements):
               SELECT key, token FROM lockfence.etcd_lock(name, ttl)
               SELECT lockfence.etcd_unlock(key)

The two are measured side by side in one run, in alternating rounds
(floor, lockfence, floor, lockfence, ...) so drift on a shared machine
hits both.  Each side's grants are checked for safety: sorted by token,
no two holders' [acquired, released] intervals overlap (CLOCK_MONOTONIC
is system-wide on Linux, so times from different processes compare).

Prints p50/p99 per side, the etcd requests per cycle (from etcd's own
grpc_server_started_total counters) and the ratios lockfence/floor.  /usr/bin/python3
with Debian's python3-psycopg; standard library otherwise.
"""

import argparse
import base64
import subprocess
import http.client
import json
import multiprocessing as mp
import os
import sys
import time
import urllib.parse


def b64(s):
    return base64.b64encode(s.encode()).decode()


class Etcd:
    """One kept-alive HTTP connection to an etcd member's JSON gateway."""

    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        self.requests = 0

    def post(self, path, doc):
        body = json.dumps(doc)
        self.conn.request("POST", path, body=body,
                          headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        self.requests += 1
        if r.status != 200:
            raise RuntimeError("%s: HTTP %d %s" % (path, r.status, data[:200]))
        return json.loads(data)


def floor_cycle(etcd, name_b64, ttl):
    """One fenced cycle with the fewest requests; returns (token, t_acq, t_rel)."""
    lease = etcd.post("/v3/lease/grant", {"TTL": str(ttl)})["ID"]
    key = etcd.post("/v3/lock/lock", {"name": name_b64, "lease": lease})["key"]
    kvs = etcd.post("/v3/kv/range", {"key": key}).get("kvs")
    if not kvs:
        raise RuntimeError("lock key vanished: lock lost")
    token = int(kvs[0]["create_revision"])
    t_acq = time.monotonic()
    t_rel = time.monotonic()
    etcd.post("/v3/lease/revoke", {"ID": lease})
    return token, t_acq, t_rel


def worker(side, args, start_at, stop_at, out):
    """One holder: loop cycles from start_at to stop_at, send results to out."""
    lat = []
    grants = []
    nreq = 0
    try:
        if side == "floor":
            etcd = Etcd(args.etcd)
            name = b64(args.name)
            cycle = lambda: floor_cycle(etcd, name, args.ttl)
        else:
            import psycopg
            conn = psycopg.connect(args.dsn, autocommit=True, prepare_threshold=0)
            cur = conn.cursor()
            cur.execute("SET lockfence.etcd_endpoints = %s" % quote(args.etcd))

            def cycle():
                cur.execute("SELECT key, token FROM lockfence.etcd_lock(%s, %s)",
                            (args.name, args.ttl))
                key, token = cur.fetchone()
                t_acq = time.monotonic()
                # Held from here until the unlock request leaves: the next
                # holder may legitimately get the lock before our unlock's
                # reply comes back.
                t_rel = time.monotonic()
                cur.execute("SELECT lockfence.etcd_unlock(%s)", (key,))
                ok = cur.fetchone()[0]
                if ok is not True:
                    raise RuntimeError("etcd_unlock returned %r" % (ok,))
                return token, t_acq, t_rel

        while time.monotonic() < start_at:
            time.sleep(0.001)
        while True:
            t0 = time.monotonic()
            if t0 >= stop_at:
                break
            token, t_acq, t_rel = cycle()
            t1 = time.monotonic()
            lat.append(t1 - t0)
            grants.append((token, t_acq, t_rel))
        if side == "floor":
            nreq = etcd.requests
        out.put((side, lat, grants, nreq, None))
    except Exception as e:  # report, do not hang the parent
        out.put((side, lat, grants, nreq, "%s: %s" % (type(e).__name__, e)))


def etcd_requests(url):
    """Requests etcd's gRPC server has started so far (the gateway's too)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    total = 0
    for line in text.splitlines():
        if line.startswith("grpc_server_started_total{"):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def run_round_c(args, seconds):
    """Run the C floor (etcd_floor) with args.holders processes."""
    start_at = time.monotonic() + 0.5
    stop_at = start_at + seconds
    p = subprocess.run([args.floor_bin, args.etcd, args.name, str(args.holders),
                        "%.6f" % start_at, "%.6f" % stop_at, str(args.ttl)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=seconds + 120)
    if p.returncode != 0:
        raise SystemExit("floor round failed: %s" % p.stderr.decode()[:500])
    lat, grants = [], []
    for line in p.stdout.decode().splitlines():
        tok, acq, rel, l = line.split()
        lat.append(float(l))
        grants.append((int(tok), float(acq), float(rel)))
    return lat, grants


def quote(s):
    return "'" + s.replace("'", "''") + "'"


def run_round(side, args, seconds):
    """Run args.holders concurrent holders of one side for some seconds.

    Returns latencies, grants, and the etcd requests the round caused."""
    before = etcd_requests(args.etcd)
    if side == "floor" and args.floor_bin:
        lat, grants = run_round_c(args, seconds)
        return lat, grants, etcd_requests(args.etcd) - before
    out = mp.Queue()
    start_at = time.monotonic() + 1.0  # time for processes to connect
    stop_at = start_at + seconds
    procs = [mp.Process(target=worker, args=(side, args, start_at, stop_at, out))
             for _ in range(args.holders)]
    for p in procs:
        p.start()
    res = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    errors = [r[4] for r in res if r[4]]
    if errors:
        raise SystemExit("%s round failed: %s" % (side, errors[0]))
    lat = [x for r in res for x in r[1]]
    grants = [g for r in res for g in r[2]]
    return lat, grants, etcd_requests(args.etcd) - before


def check_safety(side, grants):
    """Tokens unique, and in token order the holds never overlap."""
    grants = sorted(grants)
    for a, b in zip(grants, grants[1:]):
        if a[0] == b[0]:
            raise SystemExit("%s: token %d granted twice" % (side, a[0]))
        if b[1] < a[2]:
            raise SystemExit("%s: token %d acquired at %.6f before token %d released at %.6f"
                             % (side, b[0], b[1], a[0], a[2]))


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[i]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--etcd", required=True, help="etcd client URL (http)")
    ap.add_argument("--dsn", required=True, help="libpq connection string")
    ap.add_argument("--holders", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0, help="per round and side")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ttl", type=int, default=30)
    ap.add_argument("--name", default="bench-cycle")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--floor-bin", help="the C floor client (etcd_floor); "
                    "without it the floor is this script's Python client")
    ap.add_argument("--only", choices=("floor", "lockfence"),
                    help="measure one side only (no ratios)")
    args = ap.parse_args()

    sides = (args.only,) if args.only else ("floor", "lockfence")
    # Warm-up: one short round per side, discarded.
    for side in sides:
        run_round(side, args, 1.0)

    res = {"floor": ([], [], 0), "lockfence": ([], [], 0)}
    for r in range(args.rounds):
        for side in sides:
            lat, grants, nreq = run_round(side, args, args.seconds)
            check_safety(side, grants)
            res[side] = (res[side][0] + lat, res[side][1] + grants, res[side][2] + nreq)
            sys.stderr.write("round %d %-9s cycles %6d  p50 %.3f ms\n"
                             % (r + 1, side, len(lat), pct(sorted(lat), 50) * 1e3))

    summary = {"holders": args.holders, "seconds_per_round": args.seconds,
               "rounds": args.rounds,
               "floor_client": "C libcurl" if args.floor_bin else "Python http.client"}
    print("etcd lock/unlock cycle, %d holders on one lock name, %d x %.0f s per side;"
          " floor: %s" % (args.holders, args.rounds, args.seconds, summary["floor_client"]))
    print("%-10s %8s %10s %10s %10s %12s" % ("side", "cycles", "p50 ms", "p99 ms",
                                             "cycles/s", "req/cycle"))
    total = args.rounds * args.seconds
    for side in sides:
        lat = sorted(res[side][0])
        n = len(lat)
        rpc = (res[side][2] / n) if n else None
        summary[side] = {"cycles": n, "p50_ms": pct(lat, 50) * 1e3,
                         "etcd_requests_per_cycle": rpc,
                         "p99_ms": pct(lat, 99) * 1e3, "cycles_per_s": n / total}
        print("%-10s %8d %10.3f %10.3f %10.1f %12s"
              % (side, n, summary[side]["p50_ms"], summary[side]["p99_ms"],
                 n / total, "%.1f" % rpc if rpc else "-"))
    if args.only:
        return
    for p in ("p50", "p99"):
        ratio = summary["lockfence"][p + "_ms"] / summary["floor"][p + "_ms"]
        summary["ratio_" + p] = ratio
        print("ratio lockfence/floor %s: %.2fx" % (p, ratio))
    summary["ratio_throughput"] = (summary["floor"]["cycles_per_s"]
                                   / summary["lockfence"]["cycles_per_s"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
