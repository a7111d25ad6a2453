
# A blocked etcd_lock() stops at once on pg_cancel_backend, statement_timeout
# and pg_terminate_backend, and leaves no waiter key or lease behind.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

# Time allowed from the interrupt to the error reaching the client.  It
# runs from the server's clock when the signal is sent (or, for
# statement_timeout, when the statement started), not from before the
# test's own request: the round trip of the canceller's query through psql
# and IPC::Run is the harness's time, not the waiter's, and on a busy
# machine it alone took longer than the budget (128.6 ms for a
# termination the waiter answered at once).  Perl's time() and
# clock_timestamp() read the same clock.
my $budget = 0.1;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'interrupt');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('etcd_interrupt',
	"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n");

my $holder = LockfenceTest::EtcdCluster::session($node);
my $hkey = $holder->query_safe("SELECT key FROM lockfence.etcd_lock('intr', 60)");
chomp $hkey;
my @base_leases = sort $etcd->leases;

my $canceller = LockfenceTest::EtcdCluster::session($node);

# Signal a backend from the canceller's session with FN (pg_cancel_backend,
# pg_terminate_backend); returns the server's clock just before it did.
sub signal_backend
{
	my ($fn, $pid) = @_;
	my ($t, $sent) = split /\|/,
	  $canceller->query_safe("SELECT extract(epoch FROM clock_timestamp()), $fn($pid)");
	is($sent, 't', "$fn signalled the waiter");
	return $t;
}

sub wait_for_error { return LockfenceTest::EtcdCluster::wait_for_error(@_); }

sub late_ms { return LockfenceTest::EtcdCluster::late_ms(@_); }

# Start a waiter blocked behind the holder; returns the session.
sub start_waiter
{
	my ($setup) = @_;
	my $w = LockfenceTest::EtcdCluster::session($node);
	$w->query_safe($setup) if $setup;
	LockfenceTest::EtcdCluster::send_query($w,
		"SELECT key, token FROM lockfence.etcd_lock('intr', 60);");
	ok($etcd->wait_for_keys('intr/', 2), 'waiter queued its key');
	return $w;
}

# --- pg_cancel_backend -------------------------------------------------------

my $w = start_waiter();
my $t0 = signal_backend('pg_cancel_backend', $w->{pid});
my $t1 = wait_for_error($w, 30);
ok(defined $t1, 'cancelled waiter got an error');
my $elapsed = defined $t1 ? $t1 - $t0 : 999;
ok($elapsed < $budget,
	sprintf('cancel stopped the wait within %.0f ms (took %.1f ms)',
		$budget * 1000, $elapsed * 1000));
like($w->{stderr}, qr/ERROR:\s+57014/, 'cancel raises 57014');
is_deeply([ $etcd->keys('intr/') ], [$hkey], 'cancelled waiter left no key');
is_deeply([ sort $etcd->leases ], \@base_leases,
	'cancelled waiter left no lease');
my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($w, 30);
is($w->query_safe('SELECT 1'), '1', 'session remains usable after the cancel');
$w->quit;

# --- statement_timeout ---------------------------------------------------------

$w = LockfenceTest::EtcdCluster::session($node);
$w->query_safe("SET statement_timeout = '1s'");
LockfenceTest::EtcdCluster::send_query($w,
	"SELECT key, token FROM lockfence.etcd_lock('intr', 60);");
# The backend's wait for a CPU counted from the timeout on: what it waited
# before does not delay the error.
my $rd0 = LockfenceTest::EtcdCluster::run_delay_after($node, $w->{pid},
	1.0, "etcd_lock('intr'");
$t1 = wait_for_error($w, 30);
ok(defined $t1, 'waiter under statement_timeout got an error');
# From the statement's start (its timeout starts just after) to its error,
# both on the server's clock (the failed statement stays the session's
# last one): the test's psql and Perl reading the error add nothing (on a
# loaded machine they added 450 ms).  Never early; late by less than the
# budget, not counting the backend's wait for a CPU after the timeout.
$elapsed = defined $t1
  ? LockfenceTest::EtcdCluster::statement_duration($node, $w->{pid}) : 999;
my ($late_ms, $cpu_ms) = late_ms($elapsed - 1.0, $w->{pid}, $rd0);
ok($elapsed >= 1.0 && $late_ms < $budget * 1000,
	sprintf('statement_timeout of 1 s stopped the wait after %.1f ms (%.1f ms late, %.1f ms waiting for a CPU)',
		$elapsed * 1000, $late_ms, $cpu_ms));
like($w->{stderr}, qr/ERROR:\s+57014/, 'statement_timeout raises 57014');
like($w->{stderr}, qr/statement timeout/, '... as a statement timeout');
is_deeply([ $etcd->keys('intr/') ], [$hkey], 'timed-out waiter left no key');
is_deeply([ sort $etcd->leases ], \@base_leases,
	'timed-out waiter left no lease');
LockfenceTest::EtcdCluster::wait_result($w, 30);
$w->quit;

# --- pg_terminate_backend --------------------------------------------------------

$w = start_waiter();
$t0 = signal_backend('pg_terminate_backend', $w->{pid});
$t1 = wait_for_error($w, 30);
ok(defined $t1, 'terminated waiter got an error');
$elapsed = defined $t1 ? $t1 - $t0 : 999;
ok($elapsed < $budget,
	sprintf('termination stopped the wait within %.0f ms (took %.1f ms)',
		$budget * 1000, $elapsed * 1000));
like($w->{stderr}, qr/FATAL:\s+57P01/, 'termination raises 57P01');
is_deeply([ $etcd->keys('intr/') ], [$hkey], 'terminated waiter left no key');
is_deeply([ sort $etcd->leases ], \@base_leases,
	'terminated waiter left no lease');
eval { $w->quit; };

# --- the holder still holds, and the lock is usable afterwards ------------------

is_deeply([ $etcd->keys('intr/') ], [$hkey], 'holder still holds the lock');
$holder->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
my $row = $canceller->query_safe(
	"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('intr', 10, '5 s')");
is($row, 't', 'lock can be taken and released after the interrupted waits');

$holder->quit;
$canceller->quit;
$node->stop;
done_testing();
