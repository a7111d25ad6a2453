/* lockfence: the fence table and the fence functions */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION lockfence" to load this file. \quit

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
    'Accept token for resource in this transaction, or raise SQLSTATE LF001';

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
