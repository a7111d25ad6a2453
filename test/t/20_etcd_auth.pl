
# etcd authentication: locks work with a user and password, a wrong
# password fails with 28P01 without revealing it, etcd's permission
# checks map to 42501, and an invalidated token is fetched again.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::Etcd;

my $etcd = LockfenceTest::Etcd->new();
my $root = [ '--user', 'root:R00t-pw' ];
my $password = 'Sup3r-s3cret-pw';

$etcd->etcdctl_ok('user', 'add', 'root:R00t-pw');
$etcd->etcdctl_ok('user', 'add', "app:$password");
$etcd->etcdctl_ok('role', 'add', 'lockers');
$etcd->etcdctl_ok('role', 'grant-permission', 'lockers', '--prefix=true',
	'readwrite', 'authjob/');
$etcd->etcdctl_ok('user', 'grant-role', 'app', 'lockers');
$etcd->etcdctl_ok('auth', 'enable');

my $node = PostgreSQL::Test::Cluster->new('etcd_auth');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
lockfence.etcd_endpoints = '@{[ $etcd->endpoint ]}'
lockfence.etcd_user = 'app'
lockfence.etcd_password = '$password'
log_min_messages = debug1
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION lockfence');

sub run_sql
{
	my ($sql) = @_;
	my ($out, $err);
	$node->psql(
		'postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out,
		stderr => \$err);
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($out, $err, $state // '');
}

my ($out, $err, $state) = run_sql(
	"SELECT key || '|' || token FROM lockfence.etcd_lock('authjob')");
like($out, qr{^authjob/[0-9a-f]+\|\d+$}, 'lock with etcd authentication');

($out, $err, $state) = run_sql(
	"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('authjob')");
is($out, 't', 'lock and unlock with etcd authentication');

($out, $err, $state) =
  run_sql("SELECT * FROM lockfence.etcd_lock('otherjob', 30, '2 s')");
is($state, '42501', 'etcd permission denied maps to 42501');
like($err, qr/permission denied/, '... with etcd\'s message');
my ($rc, $leases) = $etcd->etcdctl(@$root, 'lease', 'list');
like($leases, qr/found 0 leases/, 'the refused lock left no lease');

($out, $err, $state) = run_sql(
	"SET lockfence.etcd_password = 'not-the-right-one';
	 SELECT * FROM lockfence.etcd_lock('authjob')");
is($state, '28P01', 'wrong password raises 28P01');
like($err, qr/authentication failed for user "app"/, '... naming the user');
unlike($err, qr/not-the-right-one|\Q$password\E/, '... without any password');

# A cached token invalidated by etcd (auth disabled and enabled again) is
# fetched again.
my $s = LockfenceTest::Etcd::session($node);
is( $s->query_safe(
		"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('authjob')"),
	't',
	'session locked once (token cached)');
$etcd->etcdctl_ok(@$root, 'auth', 'disable');
$etcd->etcdctl_ok('auth', 'enable');
is( $s->query_safe(
		"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('authjob')"),
	't',
	'session locks again after its token was invalidated');
$s->quit;

$node->stop;
my $log = slurp_file($node->logfile);
unlike($log, qr/\Q$password\E/, 'the password never appears in the server log');
like($log, qr/etcd rejected the auth token.*authenticating again/,
	'the invalidated token was noticed and replaced');

done_testing();
