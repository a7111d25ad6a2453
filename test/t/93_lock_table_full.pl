# Copyright: the lockfence authors
#
# 93_lock_table_full.pl
#	  A transaction that fences more resources than the shared lock table
#	  holds fails with PostgreSQL's own "out of shared memory" (53200) and
#	  its hint, and fences nothing.
#
# Each resource fenced in a transaction holds one resource lock (an entry of
# the shared lock table, src/fence_lock.c) until the transaction ends.  The
# table is sized by max_locks_per_transaction; running out must be a clear
# error, never a silent acceptance.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $node = PostgreSQL::Test::Cluster->new('locks');
init_node($node);
$node->append_conf('postgresql.conf',
	"max_locks_per_transaction = 10\nmax_connections = 10\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION lockfence');

my ($ret, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT lockfence.fence(ARRAY(SELECT 'r' || g FROM generate_series(1, 20000) g), 1)");
isnt($ret, 0, 'fencing 20000 resources in one transaction fails');
like($err, qr/ERROR:\s+53200: out of shared memory/, 'with 53200 out of shared memory');
like($err, qr/HINT:\s+You might need to increase "?max_locks_per_transaction"?/,
	'and the hint to raise max_locks_per_transaction');
is($node->safe_psql('postgres', 'SELECT count(*) FROM lockfence.fences'),
	'0', 'nothing was fenced');

is($node->safe_psql('postgres',
	"SELECT lockfence.fence(ARRAY(SELECT 'r' || g FROM generate_series(1, 20) g), 1)"),
	'1', 'twenty resources in one transaction are fenced');
is($node->safe_psql('postgres', 'SELECT count(*) FROM lockfence.fences'),
	'20', 'their rows are there');

$node->stop;
done_testing();
