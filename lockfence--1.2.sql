/* lockfence 1.2: fencing tokens for distributed locks, checked by PostgreSQL */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION lockfence" to load this file. \quit

GRANT USAGE ON SCHEMA lockfence TO PUBLIC;

-- The highest token accepted per resource.  Written only through the
-- functions below (which run their statements as this table's owner).
CREATE TABLE lockfence.fences (
    resource    text PRIMARY KEY
                CHECK (resource <> '' AND octet_length(resource) <= 255),
    token       bigint NOT NULL CHECK (token >= 0),
    accepted_at timestamptz NOT NULL,
    holder      text
);

COMMENT ON TABLE lockfence.fences IS
    'Highest fencing token accepted per resource';

REVOKE ALL ON lockfence.fences FROM PUBLIC;
GRANT SELECT ON lockfence.fences TO PUBLIC;

-- A restore that forgot the fences would accept stale tokens.
SELECT pg_catalog.pg_extension_config_dump('lockfence.fences', '');

CREATE FUNCTION lockfence.fence(resource text, token bigint,
                                holder text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_fence'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION lockfence.fence(text, bigint, text) IS
    'Accept token for resource in this transaction, or raise SQLSTATE LF001';

CREATE FUNCTION lockfence.try_fence(resource text, token bigint,
                                    holder text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'lockfence_try_fence'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION lockfence.try_fence(text, bigint, text) IS
    'Like fence(), but return false for a rejected token';

CREATE FUNCTION lockfence.current_token(resource text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_current_token'
LANGUAGE C STABLE;

COMMENT ON FUNCTION lockfence.current_token(text) IS
    'Highest token accepted for resource, NULL if none';

CREATE FUNCTION lockfence.reset(resource text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'lockfence_reset'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION lockfence.reset(text) IS
    'Forget the fence of resource (operators only)';

REVOKE ALL ON FUNCTION lockfence.reset(text) FROM PUBLIC;

/* lockfence: fail-closed fencing of protected tables */

CREATE FUNCTION lockfence.fence_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'lockfence_fence_trigger'
LANGUAGE C;

COMMENT ON FUNCTION lockfence.fence_trigger() IS
    'BEFORE trigger rejecting writes without an acceptable fencing token';

CREATE FUNCTION lockfence.check_trigger(trigger_oid oid)
RETURNS void
AS 'MODULE_PATHNAME', 'lockfence_check_trigger'
LANGUAGE C STRICT;

COMMENT ON FUNCTION lockfence.check_trigger(oid) IS
    'Validate a trigger that calls lockfence.fence_trigger()';

-- Spread a protected table's TRUNCATE triggers to one of its partitions
-- (statement triggers are not cloned to partitions, and TRUNCATE of a
-- partition fires only the partition's own), and refuse tables that would
-- hold a protected table's rows without its row triggers: children by
-- plain inheritance.
CREATE FUNCTION lockfence.cover_descendant(rel regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    args text;
BEGIN
    FOR t IN
        WITH RECURSIVE ancestors(relid, via_partition) AS (
            SELECT i.inhparent, c.relispartition
              FROM pg_catalog.pg_inherits i
              JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
             WHERE i.inhrelid = rel
            UNION
            SELECT i.inhparent, a.via_partition AND c.relispartition
              FROM ancestors a
              JOIN pg_catalog.pg_inherits i ON i.inhrelid = a.relid
              JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
        )
        SELECT tg.tgname, tg.tgtype, tg.tgargs, tg.tgnargs, a.relid, a.via_partition
          FROM ancestors a
          JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = a.relid
         WHERE tg.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
    LOOP
        IF NOT t.via_partition THEN
            RAISE EXCEPTION 'table "%" cannot inherit from table "%", which is protected by lockfence',
                rel, t.relid::regclass
                USING ERRCODE = 'feature_not_supported',
                      DETAIL = 'Rows of an inheritance child are written without the parent''s triggers.',
                      HINT = 'Use declarative partitioning, whose partitions get the row triggers.';
        END IF;
        -- TRUNCATE triggers (BEFORE, statement level) are copied by name.
        IF t.tgtype::int & 1 = 0 AND t.tgtype::int & 32 <> 0
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger x
                            WHERE x.tgrelid = rel AND x.tgname = t.tgname) THEN
            SELECT pg_catalog.string_agg(pg_catalog.quote_literal(a), ', ')
              INTO args
              FROM pg_catalog.unnest((pg_catalog.string_to_array(
                       pg_catalog.encode(t.tgargs, 'escape'), '\000'))[1:t.tgnargs]) AS a;
            EXECUTE pg_catalog.format(
                'CREATE TRIGGER %I BEFORE TRUNCATE ON %s FOR EACH STATEMENT'
                ' EXECUTE FUNCTION lockfence.fence_trigger(%s)',
                t.tgname, rel, coalesce(args, ''));
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.cover_descendant(regclass) IS
    'Give a partition its protected ancestors'' TRUNCATE triggers';

-- cover_descendant() for a table and everything below it.
CREATE FUNCTION lockfence.cover_descendants(rel regclass)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE tree(relid) AS (
        SELECT rel::oid
        UNION
        SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent = t.relid
    )
    SELECT lockfence.cover_descendant(relid::regclass) FROM tree;
$$;

COMMENT ON FUNCTION lockfence.cover_descendants(regclass) IS
    'cover_descendant() for a table and all its descendants';

-- Report a misused fence_trigger() when the trigger is created rather than
-- at the first write, and cover new partitions of protected tables.
CREATE FUNCTION lockfence.check_new_triggers()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tg oid;
    rel oid;
BEGIN
    FOR tg IN
        SELECT t.oid
          FROM pg_catalog.pg_event_trigger_ddl_commands() AS c
          JOIN pg_catalog.pg_trigger AS t ON t.oid = c.objid
         WHERE c.classid = 'pg_catalog.pg_trigger'::pg_catalog.regclass
           AND t.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
    LOOP
        PERFORM lockfence.check_trigger(tg);
    END LOOP;

    FOR rel IN
        SELECT DISTINCT c.objid
          FROM pg_catalog.pg_event_trigger_ddl_commands() AS c
          JOIN pg_catalog.pg_class AS r ON r.oid = c.objid
         WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
           AND c.objsubid = 0
           AND r.relkind IN ('r', 'p', 'f')
    LOOP
        PERFORM lockfence.cover_descendants(rel);
    END LOOP;
END
$$;

CREATE EVENT TRIGGER lockfence_check_new_triggers ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER', 'CREATE TABLE', 'CREATE TABLE AS',
                 'CREATE FOREIGN TABLE', 'ALTER TABLE')
    EXECUTE FUNCTION lockfence.check_new_triggers();

-- Protect a table: the row trigger and, for a fixed resource, the TRUNCATE
-- trigger, named so that they fire after the table's other BEFORE triggers.
CREATE FUNCTION lockfence.protect(tbl regclass,
                                  resource text DEFAULT NULL,
                                  resource_column name DEFAULT NULL,
                                  resource_prefix text DEFAULT NULL,
                                  token_column name DEFAULT NULL,
                                  holder_column name DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    args text := '';
BEGIN
    IF resource IS NOT NULL THEN
        args := args || ', ' || quote_literal('resource=' || resource);
    END IF;
    IF resource_column IS NOT NULL THEN
        args := args || ', ' || quote_literal('resource_column=' || resource_column);
    END IF;
    IF resource_prefix IS NOT NULL THEN
        args := args || ', ' || quote_literal('resource_prefix=' || resource_prefix);
    END IF;
    IF token_column IS NOT NULL THEN
        args := args || ', ' || quote_literal('token_column=' || token_column);
    END IF;
    IF holder_column IS NOT NULL THEN
        args := args || ', ' || quote_literal('holder_column=' || holder_column);
    END IF;
    args := ltrim(args, ', ');

    EXECUTE format('CREATE TRIGGER zz_lockfence_fence'
                   ' BEFORE INSERT OR UPDATE OR DELETE ON %s'
                   ' FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger(%s)',
                   tbl, args);
    EXECUTE format('CREATE TRIGGER zz_lockfence_fence_truncate'
                   ' BEFORE TRUNCATE ON %s'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION lockfence.fence_trigger(%s)',
                   tbl, args);

    -- Existing partitions (new ones are covered by the event trigger), and
    -- a refusal for children by plain inheritance.
    PERFORM lockfence.cover_descendants(tbl);
END
$$;

COMMENT ON FUNCTION lockfence.protect(regclass, text, name, text, name, name) IS
    'Create the lockfence triggers that protect a table';
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

/* lockfence: leases (lease locks whose token is the fence's token) */

-- A lease is its name's fence row: granting advances the token and
-- records the expiry here, so the fence check reads it with the token.
ALTER TABLE lockfence.fences
    ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN lease_ttl interval;

COMMENT ON COLUMN lockfence.fences.lease_expires_at IS
    'Expiry of the lease that granted token (-infinity: released); NULL when token is not a lease token';
COMMENT ON COLUMN lockfence.fences.lease_ttl IS
    'TTL the lease was granted or last renewed with';

CREATE FUNCTION lockfence.lease_acquire(name text, ttl interval,
                                        holder text DEFAULT NULL,
                                        wait_timeout interval DEFAULT NULL,
                                        OUT token bigint,
                                        OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'lockfence_lease_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.lease_acquire(text, interval, text, interval) IS
    'Acquire a lease (waits); returns its fencing token and expiry';

CREATE FUNCTION lockfence.lease_try_acquire(name text, ttl interval,
                                            holder text DEFAULT NULL,
                                            OUT token bigint,
                                            OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'lockfence_lease_try_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.lease_try_acquire(text, interval, text) IS
    'Acquire a lease if free at once; NULLs when it is held';

CREATE FUNCTION lockfence.lease_renew(name text, token bigint,
                                      ttl interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'lockfence_lease_renew'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.lease_renew(text, bigint, interval) IS
    'Extend an unexpired lease; returns the new expiry, or raises LF003';

CREATE FUNCTION lockfence.lease_release(name text, token bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'lockfence_lease_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.lease_release(text, bigint) IS
    'End a lease at once; false when it had expired or was taken over';
