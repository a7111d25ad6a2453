
# 61_etcd_interrupt_stopped_member.pl
#	  Cancel, termination and wait_timeout of a waiting etcd_lock take
#	  effect at once even when the etcd member stopped answering
#	  (SIGSTOP), and the exit cleanup stays within its documented 1 s
#	  budget (issue 7, item 7; issue 17, item 15).  Before issue 7 the
#	  cancel took 1.0 s (the waiter's lease revocation waited its full
#	  second for the paused member) and the termination 2.0 s.  Before
#	  issue 17, a wait_timeout fired about 1 s late (the release after it
#	  got the 1 s budget of other errors; a read of the queue that the
#	  member did not answer even ran on to the request timeout, 08006),
#	  and a termination that arrived while the release after another
#	  error waited for a member that did not answer reached the client
#	  only when that release gave up, a second later.  A read of the queue
#	  that gets no answer during the wait ends at the wait_timeout.  A
#	  cancel of etcd_lock_many that holds one lock and waits for another
#	  releases both within one budget (before, about 100 ms: a budget
#	  each).
#
#	  Latency is measured on the server, by its clock: from the
#	  pg_cancel_backend / pg_terminate_backend call (or the wait_timeout
#	  passing, counted from the statement's start) to the end of the
#	  statement (or the error's line in the server log), less the time the
#	  backend waited, runnable, for a CPU from the signal or the deadline
#	  on (/proc/PID/schedstat:
#	  on a loaded machine the kernel ran other work, which is no lateness
#	  of the code; each check prints it apart), over several tries of
#	  each case: every try below 200 ms, and all but at most one below
#	  100 ms, as the README promises (at_most_one_over in
#	  EtcdCluster.pm says why one; a try over 100 ms is printed with
#	  where its time went).  The backend must be gone within 1.6 s of
#	  the termination (1 s budget plus margin; 2 s before issue 7), by the
#	  server's clock: its "disconnection" line in the server log
#	  (log_disconnections, written after the exit callbacks).
#	  Once the member resumes, the waiters' leases go away (revoked, or
#	  expired: their TTL is 6 s).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $tries = 5;

# The waiters' TTL.  No bound here depends on it, but a waiter's lease
# must outlive its wait: a stall of the whole machine longer than the
# time between two renewals less the TTL (TTL 3: renewed every second, so
# 2 s) let etcd revoke it while the waiter waited; TTL 6 (renewed every
# 2 s) stands a stall of 4 s.  Leases given up while the member was
# stopped expire with it after the member resumes, which
# resume_and_check_leases waits for (up to 30 s): each try waits up to a
# TTL, so a longer one lengthens the file by minutes.
my $ttl = 6;

# The bound (see the header), and the wait_timeout of the tries.
my $bound_ms = 100;
my $wait_s = 1;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'stopint');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('stopint', <<EOF);
lockfence.etcd_endpoints = '@{[ $etcd->client_url(0) ]}'
log_disconnections = on
EOF

sub keys_under { return $etcd->keys(@_); }

# sorted, for comparing lists
sub leases { return sort { $a cmp $b } $etcd->leases; }

sub send_query { return LockfenceTest::EtcdCluster::send_raw(@_); }

sub wait_for_error { return LockfenceTest::EtcdCluster::wait_for_error(@_); }

sub poll_until { return LockfenceTest::EtcdCluster::poll_until(@_, 0.02); }


# The holder keeps the lock, so every waiter queues behind it.
my $holder = LockfenceTest::EtcdCluster::session($node);
# (TTL 600, renewed by resume_and_check_leases after each try: the test
# runs for about 2 minutes, longer on a loaded machine)
my ($hkey, $hlease) = split / /,
  $holder->query_safe("SELECT key || ' ' || lease FROM lockfence.etcd_lock('stop', 600)");
chomp $hlease;
my @base_leases = leases();
my $ctl = LockfenceTest::EtcdCluster::session($node);

sub error_logged_at
{
	return LockfenceTest::EtcdCluster::error_logged_at($node, @_);
}

# Send $fn (pg_cancel_backend, pg_terminate_backend) to backend $pid;
# returns when, by the server's clock (taken just before the signal).
sub signal_at
{
	my ($fn, $pid) = @_;
	my ($t, $sent) = split /\|/,
	  $ctl->query_safe("SELECT extract(epoch FROM clock_timestamp()), $fn($pid)");
	is($sent, 't', "$fn signalled backend $pid");
	return $t;
}

sub statement_end { return LockfenceTest::EtcdCluster::statement_end($node, @_); }

# When backend $pid logged its disconnection (log_disconnections: an
# on_proc_exit callback, after the exit callbacks that revoke its leases),
# in seconds since the epoch by the server's clock; undef if not yet.
sub disconnected_at
{
	my ($pid) = @_;
	my $log = slurp_file($node->logfile);
	my ($at) = $log =~ /^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+) \[$pid\] [^\n]*LOG:\s+disconnection:/m;
	return undef unless defined $at;
	return $node->safe_psql('postgres', "SELECT extract(epoch FROM timestamptz '$at')");
}

sub run_delay { return LockfenceTest::EtcdCluster::run_delay(@_); }

sub late_ms { return LockfenceTest::EtcdCluster::late_ms(@_); }

sub at_most_one_over { return LockfenceTest::EtcdCluster::at_most_one_over(@_); }

# For a try of $ms at or over the bound: where the backend's time went
# from $t0 (the signal, or the deadline) to the error; else undef.
sub over
{
	my ($ms, $w, $t0) = @_;
	return LockfenceTest::EtcdCluster::error_wait_diag_over($ms, $bound_ms, $w, $t0);
}

# When the wait_timeout of session $w's last statement passed, by the
# server's clock.
sub deadline_of
{
	my ($w) = @_;
	return LockfenceTest::EtcdCluster::statement_start($node, $w->{pid}) + $wait_s;
}

# Start a waiter queued behind the holder (with a live member), then
# pause the member.  Returns (session, pid).
sub paused_waiter
{
	my $w = LockfenceTest::EtcdCluster::session($node);
	my $pid = $w->query_safe('SELECT pg_backend_pid()');
	my $rd0 = run_delay($pid) + run_delay($etcd->pid(0));
	send_query($w, "SELECT key FROM lockfence.etcd_lock('stop', $ttl);");
	ok(poll_until(30, sub { scalar(keys_under('stop/')) == 2 }),
		'waiter queued its key')
	  or diag(sprintf("the waiter printed: %s\nkeys: %s\nleases: %s\n"
			  . "the waiter and etcd waited %.1f ms for a CPU since the call\n%s",
			  join(' | ', grep { defined } LockfenceTest::EtcdCluster::peek_output($w)),
			  join(', ', keys_under('stop/')), join(', ', leases()),
			  (run_delay($pid) + run_delay($etcd->pid(0)) - $rd0) * 1000,
			  $etcd->log_tail(0, 15)));
	$etcd->pause_member(0);
	# let the waiter settle in its wait (its keepalive is due after 1 s)
	usleep(200_000);
	return ($w, $pid);
}

sub resume_and_check_leases
{
	my ($label) = @_;
	$etcd->resume_member(0);
	$etcd->wait_healthy();
	$holder->query_safe("SELECT lockfence.etcd_keepalive($hlease)");
	ok(poll_until(30, sub { scalar(keys_under('stop/')) == 1 }),
		"$label: waiter key gone after the member resumed");
	my $gone = poll_until(30,
		sub { join(',', leases()) eq join(',', @base_leases) });
	ok($gone, "$label: waiter lease gone after the member resumed")
	  or diag explain [ leases() ];
	return;
}

# Cancel the statement of session $w (backend $pid), which waits with the
# member stopped: 57014, and the time from the signal to the end of the
# statement, on the server, below twice the bound; the try goes on
# @$tries for at_most_one_over.
sub cancel_and_measure
{
	my ($label, $w, $pid, $tries) = @_;
	my $rd0 = run_delay($pid);
	my $t0 = signal_at('pg_cancel_backend', $pid);
	my $t1 = wait_for_error($w, 10);
	ok(defined $t1, "$label: error arrived");
	like($w->{stderr}, qr/ERROR:\s+57014/, "$label: 57014");
	my ($ms, $cpu_ms) = defined $t1
	  ? late_ms(statement_end($pid) - $t0, $pid, $rd0) : (99999, 0);
	push @$tries, [ $ms, over($ms, $w, $t0) ];
	ok($ms < 2 * $bound_ms,
		sprintf('%s took %.1f ms, and %.1f ms waiting for a CPU (< %d)',
			$label, $ms, $cpu_ms, 2 * $bound_ms));
	return;
}

# --- pg_cancel_backend ----------------------------------------------------------

my @cancel_ms;
for my $i (1 .. $tries)
{
	my ($w, $pid) = paused_waiter();
	cancel_and_measure("cancel $i", $w, $pid, \@cancel_ms);
	resume_and_check_leases("cancel $i");
	$w->{stderr} = '';
	is($w->query_safe('SELECT 1'), '1', "cancel $i: session usable");
	$w->quit;
}
at_most_one_over('cancel', $bound_ms, \@cancel_ms);

# --- pg_cancel_backend during etcd_lock_many ------------------------------------
# The call holds 'astop' (names are taken in byte order) and waits for
# 'stop'.  After the cancel both locks are released within one 50 ms
# budget in all: before, each release had a budget of its own (and what
# did not fit was released again, with another, by the abort), so the
# cancel took about 100 ms with two locks.

my @many_ms;
for my $i (1 .. $tries)
{
	my $w = LockfenceTest::EtcdCluster::session($node);
	my $pid = $w->{pid};
	send_query($w, "SELECT * FROM lockfence.etcd_lock_many(ARRAY['stop', 'astop'], $ttl);");
	ok(poll_until(30, sub {
		scalar(keys_under('stop/')) == 2 && scalar(keys_under('astop/')) == 1 }),
		"lock_many cancel $i: holds astop, queued for stop");
	$etcd->pause_member(0);
	usleep(200_000);
	cancel_and_measure("lock_many cancel $i", $w, $pid, \@many_ms);
	resume_and_check_leases("lock_many cancel $i");
	ok(poll_until(30, sub { scalar(keys_under('astop/')) == 0 }),
		"lock_many cancel $i: the lock held goes with its lease");
	$w->{stderr} = '';
	is($w->query_safe('SELECT 1'), '1', "lock_many cancel $i: session usable");
	$w->quit;
}
at_most_one_over('lock_many cancel', $bound_ms, \@many_ms);

# --- pg_terminate_backend -------------------------------------------------------

my @term_ms;
for my $i (1 .. $tries)
{
	my ($w, $pid) = paused_waiter();
	my $rd0 = run_delay($pid);
	my $t0 = signal_at('pg_terminate_backend', $pid);
	my $t1 = wait_for_error($w, 10);
	# (the backend is still there: its exit cleanup waits for the member)
	my ($ms, $cpu_ms) = (99999, 0);
	($ms, $cpu_ms) = late_ms(0, $pid, $rd0) if defined $t1;
	ok(defined $t1, "terminate $i: error arrived");
	like($w->{stderr}, qr/FATAL:\s+57P01/, "terminate $i: 57P01");
	# from the signal to the FATAL in the server log
	my $t_err = defined $t1 ? error_logged_at($pid, 'FATAL') : undef;
	$ms = defined $t_err ? ($t_err - $t0) * 1000 - $cpu_ms : 99999;
	push @term_ms, [ $ms, over($ms, $w, $t0) ];
	ok($ms < 2 * $bound_ms,
		sprintf('terminate %d took %.1f ms, and %.1f ms waiting for a CPU (< %d)',
			$i, $ms, $cpu_ms, 2 * $bound_ms));

	# the exit cleanup (revoking the lease) is bounded by 1 s in total:
	# from the signal to the backend's disconnection line in the server
	# log, written after the exit callbacks, both by the server's clock
	# (the client's polling of pg_stat_activity is not what is bounded)
	my $gone = poll_until(10, sub {
		$ctl->query_safe("SELECT count(*) FROM pg_stat_activity WHERE pid = $pid") eq '0' });
	my $t_exit = $gone ? poll_until(10, sub { disconnected_at($pid) }) : undef;
	my $exit_s = defined $t_exit ? $t_exit - $t0 : 99;
	ok($gone && defined $t_exit && $exit_s < 1.6,
		sprintf('terminate %d: backend gone after %.2f s (budget 1 s)', $i, $exit_s))
	  or diag($gone ? 'no disconnection line for the backend in the server log' : 'the backend did not exit');
	resume_and_check_leases("terminate $i");
	eval { $w->quit; };
}
at_most_one_over('terminate', $bound_ms, \@term_ms);

# --- wait_timeout -----------------------------------------------------------------
# The waiter queues, the member stops answering, and the wait_timeout
# passes: 55P03 at once (the release of the waiter's key gets the short
# budget, and a read of the queue that the member does not answer is cut
# at the deadline).

my @late_ms;
for my $i (1 .. $tries)
{
	my $w = LockfenceTest::EtcdCluster::session($node);
	# load the library and open the connections first: the lateness of
	# the wait_timeout is measured, not the session's first call
	$w->query_safe("SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('warm', $ttl)");
	send_query($w, "SELECT key FROM lockfence.etcd_lock('stop', $ttl, '${wait_s}s');");
	ok(poll_until(30, sub { scalar(keys_under('stop/')) == 2 }),
		"wait_timeout $i: waiter queued its key");
	$etcd->pause_member(0);
	my $t1 = wait_for_error($w, 15);
	# the wait for a CPU counted from the deadline on
	my $rd0 = LockfenceTest::EtcdCluster::run_delay_after($node, $w, $wait_s);
	ok(defined $t1, "wait_timeout $i: error arrived");
	like($w->{stderr}, qr/ERROR:\s+55P03/, "wait_timeout $i: 55P03")
	  or diag $w->{stderr};
	# the wait_timeout runs from the statement's start on the server, to
	# the server's error (statement_duration)
	my ($ms, $cpu_ms) = defined $t1
	  ? late_ms(LockfenceTest::EtcdCluster::statement_duration($node, $w->{pid}) - $wait_s,
		$w->{pid}, $rd0) : (99999, 0);
	push @late_ms, [ $ms, over($ms, $w, deadline_of($w)) ];
	ok($ms < 2 * $bound_ms,
		sprintf('wait_timeout %d fired %.1f ms after it passed, and %.1f ms waiting for a CPU (< %d)',
			$i, $ms, $cpu_ms, 2 * $bound_ms));
	resume_and_check_leases("wait_timeout $i");
	$w->{stderr} = '';
	is($w->query_safe('SELECT 1'), '1', "wait_timeout $i: session usable");
	$w->quit;
}
at_most_one_over('wait_timeout', $bound_ms, \@late_ms);

# --- termination during the release after another error ----------------------------
# Through test/fault_http_server.py: the reply to the lock request is
# malformed (08P01, after etcd queued the key), and the revocation that
# releases the key then gets no answer, as from a stopped member: the
# release may take up to 1 s (the budget after errors other than a
# cancel).  A termination that arrives meanwhile cuts it short.

my $fault = $etcd->start_fault_server($etcd->client_url(0));
my @cut_ms;
for my $i (1 .. $tries)
{
	my $w = LockfenceTest::EtcdCluster::session($node);
	my $pid = $w->{pid};
	$w->query_safe("SET lockfence.etcd_endpoints = '@{[ $fault->url ]}'");
	$fault->clear;
	$fault->set(path => '/v3/kv/txn', mode => 'mutate', times => 1,
		ops => [ { op => 'del', path => ['header'] } ]);
	$fault->set(path => '/v3/lease/revoke', mode => 'hang', seconds => 10);
	my $revokes = $fault->hits->{'/v3/lease/revoke'} // 0;
	send_query($w, "SELECT key FROM lockfence.etcd_lock('cut$i', 3);");
	ok(poll_until(10, sub { ($fault->hits->{'/v3/lease/revoke'} // 0) > $revokes }),
		"release cut $i: the release is waiting for its revocation");
	usleep(100_000);
	# the signal's time by the server's clock, read in the query that sends it
	my $rd0 = run_delay($pid);
	my $t0 = signal_at('pg_terminate_backend', $pid);
	my $t1 = wait_for_error($w, 10);
	my ($late, $cpu_ms) = (0, 0);
	($late, $cpu_ms) = late_ms(0, $pid, $rd0) if defined $t1;
	ok(defined $t1, "release cut $i: error arrived");
	# and the error's time by the same clock: its line in the server log,
	# written as the backend raised it (the client reading it later, on a
	# loaded machine tens of ms later, is not what the bound is about)
	my $t_err = defined $t1 ? error_logged_at($pid) : undef;
	my $ms = defined $t_err ? ($t_err - $t0) * 1000 - $cpu_ms : 99999;
	push @cut_ms, [ $ms, over($ms, $w, $t0) ];
	ok($ms < 2 * $bound_ms,
		sprintf('release cut %d: the backend raised the error %.1f ms after the termination, and waited %.1f ms for a CPU (< %d)',
			$i, $ms, $cpu_ms, 2 * $bound_ms));
	like($w->{stderr}, qr/ERROR:\s+08P01/, "release cut $i: the error is the malformed reply's");
	# (psql, idle, reads the FATAL only with its next query: look at the
	# backend instead; its exit cleanup has a 1 s budget)
	ok(poll_until(5, sub {
		$ctl->query_safe("SELECT count(*) FROM pg_stat_activity WHERE pid = $pid") eq '0' }),
		"release cut $i: the backend terminated");
	$fault->clear;
	eval { $w->quit; };
	# the lock's lease (TTL 3) expires with its key
	ok(poll_until(20, sub { scalar(keys_under("cut$i/")) == 0 }),
		"release cut $i: the key goes with its lease");
}
at_most_one_over('release cut', $bound_ms, \@cut_ms);

# --- wait_timeout during a read of the queue that gets no answer ------------------
# Through the fault server: the lock request is relayed, and the waiter's
# next read of the queue (a txn too) hangs, as on a member that stopped
# answering just then.  The read is bounded by what is left of the wait:
# 55P03 at the wait_timeout (before, 08006 after the request timeout).
my @read_ms;
for my $i (1 .. $tries)
{
	my $w = LockfenceTest::EtcdCluster::session($node);
	$w->query_safe("SET lockfence.etcd_endpoints = '@{[ $fault->url ]}'");
	$w->query_safe("SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('warm', 3)");
	$fault->clear;
	$fault->set(path => '/v3/kv/txn', mode => 'mutate', times => 1, ops => []);
	$fault->set(path => '/v3/kv/txn', mode => 'hang', seconds => 10);
	send_query($w, "SELECT key FROM lockfence.etcd_lock('stop', 3, '${wait_s}s');");
	my $t1 = wait_for_error($w, 15);
	my $rd0 = LockfenceTest::EtcdCluster::run_delay_after($node, $w, $wait_s);
	ok(defined $t1, "queue read $i: error arrived");
	like($w->{stderr}, qr/ERROR:\s+55P03/, "queue read $i: 55P03") or diag $w->{stderr};
	like($w->{stderr}, qr/DETAIL:\s+The wait_timeout passed during a read of the lock queue/,
		"queue read $i: the detail names the read") or diag $w->{stderr};
	my ($ms, $cpu_ms) = defined $t1
	  ? late_ms(LockfenceTest::EtcdCluster::statement_duration($node, $w->{pid}) - $wait_s,
		$w->{pid}, $rd0) : (99999, 0);
	push @read_ms, [ $ms, over($ms, $w, deadline_of($w)) ];
	ok($ms < 2 * $bound_ms,
		sprintf('queue read %d: wait_timeout fired %.1f ms after it passed, and %.1f ms waiting for a CPU (< %d)',
			$i, $ms, $cpu_ms, 2 * $bound_ms));
	$fault->clear;
	ok(poll_until(20, sub { scalar(keys_under('stop/')) == 1 }),
		"queue read $i: the waiter's key is gone");
	$w->quit;
}
at_most_one_over('queue read', $bound_ms, \@read_ms);
$fault->stop;

is_deeply([ keys_under('stop/') ], [$hkey], 'the holder still holds the lock');
$holder->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
$holder->quit;
$ctl->quit;
$node->stop;
# stop etcd here: stopping it again at global destruction would set the exit code
$etcd->stop;
done_testing();
