# Copyright: lockfence contributors
#
# 73_lease_pool_starvation.pl: waiting for a lease behind a real pgbouncer
# (Debian's) in transaction pooling, 2 server connections, lease TTL 6 s.
#
# (a) The hazard the README warns about: two clients waiting in
#     lease_acquire(..., wait_timeout => '60 s') each pin a server
#     connection for their whole wait, so the holder's lease_renew through
#     the same pgbouncer queues in the pooler, not on the server, while its
#     lease is still alive; it runs only once a waiter has taken the lease
#     at its expiry, and fails with LF003: the holder lost a lease it
#     renewed in time.
# (b) The documented pattern: waiters loop lease_try_acquire with a
#     client-side back-off (200 ms), so they hold a server connection only
#     for a few milliseconds at a time.  The holder renews every 1.5 s over
#     more than two TTLs, each renewal through the pooler ends in under a
#     second, the lease is never lost, and after the holder's release a
#     waiter gets the next token.  A server-side wait in the waiters' loop
#     (lease_acquire with a wait) makes the holder's renewals wait as in (a)
#     and fails the bound.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;
use LockfenceTest::Node qw(init_node);

my $pool_size = 2;
my $ttl = '6 s';

my ($pgbouncer) = grep { -x $_ } map { "$_/pgbouncer" } (split(/:/, $ENV{PATH}), '/usr/sbin');
ok($pgbouncer, 'pgbouncer is installed (Debian package pgbouncer)')
  or BAIL_OUT('pgbouncer missing: run scripts/install-deps.sh');

my $node = PostgreSQL::Test::Cluster->new('lease_pool');
init_node($node);
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'lockfence'\nlog_min_messages = warning\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION lockfence');

# pgbouncer, transaction pooling, 2 server connections and no reserve.
my $dir = PostgreSQL::Test::Utils::tempdir();
my $port = LockfenceTest::EtcdCluster::free_port();
my $user = $ENV{USER} || getpwuid($<);
append_to_file("$dir/userlist.txt", qq{"$user" ""\n});
append_to_file("$dir/pgbouncer.ini", <<EOF);
[databases]
postgres = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = $user
pool_mode = transaction
default_pool_size = $pool_size
reserve_pool_size = 0
max_client_conn = 50
logfile = $dir/pgbouncer.log
EOF
my $bouncer = IPC::Run::start([ $pgbouncer, "$dir/pgbouncer.ini" ],
	'>', "$dir/stdout", '2>', "$dir/stderr");
my @waiters;
END
{
	$_->kill_kill for grep { $_->pumpable } @waiters;
	$bouncer->kill_kill if $bouncer && $bouncer->pumpable;
}

my @conn = ('-h', '127.0.0.1', '-p', $port, '-U', $user, '-d', 'postgres');

# One statement through pgbouncer; returns (ok, stdout, stderr).
sub pooled
{
	my ($sql) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
			@conn, '-c', $sql ],
		'>', \$out, '2>', \$err);
	chomp $out;
	return ($ok, $out, $err);
}

my $deadline = time + 30;
my $answer = '';
while (time < $deadline)
{
	(undef, $answer) = pooled('SELECT 1');
	last if $answer eq '1';
	usleep(100_000);
}
is($answer, '1', 'pgbouncer answers') or diag slurp_file("$dir/pgbouncer.log");

# Clients waiting in pgbouncer for a server connection (SHOW POOLS).
sub clients_waiting
{
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[ 'psql', '-XAtq', '-F', ' ', '-h', '127.0.0.1', '-p', $port,
			'-U', $user, '-d', 'pgbouncer', '-c', 'SHOW POOLS' ],
		'>', \$out, '2>', \$err);
	# database user cl_active cl_waiting ...
	my ($line) = grep { /^postgres / } split /\n/, $out;
	return defined $line ? (split / /, $line)[3] : -1;
}

# --- (a) waiters in lease_acquire starve the holder's renewal --------------

my ($ok, $tok) = pooled(
	"SELECT token FROM lockfence.lease_acquire('hazard', '$ttl', 'holder')");
ok($ok && $tok =~ /^\d+$/, "the holder takes lease 'hazard' through pgbouncer");

my @hazard;
for my $i (1, 2)
{
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ 'psql', '-XAtq', @conn, '-c',
			"SELECT token FROM lockfence.lease_acquire('hazard', '$ttl', 'waiter-$i', wait_timeout => '60 s')" ],
		'>', \$out, '2>', \$err);
	push @waiters, $h;
	push @hazard, { h => $h, out => \$out, err => \$err };
}
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) = 2 FROM pg_stat_activity
		WHERE state = 'active' AND query LIKE '%lease_acquire(''hazard''%'}),
	'both waiters wait in lease_acquire, each on a pooled server connection');

# A full TTL left, renewed over a direct connection (no pool): the renewal
# through pgbouncer below is made well before the lease expires.
$node->safe_psql('postgres', "SELECT lockfence.lease_renew('hazard', $tok)");
my ($renew_out, $renew_err) = ('', '');
my $renew_started = time;
my $renew = IPC::Run::start(
	[ 'psql', '-XAtq', '-v', 'VERBOSITY=verbose', @conn, '-c',
		"SELECT lockfence.lease_renew('hazard', $tok)" ],
	'>', \$renew_out, '2>', \$renew_err);
push @waiters, $renew;

# The renewal is queued in pgbouncer, not running on the server.
my $queued = 0;
while (time < $renew_started + 10)
{
	last if $queued = (clients_waiting() >= 1);
	usleep(50_000);
}
ok($queued, "the holder's lease_renew waits in pgbouncer for a server connection");
usleep(1_000_000);
$renew->pump_nb if $renew->pumpable;
my $left = $node->safe_psql('postgres', q{
	SELECT extract(epoch FROM lease_expires_at - clock_timestamp())
	FROM lockfence.fences WHERE resource = 'hazard'});
my $busy = $node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE query LIKE '%lease_acquire(''hazard''%')
	       || ' ' || count(*) FILTER (WHERE query LIKE '%lease_renew(''hazard''%')
	FROM pg_stat_activity WHERE state = 'active'});
my $still = $renew->pumpable;
my $blocked = time - $renew_started;
ok($still, sprintf('after %.2f s the renewal has not run', $blocked));
is($busy, '2 0', 'meanwhile both server connections run the waiters, none the renewal');
ok($left > 0, sprintf('while the lease still has %.2f s left', $left));

# It runs only when a waiter has taken the lease at its expiry: too late.
$renew->finish;
my $renew_took = time - $renew_started;
like($renew_err, qr/LF003/,
	sprintf('the renewal ran after %.2f s and failed with LF003: the lease was lost', $renew_took));
cmp_ok($renew_took, '>', 1, 'the renewal waited more than a second');

# Tidy up: the waiter left waits for the winner's lease; release it.
my @won;
$deadline = time + 30;
while (time < $deadline)
{
	$_->{h}->pump_nb for grep { $_->{h}->pumpable } @hazard;
	last if @won = grep { ${ $_->{out} } =~ /^\d+$/m } @hazard;
	usleep(50_000);
}
is(scalar @won, 1, 'one waiter got the lease');
my $next = $tok + 1;
is($node->safe_psql('postgres', "SELECT lockfence.lease_release('hazard', $next)"),
	't', "the winner's token is $next");
$_->{h}->finish for @hazard;
is(join(' ', sort map { ${ $_->{out} } =~ s/\s+//gr } @hazard), "$next " . ($next + 1),
	'the other waiter got the next one after the release');
$node->safe_psql('postgres', "SELECT lockfence.lease_release('hazard', $next + 1)");
@waiters = ();

# --- (b) lease_try_acquire with a client-side back-off ----------------------

# The pattern as a client would write it (here in the shell): try, and if
# the lease is held, sleep in the client, never in the server.
my $try_loop = <<'EOS';
while :; do
	echo try
	tok=$(psql -XAtq "$@" -c "SELECT token FROM lockfence.lease_try_acquire('pattern', '6 s', '$WAITER')") || exit 1
	if [ -n "$tok" ]; then echo "token $tok"; exit 0; fi
	sleep 0.2
done
EOS

my $front = PostgreSQL::Test::Cluster->new('lease_pool_front', port => $port);
$front->{_host} = '127.0.0.1';
my $holder = $front->background_psql('postgres', on_error_stop => 0);
my $ptok = $holder->query_safe(
	"SELECT token FROM lockfence.lease_try_acquire('pattern', '$ttl', 'holder')");
like($ptok, qr/^\d+$/, "the holder takes lease 'pattern' through pgbouncer");

my @loops;
for my $i (1, 2)
{
	my ($out, $err) = ('', '');
	local $ENV{WAITER} = "waiter-$i";
	my $h = IPC::Run::start([ 'bash', '-c', $try_loop, 'try', @conn ],
		'>', \$out, '2>', \$err);
	push @waiters, $h;
	push @loops, { h => $h, out => \$out, err => \$err };
}
sub pump_loops { $_->{h}->pump_nb for grep { $_->{h}->pumpable } @loops; }

# Wait until both loops are trying, then renew every 1.5 s (a quarter of
# the TTL) over more than two TTLs, each time through pgbouncer.
$deadline = time + 30;
while (time < $deadline)
{
	pump_loops();
	last unless grep { ${ $_->{out} } !~ /try/ } @loops;
	usleep(50_000);
}
my $pattern_started = time;
my @took;
my $lost = 0;
for my $n (1 .. 10)
{
	my $t0 = time;
	my $res = $holder->query(
		"SELECT lockfence.lease_renew('pattern', $ptok) > clock_timestamp()");
	push @took, time - $t0;
	if ($res ne 't' || $holder->{stderr} ne '')
	{
		$lost++;
		diag "renewal $n: $holder->{stderr}";
		$holder->{stderr} = '';
	}
	pump_loops();
	usleep(1_500_000);
}
my $span = time - $pattern_started;
my $max = (sort { $b <=> $a } @took)[0];
note sprintf('renewals took %s s', join(' ', map { sprintf '%.3f', $_ } @took));
is($lost, 0, 'every renewal through pgbouncer extended the lease');
cmp_ok($max, '<', 1,
	sprintf('each of 10 renewals over %.1f s ended in under a second (longest %.3f s)', $span, $max));
cmp_ok($span, '>', 12, 'the renewals spanned more than two TTLs');

pump_loops();
is(scalar(grep { ${ $_->{out} } =~ /token/ } @loops), 0,
	'no waiter got the lease while the holder renewed it');
my @tries = map { scalar(() = ${ $_->{out} } =~ /try/g) } @loops;
ok(!grep({ $_ < 10 } @tries),
	"both waiters kept trying meanwhile (@tries attempts)");

# The holder releases: a waiter gets the next token at its next try.
is($holder->query_safe("SELECT lockfence.lease_release('pattern', $ptok)"),
	't', 'the holder releases the lease');
my $released = time;
my $got;
while (time < $released + 30)
{
	pump_loops();
	($got) = map { ${ $_->{out} } =~ /^token (\d+)$/m ? ($1) : () } @loops;
	last if defined $got;
	usleep(50_000);
}
is($got, $ptok + 1, sprintf('a waiter got the lease with the next token (%.2f s after the release)',
	time - $released));
$holder->quit;

$_->{h}->kill_kill for grep { $_->{h}->pumpable } @loops;
@waiters = ();
$bouncer->kill_kill;
$node->stop;

done_testing();
