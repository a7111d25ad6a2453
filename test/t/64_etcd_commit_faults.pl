
# 64_etcd_commit_faults.pl
#	  Issue 17, item 14: nothing at commit or abort raises.  The release of
#	  transaction-scoped etcd locks after a commit (XACT_EVENT_COMMIT, where
#	  an ERROR becomes a PANIC "cannot abort transaction, it was already
#	  committed") and at an abort never lets an error out:
#	  - network faults at every step of the release (the key delete and the
#	    lease revoke that follows its failure), injected by
#	    test/fault_http_server.py or by a closed port: connection refused,
#	    malformed JSON, an HTTP error, a timeout (a reply that never comes);
#	  - an ERROR raised from inside the release (server started with
#	    LOCKFENCE_FAULT_INJECTION): before the first request, and between two
#	    locks' releases, at commit, at abort and at a rollback to savepoint;
#	  - the abort's safety net for a lock its failed call left pending: it
#	    releases the lock, and when that release raises, the lock is
#	    abandoned (its lease no longer used), not kept as if handed over.
#	  Each time the commit stands (its row is visible to another session),
#	  the backend goes on (same pid; no PANIC in the server log), and the
#	  lock is freed later (its TTL, or the revocation at backend exit).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'cfaults');
$etcd->start;
my $fault = $etcd->start_fault_server($etcd->client_url(0));
my $f = $fault->url;
my $closed = 'http://127.0.0.1:' . LockfenceTest::EtcdCluster::free_port();

my $conf = <<EOF;
lockfence.etcd_endpoints = '$f'
lockfence.etcd_request_timeout = '2s'
lockfence.etcd_connect_timeout = '1s'
EOF

my $node = LockfenceTest::EtcdCluster::pg_node('etcd_cfaults', $conf);
$node->safe_psql('postgres', 'CREATE TABLE t (id int PRIMARY KEY)');

sub gone
{
	my ($k, $secs) = @_;
	return LockfenceTest::EtcdCluster::poll_until($secs // 20,
		sub { !defined $etcd->key_info($k) });
}

sub no_panic
{
	my ($n, $label) = @_;
	my $log = slurp_file($n->logfile);
	unlike($log, qr/PANIC|cannot abort transaction|server process .* was terminated/,
		"$label: no PANIC, no crash in the server log");
	return;
}

my $s = LockfenceTest::EtcdCluster::session($node);
my $pid = $s->{pid};
my $id = 0;

# --- network faults during the release after a commit --------------------------
my @cases = (
	[ 'connection refused', undef ],
	[ 'malformed JSON', { mode => 'invalid_json' } ],
	[ 'HTTP 500', { mode => 'status', status => 500 } ],
	[ 'HTTP 503 after a delay', { mode => 'status', status => 503, delay => 0.5 } ],
	[ 'truncated reply', { mode => 'truncated' } ],
	[ 'timeout (no reply)', { mode => 'hang' } ],
);
for my $c (@cases)
{
	my ($label, $rule) = @$c;
	$id++;
	$s->query_safe('BEGIN');
	my $k = $s->query_safe("SELECT key FROM lockfence.etcd_lock('cf$id', 4, scope => 'transaction')");
	chomp $k;
	$s->query_safe("INSERT INTO t VALUES ($id)");
	ok(defined $etcd->key_info($k), "$label: lock held in the transaction");
	my $before = $fault->hits->{faults} // 0;
	if (defined $rule)
	{
		$fault->set(path => $_, %$rule) for ('/v3/kv/txn', '/v3/lease/revoke');
	}
	else
	{
		# the release goes where the setting points at commit: nowhere
		$s->query_safe("SET lockfence.etcd_endpoints = '$closed'");
	}
	my $r = LockfenceTest::EtcdCluster::sql_try($s, 'COMMIT');
	$fault->clear;
	$s->query_safe('RESET lockfence.etcd_endpoints') unless defined $rule;
	ok(($fault->hits->{faults} // 0) > $before, "$label: the fault was injected")
	  if defined $rule;
	ok($r->{ok}, "$label: COMMIT succeeds") or diag explain $r;
	cmp_ok($r->{secs}, '<', 6, sprintf("$label: COMMIT returns in time (%.2f s)", $r->{secs}));
	is($node->safe_psql('postgres', "SELECT count(*) FROM t WHERE id = $id"), '1',
		"$label: the commit stands (another session sees the row)");
	is($s->query_safe('SELECT pg_backend_pid()'), $pid, "$label: same backend goes on");
	ok(gone($k), "$label: the lock is freed anyway (delete retried later, or its TTL)");
	no_panic($node, $label);
}

$s->quit;

# --- an ERROR raised inside the release ------------------------------------------
# A second server, started with the fault injection points enabled.
my $inj;
{
	local $ENV{LOCKFENCE_FAULT_INJECTION} = 'commit_release';
	$inj = LockfenceTest::EtcdCluster::pg_node('etcd_cfaults_inj',
		"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n");
}
$inj->safe_psql('postgres', 'CREATE TABLE t (id int PRIMARY KEY)');
my $i = LockfenceTest::EtcdCluster::session($inj);
$i->query_safe('BEGIN');
my $ik = $i->query_safe("SELECT key FROM lockfence.etcd_lock('inj1', 30, scope => 'transaction')");
chomp $ik;
$i->query_safe('INSERT INTO t VALUES (1)');
my $r = LockfenceTest::EtcdCluster::sql_try($i, 'COMMIT');
ok($r->{ok}, 'injected ERROR in the release at commit: COMMIT succeeds') or diag explain $r;
like($r->{stderr}, qr/WARNING:.*could not release etcd locks at the end of the transaction: lockfence fault injected at commit_release/,
	'... with a WARNING naming the error');
is($inj->safe_psql('postgres', 'SELECT count(*) FROM t WHERE id = 1'), '1',
	'... and the commit stands');
is(LockfenceTest::EtcdCluster::sql_try($i, 'SELECT 41 + 1')->{out}, '42', '... the session goes on');
ok(defined $etcd->key_info($ik), '... the lock it could not release is still in etcd');
my $ipid = $i->{pid};
$i->quit;
ok(gone($ik, 10), '... until the backend exits and revokes its lease');
no_panic($inj, 'injected ERROR at commit');
$inj->stop;

# mid-release: the first lock released, then an ERROR before the second
{
	local $ENV{LOCKFENCE_FAULT_INJECTION} = 'release_step,abort_release';
	$inj->start;
}
$i = LockfenceTest::EtcdCluster::session($inj);
$i->query_safe('BEGIN');
my @mk = map { my $x = $i->query_safe("SELECT key FROM lockfence.etcd_lock('inj2$_', 30, scope => 'transaction')"); chomp $x; $x } qw(a b);
$i->query_safe('INSERT INTO t VALUES (2)');
$r = LockfenceTest::EtcdCluster::sql_try($i, 'COMMIT');
ok($r->{ok}, 'injected ERROR between two releases at commit: COMMIT succeeds') or diag explain $r;
like($r->{stderr}, qr/WARNING:.*lockfence fault injected at release_step/, '... with a WARNING');
is($inj->safe_psql('postgres', 'SELECT count(*) FROM t WHERE id = 2'), '1', '... the commit stands');
is(scalar(grep { !defined $etcd->key_info($_) } @mk), 1,
	'... one lock was released before the error, the other is left to its lease');
is(LockfenceTest::EtcdCluster::sql_try($i, 'SELECT 1')->{out}, '1', '... the session goes on');

# abort: ROLLBACK, an error, a rollback to savepoint
$i->query_safe('BEGIN');
my $ak = $i->query_safe("SELECT key FROM lockfence.etcd_lock('inj3', 30, scope => 'transaction')");
chomp $ak;
$r = LockfenceTest::EtcdCluster::sql_try($i, 'ROLLBACK');
ok($r->{ok}, 'injected ERROR in the release at ROLLBACK: ROLLBACK succeeds') or diag explain $r;
like($r->{stderr}, qr/WARNING:.*lockfence fault injected at abort_release/, '... with a WARNING');

$i->query_safe('BEGIN');
$i->query_safe("SELECT key FROM lockfence.etcd_lock('inj4', 30, scope => 'transaction')");
$r = LockfenceTest::EtcdCluster::sql_try($i, 'SELECT 1/0');
is($r->{sqlstate}, '22012', 'an error in the transaction is reported as itself');
$r = LockfenceTest::EtcdCluster::sql_try($i, 'ROLLBACK');
ok($r->{ok}, '... and its abort, whose release fails, completes') or diag explain $r;

$i->query_safe('BEGIN');
$i->query_safe('INSERT INTO t VALUES (5)');
$i->query_safe('SAVEPOINT s');
$i->query_safe("SELECT key FROM lockfence.etcd_lock('inj5', 30, scope => 'transaction')");
$r = LockfenceTest::EtcdCluster::sql_try($i, 'ROLLBACK TO SAVEPOINT s');
ok($r->{ok}, 'injected ERROR in the release at ROLLBACK TO SAVEPOINT: it succeeds') or diag explain $r;
$r = LockfenceTest::EtcdCluster::sql_try($i, 'COMMIT');
ok($r->{ok}, '... and the transaction commits') or diag explain $r;
is($inj->safe_psql('postgres', 'SELECT count(*) FROM t WHERE id = 5'), '1', '... its work before the savepoint stands');

$i->quit;
no_panic($inj, 'injected ERRORs at abort');
ok(gone($ak, 10), 'the locks left by the failed releases are revoked at backend exit');

$inj->stop;

# --- the abort's safety net for a lock its call did not release -------------
# skip_own_release: a failed call leaves its lock pending (as when its own
# release raised), and the abort of its transaction releases it.
# With release_request as well, that release raises before its request:
# the lock must be abandoned, its lease no longer used for new locks, not
# kept as if it had been handed to the caller.
my $stale = sub {
	my ($name, $label) = @_;
	my $res = LockfenceTest::EtcdCluster::sql_try($i,
		"SELECT lockfence.etcd_lock_and_fence('$name', 'sn', 60)");
	is($res->{sqlstate}, 'LF001', "$label: the stale etcd token is refused")
	  or diag explain $res;
	return $res;
};
{
	local $ENV{LOCKFENCE_FAULT_INJECTION} = 'skip_own_release';
	$inj->start;
}
$inj->safe_psql('postgres', "SELECT lockfence.fence('sn', 1000000000000)");
$i = LockfenceTest::EtcdCluster::session($inj);
# The abort's release of a pending lock has ETCD_PENDING_RELEASE_MS (50 ms)
# by design and gives up what does not fit (gone at session end, else
# with the TTL of 60 s): gone when the call returns unless the backend and
# etcd waited that long for a CPU (released_promptly).
my $wait0 = $etcd->cpu_wait($i->{pid});
$stale->('sn1', 'call without its own release');
$i = $etcd->released_promptly(
	node => $inj,
	session => $i,
	since => $wait0,
	gone => sub { return scalar($etcd->keys('sn1/')) == 0 },
	label => '... the abort released the lock the call left pending (TTL 60 s)',
	show => sub { return [ $etcd->keys('sn1/') ] });
$i->quit;
$inj->stop;
{
	local $ENV{LOCKFENCE_FAULT_INJECTION} = 'skip_own_release,release_request';
	$inj->start;
}
$i = LockfenceTest::EtcdCluster::session($inj);
$r = $stale->('sn2', 'ERROR in the abort\'s release');
like($r->{stderr}, qr/WARNING:.*lockfence fault injected at release_request/,
	'... the failed release is a WARNING');
my @orphan = $etcd->keys('sn2/');
is(scalar(@orphan), 1, '... the lock is left in etcd');
my $next = $i->query_safe("SELECT key FROM lockfence.etcd_lock('sn3', 60, scope => 'session')");
chomp $next;
my ($orphan_lease, $next_lease) = map { m{/([0-9a-f]+)$} ? $1 : $_ } ($orphan[0] // '', $next);
isnt($next_lease, $orphan_lease,
	'... abandoned: the next lock of the same TTL goes on a new lease');
$i->quit;
ok(gone($orphan[0], 10), '... and the lock goes when the session ends');
no_panic($inj, 'injected ERROR in the safety net');
$inj->stop;

$node->stop;
$etcd->stop;
done_testing();
