# Copyright: lockfence contributors
#
# 40_metrics.pl: the shared-memory metrics and the rejection log.
#
# Every counter is checked by its exact change: a snapshot of all counters
# is taken before each action, and afterwards the named counters must have
# moved by exactly the given amounts and every other counter not at all.
# Readings come from other sessions than the ones that counted.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $node = PostgreSQL::Test::Cluster->new('metrics');
init_node($node);
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'lockfence'
log_min_messages = warning
restart_after_crash = on
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION lockfence');
$node->safe_psql('postgres', 'CREATE ROLE app LOGIN');

# All counters, as name => value, read by a new session.
sub counters
{
	my %c;
	foreach my $line (split /\n/,
		$node->safe_psql('postgres', 'SELECT name, value FROM lockfence.metrics'))
	{
		my ($name, $value) = split /\|/, $line;
		$c{$name} = $value;
	}
	return \%c;
}

# Check that the counters moved from $before by exactly %$delta.
sub moved
{
	my ($before, $delta, $what) = @_;
	my $after = counters();
	my %want = map { $_ => $before->{$_} + ($delta->{$_} // 0) } keys %$before;
	is_deeply($after, \%want, $what);
	return $after;
}

# Run SQL in a session of its own; return (stdout, stderr) with verbose
# errors, so that stderr shows SQLSTATEs.
sub run_sql
{
	my ($sql, @params) = @_;
	my ($out, $err);
	$node->psql('postgres', "\\set VERBOSITY verbose\n" . $sql,
		stdout => \$out, stderr => \$err, extra_params => \@params);
	return ($out, $err);
}

# The lines of the server log about rejections.
sub rejection_lines
{
	my ($pattern) = @_;
	return grep { /lockfence rejected a write: $pattern/ }
	  split /\n/, slurp_file($node->logfile);
}

my $c = counters();
is_deeply(
	[ sort keys %$c ],
	[
		sort qw(fence_accepted_total fence_rejected_stale_total
		  fence_rejected_holder_conflict_total
		  write_rejected_missing_token_total proceeded_without_lock_total
		  lock_acquire_total lock_acquire_error_total
		  rejection_resources_evicted_total fence_rejected_total
		  rejection_resources_tracked fence_rejected_lease_lost_total
		  lease_acquire_total lease_acquire_error_total
		  lease_expired_taken_over_total floor_required)
	],
	'lockfence.metrics lists every counter');
is(scalar(grep { $_ != 0 } values %$c), 0, 'all counters start at zero');

# --- accepted, stale, holder conflict ------------------------------------

$node->safe_psql('postgres', "SELECT lockfence.fence('r1', 10)");
$c = moved($c, { fence_accepted_total => 1 }, 'an accepted fence counts once');

my ($out, $err) = run_sql("SELECT lockfence.fence('r1', 5)");
like($err, qr/LF001/, 'a stale token raises LF001');
$c = moved(
	$c,
	{ fence_rejected_stale_total => 1, fence_rejected_total => 1,
	  rejection_resources_tracked => 1 },
	'a stale token raised by fence() counts once');

($out) = run_sql("SELECT lockfence.try_fence('r1', 4)");
is($out, 'f', 'try_fence returns false for a stale token');
$c = moved($c, { fence_rejected_stale_total => 1, fence_rejected_total => 1 },
	'a stale token refused by try_fence() counts once');

is( $node->safe_psql('postgres',
		'SELECT resource, rejections, last_rejected_token, highest_token,'
		  . ' last_rejected_at > now() - interval \'1 minute\''
		  . ' FROM lockfence.rejections'),
	'r1|2|4|10|t',
	'the rejections view has the resource, its count, the last rejected and the highest token, and when');

$node->safe_psql('postgres', "SELECT lockfence.fence('r2', 7, 'a')");
$c = moved($c, { fence_accepted_total => 1 }, 'a fence with a holder counts');
($out, $err) = run_sql("SELECT lockfence.fence('r2', 7, 'b')");
like($err, qr/LF001.*another holder/, 'an equal token of another holder raises LF001');
$c = moved(
	$c,
	{ fence_rejected_holder_conflict_total => 1, fence_rejected_total => 1,
	  rejection_resources_tracked => 1 },
	'a holder conflict counts as such, not as stale');

# A check answered from the transaction's cache is an accepted check too.
$node->safe_psql('postgres',
	"BEGIN; SELECT lockfence.fence('r1', 11); SELECT lockfence.fence('r1', 11); COMMIT");
$c = moved($c, { fence_accepted_total => 2 }, 'each accepted check counts, cached or not');

# --- the trigger ---------------------------------------------------------

$node->safe_psql('postgres', q{
CREATE TABLE t (id int, v text);
SELECT lockfence.protect('t', resource => 'tres');
CREATE TABLE tt (id int, res text, tok bigint);
SELECT lockfence.protect('tt', resource_column => 'res', token_column => 'tok');
GRANT ALL ON t, tt TO app;
});
$c = counters();

($out, $err) = run_sql("INSERT INTO t VALUES (1, 'x')");
like($err, qr/LF002/, 'a write without a token raises LF002');
$c = moved($c, { write_rejected_missing_token_total => 1 },
	'a write without a token counts once');

($out, $err) = run_sql("TRUNCATE t");
like($err, qr/LF002/, 'a TRUNCATE without a token raises LF002');
$c = moved($c, { write_rejected_missing_token_total => 1 },
	'a TRUNCATE without a token counts once');

# Any role may put the trigger on a temporary table of its own: refusals
# there count only if the table's owner may execute fence() (app may not),
# or any role could move the counter and the top list for any name.
($out, $err) = run_sql(q{
CREATE TEMP TABLE mine (r text, v int);
SELECT lockfence.protect('mine', resource_column => 'r');
INSERT INTO mine VALUES ('payments', 1);
}, '-U', 'app');
like($err, qr/LF002/, "a role's own temporary table: a write without a token raises LF002")
  or diag $err;
$c = moved($c, {}, 'and is not counted, nor is its resource listed');

$node->safe_psql('postgres',
	"BEGIN; SELECT lockfence.fence('tres', 3); INSERT INTO t VALUES (1, 'x'), (2, 'y'); COMMIT");
$c = moved($c, { fence_accepted_total => 1 },
	'a fenced write counts its fence, and its rows add nothing');

$node->safe_psql('postgres', "INSERT INTO tt VALUES (1, 'row-res', 20)");
$c = moved($c, { fence_accepted_total => 1 }, 'a row carrying its token counts as a check');
($out, $err) = run_sql("INSERT INTO tt VALUES (2, 'row-res', 19)");
like($err, qr/LF001/, 'a row with a stale token raises LF001');
$c = moved(
	$c,
	{ fence_rejected_stale_total => 1, fence_rejected_total => 1,
	  rejection_resources_tracked => 1 },
	'a row with a stale token counts as a stale rejection');
is($c->{proceeded_without_lock_total}, 0, 'no write proceeded without a lock');

# --- two sessions count into the same counters, a third reads ------------

$node->safe_psql('postgres', "SELECT lockfence.fence('shared', 100)");
$c = counters();
my $loop = q{SELECT count(*) FILTER (WHERE NOT lockfence.try_fence('shared', g % 100))
                  || '/' || count(*) FILTER (WHERE lockfence.try_fence('shared', 100))
             FROM generate_series(1, 400) AS g};
# The two sessions wait on an advisory lock held here, so that they start
# together once it is released.
my $gate = $node->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(4242)');
my @runs;
foreach my $i (1 .. 2)
{
	my $o = '';
	my $h = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $node->connstr('postgres'),
		  '-c', 'SET lockfence.log_rejections = off',
		  '-c', 'SELECT pg_advisory_lock_shared(4242)', '-c', $loop ],
		'>', \$o, '2>', \my $e);
	push @runs, [ $h, \$o ];
}
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 2 FROM pg_locks
           WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted}),
	'both sessions wait at the gate');
$gate->query_safe('SELECT pg_advisory_unlock(4242)');
$gate->quit;
foreach my $r (@runs)
{
	$r->[0]->finish;
	is(${ $r->[1] }, "\n400/400\n",
		'a concurrent session saw its own 400 rejections and 400 acceptances');
}
$c = moved(
	$c,
	{ fence_accepted_total => 800, fence_rejected_stale_total => 800,
	  fence_rejected_total => 800, rejection_resources_tracked => 1 },
	'two concurrent sessions add up in the counters, read by a third');
is($node->safe_psql('postgres',
		"SELECT rejections, highest_token FROM lockfence.rejections WHERE resource = 'shared'"),
	'800|100', 'and in the per-resource count');

# --- reset, and who may reset --------------------------------------------

($out, $err) = run_sql('SELECT lockfence.reset_metrics()', '-U', 'app');
like($err, qr/42501.*permission denied for function reset_metrics/,
	'PUBLIC may not reset the metrics');
is(counters()->{fence_rejected_total}, $c->{fence_rejected_total},
	'a refused reset changes nothing');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM lockfence.metrics', extra_params => [ '-U', 'app' ]),
	'15', 'PUBLIC may read the metrics');

$node->safe_psql('postgres', 'SELECT lockfence.reset_metrics()');
$c = counters();
is(scalar(grep { $_ != 0 } values %$c), 0, 'reset_metrics() zeroes every counter');
is($node->safe_psql('postgres', 'SELECT count(*) FROM lockfence.rejections'),
	'0', 'reset_metrics() empties the per-resource list');

# --- the bounded top list and its eviction -------------------------------

$node->safe_psql('postgres', q{
SET lockfence.log_rejections = off;
SELECT count(lockfence.fence('e' || i, 10)) FROM generate_series(0, 63) AS i;
SELECT count(*) FROM generate_series(0, 63) AS i,
       generate_series(1, CASE WHEN i = 7 THEN 1 ELSE 2 END) AS j
 WHERE NOT lockfence.try_fence('e' || i, j);
});
$c = moved(
	$c,
	{ fence_accepted_total => 64, fence_rejected_stale_total => 127,
	  fence_rejected_total => 127, rejection_resources_tracked => 64 },
	'64 resources fill the list');

$node->safe_psql('postgres', q{
SET lockfence.log_rejections = off;
SELECT lockfence.fence('enew', 10), lockfence.try_fence('enew', 1);
});
$c = moved(
	$c,
	{ fence_accepted_total => 1, fence_rejected_stale_total => 1,
	  fence_rejected_total => 1, rejection_resources_evicted_total => 1 },
	'a 65th resource evicts one and the list stays at 64');
is($node->safe_psql('postgres',
		q{SELECT string_agg(resource || ':' || rejections, ',' ORDER BY resource)
            FROM lockfence.rejections WHERE rejections = 1 OR resource IN ('e7', 'enew')}),
	'enew:1', 'the resource with the fewest rejections (e7) was evicted');

$node->safe_psql('postgres', q{
SET lockfence.log_rejections = off;
SELECT lockfence.fence('enew2', 10), lockfence.try_fence('enew2', 1);
SELECT lockfence.try_fence('e0', 2);
});
is($node->safe_psql('postgres',
		q{SELECT count(*), count(*) FILTER (WHERE resource = 'enew'),
                 count(*) FILTER (WHERE resource = 'enew2'),
                 max(rejections) FILTER (WHERE resource = 'e0')
            FROM lockfence.rejections}),
	'64|0|1|3', 'the next newcomer evicts the only resource with one rejection, the others keep counting');

# --- the rejection log ----------------------------------------------------

# One session: its pid, then one rejection of each kind.
$node->safe_psql('postgres', "SELECT lockfence.fence('logres', 9, 'h1')");
($out, $err) = run_sql(q{
SET application_name = 'lf_app';
SELECT pg_backend_pid();
SELECT lockfence.try_fence('logres', 3);
SELECT lockfence.try_fence('logres', 9, 'h2');
INSERT INTO t VALUES (3, 'z');
});
my ($pid) = $out =~ /^(\d+)$/m;
ok($pid, 'the logging session has a pid');
my @stale = rejection_lines(
	qq{reason=stale_token resource="logres" token=3 highest=9 application_name="lf_app" pid=$pid\$});
is(scalar @stale, 1, 'a stale token is logged once, with resource, tokens, application_name and pid');
my @conflict = rejection_lines(
	qq{reason=holder_conflict resource="logres" token=9 highest=9 holder="h2" highest_holder="h1" application_name="lf_app" pid=$pid\$});
is(scalar @conflict, 1, 'a holder conflict is logged once, with both holders');
my @missing = rejection_lines(
	qq{reason=missing_token resource="tres" token=none highest=3 table="t" application_name="lf_app" pid=$pid\$});
is(scalar @missing, 1, 'a write without a token is logged once, with the highest token and the table');
is(scalar(rejection_lines(qq{.* pid=$pid\$})), 3, 'nothing else was logged for that session');

# fence() logs once as well, before its error.
($out, $err) = run_sql(q{SET application_name = 'lf_app2';
SELECT pg_backend_pid();
SELECT lockfence.fence('logres', 2);});
($pid) = $out =~ /^(\d+)$/m;
is(scalar(rejection_lines(qq{reason=stale_token resource="logres" token=2 highest=9 application_name="lf_app2" pid=$pid\$})),
	1, 'a rejection raised by fence() is logged once');

# (1.14) Read in parallel mode (a caller's function wrongly marked
# PARALLEL RESTRICTED, in a parallel plan): refused, naming what was
# called (floor_required reads lockfence.floor_state, which needs the
# latest snapshot).
($out, $err) = run_sql(q{CREATE TABLE par_items AS SELECT g AS id FROM generate_series(1, 1000) g;
ANALYZE par_items;
CREATE FUNCTION metrics_restricted(id int) RETURNS bigint
LANGUAGE plpgsql PARALLEL RESTRICTED
AS $$ BEGIN RETURN (SELECT count(*) FROM lockfence.metrics); END $$;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
EXPLAIN (COSTS OFF) SELECT metrics_restricted(id) FROM par_items WHERE id = 1;
SELECT metrics_restricted(id) FROM par_items WHERE id = 1;});
like($out, qr/Gather/, 'a parallel plan');
like($err,
	qr/ERROR:  25000: cannot execute lockfence\.read_metrics\(\) during a parallel operation/,
	'metrics read in parallel mode: 25000, naming lockfence.read_metrics()');
($out, $err) = run_sql(q{SELECT metrics_restricted(id) > 0 FROM par_items WHERE id = 1;
DROP FUNCTION metrics_restricted(int);
DROP TABLE par_items;});
is($out, 't', '... and read outside it');

# The level applies, and off means off.  At log (the default), the
# server log only: not the client, even one that asks for LOG messages.
($out, $err) = run_sql(q{SET application_name = 'lf_cml';
SET client_min_messages = log;
SELECT lockfence.try_fence('logres', 3);
SELECT lockfence.fence('logres', 3);});
like($err, qr/LF001: stale fencing token/, 'at log, the client gets its error');
unlike($err, qr/lockfence rejected a write/,
	'... and no rejection line, though client_min_messages = log');
is(scalar(rejection_lines(qq{reason=stale_token resource="logres" token=3 highest=9 application_name="lf_cml" })),
	2, '... which the server log has');
($out, $err) = run_sql(q{SET lockfence.log_rejections = warning;
SELECT lockfence.try_fence('logres', 4);});
like($err, qr/WARNING:  LF001: lockfence rejected a write: reason=stale_token resource="logres" token=4/,
	'lockfence.log_rejections = warning sends the line to the client as well');

$c = counters();
($out, $err) = run_sql(q{SET application_name = 'lf_off';
SET lockfence.log_rejections = off;
SELECT pg_backend_pid();
SELECT lockfence.try_fence('logres', 5);
INSERT INTO t VALUES (4, 'w');});
($pid) = $out =~ /^(\d+)$/m;
ok($pid, 'the silent session has a pid');
is(scalar(rejection_lines(qq{.* pid=$pid\$})), 0, 'nothing is logged with lockfence.log_rejections = off');
moved(
	$c,
	{ fence_rejected_stale_total => 1, fence_rejected_total => 1,
	  write_rejected_missing_token_total => 1 },
	'but the rejections are still counted');

($out, $err) = run_sql('SET lockfence.log_rejections = off', '-U', 'app');
like($err, qr/42501.*permission denied to set parameter "lockfence.log_rejections"/,
	'only superusers set lockfence.log_rejections');

is(counters()->{proceeded_without_lock_total}, 0,
	'proceeded_without_lock_total stayed 0 through every test');

# --- a backend crash reinitializes shared memory, and the metrics --------

ok(counters()->{fence_rejected_total} > 0, 'before the crash, rejections are counted');
my $victim = $node->background_psql('postgres', on_error_stop => 0);
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
my $log_offset = -s $node->logfile;
kill 'KILL', $victim_pid;
eval { $victim->quit; };
$node->wait_for_log(
	qr/(?:server process|client backend) \(PID $victim_pid\) was terminated by signal 9.*all server processes terminated; reinitializing.*database system is ready to accept connections/s,
	$log_offset);
pass('the backend crashed and the server restarted');
$c = counters();
is(scalar(grep { $_ != 0 } values %$c), 0, 'after the crash restart, every counter is zero');
is($node->safe_psql('postgres', "SELECT lockfence.try_fence('r1', 1)"), 'f',
	'the fence table survived the crash');
moved($c, { fence_rejected_stale_total => 1, fence_rejected_total => 1,
	  rejection_resources_tracked => 1 }, 'and counting goes on');

$node->stop;

# --- without shared_preload_libraries -----------------------------------

my $plain = PostgreSQL::Test::Cluster->new('plain');
init_node($plain);
$plain->start;
$plain->safe_psql('postgres', 'CREATE EXTENSION lockfence');
is($plain->safe_psql('postgres', "SELECT lockfence.fence('p', 5)"), '5',
	'without preloading, fence() works');
my ($pout, $perr);
$plain->psql('postgres', "SELECT lockfence.fence('p', 4)", stderr => \$perr);
like($perr, qr/stale fencing token/, 'without preloading, a stale token is still rejected');
like(slurp_file($plain->logfile),
	qr/lockfence rejected a write: reason=stale_token resource="p" token=4 highest=5/,
	'without preloading, rejections are still logged');
# (1.15) A token below the failover floor: highest is the floor, for a
# name never fenced too (docs/monitoring.md).
$plain->safe_psql('postgres', 'SELECT lockfence.raise_floor(10)');
is($plain->safe_psql('postgres', "SELECT lockfence.try_fence('never-fenced', 9)"), 'f',
	'a token below the floor is refused for a name never fenced');
like(slurp_file($plain->logfile),
	qr/lockfence rejected a write: reason=stale_token resource="never-fenced" token=9 highest=10 /,
	'... and logged with the floor as highest');
foreach my $sql ('SELECT * FROM lockfence.metrics',
	'SELECT * FROM lockfence.rejections',
	'SELECT * FROM lockfence.histograms',
	'SELECT lockfence.reset_metrics()')
{
	$plain->psql('postgres', "\\set VERBOSITY verbose\n$sql", stderr => \$perr);
	like($perr,
		qr/ERROR:  55000: lockfence metrics are not available.*HINT:  Add lockfence to shared_preload_libraries and restart the server\./s,
		"without preloading, \"$sql\" raises 55000 with a hint");
}
$plain->safe_psql('postgres', q{
CREATE FUNCTION lockfence_test_event(text, float8) RETURNS void
    AS '$libdir/lockfence', 'lockfence_metrics_test_event' LANGUAGE C STRICT;
});
is($plain->psql('postgres',
		"SELECT lockfence_test_event('acquired', 0.1), lockfence_test_event('acquire_failed', 0),"
		  . " lockfence_test_event('released', 1)"),
	0, 'without preloading, the functions the etcd client calls do nothing and do not fail');
$plain->stop;

done_testing();
