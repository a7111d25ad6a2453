
# 17_etcd_commit_check.pl
#	  The commit-time lock check (issue 9, item 4,
#	  lockfence.etcd_check_at_commit): before a transaction that fenced
#	  with the token of an etcd lock of this backend commits, one etcd
#	  transaction per lock confirms it is still held.
#	  - a holder quiet past its TTL with no successor yet is refused at
#	    commit with LF003 naming the lock, and nothing is written;
#	  - with the check off the same commit goes through (the check is what
#	    refuses it);
#	  - the check sends exactly one request per lock, and none for a
#	    transaction that did not fence with an etcd token (counted at the
#	    fault proxy in front of etcd);
#	  - all_fenced also checks locks named as holder in lockfence.fence;
#	  - a cancel while the check waits for etcd aborts the commit cleanly.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'cchk');
$etcd->start;
my $fault = $etcd->start_fault_server($etcd->client_url(0));
my $f = $fault->url;

my $node = LockfenceTest::EtcdCluster::pg_node('etcd_cchk',
	"lockfence.etcd_endpoints = '$f'\n");
$node->safe_psql('postgres',
	'CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0);');

sub txns { return $fault->hits->{'/v3/kv/txn'} // 0; }
sub fenced { return $node->safe_psql('postgres', "SELECT token FROM lockfence.fences WHERE resource = '$_[0]'"); }

my $s = LockfenceTest::EtcdCluster::session($node);

# --- one request per lock at commit ------------------------------------------
# (session scope here: a transaction-scoped lock's release after the
# commit would be one more etcd transaction, a delete)
$s->query_safe('BEGIN');
my $tok = $s->query_safe("SELECT lockfence.etcd_lock_and_fence('c1', 'res-c1', 30, scope => 'session')");
chomp $tok;
my $before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 1, 'the commit sent one etcd transaction for the lock it fenced with');
is(fenced('res-c1'), $tok, 'and committed');

# two locks, two requests
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.etcd_lock_and_fence('c2a', 'res-c2a', 30, scope => 'session')");
$s->query_safe("SELECT lockfence.etcd_lock_and_fence('c2b', 'res-c2b', 30, scope => 'session')");
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 2, 'two locks fenced with: two requests at commit');

# --- no request for transactions that did not fence with an etcd token ---------
my $k = $s->query_safe("SELECT key FROM lockfence.etcd_lock('c3', 30)");
chomp $k;
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('res-plain', 5)");
$s->query_safe('UPDATE t SET v = v + 1');
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 0, 'a transaction that fenced without an etcd lock sends nothing at commit');
$before = txns();
$s->query_safe('SELECT 1');
$s->query_safe('BEGIN; SELECT 1; COMMIT;');
is(txns() - $before, 0, 'nor does a read-only transaction of a backend holding a lock');

# fence(..., holder => key) is checked under all_fenced only
my $info = $etcd->key_info($k);
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('res-c3a', $info->{create_revision}, holder => '$k')");
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 0, 'lock_and_fence (default): a lock named in fence() is not checked');
$s->query_safe("SET lockfence.etcd_check_at_commit = all_fenced");
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('res-c3b', $info->{create_revision}, holder => '$k')");
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 1, 'all_fenced: a lock of this backend named as holder is checked');
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('res-other', 7, holder => 'someone/else')");
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 0, 'all_fenced: a fence naming another holder sends nothing');
$s->query_safe("RESET lockfence.etcd_check_at_commit");
$s->query_safe("SELECT lockfence.etcd_unlock('$k')");

# --- a holder quiet past its TTL, no successor yet, is refused at commit -------
$s->query_safe('BEGIN');
my $ltok = $s->query_safe("SELECT lockfence.etcd_lock_and_fence('c4', 'res-c4', 2)");
chomp $ltok;
$s->query_safe('UPDATE t SET v = 100');
my ($lkey) = $etcd->keys('c4/');
ok(LockfenceTest::EtcdCluster::poll_until(15, sub { !defined $etcd->key_info($lkey) }),
	'the quiet holder\'s lease expired (no successor fenced)');
$s->query('COMMIT');
like($s->{stderr}, qr/LF003/, 'its commit is refused with LF003');
like($s->{stderr}, qr/\Q$lkey\E/, '... naming the lock');
$s->{stderr} = '';
is(fenced('res-c4'), '', 'nothing of the transaction was written (no fence row)');
is($node->safe_psql('postgres', 'SELECT v FROM t'), '1', '... and no update');

# the same with the check off goes through: the check is what refuses it
$s->query_safe("SET lockfence.etcd_check_at_commit = off");
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.etcd_lock_and_fence('c5', 'res-c5', 2)");
my ($k5) = $etcd->keys('c5/');
ok(LockfenceTest::EtcdCluster::poll_until(15, sub { !defined $etcd->key_info($k5) }),
	'check off: the lease expired too');
$s->query('COMMIT');
unlike($s->{stderr}, qr/ERROR/, 'check off: the commit goes through');
$s->{stderr} = '';
$s->query_safe("RESET lockfence.etcd_check_at_commit");

# --- a cancel during the check aborts the commit cleanly -----------------------
my $c = LockfenceTest::EtcdCluster::session($node);
$s->query_safe("SET lockfence.etcd_request_timeout = '30s'");
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.etcd_lock_and_fence('c6', 'res-c6', 60)");
$fault->set(path => '/v3/kv/txn', mode => 'hang', times => 1);
LockfenceTest::EtcdCluster::send_query($s, 'COMMIT;');
usleep(1_000_000);
my $t0 = time;
$c->query_safe("SELECT pg_cancel_backend($s->{pid})");
my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($s, 30);
my $took = time - $t0;
like($err, qr/57014|canceling statement/, 'a cancel during the check ends the COMMIT with 57014');
ok($took < 5, sprintf('promptly (%.2f s)', $took));
$fault->clear;
is(fenced('res-c6'), '', 'the cancelled transaction wrote nothing');
ok(LockfenceTest::EtcdCluster::poll_until(10, sub { !$etcd->keys('c6/') }),
	'and its transaction-scoped lock was released');
$s->{stderr} = '';
is($s->query_safe('SELECT 1'), '1', 'the session goes on');

$s->quit;
$c->quit;
$node->stop;
$etcd->stop;
done_testing();
