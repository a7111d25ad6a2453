#!/usr/bin/python3
"""etcd_cycle.py - etcd lock/unlock cycle: lockfence from SQL vs floor clients.

Measures the full acquire+release cycle of an etcd lock: N concurrent
holders (one process each) loop on ONE lock name, for each holder count
given (default 1 and 8).  A cycle is timed from the start of the acquire
to the end of the release.  The clients (issue 9, item 3):

  lockfence      (a) one PostgreSQL session per holder, driven from C
                 (etcd_floor.c, mode sql: libpq, prepared statements,
                 autocommit), so that the figure is lockfence's and not a
                 driver's, as the floors are C too:
                   SELECT key, token FROM lockfence.etcd_lock(name, ttl)
                   SELECT lockfence.etcd_unlock(key)
  lockfence-py   (a) the same two statements from Python (psycopg 3,
                 autocommit), what a Python application pays on top
  lease-floor    (b) C (etcd_floor.c, mode lease): a lease per cycle and
                 etcd's lock service: lease/grant, lock/lock, kv/range of
                 the key (the token; etcd 3.4 needs this read), lease/revoke
  session-floor  (c) C (mode session), the UNCONTENDED floor, run with 1
                 holder only (it never waits): one session lease per
                 holder, granted before the run; kv/txn creating
                 NAME/<lease hex> if absent, kv/range of the key (token),
                 kv/deleterange.  3 requests, 2 raft writes
  locksvc        (d) C (mode locksvc): etcd's own lock service on a session
                 lease: lock/lock, kv/range of the key, lock/unlock
  watch-py       (d) Python (this file, stdlib only): the etcd Mutex
                 protocol on the client with a SYNCED watch: own key
                 NAME/<lease hex> on the session lease (txn: create if
                 absent); predecessor = the key under NAME/ with the highest
                 create_revision below one's own; a watch on it created
                 WITHOUT start_revision (so etcd keeps it among its synced
                 watchers and sends the delete at once), then, once etcd
                 says "created", a range of the predecessor (a delete just
                 before the watch existed is not missed): gone, or
                 re-created with another create_revision (a session's
                 key is reused by its next lock) -> look again, else wait
                 for its DELETE event and look again.
                 Holder when there is no predecessor; then a read of its
                 own key (gone: lock lost; else create_revision = token),
                 and kv/deleterange to release
  watch-c        (d) the same protocol in C (etcd_floor.c, mode watch;
                 libcurl, the watch on a multi handle of its own)

All clients run side by side in one run, in interleaved rounds (round 1:
every holder count, every client; round 2: the same; ...), so drift on a
shared machine hits all of them.  Each client uses its own lock name
(NAME-client), which must be empty before each of its rounds.  Every
client's grants are checked for safety: sorted by token (tokens unique),
no hold starts before the previous one ended (CLOCK_MONOTONIC is
system-wide on Linux, so times from different processes compare); the run
aborts if that is violated.

Prints, per holder count, p50/p99 and cycles/s per client, the etcd
requests per cycle (etcd's grpc_server_started_total counters: session
lease grants, keepalives and revokes, and watch streams, count too), and
lockfence's ratios to each client; then PASS/FAIL lines for the issue's
targets, and "RESULT name=ID median=M min=LO max=HI n=N" lines from the
per-round figures, which bench/all.sh reads.  The exit status does not depend on the targets (a benchmark is
not a test): it is non-zero only when a client fails or a safety check
does.  /usr/bin/python3 with Debian's python3-psycopg; standard library
otherwise.
"""

import argparse
import base64
import http.client
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import urllib.parse

CLIENTS = ("lockfence", "lockfence-py", "lease-floor", "session-floor", "locksvc", "watch-py", "watch-c")
C_MODES = {"lockfence": "sql", "lease-floor": "lease", "session-floor": "session", "locksvc": "locksvc",
           "watch-c": "watch"}
DESCRIPTIONS = {
    "lockfence": "(a) SQL from C: etcd_lock + etcd_unlock",
    "lockfence-py": "(a) the same SQL from Python (psycopg)",
    "lease-floor": "(b) C: lease per cycle, lock service",
    "session-floor": "(c) C: session lease, txn/range/delete",
    "locksvc": "(d) C: lock service on a session lease",
    "watch-py": "(d) Python: Mutex with a synced watch",
    "watch-c": "(d) C: Mutex with a synced watch",
}


def b64(s):
    if isinstance(s, str):
        s = s.encode()
    return base64.b64encode(s).decode()


def prefix_end(prefix):
    """The range_end covering every key that starts with prefix (bytes)."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xff:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"


def http_conn(url, timeout=60):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


class Etcd:
    """One kept-alive HTTP connection to an etcd member's JSON gateway."""

    def __init__(self, url):
        self.conn = http_conn(url)

    def post(self, path, doc):
        self.conn.request("POST", path, body=json.dumps(doc),
                          headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError("%s: HTTP %d %s" % (path, r.status, data[:200]))
        return json.loads(data)


class Watch:
    """A watch on one key, on its own connection (the stream occupies it).

    Created without start_revision: etcd starts it at the current revision
    and so counts it among its synced watchers, which get each event as it
    is written (a watch from a past revision is "unsynced" and is only
    caught up at etcd's 100 ms sync tick).  Returns once etcd has answered
    "created": from then on no event on the key is missed."""

    def __init__(self, url, key_b64):
        self.conn = http_conn(url)
        self.conn.request("POST", "/v3/watch",
                          body=json.dumps({"create_request": {"key": key_b64}}),
                          headers={"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        if self.resp.status != 200:
            raise RuntimeError("watch: HTTP %d %s" % (self.resp.status,
                                                      self.resp.read()[:200]))
        while not self.next().get("created"):
            pass

    def next(self):
        line = self.resp.readline()
        if not line:
            raise RuntimeError("watch stream ended")
        doc = json.loads(line)
        if "error" in doc:
            raise RuntimeError("watch: %s" % (doc["error"],))
        res = doc.get("result", {})
        if res.get("canceled"):
            raise RuntimeError("watch canceled: %s" % (res,))
        return res

    def wait_delete(self):
        while True:
            for ev in self.next().get("events", []):
                if ev.get("type") == "DELETE":
                    return

    def close(self):
        self.conn.close()


class Session:
    """A session lease, as etcd's concurrency.Session: granted once, renewed
    between cycles once a third of its TTL has gone by, revoked at the end."""

    def __init__(self, etcd, ttl):
        self.etcd = etcd
        self.ttl = ttl
        self.id = etcd.post("/v3/lease/grant", {"TTL": str(ttl)})["ID"]
        self.hex = "%x" % int(self.id)
        self.renewed = time.monotonic()

    def keep_alive(self):
        if time.monotonic() - self.renewed < self.ttl / 3.0:
            return
        res = self.etcd.post("/v3/lease/keepalive", {"ID": self.id}).get("result", {})
        if "TTL" not in res:
            raise RuntimeError("session lease %s lost" % self.id)
        self.renewed = time.monotonic()

    def revoke(self):
        self.etcd.post("/v3/lease/revoke", {"ID": self.id})


def watch_client(url, name, ttl):
    """The synced-watch Mutex client: returns (cycle, between, close)."""
    etcd = Etcd(url)
    session = Session(etcd, ttl)
    prefix = (name + "/").encode()
    pfx_b64, end_b64 = b64(prefix), b64(prefix_end(prefix))
    key_b64 = b64(prefix + session.hex.encode())
    create = {"compare": [{"target": "CREATE", "key": key_b64, "create_revision": "0"}],
              "success": [{"request_put": {"key": key_b64, "lease": session.id}}],
              "failure": [{"request_range": {"key": key_b64}}]}

    def cycle():
        txn = etcd.post("/v3/kv/txn", create)
        if txn.get("succeeded"):
            # a txn with one put: its revision is the key's create_revision
            own = int(txn["header"]["revision"])
        else:
            own = int(txn["responses"][0]["response_range"]["kvs"][0]["create_revision"])
        while True:
            kvs = etcd.post("/v3/kv/range", {
                "key": pfx_b64, "range_end": end_b64,
                "max_create_revision": str(own - 1),
                "sort_order": "DESCEND", "sort_target": "CREATE",
                "limit": "1"}).get("kvs")
            if not kvs:
                break
            pred, pred_rev = kvs[0]["key"], kvs[0]["create_revision"]
            w = Watch(url, pred)
            try:
                # The same key with another create_revision is not the
                # predecessor: with session leases a holder re-creates its
                # key NAME/<lease hex> on its next lock, then behind us;
                # waiting for that key's delete would deadlock.
                again = etcd.post("/v3/kv/range", {"key": pred}).get("kvs")
                if again and again[0]["create_revision"] == pred_rev:
                    w.wait_delete()
            finally:
                w.close()
        # etcd 3.4's lost-lock guard: a key (or lease) gone while waiting
        # must never yield a token
        kvs = etcd.post("/v3/kv/range", {"key": key_b64}).get("kvs")
        if not kvs or int(kvs[0]["create_revision"]) != own:
            raise RuntimeError("own key vanished while waiting: lock lost")
        t_acq = time.monotonic()
        # held until the release request leaves: the next holder may get
        # the lock before its reply comes back
        t_rel = time.monotonic()
        etcd.post("/v3/kv/deleterange", {"key": key_b64})
        return own, t_acq, t_rel

    return cycle, session.keep_alive, session.revoke


def lockfence_client(dsn, url, name, ttl):
    """One PostgreSQL session: returns (cycle, between, close)."""
    import psycopg
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
    cur = conn.cursor()
    cur.execute("SET lockfence.etcd_endpoints = %s" % quote(url))

    def cycle():
        cur.execute("SELECT key, token FROM lockfence.etcd_lock(%s, %s)", (name, ttl))
        key, token = cur.fetchone()
        t_acq = time.monotonic()
        t_rel = time.monotonic()
        cur.execute("SELECT lockfence.etcd_unlock(%s)", (key,))
        ok = cur.fetchone()[0]
        if ok is not True:
            raise RuntimeError("etcd_unlock returned %r" % (ok,))
        return token, t_acq, t_rel

    return cycle, lambda: None, conn.close


def worker(client, args, name, start_at, stop_at, out):
    """One holder: loop cycles from start_at to stop_at, send results to out."""
    lat = []
    grants = []
    try:
        if client == "lockfence-py":
            cycle, between, close = lockfence_client(args.dsn, args.etcd, name, args.ttl)
        else:
            cycle, between, close = watch_client(args.etcd, name, args.ttl)
        while time.monotonic() < start_at:
            time.sleep(0.001)
        while True:
            t0 = time.monotonic()
            if t0 >= stop_at:
                break
            token, t_acq, t_rel = cycle()
            lat.append(time.monotonic() - t0)
            grants.append((token, t_acq, t_rel))
            between()
        close()
        out.put((lat, grants, None))
    except Exception as e:  # report, do not hang the parent
        out.put((lat, grants, "%s: %s" % (type(e).__name__, e)))


def etcd_requests(url):
    """Requests etcd's gRPC server has started so far (the gateway's too),
    by method (Range, Txn, DeleteRange, Lock, Watch, LeaseKeepAlive...)."""
    conn = http_conn(url, 10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    counts = {}
    for line in text.splitlines():
        if line.startswith("grpc_server_started_total{"):
            method = line.split('grpc_method="', 1)[1].split('"', 1)[0]
            counts[method] = counts.get(method, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def delta(after, before):
    d = {m: n - before.get(m, 0) for m, n in after.items()}
    return {m: n for m, n in d.items() if n}


def add(a, b):
    return {m: a.get(m, 0) + b.get(m, 0) for m in set(a) | set(b)}


def keys_under(url, name):
    prefix = (name + "/").encode()
    conn = http_conn(url, 10)
    conn.request("POST", "/v3/kv/range",
                 body=json.dumps({"key": b64(prefix), "range_end": b64(prefix_end(prefix)),
                                  "count_only": True}),
                 headers={"Content-Type": "application/json"})
    n = int(json.loads(conn.getresponse().read()).get("count", 0))
    conn.close()
    return n


def wait_clean(args, name):
    """A round starts with no key under NAME/ (leftovers would queue it)."""
    deadline = time.monotonic() + args.ttl + 5
    while keys_under(args.etcd, name):
        if time.monotonic() > deadline:
            raise SystemExit("keys left under %s/ for over %d s" % (name, args.ttl + 5))
        time.sleep(0.1)


def run_round_c(args, client, name, holders, seconds):
    """Run the C floor (etcd_floor) in the client's mode."""
    start_at = time.monotonic() + 0.5
    stop_at = start_at + seconds
    p = subprocess.run([args.floor_bin, args.etcd, name, str(holders),
                        "%.6f" % start_at, "%.6f" % stop_at, str(args.ttl),
                        C_MODES[client]],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=dict(os.environ, LOCKFENCE_DSN=args.dsn),
                       timeout=seconds + 120)
    if p.returncode != 0:
        raise SystemExit("%s round failed: %s" % (client, p.stderr.decode()[:500]))
    lat, grants = [], []
    for line in p.stdout.decode().splitlines():
        tok, acq, rel, l = line.split()
        lat.append(float(l))
        grants.append((int(tok), float(acq), float(rel)))
    return lat, grants


def run_round_py(args, client, name, holders, seconds):
    out = mp.Queue()
    start_at = time.monotonic() + 1.0 + 0.05 * holders  # time to connect
    stop_at = start_at + seconds
    procs = [mp.Process(target=worker, args=(client, args, name, start_at, stop_at, out))
             for _ in range(holders)]
    for p in procs:
        p.start()
    res = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    errors = [r[2] for r in res if r[2]]
    if errors:
        raise SystemExit("%s round failed: %s" % (client, errors[0]))
    return [x for r in res for x in r[0]], [g for r in res for g in r[1]]


def run_round(args, client, holders, seconds):
    """Run holders concurrent holders of one client for some seconds.

    Returns latencies, grants, and the etcd requests the round caused."""
    name = "%s-%s" % (args.name, client)
    wait_clean(args, name)
    before = etcd_requests(args.etcd)
    if client in C_MODES:
        lat, grants = run_round_c(args, client, name, holders, seconds)
    else:
        lat, grants = run_round_py(args, client, name, holders, seconds)
    return lat, grants, delta(etcd_requests(args.etcd), before)


def check_safety(client, grants):
    """Tokens unique, and in token order the holds never overlap."""
    grants = sorted(grants)
    for a, b in zip(grants, grants[1:]):
        if a[0] == b[0]:
            raise SystemExit("%s: token %d granted twice" % (client, a[0]))
        if b[1] < a[2]:
            raise SystemExit("%s: token %d acquired at %.6f before token %d released at %.6f"
                             % (client, b[0], b[1], a[0], a[2]))


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[i]


def quote(s):
    return "'" + s.replace("'", "''") + "'"


def clients_for(args, holders):
    """session-floor never waits for a predecessor: a lock only alone."""
    return [c for c in args.clients
            if (c not in C_MODES or args.floor_bin)
            and not (c == "session-floor" and holders != 1)]


def print_table(args, summary, holders):
    res = summary["holders"][str(holders)]
    lf = res.get("lockfence")
    print()
    print("%d holder%s on one lock name:" % (holders, "" if holders == 1 else "s"))
    print("  %-14s %-40s %7s %9s %9s %9s %9s %11s %11s"
          % ("client", "", "cycles", "p50 ms", "p99 ms", "cycles/s", "req/cyc",
             "lf/it p50", "lf/it cyc/s"))
    for c in clients_for(args, holders):
        r = res[c]
        rp50 = rtp = "-"
        if lf and c != "lockfence" and r["cycles"] and lf["cycles"]:
            r["lockfence_p50_ratio"] = lf["p50_ms"] / r["p50_ms"]
            r["lockfence_throughput_ratio"] = lf["cycles_per_s"] / r["cycles_per_s"]
            rp50 = "%.2fx" % r["lockfence_p50_ratio"]
            rtp = "%.2fx" % r["lockfence_throughput_ratio"]
        print("  %-14s %-40s %7d %9.2f %9.2f %9.1f %9s %11s %11s"
              % (c, DESCRIPTIONS[c], r["cycles"], r["p50_ms"], r["p99_ms"],
                 r["cycles_per_s"],
                 "%.1f" % r["requests_per_cycle"] if r["requests_per_cycle"] else "-",
                 rp50, rtp))
    print("  etcd requests per cycle by method:")
    for c in clients_for(args, holders):
        print("    %-14s %s" % (c, ", ".join("%s %.2f" % mv for mv in
                                            res[c]["requests_per_cycle_by_method"].items())))


def verdict(ok):
    return "PASS" if ok else "FAIL"


def print_targets(summary):
    """The issue's targets; informative only (never the exit status)."""
    h = summary["holders"]
    lines = []
    one = h.get("1", {})
    if "lockfence" in one and "session-floor" in one:
        r = one["lockfence"]["p50_ms"] / one["session-floor"]["p50_ms"]
        # each round's ratio too: the two ran side by side within a round
        per_round = ", ".join("%.2fx" % (a / b) for a, b in
                              zip(one["lockfence"]["round_p50_ms"],
                                  one["session-floor"]["round_p50_ms"]))
        lines.append("%s  1 holder: lockfence p50 %.2f ms = %.2fx the session-lease floor's"
                     " %.2f ms (target <= 1.15x; rounds %s)"
                     % (verdict(r <= 1.15), one["lockfence"]["p50_ms"], r,
                        one["session-floor"]["p50_ms"], per_round))
    eight = h.get("8", {})
    if "lockfence" in eight:
        lf = eight["lockfence"]
        lines.append("%s  8 holders: lockfence p50 %.2f ms (target <= 20 ms)"
                     % (verdict(lf["p50_ms"] <= 20), lf["p50_ms"]))
        lines.append("%s  8 holders: lockfence %.1f cycles/s (target >= 300)"
                     % (verdict(lf["cycles_per_s"] >= 300), lf["cycles_per_s"]))
    for k in sorted(h, key=int):
        if int(k) > 1 and "lockfence" in h[k] and "locksvc" in h[k]:
            lf, ls = h[k]["lockfence"], h[k]["locksvc"]
            # "beats" beyond noise: 10 % better on both counts
            lines.append("%s  %s holders: lockfence beats etcd's lock service by over 10 %%:"
                         " p50 %.2f vs %.2f ms, %.1f vs %.1f cycles/s"
                         % (verdict(lf["p50_ms"] < 0.9 * ls["p50_ms"]
                                    and lf["cycles_per_s"] > 1.1 * ls["cycles_per_s"]),
                            k, lf["p50_ms"], ls["p50_ms"], lf["cycles_per_s"],
                            ls["cycles_per_s"]))
    if lines:
        print()
        print("issue 9 targets (informative; not the exit status):")
        for line in lines:
            print("  " + line)
    summary["targets"] = lines


def print_results(summary):
    """Machine-readable lines for bench/all.sh, from the per-round figures
    (each round ran every client side by side): "RESULT name=ID median=M
    min=LO max=HI n=N" for the targets of issue 21 (item 4)."""
    h = summary["holders"]

    def emit(name, vals):
        vals = sorted(vals)
        if not vals:
            return
        n = len(vals)
        med = vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
        print("RESULT name=%s median=%.4f min=%.4f max=%.4f n=%d" % (name, med, vals[0], vals[-1], n))

    def per_round(k, a, b, field):
        if a in h.get(k, {}) and b in h.get(k, {}):
            return [x / y for x, y in zip(h[k][a][field], h[k][b][field]) if y]
        return []

    print()
    emit("E1_p50_vs_session_floor", per_round("1", "lockfence", "session-floor", "round_p50_ms"))
    for k in sorted(h, key=int):
        if "lockfence" in h[k]:
            emit("E%s_p50_ms" % k, h[k]["lockfence"]["round_p50_ms"])
            emit("E%s_cycles_per_s" % k, h[k]["lockfence"]["round_cycles_per_s"])
        if int(k) > 1:
            emit("E%s_p50_vs_watch_c" % k, per_round(k, "lockfence", "watch-c", "round_p50_ms"))
            emit("E%s_watch_c_vs_cycles_per_s" % k,
                 per_round(k, "watch-c", "lockfence", "round_cycles_per_s"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--etcd", required=True, help="etcd client URL (http)")
    ap.add_argument("--dsn", required=True, help="libpq connection string")
    ap.add_argument("--holders", default="1,8",
                    help="comma-separated holder counts (default 1,8; e.g. 1,8,32)")
    ap.add_argument("--seconds", type=float, default=5.0,
                    help="per round, holder count and client")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ttl", type=int, default=30)
    ap.add_argument("--name", default="bench-cycle")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--floor-bin", help="the C floor client (etcd_floor); "
                    "without it the C clients are left out")
    ap.add_argument("--clients", default=",".join(CLIENTS),
                    help="comma-separated subset of: " + ", ".join(CLIENTS))
    args = ap.parse_args()
    wanted = args.clients.split(",")
    unknown = set(wanted) - set(CLIENTS)
    args.clients = [c for c in CLIENTS if c in wanted]
    holder_counts = [int(x) for x in args.holders.split(",")]
    if unknown or not args.clients or min(holder_counts) < 1:
        ap.error("bad --clients or --holders")

    # Warm-up: one short round per client, discarded.
    for c in clients_for(args, 1):
        run_round(args, c, 1, 1.0)

    acc = {(h, c): ([], [], {}) for h in holder_counts for c in CLIENTS}
    round_p50 = {(h, c): [] for h in holder_counts for c in CLIENTS}
    round_cps = {(h, c): [] for h in holder_counts for c in CLIENTS}
    for r in range(args.rounds):
        for h in holder_counts:
            for c in clients_for(args, h):
                lat, grants, nreq = run_round(args, c, h, args.seconds)
                check_safety(c, grants)
                a = acc[(h, c)]
                acc[(h, c)] = (a[0] + lat, a[1] + grants, add(a[2], nreq))
                round_p50[(h, c)].append(pct(sorted(lat), 50) * 1e3)
                round_cps[(h, c)].append(len(lat) / args.seconds)
                sys.stderr.write("round %d, %2d holders, %-13s cycles %6d  p50 %8.3f ms\n"
                                 % (r + 1, h, c, len(lat), pct(sorted(lat), 50) * 1e3))

    total = args.rounds * args.seconds
    summary = {"seconds_per_round": args.seconds, "rounds": args.rounds,
               "ttl": args.ttl, "holders": {}}
    print("etcd lock/unlock cycle, one lock name per client, %d round%s x %g s per"
          " holder count and client, interleaved"
          % (args.rounds, "" if args.rounds == 1 else "s", args.seconds))
    print("lf/it: lockfence's p50 over the client's (lower is better for lockfence),"
          " lockfence's cycles/s over the client's (higher is better)")
    for h in holder_counts:
        summary["holders"][str(h)] = {}
        for c in clients_for(args, h):
            lat = sorted(acc[(h, c)][0])
            n = len(lat)
            summary["holders"][str(h)][c] = {
                "cycles": n, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
                "round_p50_ms": round_p50[(h, c)],
                "round_cycles_per_s": round_cps[(h, c)],
                "cycles_per_s": n / total,
                "requests_per_cycle": sum(acc[(h, c)][2].values()) / n if n else None,
                "requests_per_cycle_by_method": {m: k / n for m, k in
                                                 sorted(acc[(h, c)][2].items())} if n else {}}
        print_table(args, summary, h)
    print_targets(summary)
    print_results(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
