
# Lease expiry and lost locks: a waiter keeps its own lease alive; an
# expired holder's lock passes on and its fenced write is rejected (LF001);
# a waiter whose lease is gone never gets a token (LF003), both when its
# keepalive notices and in etcd 3.4's "locked anyway" case.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;
use LockfenceTest::Node ();

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'expiry');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('etcd_expiry',
	"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n"
	  . "restart_after_crash = on\n");
$node->safe_psql(
	'postgres', q{
	CREATE TABLE accounts (id int PRIMARY KEY, balance int);
	INSERT INTO accounts VALUES (1, 100);
});

# --- a waiter keeps its lease alive while waiting longer than its TTL ---------

my $h = LockfenceTest::EtcdCluster::session($node);
my $hkey = $h->query_safe("SELECT key FROM lockfence.etcd_lock('ka', 60)");
chomp $hkey;
my $w = LockfenceTest::EtcdCluster::session($node);
$w->query_safe("SET log_min_messages = debug2");
LockfenceTest::EtcdCluster::send_query($w,
	"SELECT key || '|' || token FROM lockfence.etcd_lock('ka', 5);");
ok($etcd->wait_for_keys('ka/', 2), 'short-TTL waiter queued');
my $t0 = time;
sleep 1 while time < $t0 + 10;    # twice the waiter's TTL
is(scalar($etcd->keys('ka/')), 2, 'waiter key survived twice its TTL');
$h->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($w, 30);
my ($wkey, $wtoken) = split /\|/, $out;
ok(defined $wtoken && $wtoken =~ /^\d+$/,
	'waiter whose lease was kept alive acquired the lock')
  or diag("stdout: $out\nstderr: $err");
$w->query_safe("SELECT lockfence.etcd_unlock('$wkey')") if $wkey;

# --- lease expiry hands the lock on; the old holder is fenced out -------------

my $a = LockfenceTest::EtcdCluster::session($node);
my $arow = $a->query_safe(
	q{SELECT key || '|' || token FROM lockfence.etcd_lock('exp', 3)});
chomp $arow;
my ($akey, $atoken) = split /\|/, $arow;
$a->query_safe(
	"BEGIN; SELECT lockfence.fence('acct-1', $atoken, holder => '$akey'); "
	  . "UPDATE accounts SET balance = balance - 10 WHERE id = 1; COMMIT;");

# A is now stalled (no keepalive): B waits and gets the lock after A's
# lease expires.
my $b = LockfenceTest::EtcdCluster::session($node);
$t0 = time;
my $brow = $b->query_safe(
	q{SELECT key || '|' || token FROM lockfence.etcd_lock('exp', 30, '30 s')});
chomp $brow;
my ($bkey, $btoken) = split /\|/, $brow;
my $elapsed = time - $t0;
ok($btoken > $atoken,
	"B got the lock after A's lease expired ($elapsed s), token $btoken > $atoken");
ok(!defined $etcd->key_info($akey), "A's key is gone");
$b->query_safe(
	"BEGIN; SELECT lockfence.fence('acct-1', $btoken, holder => '$bkey'); "
	  . "UPDATE accounts SET balance = balance + 5 WHERE id = 1; COMMIT;");

# A wakes up and tries another fenced write with its old token.
($out, $err) = ('', '');
$a->query("BEGIN; SELECT lockfence.fence('acct-1', $atoken, holder => '$akey');");
like($a->{stderr}, qr/ERROR:\s+LF001/,
	'the expired holder\'s fenced write is rejected with LF001');
$a->query('ROLLBACK');
$a->{stderr} = '';
is($node->safe_psql('postgres', 'SELECT balance FROM accounts WHERE id = 1'),
	'95', 'only the writes of valid holders were applied');

# its keepalive reports the loss
my $alease = hex((split m{/}, $akey)[1]);
$a->query("SELECT lockfence.etcd_keepalive($alease)");
like($a->{stderr}, qr/ERROR:\s+LF003/,
	'keepalive of the expired lease raises LF003');
$a->{stderr} = '';
$b->query_safe("SELECT lockfence.etcd_unlock('$bkey')");

# --- a waiter's lease revoked while it waits: keepalive notices ---------------

$hkey = $h->query_safe("SELECT key FROM lockfence.etcd_lock('lost1', 60)");
chomp $hkey;
LockfenceTest::EtcdCluster::send_query($w,
	"SELECT key, token FROM lockfence.etcd_lock('lost1', 3);");
ok($etcd->wait_for_keys('lost1/', 2), 'waiter queued');
my ($wk) = grep { $_ ne $hkey } $etcd->keys('lost1/');
my $wlease_hex = (split m{/}, $wk)[1];
$etcd->etcdctl('lease', 'revoke', $wlease_hex);
($out, $err) = LockfenceTest::EtcdCluster::wait_result($w, 30);
like($err, qr/ERROR:\s+LF003/,
	'waiter whose lease was revoked gets LF003 from its keepalive');
unlike($out, qr/\d/, '... and no token');
is_deeply([ $etcd->keys('lost1/') ], [$hkey], 'no waiter key left');
$h->query_safe("SELECT lockfence.etcd_unlock('$hkey')");

# --- etcd 3.4: the lock service answers "locked" to a waiter whose lease is ---
# --- gone; the read-back refuses to issue a token -----------------------------

$hkey = $h->query_safe("SELECT key FROM lockfence.etcd_lock('lost2', 60)");
chomp $hkey;
# TTL 60: the waiter's next keepalive is 20 s away, so only the read-back
# after the lock service's answer can notice the loss.
LockfenceTest::EtcdCluster::send_query($w,
	"SELECT key, token FROM lockfence.etcd_lock('lost2', 60);");
ok($etcd->wait_for_keys('lost2/', 2), 'waiter queued');
($wk) = grep { $_ ne $hkey } $etcd->keys('lost2/');
$wlease_hex = (split m{/}, $wk)[1];
$etcd->etcdctl('lease', 'revoke', $wlease_hex);
ok($etcd->wait_for_keys('lost2/', 1), "waiter's key deleted with its lease");
$t0 = time;
$h->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
($out, $err) = LockfenceTest::EtcdCluster::wait_result($w, 30);
$elapsed = time - $t0;
like($err, qr/ERROR:\s+LF003/,
	'waiter answered "locked" without a key gets LF003');
like($err, qr/The lock key no longer exists/,
	'... found by reading the key back after the lock service answered');
unlike($out, qr/\d/, '... and no token');
ok($elapsed < 15, "... promptly after the holder released ($elapsed s)");
is_deeply([ $etcd->keys('lost2/') ], [], 'no key left under the name');

# --- a waiter survives an etcd restart (re-queues with the same lease) ---------

$hkey = $h->query_safe("SELECT key FROM lockfence.etcd_lock('restart', 60)");
chomp $hkey;
my $htoken = $etcd->key_info($hkey)->{create_revision};
$w->query_safe("SET lockfence.etcd_request_timeout = '60s'");
$w->query_safe("SET log_min_messages = debug1");
LockfenceTest::EtcdCluster::send_query($w,
	"SELECT key || '|' || token FROM lockfence.etcd_lock('restart', 10, '120 s');");
ok($etcd->wait_for_keys('restart/', 2), 'waiter queued before the restart');
# A graceful stop answers the requests in flight with the gateway's
# "HTTP 408, code 1: grpc: the client connection is closing" (or resets
# them), then refuses connections until the member is back: all of these
# are transient, retried within the waiter's request timeout (issue 17,
# item 13: the 408 used to end the wait with 08000).
$etcd->kill_member(0, 'TERM');
$etcd->restart_member(0);
is(scalar($etcd->keys('restart/')), 2, 'both keys survived the restart');
# The restarted member serves again (restart_member waited for its
# health); wait until the waiter watches its predecessor there again
# (the member's metrics start from zero), so the release below is
# delivered to a waiter that went through the whole restart.
ok(LockfenceTest::EtcdCluster::poll_until(60, sub { $etcd->grpc_calls('Watch') >= 1 }),
	'the waiter set up its watch again on the restarted member');
my (undef, $werr) = LockfenceTest::EtcdCluster::peek_output($w);
unlike($werr, qr/(?:ERROR|FATAL):/, 'the waiter is still waiting, without an error')
  or diag $werr;
$h->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
($out, $err) = LockfenceTest::EtcdCluster::wait_result($w, 60);
($wkey, $wtoken) = split /\|/, $out;
ok(defined $wtoken && $wtoken > $htoken,
	'waiter acquired the lock after etcd restarted')
  or diag("stdout: $out\nstderr: $err");
$w->query_safe("SELECT lockfence.etcd_unlock('$wkey')") if $wkey;

$_->quit for ($h, $w, $a, $b);

# --- a crashed backend's lock is freed by its TTL ------------------------------

my $c = LockfenceTest::EtcdCluster::session($node);
my $ckey = $c->query_safe("SELECT key FROM lockfence.etcd_lock('crash', 4)");
chomp $ckey;
kill 'KILL', $c->{pid};
eval { $c->quit };
ok(defined $etcd->key_info($ckey),
	'the key of a backend killed with SIGKILL is still there (no cleanup ran)');
ok(LockfenceTest::EtcdCluster::poll_until(30, sub { !defined $etcd->key_info($ckey) }),
	'... and is freed by its TTL');
# (the postmaster restarts after the SIGKILL: see poll_until_answers)
LockfenceTest::Node::poll_until_answers($node, 'postgres', 'SELECT 1', '1')
  or die 'the server did not come back after the crash';
my $crow = $node->safe_psql('postgres',
	"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('crash', 10, '10 s')");
is($crow, 't', 'the lock can be taken again after the crash');

$node->stop;
done_testing();
