-- lockfence: fence(text[], ...) and try_fence(text[], ...): several
-- resources at once, in byte order, all or nothing
CREATE EXTENSION lockfence;
\set VERBOSITY default

-- the token is accepted for every resource and returned
SELECT lockfence.fence(ARRAY['m1', 'm2', 'm3'], 5);
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;

-- the order of the array does not matter, duplicates count once
SELECT lockfence.fence(ARRAY['m3', 'm1', 'm3', 'm2', 'm1'], 6);
SELECT resource, token FROM lockfence.fences ORDER BY resource;
-- a one-element array is a plain fence
SELECT lockfence.fence(ARRAY['m1'], 7);
SELECT lockfence.current_token('m1');
-- a multi-dimensional array counts its elements
SELECT lockfence.fence(ARRAY[['m2', 'm3'], ['m3', 'm2']], 7);
SELECT resource, token FROM lockfence.fences ORDER BY resource;
-- named arguments, and an array literal
SELECT lockfence.fence(resources => '{m1,m2}', token => 7, holder => NULL);
-- an unadorned string literal is one resource (the text overload wins)
SELECT lockfence.fence('{x,y}', 1);
SELECT lockfence.reset('{x,y}');

-- a stale member: LF001 naming the first stale resource in byte order
-- ("B" sorts before "a"), and nothing of the call stays fenced
SELECT lockfence.fence(ARRAY['a', 'B', 'c'], 10);
SELECT lockfence.fence('a', 12), lockfence.fence('B', 11);
SELECT lockfence.fence(ARRAY['c', 'a', 'B', 'new'], 10);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence(ARRAY['c', 'a', 'new'], 11);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT resource, token FROM lockfence.fences
 WHERE resource IN ('a', 'B', 'c', 'new') ORDER BY resource COLLATE "C";
-- try_fence answers false, and true with every resource fenced
SELECT lockfence.try_fence(ARRAY['c', 'a', 'B', 'new'], 11) AS stale_a,
       lockfence.try_fence(ARRAY['c', 'a', 'B', 'new'], 12) AS all_fenced;
SELECT resource, token FROM lockfence.fences
 WHERE resource IN ('a', 'B', 'c', 'new') ORDER BY resource COLLATE "C";

-- all or nothing within a transaction: after a rejection the other
-- resources are neither advanced nor fenced, so a write that relies on the
-- transaction's fence is refused (LF002).  The stale resource b is checked
-- after a and before c.
CREATE TABLE ta (v int);
CREATE TABLE tc (v int);
SELECT lockfence.protect('ta', resource => 'a');
SELECT lockfence.protect('tc', resource => 'c');
SELECT lockfence.fence('a', 20), lockfence.fence('b', 30),
       lockfence.fence('c', 20);
BEGIN;
-- a and c would advance to 25, b is at 30
SELECT lockfence.try_fence(ARRAY['a', 'b', 'c'], 25);
SELECT lockfence.current_token('a') AS a, lockfence.current_token('c') AS c,
       lockfence.fenced_token('a') AS fenced_a,
       lockfence.fenced_token('c') AS fenced_c;
INSERT INTO ta VALUES (1);
ROLLBACK;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
BEGIN;
SELECT lockfence.try_fence(ARRAY['a', 'b', 'c'], 25);
SAVEPOINT w;
INSERT INTO tc VALUES (1);
ROLLBACK TO SAVEPOINT w;
-- the transaction goes on: fence what can be fenced, and write
SELECT lockfence.fence(ARRAY['a', 'c'], 25);
INSERT INTO ta VALUES (1);
INSERT INTO tc VALUES (1);
COMMIT;
SELECT resource, token FROM lockfence.fences
 WHERE resource IN ('a', 'b', 'c') ORDER BY resource COLLATE "C";

-- the same with fence(): the error undoes the call with the savepoint
BEGIN;
SAVEPOINT s;
SELECT lockfence.fence(ARRAY['a', 'b', 'c'], 26);
ROLLBACK TO SAVEPOINT s;
SELECT lockfence.current_token('a') AS a, lockfence.current_token('c') AS c,
       lockfence.fenced_token('a') AS fenced_a,
       lockfence.fenced_token('c') AS fenced_c;
SAVEPOINT w;
INSERT INTO ta VALUES (2);
ROLLBACK TO SAVEPOINT w;
COMMIT;
-- and in a PL/pgSQL exception block
DO $$
BEGIN
    BEGIN
        PERFORM lockfence.fence(ARRAY['a', 'b', 'c'], 27);
    EXCEPTION WHEN SQLSTATE 'LF001' THEN
        RAISE NOTICE 'rejected: %', SQLERRM;
    END;
    RAISE NOTICE 'a % c %, fenced a % c %',
        lockfence.current_token('a'), lockfence.current_token('c'),
        lockfence.fenced_token('a'), lockfence.fenced_token('c');
    INSERT INTO ta VALUES (3);
END
$$;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- resources this transaction fenced before the call stay fenced after a
-- rejected call (they were not the call's doing)
BEGIN;
SELECT lockfence.fence('a', 25);
SELECT lockfence.try_fence(ARRAY['a', 'c', 'b'], 25);
SELECT lockfence.fenced_token('a') AS fenced_a,
       lockfence.fenced_token('c') AS fenced_c;
INSERT INTO ta VALUES (4);
SELECT lockfence.fence('c', 25);
SELECT lockfence.try_fence(ARRAY['a', 'c', 'b'], 25);
SELECT lockfence.fenced_token('a') AS fenced_a,
       lockfence.fenced_token('c') AS fenced_c;
-- repeated calls are answered from the transaction's cache
SELECT lockfence.try_fence(ARRAY['a', 'c'], 25),
       lockfence.fence(ARRAY['c', 'a'], 25);
COMMIT;
SELECT count(*) FROM ta;

-- savepoints: a successful call is undone with its savepoint, kept with
-- its release
SELECT lockfence.fence('zz', 100);
BEGIN;
SAVEPOINT s1;
SELECT lockfence.fence(ARRAY['c', 'a'], 40);
SELECT lockfence.fenced_token('a') AS fenced_a,
       lockfence.fenced_token('c') AS fenced_c;
ROLLBACK TO SAVEPOINT s1;
SELECT lockfence.fenced_token('a') AS fenced_a,
       lockfence.fenced_token('c') AS fenced_c,
       lockfence.current_token('a') AS a, lockfence.current_token('c') AS c;
SAVEPOINT s2;
SELECT lockfence.try_fence(ARRAY['c', 'a'], 41);
RELEASE SAVEPOINT s2;
SAVEPOINT s3;
-- a rejected call inside a later savepoint leaves the released one alone
SELECT lockfence.try_fence(ARRAY['zz', 'c', 'a'], 41);
ROLLBACK TO SAVEPOINT s3;
SELECT lockfence.fenced_token('a') AS fenced_a,
       lockfence.fenced_token('c') AS fenced_c;
INSERT INTO ta VALUES (5);
INSERT INTO tc VALUES (5);
COMMIT;
SELECT resource, token FROM lockfence.fences
 WHERE resource IN ('a', 'b', 'c') ORDER BY resource COLLATE "C";

-- holders: a conflict is a rejection like a stale token
SELECT lockfence.fence(ARRAY['h1', 'h2'], 3, 'w1');
SELECT lockfence.fence(ARRAY['h2', 'h1'], 3, 'w1');
SELECT lockfence.fence(ARRAY['h2', 'h0'], 3, 'w2');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.try_fence(ARRAY['h2', 'h0'], 3, 'w2');
SELECT resource, token, holder FROM lockfence.fences
 WHERE resource LIKE 'h_' ORDER BY resource;
-- no holder is compatible with any; a higher token takes over
SELECT lockfence.try_fence(ARRAY['h1', 'h2'], 3);
SELECT lockfence.fence(ARRAY['h2', 'h0', 'h1'], 4, 'w2');
SELECT resource, token, holder FROM lockfence.fences
 WHERE resource LIKE 'h_' ORDER BY resource;

-- errors: checked before anything is fenced
SELECT lockfence.fence(NULL::text[], 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.try_fence(NULL::text[], 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence(ARRAY['e1', NULL, 'e2'], 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.try_fence(ARRAY['e1', NULL], 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence(ARRAY[]::text[], 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.try_fence('{}'::text[], 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence(ARRAY['e1'], NULL);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence(ARRAY['e1', ''], 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence(ARRAY['e1', repeat('x', 256)], 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence(ARRAY['e1', repeat('x', 255)], -1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.try_fence(ARRAY['e1'], 1, repeat('w', 256));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT count(*) FROM lockfence.fences WHERE resource LIKE 'e_' OR resource LIKE 'xxx%';
-- the longest name is accepted
SELECT lockfence.try_fence(ARRAY['e1', repeat('x', 255)], 1, repeat('w', 255));
SELECT count(*) FROM lockfence.fences WHERE resource LIKE 'e_' OR resource LIKE 'xxx%';

-- a read-only transaction cannot fence
BEGIN READ ONLY;
SELECT lockfence.fence(ARRAY['m1', 'm2'], 7);
ROLLBACK;
BEGIN READ ONLY;
SELECT lockfence.try_fence(ARRAY['m1', 'm2'], 7);
ROLLBACK;

-- rows of several resources written in one transaction (a resource column)
CREATE TABLE acct (tenant text, balance int);
SELECT lockfence.protect('acct', resource_column => 'tenant',
                         resource_prefix => 'tenant:');
BEGIN;
SELECT lockfence.fence(ARRAY['tenant:x', 'tenant:y'], 1);
INSERT INTO acct VALUES ('x', 1), ('y', 2);
INSERT INTO acct VALUES ('z', 3);
ROLLBACK;
BEGIN;
SELECT lockfence.fence(ARRAY['tenant:x', 'tenant:y'], 1);
INSERT INTO acct VALUES ('x', 1), ('y', 2);
COMMIT;
SELECT * FROM acct ORDER BY tenant;

DROP TABLE ta, tc, acct;
DROP EXTENSION lockfence;
