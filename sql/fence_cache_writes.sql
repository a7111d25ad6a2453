-- the transaction's memory of fenced tokens (issue 17, item 5): a fence row
-- written other than by a fence check (a lease grant, renewal or release,
-- reset(), raise_floor()) is read again by the next check
CREATE EXTENSION lockfence;
\set VERBOSITY default

-- fence, release the lease, fence again: the lease is no longer held (LF003)
SELECT token FROM lockfence.lease_acquire('x', '1 hour', 'h');
BEGIN;
SELECT lockfence.fence('x', 1);
SELECT lockfence.lease_release('x', 1);
SELECT lockfence.fence('x', 1);
ROLLBACK;

-- a release rolled back to a savepoint: the lease and its fence are back
BEGIN;
SELECT lockfence.fence('x', 1);
SAVEPOINT s;
SELECT lockfence.lease_release('x', 1);
ROLLBACK TO SAVEPOINT s;
SELECT lockfence.fence('x', 1);
COMMIT;

-- a renewal: the token still holds, and (1.10) the transaction's fence
-- with it too (it changed only the expiry)
BEGIN;
SELECT lockfence.fence('x', 1);
SELECT lockfence.lease_renew('x', 1) > now();
SELECT lockfence.fenced_token('x');
SELECT lockfence.fence('x', 1);
COMMIT;

-- fence 1, then a lease grant of token 2: token 1 is stale (LF001)
BEGIN;
SELECT lockfence.fence('y', 1);
SELECT token FROM lockfence.lease_acquire('y', '1 hour', 'h');
SELECT lockfence.fence('y', 1);
ROLLBACK;
-- the same with lease_try_acquire
BEGIN;
SELECT lockfence.fence('y', 1);
SELECT token FROM lockfence.lease_try_acquire('y', '1 hour', 'h');
SELECT lockfence.try_fence('y', 1) AS token_1, lockfence.try_fence('y', 2) AS token_2;
ROLLBACK;

-- reset() in the same transaction: the fence is gone, any token is accepted
BEGIN;
SELECT lockfence.fence('z', 5);
SELECT lockfence.reset('z');
SELECT lockfence.fence('z', 3);
SELECT lockfence.current_token('z');
ROLLBACK;

-- raise_floor() of named resources in the same transaction: tokens below
-- the floor are stale, also those this transaction fenced
BEGIN;
SELECT lockfence.fence('f', 5), lockfence.fence('g', 6);
SELECT lockfence.raise_floor(100, ARRAY['f']);
SELECT lockfence.try_fence('f', 5) AS f_5, lockfence.try_fence('g', 6) AS g_6;
SELECT lockfence.fence('f', 5);
ROLLBACK;
-- and of every fence
BEGIN;
SELECT lockfence.fence('f', 5), lockfence.fence('g', 6);
SELECT lockfence.raise_floor(100);
SELECT lockfence.try_fence('f', 5) AS f_5, lockfence.try_fence('g', 6) AS g_6,
       lockfence.try_fence('g', 100) AS g_100;
ROLLBACK;

-- a lease call that writes nothing leaves the transaction's fence as it
-- was (1.10; before, fenced_token() said NULL and the next protected
-- write without a token was refused, LF002): a release of a lease the
-- name does not have, and a try_acquire of the transaction's own held
-- lease
CREATE TABLE cache_nowrite (id int);
SELECT lockfence.protect('cache_nowrite', resource => 'nw');
BEGIN;
SELECT lockfence.fence('nw', 5);
SELECT lockfence.lease_release('nw', 5);
SELECT lockfence.fenced_token('nw');
INSERT INTO cache_nowrite VALUES (1);
ROLLBACK;
SELECT token AS nwl FROM lockfence.lease_acquire('nwl', '1 hour', 'h') \gset
BEGIN;
SELECT lockfence.fence('nwl', :nwl, 'h');
SELECT * FROM lockfence.lease_try_acquire('nwl', '1 hour', 'h2');
SELECT lockfence.fenced_token('nwl') = :nwl AS still_fenced;
ROLLBACK;
SELECT lockfence.unprotect('cache_nowrite');
DROP TABLE cache_nowrite;

-- forget_fenced() is for the extension's functions, not for PUBLIC
CREATE ROLE cache_app;
SET ROLE cache_app;
SELECT lockfence.forget_fenced();
RESET ROLE;
DROP ROLE cache_app;

-- end the leases still held (a drop refuses them, 55006: created again,
-- the extension would grant their tokens again)
SELECT lockfence.lease_release(resource, token) FROM lockfence.fences
 WHERE lease_expires_at IS NOT NULL \g /dev/null
DROP EXTENSION lockfence;
