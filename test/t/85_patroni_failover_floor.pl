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
# the stopped walreceiver ends (SIGTERM, then SIGCONT: the WAL already in
# its socket is discarded, as WAL never sent would be), so the advances
# are lost (checked: the standby's receive LSN stays below them).  Patroni
# promotes the standby, the callback raises the fences, and afterwards no
# token rejected before the failover is accepted, by fence(), try_fence()
# or a protected INSERT; a lock acquired afterwards works.  Writers present
# superseded tokens continuously from the kill until after the floor,
# through a read-write multi-host connection string: the promoted server
# refuses them with LF004 until the callback ran (0 accepted); an honest
# holder acquiring its lock again is accepted once the floor is in place.
# LOCKFENCE_PATRONI_FAILOVERS failovers (default 1) in a row: after each,
# the old primary's data directory is removed and Patroni clones it from
# the new leader, and the roles swap.  Each failover's times and writes
# are reported (diag) for docs/ha.md.

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
use LockfenceTest::Failover;

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
			diag("--- $node->{name} Patroni log without refused connections and rejected writes (tail)");
			diag(slurp_tail($node->{log}, 80, qr/the database system is (?:shutting down|starting up|in recovery mode|not yet accepting connections)|lockfence rejected a write|^\S+ \S+ UTC \[\d+\] (?:ERROR|DETAIL|HINT|STATEMENT):/));
			diag("--- $node->{name} processes");
			diag(node_processes($node));
		}
	}
	return ok($ok, $what);
}

# The node's postmaster and its children, with their state and what they
# wait in: a promotion that does not come (e1s46: a standby "shutting
# down" for 6 minutes during Patroni's restart) shows which process holds
# the shutdown up.
sub node_processes
{
	my ($node) = @_;
	my $pm = postmaster_pid($node);
	return "(no postmaster)" unless $pm;
	return scalar `ps -o pid,ppid,stat,etime,wchan:32,args -p $pm --ppid $pm 2>&1`;
}

sub slurp_tail
{
	my ($file, $lines, $skip) = @_;
	open my $fh, '<', $file or return "(no $file)";
	my @l = <$fh>;
	close $fh;
	@l = grep { !/$skip/ } @l if $skip;
	return '' unless @l;
	return join('', @l[ ($#l - $lines + 1 < 0 ? 0 : $#l - $lines + 1) .. $#l ]);
}

sub in_recovery
{
	my ($node) = @_;
	my ($ok, $out) = psql_at($node, 'SELECT pg_is_in_recovery()');
	return $ok ? $out : '';
}

# psql through a connection string: (ok, stdout, stderr, sqlstate).
sub psql_conn { return LockfenceTest::Failover::psql_conn($bindir, @_); }

# The application's connection string: whichever node is writable.
my $rw = sprintf(
	'host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=5',
	$nodes[0]{pg_port}, $nodes[1]{pg_port});

# Lines of a node's callback log that report a floor.
sub floor_lines
{
	my ($node) = @_;
	open my $fh, '<', $node->{cb_log} or return ();
	my @l = grep { /database "postgres": floor=\d+ raised=\d+/ } <$fh>;
	close $fh;
	return @l;
}

my $failovers = $ENV{LOCKFENCE_PATRONI_FAILOVERS} // 1;
$failovers = 1 unless $failovers =~ /^[1-9]\d*$/;
note("$failovers failover(s)");

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

my @summary;
my ($primary, $standby) = ($n1, $n2);
for my $round (1 .. $failovers)
{
	note("=== failover $round of $failovers: $primary->{name} to $standby->{name}");

	# The standby: node2 at first; then the old primary, its data
	# directory removed, so that Patroni clones it from the leader again.
	if ($round > 1)
	{
		PostgreSQL::Test::Utils::system_or_bail('rm', '-rf', $standby->{data_dir});
	}
	start_patroni($standby);
	wait_for("failover $round: $standby->{name} is a streaming standby", 180,
		sub { in_recovery($standby) eq 't' && (psql_at($standby, 'SELECT status FROM pg_stat_wal_receiver'))[1] eq 'streaming' })
	  or BAIL_OUT("$standby->{name} did not start");

	# Replicated: one turn per resource, then wait for the standby to
	# replay it all.
	my %replicated;
	$replicated{$_} = hold_once($primary, $_) for @resources;
	my $lsn = safe_at($primary, 'SELECT pg_current_wal_lsn()');
	wait_for("failover $round: the standby replayed the first fences", 60,
		sub { (psql_at($standby, "SELECT pg_last_wal_replay_lsn() >= '$lsn'"))[1] eq 't' });
	for my $r (@resources)
	{
		is(safe_at($standby, "SELECT lockfence.current_token('$r')"),
			$replicated{$r}, "failover $round: standby has the fence of $r at $replicated{$r}");
	}

	# --- the standby held behind --------------------------------------------

	my $walreceiver = safe_at($standby, 'SELECT pid FROM pg_stat_wal_receiver');
	ok($walreceiver =~ /^\d+$/, "failover $round: walreceiver of $standby->{name} is $walreceiver");
	kill 'STOP', $walreceiver;

	# Fences advance on the primary; each superseded token is presented
	# again and rejected there with LF001 (by fence() and by a protected
	# INSERT).
	my @rejected;
	for my $turn (1 .. 3)
	{
		for my $r (@resources)
		{
			my $before = safe_at($primary, "SELECT lockfence.current_token('$r')");
			my $token = hold_once($primary, $r);
			ok($token > $before, "failover $round: primary: $r advanced from $before to $token");
			my ($ok, $out, $err, $state) =
			  psql_at($primary, "SELECT lockfence.fence('$r', $before)");
			is($state, 'LF001', "failover $round: primary rejects superseded token $before of $r");
			push @rejected, [ $r, $before ];
		}
	}
	my ($iok, $iout, $ierr, $istate) = psql_at($primary,
		"INSERT INTO orders (token) VALUES ($replicated{orders})");
	is($istate, 'LF001', "failover $round: primary rejects a protected INSERT with a superseded token");

	my %primary_fence = map { $_ => safe_at($primary, "SELECT lockfence.current_token('$_')") } @resources;
	for my $r (@resources)
	{
		is(safe_at($standby, "SELECT lockfence.current_token('$r')"),
			$replicated{$r}, "failover $round: standby is behind: still $replicated{$r} for $r (primary: $primary_fence{$r})");
	}
	my $floors_before = () = floor_lines($standby);
	my $primary_lsn = safe_at($primary, 'SELECT pg_current_wal_lsn()');

	# --- failover -----------------------------------------------------------

	my $pm = postmaster_pid($primary);
	my @pm_children = split ' ', `ps -o pid= --ppid $pm`;
	kill 'KILL', $primary->{pid};
	waitpid($primary->{pid}, 0);
	delete $patroni_pids{ $primary->{pid} };
	kill 'KILL', $pm, @pm_children;
	note("failover $round: killed $primary->{name}: Patroni $primary->{pid}, postmaster $pm, children @pm_children");
	# The stopped walreceiver ends without reading what waits in its
	# socket: SIGTERM is pending when it continues, and it serves that
	# before it reads (it was stopped idle, after the catch-up above).
	# Not SIGKILL: that is a child crash, and the standby's postmaster
	# restarts everything; PostgreSQL 15's postmaster then never ends a
	# fast shutdown that arrives before redo starts (it waits for a
	# checkpointer it never told to stop), and Patroni, finding the node
	# restarting, restarts it with a fast shutdown: e1s46's node2 stayed
	# "shutting down" for 6 minutes.
	kill 'TERM', $walreceiver;
	kill 'CONT', $walreceiver;
	my $t_kill = time;
	wait_for("failover $round: the stopped walreceiver ended", 30,
		sub { !kill(0, $walreceiver) });
	# ... and the advances were lost: the standby never received them.
	my $received = safe_at($standby, 'SELECT pg_last_wal_receive_lsn()');
	is(safe_at($standby, "SELECT '$received'::pg_lsn < '$primary_lsn'::pg_lsn"), 't',
		"failover $round: the standby received WAL up to $received only, not the advances up to $primary_lsn");

	# Writers with superseded tokens, continuously from the kill until
	# after the callback raised the floor: fence(), try_fence() and a
	# protected INSERT, each in its own connection through the read-write
	# connection string.  Before the promotion the standby is refused by
	# libpq (not writable) or is restarting; from the promotion on it
	# refuses them with LF004 (issue 23: no window before the floor); once
	# the floor is raised, with LF001.  None may succeed.  An honest holder
	# (acquiring its etcd lock again) tries too: accepted once the floor is
	# in place.
	my ($last_orders_sup) = map { $_->[1] } grep { $_->[0] eq 'orders' } reverse @rejected;
	my %window;
	my ($attempts, $window_accepted) = (0, 0);
	my ($t_promoted, $t_first_floor, $t_honest, $honest_token);
	my $stop_at = time + 240;
	# The promotion's time, as a client sees it: checked before each write
	# (and taken as passed once a write reached a writable server), so it
	# is late by at most one statement.
	my $check_promoted = sub {
		$t_promoted //= time if !defined $t_promoted && in_recovery($standby) eq 'f';
	};
	for (my $i = 0; time < $stop_at; $i++)
	{
		$check_promoted->();
		my ($class, $what) = LockfenceTest::Failover::superseded_write($bindir,
			$rw, \@rejected, $i, $last_orders_sup);
		$attempts++;
		$window{$class}{$what}++;
		$window_accepted++ if $what eq 'accepted';
		$t_promoted //= time if $what =~ /^(LF004|LF001|accepted)$/;
		$t_first_floor //= time if $what eq 'LF001';
		if (!defined $t_honest)
		{
			$check_promoted->();
			my ($hok, $hout) = psql_conn($rw,
				"SELECT lockfence.etcd_lock_and_fence('lock-jobs-b', 'jobs-b', 30)");
			($t_honest, $honest_token) = (time, $hout) if $hok && $hout =~ /^\d+$/;
			$t_promoted //= $t_honest if defined $t_honest;
		}
		# Writers go on a little after the floor.
		last if defined $t_honest && defined $t_first_floor
		  && time > $t_honest + 1 && time > $t_first_floor + 1;
		usleep(20_000) unless $what eq 'LF004';
	}
	my $window_text = join('; ', map {
		my $c = $_;
		"$c: " . join(', ', map { "$_=$window{$c}{$_}" } sort keys %{ $window{$c} })
	} sort keys %window);
	note("failover $round: superseded-token writes through the failover: $window_text");
	is($window_accepted, 0,
		"failover $round: none of $attempts superseded-token writes through the read-write connection string accepted (fence, try_fence, INSERT)");
	ok(defined $t_first_floor, "failover $round: the writers met the floor (LF001) within 240 s");
	ok(defined $t_honest, "failover $round: an honest write with a fresh lock was accepted (token "
		  . ($honest_token // 'none') . ')');

	wait_for("failover $round: Patroni promotes $standby->{name}", 120, sub { in_recovery($standby) eq 'f' })
	  or BAIL_OUT('no promotion');
	$t_promoted //= time;
	$t_first_floor //= time;
	$t_honest //= time;
	my $line = sprintf(
		'Patroni failover %d: writable %.1f s after the kill; first honest write accepted %.2f s after the promotion; '
		  . 'superseded LF001 from %.2f s after it; %d superseded-token writes, %d accepted (%s)',
		$round, $t_promoted - $t_kill, $t_honest - $t_promoted, $t_first_floor - $t_promoted,
		$attempts, $window_accepted, $window_text);
	diag($line);
	push @summary, $line;

	my $cb_line;
	wait_for("failover $round: the on_role_change callback raised the fences", 90, sub {
		my @l = floor_lines($standby);
		$cb_line = $l[$floors_before] if @l > $floors_before;
		return defined $cb_line;
	});
	note("callback: $cb_line") if $cb_line;
	my ($floor, $raised) = ($cb_line // '') =~ /floor=(\d+) raised=(\d+)/;
	$floor //= 0;
	is($raised, scalar @resources, "failover $round: the callback raised every fence");

	# The failover was lossy: the fences the standby knew accept every
	# token the old primary rejected; only the floor makes them stale again.
	for my $r (@resources)
	{
		cmp_ok($primary_fence{$r}, '>', $replicated{$r},
			"failover $round: advances of $r were lost: primary had $primary_fence{$r}, standby $replicated{$r}");
	}
	cmp_ok(scalar(grep { $_->[1] >= $replicated{ $_->[0] } } @rejected), '>', 0,
		"failover $round: tokens rejected before the failover would pass the fences the standby had");

	# --- afterwards: no token rejected before the failover is accepted -----

	# The newest superseded token of the protected table first: above the
	# fence the standby had, a row carrying it would advance that fence.
	($iok, $iout, $ierr, $istate) = psql_at($standby,
		"INSERT INTO orders (token) VALUES ($last_orders_sup)");
	is($istate, 'LF001',
		"failover $round: a protected INSERT with superseded token $last_orders_sup is rejected after the failover");

	my $accepted = 0;
	for my $rt (@rejected)
	{
		my ($r, $t) = @$rt;
		my ($ok, $out, $err, $state) = psql_at($standby, "SELECT lockfence.fence('$r', $t)");
		$accepted++ if $state ne 'LF001';
		$accepted++ if safe_at($standby, "SELECT lockfence.try_fence('$r', $t)") ne 'f';
	}
	is($accepted, 0, "failover $round: "
		  . scalar(@rejected) . ' tokens rejected before the failover: all rejected after it (LF001)');
	for my $r (@resources)
	{
		my $now = safe_at($standby, "SELECT lockfence.current_token('$r')");
		# jobs-b: the honest holder's write is above the floor.
		is($now, $floor, "failover $round: fence of $r is the floor $floor") unless $r eq 'jobs-b';
		cmp_ok($now, '>=', $floor, "failover $round: fence of $r ($now) is at least the floor") if $r eq 'jobs-b';
		cmp_ok($floor, '>', $primary_fence{$r},
			"failover $round: floor is above every token issued before ($r: $primary_fence{$r})");
	}

	# A holder acquires its lock again and gets a token above the floor.
	my $fresh = hold_once($standby, 'jobs-a');
	cmp_ok($fresh, '>=', $floor, "failover $round: a lock acquired after the failover is accepted (token $fresh)");

	# The callback is safe to run twice: fences only rise.  (A second etcd
	# floor is newer, so the holder above must acquire its lock again.)
	my ($cout, $cerr);
	my $crc = IPC::Run::run(
		[ 'env', 'PGHOST=127.0.0.1', "PGPORT=$standby->{pg_port}", 'PGUSER=postgres',
		  'LOCKFENCE_TIMEOUT=30', $callback, 'on_role_change', 'master', $scope ],
		'>', \$cout, '2>', \$cerr);
	ok($crc, "failover $round: callback run a second time succeeds");
	like($cerr, qr/database "postgres": floor=\d+ raised=\d+/, '... and logs what it did');
	my ($floor2) = $cerr =~ /floor=(\d+)/;
	cmp_ok($floor2 // 0, '>=', $floor, 'second floor is not lower');
	is(safe_at($standby, 'SELECT count(*) FROM lockfence.fences WHERE token < ' . ($floor2 // 0)),
		0, 'no fence below the second floor');
	my ($ok2, $o2, $e2, $s2) = psql_at($standby, "SELECT lockfence.fence('jobs-a', $fresh)");
	is($s2, 'LF001', 'a token from before the second floor must re-acquire (LF001)');

	($primary, $standby) = ($standby, $primary);
}

# Other roles and actions: nothing to do.
my ($cout, $cerr);
my $crc = IPC::Run::run(
	[ 'env', 'PGHOST=127.0.0.1', "PGPORT=$primary->{pg_port}", $callback,
	  'on_role_change', 'replica', $scope ],
	'>', \$cout, '2>', \$cerr);
ok($crc && $cerr =~ /nothing to do/, 'callback for the replica role does nothing');

diag('summary: ' . $_) for @summary;
done_testing();
