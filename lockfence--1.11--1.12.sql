/* lockfence: update from 1.11 to 1.12 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.12'" to load this file. \quit

-- (1.12) A backend still running an older library (preloaded, the server
-- not restarted after the new release was installed) would serve this SQL
-- with code that does not know it: refuse before changing anything.
DO $$
BEGIN
    IF pg_catalog.string_to_array(lockfence.library_version(), '.')::int[]
       OPERATOR(pg_catalog.<) '{1,12}'::int[] THEN
        RAISE EXCEPTION 'the loaded lockfence library serves SQL up to version % only',
                        lockfence.library_version()
            USING ERRCODE = '55000',
                  HINT = 'Restart the server after installing the new release, then run this again.';
    END IF;
END
$$;

-- (1.12) revoke_usage() takes back only what the caller granted (REVOKE
-- removes a grantor's own grants), so it now checks that the role may no
-- longer execute the functions, and fails, naming what still lets it,
-- instead of returning as if it had.  A function the caller holds no
-- right on at all (the etcd functions, for a role delegated only the
-- others) is left to that check rather than failing the REVOKE.
CREATE OR REPLACE FUNCTION lockfence.revoke_usage(role regrole, etcd boolean DEFAULT true)
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
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;
        END;
    END LOOP;
    FOR f IN SELECT * FROM lockfence.usage_functions(revoke_usage.etcd) LOOP
        CONTINUE WHEN NOT pg_catalog.has_function_privilege(revoke_usage.role, f, 'EXECUTE');
        SELECT w.why, w.errcode INTO why, errcode
          FROM pg_catalog.pg_proc p,
               LATERAL (SELECT 1, 'it is a superuser', '55000'
                          FROM pg_catalog.pg_roles r
                         WHERE r.oid OPERATOR(pg_catalog.=) revoke_usage.role::oid AND r.rolsuper
                        UNION ALL
                        SELECT 2, 'it owns the function, or is a member of its owner', '55000'
                         WHERE pg_catalog.pg_has_role(revoke_usage.role, p.proowner, 'USAGE')
                        UNION ALL
                        SELECT 3, pg_catalog.format('%s granted it EXECUTE, and only %s can take that grant back',
                                                 a.grantor::regrole, a.grantor::regrole), '42501'
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
                           AND pg_catalog.pg_has_role(revoke_usage.role, a.grantee, 'USAGE')) AS w(rank, why, errcode)
         WHERE p.oid OPERATOR(pg_catalog.=) f
         ORDER BY w.rank
         LIMIT 1;
        RAISE EXCEPTION 'role % may still execute %', revoke_usage.role, f
            USING ERRCODE = coalesce(errcode, '55000'),
                  DETAIL = coalesce(why, 'PostgreSQL grants it EXECUTE in a way lockfence cannot name') || '; nothing was revoked.',
                  HINT = 'Revoke what the detail names (lockfence.revoke_usage() as the grantor, REVOKE ... FROM PUBLIC, or REVOKE the membership), then call lockfence.revoke_usage() again.';
    END LOOP;
END
$$;

-- (1.12) Of two lockfence triggers naming the dropped column (the row
-- trigger and the TRUNCATE one), the error names the first by name, not
-- whichever the catalog scan met first.
CREATE OR REPLACE FUNCTION lockfence.check_dropped_columns()
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

