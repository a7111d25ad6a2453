# Copyright: the lockfence authors
#
# 01_crash_recovery.pl
#	  The fence survives crashes.
#
# 1. Fences committed after the last checkpoint survive an immediate stop
#	 (no shutdown checkpoint: crash recovery must replay them from WAL);
#	 a fence in flight at the crash is gone afterwards, even though its WAL
#	 was flushed; stale tokens are still rejected, through lockfence.fence()
#	 and through the protected table's trigger.
# 2. SIGKILL of a backend in the middle of a fencing transaction, while a
#	 second session waits for its row lock: the postmaster kills every
#	 backend and reinitializes, the fence table and its index are intact,
#	 and the killed transaction left nothing behind.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $node = PostgreSQL::Test::Cluster->new('crash');
init_node($node);
$node->append_conf('postgresql.conf', "restart_after_crash = on\n");
$node->start;

# Run SQL expected to fail; return psql's stderr (with the SQLSTATE).
sub sql_error
{
	my ($sql) = @_;
	my ($ret, $stdout, $stderr) =
	  $node->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	isnt($ret, 0, "fails: $sql");
	return $stderr;
}

sub fences
{
	return $node->safe_psql('postgres',
		'SELECT resource, token, holder FROM lockfence.fences ORDER BY resource');
}

$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION lockfence;
	CREATE EXTENSION amcheck;
	CREATE TABLE items (id int PRIMARY KEY, val text, token bigint);
	SELECT lockfence.protect('items', resource => 'shop', token_column => 'token');
	CHECKPOINT;
});

# Committed after the checkpoint: only the WAL has them.
foreach my $i (1 .. 5)
{
	$node->safe_psql('postgres',
		"INSERT INTO items VALUES ($i, 'v$i', $i * 10)");
}
$node->safe_psql('postgres', "SELECT lockfence.fence('other', 7, 'h1')");
is(fences(), "other|7|h1\nshop|50|", 'fences before the crash');

# A transaction in flight at the crash: it advances "shop" to 99, writes a
# row with token 99 and fences a new resource.
my $inflight = $node->background_psql('postgres', on_error_stop => 0);
$inflight->query_safe('BEGIN');
$inflight->query_safe("SELECT lockfence.fence('shop', 99)");
$inflight->query_safe("INSERT INTO items VALUES (100, 'uncommitted', 99)");
$inflight->query_safe("SELECT lockfence.fence('new', 1)");

# Another transaction commits afterwards, which flushes the WAL of the
# in-flight one too: recovery will replay its changes, and must find them
# uncommitted.
$node->safe_psql('postgres', "SELECT lockfence.fence('after', 3)");
is( $node->safe_psql(
		'postgres',
		"SELECT lockfence.current_token('shop'), lockfence.current_token('new') IS NULL"
	),
	'50|t',
	'the in-flight fence is not visible to others before the crash');

my $log_offset = -s $node->logfile;
$node->stop('immediate');
eval { $inflight->quit; };
$node->start;

ok( $node->log_contains(
		'database system was not properly shut down; automatic recovery in progress',
		$log_offset),
	'the restart ran crash recovery');
ok($node->log_contains('redo starts at', $log_offset),
	'crash recovery replayed WAL');

is(fences(), "after|3|\nother|7|h1\nshop|50|",
	'committed fences survive the crash, the in-flight ones are gone');
is($node->safe_psql('postgres', 'SELECT string_agg(id::text, \',\' ORDER BY id) FROM items'),
	'1,2,3,4,5', 'the in-flight row is gone');

like(
	sql_error("SELECT lockfence.fence('shop', 49)"),
	qr/ERROR:  LF001: stale fencing token for resource "shop"/,
	'a stale token is rejected after the crash');
like(
	sql_error("INSERT INTO items VALUES (6, 'stale', 40)"),
	qr/ERROR:  LF001: stale fencing token for resource "shop"/,
	'the trigger rejects a stale token after the crash');
like(
	sql_error("SELECT lockfence.fence('other', 7, 'h2')"),
	qr/ERROR:  LF001: fencing token for resource "other" belongs to another holder/,
	'the holder of a fence survives the crash');
like(
	sql_error("INSERT INTO items VALUES (6, 'none', NULL)"),
	qr/ERROR:  LF002: write to protected table "items" carries no fencing token/,
	'the trigger rejects a write without a token after the crash');
is( $node->safe_psql(
		'postgres', q{
	BEGIN;
	SELECT lockfence.fence('shop', 50);
	INSERT INTO items VALUES (6, 'current', 50);
	COMMIT;
	SELECT lockfence.fence('new', 1);
}),
	"50\n1",
	'the current token and the token that was in flight are accepted');

# 2. SIGKILL of a backend in the middle of a fencing transaction.
my $victim = $node->background_psql('postgres', on_error_stop => 0);
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
$victim->query_safe('BEGIN');
$victim->query_safe("SELECT lockfence.fence('shop', 70)");
$victim->query_safe("INSERT INTO items VALUES (200, 'killed', 70)");
$victim->query_safe("SELECT lockfence.fence('killed', 1)");

# A second holder waits for the victim's row lock on "shop".
my $waiter = $node->background_psql('postgres', on_error_stop => 0);
my $waiter_pid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_until(qr/sent/, "\\echo sent\nSELECT lockfence.fence('shop', 60);\n");
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $waiter_pid"),
	'the second holder waits for the victim');

$log_offset = -s $node->logfile;
is(kill('KILL', $victim_pid), 1, 'SIGKILL sent to the fencing backend');

# The postmaster notices, terminates every backend and reinitializes.
# Wait for its log line saying it is ready again, not with
# poll_query_until: that feeds psql its query on stdin, and a psql that
# cannot connect during the restart exits before reading it, so IPC::Run
# dies writing ("Broken pipe"; seen on 17 in a full run).
$node->wait_for_log(
	qr/all server processes terminated; reinitializing.*database system is ready to accept connections/s,
	$log_offset);
is($node->safe_psql('postgres', "SELECT lockfence.current_token('shop')"),
	'50', 'the server accepts connections again after the crash of a backend');
ok( $node->log_contains(
		"(?:server process|client backend) \\(PID $victim_pid\\) was terminated by signal 9",
		$log_offset),
	'the victim was killed by SIGKILL');
ok( $node->log_contains(
		'all server processes terminated; reinitializing', $log_offset),
	'the postmaster restarted all backends');
eval { $victim->quit; };
eval { $waiter->quit; };

is(fences(), "after|3|\nnew|1|\nother|7|h1\nshop|50|",
	'the fence table holds exactly the committed fences');
is($node->safe_psql('postgres', 'SELECT string_agg(id::text, \',\' ORDER BY id) FROM items'),
	'1,2,3,4,5,6', 'the killed transaction left no row');
is( $node->safe_psql(
		'postgres', q{
	SELECT bt_index_check('lockfence.fences_pkey', true);
	SELECT count(*) FROM verify_heapam('lockfence.fences');
	SET enable_seqscan = off;
	SELECT count(*) FROM lockfence.fences WHERE resource = 'shop';
}),
	"\n0\n1",
	'the fence table and its index are intact');

like(
	sql_error("SELECT lockfence.fence('shop', 49)"),
	qr/ERROR:  LF001: stale fencing token for resource "shop"/,
	'a stale token is rejected after the backend crash');
is($node->safe_psql('postgres', "SELECT lockfence.fence('shop', 60)"),
	'60', 'the token the killed backend held back is accepted now');
like(
	sql_error("SELECT lockfence.fence('shop', 59)"),
	qr/ERROR:  LF001: stale fencing token for resource "shop"/,
	'and the fence advanced');

$node->stop;
done_testing();
