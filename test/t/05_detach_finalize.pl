# Copyright: the lockfence authors
#
# 05_detach_finalize.pl
#	  A partition whose DETACH ... CONCURRENTLY was interrupted, and that
#	  ALTER TABLE ... DETACH PARTITION ... FINALIZE then detaches, keeps its
#	  protected parent's lockfence row trigger (as a plain DETACH does; see
#	  sql/protect_ddl.sql).  An interrupted concurrent detach cannot be made
#	  in pg_regress's single session.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $node = PostgreSQL::Test::Cluster->new('detach');
init_node($node);
$node->start;

$node->safe_psql('postgres', q{
	CREATE EXTENSION lockfence;
	CREATE TABLE dp (id int, v int) PARTITION BY LIST (id);
	CREATE TABLE dp1 PARTITION OF dp FOR VALUES IN (1);
	SELECT lockfence.protect('dp', resource => 'dp');
	BEGIN;
	SELECT lockfence.fence('dp', 1);
	INSERT INTO dp VALUES (1, 1);
	COMMIT;
});

# An open transaction that has read the parent makes the second step of
# DETACH ... CONCURRENTLY wait for it; cancelling the wait leaves the
# partition detach-pending.
my $reader = $node->background_psql('postgres');
$reader->query_safe('BEGIN');
$reader->query_safe('SELECT count(*) FROM dp');

my $detacher = $node->background_psql('postgres', on_error_stop => 0);
my $detacher_pid = $detacher->query_safe('SELECT pg_backend_pid()');
$detacher->query_until(qr/sent/,
	"\\echo sent\nALTER TABLE dp DETACH PARTITION dp1 CONCURRENTLY;\n");
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $detacher_pid"),
	'DETACH CONCURRENTLY waits for the reader');
$node->safe_psql('postgres', "SELECT pg_cancel_backend($detacher_pid)");
ok( $node->poll_query_until(
		'postgres',
		"SELECT state = 'idle' FROM pg_stat_activity WHERE pid = $detacher_pid"),
	'the cancelled DETACH has ended');
$detacher->quit;
$reader->query_safe('COMMIT');
$reader->quit;

is( $node->safe_psql('postgres',
		"SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = 'dp1'::regclass"),
	't', 'the partition is left detach-pending');

my ($ret, $out, $err) = $node->psql('postgres',
	'ALTER TABLE dp DETACH PARTITION dp1 FINALIZE');
is($ret, 0, 'DETACH ... FINALIZE succeeds');
like($err, qr/stays protected by lockfence trigger "zz_lockfence_fence_detached"/,
	'and says that the detached table stays protected');
is( $node->safe_psql('postgres',
		"SELECT string_agg(tgname || ' ' || array_to_string(lockfence.trigger_arguments(tgargs), ','), '; ' ORDER BY tgname)
		   FROM pg_trigger WHERE tgrelid = 'dp1'::regclass"),
	'zz_lockfence_fence_detached resource=dp; zz_lockfence_fence_truncate resource=dp',
	'the detached table has the parent\'s row trigger, arguments and all');

($ret, $out, $err) = $node->psql('postgres', 'UPDATE dp1 SET v = 666');
like($err, qr/carries no fencing token/, 'a tokenless write to the detached table is rejected');
is($node->safe_psql('postgres', 'SELECT v FROM dp1'), '1', 'its row is unchanged');
is( $node->safe_psql('postgres', q{
		BEGIN;
		SELECT lockfence.fence('dp', 2);
		UPDATE dp1 SET v = 2;
		COMMIT;
		SELECT v FROM dp1;
	}),
	"2\n2", 'a fenced write goes through');

$node->stop;
done_testing();
