# Copyright: the lockfence authors
#
# 90_repmgr_failover_floor.pl
#	  Lossy repmgr failovers, closed by scripts/repmgr-promote.sh (repmgr
#	  standby promote, then the fence floor), with superseded-token writers
#	  going through a read-write multi-host connection string the whole
#	  time (issue 23 items 1 and 8).
#
# Debian's repmgr (5.3) manages two PostgreSQL nodes in asynchronous
# streaming replication, registered with `repmgr primary register` and
# `repmgr standby register`.  Tokens come from real etcd locks
# (lockfence.etcd_lock_and_fence).  The standby is held behind: its
# walreceiver is stopped (SIGSTOP) while the primary advances the fences
# and rejects superseded tokens with LF001; then the primary is killed
# (SIGKILL, postmaster and children) and the stopped walreceiver too (the
# WAL in its socket is discarded, as WAL never sent would be), so the
# advances are lost.  The failover is driven as repmgrd's promote_command
# would: scripts/repmgr-promote.sh on the standby, which runs
# `repmgr standby promote` and then raises the floor
# (scripts/patroni-on-role-change.sh, LOCKFENCE_FLOOR=etcd).
#
# From the kill until after the floor, writers present superseded tokens
# (fence, try_fence, a protected INSERT) through
# "host=A,B target_session_attrs=read-write", as an application would: none
# may be accepted.  An honest holder (acquiring its etcd lock again) tries
# too, and is accepted once the floor is in place; the time from the
# promotion (pg_is_in_recovery() false) to that first accepted honest write
# is reported.  Afterwards every token rejected before the failover is
# rejected.  LOCKFENCE_REPMGR_FAILOVERS failovers (default 1) in a row: after
# each, a new standby is cloned from the new primary and registered.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run ();
use Time::HiRes qw(usleep time);
use File::Spec;

use LockfenceTest::EtcdCluster;
use LockfenceTest::Failover;
use LockfenceTest::Node qw(init_node);

my $bindir = `pg_config --bindir`;
chomp $bindir;
my $sharedir = `pg_config --sharedir`;
chomp $sharedir;
my $pkglibdir = `pg_config --pkglibdir`;
chomp $pkglibdir;
my $repmgr = "$bindir/repmgr";
plan skip_all =>
  "repmgr is not installed for this PostgreSQL ($bindir; Debian: postgresql-15-repmgr, scripts/install-deps.sh)"
  unless -x $repmgr
  && -f "$sharedir/extension/repmgr.control"
  && -f "$pkglibdir/repmgr.so";

my $failovers = $ENV{LOCKFENCE_REPMGR_FAILOVERS} // 1;
$failovers = 1 unless $failovers =~ /^[1-9]\d*$/;

my $hook = File::Spec->rel2abs('scripts/repmgr-promote.sh');
ok(-x $hook, 'scripts/repmgr-promote.sh is executable');
my ($rver) = `$repmgr --version 2>&1` =~ /(\d+\.\d+\.\d+)/;
note("repmgr $rver, $failovers failover(s)");

my $locks = LockfenceTest::EtcdCluster->new(members => 1, name => 'locks');
$locks->start;
my $etcd_url = $locks->endpoints;
my $dir = PostgreSQL::Test::Utils::tempdir;

# psql against one node or a connection string: (ok, stdout, stderr, sqlstate).
sub psql_conn { return LockfenceTest::Failover::psql_conn($bindir, @_); }

sub conn_of
{
	my ($node) = @_;
	return sprintf('host=%s port=%d dbname=postgres connect_timeout=5',
		$node->host, $node->port);
}

# The application's connection string: whichever of the two is writable.
sub rw_conn
{
	my ($a, $b) = @_;
	return sprintf(
		'host=%s,%s port=%d,%d dbname=postgres target_session_attrs=read-write connect_timeout=5',
		$a->host, $b->host, $a->port, $b->port);
}

my $next_id = 0;

# A node with its repmgr.conf.  Its name is its application_name, which
# repmgr looks for in pg_stat_replication: node_name.
sub new_node
{
	my (%opt) = @_;
	my $id = ++$next_id;
	my $node = PostgreSQL::Test::Cluster->new("node$id");
	if ($opt{from})
	{
		$opt{from}->backup("b$id");
		$node->init_from_backup($opt{from}, "b$id", has_streaming => 1);
	}
	else
	{
		init_node($node, allows_streaming => 1);
		$node->append_conf('postgresql.conf',
			"shared_preload_libraries = 'repmgr'\nwal_keep_size = '256MB'\n"
			  # The standby's walreceiver is killed: its postmaster must
			  # restart it, as a production server would.
			  . "restart_after_crash = on\n");
	}
	$node->{repmgr_id} = $id;
	$node->{repmgr_conf} = "$dir/repmgr$id.conf";
	open my $fh, '>', $node->{repmgr_conf} or die "cannot write $node->{repmgr_conf}: $!";
	printf $fh <<'CONF', $id, $id, conn_of($node), $node->data_dir, $bindir;
node_id=%d
node_name='node%d'
conninfo='%s'
data_directory='%s'
pg_bindir='%s'
log_level=INFO
promote_check_timeout=120
CONF
	close $fh;
	return $node;
}

sub repmgr_run
{
	my ($node, @args) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ $repmgr, '-f', $node->{repmgr_conf}, @args ],
		'>', \$out, '2>', \$err, IPC::Run::timeout(180));
	note("repmgr @args on node$node->{repmgr_id}:\n$out$err");
	return $ok;
}

sub in_recovery
{
	my ($node) = @_;
	my ($ok, $out) = psql_conn(conn_of($node), 'SELECT pg_is_in_recovery()', 30);
	return $ok ? $out : '';
}

# One holder's turn: acquire the etcd lock, fence the resource with its
# token (and write a row under it, for the protected table), release.
sub hold_once
{
	my ($node, $resource) = @_;
	my $sql = "SELECT lockfence.etcd_lock_and_fence('lock-$resource', '$resource', 30)";
	$sql = "BEGIN; $sql; INSERT INTO orders (token) SELECT lockfence.current_token('orders'); "
	  . "SELECT lockfence.current_token('orders'); COMMIT"
	  if $resource eq 'orders';
	my $out = $node->safe_psql('postgres', $sql);
	my ($token) = $out =~ /(\d+)\s*$/;
	return $token;
}

sub token_of
{
	my ($node, $r) = @_;
	return $node->safe_psql('postgres', "SELECT lockfence.current_token('$r')");
}

# --- the cluster: node1 primary, node2 its registered standby -------------

my $primary = new_node();
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION lockfence');
$primary->safe_psql('postgres',
	"ALTER DATABASE postgres SET lockfence.etcd_endpoints = '$etcd_url'");
$primary->safe_psql('postgres',
	    'CREATE TABLE orders (id serial PRIMARY KEY, token bigint); '
	  . "SELECT lockfence.protect('orders', resource => 'orders', token_column => 'token')");
ok(repmgr_run($primary, 'primary', 'register'), 'repmgr primary register')
  or BAIL_OUT('repmgr primary register failed');

my @resources = ('jobs-a', 'jobs-b', 'orders');
my @summary;

for my $round (1 .. $failovers)
{
	note("=== failover $round of $failovers");
	my $standby = new_node(from => $primary);
	$standby->start;
	$primary->wait_for_catchup($standby, 'replay');
	ok(repmgr_run($standby, 'standby', 'register'),
		"failover $round: repmgr standby register (node$standby->{repmgr_id} follows node$primary->{repmgr_id})")
	  or BAIL_OUT('repmgr standby register failed');

	# Replicated: one turn per resource, then wait for the standby.
	my %replicated;
	$replicated{$_} = hold_once($primary, $_) for @resources;
	$primary->wait_for_catchup($standby, 'replay');
	for my $r (@resources)
	{
		is(token_of($standby, $r), $replicated{$r},
			"failover $round: standby has the fence of $r at $replicated{$r}");
	}

	# --- the standby held behind --------------------------------------------
	my $walreceiver = $standby->safe_psql('postgres',
		"SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'");
	ok($walreceiver =~ /^\d+$/, "failover $round: walreceiver of the standby is $walreceiver")
	  or BAIL_OUT('no walreceiver');
	kill 'STOP', $walreceiver;

	my @rejected;
	for my $turn (1 .. 3)
	{
		for my $r (@resources)
		{
			my $before = token_of($primary, $r);
			my $token = hold_once($primary, $r);
			cmp_ok($token, '>', $before, "failover $round: primary: $r advanced from $before to $token");
			my ($ok, $out, $err, $state) =
			  psql_conn(conn_of($primary), "SELECT lockfence.fence('$r', $before)");
			is($state, 'LF001', "failover $round: primary rejects superseded token $before of $r");
			push @rejected, [ $r, $before ];
		}
	}
	my %primary_fence = map { $_ => token_of($primary, $_) } @resources;
	for my $r (@resources)
	{
		is(token_of($standby, $r), $replicated{$r},
			"failover $round: standby is behind: $r at $replicated{$r} (primary: $primary_fence{$r})");
	}

	# --- the failover ---------------------------------------------------------
	my $pm = $primary->{_pid};
	my @children = split ' ', `ps -o pid= --ppid $pm`;
	$primary->kill9;
	kill 'KILL', @children;
	kill 'KILL', $walreceiver;
	my $t_kill = time;
	note("failover $round: killed the primary (postmaster $pm, children @children) and the standby's walreceiver");

	my $rw = rw_conn($primary, $standby);
	my ($last_orders_sup) = map { $_->[1] } grep { $_->[0] eq 'orders' } reverse @rejected;
	my %window;
	my ($attempts, $accepted) = (0, 0);
	my ($t_promoted, $t_floor, $t_honest, $honest_token, $promote);
	my ($promote_out, $promote_err) = ('', '');
	my $stop_at = time + 240;
	for (my $i = 0; time < $stop_at; $i++)
	{
		# The failover manager's step: repmgrd would run promote_command
		# once it gave up on the primary; here as soon as the standby
		# answers again (the walreceiver's SIGKILL restarts it).
		my @ready = $promote ? () : psql_conn(conn_of($standby), 'SELECT 1', 10);
		note("standby not ready: $ready[2]") if !$promote && !$ready[0] && $i % 50 == 0;
		if (!$promote && time > $t_kill + 1 && $ready[0])
		{
			$promote = IPC::Run::start(
				[
					'env', "PATH=$bindir:$ENV{PATH}", "REPMGR=$repmgr",
					'PGHOST=' . $standby->host, 'PGPORT=' . $standby->port,
					'LOCKFENCE_TIMEOUT=90', "LOCKFENCE_LOG=$dir/floor$round.log",
					$hook, '-f', $standby->{repmgr_conf}
				],
				'>', \$promote_out, '2>', \$promote_err,
				IPC::Run::timeout(300));
			note(sprintf('failover %d: repmgr-promote.sh started %.1f s after the kill',
				$round, time - $t_kill));
		}
		# The promotion's time, as a client sees it: checked before each
		# write (and taken as passed once a write reached a writable
		# server), so it is late by at most one statement.
		my $check_promoted = sub {
			$t_promoted //= time
			  if $promote && !defined $t_promoted && in_recovery($standby) eq 'f';
		};
		$check_promoted->();

		# A superseded holder.
		my ($class, $what) = LockfenceTest::Failover::superseded_write($bindir,
			$rw, \@rejected, $i, $last_orders_sup);
		$attempts++;
		$window{$class}{$what}++;
		$accepted++ if $what eq 'accepted';
		$t_promoted //= time if $what =~ /^(LF004|LF001|accepted)$/;
		$t_floor //= time if $what eq 'LF001';

		# The honest holder: a lock acquired now, and a write under it.
		if (!defined $t_honest)
		{
			$check_promoted->();
			my ($hok, $hout) = psql_conn($rw,
				"SELECT lockfence.etcd_lock_and_fence('lock-jobs-a', 'jobs-a', 30)");
			if ($hok && $hout =~ /^\d+$/)
			{
				($t_honest, $honest_token) = (time, $hout);
				$t_promoted //= $t_honest;
			}
		}
		# Writers go on a little after the floor.
		last if defined $t_honest && defined $t_floor && time > $t_honest + 1 && time > $t_floor + 1;
		usleep(20_000) unless $what eq 'LF004';
	}
	ok($promote && $promote->finish, "failover $round: repmgr-promote.sh succeeded")
	  or diag("repmgr-promote.sh:\n$promote_out$promote_err");
	note("repmgr-promote.sh:\n$promote_out$promote_err");
	my $window_text = join('; ', map {
		my $c = $_;
		"$c: " . join(', ', map { "$_=$window{$c}{$_}" } sort keys %{ $window{$c} })
	} sort keys %window);
	is($accepted, 0,
		"failover $round: none of $attempts superseded-token writes through the read-write connection string accepted");
	ok(defined $t_promoted, "failover $round: the standby was promoted");
	ok(defined $t_floor, "failover $round: the writers met the floor (LF001)");
	ok(defined $t_honest, "failover $round: an honest write with a fresh lock was accepted (token "
		  . ($honest_token // 'none') . ')');
	like($promote_err, qr/database "postgres": floor=\d+ raised=\d+/,
		"failover $round: the hook raised the floor");
	my ($floor) = $promote_err =~ /floor=(\d+) raised=/;
	$floor //= 0;

	$t_promoted //= time;
	$t_floor //= time;
	$t_honest //= time;
	my $line = sprintf(
		'repmgr failover %d: writable %.1f s after the kill; first honest write accepted %.2f s after the promotion; '
		  . 'superseded LF001 from %.2f s after it; %d superseded-token writes, %d accepted (%s)',
		$round, $t_promoted - $t_kill, $t_honest - $t_promoted, $t_floor - $t_promoted,
		$attempts, $accepted, $window_text);
	diag($line);
	push @summary, $line;

	# --- afterwards -----------------------------------------------------------
	for my $r (@resources)
	{
		cmp_ok($primary_fence{$r}, '>', $replicated{$r},
			"failover $round: advances of $r were lost (primary had $primary_fence{$r}, standby $replicated{$r})");
	}
	my $late = 0;
	for my $rt (@rejected)
	{
		my ($r, $t) = @$rt;
		my ($ok, $out, $err, $state) = psql_conn(conn_of($standby), "SELECT lockfence.fence('$r', $t)");
		$late++ if $state ne 'LF001';
		$late++ if $standby->safe_psql('postgres', "SELECT lockfence.try_fence('$r', $t)") ne 'f';
	}
	is($late, 0, "failover $round: " . scalar(@rejected)
		  . ' tokens rejected before the failover: all rejected after it (LF001)');
	for my $r (@resources)
	{
		my $now = token_of($standby, $r);
		cmp_ok($now, '>=', $floor, "failover $round: fence of $r ($now) is at least the floor $floor");
		cmp_ok($floor, '>', $primary_fence{$r},
			"failover $round: floor is above every token issued before ($r: $primary_fence{$r})");
	}
	is($standby->safe_psql('postgres', 'SELECT writes_refused FROM lockfence.floor_status()'),
		'f', "failover $round: nothing refused any more");

	$primary = $standby;
}

diag('summary: ' . $_) for @summary;
done_testing();
