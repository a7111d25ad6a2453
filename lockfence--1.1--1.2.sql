/* lockfence: update from 1.1 to 1.2 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.2'" to load this file. \quit

-- etcd: unlock scope and lock_and_fence

-- etcd_lock_and_fence becomes a C function: it checks every argument
-- before contacting etcd, and releases the lock on any error before the
-- fence accepted the token (cancel and statement timeout included).
CREATE OR REPLACE FUNCTION lockfence.etcd_lock_and_fence(name text, resource text,
                                              ttl_seconds integer DEFAULT 30,
                                              wait_timeout interval DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_etcd_lock_and_fence'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.etcd_lock_and_fence(text, text, integer, interval) IS
    'Acquire an etcd lock and fence a resource with its token; returns the token';
REVOKE ALL ON FUNCTION lockfence.etcd_lock_and_fence(text, text, integer, interval) FROM PUBLIC;

-- etcd_unlock gains force and refuses keys that are not lock keys without
-- it.  Dropping the old signature drops its grants: re-grant EXECUTE on
-- lockfence.etcd_unlock(text, boolean) to the roles that had it.
DROP FUNCTION lockfence.etcd_unlock(text);

CREATE FUNCTION lockfence.etcd_unlock(key text, force boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'lockfence_etcd_unlock'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.etcd_unlock(text, boolean) IS
    'Release an etcd lock (only lock keys unless force); false (with a NOTICE) when it was already gone';
REVOKE ALL ON FUNCTION lockfence.etcd_unlock(text, boolean) FROM PUBLIC;
