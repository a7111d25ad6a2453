/* lockfence: update from 1.3 to 1.4 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.4'" to load this file. \quit

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
