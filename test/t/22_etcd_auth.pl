
# 22_etcd_auth.pl
#	  lockfence against a real etcd with authentication enabled: the right
#	  credentials work; a wrong password gives 28P01 naming the user, with
#	  etcd's own text in errdetail, and no credentials a 28xxx error;
#	  etcd's permission checks (a role limited to a key prefix, a revoked
#	  role) map to 42501 and leave no lease behind; passwords never reach
#	  an error or the server log; the cached token is fetched again after
#	  etcd invalidated it (auth disable/enable, role revoked and granted
#	  again); the credential settings are hidden from ordinary roles.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, auth => 1, name => 'auth');
$etcd->start;

my $user = $LockfenceTest::EtcdCluster::USER_NAME;
my $pw = $LockfenceTest::EtcdCluster::USER_PASSWORD;
my $wrong_pw = 'Wrong-Secret-31c7e0';

# A second user whose role covers only the key prefix authjob/.
my $app_pw = 'Sup3r-s3cret-pw';
$etcd->etcdctl('user', 'add', 'app', "--new-user-password=$app_pw", '--interactive=false');
$etcd->etcdctl('role', 'add', 'lockers');
$etcd->etcdctl('role', 'grant-permission', 'lockers', '--prefix=true', 'readwrite', 'authjob/');
$etcd->etcdctl('user', 'grant-role', 'app', 'lockers');

my $node = LockfenceTest::EtcdCluster::pg_node('auth', <<EOF);
lockfence.etcd_endpoints = '@{[ $etcd->endpoints ]}'
lockfence.etcd_request_timeout = '3s'
lockfence.etcd_user = '$user'
lockfence.etcd_password = '$pw'
log_min_messages = debug1
log_error_verbosity = verbose
# PostgreSQL::Test::Cluster logs every statement; this test SETs a wrong
# password in SQL, which PostgreSQL itself would then log.
log_statement = none
EOF

my $s = LockfenceTest::EtcdCluster::session($node);
my $all_errors = '';

# Run SQL in a session (default $s), remember any error text for the
# password check.
sub try_sql
{
	my ($sql, $sess) = @_;
	my $r = LockfenceTest::EtcdCluster::sql_try($sess // $s, $sql);
	$all_errors .= $r->{stderr};
	return $r;
}

sub cycle_ok
{
	my ($name, $label) = @_;
	my $r = try_sql("SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('$name', 5, '10s')");
	is($r->{out}, 't', $label) or diag explain $r;
	return $r;
}

# 1. Right credentials.
cycle_ok('a1', 'right user and password: lock and unlock succeed');
# TTL 60: this lock is held to the end, across the failing calls below,
# which cannot renew its lease; with TTL 5 a loaded machine outlasted it
# (LF003 at step 6 instead of etcd's permission denied).
my $r = try_sql("SELECT token > 0 FROM lockfence.etcd_try_lock('a1b', 60)");
is($r->{out}, 't', 'right credentials: etcd_try_lock succeeds');

# 1b. A user limited to the prefix authjob/: locks there, and etcd's
# permission denied elsewhere maps to 42501 and leaves no lease.
my $app = LockfenceTest::EtcdCluster::session($node);
try_sql("SET lockfence.etcd_user = 'app'", $app);
try_sql("SET lockfence.etcd_password = '$app_pw'", $app);
$r = try_sql("SELECT key || '|' || token FROM lockfence.etcd_lock('authjob')", $app);
like($r->{out}, qr{^authjob/[0-9a-f]+\|\d+$}, 'lock with etcd authentication') or diag explain $r;
my ($app_key) = split /\|/, $r->{out};
try_sql("SELECT lockfence.etcd_unlock('$app_key')", $app);
my @leases_before = sort $etcd->leases;
$r = try_sql("SELECT * FROM lockfence.etcd_lock('otherjob', 30, '2 s')", $app);
is($r->{sqlstate}, '42501', 'etcd permission denied maps to 42501') or diag explain $r;
like($r->{stderr}, qr/permission denied/, "... with etcd's message");
# (no new lease: the session lease of the earlier lock may be revoked by
# the cleanup, issue 9)
my %had = map { $_ => 1 } @leases_before;
is_deeply([ grep { !$had{$_} } sort $etcd->leases ], [], 'the refused lock left no lease');
$app->quit;

# 2. Wrong password: 28P01 naming the user, etcd's text in errdetail, no
# password anywhere.
try_sql("SET lockfence.etcd_password = '$wrong_pw'");
$r = try_sql("SELECT * FROM lockfence.etcd_lock('a2', 5, '5s')");
ok(!$r->{ok}, 'wrong password: etcd_lock fails');
is($r->{sqlstate}, '28P01', 'wrong password raises 28P01') or diag explain $r;
like($r->{message} // '', qr/authentication failed for user "\Q$user\E"/, '... naming the user');
unlike($r->{stderr}, qr/\Q$wrong_pw\E|\Q$pw\E/, '... without any password');
like($r->{detail} // '', qr/authentication failed, invalid user ID or password/,
	"wrong password: errdetail carries etcd's text");
cmp_ok($r->{secs}, '<', 4, 'wrong password: error within the request timeout');
is(try_sql('SELECT 1')->{out}, '1', 'session usable after the auth error');

# 3. No user at all while etcd requires one.
try_sql("SET lockfence.etcd_password = ''");
try_sql("SET lockfence.etcd_user = ''");
$r = try_sql("SELECT * FROM lockfence.etcd_lock('a3', 5, '5s')");
ok(!$r->{ok}, 'no credentials against an auth-enabled etcd: etcd_lock fails');
like($r->{sqlstate} // '', qr/^28/, 'no credentials: SQLSTATE class 28') or diag explain $r;
like($r->{detail} // '', qr/user name is empty/, "no credentials: errdetail carries etcd's text");

# 4. Back to the right credentials (RESET to the configuration file).
try_sql('RESET lockfence.etcd_user');
try_sql('RESET lockfence.etcd_password');
cycle_ok('a4', 'credentials restored: lock and unlock succeed');

# 5. Token invalidated by etcd: auth disable + enable bumps the auth
# revision, so the token this session cached is refused (HTTP 401).
$etcd->auth_disable;
$etcd->auth_enable;
cycle_ok('a5', 'after auth disable/enable: the token is fetched again transparently');

# 6. Role revoked: permission denied (42501); granted again: works.
$etcd->etcdctl('user', 'revoke-role', $user, 'lockrole');
$r = try_sql("SELECT * FROM lockfence.etcd_lock('a6', 5, '5s')");
ok(!$r->{ok}, 'role revoked: etcd_lock fails');
like($r->{sqlstate} // '', qr/^(42501|28)/, 'role revoked: privilege/authorization SQLSTATE')
  or diag explain $r;
like($r->{detail} // '', qr/permission denied/, "role revoked: errdetail carries etcd's text");
$etcd->etcdctl('user', 'grant-role', $user, 'lockrole');
cycle_ok('a6', 'role granted again: lock and unlock succeed in the same session');

# Nothing of ours left behind in etcd by the failed calls.
my $left = $etcd->etcdctl('get', '--prefix', '--keys-only', 'a');
$left =~ s/^\s+|\s+$//g;
like($left, qr/^(a1b\/[0-9a-f]+)?$/, 'no lock keys left behind except the one still held')
  or diag $left;

# 7. The credential settings are hidden from an ordinary role.
$node->safe_psql('postgres', 'CREATE ROLE plain LOGIN');
LockfenceTest::EtcdCluster::check_superuser_only($node, 'plain',
	'lockfence.etcd_user', 'lockfence.etcd_password');

# 7b. A failed authentication in an ordinary role's lock call does not
# name the etcd user that role may not SHOW; the server log does.
my $hidden_user = 'hidden-user-4f2a';
$node->safe_psql('postgres', q{SELECT lockfence.grant_usage('plain', etcd => true)});
$node->safe_psql('postgres',
	"ALTER SYSTEM SET lockfence.etcd_user = '$hidden_user'; SELECT pg_reload_conf()");
$node->poll_query_until('postgres',
	"SELECT current_setting('lockfence.etcd_user') = '$hidden_user'")
  or die 'the reload of lockfence.etcd_user was not seen';
my $plain = LockfenceTest::EtcdCluster::session($node, 'plain');
$r = LockfenceTest::EtcdCluster::sql_try($plain, "SELECT * FROM lockfence.etcd_lock('a7', 5, '5s')");
$plain->quit;
$all_errors .= $r->{stderr};
is($r->{sqlstate}, '28P01', 'plain role, unknown etcd user: 28P01') or diag explain $r;
unlike($r->{stderr}, qr/\Q$hidden_user\E/, '... without the user name') or diag explain $r;
like($r->{message} // '', qr/authentication failed for the user of lockfence\.etcd_user/,
	'... naming the setting instead');
like(slurp_file($node->logfile), qr/user "\Q$hidden_user\E"/, '... which the server log names');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET lockfence.etcd_user; SELECT pg_reload_conf()');

# 8. No password in any error the client saw, nor in the server log.
$s->quit;
$node->stop;
my $log = slurp_file($node->logfile);
unlike($all_errors, qr/\Q$pw\E|\Q$wrong_pw\E/, 'no password in any error the client saw');
unlike($log, qr/\Q$pw\E/, 'the right password never appears in the server log');
unlike($log, qr/\Q$wrong_pw\E/, 'the wrong password never appears in the server log');
unlike($log, qr/\Q$app_pw\E/, 'a password SET in a session never appears in the server log');
like($log, qr/etcd rejected the auth token.*authenticating again/,
	'the invalidated token was noticed and replaced');
like($log, qr/authentication failed/, 'the server log does have the auth failure (so the grep is meaningful)');

$etcd->stop;
done_testing();
