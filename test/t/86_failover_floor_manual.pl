# Copyright: the lockfence authors
#
# 86_failover_floor_manual.pl
#	  The failover floor without Patroni: promote an asynchronous standby
#	  that was behind, then raise the fences to an operator's floor before
#	  admitting writers (the callback script with a numeric floor).
#
# Tokens come from a lock service other than etcd (plain numbers here), so
# the operator gives the floor.  Also: fences are refused (LF004) from the
# promotion on; a floor for a list of resources keeps that refusal (the
# operator then accepts the promotion); a resource whose fence row the
# failover lost entirely is covered when named; the floor functions refuse
# to run on a standby (25006).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run ();
use File::Spec;

use LockfenceTest::EtcdCluster;
use LockfenceTest::Node qw(init_node);

my $callback = File::Spec->rel2abs('scripts/patroni-on-role-change.sh');

my $primary = PostgreSQL::Test::Cluster->new('floor_primary');
init_node($primary, allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION lockfence');
$primary->safe_psql('postgres',
	"SELECT lockfence.fence('r1', 10), lockfence.fence('r2', 20)");

$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('floor_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby, 'replay');
is($standby->safe_psql('postgres', "SELECT lockfence.current_token('r1')"),
	'10', 'standby has the fences');

# Verbose psql: (stdout, sqlstate).
sub try_sql
{
	my ($node, $sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql('postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out, stderr => \$err);
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($out, $state // '', $err);
}

# On a standby the floor cannot be raised yet: a clear refusal.
for my $sql ('SELECT lockfence.raise_floor(100)',
	'SELECT * FROM lockfence.etcd_raise_floor()')
{
	my ($out, $state, $err) = try_sql($standby, $sql);
	is($state, '25006', "$sql on a standby: 25006");
	like($err, qr/server is in recovery/, '... saying the server is in recovery');
}

# --- the standby held behind ------------------------------------------------

my $walreceiver = $standby->safe_psql('postgres', 'SELECT pid FROM pg_stat_wal_receiver');
ok($walreceiver =~ /^\d+$/, "walreceiver is $walreceiver");
kill 'STOP', $walreceiver;

my @rejected;
sub advance
{
	my ($resource, $old, $new) = @_;
	$primary->safe_psql('postgres', "SELECT lockfence.fence('$resource', $new)");
	my ($out, $state) = try_sql($primary, "SELECT lockfence.fence('$resource', $old)");
	is($state, 'LF001', "primary: $resource at $new rejects $old");
	push @rejected, [ $resource, $old ];
}
advance('r1', 10, 15);
advance('r1', 15, 30);
advance('r2', 20, 25);
# a resource first fenced while the standby was behind: its row is lost
advance('fresh', 40, 45);

# --- failover: the primary dies, the WAL the standby did not read is lost ----

$primary->stop('immediate');
kill 'KILL', $walreceiver;
# A killed walreceiver is a crash: with restart_after_crash off (as in
# these test clusters) the standby shuts down.  Start it again.
ok( LockfenceTest::EtcdCluster::poll_until(60,
		sub { !-e $standby->data_dir . '/postmaster.pid' }),
	'standby shut down after its walreceiver was killed');
$standby->stop('immediate', fail_ok => 1);    # forget the old postmaster
$standby->start;
$standby->promote;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 'f', 'standby promoted');

is($standby->safe_psql('postgres', "SELECT lockfence.current_token('r1')"),
	'10', 'the failover lost the advances of r1 (fence back at 10)');
is($standby->safe_psql('postgres', "SELECT lockfence.current_token('fresh')"),
	'', 'the failover lost the fence of fresh entirely');

# From the promotion on, every fence is refused until the floor is raised
# (LF004), honest tokens of another lock service included.
my ($out, $state) = try_sql($standby, "SELECT lockfence.fence('other-service', 7)");
is($state, 'LF004', 'right after the promotion a fence is refused (LF004)');
($out, $state) = try_sql($standby, "SELECT lockfence.fence('fresh', 40)");
is($state, 'LF004', '... a superseded token of a lost resource too');

# The operator's floor for the named resources (above every token issued
# before), creating a fence for the one the failover lost entirely.
my ($cout, $cerr) = ('', '');
my $ok = IPC::Run::run(
	[ 'env', 'PGHOST=' . $standby->host, 'PGPORT=' . $standby->port,
	  'LOCKFENCE_FLOOR=100', 'LOCKFENCE_RESOURCES=r1 r2 fresh',
	  'LOCKFENCE_TIMEOUT=30', $callback, 'on_role_change', 'primary', 'manual' ],
	'>', \$cout, '2>', \$cerr);
ok($ok, 'callback with an operator floor succeeds');
like($cerr, qr/database "postgres": floor=100 raised=3/,
	'... raising r1, r2 and creating fresh, and says so');
like($cerr, qr/stay refused \(LF004\)/,
	'... and that fenced writes stay refused: names only do not cover every name');
note($cerr);
($out, $state) = try_sql($standby, "SELECT lockfence.fence('r1', 100)");
is($state, 'LF004', 'a floor for named resources only keeps the refusal');
# The other service's resources need no floor (say): the operator accepts.
$standby->safe_psql('postgres', 'SELECT lockfence.accept_promotion()');
$standby->safe_psql('postgres', "SELECT lockfence.fence('other-service', 7)");
is($standby->safe_psql('postgres', "SELECT lockfence.current_token('other-service')"),
	'7', 'after accept_promotion(), a resource not listed in LOCKFENCE_RESOURCES is left alone');

my $accepted = 0;
for my $rt (@rejected)
{
	my ($r, $t) = @$rt;
	my ($out, $state) = try_sql($standby, "SELECT lockfence.fence('$r', $t)");
	$accepted++ unless $state eq 'LF001';
}
is($accepted, 0, scalar(@rejected) . ' tokens rejected before the failover are rejected after it');
($out, $state) = try_sql($standby, "SELECT lockfence.fence('r1', 99)");
is($state, 'LF001', 'a token just below the floor is rejected');
is($standby->safe_psql('postgres', "SELECT lockfence.fence('r1', 100, 'new holder')"),
	'100', 'the floor itself is accepted, from any holder');
is($standby->safe_psql('postgres', "SELECT lockfence.fence('r2', 101)"),
	'101', 'a new token above the floor advances the fence');

# Twice: nothing is lowered.
$ok = IPC::Run::run(
	[ 'env', 'PGHOST=' . $standby->host, 'PGPORT=' . $standby->port,
	  'LOCKFENCE_FLOOR=100', $callback, 'on_role_change', 'primary', 'manual' ],
	'>', \$cout, '2>', \$cerr);
ok($ok && $cerr =~ /floor=100 raised=1/,
	'a run without a list raises every fence below the floor (other-service)');
$ok = IPC::Run::run(
	[ 'env', 'PGHOST=' . $standby->host, 'PGPORT=' . $standby->port,
	  'LOCKFENCE_FLOOR=100', $callback, 'on_role_change', 'primary', 'manual' ],
	'>', \$cout, '2>', \$cerr);
ok($ok && $cerr =~ /floor=100 raised=0/, 'a second run raises nothing');
is($standby->safe_psql('postgres', "SELECT lockfence.current_token('r2')"),
	'101', '... and lowers nothing');

# A bad floor setting is refused without touching anything.
$ok = IPC::Run::run(
	[ 'env', 'PGHOST=' . $standby->host, 'PGPORT=' . $standby->port,
	  'LOCKFENCE_FLOOR=1e9', $callback, 'on_role_change', 'primary', 'manual' ],
	'>', \$cout, '2>', \$cerr);
ok(!$ok && $cerr =~ /LOCKFENCE_FLOOR must be/, 'a malformed floor is refused');

$standby->stop;
done_testing();
