/* lockfence: update from 1.5 to 1.6 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.6'" to load this file. \quit

-- The fixes of 2026-12-05 (CHANGELOG 1.6): the DDL event triggers also fire
-- for ALTER FOREIGN TABLE and CREATE SCHEMA; ATTACH PARTITION exempts rows
-- only under an own trigger copy that fires in ordinary sessions; names
-- that name no table are forgotten only by the list's owner or a role with
-- CREATE on their schema; check() finds a partition's TRUNCATE trigger by
-- what it is; ATTACH and DETACH of pg_temp.x are checked and covered.

-- check(): a partition's TRUNCATE trigger counts by what it is.
-- The installation check: one row per finding, none when all is well.
CREATE OR REPLACE FUNCTION lockfence.check()
RETURNS TABLE (severity text, finding text, detail text, hint text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fence_fn oid := 'lockfence.fence_trigger()'::pg_catalog.regprocedure;
    r record;
    shape text;
    fs record;
    endpoints text;
    st record;
    citus_coordinator boolean;
    citus_shards oid[] := '{}';
BEGIN
    -- On a Citus node, shards are tables too: Citus hides them from this
    -- session's catalog queries unless told not to, and does not copy a
    -- TRUNCATE trigger to them (it refuses a TRUNCATE of a shard; the
    -- distributed table's own trigger refuses one through Citus).
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        PERFORM pg_catalog.set_config('citus.override_table_visibility', 'off', true);
        EXECUTE 'SELECT coalesce(pg_catalog.array_agg(DISTINCT tgrelid), ''{}'')'
                ' FROM pg_catalog.pg_trigger'
                ' WHERE tgfoid = $1 AND pg_catalog.relation_is_a_known_shard(tgrelid)'
           INTO citus_shards USING fence_fn;
    END IF;
    -- The metrics are there only when the library was preloaded (reading
    -- shared_preload_libraries itself needs pg_read_all_settings).
    BEGIN
        PERFORM FROM lockfence.read_metrics() LIMIT 1;
    EXCEPTION WHEN object_not_in_prerequisite_state THEN
        RETURN QUERY SELECT 'warning', 'not_preloaded',
            'lockfence is not in shared_preload_libraries: the metrics (lockfence.metrics, lockfence.rejections, lockfence.histograms) are not collected.',
            'Add lockfence to shared_preload_libraries and restart the server.';
    END;

    -- The fence table as installed: a trigger, rule, constraint or
    -- column change on it can make fence() accept what it must refuse.
    shape := lockfence.fences_table_problem();
    IF shape IS NOT NULL THEN
        RETURN QUERY SELECT 'error', 'fences_table_altered',
            pg_catalog.format('%s Fences and leases then go through SQL statements, whose outcome the change may alter.', shape),
            'Undo the change: lockfence.fences must stay as installed (compare with a fresh CREATE EXTENSION lockfence).';
    END IF;

    -- A promoted (or restored) server refuses every fence and lease with
    -- LF004 until its floor is raised: say so, with what to run.
    SELECT * INTO fs FROM lockfence.floor_status();
    IF fs.writes_refused THEN
        RETURN QUERY SELECT 'error', 'floor_not_raised',
            pg_catalog.format('This server (system identifier %s, timeline %s) is not the one that wrote the fences (system identifier %s, timeline %s): it was promoted or restored, and every fence and lease is refused with SQLSTATE LF004 until the floor is raised.',
                              fs.system_identifier, fs.timeline,
                              coalesce(fs.recorded_system_identifier::text, 'none'), coalesce(fs.recorded_timeline::text, 'none')),
            'SELECT * FROM lockfence.etcd_raise_floor(); or SELECT lockfence.raise_floor(<a token above every one issued>); or, if the promotion or restore lost nothing, SELECT lockfence.accept_promotion();';
    END IF;

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

    -- The trigger function itself: replaced (CREATE OR REPLACE) by one
    -- that does not check, every protected table accepts any write.
    -- Every C function of the extension must come from its library.
    FOR r IN
        SELECT p.oid::pg_catalog.regprocedure AS fn, l.lanname, p.prosrc, p.probin
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_language l ON l.oid = p.prolang
          JOIN pg_catalog.pg_depend d
            ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND d.objid = p.oid AND d.deptype = 'e'
          JOIN pg_catalog.pg_extension x
            ON d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid = x.oid AND x.extname = 'lockfence'
         WHERE (p.oid = fence_fn
                AND (l.lanname <> 'c' OR p.prosrc <> 'lockfence_fence_trigger'))
            OR (l.lanname = 'c' AND p.probin IS DISTINCT FROM 'MODULE_PATHNAME')
         ORDER BY 1
    LOOP
        RETURN QUERY SELECT 'error', 'function_replaced',
            pg_catalog.format('Function %s of lockfence was replaced (language %s, %s): %s',
                              r.fn, r.lanname,
                              CASE WHEN r.lanname = 'c'
                                   THEN pg_catalog.format('symbol %s in %s', r.prosrc, r.probin)
                                   ELSE 'not the extension''s code' END,
                              CASE WHEN r.fn = fence_fn::pg_catalog.regprocedure
                                   THEN 'writes to protected tables are not checked as lockfence checks them.'
                                   ELSE 'it does not do what lockfence''s function does.' END),
            'Drop and create the extension again (unprotect the tables first, and protect them again after).';
    END LOOP;

    -- A table whose lockfence TRUNCATE trigger stayed while its row trigger
    -- went (DROP TRIGGER): its rows are written unchecked.  And a table
    -- with a row trigger of its own but no TRUNCATE trigger: TRUNCATE is
    -- not fenced (partitions are checked below).
    FOR r IN
        SELECT DISTINCT tg.tgrelid::pg_catalog.regclass AS rel,
               (tg.tgtype::int & 1) = 0 AS row_missing
          FROM pg_catalog.pg_trigger tg
         WHERE tg.tgfoid = fence_fn
           AND CASE WHEN (tg.tgtype::int & 1) = 0
               THEN NOT EXISTS (SELECT FROM pg_catalog.pg_trigger x
                                 WHERE x.tgrelid = tg.tgrelid AND x.tgfoid = fence_fn
                                   AND (x.tgtype::int & 1) = 1)
               ELSE tg.tgparentid = 0
                    -- a row trigger check_trigger() refuses is reported above
                    AND (tg.tgtype::int & 2) <> 0 AND tg.tgqual IS NULL
                    AND tg.tgrelid <> ALL (citus_shards)
                    AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger x
                                     WHERE x.tgrelid = tg.tgrelid AND x.tgfoid = fence_fn
                                       AND (x.tgtype::int & 1) = 0
                                       AND (x.tgtype::int & 32) <> 0)
               END
         ORDER BY 1, 2
    LOOP
        IF r.row_missing THEN
            RETURN QUERY SELECT 'error', 'row_trigger_missing',
                pg_catalog.format('Table %s has a lockfence TRUNCATE trigger but no lockfence row trigger: its rows are written without a token check.', r.rel),
                pg_catalog.format('SELECT lockfence.unprotect(%L); then SELECT lockfence.protect(%L, ...) again.', r.rel::text, r.rel::text);
        ELSE
            RETURN QUERY SELECT 'error', 'truncate_trigger_missing',
                pg_catalog.format('Table %s has a lockfence row trigger but no lockfence TRUNCATE trigger: TRUNCATE of the table is not fenced.', r.rel),
                pg_catalog.format('SELECT lockfence.unprotect(%L); then SELECT lockfence.protect(%L, ...) again.', r.rel::text, r.rel::text);
        END IF;
    END LOOP;

    -- A table listed as protected with no lockfence trigger left:
    -- restored without its triggers (a data-only restore, or one without
    -- post-data; the list is dumped with the data), or its triggers
    -- dropped by hand.  One trigger missing is reported above.
    FOR r IN
        SELECT p.tbl AS name
          FROM lockfence.protected_tables p
         WHERE lockfence.protected_table_oid(p.tbl) IS NOT NULL
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger x
                            WHERE x.tgrelid OPERATOR(pg_catalog.=) lockfence.protected_table_oid(p.tbl)
                              AND x.tgfoid OPERATOR(pg_catalog.=) fence_fn)
         ORDER BY p.tbl
    LOOP
        RETURN QUERY SELECT 'error', 'protected_table_unguarded',
            pg_catalog.format('Table %s was protected by lockfence (lockfence.protected_tables lists it) but has no lockfence trigger: its writes are not fenced.  A restore without the triggers (data only, or without post-data) leaves a table so.', r.name),
            pg_catalog.format('SELECT lockfence.protect(%L, ...) again, with the arguments it was protected with; or, if it needs no protection, SELECT lockfence.unprotect(%L);', r.name, r.name);
    END LOOP;

    -- A listed name that names no table: the table was dropped or renamed
    -- while the event triggers were disabled, or left out of the dump
    -- (pg_dump -T, -N) this database was restored from.
    FOR r IN
        SELECT p.tbl AS name
          FROM lockfence.protected_tables p
         WHERE lockfence.protected_table_oid(p.tbl) IS NULL
         ORDER BY p.tbl
    LOOP
        RETURN QUERY SELECT 'warning', 'protected_table_missing',
            pg_catalog.format('Table %s is listed as protected but does not exist: dropped or renamed while lockfence''s event triggers were disabled, or left out of the dump this database was restored from.', r.name),
            pg_catalog.format('If it is gone for good: SELECT lockfence.sync_protected_tables(forget => ARRAY[%L]);', r.name);
    END LOOP;

    -- Descendants of protected tables without the protected ancestor's
    -- row trigger, or without a copy of its TRUNCATE trigger: one of
    -- lockfence's with the same arguments and no WHEN, whatever its name
    -- (as cover_descendant() judges; a trigger that merely has the name
    -- fences nothing).
    FOR r IN
        WITH prot AS (
            SELECT DISTINCT tg.tgrelid AS relid, tg.tgname, tg.tgargs,
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
                     WHERE x.tgrelid = i.inhrelid AND x.tgfoid = fence_fn
                       AND (x.tgtype::int & 1) = 0 AND (x.tgtype::int & 32) <> 0
                       AND x.tgargs = p.tgargs AND x.tgqual IS NULL))
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

    -- The extension's event triggers: the guards that refuse drops and
    -- publications fire ALWAYS (also with session_replication_role =
    -- replica); the one that validates DDL on protected tables fires
    -- unless disabled or limited to replica sessions.
    FOR r IN
        SELECT v.evtname, v.want, e.evtenabled
          FROM (VALUES ('lockfence_check_new_triggers', 'O'),
                       ('lockfence_check_publications', 'A'),
                       ('lockfence_forget_dropped_tables', 'A'),
                       ('lockfence_guard_drop', 'A'),
                       ('lockfence_track_protected_tables', 'A')) AS v(evtname, want)
          LEFT JOIN (pg_catalog.pg_event_trigger e
                     JOIN pg_catalog.pg_depend d
                       ON d.classid = 'pg_catalog.pg_event_trigger'::pg_catalog.regclass
                      AND d.objid = e.oid AND d.deptype = 'e'
                     JOIN pg_catalog.pg_extension x
                       ON d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
                      AND d.refobjid = x.oid AND x.extname = 'lockfence')
            ON e.evtname = v.evtname
         ORDER BY 1
    LOOP
        IF r.evtenabled IS NULL THEN
            RETURN QUERY SELECT 'warning', 'event_trigger_missing',
                pg_catalog.format('Event trigger %I of lockfence is missing.', r.evtname),
                'Drop and create the extension again (unprotect the tables first, and protect them again after).';
        ELSIF r.evtenabled = 'D' THEN
            RETURN QUERY SELECT 'warning', 'event_trigger_disabled',
                pg_catalog.format('Event trigger %I of lockfence is disabled.', r.evtname),
                pg_catalog.format('ALTER EVENT TRIGGER %I ENABLE%s;', r.evtname,
                                  CASE WHEN r.want = 'A' THEN ' ALWAYS' ELSE '' END);
        ELSIF r.want = 'A' AND r.evtenabled <> 'A' THEN
            RETURN QUERY SELECT 'warning', 'event_trigger_not_always',
                pg_catalog.format('Event trigger %I of lockfence does not fire in sessions with session_replication_role = %s.',
                                  r.evtname, CASE WHEN r.evtenabled = 'R' THEN 'origin' ELSE 'replica' END),
                pg_catalog.format('ALTER EVENT TRIGGER %I ENABLE ALWAYS;', r.evtname);
        ELSIF r.want = 'O' AND r.evtenabled = 'R' THEN
            RETURN QUERY SELECT 'warning', 'event_trigger_enabled_replica',
                pg_catalog.format('Event trigger %I of lockfence fires only when session_replication_role is replica.', r.evtname),
                pg_catalog.format('ALTER EVENT TRIGGER %I ENABLE;', r.evtname);
        END IF;
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
                      AND p.proname IN ('etcd_lock', 'etcd_try_lock', 'etcd_lock_and_fence', 'etcd_lock_many')
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

    -- On a Citus coordinator, every worker's own findings (docs/citus.md):
    -- each node has its own floor, metrics, triggers and fence shards.
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT pg_catalog.bool_or(groupid = 0) FROM pg_catalog.pg_dist_local_group'
           INTO citus_coordinator;
        IF citus_coordinator THEN
            FOR r IN EXECUTE $q$SELECT nodename, nodeport, success, result
                                  FROM pg_catalog.run_command_on_workers(
                                    $c$SELECT coalesce(pg_catalog.json_agg(c), '[]') FROM lockfence.check() AS c$c$)$q$
            LOOP
                IF NOT r.success THEN
                    RETURN QUERY SELECT 'error', 'citus_node_unchecked',
                        pg_catalog.format('lockfence.check() failed on Citus node %s:%s: %s', r.nodename, r.nodeport, r.result),
                        'Check that the node is up and that lockfence is installed there (CREATE EXTENSION lockfence on the coordinator creates it on every node).';
                    CONTINUE;
                END IF;
                RETURN QUERY SELECT 'info', 'citus_node',
                    pg_catalog.format('Citus node %s:%s checked: %s finding(s), listed next with the node named.', r.nodename, r.nodeport, pg_catalog.json_array_length(r.result::json)),
                    NULL::text;
                RETURN QUERY SELECT e->>'severity', e->>'finding',
                    pg_catalog.format('Citus node %s:%s: %s', r.nodename, r.nodeport, e->>'detail'),
                    e->>'hint'
                  FROM pg_catalog.json_array_elements(r.result::json) AS e;
            END LOOP;
        END IF;
    END IF;
END
$$;

-- The DDL event trigger also looks at ALTER FOREIGN TABLE (which can
-- INHERIT a protected table) and at CREATE SCHEMA (whose CREATE TABLE
-- ... PARTITION OF or INHERITS elements are commands of their own).  An
-- event trigger's tags cannot be altered: it is created again, in the
-- state (disabled, replica, always) it was in.

-- ALTER TABLE subcommands that would let rows be written unfenced: refused,
-- or covered (DETACH).  Called by check_new_triggers().
CREATE OR REPLACE FUNCTION lockfence.check_alter_table()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a record;
    col name;
BEGIN
    FOR a IN
        SELECT DISTINCT c.objid AS parent, s.action, s.relid, s.attnum,
                        s.partition_schema, s.partition_name
          FROM pg_catalog.pg_event_trigger_ddl_commands() AS c,
               LATERAL lockfence.alter_table_actions(c.command) AS s
         WHERE c.command_tag IN ('ALTER TABLE', 'ALTER FOREIGN TABLE', 'ALTER TYPE')
         ORDER BY s.relid, s.action, s.partition_name
    LOOP
        IF a.action = 'detach partition' THEN
            PERFORM lockfence.cover_detached(a.parent::regclass, p)
               FROM lockfence.named_partitions(a.parent::regclass, a.partition_schema,
                                               a.partition_name, false) AS p;
        ELSIF a.action = 'attach partition' THEN
            PERFORM lockfence.check_rows_fenced(p, 'ATTACH PARTITION', 0::smallint, true)
               FROM lockfence.named_partitions(a.parent::regclass, a.partition_schema,
                                               a.partition_name, true) AS p;
        ELSE
            -- a default, an identity or a new type: is the trigger still valid?
            PERFORM lockfence.check_trigger(t.oid)
               FROM pg_catalog.pg_trigger AS t
              WHERE t.tgrelid = a.relid
                AND t.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure;
            IF a.action = 'alter type using' THEN
                PERFORM lockfence.check_rows_fenced(a.relid::regclass,
                                                    'ALTER COLUMN ... TYPE ... USING',
                                                    a.attnum, false);
            ELSIF a.action = 'alter type' THEN
                -- without USING the rows are rewritten through a cast, which
                -- can change what it converts (to name truncates at 63
                -- bytes, to varchar(n) drops trailing blanks): on the
                -- resource column that renames the rows' resources,
                -- unfenced.  To text or varchar without a length, every
                -- type a resource column may have (fence_trigger_config.c)
                -- converts as its text form, which names the resource.
                SELECT att.attname INTO col
                  FROM pg_catalog.pg_trigger AS t, pg_catalog.pg_attribute AS att
                 WHERE t.tgrelid = a.relid
                   AND t.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
                   AND att.attrelid = a.relid AND att.attnum = a.attnum
                   AND 'resource_column=' || att.attname
                       = ANY (lockfence.trigger_arguments(t.tgargs))
                   AND NOT (att.atttypid IN ('pg_catalog.text'::pg_catalog.regtype,
                                             'pg_catalog.varchar'::pg_catalog.regtype)
                            AND att.atttypmod = -1)
                 LIMIT 1;
                IF col IS NOT NULL THEN
                    RAISE EXCEPTION 'cannot run ALTER COLUMN ... TYPE on column "%" of protected table "%"',
                                    col, a.relid::regclass
                        USING ERRCODE = 'feature_not_supported',
                              DETAIL = 'It names the resource of each row, and the cast that rewrites the rows to this type can change the names without a fence.',
                              HINT = 'Change it to text or to varchar without a length, which keep every name, or add a new column and fill it with UPDATE, which is fenced row by row.';
                END IF;
            END IF;
        END IF;
    END LOOP;
END
$$;

DO $$
DECLARE
    state "char" := (SELECT e.evtenabled FROM pg_catalog.pg_event_trigger e
                      WHERE e.evtname = 'lockfence_check_new_triggers');
BEGIN
    DROP EVENT TRIGGER IF EXISTS lockfence_check_new_triggers;
    CREATE EVENT TRIGGER lockfence_check_new_triggers ON ddl_command_end
        WHEN TAG IN ('CREATE TRIGGER', 'CREATE TABLE', 'CREATE TABLE AS',
                     'CREATE FOREIGN TABLE', 'ALTER TABLE', 'ALTER FOREIGN TABLE',
                     'CREATE SCHEMA', 'ALTER TYPE')
        EXECUTE FUNCTION lockfence.check_new_triggers();
    IF state = 'D' THEN
        ALTER EVENT TRIGGER lockfence_check_new_triggers DISABLE;
    ELSIF state = 'R' THEN
        ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE REPLICA;
    ELSIF state = 'A' THEN
        ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE ALWAYS;
    END IF;
END
$$;

-- Only the list's owner may make lockfence forget a name that no longer
-- names a table (a table left out of a restored dump, which check()
-- reports): the event trigger that forgets the tables a statement drops
-- runs as that owner.
ALTER FUNCTION lockfence.forget_dropped_tables() SECURITY DEFINER;

-- ATTACH PARTITION: a table's own identical row trigger exempts its rows
-- from the fence check only if it fires in ordinary sessions (one set to
-- ENABLE REPLICA did not fire for the rows written).
-- DDL that writes rows without firing row triggers (ATTACH PARTITION of a
-- table holding rows, ALTER COLUMN ... TYPE ... USING) is a write of every
-- row: every resource the rows belong to must have been fenced in this
-- transaction.  only_clones: check only the triggers the table got from a
-- new parent, unless it has an identical one of its own, under which its
-- rows were written (one that fires in ordinary sessions: not disabled,
-- nor set to fire only with session_replication_role = replica).  A rewrite of the resource column itself cannot be
-- fenced: the old resources are gone.
CREATE OR REPLACE FUNCTION lockfence.check_rows_fenced(rel regclass, action text,
                                            attnum smallint,
                                            only_clones boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET row_security = off
AS $$
DECLARE
    t record;
    args text[];
    res text;
    col text;
    prefix text;
    missing text;
    n bigint;
BEGIN
    FOR t IN
        SELECT tg.tgname, tg.tgargs
          FROM pg_catalog.pg_trigger tg
         WHERE tg.tgrelid = rel
           AND tg.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
           AND tg.tgtype::int & 1 = 1
           AND (NOT only_clones
                OR (tg.tgparentid <> 0
                    AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger x
                                     WHERE x.tgrelid = rel AND x.tgparentid = 0
                                       AND x.tgfoid = tg.tgfoid AND x.tgtype = tg.tgtype
                                       AND x.tgargs = tg.tgargs AND x.tgqual IS NULL
                                       AND x.tgenabled IN ('O', 'A'))))
         ORDER BY tg.tgname
    LOOP
        missing := NULL;
        args := lockfence.trigger_arguments(t.tgargs);
        SELECT substr(a, 10) INTO res FROM unnest(args) a WHERE a LIKE 'resource=%';
        SELECT substr(a, 17) INTO col FROM unnest(args) a WHERE a LIKE 'resource\_column=%';
        SELECT substr(a, 17) INTO prefix FROM unnest(args) a WHERE a LIKE 'resource\_prefix=%';
        IF res IS NOT NULL THEN
            EXECUTE format('SELECT count(*) FROM (SELECT FROM %s LIMIT 1) AS s', rel) INTO n;
            IF n > 0 AND lockfence.fenced_token(res) IS NULL THEN
                missing := res;
            END IF;
        ELSIF col IS NOT NULL THEN
            IF attnum <> 0 AND col = (SELECT a.attname FROM pg_catalog.pg_attribute a
                                       WHERE a.attrelid = rel
                                         AND a.attnum = check_rows_fenced.attnum) THEN
                RAISE EXCEPTION 'cannot run % on column "%" of protected table "%"', action, col, rel
                    USING ERRCODE = 'feature_not_supported',
                          DETAIL = 'It names the resource of each row, and the rows'' former resources could not be fenced.',
                          HINT = 'Add a new column and fill it with UPDATE, which is fenced row by row.';
            END IF;
            EXECUTE format('SELECT s.r FROM (SELECT DISTINCT %L || %I::text AS r FROM %s) AS s'
                           ' WHERE s.r IS NULL OR lockfence.fenced_token(s.r) IS NULL LIMIT 1',
                           coalesce(prefix, ''), col, rel)
                INTO missing;
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n > 0 THEN
                missing := coalesce(missing, '(null)');
            END IF;
        END IF;
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'cannot run % on protected table "%" without a fencing token', action, rel
                USING ERRCODE = 'LF002',
                      DETAIL = format('%s writes rows without firing trigger "%s", and resource "%s" was not fenced in this transaction.',
                                      action, t.tgname, missing),
                      HINT = 'Call lockfence.fence() for every resource of the rows, in the same transaction, before the ALTER TABLE.';
        END IF;
    END LOOP;
END
$$;

-- The event trigger that lists protected tables also fires for CREATE
-- SCHEMA, whose CREATE TRIGGER elements are commands of their own (and is
-- no rename).  Created again, in the state it was in.

-- List the tables given a lockfence row trigger (protect(), by hand, a
-- restore's post-data, also inside CREATE SCHEMA) and the new names of
-- renamed or moved ones (ALTER TABLE ... RENAME or SET SCHEMA, ALTER
-- SCHEMA ... RENAME).
CREATE OR REPLACE FUNCTION lockfence.track_protected_tables()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lockfence.sync_protected_tables(
        renamed => TG_TAG OPERATOR(pg_catalog.<>) ALL (ARRAY['CREATE TRIGGER', 'CREATE SCHEMA']));
END
$$;

DO $$
DECLARE
    state "char" := (SELECT e.evtenabled FROM pg_catalog.pg_event_trigger e
                      WHERE e.evtname = 'lockfence_track_protected_tables');
BEGIN
    DROP EVENT TRIGGER IF EXISTS lockfence_track_protected_tables;
    CREATE EVENT TRIGGER lockfence_track_protected_tables ON ddl_command_end
        WHEN TAG IN ('CREATE TRIGGER', 'ALTER TABLE', 'ALTER FOREIGN TABLE',
                     'ALTER SCHEMA', 'CREATE SCHEMA')
        EXECUTE FUNCTION lockfence.track_protected_tables();
    IF state IS NULL OR state = 'A' THEN
        ALTER EVENT TRIGGER lockfence_track_protected_tables ENABLE ALWAYS;
    ELSIF state = 'D' THEN
        ALTER EVENT TRIGGER lockfence_track_protected_tables DISABLE;
    ELSIF state = 'R' THEN
        ALTER EVENT TRIGGER lockfence_track_protected_tables ENABLE REPLICA;
    END IF;
END
$$;

-- ATTACH and DETACH PARTITION of pg_temp.x: named_partitions() found no
-- table in a schema called pg_temp (it is pg_temp_N), so ATTACH skipped
-- the check of the rows and DETACH the cover of the detached table.
-- The partition an ATTACH or DETACH named, as the statement named it: the
-- table by that name (in that schema, if given) that is now a partition of
-- parent (ATTACH), or that is no partition and is locked by this
-- transaction as DETACH locks it.  Ambiguous names give every candidate.
-- (Up to 1.5, pg_temp.x named nothing: the schema is called pg_temp_N.)
CREATE OR REPLACE FUNCTION lockfence.named_partitions(parent regclass, schema_name text,
                                           table_name text, attached boolean)
RETURNS SETOF regclass
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.oid::regclass
      FROM pg_catalog.pg_class c
     WHERE c.relname = named_partitions.table_name
       AND (named_partitions.schema_name IS NULL
            OR c.relnamespace = (SELECT n.oid FROM pg_catalog.pg_namespace n
                                  WHERE n.nspname = named_partitions.schema_name)
            -- pg_temp names the session's own temporary schema
            OR (named_partitions.schema_name = 'pg_temp'
                AND c.relnamespace = pg_catalog.pg_my_temp_schema()))
       AND CASE WHEN named_partitions.attached
           THEN EXISTS (SELECT FROM pg_catalog.pg_inherits i
                         WHERE i.inhrelid = c.oid AND i.inhparent = named_partitions.parent)
           ELSE NOT c.relispartition
                AND EXISTS (SELECT FROM pg_catalog.pg_locks l
                             WHERE l.locktype = 'relation' AND l.relation = c.oid
                               AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                                  WHERE d.datname = pg_catalog.current_database())
                               AND l.pid = pg_catalog.pg_backend_pid()
                               AND l.mode IN ('ShareUpdateExclusiveLock', 'AccessExclusiveLock'))
           END
$$;
