-- the shape of lockfence.fences (issue 17, item 6): fences and leases are
-- read and written without statements only while the table is exactly as
-- installed; otherwise the statements run and the executor enforces what
-- the table's owner changed.  Each change is rolled back afterwards.
CREATE EXTENSION lockfence;
\set VERBOSITY default

-- the outcome of a statement: its result, or its SQLSTATE and message
CREATE FUNCTION outcome(p_sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    result text;
BEGIN
    EXECUTE p_sql INTO result;
    RETURN coalesce(result, 'null');
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- as installed
SELECT lockfence.fences_table_problem();
-- the verdict does not depend on the caller's search_path
BEGIN;
CREATE FUNCTION public.octet_length(text) RETURNS int LANGUAGE sql AS 'SELECT 0';
SET LOCAL search_path = public, pg_catalog;
ALTER TABLE lockfence.fences SET (fillfactor = 100);
SELECT lockfence.fences_table_problem();
ROLLBACK;

-- holder dropped and added again: the holder is read and written by name
BEGIN;
ALTER TABLE lockfence.fences DROP COLUMN holder;
ALTER TABLE lockfence.fences ADD COLUMN holder text;
SELECT lockfence.fences_table_problem();
SELECT lockfence.fence('r', 5, 'worker-a');
SELECT outcome($$SELECT lockfence.fence('r', 5, 'worker-b')$$);
SELECT token FROM lockfence.lease_acquire('l', '1 hour', 'h1');
SELECT lockfence.lease_release('l', 1);
SELECT token FROM lockfence.lease_acquire('l', '1 hour', 'h2');
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;
ROLLBACK;
SELECT lockfence.fences_table_problem();

-- holder NOT NULL
BEGIN;
ALTER TABLE lockfence.fences ALTER COLUMN holder SET NOT NULL;
SELECT lockfence.fences_table_problem();
SELECT outcome($$SELECT lockfence.fence('n', 1)$$);
SELECT token FROM lockfence.lease_acquire('n', '1 hour', 'h1');
SELECT lockfence.lease_release('n', 1);
SELECT outcome($$SELECT token FROM lockfence.lease_acquire('n', '1 hour')$$);
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;
ROLLBACK;

-- the token's CHECK constraint replaced by CHECK (token < 3)
BEGIN;
ALTER TABLE lockfence.fences DROP CONSTRAINT fences_token_check,
    ADD CONSTRAINT fences_token_check CHECK (token < 3);
SELECT lockfence.fences_table_problem();
SELECT token FROM lockfence.lease_acquire('c', '1 hour');
SELECT lockfence.lease_release('c', 1);
SELECT token FROM lockfence.lease_acquire('c', '1 hour');
SELECT lockfence.lease_release('c', 2);
SELECT outcome($$SELECT token FROM lockfence.lease_acquire('c', '1 hour')$$);
SELECT outcome($$SELECT lockfence.fence('c', 5)$$);
SELECT resource, token FROM lockfence.fences ORDER BY resource;
ROLLBACK;

-- holder varchar(8)
BEGIN;
ALTER TABLE lockfence.fences ALTER COLUMN holder TYPE varchar(8);
SELECT lockfence.fences_table_problem();
SELECT token FROM lockfence.lease_acquire('v', '1 hour', 'short');
SELECT lockfence.lease_release('v', 1);
SELECT outcome($$SELECT token FROM lockfence.lease_acquire('v', '1 hour', 'much-too-long')$$);
SELECT outcome($$SELECT lockfence.fence('w', 1, 'much-too-long')$$);
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;
ROLLBACK;

-- a trigger: it fires for every write
BEGIN;
CREATE TABLE fences_audit (op text, resource text, token bigint, holder text);
CREATE FUNCTION fences_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fences_audit VALUES (TG_OP, NEW.resource, NEW.token, NEW.holder);
    RETURN NEW;
END
$$;
CREATE TRIGGER fences_audit AFTER INSERT OR UPDATE ON lockfence.fences
    FOR EACH ROW EXECUTE FUNCTION fences_audit();
SELECT lockfence.fences_table_problem();
SELECT token FROM lockfence.lease_acquire('t', '1 hour', 'h1');
SELECT lockfence.lease_release('t', 1);
SELECT token FROM lockfence.lease_acquire('t', '1 hour', 'h2');
SELECT lockfence.fence('t', 7, 'h3');
SELECT * FROM fences_audit;
ROLLBACK;

-- a rule: it applies to every update; a first fence or lease (INSERT ...
-- ON CONFLICT) is refused by the executor
BEGIN;
SELECT token FROM lockfence.lease_acquire('u', '1 hour', 'h1');
CREATE TABLE fences_audit (resource text, token bigint, holder text);
CREATE RULE fences_audit AS ON UPDATE TO lockfence.fences
    DO ALSO INSERT INTO fences_audit VALUES (NEW.resource, NEW.token, NEW.holder);
SELECT lockfence.fences_table_problem();
SELECT lockfence.lease_release('u', 1);
SELECT token FROM lockfence.lease_acquire('u', '1 hour', 'h2');
SELECT lockfence.fence('u', 7, 'h3');
SELECT * FROM fences_audit;
SELECT outcome($$SELECT lockfence.fence('new', 1)$$);
ROLLBACK;

-- another index: it is kept up to date
BEGIN;
CREATE INDEX fences_holder ON lockfence.fences (holder);
SELECT lockfence.fences_table_problem();
SELECT token FROM lockfence.lease_acquire('i', '1 hour', 'h1');
SELECT lockfence.lease_release('i', 1);
SELECT token FROM lockfence.lease_acquire('i', '1 hour', 'h2');
SET LOCAL enable_seqscan = off;
SELECT resource, token FROM lockfence.fences WHERE holder = 'h2';
ROLLBACK;

-- row-level security
BEGIN;
ALTER TABLE lockfence.fences ENABLE ROW LEVEL SECURITY;
SELECT lockfence.fences_table_problem();
SELECT lockfence.fence('s', 5, 'h1');
SELECT outcome($$SELECT lockfence.fence('s', 5, 'h2')$$);
SELECT token FROM lockfence.lease_acquire('s2', '1 hour', 'h1');
SELECT lockfence.lease_release('s2', 1);
SELECT token FROM lockfence.lease_acquire('s2', '1 hour', 'h2');
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;
ROLLBACK;

-- other changes are named too
BEGIN;
ALTER TABLE lockfence.fences ADD COLUMN note text;
SELECT lockfence.fences_table_problem();
ROLLBACK;
BEGIN;
ALTER TABLE lockfence.fences ALTER COLUMN accepted_at SET DEFAULT now();
SELECT lockfence.fences_table_problem();
ROLLBACK;
BEGIN;
ALTER TABLE lockfence.fences ADD CONSTRAINT fences_holder_key UNIQUE (holder);
SELECT lockfence.fences_table_problem();
ROLLBACK;
BEGIN;
CREATE TABLE fences_child () INHERITS (lockfence.fences);
SELECT lockfence.fences_table_problem();
ROLLBACK;
BEGIN;
ALTER TABLE lockfence.fences SET UNLOGGED;
SELECT lockfence.fences_table_problem();
ROLLBACK;

-- all rolled back: the table is as installed again, and the leases and
-- fences written directly again
SELECT lockfence.fences_table_problem();
SELECT token FROM lockfence.lease_acquire('l', '1 hour', 'h1');
SELECT lockfence.lease_release('l', 1);
SELECT token FROM lockfence.lease_acquire('l', '1 hour', 'h2');
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;

-- the verdict does not depend on the session's quote_all_identifiers (a
-- new session, whose first look at the table is made with it on)
\c
SET quote_all_identifiers = on;
SELECT lockfence.fences_table_problem();
RESET quote_all_identifiers;

DROP FUNCTION outcome(text);
-- end the leases still held (a drop refuses them, 55006: created again,
-- the extension would grant their tokens again)
SELECT lockfence.lease_release(resource, token) FROM lockfence.fences
 WHERE lease_expires_at IS NOT NULL \g /dev/null
DROP EXTENSION lockfence;
