-- lockfence core: the fence functions and their error paths
CREATE EXTENSION lockfence;
\set VERBOSITY default

-- the objects the extension creates
SELECT n.nspname, c.relname, c.relkind
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'lockfence' ORDER BY c.relname;
SELECT p.oid::regprocedure AS function, p.prosecdef
  FROM pg_proc p WHERE p.pronamespace = 'lockfence'::regnamespace
 ORDER BY p.proname, p.oid::regprocedure::text COLLATE "C";

-- the extension is not relocatable and lives in its own schema
ALTER EXTENSION lockfence SET SCHEMA public;

-- a first token is accepted and recorded
SELECT lockfence.current_token('orders');
SELECT lockfence.fence('orders', 5);
SELECT lockfence.current_token('orders');
SELECT resource, token, holder, accepted_at <= now() AS accepted_in_past
  FROM lockfence.fences;

-- equal tokens are accepted again (one holder writes many times)
SELECT lockfence.fence('orders', 5);
-- higher tokens advance the fence
SELECT lockfence.fence('orders', 7);
SELECT lockfence.current_token('orders');
-- lower tokens are rejected, with the extension's SQLSTATE
SELECT lockfence.fence('orders', 6);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence('orders', 0);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.current_token('orders');

-- try_fence answers false instead of raising
SELECT lockfence.try_fence('orders', 6) AS stale,
       lockfence.try_fence('orders', 7) AS equal,
       lockfence.try_fence('orders', 8) AS higher;
SELECT lockfence.current_token('orders');

-- a rejected fence does not advance anything, and the error aborts
BEGIN;
SELECT lockfence.fence('orders', 100);
SELECT lockfence.fence('orders', 1);
COMMIT;
SELECT lockfence.current_token('orders');

-- rollback leaves no trace
BEGIN;
SELECT lockfence.fence('orders', 50);
SELECT lockfence.fence('newres', 1);
ROLLBACK;
SELECT lockfence.current_token('orders'), lockfence.current_token('newres');

-- savepoints: a fence in a rolled-back savepoint is undone
BEGIN;
SELECT lockfence.fence('orders', 9);
SAVEPOINT s1;
SELECT lockfence.fence('orders', 10);
ROLLBACK TO SAVEPOINT s1;
SELECT lockfence.current_token('orders');
-- 9 is still this transaction's fence; 10 was rolled back
SELECT lockfence.fence('orders', 9);
SAVEPOINT s2;
SELECT lockfence.fence('orders', 11);
RELEASE SAVEPOINT s2;
COMMIT;
SELECT lockfence.current_token('orders');

-- holders: an equal token from another holder is rejected
SELECT lockfence.fence('jobs', 3, 'worker-a');
SELECT lockfence.fence('jobs', 3, 'worker-a');
SELECT lockfence.fence('jobs', 3);
SELECT lockfence.fence('jobs', 3, 'worker-b');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.try_fence('jobs', 3, 'worker-b');
-- a higher token replaces the holder
SELECT lockfence.fence('jobs', 4, 'worker-b');
SELECT lockfence.fence('jobs', 4, 'worker-a');
SELECT resource, token, holder FROM lockfence.fences WHERE resource = 'jobs';
-- an unknown holder on either side is accepted
SELECT lockfence.fence('anon', 1);
SELECT lockfence.fence('anon', 1, 'worker-c');
SELECT holder FROM lockfence.fences WHERE resource = 'anon';

-- the transaction cache honours the holder too
BEGIN;
SELECT lockfence.fence('jobs', 4, 'worker-b');
SELECT lockfence.fence('jobs', 4, 'worker-a');
ROLLBACK;

-- input validation
SELECT lockfence.fence(NULL, 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence('orders', NULL);
SELECT lockfence.try_fence('orders', NULL);
SELECT lockfence.fence('', 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence('orders', -1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence(repeat('x', 255), 1);
SELECT lockfence.fence(repeat('x', 256), 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence(repeat('é', 128), 1);
-- holder names have the same limit
SELECT lockfence.fence('holders', 1, repeat('h', 255)) AS holder_255;
SELECT lockfence.fence('holders', 1, repeat('h', 256));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.try_fence('holders', 2, repeat('h', 256));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.fence('holders', 2, repeat('é', 128));
SELECT lockfence.current_token('holders');
SELECT lockfence.fence('orders', 9223372036854775807) = 9223372036854775807 AS max_token;
SELECT lockfence.current_token(NULL);
SELECT lockfence.current_token('');
SELECT lockfence.reset(NULL);

-- a check is a write: not in a read-only transaction
BEGIN READ ONLY;
SELECT lockfence.fence('orders', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- nor is a reset, which says so by its own name (1.10)
BEGIN READ ONLY;
SELECT lockfence.reset('orders');
ROLLBACK;
-- nor is try_fence(), which says so by its own name too (1.11)
BEGIN READ ONLY;
SELECT lockfence.try_fence('orders', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- a repeated check of what the transaction fenced writes nothing: answered
-- after SET transaction_read_only too, by every form; a new one is not
BEGIN;
SELECT lockfence.fence('read_only_later', 5);
SET transaction_read_only = on;
SELECT lockfence.fence('read_only_later', 5),
       lockfence.try_fence('read_only_later', 5),
       lockfence.try_fence(ARRAY['read_only_later'], 5);
SELECT lockfence.try_fence('read_only_later', 6);
ROLLBACK;
BEGIN;
SELECT lockfence.fence('read_only_later', 5);
SET transaction_read_only = on;
SELECT lockfence.try_fence(ARRAY['read_only_later', 'another'], 5);
ROLLBACK;
SELECT lockfence.current_token('read_only_later');

-- reset is for operators
SELECT lockfence.reset('orders');
SELECT lockfence.reset('orders');
SELECT lockfence.current_token('orders');
SELECT lockfence.fence('orders', 1);
-- a reset rolled back restores the fence, also in the transaction cache
BEGIN;
SELECT lockfence.fence('orders', 1);
SAVEPOINT s;
SELECT lockfence.reset('orders');
ROLLBACK TO SAVEPOINT s;
SELECT lockfence.current_token('orders');
COMMIT;

-- privileges: PUBLIC may read, not fence, write the table or reset;
-- lockfence.grant_usage() lets a role fence
CREATE ROLE lockfence_app;
SET ROLE lockfence_app;
SELECT lockfence.fence('app', 1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
RESET ROLE;
-- (1.10) a null etcd argument is refused, not taken for false
SELECT lockfence.grant_usage('lockfence_app', NULL);
SELECT lockfence.revoke_usage('lockfence_app', NULL);
SELECT lockfence.grant_usage('lockfence_app');
SET ROLE lockfence_app;
SELECT lockfence.fence('app', 1);
SELECT lockfence.current_token('app');
SELECT count(*) > 0 AS can_read FROM lockfence.fences;
INSERT INTO lockfence.fences VALUES ('app', 0, now(), NULL);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
UPDATE lockfence.fences SET token = 0;
DELETE FROM lockfence.fences;
SELECT lockfence.reset('app');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
RESET ROLE;
SELECT lockfence.current_token('app');

-- search_path cannot redirect the fence's own statements
CREATE SCHEMA evil;
CREATE FUNCTION evil.texteq_always(text, text) RETURNS boolean
    LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text,
                        FUNCTION = evil.texteq_always);
\c
SET search_path = evil, public;
SELECT lockfence.fence('app', 0);
SELECT lockfence.current_token('orders');
RESET search_path;
DROP SCHEMA evil CASCADE;

-- etcd_lock_and_fence checks its arguments before contacting etcd (no
-- endpoint is configured here): its lock key is the fence's holder, so
-- the name must leave room for "/" and 16 hex digits
SELECT lockfence.etcd_lock_and_fence(repeat('n', 239), 'r');
-- also beyond any etcd lock name's limit (1024 bytes): the same 22001
SELECT lockfence.etcd_lock_and_fence(repeat('n', 2000), 'r');
\echo :LAST_ERROR_SQLSTATE
-- the array form says the same, for either length
SELECT lockfence.etcd_lock_and_fence(ARRAY['a', repeat('n', 239)], ARRAY['r1', 'r2']);
\echo :LAST_ERROR_SQLSTATE
SELECT lockfence.etcd_lock_and_fence(ARRAY['a', repeat('n', 2000)], ARRAY['r1', 'r2']);
\echo :LAST_ERROR_SQLSTATE
SELECT lockfence.etcd_lock_and_fence('n', NULL);

-- the fence table is dumped with the data
SELECT c.relname, e.extcondition
  FROM pg_extension e, unnest(e.extconfig) AS cfg(oid)
  JOIN pg_class c ON c.oid = cfg.oid
 WHERE e.extname = 'lockfence'
 ORDER BY 1;

-- (1.12) revoke_usage() takes back what the caller granted, and fails,
-- naming what is left, while the role may still execute a function
CREATE ROLE lockfence_deleg;
CREATE ROLE lockfence_app2;
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT * FROM lockfence.usage_functions(false) LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO lockfence_deleg WITH GRANT OPTION', f);
    END LOOP;
END
$$;
GRANT EXECUTE ON FUNCTION lockfence.grant_usage(regrole, boolean),
                          lockfence.revoke_usage(regrole, boolean) TO lockfence_deleg;
-- a role delegated the fence and lease functions only grants and takes
-- back those (etcd => true by default: it holds no right on the others)
SET ROLE lockfence_deleg;
SELECT lockfence.grant_usage('lockfence_app2');
SELECT lockfence.revoke_usage('lockfence_app2');
SELECT has_function_privilege('lockfence_app2', 'lockfence.fence(text, bigint, text)', 'EXECUTE');
SELECT lockfence.grant_usage('lockfence_app2');
RESET ROLE;
-- the owner cannot take back the delegated role's grant: refused, naming it
SELECT lockfence.revoke_usage('lockfence_app2');
\echo :LAST_ERROR_SQLSTATE
SELECT has_function_privilege('lockfence_app2', 'lockfence.fence(text, bigint, text)', 'EXECUTE');
-- nor take back the delegated role's own grant while it granted on
SELECT lockfence.revoke_usage('lockfence_deleg', etcd => false);
\echo :LAST_ERROR_SQLSTATE
SET ROLE lockfence_deleg;
SELECT lockfence.revoke_usage('lockfence_app2');
RESET ROLE;
SELECT lockfence.revoke_usage('lockfence_app2');
-- membership in a role granted the functions, and PUBLIC, keep EXECUTE too
GRANT lockfence_app TO lockfence_app2;
SELECT lockfence.revoke_usage('lockfence_app2');
\echo :LAST_ERROR_SQLSTATE
REVOKE lockfence_app FROM lockfence_app2;
-- also without INHERIT: the member may SET ROLE to it
CREATE ROLE lockfence_noinh NOINHERIT IN ROLE lockfence_app;
SELECT lockfence.revoke_usage('lockfence_noinh');
\echo :LAST_ERROR_SQLSTATE
DROP ROLE lockfence_noinh;
GRANT EXECUTE ON FUNCTION lockfence.lease_release(text, bigint) TO PUBLIC;
SELECT lockfence.revoke_usage('lockfence_app2', etcd => false);
\echo :LAST_ERROR_SQLSTATE
REVOKE EXECUTE ON FUNCTION lockfence.lease_release(text, bigint) FROM PUBLIC;
SELECT lockfence.revoke_usage('lockfence_app2', etcd => false);
DROP ROLE lockfence_app2;
REVOKE ALL ON FUNCTION lockfence.grant_usage(regrole, boolean),
                       lockfence.revoke_usage(regrole, boolean) FROM lockfence_deleg;
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT * FROM lockfence.usage_functions(false) LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM lockfence_deleg CASCADE', f);
    END LOOP;
END
$$;
DROP ROLE lockfence_deleg;

SELECT lockfence.revoke_usage('lockfence_app');
DROP ROLE lockfence_app;

-- dropping the extension removes everything, event trigger included
DROP EXTENSION lockfence;
SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'lockfence%';
-- the schema CREATE EXTENSION made for the extension stays, empty
SELECT count(*) FROM pg_class WHERE relnamespace = 'lockfence'::regnamespace;
