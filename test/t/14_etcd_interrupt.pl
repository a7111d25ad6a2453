
# A blocked etcd_lock() stops at once on pg_cancel_backend, statement_timeout
# and pg_terminate_backend, and leaves no waiter key or lease behind.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

# Time allowed from the interrupt to the error, all on the server's clock:
# from just before the signal (or, for statement_timeout, the deadline) to
# the end of the statement (or, for a termination, the FATAL's line in the
# server log), less what the backend waited, runnable, for a CPU in
# between (/proc/PID/schedstat; each check prints it apart).  Neither the
# round trip of the canceller's query nor the test's psql and Perl reading
# the error count: they are the harness's time, not the waiter's.  On a
# busy machine the first alone took 128.6 ms for a termination the waiter
# answered at once, and the second 573 ms for a cancel, in a CI run where
# a Valgrind lane held both cores.
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

sub run_delay { return LockfenceTest::EtcdCluster::run_delay(@_); }

# The waiter's key and lease, gone: only the holder's key and the leases
# there were before.
sub waiter_gone
{
	return join(',', $etcd->keys('intr/')) eq $hkey
	  && join(',', sort $etcd->leases) eq join(',', @base_leases);
}

sub waiter_state
{
	return { keys => [ $etcd->keys('intr/') ], leases => [ sort $etcd->leases ] };
}

# What the (one) etcd member waited, runnable, for a CPU so far (s).
sub etcd_run_delay { return run_delay($etcd->pid(0)); }

# The waiter releases its key and lease before its error is sent, within
# ETCD_PENDING_RELEASE_MS (50 ms) by design; what does not fit goes when
# the session ends (its exit callback revokes the lease) or with the TTL.
# released_promptly (EtcdCluster.pm) demands them gone at once unless the
# backend and etcd waited that long for a CPU since $since, else once the
# session ended.  Returns the session to go on with (a new one if ended).
sub left_nothing
{
	my ($w, $since, $what) = @_;
	return $etcd->released_promptly(
		node => $node,
		session => $w,
		since => $since,
		gone => \&waiter_gone,
		label => "$what waiter left no key and no lease",
		show => \&waiter_state);
}

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
my $rd0 = run_delay($w->{pid});
my $wait0 = $etcd->cpu_wait($w->{pid});
my $t0 = signal_backend('pg_cancel_backend', $w->{pid});
my $t1 = wait_for_error($w, 30);
ok(defined $t1, 'cancelled waiter got an error');
# from the signal to the end of the statement, both on the server
my ($late_ms, $cpu_ms) = defined $t1
  ? late_ms(LockfenceTest::EtcdCluster::statement_end($node, $w->{pid}) - $t0,
	$w->{pid}, $rd0)
  : (99999, 0);
ok($late_ms < $budget * 1000,
	sprintf('cancel stopped the wait within %.0f ms (took %.1f ms, and %.1f ms waiting for a CPU)',
		$budget * 1000, $late_ms, $cpu_ms));
like($w->{stderr}, qr/ERROR:\s+57014/, 'cancel raises 57014');
my $cancelled = $w;
$w = left_nothing($w, $wait0, 'cancelled');
if ($w == $cancelled)
{
	LockfenceTest::EtcdCluster::wait_result($w, 30);
	is($w->query_safe('SELECT 1'), '1', 'session remains usable after the cancel');
}
else
{
	note('the cancelled session was ended for the release check: its use after the cancel is not checked this time');
}
$w->quit;

# --- statement_timeout ---------------------------------------------------------

$w = LockfenceTest::EtcdCluster::session($node);
$w->query_safe("SET statement_timeout = '1s'");
# (for the release check, etcd's wait for a CPU counted from before the
# statement, the backend's from the timeout on)
my $etcd_rd_before = etcd_run_delay();
LockfenceTest::EtcdCluster::send_query($w,
	"SELECT key, token FROM lockfence.etcd_lock('intr', 60);");
$t1 = wait_for_error($w, 30);
# The backend's wait for a CPU counted from the timeout on: what it waited
# before does not delay the error.
$rd0 = LockfenceTest::EtcdCluster::run_delay_after($node, $w, 1.0);
ok(defined $t1, 'waiter under statement_timeout got an error');
# From the statement's start (its timeout starts just after) to its error,
# both on the server's clock (the failed statement stays the session's
# last one): the test's psql and Perl reading the error add nothing (on a
# loaded machine they added 450 ms).  Never early; late by less than the
# budget, not counting the backend's wait for a CPU after the timeout.
my $elapsed = defined $t1
  ? LockfenceTest::EtcdCluster::statement_duration($node, $w->{pid}) : 999;
($late_ms, $cpu_ms) = late_ms($elapsed - 1.0, $w->{pid}, $rd0);
ok($elapsed >= 1.0 && $late_ms < $budget * 1000,
	sprintf('statement_timeout of 1 s stopped the wait after %.1f ms (%.1f ms late, %.1f ms waiting for a CPU)',
		$elapsed * 1000, $late_ms, $cpu_ms));
like($w->{stderr}, qr/ERROR:\s+57014/, 'statement_timeout raises 57014');
like($w->{stderr}, qr/statement timeout/, '... as a statement timeout');
my $timed_out = $w;
$w = left_nothing($w, $rd0 + $etcd_rd_before, 'timed-out');
LockfenceTest::EtcdCluster::wait_result($w, 30) if $w == $timed_out;
$w->quit;

# --- pg_terminate_backend --------------------------------------------------------

$w = start_waiter();
$rd0 = run_delay($w->{pid});
my $etcd_rd0 = etcd_run_delay();
$t0 = signal_backend('pg_terminate_backend', $w->{pid});
$t1 = wait_for_error($w, 30);
ok(defined $t1, 'terminated waiter got an error');
# from the signal to the FATAL's line in the server log, less the
# backend's wait for a CPU up to that line (from wait_for_error's samples:
# the backend exits right after, and its wait cannot be read then)
my $t_err = defined $t1
  ? LockfenceTest::EtcdCluster::error_logged_at($node, $w->{pid}, 'FATAL')
  : undef;
$cpu_ms = 0;
if (defined $t_err)
{
	my $rd1 = LockfenceTest::EtcdCluster::run_delay_at($w, $t_err);
	$cpu_ms = $rd1 > $rd0 ? ($rd1 - $rd0) * 1000 : 0;
}
$late_ms = defined $t_err ? ($t_err - $t0) * 1000 - $cpu_ms : 99999;
ok($late_ms < $budget * 1000,
	sprintf('termination stopped the wait within %.0f ms (took %.1f ms, and %.1f ms waiting for a CPU)',
		$budget * 1000, $late_ms, $cpu_ms));
like($w->{stderr}, qr/FATAL:\s+57P01/, 'termination raises 57P01');
# The terminated waiter revokes its lease before the FATAL is sent, within
# ETCD_PENDING_RELEASE_MS (50 ms), and its exit callback, which runs after
# the FATAL is sent, tries again within what is left of ETCD_EXIT_REVOKE_MS
# (1 s).  As released_promptly does for the other two, but the backend's
# wait for a CPU read from wait_for_error's samples (it has exited): gone
# at once unless the backend and etcd waited 50 ms for a CPU, else within
# 10 s (the backend has exited; its exit callback ran or is running).
my $term_waited_ms = $cpu_ms + (etcd_run_delay() - $etcd_rd0) * 1000;
if ($term_waited_ms < 50 || waiter_gone())
{
	ok(waiter_gone(),
		sprintf('terminated waiter left no key and no lease (the backend and etcd waited %.1f ms for a CPU)',
			$term_waited_ms))
	  or diag explain waiter_state();
}
else
{
	ok(LockfenceTest::EtcdCluster::poll_until(10, \&waiter_gone),
		sprintf('terminated waiter left no key and no lease once it exited (the backend and etcd waited %.1f ms for a CPU, more than the release before the error has)',
			$term_waited_ms))
	  or diag explain waiter_state();
}
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
