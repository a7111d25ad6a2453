-- lockfence.fence_trigger(): fail-closed fencing of protected tables
CREATE EXTENSION lockfence;
\set VERBOSITY default

-- 1. a fixed resource, tokens from the transaction's fence
CREATE TABLE ledger (id int PRIMARY KEY, amount int);
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=ledger');
CREATE TRIGGER fence_truncate BEFORE TRUNCATE ON ledger
    FOR EACH STATEMENT EXECUTE FUNCTION lockfence.fence_trigger('resource=ledger');

-- no token: every kind of write is rejected
INSERT INTO ledger VALUES (1, 10);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
COPY ledger FROM stdin;
1	10
\.
TRUNCATE ledger;
SELECT count(*) FROM ledger;

-- with the transaction's fence, writes proceed
BEGIN;
SELECT lockfence.fence('ledger', 3);
INSERT INTO ledger VALUES (1, 10), (2, 20);
COPY ledger FROM stdin;
3	30
\.
UPDATE ledger SET amount = amount + 1 WHERE id = 1;
DELETE FROM ledger WHERE id = 2;
COMMIT;
SELECT * FROM ledger ORDER BY id;

-- each transaction must fence again
UPDATE ledger SET amount = 0;
DELETE FROM ledger;
-- a stale token cannot be used to write
BEGIN;
SELECT lockfence.fence('ledger', 2);
UPDATE ledger SET amount = 0;
ROLLBACK;
-- a fence rolled back with its savepoint no longer covers writes
BEGIN;
SAVEPOINT s;
SELECT lockfence.fence('ledger', 3);
ROLLBACK TO SAVEPOINT s;
UPDATE ledger SET amount = 0;
ROLLBACK;
-- ... but a released one does
BEGIN;
SAVEPOINT s;
SELECT lockfence.fence('ledger', 3);
RELEASE SAVEPOINT s;
UPDATE ledger SET amount = amount WHERE id = 1;
ROLLBACK;
-- TRUNCATE with the transaction's fence
BEGIN;
SELECT lockfence.fence('ledger', 4);
TRUNCATE ledger;
ROLLBACK;
SELECT count(*) FROM ledger;
-- a fence for another resource does not help
BEGIN;
SELECT lockfence.fence('other', 100);
DELETE FROM ledger;
ROLLBACK;

-- 2. a resource per row, tokens from a column (what an ORM can do)
CREATE TABLE accounts (
    id int PRIMARY KEY,
    tenant text,
    balance int,
    fence_token bigint,
    fenced_by text
);
SELECT lockfence.protect('accounts', resource_column => 'tenant',
                         resource_prefix => 'tenant:',
                         token_column => 'fence_token',
                         holder_column => 'fenced_by');
SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger
 WHERE tgrelid = 'accounts'::regclass ORDER BY tgname;

INSERT INTO accounts VALUES (1, 'acme', 100, 10, 'w1');
-- a later transaction presenting the token the fence records may have
-- copied it: it must fence it first
INSERT INTO accounts VALUES (2, 'acme', 100, 10, 'w1');
BEGIN;
SELECT lockfence.fence('tenant:acme', 10, 'w1');
INSERT INTO accounts VALUES (2, 'acme', 100, 10, 'w1');
COMMIT;
INSERT INTO accounts VALUES (3, 'initech', 100, 1, NULL);
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;
-- the token column counts only when the write changes it
UPDATE accounts SET balance = 0 WHERE id = 1;
UPDATE accounts SET balance = 50, fence_token = 10, fenced_by = 'w1' WHERE id = 1;
-- a stale token in the row is rejected
UPDATE accounts SET balance = 0, fence_token = 9 WHERE id = 1;
-- an equal token from another holder is rejected
INSERT INTO accounts VALUES (5, 'acme', 0, 10, 'w2');
-- a newer holder takes over; the old one is locked out
UPDATE accounts SET balance = 60, fence_token = 11, fenced_by = 'w2' WHERE tenant = 'acme';
UPDATE accounts SET balance = 0, fence_token = 10, fenced_by = 'w1' WHERE id = 2;
-- a NULL token in the row falls back to the transaction's fence
INSERT INTO accounts VALUES (4, 'acme', 1, NULL, NULL);
BEGIN;
SELECT lockfence.fence('tenant:acme', 11);
INSERT INTO accounts VALUES (4, 'acme', 1, NULL, NULL);
DELETE FROM accounts WHERE id = 4;
COMMIT;
-- deletes need the transaction's fence
DELETE FROM accounts WHERE id = 3;
BEGIN;
SELECT lockfence.fence('tenant:initech', 1);
DELETE FROM accounts WHERE id = 3;
COMMIT;
-- moving a row to another resource needs both fences
UPDATE accounts SET tenant = 'globex', fence_token = 1 WHERE id = 2;
BEGIN;
SELECT lockfence.fence('tenant:acme', 11, 'w2');
UPDATE accounts SET tenant = 'globex', fence_token = 1 WHERE id = 2;
COMMIT;
-- a NULL resource is rejected
UPDATE accounts SET tenant = NULL, fence_token = 1 WHERE id = 2;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- TRUNCATE cannot be fenced per row resource
TRUNCATE accounts;
-- INSERT ... ON CONFLICT DO UPDATE goes through the same checks
INSERT INTO accounts VALUES (1, 'acme', 70, 11, 'w2')
    ON CONFLICT (id) DO UPDATE SET balance = excluded.balance;
INSERT INTO accounts VALUES (1, 'acme', 70, 11, 'w2')
    ON CONFLICT (id) DO UPDATE SET balance = excluded.balance,
                                   fence_token = excluded.fence_token,
                                   fenced_by = excluded.fenced_by;
INSERT INTO accounts VALUES (1, 'acme', 70, 12, 'w2')
    ON CONFLICT (id) DO UPDATE SET balance = excluded.balance,
                                   fence_token = excluded.fence_token,
                                   fenced_by = excluded.fenced_by;
SELECT * FROM accounts ORDER BY id;
SELECT resource, token, holder FROM lockfence.fences ORDER BY resource;

-- a resource column of another type
CREATE TABLE shards (shard int PRIMARY KEY, v text, fence_token bigint);
SELECT lockfence.protect('shards', resource_column => 'shard',
                         token_column => 'fence_token');
INSERT INTO shards VALUES (7, 'x', 1);
SELECT lockfence.current_token('7');

-- a bulk write under one token
BEGIN;
SELECT lockfence.fence('ledger', 5);
INSERT INTO ledger SELECT g, g FROM generate_series(10, 5009) g;
UPDATE ledger SET amount = amount + 1;
COMMIT;
SELECT count(*), sum(amount) FROM ledger;

-- 3. misuse is reported when the trigger is created
CREATE TABLE misuse (id int, tok int, tok8 bigint);
CREATE TRIGGER t AFTER INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH STATEMENT EXECUTE FUNCTION lockfence.fence_trigger('resource=m');
CREATE TRIGGER t BEFORE INSERT OR UPDATE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m');
CREATE TRIGGER t BEFORE INSERT OR UPDATE OF tok OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m');
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW WHEN (true) EXECUTE FUNCTION lockfence.fence_trigger('resource=m');
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger();
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m', 'resource_column=id');
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m', 'resource=n');
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resourse=m');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('m');
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=');
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m', 'resource_prefix=p');
-- (1.10) a prefix that leaves no room for a name: refused when protecting,
-- not at every write (22001)
CREATE TABLE misuse_prefix (id int, tenant text);
SELECT lockfence.protect('misuse_prefix', resource_column => 'tenant',
                         resource_prefix => repeat('p', 255));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT lockfence.protect('misuse_prefix', resource_column => 'tenant',
                         resource_prefix => repeat('p', 254));
SELECT lockfence.unprotect('misuse_prefix');
DROP TABLE misuse_prefix;
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource_column=nope');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m', 'token_column=tok');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m', 'token_column=xmin');
SELECT count(*) FROM pg_trigger WHERE tgrelid = 'misuse'::regclass;

-- ... and, at the latest, at the first write after the table changed
-- (since 1.10 dropping a column the trigger names, or adding one under its
-- name, is refused at the ALTER, protect_ddl; here made with the event
-- triggers away)
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m', 'token_column=tok8');
ALTER TABLE misuse DROP COLUMN tok8;
ALTER EVENT TRIGGER lockfence_check_new_triggers DISABLE;
ALTER EVENT TRIGGER lockfence_forget_dropped_tables DISABLE;
ALTER TABLE misuse DROP COLUMN tok8;
INSERT INTO misuse VALUES (1, 1);
ALTER TABLE misuse ADD COLUMN tok8 int;
ALTER EVENT TRIGGER lockfence_forget_dropped_tables ENABLE ALWAYS;
ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE;
INSERT INTO misuse VALUES (1, 1, 1);
SELECT count(*) FROM misuse;

-- a trigger created while the event trigger is away is checked at the first write
ALTER EVENT TRIGGER lockfence_check_new_triggers DISABLE;
CREATE TRIGGER late AFTER INSERT ON misuse
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=m');
ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE;
DROP TRIGGER t ON misuse;
INSERT INTO misuse VALUES (2, 2, 2);
SELECT count(*) FROM misuse;

-- the function refuses to run outside the trigger manager
SELECT lockfence.fence_trigger();

-- other triggers are left alone by the event trigger
CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
CREATE TRIGGER noop AFTER INSERT ON misuse FOR EACH ROW EXECUTE FUNCTION noop();

-- the documented bypasses, for the record: they need table ownership or
-- superuser, and they are visible in the catalog
ALTER TABLE ledger DISABLE TRIGGER fence;
DELETE FROM ledger WHERE id = 10;
ALTER TABLE ledger ENABLE TRIGGER fence;
DELETE FROM ledger WHERE id = 11;

-- 4. what counts as a row token: an INSERT's non-NULL token, or an UPDATE
-- that changes the token.  An unchanged token presents nothing, whatever
-- the statement; a token equal to the fence counts only if this
-- transaction fenced it (otherwise it may be a copy).
CREATE TABLE macct (id int PRIMARY KEY, res text, tok bigint, data text);
SELECT lockfence.protect('macct', resource_column => 'res', token_column => 'tok');
INSERT INTO macct VALUES (1, 'm1', 20, 'a'), (2, 'm1', 20, 'b');
\c
-- the MERGE itself loads the library in this session
MERGE INTO macct a USING (VALUES (2)) s(id) ON a.id = s.id
    WHEN MATCHED AND false THEN UPDATE SET tok = 10
    WHEN MATCHED THEN UPDATE SET data = 'stale merge';
\echo :LAST_ERROR_SQLSTATE
MERGE INTO macct a USING (VALUES (2)) s(id) ON a.id = s.id
    WHEN MATCHED AND false THEN UPDATE SET tok = 10
    WHEN MATCHED THEN UPDATE SET data = 'stale merge';
\echo :LAST_ERROR_SQLSTATE
-- a MERGE action that writes a new token is fenced with it
MERGE INTO macct a USING (VALUES (2)) s(id) ON a.id = s.id
    WHEN MATCHED THEN UPDATE SET data = 'newer holder', tok = 21;
-- (a MERGE presenting the row's old token cannot prove it wrote it)
MERGE INTO macct a USING (VALUES (1)) s(id) ON a.id = s.id
    WHEN MATCHED THEN UPDATE SET data = 'stale', tok = 20;
\echo :LAST_ERROR_SQLSTATE
-- one that keeps the token needs the transaction's fence
MERGE INTO macct a USING (VALUES (2)) s(id) ON a.id = s.id
    WHEN MATCHED THEN UPDATE SET data = 'same token', tok = 21;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT lockfence.fence('m1', 21);
MERGE INTO macct a USING (VALUES (2)) s(id) ON a.id = s.id
    WHEN MATCHED THEN UPDATE SET data = 'same token, fenced', tok = 21;
COMMIT;
\c
-- a plain UPDATE, as the first statement of a session, that changes the
-- token to the fence's (here row 2's token) needs the transaction's fence
UPDATE macct SET data = 'plain update', tok = 21 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM macct ORDER BY id;

-- an UPDATE inside WITH: a higher token counts, an unchanged one needs the
-- transaction's fence
WITH u AS (UPDATE macct SET data = 'cte', tok = 22 WHERE id = 1 RETURNING tok)
SELECT tok FROM u;
WITH u AS (UPDATE macct SET data = 'cte again', tok = 22 WHERE id = 1 RETURNING tok)
SELECT tok FROM u;
\echo :LAST_ERROR_SQLSTATE
SELECT lockfence.current_token('m1');

-- the decision does not depend on when the library was loaded: here a
-- MERGE nested in a function called by an INSERT loads it (the INSERT's
-- portal says nothing about the MERGE), and its unchanged token presents
-- nothing, before and after the library is loaded
CREATE TABLE mrow (id int PRIMARY KEY, tok bigint, v int);
SELECT lockfence.protect('mrow', resource => 'mres', token_column => 'tok');
INSERT INTO mrow VALUES (1, 50, 0);
CREATE TABLE side (a int, b int);
CREATE FUNCTION do_merge() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    MERGE INTO mrow m USING (VALUES (1)) s(id) ON m.id = s.id
        WHEN MATCHED AND false THEN UPDATE SET tok = 51
        WHEN MATCHED THEN UPDATE SET v = 666;
    RETURN 1;
END
$$;
\c
INSERT INTO side SELECT do_merge(), do_merge();
\echo :LAST_ERROR_SQLSTATE
INSERT INTO side SELECT do_merge(), do_merge();
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM mrow;
SELECT count(*) FROM side;

-- carried-over tokens (an ORM that loads a row and saves every column,
-- INSERT ... SELECT of the token column, a subquery reading another row's
-- token) are refused unless this transaction fenced the token
CREATE TABLE orm (id int PRIMARY KEY, tok bigint, who text, v int);
SELECT lockfence.protect('orm', resource => 'orm', token_column => 'tok',
                         holder_column => 'who');
INSERT INTO orm VALUES (1, 30, NULL, 1);
INSERT INTO orm VALUES (2, 31, NULL, 2);
BEGIN;
SELECT lockfence.fence('orm', 31);
INSERT INTO orm VALUES (3, NULL, NULL, 3);
COMMIT;
SELECT lockfence.current_token('orm');
UPDATE orm SET v = 666, tok = tok WHERE id = 2;
\echo :LAST_ERROR_SQLSTATE
INSERT INTO orm SELECT id + 10, tok, who, 666 FROM orm WHERE id = 2;
\echo :LAST_ERROR_SQLSTATE
UPDATE orm SET v = 666, tok = (SELECT max(tok) FROM orm) WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
UPDATE orm SET v = 666, tok = (SELECT max(tok) FROM orm) WHERE id = 3;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM orm ORDER BY id;
-- the same writes, after fence() in the same transaction
BEGIN;
SELECT lockfence.fence('orm', 31);
UPDATE orm SET v = 666, tok = tok WHERE id = 2;
INSERT INTO orm SELECT id + 10, tok, who, 666 FROM orm WHERE id = 2;
UPDATE orm SET v = 666, tok = (SELECT max(tok) FROM orm) WHERE id IN (1, 3);
COMMIT;
SELECT * FROM orm ORDER BY id;
-- a holder writes the same row many times in one transaction: one fence(),
-- then every write is answered from the transaction's cache
BEGIN;
SELECT lockfence.fence('orm', 31);
DO $$
BEGIN
    FOR i IN 1..200 LOOP
        UPDATE orm SET v = v + 1, tok = 31 WHERE id = 1;
        UPDATE orm SET v = v + 1 WHERE id = 2;
    END LOOP;
END
$$;
COMMIT;
SELECT id, v FROM orm WHERE id IN (1, 2) ORDER BY id;
-- a higher token advances the fence without fence(), and the transaction's
-- later rows may present it again
BEGIN;
UPDATE orm SET tok = 32 WHERE id = 1;
UPDATE orm SET tok = 32 WHERE id = 2;
INSERT INTO orm VALUES (4, 32, NULL, 4);
COMMIT;
SELECT lockfence.current_token('orm');
-- a lower one is stale
UPDATE orm SET tok = 31 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
INSERT INTO orm VALUES (5, 5, NULL, 5);
\echo :LAST_ERROR_SQLSTATE
-- a savepoint rolled back forgets a fence established inside it, by a row
-- or by fence()
BEGIN;
SAVEPOINT s;
UPDATE orm SET tok = 33 WHERE id = 1;
ROLLBACK TO SAVEPOINT s;
INSERT INTO orm VALUES (5, 32, NULL, 5);
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT lockfence.fence('orm', 32);
ROLLBACK TO SAVEPOINT s;
INSERT INTO orm VALUES (5, 32, NULL, 5);
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT lockfence.fence('orm', 32);
RELEASE SAVEPOINT s;
INSERT INTO orm VALUES (5, 32, NULL, 5);
COMMIT;
-- holders: an equal token from another holder is a conflict (LF001), from
-- the same holder a possible copy (LF002)
INSERT INTO orm VALUES (6, 40, 'h1', 6);
INSERT INTO orm VALUES (7, 40, 'h2', 7);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO orm VALUES (7, 40, 'h1', 7);
\echo :LAST_ERROR_SQLSTATE
-- holder names are limited like resource names
INSERT INTO orm VALUES (8, 41, repeat('h', 256), 8);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO orm VALUES (8, 41, repeat('h', 255), 8);
SELECT resource, token, length(holder) FROM lockfence.fences WHERE resource = 'orm';

-- 5. columns that cannot serve
CREATE TABLE ev (day timestamptz, tok bigint, v int);
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON ev
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource_column=day', 'token_column=tok');
\echo :LAST_ERROR_SQLSTATE
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON ev
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=ev', 'holder_column=day');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE gen (t_in bigint, tok bigint GENERATED ALWAYS AS (t_in) STORED);
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON gen
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=gen', 'token_column=tok');
\echo :LAST_ERROR_SQLSTATE
CREATE DOMAIN tenant_id AS varchar(20);
CREATE TABLE dom (tenant tenant_id, tok bigint);
SELECT lockfence.protect('dom', resource_column => 'tenant', token_column => 'tok');
INSERT INTO dom VALUES ('d1', 1);
SELECT lockfence.current_token('d1');

-- 6. partitions get the TRUNCATE trigger too (statement triggers are not
-- cloned), now and later; children by plain inheritance are refused
CREATE TABLE pt (id int, v int) PARTITION BY RANGE (id);
CREATE TABLE pt1 PARTITION OF pt FOR VALUES FROM (0) TO (10);
CREATE TABLE pt2 PARTITION OF pt FOR VALUES FROM (10) TO (20) PARTITION BY RANGE (id);
CREATE TABLE pt2a PARTITION OF pt2 FOR VALUES FROM (10) TO (15);
SELECT lockfence.protect('pt', resource => 'pres');
CREATE TABLE pt3 PARTITION OF pt FOR VALUES FROM (20) TO (30);
CREATE TABLE pt2b (id int, v int);
ALTER TABLE pt2 ATTACH PARTITION pt2b FOR VALUES FROM (15) TO (20);
SELECT tgrelid::regclass, tgname FROM pg_trigger
 WHERE tgname LIKE 'zz_lockfence%' AND tgrelid::regclass::text LIKE 'pt%'
 ORDER BY tgrelid::regclass::text, tgname;
INSERT INTO pt1 VALUES (1, 1);
TRUNCATE pt1;
TRUNCATE pt2b;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT lockfence.fence('pres', 1);
INSERT INTO pt VALUES (1, 1), (16, 1), (25, 1);
TRUNCATE pt1, pt2b;
COMMIT;
SELECT * FROM pt ORDER BY id;
CREATE TABLE parent (id int, v int);
SELECT lockfence.protect('parent', resource => 'inh');
CREATE TABLE child () INHERITS (parent);
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE child2 (id int, v int);
ALTER TABLE child2 INHERIT parent;
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE p2 (id int);
CREATE TABLE c2 () INHERITS (p2);
SELECT lockfence.protect('p2', resource => 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pg_trigger WHERE tgrelid = 'p2'::regclass;
-- fence() in the write itself: the SET list and VALUES are evaluated
-- before the row trigger, so one statement fences and writes.
CREATE TABLE inline_w (id int PRIMARY KEY, res text, v int, tok bigint);
SELECT lockfence.protect('inline_w', resource_column => 'res',
                         token_column => 'tok');
INSERT INTO inline_w VALUES (1, 'inl', 0, lockfence.fence('inl', 5));
UPDATE inline_w SET v = v + 1, tok = lockfence.fence('inl', 5) WHERE id = 1;
UPDATE inline_w SET v = v + 1, tok = lockfence.fence('inl', 6) WHERE id = 1;
-- a stale token raises before the row is written
UPDATE inline_w SET v = 100, tok = lockfence.fence('inl', 5) WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
-- the same token without the call is a copy: refused
UPDATE inline_w SET v = 100, tok = 6 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
-- no row matches: nothing is fenced, nothing written
UPDATE inline_w SET v = 100, tok = lockfence.fence('inl', 7) WHERE id = 2;
SELECT lockfence.current_token('inl');
SELECT id, v, tok FROM inline_w;
-- 7. a BEFORE ROW trigger that fires after lockfence's (name order) could
-- change a row the fence has checked: every write is refused until it is
-- renamed to fire before, where the fence judges the row it leaves.
CREATE TABLE late_t (id int PRIMARY KEY, tenant text, v int);
SELECT lockfence.protect('late_t', resource_column => 'tenant');
CREATE FUNCTION retarget() RETURNS trigger LANGUAGE plpgsql
  AS $$BEGIN NEW.tenant := 'victim'; RETURN NEW; END$$;
CREATE TRIGGER zzz_retarget BEFORE INSERT OR UPDATE ON late_t
  FOR EACH ROW EXECUTE FUNCTION retarget();
BEGIN;
SELECT lockfence.fence('attacker', 1);
INSERT INTO late_t VALUES (1, 'attacker', 0);
ROLLBACK;
-- also when it fires only with a WHEN condition; not when disabled
ALTER TABLE late_t DISABLE TRIGGER zzz_retarget;
BEGIN;
SELECT lockfence.fence('attacker', 1);
INSERT INTO late_t VALUES (1, 'attacker', 0);
COMMIT;
ALTER TABLE late_t ENABLE TRIGGER zzz_retarget;
DROP TRIGGER zzz_retarget ON late_t;
CREATE TRIGGER zzz_when BEFORE UPDATE ON late_t
  FOR EACH ROW WHEN (OLD.v = 42) EXECUTE FUNCTION retarget();
BEGIN;
SELECT lockfence.fence('attacker', 1);
UPDATE late_t SET v = 1 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TRIGGER zzz_when ON late_t;
-- lockfence.check() reports it
CREATE TRIGGER zzz_retarget BEFORE INSERT OR UPDATE ON late_t
  FOR EACH ROW EXECUTE FUNCTION retarget();
SELECT severity, finding, detail FROM lockfence.check()
 WHERE finding = 'trigger_invalid' AND detail LIKE '%late_t%';
-- a BEFORE DELETE trigger cannot change a row: allowed
DROP TRIGGER zzz_retarget ON late_t;
CREATE TRIGGER zzz_del BEFORE DELETE ON late_t
  FOR EACH ROW EXECUTE FUNCTION retarget();
BEGIN;
SELECT lockfence.fence('attacker', 1);
UPDATE late_t SET v = 2 WHERE id = 1;
COMMIT;
DROP TRIGGER zzz_del ON late_t;
-- renamed to fire first: the fence judges the retargeted row, for which
-- this transaction holds no token
CREATE TRIGGER a_retarget BEFORE INSERT OR UPDATE ON late_t
  FOR EACH ROW EXECUTE FUNCTION retarget();
BEGIN;
SELECT lockfence.fence('attacker', 1);
INSERT INTO late_t VALUES (2, 'attacker', 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT id, tenant, v FROM late_t ORDER BY id;

-- 8. an UPDATE that moves a row to another partition (a DELETE and an
-- INSERT to PostgreSQL) is one write: the moved row presents its token
-- only if the UPDATE changed it.  A holder moving its own row with an
-- older token in it is not refused as stale; a row moving to another
-- resource does not raise that resource's fence to its old token; a
-- changed token is still presented; without a fence the move is refused
CREATE TABLE acc (id int, region int, tenant text, tok bigint)
  PARTITION BY LIST (region);
CREATE TABLE acc1 PARTITION OF acc FOR VALUES IN (1);
CREATE TABLE acc2 PARTITION OF acc FOR VALUES IN (2);
SELECT lockfence.protect('acc', resource_column => 'tenant', token_column => 'tok');
INSERT INTO acc VALUES (1, 1, 'mv_a', 11), (2, 1, 'mv_a', 11);
BEGIN;
SELECT lockfence.fence('mv_a', 12);
UPDATE acc SET region = 2 WHERE id = 1;
COMMIT;
SELECT tableoid::regclass, id, tenant, tok FROM acc ORDER BY id;
SELECT lockfence.fence('mv_b', 5);
BEGIN;
SELECT lockfence.fence('mv_a', 12), lockfence.fence('mv_b', 5);
UPDATE acc SET region = 2, tenant = 'mv_b' WHERE id = 2;
COMMIT;
SELECT tableoid::regclass, id, tenant, tok FROM acc ORDER BY id;
SELECT lockfence.current_token('mv_b');
BEGIN;
UPDATE acc SET region = 1, tok = 13 WHERE id = 1;
COMMIT;
SELECT tableoid::regclass, id, tenant, tok FROM acc ORDER BY id;
SELECT lockfence.current_token('mv_a');
UPDATE acc SET region = 2 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
-- an INSERT into another partition of a row with the same resource and
-- token, in the statement after an UPDATE that did not move its row, is
-- an INSERT: its token is presented and advances the fence
BEGIN;
SELECT lockfence.fence('mv_b', 5);
UPDATE acc SET tenant = tenant WHERE id = 2;
INSERT INTO acc VALUES (4, 1, 'mv_b', 11);
SELECT lockfence.current_token('mv_b');
ROLLBACK;
-- so is one in the same statement (no DELETE of the row in between)
BEGIN;
SELECT lockfence.fence('mv_b', 5);
WITH u AS (UPDATE acc SET tenant = tenant WHERE id = 2 RETURNING 1)
INSERT INTO acc SELECT 4, 1, 'mv_b', 11 FROM u;
SELECT lockfence.current_token('mv_b');
ROLLBACK;
DROP TABLE acc;

-- 9. the event trigger sees the tables CREATE SCHEMA creates (a partition
-- gets the TRUNCATE trigger, a child by inheritance is refused) and
-- ALTER FOREIGN TABLE ... INHERIT of a protected table (refused)
CREATE TABLE sp (id int, k int) PARTITION BY RANGE (k);
SELECT lockfence.protect('sp', resource => 'sp');
CREATE SCHEMA sp_s CREATE TABLE sp3 PARTITION OF public.sp FOR VALUES FROM (20) TO (30);
SELECT tgname FROM pg_trigger WHERE tgrelid = 'sp_s.sp3'::regclass ORDER BY 1;
TRUNCATE sp_s.sp3;
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE sp_plain (id int, v int);
SELECT lockfence.protect('sp_plain', resource => 'sp_plain');
CREATE SCHEMA sp_s2 CREATE TABLE c2 () INHERITS (public.sp_plain);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pg_namespace WHERE nspname = 'sp_s2';
CREATE FOREIGN DATA WRAPPER regress_lf_fdw;
CREATE SERVER regress_lf_srv FOREIGN DATA WRAPPER regress_lf_fdw;
CREATE FOREIGN TABLE sp_ft (id int, v int) SERVER regress_lf_srv;
ALTER FOREIGN TABLE sp_ft INHERIT sp_plain;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pg_inherits WHERE inhparent = 'sp_plain'::regclass;
-- (1.12) a foreign table cannot be protected: it can have no TRUNCATE
-- trigger (a wrapper may forward TRUNCATE), so protect() and a lockfence
-- row trigger made by hand are refused
SELECT lockfence.protect('sp_ft', resource => 'sp_ft');
\echo :LAST_ERROR_SQLSTATE
CREATE TRIGGER zz_fence BEFORE INSERT OR UPDATE OR DELETE ON sp_ft
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=sp_ft');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pg_trigger WHERE tgrelid = 'sp_ft'::regclass;
DROP FOREIGN TABLE sp_ft;
DROP SERVER regress_lf_srv;
DROP FOREIGN DATA WRAPPER regress_lf_fdw;
DROP SCHEMA sp_s CASCADE;
DROP TABLE sp, sp_plain;

-- check_trigger() judges lockfence's triggers only: another trigger is
-- named as such, not reported as a misdefined fence
CREATE TABLE ct_other (id int);
CREATE FUNCTION ct_noop() RETURNS trigger LANGUAGE plpgsql
AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER ct_instead AFTER INSERT ON ct_other
FOR EACH ROW EXECUTE FUNCTION ct_noop();
SELECT lockfence.check_trigger(oid) FROM pg_trigger WHERE tgname = 'ct_instead';
\echo :LAST_ERROR_SQLSTATE
-- a trigger that no longer exists is nothing to judge
SELECT lockfence.check_trigger(0);
DROP TABLE ct_other;
DROP FUNCTION ct_noop();

-- a session that keeps creating and dropping protected tables does not
-- keep a configuration per dropped trigger: the stale ones are removed
-- when the transaction ends
SELECT count(*) AS configs_before FROM pg_backend_memory_contexts
 WHERE name = 'lockfence trigger configuration' \gset
DO $$
BEGIN
  PERFORM lockfence.fence('tc_churn', 1);
  FOR i IN 1..30 LOOP
    CREATE TEMP TABLE tc_churn (id int);
    PERFORM lockfence.protect('tc_churn', resource => 'tc_churn');
    INSERT INTO tc_churn VALUES (i);
    DROP TABLE tc_churn;
  END LOOP;
END $$;
SELECT count(*) - :configs_before <= 2 AS few_new_configurations
  FROM pg_backend_memory_contexts
 WHERE name = 'lockfence trigger configuration';
