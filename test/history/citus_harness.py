#!/usr/bin/python3
"""citus_harness.py: the history test's counter workload on a Citus cluster.

Started by test/t/94_citus_history.pl, which starts a coordinator and two
workers (LockfenceTest::Citus) and passes them in CITUS_HISTORY_NODES
("name:port:datadir:logfile" for the coordinator, then each worker) and
the PostgreSQL binaries in CITUS_HISTORY_PG_BIN.  Worker processes take a
lease on a counter from a lease service (below), then do one to four
increments under it, each its own transaction through the coordinator:
fence (unless the run is the self-check), read, write, witness; the
checker (checker.py, unchanged) reads the same history.jsonl and
final.json as for the single-server test.

The tables are Citus tables: hist.cells distributed by resource (the
counter's shard is on one worker), hist.witness distributed by op, so
that about half of the increments write on both workers and commit with
Citus' two-phase commit.  The nemesis injects:

  worker-pause          SIGSTOP a worker process between two writes under
                        its lease, past the lease: a stale holder writes
                        (the fence must refuse it)
  citus-worker-crash    SIGKILL a Citus worker node's postmaster (and its
                        children), restart it (crash recovery; prepared
                        transactions survive it)
  coordinator-crash-2pc-commit
                        the coordinator killed after its workers PREPAREd
                        and its own commit record (the 2PC decision) is on
                        disk, before COMMIT PREPARED: its commits wait for
                        a synchronous standby that does not exist
                        (synchronous_standby_names, set for the fault in a
                        file every node includes), which is after the
                        local commit record and before Citus'
                        XACT_EVENT_COMMIT sends COMMIT PREPARED.
                        Restarted, Citus' 2PC recovery commits them.
  coordinator-crash-2pc-rollback
                        the coordinator killed after the workers began to
                        PREPARE and before its decision: PREPARE
                        TRANSACTION on one worker waits the same way after
                        its prepare record, so the coordinator waits in its
                        pre-commit.  Restarted, recovery rolls back the
                        prepared transactions.

Citus' own failure tests (src/test/regress/sql/failure_*.sql in its
source) cut a connection at PREPARE TRANSACTION or COMMIT PREPARED with a
proxy between the nodes (citus.mitmproxy); here the whole coordinator
dies, and waiting for a standby that never comes holds a backend at an
exact point of the commit with PostgreSQL alone, where the nemesis sees
it (pg_stat_activity's wait_event SyncRep) before it kills.  After the restart Citus' 2PC
recovery is off until the prepared transactions on the workers were
compared with the coordinator's decisions (pg_dist_transaction): the
fault says how many it found of each kind.

A fault whose window was not reached is recorded as info (not ok): the
checker's --require-all-faults then fails the run.

The witness's seq (the checker's commit order per resource) is the
counter row's own version, which the increment's UPDATE advances, not a
sequence on the coordinator as in the single-server test.  A nextval()
is durable only once WAL past its sequence record is flushed: a
transaction whose PREPARE TRANSACTION waits (the rollback fault) wrote
that record and never commits, while the single-node increments after it
take the next values without writing anything on the coordinator.  At
the coordinator's SIGKILL those values are handed out again: a later
increment got a lower seq than one acknowledged before it began, and the
checker reported a token going down where the values showed the right
order (a run under a CPU hog, 2026-12-03).  The version is written with
the value, in the same row on the same node, so it cannot go back; and
row locks make the row's update order its commit order.

The lease service is a table in shared memory of the harness's processes:
per counter the last token, the holder and the expiry (TTL 2 s, no
renewal).  A worker stopped past its lease still believes it holds it;
the next taker gets a higher token.
"""

import argparse
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time

import psycopg

import harness
from harness import History, Hold, merge_history, outcome_of, short, wait_until
from workloads import Workloads

PG_BIN = os.environ.get("CITUS_HISTORY_PG_BIN", "")
NODES = [dict(zip(("name", "port", "datadir", "log"), n.split(":", 3)))
         for n in os.environ.get("CITUS_HISTORY_NODES", "").split()]
COUNTERS = [f"c{i}/counter" for i in range(6)]
WORKERS = 6
TTL = 2.0               # seconds: a lease, never renewed
NEMESIS_CONF = "lockfence_history_nemesis.conf"    # every node includes it
NOBODY = "synchronous_standby_names = 'lockfence_history_nobody'"

# How long each fault lasts (seconds), for spacing the schedule.
FAULTS = {
    "worker-pause": 5,
    "citus-worker-crash": 6,
    "coordinator-crash-2pc-commit": 10,
    "coordinator-crash-2pc-rollback": 10,
}

SCHEMA = [
    "DROP SCHEMA IF EXISTS hist CASCADE",
    "CREATE SCHEMA hist",
    "CREATE TABLE hist.cells (resource text PRIMARY KEY, value bigint NOT NULL,"
    " token bigint, holder text, version bigint NOT NULL DEFAULT 0)",
    "CREATE TABLE hist.witness (seq bigint NOT NULL,"
    " op text, resource text, token bigint, holder text, read bigint, written bigint,"
    " PRIMARY KEY (op, resource))",
    "SELECT create_distributed_table('hist.cells', 'resource')",
    "SELECT create_distributed_table('hist.witness', 'op', colocate_with => 'none')",
]

# Fenced: lockfence.fences distributed by resource, co-located with the
# counters, fence() delegated to the node of its resource, the distributed
# table protected (docs/citus.md).
PROTECT = [
    "SELECT lockfence.citus_distribute('hist.cells')",
    "SELECT lockfence.protect('hist.cells', resource_column => 'resource',"
    " token_column => 'token', holder_column => 'holder')",
]


def node(name):
    return next(n for n in NODES if n["name"] == name)


def coord():
    return NODES[0]


def dsn(n, dbname="postgres"):
    return f"host=127.0.0.1 port={n['port']} user=postgres dbname={dbname}"


def connect(n=None, timeout=3):
    return psycopg.connect(dsn(n or coord()), autocommit=True, connect_timeout=timeout,
                           options="-c idle_in_transaction_session_timeout=2000"
                                   " -c statement_timeout=10000 -c lock_timeout=6000")


def query(n, sql, args=None, timeout=3):
    with connect(n, timeout) as c:
        return c.execute(sql, args).fetchall()


def make_schedule(seed, seconds):
    """[(at, kind, target)]: each crash kind once in a shuffled order, each
    after a worker pause, then at random, pauses (what the fence is for)
    as often as crashes."""
    rng = random.Random(seed)
    crashes = sorted(k for k in FAULTS if k != "worker-pause")
    rng.shuffle(crashes)
    first = [k for c in crashes for k in ("worker-pause", c)]
    plan, t = [], 8.0
    while t < seconds - 10:
        kind = first.pop(0) if first else rng.choice(crashes + ["worker-pause"] * len(crashes))
        plan.append((round(t, 1), kind, rng.randrange(1 << 16)))
        t += FAULTS[kind] + rng.uniform(2, 5)
    return plan


# ---------------------------------------------------------------------------
# The lease service
# ---------------------------------------------------------------------------

class Leases:
    """Per counter: the last token, the holder (0: none), the expiry."""

    def __init__(self, ctx):
        self.lock = ctx.Lock()
        self.token = ctx.Array("q", len(COUNTERS), lock=False)
        self.holder = ctx.Array("q", len(COUNTERS), lock=False)
        self.expiry = ctx.Array("d", len(COUNTERS), lock=False)

    def acquire(self, i, who, wait=5.0):
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with self.lock:
                now = time.monotonic()
                if self.holder[i] == 0 or self.expiry[i] < now:
                    self.token[i] += 1
                    self.holder[i], self.expiry[i] = who, now + TTL
                    return self.token[i]
            time.sleep(0.005)
        return None

    def release(self, i, who):
        with self.lock:
            if self.holder[i] == who:
                self.holder[i] = 0


# ---------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------

class Worker(Workloads):
    def __init__(self, name, number, fenced, out, seed, leases, ok_count, between):
        self.name, self.number, self.fenced = name, number, fenced
        self.between = between
        self.rng = random.Random(f"{seed}/{name}")
        self.hist = History(out, name)
        self.leases, self.ok_count = leases, ok_count
        self.conn, self.n, self.grants = None, 0, 0

    def pg(self):
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = None
            self.conn = connect(timeout=2)
        return self.conn

    def run(self, stop):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while not stop.is_set():
            try:
                self.pg()
            except psycopg.OperationalError:
                time.sleep(0.3)              # the coordinator restarting
                continue
            i = self.rng.randrange(len(COUNTERS))
            res = COUNTERS[i]
            self.grants += 1
            who = self.number * 1000000 + self.grants
            holder = f"{self.name}:{self.grants}"
            self.hist.record("invoke", "lock", resource=[res])
            token = self.leases.acquire(i, who)
            if token is None:
                self.hist.record("fail", "lock", resource=[res], error="lease busy for 5 s")
                continue
            self.hist.record("ok", "lock", resource=[res], token=[token], holder=[holder])
            holds = [Hold(res, token, holder, who)]
            writes = self.rng.randint(1, 4)
            for k in range(writes):
                if stop.is_set() or not self.operation(holds):
                    break
                if k == writes - 1:
                    break
                # outside any transaction, with a write still to do under
                # the lease: a pause here leaves the worker believing it
                # still holds the lease, and it writes on waking (the
                # nemesis pauses workers that say they are here; after the
                # last write a pause would only delay the release, and a
                # self-check whose every pause fell there found nothing to
                # report, 2026-12-04)
                self.between[self.number - 1] = 1
                time.sleep(self.rng.uniform(0, 0.03))
                self.between[self.number - 1] = 0
            self.hist.record("invoke", "unlock", resource=[res])
            self.leases.release(i, who)
            self.hist.record("ok", "unlock", resource=[res])

    def operation(self, holds):
        self.n += 1
        op = f"{self.name}-{self.n}"
        fields = {"op": op, "resource": [h.resource for h in holds],
                  "token": [h.token for h in holds], "holder": [h.holder for h in holds]}
        self.hist.record("invoke", "counter", **fields)
        committing = False
        try:
            with self.pg().transaction():
                result = self.counter(op, holds)
                committing = True
        except Exception as e:
            # An error at COMMIT is no proof of a rollback: Citus commits a
            # single-node transaction on the worker in its pre-commit, and
            # a worker that crashed after committing looks the same.
            kind = outcome_of(e) if isinstance(e, psycopg.Error) and not committing else "info"
            if kind == "info":
                self.conn = None
            self.hist.record(kind, "counter", error=short(e), **fields)
            return False
        self.hist.record("ok", "counter", **fields, **result)
        with self.ok_count.get_lock():
            self.ok_count.value += 1
        return True

    def counter(self, op, holds):
        """Workloads.counter, its witness numbered by the row's version (see
        the top of this file)."""
        self.fence(holds)
        h = holds[0]
        v = self.read(h.resource)
        version = self.conn.execute(
            "UPDATE hist.cells SET value = %s, token = %s, holder = %s, version = version + 1"
            " WHERE resource = %s RETURNING version",
            (v + 1, h.token, h.holder, h.resource)).fetchone()[0]
        self.conn.execute(
            "INSERT INTO hist.witness (seq, op, resource, token, holder, read, written)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (version, op, h.resource, h.token, h.holder, v, v + 1))
        return {"read": [v], "write": [v + 1]}

    def fence(self, holds):
        if self.fenced:
            for h in holds:
                self.conn.execute("SELECT lockfence.fence(%s, %s, %s)",
                                  (h.resource, h.token, h.holder))


def worker_main(args):
    name, number, fenced, out, seed, leases, ok_count, between, stop = args
    Worker(name, number, fenced, out, seed, leases, ok_count, between).run(stop)


# ---------------------------------------------------------------------------
# The nemesis
# ---------------------------------------------------------------------------

def postmaster_pid(n):
    with open(os.path.join(n["datadir"], "postmaster.pid")) as f:
        return int(f.readline())


def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    return out


def proc_state(pid):
    """The state letter of a process (Z: a zombie), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def kill_node(n):
    """SIGKILL the postmaster and its children as a power cut would: all at
    once.  Killed one by one, a backend that wakes to its postmaster's
    death before its own SIGKILL arrives goes on: a commit held for a
    synchronous standby stops waiting, and Citus then sends COMMIT
    PREPARED, so the 2PC-commit fault found nothing prepared after the
    crash (under a CPU hog, 2026-12-03).  So: stop the postmaster (it
    forks no one from then on), stop its children, kill them, kill it.
    Then wait until all are gone.  A killed postmaster whose parent (here
    the container's init) has not reaped it yet still answers kill(pid,
    0), and the next postmaster would take it for a live one: its lock
    file goes once it is a zombie."""
    pm = postmaster_pid(n)
    os.kill(pm, signal.SIGSTOP)
    kids = children(pm)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for k in kids:
            try:
                os.kill(k, sig)
            except OSError:
                pass
    os.kill(pm, signal.SIGKILL)
    wait_until(f"{n['name']} gone", lambda: all(proc_state(p) in (None, "Z")
                                                 for p in [pm] + kids), 30)
    if proc_state(pm) == "Z":
        os.unlink(os.path.join(n["datadir"], "postmaster.pid"))


def start_node(n):
    subprocess.run([f"{PG_BIN}/pg_ctl", "-D", n["datadir"], "-l", n["log"], "-w", "-t", "120",
                    "start"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return wait_until(f"{n['name']} answering", lambda: query(n, "SELECT 1"), 120)


def arm(n, line, reload=True):
    """Put line into the node's nemesis configuration file."""
    with open(os.path.join(n["datadir"], NEMESIS_CONF), "w") as f:
        f.write(line + "\n")
    if reload:
        query(n, "SELECT pg_reload_conf()")


def disarm(n):
    os.unlink(os.path.join(n["datadir"], NEMESIS_CONF))
    try:
        alive = proc_state(postmaster_pid(n)) not in (None, "Z")
    except (OSError, ValueError):
        alive = False
    if alive:
        subprocess.run([f"{PG_BIN}/pg_ctl", "-D", n["datadir"], "reload"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def waiting(n, query_like="%"):
    """Backends of the node waiting for a synchronous standby."""
    return query(n, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
                    " AND query LIKE %s", (query_like,))[0][0]


def waiting_pids(n):
    return [r[0] for r in query(n, "SELECT pid FROM pg_stat_activity"
                                   " WHERE wait_event = 'SyncRep'")]


def prepared(n):
    return [r[0] for r in query(n, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'citus\\_%'")]


def recover():
    """Citus' 2PC recovery from the coordinator, until no worker holds a
    prepared transaction of Citus (the maintenance daemon does the same
    every citus.recover_2pc_interval)."""
    recovered = 0

    def done():
        nonlocal recovered
        recovered += query(coord(), "SELECT recover_prepared_transactions()", timeout=5)[0][0]
        return not any(prepared(w) for w in NODES[1:])
    ok = wait_until("no prepared transaction left on the workers", done, 90)
    return recovered, ok


class Nemesis:
    def __init__(self, hist, workers, between):
        self.hist, self.workers, self.between = hist, workers, between

    def inject(self, kind, target):
        try:
            what = getattr(self, kind.replace("-", "_"))(target)
        except Exception as e:
            print(f"citus-history: nemesis: {kind} failed: {e!r}", file=sys.stderr)
            self.heal()
            self.hist.record("info", kind, error=repr(e))
            return
        if what.startswith("NOT REACHED"):
            print(f"citus-history: nemesis: {kind}: {what}", file=sys.stderr)
            self.hist.record("info", kind, value=what)
        else:
            self.hist.record("ok", kind, value=what)

    def heal(self):
        for _, p in self.workers:
            os.kill(p.pid, signal.SIGCONT)
        for n in NODES:
            if os.path.exists(os.path.join(n["datadir"], NEMESIS_CONF)):
                disarm(n)

    def start(self, kind, what):
        self.hist.record("invoke", kind, value=what)

    def worker_pause(self, target):
        """Stop a worker between two writes under its lease (waiting up to
        5 s for one to be there), past its lease: it resumes believing it
        still holds the lease and writes with its old token."""
        pick = []

        def someone_between():
            pick[:] = [w for k, w in enumerate(self.workers) if self.between[k]]
            return pick
        wait_until("a worker between two writes", someone_between, 5)
        name, p = (pick or self.workers)[target % len(pick or self.workers)]
        self.start("worker-pause", f"SIGSTOP {name} for {TTL + 3:.0f} s")
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(TTL + 3)
        os.kill(p.pid, signal.SIGCONT)
        return f"SIGCONT {name}"

    def citus_worker_crash(self, target):
        w = NODES[1 + target % (len(NODES) - 1)]
        self.start("citus-worker-crash", f"SIGKILL {w['name']}")
        kill_node(w)
        time.sleep(1)
        if not start_node(w):
            return f"NOT REACHED: {w['name']} did not come back"
        recovered, ok = recover()
        return (f"{w['name']} restarted; no prepared transaction left "
                f"({recovered} finished by recover_prepared_transactions())")

    def crash_coordinator(self, before_restart=None):
        """SIGKILL the coordinator; restart it with Citus' 2PC recovery off
        until the prepared transactions on the workers were compared with
        its commit decisions (pg_dist_transaction); then recover.  Returns
        (prepared at the crash, of them decided commit, recovered, ok)."""
        c = coord()
        kill_node(c)
        if before_restart:
            before_restart()
        arm(c, "citus.recover_2pc_interval = -1", reload=False)
        if not start_node(c):
            raise RuntimeError("the coordinator did not come back")
        gids = [g for w in NODES[1:] for g in prepared(w)]
        decided = {r[0] for r in query(c, "SELECT gid FROM pg_dist_transaction")}
        disarm(c)
        recovered, ok = recover()
        return len(gids), sum(1 for g in gids if g in decided), recovered, ok

    def coordinator_crash_2pc_commit(self, target):
        """Commits on the coordinator wait for a standby that does not exist:
        after the local commit record (Citus' decision), before COMMIT
        PREPARED."""
        c = coord()
        self.start("coordinator-crash-2pc-commit",
                   "the coordinator's commits wait after their commit record; SIGKILL it")
        arm(c, NOBODY)

        def in_window():
            # a commit held after its decision whose own transactions are
            # prepared on a worker (Citus names them citus_<group>_<pid>_...):
            # a waiting commit and someone else's PREPARE in flight are not
            held = {str(pid) for pid in waiting_pids(c)}
            return any(g.split("_")[2] in held for w in NODES[1:] for g in prepared(w))
        reached = wait_until("a commit between PREPARE and COMMIT PREPARED", in_window, 30)
        # what waited and what was prepared just before the kill
        seen = (query(c, "SELECT pid, backend_type, left(query, 60) FROM pg_stat_activity"
                         " WHERE wait_event = 'SyncRep'"),
                [g for w in NODES[1:] for g in prepared(w)])
        held = len(seen[0])
        n, commit, recovered, ok = self.crash_coordinator()
        what = (f"{held} commits waiting, {n} transactions prepared on the workers at the "
                f"crash, {commit} of them decided commit; all resolved by Citus' recovery "
                f"({recovered} by recover_prepared_transactions(), the rest by its daemon)")
        if not (reached and commit > 0 and ok):
            return f"NOT REACHED: {what}; waiting {seen[0]}, prepared {seen[1]}"
        return what

    def coordinator_crash_2pc_rollback(self, target):
        """PREPARE TRANSACTION on one worker waits for a standby that does not
        exist (after its prepare record): the coordinator waits for it,
        before its decision."""
        w = NODES[1 + target % (len(NODES) - 1)]
        self.start("coordinator-crash-2pc-rollback",
                   f"PREPARE TRANSACTION waits on {w['name']}; SIGKILL the coordinator")
        arm(w, NOBODY)
        reached = wait_until(f"a PREPARE TRANSACTION waiting on {w['name']}",
                             lambda: waiting(w, "PREPARE TRANSACTION%") > 0, 30)
        held = waiting(w, "PREPARE TRANSACTION%")

        def release_worker():
            disarm(w)
            wait_until(f"{w['name']}'s waits released", lambda: waiting(w) == 0, 30)
        n, commit, recovered, ok = self.crash_coordinator(release_worker)
        what = (f"{held} PREPAREs waiting on {w['name']}, {n} transactions prepared on the "
                f"workers at the crash, {n - commit} of them without a commit decision; "
                f"all resolved by Citus' recovery "
                f"({recovered} by recover_prepared_transactions(), the rest by its daemon)")
        if not (reached and n - commit > 0 and ok):
            return "NOT REACHED: " + what
        return what


# ---------------------------------------------------------------------------

def setup(fenced):
    with connect() as c:
        for s in SCHEMA:
            c.execute(s)
        with c.cursor().copy("COPY hist.cells (resource, value) FROM STDIN") as cp:
            for r in COUNTERS:
                cp.write_row((r, 0))
        if fenced:
            for s in PROTECT:
                c.execute(s)
    return {r: 0 for r in COUNTERS}


def dump_final_state(initial, fenced, out):
    wait_until("the coordinator", lambda: query(coord(), "SELECT 1"), 120)
    recover()
    with connect() as c:
        state = {
            "fenced": fenced,
            "fault_kinds": sorted(FAULTS),
            "initial": initial,
            "cells": dict(c.execute("SELECT resource, value FROM hist.cells").fetchall()),
            "witness": [list(r) for r in c.execute(
                "SELECT seq, op, resource, token, holder, read, written "
                "FROM hist.witness ORDER BY seq")],
            "log": [],
        }
        try:
            state["fences"] = [list(r) for r in c.execute(
                "SELECT resource, token, holder FROM lockfence.fences ORDER BY resource")]
        except psycopg.Error:
            state["fences"] = []
    with open(os.path.join(out, "final.json"), "w") as f:
        json.dump(state, f)


HARD_END_FACTOR = 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--min-ok", type=int, default=0)
    ap.add_argument("--no-fence", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    plan = make_schedule(a.seed, a.minutes * 60 * HARD_END_FACTOR)
    os.makedirs(a.out)
    with open(os.path.join(a.out, "schedule.txt"), "w") as f:
        f.write(harness.schedule_text(plan))
    fenced = not a.no_fence
    initial = setup(fenced)

    harness.T0 = time.monotonic()
    hist = History(a.out, "nemesis")
    hist.record("info", "start", value={"seed": a.seed, "fenced": fenced, "minutes": a.minutes})
    ctx = multiprocessing.get_context("fork")
    leases = Leases(ctx)
    ok_count, stop = ctx.Value("i", 0), ctx.Event()
    between = ctx.Array("i", WORKERS, lock=False)
    workers = []
    for i in range(1, WORKERS + 1):
        name = f"lease-{i}"
        p = ctx.Process(target=worker_main, name=name, daemon=True, args=(
            (name, i, fenced, a.out, a.seed, leases, ok_count, between, stop),))
        p.start()
        workers.append((name, p))

    nemesis = Nemesis(hist, workers, between)
    end, hard_end = a.minutes * 60, a.minutes * 60 * HARD_END_FACTOR
    injected = 0

    def done():
        t = time.monotonic() - harness.T0
        return t >= hard_end or (t >= end and ok_count.value >= a.min_ok
                                 and injected >= min(2 * len(FAULTS) - 2, len(plan)))

    try:
        for at, kind, target in plan:
            while not done() and time.monotonic() - harness.T0 < at:
                time.sleep(0.2)
            if done():
                break
            injected += 1
            print(f"citus-history: {time.monotonic() - harness.T0:6.1f}s {kind} "
                  f"({ok_count.value} acknowledged so far)", flush=True)
            nemesis.inject(kind, target)
        while not done():
            time.sleep(0.2)
    finally:
        nemesis.heal()
        stop.set()
        for name, p in workers:
            p.join(15)
            if p.is_alive():
                p.kill()
                p.join()
    hist.record("info", "stop", value={"acknowledged": ok_count.value})
    hist.file.close()
    dump_final_state(initial, fenced, a.out)
    events = merge_history(a.out)
    print(f"citus-history: {len(events)} events in {a.out}/history.jsonl, "
          f"{time.monotonic() - harness.T0:.0f} s")


if __name__ == "__main__":
    main()
