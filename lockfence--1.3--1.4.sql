/* lockfence: update from 1.3 to 1.4 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.4'" to load this file. \quit

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

-- raise_floor(floor) without resources records this server's identity and
-- the global floor (issue 23).
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
