-- lockfence.protected_tables: the names of the tables lockfence protects,
-- dumped with the data, so that check() reports a table restored without
-- its triggers (a data-only restore, or one without post-data) (issue 17,
-- item 10)
CREATE EXTENSION lockfence;
\set VERBOSITY default
\set SHOW_CONTEXT never

-- 1. protect() remembers the table, and check() is clean
CREATE TABLE reg (id int, tok bigint);
SELECT lockfence.protect('reg', resource => 'reg', token_column => 'tok');
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
SELECT finding FROM lockfence.check() WHERE severity = 'error';

-- 2. the table loses its triggers as a restore without post-data leaves
-- it: check() reports it, and a tokenless write is accepted (nothing fires)
DROP TRIGGER zz_lockfence_fence ON reg;
DROP TRIGGER zz_lockfence_fence_truncate ON reg;
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
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
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
DROP TABLE reg;
SELECT count(*) FROM lockfence.protected_tables;
SELECT finding FROM lockfence.check() WHERE severity IN ('error', 'warning') AND finding <> 'not_preloaded';

-- 5. a partitioned table is remembered, not its partitions (their row
-- triggers are the parent's); DROP SCHEMA ... CASCADE forgets it
CREATE SCHEMA regs;
CREATE TABLE regs.pt (id int) PARTITION BY LIST (id);
CREATE TABLE regs.pt1 PARTITION OF regs.pt FOR VALUES IN (1);
SELECT lockfence.protect('regs.pt', resource => 'pt');
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
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
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
INSERT INTO lockfence.protected_tables VALUES ('public.owned');
\echo :LAST_ERROR_SQLSTATE
DELETE FROM lockfence.protected_tables;
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE plain (id int);
SELECT lockfence.sync_protected_tables();
SELECT lockfence.sync_protected_tables(forget => ARRAY['public.owned']);
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
RESET ROLE;
DROP TRIGGER zz_lockfence_fence ON owned;
DROP TRIGGER zz_lockfence_fence_truncate ON owned;
SET ROLE regress_reg_other;
SELECT lockfence.unprotect('owned');
\echo :LAST_ERROR_SQLSTATE
SELECT lockfence.sync_protected_tables(forget => ARRAY['public.owned']);
\echo :LAST_ERROR_SQLSTATE
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
SET ROLE regress_reg_owner;
SELECT lockfence.unprotect('owned');
SELECT count(*) FROM lockfence.protected_tables;
DROP TABLE owned, plain;
RESET ROLE;
REVOKE CREATE ON SCHEMA public FROM regress_reg_owner;
DROP ROLE regress_reg_owner, regress_reg_other;

-- 8. the list follows renames without OIDs: ALTER TABLE ... RENAME, ...
-- SET SCHEMA, ALTER SCHEMA ... RENAME; the old name is removed, the new
-- one listed, and check() is clean
CREATE SCHEMA rn1;
CREATE SCHEMA rn2;
CREATE TABLE rn1.t1 (id int);
SELECT lockfence.protect('rn1.t1', resource => 'rn');
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
ALTER TABLE rn1.t1 RENAME TO "T 2";
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
ALTER TABLE rn1."T 2" SET SCHEMA rn2;
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
ALTER SCHEMA rn2 RENAME TO rn3;
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
SELECT finding FROM lockfence.check() WHERE severity IN ('error', 'warning') AND finding <> 'not_preloaded';
-- other ALTER TABLE commands leave the list as it is
ALTER TABLE rn3."T 2" ADD COLUMN v text;
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;

-- 9. a listed name that names no table (left out of a dump, or dropped
-- while the event triggers were disabled) is a warning, with the statement
-- that removes it as the hint; only a role with the privileges of the
-- list's owner (or CREATE on its schema) may remove it (42501 for others,
-- whose renames leave it too), and a table's owner who drops it still has
-- its name removed (the event trigger runs as the list's owner)
ALTER EVENT TRIGGER lockfence_forget_dropped_tables DISABLE;
DROP TABLE rn3."T 2";
ALTER EVENT TRIGGER lockfence_forget_dropped_tables ENABLE ALWAYS;
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
\x on
SELECT severity, finding, detail, hint FROM lockfence.check() WHERE severity IN ('error', 'warning') AND finding <> 'not_preloaded';
\x off
-- a protect() or a trigger created meanwhile leaves it listed (as a
-- restore's post-data does)
CREATE TABLE rn1.t3 (id int);
SELECT lockfence.protect('rn1.t3', resource => 'rn');
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
CREATE ROLE regress_reg_nobody;
SET ROLE regress_reg_nobody;
SELECT lockfence.sync_protected_tables(forget => ARRAY['rn3."T 2"']);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- nor does its rename of a protected table of its own, which removes the
-- old name (in a schema where it may create tables) and nothing else
GRANT CREATE ON SCHEMA public TO regress_reg_nobody;
SET ROLE regress_reg_nobody;
CREATE TABLE nobodys (id int);
SELECT lockfence.protect('nobodys', resource => 'nobodys');
ALTER TABLE nobodys RENAME TO nobodys2;
SELECT lockfence.sync_protected_tables(renamed => true);
RESET ROLE;
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
SELECT lockfence.sync_protected_tables(forget => ARRAY['rn3."T 2"']);
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
SET ROLE regress_reg_nobody;
DROP TABLE nobodys2;
SELECT tbl FROM lockfence.protected_tables ORDER BY 1;
RESET ROLE;
REVOKE CREATE ON SCHEMA public FROM regress_reg_nobody;
DROP ROLE regress_reg_nobody;
SELECT finding FROM lockfence.check() WHERE severity IN ('error', 'warning') AND finding <> 'not_preloaded';
DROP SCHEMA rn1, rn3 CASCADE;
SELECT count(*) FROM lockfence.protected_tables;

-- The list is written as its owner: the caller's search_path must not
-- choose what those statements call (sync_protected_tables() is declared
-- with SET search_path).  An operator "=" of the caller's, ahead of
-- pg_catalog's, that says whom it runs as:
CREATE ROLE regress_reg_evil;
CREATE SCHEMA regress_evil AUTHORIZATION regress_reg_evil;
SET ROLE regress_reg_evil;
CREATE FUNCTION regress_evil.oideq(a oid, b oid) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF current_user OPERATOR(pg_catalog.<>) 'regress_reg_evil' THEN
        RAISE EXCEPTION 'the caller''s operator ran as another role';
    END IF;
    RETURN a OPERATOR(pg_catalog.=) b;
END
$$;
CREATE OPERATOR regress_evil.= (LEFTARG = oid, RIGHTARG = oid,
                                FUNCTION = regress_evil.oideq);
CREATE TABLE regress_evil.t (id int, token bigint);
SELECT lockfence.protect('regress_evil.t', resource => 'evil');
SET search_path = regress_evil, pg_catalog;
SELECT lockfence.sync_protected_tables();
RESET search_path;
SELECT tbl FROM lockfence.protected_tables WHERE tbl LIKE '%evil%' ORDER BY 1;
-- quote_all_identifiers does not change the names: unprotect() (which
-- names its table with format('%I.%I')) still removes it from the list
SET quote_all_identifiers = on;
SELECT lockfence.unprotect('regress_evil.t');
RESET quote_all_identifiers;
RESET ROLE;
SELECT tbl FROM lockfence.protected_tables WHERE tbl LIKE '%evil%' ORDER BY 1;
-- nor does it keep a dropped table listed (1.11; it stayed, and check()
-- reported it dropped while the event triggers were disabled)
SELECT lockfence.protect('regress_evil.t', resource => 'evil');
SET quote_all_identifiers = on;
DROP TABLE regress_evil.t;
RESET quote_all_identifiers;
SELECT tbl FROM lockfence.protected_tables WHERE tbl LIKE '%evil%' ORDER BY 1;
DROP SCHEMA regress_evil CASCADE;
DROP ROLE regress_reg_evil;

-- 10. a lockfence trigger created inside CREATE SCHEMA is listed too
CREATE SCHEMA reg_cs
    CREATE TABLE t (id int)
    CREATE TRIGGER zz_fence BEFORE INSERT OR UPDATE OR DELETE ON t
        FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger('resource=cs');
SELECT tbl FROM lockfence.protected_tables WHERE tbl LIKE 'reg_cs%' ORDER BY 1;
DROP SCHEMA reg_cs CASCADE;
SELECT count(*) FROM lockfence.protected_tables WHERE tbl LIKE 'reg_cs%';

-- leave the database as the next test expects it
DROP EXTENSION lockfence;
