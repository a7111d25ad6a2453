/* lockfence: update from 1.13 to 1.14 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.14'" to load this file. \quit

-- (1.14) A backend still running an older library (preloaded, the server
-- not restarted after the new release was installed) would serve this SQL
-- with code that does not know it: refuse before changing anything.
DO $$
BEGIN
    IF pg_catalog.string_to_array(lockfence.library_version(), '.')::int[]
       OPERATOR(pg_catalog.<) '{1,14}'::int[] THEN
        RAISE EXCEPTION 'the loaded lockfence library serves SQL up to version % only',
                        lockfence.library_version()
            USING ERRCODE = '55000',
                  HINT = 'Restart the server after installing the new release, then run this again.';
    END IF;
END
$$;

-- (1.14) check() reports roles that may act as pg_maintain on lockfence's
-- tables (PostgreSQL 17 and later): maintain_granted; not_preloaded is an
-- error on a Citus node (the shard TRUNCATE guard is a hook).
CREATE OR REPLACE FUNCTION lockfence.check()
RETURNS TABLE (severity text, finding text, detail text, hint text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- (1.11) A lock held on a protected table (by its owner, by any role on
-- a temporary table of its own) made check() wait for as long: it waits
-- a second, and says what it could not check.
SET lock_timeout = '1s'
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
    locked oid[] := '{}';
    not_checked boolean;
    fences_distributed boolean;
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
        -- (1.14) On a Citus node it is an error: the guard that refuses
        -- TRUNCATE of a protected table's shard is a hook, installed when
        -- the library loads, and a session that has not loaded it (one
        -- that only truncates) has none.
        IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
            RETURN QUERY SELECT 'error', 'not_preloaded',
                'lockfence is not in shared_preload_libraries of this Citus node: a session that has not loaded lockfence may TRUNCATE a protected table''s shard here without a token (the guard is a hook the library installs when it loads), and the metrics (lockfence.metrics, lockfence.rejections, lockfence.histograms) are not collected.',
                'Add lockfence to shared_preload_libraries, after citus, and restart the server.';
        ELSE
            RETURN QUERY SELECT 'warning', 'not_preloaded',
                'lockfence is not in shared_preload_libraries: the metrics (lockfence.metrics, lockfence.rejections, lockfence.histograms) are not collected.',
                'Add lockfence to shared_preload_libraries and restart the server.';
        END IF;
    END;

    -- (1.11) A library older than this SQL (an older release installed
    -- again, or still loaded: preloaded, the server not restarted): the
    -- SQL's functions may call what it lacks, or read its results wrongly.
    BEGIN
        IF pg_catalog.string_to_array(lockfence.library_version(), '.')::int[]
           OPERATOR(pg_catalog.<)
           pg_catalog.string_to_array((SELECT x.extversion FROM pg_catalog.pg_extension x
                                        WHERE x.extname OPERATOR(pg_catalog.=) 'lockfence'), '.')::int[] THEN
            RETURN QUERY SELECT 'error', 'library_older_than_sql',
                pg_catalog.format('The loaded lockfence library serves SQL up to version %s, older than this database''s %s.',
                                  lockfence.library_version(),
                                  (SELECT x.extversion FROM pg_catalog.pg_extension x
                                    WHERE x.extname OPERATOR(pg_catalog.=) 'lockfence')),
                'Install the release matching the SQL version (make install) and restart the server.';
        END IF;
    EXCEPTION WHEN undefined_function THEN
        RETURN QUERY SELECT 'error', 'library_older_than_sql',
            pg_catalog.format('The loaded lockfence library is older than this database''s SQL: %s.', SQLERRM),
            'Install the release matching the SQL version (make install) and restart the server.';
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

    -- (1.14) pg_maintain (PostgreSQL 17 and later), and MAINTAIN granted
    -- on a table of lockfence, may LOCK lockfence's tables: a lock on
    -- lockfence.fences in a transaction left open holds every fence() off
    -- for as long.  No fence changes, so a warning.
    IF pg_catalog.to_regrole('pg_maintain') IS NOT NULL THEN
        SELECT pg_catalog.string_agg(pg_catalog.quote_ident(m.rolname), ', ' ORDER BY m.rolname) INTO roles
          FROM pg_catalog.pg_roles m
         WHERE NOT m.rolsuper
           AND m.rolname OPERATOR(pg_catalog.!~) '^pg_'
           AND (pg_catalog.pg_has_role(m.oid, 'pg_maintain', 'MEMBER')
                OR EXISTS (SELECT FROM pg_catalog.pg_class c
                            WHERE c.relnamespace OPERATOR(pg_catalog.=) 'lockfence'::pg_catalog.regnamespace
                              AND c.relkind OPERATOR(pg_catalog.=) 'r'
                              AND NOT pg_catalog.pg_has_role(m.oid, c.relowner, 'USAGE')
                              AND pg_catalog.has_table_privilege(m.oid, c.oid, 'MAINTAIN')));
        IF roles IS NOT NULL THEN
            RETURN QUERY SELECT 'warning', 'maintain_granted',
                pg_catalog.format('%s may act as pg_maintain on lockfence''s tables: LOCK TABLE lockfence.fences in a transaction left open holds every fence() and every fenced write off until it ends (no fence changes).', roles),
                (SELECT pg_catalog.concat_ws(' ',
                     (SELECT pg_catalog.format('REVOKE pg_maintain FROM %s;',
                                               pg_catalog.string_agg(pg_catalog.quote_ident(g.rolname), ', ' ORDER BY g.rolname))
                        FROM pg_catalog.pg_auth_members a
                        JOIN pg_catalog.pg_roles g ON g.oid OPERATOR(pg_catalog.=) a.member
                       WHERE a.roleid OPERATOR(pg_catalog.=) 'pg_maintain'::pg_catalog.regrole
                         AND NOT g.rolsuper
                      HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0),
                     (SELECT pg_catalog.string_agg(pg_catalog.format('REVOKE MAINTAIN ON %s FROM %s;',
                                                                     x.oid::pg_catalog.regclass,
                                                                     CASE WHEN x.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                                                          ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(x.grantee)) END),
                                                   ' ' ORDER BY x.oid, x.grantee)
                        FROM (SELECT DISTINCT c.oid, e.grantee
                                FROM pg_catalog.pg_class c,
                                     LATERAL pg_catalog.aclexplode(c.relacl) e
                               WHERE c.relnamespace OPERATOR(pg_catalog.=) 'lockfence'::pg_catalog.regnamespace
                                 AND c.relkind OPERATOR(pg_catalog.=) 'r'
                                 AND e.privilege_type OPERATOR(pg_catalog.=) 'MAINTAIN'
                                 AND e.grantee OPERATOR(pg_catalog.<>) c.relowner) x)));
        END IF;
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
            -- a table found locked for its other trigger is not tried again
            not_checked := r.rel::pg_catalog.oid OPERATOR(pg_catalog.=) ANY (locked);
            IF NOT not_checked THEN
                BEGIN
                    PERFORM lockfence.check_trigger(r.oid);
                EXCEPTION WHEN lock_not_available THEN
                    locked := locked OPERATOR(pg_catalog.||) r.rel::pg_catalog.oid;
                    not_checked := true;
                WHEN OTHERS THEN
                    RETURN QUERY SELECT 'error', 'trigger_invalid',
                        pg_catalog.format('Trigger %I on %s: %s', r.tgname, r.rel, SQLERRM),
                        pg_catalog.format('DROP TRIGGER %I ON %s; then SELECT lockfence.protect(...) again.', r.tgname, r.rel);
                END;
            END IF;
            IF not_checked THEN
                RETURN QUERY SELECT 'warning', 'trigger_not_checked',
                    pg_catalog.format('Trigger %I on %s was not checked: another transaction holds a lock on the table that kept check() from reading it for a second.', r.tgname, r.rel),
                    pg_catalog.format('Run lockfence.check() again once the lock is released (SELECT pid FROM pg_locks WHERE relation = %L::regclass AND granted).', r.rel::text);
            END IF;
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

    -- (1.11) The other side: a subscription that replicates a table into
    -- lockfence.fences or lockfence.floor_state here (from a publisher
    -- without the guard, or one that allowed it): its apply writes them as
    -- the publisher has them, moving this database's fences back.
    FOR r IN
        SELECT DISTINCT s.subname, c.relname
          FROM pg_catalog.pg_subscription_rel AS sr
          JOIN pg_catalog.pg_subscription AS s ON s.oid OPERATOR(pg_catalog.=) sr.srsubid
          JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) sr.srrelid
         WHERE c.oid IN ('lockfence.fences'::pg_catalog.regclass,
                         'lockfence.floor_state'::pg_catalog.regclass)
         ORDER BY 1, 2
    LOOP
        RETURN QUERY SELECT 'error', 'fences_subscribed',
            pg_catalog.format('Subscription %I replicates into lockfence.%I: its apply writes the publisher''s rows there, which can move this database''s fences back (a token superseded here accepted again).', r.subname, r.relname),
            pg_catalog.format('Remove lockfence''s tables from what subscription %I receives (its publications), or drop it; then raise the floor above every token issued (lockfence.raise_floor).', r.subname);
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
                'etcd is in use here (lockfence.etcd_endpoints is set, or an etcd lock function was granted), but this role may not call lockfence.etcd_status(), so etcd was not probed.',
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
            -- (1.13) run_command_on_workers() passes over a disabled node,
            -- which citus_activate_node() brings back as it was
            RETURN QUERY EXECUTE $q$
                SELECT 'warning', 'citus_node_inactive',
                       pg_catalog.format('Citus node %s:%s is disabled: lockfence.check() did not check it.', n.nodename, n.nodeport),
                       'Activate it (citus_activate_node) and run lockfence.check() again (raise the floor if it reports the node below the others), or remove it (citus_remove_node). With the fences distributed, raise_floor() fails while a disabled node with lockfence does not answer.'
                  FROM pg_catalog.pg_dist_node AS n
                 WHERE NOT n.isactive AND n.noderole OPERATOR(pg_catalog.=) 'primary'
                 ORDER BY n.nodename, n.nodeport$q$;

            -- (1.12) A fence row moves with its shard, a node's floor does
            -- not: a node below another's floor gives a resource without a
            -- row that is moved there a lower floor (a node added later
            -- starts at 0).
            EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition'
                    ' WHERE logicalrelid = ''lockfence.fences''::pg_catalog.regclass)'
               INTO fences_distributed;
            IF fences_distributed THEN
                RETURN QUERY EXECUTE $q$
                    WITH f AS (
                        SELECT w.nodename, w.nodeport, w.result::bigint AS floor
                          FROM pg_catalog.run_command_on_workers(
                                 'SELECT pg_catalog.max(floor) FROM lockfence.floor_state') AS w
                         WHERE w.success AND w.result ~ '^[0-9]+$'
                        UNION ALL
                        -- the coordinator only when it holds fence shards
                        SELECT 'the coordinator', NULL, pg_catalog.max(s.floor)
                          FROM lockfence.floor_state s
                         WHERE EXISTS (SELECT FROM pg_catalog.pg_dist_shard d
                                         JOIN pg_catalog.pg_dist_placement pl USING (shardid)
                                        WHERE d.logicalrelid OPERATOR(pg_catalog.=) 'lockfence.fences'::pg_catalog.regclass
                                          AND pl.groupid OPERATOR(pg_catalog.=) 0))
                    SELECT 'error', 'citus_floor_uneven',
                           pg_catalog.format('%s has fence floor %s, below the %s of another node: a resource without a fence row whose shard moves there loses the floor.',
                                             coalesce('Citus node ' || f.nodename || ':' || f.nodeport, f.nodename), f.floor, m.top),
                           pg_catalog.format('SELECT lockfence.raise_floor(%s); raises every node''s floor (1.12).', m.top)
                      FROM f, (SELECT pg_catalog.max(g.floor) AS top FROM f g) AS m
                     WHERE f.floor OPERATOR(pg_catalog.<) m.top
                     ORDER BY f.nodename, f.nodeport$q$;
            END IF;
        END IF;
    END IF;
END
$$;

-- (1.14) Object comments that said less than the functions do (a review):
-- fence() raises LF003 and LF004 too; the drop guard lets DROP TRIGGER
-- through; lease_release() is false for a lease released already.
COMMENT ON FUNCTION lockfence.fence(text, bigint, text) IS
    'Accept token for resource in this transaction, or raise LF001 (a lower token, or the same one under another holder), LF003 (its lease lost) or LF004 (the floor not raised)';
COMMENT ON FUNCTION lockfence.fence(text[], bigint, text) IS
    'Accept token for every resource in this transaction, in byte order, all or nothing, or raise the first rejected one''s error (LF001, LF003, LF004), naming it';
COMMENT ON FUNCTION lockfence.guard_drop() IS
    'Refuse to drop lockfence, or what a lockfence trigger depends on, while tables are protected by it';
COMMENT ON FUNCTION lockfence.lease_release(text, bigint) IS
    'End a lease at once; false when it had expired, was taken over or was released already';
