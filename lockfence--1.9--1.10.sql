/* lockfence: update from 1.9 to 1.10 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.10'" to load this file. \quit

-- floor_state records the database it was recorded in: a copy made with
-- CREATE DATABASE ... TEMPLATE carries the original's row, naming this
-- server, and the library of 1.10 refuses its fences (LF004) until the
-- floor is raised.  The row kept by the update is this database's.
ALTER TABLE lockfence.floor_state ADD COLUMN database_oid oid;
UPDATE lockfence.floor_state
   SET database_oid = (SELECT d.oid FROM pg_catalog.pg_database d
                        WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database());

-- check(): floor_not_raised says when the refusal is a copy from another
-- database.
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
    roles text;
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
    IF fs.writes_refused AND fs.system_identifier OPERATOR(pg_catalog.=) fs.recorded_system_identifier
       AND fs.timeline OPERATOR(pg_catalog.=) fs.recorded_timeline THEN
        IF (SELECT pg_catalog.count(*) FROM lockfence.floor_state) OPERATOR(pg_catalog.=) 1 THEN
            -- (1.10) one row naming this server, recorded in another database:
            -- a copy (CREATE DATABASE ... TEMPLATE)
            RETURN QUERY SELECT 'error', 'floor_not_raised',
                pg_catalog.format('The fences of this database were copied from another database (lockfence.floor_state was recorded in the database of OID %s; this one is %s): a copy made with CREATE DATABASE ... TEMPLATE is as old as the moment it was made, and every fence and lease is refused with SQLSTATE LF004 until the floor is raised.',
                                  (SELECT s.database_oid FROM lockfence.floor_state s),
                                  (SELECT d.oid FROM pg_catalog.pg_database d
                                    WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())),
                'SELECT * FROM lockfence.etcd_raise_floor(); or SELECT lockfence.raise_floor(<a token above every one issued>); or, if nothing was fenced or granted in the original database since the copy was made, SELECT lockfence.accept_promotion();';
        ELSE
            -- (1.9) more than one row, all naming this server: a restored dump
            RETURN QUERY SELECT 'error', 'floor_not_raised',
                pg_catalog.format('The fences of this database were restored from a dump (lockfence.floor_state holds %s rows: the one recorded when the extension was created here and the dumped ones): they are as old as the dump, and every fence and lease is refused with SQLSTATE LF004 until the floor is raised.',
                                  (SELECT pg_catalog.count(*) FROM lockfence.floor_state)),
                'SELECT * FROM lockfence.etcd_raise_floor(); or SELECT lockfence.raise_floor(<a token above every one issued>); or, if nothing was fenced or granted since the dump was taken, SELECT lockfence.accept_promotion();';
        END IF;
    ELSIF fs.writes_refused THEN
        RETURN QUERY SELECT 'error', 'floor_not_raised',
            pg_catalog.format('This server (system identifier %s, timeline %s) is not the one that wrote the fences (system identifier %s, timeline %s): it was promoted or restored, and every fence and lease is refused with SQLSTATE LF004 until the floor is raised.',
                              fs.system_identifier, fs.timeline,
                              coalesce(fs.recorded_system_identifier::text, 'none'), coalesce(fs.recorded_timeline::text, 'none')),
            'SELECT * FROM lockfence.etcd_raise_floor(); or SELECT lockfence.raise_floor(<a token above every one issued>); or, if the promotion or restore lost nothing, SELECT lockfence.accept_promotion();';
    END IF;

    -- A BEFORE ROW trigger that fires ahead of lockfence's sees the row
    -- first and may change it, its token included: whoever may replace its
    -- function can make any write carry a token of their choosing.  Such
    -- functions should be the table owner's.  A partition's clone of its
    -- parent's trigger counts: it fires there, even where the parent
    -- itself is not protected.
    FOR r IN
        SELECT tg.tgname, tg.tgrelid::pg_catalog.regclass AS rel,
               tg.tgfoid::pg_catalog.regprocedure AS fn, fo.rolname AS fowner,
               tow.rolname AS towner
          FROM pg_catalog.pg_trigger tg
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) tg.tgrelid
          JOIN pg_catalog.pg_roles tow ON tow.oid OPERATOR(pg_catalog.=) c.relowner
          JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) tg.tgfoid
          JOIN pg_catalog.pg_roles fo ON fo.oid OPERATOR(pg_catalog.=) p.proowner
         WHERE tg.tgfoid OPERATOR(pg_catalog.<>) fence_fn
           AND (tg.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 3) OPERATOR(pg_catalog.=) 3   -- ROW, BEFORE
           AND (tg.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 20) OPERATOR(pg_catalog.<>) 0  -- INSERT or UPDATE
           AND EXISTS (SELECT FROM pg_catalog.pg_trigger f
                        WHERE f.tgrelid OPERATOR(pg_catalog.=) tg.tgrelid
                          AND f.tgfoid OPERATOR(pg_catalog.=) fence_fn)
           AND NOT fo.rolsuper
           AND p.proowner OPERATOR(pg_catalog.<>) c.relowner
           AND NOT pg_catalog.pg_has_role(p.proowner, c.relowner, 'USAGE')
         ORDER BY 2, 1
    LOOP
        RETURN QUERY SELECT 'warning', 'trigger_function_foreign',
            pg_catalog.format('Trigger %I on %s runs before the fence and executes %s, owned by %I, who has not the privileges of the table''s owner %I: replacing the function changes what every write carries, its token included.',
                              r.tgname, r.rel, r.fn, r.fowner, r.towner),
            pg_catalog.format('ALTER FUNCTION %s OWNER TO %I; (or drop the trigger)', r.fn, r.towner);
    END LOOP;

    -- pg_write_all_data may write lockfence's own tables, which only
    -- lockfence's functions write otherwise: a row of lockfence.fences
    -- moved back or deleted lets the next stale token through.
    SELECT pg_catalog.string_agg(pg_catalog.quote_ident(m.rolname), ', ' ORDER BY m.rolname) INTO roles
      FROM pg_catalog.pg_roles m
     WHERE NOT m.rolsuper
       AND m.rolname OPERATOR(pg_catalog.<>) 'pg_write_all_data'
       AND pg_catalog.pg_has_role(m.oid, 'pg_write_all_data', 'MEMBER');
    IF roles IS NOT NULL THEN
        RETURN QUERY SELECT 'warning', 'write_all_data_granted',
            pg_catalog.format('%s may act as pg_write_all_data: update or delete rows of lockfence.fences, which moves a fence back or removes it, and then a stale token is accepted (and write lockfence.floor_state and lockfence.protected_tables).', roles),
            (SELECT pg_catalog.format('REVOKE pg_write_all_data FROM %s;',
                                      pg_catalog.string_agg(pg_catalog.quote_ident(g.rolname), ', ' ORDER BY g.rolname))
               FROM pg_catalog.pg_auth_members a
               JOIN pg_catalog.pg_roles g ON g.oid OPERATOR(pg_catalog.=) a.member
              WHERE a.roleid OPERATOR(pg_catalog.=) 'pg_write_all_data'::pg_catalog.regrole);
    END IF;

    -- A session with session_replication_role = replica writes without
    -- firing the triggers.  Superusers may set it; so may roles a
    -- superuser let (GRANT SET ON PARAMETER, inherited by their members),
    -- and a role or database setting starts every session that way.
    IF EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE tgfoid OPERATOR(pg_catalog.=) fence_fn) THEN
        SELECT pg_catalog.string_agg(g.name, ', ' ORDER BY g.name) INTO roles
          FROM (SELECT DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                     ELSE pg_catalog.quote_ident(ro.rolname) END AS name
                  FROM pg_catalog.pg_parameter_acl p
                 CROSS JOIN LATERAL pg_catalog.aclexplode(p.paracl) a
                  LEFT JOIN pg_catalog.pg_roles ro ON ro.oid OPERATOR(pg_catalog.=) a.grantee
                 WHERE p.parname OPERATOR(pg_catalog.=) 'session_replication_role'
                   AND a.privilege_type OPERATOR(pg_catalog.=) ANY ('{SET,ALTER SYSTEM}')
                   AND NOT coalesce(ro.rolsuper, false)) g;
        IF roles IS NOT NULL THEN
            RETURN QUERY SELECT 'warning', 'replication_role_granted',
                pg_catalog.format('%s (and members) may SET session_replication_role, or ALTER SYSTEM it: their writes in a session with it set to replica skip the triggers of protected tables.', roles),
                pg_catalog.format('REVOKE SET, ALTER SYSTEM ON PARAMETER session_replication_role FROM %s CASCADE;', roles);
        END IF;
        FOR r IN
            SELECT s.setrole, ro.rolname, s.setdatabase, d.datname
              FROM pg_catalog.pg_db_role_setting s
              LEFT JOIN pg_catalog.pg_roles ro ON ro.oid OPERATOR(pg_catalog.=) s.setrole
              LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.setdatabase
             WHERE (s.setdatabase OPERATOR(pg_catalog.=) 0 OR d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
               AND (s.setrole OPERATOR(pg_catalog.=) 0 OR ro.rolcanlogin)
               AND EXISTS (SELECT FROM pg_catalog.unnest(s.setconfig) c
                            WHERE pg_catalog.lower(c) OPERATOR(pg_catalog.=) 'session_replication_role=replica')
             ORDER BY 2, 4
        LOOP
            RETURN QUERY SELECT 'error', 'replication_role_default',
                pg_catalog.format('Sessions of %s in %s start with session_replication_role = replica: their writes skip the triggers of protected tables.',
                                  CASE WHEN r.setrole OPERATOR(pg_catalog.=) 0 THEN 'every role'
                                       ELSE 'role ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(r.rolname) END,
                                  CASE WHEN r.setdatabase OPERATOR(pg_catalog.=) 0 THEN 'every database'
                                       ELSE 'database ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(r.datname) END),
                pg_catalog.format('ALTER %s RESET session_replication_role;',
                                  CASE WHEN r.setrole OPERATOR(pg_catalog.=) 0 AND r.setdatabase OPERATOR(pg_catalog.=) 0 THEN 'ROLE ALL'
                                       WHEN r.setrole OPERATOR(pg_catalog.=) 0 THEN 'DATABASE ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(r.datname)
                                       WHEN r.setdatabase OPERATOR(pg_catalog.=) 0 THEN 'ROLE ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(r.rolname)
                                       ELSE 'ROLE ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(r.rolname)
                                            OPERATOR(pg_catalog.||) ' IN DATABASE ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(r.datname) END);
        END LOOP;
        -- the server's configuration (postgresql.conf, ALTER SYSTEM, -c):
        -- what this session started with, unless a setting of this role or
        -- database (reported above) explains it
        IF EXISTS (
            SELECT FROM pg_catalog.pg_settings
             WHERE name OPERATOR(pg_catalog.=) 'session_replication_role'
               AND pg_catalog.lower(reset_val) OPERATOR(pg_catalog.=) 'replica')
           AND NOT EXISTS (
            SELECT FROM pg_catalog.pg_db_role_setting s
             WHERE s.setrole OPERATOR(pg_catalog.=) ANY (ARRAY[0, (SELECT oid FROM pg_catalog.pg_roles
                                                                  WHERE rolname OPERATOR(pg_catalog.=) session_user)])
               AND s.setdatabase OPERATOR(pg_catalog.=) ANY (ARRAY[0, (SELECT oid FROM pg_catalog.pg_database
                                                                      WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())])
               AND EXISTS (SELECT FROM pg_catalog.unnest(s.setconfig) c
                            WHERE pg_catalog.lower(c) OPERATOR(pg_catalog.=) 'session_replication_role=replica')) THEN
            RETURN QUERY SELECT 'error', 'replication_role_default',
                'Sessions start with session_replication_role = replica (as this session did, which no role or database setting explains: the server''s configuration, or the connection''s options): their writes skip the triggers of protected tables.',
                'ALTER SYSTEM RESET session_replication_role; SELECT pg_catalog.pg_reload_conf(); (and remove it from postgresql.conf or the command line)';
        END IF;
        -- (1.9) a function's own setting: whoever may execute it writes
        -- with replica for the call, its callers' statements included
        FOR r IN
            SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text AS fn,
                   CASE p.prokind WHEN 'p' THEN 'Procedure' ELSE 'Function' END AS kind
              FROM pg_catalog.pg_proc p
             WHERE EXISTS (SELECT FROM pg_catalog.unnest(p.proconfig) c
                            WHERE pg_catalog.lower(c) OPERATOR(pg_catalog.=) 'session_replication_role=replica')
             ORDER BY 1
        LOOP
            RETURN QUERY SELECT 'error', 'replication_role_function',
                pg_catalog.format('%s %s runs with session_replication_role = replica (its SET clause): the writes made during a call skip the triggers of protected tables, for every role that may execute it.', r.kind, r.fn),
                pg_catalog.format('ALTER ROUTINE %s RESET session_replication_role;', r.fn);
        END LOOP;
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
                       ('lockfence_check_trigger_owners', 'A'),
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

    -- (1.8) The triggers that make connected sessions see a write to
    -- lockfence.floor_state made without the floor functions.  A data-only
    -- restore with --disable-triggers ends with ENABLE TRIGGER ALL, which
    -- leaves them enabled, but not ALWAYS.
    FOR r IN
        SELECT t.tgname, t.tgenabled
          FROM pg_catalog.pg_trigger t
         WHERE t.tgrelid OPERATOR(pg_catalog.=) 'lockfence.floor_state'::pg_catalog.regclass
           AND t.tgfoid OPERATOR(pg_catalog.=) 'lockfence.floor_state_changed()'::pg_catalog.regprocedure
           AND t.tgenabled OPERATOR(pg_catalog.<>) 'A'
         ORDER BY t.tgname
    LOOP
        RETURN QUERY SELECT 'warning', 'floor_trigger_not_always',
            pg_catalog.format('Trigger %I on lockfence.floor_state is %s: a write to the table made without the floor functions (by hand, a restore, logical replication) is not seen by sessions already connected, which keep judging fences by the floor and server identity they read before.',
                              r.tgname, CASE r.tgenabled WHEN 'D' THEN 'disabled' WHEN 'R' THEN 'enabled for replica sessions only' ELSE 'not enabled ALWAYS' END),
            pg_catalog.format('ALTER TABLE lockfence.floor_state ENABLE ALWAYS TRIGGER %I;', r.tgname);
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

-- A lockfence trigger finds its columns by name: check_alter_table()
-- refuses renaming, dropping or adding a column under the name of one a
-- trigger names (with its helpers trigger_columns(), column_family() and
-- check_trigger_columns()); the library reports ADD COLUMN to it, and the
-- sql_drop event trigger refuses dropping such a column (check_dropped_columns()).
-- (1.10) The columns the lockfence triggers of table rel name, as each
-- trigger's arguments give them (resource_column, token_column,
-- holder_column).
CREATE FUNCTION lockfence.trigger_columns(rel oid)
RETURNS TABLE (trigger_name name, argument text, column_name text)
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
SELECT t.tgname,
       pg_catalog.left(a, pg_catalog.strpos(a, '=') OPERATOR(pg_catalog.-) 1),
       pg_catalog.substr(a, pg_catalog.strpos(a, '=') OPERATOR(pg_catalog.+) 1)
  FROM pg_catalog.pg_trigger AS t,
       pg_catalog.unnest(lockfence.trigger_arguments(t.tgargs)) AS a
 WHERE t.tgrelid OPERATOR(pg_catalog.=) rel
   AND t.tgfoid OPERATOR(pg_catalog.=) 'lockfence.fence_trigger()'::pg_catalog.regprocedure
   AND pg_catalog.left(a, pg_catalog.strpos(a, '=') OPERATOR(pg_catalog.-) 1)
       IN ('resource_column', 'token_column', 'holder_column')
$$;

COMMENT ON FUNCTION lockfence.trigger_columns(oid) IS
    'The columns the lockfence triggers of a table name';

-- (1.10) The tables whose columns an ALTER of rel's columns changes too:
-- rel, its inheritance descendants, and, for a composite type, its typed
-- tables and theirs.
CREATE FUNCTION lockfence.column_family(rel oid)
RETURNS SETOF oid
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
-- its estimate grows with pg_class and would start JIT compilation, which
-- costs more than the query (every ADD, DROP or RENAME COLUMN runs it)
SET jit = off
AS $$
WITH RECURSIVE family(rel) AS (
    SELECT rel
    UNION
    SELECT tt.oid
      FROM pg_catalog.pg_class AS ct
      JOIN pg_catalog.pg_class AS tt ON tt.reloftype OPERATOR(pg_catalog.=) ct.reltype
     WHERE ct.oid OPERATOR(pg_catalog.=) column_family.rel
       AND ct.relkind OPERATOR(pg_catalog.=) 'c'
    UNION
    SELECT i.inhrelid
      FROM pg_catalog.pg_inherits AS i, family
     WHERE i.inhparent OPERATOR(pg_catalog.=) family.rel
)
SELECT family.rel FROM family ORDER BY family.rel
$$;

COMMENT ON FUNCTION lockfence.column_family(oid) IS
    'The tables whose columns an ALTER of a table''s (or a type''s) columns changes too';

-- (1.10) A lockfence trigger finds its columns by name: a column renamed,
-- or added, under the name of one it names (once that one was renamed or
-- dropped) would become the rows' resource, token or holder, and move
-- every row to other resources, unfenced.  So no column may be given one
-- of their names (named: the column the command added or renamed), and
-- after a rename (renamed) the columns a trigger of table rel names must
-- still be there.  (Drops: check_dropped_columns().)
CREATE FUNCTION lockfence.check_trigger_columns(rel oid, named text,
                                                renamed boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT * FROM lockfence.trigger_columns(rel) ORDER BY 1, 2
    LOOP
        IF c.column_name OPERATOR(pg_catalog.=) named THEN
            RAISE EXCEPTION 'cannot give the name "%" to another column of protected table "%"',
                            named, rel::regclass
                USING ERRCODE = 'feature_not_supported',
                      DETAIL = pg_catalog.format('lockfence trigger %I finds its %s by that name: the column would take the place of the one it named, and move the rows to other resources or tokens without a fence.',
                                                 c.trigger_name, c.argument),
                      HINT = 'Give the column another name; to change a column that lockfence names, remove the protection with lockfence.unprotect(), change the column, and protect the table again.';
        END IF;
        IF renamed AND NOT EXISTS (SELECT FROM pg_catalog.pg_attribute AS att
                        WHERE att.attrelid OPERATOR(pg_catalog.=) rel
                          AND att.attname OPERATOR(pg_catalog.=) c.column_name
                          AND att.attnum OPERATOR(pg_catalog.>) 0
                          AND NOT att.attisdropped) THEN
            RAISE EXCEPTION 'cannot rename column "%" of protected table "%"',
                            c.column_name, rel::regclass
                USING ERRCODE = 'feature_not_supported',
                      DETAIL = pg_catalog.format('lockfence trigger %I names it (%s) and finds it by name: another column given the name would take its place without a fence.',
                                                 c.trigger_name, c.argument),
                      HINT = 'Remove the protection with lockfence.unprotect(), change the column, and protect the table again naming the new column.';
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.check_trigger_columns(oid, text, boolean) IS
    'Refuse a change of the columns a lockfence trigger names';

CREATE OR REPLACE FUNCTION lockfence.check_alter_table()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    a record;
    r record;
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
            -- (1.10) a column added: not under a name a trigger names
            -- (a dropped one: check_dropped_columns())
            IF a.action IN ('add column', 'add column with default') THEN
                PERFORM lockfence.check_trigger_columns(f,
                    (SELECT att.attname::text FROM pg_catalog.pg_attribute AS att
                      WHERE att.attrelid OPERATOR(pg_catalog.=) a.relid
                        AND att.attnum OPERATOR(pg_catalog.=) a.attnum),
                    false)
                   FROM lockfence.column_family(a.relid) AS f;
            END IF;
            -- a default, an identity or a new type: is the trigger still valid?
            PERFORM lockfence.check_trigger(t.oid)
               FROM pg_catalog.pg_trigger AS t
              WHERE t.tgrelid = a.relid
                AND t.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
                AND a.action OPERATOR(pg_catalog.<>) 'add column';
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

    -- (1.10) A column renamed (ALTER TABLE ... RENAME COLUMN, ALTER TYPE
    -- ... RENAME ATTRIBUTE ... CASCADE, the only commands reported with a
    -- column; ALTER VIEW and ALTER MATERIALIZED VIEW rename a table's
    -- column too): the tables whose column it renamed (column_family) must
    -- keep the columns their lockfence triggers name.
    FOR r IN
        SELECT DISTINCT c.objid, att.attname::text AS named
          FROM pg_catalog.pg_event_trigger_ddl_commands() AS c
          JOIN pg_catalog.pg_attribute AS att
            ON att.attrelid OPERATOR(pg_catalog.=) c.objid
           AND att.attnum OPERATOR(pg_catalog.=) c.objsubid
         WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
           AND c.objsubid OPERATOR(pg_catalog.>) 0
           AND c.command_tag IN ('ALTER TABLE', 'ALTER FOREIGN TABLE', 'ALTER TYPE',
                                 'ALTER VIEW', 'ALTER MATERIALIZED VIEW')
    LOOP
        PERFORM lockfence.check_trigger_columns(f, r.named, true)
           FROM lockfence.column_family(r.objid) AS f;
    END LOOP;
END
$$;

-- ALTER VIEW and ALTER MATERIALIZED VIEW ... RENAME COLUMN rename a
-- table's column too: the event trigger that runs check_alter_table() sees
-- those commands as well.
DROP EVENT TRIGGER lockfence_check_new_triggers;
CREATE EVENT TRIGGER lockfence_check_new_triggers ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER', 'CREATE TABLE', 'CREATE TABLE AS',
                 'CREATE FOREIGN TABLE', 'ALTER TABLE', 'ALTER FOREIGN TABLE',
                 'CREATE SCHEMA', 'ALTER TYPE', 'ALTER VIEW',
                 'ALTER MATERIALIZED VIEW')
    EXECUTE FUNCTION lockfence.check_new_triggers();

-- grant_usage(), revoke_usage(): a null etcd argument is refused (22004),
-- not taken for false.
CREATE OR REPLACE FUNCTION lockfence.grant_usage(role regrole, etcd boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f regprocedure;
BEGIN
    IF grant_usage.role IS NULL THEN
        RAISE EXCEPTION 'argument "role" of lockfence.grant_usage() must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF grant_usage.etcd IS NULL THEN
        RAISE EXCEPTION 'argument "etcd" of lockfence.grant_usage() must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOR f IN SELECT * FROM lockfence.usage_functions(grant_usage.etcd) LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, grant_usage.role);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION lockfence.revoke_usage(role regrole, etcd boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f regprocedure;
BEGIN
    IF revoke_usage.role IS NULL THEN
        RAISE EXCEPTION 'argument "role" of lockfence.revoke_usage() must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF revoke_usage.etcd IS NULL THEN
        RAISE EXCEPTION 'argument "etcd" of lockfence.revoke_usage() must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOR f IN SELECT * FROM lockfence.usage_functions(revoke_usage.etcd) LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM %s', f, revoke_usage.role);
    END LOOP;
END
$$;

-- unprotect(): refused on a partition or child of a protected table, whose
-- lockfence triggers are copies of its parent's (0A000).
CREATE OR REPLACE FUNCTION lockfence.unprotect(tbl regclass)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    n integer := 0;
    parent regclass;
BEGIN
    -- (1.10) A partition or child of a protected table keeps that
    -- protection: dropping its copies of the parent's triggers (the
    -- TRUNCATE trigger lockfence made) would let TRUNCATE of it through.
    WITH RECURSIVE up(relid) AS (
        SELECT i.inhparent FROM pg_catalog.pg_inherits i
         WHERE i.inhrelid OPERATOR(pg_catalog.=) tbl
        UNION
        SELECT i.inhparent FROM pg_catalog.pg_inherits i, up
         WHERE i.inhrelid OPERATOR(pg_catalog.=) up.relid
    )
    SELECT up.relid INTO parent
      FROM up
     WHERE EXISTS (SELECT FROM pg_catalog.pg_trigger tg
                    WHERE tg.tgrelid OPERATOR(pg_catalog.=) up.relid
                      AND tg.tgfoid OPERATOR(pg_catalog.=) 'lockfence.fence_trigger()'::pg_catalog.regprocedure
                      AND tg.tgparentid OPERATOR(pg_catalog.=) 0)
     ORDER BY up.relid
     LIMIT 1;
    IF parent IS NOT NULL THEN
        RAISE EXCEPTION 'cannot unprotect table "%": it is protected through "%"', tbl, parent
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'Its lockfence triggers are copies of those of a protected table it is a partition or child of; dropping them would let writes or TRUNCATE of it through unfenced.',
                  HINT = 'Unprotect that table, or detach the partition (or NO INHERIT) first.';
    END IF;
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

-- check_rows_fenced(): resources told apart byte for byte (COLLATE "C"), not
-- under the column's collation, which may be case-insensitive.
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
            -- byte for byte, as fences are: DISTINCT under the column's
            -- collation (a case-insensitive one) would check one spelling
            -- of a resource for all (1.10)
            EXECUTE format('SELECT s.r FROM (SELECT DISTINCT (%L || %I::text) COLLATE pg_catalog."C" AS r FROM %s) AS s'
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

-- A column a lockfence trigger names is not dropped (also with something
-- it depends on, ... CASCADE): the sql_drop event trigger refuses it.
-- (1.10) A column a lockfence trigger names, dropped by ALTER TABLE ...
-- DROP COLUMN or with something it depends on (DROP COLLATION, TYPE or
-- DOMAIN ... CASCADE), while its table stays: refused, as renaming it is
-- (check_alter_table()).  Its rows' resources or tokens would be lost, and
-- another column could be given its name.
CREATE FUNCTION lockfence.check_dropped_columns()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT o.objid, o.address_names[3] AS col, t.trigger_name, t.argument
          FROM pg_catalog.pg_event_trigger_dropped_objects() AS o,
               LATERAL lockfence.trigger_columns(o.objid) AS t
         WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
           AND o.objsubid OPERATOR(pg_catalog.>) 0
           AND t.column_name OPERATOR(pg_catalog.=) o.address_names[3]
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_event_trigger_dropped_objects() AS w
                            WHERE w.classid OPERATOR(pg_catalog.=) o.classid
                              AND w.objid OPERATOR(pg_catalog.=) o.objid
                              AND w.objsubid OPERATOR(pg_catalog.=) 0)
         ORDER BY 1, 2
         LIMIT 1
    LOOP
        RAISE EXCEPTION 'cannot drop column "%" of protected table "%"',
                        c.col, c.objid::pg_catalog.regclass
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = pg_catalog.format('lockfence trigger %I names it (%s) and finds it by name: the rows would lose their resources or tokens, and another column given the name would take its place without a fence.',
                                             c.trigger_name, c.argument),
                  HINT = 'Remove the protection with lockfence.unprotect() first, or drop the table.';
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.check_dropped_columns() IS
    'Refuse dropping a column a lockfence trigger names';

CREATE OR REPLACE FUNCTION lockfence.forget_dropped_tables()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    gone text[];
BEGIN
    PERFORM lockfence.check_dropped_columns();
    gone := ARRAY(SELECT o.object_identity
                    FROM pg_catalog.pg_event_trigger_dropped_objects() AS o
                   WHERE o.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                     AND o.objsubid = 0
                     AND o.object_identity IN (SELECT p.tbl FROM lockfence.protected_tables AS p));
    IF pg_catalog.cardinality(gone) > 0 THEN
        PERFORM lockfence.sync_protected_tables(forget => gone);
    END IF;
END
$$;

-- raise_floor(floor, resources) records an empty database copy's
-- floor_state row as its own before it writes fence rows (floor_adopt()).
-- (1.10) In an empty copy of a database (its floor_state row names another
-- database, and it has no fence row), record the row as this database's:
-- raise_floor(floor, resources) calls it before writing fence rows, as a
-- fenced write does through the library's guard.
CREATE FUNCTION lockfence.floor_adopt()
RETURNS void
AS 'MODULE_PATHNAME', 'lockfence_floor_adopt'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.floor_adopt() IS
    'Record an empty database copy''s floor_state row as its own (raise_floor() calls it)';


REVOKE ALL ON FUNCTION lockfence.floor_adopt() FROM PUBLIC;

CREATE OR REPLACE FUNCTION lockfence.raise_floor(floor bigint, resources text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raised bigint;
    bad text;
    effective bigint;
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
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION 'cannot raise the fence floor under %', pg_catalog.upper(pg_catalog.current_setting('transaction_isolation'))
            USING ERRCODE = 'invalid_transaction_state',
                  DETAIL = 'The transaction''s snapshot would miss fences committed after it, and leave them below the floor.',
                  HINT = 'Run it in a READ COMMITTED transaction (SET default_transaction_isolation = ''read committed'').';
    END IF;

    PERFORM lockfence.floor_record(raise_floor.floor) WHERE raise_floor.resources IS NULL;
    IF raise_floor.resources IS NULL THEN
        -- Any holder may present the floor, and no lease survives it; rows
        -- are raised after every transaction that fenced them (lock_resource).
        PERFORM lockfence.lock_resource(f.resource) FROM lockfence.fences f WHERE f.token OPERATOR(pg_catalog.<) raise_floor.floor ORDER BY f.resource;
        UPDATE lockfence.fences f
           SET token = raise_floor.floor,
               accepted_at = pg_catalog.statement_timestamp(),
               holder = NULL, lease_expires_at = NULL, lease_ttl = NULL
         WHERE f.token OPERATOR(pg_catalog.<) raise_floor.floor;
        GET DIAGNOSTICS raised = ROW_COUNT;
        -- What this transaction fenced before may be below the floor now.
        PERFORM lockfence.forget_fenced(NULL);
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

    -- (1.10) an empty copy's fence rows are its own
    PERFORM lockfence.floor_adopt();
    PERFORM lockfence.lock_resource(r)
       FROM (SELECT DISTINCT r FROM pg_catalog.unnest(raise_floor.resources) AS r) AS d
      ORDER BY r;
    -- A name's row below the global floor would let its tokens under the
    -- floor through: the floor a list gives is the global one at least.
    SELECT GREATEST(raise_floor.floor, pg_catalog.max(s.floor)) INTO effective
      FROM lockfence.floor_state s;
    INSERT INTO lockfence.fences AS f (resource, token, accepted_at, holder)
    SELECT DISTINCT r, effective, pg_catalog.statement_timestamp(),
           NULL::text
      FROM pg_catalog.unnest(raise_floor.resources) AS r
        ON CONFLICT (resource) DO UPDATE
       SET token = excluded.token, accepted_at = excluded.accepted_at,
           holder = NULL, lease_expires_at = NULL, lease_ttl = NULL
     WHERE f.token OPERATOR(pg_catalog.<) excluded.token;
    GET DIAGNOSTICS raised = ROW_COUNT;
    PERFORM lockfence.forget_fenced(raise_floor.resources);
    RETURN raised;
END
$$;
