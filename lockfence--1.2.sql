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

-- deployment checks

-- Remove a table's protection: its lockfence triggers, and the TRUNCATE
-- triggers copied from it to its partitions (the partitions' row triggers
-- are clones and go with the parent's).  Returns the number of triggers
-- dropped.  DROP TRIGGER's own permission checks apply.
CREATE FUNCTION lockfence.unprotect(tbl regclass)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    n integer := 0;
BEGIN
    FOR t IN
        WITH RECURSIVE tree(relid, level) AS (
            SELECT tbl::oid, 0
            UNION
            SELECT i.inhrelid, up.level + 1
              FROM pg_catalog.pg_inherits i JOIN tree up ON i.inhparent = up.relid
        ), own AS (
            SELECT tg.tgname FROM pg_catalog.pg_trigger tg
             WHERE tg.tgrelid = tbl
               AND tg.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
               AND tg.tgparentid = 0
        )
        SELECT tg.tgname, tg.tgrelid, tree.level
          FROM tree
          JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = tree.relid
         WHERE tg.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
           AND tg.tgparentid = 0
           AND (tree.relid = tbl OR tg.tgname IN (SELECT tgname FROM own))
         ORDER BY tree.level DESC
    LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', t.tgname,
                                  t.tgrelid::pg_catalog.regclass);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

COMMENT ON FUNCTION lockfence.unprotect(regclass) IS
    'Drop the lockfence triggers that protect a table';

-- Refuse DROP EXTENSION lockfence (and DROP SCHEMA lockfence, DROP OWNED BY
-- its owner) while tables are protected: CASCADE would drop every protection with a NOTICE, and a
-- new CREATE EXTENSION would not restore them.  An event trigger rather
-- than a hook, so that it works without shared_preload_libraries; it fires
-- before the drop, while it still exists.  ENABLE ALWAYS: also in sessions
-- with session_replication_role = replica.
CREATE FUNCTION lockfence.guard_drop()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'lockfence_guard_drop'
LANGUAGE C;

COMMENT ON FUNCTION lockfence.guard_drop() IS
    'Refuse to drop lockfence while tables are protected by it';

CREATE EVENT TRIGGER lockfence_guard_drop ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION lockfence.guard_drop();

ALTER EVENT TRIGGER lockfence_guard_drop ENABLE ALWAYS;

-- Refuse publications that would publish lockfence.fences (FOR ALL TABLES,
-- FOR TABLES IN SCHEMA lockfence, or the table by name): a subscriber's
-- fences are its own, and following the publisher's would move them back
-- or stop the subscription with 23505.
CREATE FUNCTION lockfence.check_publications()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p record;
BEGIN
    IF coalesce(pg_catalog.current_setting('lockfence.allow_publish_fences', true),
                'off')::boolean THEN
        RETURN;
    END IF;
    FOR p IN
        WITH touched(pubid) AS (
            SELECT c.objid FROM pg_catalog.pg_event_trigger_ddl_commands() c
             WHERE c.classid = 'pg_catalog.pg_publication'::pg_catalog.regclass
            UNION
            SELECT r.prpubid FROM pg_catalog.pg_event_trigger_ddl_commands() c
              JOIN pg_catalog.pg_publication_rel r ON r.oid = c.objid
             WHERE c.classid = 'pg_catalog.pg_publication_rel'::pg_catalog.regclass
            UNION
            SELECT n.pnpubid FROM pg_catalog.pg_event_trigger_ddl_commands() c
              JOIN pg_catalog.pg_publication_namespace n ON n.oid = c.objid
             WHERE c.classid = 'pg_catalog.pg_publication_namespace'::pg_catalog.regclass
        )
        SELECT DISTINCT pub.pubname, pub.puballtables
          FROM touched
          JOIN pg_catalog.pg_publication pub ON pub.oid = touched.pubid
          JOIN pg_catalog.pg_publication_tables pt ON pt.pubname = pub.pubname
         WHERE pt.schemaname = 'lockfence' AND pt.tablename = 'fences'
    LOOP
        RAISE EXCEPTION 'publication "%" would publish lockfence.fences', p.pubname
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'A subscriber''s fences must be its own: following the publisher''s would move them back, or stop the subscription with a unique violation.',
                  HINT = CASE WHEN p.puballtables
                         THEN 'Publish the application''s tables by name or by schema instead of FOR ALL TABLES, or SET lockfence.allow_publish_fences = on to publish the fences anyway.'
                         ELSE 'Leave lockfence.fences and the lockfence schema out of the publication, or SET lockfence.allow_publish_fences = on to publish the fences anyway.'
                         END;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.check_publications() IS
    'Refuse publications that would publish lockfence.fences';

CREATE EVENT TRIGGER lockfence_check_publications ON ddl_command_end
    WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION')
    EXECUTE FUNCTION lockfence.check_publications();

ALTER EVENT TRIGGER lockfence_check_publications ENABLE ALWAYS;

-- Ask the etcd endpoints for their status (for check()).
CREATE FUNCTION lockfence.etcd_status(timeout_ms integer DEFAULT 1000,
                                      OUT endpoint text, OUT leader text,
                                      OUT revision bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'lockfence_etcd_status'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.etcd_status(integer) IS
    'Status of the etcd cluster: endpoint that answered, leader (NULL: none), revision';

REVOKE ALL ON FUNCTION lockfence.etcd_status(integer) FROM PUBLIC;

-- The installation check: one row per finding, none when all is well.
CREATE FUNCTION lockfence.check()
RETURNS TABLE (severity text, finding text, detail text, hint text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fence_fn oid := 'lockfence.fence_trigger()'::pg_catalog.regprocedure;
    r record;
    endpoints text;
    st record;
BEGIN
    -- The metrics are there only when the library was preloaded (reading
    -- shared_preload_libraries itself needs pg_read_all_settings).
    BEGIN
        PERFORM FROM lockfence.read_metrics() LIMIT 1;
    EXCEPTION WHEN object_not_in_prerequisite_state THEN
        RETURN QUERY SELECT 'warning', 'not_preloaded',
            'lockfence is not in shared_preload_libraries: the metrics (lockfence.metrics, lockfence.rejections, lockfence.histograms) are not collected.',
            'Add lockfence to shared_preload_libraries and restart the server.';
    END;

    IF pg_catalog.pg_is_in_recovery() THEN
        RETURN QUERY SELECT 'info', 'in_recovery',
            'The server is in recovery (a standby): fence() and writes to protected tables are refused with SQLSTATE 25006.',
            'Fence and write on the primary.';
    END IF;

    FOR r IN
        SELECT tg.oid, tg.tgname, tg.tgrelid::pg_catalog.regclass AS rel,
               tg.tgenabled, tg.tgqual IS NOT NULL AS has_when,
               pg_catalog.cardinality(tg.tgattr::int2[]) > 0 AS has_columns
          FROM pg_catalog.pg_trigger tg
         WHERE tg.tgfoid = fence_fn
         ORDER BY 3, 2
    LOOP
        IF r.tgenabled = 'D' THEN
            RETURN QUERY SELECT 'error', 'trigger_disabled',
                pg_catalog.format('Trigger %I on %s is disabled: writes to the table are not fenced.', r.tgname, r.rel),
                pg_catalog.format('ALTER TABLE %s ENABLE TRIGGER %I;', r.rel, r.tgname);
        ELSIF r.tgenabled = 'R' THEN
            RETURN QUERY SELECT 'error', 'trigger_enabled_replica',
                pg_catalog.format('Trigger %I on %s fires only when session_replication_role is replica: ordinary writes are not fenced.', r.tgname, r.rel),
                pg_catalog.format('ALTER TABLE %s ENABLE TRIGGER %I;', r.rel, r.tgname);
        ELSIF r.tgenabled = 'A' THEN
            RETURN QUERY SELECT 'warning', 'trigger_enabled_always',
                pg_catalog.format('Trigger %I on %s also fires in logical replication apply, which stops with LF002 at the first replicated row without a token.', r.tgname, r.rel),
                pg_catalog.format('Unless rows replicated into %s carry their tokens: ALTER TABLE %s ENABLE TRIGGER %I;', r.rel, r.rel, r.tgname);
        END IF;
        IF r.has_when OR r.has_columns THEN
            RETURN QUERY SELECT 'error', 'trigger_invalid',
                pg_catalog.format('Trigger %I on %s has a WHEN condition or a column list: some writes skip the fence.', r.tgname, r.rel),
                pg_catalog.format('DROP TRIGGER %I ON %s; then SELECT lockfence.protect(...) again.', r.tgname, r.rel);
        ELSE
            BEGIN
                PERFORM lockfence.check_trigger(r.oid);
            EXCEPTION WHEN OTHERS THEN
                RETURN QUERY SELECT 'error', 'trigger_invalid',
                    pg_catalog.format('Trigger %I on %s: %s', r.tgname, r.rel, SQLERRM),
                    pg_catalog.format('DROP TRIGGER %I ON %s; then SELECT lockfence.protect(...) again.', r.tgname, r.rel);
            END;
        END IF;
    END LOOP;

    -- Descendants of protected tables without the protected ancestor's
    -- row trigger, or without its TRUNCATE trigger (copied by name).
    FOR r IN
        WITH prot AS (
            SELECT DISTINCT tg.tgrelid AS relid, tg.tgname,
                   (tg.tgtype::int & 1) = 1 AS is_row
              FROM pg_catalog.pg_trigger tg
             WHERE tg.tgfoid = fence_fn AND tg.tgparentid = 0
        )
        SELECT DISTINCT p.relid::pg_catalog.regclass AS parent,
               i.inhrelid::pg_catalog.regclass AS child, c.relispartition,
               p.tgname, p.is_row
          FROM prot p
          JOIN pg_catalog.pg_partition_tree(p.relid) pt ON pt.relid <> p.relid
          JOIN pg_catalog.pg_inherits i ON i.inhrelid = pt.relid
          JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
         WHERE (p.is_row AND NOT EXISTS (
                    SELECT FROM pg_catalog.pg_trigger x
                     WHERE x.tgrelid = i.inhrelid AND x.tgfoid = fence_fn
                       AND (x.tgtype::int & 1) = 1))
            OR (NOT p.is_row AND NOT EXISTS (
                    SELECT FROM pg_catalog.pg_trigger x
                     WHERE x.tgrelid = i.inhrelid AND x.tgname = p.tgname))
         ORDER BY 1, 2
    LOOP
        RETURN QUERY SELECT 'error', 'partition_unprotected',
            pg_catalog.format('Partition %s of protected table %s has no lockfence %s trigger: %s',
                              r.child, r.parent,
                              CASE WHEN r.is_row THEN 'row' ELSE 'TRUNCATE' END,
                              CASE WHEN r.is_row THEN 'its rows are written without a token check.'
                                   ELSE 'TRUNCATE of the partition is not fenced.' END),
            pg_catalog.format('SELECT lockfence.cover_descendants(%L);', r.parent::text);
    END LOOP;

    -- Children by plain inheritance are written without the parent's
    -- triggers (pg_partition_tree does not show them).
    FOR r IN
        SELECT DISTINCT tg.tgrelid::pg_catalog.regclass AS parent,
               i.inhrelid::pg_catalog.regclass AS child
          FROM pg_catalog.pg_trigger tg
          JOIN pg_catalog.pg_inherits i ON i.inhparent = tg.tgrelid
          JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
         WHERE tg.tgfoid = fence_fn AND NOT c.relispartition
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger x
                            WHERE x.tgrelid = i.inhrelid AND x.tgfoid = fence_fn)
         ORDER BY 1, 2
    LOOP
        RETURN QUERY SELECT 'error', 'inheritance_child_unprotected',
            pg_catalog.format('Table %s inherits from protected table %s without its triggers.', r.child, r.parent),
            'Use declarative partitioning, or protect the child table too.';
    END LOOP;

    FOR r IN
        SELECT pt.pubname, p.puballtables
          FROM pg_catalog.pg_publication_tables pt
          JOIN pg_catalog.pg_publication p ON p.pubname = pt.pubname
         WHERE pt.schemaname = 'lockfence' AND pt.tablename = 'fences'
         ORDER BY 1
    LOOP
        RETURN QUERY SELECT 'error', 'fences_published',
            pg_catalog.format('Publication %I publishes lockfence.fences%s: its subscribers'' fences follow this server''s, moving their own back or stopping the subscription.',
                              r.pubname, CASE WHEN r.puballtables THEN ' (FOR ALL TABLES)' ELSE '' END),
            CASE WHEN r.puballtables
                 THEN pg_catalog.format('Publish the tables by name or schema instead: DROP PUBLICATION %I; CREATE PUBLICATION %I FOR TABLE ...;', r.pubname, r.pubname)
                 ELSE pg_catalog.format('ALTER PUBLICATION %I DROP TABLE lockfence.fences; (or DROP TABLES IN SCHEMA lockfence)', r.pubname)
            END;
    END LOOP;

    FOR r IN
        SELECT e.evtname, e.evtenabled
          FROM pg_catalog.pg_event_trigger e
          JOIN pg_catalog.pg_depend d
            ON d.classid = 'pg_catalog.pg_event_trigger'::pg_catalog.regclass
           AND d.objid = e.oid AND d.deptype = 'e'
          JOIN pg_catalog.pg_extension x
            ON d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid = x.oid AND x.extname = 'lockfence'
         WHERE e.evtenabled = 'D'
         ORDER BY 1
    LOOP
        RETURN QUERY SELECT 'warning', 'event_trigger_disabled',
            pg_catalog.format('Event trigger %I of lockfence is disabled.', r.evtname),
            pg_catalog.format('ALTER EVENT TRIGGER %I ENABLE ALWAYS;', r.evtname);
    END LOOP;

    -- etcd is probed when it is configured (endpoints not the default) or
    -- when a lock function has been granted to anyone.
    endpoints := pg_catalog.current_setting('lockfence.etcd_endpoints', true);
    IF coalesce(endpoints, '') <> '' AND (
        coalesce((SELECT s.source <> 'default' FROM pg_catalog.pg_settings s
                   WHERE s.name = 'lockfence.etcd_endpoints'), true)
        OR EXISTS (SELECT FROM pg_catalog.pg_proc p,
                               LATERAL pg_catalog.aclexplode(p.proacl) a
                    WHERE p.pronamespace = 'lockfence'::pg_catalog.regnamespace
                      AND p.proname IN ('etcd_lock', 'etcd_try_lock', 'etcd_lock_and_fence')
                      AND a.grantee <> p.proowner)) THEN
        IF NOT pg_catalog.has_function_privilege('lockfence.etcd_status(integer)', 'EXECUTE') THEN
            RETURN QUERY SELECT 'info', 'etcd_not_probed',
                'lockfence.etcd_endpoints is set, but this role may not call lockfence.etcd_status(), so etcd was not probed.',
                'Run lockfence.check() as a role granted EXECUTE on lockfence.etcd_status(integer).';
        ELSE
            BEGIN
                SELECT * INTO st FROM lockfence.etcd_status(2000);
                IF st.leader IS NULL THEN
                    RETURN QUERY SELECT 'error', 'etcd_no_leader',
                        pg_catalog.format('etcd endpoint %s answered, but the cluster has no leader: locks cannot be acquired.', st.endpoint),
                        'Check the etcd cluster: a majority of its members must be up and connected.';
                END IF;
            EXCEPTION WHEN OTHERS THEN
                RETURN QUERY SELECT 'error', 'etcd_unreachable',
                    pg_catalog.format('No etcd endpoint of "%s" answered a status request within 2 s: %s', endpoints, SQLERRM),
                    'Check lockfence.etcd_endpoints, the etcd servers and the network (and TLS or authentication settings).';
            END;
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION lockfence.check() IS
    'Installation check: one row per finding (severity, finding, detail, hint)';
