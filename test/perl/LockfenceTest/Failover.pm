
=pod

=head1 NAME

LockfenceTest::Failover - what the failover suites (85 Patroni, 90 repmgr)
share: psql through a connection string, and one write of a superseded
holder, classified.

=cut

package LockfenceTest::Failover;

use strict;
use warnings;

use IPC::Run ();

=pod

=item psql_conn(bindir, conn, sql, timeout)

Run sql through psql on the connection string conn (timeout default 60
s); returns (ok, stdout, stderr, SQLSTATE or '').

=cut

sub psql_conn
{
	my ($bindir, $conn, $sql, $timeout) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[
			"$bindir/psql", '-X', '-A', '-t', '-q', '-d', $conn,
			'-v', 'ON_ERROR_STOP=1', '-c', '\set VERBOSITY verbose', '-c', $sql
		],
		'>', \$out, '2>', \$err,
		IPC::Run::timeout($timeout // 60));
	chomp $out;
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($ok, $out, $err, $state // '');
}

=pod

=item superseded_write(bindir, conn, rejected, i, orders_token)

Write i of a superseded holder through conn: fence, try_fence or a
protected INSERT in turn, with the i-th of rejected ([resource, token]
pairs) or orders_token.  Returns (class, what): what is 'accepted',
'LF001' (also a try_fence that said false), another SQLSTATE, 'standby
only' or 'no server'.

=cut

sub superseded_write
{
	my ($bindir, $conn, $rejected, $i, $orders_token) = @_;
	my ($r, $t) = @{ $rejected->[ $i % @$rejected ] };
	my $class = (qw(fence try_fence insert))[ $i % 3 ];
	my $sql = {
		fence => "SELECT lockfence.fence('$r', $t)",
		try_fence => "SELECT CASE WHEN lockfence.try_fence('$r', $t) THEN 'accepted' ELSE 'refused' END",
		insert => "INSERT INTO orders (token) VALUES ($orders_token)",
	}->{$class};
	my ($ok, $out, $err, $state) = psql_conn($bindir, $conn, $sql);
	my $what = $ok ? ($out eq 'refused' ? 'LF001' : 'accepted')
	  : $state ? $state
	  : $err =~ /read-write|read-only|hot standby/ ? 'standby only'
	  : 'no server';
	return ($class, $what);
}

1;
