
# 24_etcd_malformed_replies.pl
#	  Malformed and slow etcd replies, injected at one step of the real
#	  lock protocol by test/fault_http_server.py (a proxy in front of a
#	  real etcd that forwards everything except the request under test):
#	  each gives a clean error with a fitting SQLSTATE within the configured
#	  timeout; the backend never crashes, the same session runs the next
#	  query, and a failed acquisition leaves no lock behind in etcd.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes ();

use LockfenceTest::EtcdCluster;

my $timeout_s = 2;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'malformed');
$etcd->start;
my $fault = $etcd->start_fault_server($etcd->client_url(0));

my $node = LockfenceTest::EtcdCluster::pg_node('malformed', <<EOF);
lockfence.etcd_endpoints = '@{[ $fault->url ]}'
lockfence.etcd_request_timeout = '${timeout_s}s'
lockfence.etcd_connect_timeout = '1s'
EOF

my $s = LockfenceTest::EtcdCluster::session($node);
my $backend_pid = $s->{pid};

# Sanity: through the proxy, with no rule, everything works.
is( LockfenceTest::EtcdCluster::sql_try($s,
		"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('m0', 5, '5s')")->{out},
	't', 'lock and unlock through the fault proxy');
ok($fault->hits->{'/v3/kv/txn'} >= 1, 'the proxy saw the lock request');

my $n = 0;

# One case: install rules, run sql, check the error, the time, the
# session, and (for acquisitions) that the lock name is free again.
sub case
{
	my (%c) = @_;
	my $label = $c{label};
	my $name = 'm' . ++$n;
	(my $sql = $c{sql}) =~ s/NAME/$name/g;
	# a TTL of its own: a new session lease, so the case's lock is granted
	# a lease (issue 9: a session reuses one lease per TTL)
	my $ttl = 100 + $n;
	$sql =~ s/TTLN/$ttl/g;

	$fault->clear;
	$fault->set(%$_) for @{ $c{rules} };
	my $before = $fault->hits->{faults} // 0;
	my $r = LockfenceTest::EtcdCluster::sql_try($s, $sql);
	my $after = $fault->hits->{faults} // 0;
	$fault->clear;

	ok($after > $before, "$label: the fault was injected");
	ok(!$r->{ok}, "$label: the call fails") or diag explain $r;
	like($r->{sqlstate} // '', $c{sqlstate}, "$label: SQLSTATE") or diag explain $r;
	like(($r->{message} // '') . ' ' . ($r->{detail} // ''), $c{text}, "$label: message/detail") or diag explain $r
	  if $c{text};
	cmp_ok($r->{secs}, '<', $c{max_secs} // ($timeout_s + 2), "$label: error in time")
	  or diag explain $r;
	is(LockfenceTest::EtcdCluster::sql_try($s, 'SELECT pg_backend_pid()')->{out},
		$backend_pid, "$label: same session, same backend, still usable");
	if ($c{free_after})
	{
		my $t = LockfenceTest::EtcdCluster::sql_try($s,
			"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_try_lock('$name', 5)");
		is($t->{out}, 't', "$label: nothing left holding the lock") or diag explain $t;
	}
	return $r;
}

my $LOCK = "SELECT * FROM lockfence.etcd_lock('NAME', TTLN, '4s')";
my $txn0 = [ 'responses', 0, 'response_range', 'kvs', 0 ];

# --- the lease grant -----------------------------------------------------
case(label => 'grant: invalid JSON', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'invalid_json' } ],
	sqlstate => qr/^08P01$/, free_after => 1);
case(label => 'grant: truncated body', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'truncated' } ],
	sqlstate => qr/^08/, free_after => 1);
case(label => 'grant: oversized body (4 MiB, Content-Length)', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'oversized' } ],
	sqlstate => qr/^08P01$/, text => qr/too large/, free_after => 1);
case(label => 'grant: oversized body (chunked, no length)', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'oversized_chunked', size => 3 * 1024 * 1024 } ],
	sqlstate => qr/^08P01$/, text => qr/too large/, free_after => 1);
case(label => 'grant: lease ID is an object', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'mutate',
		ops => [ { op => 'set', path => ['ID'], value => { x => 1 } } ] } ],
	sqlstate => qr/^08P01$/, free_after => 1);
case(label => 'grant: lease ID missing', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'mutate',
		ops => [ { op => 'del', path => ['ID'] } ] } ],
	sqlstate => qr/^08P01$/, free_after => 1);
case(label => 'grant: lease ID negative', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'mutate',
		ops => [ { op => 'set', path => ['ID'], value => '-42' } ] } ],
	sqlstate => qr/^08P01$/, free_after => 1);
case(label => 'grant: HTTP 500 with etcd error JSON', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'status', status => 500 } ],
	sqlstate => qr/^08/, text => qr/injected failure/, free_after => 1);
case(label => 'grant: HTTP 500 with an HTML body', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'status', status => 500,
		body => '<html>Internal Server Error</html>' } ],
	sqlstate => qr/^08/, free_after => 1);
case(label => 'grant: reply never ends (slow)', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'slow', seconds => 30 } ],
	sqlstate => qr/^08/, free_after => 1);
case(label => 'grant: no reply at all (hang)', sql => $LOCK,
	rules => [ { path => '/v3/lease/grant', mode => 'hang', seconds => 30 } ],
	sqlstate => qr/^08/, free_after => 1);

# --- queueing the lock key (one txn: create it, read the holder) -----------
# Uncontended, the token is the revision of the transaction that created
# the key.
my @rev = ('header', 'revision');
my @queue_cases = (
	[ 'revision is an object', { op => 'set', path => \@rev, value => { a => 1 } } ],
	[ 'revision negative', { op => 'set', path => \@rev, value => '-7' } ],
	[ 'revision not numeric', { op => 'set', path => \@rev, value => '12abc' } ],
	[ 'revision beyond bigint',
		{ op => 'set', path => \@rev, value => '99999999999999999999999' } ],
	[ 'revision missing', { op => 'del', path => \@rev } ],
	[ 'succeeded is a string', { op => 'set', path => ['succeeded'], value => 'yes' } ],
	[ 'the holder range found no key',
		{ op => 'del', path => [ 'responses', 1, 'response_range', 'kvs' ] } ],
	[ 'holder key is base64 garbage',
		{ op => 'set', path => [ 'responses', 1, 'response_range', 'kvs', 0, 'key' ],
		  value => '%%%' } ],
	[ 'responses is a string', { op => 'set', path => ['responses'], value => 'nope' } ]);
for my $qc (@queue_cases)
{
	case(label => "queue: $qc->[0]", sql => $LOCK,
		rules => [ { path => '/v3/kv/txn', mode => 'mutate', times => 1,
			ops => [ $qc->[1] ] } ],
		sqlstate => qr/^08P01$/, free_after => 1);
}
case(label => 'queue: invalid JSON', sql => $LOCK,
	rules => [ { path => '/v3/kv/txn', mode => 'invalid_json', times => 1 } ],
	sqlstate => qr/^08P01$/, free_after => 1);
case(label => 'queue: oversized body', sql => $LOCK,
	rules => [ { path => '/v3/kv/txn', mode => 'oversized', times => 1 } ],
	sqlstate => qr/^08P01$/, free_after => 1);
case(label => 'queue: reply hangs', sql => $LOCK,
	rules => [ { path => '/v3/kv/txn', mode => 'hang', seconds => 30 } ],
	sqlstate => qr/^08/, free_after => 1);

# --- the wait: a watch on the predecessor ----------------------------------
# Another session holds the name, so ours queues behind it and watches
# its key; the watch stream misbehaves.  A failed wait leaves only the
# holder's key.
my $holder = LockfenceTest::EtcdCluster::session($node);

sub hold
{
	my ($name) = @_;
	my $h = LockfenceTest::EtcdCluster::sql_try($holder,
		"SELECT key FROM lockfence.etcd_lock('$name', 30)");
	ok($h->{ok} && $h->{out} =~ m{^\Q$name\E/}, "$name: the holder has the lock")
	  or diag explain $h;
	return $h->{out};
}

sub watch_case
{
	my (%c) = @_;
	my $name = 'w' . ++$n;
	my $ttl = 100 + $n;
	my $hkey = hold($name);

	$fault->clear;
	$fault->set(%$_) for @{ $c{rules} };
	my $before = $fault->hits->{faults} // 0;
	my $r = LockfenceTest::EtcdCluster::sql_try($s,
		"SELECT token FROM lockfence.etcd_lock('$name', $ttl, '8s')");
	ok(($fault->hits->{faults} // 0) > $before, "$c{label}: the fault was injected");
	$fault->clear;
	ok(!$r->{ok}, "$c{label}: the wait fails") or diag explain $r;
	like($r->{sqlstate} // '', $c{sqlstate}, "$c{label}: SQLSTATE") or diag explain $r;
	like(($r->{message} // '') . ' ' . ($r->{detail} // ''), $c{text},
		"$c{label}: message/detail") or diag explain $r
	  if $c{text};
	cmp_ok($r->{secs}, '<', $c{max_secs} // ($timeout_s * 2 + 2),
		"$c{label}: error in time") or diag explain $r;
	is($etcd->etcdctl('get', '--prefix', '--keys-only', "$name/") =~ s/\s+//gr,
		$hkey, "$c{label}: only the holder's key is left");
	LockfenceTest::EtcdCluster::sql_try($holder,
		"SELECT lockfence.etcd_unlock('$hkey')");
}
watch_case(label => 'watch: a message that is not JSON',
	rules => [ { path => '/v3/watch', mode => 'lines', lines => ["garbage\n"], close => 1 } ],
	sqlstate => qr/^08P01$/, text => qr/not a watch result/);
watch_case(label => 'watch: an error message instead of a result',
	rules => [ { path => '/v3/watch', mode => 'lines', close => 1,
		lines => [ qq({"error":{"grpc_code":7,"http_code":403,"message":"injected"}}\n) ] } ],
	sqlstate => qr/^08P01$/, text => qr/not a watch result/);
watch_case(label => 'watch: canceled by etcd',
	rules => [ { path => '/v3/watch', mode => 'lines', close => 1,
		lines => [ qq({"result":{"header":{"revision":"5"},"canceled":true,"cancel_reason":"injected cancel"}}\n) ] } ],
	sqlstate => qr/^08006$/, text => qr/injected cancel/);
watch_case(label => 'watch: never confirmed',
	rules => [ { path => '/v3/watch', mode => 'lines', lines => [], seconds => 30 } ],
	sqlstate => qr/^(08006|55P03)$/, max_secs => 10);
watch_case(label => 'watch: HTTP 500',
	rules => [ { path => '/v3/watch', mode => 'status', status => 500 } ],
	sqlstate => qr/^08006$/);
watch_case(label => 'watch: oversized stream',
	rules => [ { path => '/v3/watch', mode => 'oversized_chunked', size => 3 * 1024 * 1024 } ],
	sqlstate => qr/^08P01$/);

# A DELETE event whose key is not valid base64 is a malformed watch
# message like any other (issue 17, item 16: it ended the wait with 08P01
# at once, while other malformed messages were retried): the same policy,
# 08P01 once the retries are spent.
my $bad_delete = qq({"result":{"header":{"revision":"5"},"events":[{"type":"DELETE","kv":{"key":"%%% not base64 %%%","mod_revision":"5"}}]}}\n);
watch_case(label => 'watch: a DELETE event whose key is not base64',
	rules => [ { path => '/v3/watch', mode => 'lines', close => 1, lines => [$bad_delete] } ],
	sqlstate => qr/^08P01$/, text => qr/not valid base64/);

# A watch that fails once is set up again, and the waiter keeps its place:
# it gets the lock once the holder releases it.  The same for every kind
# of failure: canceled by etcd, a message that is not a watch result, a
# DELETE event whose key is not base64.
for my $once ([ 'canceled', qq({"result":{"canceled":true,"cancel_reason":"once"}}\n) ],
	[ 'not a watch result', qq({"error":{"grpc_code":14,"message":"once"}}\n) ],
	[ 'DELETE key not base64', $bad_delete ])
{
	my ($what, $line) = @$once;
	my $name = 'w' . ++$n;
	my $hkey = hold($name);
	my $w0 = $fault->hits->{'/v3/watch'} // 0;
	$fault->set(path => '/v3/watch', mode => 'lines', close => 1, times => 1,
		lines => [$line]);
	LockfenceTest::EtcdCluster::send_query($s,
		"SELECT key || ' ' || token FROM lockfence.etcd_lock('$name', 30, '20s');");
	ok($etcd->wait_for_keys("$name/", 2), "watch failing once ($what): the waiter queued");
	ok( LockfenceTest::EtcdCluster::poll_until(10,
			sub { ($fault->hits->{'/v3/watch'} // 0) >= $w0 + 2 }),
		"watch failing once ($what): the watch was set up again");
	LockfenceTest::EtcdCluster::sql_try($holder,
		"SELECT lockfence.etcd_unlock('$hkey')");
	my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($s, 30);
	my ($wkey, $wtoken) = split / /, $out;
	like($wtoken // '', qr/^\d+$/, "watch failing once ($what): the waiter got the lock")
	  or diag("stdout: $out\nstderr: $err");
	$fault->clear;
	LockfenceTest::EtcdCluster::sql_try($s, "SELECT lockfence.etcd_unlock('$wkey')")
	  if $wkey;
}
$holder->quit;

# --- keepalive and unlock ----------------------------------------------------
my $r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT key || ' ' || lease FROM lockfence.etcd_lock('mk', 10, '5s')");
my ($mk_key, $mk_lease) = split / /, $r->{out};
ok($mk_lease, 'a lock for the keepalive/unlock cases');
case(label => 'keepalive: no result object',
	sql => "SELECT lockfence.etcd_keepalive($mk_lease)",
	rules => [ { path => '/v3/lease/keepalive', mode => 'mutate',
		ops => [ { op => 'del', path => ['result'] } ] } ],
	sqlstate => qr/^(08P01|LF003)$/);
case(label => 'keepalive: TTL is an object',
	sql => "SELECT lockfence.etcd_keepalive($mk_lease)",
	rules => [ { path => '/v3/lease/keepalive', mode => 'mutate',
		ops => [ { op => 'set', path => [ 'result', 'TTL' ], value => [1] } ] } ],
	sqlstate => qr/^(08P01|LF003)$/);
case(label => 'keepalive: invalid JSON',
	sql => "SELECT lockfence.etcd_keepalive($mk_lease)",
	rules => [ { path => '/v3/lease/keepalive', mode => 'invalid_json' } ],
	sqlstate => qr/^08P01$/);
# etcd_unlock of a lock this session holds deletes its key in a txn and
# keeps the session lease (issue 9); the cleanup after a failure revokes
# the lease; another holder's key is deleted first: fault them all.
case(label => 'unlock: invalid JSON',
	sql => "SELECT lockfence.etcd_unlock('$mk_key')",
	rules => [ map { { path => $_, mode => 'invalid_json' } }
		('/v3/kv/txn', '/v3/kv/deleterange', '/v3/lease/revoke') ],
	sqlstate => qr/^08P01$/);
case(label => 'unlock: reply never ends',
	sql => "SELECT lockfence.etcd_unlock('$mk_key')",
	rules => [ map { { path => $_, mode => 'slow', seconds => 30 } }
		('/v3/kv/txn', '/v3/kv/deleterange', '/v3/lease/revoke') ],
	sqlstate => qr/^08/);
# The lease survived all that (the faults were only in replies).  The
# faulty unlocks could delete neither the key nor, after that, the lease:
# the session gave the key up, and the next renewal deletes it first.
$r = LockfenceTest::EtcdCluster::sql_try($s, "SELECT lockfence.etcd_keepalive($mk_lease) > 0");
is($r->{out}, 't', 'the lease is still alive after the faulty replies') or diag explain $r;
ok(!defined $etcd->key_info($mk_key), '... and the renewal deleted the key the unlocks gave up');
$r = LockfenceTest::EtcdCluster::sql_try($s, "SELECT lockfence.etcd_unlock('$mk_key')");
like($r->{out}, qr/^[tf]$/, 'unlock without faults completes');

# A cancel during a never-ending reply is honoured at once.
$fault->set(path => '/v3/lease/grant', mode => 'slow', seconds => 30);
$s->query_safe("SET lockfence.etcd_request_timeout = '60s'");
$s->{stdin} .= "SELECT * FROM lockfence.etcd_lock('mc', 77);\n";
$s->{run}->pump_nb;
my $t0 = Time::HiRes::time();
sleep 1;
$node->safe_psql('postgres', "SELECT pg_cancel_backend($backend_pid)");
$r = LockfenceTest::EtcdCluster::sql_try($s, 'SELECT 1');
my $cancel_secs = Time::HiRes::time() - $t0;
like($r->{stderr}, qr/57014/, 'cancel during a never-ending reply: 57014');
cmp_ok($cancel_secs, '<', 3, 'cancel honoured promptly');
$fault->clear;
$s->query_safe("RESET lockfence.etcd_request_timeout");

# The server never crashed.
$s->quit;
my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|server process .* was terminated|PANIC/,
	'no backend crashed');
ok($node->safe_psql('postgres', 'SELECT 1') eq '1', 'server up at the end');

$node->stop;
$fault->stop;
$etcd->stop;
done_testing();
