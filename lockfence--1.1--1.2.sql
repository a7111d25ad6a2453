/* lockfence: update from 1.1 to 1.2 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.2'" to load this file. \quit

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
