
# 35_etcd_retry.pl
#	  Retries and request counts, with test/fault_http_server.py in front
#	  of a real etcd member (it forwards every request unchanged except the
#	  one step under test):
#	  - etcd's election messages answered as HTTP 500 / gRPC code 2
#	    ("etcdserver: leader changed", "request timed out", "no leader",
#	    "too many requests") are retried, not reported as errors;
#	  - the gateway's answers during a restart, an election or an overload
#	    (408 "the client connection is closing", 503 "leader changed",
#	    "no leader", "request timed out", 429 "too many requests") and a
#	    reset connection are retried once or twice and the call succeeds;
#	    a non-transient answer (429 "database space exceeded", 400) is not;
#	  - an etcd_unlock whose request hangs on the first endpoint succeeds
#	    through the next one within a request timeout of 2 s (each endpoint
#	    gets a share of the timeout, not all of it);
#	  - etcd_unlock of a lock this session acquired sends one txn (deleting
#	    the key on its lease) and no deleterange or revoke: the session lease
#	    is kept (issue 9); another holder's key is deleted (in a txn that checks
#	    it is attached to the lease its name ends in) and its lease revoked;
#	    a key that is already gone gives false and a NOTICE.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'retry');
$etcd->start;
my $fault = $etcd->start_fault_server($etcd->client_url(0));
my $f = $fault->url;

# The proxy listed twice: the second entry is tried after the first one
# failed, and every request still goes through the proxy (so it is
# counted, and a rule with "times" applies only to the first attempt).
my $node = LockfenceTest::EtcdCluster::pg_node('retry', <<EOF);
lockfence.etcd_endpoints = '$f,$f/'
lockfence.etcd_request_timeout = '2s'
lockfence.etcd_connect_timeout = '1s'
EOF

my $s = LockfenceTest::EtcdCluster::session($node);

sub hits
{
	my ($path) = @_;
	return $fault->hits->{$path} // 0;
}

# sql_try in $s, plus how long the statement took on the server, from its
# start to the backend going idle after it (statement_duration), less what
# the backend waited for a CPU meanwhile (late_ms): $r->{server_ms} and
# $r->{cpu_ms}.  The time bounds below use it, not the client's wall clock
# (secs), which also counts psql, Perl and a loaded machine's run queue.
sub timed_try
{
	my ($sql) = @_;
	my $rd0 = LockfenceTest::EtcdCluster::run_delay($s->{pid});
	my $r = LockfenceTest::EtcdCluster::sql_try($s, $sql);
	@$r{qw(server_ms cpu_ms)} = LockfenceTest::EtcdCluster::late_ms(
		LockfenceTest::EtcdCluster::statement_duration($node, $s->{pid}),
		$s->{pid}, $rd0);
	return $r;
}

# "TEXT (N ms on the server, and N ms waiting for a CPU)"
sub took { return sprintf('%s (%.1f ms on the server, and %.1f ms waiting for a CPU)', $_[0], $_[1]{server_ms}, $_[1]{cpu_ms}); }

sub key_exists
{
	my ($key) = @_;
	return $etcd->etcdctl('get', '--keys-only', $key) =~ /\Q$key\E/ ? 1 : 0;
}

# 1. Transient election errors, as etcd sends them: HTTP 500, code 2.
my @transient = (
	[ '/v3/lease/grant', 'etcdserver: no leader' ],
	[ '/v3/kv/txn', 'etcdserver: leader changed' ],
	[ '/v3/kv/txn', 'etcdserver: request timed out' ],
	[ '/v3/lease/keepalive', 'etcdserver: too many requests' ],);
my $n = 0;
for my $t (@transient)
{
	my ($path, $msg) = @$t;
	my $name = 'tr' . ++$n;
	$fault->clear;
	$fault->set(path => $path, mode => 'status', status => 500, times => 1,
		body => { error => $msg, message => $msg, code => 2 });
	# A lock call renews its TTL-5 session lease only once a third of the
	# TTL has passed since the last renewal: let it come due.
	usleep(1_800_000) if $path eq '/v3/lease/keepalive';
	my $before = $fault->hits->{faults} // 0;
	my $r = timed_try(
		"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('$name', 5, '5s')");
	ok(($fault->hits->{faults} // 0) > $before, "$path \"$msg\": the fault was injected");
	ok($r->{ok}, "$path \"$msg\": lock and unlock succeed after a retry") or diag explain $r;
	is($r->{out}, 't', "$path \"$msg\": unlock returns true");
	ok($r->{server_ms} < 2000, took("$path \"$msg\": within the request timeout of 2 s", $r));
	like($etcd->etcdctl('get', '--prefix', '--keys-only', "$name/"), qr/^\s*$/,
		"$path \"$msg\": nothing left in etcd");
}
$fault->clear;

# 1b. The answers etcd's JSON gateway gives while a member restarts, an
# election runs or it is overloaded (fault server mode "transient", as
# etcd 3.4 sends them), and a connection reset mid-request: each is
# retried within the call's budget, once or twice in a row, and the call
# succeeds.  Issue 17 item 13: "HTTP 408, code 1: grpc: the client
# connection is closing" (a member restarting) was reported as 08000.
for my $kind (qw(closing leader_changed no_leader too_many_requests timed_out reset))
{
	for my $times (1, 2)
	{
		my $name = "tk$kind$times";
		my $path = '/v3/kv/txn';
		$fault->clear;
		$fault->set(path => $path, times => $times,
			$kind eq 'reset' ? (mode => 'reset') : (mode => 'transient', kind => $kind));
		my $before = hits($path);
		my $faults = $fault->hits->{faults} // 0;
		my $r = timed_try(
			"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('$name', 5, '5s')");
		is(($fault->hits->{faults} // 0) - $faults, $times,
			"$kind x$times: the fault was injected $times time(s)");
		ok($r->{ok}, "$kind x$times: lock and unlock succeed after retries") or diag explain $r;
		is($r->{out}, 't', "$kind x$times: unlock returns true");
		# the lock's txn: $times faulty answers, then relayed; the unlock's txn
		is(hits($path) - $before, $times + 2, "$kind x$times: sent again $times time(s)");
		ok($r->{server_ms} < 2000, took("$kind x$times: within the request timeout of 2 s", $r));
		like($etcd->etcdctl('get', '--prefix', '--keys-only', "$name/"), qr/^\s*$/,
			"$kind x$times: nothing left in etcd");
	}
}
$fault->clear;

# A non-transient answer of the same shapes is final: sent once, reported
# at once.  ("database space exceeded" comes as HTTP 429, code 8, like
# "too many requests"; a bad request as HTTP 400, code 3.)  Each lock has a
# TTL of its own, which no lock of this session used yet: its lease is
# granted for it and revoked after the failure (no txn), so the lock's
# txn, the one the rule answers, is the only txn of the call unless it is
# sent again.
for my $perm ([ 429, 8, 'mvcc: database space exceeded', '08000', 6 ],
	[ 400, 3, 'etcdserver: key is not provided', '08000', 7 ])
{
	my ($status, $code, $msg, $state, $ttl) = @$perm;
	$fault->clear;
	$fault->set(path => '/v3/kv/txn', mode => 'status', status => $status, times => 1,
		body => { error => $msg, message => $msg, code => $code });
	my $faults = $fault->hits->{faults} // 0;
	my $txns = hits('/v3/kv/txn');
	my $r = timed_try("SELECT * FROM lockfence.etcd_lock('perm$status', $ttl, '5s')");
	is(($fault->hits->{faults} // 0) - $faults, 1,
		"HTTP $status \"$msg\": the fault was injected");
	# the rule applies once: a retry would have been relayed and succeeded
	is($r->{sqlstate}, $state, "HTTP $status \"$msg\": $state, not retried")
	  or diag explain $r;
	is(hits('/v3/kv/txn') - $txns, 1, "HTTP $status \"$msg\": not retried (one txn sent)");
	# reported at once: a retry would have come after a pause, and a call
	# that retried until its request timeout would have taken 2 s
	ok($r->{server_ms} < 1000, took("HTTP $status \"$msg\": reported at once", $r));
	like($etcd->etcdctl('get', '--prefix', '--keys-only', "perm$status/"), qr/^\s*$/,
		"HTTP $status \"$msg\": nothing left in etcd");
}
$fault->clear;

# A permanent error is still reported at once, not retried.
$fault->set(path => '/v3/lease/grant', mode => 'status', status => 500,
	body => { error => 'etcdserver: injected failure', message => 'etcdserver: injected failure', code => 2 });
# (a TTL no lock of this session used yet: its lease is granted now)
my $grants = hits('/v3/lease/grant');
my $faults = $fault->hits->{faults} // 0;
my $r = timed_try("SELECT * FROM lockfence.etcd_lock('perm', 55, '5s')");
is($r->{sqlstate}, '08000', 'a permanent code 2 error is reported as 08000') or diag explain $r;
# the rule answers every grant: a retry would be a second grant, answered so
is(hits('/v3/lease/grant') - $grants, 1, 'a permanent code 2 error is not retried (one grant sent)');
is(($fault->hits->{faults} // 0) - $faults, 1, '... and answered with the fault once');
ok($r->{server_ms} < 1000, took('a permanent code 2 error is reported at once', $r));
$fault->clear;

# 2. A hung unlock request on the first endpoint: the second endpoint
# gets its turn within the 2 s request timeout.
for my $which ('own', 'foreign')
{
	my $path = '/v3/kv/txn';
	my $name = 'hang' . ++$n;
	$s->query_safe("SET lockfence.etcd_endpoints = '$f,$f/" . ('/' x $n) . "'");
	my ($key, $lease);
	if ($which eq 'own')
	{
		# our own lock: etcd_unlock deletes its key by a txn on its lease
		($key) = split / /, $s->query_safe(
			"SELECT key FROM lockfence.etcd_lock('$name', 10, '5s')");
	}
	else
	{
		# another holder's key (etcdctl's lease): deleted first, by a txn
		# that checks its lease.  etcdctl pads lease IDs to 16 digits; lock
		# keys, like Go's Mutex, have no leading zeros.
		($lease) = $etcd->etcdctl('lease', 'grant', '30') =~ /lease 0*([0-9a-f]+) granted/;
		$key = "$name/$lease";
		$etcd->etcdctl('put', "--lease=$lease", $key, '');
	}
	ok(key_exists($key), "$path hangs: the lock key exists before unlock");
	$fault->set(path => $path, mode => 'hang', seconds => 10, times => 1);
	my $before = hits($path);
	$r = timed_try("SELECT lockfence.etcd_unlock('$key')");
	is($r->{out}, 't', "$path hangs on the first endpoint: etcd_unlock succeeds") or diag explain $r;
	cmp_ok(hits($path) - $before, '>=', 2, "$path hangs: sent again to the next endpoint");
	# The first attempt uses its whole share, 1 s of the 2 s (two
	# endpoints), and the second the time it needs; an attempt given the
	# whole request timeout would have taken 2 s alone.  On the server's
	# clock, less the backend's wait for a CPU.
	ok($r->{server_ms} < 2000, took("$path hangs: within the request timeout of 2 s", $r));
	ok(!key_exists($key), "$path hangs: the lock key is gone");
	$fault->clear;
}
$s->query_safe('RESET lockfence.etcd_endpoints');

# 2b. (1.11) An unlock whose first request etcd applied but whose answer
# was lost (never sent; the attempt times out after its share of the
# request timeout, 1 s): the retry finds the key gone.  The
# NOTICE says it may have been the first attempt, not that the lease
# expired (the lease is alive), and the key is gone.  For each kind of key.
for my $which ('own', 'foreign')
{
	my $name = 'lostreply' . ++$n;
	my ($key, $lease);
	if ($which eq 'own')
	{
		($key, $lease) = split / /, $s->query_safe(
			"SELECT key || ' ' || lease FROM lockfence.etcd_lock('$name', 10, '5s')");
		$lease = sprintf('%x', $lease);
	}
	else
	{
		($lease) = $etcd->etcdctl('lease', 'grant', '30') =~ /lease 0*([0-9a-f]+) granted/;
		$key = "$name/$lease";
		$etcd->etcdctl('put', "--lease=$lease", $key, '');
	}
	$fault->set(path => '/v3/kv/txn', mode => 'applied_hang', seconds => 10, times => 1);
	my $before = hits('/v3/kv/txn');
	$s->{stderr} = '';
	is($s->query("SELECT lockfence.etcd_unlock('$key')"), 'f',
		"$which key, answer lost: etcd_unlock returns false (it cannot know)");
	cmp_ok(hits('/v3/kv/txn') - $before, '>=', 2, "$which key, answer lost: the txn was sent again");
	like($s->{stderr}, qr/NOTICE:.*does not exist.*an earlier attempt, whose answer did not arrive, may have deleted it/s,
		"$which key, answer lost: the NOTICE says the first attempt may have deleted it");
	unlike($s->{stderr}, qr/lost when its lease expired/,
		"$which key, answer lost: not that the lease expired");
	ok(!key_exists($key), "$which key, answer lost: the key is gone");
	$s->{stderr} = '';
	$fault->clear;
	$etcd->etcdctl('lease', 'revoke', $lease) if $which eq 'foreign';
}

# 3. Request counts of etcd_unlock.
my ($key, $lease) = split / /, $s->query_safe(
	"SELECT key || ' ' || lease FROM lockfence.etcd_lock('cnt', 10, '5s')");
my %before = map { $_ => hits($_) } ('/v3/kv/deleterange', '/v3/lease/revoke', '/v3/kv/txn');
is($s->query_safe("SELECT lockfence.etcd_unlock('$key')"), 't', 'own lock: etcd_unlock returns true');
is(hits('/v3/kv/deleterange') - $before{'/v3/kv/deleterange'}, 0,
	'own lock: no deleterange request');
is(hits('/v3/lease/revoke') - $before{'/v3/lease/revoke'}, 0, 'own lock: no revoke request');
is(hits('/v3/kv/txn') - $before{'/v3/kv/txn'}, 1, 'own lock: one request, a txn');
ok(!key_exists($key), 'own lock: the key is gone');
unlike($etcd->etcdctl('lease', 'timetolive', sprintf('%x', $lease)), qr/already expired|not found/i,
	'own lock: the session lease is kept');

# Unlocking it again: false and a NOTICE.
$s->{stderr} = '';
is($s->query("SELECT lockfence.etcd_unlock('$key')"), 'f', 'unlock again: false');
like($s->{stderr}, qr/NOTICE:.*does not exist/, 'unlock again: NOTICE');
$s->{stderr} = '';

# A key whose lease expired while this session held it: false and a NOTICE.
($key, $lease) = split / /, $s->query_safe(
	"SELECT key || ' ' || lease FROM lockfence.etcd_lock('cnt2', 10, '5s')");
$etcd->etcdctl('lease', 'revoke', sprintf('%x', $lease));
is($s->query("SELECT lockfence.etcd_unlock('$key')"), 'f', 'own lock lost meanwhile: false');
like($s->{stderr}, qr/NOTICE:.*does not exist/, 'own lock lost meanwhile: NOTICE');
$s->{stderr} = '';

# Our lease's hex under another name is not our key: revoking our lease
# would release the lock we hold.
($key, $lease) = split / /, $s->query_safe(
	"SELECT key || ' ' || lease FROM lockfence.etcd_lock('cnt3', 10, '5s')");
(my $wrong = $key) =~ s{^cnt3/}{cnt3x/};
is($s->query("SELECT lockfence.etcd_unlock('$wrong')"), 'f',
	'our lease under another name: false');
$s->{stderr} = '';
ok(key_exists($key), 'our lease under another name: our lock key survives');
is($s->query_safe("SELECT lockfence.etcd_keepalive($lease) > 0"), 't',
	'our lease under another name: our lease survives');
is($s->query_safe("SELECT lockfence.etcd_unlock('$key')"), 't', 'cnt3 released');

# Another holder's key: a txn deletes it (if attached to its lease), then
# its lease is revoked.
my ($olease) = $etcd->etcdctl('lease', 'grant', '30') =~ /lease 0*([0-9a-f]+) granted/;
$key = "cnt4/$olease";
$etcd->etcdctl('put', "--lease=$olease", $key, '');
%before = map { $_ => hits($_) } ('/v3/kv/txn', '/v3/lease/revoke');
is($s->query_safe("SELECT lockfence.etcd_unlock('$key')"), 't', 'etcdctl holder: etcd_unlock returns true');
is(hits('/v3/kv/txn') - $before{'/v3/kv/txn'}, 1,
	'etcdctl holder: one txn request');
is(hits('/v3/lease/revoke') - $before{'/v3/lease/revoke'}, 1,
	'etcdctl holder: its lease is revoked');
ok(!key_exists($key), 'etcdctl holder: the key is gone');

$s->quit;
$node->stop;
$fault->stop;
$etcd->stop;
done_testing();
