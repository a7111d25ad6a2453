
=pod

=head1 NAME

LockfenceTest::Node - PostgreSQL::Test::Cluster nodes made from one
initdb per lane

=head1 SYNOPSIS

  use LockfenceTest::Node qw(init_node);

  my $node = PostgreSQL::Test::Cluster->new('main');
  init_node($node, allows_streaming => 1);    # instead of $node->init(...)

=head1 DESCRIPTION

initdb runs once per tmp_check (one lane's TAP files, so one major) and
each node initialised here starts from a copy of its data folder, as
PostgreSQL 17's Cluster.pm does with INITDB_TEMPLATE: on this machine an
initdb costs about 0.8 CPU seconds, a copy about 0.1.  What init adds to
postgresql.conf (allows_streaming, has_archiving and the rest) is added to
the copy as it would be after initdb.

The copies share one system identifier.  A file that restores a dump into
another cluster, which must have an identity of its own (TAP 02, 88), or
that needs initdb's options (pg_upgrade's checksums, TAP 51) calls init
itself.

=cut

package LockfenceTest::Node;

use strict;
use warnings;

use Exporter 'import';
use File::Path ();
use IPC::Run ();
use PostgreSQL::Test::Utils ();
use Test::More ();

our @EXPORT_OK = qw(init_node poll_until_answers);

sub _initdb_template
{
	my $tpl = "$PostgreSQL::Test::Utils::tmp_check/initdb-template";
	return $tpl if -f "$tpl/PG_VERSION";
	my $tmp = "$tpl.$$";
	PostgreSQL::Test::Utils::system_or_bail('initdb', '-D', $tmp, '-A', 'trust', '-N');
	# rename() is atomic: a folder at $tpl is complete.  Another test file
	# of the lane (prove -j) may have made it first; its copy is kept.
	File::Path::rmtree($tmp) unless rename($tmp, $tpl);
	return $tpl;
}

=pod

=item init_node(node, params)

$node->init(params), from the template.  PostgreSQL 17 and later copy
INITDB_TEMPLATE themselves; 15's init runs initdb through system_or_bail,
which is replaced by the same copy for that call only (any other command,
or initdb with other options, runs as before).

=cut

sub init_node
{
	my ($node, %params) = @_;
	my $tpl = _initdb_template();
	if ($node->pg_version >= 17)
	{
		local $ENV{INITDB_TEMPLATE} = $tpl;
		$node->init(%params);
		return;
	}
	my $run = \&PostgreSQL::Test::Utils::system_or_bail;
	no warnings 'redefine';
	local *PostgreSQL::Test::Utils::system_or_bail = sub {
		return $run->(@_)
		  unless @_ == 6 && "@_" eq "initdb -D $_[2] -A trust -N";
		return $run->('cp', '-RPp', $tpl, $_[2]);
	};
	$node->init(%params);
	return;
}

=pod

=item poll_until_answers(node, dbname, query[, expected])

As Cluster.pm's poll_query_until (true once psql prints expected, 't' by
default, and nothing on stderr; false after the default timeout), for a
server that may not accept connections yet: one restarting after a
backend's crash, or a pooler still starting.  The query goes on psql's
command line (-c).  poll_query_until feeds it to psql's standard input,
and a psql that exits at once, unable to connect, makes that write fail
with EPIPE, which IPC::Run dies of ("ack Broken pipe: write(...)": TAP 71
on 18 under stress-ng, 2026-12-05, polling pgbouncer just started).

=cut

sub poll_until_answers
{
	my ($node, $dbname, $query, $expected) = @_;
	$expected //= 't';
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	my ($out, $err) = ('', '');
	while (time < $deadline)
	{
		($out, $err) = ('', '');
		IPC::Run::run(
			[ $node->installed_command('psql'), '-XAtq',
				'-d', $node->connstr($dbname), '-c', $query ],
			'<', \undef, '>', \$out, '2>', \$err);
		chomp $out;
		return 1 if $out eq $expected && $err eq '';
		select(undef, undef, undef, 0.1);
	}
	Test::More::diag("poll_until_answers timed out: $query\nlast output: $out\nstderr: $err");
	return 0;
}

1;
