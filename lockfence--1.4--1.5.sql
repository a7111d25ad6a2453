/* lockfence: update from 1.4 to 1.5 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.5'" to load this file. \quit

-- issue 22 (Citus, docs/citus.md): protect() turns citus.enable_unsafe_triggers
-- on for its CREATE TRIGGER statements, so that Citus puts the triggers on a
-- distributed table's shards (lockfence's guard judges the table).
CREATE OR REPLACE FUNCTION lockfence.protect(tbl regclass,
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
    args text;
    citus_unsafe text;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'argument "tbl" of lockfence.protect() must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Name the table to protect.';
    END IF;
    IF (resource IS NULL) = (resource_column IS NULL) THEN
        RAISE EXCEPTION 'lockfence.protect() needs exactly one of the arguments "resource" and "resource_column"'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give resource for a table whose rows all belong to one resource, resource_column for a resource per row.';
    END IF;
    args := concat_ws(', ',
                      quote_literal('resource=' || resource),
                      quote_literal('resource_column=' || resource_column),
                      quote_literal('resource_prefix=' || resource_prefix),
                      quote_literal('token_column=' || token_column),
                      quote_literal('holder_column=' || holder_column));

    -- Citus creates a trigger on a distributed table (and on its shards)
    -- only with citus.enable_unsafe_triggers on; lockfence's own guard then
    -- refuses every Citus table whose rows are not beside their fences
    -- (docs/citus.md).  On for the two statements only.
    citus_unsafe := NULL;
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        citus_unsafe := pg_catalog.current_setting('citus.enable_unsafe_triggers', true);
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    END IF;
    EXECUTE format('CREATE TRIGGER zz_lockfence_fence'
                   ' BEFORE INSERT OR UPDATE OR DELETE ON %s'
                   ' FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger(%s)',
                   tbl, args);
    EXECUTE format('CREATE TRIGGER zz_lockfence_fence_truncate'
                   ' BEFORE TRUNCATE ON %s'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION lockfence.fence_trigger(%s)',
                   tbl, args);
    IF citus_unsafe IS NOT NULL THEN
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', citus_unsafe, true);
    END IF;

    -- Existing partitions (new ones are covered by the event trigger), and
    -- a refusal for children by plain inheritance.
    PERFORM lockfence.cover_descendants(tbl);

    -- The event trigger validates the triggers too, unless it is disabled.
    PERFORM lockfence.check_trigger(t.oid)
       FROM pg_catalog.pg_trigger AS t
      WHERE t.tgrelid = tbl
        AND t.tgname IN ('zz_lockfence_fence', 'zz_lockfence_fence_truncate');

    -- The event trigger lists the table too, unless it is disabled.
    PERFORM lockfence.sync_protected_tables();
END
$$;

-- issue 22: unprotect() turns citus.enable_unsafe_triggers on to drop a
-- distributed table's triggers.
CREATE OR REPLACE FUNCTION lockfence.unprotect(tbl regclass)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    n integer := 0;
BEGIN
    -- Citus drops a distributed table's triggers (and its shards') only
    -- with citus.enable_unsafe_triggers on, as protect() creates them;
    -- on until the transaction ends.
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    END IF;
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
    PERFORM lockfence.sync_protected_tables(forget => ARRAY(
        SELECT pg_catalog.format('%I.%I', ns.nspname, cl.relname)
          FROM pg_catalog.pg_class cl
          JOIN pg_catalog.pg_namespace ns ON ns.oid OPERATOR(pg_catalog.=) cl.relnamespace
         WHERE cl.oid OPERATOR(pg_catalog.=) tbl));
    RETURN n;
END
$$;

-- issue 22: on a Citus coordinator, check() reports every worker's findings.
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

-- Citus (issue 22, docs/citus.md): make lockfence.fences a distributed
-- table by resource, in the co-location group of the tables it protects,
-- and delegate the functions that take one resource to the node that holds
-- its shard (by their first argument, even inside a transaction block), so
-- that a fence check and the write it guards commit on the same node, in
-- the same transaction.  Run once on the coordinator; again after adding
-- functions (it skips what is done).
CREATE FUNCTION lockfence.citus_distribute(colocate_with text DEFAULT 'default')
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fn text;
    distributed boolean;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'lockfence.citus_distribute() needs the citus extension'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Run it on the coordinator of a Citus cluster (docs/citus.md).';
    END IF;
    -- Citus' catalog is named only in EXECUTE: without Citus it is not there.
    EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition'
            ' WHERE logicalrelid = ''lockfence.fences''::pg_catalog.regclass)'
       INTO distributed;
    IF NOT distributed THEN
        EXECUTE pg_catalog.format(
            'SELECT pg_catalog.create_distributed_table(%L, %L, colocate_with => %L)',
            'lockfence.fences', 'resource', colocate_with);
    END IF;
    FOREACH fn IN ARRAY ARRAY['lockfence.fence(text, bigint, text)',
                              'lockfence.try_fence(text, bigint, text)',
                              'lockfence.current_token(text)',
                              'lockfence.reset(text)',
                              'lockfence.lease_acquire(text, interval, text, interval)',
                              'lockfence.lease_try_acquire(text, interval, text)',
                              'lockfence.lease_renew(text, bigint, interval)',
                              'lockfence.lease_release(text, bigint)']
    LOOP
        EXECUTE pg_catalog.format(
            'SELECT pg_catalog.create_distributed_function(%L, %L, colocate_with => %L, force_delegation => true)',
            fn, '$1', 'lockfence.fences');
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.citus_distribute(text) IS
    'On a Citus coordinator: distribute lockfence.fences by resource and delegate the fence and lease functions to the node holding each resource';

REVOKE ALL ON FUNCTION lockfence.citus_distribute(text) FROM PUBLIC;
