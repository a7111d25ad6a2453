# Copyright: the lockfence authors
#
# 91_resource_lock_2pc.pl
#	  The resource lock of an equal-token fence (src/fence_lock.c) survives
#	  PREPARE TRANSACTION, a crash, and the promotion of a standby.
#
# An equal-token fence takes no row lock, only a transaction-level
# heavyweight lock on the resource.  PostgreSQL carries such a lock into a
# prepared transaction and gives it back to the prepared transaction when
# it recovers it (after a crash, or at the promotion of a standby), before
# connections are accepted.  So an advance to the next token must wait
# until COMMIT PREPARED or ROLLBACK PREPARED in every case:
#
# 1. prepared, same server;
# 2. prepared, then pg_ctl stop -m immediate and a restart;
# 3. prepared on a primary, replayed by a standby, the primary stopped
#	 (-m immediate) and the standby promoted.
#
# "Waits" is a lock_timeout of 300 ms elapsing on the advance (55P03) while
# pg_locks shows the prepared transaction holding the resource lock; then
# the prepared transaction ends and the same advance is accepted.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $primary = PostgreSQL::Test::Cluster->new('primary');
init_node($primary, allows_streaming => 1);
$primary->append_conf('postgresql.conf', "max_prepared_transactions = 5\n");
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION lockfence;
	CREATE TABLE items (id int PRIMARY KEY, v int);
	SELECT lockfence.protect('items', resource => 'r');
	SELECT lockfence.fence('r', 5, 'A');
	INSERT INTO items SELECT g, 0 FROM generate_series(1, 3) g
		WHERE lockfence.fence('r', 5, 'A') IS NOT NULL;
});

# The prepared transaction gid (the only one) holds the resource lock on
# the node: a lock without a process is a prepared transaction's.
sub prepared_lock_held
{
	my ($node, $gid) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT count(*) FROM pg_locks l
		 WHERE l.locktype = 'advisory' AND l.objsubid = 19526
		   AND l.mode = 'ShareLock' AND l.granted AND l.pid IS NULL
		   AND (SELECT pg_catalog.array_agg(gid) FROM pg_prepared_xacts) = ARRAY['$gid']});
}

# An advance to token, bounded by a 300 ms lock_timeout: its SQLSTATE, or
# "accepted".
sub advance
{
	my ($node, $token) = @_;
	my ($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSET lock_timeout = '300ms';"
		  . " SELECT lockfence.fence('r', $token, 'B')");
	return 'accepted' if $ret == 0;
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return $state // $err;
}

# A prepared transaction that fenced the current token and wrote.
sub prepare_fence
{
	my ($node, $gid, $token, $holder) = @_;
	$node->safe_psql('postgres', qq{
		BEGIN;
		SELECT lockfence.fence('r', $token, '$holder');
		UPDATE items SET v = v + 1 WHERE id = 1;
		PREPARE TRANSACTION '$gid';
	});
}

# --- 1. prepared -------------------------------------------------------------

prepare_fence($primary, 'p1', 5, 'A');
is(prepared_lock_held($primary, 'p1'), '1',
	'prepared: the prepared transaction holds the resource lock');
is($primary->safe_psql('postgres',
	"SELECT xmax::text = '0' FROM lockfence.fences WHERE resource = 'r'"),
	't', 'prepared: the fence row itself is not locked');
is(advance($primary, 6), '55P03', 'prepared: the advance waits');
$primary->safe_psql('postgres', "COMMIT PREPARED 'p1'");
is(advance($primary, 6), 'accepted', 'after COMMIT PREPARED the advance is accepted');

# --- 2. prepared, crash, restart ----------------------------------------------

prepare_fence($primary, 'p2', 6, 'B');
$primary->stop('immediate');
$primary->start;
is(prepared_lock_held($primary, 'p2'), '1',
	'crash: the recovered prepared transaction holds the resource lock');
is(advance($primary, 7), '55P03', 'crash: the advance still waits');
$primary->safe_psql('postgres', "ROLLBACK PREPARED 'p2'");
is(advance($primary, 7), 'accepted', 'after ROLLBACK PREPARED the advance is accepted');

# --- 3. prepared, standby promoted ---------------------------------------------

$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->append_conf('postgresql.conf', "max_prepared_transactions = 5\n");
$standby->start;

prepare_fence($primary, 'p3', 7, 'B');
$primary->wait_for_catchup($standby);
$primary->stop('immediate');
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'standby not promoted';
# Nothing was lost: the operator accepts the promotion (lockfence's
# failover guard refuses fences until then).
$standby->safe_psql('postgres', 'SELECT lockfence.accept_promotion()');
is(prepared_lock_held($standby, 'p3'), '1',
	'promotion: the prepared transaction holds the resource lock on the new primary');
is(advance($standby, 8), '55P03', 'promotion: the advance waits');
$standby->safe_psql('postgres', "COMMIT PREPARED 'p3'");
is(advance($standby, 8), 'accepted', 'after COMMIT PREPARED the advance is accepted');
is($standby->safe_psql('postgres', 'SELECT v FROM items WHERE id = 1'),
	'2', 'the committed prepared writes are there, the rolled back one is not');

$standby->stop;
done_testing();
