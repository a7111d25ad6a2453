-- lockfence: (1.13) ALTER COLUMN ... SET EXPRESSION, new in PostgreSQL 17,
-- gives a generated column of every row a new value without firing row
-- triggers (a stored column is rewritten, a virtual one, 18, reads the new
-- expression): like ALTER COLUMN ... TYPE ... USING, it needs every
-- resource of the rows fenced in the transaction (a review wrote every
-- row of a protected table with it, unfenced).  PostgreSQL 15 and 16 have
-- no such command (expected/protect_ddl_generated_1.out); 17 has no
-- virtual columns (expected/protect_ddl_generated_2.out).
SELECT current_setting('server_version_num')::int < 170000 AS before_17,
       current_setting('server_version_num')::int >= 180000 AS has_virtual \gset
\if :before_17
\quit
\endif
CREATE EXTENSION lockfence;

-- a table fenced as one resource, with a stored generated column
CREATE TABLE acct (id int, amount int,
                   balance int GENERATED ALWAYS AS (amount) STORED);
SELECT lockfence.protect('acct', resource => 'acct');
BEGIN;
SELECT lockfence.fence('acct', 5);
INSERT INTO acct (id, amount) VALUES (1, 10);
COMMIT;
-- without the resource fenced: refused, the rows as they were
ALTER TABLE acct ALTER COLUMN balance SET EXPRESSION AS (amount * 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT id, amount, balance FROM acct;
-- fenced in the transaction: the rows get their new values
BEGIN;
SELECT lockfence.fence('acct', 5);
ALTER TABLE acct ALTER COLUMN balance SET EXPRESSION AS (amount * 2);
COMMIT;
SELECT id, amount, balance FROM acct;

-- per row resources, partitioned: the command recurses, and every
-- partition's rows need their resources fenced
CREATE TABLE pacct (tenant text, amount int,
                    balance int GENERATED ALWAYS AS (amount) STORED)
    PARTITION BY LIST (tenant);
CREATE TABLE pacct_a PARTITION OF pacct FOR VALUES IN ('a');
CREATE TABLE pacct_b PARTITION OF pacct FOR VALUES IN ('b');
SELECT lockfence.protect('pacct', resource_column => 'tenant');
BEGIN;
SELECT lockfence.fence(ARRAY['a', 'b'], 7);
INSERT INTO pacct (tenant, amount) VALUES ('a', 10), ('b', 20);
COMMIT;
BEGIN;
SELECT lockfence.fence('a', 7);
ALTER TABLE pacct ALTER COLUMN balance SET EXPRESSION AS (amount * 1000);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- on a partition itself, too: its rows' resources
BEGIN;
SELECT lockfence.fence('a', 7);
ALTER TABLE pacct_b ALTER COLUMN balance SET EXPRESSION AS (amount * 1000);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT lockfence.fence(ARRAY['a', 'b'], 7);
ALTER TABLE pacct ALTER COLUMN balance SET EXPRESSION AS (amount + 1);
COMMIT;
SELECT tenant, amount, balance FROM pacct ORDER BY tenant;

\if :has_virtual
-- (18) a virtual generated column: nothing is rewritten, but every row
-- reads the new expression
CREATE TABLE vacct (id int, amount int,
                    shown int GENERATED ALWAYS AS (amount) VIRTUAL);
SELECT lockfence.protect('vacct', resource => 'vacct');
BEGIN;
SELECT lockfence.fence('vacct', 3);
INSERT INTO vacct (id, amount) VALUES (1, 10);
COMMIT;
ALTER TABLE vacct ALTER COLUMN shown SET EXPRESSION AS (0);
\echo :LAST_ERROR_SQLSTATE
SELECT id, amount, shown FROM vacct;
BEGIN;
SELECT lockfence.fence('vacct', 3);
ALTER TABLE vacct ALTER COLUMN shown SET EXPRESSION AS (amount * 3);
COMMIT;
SELECT id, amount, shown FROM vacct;
\endif

DROP TABLE acct, pacct;
DROP TABLE IF EXISTS vacct;
DROP EXTENSION lockfence;
