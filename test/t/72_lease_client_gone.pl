# Copyright: lockfence contributors
#
# 72_lease_client_gone.pl: a client killed while it waits in
# lease_acquire() does not get the lease (issue 23, item 6).
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

$holder->quit;
$node->stop;
done_testing();
