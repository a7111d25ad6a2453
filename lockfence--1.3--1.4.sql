/* lockfence: update from 1.3 to 1.4 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.4'" to load this file. \quit

-- Drop guard (issue 17, item 9)
--
-- The guard also refuses drops that reach lockfence through dependencies
-- (DROP SCHEMA of its schema renamed, DROP EXTENSION plpgsql CASCADE, DROP
-- FUNCTION of a member, ...), ALTER EXTENSION lockfence DROP while tables
-- are protected, and renaming its schema: it fires on more commands.

COMMENT ON FUNCTION lockfence.guard_drop() IS
    'Refuse to drop lockfence, or a lockfence trigger, while tables are protected by it';

DROP EVENT TRIGGER lockfence_guard_drop;

CREATE EVENT TRIGGER lockfence_guard_drop ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED',
                 'DROP LANGUAGE', 'DROP FUNCTION', 'DROP PROCEDURE',
                 'DROP ROUTINE', 'DROP AGGREGATE', 'DROP TYPE', 'DROP DOMAIN',
                 'DROP TABLE', 'DROP VIEW', 'DROP MATERIALIZED VIEW',
                 'DROP SEQUENCE', 'DROP FOREIGN TABLE',
                 'ALTER EXTENSION', 'ALTER SCHEMA')
    EXECUTE FUNCTION lockfence.guard_drop();

ALTER EVENT TRIGGER lockfence_guard_drop ENABLE ALWAYS;

-- check() finds more (issue 17, items 10 and 11)
--
-- check_new_triggers(): with check_function_bodies off, as in a restore, a
-- broken lockfence trigger is created with a WARNING instead of refused,
-- so that the table keeps refusing writes as it did in the source.
-- check(): a row trigger dropped while the TRUNCATE trigger stays (and the
-- reverse), fence_trigger() or another C function replaced, and the
-- extension's event triggers missing or not enabled as created.

CREATE OR REPLACE FUNCTION lockfence.check_new_triggers()
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
        IF pg_catalog.current_setting('check_function_bodies')::boolean THEN
            PERFORM lockfence.check_trigger(tg);
        ELSE
            -- A restore (pg_dump and pg_restore set check_function_bodies =
            -- off) recreates the trigger as it was, even a broken one: it
            -- refuses every write, as it did in the source, where the table
            -- without it would accept any.  lockfence.check() reports it.
            -- Not a trigger of the wrong shape (a WHEN condition, a column
            -- list, not BEFORE, an event missing, a statement trigger other
            -- than TRUNCATE): it would not fire for some writes, and no
            -- source could have had it (it was refused there).
            IF NOT EXISTS (
                SELECT FROM pg_catalog.pg_trigger t
                 WHERE t.oid OPERATOR(pg_catalog.=) tg AND t.tgqual IS NULL
                   AND ((t.tgtype OPERATOR(pg_catalog.=) 31  -- ROW BEFORE INSERT UPDATE DELETE
                         AND pg_catalog.cardinality(t.tgattr::pg_catalog.int2[]) OPERATOR(pg_catalog.=) 0)
                        OR t.tgtype OPERATOR(pg_catalog.=) 34)) THEN  -- STATEMENT BEFORE TRUNCATE
                PERFORM lockfence.check_trigger(tg);
            END IF;
            BEGIN
                PERFORM lockfence.check_trigger(tg);
            EXCEPTION WHEN OTHERS THEN
                RAISE WARNING '%', SQLERRM
                    USING DETAIL = 'The trigger was created anyway (check_function_bodies is off, as in a restore): every write to the table fails until it is fixed.',
                          HINT = 'Run SELECT * FROM lockfence.check(); and fix the trigger as its finding says.';
            END;
        END IF;
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

    PERFORM lockfence.check_alter_table();
END
$$;

-- lockfence.check() finds more in 1.4: it is created once, with every
-- finding, at the end of this script (issue 17, item 10).


-- privileges (issue 17, item 12)
--
-- A new installation grants PUBLIC nothing that advances a fence or a
-- lease; this update keeps the grants an installation has, so that running
-- applications do not break: it adds lockfence.grant_usage(role), and says
-- (WARNING: extension scripts run with client_min_messages at least
-- warning) how to tighten.

-- The functions an application role is granted, one regprocedure a row.
CREATE FUNCTION lockfence.usage_functions(etcd boolean DEFAULT false)
RETURNS SETOF regprocedure
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT f::regprocedure
      FROM unnest(ARRAY['lockfence.fence(text, bigint, text)',
                        'lockfence.try_fence(text, bigint, text)',
                        'lockfence.fence(text[], bigint, text)',
                        'lockfence.try_fence(text[], bigint, text)',
                        'lockfence.lease_acquire(text, interval, text, interval)',
                        'lockfence.lease_try_acquire(text, interval, text)',
                        'lockfence.lease_renew(text, bigint, interval)',
                        'lockfence.lease_release(text, bigint)']) AS f
    UNION ALL
    SELECT f::regprocedure
      FROM unnest(ARRAY['lockfence.etcd_lock(text, integer, interval, text)',
                        'lockfence.etcd_try_lock(text, integer, text)',
                        'lockfence.etcd_unlock(text, boolean)',
                        'lockfence.etcd_keepalive(bigint)',
                        'lockfence.etcd_lock_and_fence(text, text, integer, interval, text)',
                        'lockfence.etcd_lock_many(text[], integer, interval, text)',
                        'lockfence.etcd_lock_and_fence(text[], text[], integer, interval, text)']) AS f
     WHERE usage_functions.etcd
$$;

COMMENT ON FUNCTION lockfence.usage_functions(boolean) IS
    'The functions grant_usage() grants: fences and leases (and etcd locks with etcd => true)';

-- GRANT (or REVOKE) EXECUTE on usage_functions(etcd) to (from) a role.
-- Runs with the caller's rights: the caller must be allowed to grant them
-- (the extension's owner, or a role granted them WITH GRANT OPTION).
CREATE FUNCTION lockfence.grant_usage(role regrole, etcd boolean DEFAULT false)
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
    FOR f IN SELECT * FROM lockfence.usage_functions(grant_usage.etcd) LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, grant_usage.role);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.grant_usage(regrole, boolean) IS
    'Let a role fence resources and take leases (and etcd locks with etcd => true)';

CREATE FUNCTION lockfence.revoke_usage(role regrole, etcd boolean DEFAULT true)
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
    FOR f IN SELECT * FROM lockfence.usage_functions(revoke_usage.etcd) LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM %s', f, revoke_usage.role);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.revoke_usage(regrole, boolean) IS
    'Undo grant_usage() (with etcd => false, keep the etcd lock functions)';

REVOKE ALL ON FUNCTION lockfence.grant_usage(regrole, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.revoke_usage(regrole, boolean) FROM PUBLIC;

DO $$
DECLARE
    open_fns text;
BEGIN
    -- Named schema-qualified whatever the script's search_path.
    SELECT pg_catalog.string_agg(n.name, ', ' ORDER BY n.name) INTO open_fns
      FROM lockfence.usage_functions(false) AS f
      JOIN pg_catalog.pg_proc p ON p.oid = f
     CROSS JOIN LATERAL (SELECT pg_catalog.format('lockfence.%I(%s)', p.proname,
                                                  pg_catalog.oidvectortypes(p.proargtypes))) AS n(name)
     WHERE pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE');
    IF open_fns IS NOT NULL THEN
        RAISE WARNING 'PUBLIC may still execute lockfence functions that advance fences and leases: %', open_fns
            USING DETAIL = 'lockfence 1.4 installed fresh grants them to no one; this update keeps the existing grants so that running applications do not break.',
                  HINT = 'Grant them to the application roles with SELECT lockfence.grant_usage(''app_role''); then REVOKE EXECUTE ON FUNCTION ' || open_fns || ' FROM PUBLIC;';
    END IF;
END
$$;
-- issue 17, items 5 and 8: a floor clears the lease columns of the rows it
-- raises, and makes the transaction forget what it fenced

-- Make this transaction forget the tokens it fenced for resources (NULL:
-- all), so that its next checks read the fence rows: for SQL that writes
-- them other than through fence() (raise_floor).
CREATE FUNCTION lockfence.forget_fenced(resources text[] DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'lockfence_forget_fenced'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.forget_fenced(text[]) IS
    'Forget the tokens this transaction fenced (for functions writing fence rows)';

REVOKE ALL ON FUNCTION lockfence.forget_fenced(text[]) FROM PUBLIC;

-- failover guard (issue 23 items 1 to 4): see lockfence--1.4.sql
--
-- Which server wrote this database's fences: its system identifier and
-- WAL timeline, recorded at CREATE EXTENSION and by raise_floor(floor)
-- without resources, etcd_raise_floor() and accept_promotion().  While the
-- server's own identity differs (a promoted standby, a restored backup,
-- dump or pg_upgrade), every fence and lease operation is refused with
-- SQLSTATE LF004 (src/failover_guard.c).  floor is the global fence floor:
-- the fence of every resource without a row.  Dumped with the fences, so
-- that a dump restored elsewhere is refused until the floor is raised.
CREATE TABLE lockfence.floor_state (
    system_identifier bigint NOT NULL,
    timeline          bigint NOT NULL,
    floor             bigint NOT NULL DEFAULT 0 CHECK (floor >= 0),
    recorded_at       timestamptz NOT NULL
);

COMMENT ON TABLE lockfence.floor_state IS
    'Server identity that wrote the fences, and the global fence floor (one row)';

REVOKE ALL ON lockfence.floor_state FROM PUBLIC;
GRANT SELECT ON lockfence.floor_state TO PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('lockfence.floor_state', '');

CREATE FUNCTION lockfence.floor_identity(OUT system_identifier bigint,
                                         OUT timeline bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'lockfence_floor_identity'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION lockfence.floor_identity() IS
    'This server''s system identifier and the WAL timeline it writes';

INSERT INTO lockfence.floor_state
SELECT i.system_identifier, i.timeline, 0, pg_catalog.statement_timestamp()
  FROM lockfence.floor_identity() AS i;

CREATE FUNCTION lockfence.floor_record(floor bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_floor_record'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.floor_record(bigint) IS
    'Record this server''s identity and raise the global floor (raise_floor() calls it)';

CREATE FUNCTION lockfence.accept_promotion()
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_accept_promotion'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.accept_promotion() IS
    'Accept a promotion or restore that lost nothing, without a floor (operators only)';

CREATE FUNCTION lockfence.floor_status(OUT recorded_system_identifier bigint,
                                       OUT recorded_timeline bigint,
                                       OUT recorded_at timestamptz,
                                       OUT floor bigint,
                                       OUT system_identifier bigint,
                                       OUT timeline bigint,
                                       OUT in_recovery boolean,
                                       OUT writes_refused boolean)
RETURNS record
AS 'MODULE_PATHNAME', 'lockfence_floor_status'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.floor_status() IS
    'Recorded and current server identity, global floor, and whether fenced writes are refused (LF004)';

REVOKE ALL ON FUNCTION lockfence.floor_record(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.accept_promotion() FROM PUBLIC;

-- raise_floor(): the lease columns of the rows it raises are cleared and
-- the transaction forgets what it fenced (issue 17, items 5 and 8);
-- without resources it also records this server's identity and the global
-- floor (issue 23).
CREATE OR REPLACE FUNCTION lockfence.raise_floor(floor bigint, resources text[] DEFAULT NULL)
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

    PERFORM lockfence.floor_record(raise_floor.floor) WHERE raise_floor.resources IS NULL;
    IF raise_floor.resources IS NULL THEN
        -- The holder of the floor is unknown: any holder may present it.
        -- No lease survives a floor: its holder lost it with the failover,
        -- and the floor is no lease token.
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

    INSERT INTO lockfence.fences AS f (resource, token, accepted_at, holder)
    SELECT DISTINCT r, raise_floor.floor, pg_catalog.statement_timestamp(),
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

-- issue 17, item 6: the shape of lockfence.fences

-- NULL when lockfence.fences is exactly as the install scripts make it,
-- else what differs.  Fences and leases then go through SQL statements.
CREATE FUNCTION lockfence.fences_table_problem()
RETURNS text
AS 'MODULE_PATHNAME', 'lockfence_fences_table_problem'
LANGUAGE C STABLE PARALLEL SAFE;

COMMENT ON FUNCTION lockfence.fences_table_problem() IS
    'What differs between lockfence.fences and the table as installed, NULL if nothing';

-- issue 17 item 10: lockfence lists the tables it protects
--
-- lockfence.protected_tables, an extension configuration table dumped
-- with the data, so that check() reports a table restored without its
-- triggers (a data-only restore, or one without post-data).  The names
-- are text, so that a dump that leaves a listed table out restores.
-- protect() and an event trigger on CREATE TRIGGER list a table, ALTER
-- TABLE and ALTER SCHEMA follow renames, unprotect() and a sql_drop
-- event trigger remove it; the tables protected before the update are
-- listed from their triggers.

-- The tables lockfence protects (issue 17, item 10): the name of each
-- table with a lockfence row trigger of its own, added when the trigger is
-- created (by protect(), by hand, or by a restore's post-data) and removed
-- by unprotect() and when the table is dropped; a rename or a move to
-- another schema lists the new name.  Dumped with the data, so that after
-- a restore that did not bring the triggers (a data-only restore, or one
-- without post-data) check() reports the table.  The name is text (the
-- schema-qualified, quoted name), not regclass: a dump that leaves a
-- listed table out (pg_dump -T, -N) restores as any other.  Written only
-- through sync_protected_tables(), which records what is true.
CREATE TABLE lockfence.protected_tables (
    tbl          text PRIMARY KEY,
    protected_at timestamptz NOT NULL DEFAULT pg_catalog.statement_timestamp()
);

COMMENT ON TABLE lockfence.protected_tables IS
    'Tables protected by lockfence, remembered across dump and restore (for check())';

REVOKE ALL ON lockfence.protected_tables FROM PUBLIC;
GRANT SELECT ON lockfence.protected_tables TO PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('lockfence.protected_tables', '');

-- The table a listed name names, NULL if none.  Not to_regclass(): that
-- needs USAGE on the schema, and check() runs with the caller's rights.
CREATE FUNCTION lockfence.protected_table_oid(name text)
RETURNS oid
LANGUAGE sql STABLE STRICT PARALLEL SAFE
AS $$
SELECT c.oid
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE n.nspname OPERATOR(pg_catalog.=) (pg_catalog.parse_ident(name))[1]
   AND c.relname OPERATOR(pg_catalog.=) (pg_catalog.parse_ident(name))[2]
$$;

COMMENT ON FUNCTION lockfence.protected_table_oid(text) IS
    'The table a name of lockfence.protected_tables names, NULL if none';

-- Add the name of every table with a lockfence row trigger of its own;
-- remove the names in forget that are gone, or that name a table without
-- one that the caller owns; after a rename (renamed), remove the names
-- that no longer name a table.  Anything else is left as it is.
CREATE FUNCTION lockfence.sync_protected_tables(forget text[] DEFAULT NULL,
                                                renamed boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'lockfence_sync_protected_tables'
LANGUAGE C VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION lockfence.sync_protected_tables(text[], boolean) IS
    'Keep lockfence.protected_tables true to the tables and their triggers';

-- Forget the dropped tables (DROP TABLE, DROP SCHEMA ... CASCADE, DROP
-- OWNED, ...) by name.
CREATE FUNCTION lockfence.forget_dropped_tables()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    gone text[];
BEGIN
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

COMMENT ON FUNCTION lockfence.forget_dropped_tables() IS
    'Forget dropped tables in lockfence.protected_tables';

CREATE EVENT TRIGGER lockfence_forget_dropped_tables ON sql_drop
    EXECUTE FUNCTION lockfence.forget_dropped_tables();

ALTER EVENT TRIGGER lockfence_forget_dropped_tables ENABLE ALWAYS;

-- List the tables given a lockfence row trigger (protect(), by hand, a
-- restore's post-data) and the new names of renamed or moved ones (ALTER
-- TABLE ... RENAME or SET SCHEMA, ALTER SCHEMA ... RENAME).
CREATE FUNCTION lockfence.track_protected_tables()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lockfence.sync_protected_tables(
        renamed => TG_TAG OPERATOR(pg_catalog.<>) 'CREATE TRIGGER');
END
$$;

COMMENT ON FUNCTION lockfence.track_protected_tables() IS
    'List new protected tables and the new names of renamed ones in lockfence.protected_tables';

CREATE EVENT TRIGGER lockfence_track_protected_tables ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER', 'ALTER TABLE', 'ALTER FOREIGN TABLE',
                 'ALTER SCHEMA')
    EXECUTE FUNCTION lockfence.track_protected_tables();

ALTER EVENT TRIGGER lockfence_track_protected_tables ENABLE ALWAYS;

-- protect() lists the table.
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

    -- The event trigger validates the triggers too, unless it is disabled.
    PERFORM lockfence.check_trigger(t.oid)
       FROM pg_catalog.pg_trigger AS t
      WHERE t.tgrelid = tbl
        AND t.tgname IN ('zz_lockfence_fence', 'zz_lockfence_fence_truncate');

    -- The event trigger lists the table too, unless it is disabled.
    PERFORM lockfence.sync_protected_tables();
END
$$;

-- unprotect() removes it.
CREATE OR REPLACE FUNCTION lockfence.unprotect(tbl regclass)
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
    PERFORM lockfence.sync_protected_tables(forget => ARRAY(
        SELECT pg_catalog.format('%I.%I', ns.nspname, cl.relname)
          FROM pg_catalog.pg_class cl
          JOIN pg_catalog.pg_namespace ns ON ns.oid OPERATOR(pg_catalog.=) cl.relnamespace
         WHERE cl.oid OPERATOR(pg_catalog.=) tbl));
    RETURN n;
END
$$;

-- check() with every finding 1.4 adds: a changed fences table, a trigger
-- or event trigger that no longer protects (issue 17, items 6 and 11), a
-- floor not raised after a promotion (issue 23, item 4), a listed table
-- without triggers (protected_table_unguarded) and a listed name that
-- names no table (protected_table_missing) (issue 17, item 10).
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
END
$$;

-- The tables protected now: those with a lockfence row trigger of their
-- own (partitions' cloned row triggers are their parent's).
SELECT lockfence.sync_protected_tables();

/* issue 21 item 1: the resource lock (fence_lock.c) for raise_floor() */

-- Take the resource lock of resource in ExclusiveLock mode until the
-- transaction ends, as fence() does before it advances a fence row: for SQL
-- that writes fence rows other than through fence() (raise_floor), so that
-- the write waits for every transaction that fenced the old token.
CREATE FUNCTION lockfence.lock_resource(resource text)
RETURNS void
AS 'MODULE_PATHNAME', 'lockfence_lock_resource'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.lock_resource(text) IS
    'Wait for the fencers of resource and hold off new ones until commit (for functions writing fence rows)';

REVOKE ALL ON FUNCTION lockfence.lock_resource(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION lockfence.raise_floor(floor bigint, resources text[] DEFAULT NULL)
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

    PERFORM lockfence.lock_resource(r)
       FROM (SELECT DISTINCT r FROM pg_catalog.unnest(raise_floor.resources) AS r) AS d
      ORDER BY r;
    INSERT INTO lockfence.fences AS f (resource, token, accepted_at, holder)
    SELECT DISTINCT r, raise_floor.floor, pg_catalog.statement_timestamp(),
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
