
# 69_etcd_given_up_lease.pl
#	  A lease carrying a key that this session could not delete, and no
#	  longer tracks, is renewed only once that key is deleted: renewing it
#	  with the key would keep the key in etcd, ahead of every later waiter
#	  for its name, for as long as the session renews the lease for its
#	  other locks.  Two ways to leave such a key on the session lease, each
#	  with another lock of the session on the same lease:
#	  - a transaction-scoped lock whose release at COMMIT raised (server
#	    started with LOCKFENCE_FAULT_INJECTION=commit_release);
#	  - a waiting etcd_lock that fails while etcd does not answer its
#	    requests, nor the cleanup (test/fault_http_server.py holds every key
#	    transaction and lease revoke without a reply).
#	  Once etcd answers, etcd_keepalive of that lease deletes the key first
#	  and renews the lease: the session's other lock lives on, and another
#	  session gets the key's name at once (its TTL is 30 s).  While etcd
#	  still does not answer the deletion, the keepalive reports the
#	  session's locks on the lease lost (LF003) rather than renew it, and a
#	  later keepalive, once etcd answers, deletes their keys too before it
#	  renews: no key of the session is left.  A lock taken afterwards goes
#	  on a new lease.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'givenup');
$etcd->start;
my $fault = $etcd->start_fault_server($etcd->client_url(0));

sub gone
{
	my ($k, $secs) = @_;
	return LockfenceTest::EtcdCluster::poll_until($secs // 5,
		sub { !defined $etcd->key_info($k) });
}

# One statement's row as a list; dies on an ERROR.  (Not query_safe: on the
# server started with commit_release, every commit of a session holding an
# etcd lock prints the injected fault's WARNING.)
sub lock_row
{
	my ($s, $sql) = @_;
	my $r = LockfenceTest::EtcdCluster::sql_try($s, $sql);
	die "$sql: $r->{stderr}" unless $r->{ok};
	chomp $r->{out};
	return split /\|/, $r->{out};
}

# Another session takes $name within 3 s (its holder's key is gone).
sub taken_at_once
{
	my ($label, $node, $name) = @_;
	my $o = LockfenceTest::EtcdCluster::session($node);
	my $t0 = time;
	my $got = LockfenceTest::EtcdCluster::sql_try($o,
		"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('$name', 30, wait_timeout => '5s')");
	ok($got->{ok} && time - $t0 < 3, "$label: another session gets \"$name\" at once")
	  or diag explain $got;
	$o->quit;
	return;
}

# After session $s left the key $left of name $name on lease $lease, which
# also carries its lock $held: once etcd answers, a keepalive deletes the
# left key and renews the lease.
sub check_renewed_after_delete
{
	my ($label, $node, $s, $lease, $held, $left, $name) = @_;
	ok(defined $etcd->key_info($left),
		"$label: the key that could not be deleted is still in etcd");
	my $r = LockfenceTest::EtcdCluster::sql_try($s,
		"SELECT lockfence.etcd_keepalive($lease)");
	like($r->{out}, qr/^\d+$/, "$label: etcd_keepalive renews the lease")
	  or diag explain $r;
	ok(!defined $etcd->key_info($left), "$label: ... once it deleted the key left on it");
	ok(defined $etcd->key_info($held), "$label: the session's other lock on the lease lives on");
	taken_at_once($label, $node, $name);
	my ($nkey, $nlease) = lock_row($s,
		"SELECT key, lease FROM lockfence.etcd_lock('${name}_after', 30)");
	isnt($nlease, $lease, "$label: the next lock goes on a new lease");
	lock_row($s, "SELECT lockfence.etcd_unlock('$nkey')");
	lock_row($s, "SELECT lockfence.etcd_unlock('$held')");
	return;
}

# --- the release at COMMIT raised ---------------------------------------------------
my $inj;
{
	local $ENV{LOCKFENCE_FAULT_INJECTION} = 'commit_release';
	$inj = LockfenceTest::EtcdCluster::pg_node('etcd_givenup_inj',
		"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n");
}
my $s = LockfenceTest::EtcdCluster::session($inj);
$s->query_safe('BEGIN');
my ($akey, $alease) = lock_row($s,
	"SELECT key, lease FROM lockfence.etcd_lock('ga', 30, scope => 'session')");
my ($bkey, $blease) = lock_row($s,
	"SELECT key, lease FROM lockfence.etcd_lock('gb', 30, scope => 'transaction')");
is($blease, $alease, 'release raised: both locks are on the session lease');
my $r = LockfenceTest::EtcdCluster::sql_try($s, 'COMMIT');
ok($r->{ok}, 'release raised: COMMIT succeeds') or diag explain $r;
like($r->{stderr}, qr/WARNING:.*lockfence fault injected at commit_release/,
	'release raised: ... with its WARNING');
check_renewed_after_delete('release raised', $inj, $s, $alease, $akey, $bkey, 'gb');
$s->quit;
$inj->stop;

# --- the cleanup of a stopped wait got no answer -------------------------------------
my $node = LockfenceTest::EtcdCluster::pg_node('etcd_givenup',
	"lockfence.etcd_endpoints = '" . $fault->url . "'\n"
	  . "lockfence.etcd_request_timeout = '3s'\n");
my $holder = LockfenceTest::EtcdCluster::session($node);
my ($hkey) = lock_row($holder,
	"SELECT key, lease FROM lockfence.etcd_lock('wb', 30)");
$s = LockfenceTest::EtcdCluster::session($node);
($akey, $alease) = lock_row($s,
	"SELECT key, lease FROM lockfence.etcd_lock('wa', 30)");
LockfenceTest::EtcdCluster::send_query($s,
	"SELECT key FROM lockfence.etcd_lock('wb', 30, wait_timeout => '4s');");
my @q = ();
ok(LockfenceTest::EtcdCluster::poll_until(10,
		sub { @q = $etcd->keys('wb/'); @q == 2 }),
	'stopped wait: the waiter\'s key is queued behind the holder');
my ($wkey) = grep { $_ ne $hkey } @q;
like($wkey // '', qr{/\Q@{[ sprintf '%x', $alease ]}\E$},
	'stopped wait: ... on the session lease, which carries another lock');
# from now on etcd does not answer a key delete or a lease revoke
$fault->set(path => $_, mode => 'hang') for ('/v3/kv/txn', '/v3/lease/revoke');
my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($s, 20);
# 55P03 at the wait_timeout, or 08006 if a request of the wait itself (a
# read of the queue) was held first: either way the cleanup follows
like($err, qr/ERROR:\s+(55P03|08006)/, 'stopped wait: the call fails while etcd does not answer')
  or diag $err;
ok(($fault->hits->{faults} // 0) > 0, 'stopped wait: its cleanup got no answer');
$fault->clear;
$holder->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
ok(!defined $etcd->key_info($hkey), 'stopped wait: the holder released "wb"');
check_renewed_after_delete('stopped wait', $node, $s, $alease, $akey, $wkey, 'wb');
$s->quit;

# --- a keepalive while etcd still does not answer the deletion ------------------------
$s = LockfenceTest::EtcdCluster::session($node);
($hkey) = lock_row($holder, "SELECT key, lease FROM lockfence.etcd_lock('xb', 30)");
($akey, $alease) = lock_row($s, "SELECT key, lease FROM lockfence.etcd_lock('xa', 30)");
LockfenceTest::EtcdCluster::send_query($s,
	"SELECT key FROM lockfence.etcd_lock('xb', 30, wait_timeout => '4s');");
ok(LockfenceTest::EtcdCluster::poll_until(10,
		sub { @q = $etcd->keys('xb/'); @q == 2 }),
	'still no answer: the waiter\'s key is queued');
($wkey) = grep { $_ ne $hkey } @q;
$fault->set(path => $_, mode => 'hang') for ('/v3/kv/txn', '/v3/lease/revoke');
($out, $err) = LockfenceTest::EtcdCluster::wait_result($s, 20);
like($err, qr/ERROR:\s+(55P03|08006)/, 'still no answer: the call fails') or diag $err;
my $r2 = LockfenceTest::EtcdCluster::sql_try($s, "SELECT lockfence.etcd_keepalive($alease)");
is($r2->{sqlstate}, 'LF003', 'still no answer: etcd_keepalive refuses to renew (LF003)')
  or diag explain $r2;
like($r2->{message} // '', qr/etcd locks of this session were lost: "\Q$akey\E"/,
	'still no answer: ... naming the session\'s other lock on the lease');
ok(defined $etcd->key_info($wkey) && defined $etcd->key_info($akey),
	'still no answer: both keys are still in etcd (neither deleted nor revoked)');
$fault->clear;
$r2 = LockfenceTest::EtcdCluster::sql_try($s, "SELECT lockfence.etcd_keepalive($alease)");
like($r2->{out}, qr/^\d+$/, 'answered again: the next keepalive renews the lease')
  or diag explain $r2;
ok(!defined $etcd->key_info($wkey) && !defined $etcd->key_info($akey),
	'answered again: ... once it deleted both keys (the lost lock\'s too)');
$holder->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
taken_at_once('answered again', $node, 'xb');
taken_at_once('answered again', $node, 'xa');
my $spid = $s->{pid};
$s->quit;
ok(LockfenceTest::EtcdCluster::poll_until(10,
		sub { my $hex = sprintf('%x', $alease); !grep { $_ eq $hex } $etcd->leases }),
	'the session revoked the lease at exit');

$holder->quit;
$node->stop;
$fault->stop;
$etcd->stop;
done_testing();
