
# 18_etcd_commit_check_election.pl
#	  The commit-time lock check (issue 9, item 4) across an etcd leader
#	  election: the leader of a 3-member cluster is killed right before
#	  COMMIT; the check's request is retried on the other members within
#	  lockfence.etcd_request_timeout and the commit goes through, with one
#	  confirmed lock.  A lock whose key is deleted meanwhile (etcdctl) is
#	  then refused at commit, through the surviving members.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 3, name => 'ccelect');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('ccelect',
	"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n"
	  . "lockfence.etcd_request_timeout = '20s'\n");

my $s = LockfenceTest::EtcdCluster::session($node);
$s->query_safe('BEGIN');
my $tok = $s->query_safe("SELECT lockfence.etcd_lock_and_fence('el', 'res-el', 60, scope => 'session')");
chomp $tok;
my $leader = $etcd->leader_index;
ok(defined $leader, "leader is member $leader");
$etcd->kill_member($leader);
my $t0 = time;
$s->query('COMMIT');
my $took = time - $t0;
unlike($s->{stderr}, qr/ERROR/, 'COMMIT right after the leader was killed succeeds')
  or diag $s->{stderr};
$s->{stderr} = '';
ok($took < 20, sprintf('within the request timeout (%.2f s)', $took));
is($node->safe_psql('postgres', "SELECT token FROM lockfence.fences WHERE resource = 'res-el'"),
	$tok, 'and the fence committed');

# the check still refuses a lost lock through the surviving members
my ($key) = $etcd->keys('el/');
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('res-el2', $tok, holder => '$key')");
$s->query_safe("SET LOCAL lockfence.etcd_check_at_commit = all_fenced");
$etcd->etcdctl('del', $key);
$s->query('COMMIT');
like($s->{stderr}, qr/LF003/, 'a lock deleted meanwhile is refused at commit (LF003)');
$s->{stderr} = '';
is($node->safe_psql('postgres', "SELECT count(*) FROM lockfence.fences WHERE resource = 'res-el2'"),
	'0', 'and nothing was written');

$s->quit;
$node->stop;
$etcd->stop;
done_testing();
