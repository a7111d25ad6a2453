
# Leases with several sessions, lockfence preloaded (condition variables):
#
# - a release wakes a waiter at once (the lease's TTL is a minute), and so
#   does a raise_floor() that ends the lease, and (1.11) a fence() with a
#   higher token, which takes it over;
# - pg_cancel_backend and statement_timeout stop a wait at once;
# - a paused client (SIGSTOP of its psql) whose lease expires: the successor
#   gets a higher token, the old holder's later writes are rejected, and in
#   commit order no two holders' writes interleave; paused inside a
#   fencing transaction, it holds the successor back until it ends;
# - under REPEATABLE READ a waiter fails with 40001 at a release after its
#   snapshot (it could never see the release), not at the TTL;
# - tokens only grow, across a crash (pg_ctl stop -m immediate), and a
#   grant acknowledged under synchronous_commit = off is not lost by one;
# - a first grant of a name in a prepared transaction: lease_try_acquire
#   does not wait for it, lease_acquire's wait_timeout bounds the wait
#   (55P03), as for any uncommitted first grant (test/specs/
#   lease_first_grant.spec); before, both waited until statement_timeout.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IPC::Run;

use LockfenceTest::EtcdCluster;    # session helpers only; no etcd here

my $node = LockfenceTest::EtcdCluster::pg_node('leases',
	"shared_preload_libraries = 'lockfence'\ntrack_commit_timestamp = on\n"
	  . "max_prepared_transactions = 2\n");
$node->safe_psql('postgres', q{
	CREATE TABLE log (n bigserial PRIMARY KEY, who text NOT NULL,
					  token bigint NOT NULL);
	SELECT lockfence.protect('log', resource => 'job');
});

sub S { return LockfenceTest::EtcdCluster::session($node); }

# Is session $s's backend waiting inside a lease wait?
sub lease_waiting
{
	my ($pid) = @_;
	return $node->safe_psql('postgres',
		"SELECT wait_event_type IN ('Extension', 'Lock') FROM pg_stat_activity WHERE pid = $pid"
	) eq 't';
}

sub wait_for_error { return LockfenceTest::EtcdCluster::wait_for_error(@_); }

# How late a waiter was granted after the commit that should wake it: from
# that transaction's commit timestamp (track_commit_timestamp) to the
# waiter's clock reading at its grant, both on the server, less the time
# the waiter's backend spent waiting for a CPU meanwhile (the growth of its
# run_delay since $rd_before, read while it slept), which says nothing
# about the wake-up and is returned apart (docs/testing-lanes.md).  The
# statement that commits must return pg_current_xact_id().
sub granted_late_ms
{
	my ($xid, $granted_at, $waiter_pid, $rd_before) = @_;
	my $committed_at = $node->safe_psql('postgres',
		"SELECT extract(epoch FROM pg_xact_commit_timestamp('$xid'::xid))");
	return LockfenceTest::EtcdCluster::late_ms($granted_at - $committed_at,
		$waiter_pid, $rd_before);
}

# --- a release wakes the waiter -----------------------------------------------

my $holder = S();
my $t1 = $holder->query_safe(
	"SELECT token FROM lockfence.lease_acquire('wake', '1 min', 'h')");
is($t1, '1', 'first grant: token 1');

my $waiter = S();
LockfenceTest::EtcdCluster::send_query($waiter,
	"SELECT token, extract(epoch FROM clock_timestamp()) FROM lockfence.lease_acquire('wake', '1 min', 'w');");
ok(LockfenceTest::EtcdCluster::poll_until(30, sub { lease_waiting($waiter->{pid}) }),
	'the waiter waits');
my $rd = LockfenceTest::EtcdCluster::run_delay($waiter->{pid});
my $release_xid = $holder->query_safe(
	"SELECT pg_current_xact_id() FROM lockfence.lease_release('wake', 1)");
my ($out) = LockfenceTest::EtcdCluster::wait_result($waiter, 30);
my ($t2, $granted_at) = split /\|/, $out;
is($t2, '2', 'the waiter is granted the next token');
# The TTL is 60 s; a waiter not woken looks again within a second.
my ($handon_ms, $cpu_ms) = granted_late_ms($release_xid, $granted_at, $waiter->{pid}, $rd);
ok($handon_ms < 500,
	sprintf('the waiter is woken by the release, not by the TTL (granted %.1f ms after its commit, and %.1f ms waiting for a CPU)',
		$handon_ms, $cpu_ms));

# --- a raised floor wakes the waiter ------------------------------------------
# raise_floor() ends the leases of the rows it raises: a waiter must look
# again when it commits.  A waiter sleeps at most a second between looks
# (LEASE_MAX_SLEEP_MS, for a client that went away), so one woken by
# nothing would still be granted within a second: each of 3 tries must be
# granted within 300 ms of the floor's commit (by the server's clock, less
# the waiter's wait for a CPU: granted_late_ms), which a waiter not woken
# by it meets in about 3 of 10 tries, all 3 about once in 40 runs.

# (library of 1.11) So must a fence() with a higher token, which takes the
# lease over and ends it: before, its waiters were granted at their next
# look, up to a second later (rev14).
for my $case ((map { ['floor', $_] } 1 .. 3), (map { ['takeover', $_] } 1 .. 3))
{
	my ($how, $try) = @$case;
	my $name = "${how}wake$try";
	my $floor = 1000 * $try;
	my $ends = $how eq 'floor'
	  ? "lockfence.raise_floor($floor, ARRAY['$name'])"
	  : "lockfence.fence('$name', $floor)";
	my $fholder = S();
	is($fholder->query_safe(
		"SELECT token FROM lockfence.lease_acquire('$name', '1 min', 'h')"),
		'1', "$how $try: first grant, token 1");
	my $fwaiter = S();
	LockfenceTest::EtcdCluster::send_query($fwaiter,
		"SELECT token, extract(epoch FROM clock_timestamp()) FROM lockfence.lease_acquire('$name', '1 min', 'w');");
	ok(LockfenceTest::EtcdCluster::poll_until(30, sub { lease_waiting($fwaiter->{pid}) }),
		"$how $try: the waiter waits");
	my $frd = LockfenceTest::EtcdCluster::run_delay($fwaiter->{pid});
	my $floor_xid = $fholder->query_safe(
		"SELECT pg_current_xact_id() FROM $ends");
	my ($fout) = LockfenceTest::EtcdCluster::wait_result($fwaiter, 50);
	my ($ft, $fgranted_at) = split /\|/, $fout;
	is($ft, $floor + 1, "$how $try: the waiter is granted the token after it");
	my ($fhandon_ms, $fcpu_ms) = defined $fgranted_at
	  ? granted_late_ms($floor_xid, $fgranted_at, $fwaiter->{pid}, $frd)
	  : (999_999, 0);
	ok($fhandon_ms < 300,
		sprintf('%s %d: the waiter is woken by it (granted %.1f ms after its commit, and %.1f ms waiting for a CPU)',
			$how, $try, $fhandon_ms, $fcpu_ms));
	$fholder->quit;
	$fwaiter->quit;
}

# --- cancel and statement_timeout stop a wait --------------------------------

for my $case (['pg_cancel_backend', ''],
	['statement_timeout', "SET statement_timeout = '300ms';"])
{
	my ($what, $setup) = @$case;
	my $w = S();
	$w->query_safe($setup) if $setup;
	LockfenceTest::EtcdCluster::send_query($w,
		"SELECT token FROM lockfence.lease_acquire('wake', '1 min', 'x');");
	my $t0;
	if ($what eq 'pg_cancel_backend')
	{
		ok(LockfenceTest::EtcdCluster::poll_until(30, sub { lease_waiting($w->{pid}) }),
			"$what: the waiter waits");
		$t0 = time;
		$node->safe_psql('postgres', "SELECT pg_cancel_backend($w->{pid})");
	}
	my $err_at = wait_for_error($w, 30);
	ok(defined $err_at, "$what: the wait ends in an error");
	like($w->{stderr}, qr/57014/, "$what: SQLSTATE 57014");
	if ($what eq 'statement_timeout')
	{
		# A 300 ms timeout can fire before a poll of pg_stat_activity sees
		# the wait (it did on the assert build under load): time it from
		# the statement's start on the server instead.  It waited if the
		# error came no sooner than the timeout.
		$t0 = LockfenceTest::EtcdCluster::statement_start($node, $w->{pid}) + 0.3;
		ok($err_at >= $t0 - 0.01, "$what: the waiter waits until the timeout")
		  or diag($err_at - $t0);
	}
	ok($err_at - $t0 < 2, "$what: at once") or diag($err_at - $t0);
	$w->quit;
}
$waiter->query_safe("SELECT lockfence.lease_release('wake', 2)");

# --- a paused client ---------------------------------------------------------

# The psql process behind a background session.
sub psql_pid { return $_[0]->{run}->{KIDS}[0]{PID}; }

sub write_as
{
	my ($s, $who, $token) = @_;
	my $r = LockfenceTest::EtcdCluster::sql_try($s,
		"BEGIN; SELECT lockfence.fence('job', $token, '$who'); "
		  . "INSERT INTO log (who, token) VALUES ('$who', $token); COMMIT;");
	return $r->{sqlstate} // 'accepted';
}

my $a = S();
my $b = S();
my $ta = $a->query_safe(
	"SELECT token FROM lockfence.lease_acquire('job', '2 s', 'a')");
$a->query_safe(
	"BEGIN; SELECT lockfence.fence('job', $ta, 'a'); INSERT INTO log (who, token) VALUES ('a', $ta); COMMIT;");

kill 'STOP', psql_pid($a);
ok(LockfenceTest::EtcdCluster::poll_until(30, sub {
	$node->safe_psql('postgres',
		"SELECT lease_expires_at < clock_timestamp() FROM lockfence.fences WHERE resource = 'job'") eq 't' }),
	'paused holder: its lease expires');
my $tb = $b->query_safe(
	"SELECT token FROM lockfence.lease_acquire('job', '1 min', 'b')");
ok($tb > $ta, "the successor gets a higher token ($tb > $ta)");
$b->query_safe(
	"BEGIN; SELECT lockfence.fence('job', $tb, 'b'); INSERT INTO log (who, token) VALUES ('b', $tb); COMMIT;");
kill 'CONT', psql_pid($a);

my $state = write_as($a, 'a', $ta);
is($state, 'LF001', 'the resumed old holder\'s write is rejected as stale');
$b->query_safe("SELECT lockfence.lease_release('job', $tb)");

# Paused inside its fencing transaction: the successor waits for it.
my $tc = $a->query_safe(
	"SELECT token FROM lockfence.lease_acquire('job', '2 s', 'a')");
ok($tc > $tb, "a new grant is higher again ($tc > $tb)");
$a->query_safe(
	"BEGIN; SELECT lockfence.fence('job', $tc, 'a'); INSERT INTO log (who, token) VALUES ('a', $tc);");
kill 'STOP', psql_pid($a);
ok(LockfenceTest::EtcdCluster::poll_until(30, sub {
	$node->safe_psql('postgres',
		"SELECT lease_expires_at < clock_timestamp() FROM lockfence.fences WHERE resource = 'job'") eq 't' }),
	'paused in a transaction: its lease expires');
$state = LockfenceTest::EtcdCluster::sql_try($b,
	"SELECT token FROM lockfence.lease_acquire('job', '1 min', 'b', wait_timeout => '1 s')")->{sqlstate};
is($state, '55P03',
	'no successor while the old holder\'s fencing transaction is open');
LockfenceTest::EtcdCluster::send_query($b,
	"SELECT token FROM lockfence.lease_acquire('job', '1 min', 'b');");
kill 'CONT', psql_pid($a);
# Its late write, past the expiry, in the transaction that fenced in time.
$a->query_safe("INSERT INTO log (who, token) VALUES ('a', $tc); COMMIT;");
($out) = LockfenceTest::EtcdCluster::wait_result($b, 30);
my $td = $out;
ok($td > $tc, "the successor is granted after the old transaction ended ($td > $tc)");
$b->query_safe(
	"BEGIN; SELECT lockfence.fence('job', $td, 'b'); INSERT INTO log (who, token) VALUES ('b', $td); COMMIT;");
$state = write_as($a, 'a', $tc);
is($state, 'LF001', 'the old holder is stale after the takeover');

# In commit order the tokens never go down, and each holder's writes form
# one run: no two holders' writes interleave.
my $order = $node->safe_psql('postgres', q{
	SELECT string_agg(who || token, ' ' ORDER BY pg_xact_commit_timestamp(xmin), n)
	  FROM log});
is($order, "a$ta b$tb a$tc a$tc b$td",
	'commit order: a, b, a (including its late write), b');

# --- 8 sessions contending -----------------------------------------------------

# Each pgbench transaction acquires the lease (TTL 10 s) and releases it;
# a release that fails (its lease was not held to the end) divides by
# zero, which aborts the run.  A failed attempt must leave no row lock
# behind: one that did would block the holder's release until the TTL.
my $script = PostgreSQL::Test::Utils::tempdir . '/contend.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{
SELECT token FROM lockfence.lease_acquire('hot', '10 s') \gset
SELECT 1 / (lockfence.lease_release('hot', :token))::int;
});
my ($pgb_out, $pgb_err) = ('', '');
my $pgb_ok = IPC::Run::run(
	[ 'pgbench', '-n', '-c', '8', '-j', '2', '-T', '3', '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$pgb_out, '2>', \$pgb_err);
ok($pgb_ok, '8 sessions: every release of a granted lease succeeds')
  or diag($pgb_out, $pgb_err);
my ($ntx) = $pgb_out =~ /number of transactions actually processed: (\d+)/;
note("8 sessions, 3 s: $ntx grants");
my $hot = $node->safe_psql('postgres',
	"SELECT token FROM lockfence.fences WHERE resource = 'hot'");
is($hot, $ntx, 'one token per grant, none skipped or repeated');
ok($ntx > 8, 'hand-on is not bound to the TTL');

# --- metrics ------------------------------------------------------------------

my %m = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	"SELECT name, value FROM lockfence.metrics WHERE name LIKE 'lease%' OR name LIKE 'fence_rejected_lease%'");
# Grants: wake 1, 2; floorwake1 to 3 and takeoverwake1 to 3, twice each;
# job a, b, a, b; hot: $ntx.
# Errors: the cancelled wait, the statement_timeout, and the wait_timeout
# behind the paused transaction.
is($m{lease_acquire_total}, 18 + $ntx, 'lease_acquire_total counts the grants');
is($m{lease_acquire_error_total}, 3,
	'lease_acquire_error_total counts cancel, statement_timeout and wait_timeout');
is($m{lease_expired_taken_over_total}, 2,
	'lease_expired_taken_over_total counts the two expired leases taken over');
is($node->safe_psql('postgres',
	"SELECT count FROM lockfence.histograms WHERE name = 'lease_hold_duration_seconds'"),
	3 + 2 + $ntx, 'lease_hold_duration_seconds: every release and expiry');
is($node->safe_psql('postgres',
	"SELECT count FROM lockfence.histograms WHERE name = 'lease_acquire_duration_seconds'"),
	18 + $ntx, 'lease_acquire_duration_seconds: one observation per grant');

# --- REPEATABLE READ: a release after the waiter's snapshot fails it at once --
# Every attempt reads the row as the transaction's snapshot sees it, so the
# release is never seen: the wait would last the lease's minute (here cut
# by wait_timeout, 55P03) and end in a serialization failure anyway.
# (1.11) Also when the waiter reads the row with statements (the table not
# as installed, a Citus shard; here the test switch): it waited until the
# lease's old expiry.
for my $path ('fast path', 'statement path')
{
	my $name = $path eq 'fast path' ? 'rr' : 'rr_stmt';
	my $rr_holder = S();
	$rr_holder->query_safe("SELECT token FROM lockfence.lease_acquire('$name', '1 min', 'h')");
	my $rr = S();
	$rr->query_safe("SET default_transaction_isolation = 'repeatable read'");
	$rr->query_safe('SET lockfence.debug_disable_fastpath = on')
	  if $path eq 'statement path';
	LockfenceTest::EtcdCluster::send_query($rr,
		"SELECT token FROM lockfence.lease_acquire('$name', '1 min', 'w', wait_timeout => '30 s');");
	ok(LockfenceTest::EtcdCluster::poll_until(30, sub { lease_waiting($rr->{pid}) }),
		"repeatable read, $path: the waiter waits");
	my $rr_released = time;
	$rr_holder->query_safe("SELECT lockfence.lease_release('$name', 1)");
	my $rr_failed = wait_for_error($rr, 40);
	like($rr->{stderr}, qr/40001|could not serialize/,
		"repeatable read, $path: a release after the snapshot fails the wait as a serialization failure")
	  or diag $rr->{stderr};
	cmp_ok(($rr_failed // 99) - $rr_released, '<', 15,
		"$path: at the release, not at the wait_timeout (30 s) or the TTL (60 s)");
	$rr->quit;
	$rr_holder->quit;
}

# --- tokens only grow, across a crash ----------------------------------------

$_->quit for ($holder, $waiter, $a, $b);
my $before = $node->safe_psql('postgres',
	"SELECT token FROM lockfence.lease_acquire('crash', '1 min', 'x')");
$node->safe_psql('postgres', q{
	CREATE TABLE pending (t bigint);
});
# A grant not yet committed when the server crashes.
my $bg = S();
$bg->query_safe(
	"BEGIN; SELECT lockfence.lease_release('crash', $before); INSERT INTO pending SELECT token FROM lockfence.lease_acquire('crash', '1 min', 'y');");
$node->stop('immediate');
$bg->{run}->kill_kill;
$node->start;
is($node->safe_psql('postgres',
	"SELECT count(*) FROM lockfence.lease_try_acquire('crash', '1 min', 'z') WHERE token IS NOT NULL"),
	'0', 'after the crash the committed lease is still held');
is($node->safe_psql('postgres',
	"SELECT lockfence.lease_release('crash', $before)"), 't',
	'and its holder can release it with its token');
my $after = $node->safe_psql('postgres',
	"SELECT token FROM lockfence.lease_acquire('crash', '1 min', 'z')");
ok($after > $before, "the next grant is higher ($after > $before)");

# --- an acknowledged grant survives a crash, whatever synchronous_commit --
# Under synchronous_commit = off a commit is acknowledged before its WAL
# is written; the WAL writer (its delay raised to 10 s here) writes it
# later.  A grant lost that way would be handed out again, to a second
# holder: lockfence flushes a grant's commit regardless.  An unrelated
# INSERT after it, also asynchronous, shows what the crash would lose.
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET wal_writer_delay = '10s';
	SELECT pg_reload_conf();});
$node->poll_query_until('postgres', "SELECT current_setting('wal_writer_delay') = '10s'")
  or die 'wal_writer_delay not reloaded';
my $async_tok = $node->safe_psql('postgres', q{
	SET synchronous_commit = off;
	SELECT token FROM lockfence.lease_acquire('async', '1 hour', 'a');});
$node->safe_psql('postgres', q{
	SET synchronous_commit = off;
	INSERT INTO pending VALUES (-1);});
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres',
	"SELECT token FROM lockfence.fences WHERE resource = 'async' AND lease_expires_at > now()"),
	$async_tok, 'an acknowledged grant under synchronous_commit = off survives a crash');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM lockfence.lease_try_acquire('async', '1 min', 'b') WHERE token IS NOT NULL"),
	'0', '... and its token is not granted again');
note('the asynchronous INSERT after it was '
	  . ($node->safe_psql('postgres', 'SELECT count(*) FROM pending WHERE t = -1') eq '0'
		? 'lost' : 'kept') . ' by the crash');
$node->safe_psql('postgres', q{
	ALTER SYSTEM RESET wal_writer_delay;
	SELECT pg_reload_conf();});

# --- a prepared first grant -------------------------------------------------

$node->safe_psql('postgres', q{
	BEGIN;
	SELECT token FROM lockfence.lease_acquire('prepared', '1 min', 'p');
	PREPARE TRANSACTION 'lease_first_grant';
});
# statement_timeout only ends a wait that would not end by itself.
my $t0 = time;
is($node->safe_psql('postgres', q{
	SET statement_timeout = '30s';
	SELECT count(*) FROM lockfence.lease_try_acquire('prepared', '1 min', 'q')
	 WHERE token IS NULL}),
	'1', 'prepared first grant: try_acquire is not granted');
my $took = time - $t0;
ok($took < 10, 'prepared first grant: try_acquire does not wait')
  or diag("took $took s");
$t0 = time;
my ($rc, $stdout, $stderr) = $node->psql('postgres', q{
	SET statement_timeout = '30s';
	SELECT token FROM lockfence.lease_acquire('prepared', '1 min', 'q',
		wait_timeout => '500 ms')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
$took = time - $t0;
like($stderr, qr/ERROR:  55P03: could not acquire lease "prepared" within wait_timeout/,
	'prepared first grant: acquire fails with 55P03 at wait_timeout');
ok($took >= 0.5 && $took < 10, 'prepared first grant: within the bound')
  or diag("took $took s");
$node->safe_psql('postgres', "ROLLBACK PREPARED 'lease_first_grant'");
is($node->safe_psql('postgres',
	"SELECT token FROM lockfence.lease_try_acquire('prepared', '1 min', 'q')"),
	'1', 'after ROLLBACK PREPARED the lease is free');

$node->stop;
done_testing();
