-- lockfence leases: the uncontended path that updates the fence row
-- without SPI (lease_fastpath.c, fence_fastpath_update) must leave the
-- table exactly as the UPDATE statements would
CREATE EXTENSION lockfence;
\set VERBOSITY terse

-- A full page: the grant's new row version goes to another page (no HOT
-- update), so the primary key needs an entry for it, or the next lookup
-- through the index finds nothing.
INSERT INTO lockfence.fences (resource, token, accepted_at, holder, lease_expires_at, lease_ttl)
SELECT 'full-' || g, 1, now(), repeat('h', 255), '-infinity', '1 minute'
  FROM generate_series(1, 100) g;
SELECT ctid AS before FROM lockfence.fences WHERE resource = 'full-1' \gset
SELECT token FROM lockfence.lease_acquire('full-1', '1 minute', repeat('g', 255));
SELECT (ctid::text::point)[0] <> (:'before'::text::point)[0] AS moved_to_another_page
  FROM lockfence.fences WHERE resource = 'full-1';
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT token FROM lockfence.fences WHERE resource = 'full-1';
SELECT token, length(holder) FROM lockfence.fences WHERE resource = 'full-1';
-- renew and release find it (through the index) and update it again
SELECT lockfence.lease_renew('full-1', 2) > clock_timestamp() AS renewed;
SELECT lockfence.lease_release('full-1', 2);
SELECT token, lease_expires_at FROM lockfence.fences WHERE resource = 'full-1';
RESET enable_seqscan;
RESET enable_bitmapscan;
DELETE FROM lockfence.fences WHERE resource LIKE 'full-%';

-- The next token of the largest one is out of range: an error, never a
-- wrapped (negative) token.
SELECT lockfence.fence('top', 9223372036854775807);
SELECT token FROM lockfence.lease_acquire('top', '1 minute');
SELECT token FROM lockfence.fences WHERE resource = 'top';

-- A grant, renewal or release is visible to the rest of its statement (as
-- after an SPI statement).
SELECT lockfence.fence('same', (SELECT token FROM lockfence.lease_acquire('same', '1 minute', 'a')), 'a');
SELECT lockfence.lease_renew('same', 1) > clock_timestamp() AS renewed,
       lockfence.fence('same', 1, 'a');
SELECT lockfence.lease_release('same', 1), lockfence.fence('same', 1, 'a');
-- (that error rolled the release back)
SELECT lockfence.lease_release('same', 1);
SELECT lockfence.fence('same', (SELECT token FROM lockfence.lease_acquire('same', '1 minute', 'a')), 'a');

-- A table changed by its owner is updated by the statements: another
-- index (on the expiry) gets entries for every new version, and a trigger
-- fires for grant, renewal and release.
CREATE INDEX fences_expiry ON lockfence.fences (lease_expires_at);
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT resource FROM lockfence.fences WHERE lease_expires_at > '-infinity';
SELECT token FROM lockfence.lease_acquire('indexed', '1 minute');
SELECT lockfence.lease_renew('indexed', 1, '2 minutes') > clock_timestamp() AS renewed;
SELECT resource, token FROM lockfence.fences WHERE lease_expires_at > '-infinity' ORDER BY 1;
SELECT lockfence.lease_release('indexed', 1);
SELECT token FROM lockfence.lease_acquire('indexed', '1 minute');
SELECT resource, token FROM lockfence.fences WHERE lease_expires_at > '-infinity' ORDER BY 1;
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX lockfence.fences_expiry;

CREATE FUNCTION fences_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'fences %: % token % holder %', TG_OP, NEW.resource, NEW.token, NEW.holder;
    RETURN NEW;
END
$$;
CREATE TRIGGER fences_audit AFTER UPDATE ON lockfence.fences
    FOR EACH ROW EXECUTE FUNCTION fences_audit();
SELECT lockfence.lease_release('indexed', 2);
SELECT token FROM lockfence.lease_acquire('indexed', '1 minute', 'audited');
SELECT lockfence.lease_renew('indexed', 3) > clock_timestamp() AS renewed;
DROP TRIGGER fences_audit ON lockfence.fences;
DROP FUNCTION fences_audit();

-- An UPDATE of a table that publishes updates needs a replica identity:
-- the same error without the statement.
SET lockfence.allow_publish_fences = on;
SET client_min_messages = error;
CREATE PUBLICATION fences_pub FOR TABLE lockfence.fences;
RESET client_min_messages;
ALTER TABLE lockfence.fences REPLICA IDENTITY NOTHING;
SELECT lockfence.lease_release('indexed', 3);
SELECT lockfence.lease_renew('indexed', 3) > clock_timestamp() AS renewed;
ALTER TABLE lockfence.fences REPLICA IDENTITY DEFAULT;
SELECT lockfence.lease_release('indexed', 3);
DROP PUBLICATION fences_pub;
RESET lockfence.allow_publish_fences;

-- end the leases still held (a drop refuses them, 55006: created again,
-- the extension would grant their tokens again)
SELECT lockfence.lease_release(resource, token) FROM lockfence.fences
 WHERE lease_expires_at IS NOT NULL \g /dev/null
DROP EXTENSION lockfence;
