#!/usr/bin/python3
"""demo/scenarios.py: the lockfence demonstration scenarios.

Started by demo/run.sh, which starts the servers and passes their addresses
in LOCKFENCE_DEMO_* environment variables.  Each scenario prints a timeline
(seconds since the scenario started, who, what) and checks every write
against what must happen: a write with a current token is accepted, a stale
one is rejected with the expected SQLSTATE.  The exit status is 0 only when
every check held.

Arguments: scenario numbers to run (default: all).  Scenario 0 always runs
first, because it creates the protected table the others write to.
"""

import datetime
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback

import psycopg

PG_DSN = os.environ["LOCKFENCE_DEMO_PG"]
ETCD_URL = os.environ.get("LOCKFENCE_DEMO_ETCD", "")
ZK_HOSTS = os.environ.get("LOCKFENCE_DEMO_ZK", "")

TABLE = "demo.reports"

# Rejections seen by the scenarios, by kind, to hold against lockfence.metrics.
SEEN_REJECTIONS = {"fence_rejected_stale_total": 0,
                   "fence_rejected_holder_conflict_total": 0,
                   "write_rejected_missing_token_total": 0}

# Children are forked, so they share the scenario's start time.
mp = multiprocessing.get_context("fork")


class ScenarioFailed(Exception):
    """A scenario could not run to its end."""


# ---------------------------------------------------------------------------
# Timeline and checks
# ---------------------------------------------------------------------------

class Scenario:
    """One scenario: its clock, its checks, and the workers it started."""

    def __init__(self, number, title):
        self.number = number
        self.title = title
        self.t0 = time.monotonic()
        self.failures = []
        self.checks = 0
        self.children = {}          # who -> (process, receiving end of its pipe)
        self.pending = []           # messages received but not yet asked for
        print()
        print(f"=== Scenario {number}: {title} ===", flush=True)

    def log(self, who, what):
        """Print one timeline line (also from a worker process)."""
        elapsed = time.monotonic() - self.t0
        print(f"  [+{elapsed:6.3f}s] {who:<9} {what}", flush=True)

    def note(self, text):
        """Print an explanation without a timestamp."""
        print(f"  {'':11}{'':10}# {text}", flush=True)

    def expect(self, result, want):
        """Check a write result: want is 'accepted' or a SQLSTATE."""
        self.checks += 1
        if want == "accepted":
            ok = result["accepted"]
        else:
            ok = (not result["accepted"]) and result["sqlstate"] == want
        if ok and not result["accepted"]:
            if result["sqlstate"] == "LF002":
                SEEN_REJECTIONS["write_rejected_missing_token_total"] += 1
            elif "another holder" in (result["message"] or ""):
                SEEN_REJECTIONS["fence_rejected_holder_conflict_total"] += 1
            else:
                SEEN_REJECTIONS["fence_rejected_stale_total"] += 1
        if ok:
            shown = "no token" if result["token"] is None else f"token {result['token']}"
            self.log("check", f"ok: {result['who']}'s write with {shown} "
                     f"{'accepted' if want == 'accepted' else 'rejected with ' + want}, as it must be")
            return
        got = ("accepted" if result["accepted"]
               else f"rejected {result['sqlstate']} {result['message']}")
        if want != "accepted" and result["accepted"]:
            why = "STALE WRITE ACCEPTED"
        else:
            why = "UNEXPECTED OUTCOME"
        msg = (f"{why}: {result['who']} token {result['token']}: "
               f"expected {want}, got {got}")
        self.log("check", "FAILED: " + msg)
        self.failures.append(msg)

    def fail(self, msg):
        self.log("check", "FAILED: " + msg)
        self.failures.append(msg)

    # -- worker processes -----------------------------------------------

    def spawn(self, who, target, *args):
        """Start target(scenario, who, pipe, *args) in its own process."""
        recv, send = mp.Pipe(duplex=False)
        proc = mp.Process(target=_child_main, args=(self, who, send, target, args),
                          name=who, daemon=True)
        proc.start()
        send.close()
        pidfile = os.environ.get("LOCKFENCE_DEMO_PIDFILE")
        if pidfile:
            with open(pidfile, "a") as f:
                f.write(f"{proc.pid}:{start_time(proc.pid)}\n")
        self.children[who] = (proc, recv)
        return proc

    def wait_for(self, who, kind, timeout):
        """Wait for message kind from worker who; return its payload."""
        deadline = time.monotonic() + timeout
        while True:
            for i, (w, k, payload) in enumerate(self.pending):
                if w == who and k == kind:
                    del self.pending[i]
                    return payload
                if k == "error":
                    del self.pending[i]
                    raise ScenarioFailed(f"{w} failed: {payload}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ScenarioFailed(f"{who} did not report '{kind}' within {timeout}s")
            conns = {recv: w for w, (p, recv) in self.children.items()
                     if not recv.closed}
            ready = multiprocessing.connection.wait(list(conns), left)
            for recv in ready:
                try:
                    w, k, payload = recv.recv()
                except EOFError:
                    recv.close()
                    if conns[recv] == who:
                        raise ScenarioFailed(f"{who} exited before reporting '{kind}'")
                    continue
                self.pending.append((w, k, payload))

    def reap(self):
        """Stop and collect every worker this scenario started."""
        for who, (proc, recv) in self.children.items():
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGCONT)
                proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
            recv.close()
        self.children = {}


def _child_main(sc, who, pipe, target, args):
    """Body of a worker process: run target, report an exception."""
    logging.disable(logging.CRITICAL)   # kazoo complains once its session is gone

    def send(kind, payload=None):
        pipe.send((who, kind, payload))

    try:
        target(sc, who, send, *args)
    except Exception:
        send("error", traceback.format_exc(limit=3))
    finally:
        pipe.close()


def start_time(pid):
    """A process's start time, as run.sh reads it (field 22 of its stat)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def process_state(pid):
    """The state letter of a process (T when stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


# ---------------------------------------------------------------------------
# Writing to the protected table
# ---------------------------------------------------------------------------

def connect():
    return psycopg.connect(PG_DSN, autocommit=True)


def write(sc, conn, who, resource, token, body, fence_holder=False, holder=None):
    """One write of a worker, in one transaction, reported on the timeline.

    The row carries token and holder in its own columns, so the table's
    fence trigger checks them.  The holder is who unless given.  With
    fence_holder, the worker first calls lockfence.fence(resource, token,
    holder => who) itself.
    """
    holder = holder or who
    how = "lockfence.fence(holder => '%s') + INSERT" % who if fence_holder else "INSERT"
    shown = "no token" if token is None else f"token {token}"
    result = {"who": who, "token": token, "accepted": False,
              "sqlstate": None, "message": None, "detail": None}
    try:
        with conn.transaction():
            if fence_holder:
                conn.execute("SELECT lockfence.fence(%s, %s, holder => %s)",
                             (resource, token, who))
            if token is None:
                conn.execute(f"INSERT INTO {TABLE} (resource, holder, body) "
                             "VALUES (%s, %s, %s)", (resource, holder, body))
            else:
                conn.execute(f"INSERT INTO {TABLE} (resource, token, holder, body) "
                             "VALUES (%s, %s, %s, %s)", (resource, token, holder, body))
        result["accepted"] = True
        sc.log(who, f"{how} {resource!r} with {shown} -> accepted")
    except psycopg.Error as e:
        result["sqlstate"] = e.sqlstate
        result["message"] = e.diag.message_primary
        result["detail"] = e.diag.message_detail
        sc.log(who, f"{how} {resource!r} with {shown} -> REJECTED "
               f"{e.sqlstate}: {e.diag.message_primary}")
        if e.diag.message_detail:
            sc.log("", f"    detail: {e.diag.message_detail}")
    return result


# ---------------------------------------------------------------------------
# Scenario 0: PostgreSQL only
# ---------------------------------------------------------------------------

SETUP_SQL = f"""
CREATE EXTENSION IF NOT EXISTS lockfence;
CREATE SCHEMA IF NOT EXISTS demo;
CREATE TABLE IF NOT EXISTS {TABLE} (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    resource    text NOT NULL,
    token       bigint,
    holder      text,
    body        text,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def scenario_pg(sc):
    with connect() as conn:
        conn.execute(SETUP_SQL)
        if conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass"
                        " AND tgname = 'zz_lockfence_fence'", (TABLE,)).fetchone()[0] == 0:
            conn.execute("SELECT lockfence.protect(%s, resource_column => 'resource',"
                         " token_column => 'token', holder_column => 'holder')", (TABLE,))
        sc.log("setup", f"CREATE EXTENSION lockfence; lockfence.protect('{TABLE}', "
               "resource_column => 'resource', token_column => 'token', "
               "holder_column => 'holder')")
    res = "pg/report"
    old, new, anon = connect(), connect(), connect()
    try:
        sc.note("holder-1 got token 7 from its lock service")
        sc.expect(write(sc, old, "holder-1", res, 7, "first version"), "accepted")
        sc.note("the lock moved on: holder-2 got token 8")
        sc.expect(write(sc, new, "holder-2", res, 8, "second version"), "accepted")
        sc.note("holder-1 does not know it lost the lock and writes again")
        sc.expect(write(sc, old, "holder-1", res, 7, "stale version"), "LF001")
        sc.note("a write that carries no token at all (fail-closed)")
        sc.expect(write(sc, anon, "nobody", res, None, "unfenced version"), "LF002")
    finally:
        for c in (old, new, anon):
            c.close()


# ---------------------------------------------------------------------------
# The pause scenarios (etcd, ZooKeeper): holder paused, lock moves on
# ---------------------------------------------------------------------------

def pause_scenario(sc, holder_target, waiter_target, work_seconds=4.0):
    """worker-A takes the lock and is SIGSTOPped while it works; worker-B
    gets the lock and writes; worker-A is resumed and writes.  worker-B must
    be accepted, worker-A rejected with LF001."""
    a = sc.spawn("worker-A", holder_target, work_seconds)
    got = sc.wait_for("worker-A", "acquired", 30)
    os.kill(a.pid, signal.SIGSTOP)
    # The stop is asynchronous: poll until the kernel says it happened.
    deadline = time.monotonic() + 5
    while process_state(a.pid) != "T":
        if time.monotonic() > deadline:
            raise ScenarioFailed("worker-A did not stop")
        time.sleep(0.01)
    sc.log("demo", f"SIGSTOP worker-A (pid {a.pid}): a long pause while it holds "
           f"the lock with token {got['token']}")
    sc.spawn("worker-B", waiter_target)
    b = sc.wait_for("worker-B", "wrote", 60)
    if any(w == "worker-A" and k == "wrote" for w, k, p in sc.pending):
        sc.fail("worker-A wrote while it should have been stopped")
    os.kill(a.pid, signal.SIGCONT)
    sc.log("demo", "SIGCONT worker-A: it resumes and finishes its work")
    a_res = sc.wait_for("worker-A", "wrote", 30)
    a_done = sc.wait_for("worker-A", "done", 30)
    b_done = sc.wait_for("worker-B", "done", 30)
    sc.expect(b, "accepted")
    sc.expect(a_res, "LF001")
    if not b["token"] > a_res["token"]:
        sc.fail(f"the lock service gave worker-B token {b['token']}, not above "
                f"worker-A's {a_res['token']}")
    return a_done, b_done


# ---------------------------------------------------------------------------
# Scenario 1: leases kept in PostgreSQL itself (no lock service at all)
# ---------------------------------------------------------------------------

LEASE = "lease/report"

LEASE_SQL = ("SELECT token, expires_at FROM lockfence.lease_acquire(%s, %s::interval, "
             "holder => %s, wait_timeout => %s::interval)")


def lease_holder(sc, who, send, work_seconds):
    conn = connect()
    token, expires = conn.execute(LEASE_SQL, (LEASE, "2 s", who, "30 s")).fetchone()
    sc.log(who, f"lockfence.lease_acquire('{LEASE}', '2 s', holder => '{who}') -> "
           f"token {token}, leader until {expires:%H:%M:%S.%f}"[:-3])
    sc.log(who, f"works for {work_seconds:.0f} s before writing; it does not renew")
    work_until = time.monotonic() + work_seconds
    send("acquired", {"token": token})
    time.sleep(max(0.0, work_until - time.monotonic()))
    sc.log(who, "resumed; it still believes it is the leader and writes")
    send("wrote", write(sc, conn, who, LEASE, token, "report by worker-A",
                        fence_holder=True))
    try:
        conn.execute("SELECT lockfence.lease_renew(%s, %s)", (LEASE, token))
        renewed = True
        sc.log(who, f"lockfence.lease_renew('{LEASE}', {token}) -> renewed")
    except psycopg.Error as e:
        renewed = False
        sc.log(who, f"lockfence.lease_renew('{LEASE}', {token}) -> {e.sqlstate}: "
               f"{e.diag.message_primary}")
    conn.close()
    send("done", {"renewed": renewed})


def lease_waiter(sc, who, send):
    conn = connect()
    sc.log(who, f"lockfence.lease_acquire('{LEASE}', '10 s', holder => '{who}'): waits")
    token, _ = conn.execute(LEASE_SQL, (LEASE, "10 s", who, "30 s")).fetchone()
    sc.log(who, f"leader once worker-A's lease expired -> token {token}")
    send("wrote", write(sc, conn, who, LEASE, token, "report by worker-B",
                        fence_holder=True))
    released = conn.execute("SELECT lockfence.lease_release(%s, %s)",
                            (LEASE, token)).fetchone()[0]
    sc.log(who, f"lockfence.lease_release('{LEASE}', {token}) -> {released}")
    conn.close()
    send("done")


def scenario_lease(sc):
    with connect() as conn:
        if conn.execute("SELECT to_regproc('lockfence.lease_acquire')").fetchone()[0] is None:
            sc.fail("lockfence.lease_acquire() is not in this build of lockfence")
            return
    sc.note("the lease lives in PostgreSQL: its token is the fence's token; "
            "holder = the worker's name")
    try:
        a_done, _ = pause_scenario(sc, lease_holder, lease_waiter)
        sc.checks += 1
        if a_done["renewed"] is False:
            sc.log("check", "ok: worker-A's renewal failed: its lease was taken over")
        else:
            sc.fail("worker-A renewed a lease that had been taken over")
    finally:
        sc.reap()


# ---------------------------------------------------------------------------
# Scenario 2: etcd through lockfence.etcd_lock
# ---------------------------------------------------------------------------

ETCD_LOCK = "demo-report-lock"
ETCD_RES = "etcd/report"


ETCD_LOCK_SQL = ("SELECT key, lease, token FROM lockfence.etcd_lock(%s, %s, "
                 "make_interval(secs => %s))")


def etcd_connect():
    """A session pointed at the demo's etcd."""
    conn = connect()
    conn.execute("SELECT set_config('lockfence.etcd_endpoints', %s, false)", (ETCD_URL,))
    return conn


def etcd_holder(sc, who, send, work_seconds):
    conn = etcd_connect()
    key, lease, token = conn.execute(ETCD_LOCK_SQL, (ETCD_LOCK, 2, 10)).fetchone()
    sc.log(who, f"lockfence.etcd_lock('{ETCD_LOCK}', ttl_seconds => 2) -> "
           f"token {token} (key {key})")
    sc.log(who, f"works for {work_seconds:.0f} s before writing; nobody renews its lease")
    work_until = time.monotonic() + work_seconds
    send("acquired", {"token": token})
    time.sleep(max(0.0, work_until - time.monotonic()))
    sc.log(who, "resumed; it still believes it holds the lock and writes")
    send("wrote", write(sc, conn, who, ETCD_RES, token, "report by worker-A",
                        holder=key))
    released = conn.execute("SELECT lockfence.etcd_unlock(%s)", (key,)).fetchone()[0]
    sc.log(who, f"lockfence.etcd_unlock('{key}') -> {released}")
    conn.close()
    send("done", {"released": released})


def etcd_waiter(sc, who, send):
    conn = etcd_connect()
    sc.log(who, f"lockfence.etcd_lock('{ETCD_LOCK}', ttl_seconds => 10): waits")
    key, lease, token = conn.execute(ETCD_LOCK_SQL, (ETCD_LOCK, 10, 30)).fetchone()
    sc.log(who, f"got the lock once worker-A's lease expired -> token {token} (key {key})")
    send("wrote", write(sc, conn, who, ETCD_RES, token, "report by worker-B",
                        holder=key))
    released = conn.execute("SELECT lockfence.etcd_unlock(%s)", (key,)).fetchone()[0]
    sc.log(who, f"lockfence.etcd_unlock('{key}') -> {released}")
    conn.close()
    send("done")


def scenario_etcd(sc):
    with connect() as conn:
        if conn.execute("SELECT to_regproc('lockfence.etcd_lock')").fetchone()[0] is None:
            sc.fail("lockfence.etcd_lock() is not in this build of lockfence")
            return
    sc.note("token = create_revision of the etcd lock key; holder = the lock key")
    try:
        a_done, _ = pause_scenario(sc, etcd_holder, etcd_waiter)
        sc.checks += 1
        if a_done["released"] is False:
            sc.log("check", "ok: worker-A's lock key was already gone when it "
                   "unlocked: its lease had expired")
        else:
            sc.fail("worker-A's lock key was still there after worker-B got the lock")
    finally:
        sc.reap()


# ---------------------------------------------------------------------------
# Scenario 3: Redis failover makes the INCR token go backwards
# ---------------------------------------------------------------------------

REDIS_LOCK = "lock:redis/report"
REDIS_COUNTER = "fence:redis/report"
REDIS_RES = "redis/report"
RELEASE_LUA = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
               "return redis.call('del', KEYS[1]) else return 0 end")


def redis_addr(var):
    port, pid = os.environ[var].split(":")
    return int(port), int(pid)


def scenario_redis(sc):
    import redis

    p_port, p_pid = redis_addr("LOCKFENCE_DEMO_REDIS_PRIMARY")
    r_port, r_pid = redis_addr("LOCKFENCE_DEMO_REDIS_REPLICA")
    primary = redis.Redis(host="127.0.0.1", port=p_port, socket_timeout=5)
    replica = redis.Redis(host="127.0.0.1", port=r_port, socket_timeout=5)
    conns = {}

    def pg(who):
        if who not in conns:
            conns[who] = connect()
        return conns[who]

    def take(who, server, where, ttl_ms=10000):
        if not server.set(REDIS_LOCK, who, nx=True, px=ttl_ms):
            raise ScenarioFailed(f"{who} could not take {REDIS_LOCK} on the {where}")
        token = server.incr(REDIS_COUNTER)
        sc.log(who, f"SET {REDIS_LOCK} {who} NX PX {ttl_ms} on the {where} -> OK; "
               f"INCR {REDIS_COUNTER} -> token {token}")
        return token

    def release(who, server):
        server.eval(RELEASE_LUA, 1, REDIS_LOCK, who)
        sc.log(who, f"releases {REDIS_LOCK}")

    try:
        sc.note(f"Redis primary :{p_port} (pid {p_pid}), replica :{r_port} (pid {r_pid})")
        t = take("worker-A", primary, "primary")
        acked = primary.execute_command("WAIT", 1, 5000)
        if acked != 1:
            raise ScenarioFailed("the replica did not acknowledge the first INCR")
        sc.log("demo", f"WAIT 1 -> the replica has the counter at {t}")
        sc.expect(write(sc, pg("worker-A"), "worker-A", REDIS_RES, t, "report by worker-A",
                        fence_holder=True), "accepted")
        release("worker-A", primary)

        # Cut the replica off so that it misses the next INCRs.
        os.kill(r_pid, signal.SIGSTOP)
        killed = primary.execute_command("CLIENT", "KILL", "TYPE", "replica")
        sc.log("demo", f"SIGSTOP the replica; CLIENT KILL TYPE replica on the primary "
               f"-> {killed} link cut: the replica misses what follows")

        t = take("worker-B", primary, "primary")
        sc.expect(write(sc, pg("worker-B"), "worker-B", REDIS_RES, t, "report by worker-B",
                        fence_holder=True), "accepted")
        release("worker-B", primary)
        t_c = take("worker-C", primary, "primary")
        sc.expect(write(sc, pg("worker-C"), "worker-C", REDIS_RES, t_c, "report by worker-C",
                        fence_holder=True), "accepted")
        sc.note("worker-C still holds the lock when the primary dies")

        os.kill(p_pid, signal.SIGKILL)
        sc.log("demo", f"SIGKILL the primary (pid {p_pid})")
        os.kill(r_pid, signal.SIGCONT)
        replica.execute_command("REPLICAOF", "NO", "ONE")
        deadline = time.monotonic() + 10
        while replica.info("replication")["role"] != "master":
            if time.monotonic() > deadline:
                raise ScenarioFailed("the replica was not promoted")
            time.sleep(0.05)
        counter = replica.get(REDIS_COUNTER)
        holder = replica.get(REDIS_LOCK)
        sc.log("demo", f"SIGCONT the replica; REPLICAOF NO ONE -> promoted. "
               f"There the counter is {counter.decode() if counter else None} and "
               f"{REDIS_LOCK} is {'held' if holder else 'free'}")

        t = take("worker-D", replica, "promoted replica")
        if not t < t_c:
            sc.fail(f"the counter did not go backwards ({t} after {t_c})")
        sc.note(f"token {t} is below token {t_c} already accepted: stale")
        sc.expect(write(sc, pg("worker-D"), "worker-D", REDIS_RES, t, "report by worker-D",
                        fence_holder=True), "LF001")
        release("worker-D", replica)

        t = take("worker-E", replica, "promoted replica")
        if t != t_c:
            sc.fail(f"expected the counter to hand out {t_c} a second time, got {t}")
        sc.note(f"token {t} EQUALS the token accepted from worker-C: the holder check")
        sc.expect(write(sc, pg("worker-E"), "worker-E", REDIS_RES, t, "report by worker-E",
                        fence_holder=True), "LF001")
        sc.checks += 1
        fence = pg("worker-E").execute(
            "SELECT token, holder FROM lockfence.fences WHERE resource = %s",
            (REDIS_RES,)).fetchone()
        if tuple(fence) == (t_c, "worker-C"):
            sc.log("check", f"ok: the fence still records token {t_c} from worker-C")
        else:
            sc.fail(f"the fence records {tuple(fence)}, not ({t_c}, 'worker-C')")
        release("worker-E", replica)

        t = take("worker-F", replica, "promoted replica")
        sc.note("the counter has passed the highest accepted token again")
        sc.expect(write(sc, pg("worker-F"), "worker-F", REDIS_RES, t, "report by worker-F",
                        fence_holder=True), "accepted")
        sc.note("worker-C, which still believes it holds the lock, writes again")
        sc.expect(write(sc, pg("worker-C"), "worker-C", REDIS_RES, t_c, "report by worker-C, again",
                        fence_holder=True), "LF001")
    finally:
        for c in conns.values():
            c.close()
        try:
            os.kill(r_pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------------
# Scenario 4: ZooKeeper lock recipe, session expiry
# ---------------------------------------------------------------------------

ZK_LOCK = "/demo/locks/report"
ZK_RES = "zk/report"
ZK_SESSION_TIMEOUT = 2.0


def zk_lock(sc, who):
    """Connect, take kazoo's Lock, return (client, lock, czxid of the lock node)."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=ZK_HOSTS, timeout=ZK_SESSION_TIMEOUT)
    zk.start(timeout=15)
    lock = zk.Lock(ZK_LOCK, identifier=who)
    if not lock.acquire(timeout=30):
        raise RuntimeError(f"{who} could not take the lock")
    node = f"{ZK_LOCK}/{lock.node}"
    stat = zk.exists(node)
    if stat is None:
        raise RuntimeError(f"lock node {node} vanished")
    return zk, lock, node, stat.czxid


def zk_holder(sc, who, send, work_seconds):
    conn = connect()
    zk, lock, node, token = zk_lock(sc, who)
    sc.log(who, f"kazoo Lock('{ZK_LOCK}') -> node {node.rsplit('/', 1)[1]}, "
           f"token = czxid {token} (session timeout {ZK_SESSION_TIMEOUT:.0f} s)")
    sc.log(who, f"works for {work_seconds:.0f} s before writing")
    work_until = time.monotonic() + work_seconds
    send("acquired", {"token": token})
    time.sleep(max(0.0, work_until - time.monotonic()))
    sc.log(who, f"resumed; kazoo state {zk.state}, lock.is_acquired={lock.is_acquired}: "
           "it believes it holds the lock and writes")
    send("wrote", write(sc, conn, who, ZK_RES, token, "report by worker-A"))
    try:
        zk.stop()
        zk.close()
    except Exception:
        pass
    conn.close()
    send("done")


def zk_waiter(sc, who, send):
    conn = connect()
    sc.log(who, f"kazoo Lock('{ZK_LOCK}'): waits for the lock")
    zk, lock, node, token = zk_lock(sc, who)
    sc.log(who, f"got the lock (worker-A's session expired) -> node "
           f"{node.rsplit('/', 1)[1]}, token = czxid {token}")
    children = zk.get_children(ZK_LOCK)
    sc.log(who, f"lock nodes now: {len(children)}"
           + (" (its own: worker-A's ephemeral node is gone)" if len(children) == 1 else ""))
    send("wrote", write(sc, conn, who, ZK_RES, token, "report by worker-B"))
    lock.release()
    zk.stop()
    zk.close()
    sc.log(who, "released the lock")
    conn.close()
    send("done")


def scenario_zk(sc):
    sc.note("token = czxid of the holder's ephemeral sequential lock node")
    try:
        pause_scenario(sc, zk_holder, zk_waiter)
    finally:
        sc.reap()


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def cell_text(value):
    if value is None:
        return ""
    if isinstance(value, datetime.datetime):
        return value.strftime("%H:%M:%S.%f")[:-3]
    return str(value)


def print_rows(title, cur):
    rows = cur.fetchall()
    names = [d.name for d in cur.description]
    cells = [[cell_text(v) for v in row] for row in rows]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    print()
    print(f"--- {title} ---")
    print("  " + " | ".join(n.ljust(w) for n, w in zip(names, widths)))
    print("  " + "-+-".join("-" * w for w in widths))
    for r in cells:
        print("  " + " | ".join(c.ljust(w) for c, w in zip(r, widths)))
    print(f"  ({len(rows)} row{'s' if len(rows) != 1 else ''})", flush=True)


def report():
    with connect() as conn:
        print_rows(f"{TABLE} (every accepted write)", conn.execute(
            f"SELECT resource, token, holder, body, "
            f"to_char(written_at, 'HH24:MI:SS.MS') AS written_at "
            f"FROM {TABLE} ORDER BY id"))
        print_rows("lockfence.fences", conn.execute(
            "SELECT resource, token, holder, "
            "to_char(accepted_at, 'HH24:MI:SS.MS') AS accepted_at "
            "FROM lockfence.fences ORDER BY resource"))
        for view in ("lockfence.metrics", "lockfence.rejections"):
            if not conn.execute("SELECT to_regclass(%s)", (view,)).fetchone()[0]:
                print()
                print(f"--- {view}: not in this build of lockfence, skipped ---")
                continue
            try:
                print_rows(view, conn.execute(f"SELECT * FROM {view}"))
            except psycopg.Error as e:
                print()
                print(f"--- {view}: skipped ({e.sqlstate}: {e.diag.message_primary}) ---")
                continue
            if view == "lockfence.metrics":
                compare_metrics(conn)


def compare_metrics(conn):
    """Hold the rejection counters against the rejections the timeline saw.

    Informational: the demonstration's verdict is the checks above.
    """
    counters = dict(conn.execute("SELECT name, value FROM lockfence.metrics").fetchall())
    for name, seen in SEEN_REJECTIONS.items():
        if name not in counters:
            continue
        agree = "agrees" if counters[name] == seen else "DIFFERS"
        print(f"  {name} = {counters[name]}: {agree} with the "
              f"{seen} such rejection{'s' if seen != 1 else ''} in the timelines")
    sys.stdout.flush()


SCENARIOS = {
    0: ("PostgreSQL alone: the fence trigger on a protected table", scenario_pg),
    1: ("PostgreSQL leases: the leader pauses past its lease (lockfence.lease_acquire)",
        scenario_lease),
    2: ("etcd: the holder pauses past its lease (lockfence.etcd_lock)", scenario_etcd),
    3: ("Redis: a failover hands out a token that went backwards", scenario_redis),
    4: ("ZooKeeper: the holder's session expires while it is paused", scenario_zk),
}


def main(argv):
    wanted = [int(a) for a in " ".join(argv).split()] or sorted(SCENARIOS)[1:]
    start = time.monotonic()
    results = []
    for number in [0] + [n for n in wanted if n != 0]:
        title, func = SCENARIOS[number]
        sc = Scenario(number, title)
        try:
            func(sc)
        except ScenarioFailed as e:
            sc.fail(f"did not run to its end: {e}")
        except Exception:
            sc.fail("crashed:\n" + traceback.format_exc())
        results.append(sc)
    report()

    print()
    print("--- summary ---")
    ok = True
    for sc in results:
        if sc.failures or sc.checks == 0:
            ok = False
            print(f"  FAIL  scenario {sc.number}: {sc.title}")
            for f in sc.failures or ["no check ran"]:
                print(f"          {f}")
        else:
            print(f"  PASS  scenario {sc.number}: {sc.title} ({sc.checks} checks)")
    print(f"  {'all expected rejections happened, no stale write accepted' if ok else 'DEMO FAILED'}"
          f" ({time.monotonic() - start:.1f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
