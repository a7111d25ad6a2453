-- lockfence: DDL that writes rows (here ATTACH PARTITION) finds every
-- resource of the rows fenced byte for byte, as fences are, also when the
-- resource column's collation is case-insensitive (ICU, nondeterministic).
-- A build without ICU (the assert build of the Valgrind lane) skips it:
-- expected/protect_ddl_icu_1.out.
SELECT count(*) = 0 AS no_icu FROM pg_collation WHERE collprovider = 'i' \gset
\if :no_icu
\quit
\endif
CREATE EXTENSION lockfence;

-- (1.10) resources are told apart byte for byte, as fences are, also
-- when the column's collation is case-insensitive: 'zeta' fenced does not
-- cover rows of 'ZETA' (the check's DISTINCT is under "C")
CREATE COLLATION lf_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE TABLE cp (tenant text COLLATE lf_ci, v int) PARTITION BY LIST (v);
SELECT lockfence.protect('cp', resource_column => 'tenant');
CREATE TABLE cp1 (tenant text COLLATE lf_ci, v int);
INSERT INTO cp1 VALUES ('zeta', 1), ('ZETA', 1), ('Zeta', 1);
BEGIN;
SELECT lockfence.fence('zeta', 1);
-- (terse: which of the two unfenced spellings it names depends on the plan)
\set VERBOSITY terse
ALTER TABLE cp ATTACH PARTITION cp1 FOR VALUES IN (1);
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT lockfence.fence(ARRAY['zeta', 'ZETA', 'Zeta'], 1);
ALTER TABLE cp ATTACH PARTITION cp1 FOR VALUES IN (1);
COMMIT;
SELECT lockfence.unprotect('cp');
DROP TABLE cp;
DROP COLLATION lf_ci;

DROP EXTENSION lockfence;
