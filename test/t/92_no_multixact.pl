# Copyright: the lockfence authors
#
# 92_no_multixact.pl
#	  Concurrent transactions fencing one resource with one token create no
#	  MultiXact.
#
# Up to 1.3 every equal-token fence locked the fence row FOR SHARE: the
# second concurrent locker of a row makes PostgreSQL create a MultiXact,
# and every further one another (measured: 27,815 in 15 s of 8 clients).
# Since 1.4 an equal-token fence takes a heavyweight lock on the resource
# (src/fence_lock.c) and leaves the row alone.
#
# 1. Deterministic: four sessions fence ('hot', 1) and write their own row,
#	 all four open at once, then commit.  The MultiXact counter
#	 (next_multixact_id of the checkpoint after) does not move.
# 2. Under load: pgbench, 8 clients, each transaction fence('hot', 1,
#	 'leader') and an UPDATE of its own row; no MultiXact either, as for the
#	 same UPDATEs unprotected.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $node = PostgreSQL::Test::Cluster->new('mxid');
init_node($node);
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION lockfence;
	CREATE TABLE t (id int PRIMARY KEY, v int);
	INSERT INTO t SELECT g, 0 FROM generate_series(1, 64) g;
	CREATE TABLE u (id int PRIMARY KEY, v int);
	INSERT INTO u SELECT g, 0 FROM generate_series(1, 64) g;
	SELECT lockfence.protect('t', resource => 'hot');
	SELECT lockfence.fence('hot', 1, 'leader');
});

sub next_mxid
{
	return $node->safe_psql('postgres',
		'CHECKPOINT; SELECT next_multixact_id FROM pg_control_checkpoint()');
}

# --- 1. four open transactions ------------------------------------------------

my $before = next_mxid();
my @s = map { $node->background_psql('postgres') } 1 .. 4;
for my $i (0 .. $#s)
{
	my $id = $i + 1;
	$s[$i]->query_safe("BEGIN; SELECT lockfence.fence('hot', 1, 'leader');"
		  . " UPDATE t SET v = v + 1 WHERE id = $id;");
}
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM pg_locks
	 WHERE locktype = 'advisory' AND objsubid = 19526
	   AND mode = 'ShareLock' AND granted}),
	'4', 'four transactions hold the resource lock at once');
$_->query_safe('COMMIT') for @s;
$_->quit for @s;
is(next_mxid(), $before, 'four concurrent equal-token fences created no MultiXact');
is($node->safe_psql('postgres', 'SELECT sum(v) FROM t'), '4', 'their writes committed');

# --- 2. pgbench -------------------------------------------------------------------

sub bench
{
	my ($name, $sql) = @_;
	my $start = next_mxid();
	$node->pgbench('-n -c 8 -j 2 -t 150', 0, [qr/processed: 1200\/1200/],
		[qr/^$/], $name, { "092_$name" => $sql });
	return next_mxid() - $start;
}

is(bench('unprotected', q{
\set id random(1, 8)
UPDATE u SET v = v + 1 WHERE id = :client_id + 1;
}), 0, 'unprotected UPDATEs: no MultiXact');
is(bench('fenced', q{
BEGIN;
SELECT lockfence.fence('hot', 1, 'leader');
UPDATE t SET v = v + 1 WHERE id = :client_id + 1;
COMMIT;
}), 0, 'fenced UPDATEs under one token, 8 clients: no MultiXact');

$node->stop;
done_testing();
