
/* lockfence: etcd locks (etcd concurrency Mutex compatible) */

-- Acquire the named lock, waiting as long as wait_timeout allows (NULL:
-- forever).  token is the create_revision of the lock key.
CREATE FUNCTION lockfence.etcd_lock(name text, ttl_seconds integer DEFAULT 30,
                                    wait_timeout interval DEFAULT NULL)
RETURNS TABLE (key text, lease bigint, token bigint)
AS 'MODULE_PATHNAME', 'lockfence_etcd_lock'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION lockfence.etcd_lock(text, integer, interval) IS
    'Acquire an etcd lock (waits); returns its key, lease and fencing token';

-- Acquire the named lock only if it is free at once; no row otherwise.
CREATE FUNCTION lockfence.etcd_try_lock(name text, ttl_seconds integer DEFAULT 30)
RETURNS TABLE (key text, lease bigint, token bigint)
AS 'MODULE_PATHNAME', 'lockfence_etcd_try_lock'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION lockfence.etcd_try_lock(text, integer) IS
    'Acquire an etcd lock if free at once; no row when it is taken';

-- Release a lock: delete its key and revoke its lease.
CREATE FUNCTION lockfence.etcd_unlock(key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'lockfence_etcd_unlock'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.etcd_unlock(text) IS
    'Release an etcd lock; false (with a NOTICE) when it was already gone';

-- Renew a lease once; returns the seconds it has left.
CREATE FUNCTION lockfence.etcd_keepalive(lease bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_etcd_keepalive'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.etcd_keepalive(bigint) IS
    'Renew an etcd lease; returns its remaining TTL in seconds';

-- Acquire the lock, then fence the resource with its token in the
-- current transaction.  If the fence rejects the token, the lock is
-- released again before the error propagates.
CREATE FUNCTION lockfence.etcd_lock_and_fence(name text, resource text,
                                              ttl_seconds integer DEFAULT 30,
                                              wait_timeout interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    l record;
BEGIN
    SELECT k.key, k.lease, k.token INTO STRICT l
      FROM lockfence.etcd_lock(etcd_lock_and_fence.name,
                               etcd_lock_and_fence.ttl_seconds,
                               etcd_lock_and_fence.wait_timeout) AS k;
    BEGIN
        PERFORM lockfence.fence(etcd_lock_and_fence.resource, l.token,
                                holder => l.key);
    EXCEPTION WHEN OTHERS THEN
        PERFORM lockfence.etcd_unlock(l.key);
        RAISE;
    END;
    RETURN l.token;
END;
$$;

COMMENT ON FUNCTION lockfence.etcd_lock_and_fence(text, text, integer, interval) IS
    'Acquire an etcd lock and fence a resource with its token; returns the token';

-- Network access to the lock service is granted explicitly, e.g.
--   GRANT EXECUTE ON FUNCTION lockfence.etcd_lock(text, integer, interval) TO app;
REVOKE ALL ON FUNCTION lockfence.etcd_lock(text, integer, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_try_lock(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_unlock(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_keepalive(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_lock_and_fence(text, text, integer, interval) FROM PUBLIC;
