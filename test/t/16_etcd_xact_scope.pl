
# 16_etcd_xact_scope.pl
#	  Transaction-scoped etcd locks (issue 9, item 2): etcd_lock and
#	  etcd_try_lock with scope => 'transaction' release the lock when the
#	  transaction that took it ends: commit, abort, or the rollback of the
#	  savepoint it was taken in (a released savepoint passes it on);
#	  etcd_lock_and_fence is transaction-scoped by default; a release that
#	  fails (etcd paused) never fails the commit, and the TTL frees the
#	  lock; session-scoped locks survive their transaction.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'xact');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('etcd_xact',
	"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n");

sub gone { my $k = shift; return LockfenceTest::EtcdCluster::poll_until(5, sub { !defined $etcd->key_info($k) }); }

my $s = LockfenceTest::EtcdCluster::session($node);

# --- commit ------------------------------------------------------------------
$s->query_safe('BEGIN');
my $k1 = $s->query_safe("SELECT key FROM lockfence.etcd_lock('x1', 30, scope => 'transaction')");
chomp $k1;
ok(defined $etcd->key_info($k1), 'transaction-scoped lock held inside its transaction');
$s->query_safe("SELECT 1");
ok(defined $etcd->key_info($k1), '... across statements');
$s->query_safe('COMMIT');
ok(gone($k1), 'released when the transaction commits');
my $lease = hex((split m{/}, $k1)[1]);
ok((grep { $_ eq sprintf('%x', $lease) } $etcd->leases),
	'the session lease stays for the next lock');

# --- abort -------------------------------------------------------------------
$s->query_safe('BEGIN');
my $k2 = $s->query_safe("SELECT key FROM lockfence.etcd_try_lock('x2', 30, scope => 'transaction')");
chomp $k2;
ok(defined $etcd->key_info($k2), 'try_lock: transaction-scoped lock held');
$s->query_safe('ROLLBACK');
ok(gone($k2), 'released when the transaction aborts');

$s->query_safe('BEGIN');
my $k2b = $s->query_safe("SELECT key FROM lockfence.etcd_lock('x2b', 30, scope => 'transaction')");
chomp $k2b;
$s->query("SELECT 1/0");
$s->{stderr} = '';
$s->query_safe('ROLLBACK');
ok(gone($k2b), 'released when the transaction fails');

# --- savepoints ----------------------------------------------------------------
$s->query_safe('BEGIN');
$s->query_safe('SAVEPOINT a');
my $k3 = $s->query_safe("SELECT key FROM lockfence.etcd_lock('x3', 30, scope => 'transaction')");
chomp $k3;
$s->query_safe('ROLLBACK TO SAVEPOINT a');
ok(gone($k3), 'released by the rollback of the savepoint it was taken in');
$s->query_safe('SAVEPOINT b');
my $k4 = $s->query_safe("SELECT key FROM lockfence.etcd_lock('x4', 30, scope => 'transaction')");
chomp $k4;
$s->query_safe('RELEASE SAVEPOINT b');
$s->query_safe('SAVEPOINT c');
$s->query_safe('ROLLBACK TO SAVEPOINT c');
ok(defined $etcd->key_info($k4),
	'a released savepoint passes its lock on: a later rollback to another savepoint keeps it');
$s->query_safe('COMMIT');
ok(gone($k4), '... and the commit releases it');

# --- session scope survives its transaction ---------------------------------
$s->query_safe('BEGIN');
my $k5 = $s->query_safe("SELECT key FROM lockfence.etcd_lock('x5', 30)");
chomp $k5;
$s->query_safe('COMMIT');
ok(defined $etcd->key_info($k5), 'a session-scoped lock (the default) survives the commit');
$s->query_safe('BEGIN');
$s->query_safe('ROLLBACK');
ok(defined $etcd->key_info($k5), '... and a later abort');
is($s->query_safe("SELECT lockfence.etcd_unlock('$k5')"), 't', '... until etcd_unlock');

# --- etcd_lock_and_fence defaults to the transaction -------------------------
$s->query_safe('BEGIN');
my $tok = $s->query_safe("SELECT lockfence.etcd_lock_and_fence('x6', 'res-x6')");
chomp $tok;
my @held = $etcd->keys('x6/');
is(scalar(@held), 1, 'etcd_lock_and_fence holds its lock inside the transaction');
$s->query_safe('COMMIT');
ok(gone($held[0]), 'etcd_lock_and_fence: released at commit by default');
is($node->safe_psql('postgres', "SELECT token FROM lockfence.fences WHERE resource = 'res-x6'"),
	$tok, 'and the fence committed with its token');

# --- a failed release never fails the commit ---------------------------------
$s->query_safe('BEGIN');
my $k7 = $s->query_safe("SELECT key FROM lockfence.etcd_lock('x7', 4, scope => 'transaction')");
chomp $k7;
$s->query_safe("SELECT lockfence.fence('res-x7', 1)");
$etcd->pause_member(0);
my $t0 = time;
my ($out, $err) = ('', '');
$s->query('COMMIT');
my $took = time - $t0;
unlike($s->{stderr} // '', qr/ERROR|WARNING/, 'COMMIT succeeds while etcd does not answer');
$s->{stderr} = '';
ok($took < 3, sprintf('and is not held up by the release (%.2f s)', $took));
$etcd->resume_member(0);
$etcd->wait_healthy();
is($node->safe_psql('postgres', "SELECT token FROM lockfence.fences WHERE resource = 'res-x7'"),
	'1', 'the transaction committed');
ok(LockfenceTest::EtcdCluster::poll_until(20, sub { !defined $etcd->key_info($k7) }),
	'the lock whose release failed is freed by its TTL');

# --- arguments -----------------------------------------------------------------
my $r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT key FROM lockfence.etcd_lock('x8', 30, scope => 'statement')");
is($r->{sqlstate}, '22023', 'an unknown scope is refused (22023)') or diag explain $r;
$r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT key FROM lockfence.etcd_try_lock('x8', 30, scope => NULL)");
is($r->{sqlstate}, '22004', 'a NULL scope is refused (22004)') or diag explain $r;
is_deeply([ $etcd->keys('x8/') ], [], 'neither left a key');

$s->quit;
$node->stop;
$etcd->stop;
done_testing();
