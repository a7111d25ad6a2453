
# 65_etcd_quiet_calls.pl
#	  Replies that the JSON parser cannot take (nesting far beyond any etcd
#	  reply) are malformed replies, 08P01, not "stack depth limit exceeded"
#	  (54001); and the quiet calls made in error cleanup and at backend
#	  exit never raise, whatever the reply: the original error reaches the
#	  client, and a backend exits without an error of its own.  The faulty
#	  replies come from test/fault_http_server.py in front of a real etcd.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'quiet');
$etcd->start;
my $fault = $etcd->start_fault_server($etcd->client_url(0));

# Short timeouts keep a failure short; no check here bounds a time.  The
# Valgrind run (scripts/pg-assert.sh) multiplies them: there, on a loaded
# machine, a new backend's first request once took more than a second to
# connect (08006, in the CI run of 5efd389).
my $scale = LockfenceTest::EtcdCluster::time_scale();
sub secs { return ($_[0] * $scale) . 's'; }

my $node = LockfenceTest::EtcdCluster::pg_node('quiet', <<EOF);
lockfence.etcd_endpoints = '@{[ $fault->url ]}'
lockfence.etcd_request_timeout = '@{[ secs(2) ]}'
lockfence.etcd_connect_timeout = '@{[ secs(1) ]}'
log_error_verbosity = verbose
EOF

my $s = LockfenceTest::EtcdCluster::session($node);
my $pid = $s->query_safe('SELECT pg_backend_pid()');

sub try_sql { return LockfenceTest::EtcdCluster::sql_try($s, $_[0]); }

# Error replies whose fields etcd always sends as a number and strings.
my %bad_error = (
	'nested 200 body' => { mode => 'nested' },
	'nested error body' => { mode => 'nested', status => 500 },
	'code is a string' => { mode => 'status', status => 500,
		body => { code => 'two', message => 'etcdserver: x' } },
	'code beyond int' => { mode => 'status', status => 500,
		body => { code => '99999999999', message => 'etcdserver: x' } },
	'message is an array' => { mode => 'status', status => 500,
		body => { code => 2, message => ['etcdserver: x'] } },
	'error is an object' => { mode => 'status', status => 500,
		body => { code => 2, error => { a => 1 } } },
);

# --- 1. nesting is a malformed reply, not a stack overflow -----------------
$fault->clear;
$fault->set(path => '/v3/lease/grant', mode => 'nested', times => 1);
my $r = try_sql("SELECT * FROM lockfence.etcd_lock('q-nest', 5, '" . secs(4) . "')");
is($r->{sqlstate}, '08P01', 'deeply nested grant reply: 08P01') or diag explain $r;
like($r->{message} // '', qr{malformed reply from etcd to /v3/lease/grant},
	'the message names the request');
like($r->{detail} // '', qr/nests more than 64 levels/, 'the detail says why');
unlike($r->{stderr}, qr/max_stack_depth/, 'no hint to raise max_stack_depth');

# Nesting at the limit is still parsed (the reply is then refused for
# lacking a lease ID, like any reply without one).
$fault->clear;
$fault->set(path => '/v3/lease/grant', mode => 'nested', depth => 63, times => 1);
$r = try_sql("SELECT * FROM lockfence.etcd_lock('q-nest64', 5, '" . secs(4) . "')");
is($r->{sqlstate}, '08P01', '64 levels: parsed, refused for its content');
like($r->{detail} // '', qr/no lease ID/, '64 levels: the reply was parsed');

# --- 2. error cleanup keeps the original error -----------------------------
# The lock request (the transaction queueing our key) fails with a plain
# etcd error (08000); the cleanup then
# revokes the lease with a quiet call, whose reply is faulty.
my $n = 0;
for my $label (sort keys %bad_error)
{
	my $name = 'q-clean' . ++$n;
	$fault->clear;
	$fault->set(path => '/v3/kv/txn', mode => 'status', status => 400, times => 1,
		body => { error => 'injected lock refusal', message => 'injected lock refusal', code => 3 });
	$fault->set(path => '/v3/lease/revoke', %{ $bad_error{$label} });
	my $before = $fault->hits->{'/v3/lease/revoke'} // 0;
	$r = try_sql("SELECT * FROM lockfence.etcd_lock('$name', 5, '" . secs(4) . "')");
	my $revokes = ($fault->hits->{'/v3/lease/revoke'} // 0) - $before;
	$fault->clear;
	ok($revokes >= 1, "cleanup, revoke reply $label: the revocation was tried");
	is($r->{sqlstate}, '08000', "cleanup, revoke reply $label: the original error (08000) reaches the client")
	  or diag explain $r;
	like($r->{message} // '', qr/etcd rejected a lock request/, "cleanup, revoke reply $label: original message");
	is(try_sql('SELECT pg_backend_pid()')->{out}, $pid, "cleanup, revoke reply $label: session usable");
}

# --- 3. backend exit: the revocation is quiet too ---------------------------
$n = 0;
for my $label (sort keys %bad_error)
{
	my $name = 'q-exit' . ++$n;
	my $e = LockfenceTest::EtcdCluster::session($node);
	my $epid = $e->query_safe('SELECT pg_backend_pid()');
	my $lease = $e->query_safe("SELECT lease FROM lockfence.etcd_lock('$name', 30, '" . secs(5) . "')");
	ok($lease > 0, "exit, revoke reply $label: lock held");
	$fault->clear;
	$fault->set(path => '/v3/lease/revoke', %{ $bad_error{$label} });
	my $before = $fault->hits->{'/v3/lease/revoke'} // 0;
	my $offset = -s $node->logfile;
	$e->quit;
	my $deadline = time + 60;
	while (time < $deadline &&
		$node->safe_psql('postgres', "SELECT count(*) FROM pg_stat_activity WHERE pid = $epid") ne '0')
	{
		usleep(50_000);
	}
	# the log lines of the exit may follow the process' disappearance
	usleep(300_000);
	my $revokes = ($fault->hits->{'/v3/lease/revoke'} // 0) - $before;
	$fault->clear;
	my $log = slurp_file($node->logfile, $offset);
	my @own = grep { /\[$epid\]/ } split /\n/, $log;
	ok($revokes >= 1, "exit, revoke reply $label: the revocation was tried at exit");
	unlike($log, qr/stack depth limit exceeded/, "exit, revoke reply $label: no stack depth error");
	unlike(join("\n", @own), qr/(?:FATAL|ERROR|PANIC):/, "exit, revoke reply $label: the backend exits without an error")
	  or diag $log;
	# The lease outlives the failed revocation (its TTL frees it): drop it.
	$etcd->etcdctl_try('lease', 'revoke', sprintf('%x', $lease));
}

$s->quit;
my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|PANIC/, 'no backend crashed');
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'server up at the end');

$node->stop;
$fault->stop;
$etcd->stop;
done_testing();
