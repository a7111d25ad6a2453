
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

-- Report a misused fence_trigger() when the trigger is created rather than
-- at the first write.
CREATE FUNCTION lockfence.check_new_triggers()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tg oid;
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
END
$$;

CREATE EVENT TRIGGER lockfence_check_new_triggers ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER')
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
END
$$;

COMMENT ON FUNCTION lockfence.protect(regclass, text, name, text, name, name) IS
    'Create the lockfence triggers that protect a table';
