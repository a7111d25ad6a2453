#!/usr/bin/python3
"""harness.py: workers, a nemesis and a history, for the lockfence history test.

Started by run.sh, which starts the servers and passes their addresses in
HISTORY_* environment variables.  Nine worker processes (three per lock
service: etcd through lockfence's own etcd_lock, Redis INCR tokens,
ZooKeeper czxid tokens) loop: choose a workload, take the lock(s), do one
to four operations under them, each in its own transaction, release.  The
main process is the nemesis: it injects the faults of a schedule drawn from
the seed.  Every step is a JSON line in history.jsonl:

  {"time": 12.345678, "process": "etcd-1", "type": "invoke", "f": "counter",
   "op": "etcd-1-17", "resource": ["etcd/counter"], "token": [4711],
   "holder": ["hist/etcd/counter/694d8a1b7c2e0f13"]}
  {"time": 12.351002, "process": "etcd-1", "type": "ok", "f": "counter",
   "op": "etcd-1-17", ..., "read": [41], "write": [42]}

type is invoke, then ok (committed), fail (certainly not committed: the
server answered with an error, e.g. LF001 from the fence) or info (unknown:
the connection broke).  time is CLOCK_MONOTONIC seconds since the run
began, one clock for all processes.  After the run, the final state of the
database goes to final.json; checker.py reads only these two files.

Every write transaction ends by inserting one row per resource it wrote
into hist.witness; the row takes its seq from a sequence at that moment.
The fence holds the resource's fence row locked until commit, so for one
resource the seq order of committed transactions is their commit order.
"""

import argparse
import base64
import json
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request

import psycopg

from workloads import Workloads, create_tables, resources

DIR = os.environ.get("HISTORY_DIR", "")
PG_BIN = os.environ.get("HISTORY_PG_BIN", "")
PG_PORT = os.environ.get("HISTORY_PG_PORT", "")
ETCD_PORTS = [int(p) for p in os.environ.get("HISTORY_ETCD", "").split()]
REDIS_PORTS = [int(p) for p in os.environ.get("HISTORY_REDIS", "").split()]
ZK_HOSTS = os.environ.get("HISTORY_ZK", "")

SERVICES = ("etcd", "redis", "zk")
WORKERS_PER_SERVICE = 3
TTL = 3                 # seconds: etcd lease, Redis lock expiry
ZK_SESSION = 2.0        # seconds: ZooKeeper session timeout

# How long each fault lasts (seconds), for spacing the schedule.
FAULTS = {
    "etcd-leader-kill": 4,      # SIGKILL the etcd leader, restart it 2 s later
    "etcd-member-stop": 4,      # SIGSTOP one etcd member for 4 s
    "etcd-member-cut": 5,       # the fault proxy cuts a member off for 5 s
    "redis-failover": 3,        # a failover that loses INCRs: tokens regress
    "zk-session-expiry": 5,     # SIGSTOP a ZooKeeper worker past its session
    "worker-pause": 5,          # SIGSTOP an etcd or Redis worker past its TTL
    "pg-crash": 3,              # pg_ctl stop -m immediate, then start
}

T0 = time.monotonic()


# ---------------------------------------------------------------------------
# The fault schedule: a pure function of the seed and the run's length
# ---------------------------------------------------------------------------

def make_schedule(seed, seconds):
    """[(at, kind, target)]: every kind once in a shuffled order, then random."""
    rng = random.Random(seed)
    first = sorted(FAULTS)
    rng.shuffle(first)
    plan, t = [], 8.0
    while t < seconds - 10:
        kind = first.pop(0) if first else rng.choice(sorted(FAULTS))
        plan.append((round(t, 1), kind, rng.randrange(1 << 16)))
        t += FAULTS[kind] + rng.uniform(4, 10)
    return plan


def schedule_text(plan):
    return "".join(f"{at:7.1f}s {kind} target={target}\n" for at, kind, target in plan)


# ---------------------------------------------------------------------------
# History
# ---------------------------------------------------------------------------

class History:
    """One process's part of the history, a JSON line per event."""

    def __init__(self, out, process):
        self.process = process
        self.file = open(os.path.join(out, f"part-{process}.jsonl"), "a", buffering=1)

    def record(self, type_, f, **fields):
        rec = {"time": round(time.monotonic() - T0, 6), "process": self.process,
               "type": type_, "f": f}
        rec.update(fields)
        self.file.write(json.dumps(rec) + "\n")


def merge_history(out):
    events = []
    for name in sorted(os.listdir(out)):
        if name.startswith("part-"):
            with open(os.path.join(out, name)) as f:
                events += [json.loads(line) for line in f if line.endswith("\n")]
            os.unlink(os.path.join(out, name))
    events.sort(key=lambda e: e["time"])
    with open(os.path.join(out, "history.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)
    return events


# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

def dsn(dbname):
    return f"host=127.0.0.1 port={PG_PORT} user=postgres dbname={dbname}"


def connect(dbname, timeout=3):
    # A worker SIGSTOPped inside a transaction must not block the others
    # for long: its session ends after 2 s idle in transaction.
    return psycopg.connect(dsn(dbname), autocommit=True, connect_timeout=timeout,
                           options="-c idle_in_transaction_session_timeout=2000"
                                   " -c statement_timeout=10000 -c lock_timeout=6000")


def setup_database(dbname, fenced):
    with psycopg.connect(dsn("postgres"), autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {dbname}")
        c.execute(f"CREATE DATABASE {dbname}")
    with psycopg.connect(dsn(dbname), autocommit=True) as c:
        return create_tables(c, SERVICES, fenced)


def dump_final_state(dbname, initial, fenced, out):
    deadline = time.monotonic() + 60
    while True:
        try:
            c = connect(dbname)
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    with c:
        state = {
            "fenced": fenced,
            "fault_kinds": sorted(FAULTS),
            "initial": initial,
            "cells": dict(c.execute("SELECT resource, value FROM hist.cells").fetchall()),
            "witness": [list(r) for r in c.execute(
                "SELECT seq, op, resource, token, holder, read, written "
                "FROM hist.witness ORDER BY seq")],
            "log": [list(r) for r in c.execute(
                "SELECT op, resource, count(*), array_agg(DISTINCT token) "
                "FROM hist.log GROUP BY op, resource")],
            "fences": [list(r) for r in c.execute(
                "SELECT resource, token, holder FROM lockfence.fences ORDER BY resource")],
        }
    with open(os.path.join(out, "final.json"), "w") as f:
        json.dump(state, f)


def sqlstate(e):
    return getattr(e, "sqlstate", None) or getattr(getattr(e, "diag", None), "sqlstate", None)


def outcome_of(e):
    """fail: the server refused and rolled back; info: nobody knows."""
    code = sqlstate(e)
    if code is None or code[:2] in ("08", "57") or code == "25P03":
        return "info"
    return "fail"


# ---------------------------------------------------------------------------
# Lock services.  acquire(resource) -> (token, holder, handle)
# ---------------------------------------------------------------------------

class EtcdLocks:
    """lockfence.etcd_lock from the worker's own PostgreSQL session."""

    def __init__(self, worker):
        self.w = worker

    def acquire(self, resource):
        key, token = self.w.conn.execute(
            "SELECT key, token FROM lockfence.etcd_lock(%s, %s, '5 s')",
            (f"hist/{resource}", TTL)).fetchone()
        return token, key, key

    def release(self, key):
        self.w.conn.execute("SELECT lockfence.etcd_unlock(%s)", (key,))

    @staticmethod
    def key_of(resource, token):
        """The lock key granted with token (etcd_lock_and_fence returns only the token)."""
        prefix = f"hist/{resource}/".encode()
        body = json.dumps({"key": base64.b64encode(prefix).decode(),
                           "range_end": base64.b64encode(prefix[:-1] + b"0").decode()})
        for port in ETCD_PORTS:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v3/kv/range",
                                             body.encode(), method="POST")
                kvs = json.load(urllib.request.urlopen(req, timeout=1)).get("kvs", [])
                return next((base64.b64decode(kv["key"]).decode() for kv in kvs
                             if int(kv["create_revision"]) == token), None)
            except OSError:
                continue
        return None


RELEASE_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class RedisLocks:
    """SET lock:R holder NX PX, token from INCR fence:R, on the current primary."""

    def __init__(self, worker, primary):
        import redis
        self.redis, self.primary, self.w = redis, primary, worker
        self.client, self.port, self.n = None, None, 0

    def server(self):
        if self.port != self.primary.value:
            self.port = self.primary.value
            self.client = self.redis.Redis(host="127.0.0.1", port=self.port,
                                           socket_timeout=2, socket_connect_timeout=2)
        return self.client

    def acquire(self, resource):
        self.n += 1
        holder = f"{self.w.name}:{self.n}"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if self.server().set(f"lock:{resource}", holder, nx=True, px=TTL * 1000):
                    return self.server().incr(f"fence:{resource}"), holder, (resource, holder)
            except self.redis.RedisError:
                self.port = None          # the primary may have changed
            time.sleep(0.01)
        raise TimeoutError(f"lock:{resource} not free within 5 s")

    def release(self, handle):
        resource, holder = handle
        self.server().eval(RELEASE_LUA, 1, f"lock:{resource}", holder)


class ZkLocks:
    """kazoo's Lock recipe; the token is the czxid of the lock node."""

    def __init__(self, worker):
        from kazoo.client import KazooClient
        self.zk = KazooClient(hosts=ZK_HOSTS, timeout=ZK_SESSION)
        self.zk.start(timeout=15)
        self.w = worker

    def acquire(self, resource):
        lock = self.zk.Lock(f"/hist/{resource}", identifier=self.w.name)
        if not lock.acquire(timeout=5):
            raise TimeoutError(f"ZooKeeper lock {resource} not granted within 5 s")
        stat = self.zk.exists(f"/hist/{resource}/{lock.node}")
        if stat is None:
            raise RuntimeError("lock node gone")
        return stat.czxid, lock.node, lock

    def release(self, lock):
        lock.release()


# ---------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------

class Hold:
    def __init__(self, resource, token=None, holder=None, handle=None):
        self.resource, self.token, self.holder, self.handle = resource, token, holder, handle


class Worker(Workloads):
    """A worker process: the loop, the locks, fence(); the writes are in workloads.py."""

    def __init__(self, name, service, fenced, dbname, out, seed, primary, ok_count):
        self.name, self.service, self.fenced, self.dbname = name, service, fenced, dbname
        self.rng = random.Random(f"{seed}/{name}")
        self.hist = History(out, name)
        self.primary, self.ok_count = primary, ok_count
        self.conn, self.n = None, 0

    def pg(self):
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = None
            self.conn = connect(self.dbname, timeout=2)
        return self.conn

    def run(self, stop):
        logging.disable(logging.CRITICAL)     # kazoo's complaints on session loss
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        if self.service == "etcd":
            self.locks = EtcdLocks(self)
        elif self.service == "redis":
            self.locks = RedisLocks(self, self.primary)
        else:
            self.locks = ZkLocks(self)
        while not stop.is_set():
            try:
                self.pg()
            except psycopg.OperationalError:
                time.sleep(0.3)              # PostgreSQL restarting
                continue
            workload = self.rng.choice(("counter", "transfer", "append"))
            names = resources(self.service)[workload]
            picked = sorted(self.rng.sample(names, 2 if workload == "transfer" else 1))
            holds = self.lock_all(picked)
            if holds is None:
                time.sleep(0.1)              # the lock service may be down
                continue
            for _ in range(self.rng.randint(1, 4)):
                if stop.is_set() or not self.operation(workload, holds):
                    break
                # work between writes, outside any transaction: a pause
                # here leaves the worker believing it still holds the lock
                time.sleep(self.rng.uniform(0, 0.05))
            self.unlock_all(holds)

    # -- locks -----------------------------------------------------------

    def lock_all(self, names):
        """Take the locks of names, in sorted order; None if that failed."""
        if (self.service == "etcd" and self.fenced and len(names) == 1
                and self.rng.random() < 0.3):
            return [Hold(names[0])]     # taken by etcd_lock_and_fence in the write
        self.hist.record("invoke", "lock", resource=names)
        holds = []
        try:
            for r in names:
                holds.append(Hold(r, *self.locks.acquire(r)))
        except Exception as e:
            self.hist.record("fail", "lock", resource=names, error=short(e))
            self.unlock_all(holds, quiet=True)
            if isinstance(e, psycopg.Error) and outcome_of(e) == "info":
                self.conn = None
            return None
        self.hist.record("ok", "lock", resource=names, token=[h.token for h in holds],
                         holder=[h.holder for h in holds])
        return holds

    def unlock_all(self, holds, quiet=False):
        taken = [h for h in holds if h.handle is not None]
        if not taken:
            return
        if not quiet:
            self.hist.record("invoke", "unlock", resource=[h.resource for h in taken])
        error = None
        for h in taken:
            try:
                self.locks.release(h.handle)
            except Exception as e:            # lost already; the lease or key expires
                error = short(e)
        if not quiet:
            self.hist.record("ok" if error is None else "info", "unlock",
                             resource=[h.resource for h in taken], error=error)

    # -- one operation: one transaction ----------------------------------

    def operation(self, workload, holds):
        """Run one operation and record it; False if the holds are no longer good."""
        self.n += 1
        op = f"{self.name}-{self.n}"
        fields = {"op": op, "resource": [h.resource for h in holds]}
        if holds[0].token is None:
            self.hist.record("invoke", "lock", resource=fields["resource"])
        else:
            fields.update(token=[h.token for h in holds], holder=[h.holder for h in holds])
        self.hist.record("invoke", workload, **fields)
        try:
            with self.pg().transaction():
                result = getattr(self, workload)(op, holds)
        except Exception as e:
            kind = outcome_of(e) if isinstance(e, psycopg.Error) else "info"
            if kind == "info":
                self.conn = None
            if holds[0].token is None:      # etcd_lock_and_fence did not lock
                self.hist.record("fail", "lock", resource=fields["resource"], error=short(e))
            else:
                fields.update(token=[h.token for h in holds], holder=[h.holder for h in holds])
            self.hist.record(kind, workload, error=short(e), **fields)
            return False
        fields.update(token=[h.token for h in holds], holder=[h.holder for h in holds])
        self.hist.record("ok", workload, **fields, **result)
        with self.ok_count.get_lock():
            self.ok_count.value += 1
        return True

    def fence(self, holds):
        """fence() each resource (in a random order), or etcd_lock_and_fence."""
        c = self.conn
        h = holds[0]
        if h.token is None:
            h.token = c.execute("SELECT lockfence.etcd_lock_and_fence(%s, %s, %s, '5 s')",
                                (f"hist/{h.resource}", h.resource, TTL)).fetchone()[0]
            h.holder = h.handle = EtcdLocks.key_of(h.resource, h.token)
            self.hist.record("ok", "lock", resource=[h.resource], token=[h.token],
                             holder=[h.holder])
            return
        if not self.fenced:
            return
        for h in self.rng.sample(holds, len(holds)):
            c.execute("SELECT lockfence.fence(%s, %s, %s)", (h.resource, h.token, h.holder))


def short(e):
    code = sqlstate(e) if isinstance(e, psycopg.Error) else None
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{code} {text}" if code else f"{type(e).__name__}: {text}"


def worker_main(args):
    name, service, fenced, dbname, out, seed, primary, ok_count, stop = args
    Worker(name, service, fenced, dbname, out, seed, primary, ok_count).run(stop)


# ---------------------------------------------------------------------------
# The nemesis
# ---------------------------------------------------------------------------

def pid_of(name):
    with open(f"{DIR}/run/{name}.pid") as f:
        return int(f.read().split()[0])


def spawn(name, argv=None):
    """Restart a server from run/NAME.sh (or argv), recording its pid."""
    cmd = argv or ["bash", f"{DIR}/run/{name}.sh"]
    log = open(f"{DIR}/{name}.log", "a")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    with open(f"/proc/{p.pid}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    with open(f"{DIR}/run/{name}.pid", "w") as f:
        f.write(f"{p.pid} {start}\n")


def pg_ctl(*args):
    subprocess.run(["runuser", "-u", "postgres", "--", f"{PG_BIN}/pg_ctl", "-D", f"{DIR}/pg",
                    "-l", f"{DIR}/postgres.log", *args],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def etcd_status(port):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v3/maintenance/status",
                                 b"{}", method="POST")
    return json.load(urllib.request.urlopen(req, timeout=1))


def etcd_leader():
    """Index (0-2) of the etcd leader, asking any member that answers."""
    for port in ETCD_PORTS:
        try:
            leader = etcd_status(port).get("leader")    # absent in an election
        except OSError:
            continue
        for i, p in enumerate(ETCD_PORTS):
            try:
                if leader and etcd_status(p)["header"]["member_id"] == leader:
                    return i
            except OSError:
                continue
    return None


def port_closed(port):
    """Does nothing listen on 127.0.0.1:port any more?"""
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return False
    except ConnectionRefusedError:
        return True


def wait_until(what, probe, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if probe():
                return True
        except Exception:
            pass
        time.sleep(0.2)
    print(f"history: {what} not within {seconds} s", file=sys.stderr)
    return False


class Nemesis:
    def __init__(self, hist, workers, primary):
        self.hist, self.workers, self.primary = hist, workers, primary
        self.redis_names = {REDIS_PORTS[0]: "redis-a", REDIS_PORTS[1]: "redis-b"}

    def inject(self, kind, target):
        """Inject one fault and heal it; its band in the history is invoke..ok
        (info if the nemesis itself failed: then everything is resumed)."""
        try:
            what = getattr(self, kind.replace("-", "_"))(target)
        except Exception as e:
            print(f"history: nemesis: {kind} failed: {e!r}", file=sys.stderr)
            self.heal()
            self.hist.record("info", kind, error=repr(e))
            return
        self.hist.record("ok", kind, value=what)

    def heal(self):
        for name in ("etcd-e1", "etcd-e2", "etcd-e3", "redis-a", "redis-b"):
            try:
                os.kill(pid_of(name), signal.SIGCONT)
            except OSError:
                pass
        for _, p in self.workers:
            os.kill(p.pid, signal.SIGCONT)
        os.kill(pid_of("faultproxy"), signal.SIGUSR2)

    def start(self, kind, what):
        self.hist.record("invoke", kind, value=what)

    def etcd_leader_kill(self, target):
        i = etcd_leader()
        i = target % 3 if i is None else i
        self.start("etcd-leader-kill", f"SIGKILL e{i + 1} (leader)")
        os.kill(pid_of(f"etcd-e{i + 1}"), signal.SIGKILL)
        time.sleep(2)
        spawn(f"etcd-e{i + 1}")
        wait_until(f"etcd e{i + 1}", lambda: etcd_status(ETCD_PORTS[i]), 20)
        return f"e{i + 1} restarted"

    def etcd_member_stop(self, target):
        i = target % 3
        self.start("etcd-member-stop", f"SIGSTOP e{i + 1}")
        os.kill(pid_of(f"etcd-e{i + 1}"), signal.SIGSTOP)
        time.sleep(FAULTS["etcd-member-stop"])
        os.kill(pid_of(f"etcd-e{i + 1}"), signal.SIGCONT)
        return f"SIGCONT e{i + 1}"

    def etcd_member_cut(self, target):
        i = target % 3
        self.start("etcd-member-cut", f"proxy cuts e{i + 1} off")
        with open(f"{DIR}/run/cut", "w") as f:
            f.write(str(i))
        os.kill(pid_of("faultproxy"), signal.SIGUSR1)
        time.sleep(FAULTS["etcd-member-cut"] - 1.5)
        # cut off from the quorum, the member can no longer serve a
        # linearizable read: say in the history whether the cut held
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{ETCD_PORTS[i]}/v3/kv/range",
                                         b'{"key": "eA=="}', method="POST")
            urllib.request.urlopen(req, timeout=1.5).read()
            held = "but it still answered a linearizable read"
        except OSError:
            held = "its linearizable reads failed"
        os.kill(pid_of("faultproxy"), signal.SIGUSR2)
        return f"e{i + 1} reconnected; while cut off {held}"

    def redis_failover(self, target):
        """Cut the replica off, let INCRs land on the primary only, kill it,
        promote the replica: its counters are behind (tokens regress)."""
        import redis
        p_port = self.primary.value
        r_port = [p for p in REDIS_PORTS if p != p_port][0]
        p_name, r_name = self.redis_names[p_port], self.redis_names[r_port]
        replica = redis.Redis(host="127.0.0.1", port=r_port, socket_timeout=5)
        wait_until("Redis replica in sync",
                   lambda: replica.info("replication").get("master_link_status") == "up", 20)
        self.start("redis-failover", f"primary :{p_port} loses INCRs")
        os.kill(pid_of(r_name), signal.SIGSTOP)
        try:
            redis.Redis(host="127.0.0.1", port=p_port, socket_timeout=2).execute_command(
                "CLIENT", "KILL", "TYPE", "replica")
        except redis.RedisError:
            pass
        time.sleep(1.5)                       # workers INCR on the primary alone
        os.kill(pid_of(p_name), signal.SIGKILL)
        os.kill(pid_of(r_name), signal.SIGCONT)
        replica.execute_command("REPLICAOF", "NO", "ONE")
        self.primary.value = r_port
        # SIGKILL is delivered, not yet done, when kill() returns: the port
        # is free only once the process has exited (a restart at once
        # failed with "Address already in use", and the server stayed down
        # for the rest of the test).
        wait_until(f"Redis :{p_port} closed", lambda: port_closed(p_port), 10)
        spawn(p_name, ["redis-server", "--bind", "127.0.0.1", "--port", str(p_port),
                       "--dir", f"{DIR}/{p_name}", "--save", "", "--appendonly", "no",
                       "--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", str(r_port)])
        return f"replica :{r_port} promoted"

    def pause(self, kind, candidates, target, seconds):
        name, pid = candidates[target % len(candidates)]
        self.start(kind, f"SIGSTOP {name} for {seconds:.0f} s")
        os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)
        return f"SIGCONT {name}"

    def zk_session_expiry(self, target):
        zk = [(n, p.pid) for n, p in self.workers if n.startswith("zk")]
        return self.pause("zk-session-expiry", zk, target, ZK_SESSION + 3)

    def worker_pause(self, target):
        others = [(n, p.pid) for n, p in self.workers if not n.startswith("zk")]
        return self.pause("worker-pause", others, target, TTL + 2)

    def pg_crash(self, target):
        self.start("pg-crash", "pg_ctl stop -m immediate")
        pg_ctl("-m", "immediate", "stop")
        time.sleep(1)
        pg_ctl("-w", "-t", "60", "start")
        return "restarted"


def redis_primary():
    """The port of the Redis server that is primary now (after failovers).

    A server the previous run's failover stopped may not be back yet (the
    self-check run starts right after the fenced one): one that refuses the
    connection is skipped, and the servers are asked again for up to 60 s
    until one of them is primary."""
    import redis
    deadline = time.monotonic() + 60
    while True:
        for port in REDIS_PORTS:
            try:
                if redis.Redis(port=port, socket_timeout=2).info("replication")["role"] == "master":
                    return port
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                continue
        if time.monotonic() > deadline:
            raise RuntimeError("no Redis primary")
        time.sleep(0.5)


def wait_ready():
    import redis
    ok = wait_until("PostgreSQL", lambda: connect("postgres").close() or True, 60)
    for port in ETCD_PORTS:
        ok = ok and wait_until(f"etcd :{port}", lambda: json.load(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/health", timeout=2))["health"] == "true", 60)
    ok = ok and wait_until("Redis replication", lambda: redis.Redis(
        port=REDIS_PORTS[1]).info("replication")["master_link_status"] == "up", 30)

    def zk_ok():
        import socket
        with socket.create_connection(("127.0.0.1", int(ZK_HOSTS.split(":")[1])), 2) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"
    return ok and wait_until("ZooKeeper", zk_ok, 90)


# How long a run may go on past --minutes to reach --min-ok: on a 2-core
# machine loaded with other suites the workers acknowledged 26 operations
# a second, 7,889 in twice the planned time (14,099 at lighter load);
# the run stops as soon as the count is reached, so a quiet machine is
# not slowed.
HARD_END_FACTOR = 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=2.5)
    ap.add_argument("--min-ok", type=int, default=0,
                    help="go on (up to HARD_END_FACTOR times --minutes) until this many operations were acknowledged")
    ap.add_argument("--no-fence", action="store_true", help="self-check: no fence() call, tables unprotected")
    ap.add_argument("--out")
    ap.add_argument("--print-schedule", action="store_true")
    ap.add_argument("--wait-ready", action="store_true")
    a = ap.parse_args()
    if a.wait_ready:
        sys.exit(0 if wait_ready() else 1)
    plan = make_schedule(a.seed, a.minutes * 60 * HARD_END_FACTOR)
    if a.print_schedule:
        sys.stdout.write(schedule_text(plan))
        return
    os.makedirs(a.out)
    with open(os.path.join(a.out, "schedule.txt"), "w") as f:
        f.write(schedule_text(plan))
    fenced = not a.no_fence
    dbname = "hist_fenced" if fenced else "hist_nofence"
    initial = setup_database(dbname, fenced)

    global T0
    T0 = time.monotonic()
    hist = History(a.out, "nemesis")
    hist.record("info", "start", value={"seed": a.seed, "fenced": fenced, "minutes": a.minutes})
    ctx = multiprocessing.get_context("fork")
    primary = ctx.Value("i", redis_primary())
    ok_count, stop = ctx.Value("i", 0), ctx.Event()
    workers = []
    for s in SERVICES:
        for i in range(1, WORKERS_PER_SERVICE + 1):
            name = f"{s}-{i}"
            p = ctx.Process(target=worker_main, name=name, daemon=True, args=(
                (name, s, fenced, dbname, a.out, a.seed, primary, ok_count, stop),))
            p.start()
            with open(f"{DIR}/run/worker-{name}.pid", "w") as f, open(f"/proc/{p.pid}/stat") as st:
                f.write(f"{p.pid} {st.read().rsplit(')', 1)[1].split()[19]}\n")
            workers.append((name, p))

    nemesis = Nemesis(hist, workers, primary)
    end, hard_end = a.minutes * 60, a.minutes * 60 * HARD_END_FACTOR
    injected = 0

    def done():
        # the planned length, the minimum count, and every kind of fault once
        t = time.monotonic() - T0
        return t >= hard_end or (t >= end and ok_count.value >= a.min_ok
                                 and injected >= min(len(FAULTS), len(plan)))

    for at, kind, target in plan:
        while not done() and time.monotonic() - T0 < at:
            time.sleep(0.2)
        if done():
            break
        injected += 1
        print(f"history: {time.monotonic() - T0:6.1f}s {kind} "
              f"({ok_count.value} acknowledged so far)", flush=True)
        nemesis.inject(kind, target)
    while not done():
        time.sleep(0.2)

    stop.set()
    for name, p in workers:
        p.join(15)
        if p.is_alive():
            p.kill()
            p.join()
    hist.record("info", "stop", value={"acknowledged": ok_count.value})
    hist.file.close()
    dump_final_state(dbname, initial, fenced, a.out)
    events = merge_history(a.out)
    print(f"history: {len(events)} events in {a.out}/history.jsonl, "
          f"{time.monotonic() - T0:.0f} s")


if __name__ == "__main__":
    main()
