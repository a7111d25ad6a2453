
# 62_etcd_unlock_scope.pl
#	  etcd_unlock releases lock keys only, unless force (issue 7, item 13).
#	  Before the fix, etcd_unlock('app/config/leader') deleted that key and
#	  revoked its lease, which deleted app/config/endpoint too.
#	  - keys not of the form <name>/<lease hex> are refused with 22023 and
#	    a hint naming force, before any request;
#	  - a key of that form attached to another lease (or none) is refused
#	    the same way, and nothing is deleted;
#	  - another holder's lock key is released (key deleted, lease
#	    revoked), a missing lock key gives false and a NOTICE;
#	  - force => true deletes any key and revokes its lease;
#	  - an etcd_unlock cancelled by statement_timeout while the member is
#	    paused leaves the session's lease to the exit cleanup, which
#	    revokes it when the session ends.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'unlk');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('unlk', <<EOF);
lockfence.etcd_endpoints = '@{[ $etcd->client_url(0) ]}'
lockfence.etcd_request_timeout = '2s'
EOF

sub key_exists
{
	my ($key) = @_;
	return $etcd->etcdctl('get', '--keys-only', $key) =~ /\Q$key\E/ ? 1 : 0;
}

sub lease_alive
{
	my ($hex) = @_;
	my $out = $etcd->etcdctl('lease', 'list');
	return $out =~ /^0*\Q$hex\E$/m ? 1 : 0;
}

sub grant
{
	my ($ttl) = @_;
	my $out = $etcd->etcdctl('lease', 'grant', $ttl);
	# etcdctl pads to 16 digits; lock keys have no leading zeros
	$out =~ /lease 0*([0-9a-f]+) granted/ or die "no lease in: $out";
	return $1;
}

sub poll_until
{
	my ($seconds, $code) = @_;
	my $deadline = time + $seconds;
	while (time < $deadline)
	{
		return 1 if $code->();
		usleep(50_000);
	}
	return $code->();
}

my $s = LockfenceTest::EtcdCluster::session($node);

# --- application keys sharing a lease ------------------------------------

my $app = grant(120);
$etcd->etcdctl('put', '--lease', $app, 'app/config/leader', 'me');
$etcd->etcdctl('put', '--lease', $app, 'app/config/endpoint', 'http://x');

my $r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT lockfence.etcd_unlock('app/config/leader')");
is($r->{sqlstate}, '22023', 'a key that is not a lock key is refused with 22023')
  or diag explain $r;
like($r->{message}, qr/is not a lock key/, '... saying so');
like($r->{hint} // '', qr/force => true/, '... with a hint naming force');
ok(key_exists('app/config/leader'), 'the key is still there');
ok(key_exists('app/config/endpoint'), 'the other key on its lease too');
ok(lease_alive($app), 'and the lease lives');

# a name that ends in hex, but not in the lease it is attached to
my $fake = "app/config/$app";
$fake =~ s/.$/ $& eq '1' ? '2' : '1' /e;
$etcd->etcdctl('put', '--lease', $app, $fake, 'v');
$r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT lockfence.etcd_unlock('$fake')");
is($r->{sqlstate}, '22023', 'a lock-like key on another lease is refused')
  or diag explain $r;
like($r->{detail} // '', qr/attached to lease $app/, '... naming its lease');
ok(key_exists($fake) && lease_alive($app), '... and nothing is deleted');

# the right form, but attached to no lease
my $nolease = "nolease/" . grant(60);
$etcd->etcdctl('put', $nolease, 'v');
$r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT lockfence.etcd_unlock('$nolease')");
is($r->{sqlstate}, '22023', 'a lock-like key without a lease is refused')
  or diag explain $r;
ok(key_exists($nolease), '... and kept');

# malformed lock keys are refused without a request
for my $k ('app', '/abc', 'x/ABC', 'x/0abc', 'x/', 'x/12345678901234567', 'x/g1')
{
	$r = LockfenceTest::EtcdCluster::sql_try($s,
		"SELECT lockfence.etcd_unlock('$k')");
	is($r->{sqlstate}, '22023', "'$k' is not a lock key") or diag explain $r;
}

# --- real lock keys ---------------------------------------------------------

# a lock key as etcd's Mutex makes it (as etcdctl lock does): under a
# lease of its own, named after that lease
my $ext_hex = grant(60);
my $ext_key = "ext/$ext_hex";
$etcd->etcdctl('put', '--lease', $ext_hex, $ext_key, '');
$r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT lockfence.etcd_unlock('$ext_key')");
is($r->{out}, 't', "another holder's lock key is released") or diag explain $r;
ok(!key_exists($ext_key), '... its key deleted');
ok(poll_until(5, sub { !lease_alive($ext_hex) }), '... its lease revoked');

$r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT lockfence.etcd_unlock('$ext_key')");
is($r->{out}, 'f', 'a lock key that is gone gives false');
like($r->{stderr}, qr/NOTICE:.*does not exist/, '... with a NOTICE');

my $own = $s->query_safe("SELECT key FROM lockfence.etcd_lock('own', 30)");
is($s->query_safe("SELECT lockfence.etcd_unlock('$own')"), 't',
	'own lock key is released');
ok(!key_exists($own), '... and gone');

# --- force ------------------------------------------------------------------

$r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT lockfence.etcd_unlock('app/config/leader', force => true)");
is($r->{out}, 't', 'force deletes any key') or diag explain $r;
ok(!key_exists('app/config/leader'), '... the key is gone');
ok(!lease_alive($app) && !key_exists('app/config/endpoint'),
	'... and its lease revoked, with the keys on it');

# --- privileges -------------------------------------------------------------

is($node->safe_psql('postgres', q{
SELECT has_function_privilege('public', 'lockfence.etcd_unlock(text, boolean)', 'EXECUTE')}),
	'f', 'etcd_unlock(text, boolean) is not executable by PUBLIC');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM pg_proc WHERE proname = 'etcd_unlock'}),
	'1', 'one etcd_unlock function');

# --- an interrupted unlock ---------------------------------------------------

my $k2 = $s->query_safe("SELECT key FROM lockfence.etcd_lock('intr', 60)");
(my $k2hex = $k2) =~ s{^intr/}{};
$etcd->pause_member(0);
$s->query_safe("SET statement_timeout = '300ms'");
$r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT lockfence.etcd_unlock('$k2')");
is($r->{sqlstate}, '57014', 'unlock interrupted while the member is paused')
  or diag explain $r;
# from the statement's start to its error, on the server: the test's psql
# and Perl reading the error are not the unlock's time (on a loaded
# machine they alone took over 500 ms, in TAP 14)
my $took = LockfenceTest::EtcdCluster::statement_duration($node, $s->{pid});
ok($took < 1.0, sprintf('... within %.0f ms', $took * 1000));
$etcd->resume_member(0);
$etcd->wait_healthy();
$s->quit;
ok(poll_until(10, sub { !lease_alive($k2hex) && !key_exists($k2) }),
	'the lease of the interrupted unlock is revoked when the session ends');

$node->stop;
# stop etcd here: stopping it again at global destruction would set the exit code
$etcd->stop;
done_testing();
