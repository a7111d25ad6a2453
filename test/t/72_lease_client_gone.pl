# Copyright: lockfence contributors
#
# 72_lease_client_gone.pl: a client killed while it waits in
# lease_acquire() does not get the lease (issue 23, item 6), whether it
# waits for the lease's expiry or (1.9) for a transaction that fenced the
# expired token.
#
# Its backend notices the closed connection after its next sleep (at most
# a second) and ends with "connection to client lost", without
# client_connection_check_interval; before, it waited on, was granted the
# lease when the holder released it, and the next client waited the whole
# TTL of a lease nobody used.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;    # session helpers only; no etcd here

my $node = LockfenceTest::EtcdCluster::pg_node('lease_client_gone',
	"shared_preload_libraries = 'lockfence'\n");

sub S { return LockfenceTest::EtcdCluster::session($node); }

sub backend_alive
{
	my ($pid) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE pid = $pid") eq '1';
}

# Poll cond for up to $seconds; true as soon as it holds.
sub eventually
{
	my ($cond, $seconds) = @_;
	my $until = time + $seconds;
	while (time < $until)
	{
		return 1 if $cond->();
		usleep(100_000);
	}
	return $cond->();
}

my $holder = S();
my $token = $holder->query_safe(
	"SELECT token FROM lockfence.lease_acquire('gone', '60 s', holder => 'h1')");
chomp $token;
is($token, '1', 'the holder has the lease');

for my $round (1 .. 2)
{
	my $w = S();
	my $pid = $w->{pid};
	LockfenceTest::EtcdCluster::send_query($w,
		"SELECT token FROM lockfence.lease_acquire('gone', '60 s', holder => 'ghost$round');");
	ok( eventually(
			sub {
				$node->safe_psql('postgres',
					"SELECT wait_event_type FROM pg_stat_activity WHERE pid = $pid")
				  eq 'Extension';
			},
			30),
		"round $round: the waiter waits for the lease");

	# The client dies (SIGKILL of psql): its socket closes.
	$w->{run}->signal('KILL');
	$w->{run}->kill_kill;
	my $t0 = time;
	ok(eventually(sub { !backend_alive($pid) }, 15),
		"round $round: the killed waiter's backend ends");
	note sprintf('round %d: ended %.2f s after the kill', $round, time - $t0);
}

like(slurp_file($node->logfile), qr/connection to client lost/,
	'the server log says why');

# The holder releases: the next client is granted at once, not after a
# ghost's TTL.
$holder->query_safe("SELECT lockfence.lease_release('gone', $token)");
my ($rc, $out, $err) = $node->psql('postgres',
	"SELECT token FROM lockfence.lease_acquire('gone', '10 s', holder => 'h2', wait_timeout => '5 s')");
is($rc, 0, 'the next client is granted the lease') or diag $err;
is($node->safe_psql('postgres', "SELECT holder FROM lockfence.fences WHERE resource = 'gone'"),
	'h2', '... and holds it; no killed waiter ever did');

# The other wait: the lease has expired, but a transaction that fenced its
# token is still open, so the waiter waits in PostgreSQL's lock manager
# for the resource, which does not look at the client.  Its client is
# killed there; when the fencing transaction commits, the waiter is
# granted, sees its client gone, and ends, rolling the grant back (1.9;
# before, it kept the lease for its whole TTL, nobody using it).
# The lease's TTL must outlast the fencer's start and its fence, which a
# loaded machine can stretch past a second (run b1s50: LF003 at the fence
# on 17): a lease that expired first is taken again with twice the TTL.
my ($old, $fencer);
for my $ttl (1, 2, 4, 8, 16)
{
	$old = $node->safe_psql('postgres',
		"SELECT token FROM lockfence.lease_acquire('gone-locked', '$ttl s', holder => 'a')");
	$fencer = S();
	my ($out, $failed) = $fencer->query("BEGIN; SELECT lockfence.fence('gone-locked', $old, 'a');");
	last unless $failed;
	like($fencer->{stderr}, qr/LF003: lease for resource "gone-locked" is no longer held/,
		"the $ttl s lease expired before its fence (a slow machine): taken again");
	$fencer->quit;
	$fencer = undef;
}
ok(defined $fencer, 'a transaction fenced the lease\'s token');
ok( eventually(
		sub {
			$node->safe_psql('postgres',
				"SELECT lease_expires_at < now() FROM lockfence.fences WHERE resource = 'gone-locked'") eq 't';
		},
		30),
	'the lease has expired, its fencing transaction still open');
my $w = S();
my $wpid = $w->{pid};
LockfenceTest::EtcdCluster::send_query($w,
	"SELECT token FROM lockfence.lease_acquire('gone-locked', '10 min', holder => 'ghost-locked');");
ok( eventually(
		sub {
			$node->safe_psql('postgres',
				"SELECT wait_event_type FROM pg_stat_activity WHERE pid = $wpid") eq 'Lock';
		},
		30),
	'the waiter waits for the fencing transaction (a lock wait)');
$w->{run}->signal('KILL');
$w->{run}->kill_kill;
$fencer->query_safe('COMMIT');
ok(eventually(sub { !backend_alive($wpid) }, 15),
	'once the fencing transaction commits, the killed waiter\'s backend ends');
is( $node->safe_psql('postgres',
		"SELECT token || ' ' || holder FROM lockfence.fences WHERE resource = 'gone-locked'"),
	"$old a", '... and its grant was rolled back: nobody holds the lease');
is( $node->safe_psql('postgres',
		"SELECT token FROM lockfence.lease_try_acquire('gone-locked', '10 s', holder => 'h3')"),
	$old + 1, 'the next client is granted the lease at once');
$fencer->quit;

$holder->quit;
$node->stop;
done_testing();
