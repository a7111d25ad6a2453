/* lockfence: update from 1.0 to 1.1 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.1'" to load this file. \quit
/* lockfence: operational metrics (need lockfence in shared_preload_libraries) */

CREATE FUNCTION lockfence.read_metrics(OUT name text, OUT value bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'lockfence_read_metrics'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION lockfence.read_metrics() IS
    'Cluster-wide lockfence counters (needs shared_preload_libraries)';

CREATE FUNCTION lockfence.read_rejections(OUT resource text,
                                          OUT rejections bigint,
                                          OUT last_rejected_token bigint,
                                          OUT highest_token bigint,
                                          OUT last_rejected_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'lockfence_read_rejections'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION lockfence.read_rejections() IS
    'Resources with the most rejected fencing tokens (bounded list)';

CREATE FUNCTION lockfence.read_histograms(OUT name text,
                                          OUT le float8[],
                                          OUT buckets bigint[],
                                          OUT sum float8,
                                          OUT count bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'lockfence_read_histograms'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION lockfence.read_histograms() IS
    'Lock acquisition and hold time histograms, Prometheus style';

CREATE FUNCTION lockfence.reset_metrics()
RETURNS void
AS 'MODULE_PATHNAME', 'lockfence_reset_metrics'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION lockfence.reset_metrics() IS
    'Set all lockfence metrics to zero (operators only)';

REVOKE ALL ON FUNCTION lockfence.reset_metrics() FROM PUBLIC;

-- One row per counter.
CREATE VIEW lockfence.metrics AS
    SELECT name, value FROM lockfence.read_metrics();

COMMENT ON VIEW lockfence.metrics IS
    'Cluster-wide lockfence counters since start or reset_metrics()';

-- The resources with the most rejected tokens, most rejected first.
CREATE VIEW lockfence.rejections AS
    SELECT resource, rejections, last_rejected_token, highest_token,
           last_rejected_at
      FROM lockfence.read_rejections()
     ORDER BY rejections DESC, last_rejected_at DESC;

COMMENT ON VIEW lockfence.rejections IS
    'Rejected fencing tokens per resource, for the most rejected resources';

-- One row per histogram: finite upper bounds, cumulative counts for them,
-- sum, and count (the +Inf bucket).
CREATE VIEW lockfence.histograms AS
    SELECT name, le, buckets, sum, count FROM lockfence.read_histograms();

COMMENT ON VIEW lockfence.histograms IS
    'Histograms: finite bucket bounds, cumulative counts, sum and count';

-- The same, one row per bucket, the +Inf bucket included.
CREATE VIEW lockfence.histogram_buckets AS
    SELECT h.name, b.le, b.count
      FROM lockfence.read_histograms() AS h,
           LATERAL (SELECT u.le, u.count
                      FROM unnest(h.le, h.buckets) AS u(le, count)
                    UNION ALL
                    SELECT 'Infinity'::float8, h.count) AS b
     ORDER BY h.name, b.le;

COMMENT ON VIEW lockfence.histogram_buckets IS
    'Histogram buckets, one row per upper bound (le), cumulative';

GRANT SELECT ON lockfence.metrics, lockfence.rejections, lockfence.histograms,
    lockfence.histogram_buckets TO PUBLIC;


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
