# Copyright: the lockfence authors
#
# 51_pg_upgrade.pl
#	  pg_upgrade of a cluster using lockfence to the next PostgreSQL major.
#
# A cluster of the previous major (LOCKFENCE_UPGRADE_FROM: its bin folder,
# with lockfence built and installed there) gets lockfence with fences
# recorded, three protected tables (a fixed resource, a resource column, a
# partitioned table with a partition made before and one after protect())
# and grants to application roles; pg_upgrade moves it to the major this
# suite runs on.  Afterwards every fence row, every protection (row and
# TRUNCATE triggers, the event trigger) and every grant is there, exactly
# as before; a stale token is rejected and a tokenless write is refused;
# the event trigger still covers a new partition.
#
# test/run-all.sh runs it in the chroot where PostgreSQL 17 and 18 are both
# installed (17 -> 18).  Elsewhere only one major is installed and it is
# skipped, saying so.

use strict;
use warnings;

use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $oldbin = $ENV{LOCKFENCE_UPGRADE_FROM} // '';
if ($oldbin eq '' || !-x "$oldbin/pg_ctl")
{
	plan skip_all =>
	  'pg_upgrade needs the previous PostgreSQL major installed side by side '
	  . 'with lockfence (LOCKFENCE_UPGRADE_FROM); test/run-all.sh runs this '
	  . 'in the PostgreSQL 17 and 18 chroot';
}

my $old = PostgreSQL::Test::Cluster->new('old', install_path => dirname($oldbin));
$old->init;
$old->append_conf('postgresql.conf', "shared_preload_libraries = 'lockfence'\n");
$old->start;

my $new = PostgreSQL::Test::Cluster->new('new');
ok($new->pg_version > $old->pg_version,
	"upgrading from PostgreSQL " . $old->pg_version . " to " . $new->pg_version);

# Everything an upgrade must carry over, one line per fact, in a stable
# order: the extension's objects with their definitions and privileges,
# the event trigger, the fences, the protected tables' triggers, grants
# and rows.
my $snapshot_sql = q{
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'lockfence')
SELECT 'extension: ' || extname || ' ' || extversion
       || ' config=' || coalesce(extconfig::regclass[]::text, '')
  FROM pg_extension WHERE extname = 'lockfence'
UNION ALL
SELECT 'member: ' || pg_describe_object(d.classid, d.objid, 0)
  FROM pg_depend d, ext
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = ext.oid AND d.deptype = 'e'
UNION ALL
SELECT 'function: ' || p.oid::regprocedure || ' ' || md5(pg_get_functiondef(p.oid))
       || ' acl=' || coalesce(p.proacl::text, 'default')
  FROM pg_proc p WHERE p.pronamespace = 'lockfence'::regnamespace
UNION ALL
SELECT 'relation: ' || c.oid::regclass || ' kind=' || c.relkind::text
       || ' acl=' || coalesce(c.relacl::text, 'default')
  FROM pg_class c
 WHERE c.relnamespace IN ('lockfence'::regnamespace, 'public'::regnamespace)
   AND c.relkind IN ('r', 'p', 'v')
UNION ALL
SELECT 'schema acl: ' || nspname || ' ' || coalesce(nspacl::text, 'default')
  FROM pg_namespace WHERE nspname IN ('lockfence', 'public')
UNION ALL
SELECT 'event trigger: ' || evtname || ' ' || evtevent || ' ' || evtfoid::regproc
       || ' tags=' || coalesce(evttags::text, '') || ' enabled=' || evtenabled::text
  FROM pg_event_trigger
UNION ALL
SELECT 'trigger: ' || tgrelid::regclass || ' ' || pg_get_triggerdef(oid)
       || ' enabled=' || tgenabled::text
  FROM pg_trigger WHERE NOT tgisinternal
UNION ALL
SELECT 'fence: ' || resource || '=' || token || '/' || coalesce(holder, '')
       || ' at ' || accepted_at::text
  FROM lockfence.fences
UNION ALL
SELECT 'ledger: ' || l::text FROM ledger l
UNION ALL
SELECT 'accounts: ' || a::text FROM accounts a
UNION ALL
SELECT 'events: ' || tableoid::regclass || ' ' || e::text FROM events e
ORDER BY 1
};

$old->safe_psql('postgres', q{
	CREATE ROLE app LOGIN;
	CREATE ROLE operator;
	CREATE EXTENSION lockfence;
	SELECT lockfence.grant_usage('app');
	GRANT EXECUTE ON FUNCTION lockfence.reset(text) TO operator;
	GRANT EXECUTE ON FUNCTION lockfence.etcd_lock(text, integer, interval, text) TO app;
	GRANT EXECUTE ON FUNCTION lockfence.etcd_unlock(text, boolean) TO app;

	SELECT lockfence.fence('ledger', 41, 'w1');
	SELECT lockfence.fence('unused', 7);

	-- A fixed resource, the token from the transaction.
	CREATE TABLE ledger (id int PRIMARY KEY, amount int);
	SELECT lockfence.protect('ledger', resource => 'ledger');
	BEGIN;
	SELECT lockfence.fence('ledger', 42, 'w1');
	INSERT INTO ledger VALUES (1, 10);
	COMMIT;

	-- One resource per tenant, the token in a column.
	CREATE TABLE accounts (id int PRIMARY KEY, tenant text, balance int,
	                       fence_token bigint, fenced_by text);
	SELECT lockfence.protect('accounts', resource_column => 'tenant',
	                         resource_prefix => 'tenant:',
	                         token_column => 'fence_token',
	                         holder_column => 'fenced_by');
	INSERT INTO accounts VALUES (1, 'acme', 100, 11, 'w2'),
	                            (2, 'globex', 5, 7, 'w3');

	-- A partitioned table: one partition before protect(), one after
	-- (covered by the event trigger).
	CREATE TABLE events (id int, at int, payload text) PARTITION BY RANGE (at);
	CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (0) TO (100);
	SELECT lockfence.protect('events', resource => 'events');
	CREATE TABLE events_2 PARTITION OF events FOR VALUES FROM (100) TO (200);
	BEGIN;
	SELECT lockfence.fence('events', 5, 'w4');
	INSERT INTO events VALUES (1, 50, 'a'), (2, 150, 'b');
	COMMIT;

	GRANT SELECT, INSERT, UPDATE, DELETE ON ledger, accounts, events TO app;
	GRANT TRUNCATE ON events, events_1, events_2 TO operator;
});

my $before = $old->safe_psql('postgres', $snapshot_sql);
like($before, qr/^event trigger: lockfence_check_new_triggers /m,
	'the event trigger is in place before the upgrade');
like($before, qr/^trigger: events_2 CREATE TRIGGER zz_lockfence_fence_truncate /m,
	'the partition made after protect() has its TRUNCATE trigger');
my $checksums = $old->safe_psql('postgres', 'SHOW data_checksums');

# Debian's PostgreSQL 17.12 stores an attribute option pg_attver on every
# column of every table; 17's pg_dump leaves it out, but 18.6's pg_dump
# (which pg_upgrade runs) dumps it and 18 rejects it ("unrecognized
# parameter"), so pg_upgrade fails for any cluster with a table, with or
# without lockfence.  Shown here on a table lockfence has nothing to do
# with, then removed from the user tables' columns (a catalog update, the
# old cluster is not used afterwards) so that what lockfence must survive
# is tested.  When the packages agree this finds nothing and does nothing.
$old->safe_psql('postgres', 'CREATE TABLE plain_table (a int)');
my $attver = $old->safe_psql('postgres', q{
	SELECT count(*) FROM pg_attribute
	 WHERE attrelid = 'plain_table'::regclass
	   AND array_to_string(attoptions, ',') LIKE '%pg_attver=%'});
if ($attver > 0)
{
	diag('PostgreSQL ' . $old->pg_version
		  . ' stores pg_attver attribute options, which ' . $new->pg_version
		  . ' rejects: removing them before pg_upgrade');
	for my $db ('template1', 'postgres')
	{
		$old->safe_psql($db, q{
			UPDATE pg_attribute
			   SET attoptions = nullif(array(SELECT o FROM unnest(attoptions) AS o
			                                  WHERE o NOT LIKE 'pg_attver=%'), '{}')
			 WHERE attrelid >= 16384
			   AND array_to_string(attoptions, ',') LIKE '%pg_attver=%'});
	}
}
$old->safe_psql('postgres', 'DROP TABLE plain_table');
$old->stop;

# The new cluster: same data checksum setting (18 turns them on by default,
# 17 did not), the library preloaded like in the old one.
$new->init(no_data_checksums => ($checksums eq 'off' ? 1 : 0));
$new->append_conf('postgresql.conf', "shared_preload_libraries = 'lockfence'\n");

# pg_upgrade writes its logs under the new data folder and the current one.
chdir ${PostgreSQL::Test::Utils::tmp_check};
command_ok(
	[
		'pg_upgrade', '--no-sync',
		'-d' => $old->data_dir, '-D' => $new->data_dir,
		'-b' => $oldbin, '-B' => $new->config_data('--bindir'),
		'-s' => $new->host,
		'-p' => $old->port, '-P' => $new->port,
		'--copy',
	],
	'pg_upgrade of a cluster using lockfence');

$new->start;
my $after = $new->safe_psql('postgres', $snapshot_sql);
is($after, $before,
	'fences, objects, privileges, triggers, the event trigger and rows are unchanged');

like($after, qr/^fence: ledger=42\/w1 /m, 'fence rows are there');
like($after, qr/^trigger: events_1 CREATE TRIGGER zz_lockfence_fence_truncate /m,
	'partition TRUNCATE triggers are there');
is( $new->safe_psql('postgres', q{
		SELECT has_function_privilege('app', 'lockfence.etcd_lock(text, integer, interval, text)', 'EXECUTE'),
		       has_function_privilege('app', 'lockfence.reset(text)', 'EXECUTE'),
		       has_function_privilege('operator', 'lockfence.reset(text)', 'EXECUTE'),
		       has_table_privilege('app', 'ledger', 'UPDATE'),
		       has_table_privilege('app', 'lockfence.fences', 'UPDATE')}),
	't|f|t|t|f', 'grants work as before');

# sqlstate SQL: run SQL, return the SQLSTATE of its error ('' if none).
sub sqlstate
{
	my ($sql) = @_;
	my ($ret, $out, $err) = $new->psql('postgres',
		"\\set VERBOSITY verbose\n\\set ON_ERROR_STOP 1\n$sql");
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : '';
}

# pg_upgrade makes a new cluster (a new system identifier): fenced writes
# are refused (LF004) until an operator accepts it or raises the floor.
is(sqlstate("SELECT lockfence.fence('ledger', 43, 'w5')"), 'LF004',
	'after pg_upgrade, fenced writes are refused until accepted');
is($new->safe_psql('postgres', 'SELECT writes_refused FROM lockfence.floor_status()'),
	't', 'floor_status() says so');
$new->safe_psql('postgres', 'SELECT lockfence.accept_promotion()');

is(sqlstate("SELECT lockfence.fence('ledger', 41)"), 'LF001',
	'a stale token is rejected by fence()');
is(sqlstate("UPDATE accounts SET balance = 0, fence_token = 10 WHERE id = 1"),
	'LF001', 'a stale token in the row is rejected');
is(sqlstate("SET ROLE app; INSERT INTO ledger VALUES (2, 20)"), 'LF002',
	'a tokenless write to a fixed-resource table is refused');
is(sqlstate("UPDATE accounts SET balance = 0 WHERE id = 1"), 'LF002',
	'a tokenless write to a resource-column table is refused');
is(sqlstate("DELETE FROM events WHERE id = 2"), 'LF002',
	'a tokenless write to a partitioned table is refused');
is(sqlstate("SET ROLE operator; TRUNCATE events_2"), 'LF002',
	'a tokenless TRUNCATE of a partition is refused');
is(sqlstate("TRUNCATE ledger"), 'LF002', 'a tokenless TRUNCATE is refused');

# The event trigger still covers partitions made after the upgrade.
$new->safe_psql('postgres',
	'CREATE TABLE events_3 PARTITION OF events FOR VALUES FROM (200) TO (300)');
is(sqlstate("TRUNCATE events_3"), 'LF002',
	'a partition made after the upgrade is covered by the event trigger');

# And a current token still works.
is(sqlstate(q{
	BEGIN;
	SET ROLE app;
	SELECT lockfence.fence('ledger', 43, 'w5');
	INSERT INTO ledger VALUES (2, 20);
	COMMIT;}), '', 'a newer token is accepted');
is($new->safe_psql('postgres',
	"SELECT token || '/' || holder FROM lockfence.fences WHERE resource = 'ledger'"),
	'43/w5', 'and recorded');
is(sqlstate("UPDATE accounts SET balance = 1, fence_token = 12 WHERE id = 1"),
	'', 'a newer token in the row is accepted');

$new->stop;
done_testing();
