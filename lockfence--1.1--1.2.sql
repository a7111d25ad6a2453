/* lockfence: update from 1.1 to 1.2 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION lockfence UPDATE TO '1.2'" to load this file. \quit

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
    'End a lease at once; false when it had expired or was taken over';
