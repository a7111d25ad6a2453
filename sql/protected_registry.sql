-- lockfence.protected_tables: the tables lockfence remembers as protected,
-- dumped with the data, so that check() reports a table restored without
-- its triggers (a data-only restore, or one without post-data) (issue 17,
-- item 10)
CREATE EXTENSION lockfence;
\set VERBOSITY default
\set SHOW_CONTEXT never

-- 1. protect() remembers the table, and check() is clean
CREATE TABLE reg (id int, tok bigint);
SELECT lockfence.protect('reg', resource => 'reg', token_column => 'tok');
SELECT tbl FROM lockfence.protected_tables ORDER BY 1::text;
SELECT finding FROM lockfence.check() WHERE severity = 'error';

-- 2. the table loses its triggers as a restore without post-data leaves
-- it: check() reports it, and a tokenless write is accepted (nothing fires)
DROP TRIGGER zz_lockfence_fence ON reg;
DROP TRIGGER zz_lockfence_fence_truncate ON reg;
SELECT tbl FROM lockfence.protected_tables ORDER BY 1::text;
\x on
SELECT severity, finding, detail, hint FROM lockfence.check() WHERE severity = 'error';
\x off
INSERT INTO reg VALUES (1, NULL);
-- only one trigger gone is reported as before, not twice
SELECT lockfence.protect('reg', resource => 'reg', token_column => 'tok');
DROP TRIGGER zz_lockfence_fence ON reg;
SELECT finding FROM lockfence.check() WHERE severity = 'error';
DROP TRIGGER zz_lockfence_fence_truncate ON reg;
-- ... a disabled one too
SELECT lockfence.protect('reg', resource => 'reg', token_column => 'tok');
ALTER TABLE reg DISABLE TRIGGER zz_lockfence_fence;
SELECT finding FROM lockfence.check() WHERE severity = 'error';
ALTER TABLE reg ENABLE TRIGGER zz_lockfence_fence;

-- 3. protected again: the write is refused, one row, check() clean
INSERT INTO reg VALUES (2, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM lockfence.protected_tables;
SELECT finding FROM lockfence.check() WHERE severity = 'error';

-- 4. unprotect() forgets the table; a trigger created by hand is
-- remembered; DROP TABLE forgets the table
SELECT lockfence.unprotect('reg');
SELECT count(*) FROM lockfence.protected_tables;
CREATE TRIGGER by_hand BEFORE INSERT OR UPDATE OR DELETE ON reg
    FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=reg');
SELECT tbl FROM lockfence.protected_tables ORDER BY 1::text;
DROP TABLE reg;
SELECT count(*) FROM lockfence.protected_tables;
-- (the OID no longer names a table: nothing left to report)
SELECT finding FROM lockfence.check() WHERE severity = 'error';

-- 5. a partitioned table is remembered, not its partitions (their row
-- triggers are the parent's); DROP SCHEMA ... CASCADE forgets it
CREATE SCHEMA regs;
CREATE TABLE regs.pt (id int) PARTITION BY LIST (id);
CREATE TABLE regs.pt1 PARTITION OF regs.pt FOR VALUES IN (1);
SELECT lockfence.protect('regs.pt', resource => 'pt');
SELECT tbl FROM lockfence.protected_tables ORDER BY 1::text;
DROP SCHEMA regs CASCADE;
SELECT count(*) FROM lockfence.protected_tables;

-- 6. a temporary table is not remembered (it is dropped at the end of the
-- session without event triggers, and never dumped)
CREATE TEMP TABLE tmp_reg (id int);
SELECT lockfence.protect('tmp_reg', resource => 'tmp');
SELECT count(*) FROM lockfence.protected_tables;
DROP TABLE tmp_reg;

-- 7. privileges: a table's owner protects it without owning the registry,
-- which nobody else writes; remember_protection() records only what is
-- true, and only the owner makes lockfence forget a table that lost its
-- triggers
CREATE ROLE regress_reg_owner;
CREATE ROLE regress_reg_other;
GRANT CREATE ON SCHEMA public TO regress_reg_owner;
SET ROLE regress_reg_owner;
CREATE TABLE owned (id int);
SELECT lockfence.protect('owned', resource => 'owned');
SELECT tbl FROM lockfence.protected_tables ORDER BY 1::text;
INSERT INTO lockfence.protected_tables VALUES ('owned');
\echo :LAST_ERROR_SQLSTATE
DELETE FROM lockfence.protected_tables;
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE plain (id int);
SELECT lockfence.remember_protection('plain'::regclass, true);
SELECT tbl FROM lockfence.protected_tables ORDER BY 1::text;
RESET ROLE;
DROP TRIGGER zz_lockfence_fence ON owned;
DROP TRIGGER zz_lockfence_fence_truncate ON owned;
SET ROLE regress_reg_other;
SELECT lockfence.unprotect('owned');
\echo :LAST_ERROR_SQLSTATE
SELECT lockfence.remember_protection('owned'::regclass, false);
\echo :LAST_ERROR_SQLSTATE
SELECT tbl FROM lockfence.protected_tables ORDER BY 1::text;
SET ROLE regress_reg_owner;
SELECT lockfence.unprotect('owned');
SELECT count(*) FROM lockfence.protected_tables;
DROP TABLE owned, plain;
RESET ROLE;
REVOKE CREATE ON SCHEMA public FROM regress_reg_owner;
DROP ROLE regress_reg_owner, regress_reg_other;

-- leave the database as the next test expects it
DROP EXTENSION lockfence;
