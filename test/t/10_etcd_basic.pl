
# etcd locks against a real etcd: acquire/release, try-lock, tokens and
# fencing, keepalive, wait_timeout, lock_and_fence, exit cleanup,
# permissions, endpoint failover and connection errors.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'basic');
$etcd->start;

# The server starts with proxies in its environment, where nothing listens
# (port 9): libcurl would send every request there, and a proxy could
# answer with any token; lockfence uses none, so every call below goes to
# the endpoint.
my $node;
{
	local @ENV{qw(http_proxy HTTPS_PROXY https_proxy ALL_PROXY all_proxy)} =
	  ('http://127.0.0.1:9') x 5;
	$node = LockfenceTest::EtcdCluster::pg_node('etcd_basic',
		"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n"
		  . "shared_preload_libraries = 'lockfence'\n");
}

# Run SQL with verbose errors; returns (rc, stdout, stderr, sqlstate).
sub run_sql
{
	my ($sql, %opts) = @_;
	my ($out, $err);
	my $rc = $node->psql(
		'postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out,
		stderr => \$err,
		%opts);
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($rc, $out, $err, $state // '');
}

sub lease_hex { return sprintf('%x', $_[0]); }

# --- acquire and release -------------------------------------------------

my $row = $node->safe_psql('postgres',
	"SELECT key, lease, token FROM lockfence.etcd_lock('basic')");
my ($key, $lease, $token) = split /\|/, $row;
is($key, 'basic/' . lease_hex($lease),
	'lock key is <name>/<lease id in lowercase hex>');
my $info;

# That session has exited, so its lease was revoked and the key is gone.
ok( LockfenceTest::EtcdCluster::poll_until(5, sub { !defined $etcd->key_info($key) }),
	'key of a session that exited is gone');

my $s1 = LockfenceTest::EtcdCluster::session($node);
$row = $s1->query_safe(
	"SELECT key || '|' || lease || '|' || token FROM lockfence.etcd_lock('basic', 20)");
chomp $row;
($key, $lease, $token) = split /\|/, $row;
$info = $etcd->key_info($key);
ok(defined $info, 'held lock key exists in etcd');
is($info->{create_revision}, $token,
	'token is the create_revision of the lock key');
is($info->{lease}, $lease, 'lock key is attached to the granted lease');
ok((grep { $_ eq lease_hex($lease) } $etcd->leases), 'lease is alive');

my $ttl = $s1->query_safe("SELECT lockfence.etcd_keepalive($lease)");
chomp $ttl;
ok($ttl > 0 && $ttl <= 20, "keepalive returns the remaining TTL ($ttl)");

is($s1->query_safe("SELECT lockfence.etcd_unlock('$key')"),
	't', 'unlock returns true');
ok(!defined $etcd->key_info($key), 'unlock deleted the key');
ok((grep { $_ eq lease_hex($lease) } $etcd->leases),
	'unlock kept the session lease (issue 9: session leases)');

my ($rc, $out, $err, $state) =
  run_sql("SELECT lockfence.etcd_unlock('$key')");
is($out, 'f', 'unlocking a released lock returns false');
like($err, qr/NOTICE:.*does not exist/, '... with a NOTICE');

$etcd->etcdctl('lease', 'revoke', lease_hex($lease));
($rc, $out, $err, $state) = run_sql("SELECT lockfence.etcd_keepalive($lease)");
is($state, 'LF003', 'keepalive of a revoked lease raises LF003');

# --- no call waits for nothing ----------------------------------------------
# (a request that completes inside libcurl's first step must not leave the
# backend waiting for the request timeout; healthy calls take milliseconds)
# Each cycle is measured on the server, from the statement's start to its
# end, less the time the backend waited for a CPU: the client's clock also
# counts psql and a loaded machine's run queue.

my ($slowest, $slowest_wait) = (0, 0);
for my $i (1 .. 30)
{
	my $rd0 = LockfenceTest::EtcdCluster::run_delay($s1->{pid});
	$s1->query_safe(
		"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_try_lock('quick')");
	my ($ms, $wait_ms) = LockfenceTest::EtcdCluster::late_ms(
		LockfenceTest::EtcdCluster::statement_duration($node, $s1->{pid}),
		$s1->{pid}, $rd0);
	($slowest, $slowest_wait) = ($ms, $wait_ms) if $ms > $slowest;
}
cmp_ok($slowest, '<', 2500,
	sprintf('30 try_lock/unlock cycles, slowest %.1f ms (and %.1f ms waiting for a CPU; request timeout 5 s)',
		$slowest, $slowest_wait));

# --- try-lock -------------------------------------------------------------

$row = $s1->query_safe(
	"SELECT key || '|' || lease || '|' || token FROM lockfence.etcd_try_lock('trylk', 20)"
);
chomp $row;
my ($tkey, $tlease, $ttoken) = split /\|/, $row;
like($tkey, qr{^trylk/[0-9a-f]+$}, 'try_lock on a free lock returns a row');
my @leases_before = sort $etcd->leases;

($rc, $out, $err, $state) =
  run_sql("SELECT count(*) FROM lockfence.etcd_try_lock('trylk', 20)");
is($out, '0', 'try_lock on a held lock returns no row');
is_deeply([ $etcd->keys('trylk/') ], [$tkey],
	'failed try_lock left no key behind');
is_deeply([ sort $etcd->leases ], \@leases_before,
	'failed try_lock left no lease behind');
$s1->query_safe("SELECT lockfence.etcd_unlock('$tkey')");

# --- tokens increase and are accepted by the fence -----------------------

my @tokens;
for my $i (1 .. 3)
{
	my $r = $node->safe_psql(
		'postgres', qq{
		SELECT l.key || '|' || l.token || '|' ||
		       lockfence.fence('res-basic', l.token, holder => l.key) || '|' ||
		       lockfence.etcd_unlock(l.key)::text
		  FROM lockfence.etcd_lock('tok') AS l});
	my ($k, $t, $fenced, $unlocked) = split /\|/, $r;
	is($fenced, $t, "grant $i: fence accepted token $t");
	is($unlocked, 'true', "grant $i: unlocked");
	push @tokens, $t;
}
ok($tokens[0] < $tokens[1] && $tokens[1] < $tokens[2],
	"tokens strictly increase across grants (@tokens)");
($rc, $out, $err, $state) =
  run_sql("SELECT lockfence.fence('res-basic', $tokens[0])");
is($state, 'LF001', 'fence rejects an older grant\'s token');

# --- wait_timeout ---------------------------------------------------------

$row = $s1->query_safe(
	"SELECT key || '|' || lease FROM lockfence.etcd_lock('wt', 20)");
chomp $row;
my ($wkey, $wlease) = split /\|/, $row;
@leases_before = sort $etcd->leases;
my $t0 = time;
($rc, $out, $err, $state) =
  run_sql("SELECT * FROM lockfence.etcd_lock('wt', 20, '300 ms')");
my $elapsed = time - $t0;
is($state, '55P03', 'wait_timeout expiry raises 55P03');
ok($elapsed >= 0.3, "wait lasted at least wait_timeout ($elapsed s)");
# The waiter's release after a wait_timeout has 50 ms by design
# (ETCD_PENDING_RELEASE_MS; TAP 14 and 63 check that claim); what does not
# fit goes when the session ends, and run_sql's session has ended, its
# exit callback revoking the lease: a poll, with a generous deadline.
LockfenceTest::EtcdCluster::poll_until(10, sub {
	return join(',', $etcd->keys('wt/')) eq $wkey
	  && join(',', sort $etcd->leases) eq join(',', @leases_before);
});
is_deeply([ $etcd->keys('wt/') ], [$wkey], 'timed-out waiter left no key');
is_deeply([ sort $etcd->leases ], \@leases_before,
	'timed-out waiter left no lease');

# --- metrics: acquisitions and errors are counted ---------------------------

sub metric
{
	my ($name) = @_;
	return $node->safe_psql('postgres',
		"SELECT value FROM lockfence.metrics WHERE name = '$name'");
}
my $acq0 = metric('lock_acquire_total');
my $err0 = metric('lock_acquire_error_total');
run_sql("SELECT * FROM lockfence.etcd_try_lock('wt', 20)");    # busy: neither
run_sql("SELECT * FROM lockfence.etcd_lock('wt', 20, '100 ms')");    # error
run_sql("SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('wt-other')"); # acquired
is(metric('lock_acquire_total') - $acq0, 1, 'metrics: one acquisition counted');
is(metric('lock_acquire_error_total') - $err0,
	1, 'metrics: one failed acquisition counted, busy try_lock not');

# --- lock_and_fence -------------------------------------------------------

($rc, $out, $err, $state) = run_sql(
	"BEGIN; SELECT lockfence.etcd_lock_and_fence('laf', 'res-laf'); SELECT lockfence.current_token('res-laf'); COMMIT;"
);
my ($laf_token, $cur) = split /\n/, $out;
is($rc, 0, 'lock_and_fence succeeded');
is($cur, $laf_token, 'lock_and_fence fenced the resource with its token');
my $holder = $node->safe_psql('postgres',
	"SELECT holder FROM lockfence.fences WHERE resource = 'res-laf'");
like($holder, qr{^laf/[0-9a-f]+$}, 'fence holder is the lock key');

# A stale token: fence 'res-laf' far ahead, then lock_and_fence must fail
# with LF001 and release the lock it took.
$node->safe_psql('postgres', "SELECT lockfence.fence('res-laf', 1000000000)");
($rc, $out, $err, $state) =
  run_sql("SELECT lockfence.etcd_lock_and_fence('laf2', 'res-laf')");
is($state, 'LF001', 'lock_and_fence with a stale token raises LF001');
is_deeply([ $etcd->keys('laf2/') ], [],
	'lock_and_fence released the lock after the fence failed');

# --- backend exit frees its locks at once ---------------------------------

my $s2 = LockfenceTest::EtcdCluster::session($node);
$row = $s2->query_safe(
	"SELECT key || '|' || lease FROM lockfence.etcd_lock('exitlk', 60)");
chomp $row;
my ($ekey, $elease) = split /\|/, $row;
ok(defined $etcd->key_info($ekey), 'lock held before exit');
$t0 = time;
$s2->quit;
ok( LockfenceTest::EtcdCluster::poll_until(
		5, sub { !defined $etcd->key_info($ekey) }),
	'lock released after backend exit');
$elapsed = time - $t0;
ok($elapsed < 5, "released well before its 60 s TTL ($elapsed s)");
ok(!(grep { $_ eq lease_hex($elease) } $etcd->leases),
	'lease revoked at backend exit');

# A terminated holder frees its lock at once too.
my $s3 = LockfenceTest::EtcdCluster::session($node);
$row = $s3->query_safe(
	"SELECT key || '|' || lease FROM lockfence.etcd_lock('termlk', 60)");
chomp $row;
my ($tkey2, $tlease2) = split /\|/, $row;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($s3->{pid})");
ok( LockfenceTest::EtcdCluster::poll_until(
		5, sub { !defined $etcd->key_info($tkey2) }),
	'lock released after pg_terminate_backend of its holder');
ok(!(grep { $_ eq lease_hex($tlease2) } $etcd->leases),
	'lease revoked after pg_terminate_backend of its holder');
eval { $s3->quit };

# --- permissions ----------------------------------------------------------

$node->safe_psql('postgres', 'CREATE ROLE lf_app LOGIN');
($rc, $out, $err, $state) =
  run_sql("SELECT * FROM lockfence.etcd_lock('perm')", extra_params => [ '-U', 'lf_app' ]);
is($state, '42501', 'PUBLIC cannot call etcd_lock');
$node->safe_psql('postgres',
	'GRANT EXECUTE ON FUNCTION lockfence.etcd_lock(text, integer, interval, text), lockfence.etcd_unlock(text, boolean) TO lf_app'
);
($rc, $out, $err, $state) = run_sql(
	"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('perm')",
	extra_params => [ '-U', 'lf_app' ]);
is($out, 't', 'a granted role can lock and unlock');
# (call a lockfence function first, so the settings are defined)
($rc, $out, $err, $state) = run_sql(
	"SELECT lockfence.current_token('x');
	 SET lockfence.etcd_endpoints = 'http://127.0.0.1:1'",
	extra_params => [ '-U', 'lf_app' ]);
is($state, '42501', 'ordinary users cannot change the endpoints');
($rc, $out, $err, $state) = run_sql(
	"SELECT lockfence.current_token('x'); SHOW lockfence.etcd_password",
	extra_params => [ '-U', 'lf_app' ]);
is($state, '42501', 'ordinary users cannot read the password setting');

# --- endpoints: failover and connection errors ----------------------------

my $dead_port = PostgreSQL::Test::Cluster::get_free_port();
$err0 = metric('lock_acquire_error_total');
$t0 = time;
($rc, $out, $err, $state) = run_sql(
	"SET lockfence.etcd_request_timeout = '1s';
	 SET lockfence.etcd_endpoints = 'http://127.0.0.1:$dead_port';
	 SELECT * FROM lockfence.etcd_lock('conn')");
is($state, '08001', 'unreachable etcd raises 08001');
$elapsed = time - $t0;
ok($elapsed < 4, "... within the request timeout ($elapsed s)");
like($err, qr/could not connect to etcd/, '... with a clear message');
# The call failed granting its session lease, before its key was queued.
is(metric('lock_acquire_error_total') - $err0,
	1, '... and is counted as a failed acquisition');

($rc, $out, $err, $state) = run_sql(
	"SET lockfence.etcd_endpoints = 'http://127.0.0.1:$dead_port, "
	  . $etcd->endpoints . "';
	 SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('conn')");
is($out, 't', 'a dead first endpoint fails over to the next one');

($rc, $out, $err, $state) = run_sql(
	"SELECT lockfence.current_token('x');
	 SET lockfence.etcd_endpoints = 'ftp://127.0.0.1:2379'");
is($state, '22023', 'non-http endpoints are refused');

($rc, $out, $err, $state) =
  run_sql("SELECT * FROM lockfence.etcd_lock('', 30)");
is($state, '22023', 'empty lock name is refused');

$s1->quit;
$node->stop;
done_testing();
