/* lockfence: update from 1.14 to 1.15 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.15'" to load this file. \quit

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
