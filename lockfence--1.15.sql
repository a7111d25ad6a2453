/* lockfence 1.15: fencing tokens for distributed locks, checked by PostgreSQL */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION lockfence" to load this file. \quit

-- (1.11) The newest SQL version the loaded library serves.  Created first:
-- in a backend still running an older library (preloaded, the server not
-- restarted after the new release was installed) its symbol is missing,
-- and the script fails here, having changed nothing.
CREATE FUNCTION lockfence.library_version()
RETURNS text
AS 'MODULE_PATHNAME', 'lockfence_library_version'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION lockfence.library_version() IS
    'The newest SQL version of lockfence the loaded library serves';

-- (1.15) A backend still running an older library (preloaded, the server
-- not restarted after the new release was installed) would serve this SQL
-- with code that does not know it: refuse before changing anything.
DO $$
BEGIN
    IF pg_catalog.string_to_array(lockfence.library_version(), '.')::int[]
       OPERATOR(pg_catalog.<) '{1,15}'::int[] THEN
        RAISE EXCEPTION 'the loaded lockfence library serves SQL up to version % only',
                        lockfence.library_version()
            USING ERRCODE = '55000',
                  HINT = 'Restart the server after installing the new release, then run this again.';
    END IF;
END
$$;

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
    'Accept token for resource in this transaction, or raise LF001 (a lower token, or the same one under another holder), LF003 (its lease lost) or LF004 (the floor not raised)';

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

-- multi-resource fence
--
-- Several resources in one call, checked in byte order (duplicates
-- removed), so that overlapping sets fenced in any order cannot deadlock;
-- all or nothing.  Like fence(text, bigint, text), not executable by
-- PUBLIC (since 1.4: see "privileges" below, and grant_usage).
CREATE FUNCTION lockfence.fence(resources text[], token bigint,
                                holder text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_fence_many'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION lockfence.fence(text[], bigint, text) IS
    'Accept token for every resource in this transaction, in byte order, all or nothing, or raise the first rejected one''s error (LF001, LF003, LF004), naming it';

CREATE FUNCTION lockfence.try_fence(resources text[], token bigint,
                                    holder text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'lockfence_try_fence_many'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION lockfence.try_fence(text[], bigint, text) IS
    'Like fence(text[], ...), but return false, fencing none of the resources, for a rejected token';

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

-- A trigger's arguments exactly as CREATE TRIGGER received them: tgargs
-- holds each argument's bytes followed by a zero byte, in the database
-- encoding.
CREATE FUNCTION lockfence.trigger_arguments(tgargs bytea)
RETURNS text[]
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(array_agg(convert_from(substring(tgargs, z.prev + 2, z.pos - z.prev - 1),
                                           getdatabaseencoding())
                              ORDER BY z.pos),
                    '{}')
      FROM (SELECT g AS pos, lag(g, 1, -1) OVER (ORDER BY g) AS prev
              FROM generate_series(0, length(tgargs) - 1) AS g
             WHERE get_byte(tgargs, g) = 0) AS z
$$;

COMMENT ON FUNCTION lockfence.trigger_arguments(bytea) IS
    'The arguments of a trigger (pg_trigger.tgargs), byte for byte';

-- The argument list of a CREATE TRIGGER that passes the same arguments.
CREATE FUNCTION lockfence.trigger_argument_list(tgargs bytea)
RETURNS text
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(string_agg(quote_literal(a.arg), ', ' ORDER BY a.n), '')
      FROM unnest(lockfence.trigger_arguments(tgargs)) WITH ORDINALITY AS a(arg, n)
$$;

COMMENT ON FUNCTION lockfence.trigger_argument_list(bytea) IS
    'The arguments of a trigger, quoted for CREATE TRIGGER';

-- Refuse to create a lockfence trigger on a table that already has another
-- trigger by that name: the table would seem covered, and be not.
CREATE FUNCTION lockfence.claim_trigger_name(rel regclass, tgname name,
                                             protected regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_trigger x
                WHERE x.tgrelid = rel AND x.tgname = claim_trigger_name.tgname) THEN
        RAISE EXCEPTION 'table "%" already has a trigger named "%"', rel, tgname
            USING ERRCODE = 'duplicate_object',
                  DETAIL = pg_catalog.format('lockfence must give it a copy of the lockfence trigger "%s" of protected table "%s", and the existing trigger is not one.',
                                             tgname, protected),
                  HINT = 'Rename or drop that trigger, then repeat the command.';
    END IF;
END
$$;

COMMENT ON FUNCTION lockfence.claim_trigger_name(regclass, name, regclass) IS
    'Refuse a lockfence trigger name that a table already uses';

-- Spread a protected table's TRUNCATE triggers to one of its partitions
-- (statement triggers are not cloned to partitions, and TRUNCATE of a
-- partition fires only the partition's own), and refuse tables that would
-- hold a protected table's rows without its row triggers: children by
-- plain inheritance.  A partition is covered by a trigger with the same
-- function, kind and arguments, whatever its name.
CREATE FUNCTION lockfence.cover_descendant(rel regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
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
        SELECT tg.tgname, tg.tgtype, tg.tgargs, a.relid, a.via_partition
          FROM ancestors a
          JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = a.relid
         WHERE tg.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
         ORDER BY a.relid, tg.tgname
    LOOP
        IF NOT t.via_partition THEN
            RAISE EXCEPTION 'table "%" cannot inherit from table "%", which is protected by lockfence',
                rel, t.relid::regclass
                USING ERRCODE = 'feature_not_supported',
                      DETAIL = 'Rows of an inheritance child are written without the parent''s triggers.',
                      HINT = 'Use declarative partitioning, whose partitions get the row triggers.';
        END IF;
        -- TRUNCATE triggers (BEFORE, statement level) are copied.
        IF t.tgtype::int & 1 = 0 AND t.tgtype::int & 32 <> 0
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger x
                            WHERE x.tgrelid = rel
                              AND x.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
                              AND x.tgtype = t.tgtype
                              AND x.tgargs = t.tgargs
                              AND x.tgqual IS NULL) THEN
            PERFORM lockfence.claim_trigger_name(rel, t.tgname, t.relid::regclass);
            EXECUTE pg_catalog.format(
                'CREATE TRIGGER %I BEFORE TRUNCATE ON %s FOR EACH STATEMENT'
                ' EXECUTE FUNCTION lockfence.fence_trigger(%s)',
                t.tgname, rel, lockfence.trigger_argument_list(t.tgargs));
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

-- A detached partition loses the row triggers it had from its parent: give
-- it the parent's lockfence row triggers back, so that its rows stay fenced
-- until the owner drops them.  Named NAME_detached, so that the partition
-- can be attached again (the parent's trigger is then cloned by its name).
CREATE FUNCTION lockfence.cover_detached(parent regclass, rel regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    tgname name;
BEGIN
    FOR t IN
        SELECT tg.tgname, tg.tgtype, tg.tgargs
          FROM pg_catalog.pg_trigger tg
         WHERE tg.tgrelid = parent
           AND tg.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
           AND tg.tgtype::int & 1 = 1
         ORDER BY tg.tgname
    LOOP
        CONTINUE WHEN EXISTS (SELECT FROM pg_catalog.pg_trigger x
                               WHERE x.tgrelid = rel
                                 AND x.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure
                                 AND x.tgtype = t.tgtype
                                 AND x.tgargs = t.tgargs
                                 AND x.tgqual IS NULL);
        tgname := t.tgname || '_detached';
        PERFORM lockfence.claim_trigger_name(rel, tgname, parent);
        EXECUTE pg_catalog.format(
            'CREATE TRIGGER %I BEFORE INSERT OR UPDATE OR DELETE ON %s'
            ' FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger(%s)',
            tgname, rel, lockfence.trigger_argument_list(t.tgargs));
        RAISE NOTICE 'detached table "%" stays protected by lockfence trigger "%"', rel, tgname
            USING DETAIL = 'Its rows were fenced as rows of table "' || parent::text || '".',
                  HINT = 'Drop the trigger if the table no longer needs fencing.';
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.cover_detached(regclass, regclass) IS
    'Give a detached partition its former parent''s lockfence row triggers';

-- The token this transaction fenced a resource with.
CREATE FUNCTION lockfence.fenced_token(resource text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_fenced_token'
LANGUAGE C STABLE STRICT;

COMMENT ON FUNCTION lockfence.fenced_token(text) IS
    'Token this transaction fenced resource with, NULL if none';

-- The ALTER TABLE subcommands of a collected DDL command that matter to
-- protected tables (for the event trigger).
CREATE FUNCTION lockfence.alter_table_actions(command pg_ddl_command,
                                              OUT action text,
                                              OUT relid oid,
                                              OUT attnum smallint,
                                              OUT partition_schema text,
                                              OUT partition_name text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'lockfence_alter_table_actions'
LANGUAGE C STABLE STRICT;

COMMENT ON FUNCTION lockfence.alter_table_actions(pg_ddl_command) IS
    'ALTER TABLE subcommands that matter to protected tables';

-- Under REPEATABLE READ or SERIALIZABLE the event triggers' checks would
-- read the catalogs and rows as of the transaction's snapshot, which may
-- predate a table's protection: DDL touching a protected table (its
-- partitions, parents, children, found with the latest snapshot) is
-- refused there (25000).  Called first by the DDL event trigger functions.
CREATE FUNCTION lockfence.check_ddl_isolation()
RETURNS void
AS 'MODULE_PATHNAME', 'lockfence_check_ddl_isolation'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.check_ddl_isolation() IS
    'Refuse DDL on protected tables under REPEATABLE READ or SERIALIZABLE (the event triggers call it)';

-- The partition an ATTACH or DETACH named, as the statement named it: the
-- table by that name (in that schema, if given) that is now a partition of
-- parent (ATTACH), or that is no partition and is locked by this
-- transaction as DETACH locks it.  Ambiguous names give every candidate.
-- (Up to 1.5, pg_temp.x named nothing: the schema is called pg_temp_N.)
CREATE FUNCTION lockfence.named_partitions(parent regclass, schema_name text,
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

COMMENT ON FUNCTION lockfence.named_partitions(regclass, text, text, boolean) IS
    'The partition that an ATTACH or DETACH PARTITION named';

-- DDL that writes rows without firing row triggers (ATTACH PARTITION of a
-- table holding rows, ALTER COLUMN ... TYPE ... USING) is a write of every
-- row: every resource the rows belong to must have been fenced in this
-- transaction.  only_clones: check only the triggers the table got from a
-- new parent, unless it has an identical one of its own, under which its
-- rows were written (one that fires in ordinary sessions: not disabled,
-- nor set to fire only with session_replication_role = replica).  A rewrite of the resource column itself cannot be
-- fenced: the old resources are gone.
CREATE FUNCTION lockfence.check_rows_fenced(rel regclass, action text,
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
                      HINT = format('Call lockfence.fence() for every resource of the rows, in the same transaction, before %s.', action);
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.check_rows_fenced(regclass, text, smallint, boolean) IS
    'Refuse DDL that writes rows of resources not fenced in this transaction';

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

-- (1.11) The table columns whose values are of type typ, or hold it: as an
-- array, a domain, a range or multirange, or an attribute of a composite
-- type (a table's or view's row type too), at any depth.  Read from the
-- types' own catalog columns, not pg_depend, where a domain's DEFAULT
-- expression also depends on the types it names.
CREATE FUNCTION lockfence.type_columns(typ oid, OUT rel regclass,
                                       OUT attnum smallint)
RETURNS SETOF record
LANGUAGE sql STABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
WITH RECURSIVE types(t) AS (
    SELECT typ
    UNION
    SELECT h.t
      FROM types,
           LATERAL (SELECT y.oid FROM pg_catalog.pg_type AS y
                     WHERE y.typbasetype OPERATOR(pg_catalog.=) types.t
                        OR y.typelem OPERATOR(pg_catalog.=) types.t
                    UNION ALL
                    SELECT g.rngtypid FROM pg_catalog.pg_range AS g
                     WHERE g.rngsubtype OPERATOR(pg_catalog.=) types.t
                    UNION ALL
                    SELECT g.rngmultitypid FROM pg_catalog.pg_range AS g
                     WHERE g.rngtypid OPERATOR(pg_catalog.=) types.t
                    UNION ALL
                    SELECT k.reltype
                      FROM pg_catalog.pg_attribute AS att
                      JOIN pg_catalog.pg_class AS k ON k.oid OPERATOR(pg_catalog.=) att.attrelid
                     WHERE att.atttypid OPERATOR(pg_catalog.=) types.t
                       AND att.attnum OPERATOR(pg_catalog.>) 0
                       AND NOT att.attisdropped
                       AND k.reltype OPERATOR(pg_catalog.<>) 0) AS h(t)
)
SELECT DISTINCT att.attrelid::pg_catalog.regclass, att.attnum
  FROM types
  JOIN pg_catalog.pg_attribute AS att
    ON att.atttypid OPERATOR(pg_catalog.=) types.t
   AND att.attnum OPERATOR(pg_catalog.>) 0
   AND NOT att.attisdropped
  JOIN pg_catalog.pg_class AS r
    ON r.oid OPERATOR(pg_catalog.=) att.attrelid
   AND r.relkind IN ('r', 'p', 'f')
$$;

COMMENT ON FUNCTION lockfence.type_columns(oid) IS
    'The table columns whose values hold a type, at any depth';

-- ALTER TABLE subcommands that would let rows be written unfenced: refused,
-- or covered (DETACH).  Called by check_new_triggers().
CREATE FUNCTION lockfence.check_alter_table()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    a record;
    r record;
    u record;
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
        ELSIF a.action = 'rename enum value' THEN
            -- (1.11) ALTER TYPE ... RENAME VALUE: the rows holding the value
            -- now read the new label, a write of every protected table
            -- with a column of the enum (a.parent), whose resources must
            -- be fenced in this transaction
            -- (in the tables' order by name: the first refused is named)
            FOR u IN
                SELECT c.rel, c.attnum FROM lockfence.type_columns(a.parent) AS c
                 ORDER BY c.rel::text, c.attnum
            LOOP
                PERFORM lockfence.check_rows_fenced(u.rel, 'ALTER TYPE ... RENAME VALUE', u.attnum, false);
            END LOOP;
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
            ELSIF a.action = 'set expression' THEN
                -- (1.13) PostgreSQL 17's SET EXPRESSION gives a generated
                -- column of every row a new value (a stored one is
                -- rewritten, a virtual one reads it): a write of every row
                PERFORM lockfence.check_rows_fenced(a.relid::regclass,
                                                    'ALTER COLUMN ... SET EXPRESSION',
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

COMMENT ON FUNCTION lockfence.check_alter_table() IS
    'Refuse or cover ALTER TABLE subcommands that write rows unfenced';

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

-- (dumped with the data: marked at the end of this script, in the order
-- an update from 1.3 marks it)

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
-- remove the names in forget that are gone (for roles with the privileges
-- of the list's owner), or that name a table without one that the caller
-- owns; after a rename (renamed), remove the names that no longer name a
-- table.  Anything else is left as it is.
CREATE FUNCTION lockfence.sync_protected_tables(forget text[] DEFAULT NULL,
                                                renamed boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'lockfence_sync_protected_tables'
LANGUAGE C VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION lockfence.sync_protected_tables(text[], boolean) IS
    'Keep lockfence.protected_tables true to the tables and their triggers';

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
         ORDER BY 1, 2, 3
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

-- Forget the dropped tables (DROP TABLE, DROP SCHEMA ... CASCADE, DROP
-- OWNED, ...) by name.  As the list's owner: only it may make lockfence
-- forget a name that no longer names a table, and the names here are
-- those of the tables this very statement dropped.
CREATE FUNCTION lockfence.forget_dropped_tables()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET quote_all_identifiers = off
AS $$
DECLARE
    gone text[];
BEGIN
    PERFORM lockfence.check_dropped_columns();
    -- (1.11) Named as the list names them: object_identity is quoted as
    -- the dropping session's quote_all_identifiers quoted it.
    gone := ARRAY(SELECT n.tbl
                    FROM pg_catalog.pg_event_trigger_dropped_objects() AS o,
                         LATERAL (SELECT pg_catalog.format('%I.%I', o.schema_name, o.object_name) AS tbl) AS n
                   WHERE o.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                     AND o.objsubid = 0
                     AND n.tbl IN (SELECT p.tbl FROM lockfence.protected_tables AS p));
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
-- restore's post-data, also inside CREATE SCHEMA) and the new names of
-- renamed or moved ones (ALTER TABLE ... RENAME or SET SCHEMA, ALTER
-- SCHEMA ... RENAME).
CREATE FUNCTION lockfence.track_protected_tables()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lockfence.check_ddl_isolation();
    PERFORM lockfence.sync_protected_tables(
        renamed => TG_TAG OPERATOR(pg_catalog.<>) ALL (ARRAY['CREATE TRIGGER', 'CREATE SCHEMA']));
END
$$;

COMMENT ON FUNCTION lockfence.track_protected_tables() IS
    'List new protected tables and the new names of renamed ones in lockfence.protected_tables';

CREATE EVENT TRIGGER lockfence_track_protected_tables ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER', 'ALTER TABLE', 'ALTER FOREIGN TABLE',
                 'ALTER SCHEMA', 'CREATE SCHEMA')
    EXECUTE FUNCTION lockfence.track_protected_tables();

ALTER EVENT TRIGGER lockfence_track_protected_tables ENABLE ALWAYS;

-- Report a misused fence_trigger() when the trigger is created rather than
-- at the first write (with check_function_bodies off, as in a restore, as
-- a warning: the trigger fails closed), cover new partitions of protected tables, and refuse
-- ALTER TABLE subcommands that would let rows be written unfenced.
CREATE FUNCTION lockfence.check_new_triggers()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tg oid;
    rel oid;
BEGIN
    PERFORM lockfence.check_ddl_isolation();
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

-- CREATE SCHEMA reports the tables and triggers it creates as commands of
-- their own; ALTER FOREIGN TABLE can INHERIT a protected table; ALTER TYPE
-- ... ALTER ATTRIBUTE ... CASCADE changes the columns of typed tables;
-- (1.10) ALTER VIEW and ALTER MATERIALIZED VIEW ... RENAME COLUMN rename a
-- table's column too (PostgreSQL does not check the kind of relation).
CREATE EVENT TRIGGER lockfence_check_new_triggers ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER', 'CREATE TABLE', 'CREATE TABLE AS',
                 'CREATE FOREIGN TABLE', 'ALTER TABLE', 'ALTER FOREIGN TABLE',
                 'CREATE SCHEMA', 'ALTER TYPE', 'ALTER VIEW',
                 'ALTER MATERIALIZED VIEW')
    EXECUTE FUNCTION lockfence.check_new_triggers();

-- Only the owner of a protected table may create or replace its triggers:
-- an event trigger of its own, enabled ALWAYS, so that a session with
-- session_replication_role = replica cannot leave a replaced trigger
-- behind for every other session.
CREATE FUNCTION lockfence.check_trigger_owners()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    foreign_trigger record;
BEGIN
    PERFORM lockfence.check_ddl_isolation();
    -- Only the owner of a protected table may create or replace its
    -- triggers.  CREATE OR REPLACE TRIGGER needs no more than the TRIGGER
    -- privilege (which GRANT ALL gives) and keeps the name: lockfence's
    -- trigger pointed at another function lets every write through.  A
    -- table is protected when it has a lockfence trigger, or is listed
    -- (its last one may be the trigger just replaced), and lockfence's
    -- trigger names are the owner's on any table.  A trigger created on a
    -- partitioned table is cloned onto its partitions (needing only the
    -- TRIGGER privilege on them, which GRANT ALL gives) and fires there like
    -- one of their own: the clones count.
    FOR foreign_trigger IN
        WITH RECURSIVE created(oid) AS (
            SELECT c.objid
              FROM pg_catalog.pg_event_trigger_ddl_commands() AS c
             WHERE c.classid = 'pg_catalog.pg_trigger'::pg_catalog.regclass
            UNION
            SELECT t.oid
              FROM pg_catalog.pg_trigger AS t
              JOIN created ON t.tgparentid = created.oid
        )
        SELECT t.tgname, t.tgrelid::pg_catalog.regclass AS rel
          FROM created
          JOIN pg_catalog.pg_trigger AS t ON t.oid = created.oid
          JOIN pg_catalog.pg_class AS k ON k.oid = t.tgrelid
         WHERE NOT pg_catalog.pg_has_role(k.relowner, 'USAGE')
           AND (t.tgname IN ('zz_lockfence_fence', 'zz_lockfence_fence_truncate')
                OR EXISTS (SELECT FROM pg_catalog.pg_trigger AS f
                            WHERE f.tgrelid = t.tgrelid
                              AND f.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure)
                OR EXISTS (SELECT FROM lockfence.protected_tables AS p
                            WHERE lockfence.protected_table_oid(p.tbl) = t.tgrelid))
    LOOP
        RAISE EXCEPTION 'only the owner of protected table % may create or replace its triggers', foreign_trigger.rel
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('Role %I, which does not own the table, created or replaced trigger %I: a lockfence trigger replaced by another would let writes through unfenced.',
                                             current_user, foreign_trigger.tgname),
                  HINT = 'Create the trigger as the table''s owner.';
    END LOOP;
END
$$;

CREATE EVENT TRIGGER lockfence_check_trigger_owners ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER', 'CREATE SCHEMA')
    EXECUTE FUNCTION lockfence.check_trigger_owners();

ALTER EVENT TRIGGER lockfence_check_trigger_owners ENABLE ALWAYS;

-- Protect a table: the row trigger and the TRUNCATE trigger (which lets a
-- TRUNCATE through only for a fixed resource the transaction fenced), named
-- so that they fire after the table's other BEFORE triggers.
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
    args text;
    citus_unsafe text;
    partitioned boolean;
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
        -- (1.13) Citus creates a moved partitioned table's partition shards
        -- on the new node and attaches them, which lockfence refuses as an
        -- ATTACH PARTITION of unfenced rows: moves would fail (a review;
        -- before, protect() failed in Citus with XX000 here).
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS d'
                ' JOIN pg_catalog.pg_class AS c ON c.oid = d.logicalrelid'
                ' WHERE d.logicalrelid = $1 AND (c.relkind = ''p'' OR c.relispartition))'
           INTO partitioned USING tbl;
        IF partitioned THEN
            RAISE EXCEPTION 'lockfence cannot protect partitioned Citus table "%"', tbl
                USING ERRCODE = 'feature_not_supported',
                      DETAIL = 'Citus attaches the partitions'' shards anew when it moves them, which lockfence refuses as an ATTACH PARTITION of rows not fenced.',
                      HINT = 'Protect distributed tables that are not partitioned (see docs/citus.md).';
        END IF;
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

-- Locks are keys on a lease of the session (one per TTL).  scope
-- 'transaction' releases a lock when the transaction that took it ends
-- (after a commit, once it is durable; a failed release never turns the
-- commit into an error, the TTL frees the lock), like
-- pg_advisory_xact_lock, so it works behind a transaction-pooling
-- connection pooler; scope 'session' keeps it until etcd_unlock or the
-- session's end.

-- Acquire the named lock, waiting as long as wait_timeout allows (NULL:
-- forever).  token is the create_revision of the lock key.
CREATE FUNCTION lockfence.etcd_lock(name text, ttl_seconds integer DEFAULT 30,
                                    wait_timeout interval DEFAULT NULL,
                                    scope text DEFAULT 'session')
RETURNS TABLE (key text, lease bigint, token bigint)
AS 'MODULE_PATHNAME', 'lockfence_etcd_lock'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION lockfence.etcd_lock(text, integer, interval, text) IS
    'Acquire an etcd lock (waits); returns its key, lease and fencing token; scope session or transaction';

-- Acquire the named lock only if it is free at once; no row otherwise.
CREATE FUNCTION lockfence.etcd_try_lock(name text, ttl_seconds integer DEFAULT 30,
                                        scope text DEFAULT 'session')
RETURNS TABLE (key text, lease bigint, token bigint)
AS 'MODULE_PATHNAME', 'lockfence_etcd_try_lock'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION lockfence.etcd_try_lock(text, integer, text) IS
    'Acquire an etcd lock if free at once; no row when it is taken; scope session or transaction';

-- Release a lock: delete its key (and revoke its lease when the lease is
-- not this session's).  Only lock keys (<name>/<lease hex>, attached to
-- that lease) unless force.
CREATE FUNCTION lockfence.etcd_unlock(key text, force boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'lockfence_etcd_unlock'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.etcd_unlock(text, boolean) IS
    'Release an etcd lock (only lock keys unless force); false (with a NOTICE) when it was already gone';

-- Renew a lease once; returns the seconds it has left.
CREATE FUNCTION lockfence.etcd_keepalive(lease bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_etcd_keepalive'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.etcd_keepalive(bigint) IS
    'Renew an etcd lease; returns its remaining TTL in seconds';

-- Acquire the lock, then fence the resource with its token in the
-- current transaction.  Every argument is checked before etcd is
-- contacted; if anything fails before the fence accepted the token (a
-- rejected token, a cancel, a statement timeout), the lock is released
-- again before the error propagates.  Transaction-scoped by default: its
-- fence is transactional anyway.
CREATE FUNCTION lockfence.etcd_lock_and_fence(name text, resource text,
                                              ttl_seconds integer DEFAULT 30,
                                              wait_timeout interval DEFAULT NULL,
                                              scope text DEFAULT 'transaction')
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_etcd_lock_and_fence'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.etcd_lock_and_fence(text, text, integer, interval, text) IS
    'Acquire an etcd lock and fence a resource with its token; returns the token; the lock is transaction-scoped by default';

-- Network access to the lock service is granted explicitly, e.g.
--   GRANT EXECUTE ON FUNCTION lockfence.etcd_lock(text, integer, interval, text) TO app;
REVOKE ALL ON FUNCTION lockfence.etcd_lock(text, integer, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_try_lock(text, integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_unlock(text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_keepalive(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_lock_and_fence(text, text, integer, interval, text) FROM PUBLIC;

-- etcd multi-lock (issue 9, item 5)
--
-- Several etcd locks in one call, taken in byte order of their names
-- (duplicates removed), so that overlapping sets requested in any order
-- cannot deadlock; all or nothing: if any acquisition fails, times out or
-- is cancelled, every lock the call took is released before the error
-- returns.  wait_timeout bounds the whole call.  Like etcd_lock, not
-- executable by PUBLIC.
CREATE FUNCTION lockfence.etcd_lock_many(names text[], ttl_seconds integer DEFAULT 30,
                                         wait_timeout interval DEFAULT NULL,
                                         scope text DEFAULT 'session')
RETURNS TABLE (name text, key text, lease bigint, token bigint)
AS 'MODULE_PATHNAME', 'lockfence_etcd_lock_many'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE ROWS 4;

COMMENT ON FUNCTION lockfence.etcd_lock_many(text[], integer, interval, text) IS
    'Acquire several etcd locks in byte order, all or nothing; one row per name with its key, lease and fencing token';

-- Lock every name, then fence resources[i] with the token of the lock on
-- names[i] (resources in byte order), all or nothing; one row per
-- resource.  Transaction-scoped by default, and every lock is confirmed
-- at commit, like etcd_lock_and_fence(text, text, ...).
CREATE FUNCTION lockfence.etcd_lock_and_fence(names text[], resources text[],
                                              ttl_seconds integer DEFAULT 30,
                                              wait_timeout interval DEFAULT NULL,
                                              scope text DEFAULT 'transaction')
RETURNS TABLE (resource text, name text, key text, lease bigint, token bigint)
AS 'MODULE_PATHNAME', 'lockfence_etcd_lock_and_fence_many'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE ROWS 4;

COMMENT ON FUNCTION lockfence.etcd_lock_and_fence(text[], text[], integer, interval, text) IS
    'Acquire several etcd locks in byte order and fence each resource with its lock''s token, all or nothing; the locks are transaction-scoped by default';

REVOKE ALL ON FUNCTION lockfence.etcd_lock_many(text[], integer, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.etcd_lock_and_fence(text[], text[], integer, interval, text) FROM PUBLIC;

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

COMMENT ON FUNCTION lockfence.unprotect(regclass) IS
    'Drop the lockfence triggers that protect a table';

-- Refuse what would take lockfence's protection away from tables that
-- stay: a drop that, with CASCADE, would drop lockfence while tables are
-- protected (DROP EXTENSION lockfence, DROP SCHEMA of its schema under any
-- name, DROP EXTENSION plpgsql, DROP OWNED BY its owner, ...) or a
-- lockfence trigger of a table it does not drop; ALTER EXTENSION lockfence
-- DROP while tables are protected; and renaming its schema.  CASCADE would
-- drop every protection with a NOTICE, and a new CREATE EXTENSION would
-- not restore them.  An event trigger rather than a hook, so that it works
-- without shared_preload_libraries; it fires before the drop, while it
-- still exists.  ENABLE ALWAYS: also in sessions with
-- session_replication_role = replica.
CREATE FUNCTION lockfence.guard_drop()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'lockfence_guard_drop'
LANGUAGE C;

COMMENT ON FUNCTION lockfence.guard_drop() IS
    'Refuse to drop lockfence, or what a lockfence trigger depends on, while tables are protected by it';

CREATE EVENT TRIGGER lockfence_guard_drop ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED',
                 'DROP LANGUAGE', 'DROP FUNCTION', 'DROP PROCEDURE',
                 'DROP ROUTINE', 'DROP AGGREGATE', 'DROP TYPE', 'DROP DOMAIN',
                 'DROP TABLE', 'DROP VIEW', 'DROP MATERIALIZED VIEW',
                 'DROP SEQUENCE', 'DROP FOREIGN TABLE',
                 'ALTER EXTENSION', 'ALTER SCHEMA')
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

-- A publication made before the extension (FOR ALL TABLES, or FOR TABLES
-- IN SCHEMA lockfence with the schema made beforehand) publishes
-- lockfence.fences from now on: refused as the event trigger refuses it
-- (issue 23, item 7).
DO $$
DECLARE
    p record;
BEGIN
    IF coalesce(pg_catalog.current_setting('lockfence.allow_publish_fences', true),
                'off')::boolean THEN
        RETURN;
    END IF;
    FOR p IN
        SELECT pub.pubname, pub.puballtables
          FROM pg_catalog.pg_publication pub
          JOIN pg_catalog.pg_publication_tables pt ON pt.pubname = pub.pubname
         WHERE pt.schemaname = 'lockfence' AND pt.tablename = 'fences'
         ORDER BY 1
         LIMIT 1
    LOOP
        RAISE EXCEPTION 'publication "%" would publish lockfence.fences', p.pubname
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'A subscriber''s fences must be its own: following the publisher''s would move them back, or stop the subscription with a unique violation.',
                  HINT = CASE WHEN p.puballtables
                         THEN 'Publish the application''s tables by name or by schema instead of FOR ALL TABLES, or SET lockfence.allow_publish_fences = on to create the extension anyway.'
                         ELSE 'Leave the lockfence schema out of the publication, or SET lockfence.allow_publish_fences = on to create the extension anyway.'
                         END;
    END LOOP;
END
$$;

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

COMMENT ON FUNCTION lockfence.check() IS
    'Installation check: one row per finding (severity, finding, detail, hint)';

-- failover floor
--
-- After a failover that lost acknowledged fence advances (an asynchronous
-- standby promoted while behind), raise the fences to a floor above every
-- token the lock service issued before: the superseded holders' tokens are
-- rejected again, and holders must acquire their locks again.

-- Raise every fence (or those of the named resources, creating rows for
-- named resources that have none) to at least floor, the lowest token
-- accepted afterwards.  Returns the number of fences raised or created.
-- Without resources it also records this server's identity and floor as
-- the global floor (floor_record): that lifts the refusal after a
-- promotion (LF004) and covers names without a row; a list does neither,
-- and raises its names to the global floor at least, never below it.  It
-- runs under READ COMMITTED only: with a transaction snapshot a fence row
-- committed after it would be left below the floor.
CREATE FUNCTION lockfence.raise_floor(floor bigint, resources text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raised bigint;
    bad text;
    effective bigint;
    distributed boolean := false;
    node record;
    node_lock_timeout text;
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

    -- (1.12) On Citus, with the fences distributed: a fence row moves with
    -- its shard, a node's floor does not, so a resource without a row moved
    -- to a node with a lower floor lost it.  Every node records the floor,
    -- the other nodes first, each in a transaction of its own (as Citus
    -- runs a command on a node): a floor only rises, so the nodes raised
    -- before another failed keep theirs, and raise_floor() runs again.
    -- Those transactions wait for this one's locks unseen by any deadlock
    -- detector (a fence of a new name earlier in it holds the node's
    -- lockfence.floor_state): they wait lock_timeout at most, 10 s unset.
    -- (1.13) A disabled node too: citus_activate_node() brings it back
    -- with the shards it may then be given, at the floor it had (a review:
    -- skipped, it let a token below the floor in after a move there).  One
    -- never activated (citus_add_inactive_node) may not have lockfence
    -- yet; activation creates it at floor 0, as for a node added later.
    IF raise_floor.resources IS NULL
       AND EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition'
                ' WHERE logicalrelid = ''lockfence.fences''::pg_catalog.regclass)'
           INTO distributed;
    END IF;
    IF distributed THEN
        node_lock_timeout := CASE WHEN pg_catalog.current_setting('lock_timeout') OPERATOR(pg_catalog.=) '0' THEN '10s'
                                  ELSE pg_catalog.current_setting('lock_timeout') END;
        FOR node IN EXECUTE
            'SELECT w.node_name, w.node_port, w.success, w.result'
            '  FROM (SELECT pg_catalog.array_agg(n.nodename ORDER BY n.nodename, n.nodeport) AS names,'
            '               pg_catalog.array_agg(n.nodeport ORDER BY n.nodename, n.nodeport) AS ports,'
            '               pg_catalog.array_agg(CASE WHEN n.isactive THEN $1 ELSE $2 END'
            '                                    ORDER BY n.nodename, n.nodeport) AS commands'
            '          FROM pg_catalog.pg_dist_node n'
            '         WHERE n.noderole = ''primary'''
            '           AND n.groupid <> ALL (SELECT groupid FROM pg_catalog.pg_dist_local_group)) AS a,'
            '       pg_catalog.master_run_on_worker(a.names, a.ports, a.commands, true) AS w'
            USING pg_catalog.format(
                'SELECT lockfence.floor_record(%s) FROM (SELECT pg_catalog.set_config(''lock_timeout'', %L, true)) AS t',
                raise_floor.floor, node_lock_timeout),
                  pg_catalog.format(
                'DO $r$BEGIN IF pg_catalog.to_regnamespace(''lockfence'') IS NOT NULL THEN'
                ' PERFORM pg_catalog.set_config(''lock_timeout'', %L, true);'
                ' PERFORM lockfence.floor_record(%s); END IF; END$r$',
                node_lock_timeout, raise_floor.floor)
        LOOP
            IF NOT node.success THEN
                RAISE EXCEPTION 'could not raise the fence floor on Citus node %:%', node.node_name, node.node_port
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          DETAIL = node.result,
                          HINT = 'The nodes already raised keep the floor (it only rises): call raise_floor() again once every node answers, in a transaction of its own (a fence of a new name, or a floor raised, earlier in this transaction holds the lock it waits for there). A node gone for good, disabled or not, must first be removed (citus_remove_node).';
            END IF;
        END LOOP;
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

-- failover guard (issue 23 items 1 to 4)
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
    recorded_at       timestamptz NOT NULL,
    database_oid      oid
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
SELECT i.system_identifier, i.timeline, 0, pg_catalog.statement_timestamp(),
       (SELECT d.oid FROM pg_catalog.pg_database d
         WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  FROM lockfence.floor_identity() AS i;

CREATE FUNCTION lockfence.floor_record(floor bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'lockfence_floor_record'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.floor_record(bigint) IS
    'Record this server''s identity and raise the global floor (raise_floor() calls it)';

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
                                       OUT writes_refused boolean,
                                       OUT recorded_database_oid oid,
                                       OUT database_oid oid)
RETURNS record
AS 'MODULE_PATHNAME', 'lockfence_floor_status'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.floor_status() IS
    'Recorded and current server identity and database, global floor, and whether fenced writes are refused (LF004)';

REVOKE ALL ON FUNCTION lockfence.floor_record(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.floor_adopt() FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.accept_promotion() FROM PUBLIC;

-- A write to lockfence.floor_state that does not go through the floor
-- functions (by its owner, a member of pg_write_all_data, a data-only
-- restore, logical replication's apply) sends the relcache invalidation
-- those functions send, so that connected sessions judge the table again
-- rather than keep a verdict (and a global floor) read before the write.
-- ENABLE ALWAYS: also for sessions with session_replication_role = replica
-- and for logical replication's apply, which fires row triggers only (so a
-- row trigger, and a statement trigger for TRUNCATE).  check() reports
-- them disabled or not ALWAYS.
CREATE FUNCTION lockfence.floor_state_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'lockfence_floor_state_changed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.floor_state_changed() IS
    'Make every session read lockfence.floor_state again after a write to it (its trigger)';

REVOKE ALL ON FUNCTION lockfence.floor_state_changed() FROM PUBLIC;

CREATE TRIGGER floor_state_changed
    AFTER INSERT OR UPDATE OR DELETE ON lockfence.floor_state
    FOR EACH ROW EXECUTE FUNCTION lockfence.floor_state_changed();
CREATE TRIGGER floor_state_truncated
    AFTER TRUNCATE ON lockfence.floor_state
    FOR EACH STATEMENT EXECUTE FUNCTION lockfence.floor_state_changed();
ALTER TABLE lockfence.floor_state ENABLE ALWAYS TRIGGER floor_state_changed;
ALTER TABLE lockfence.floor_state ENABLE ALWAYS TRIGGER floor_state_truncated;

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
    'End a lease at once; false when it had expired, was taken over or was released already';

-- privileges (issue 17, item 12)
--
-- Nothing that advances a fence or a lease is executable by PUBLIC: a role
-- that may fence a resource can lock its holder out (a higher token), and
-- one that may renew or release a lease can keep or end another's.
-- lockfence.grant_usage(role) gives an application role exactly these
-- functions (and, with etcd => true, the etcd lock functions).  Writing a
-- protected table needs no grant here: the trigger runs for any writer.
REVOKE EXECUTE ON FUNCTION lockfence.fence(text, bigint, text),
    lockfence.try_fence(text, bigint, text),
    lockfence.fence(text[], bigint, text),
    lockfence.try_fence(text[], bigint, text),
    lockfence.lease_acquire(text, interval, text, interval),
    lockfence.lease_try_acquire(text, interval, text),
    lockfence.lease_renew(text, bigint, interval),
    lockfence.lease_release(text, bigint)
    FROM PUBLIC;

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
    IF grant_usage.etcd IS NULL THEN
        RAISE EXCEPTION 'argument "etcd" of lockfence.grant_usage() must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOR f IN SELECT * FROM lockfence.usage_functions(grant_usage.etcd) LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, grant_usage.role);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.grant_usage(regrole, boolean) IS
    'Let a role fence resources and take leases (and etcd locks with etcd => true)';

-- (1.12) revoke_usage() takes back only what the caller granted (REVOKE
-- removes a grantor's own grants), so it now checks that the role may no
-- longer execute the functions, and fails, naming what still lets it,
-- instead of returning as if it had.  A function the caller holds no
-- right on at all (the etcd functions, for a role delegated only the
-- others) is left to that check rather than failing the REVOKE.
CREATE FUNCTION lockfence.revoke_usage(role regrole, etcd boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f regprocedure;
    why text;
    errcode text;
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
        BEGIN
            EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM %s', f, revoke_usage.role);
        EXCEPTION
            WHEN insufficient_privilege THEN
                NULL;
            WHEN dependent_objects_still_exist THEN
                RAISE EXCEPTION 'role % granted EXECUTE on % on to other roles', revoke_usage.role, f
                    USING ERRCODE = 'dependent_objects_still_exist',
                          DETAIL = 'Taking its grant back would leave theirs without a grantor; nothing was revoked.',
                          HINT = pg_catalog.format('Call lockfence.revoke_usage() for those roles first (as %s), or REVOKE EXECUTE ON FUNCTION %s FROM %s CASCADE.',
                                                   revoke_usage.role, f, revoke_usage.role);
        END;
    END LOOP;
    FOR f IN SELECT * FROM lockfence.usage_functions(revoke_usage.etcd) LOOP
        -- Also through a membership without INHERIT: the role may SET ROLE.
        SELECT w.why, w.errcode INTO why, errcode
          FROM pg_catalog.pg_proc p,
               LATERAL (SELECT 1, CASE WHEN r.oid OPERATOR(pg_catalog.=) revoke_usage.role::oid
                                       THEN 'it is a superuser'
                                       ELSE pg_catalog.format('it is a member of superuser %s', r.oid::regrole) END,
                               '55000'
                          FROM pg_catalog.pg_roles r
                         WHERE r.rolsuper AND pg_catalog.pg_has_role(revoke_usage.role, r.oid, 'MEMBER')
                        UNION ALL
                        SELECT 2, 'it owns the function, or is a member of its owner', '55000'
                         WHERE pg_catalog.pg_has_role(revoke_usage.role, p.proowner, 'MEMBER')
                        UNION ALL
                        SELECT 3, pg_catalog.format('%1$s granted it EXECUTE: %1$s can take that grant back (lockfence.revoke_usage() run as %1$s), or the functions'' owner with REVOKE EXECUTE ... FROM %1$s CASCADE',
                                                 a.grantor::regrole), '42501'
                          FROM pg_catalog.aclexplode(p.proacl) a
                         WHERE a.grantee OPERATOR(pg_catalog.=) revoke_usage.role::oid
                        UNION ALL
                        SELECT 4, 'EXECUTE is granted to PUBLIC', '55000'
                          FROM pg_catalog.aclexplode(p.proacl) a
                         WHERE a.grantee OPERATOR(pg_catalog.=) 0
                        UNION ALL
                        SELECT 5, pg_catalog.format('it is a member of role %s, granted EXECUTE', a.grantee::regrole), '55000'
                          FROM pg_catalog.aclexplode(p.proacl) a
                         WHERE a.grantee NOT IN (0, revoke_usage.role::oid)
                           AND pg_catalog.pg_has_role(revoke_usage.role, a.grantee, 'MEMBER')) AS w(rank, why, errcode)
         WHERE p.oid OPERATOR(pg_catalog.=) f
         ORDER BY w.rank
         LIMIT 1;
        IF NOT FOUND THEN
            CONTINUE WHEN NOT pg_catalog.has_function_privilege(revoke_usage.role, f, 'EXECUTE');
            why := 'PostgreSQL grants it EXECUTE in a way lockfence cannot name';
            errcode := '55000';
        END IF;
        RAISE EXCEPTION 'role % may still execute %', revoke_usage.role, f
            USING ERRCODE = errcode,
                  DETAIL = why || '; nothing was revoked.',
                  HINT = 'Revoke what the detail names (lockfence.revoke_usage() as the grantor, REVOKE ... FROM PUBLIC, or REVOKE the membership), then call lockfence.revoke_usage() again.';
    END LOOP;
END
$$;

COMMENT ON FUNCTION lockfence.revoke_usage(regrole, boolean) IS
    'Undo grant_usage() (with etcd => false, keep the etcd lock functions)';

REVOKE ALL ON FUNCTION lockfence.grant_usage(regrole, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockfence.revoke_usage(regrole, boolean) FROM PUBLIC;
/* issue 17: the fence cache and the shape of lockfence.fences */

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

-- NULL when lockfence.fences is exactly as the install scripts make it,
-- else what differs.  Fences and leases then go through SQL statements.
CREATE FUNCTION lockfence.fences_table_problem()
RETURNS text
AS 'MODULE_PATHNAME', 'lockfence_fences_table_problem'
LANGUAGE C STABLE PARALLEL SAFE;

COMMENT ON FUNCTION lockfence.fences_table_problem() IS
    'What differs between lockfence.fences and the table as installed, NULL if nothing';

-- issue 17 item 10: the registry of protected tables (created above) is
-- dumped with the data.
SELECT pg_catalog.pg_extension_config_dump('lockfence.protected_tables', '');

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
