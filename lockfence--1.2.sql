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

-- failover floor
--
-- After a failover that lost acknowledged fence advances (an asynchronous
-- standby promoted while behind), raise the fences to a floor above every
-- token the lock service issued before: the superseded holders' tokens are
-- rejected again, and holders must acquire their locks again.

-- Raise every fence (or those of the named resources, creating rows for
-- named resources that have none) to at least floor, the lowest token
-- accepted afterwards.  Returns the number of fences raised or created.
CREATE FUNCTION lockfence.raise_floor(floor bigint, resources text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raised bigint;
    bad text;
BEGIN
    IF raise_floor.floor IS NULL THEN
        RAISE EXCEPTION 'fence floor must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF raise_floor.floor < 0 THEN
        RAISE EXCEPTION 'fence floor must not be negative'
            USING ERRCODE = 'numeric_value_out_of_range',
                  DETAIL = pg_catalog.format('The floor given was %s.', raise_floor.floor);
    END IF;
    IF pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION 'cannot raise the fence floor while the server is in recovery'
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'Run it on the primary, after the promotion.';
    END IF;

    IF raise_floor.resources IS NULL THEN
        -- The holder of the floor is unknown: any holder may present it.
        UPDATE lockfence.fences f
           SET token = raise_floor.floor,
               accepted_at = pg_catalog.statement_timestamp(),
               holder = NULL
         WHERE f.token OPERATOR(pg_catalog.<) raise_floor.floor;
        GET DIAGNOSTICS raised = ROW_COUNT;
        RETURN raised;
    END IF;

    SELECT r INTO bad
      FROM pg_catalog.unnest(raise_floor.resources) AS r
     WHERE r IS NULL OR r OPERATOR(pg_catalog.=) ''
        OR pg_catalog.octet_length(r) OPERATOR(pg_catalog.>) 255
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid fencing resource name in resources'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = CASE WHEN bad IS NULL THEN 'The array holds a null.'
                                WHEN bad OPERATOR(pg_catalog.=) '' THEN 'The array holds an empty name.'
                                ELSE 'A name is longer than 255 bytes.' END;
    END IF;

    INSERT INTO lockfence.fences AS f (resource, token, accepted_at, holder)
    SELECT DISTINCT r, raise_floor.floor, pg_catalog.statement_timestamp(),
           NULL::text
      FROM pg_catalog.unnest(raise_floor.resources) AS r
        ON CONFLICT (resource) DO UPDATE
       SET token = excluded.token, accepted_at = excluded.accepted_at,
           holder = NULL
     WHERE f.token OPERATOR(pg_catalog.<) excluded.token;
    GET DIAGNOSTICS raised = ROW_COUNT;
    RETURN raised;
END
$$;

COMMENT ON FUNCTION lockfence.raise_floor(bigint, text[]) IS
    'Raise fences to at least floor after a lossy failover (operators only)';

-- The etcd cluster's current revision (a linearizable read through
-- lockfence.etcd_endpoints): every etcd lock token issued so far is at
-- most this.
CREATE FUNCTION lockfence.etcd_revision()
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_etcd_revision'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.etcd_revision() IS
    'Current revision of the etcd cluster (linearizable read)';

-- raise_floor() above every token etcd locks issued before now.
CREATE FUNCTION lockfence.etcd_raise_floor(resources text[] DEFAULT NULL,
                                           OUT floor bigint,
                                           OUT raised bigint)
RETURNS record
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Refuse before reading etcd: the floor must be read after the
    -- promotion, not before.
    IF pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION 'cannot raise the fence floor while the server is in recovery'
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'Run it on the primary, after the promotion.';
    END IF;
    floor := lockfence.etcd_revision() OPERATOR(pg_catalog.+) 1;
    raised := lockfence.raise_floor(floor, etcd_raise_floor.resources);
END
$$;

COMMENT ON FUNCTION lockfence.etcd_raise_floor(text[]) IS
    'Raise fences above every etcd lock token issued so far (operators only)';

REVOKE ALL ON FUNCTION lockfence.raise_floor(bigint, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_revision() FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_raise_floor(text[]) FROM PUBLIC;
