
=pod

=head1 NAME

LockfenceTest::Citus - a Citus cluster for lockfence's Citus suites: a
coordinator and workers on 127.0.0.1, each preloading citus and
lockfence, the workers added with their metadata synced.

=head1 SYNOPSIS

  use LockfenceTest::Citus;

  my $why = LockfenceTest::Citus::unavailable();
  plan skip_all => $why if $why;
  my ($coord, @workers) = LockfenceTest::Citus::start_cluster('citus', 2);
  my ($ok, $out, $err, $state) = LockfenceTest::Citus::sql($coord, 'SELECT 1');

=cut

package LockfenceTest::Citus;

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use LockfenceTest::Node qw(init_node);

# Citus' nodes reach each other by host name and port: TCP on 127.0.0.1
# (initdb's trust authentication covers it).  Set before any node exists.
sub use_tcp
{
	no warnings 'once';
	$PostgreSQL::Test::Cluster::use_tcp = 1;
	$PostgreSQL::Test::Cluster::test_pghost = '127.0.0.1';
	$ENV{PGHOST} = '127.0.0.1';
	return;
}

=pod

=item unavailable()

Why the Citus suites cannot run with the PostgreSQL on PATH (the reason
for plan skip_all), or undef when citus.so and citus.control are
installed there (scripts/citus.sh build, then scripts/citus.sh install
PG_CONFIG).

=cut

sub unavailable
{
	my $pkglib = `pg_config --pkglibdir 2>/dev/null`;
	my $share = `pg_config --sharedir 2>/dev/null`;
	chomp($pkglib, $share);
	return 'pg_config is not on PATH' unless $pkglib && $share;
	return "Citus is not installed in $pkglib (scripts/citus.sh build && scripts/citus.sh install PG_CONFIG)"
	  unless -f "$pkglib/citus.so" && -f "$share/extension/citus.control";
	return undef;
}

=pod

=item start_cluster(name, workers)

Start a coordinator and that many workers, create citus on each, register
the coordinator and add the workers (metadata synced, as citus_add_node
does).  Each node has WAL senders and replication slots for Citus' shard
moves by logical replication.  lockfence is not created: the caller does, to see how.  Returns
(coordinator, workers...).

=cut

sub start_cluster
{
	my ($name, $nworkers) = @_;
	use_tcp();
	my @nodes = map { start_node($_ == 0 ? "${name}_coord" : "${name}_w$_") } 0 .. $nworkers;
	my ($coord, @workers) = @nodes;
	$coord->safe_psql('postgres',
		"SELECT citus_set_coordinator_host('127.0.0.1', " . $coord->port . ')');
	for my $w (@workers)
	{
		$coord->safe_psql('postgres',
			"SELECT citus_add_node('127.0.0.1', " . $w->port . ')');
	}
	return @nodes;
}

=pod

=item start_node(name)

A server named name that preloads citus and lockfence, started, with the
citus extension created: a node for start_cluster(), or one a test adds
to the cluster itself (citus_add_node on the coordinator).

=cut

sub start_node
{
	my ($name) = @_;
	my $n = PostgreSQL::Test::Cluster->new($name);
	init_node($n);
	$n->append_conf('postgresql.conf', <<'EOF');
shared_preload_libraries = 'citus,lockfence'
max_prepared_transactions = 50
max_connections = 100
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
log_min_messages = warning
citus.shard_count = 4
citus.shard_replication_factor = 1
EOF
	$n->start;
	$n->safe_psql('postgres', 'CREATE EXTENSION citus');
	return $n;
}

=pod

=item sql(node, sql)

Run sql through psql on node (database postgres, ON_ERROR_STOP, verbose
errors); returns (ok, stdout, stderr, SQLSTATE or '').  sql may be a
reference to a list of commands, each sent on its own in one session
(Citus propagates a DDL command's whole query string to the workers, so a
SET before it must be sent apart).

=cut

sub sql
{
	my ($node, $sql) = @_;
	my ($out, $err) = ('', '');
	my @cmds = map { ('-c', $_) } (ref $sql ? @$sql : ($sql));
	my $ok = IPC::Run::run(
		[
			$node->installed_command('psql'), '-X', '-A', '-t', '-q',
			'-d', $node->connstr('postgres'),
			'-v', 'ON_ERROR_STOP=1', '-c', '\set VERBOSITY verbose', @cmds
		],
		'>', \$out, '2>', \$err,
		IPC::Run::timeout(120));
	chomp $out;
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($ok, $out, $err, $state // '');
}

1;
