-- lockfence: the functions that fence, take a lease or an etcd lock
-- refuse to run during a parallel operation.  They are PARALLEL UNSAFE
-- themselves; a caller's function wrongly marked PARALLEL SAFE (which may
-- run in a worker) or RESTRICTED (which runs in the leader, in parallel
-- mode too) gets a clear error (25000) instead of an internal one, and
-- nothing is fenced.
CREATE EXTENSION lockfence;
\set VERBOSITY terse

CREATE TABLE work_items AS SELECT g AS id FROM generate_series(1, 1000) g;
ANALYZE work_items;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;

CREATE FUNCTION fence_safe(id int) RETURNS bigint
LANGUAGE plpgsql PARALLEL SAFE
AS $$ BEGIN RETURN lockfence.fence('par', 5); END $$;
CREATE FUNCTION fence_restricted(id int) RETURNS bigint
LANGUAGE plpgsql PARALLEL RESTRICTED
AS $$ BEGIN RETURN lockfence.fence('par', 5); END $$;

-- the plans are parallel: a worker or the leader in parallel mode calls it
EXPLAIN (COSTS OFF) SELECT count(fence_safe(id)) FROM work_items;
EXPLAIN (COSTS OFF) SELECT fence_restricted(id) FROM work_items WHERE id = 1;

SELECT count(fence_safe(id)) FROM work_items;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT fence_restricted(id) FROM work_items WHERE id = 1;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT count(*) AS fenced FROM lockfence.fences;

-- every function that fences, locks or takes a lease says the same
CREATE FUNCTION call_restricted(id int, what text) RETURNS text
LANGUAGE plpgsql PARALLEL RESTRICTED
AS $$ BEGIN EXECUTE what; RETURN 'ran'; END $$;
SELECT call_restricted(id, $q$SELECT lockfence.try_fence('par', 5)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.fence(ARRAY['par', 'par2'], 5)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.try_fence(ARRAY['par'], 5)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.reset('par')$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.lease_acquire('par', '10s')$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.lease_try_acquire('par', '10s')$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.lease_renew('par', 1)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.lease_release('par', 1)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.etcd_lock('par', 10)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.etcd_try_lock('par', 10)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.etcd_unlock('/par/1')$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.etcd_lock_many(ARRAY['par'], 10)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.etcd_lock_and_fence('par', 'par', 10)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.etcd_lock_and_fence(ARRAY['par'], ARRAY['par'], 10)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.etcd_keepalive(1)$q$)
  FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.lock_resource('par')$q$)
  FROM work_items WHERE id = 1;
-- (1.10) what reads lockfence.floor_state with the latest snapshot says
-- so too (it was an internal error, XX000)
SELECT call_restricted(id, $q$SELECT lockfence.floor_status()$q$)
  FROM work_items WHERE id = 1;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT count(*) AS fenced FROM lockfence.fences;

-- reading the fence table is allowed (current_token() is PARALLEL UNSAFE
-- by default, but reads nothing a worker lacks)
SELECT lockfence.fence('par_read', 4);
CREATE FUNCTION read_safe(id int) RETURNS bigint
LANGUAGE plpgsql PARALLEL SAFE
AS $$ BEGIN RETURN lockfence.current_token('par_read'); END $$;
SELECT read_safe(id) AS token, count(*) FROM work_items GROUP BY 1;
SELECT lockfence.reset('par_read');

-- fenced_token() and forget_fenced() use this transaction's fences, which
-- a worker does not have: refused there (only workers run the plan here,
-- on this test's own server, whose worker slots are free), answered in
-- the leader
BEGIN;
SELECT lockfence.fence('par2', 3);
CREATE FUNCTION fenced_safe(id int) RETURNS bigint
LANGUAGE plpgsql PARALLEL SAFE
AS $$ BEGIN RETURN lockfence.fenced_token('par2'); END $$;
CREATE FUNCTION fenced_restricted(id int) RETURNS bigint
LANGUAGE plpgsql PARALLEL RESTRICTED
AS $$ BEGIN RETURN lockfence.fenced_token('par2'); END $$;
SET LOCAL parallel_leader_participation = off;
SAVEPOINT s;
SELECT count(fenced_safe(id)) FROM work_items;
ROLLBACK TO s;
CREATE FUNCTION forget_safe(id int) RETURNS int
LANGUAGE plpgsql PARALLEL SAFE
AS $$ BEGIN PERFORM lockfence.forget_fenced(ARRAY['par2']); RETURN 1; END $$;
SAVEPOINT s;
SELECT count(forget_safe(id)) FROM work_items;
ROLLBACK TO s;
SELECT fenced_restricted(id) FROM work_items WHERE id = 1;
ROLLBACK;

-- outside a parallel plan the same functions work
SET max_parallel_workers_per_gather = 0;
SELECT fence_restricted(id) FROM work_items WHERE id = 1;
SELECT call_restricted(id, $q$SELECT lockfence.reset('par')$q$)
  FROM work_items WHERE id = 1;

DROP TABLE work_items;
DROP FUNCTION fence_safe(int), fence_restricted(int), call_restricted(int, text),
  read_safe(int);
DROP EXTENSION lockfence;
