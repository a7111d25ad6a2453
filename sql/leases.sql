-- lockfence leases: lease locks whose token is the fence's token
CREATE EXTENSION lockfence;
\set VERBOSITY default

-- a first grant starts at token 1 and expires after the TTL
SELECT token, expires_at > clock_timestamp() AS unexpired,
       expires_at <= clock_timestamp() + interval '1 minute' AS within_ttl
  FROM lockfence.lease_acquire('job', '1 minute', 'worker-a');
SELECT resource, token, holder, lease_ttl, lease_expires_at IS NOT NULL AS leased
  FROM lockfence.fences;

-- the lease token is the fence's token: the holder fences and writes
BEGIN;
SELECT lockfence.fence('job', 1, 'worker-a');
SELECT lockfence.fence('job', 1);
-- another holder presenting it is refused
SELECT lockfence.fence('job', 1, 'worker-b');
ROLLBACK;

-- held: try_acquire gets NULLs, acquire with a short wait_timeout fails
SELECT * FROM lockfence.lease_try_acquire('job', '1 minute', 'worker-b');
-- (terse: the detail names the expiry time)
\set VERBOSITY terse
SELECT * FROM lockfence.lease_acquire('job', '1 minute', 'worker-b', wait_timeout => '50 ms');
SELECT * FROM lockfence.lease_acquire('job', '1 minute', 'worker-b', wait_timeout => '0');
\set VERBOSITY default

-- renew: a new expiry, with the granted TTL or a new one
SELECT lockfence.lease_renew('job', 1) > clock_timestamp() AS renewed;
SELECT lockfence.lease_renew('job', 1, '2 minutes') > clock_timestamp() + interval '1 minute' AS renewed_longer;
SELECT lease_ttl FROM lockfence.fences WHERE resource = 'job';
-- a token that is not the lease's
SELECT lockfence.lease_renew('job', 0);
SELECT lockfence.lease_renew('job', 7);
SELECT lockfence.lease_renew('nothing', 1);

-- release: the token can no longer be fenced (lock lost), renew fails
SELECT lockfence.lease_release('job', 0);
SELECT lockfence.lease_release('job', 1);
SELECT lockfence.lease_release('job', 1);
SELECT lockfence.fence('job', 1, 'worker-a');
SELECT lockfence.try_fence('job', 1);
SELECT lockfence.lease_renew('job', 1);
SELECT lease_expires_at FROM lockfence.fences WHERE resource = 'job';

-- the next grant has the next token, and the old one is stale
SELECT token FROM lockfence.lease_try_acquire('job', '1 minute', 'worker-b');
SELECT lockfence.fence('job', 1, 'worker-a');
SELECT lockfence.fence('job', 2, 'worker-b');

-- expiry: after the TTL, the token is lock lost and the lease is free
SELECT token FROM lockfence.lease_acquire('short', '100 ms', 'a');
SELECT pg_sleep(0.2);
\set VERBOSITY terse
SELECT lockfence.fence('short', 1, 'a');
SELECT lockfence.lease_renew('short', 1);
\set VERBOSITY default
SELECT lockfence.lease_release('short', 1);
SELECT token FROM lockfence.lease_acquire('short', '1 minute', 'b');
SELECT lockfence.lease_renew('short', 1);

-- a grant is above every token ever fenced for the name
SELECT lockfence.fence('etcd-fed', 1000, 'etcd');
SELECT token FROM lockfence.lease_acquire('etcd-fed', '1 minute');
-- a higher token from another lock service ends the lease (takes over)
SELECT lockfence.fence('etcd-fed', 2000, 'etcd');
SELECT lease_expires_at, lease_ttl FROM lockfence.fences WHERE resource = 'etcd-fed';
SELECT lockfence.lease_renew('etcd-fed', 1001);
SELECT lockfence.fence('etcd-fed', 2000, 'etcd');

-- a protected table: a lease token fenced in the transaction is the
-- writer's token; after release the write is refused
CREATE TABLE jobs (id int PRIMARY KEY, state text);
SELECT lockfence.protect('jobs', resource => 'jobs');
SELECT token FROM lockfence.lease_acquire('jobs', '1 minute', 'w');
BEGIN;
SELECT lockfence.fence('jobs', 1, 'w');
INSERT INTO jobs VALUES (1, 'new');
COMMIT;
SELECT lockfence.lease_release('jobs', 1);
BEGIN;
SELECT lockfence.fence('jobs', 1, 'w');
ROLLBACK;
UPDATE jobs SET state = 'done';

-- a row token of a released (or expired) lease is refused as such (LF003),
-- not as a token to fence first (LF002), which would fail the same way
CREATE TABLE tokened (id int, token bigint);
SELECT lockfence.protect('tokened', resource => 'jobs', token_column => 'token');
INSERT INTO tokened VALUES (1, 1);
DROP TABLE tokened;

-- bad arguments
SELECT * FROM lockfence.lease_acquire(NULL, '1 minute');
SELECT * FROM lockfence.lease_acquire('', '1 minute');
SELECT * FROM lockfence.lease_acquire(repeat('x', 256), '1 minute');
SELECT * FROM lockfence.lease_acquire('x', NULL);
SELECT * FROM lockfence.lease_acquire('x', '0');
SELECT * FROM lockfence.lease_acquire('x', '-1 second');
SELECT * FROM lockfence.lease_acquire('x', '1 minute', repeat('h', 256));
SELECT * FROM lockfence.lease_acquire('x', '1 minute', NULL, '-1 second');
SELECT lockfence.lease_renew('x', NULL);
SELECT lockfence.lease_renew('x', -1);
SELECT lockfence.lease_renew('job', 2, '0');
SELECT lockfence.lease_release(NULL, 1);

-- a TTL must give a later time than now, by the calendar: a year is 365
-- or 366 days, so this one is negative although its fields add up to
-- 12 hours when a month counts 30 days (22023)
SELECT * FROM lockfence.lease_acquire('x', '-1 year +360 days 12 hours');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lockfence.lease_try_acquire('x', '-1 year +360 days 12 hours');
SELECT lockfence.lease_renew('job', 2, '-1 year +360 days 12 hours');
-- a renewal with the lease's own ttl counts it by the calendar too: one
-- that gives no later time ('1 month -30 days' granted in December and
-- renewed in February; here a ttl no date gives a later time for) fails
-- (22023) and leaves the lease as it was
SELECT token AS cal_token FROM lockfence.lease_acquire('cal', '1 minute') \gset
UPDATE lockfence.fences SET lease_ttl = '1 month -31 days' WHERE resource = 'cal';
SELECT lockfence.lease_renew('cal', :cal_token);
\echo :LAST_ERROR_SQLSTATE
SELECT lease_expires_at > clock_timestamp() AS still_held, lease_ttl
  FROM lockfence.fences WHERE resource = 'cal';
SELECT lockfence.lease_renew('cal', :cal_token, '1 minute') > clock_timestamp() AS renewed;
SELECT lockfence.lease_release('cal', :cal_token);
-- and at most 100 years (22023, not a timestamp overflow)
SELECT * FROM lockfence.lease_acquire('x', '1000000 years');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lockfence.lease_acquire('x', '100 years 1 second');
SELECT * FROM lockfence.lease_acquire('x', '-178000000 years');
-- far enough back that adding it to now leaves a timestamp's range: still
-- "must be positive" (22023, not 22008)
SELECT * FROM lockfence.lease_acquire('x', '-9000 years');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lockfence.lease_try_acquire('x', '-6800 years -1 day');
SELECT lockfence.lease_renew('job', 2, '-9000 years');
-- fields beyond 1000 years that disagree in sign are refused as such,
-- whatever they add up to (this one is about 3 years)
SELECT * FROM lockfence.lease_acquire('x', make_interval(months => 200000, days => -6086300));
\echo :LAST_ERROR_SQLSTATE
SELECT lockfence.lease_renew('job', 2, '1000000 years');
SELECT token, expires_at > clock_timestamp() + interval '99 years' AS long
  FROM lockfence.lease_acquire('century', '100 years');
SELECT lockfence.lease_release('century', 1);

-- a name whose token is at the maximum cannot be granted (22003), by
-- either function, with or without a lease on it
SELECT lockfence.fence('top', 9223372036854775807);
SELECT * FROM lockfence.lease_try_acquire('top', '1 minute');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lockfence.lease_acquire('top', '1 minute');
SELECT count(*) FROM lockfence.fences WHERE resource = 'top' AND lease_expires_at IS NULL;

-- a grant, renewal or release is a write; the error names the function
BEGIN READ ONLY;
SELECT * FROM lockfence.lease_try_acquire('ro', '1 minute');
ROLLBACK;
BEGIN READ ONLY;
SELECT * FROM lockfence.lease_acquire('ro', '1 minute');
ROLLBACK;
BEGIN READ ONLY;
SELECT lockfence.lease_renew('job', 2);
ROLLBACK;
BEGIN READ ONLY;
SELECT lockfence.lease_release('job', 2);
ROLLBACK;

-- reset() of a name whose lease is held is refused (55006): the next
-- grant would start from the floor and could give the same token to
-- another holder; once released, the name can be reset
SELECT token AS rs_token FROM lockfence.lease_acquire('rs', '1 minute') \gset
\set VERBOSITY terse
SELECT lockfence.reset('rs');
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM lockfence.fences WHERE resource = 'rs';
SELECT lockfence.lease_release('rs', :rs_token);
SELECT lockfence.reset('rs');
SELECT count(*) FROM lockfence.fences WHERE resource = 'rs';

-- a rolled back grant leaves nothing
BEGIN;
SELECT token FROM lockfence.lease_acquire('rolled', '1 minute');
ROLLBACK;
SELECT count(*) FROM lockfence.fences WHERE resource = 'rolled';

-- who may call them: not PUBLIC, like fence() (lockfence.grant_usage() grants them)
SELECT p.oid::regprocedure, has_function_privilege('public', p.oid, 'EXECUTE') AS public
  FROM pg_proc p WHERE p.pronamespace = 'lockfence'::regnamespace
   AND p.proname LIKE 'lease%' ORDER BY 1;

DROP TABLE jobs;

-- end the leases still held (a drop refuses them, 55006: created again,
-- the extension would grant their tokens again)
SELECT lockfence.lease_release(resource, token) FROM lockfence.fences
 WHERE lease_expires_at IS NOT NULL \g /dev/null

-- dropping the extension while a lease is held is refused (55006), as
-- reset() of its name is: created again, it would grant the same token to
-- another holder within the lease; released, it drops
SELECT token AS dx_token FROM lockfence.lease_acquire('dx', '1 hour', 'a') \gset
\set VERBOSITY terse
DROP EXTENSION lockfence;
\echo :LAST_ERROR_SQLSTATE
DROP SCHEMA lockfence CASCADE;
\set VERBOSITY default
SELECT count(*) FROM lockfence.fences WHERE resource = 'dx' AND lease_expires_at > now();
SELECT lockfence.lease_release('dx', :dx_token);
DROP EXTENSION lockfence;
