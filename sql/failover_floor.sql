-- failover floor: raise_floor() after a lossy failover
CREATE EXTENSION lockfence;
\set VERBOSITY default

SELECT lockfence.fence('a', 10), lockfence.fence('b', 50), lockfence.fence('c', 99);

-- every fence below the floor is raised to it; higher ones are kept
SELECT lockfence.raise_floor(60);
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;
-- tokens below the floor are rejected, the floor itself is accepted
SELECT lockfence.try_fence('a', 59);
SELECT lockfence.fence('b', 59);
SELECT lockfence.fence('a', 60, 'new holder');
-- safe to run twice: nothing is lowered, nothing raised again
SELECT lockfence.raise_floor(60);
SELECT lockfence.raise_floor(5);
SELECT resource, token FROM lockfence.fences ORDER BY resource;

-- a set of resources: named resources without a fence get one
SELECT lockfence.raise_floor(100, ARRAY['b', 'new', 'new']);
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;
SELECT lockfence.try_fence('new', 99), lockfence.try_fence('new', 100);
SELECT lockfence.raise_floor(100, ARRAY[]::text[]);
-- a list below the global floor (60) raises its names to the global floor,
-- never below it: a row under the floor would let tokens under it through
SELECT lockfence.raise_floor(20, ARRAY['low']);
SELECT token FROM lockfence.fences WHERE resource = 'low';
SELECT lockfence.try_fence('low', 59), lockfence.try_fence('low', 60);

-- not under REPEATABLE READ or SERIALIZABLE (25000): the transaction's
-- snapshot would miss fences committed after it, and leave them below
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT lockfence.raise_floor(70);
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT lockfence.raise_floor(70, ARRAY['a']);
ROLLBACK;
-- nor accept_promotion() (library of 1.9): its DELETE would miss a record
-- committed after the snapshot and leave two, which refuse every fence
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT lockfence.accept_promotion();
ROLLBACK;
SELECT count(*) FROM lockfence.floor_state;

-- bad input
SELECT lockfence.raise_floor(NULL);
SELECT lockfence.raise_floor(-1);
SELECT lockfence.raise_floor(1, ARRAY['x', NULL]);
SELECT lockfence.raise_floor(1, ARRAY['']);
SELECT lockfence.raise_floor(1, ARRAY[repeat('x', 256)]);
SELECT count(*) FROM lockfence.fences WHERE resource = 'x';

-- operators only
CREATE ROLE floor_app;
SET ROLE floor_app;
SELECT lockfence.raise_floor(1000);
SELECT * FROM lockfence.etcd_raise_floor();
SELECT lockfence.etcd_revision();
RESET ROLE;
-- an operator granted raise_floor needs no privilege on the table
GRANT EXECUTE ON FUNCTION lockfence.raise_floor(bigint, text[]) TO floor_app;
SET ROLE floor_app;
SELECT lockfence.raise_floor(1000, ARRAY['a']);
RESET ROLE;
SELECT token FROM lockfence.fences WHERE resource = 'a';

-- etcd out of reach: etcd_raise_floor fails and raises nothing
SET lockfence.etcd_endpoints = 'http://127.0.0.1:1';
SET lockfence.etcd_request_timeout = 1000;
\set VERBOSITY terse
SELECT * FROM lockfence.etcd_raise_floor();
\set VERBOSITY default
RESET lockfence.etcd_endpoints;
RESET lockfence.etcd_request_timeout;
SELECT resource, token FROM lockfence.fences ORDER BY resource;

-- no lease survives a floor (issue 17, item 8): the rows raised lose
-- their lease columns
-- an expired lease: the floor is not a lease token, its holder may fence it
SELECT token FROM lockfence.lease_acquire('fl', '10 ms', 'h');
DO $$
BEGIN
    WHILE (SELECT lease_expires_at >= clock_timestamp()
             FROM lockfence.fences WHERE resource = 'fl') LOOP
        PERFORM pg_sleep(0.01);
    END LOOP;
END
$$;
SELECT lockfence.raise_floor(100, ARRAY['fl']);
SELECT token, holder, lease_expires_at, lease_ttl
  FROM lockfence.fences WHERE resource = 'fl';
SELECT lockfence.fence('fl', 100, 'etcd-holder');
-- an unexpired lease: it ends with the floor, no phantom lease of the
-- floor's token remains to renew, release or wait for
SELECT token FROM lockfence.lease_acquire('ul', '1 hour', 'h');
SELECT lockfence.raise_floor(200, ARRAY['ul']);
SELECT token, holder, lease_expires_at, lease_ttl
  FROM lockfence.fences WHERE resource = 'ul';
SELECT lockfence.lease_renew('ul', 200);
SELECT lockfence.lease_release('ul', 200);
SELECT lockfence.lease_release('ul', 1);
SELECT token FROM lockfence.lease_try_acquire('ul', '1 hour', 'h2');
-- the same for a floor raising every fence
SELECT token FROM lockfence.lease_acquire('al', '1 hour', 'h');
SELECT lockfence.raise_floor(5000);
SELECT count(*) AS leases_left FROM lockfence.fences
 WHERE lease_expires_at IS NOT NULL OR lease_ttl IS NOT NULL;
SELECT lockfence.fence('al', 5000, 'etcd-holder');
SELECT token FROM lockfence.lease_try_acquire('al', '1 hour', 'h2');

-- (1.14) a fence row below the global floor (on Citus: a promoted
-- worker's row between its node's floor record and the coordinator's
-- raise of the rows; here written by hand) takes no token below the floor,
-- and a lease of it starts above the floor
SELECT lockfence.fence('rb', 5000, 'old');
UPDATE lockfence.fences SET token = 5 WHERE resource = 'rb';
SELECT lockfence.fence('rb', 6, 'old');
\echo :LAST_ERROR_SQLSTATE
SELECT lockfence.try_fence('rb', 4999, 'old');
SELECT lockfence.fence('rb', 5000, 'new');
SELECT lockfence.fence('below', 5001);
UPDATE lockfence.fences SET token = 7 WHERE resource = 'below';
SELECT token FROM lockfence.lease_try_acquire('below', '1 hour', 'h');

-- (1.15) the detail of a token below the floor names the floor as such
-- (it said that the floor "has already been accepted"), for a name
-- without a row too; a stale token at or above the floor names the fence
SELECT lockfence.fence('never-fenced', 4999);
SELECT lockfence.fence('rb', 5001, 'new');
SELECT lockfence.fence('rb', 5000, 'new');
-- (1.15) and a lease below the floor ended with it, as raise_floor() ends
-- a lease whose row it raises: renewing it is LF003, releasing it false
SELECT token FROM lockfence.lease_acquire('lb', '1 hour', 'h');
UPDATE lockfence.fences SET token = 8 WHERE resource = 'lb';
SELECT lockfence.lease_renew('lb', 8);
\echo :LAST_ERROR_SQLSTATE
SELECT lockfence.lease_release('lb', 8);
SELECT lease_expires_at > now() AS still_unexpired FROM lockfence.fences
 WHERE resource = 'lb';
-- which raise_floor() then ends, raising the row
SELECT lockfence.raise_floor(5000) > 0 AS raised;
SELECT token, lease_expires_at FROM lockfence.fences WHERE resource = 'lb';

-- end the leases still held (a drop refuses them, 55006: created again,
-- the extension would grant their tokens again)
SELECT lockfence.lease_release(resource, token) FROM lockfence.fences
 WHERE lease_expires_at IS NOT NULL \g /dev/null
DROP EXTENSION lockfence;
DROP ROLE floor_app;
