-- lockfence: etcd_lock_many(text[], ...) and etcd_lock_and_fence(text[],
-- text[], ...): every argument is checked before etcd is contacted.  No
-- etcd runs here, and the endpoint refuses connections: a call that got
-- past its checks would fail with a connection error instead.
CREATE EXTENSION lockfence;
\set VERBOSITY default
SET lockfence.etcd_endpoints = 'http://127.0.0.1:1';

-- etcd_lock_many: the name array, as fence(text[], ...) reads its resources
SELECT * FROM lockfence.etcd_lock_many(NULL);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_many('{}');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_many(ARRAY['a', NULL, 'b']);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_many(ARRAY['a', 'b', '']);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_many(ARRAY['a', repeat('n', 1025)]);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- a multi-dimensional array counts its elements
SELECT * FROM lockfence.etcd_lock_many(ARRAY[['a', 'b'], ['c', NULL]]);
-- at most 1000 distinct names
SELECT * FROM lockfence.etcd_lock_many(
    ARRAY(SELECT 'n' || i FROM generate_series(1, 1001) AS i));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- the other arguments
SELECT * FROM lockfence.etcd_lock_many(ARRAY['a'], NULL);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_many(ARRAY['a'], 0);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_many(ARRAY['a'], 30, '-1 s');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_many(ARRAY['a'], 30, NULL, 'statement');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_many(ARRAY['a'], 30, NULL, NULL);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- etcd_lock_and_fence(names, resources): both arrays
SELECT * FROM lockfence.etcd_lock_and_fence(NULL::text[], ARRAY['r']);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a'], NULL::text[]);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence('{}'::text[], '{}'::text[]);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a', NULL], ARRAY['r', 's']);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a', 'b'], ARRAY['r', NULL]);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a', 'b'], ARRAY['', 's']);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a', 'b'], ARRAY['r', repeat('r', 256)]);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- the lock key is each fence's holder: names leave room for "/" and 16
-- hex digits
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a', repeat('n', 239)], ARRAY['r', 's']);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- resources[i] is fenced with the lock on names[i]: same lengths
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a', 'b'], ARRAY['r']);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- a resource carries the token of one lock only
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a', 'b', 'a'], ARRAY['r', 's', 's']);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(
    ARRAY(SELECT 'n' || i FROM generate_series(1, 1001) AS i),
    ARRAY(SELECT 'r' || i FROM generate_series(1, 1001) AS i));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a'], ARRAY['r'], NULL);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a'], ARRAY['r'], 0);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a'], ARRAY['r'], 30, '-1 s');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['a'], ARRAY['r'], 30, NULL, 'x');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- untyped literals still choose the one-resource form
SELECT lockfence.etcd_lock_and_fence('a', NULL);

-- defaults and privileges: like etcd_lock and etcd_lock_and_fence, the
-- array forms are not executable by PUBLIC
\x on
SELECT p.oid::regprocedure AS function, pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result
  FROM pg_proc p
 WHERE p.pronamespace = 'lockfence'::regnamespace
   AND p.proname IN ('etcd_lock_many', 'etcd_lock_and_fence')
 ORDER BY p.oid::regprocedure::text COLLATE "C";
\x off
CREATE ROLE lockfence_many_app;
SELECT has_function_privilege('lockfence_many_app',
           'lockfence.etcd_lock_many(text[], integer, interval, text)', 'EXECUTE') AS lock_many,
       has_function_privilege('lockfence_many_app',
           'lockfence.etcd_lock_and_fence(text[], text[], integer, interval, text)', 'EXECUTE') AS lock_and_fence_many;
DROP ROLE lockfence_many_app;

-- nothing was fenced
SELECT count(*) FROM lockfence.fences;
DROP EXTENSION lockfence;
