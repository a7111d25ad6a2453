# Copyright: the lockfence authors
#
# 88_promotion_guard.pl
#	  A promoted server refuses every fenced write and lease operation
#	  (SQLSTATE LF004) from its first writable moment until the floor is
#	  raised or the promotion accepted (issue 23 items 1 to 4).
#
# A lossy asynchronous failover: the standby is stopped, the primary goes
# on fencing and granting, then dies; the standby is promoted without
# those advances.  Right after the promotion every fence path (fence,
# try_fence, the array form, a protected table's trigger) and every lease
# function is refused, in new sessions and in a session that was open on
# the standby before.  raise_floor(F, resources) does not lift it;
# raise_floor(F) does, and then also covers a resource whose row the
# failover lost entirely (the global floor), for fences and lease grants.
# A second, lossless promotion is accepted with accept_promotion()
# (operators only).  A dump restored into another cluster is refused until
# accepted.  floor_status() reports all of it.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $tempdir = PostgreSQL::Test::Utils::tempdir;

# Verbose psql: (stdout, sqlstate, stderr).
sub try_sql
{
	my ($node, $sql, $db) = @_;
	my ($out, $err) = ('', '');
	$node->psql($db // 'postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out, stderr => \$err);
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($out, $state // '', $err);
}

sub status
{
	my ($node, $db, $cols) = @_;
	$cols //= 'writes_refused, floor, recorded_timeline, timeline';
	my ($out) = try_sql($node, "SELECT $cols FROM lockfence.floor_status()", $db);
	chomp $out;
	return $out;
}

my $primary = PostgreSQL::Test::Cluster->new('guard_primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', "shared_preload_libraries = 'lockfence'");
$primary->start;
$primary->safe_psql(
	'postgres', q{
	CREATE EXTENSION lockfence;
	CREATE ROLE app LOGIN;
	CREATE TABLE ledger (id int PRIMARY KEY, amount int, token bigint);
	SELECT lockfence.protect('ledger', resource => 'ledger', token_column => 'token');
	GRANT ALL ON ledger TO app;
	SELECT lockfence.grant_usage('app');
	SELECT lockfence.fence('r1', 10), lockfence.fence('r2', 20);
	INSERT INTO ledger VALUES (1, 100, 5);
	SELECT token FROM lockfence.lease_acquire('L1', '1 hour', 'old-holder');
});
is(status($primary), 'f|0|1|1', 'a new installation records its own identity: nothing refused');

$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('guard_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby, 'replay');
is(status($standby, 'postgres', 'in_recovery, writes_refused'),
	't|f', 'a standby in recovery: nothing refused (nothing can be written there)');

# --- the lossy failover -------------------------------------------------------

$standby->stop;
$primary->safe_psql(
	'postgres', q{
	SELECT lockfence.fence('r1', 30);
	SELECT lockfence.fence('lost', 50);
	SELECT lockfence.lease_release('L1', 1);
	SELECT token FROM lockfence.lease_acquire('L1', '1 hour', 'new-holder');
	SELECT token FROM lockfence.lease_acquire('lostlease', '1 hour', 'x');
});
my ($out, $state) = try_sql($primary, "SELECT lockfence.fence('lost', 40)");
is($state, 'LF001', 'on the old primary, lost@50 rejects token 40');
$primary->stop('immediate');

$standby->start;
# A session open on the standby before its promotion (it read there).
my $early = $standby->background_psql('postgres', on_error_stop => 0);
$early->query_safe("SELECT lockfence.current_token('r1')");
$standby->promote;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 'f', 'standby promoted');

# Immediately: every path refused.
my @refused = (
	[ "SELECT lockfence.fence('r1', 30)", 'fence() with the newest token' ],
	[ "SELECT lockfence.fence('r1', 10)", 'fence() with a superseded token' ],
	[ "SELECT lockfence.fence('lost', 40)", 'fence() of a resource whose row was lost' ],
	[ "SELECT lockfence.try_fence('r2', 20)", 'try_fence()' ],
	[ "SELECT lockfence.try_fence('lost', 40)", 'try_fence() of a lost resource' ],
	[ "SELECT lockfence.fence(ARRAY['r1', 'r2'], 60)", 'fence(text[])' ],
	[ "SELECT lockfence.try_fence(ARRAY['r1', 'r2'], 60)", 'try_fence(text[])' ],
	[ "INSERT INTO ledger VALUES (2, 1, 70)", 'a protected table\'s INSERT with a token' ],
	[ "SELECT * FROM lockfence.lease_acquire('L1', '1 hour', 'old-holder', '1s')", 'lease_acquire() of a lost lease' ],
	[ "SELECT * FROM lockfence.lease_try_acquire('lostlease', '1 hour')", 'lease_try_acquire()' ],
	[ "SELECT lockfence.lease_renew('L1', 1)", 'lease_renew() of the lease the old primary released' ],
	[ "SELECT lockfence.lease_release('L1', 1)", 'lease_release()' ],
);
for my $case (@refused)
{
	my ($sql, $what) = @$case;
	my ($o, $s, $err) = try_sql($standby, $sql);
	is($s, 'LF004', "right after the promotion: $what is refused with LF004");
}
my ($o, $s, $err) = try_sql($standby, "SELECT lockfence.fence('r1', 30)");
like($err, qr/this server was promoted and its fence floor has not been raised/,
	'... saying the server was promoted');
like($err, qr/recorded on timeline 1; this server writes timeline 2/,
	'... with both timelines');
like($err, qr/lockfence\.etcd_raise_floor\(\).*lockfence\.raise_floor\(floor\).*lockfence\.accept_promotion\(\)/s,
	'... and the functions that lift it');
($o, $s) = try_sql($standby, "SET ROLE app; SELECT lockfence.fence('r1', 30)");
is($s, 'LF004', 'an application role is refused too');

$early->query("SELECT lockfence.fence('r1', 30)");
like($early->{stderr}, qr/LF004|fence floor has not been raised/,
	'a session opened before the promotion is refused too');
$early->{stderr} = '';

is(status($standby), 't|0|1|2', 'floor_status(): writes refused, recorded timeline 1, current 2');
is($standby->safe_psql('postgres', "SELECT value FROM lockfence.metrics WHERE name = 'floor_required'"),
	'1', 'the floor_required gauge is 1');
is($standby->safe_psql('postgres', "SELECT lockfence.current_token('r1')"),
	'10', 'reads still work (the fence of r1 is back at 10)');

like($standby->safe_psql('postgres', "SELECT severity || ' ' || finding FROM lockfence.check()"),
	qr/^error floor_not_raised$/m, 'check() reports the floor not raised as an error');
like($standby->safe_psql('postgres', "SELECT hint FROM lockfence.check() WHERE finding = 'floor_not_raised'"),
	qr/etcd_raise_floor\(\).*raise_floor\(.*accept_promotion\(\)/s, '... with what to run');

# A floor for named resources only does not lift the refusal.
$standby->safe_psql('postgres', "SELECT lockfence.raise_floor(100, ARRAY['r1'])");
($o, $s) = try_sql($standby, "SELECT lockfence.fence('r2', 200)");
is($s, 'LF004', 'raise_floor(F, resources) leaves the refusal in place');

# The floor for every name lifts it.
is($standby->safe_psql('postgres', 'SELECT lockfence.raise_floor(100)'),
	'3', 'raise_floor(100) raises r2, ledger and L1 (r1 was raised already)');
is(status($standby), 'f|100|2|2', 'floor_status(): nothing refused, floor 100, timeline 2 recorded');
is($standby->safe_psql('postgres', "SELECT value FROM lockfence.metrics WHERE name = 'floor_required'"),
	'0', 'the floor_required gauge is back to 0');
is($standby->safe_psql('postgres', "SELECT count(*) FROM lockfence.check() WHERE finding = 'floor_not_raised'"),
	'0', 'check() no longer reports it');

my $accepted = 0;
for my $rt ([ 'r1', 30 ], [ 'r1', 10 ], [ 'r2', 20 ], [ 'lost', 50 ], [ 'lost', 40 ],
	[ 'never-seen', 99 ])
{
	my ($r, $t) = @$rt;
	($o, $s) = try_sql($standby, "SELECT lockfence.fence('$r', $t)");
	is($s, 'LF001', "after the floor: superseded token $t for $r rejected (LF001)");
	$accepted++ if $s eq '';
}
is($accepted, 0, '0 superseded tokens accepted, rowless resources included');
is($standby->safe_psql('postgres', "SELECT lockfence.try_fence('lost2', 99)"),
	'f', 'try_fence() of a rowless resource below the floor: false');
is($standby->safe_psql('postgres', "SELECT lockfence.fence('lost', 100, 'h')"),
	'100', 'the floor itself is accepted for a rowless resource');
is($standby->safe_psql('postgres', "SELECT lockfence.fence('r2', 101)"),
	'101', 'an honest token above the floor is accepted');
is($standby->safe_psql('postgres', "INSERT INTO ledger VALUES (2, 1, 150) RETURNING id"),
	'2', 'a protected INSERT with a fresh token is accepted');
is($standby->safe_psql('postgres', "SELECT token FROM lockfence.lease_acquire('lostlease', '1 hour')"),
	'101', 'a lease on a name without a row starts above the floor');
is($standby->safe_psql('postgres', "SELECT token FROM lockfence.lease_acquire('brand-new', '1 hour')"),
	'101', 'so does a lease on a brand-new name');

$early->query("SELECT lockfence.fence('r1', 120)");
is($early->{stderr}, '', 'the session that was refused fences again once the floor is raised');
$early->quit;

# --- a lossless promotion, accepted ----------------------------------------

$standby->backup('b2');
my $standby2 = PostgreSQL::Test::Cluster->new('guard_standby2');
$standby2->init_from_backup($standby, 'b2', has_streaming => 1);
$standby2->start;
$standby->safe_psql('postgres', "SELECT lockfence.fence('sync', 150)");
$standby->wait_for_catchup($standby2, 'replay');
$standby->stop;
$standby2->promote;
($o, $s) = try_sql($standby2, "SELECT lockfence.fence('sync', 150)");
is($s, 'LF004', 'a second promotion is refused too');
($o, $s) = try_sql($standby2, "SET ROLE app; SELECT lockfence.accept_promotion()");
is($s, '42501', 'accept_promotion() is for operators only');
is($standby2->safe_psql('postgres', 'SELECT lockfence.accept_promotion()'),
	'100', 'accept_promotion() returns the floor, unchanged');
is($standby2->safe_psql('postgres', "SELECT lockfence.fence('sync', 150)"),
	'150', 'after accept_promotion() the holders go on with their tokens');
($o, $s) = try_sql($standby2, "SELECT lockfence.fence('another-new', 7)");
is($s, 'LF001', 'the earlier global floor still covers names without a row');

# --- a dump restored into another cluster ----------------------------------

my $dump = "$tempdir/guard.dump";
command_ok([ 'pg_dump', '-Fc', '-d', $standby2->connstr('postgres'), '-f', $dump ],
	'pg_dump');
my $other = PostgreSQL::Test::Cluster->new('guard_other');
$other->init;
$other->start;
$other->safe_psql('postgres', 'CREATE ROLE app LOGIN; CREATE DATABASE copy');
command_ok([ 'pg_restore', '-d', $other->connstr('copy'), $dump ], 'pg_restore into another cluster');
is($other->safe_psql('copy', 'SELECT writes_refused FROM lockfence.floor_status()'),
	't', 'the restored copy reports writes refused');
($o, $s, $err) = try_sql($other, "SELECT lockfence.fence('sync', 160)", 'copy');
is($s, 'LF004', 'a fence in the restored copy is refused');
like($err, qr/written by another server/, '... saying the fences come from another server');
$other->safe_psql('copy', 'SELECT lockfence.accept_promotion()');
is($other->safe_psql('copy', "SELECT lockfence.fence('sync', 160)"),
	'160', 'once accepted, the restored copy fences');
is($other->safe_psql('copy', 'SELECT count(*) FROM lockfence.floor_state'),
	'1', 'one identity row recorded');

# A database created in the same cluster from the dump: same server, same
# timeline, but its fences are as old as the dump, and floor_state holds
# the dumped row beside CREATE EXTENSION's: refused too until accepted
# (1.9; before, such a restore fenced at once).
$standby2->safe_psql('postgres', 'CREATE DATABASE same');
command_ok([ 'pg_restore', '-d', $standby2->connstr('same'), $dump ],
	'pg_restore into the same cluster');
is($standby2->safe_psql('same', 'SELECT writes_refused FROM lockfence.floor_status()'),
	't', 'the same-cluster copy reports writes refused');
($o, $s, $err) = try_sql($standby2, "SELECT lockfence.fence('sync', 170)", 'same');
is($s, 'LF004', 'a fence in the same-cluster copy is refused');
like($err, qr/restored from a dump/, '... saying the fences were restored from a dump');
$standby2->safe_psql('same', 'SELECT lockfence.accept_promotion()');
is($standby2->safe_psql('same', "SELECT lockfence.fence('sync', 170)"),
	'170', 'once accepted, the same-cluster copy fences');

# A copy made with CREATE DATABASE ... TEMPLATE: one row, naming this
# server and timeline, but recorded in the original database; the copy's
# fences stop where the original's were when it was made.  Refused until
# accepted (1.10; before, the copy fenced at once, and took a token the
# original had superseded).
$standby2->safe_psql('same', "SELECT lockfence.fence('sync', 171)");
$standby2->safe_psql('postgres', 'CREATE DATABASE tcopy TEMPLATE same');
is($standby2->safe_psql('same', "SELECT lockfence.fence('sync', 180)"),
	'180', 'the original fences on after the copy');
is($standby2->safe_psql('tcopy', 'SELECT writes_refused FROM lockfence.floor_status()'),
	't', 'the template copy reports writes refused');
is($standby2->safe_psql('tcopy',
		'SELECT recorded_database_oid = (SELECT oid FROM pg_database WHERE datname = \'same\'),'
		. ' database_oid = (SELECT oid FROM pg_database WHERE datname = current_database())'
		. ' FROM lockfence.floor_status()'),
	't|t', 'floor_status() (1.11) names the original database as the recorded one, and this one');
($o, $s, $err) = try_sql($standby2, "SELECT lockfence.fence('sync', 175)", 'tcopy');
is($s, 'LF004', 'a token the original superseded is refused in the template copy');
like($err, qr/copied from another database/, '... saying the fences were copied from another database');
like($standby2->safe_psql('tcopy',
		"SELECT detail FROM lockfence.check() WHERE finding = 'floor_not_raised'"),
	qr/copied from another database/, 'check() says the database is a copy');
($o, $s, $err) = try_sql($standby2,
	"INSERT INTO ledger VALUES (99, 1, 175)", 'tcopy');
is($s, 'LF004', 'a protected write in the template copy is refused');
is($standby2->safe_psql('same', 'SELECT writes_refused FROM lockfence.floor_status()'),
	'f', 'the original is not refused');
$standby2->safe_psql('tcopy', 'SELECT lockfence.accept_promotion()');
is($standby2->safe_psql('tcopy', "SELECT lockfence.fence('sync', 176)"),
	'176', 'once accepted, the template copy fences');
is($standby2->safe_psql('tcopy',
		"SELECT count(*) FROM lockfence.floor_state s, pg_database d"
		. " WHERE d.datname = current_database() AND s.database_oid = d.oid"),
	'1', 'the copy now records its own database');
is($standby2->safe_psql('tcopy',
		'SELECT recorded_database_oid = database_oid FROM lockfence.floor_status()'),
	't', 'floor_status() says so');

# An empty copy (a database made from a template holding the extension but
# no fence row, as template1 with lockfence installed): nothing old came
# with it, so it fences at once, and its first fence records the row as
# its own, in the same transaction (1.10).  Once it has fences, a copy of
# it is refused like any other.
$standby2->safe_psql('postgres', 'CREATE DATABASE tmpl_empty');
$standby2->safe_psql('tmpl_empty', 'CREATE EXTENSION lockfence');
$standby2->safe_psql('postgres', 'CREATE DATABASE from_empty TEMPLATE tmpl_empty');
is($standby2->safe_psql('from_empty', 'SELECT writes_refused FROM lockfence.floor_status()'),
	'f', 'an empty copy is not refused');
is($standby2->safe_psql('from_empty',
		"SELECT count(*) FROM lockfence.check() WHERE finding = 'floor_not_raised'"),
	'0', '... and check() reports nothing');
my $own_row = "SELECT count(*) FROM lockfence.floor_state s, pg_database d"
  . " WHERE d.datname = current_database() AND s.database_oid = d.oid";
is($standby2->safe_psql('from_empty', $own_row), '0',
	'... its row still names the template');
# a fence rolled back records nothing
$standby2->safe_psql('from_empty',
	"BEGIN; SELECT lockfence.fence('e', 1); ROLLBACK;");
is($standby2->safe_psql('from_empty', $own_row), '0',
	'a fence rolled back leaves the row as it was');
is($standby2->safe_psql('from_empty', "SELECT lockfence.fence('e', 1)"),
	'1', 'the first fence is accepted');
is($standby2->safe_psql('from_empty', $own_row), '1',
	'... and records the row as this database\'s');
$standby2->safe_psql('postgres', 'CREATE DATABASE from_fenced TEMPLATE from_empty');
($o, $s, $err) = try_sql($standby2, "SELECT lockfence.fence('e', 2)", 'from_fenced');
is($s, 'LF004', 'a copy of it, now holding a fence, is refused');

# raise_floor(N, list) in an empty copy writes fence rows of its own: the
# row is recorded as this database's first, not left to make the copy
# look like one holding fences.
$standby2->safe_psql('postgres', 'CREATE DATABASE from_empty2 TEMPLATE tmpl_empty');
is($standby2->safe_psql('from_empty2', "SELECT lockfence.raise_floor(100, ARRAY['a', 'b'])"),
	'2', 'raise_floor with a list in an empty copy');
is($standby2->safe_psql('from_empty2', $own_row), '1',
	'... records the row as this database\'s');
is($standby2->safe_psql('from_empty2', "SELECT lockfence.fence('a', 100)"),
	'100', '... and the copy fences on');

# The first fenced write of an empty copy, still open, holds the row it
# records: another session's fenced write waits for it (had it gone on, it
# would commit a fence row beside a row naming another database, and the
# copy would be refused), then goes through; nothing is refused.
$standby2->safe_psql('postgres', 'CREATE DATABASE from_empty3 TEMPLATE tmpl_empty');
my $first = $standby2->background_psql('from_empty3');
$first->query_safe("BEGIN");
$first->query_safe("SELECT lockfence.fence('x', 1)");
my $second = $standby2->background_psql('from_empty3');
my $second_pid = $second->query_safe('SELECT pg_backend_pid()');
$second->query_until(qr/started/, "\\echo started\nSELECT token FROM lockfence.lease_try_acquire('l', '10 s');\n");
ok($standby2->poll_query_until('from_empty3',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $second_pid"),
	'a lease_try_acquire beside the open first fence waits for it');
$first->query_safe("COMMIT");
$first->quit;
ok($standby2->poll_query_until('from_empty3',
		"SELECT count(*) = 1 FROM lockfence.fences WHERE resource = 'l'"),
	'... and is granted once the first commits');
$second->quit;
is($standby2->safe_psql('from_empty3', $own_row), '1',
	'the row is this database\'s');
is($standby2->safe_psql('from_empty3', 'SELECT writes_refused FROM lockfence.floor_status()'),
	'f', '... and nothing is refused');

$other->stop;
$standby2->stop;
done_testing();
