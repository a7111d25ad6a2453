# Copyright: the lockfence authors
#
# 85_patroni_failover_floor.pl
#	  A lossy Patroni failover, closed by the on_role_change callback
#	  (scripts/patroni-on-role-change.sh) raising the fences to the etcd
#	  revision.
#
# Debian's Patroni (3.0) with a real etcd (Debian's 3.4, v3 API: Patroni's
# etcd3 support) as its DCS, two PostgreSQL nodes in asynchronous streaming
# replication.  Tokens come from real etcd locks
# (lockfence.etcd_lock_and_fence against a second etcd, the application's).
# The standby is held behind: its walreceiver is stopped (SIGSTOP) while
# the primary advances the fences and rejects superseded tokens with
# LF001; then the primary is killed (Patroni and PostgreSQL, SIGKILL) and
# the stopped walreceiver too (SIGKILL: the WAL already in its socket is
# discarded, as WAL never sent would be), so the advances are lost.  Patroni
# promotes the standby, the callback raises the fences, and afterwards no
# token rejected before the failover is accepted, by fence(), try_fence()
# or a protected INSERT; a lock acquired afterwards works.  Writers present
# superseded tokens continuously from the kill until the floor: the
# promoted server refuses them with LF004 until the callback ran (0
# accepted).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run ();
use POSIX ();
use Time::HiRes qw(usleep time);
use File::Spec;

use LockfenceTest::EtcdCluster;

my $callback = File::Spec->rel2abs('scripts/patroni-on-role-change.sh');
ok(-x $callback, 'callback script is executable');
ok(-x '/usr/bin/patroni', 'Patroni is installed (scripts/install-deps.sh)')
  or BAIL_OUT('patroni is missing: run scripts/install-deps.sh');
my ($pver) = `/usr/bin/patroni --version 2>&1` =~ /(\d+\.\d+\.\d+)/;
note("Patroni $pver");

my $bindir = `pg_config --bindir`;
chomp $bindir;

# Two etcd clusters, as the README advises: Patroni's DCS, and the one the
# application locks (and so the floor) come from.
my $dcs = LockfenceTest::EtcdCluster->new(members => 1, name => 'dcs');
$dcs->start;
(my $etcd_hostport = $dcs->endpoints) =~ s{^https?://}{};
my $locks = LockfenceTest::EtcdCluster->new(members => 1, name => 'locks');
$locks->start;
my $etcd_url = $locks->endpoints;

my $dir = PostgreSQL::Test::Utils::tempdir;
my $sockdir = PostgreSQL::Test::Utils::tempdir_short;
my $scope = 'lf85';

# Patroni processes started here (pid => node); END stops them and any
# postmaster they leave behind.
my %patroni_pids;
my @nodes;

for my $n (1, 2)
{
	my $node = {
		name => "node$n",
		rest_port => LockfenceTest::EtcdCluster::free_port(),
		pg_port => LockfenceTest::EtcdCluster::free_port(),
		data_dir => "$dir/data$n",
		yml => "$dir/node$n.yml",
		log => "$dir/patroni$n.log",
		cb_log => "$dir/callback$n.log",
	};
	open my $fh, '>', $node->{yml} or die "cannot write $node->{yml}: $!";
	print $fh <<"YML";
scope: $scope
name: $node->{name}
restapi:
  listen: 127.0.0.1:$node->{rest_port}
  connect_address: 127.0.0.1:$node->{rest_port}
etcd3:
  hosts: $etcd_hostport
bootstrap:
  dcs:
    # Short, for a quick failover, with room for a loaded machine
    # (Patroni wants loop_wait + 2 * retry_timeout <= ttl).
    ttl: 15
    loop_wait: 1
    retry_timeout: 5
    # The standby is far behind on purpose: let Patroni promote it.
    maximum_lag_on_failover: 1073741824
    synchronous_mode: false
    postgresql:
      use_pg_rewind: false
      parameters:
        wal_level: replica
        max_wal_senders: 5
        synchronous_commit: local
  initdb:
    - encoding: UTF8
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$node->{pg_port}
  connect_address: 127.0.0.1:$node->{pg_port}
  data_dir: $node->{data_dir}
  bin_dir: $bindir
  pgpass: $dir/pgpass$n
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
  parameters:
    unix_socket_directories: '$sockdir'
  callbacks:
    on_role_change: env PGHOST=127.0.0.1 PGPORT=$node->{pg_port} PGUSER=postgres LOCKFENCE_TIMEOUT=60 LOCKFENCE_LOG=$node->{cb_log} $callback
YML
	close $fh;
	push @nodes, $node;
}

sub start_patroni
{
	my ($node) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDOUT, '>>', $node->{log} or POSIX::_exit(1);
		open STDERR, '>&', \*STDOUT or POSIX::_exit(1);
		exec('/usr/bin/patroni', $node->{yml}) or POSIX::_exit(1);
	}
	$node->{pid} = $pid;
	$patroni_pids{$pid} = $node;
	return;
}

sub postmaster_pid
{
	my ($node) = @_;
	open my $fh, '<', "$node->{data_dir}/postmaster.pid" or return undef;
	my $pid = <$fh>;
	close $fh;
	chomp $pid if defined $pid;
	return ($pid && kill(0, $pid)) ? $pid : undef;
}

# Stop what this test started, whatever happened: Patroni first (SIGTERM
# stops its PostgreSQL too), then SIGKILL for anything left.
END
{
	my $rc = $?;
	for my $pid (keys %patroni_pids)
	{
		kill 'TERM', $pid;
	}
	my $deadline = time + 30;
	while (time < $deadline && grep { waitpid($_, POSIX::WNOHANG()) == 0 } keys %patroni_pids)
	{
		usleep(100_000);
	}
	for my $pid (keys %patroni_pids)
	{
		kill 'KILL', $pid if waitpid($pid, POSIX::WNOHANG()) == 0;
		waitpid($pid, 0);
	}
	for my $node (@nodes)
	{
		my $pm = postmaster_pid($node);
		kill 'QUIT', $pm if $pm;
	}
	$? = $rc;
}

# psql against a node over TCP: (ok, stdout, stderr, sqlstate).
sub psql_at
{
	my ($node, $sql) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[
			"$bindir/psql", '-X', '-A', '-t', '-q',
			'-h', '127.0.0.1', '-p', $node->{pg_port}, '-U', 'postgres',
			'-d', 'postgres', '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
			'-c', '\set VERBOSITY verbose', '-c', $sql
		],
		'>', \$out, '2>', \$err,
		IPC::Run::timeout(60));
	chomp $out;
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($ok, $out, $err, $state // '');
}

sub safe_at
{
	my ($node, $sql) = @_;
	my ($ok, $out, $err) = psql_at($node, $sql);
	die "SQL failed on $node->{name}: $sql\n$err" unless $ok;
	return $out;
}

sub wait_for
{
	my ($what, $seconds, $code) = @_;
	my $ok = LockfenceTest::EtcdCluster::poll_until($seconds, $code);
	unless ($ok)
	{
		for my $node (@nodes)
		{
			diag("--- $node->{name} Patroni log (tail)");
			diag(slurp_tail($node->{log}, 40));
		}
	}
	return ok($ok, $what);
}

sub slurp_tail
{
	my ($file, $lines) = @_;
	open my $fh, '<', $file or return "(no $file)";
	my @l = <$fh>;
	close $fh;
	return join('', @l[ ($#l - $lines + 1 < 0 ? 0 : $#l - $lines + 1) .. $#l ]);
}

sub in_recovery
{
	my ($node) = @_;
	my ($ok, $out) = psql_at($node, 'SELECT pg_is_in_recovery()');
	return $ok ? $out : '';
}

my ($n1, $n2) = @nodes;

# --- the cluster: node1 bootstraps and leads, node2 streams ---------------

start_patroni($n1);
wait_for('node1 bootstraps and leads', 120,
	sub { in_recovery($n1) eq 'f' }) or BAIL_OUT('node1 did not start');

safe_at($n1, 'CREATE EXTENSION lockfence');
safe_at($n1,
	"ALTER DATABASE postgres SET lockfence.etcd_endpoints = '$etcd_url'");
safe_at($n1,
	    'CREATE TABLE orders (id serial PRIMARY KEY, token bigint); '
	  . "SELECT lockfence.protect('orders', resource => 'orders', token_column => 'token')"
);

start_patroni($n2);
wait_for('node2 is a streaming standby', 120,
	sub { in_recovery($n2) eq 't' && (psql_at($n2, 'SELECT status FROM pg_stat_wal_receiver'))[1] eq 'streaming' })
  or BAIL_OUT('node2 did not start');

my @resources = ('jobs-a', 'jobs-b', 'orders');

# One holder's turn: acquire the etcd lock, fence the resource with its
# token (and write a row under it, for the protected table), release.
sub hold_once
{
	my ($node, $resource) = @_;
	my $sql = "SELECT lockfence.etcd_lock_and_fence('lock-$resource', '$resource', 30)";
	$sql = "BEGIN; $sql; INSERT INTO orders (token) SELECT lockfence.current_token('orders'); "
	  . "SELECT lockfence.current_token('orders'); COMMIT"
	  if $resource eq 'orders';
	my $out = safe_at($node, $sql);
	my ($token) = $out =~ /(\d+)\s*$/;
	return $token;
}

# Replicated: one turn per resource, then wait for node2 to replay it all.
my %replicated;
$replicated{$_} = hold_once($n1, $_) for @resources;
my $lsn = safe_at($n1, 'SELECT pg_current_wal_lsn()');
wait_for('node2 replayed the first fences', 60,
	sub { (psql_at($n2, "SELECT pg_last_wal_replay_lsn() >= '$lsn'"))[1] eq 't' });
for my $r (@resources)
{
	is(safe_at($n2, "SELECT lockfence.current_token('$r')"),
		$replicated{$r}, "standby has the fence of $r at $replicated{$r}");
}

# --- the standby held behind ----------------------------------------------

my $walreceiver = safe_at($n2, 'SELECT pid FROM pg_stat_wal_receiver');
ok($walreceiver =~ /^\d+$/, "walreceiver of node2 is $walreceiver");
kill 'STOP', $walreceiver;

# Fences advance on the primary; each superseded token is presented again
# and rejected there with LF001 (by fence() and by a protected INSERT).
my @rejected;
for my $round (1 .. 3)
{
	for my $r (@resources)
	{
		my $before = $round == 1 ? $replicated{$r}
		  : safe_at($n1, "SELECT lockfence.current_token('$r')");
		my $token = hold_once($n1, $r);
		ok($token > $before, "primary: $r advanced from $before to $token");
		my ($ok, $out, $err, $state) =
		  psql_at($n1, "SELECT lockfence.fence('$r', $before)");
		is($state, 'LF001', "primary rejects superseded token $before of $r");
		push @rejected, [ $r, $before ];
	}
}
my ($iok, $iout, $ierr, $istate) = psql_at($n1,
	"INSERT INTO orders (token) VALUES ($replicated{orders})");
is($istate, 'LF001', 'primary rejects a protected INSERT with a superseded token');

my %primary_fence = map { $_ => safe_at($n1, "SELECT lockfence.current_token('$_')") } @resources;
for my $r (@resources)
{
	is(safe_at($n2, "SELECT lockfence.current_token('$r')"),
		$replicated{$r}, "standby is behind: still $replicated{$r} for $r (primary: $primary_fence{$r})");
}

# --- failover ---------------------------------------------------------------

my $pm1 = postmaster_pid($n1);
my @pm1_children = split ' ', `ps -o pid= --ppid $pm1`;
kill 'KILL', $n1->{pid};
waitpid($n1->{pid}, 0);
delete $patroni_pids{ $n1->{pid} };
kill 'KILL', $pm1, @pm1_children;
note("killed node1: Patroni $n1->{pid}, postmaster $pm1, children @pm1_children");
kill 'KILL', $walreceiver;
my $t_kill = time;

# Writers with superseded tokens, continuously from the kill until the
# callback raised the floor: fence(), try_fence() and a protected INSERT,
# each in its own connection (as a read-write connection string would
# reach whichever node is writable).  Before the promotion node2 refuses
# them as a standby (25006) or is restarting; from the promotion on it
# refuses them with LF004 (issue 23: no window before the floor); once the
# floor is raised, with LF001.  None may succeed.
my ($last_orders_sup) = map { $_->[1] } grep { $_->[0] eq 'orders' } reverse @rejected;
my %window;
my ($window_accepted, $t_promoted, $t_first_floor) = (0, undef, undef);
my $stop_at = time + 180;
for (my $i = 0; time < $stop_at; $i++)
{
	my ($r, $t) = @{ $rejected[ $i % @rejected ] };
	my $sql = ("SELECT lockfence.fence('$r', $t)",
		"SELECT CASE WHEN lockfence.try_fence('$r', $t) THEN 'accepted' ELSE 'refused' END",
		"INSERT INTO orders (token) VALUES ($last_orders_sup)")[ $i % 3 ];
	my ($ok, $out, $err, $state) = psql_at($n2, $sql);
	my $what = $ok ? ($out eq 'refused' ? 'LF001' : 'accepted') : ($state || 'no answer');
	$window{$what}++;
	$window_accepted++ if $what eq 'accepted';
	$t_promoted //= time if $what eq 'LF004' || $what eq 'LF001' || $what eq 'accepted';
	if ($what eq 'LF001')
	{
		$t_first_floor = time;
		last;
	}
	usleep(20_000) unless $state eq 'LF004';
}
note('superseded-token writes through the failover: '
	  . join(', ', map { "$_=$window{$_}" } sort keys %window));
is($window_accepted, 0,
	'no superseded-token write accepted from the kill until the floor (fence, try_fence, INSERT)');
ok(defined $t_first_floor, 'the writers met the floor (LF001) within 180 s');
note(sprintf('node2 writable %.1f s after the kill; the floor rejected writers %.2f s after that',
	($t_promoted // time) - $t_kill, ($t_first_floor // time) - ($t_promoted // time)));

wait_for('Patroni promotes node2', 120, sub { in_recovery($n2) eq 'f' })
  or BAIL_OUT('no promotion');
$t_promoted //= time;
note(sprintf('node2 promoted %.1f s after the kill', $t_promoted - $t_kill));
# How long writers could reach the new primary before the floor (the
# window the documentation mentions), as seen by a client.
LockfenceTest::EtcdCluster::poll_until(90, sub {
	(psql_at($n2, "SELECT lockfence.current_token('jobs-a') > $replicated{'jobs-a'}"))[1] eq 't' });
note(sprintf('fences raised %.2f s after the promotion was visible', time - $t_promoted));

my $cb_line;
wait_for('the on_role_change callback raised the fences', 90, sub {
	open my $fh, '<', $n2->{cb_log} or return 0;
	($cb_line) = grep { /database "postgres": floor=\d+ raised=\d+/ } <$fh>;
	close $fh;
	return defined $cb_line;
});
note("callback: $cb_line") if $cb_line;
my ($floor, $raised) = ($cb_line // '') =~ /floor=(\d+) raised=(\d+)/;
$floor //= 0;
is($raised, scalar @resources, 'the callback raised every fence');

# The failover was lossy: the fences the standby knew accept every token
# the old primary rejected; only the floor makes them stale again.
for my $r (@resources)
{
	cmp_ok($primary_fence{$r}, '>', $replicated{$r},
		"advances of $r were lost: primary had $primary_fence{$r}, standby $replicated{$r}");
}
cmp_ok(scalar(grep { $_->[1] >= $replicated{ $_->[0] } } @rejected), '>', 0,
	'tokens rejected before the failover would pass the fences the standby had');

# --- afterwards: no token rejected before the failover is accepted ---------

# The newest superseded token of the protected table first: above the
# fence the standby had, a row carrying it would advance that fence.
my ($last_orders) = map { $_->[1] } grep { $_->[0] eq 'orders' } reverse @rejected;
($iok, $iout, $ierr, $istate) = psql_at($n2,
	"INSERT INTO orders (token) VALUES ($last_orders)");
is($istate, 'LF001',
	"a protected INSERT with superseded token $last_orders is rejected after the failover");

my $accepted = 0;
for my $rt (@rejected)
{
	my ($r, $t) = @$rt;
	my ($ok, $out, $err, $state) = psql_at($n2, "SELECT lockfence.fence('$r', $t)");
	$accepted++ if $state ne 'LF001';
	$accepted++ if safe_at($n2, "SELECT lockfence.try_fence('$r', $t)") ne 'f';
}
is($accepted, 0,
	scalar(@rejected) . ' tokens rejected before the failover: all rejected after it (LF001)');
for my $r (@resources)
{
	is(safe_at($n2, "SELECT lockfence.current_token('$r')"), $floor,
		"fence of $r is the floor $floor");
	cmp_ok($floor, '>', $primary_fence{$r},
		"floor is above every token issued before ($r: $primary_fence{$r})");
}

# A holder acquires its lock again and gets a token above the floor.
my $fresh = hold_once($n2, 'jobs-a');
cmp_ok($fresh, '>=', $floor, "a lock acquired after the failover is accepted (token $fresh)");

# The callback is safe to run twice: fences only rise.  (A second etcd
# floor is newer, so the holder above must acquire its lock again.)
my ($cout, $cerr);
my $crc = IPC::Run::run(
	[ 'env', 'PGHOST=127.0.0.1', "PGPORT=$n2->{pg_port}", 'PGUSER=postgres',
	  'LOCKFENCE_TIMEOUT=30', $callback, 'on_role_change', 'master', $scope ],
	'>', \$cout, '2>', \$cerr);
ok($crc, 'callback run a second time succeeds');
like($cerr, qr/database "postgres": floor=\d+ raised=\d+/, '... and logs what it did');
my ($floor2) = $cerr =~ /floor=(\d+)/;
cmp_ok($floor2 // 0, '>=', $floor, 'second floor is not lower');
is(safe_at($n2, 'SELECT count(*) FROM lockfence.fences WHERE token < ' . ($floor2 // 0)),
	0, 'no fence below the second floor');
my ($ok2, $o2, $e2, $s2) = psql_at($n2, "SELECT lockfence.fence('jobs-a', $fresh)");
is($s2, 'LF001', 'a token from before the second floor must re-acquire (LF001)');

# Other roles and actions: nothing to do.
$crc = IPC::Run::run(
	[ 'env', 'PGHOST=127.0.0.1', "PGPORT=$n2->{pg_port}", $callback,
	  'on_role_change', 'replica', $scope ],
	'>', \$cout, '2>', \$cerr);
ok($crc && $cerr =~ /nothing to do/, 'callback for the replica role does nothing');

done_testing();
