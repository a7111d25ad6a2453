# Copyright: the lockfence authors
#
# 02_dump_restore.pl
#	  The fence survives pg_dump and restore.
#
# A database with fences and tables protected with lockfence.protect() is
# dumped with pg_dump, and restored (1) with pg_restore into a new database
# of the same cluster (also one whose sessions default to SERIALIZABLE) and
# (2) with psql from a plain dump into a new cluster.  In both copies the fence rows are kept exactly (the table is
# marked with pg_extension_config_dump), stale tokens and other holders'
# tokens are still rejected, and the triggers still protect the tables.
# Each copy's fences are refused (LF004) until the restore is accepted:
# from another cluster its floor_state names another server; into the
# same cluster it holds two rows naming this one, the dumped one beside
# CREATE EXTENSION's (1.9: before, such a restore was accepted at once).
# A restore that brings the data but not the triggers (without post-data,
# or data only) brings lockfence's registry of protected tables, and
# check() reports the tables (issue 17, item 10).
# A data-only restore after a schema-only one is refused by the triggers;
# the steps docs/operations.md gives restore it (1.12, a review).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $tempdir = PostgreSQL::Test::Utils::tempdir;

my $source = PostgreSQL::Test::Cluster->new('source');
$source->init;
$source->start;

$source->safe_psql('postgres', 'CREATE DATABASE src');
$source->safe_psql(
	'src', q{
	CREATE EXTENSION lockfence;

	CREATE TABLE items (id int PRIMARY KEY, val text, token bigint);
	SELECT lockfence.protect('items', resource => 'shop', token_column => 'token');

	CREATE TABLE accounts (name text PRIMARY KEY, balance int);
	SELECT lockfence.protect('accounts', resource_column => 'name',
							 resource_prefix => 'acct:');
});
$source->safe_psql('src', "INSERT INTO items VALUES (1, 'first', 10)");
$source->safe_psql('src', "INSERT INTO items VALUES (2, 'second', 20)");
$source->safe_psql('src',
	"BEGIN; SELECT lockfence.fence('acct:alice', 3, 'h1'); INSERT INTO accounts VALUES ('alice', 100); COMMIT;"
);
$source->safe_psql('src',
	"BEGIN; SELECT lockfence.fence('acct:bob', 4); INSERT INTO accounts VALUES ('bob', 50); COMMIT;"
);
$source->safe_psql('src', "SELECT lockfence.fence('standalone', 42, 'svc')");

my $fences_query =
  'SELECT resource, token, accepted_at, holder FROM lockfence.fences ORDER BY resource';
my $data_query =
  q{SELECT (SELECT string_agg(format('%s:%s:%s', id, val, token), ',' ORDER BY id) FROM items),
		   (SELECT string_agg(format('%s:%s', name, balance), ',' ORDER BY name) FROM accounts)};
my $triggers_query = q{
	SELECT tgrelid::regclass, tgname, pg_get_triggerdef(oid)
	  FROM pg_trigger
	 WHERE tgfoid = 'lockfence.fence_trigger()'::regprocedure
	 ORDER BY tgrelid::regclass::text, tgname};

my $registry_query =
  q{SELECT string_agg(tbl::text, ',' ORDER BY tbl::text) FROM lockfence.protected_tables};
my $check_errors_query =
  q{SELECT string_agg(finding || ': ' || detail, E'\n' ORDER BY detail) FROM lockfence.check() WHERE severity = 'error'};

my $source_fences = $source->safe_psql('src', $fences_query);
my $source_data = $source->safe_psql('src', $data_query);
my $source_triggers = $source->safe_psql('src', $triggers_query);
is( $source->safe_psql('src',
		'SELECT string_agg(resource || \'=\' || token, \',\' ORDER BY resource) FROM lockfence.fences'),
	'acct:alice=3,acct:bob=4,shop=20,standalone=42',
	'source fences');
is(scalar(split /\n/, $source_triggers),
	4, 'source has the four protecting triggers');

# A restore into the cluster that made the dump brings the dumped row of
# lockfence.floor_state beside the one CREATE EXTENSION recorded: its
# fences are as old as the dump, so every fence is refused (LF004) until
# the floor is raised or the restore accepted (1.9), and check() says so.
sub accept_restore
{
	my ($node, $db, $label) = @_;
	is($node->safe_psql($db, 'SELECT count(*) FROM lockfence.floor_state'),
		'2', "$label: floor_state holds the dumped row and CREATE EXTENSION's");
	my ($r, $o, $e) = $node->psql($db, "\\set VERBOSITY verbose\nSELECT lockfence.fence('shop', 20)");
	like($e, qr/ERROR:  LF004: the fences of this database were restored from a dump/,
		"$label: fences refused until the restore is accepted");
	like( $node->safe_psql($db,
			"SELECT detail FROM lockfence.check() WHERE finding = 'floor_not_raised'"),
		qr/^The fences of this database were restored from a dump \(lockfence\.floor_state holds 2 rows/,
		"$label: check() reports the restore");
	# (READ COMMITTED: one of these databases defaults to SERIALIZABLE,
	# under which recording the floor is refused)
	$node->safe_psql($db,
		'BEGIN ISOLATION LEVEL READ COMMITTED; SELECT lockfence.accept_promotion(); COMMIT;');
	is($node->safe_psql($db, 'SELECT count(*) FROM lockfence.floor_state'),
		'1', "$label: accepted, one identity row");
	return;
}

# Check a restored copy: same fences, same data, same triggers, and the
# fence still works.
sub check_copy
{
	my ($node, $db, $label) = @_;

	my $sql_error = sub {
		my ($sql) = @_;
		my ($ret, $stdout, $stderr) =
		  $node->psql($db, "\\set VERBOSITY verbose\n$sql");
		isnt($ret, 0, "$label: fails: $sql");
		return $stderr;
	};

	is($node->safe_psql($db, $fences_query),
		$source_fences, "$label: fence rows are restored exactly");
	is($node->safe_psql($db, $data_query),
		$source_data, "$label: protected data is restored");
	is($node->safe_psql($db, $triggers_query),
		$source_triggers, "$label: the protecting triggers are restored");
	# lockfence remembers what it protects (issue 17, item 10): the
	# registry's rows are restored (with --exit-on-error: no duplicate key
	# when post-data's CREATE TRIGGER remembers the tables again), and
	# check() finds nothing wrong.
	is($node->safe_psql($db, $registry_query),
		'public.accounts,public.items', "$label: the registry of protected tables is restored");
	is($node->safe_psql($db, $check_errors_query),
		'', "$label: check() reports no error");

	like(
		$sql_error->("SELECT lockfence.fence('shop', 19)"),
		qr/ERROR:  LF001: stale fencing token for resource "shop"/,
		"$label: a stale token is rejected");
	like(
		$sql_error->("SELECT lockfence.fence('acct:alice', 3, 'h2')"),
		qr/ERROR:  LF001: fencing token for resource "acct:alice" belongs to another holder/,
		"$label: another holder's equal token is rejected");
	like(
		$sql_error->("INSERT INTO items VALUES (3, 'stale', 19)"),
		qr/ERROR:  LF001: stale fencing token for resource "shop"/,
		"$label: the trigger rejects a row with a stale token");
	like(
		$sql_error->("UPDATE items SET val = 'no token' WHERE id = 1"),
		qr/ERROR:  LF002: write to protected table "items" carries no fencing token/,
		"$label: the trigger rejects a write without a token");
	like(
		$sql_error->("TRUNCATE items"),
		qr/ERROR:  LF002: write to protected table "items" carries no fencing token/,
		"$label: the truncate trigger rejects a truncate without a token");
	like(
		$sql_error->(
			"BEGIN; SELECT lockfence.fence('acct:bob', 3); UPDATE accounts SET balance = 0 WHERE name = 'bob'; COMMIT;"
		),
		qr/ERROR:  LF001: stale fencing token for resource "acct:bob"/,
		"$label: a stale token for a per-row resource is rejected");
	like(
		$sql_error->(
			"BEGIN; SELECT lockfence.fence('acct:alice', 3, 'h1'); UPDATE accounts SET balance = 0; COMMIT;"
		),
		qr/ERROR:  LF002: write to protected table "accounts" carries no fencing token\n.*Resource "acct:bob" was not fenced/,
		"$label: the per-row trigger still checks every row");

	is( $node->safe_psql(
			$db, q{
		BEGIN;
		SELECT lockfence.fence('shop', 20);
		INSERT INTO items VALUES (3, 'current', 20);
		SELECT lockfence.fence('acct:alice', 3, 'h1');
		UPDATE accounts SET balance = balance + 1 WHERE name = 'alice';
		INSERT INTO items VALUES (4, 'newer', 21);
		COMMIT;
		SELECT lockfence.current_token('shop');
	}),
		"20\n3\n21",
		"$label: current and newer tokens are accepted");
	like(
		$sql_error->("SELECT lockfence.fence('shop', 20)"),
		qr/ERROR:  LF001: stale fencing token for resource "shop"/,
		"$label: the restored fence advances");
	return;
}

# 1. Custom-format dump, pg_restore into a new database of the same cluster.
my $custom = "$tempdir/src.dump";
$source->command_ok([ 'pg_dump', '-Fc', '-f', $custom, 'src' ],
	'pg_dump -Fc');
$source->safe_psql('postgres', 'CREATE DATABASE dst');
$source->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', 'dst', $custom ],
	'pg_restore into a new database');
accept_restore($source, 'dst', 'pg_restore');
check_copy($source, 'dst', 'pg_restore');

# 1b. The same into a database whose sessions default to SERIALIZABLE: the
# restore's CREATE TRIGGER runs under a transaction snapshot, and
# lockfence's refusal of DDL on protected tables changed since the
# snapshot (1.8) must not refuse a restore, which nobody changes beside it.
$source->safe_psql('postgres', q{
CREATE DATABASE dst_serializable;
ALTER DATABASE dst_serializable SET default_transaction_isolation = 'serializable';
});
$source->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', 'dst_serializable', $custom ],
	'pg_restore into a database whose default isolation is SERIALIZABLE');
accept_restore($source, 'dst_serializable', 'pg_restore (SERIALIZABLE)');
check_copy($source, 'dst_serializable', 'pg_restore (SERIALIZABLE)');

# 2. Plain dump, restored with psql into a new cluster.
my $plain = "$tempdir/src.sql";
$source->command_ok([ 'pg_dump', '-f', $plain, 'src' ], 'pg_dump plain');
like(slurp_file($plain), qr/COPY lockfence\.fences \(resource, token, accepted_at, holder, lease_expires_at, lease_ttl\) FROM stdin;/,
	'the plain dump contains the fence rows');

my $target = PostgreSQL::Test::Cluster->new('target');
$target->init;
$target->start;
$target->safe_psql('postgres', 'CREATE DATABASE dst');
$target->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', 'dst', '-f', $plain ],
	'plain dump restored into a new cluster');
# Another server: fenced writes are refused (LF004) until an operator
# raises the floor or accepts the restore (issue 23).
like(($target->psql('dst', "\\set VERBOSITY verbose\nSELECT lockfence.fence('shop', 20)"))[2],
	qr/ERROR:  LF004: the fences of this database were written by another server/,
	'new cluster: fences refused until the restore is accepted');
$target->safe_psql('dst', 'SELECT lockfence.accept_promotion()');
check_copy($target, 'dst', 'new cluster');

# 3. A table whose lockfence trigger names a dropped column (issue 17,
# item 10): in the source every write to it fails.  A restore must not turn
# that into a table that accepts tokenless writes: the event trigger that
# refuses a broken lockfence trigger lets it through with a warning when
# check_function_bodies is off (as pg_dump's output and pg_restore set it),
# the restored table keeps failing closed, and check() reports it.  (Since
# 1.10 the DROP COLUMN is refused; made here with the event triggers away,
# as a database from before 1.10 may hold such a table.)
$source->safe_psql('postgres', 'CREATE DATABASE broken');
$source->safe_psql('broken', q{
	CREATE EXTENSION lockfence;
	CREATE TABLE t (id int, tok bigint);
	SELECT lockfence.protect('t', resource => 't', token_column => 'tok');
	ALTER EVENT TRIGGER lockfence_forget_dropped_tables DISABLE;
	ALTER EVENT TRIGGER lockfence_check_new_triggers DISABLE;
	ALTER TABLE t DROP COLUMN tok;
	ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE;
	ALTER EVENT TRIGGER lockfence_forget_dropped_tables ENABLE ALWAYS;
});
my ($ret, $stdout, $stderr) = $source->psql('broken', "\\set VERBOSITY verbose\nINSERT INTO t VALUES (1)");
like($stderr, qr/ERROR:  42703/, 'source: a write to the broken table fails (42703)');

sub check_broken_copy
{
	my ($node, $db, $label) = @_;
	is( $node->safe_psql($db,
			"SELECT string_agg(tgname, ',' ORDER BY tgname) FROM pg_trigger WHERE tgrelid = 't'::regclass"),
		'zz_lockfence_fence,zz_lockfence_fence_truncate',
		"$label: the broken table keeps its lockfence triggers");
	my ($r, $o, $e) = $node->psql($db, "\\set VERBOSITY verbose\nINSERT INTO t VALUES (2)");
	isnt($r, 0, "$label: a tokenless INSERT into it is refused");
	like($e, qr/ERROR:  42703/, "$label: ... as in the source");
	is($node->safe_psql($db, 'SELECT count(*) FROM t'), '0', "$label: nothing was written");
	like( $node->safe_psql($db,
			"SELECT string_agg(finding || ': ' || detail, E'\\n') FROM lockfence.check() WHERE severity = 'error'"),
		qr/^trigger_invalid: Trigger zz_lockfence_fence on public\.t: column "tok" named by lockfence trigger argument "token_column" does not exist/m,
		"$label: check() reports the broken trigger");
	return;
}

my $broken_custom = "$tempdir/broken.dump";
$source->command_ok([ 'pg_dump', '-Fc', '-f', $broken_custom, 'broken' ],
	'pg_dump -Fc of the broken table');
$source->safe_psql('postgres', 'CREATE DATABASE broken_dst');
my ($restore_out, $restore_err);
# --verbose: pg_restore shows the server's warnings only then.
IPC::Run::run([ 'pg_restore', '--verbose', '-d', $source->connstr('broken_dst'), $broken_custom ],
	'>', \$restore_out, '2>', \$restore_err);
unlike($restore_err, qr/ERROR/, 'pg_restore of the broken table: no error')
  or diag $restore_err;
like($restore_err, qr/WARNING:  column "tok" named by lockfence trigger argument "token_column" does not exist/,
	'... but a warning naming the broken trigger');
check_broken_copy($source, 'broken_dst', 'broken, pg_restore');

my $broken_plain = "$tempdir/broken.sql";
$source->command_ok([ 'pg_dump', '-f', $broken_plain, 'broken' ],
	'pg_dump plain of the broken table');
$target->safe_psql('postgres', 'CREATE DATABASE broken');
$target->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', 'broken', '-f', $broken_plain ],
	'plain dump of the broken table restored with ON_ERROR_STOP');
check_broken_copy($target, 'broken', 'broken, plain');

# 4. A restore that brings the tables and their data but not their
# triggers (issue 17, item 10): the registry of protected tables comes
# with the data, so check() reports each protected table that lost its
# triggers.  Nothing fires without the trigger, so a tokenless write is
# accepted until lockfence.protect() runs again (the documented residual);
# after that it is refused and check() is clean.
sub check_unguarded_copy
{
	my ($node, $db, $label) = @_;

	is($node->safe_psql($db, $triggers_query),
		'', "$label: no lockfence trigger was restored");
	is($node->safe_psql($db, $registry_query),
		'public.accounts,public.items', "$label: the registry of protected tables is restored");
	is( $node->safe_psql($db, $check_errors_query),
		"protected_table_unguarded: Table public.accounts was protected by lockfence (lockfence.protected_tables lists it) but has no lockfence trigger: its writes are not fenced.  A restore without the triggers (data only, or without post-data) leaves a table so.\n"
		  . "protected_table_unguarded: Table public.items was protected by lockfence (lockfence.protected_tables lists it) but has no lockfence trigger: its writes are not fenced.  A restore without the triggers (data only, or without post-data) leaves a table so.",
		"$label: check() reports both protected tables as unguarded");
	like( $node->safe_psql($db,
			"SELECT hint FROM lockfence.check() WHERE finding = 'protected_table_unguarded' ORDER BY detail LIMIT 1"),
		qr/^SELECT lockfence\.protect\('public\.accounts', \.\.\.\) again/,
		"$label: ... with protect() as the hint");
	$node->safe_psql($db, "INSERT INTO items VALUES (90, 'tokenless', NULL)");
	is($node->safe_psql($db, 'SELECT val FROM items WHERE id = 90'),
		'tokenless', "$label: without its trigger, a tokenless INSERT is accepted");

	$node->safe_psql($db, q{
		SELECT lockfence.protect('items', resource => 'shop', token_column => 'token');
		SELECT lockfence.protect('accounts', resource_column => 'name', resource_prefix => 'acct:');
	});
	my ($r, $o, $e) = $node->psql($db, "\\set VERBOSITY verbose\nINSERT INTO items VALUES (91, 'tokenless', NULL)");
	like($e, qr/ERROR:  LF002: write to protected table "items" carries no fencing token/,
		"$label: protected again, a tokenless INSERT is refused");
	($r, $o, $e) = $node->psql($db, "\\set VERBOSITY verbose\nUPDATE accounts SET balance = 0");
	like($e, qr/ERROR:  LF002: write to protected table "accounts" carries no fencing token/,
		"$label: ... and a tokenless UPDATE of the per-row table");
	is($node->safe_psql($db, $check_errors_query),
		'', "$label: protected again, check() reports no error");
	is($node->safe_psql($db, 'SELECT count(*) FROM lockfence.protected_tables'),
		'2', "$label: one registry row per table");
	return;
}

$source->safe_psql('postgres', 'CREATE DATABASE nopost');
$source->command_ok(
	[ 'pg_restore', '--exit-on-error', '--section=pre-data', '--section=data',
	  '-d', 'nopost', $custom ],
	'pg_restore --section=pre-data --section=data (no post-data)');
accept_restore($source, 'nopost', 'restore without post-data');
check_unguarded_copy($source, 'nopost', 'restore without post-data');

$source->safe_psql('postgres', 'CREATE DATABASE dataonly');
$source->command_ok(
	[ 'pg_restore', '--exit-on-error', '--section=pre-data', '-d', 'dataonly', $custom ],
	'pg_restore --section=pre-data (the schema without post-data)');
is($source->safe_psql('dataonly', 'SELECT count(*) FROM lockfence.protected_tables'),
	'0', 'schema only: the registry is empty');
$source->command_ok(
	[ 'pg_restore', '--exit-on-error', '--data-only', '-d', 'dataonly', $custom ],
	'pg_restore --data-only into it');
accept_restore($source, 'dataonly', 'data-only restore');
check_unguarded_copy($source, 'dataonly', 'data-only restore');

# 5. A dump that leaves out a protected table (pg_dump -T): its row of
# lockfence.protected_tables is still in the data, and the restore must
# not fail on it (--exit-on-error).  The restored table is listed and
# guarded; check() reports the left-out table as missing (a warning) and
# nothing else.
my $partial = "$tempdir/partial.dump";
$source->command_ok([ 'pg_dump', '-Fc', '-T', 'accounts', '-f', $partial, 'src' ],
	'pg_dump -Fc -T accounts');
$source->safe_psql('postgres', 'CREATE DATABASE partial');
$source->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', 'partial', $partial ],
	'pg_restore --exit-on-error of a dump without one protected table');
accept_restore($source, 'partial', '-T restore');
is($source->safe_psql('partial', $registry_query),
	'public.accounts,public.items',
	'-T restore: the list holds the restored table and the left-out one');
is( $source->safe_psql('partial',
		q{SELECT string_agg(severity || ' ' || finding || ': ' || detail, E'\n' ORDER BY finding, detail)
		    FROM lockfence.check() WHERE severity IN ('error', 'warning') AND finding <> 'not_preloaded'}),
	"warning protected_table_missing: Table public.accounts is listed as protected but does not exist: dropped or renamed while lockfence's event triggers were disabled, or left out of the dump this database was restored from.",
	'-T restore: check() reports the left-out table as missing, and nothing else');
$source->safe_psql('partial', q{
	SELECT lockfence.sync_protected_tables(forget => ARRAY['public.accounts'])});
is($source->safe_psql('partial', $registry_query),
	'public.items', '-T restore: the hint removes the missing name');

# 6. A schema-only restore (-s: the triggers included), then a data-only
# one (docs/operations.md): the triggers refuse the protected tables' rows
# (LF002) and the registry's rows are there already.  The documented
# steps restore the data: --disable-triggers (superuser) with a list
# without the registry's data, floor_state's triggers ALWAYS again, then
# the restore accepted as any other.
my $list_all = '';
IPC::Run::run([ 'pg_restore', '-l', $custom ], '>', \$list_all)
  or die "pg_restore -l failed";
my $list = "$tempdir/without-registry.list";
PostgreSQL::Test::Utils::append_to_file($list,
	join("\n", grep { !/TABLE DATA lockfence protected_tables/ } split /\n/, $list_all) . "\n");
for my $db ('schemafirst_plain', 'schemafirst')
{
	$source->safe_psql('postgres', "CREATE DATABASE $db");
	$source->command_ok(
		[ 'pg_restore', '--exit-on-error', '--schema-only', '-d', $db, $custom ],
		"pg_restore --schema-only into $db");
}
$source->command_fails_like(
	[ 'pg_restore', '--data-only', '-L', $list, '-d', 'schemafirst_plain', $custom ],
	qr/carries no fencing token/,
	'schema first: a data-only restore without --disable-triggers is refused by the triggers');
is($source->safe_psql('schemafirst_plain', 'SELECT count(*) FROM items'),
	'0', 'schema first: ... and restores no protected row');
$source->command_ok(
	[ 'pg_restore', '--exit-on-error', '--data-only', '--disable-triggers', '-L', $list,
	  '-d', 'schemafirst', $custom ],
	'schema first: pg_restore --data-only --disable-triggers -L (without the registry)');
is($source->safe_psql('schemafirst', $data_query),
	$source_data, 'schema first: the protected rows are restored');
is($source->safe_psql('schemafirst', $fences_query),
	$source_fences, 'schema first: the fences are restored');
is($source->safe_psql('schemafirst',
		"SELECT string_agg(finding, ',' ORDER BY detail) FROM lockfence.check() WHERE finding = 'floor_trigger_not_always'"),
	'floor_trigger_not_always,floor_trigger_not_always',
	"schema first: --disable-triggers left floor_state's triggers ordinary, and check() says so");
$source->safe_psql('schemafirst',
	'ALTER TABLE lockfence.floor_state ENABLE ALWAYS TRIGGER floor_state_changed, '
	  . 'ENABLE ALWAYS TRIGGER floor_state_truncated');
is($source->safe_psql('schemafirst',
		"SELECT count(*) FROM lockfence.check() WHERE finding = 'floor_trigger_not_always'"),
	'0', 'schema first: the documented ALTER TABLE enables them ALWAYS again');
accept_restore($source, 'schemafirst', 'schema first');
is($source->safe_psql('schemafirst', $check_errors_query),
	'', 'schema first: check() reports no error');
is($source->safe_psql('schemafirst', $registry_query),
	'public.accounts,public.items', 'schema first: one registry row per table');
my ($sf_ret, $sf_out, $sf_err) = $source->psql('schemafirst',
	"\\set VERBOSITY verbose\nBEGIN; SELECT lockfence.fence('shop', 19); UPDATE items SET token = 19;");
like($sf_err, qr/ERROR:  LF001: stale fencing token for resource "shop"/,
	'schema first: a stale token is rejected');
($sf_ret, $sf_out, $sf_err) = $source->psql('schemafirst',
	"\\set VERBOSITY verbose\nDELETE FROM accounts");
like($sf_err, qr/ERROR:  LF002: write to protected table "accounts" carries no fencing token/,
	'schema first: a tokenless write is refused');

# The source itself is unchanged by all this.
is($source->safe_psql('src', $fences_query),
	$source_fences, 'source fences unchanged');

$target->stop;
$source->stop;
done_testing();
