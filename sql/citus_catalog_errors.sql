-- The Citus guard keeps no verdict drawn from a read of Citus' catalog
-- that failed: a lookup that raised raises again at the next call, rather
-- than leave lockfence.fences judged a plain local table (a lock timeout
-- or a cancel on pg_dist_partition did that).  A pg_dist_partition made
-- by hand, without the index lockfence reads it through, stands for a
-- Citus whose catalog cannot be read.
CREATE EXTENSION lockfence;
\set VERBOSITY terse
SET allow_system_table_mods = on;
CREATE TABLE pg_catalog.pg_dist_partition (logicalrelid oid, partmethod "char",
    partkey text, colocationid int, repmodel "char");
RESET allow_system_table_mods;
SELECT lockfence.fence('cg', 5);
SELECT lockfence.fence('cg', 6);
SELECT lockfence.lease_try_acquire('cg-lease', '10 s', 'h');
SELECT count(*) FROM lockfence.fences WHERE resource LIKE 'cg%';
-- once the catalog is readable (here: gone), fences are accepted again
SET allow_system_table_mods = on;
DROP TABLE pg_catalog.pg_dist_partition;
RESET allow_system_table_mods;
SELECT lockfence.fence('cg', 7);
SELECT resource, token FROM lockfence.fences WHERE resource LIKE 'cg%';
DROP EXTENSION lockfence;
