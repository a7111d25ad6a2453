/* lockfence: update from 1.10 to 1.11 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.11'" to load this file. \quit

-- (1.11) floor_status() also says which database lockfence.floor_state's
-- row was recorded in, and which one this is: a CREATE DATABASE ...
-- TEMPLATE copy is refused with the same server identity on both sides.
-- New OUT columns change the row type, which CREATE OR REPLACE cannot.
DROP FUNCTION lockfence.floor_status();

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
