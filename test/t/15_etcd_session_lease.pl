
# 15_etcd_session_lease.pl
#	  Session leases (issue 9, item 1): one lease per distinct TTL per
#	  backend, reused by every lock with that TTL; etcd_unlock deletes the
#	  key and keeps the lease; a lease without locks is not renewed and
#	  expires one TTL after its last use; a client that goes quiet (its
#	  psql process stopped with SIGSTOP while the backend sits idle) loses
#	  its locks after the TTL, the next holder's token is higher, and the
#	  quiet session learns of every lost lock (LF003 naming each);
#	  etcd_keepalive renews the session lease; lock calls renew it when a
#	  third of its TTL has passed since its last renewal, and only then;
#	  DISCARD ALL revokes the session leases, as the backend's exit does.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'sess');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('etcd_sess',
	"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n");

sub lease_hex { return sprintf('%x', $_[0]); }
sub lease_alive { my $h = shift; return grep { $_ eq $h } $etcd->leases; }

sub lock_row
{
	my ($s, $sql) = @_;
	my $row = $s->query_safe("SELECT key || '|' || lease || '|' || token FROM $sql");
	chomp $row;
	return split /\|/, $row;
}

# --- one lease per TTL, reused; unlock keeps it -----------------------------

my $s = LockfenceTest::EtcdCluster::session($node);
my ($k1, $l1, $t1) = lock_row($s, "lockfence.etcd_lock('a', 20)");
my ($k2, $l2, $t2) = lock_row($s, "lockfence.etcd_try_lock('b', 20)");
my ($k3, $l3, $t3) = lock_row($s, "lockfence.etcd_lock('c', 30)");
is($l2, $l1, 'two locks with the same TTL share the session lease');
isnt($l3, $l1, 'a lock with another TTL gets another lease');
is($k2, 'b/' . lease_hex($l1), 'the lock key is NAME/LEASEHEX of the session lease');
is($etcd->key_info($k1)->{lease}, $l1, 'the key is attached to that lease');

is($s->query_safe("SELECT lockfence.etcd_unlock('$k1')"), 't', 'unlock');
ok(!defined $etcd->key_info($k1), 'unlock deleted the key');
ok(lease_alive(lease_hex($l1)), 'unlock kept the session lease');
ok(defined $etcd->key_info($k2), 'the other lock on the lease is still held');

my ($k4, $l4, $t4) = lock_row($s, "lockfence.etcd_lock('a', 20)");
is($l4, $l1, 'the next lock with that TTL reuses the lease');
ok($t4 > $t1, 'and gets a higher token');

is($s->query_safe("SELECT count(*) FROM lockfence.etcd_try_lock('a', 20)"), '0',
	'a session contends with itself for a name it holds (another lease): try_lock finds it taken');

# an unlock of a key on our session lease, with force, keeps the lease
is($s->query_safe("SELECT lockfence.etcd_unlock('$k2', force => true)"),
	't', 'forced unlock of our own lock key');
ok(!defined $etcd->key_info($k2) && lease_alive(lease_hex($l1)),
	'... deleted the key and kept the session lease');
$s->query_safe("SELECT lockfence.etcd_unlock('$k4')");
$s->query_safe("SELECT lockfence.etcd_unlock('$k3')");

# --- a lease without locks is not renewed: it expires after its TTL ---------
# TTL 5: the lease must outlive the unlock and the check that follows it
# (with TTL 2 a loaded machine could take that long); the poll allows 15 s.

my ($k5, $l5) = lock_row($s, "lockfence.etcd_lock('idle', 5)");
$s->query_safe("SELECT lockfence.etcd_unlock('$k5')");
ok(lease_alive(lease_hex($l5)), 'idle lease alive right after unlock');
ok(LockfenceTest::EtcdCluster::poll_until(15, sub { !lease_alive(lease_hex($l5)) }),
	'a lease holding no lock expires by itself after its TTL');
my ($k6, $l6) = lock_row($s, "lockfence.etcd_lock('idle', 5)");
isnt($l6, $l5, 'the next lock with that TTL gets a new lease');
$s->query_safe("SELECT lockfence.etcd_unlock('$k6')");

# --- etcd_keepalive renews the session lease --------------------------------

my ($k7, $l7) = lock_row($s, "lockfence.etcd_lock('kept', 3)");
my $t0 = time;
while (time < $t0 + 7)
{
	$s->query_safe("SELECT lockfence.etcd_keepalive($l7)");
	usleep(700_000);
}
ok(defined $etcd->key_info($k7),
	'a lock whose session lease is kept alive outlives twice its TTL');
is($s->query_safe("SELECT lockfence.etcd_unlock('$k7')"), 't',
	'... and is released normally');

# --- lock calls renew the session lease once a third of its TTL has passed --

# The first call grants a TTL-45 lease (no lock used that TTL before);
# the lock calls that follow within a third of its TTL send no keepalive:
# a client taking many short locks does not pay for a renewal on each.
my ($k8, $l8) = lock_row($s, "lockfence.etcd_lock('fresh', 45)");
my $ka_before = $etcd->grpc_calls('LeaseKeepAlive');
for my $i (1 .. 10)
{
	my ($kq) = lock_row($s, "lockfence.etcd_try_lock('quick', 45)");
	$s->query_safe("SELECT lockfence.etcd_unlock('$kq')");
}
is($etcd->grpc_calls('LeaseKeepAlive') - $ka_before, 0,
	'lock calls within a third of the TTL of the last renewal send no keepalive');
$s->query_safe("SELECT lockfence.etcd_unlock('$k8')");

# TTL 3: renewals are due every second.  Locks taken and released every
# 0.3 s for three TTLs keep an older lock on the same lease alive, with at
# most one keepalive per second, however slowly the calls run.
my ($k9, $l9) = lock_row($s, "lockfence.etcd_lock('kept-by-calls', 3)");
$ka_before = $etcd->grpc_calls('LeaseKeepAlive');
my $calls = 0;
$t0 = time;
while (time < $t0 + 9)
{
	my ($kq) = lock_row($s, "lockfence.etcd_try_lock('short', 3)");
	$s->query_safe("SELECT lockfence.etcd_unlock('$kq')");
	$calls++;
	usleep(300_000);
}
my $elapsed = time - $t0;
my $renewals = $etcd->grpc_calls('LeaseKeepAlive') - $ka_before;
ok(defined $etcd->key_info($k9),
	'a session that keeps taking locks keeps an older lock alive for three TTLs');
cmp_ok($renewals, '>=', 2, "... renewing the lease ($renewals keepalives in $calls calls)");
cmp_ok($renewals, '<=', int($elapsed) + 1,
	sprintf('... at most once per third of the TTL (%.1f s)', $elapsed));
$s->query_safe("SELECT lockfence.etcd_unlock('$k9')");

# --- a paused client loses its locks after the TTL --------------------------

my $p = LockfenceTest::EtcdCluster::session($node);
my ($px, $pl, $ptok) = lock_row($p, "lockfence.etcd_lock('px', 3)");
my ($py) = lock_row($p, "lockfence.etcd_lock('py', 3)");
my $psql_pid = $p->{run}->{KIDS}[0]{PID};
ok($psql_pid, "psql client process $psql_pid");
kill 'STOP', $psql_pid;
$t0 = time;

my $b = LockfenceTest::EtcdCluster::session($node);
my ($bx, $bl, $btok) = lock_row($b, "lockfence.etcd_lock('px', 30, '30 s')");
my $waited = time - $t0;
ok($btok > $ptok, "next holder got the lock after ${waited}s, token $btok > $ptok");
ok($waited < 15, 'within the TTL of the quiet client plus etcd\'s expiry delay');
ok(!defined $etcd->key_info($px) && !defined $etcd->key_info($py),
	'both locks of the quiet client are gone');

kill 'CONT', $psql_pid;
$p->query("SELECT key FROM lockfence.etcd_try_lock('pz', 3)");
like($p->{stderr}, qr/LF003/, 'the quiet client\'s next lock call reports LF003');
like($p->{stderr}, qr/\Q$px\E/, '... naming its first lost lock');
like($p->{stderr}, qr/\Q$py\E/, '... and its second');
$p->{stderr} = '';
my ($pz) = lock_row($p, "lockfence.etcd_try_lock('pz', 3)");
like($pz, qr{^pz/}, 'the call after that takes a lock on a new lease');
$p->query_safe("SELECT lockfence.etcd_unlock('$pz')");
$b->query_safe("SELECT lockfence.etcd_unlock('$bx')");

# --- DISCARD ALL ends the session's locks -----------------------------------
# A session pooler's reset between clients: the backend's next client
# neither inherits the locks nor keeps them alive with its own lock calls
# of the same TTL.  Refused in a transaction block, it releases nothing.
# The session names the endpoints itself, and the server's setting is a
# port where nothing listens: DISCARD ALL resets the settings, and the
# revokes must go where the leases were granted.

$node->safe_psql('postgres',
	"ALTER SYSTEM SET lockfence.etcd_endpoints = 'http://127.0.0.1:9'; SELECT pg_reload_conf()");
$node->poll_query_until('postgres',
	"SELECT current_setting('lockfence.etcd_endpoints') = 'http://127.0.0.1:9'")
  or die 'the reload of lockfence.etcd_endpoints was not seen';
my $set_endpoints = "SET lockfence.etcd_endpoints = '" . $etcd->endpoints . "'";
$b->query_safe($set_endpoints);
my ($d1, $dl) = lock_row($b, "lockfence.etcd_lock('discard', 60)");
my ($d2) = lock_row($b, "lockfence.etcd_lock('discard2', 60)");
$b->query('BEGIN; DISCARD ALL;');
like($b->{stderr}, qr/DISCARD ALL cannot run inside a transaction block/,
	'DISCARD ALL in a transaction block is refused');
$b->{stderr} = '';
$b->query_safe('ROLLBACK');
ok(defined $etcd->key_info($d1), '... and the lock is still held');
$b->query_safe('DISCARD ALL');
# revoked before DISCARD ALL returns (within 1 s, else left to its TTL of 60)
ok(LockfenceTest::EtcdCluster::poll_until(5, sub { !lease_alive(lease_hex($dl)) }),
	'DISCARD ALL revokes the session lease');
ok(!defined $etcd->key_info($d1) && !defined $etcd->key_info($d2),
	'... and with it both locks on it');
$b->query_safe($set_endpoints);
my ($d3) = lock_row($b, "lockfence.etcd_try_lock('discard', 60)");
like($d3, qr{^discard/}, 'the same backend takes the name again, on a new lease');
isnt($d3, $d1, '... under a new key');
$b->query_safe("SELECT lockfence.etcd_unlock('$d3')");
$b->query_safe('RESET lockfence.etcd_endpoints');
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET lockfence.etcd_endpoints; SELECT pg_reload_conf()');
$node->poll_query_until('postgres',
	"SELECT current_setting('lockfence.etcd_endpoints') = '" . $etcd->endpoints . "'")
  or die 'the reset of lockfence.etcd_endpoints was not seen';

# --- exit revokes the session leases ----------------------------------------

my ($e1, $el) = lock_row($b, "lockfence.etcd_lock('exit', 60)");
$b->quit;
ok(LockfenceTest::EtcdCluster::poll_until(5, sub { !lease_alive(lease_hex($el)) }),
	'the session lease is revoked when the backend exits');

$s->quit;
$p->quit;
$node->stop;
$etcd->stop;
done_testing();
