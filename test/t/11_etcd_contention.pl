
# etcd locks under contention: FIFO among three waiting sessions, and
# mutual exclusion with `etcdctl lock` in both directions.

use strict;
use warnings;

use File::Spec;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'contention');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('etcd_contention',
	"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n");

# The key under NAME/ with the lowest create_revision holds the lock.
sub holder_key
{
	my ($name) = @_;
	my $best;
	my $best_rev;
	foreach my $k ($etcd->keys("$name/"))
	{
		my $info = $etcd->key_info($k) or next;
		if (!defined $best_rev || $info->{create_revision} < $best_rev)
		{
			$best = $k;
			$best_rev = $info->{create_revision};
		}
	}
	return $best;
}

# --- FIFO among three waiting sessions -----------------------------------

my $h = LockfenceTest::EtcdCluster::session($node);
my $hkey = $h->query_safe("SELECT key FROM lockfence.etcd_lock('fifo')");
chomp $hkey;

my @w;
for my $i (0 .. 2)
{
	$w[$i] = LockfenceTest::EtcdCluster::session($node);
	LockfenceTest::EtcdCluster::send_query($w[$i],
		"SELECT key || '|' || token FROM lockfence.etcd_lock('fifo');");
	ok($etcd->wait_for_keys('fifo/', $i + 2), "waiter $i queued its key");
}

$h->query_safe("SELECT lockfence.etcd_unlock('$hkey')");

my @tokens;
for my $i (0 .. 2)
{
	my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($w[$i], 60);
	my ($k, $t) = split /\|/, $out;
	ok(defined $t && $t =~ /^\d+$/, "waiter $i acquired the lock")
	  or diag("stdout: $out\nstderr: $err");
	is(holder_key('fifo'), $k, "waiter $i is the holder in etcd");

	# the later waiters must still be waiting
	usleep(300_000);
	for my $j ($i + 1 .. 2)
	{
		my ($o, $e) = LockfenceTest::EtcdCluster::peek_output($w[$j]);
		is($o, '', "waiter $j still waits while waiter $i holds the lock");
	}
	push @tokens, $t;
	$w[$i]->query_safe("SELECT lockfence.etcd_unlock('$k')");
}
ok($tokens[0] < $tokens[1] && $tokens[1] < $tokens[2],
	"tokens follow the queue order (@tokens)");
is_deeply([ $etcd->keys('fifo/') ], [], 'no key left after the queue drained');

# --- etcdctl holds, lockfence waits ----------------------------------------

my $dir = PostgreSQL::Test::Utils::tempdir('ctl');
my $release = File::Spec->catfile($dir, 'release');
my $ctl = $etcd->start_etcdctl_lock('ctl1',
	"while [ ! -e '$release' ]; do sleep 0.05; done");
ok(LockfenceTest::EtcdCluster::wait_for_output($ctl, qr/LOCKED/, 30),
	'etcdctl lock holds ctl1');

LockfenceTest::EtcdCluster::send_query($w[0],
	"SELECT key || '|' || token FROM lockfence.etcd_lock('ctl1');");
ok($etcd->wait_for_keys('ctl1/', 2), 'lockfence waiter queued behind etcdctl');
usleep(300_000);
my ($o1) = LockfenceTest::EtcdCluster::peek_output($w[0]);
is($o1, '', 'lockfence waits while etcdctl holds the lock');

open(my $fh, '>', $release) or die "could not create $release: $!";
close $fh;
my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($w[0], 60);
my ($k1, $t1) = split /\|/, $out;
ok(defined $t1 && $t1 =~ /^\d+$/, 'lockfence acquired after etcdctl released')
  or diag("stdout: $out\nstderr: $err");
is(holder_key('ctl1'), $k1, 'lockfence key is now the holder');
is($etcd->key_info($k1)->{create_revision}, $t1,
	'token is the create_revision of the key');
$ctl->{handle}->finish;
$w[0]->query_safe("SELECT lockfence.etcd_unlock('$k1')");

# --- lockfence holds, etcdctl waits ----------------------------------------

my $k2 = $w[1]->query_safe("SELECT key FROM lockfence.etcd_lock('ctl2')");
chomp $k2;
my $ctl2 = $etcd->start_etcdctl_lock('ctl2', 'true');
ok($etcd->wait_for_keys('ctl2/', 2), 'etcdctl queued behind lockfence');
ok(!LockfenceTest::EtcdCluster::wait_for_output($ctl2, qr/LOCKED/, 0.5),
	'etcdctl waits while lockfence holds the lock');
$w[1]->query_safe("SELECT lockfence.etcd_unlock('$k2')");
ok(LockfenceTest::EtcdCluster::wait_for_output($ctl2, qr/LOCKED/, 30),
	'etcdctl acquired after lockfence released');
$ctl2->{handle}->finish;
ok(LockfenceTest::EtcdCluster::poll_until(10, sub { !$etcd->keys('ctl2/') }),
	'etcdctl released its key');

$_->quit for ($h, @w);
$node->stop;
done_testing();
