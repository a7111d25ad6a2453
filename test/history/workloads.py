#!/usr/bin/python3
"""workloads.py: the three workloads of the history test, and their tables.

Each workload is one transaction, run by harness.py's workers under the
lock(s) of its resource(s): fence (unless the run is the self-check), read,
write, and last the witness row that records the transaction's place in
commit order.  checker.py checks their invariants:

  counter   read the counter, write counter + 1: the values along commit
            order are 1, 2, 3... and the tokens never go down
  transfer  move an amount between two accounts fenced together, in either
            order: the total never changes
  append    append 1-3 rows with the token in a column by INSERT, COPY,
            MERGE, or INSERT without token then UPDATE; move the log's head:
            the rows of every committed append are there, under its token
"""

INITIAL_BALANCE = 100

SCHEMA = """
    CREATE EXTENSION lockfence;
    CREATE SCHEMA hist;
    -- one value per resource: a counter, a balance, or an append log's
    -- head (the number of rows appended so far)
    CREATE TABLE hist.cells (resource text PRIMARY KEY, value bigint NOT NULL,
                             token bigint, holder text);
    CREATE TABLE hist.log (op text, k int, resource text NOT NULL,
                           token bigint, holder text, PRIMARY KEY (op, k));
    -- the commit-order witness: one row per committed write and resource
    CREATE SEQUENCE hist.commit_order;
    CREATE TABLE hist.witness (
        seq bigint NOT NULL DEFAULT nextval('hist.commit_order'),
        op text, resource text, token bigint, holder text,
        read bigint, written bigint, PRIMARY KEY (op, resource));
"""


def resources(service):
    """The resources of one lock service's workers, by workload."""
    return {"counter": [f"{service}/counter"],
            "transfer": [f"{service}/acct/{i}" for i in range(4)],
            "append": [f"{service}/log/{i}" for i in range(2)]}


def initial_value(resource):
    return INITIAL_BALANCE if "/acct/" in resource else 0


def create_tables(conn, services, fenced):
    """Create the tables in a fresh database; protect them unless the run is
    the self-check.  Returns the initial value of every resource."""
    conn.execute(SCHEMA)
    cells = {r: initial_value(r) for s in services for names in resources(s).values()
             for r in names}
    with conn.cursor().copy("COPY hist.cells (resource, value) FROM STDIN") as cp:
        for r, v in cells.items():
            cp.write_row((r, v))
    if fenced:
        for t in ("hist.cells", "hist.log"):
            conn.execute("SELECT lockfence.protect(%s, resource_column => 'resource', "
                         "token_column => 'token', holder_column => 'holder')", (t,))
    return cells


class Workloads:
    """Mixed into the worker: uses its self.conn (in a transaction),
    self.rng and self.fence(holds), which calls lockfence.fence() for each
    hold (token, holder) in a random order, or nothing in the self-check."""

    def read(self, resource):
        return self.conn.execute("SELECT value FROM hist.cells WHERE resource = %s",
                                 (resource,)).fetchone()[0]

    def write(self, h, value):
        self.conn.execute("UPDATE hist.cells SET value = %s, token = %s, holder = %s "
                          "WHERE resource = %s", (value, h.token, h.holder, h.resource))

    def witness(self, op, holds, reads, writes):
        """Last statement of every transaction: its place in commit order."""
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO hist.witness (op, resource, token, holder, read, written) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                [(op, h.resource, h.token, h.holder, r, w)
                 for h, r, w in zip(holds, reads, writes)])

    def counter(self, op, holds):
        self.fence(holds)
        h = holds[0]
        v = self.read(h.resource)
        self.write(h, v + 1)
        self.witness(op, holds, [v], [v + 1])
        return {"read": [v], "write": [v + 1]}

    def transfer(self, op, holds):
        self.fence(holds)
        amount = self.rng.randint(1, 20)
        reads = [self.read(h.resource) for h in holds]
        writes = [reads[0] - amount, reads[1] + amount]
        for h, v in zip(holds, writes):
            self.write(h, v)
        self.witness(op, holds, reads, writes)
        return {"read": reads, "write": writes, "amount": amount}

    def append(self, op, holds):
        """Append 1-3 rows to a log through the trigger, then move its head."""
        self.fence(holds)
        h = holds[0]
        n = self.rng.randint(1, 3)
        method = self.rng.choice(("insert", "update", "merge", "copy"))
        rows = [(op, k, h.resource, h.token, h.holder) for k in range(n)]
        c = self.conn
        if method == "insert":
            with c.cursor() as cur:
                cur.executemany("INSERT INTO hist.log VALUES (%s, %s, %s, %s, %s)", rows)
        elif method == "update":    # rows without a token, then UPDATE sets it
            with c.cursor() as cur:
                cur.executemany("INSERT INTO hist.log (op, k, resource) VALUES (%s, %s, %s)",
                                [r[:3] for r in rows])
            c.execute("UPDATE hist.log SET token = %s, holder = %s WHERE op = %s",
                      (h.token, h.holder, op))
        elif method == "merge":
            for r in rows:
                c.execute("MERGE INTO hist.log l USING (SELECT %s::text op, %s::int k) s "
                          "ON l.op = s.op AND l.k = s.k WHEN NOT MATCHED THEN "
                          "INSERT VALUES (%s, %s, %s, %s::bigint, %s)", (r[0], r[1]) + r)
        else:
            with c.cursor().copy("COPY hist.log FROM STDIN") as cp:
                for r in rows:
                    cp.write_row(r)
        head = self.read(h.resource)
        self.write(h, head + n)
        self.witness(op, holds, [head], [head + n])
        return {"read": [head], "write": [head + n], "rows": n, "method": method}
