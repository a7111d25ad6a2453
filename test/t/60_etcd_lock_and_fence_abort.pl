
# 60_etcd_lock_and_fence_abort.pl
#	  etcd_lock_and_fence leaves no lock behind when it fails after the lock
#	  was granted but before the caller got anything (issue 7, item 6), and
#	  checks every argument before contacting etcd (item 14):
#	  - a statement_timeout or pg_cancel_backend while fence() waits for a
#	    fence row locked by another transaction gives 57014, and the lock
#	    key and its lease are gone when the error arrives (before the fix,
#	    PL/pgSQL's WHEN OTHERS did not catch 57014 and the lock stayed held
#	    until its TTL);
#	  - the same inside a PL/pgSQL exception block that catches the error;
#	  - a rejected token (LF001) still releases the lock;
#	  - NULL, empty or over-long resource, NULL name, bad ttl or wait_timeout
#	    are refused at once with the member paused (SIGSTOP): no request is
#	    sent, so no lock is taken (before the fix the lock came first).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'laf');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('laf', <<EOF);
lockfence.etcd_endpoints = '@{[ $etcd->client_url(0) ]}'
lockfence.etcd_request_timeout = '2s'
EOF

sub keys_under { return $etcd->keys(@_); }

# sorted, for comparing lists
sub leases { return sort { $a cmp $b } $etcd->leases; }

sub send_query { return LockfenceTest::EtcdCluster::send_raw(@_); }

sub wait_for_error { return LockfenceTest::EtcdCluster::wait_for_error(@_); }

# Poll until code returns true or the deadline passes.
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

my @base_leases = leases();

# After a cancel or a statement timeout, the failed call's lock is
# released within 50 ms, or once the session ended when the backend and
# etcd waited that long for a CPU (see released_promptly).  Returns the
# session to go on with.
sub released_after_cancel
{
	my ($label, $prefix, $session, $wait0) = @_;
	return $etcd->released_promptly(
		node => $node,
		session => $session,
		since => $wait0,
		gone => sub {
			return !keys_under($prefix)
			  && join(',', leases()) eq join(',', @base_leases);
		},
		label => "$label: no lock key and no lease left",
		show => sub { return [ [ keys_under($prefix) ], [ leases() ], \@base_leases ]; });
}

# Another transaction fences the resource and keeps its fence row locked.
my $blocker = LockfenceTest::EtcdCluster::session($node);
my $canceller = LockfenceTest::EtcdCluster::session($node);

sub block_resource
{
	my ($res) = @_;
	$blocker->query_safe('BEGIN');
	$blocker->query_safe("SELECT lockfence.fence('$res', 1)");
	return;
}

sub unblock_resource
{
	$blocker->query_safe('ROLLBACK');
	return;
}

# Is session $pid waiting for a lock (the fence row)?
sub waits_on_lock
{
	my ($pid) = @_;
	return $canceller->query_safe(
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $pid"
	) eq 't';
}

# --- statement_timeout while fence() waits ---------------------------------

block_resource('res-st');
my $w = LockfenceTest::EtcdCluster::session($node);
$w->query_safe("SET statement_timeout = '1500ms'");
my $wait0 = $etcd->cpu_wait($w->{pid});
my $r = LockfenceTest::EtcdCluster::sql_try($w,
	"SELECT lockfence.etcd_lock_and_fence('laf-st', 'res-st', 60)");
is($r->{sqlstate}, '57014', 'statement_timeout while fencing gives 57014')
  or diag explain $r;
$w = released_after_cancel('statement_timeout while fencing', 'laf-st/', $w, $wait0);
unblock_resource();
$w->query_safe('RESET statement_timeout');

# --- pg_cancel_backend while fence() waits ----------------------------------

block_resource('res-c');
my $wpid = $w->query_safe('SELECT pg_backend_pid()');
$w->{stderr} = '';
$wait0 = $etcd->cpu_wait($wpid);
send_query($w, "SELECT lockfence.etcd_lock_and_fence('laf-c', 'res-c', 60);");
ok(poll_until(30, sub { waits_on_lock($wpid) }),
	'etcd_lock_and_fence waits for the fence row');
is(scalar(keys_under('laf-c/')), 1, 'it holds the etcd lock while waiting');
$canceller->query_safe("SELECT pg_cancel_backend($wpid)");
ok(defined wait_for_error($w, 30), 'cancelled call got an error');
like($w->{stderr}, qr/ERROR:\s+57014/, 'cancel while fencing gives 57014');
$w->{stderr} = '';
is($w->query_safe('SELECT 1'), '1', 'session usable after the cancel');
$w = released_after_cancel('cancel while fencing', 'laf-c/', $w, $wait0);
unblock_resource();

# --- statement_timeout caught by a PL/pgSQL exception block ----------------

block_resource('res-sub');
$w->{stderr} = '';
$w->query_safe("SET statement_timeout = '1500ms'");
$wait0 = $etcd->cpu_wait($w->{pid});
$r = LockfenceTest::EtcdCluster::sql_try($w, q{
DO $$
BEGIN
    BEGIN
        PERFORM lockfence.etcd_lock_and_fence('laf-sub', 'res-sub', 60);
    EXCEPTION WHEN query_canceled THEN
        RAISE NOTICE 'caught %', SQLSTATE;
    END;
END;
$$});
ok($r->{ok}, 'timeout caught in a subtransaction') or diag explain $r;
like($r->{stderr}, qr/caught 57014/, 'the handler saw 57014');
$w = released_after_cancel('caught timeout', 'laf-sub/', $w, $wait0);
unblock_resource();
$w->query_safe('RESET statement_timeout');

# --- a rejected token still releases the lock ------------------------------

$canceller->query_safe("SELECT lockfence.fence('res-stale', 9223372036854775000)");
$r = LockfenceTest::EtcdCluster::sql_try($w,
	"SELECT lockfence.etcd_lock_and_fence('laf-stale', 'res-stale', 60)");
is($r->{sqlstate}, 'LF001', 'stale token gives LF001') or diag explain $r;
is_deeply([ keys_under('laf-stale/') ], [], 'LF001: no lock key left');
is_deeply([ leases() ], \@base_leases, 'LF001: no lease left');

# --- success hands the lock over -------------------------------------------

$r = LockfenceTest::EtcdCluster::sql_try($w,
	"SELECT lockfence.etcd_lock_and_fence('laf-ok', 'res-ok', 60, scope => 'session')");
ok($r->{ok} && $r->{out} =~ /^\d+$/, 'etcd_lock_and_fence returns a token')
  or diag explain $r;
my @k = keys_under('laf-ok/');
is(scalar(@k), 1, 'the lock is held after success');
is($w->query_safe("SELECT lockfence.etcd_unlock('$k[0]')"), 't',
	'and can be released with its key');

# --- arguments are checked before etcd is contacted ------------------------

# With the member paused, any request would hang until the request
# timeout (2 s) and fail with 08006: an immediate argument error proves
# that nothing was sent.  (The session lease of the lock released above
# stays for the session's next lock: issue 9, session leases.)
@base_leases = leases();
$etcd->pause_member(0);
my $long = 'x' x 300;
my @bad = (
	[ "'laf-v', NULL", '22004', 'NULL resource' ],
	[ "'laf-v', ''", '22023', 'empty resource' ],
	[ "'laf-v', '$long'", '22001', 'over-long resource' ],
	[ "NULL, 'r'", '22004', 'NULL name' ],
	[ "'', 'r'", '22023', 'empty name' ],
	[ "'laf-v', 'r', 0", '22023', 'ttl_seconds 0' ],
	[ "'laf-v', 'r', NULL", '22004', 'NULL ttl_seconds' ],
	[ "'laf-v', 'r', 30, '-1 s'", '22023', 'negative wait_timeout' ],);
for my $b (@bad)
{
	my ($args, $state, $what) = @$b;
	my $rd0 = LockfenceTest::EtcdCluster::run_delay($w->{pid});
	$r = LockfenceTest::EtcdCluster::sql_try($w,
		"SELECT lockfence.etcd_lock_and_fence($args)");
	is($r->{sqlstate}, $state, "$what: $state") or diag explain $r;
	# on the server, from the statement's start to its error, less the
	# backend's wait for a CPU: the client's clock also counts psql and
	# a loaded machine's run queue
	my ($ms, $cpu_ms) = LockfenceTest::EtcdCluster::late_ms(
		LockfenceTest::EtcdCluster::statement_duration($node, $w->{pid}),
		$w->{pid}, $rd0);
	ok($ms < 1500,
		sprintf('%s: refused before contacting etcd (%.1f ms, and %.1f ms waiting for a CPU)',
			$what, $ms, $cpu_ms));
}
$etcd->resume_member(0);
$etcd->wait_healthy();
is_deeply([ keys_under('laf-v/') ], [], 'invalid arguments: no lock key');
is_deeply([ leases() ], \@base_leases, 'invalid arguments: no lease');

$w->quit;
$blocker->quit;
$canceller->quit;
$node->stop;
# stop etcd here: stopping it again at global destruction would set the exit code
$etcd->stop;
done_testing();
