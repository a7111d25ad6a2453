
# 30_etcd_endpoint_failover.pl
#	  lockfence.etcd_endpoints failover against a real 3-member etcd cluster:
#	  a dead port listed first, a killed member, a paused (hung) member, and
#	  no live endpoint at all.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 3, name => 'failover');
$etcd->start;

my $leader = $etcd->leader_index;
my @followers = grep { $_ != $leader } 0 .. 2;
my $dead_port = LockfenceTest::EtcdCluster::free_port();
my $dead = "http://127.0.0.1:$dead_port";

my $node = LockfenceTest::EtcdCluster::pg_node('failover', <<EOF);
lockfence.etcd_request_timeout = '5s'
lockfence.etcd_connect_timeout = '1s'
EOF

my $s = LockfenceTest::EtcdCluster::session($node);

# One full cycle through every function; returns the token, dies on error.
sub full_cycle
{
	my ($sess, $name, $label) = @_;
	my $t0 = time;
	my $r = LockfenceTest::EtcdCluster::sql_try($sess,
		"SELECT key || ' ' || lease || ' ' || token FROM lockfence.etcd_lock('$name', 10, '20s')");
	ok($r->{ok}, "$label: etcd_lock succeeds") or diag explain $r;
	my ($key, $lease, $token) = split / /, $r->{out};
	$r = LockfenceTest::EtcdCluster::sql_try($sess, "SELECT lockfence.etcd_keepalive($lease) > 0");
	is($r->{out}, 't', "$label: etcd_keepalive succeeds") or diag explain $r;
	$r = LockfenceTest::EtcdCluster::sql_try($sess,
		"SELECT count(*) FROM lockfence.etcd_try_lock('$name', 10)");
	is($r->{out}, '0', "$label: etcd_try_lock sees the lock taken") or diag explain $r;
	$r = LockfenceTest::EtcdCluster::sql_try($sess, "SELECT lockfence.etcd_unlock('$key')");
	is($r->{out}, 't', "$label: etcd_unlock succeeds") or diag explain $r;
	note sprintf("%s: cycle took %.2f s", $label, time - $t0);
	return ($token, time - $t0);
}

# 1. A refused port first, a live member second.
$s->query_safe("SET lockfence.etcd_endpoints = '$dead," . $etcd->client_url($leader) . "'");
my ($tok1, $secs1) = full_cycle($s, 'fo1', 'dead port first');
ok($tok1 > 0, 'dead port first: a positive token');
cmp_ok($secs1, '<', 5, 'dead port first: refused connection fails over at once');

# The same, in a fresh session (no connection reused from the cycle above).
{
	my $out = $node->safe_psql('postgres',
		"SET lockfence.etcd_endpoints = '$dead,$dead," . $etcd->client_url($followers[0]) . "';
		 SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('fo1b', 5, '10s');");
	is($out, 't', 'two dead ports first, a follower third: lock and unlock succeed');
}

# 2. All three members listed, a follower first; the session has used it
# (its connection is kept alive); then that follower is killed.
my $eps = join(',', map { $etcd->client_url($_) } ($followers[0], $followers[1], $leader));
$s->query_safe("SET lockfence.etcd_endpoints = '$eps'");
my ($tok2) = full_cycle($s, 'fo2', 'all members up');
$etcd->kill_member($followers[0]);
my ($tok3, $secs3) = full_cycle($s, 'fo2', 'first-listed member killed');
cmp_ok($tok3, '>', $tok2, 'token after failover is larger than before');
cmp_ok($secs3, '<', 10, 'failover after a killed member within the request timeout');

# A new session too.
is( $node->safe_psql('postgres',
		"SET lockfence.etcd_endpoints = '$eps';
		 SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('fo2b', 5, '10s');"),
	't', 'new session with the first member dead: lock and unlock succeed');

# 3. A hung member (SIGSTOP: connections are accepted, nothing answers).
# Restart the killed follower and list it first, so the session talks to
# it; pause it while a second session holds the lock and this one waits.
$etcd->restart_member($followers[0]);
my $other = LockfenceTest::EtcdCluster::session($node);
$other->query_safe("SET lockfence.etcd_endpoints = '" . $etcd->client_url($leader) . "'");
my $r = LockfenceTest::EtcdCluster::sql_try($other,
	"SELECT key FROM lockfence.etcd_lock('fo3', 10, '10s')");
ok($r->{ok}, 'second session holds fo3') or diag explain $r;
my $held_key = $r->{out};

# A new endpoint list string makes the session start again at its first
# entry; a cycle first, so the session is talking to that member.
my $eps3 = join(',', map { $etcd->client_url($_) } ($followers[0], $leader, $followers[1]));
$s->query_safe("SET lockfence.etcd_endpoints = '$eps3'");
$s->query_safe("SET lockfence.etcd_request_timeout = '3s'");
full_cycle($s, 'fo3warm', 'before pausing');

# Start waiting for fo3 (in the background), then pause the member the
# waiter talks to, then release fo3.
$s->{stderr} = '';
$s->{stdin} .= "SELECT 'got ' || token || ' ' || key FROM lockfence.etcd_lock('fo3', 10, '25s');\n";
$s->{run}->pump_nb;
usleep(700_000);
$etcd->pause_member($followers[0]);
my $t_pause = time;
$r = LockfenceTest::EtcdCluster::sql_try($other, "SELECT lockfence.etcd_unlock('$held_key')");
is($r->{out}, 't', 'holder released fo3 while the waiter\'s member is hung');

# The waiter should get the lock through a live member well before its
# 25 s wait_timeout.
my $got = 0;
while (time - $t_pause < 30)
{
	$s->{run}->pump_nb;
	if ($s->{stdout} =~ /got \d+/ || $s->{stderr} =~ /ERROR/)
	{
		$got = 1 if $s->{stdout} =~ /got \d+/;
		last;
	}
	usleep(100_000);
}
my $waited = time - $t_pause;
note sprintf('waiter outcome after %.1f s: stdout=%s stderr=%s', $waited, $s->{stdout}, $s->{stderr});
ok($got, 'waiter on a hung member gets the lock through another member');
cmp_ok($waited, '<', 15, 'waiter on a hung member recovers well before wait_timeout');
# When the hung member wakes up, it sees its lock request's client gone;
# etcd's lock service then deletes the waiter's key.  If the waiter had
# re-queued on another member under the same lease (same key), that would
# silently take away the lock it now holds.
$etcd->resume_member($followers[0]);
if ($got)
{
	my ($wkey) = $s->{stdout} =~ /got \d+ (\S+)/;
	$etcd->wait_healthy();
	sleep 2;
	like($etcd->etcdctl('get', '--keys-only', $wkey), qr/\Q$wkey\E/,
		"the waiter's lock key survives the hung member waking up");
}
$s->{stdout} = '';
$s->{stderr} = '';
$s->query('SELECT 1');    # resynchronise the session
$s->{stderr} = '';

# 4. No live endpoint: a clean 08xxx error within the request timeout.
$s->query_safe("SET lockfence.etcd_endpoints = '$dead,http://127.0.0.1:" . LockfenceTest::EtcdCluster::free_port() . "'");
$s->query_safe("SET lockfence.etcd_request_timeout = '2s'");
$r = LockfenceTest::EtcdCluster::sql_try($s, "SELECT * FROM lockfence.etcd_lock('fo4', 5, '10s')");
ok(!$r->{ok}, 'no live endpoint: etcd_lock fails');
like($r->{sqlstate} // '', qr/^08/, 'no live endpoint: SQLSTATE class 08') or diag explain $r;
cmp_ok($r->{secs}, '<', 4, 'no live endpoint: error within the request timeout');
like($r->{detail} // '', qr/127\.0\.0\.1/, 'no live endpoint: errdetail names the endpoint');
is(LockfenceTest::EtcdCluster::sql_try($s, 'SELECT 42')->{out}, '42',
	'session still usable after the error');

$s->quit;
$other->quit;
$node->stop;
$etcd->stop;
done_testing();
