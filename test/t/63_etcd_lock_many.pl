
# 63_etcd_lock_many.pl
#	  Several etcd locks at once (issue 9, item 5), against a real etcd:
#	  - etcd_lock_many takes the distinct names in byte order on the
#	    session lease, one row per name, token = create_revision;
#	  - all or nothing: when one name is held elsewhere, a short
#	    wait_timeout (55P03), a cancel while waiting (57014), or a rejected
#	    fence in etcd_lock_and_fence(text[], text[]) (LF001) leaves none of
#	    the call's keys in etcd when the error arrives, and no fence;
#	  - wait_timeout bounds the whole call, not each lock;
#	  - a call that waits for a name the session holds itself fails with
#	    LF003 when the session lease expires meanwhile (that wait renews
#	    only the lease of its own), never returning a lock already lost,
#	    and with another TTL than the held lock's fails with LF003 naming
#	    the held lock, which expired while it waited;
#	  - two sessions asking for overlapping sets in opposite orders do not
#	    deadlock;
#	  - etcd_lock_and_fence(text[], text[]) fences each resource with its
#	    own lock's token, is transaction-scoped by default, and the
#	    commit-time check covers every one of its locks;
#	  - six sessions with random overlapping sets run many rounds of
#	    etcd_lock_and_fence(text[]) plus writes to protected tables: every
#	    round completes, each resource's tokens only grow, and no two
#	    holders of a resource overlap in time.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use List::Util qw(max);
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $t_start = time;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'many');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('etcd_many', <<EOF);
lockfence.etcd_endpoints = '@{[ $etcd->endpoints ]}'
lockfence.etcd_request_timeout = '5s'
max_connections = 40
EOF

sub session { return LockfenceTest::EtcdCluster::session($node); }
sub sql_try { return LockfenceTest::EtcdCluster::sql_try(@_); }
sub send_query { return LockfenceTest::EtcdCluster::send_query(@_); }
sub wait_result { return LockfenceTest::EtcdCluster::wait_result(@_); }
sub poll_until { return LockfenceTest::EtcdCluster::poll_until(@_); }

# Rows of a lock function as hashes, in the order returned.
sub rows
{
	my ($s, $sql, @cols) = @_;
	my $out = $s->query_safe(
		'SELECT ' . join(q{ || '|' || }, @cols) . " FROM $sql");
	my @rows;
	for my $line (grep { $_ ne '' } split /\n/, $out)
	{
		my %r;
		@r{@cols} = split /\|/, $line;
		push @rows, \%r;
	}
	return @rows;
}

# One lock of a session, taken with etcd_lock; returns its key.
sub lock_one
{
	my ($s, $name) = @_;
	my $key = $s->query_safe("SELECT key FROM lockfence.etcd_lock('$name', 20)");
	chomp $key;
	return $key;
}

my $s = session();
my $h = session();		# another holder
my $admin = session();

# --- etcd_lock_many: byte order, duplicates once, one row per name ----------

my @r = rows($s, "lockfence.etcd_lock_many(ARRAY['m/b', 'm/a', 'm/b', 'm/B'], 20)",
	qw(name key lease token));
is_deeply([ map { $_->{name} } @r ], [ 'm/B', 'm/a', 'm/b' ],
	'one row per distinct name, in byte order');
is(scalar(grep { $_->{key} eq sprintf('%s/%x', $_->{name}, $_->{lease}) } @r), 3,
	'each key is NAME/LEASEHEX');
is(scalar(keys %{ { map { $_->{lease} => 1 } @r } }), 1,
	'all on the session lease');
is(scalar(grep { defined $etcd->key_info($_->{key}) } @r), 3,
	'every key is in etcd');
is(scalar(grep { $etcd->key_info($_->{key})->{create_revision} == $_->{token} } @r), 3,
	'each token is its key\'s create_revision');
ok($r[0]{token} < $r[1]{token} && $r[1]{token} < $r[2]{token},
	'taken in byte order (tokens increase along the rows)');
$s->query_safe("SELECT lockfence.etcd_unlock('$_->{key}')") for @r;
is_deeply([ $etcd->keys('m/') ], [], 'released with etcd_unlock');

# scope => 'transaction'
$s->query_safe('BEGIN');
@r = rows($s, "lockfence.etcd_lock_many(ARRAY['mx/a', 'mx/b'], 20, scope => 'transaction')",
	qw(name key));
is(scalar($etcd->keys('mx/')), 2, 'transaction scope: held inside the transaction');
$s->query_safe('COMMIT');
ok(poll_until(5, sub { scalar($etcd->keys('mx/')) == 0 }),
	'transaction scope: released at commit');

# --- all or nothing: a name held elsewhere, short wait_timeout ---------------

# The call releases its locks itself, before the error is reported: the
# transaction abort that follows (which would release locks still pending,
# and says so at DEBUG1) finds none left.
# The release after a wait_timeout has ETCD_PENDING_RELEASE_MS (50 ms) by
# design and gives up what does not fit (gone at session end or with the
# TTL): released_promptly demands the keys gone at once unless the backend
# and etcd waited that long for a CPU during the call, else once the session
# ended (the CPU wait is counted from before the call, whose deadline falls
# inside it).
my $hk = lock_one($h, 'aon/b');
$s->query_safe('SET client_min_messages = debug1');
my $wait0 = $etcd->cpu_wait($s->{pid});
my $res = sql_try($s,
	"SELECT * FROM lockfence.etcd_lock_many(ARRAY['aon/c', 'aon/b', 'aon/a'], 20, '1 s')");
is($res->{sqlstate}, '55P03', 'wait_timeout: 55P03') or diag explain $res;
$s = $etcd->released_promptly(
	node => $node,
	session => $s,
	since => $wait0,
	gone => sub { return join(',', $etcd->keys('aon/')) eq $hk },
	label => 'wait_timeout: none of the call\'s keys is left when the error arrives',
	show => sub { return [ $etcd->keys('aon/') ] });
$s->query('RESET client_min_messages');
$s->{stderr} = '';
like($res->{message}, qr/"aon\/b"/, 'the error names the lock it could not get');
like($res->{stderr}, qr/acquiring etcd lock 2 of 3, in byte order/,
	'and says where in the call');
unlike($res->{stderr}, qr/is released at the end of its transaction/,
	'wait_timeout: released by the call itself, not by the abort');

# the same, caught in a PL/pgSQL exception block
$wait0 = $etcd->cpu_wait($s->{pid});
$res = sql_try($s, q{
DO $$
BEGIN
    BEGIN
        PERFORM lockfence.etcd_lock_many(ARRAY['aon/b', 'aon/a'], 20, '500 ms');
    EXCEPTION WHEN lock_not_available THEN
        RAISE NOTICE 'caught %', SQLSTATE;
    END;
END
$$});
like($res->{stderr}, qr/caught 55P03/, 'caught in an exception block');
$s = $etcd->released_promptly(
	node => $node,
	session => $s,
	since => $wait0,
	gone => sub { return join(',', $etcd->keys('aon/')) eq $hk },
	label => 'caught in an exception block: nothing of the call is left',
	show => sub { return [ $etcd->keys('aon/') ] });

# --- cancel while waiting ---------------------------------------------------

my $ck = lock_one($h, 'cx/b');
send_query($s, "SELECT * FROM lockfence.etcd_lock_many(ARRAY['cx/c', 'cx/a', 'cx/b'], 20);");
ok(poll_until(30, sub { scalar($etcd->keys('cx/b/')) == 2 }),
	'cancel: the call holds cx/a and waits for cx/b');
is(scalar($etcd->keys('cx/a/')), 1, 'cancel: cx/a is held meanwhile');
$wait0 = $etcd->cpu_wait($s->{pid});
$admin->query_safe("SELECT pg_cancel_backend($s->{pid})");
my ($out, $err) = wait_result($s, 30);
like($err, qr/ERROR:\s+57014/, 'cancel: 57014');
$s = $etcd->released_promptly(
	node => $node,
	session => $s,
	since => $wait0,
	gone => sub { return join(',', $etcd->keys('cx/')) eq $ck },
	label => 'cancel: none of the call\'s keys is left when the error arrives',
	show => sub { return [ $etcd->keys('cx/') ] });

# --- wait_timeout bounds the whole call ----------------------------------------

my $h2 = session();
my $wa = lock_one($h, 'wt/a');
my $wb = lock_one($h2, 'wt/b');
# wait_timeout 4 s; wt/a is unlocked 2.5 s after the call queued for it,
# which leaves 1.5 s for the call to start and queue before its deadline.
# A wait_timeout per lock fails after at least 2.5 s + 4 s = 6.5 s; the
# whole call's after about 4 s: the bound, 6 s, leaves 2 s for psql and a
# loaded machine (it was 4.3 s with an unlock after 1.5 s and 3 s, which
# left 1.3 s, measured on the client).
my $t0 = time;
send_query($s, "SELECT * FROM lockfence.etcd_lock_many(ARRAY['wt/a', 'wt/b'], 20, '4 s');");
ok(poll_until(30, sub { scalar($etcd->keys('wt/a/')) == 2 }), 'whole call: queued for wt/a');
usleep(2_500_000);
$h->query_safe("SELECT lockfence.etcd_unlock('$wa')");
$wait0 = $etcd->cpu_wait($s->{pid});
($out, $err) = wait_result($s, 30);
my $took = time - $t0;
like($err, qr/ERROR:\s+55P03/, 'whole call: 55P03');
ok($took < 6.0,
	sprintf('whole call: fails after about 4 s in all, not 2.5 s + 4 s (%.2f s)', $took));
# the CPU wait counted from the unlock that let the call go on
$s = $etcd->released_promptly(
	node => $node,
	session => $s,
	since => $wait0,
	gone => sub { return join(',', $etcd->keys('wt/')) eq $wb },
	label => 'whole call: nothing of the call left',
	show => sub { return [ $etcd->keys('wt/') ] });
$h2->query_safe("SELECT lockfence.etcd_unlock('$wb')");

# --- a name the session holds itself: its session lease is checked after ----
# The session holds sx/x (TTL 3).  etcd_lock_many(['sx/a', 'sx/x']) takes
# sx/a on the session lease, then contends for sx/x with the session's own
# lock, under a lease of its own, which is all that wait renews.  The
# session lease expires, sx/x's old key goes with it and the wait wins:
# the session lease is then found gone, so the call fails with LF003
# naming both lost locks instead of returning sx/a already expired.
my $o = session();
my $ox = $o->query_safe("SELECT key FROM lockfence.etcd_lock('sx/x', 3)");
chomp $ox;
$res = sql_try($o,
	"SELECT * FROM lockfence.etcd_lock_many(ARRAY['sx/a', 'sx/x'], 3, '20 s')");
is($res->{sqlstate}, 'LF003',
	'own name: LF003 once the session lease, not renewed by that wait, expired')
  or diag explain $res;
like($res->{message} // '', qr{sx/a/}, '... naming the lock the call took first');
like($res->{message} // '', qr{\Q$ox\E}, '... and the lock the session held');
ok(poll_until(10, sub { !scalar($etcd->keys('sx/')) }),
	'own name: nothing of the call is left in etcd');
$o->quit;

# --- the same with another TTL: the older lock is checked after the wait -------
# The session holds sy (TTL 3).  etcd_lock('sy', 20) waits with the session
# lease of TTL 20, which renews nothing of TTL 3: the older lock expires,
# the wait wins, and the call fails with LF003 naming the older lock
# instead of returning the new one while the session lists both.
my $q = session();
my $qy = $q->query_safe("SELECT key FROM lockfence.etcd_lock('sy', 3)");
chomp $qy;
$res = sql_try($q, "SELECT key FROM lockfence.etcd_lock('sy', 20, '20 s')");
is($res->{sqlstate}, 'LF003',
	'own name, another TTL: LF003 once the older lock, not renewed by that wait, expired')
  or diag explain $res;
like($res->{message} // '', qr{\Q$qy\E}, '... naming the older lock');
ok(poll_until(10, sub { !scalar($etcd->keys('sy/')) }),
	'own name, another TTL: nothing of the call is left in etcd');
$q->quit;

# --- overlapping sets in opposite orders do not deadlock ------------------------

# X holds dl/a.  A asks for [dl/a, dl/b] and queues for dl/a.  B asks for
# [dl/b, dl/a]: in byte order it queues for dl/a too, behind A, holding
# nothing.  (Taken in array order, B would hold dl/b and wait for dl/a,
# and once X releases dl/a, A would wait for dl/b: a deadlock.)
my $xk = lock_one($h, 'dl/a');
my $sa = session();
my $sb = session();
send_query($sa, "SELECT count(*) FROM lockfence.etcd_lock_many(ARRAY['dl/a', 'dl/b'], 20, '15 s', 'transaction');");
ok(poll_until(30, sub { scalar($etcd->keys('dl/a/')) == 2 }), 'deadlock: A queued for dl/a');
send_query($sb, "SELECT count(*) FROM lockfence.etcd_lock_many(ARRAY['dl/b', 'dl/a'], 20, '15 s', 'transaction');");
ok(poll_until(30, sub { scalar($etcd->keys('dl/a/')) == 3 }), 'deadlock: B queued for dl/a');
$h->query_safe("SELECT lockfence.etcd_unlock('$xk')");
my ($oa, $ea) = wait_result($sa, 40);
my ($ob, $eb) = wait_result($sb, 40);
is($oa, '2', 'deadlock: A got both locks') or diag $ea;
is($ob, '2', 'deadlock: B got both locks') or diag $eb;
ok(poll_until(5, sub { scalar($etcd->keys('dl/')) == 0 }),
	'deadlock: both released (transaction scope)');

# --- etcd_lock_and_fence(text[], text[]) ----------------------------------------

# each resource with its own lock's token; a name paired twice locks once
$s->query_safe('BEGIN');
@r = rows($s,
	"lockfence.etcd_lock_and_fence(ARRAY['p/y', 'p/x', 'p/x'], ARRAY['res-p3', 'res-p1', 'res-p2'])",
	qw(resource name key lease token));
is_deeply([ map { "$_->{resource}:$_->{name}" } @r ],
	[ 'res-p1:p/x', 'res-p2:p/x', 'res-p3:p/y' ],
	'lock_and_fence: one row per resource, in byte order, with its lock');
is($r[0]{key}, $r[1]{key}, 'a name paired with two resources is locked once');
is(scalar($etcd->keys('p/')), 2, 'two locks held');
is($s->query_safe(
		"SELECT string_agg(resource || '=' || token || '/' || holder, ',' ORDER BY resource) FROM lockfence.fences WHERE resource LIKE 'res-p%'"),
	join(',', map { "$_->{resource}=$_->{token}/$_->{key}" } @r),
	'each resource fenced with its lock\'s token, holder the lock key');
$s->query_safe('COMMIT');
ok(poll_until(5, sub { scalar($etcd->keys('p/')) == 0 }),
	'lock_and_fence: transaction-scoped by default, released at commit');

# a rejected fence: LF001 naming the resource, no lock and no fence left
$admin->query_safe("SELECT lockfence.fence('res-st-b', 9000000000000000000)");
$s->query_safe('SET client_min_messages = debug1');
$res = sql_try($s,
	"SELECT * FROM lockfence.etcd_lock_and_fence(ARRAY['st/b', 'st/a'], ARRAY['res-st-b', 'res-st-a'], scope => 'session')");
$s->query('RESET client_min_messages');
$s->{stderr} = '';
is($res->{sqlstate}, 'LF001', 'a stale resource: LF001') or diag explain $res;
like($res->{message}, qr/"res-st-b"/, 'naming it');
is_deeply([ $etcd->keys('st/') ], [],
	'a rejected fence: none of the call\'s keys is left when the error arrives');
unlike($res->{stderr}, qr/is released at the end of its transaction/,
	'a rejected fence: released by the call itself, not by the abort');
is($admin->query_safe("SELECT count(*) FROM lockfence.fences WHERE resource = 'res-st-a'"),
	'0', 'a rejected fence: the other resource is not fenced');

# the commit-time check covers every lock of the call
for my $lost ('cc/a', 'cc/b')
{
	$s->query_safe('BEGIN');
	@r = rows($s,
		"lockfence.etcd_lock_and_fence(ARRAY['cc/a', 'cc/b'], ARRAY['res-cc-a', 'res-cc-b'])",
		qw(name key));
	my ($gone) = grep { $_->{name} eq $lost } @r;
	$etcd->etcdctl('del', $gone->{key});
	$res = sql_try($s, 'COMMIT');
	is($res->{sqlstate}, 'LF003', "commit check: $lost lost, the commit fails with LF003")
	  or diag explain $res;
	like($res->{message}, qr/\Q$gone->{key}\E/, "commit check: naming $lost\'s key");
	is($admin->query_safe(
			"SELECT count(*) FROM lockfence.fences WHERE resource LIKE 'res-cc-%'"),
		'0', "commit check ($lost lost): nothing of the transaction written");
	ok(poll_until(5, sub { scalar($etcd->keys('cc/')) == 0 }),
		"commit check ($lost lost): the other lock is released");
}

# --- many sessions, random overlapping sets ------------------------------------

my $n_res = 5;
my $n_sessions = 6;
my $rounds = 20;
my $seed = $ENV{LOCKFENCE_TEST_SEED} // int(rand(1_000_000));
note("random seed $seed (set LOCKFENCE_TEST_SEED to repeat)");
srand($seed);

for my $i (0 .. $n_res - 1)
{
	$node->safe_psql('postgres', qq{
		CREATE TABLE ledger_$i (token bigint, who int, round int,
		                        t_start timestamptz, t_end timestamptz);
		SELECT lockfence.protect('ledger_$i', resource => 'sr$i');
	});
}

# One session's script: each round locks a random set (random order, a
# duplicate now and then), writes one row per resource at the start and
# updates it at the end of its hold.
sub script
{
	my ($who) = @_;
	my $sql = "\\set QUIET on\n";
	my $expect = 0;
	for my $round (1 .. $rounds)
	{
		my @set = grep { rand() < 0.45 } 0 .. $n_res - 1;
		@set = (int(rand($n_res))) unless @set;
		$expect += @set;
		my @pairs = map { [ "sl/$_", "sr$_" ] } @set;
		push @pairs, $pairs[0] if rand() < 0.2;
		@pairs = map { $_->[1] } sort { $a->[0] <=> $b->[0] } map { [ rand(), $_ ] } @pairs;
		my $names = join(', ', map { "'$_->[0]'" } @pairs);
		my $ress = join(', ', map { "'$_->[1]'" } @pairs);
		$sql .= "BEGIN;\n";
		$sql .= "SELECT count(*) FROM lockfence.etcd_lock_and_fence(ARRAY[$names], ARRAY[$ress], 10, '20 s') \\g /dev/null\n";
		$sql .= "INSERT INTO ledger_$_ VALUES (lockfence.fenced_token('sr$_'), $who, $round, clock_timestamp(), NULL);\n"
		  for @set;
		$sql .= "SELECT pg_sleep(0.02) \\g /dev/null\n";
		$sql .= "UPDATE ledger_$_ SET t_end = clock_timestamp() WHERE who = $who AND round = $round;\n"
		  for @set;
		$sql .= "COMMIT;\n";
	}
	$sql .= "SELECT 'done';\n";
	return ($sql, $expect);
}

my (@workers, @scripts);
my $expected_total = 0;
for my $w (1 .. $n_sessions)
{
	my ($sql, $n) = script($w);
	push @scripts, $sql;
	push @workers, session();
	$expected_total += $n;
}
my $t_many = time;
send_query($workers[$_ - 1], $scripts[$_ - 1]) for 1 .. $n_sessions;
# All rounds of all sessions within 90 s (about 5 s here); sessions still
# running then (a deadlock would keep them waiting) are terminated.
my $deadline = time + 90;
my $all_ok = 1;
my @unfinished;
for my $w (1 .. $n_sessions)
{
	my ($o, $e) = wait_result($workers[$w - 1], 1 + max(0, $deadline - time));
	if ($e =~ /ERROR|FATAL/ || $o !~ /done/)
	{
		$all_ok = 0;
		diag("session $w: " . substr($e || 'did not finish in time', 0, 600));
	}
	push @unfinished, $w if $o !~ /done/;
}
my $many_took = time - $t_many;
ok($all_ok, sprintf('%d sessions x %d rounds completed without error (%.1f s)',
	$n_sessions, $rounds, $many_took));
for my $w (@unfinished)
{
	$admin->query_safe("SELECT pg_terminate_backend($workers[$w - 1]{pid})");
	$workers[$w - 1]{run}->kill_kill;
}

my $rows_total = 0;
my $tokens_grow = 1;
my $no_overlap = 1;
for my $i (0 .. $n_res - 1)
{
	my @ledger = map { [ split /\|/ ] } grep { $_ ne '' } split /\n/,
	  $node->safe_psql('postgres',
		"SELECT token, who, round, extract(epoch FROM t_start), extract(epoch FROM t_end) FROM ledger_$i ORDER BY t_start");
	$rows_total += @ledger;
	for my $j (1 .. $#ledger)
	{
		my ($p, $c) = ($ledger[ $j - 1 ], $ledger[$j]);
		if ($c->[0] <= $p->[0])
		{
			$tokens_grow = 0;
			diag("sr$i: token $c->[0] (session $c->[1] round $c->[2]) after token $p->[0]");
		}
		if ($c->[3] < $p->[4])
		{
			$no_overlap = 0;
			diag("sr$i: session $c->[1] round $c->[2] started before session $p->[1] round $p->[2] ended");
		}
	}
}
is($rows_total, $expected_total, 'every round wrote its rows');
ok($tokens_grow, 'each resource\'s tokens only grow, in the order of the holds');
ok($no_overlap, 'no two holders of a resource overlap');
is_deeply([ $etcd->keys('sl/') ], [], 'no lock left after the rounds');

my %gone = map { $_ => 1 } @unfinished;
$workers[ $_ - 1 ]->quit for grep { !$gone{$_} } 1 .. $n_sessions;
$_->quit for $s, $h, $h2, $admin, $sa, $sb;
$node->stop;
$etcd->stop;
note(sprintf('total %.1f s', time - $t_start));
done_testing();
