/* lockfence: update from 1.7 to 1.8 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.8'" to load this file. \quit

-- The changes of 2026-12-06 (CHANGELOG 1.8): a write to
-- lockfence.floor_state by hand reaches connected sessions.

-- A write to lockfence.floor_state that does not go through the floor
-- functions (by its owner, a member of pg_write_all_data, a data-only
-- restore, logical replication's apply) sends the relcache invalidation
-- those functions send, so that connected sessions judge the table again
-- rather than keep a verdict (and a global floor) read before the write.
-- ENABLE ALWAYS: also for sessions with session_replication_role = replica.
CREATE FUNCTION lockfence.floor_state_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'lockfence_floor_state_changed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION lockfence.floor_state_changed() IS
    'Make every session read lockfence.floor_state again after a write to it (its trigger)';

REVOKE ALL ON FUNCTION lockfence.floor_state_changed() FROM PUBLIC;

CREATE TRIGGER floor_state_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON lockfence.floor_state
    FOR EACH STATEMENT EXECUTE FUNCTION lockfence.floor_state_changed();
ALTER TABLE lockfence.floor_state ENABLE ALWAYS TRIGGER floor_state_changed;
