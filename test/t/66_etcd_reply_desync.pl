
# 66_etcd_reply_desync.pl
#	  A reply is checked against the request it answers (the lease ID of a
#	  keepalive, the keys of a range or a delete, the fields of a revoke),
#	  and a connection that brought a reply out of step is never used
#	  again.  test/fault_http_server.py plays an endpoint out of step with
#	  its client: after a valid reply it sends one more response, unasked,
#	  on the same kept-alive connection; other cases alter one field of a
#	  real etcd reply.

use strict;
use warnings;

use MIME::Base64;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'desync');
$etcd->start;
my $fault = $etcd->start_fault_server($etcd->client_url(0));

my $node = LockfenceTest::EtcdCluster::pg_node('desync', <<EOF);
lockfence.etcd_endpoints = '@{[ $fault->url ]}'
lockfence.etcd_request_timeout = '2s'
lockfence.etcd_connect_timeout = '1s'
EOF

my $s = LockfenceTest::EtcdCluster::session($node);
my $s2 = LockfenceTest::EtcdCluster::session($node);

sub try_sql { return LockfenceTest::EtcdCluster::sql_try($s, $_[0]); }

my $r = try_sql("SELECT key || ' ' || lease FROM lockfence.etcd_lock('d1', 20, '5s')");
my ($key, $lease) = split / /, $r->{out};
ok($lease, 'a lock whose lease the keepalive cases renew') or diag explain $r;

# --- 0. the keepalive of a lock wait (first: on clean connections) ---------
$s2->query_safe("SELECT key FROM lockfence.etcd_lock('d7', 30, '5s')");
$fault->set(path => '/v3/lease/keepalive', mode => 'mutate',
	ops => [ { op => 'set', path => [ 'result', 'ID' ], value => '4242' } ]);
$r = try_sql("SELECT * FROM lockfence.etcd_lock('d7', 3, '6s')");
$fault->clear;
is($r->{sqlstate}, '08P01', 'waiting: a keepalive reply for another lease ends the wait with 08P01')
  or diag explain $r;
cmp_ok($r->{secs}, '<', 4, 'at the first keepalive, not at wait_timeout');

# A stale keepalive answer: right lease, absurd TTL, so it shows if used.
my $stale = { result => { header => { revision => '1' }, ID => "$lease", TTL => '999' } };

# --- 1. an unasked response taken as the answer to the next request -------
# The first keepalive is answered, then (1 s later) the endpoint sends the
# stale answer; the second keepalive, for lease 4242, is never answered.
$fault->clear;
$fault->set(path => '/v3/lease/keepalive', mode => 'desync', delay => 1.0,
	extra => $stale, times => 1);
$fault->set(path => '/v3/lease/keepalive', mode => 'hang', seconds => 10, times => 1);
$r = try_sql("SELECT lockfence.etcd_keepalive($lease) AS first, lockfence.etcd_keepalive(4242) AS second");
unlike($r->{out}, qr/999/, 'an unasked response is not taken as the keepalive answer');
is($r->{sqlstate}, '08P01', 'a keepalive reply for another lease: 08P01') or diag explain $r;
like(($r->{detail} // ''), qr/for lease $lease, not 4242/, 'the detail names both leases');

# --- 2. that connection is not used again ----------------------------------
# Had it been kept, the next request would go to the hung handler behind
# it and time out.
$fault->clear;
$r = try_sql("SELECT lockfence.etcd_keepalive($lease) BETWEEN 1 AND 20");
is($r->{out}, 't', 'the next keepalive gets a real answer on a new connection') or diag explain $r;
cmp_ok($r->{secs}, '<', 1.5, 'at once, not after a timeout');

# --- 3. bytes that arrive while the connection is idle ---------------------
$fault->clear;
$fault->set(path => '/v3/lease/keepalive', mode => 'desync', delay => 0.2,
	extra => $stale, times => 1);
$r = try_sql("SELECT lockfence.etcd_keepalive($lease)");
ok($r->{ok} && $r->{out} >= 1 && $r->{out} <= 20, 'idle case: the first keepalive is answered')
  or diag explain $r;
try_sql('SELECT pg_sleep(1)');
$r = try_sql("SELECT lockfence.etcd_keepalive($lease)");
ok($r->{ok} && $r->{out} >= 1 && $r->{out} <= 20,
	'idle case: a connection with unread bytes is not reused') or diag explain $r;
$fault->clear;

# --- 3b. bytes that come right behind the reply ------------------------------
$fault->set(path => '/v3/lease/keepalive', mode => 'desync', delay => 0,
	extra => $stale, times => 1);
$r = try_sql("SELECT lockfence.etcd_keepalive($lease)");
ok($r->{ok} && $r->{out} >= 1 && $r->{out} <= 20, 'right behind: the keepalive is answered')
  or diag explain $r;
try_sql('SELECT pg_sleep(0.3)');
$r = try_sql("SELECT lockfence.etcd_keepalive($lease)");
ok($r->{ok} && $r->{out} >= 1 && $r->{out} <= 20,
	'right behind: the unasked bytes are not read as the next reply') or diag explain $r;
$fault->clear;

# --- 4. the lock request answers for another key ---------------------------
# (the transaction that queues our key also reads the name's holder)
my $other = encode_base64('d-other/694d', '');
$fault->set(path => '/v3/kv/txn', mode => 'mutate', times => 1,
	ops => [ { op => 'set', path => [ 'responses', 1, 'response_range', 'kvs', 0, 'key' ], value => $other } ]);
$r = try_sql("SELECT token FROM lockfence.etcd_lock('d4', 5, '5s')");
is($r->{sqlstate}, '08P01', 'a lock reply naming a key of another name: 08P01, no token') or diag explain $r;
like($r->{message} // '', qr{/v3/kv/txn}, 'the message names the transaction');
$fault->clear;
$r = try_sql("SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_try_lock('d4', 5)");
is($r->{out}, 't', 'nothing left holding d4');

# --- 5. a delete reply for another key (a forced unlock deletes with prev_kv) ---
my $k5 = $s2->query_safe("SELECT key FROM lockfence.etcd_lock('d5', 30, '5s')");
$fault->set(path => '/v3/kv/deleterange', mode => 'mutate', times => 1,
	ops => [ { op => 'set', path => [ 'prev_kvs', 0, 'key' ], value => $other } ]);
$r = try_sql("SELECT lockfence.etcd_unlock('$k5', force => true)");
is($r->{sqlstate}, '08P01', 'a delete reply naming another key: 08P01') or diag explain $r;
$fault->clear;

# --- 6. a revoke reply that is another reply --------------------------------
# (another session's lock: unlocking one's own lock deletes the key and
# keeps the session lease, issue 9; another holder's lease is revoked)
my $k6 = $s2->query_safe("SELECT key FROM lockfence.etcd_lock('d6', 30, '5s')");
chomp $k6;
$fault->set(path => '/v3/lease/revoke', mode => 'mutate', times => 1,
	ops => [ { op => 'set', path => ['result'], value => $stale->{result} } ]);
$r = try_sql("SELECT lockfence.etcd_unlock('$k6')");
is($r->{sqlstate}, '08P01', 'a revoke reply carrying a keepalive result: 08P01') or diag explain $r;
$fault->clear;
# (the revocation itself went through: the lease and its key are gone)
like(try_sql("SELECT lockfence.etcd_unlock('$k6')")->{out}, qr/^[tf]$/, 'unlock without the fault');

# --- 7. the commit-time check answered with another lock's reply -----------
# Two locks fenced with in one transaction; the second one's key is then
# deleted behind our back.  The endpoint sends the answer to the first
# lock's check twice, so that the second check reads the first lock's
# "still held".  That reply must not pass for the second lock: the commit
# fails and neither fence row is written.  (Up to 1.5 the check's passing
# branch read nothing back, so its reply named no key, and this committed.)
$fault->clear;
$r = try_sql("BEGIN; SELECT lockfence.etcd_lock_and_fence('d9a', 'd9a') > 0 AND lockfence.etcd_lock_and_fence('d9b', 'd9b') > 0");
is($r->{out}, 't', 'check at commit: two locks fenced with in one transaction') or diag explain $r;
my ($k9b) = $etcd->keys('d9b/');
ok($k9b, "the second lock's key exists ($k9b)");
$etcd->etcdctl('del', $k9b);
$fault->set(path => '/v3/kv/txn', mode => 'desync', delay => 0.2, times => 1);
$r = try_sql('COMMIT');
$fault->clear;
ok(!$r->{ok}, "check at commit: the first lock's answer is not taken for the lost second lock's")
  or diag explain $r;
like($r->{sqlstate} // '', qr/^(08P01|LF003)$/, 'a malformed reply (08P01) or the lost lock (LF003)')
  or diag explain $r;
try_sql('ROLLBACK');
is(try_sql("SELECT count(*) FROM lockfence.fences WHERE resource IN ('d9a', 'd9b')")->{out},
	'0', 'neither fence row was written');
$r = try_sql("BEGIN; SELECT lockfence.etcd_lock_and_fence('d9c', 'd9c') > 0");
$r = try_sql('COMMIT');
ok($r->{ok}, 'without the fault, a commit with a held lock passes its check') or diag explain $r;

# A keepalive of a lease etcd no longer knows still says so (the reply
# carries the lease ID even then).
my $gone = try_sql("SELECT lease FROM lockfence.etcd_try_lock('d8', 5)")->{out};
$etcd->etcdctl('lease', 'revoke', sprintf('%x', $gone));
$r = try_sql("SELECT lockfence.etcd_keepalive($gone)");
is($r->{sqlstate}, 'LF003', 'keepalive of a revoked lease: LF003') or diag explain $r;

$s->quit;
$s2->quit;
$node->stop;
$fault->stop;
$etcd->stop;
done_testing();
