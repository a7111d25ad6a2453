
# Malformed, oversized, slow and hostile replies give clean errors with the
# right SQLSTATE (never a crash, hang or token), and etcd's "unavailable"
# answers fail over to the next endpoint.  A small HTTP server in this
# script plays the hostile endpoint; the real etcd plays the healthy one.

use strict;
use warnings;

use File::Spec;
use IO::Socket::INET;
use POSIX ();
use MIME::Base64;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'hostile');
$etcd->start;
my $dir = PostgreSQL::Test::Utils::tempdir('hostile');
my $mode_file = File::Spec->catfile($dir, 'mode');
my $req_log = File::Spec->catfile($dir, 'requests');

# --- the hostile server --------------------------------------------------------

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $listener = IO::Socket::INET->new(
	LocalAddr => '127.0.0.1',
	LocalPort => $port,
	Proto => 'tcp',
	Listen => 16,
	ReuseAddr => 1) or die "could not listen on $port: $!";

sub set_mode
{
	my ($mode) = @_;
	open my $fh, '>', $mode_file or die $!;
	print $fh $mode;
	close $fh;
	unlink $req_log;
}

sub requests
{
	open my $fh, '<', $req_log or return ();
	my @r = <$fh>;
	chomp @r;
	return @r;
}

sub respond
{
	my ($c, $status, $body, %opts) = @_;
	my $len = length $body;
	my $hdr = "HTTP/1.1 $status\r\nContent-Type: application/json\r\nConnection: close\r\n";
	if ($opts{chunked})
	{
		print $c $hdr . "Transfer-Encoding: chunked\r\n\r\n";
		my $chunk = 'x' x 65536;
		for (1 .. 40)
		{
			print $c sprintf("%x\r\n", length $chunk) . $chunk . "\r\n" or last;
		}
		print $c "0\r\n\r\n";
		return;
	}
	print $c $hdr . "Content-Length: $len\r\n\r\n" . $body;
}

sub serve
{
	my ($c) = @_;
	my $head = '';
	while ($head !~ /\r\n\r\n/)
	{
		my $n = sysread($c, my $buf, 4096);
		return if !$n;
		$head .= $buf;
	}
	my ($path) = $head =~ m{^POST (\S+)};
	my ($clen) = $head =~ /Content-Length:\s*(\d+)/i;
	my ($body) = $head =~ /\r\n\r\n(.*)$/s;
	while (length($body) < ($clen // 0))
	{
		my $n = sysread($c, my $buf, 4096);
		last if !$n;
		$body .= $buf;
	}
	open my $mf, '<', $mode_file or die $!;
	my $mode = <$mf>;
	close $mf;
	open my $lf, '>>', $req_log or die $!;
	print $lf "$path\n";
	close $lf;
	$c->autoflush(1);

	my $lease = '7';
	my $lease_hex = sprintf('%x', $lease);
	if ($path eq '/v3/lease/grant' && $mode =~ /^lock/)
	{
		respond($c, '200 OK', qq({"header":{"revision":"5"},"ID":"$lease","TTL":"30"}));
	}
	elsif ($path eq '/v3/lease/revoke')
	{
		respond($c, '200 OK', '{"header":{"revision":"6"}}');
	}
	elsif ($mode eq 'lockwrongkey' && $path eq '/v3/kv/txn')
	{
		# the queueing transaction "succeeds", but names as holder a key
		# outside the range asked for: a reply to another request
		my $k = encode_base64("other/ffff", '');
		respond($c, '200 OK',
			qq({"header":{"revision":"9"},"succeeded":true,"responses":[{"response_put":{"header":{}}},{"response_range":{"header":{},"kvs":[{"key":"$k","create_revision":"3","lease":"8"}],"count":"1"}}]})
		);
	}
	elsif ($mode eq 'locknokv' && $path eq '/v3/kv/txn')
	{
		my $own = encode_base64("hostile/$lease_hex", '');
		my $other = encode_base64("hostile/ffff", '');
		if ($body =~ /max_create_revision/)
		{
			# waiting, the read of our key finds nothing: its lease
			# expired (the 3.4 "locked anyway" case)
			respond($c, '200 OK',
				qq({"header":{"revision":"12"},"succeeded":true,"responses":[{"response_range":{"header":{}}},{"response_range":{"header":{},"kvs":[{"key":"$other","create_revision":"3","lease":"8"}],"count":"1"}}]})
			);
		}
		else
		{
			# queued behind another holder
			respond($c, '200 OK',
				qq({"header":{"revision":"10"},"succeeded":true,"responses":[{"response_put":{"header":{}}},{"response_range":{"header":{},"kvs":[{"key":"$other","create_revision":"3","lease":"8"}],"count":"1"}}]})
			);
		}
	}
	elsif ($mode eq 'garbage')
	{
		respond($c, '200 OK', 'this is not json {');
	}
	elsif ($mode eq 'array')
	{
		respond($c, '200 OK', '[1,2,3]');
	}
	elsif ($mode eq 'wrongtype')
	{
		respond($c, '200 OK', '{"ID":{"x":1},"TTL":"30"}');
	}
	elsif ($mode eq 'badint')
	{
		respond($c, '200 OK', '{"ID":"12abc","TTL":"30"}');
	}
	elsif ($mode eq 'nul')
	{
		respond($c, '200 OK', '{"ID":"\u0000","TTL":"30"}');
	}
	elsif ($mode eq 'noid')
	{
		respond($c, '200 OK', '{"header":{"revision":"1"}}');
	}
	elsif ($mode eq 'big')
	{
		respond($c, '200 OK', '{"x":"' . ('a' x (2 * 1024 * 1024)) . '"}');
	}
	elsif ($mode eq 'bigchunked')
	{
		respond($c, '200 OK', '', chunked => 1);
	}
	elsif ($mode eq 'truncated')
	{
		print $c "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"ID\":\"1";
	}
	elsif ($mode eq 'slow')
	{
		print $c "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n";
		for (1 .. 1000)
		{
			print $c ' ' or last;
			usleep(100_000);
		}
	}
	elsif ($mode eq 'close')
	{
		# say nothing
	}
	elsif ($mode eq 'unavailable')
	{
		respond($c, '503 Service Unavailable',
			'{"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14}');
	}
	elsif ($mode eq 'denied')
	{
		respond($c, '403 Forbidden',
			'{"error":"etcdserver: permission denied","message":"etcdserver: permission denied","code":7}');
	}
	else
	{
		respond($c, '500 Internal Server Error', '{"message":"unexpected","code":2}');
	}
}

set_mode('garbage');
my $server_pid = fork();
die "fork failed: $!" unless defined $server_pid;
if ($server_pid == 0)
{
	$SIG{CHLD} = 'IGNORE';
	while (my $c = $listener->accept)
	{
		my $pid = fork();
		if (defined $pid && $pid == 0)
		{
			serve($c);
			close $c;
			POSIX::_exit(0);
		}
		close $c;
	}
	POSIX::_exit(0);
}
END { kill 'KILL', $server_pid if $server_pid; }

# --- PostgreSQL ------------------------------------------------------------------

my $hostile = "http://127.0.0.1:$port";
my $node = LockfenceTest::EtcdCluster::pg_node('etcd_hostile', qq{
lockfence.etcd_endpoints = '$hostile'
lockfence.etcd_request_timeout = '1s'
});

sub run_sql
{
	my ($sql) = @_;
	my ($out, $err);
	my $t0 = time;
	$node->psql(
		'postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out,
		stderr => \$err,
		timeout => 60);
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($out, $err, $state // '', time - $t0);
}

my %expect = (
	garbage => '08P01',
	array => '08P01',
	wrongtype => '08P01',
	badint => '08P01',
	nul => '08P01',
	noid => '08P01',
	big => '08P01',
	bigchunked => '08P01',
	truncated => '08006',
	slow => '08006',
	close => '08006',
	unavailable => '08006',
	denied => '42501',);

foreach my $mode (sort keys %expect)
{
	set_mode($mode);
	my ($out, $err, $state, $secs) =
	  run_sql("SELECT * FROM lockfence.etcd_lock('hostile')");
	is($state, $expect{$mode}, "$mode reply: SQLSTATE $expect{$mode}")
	  or diag($err);
	ok($secs < 5, sprintf('%s reply: error after %.2f s', $mode, $secs));
	unlike($out, qr/\d/, "$mode reply: no token");
}

# No descriptor (socket, epoll set) or handle is left behind by failed
# calls: the backend's open file count is the same after 30 more of them.
{
	my $s = LockfenceTest::EtcdCluster::session($node);
	my $fds = sub { my @f = glob("/proc/$s->{pid}/fd/*"); scalar @f };
	my $fail = sub {
		my ($mode, $sql) = @_;
		set_mode($mode);
		$s->query($sql);
		$s->{stderr} = '';
	};
	my @modes = qw(garbage big close truncated unavailable denied nul);
	$fail->($_, "SELECT * FROM lockfence.etcd_lock('hostile')") for @modes;
	$fail->('slow', "SET statement_timeout = '150ms'; SELECT * FROM lockfence.etcd_lock('hostile'); RESET statement_timeout");
	my $before = $fds->();
	for my $i (1 .. 4)
	{
		$fail->($_, "SELECT * FROM lockfence.etcd_lock('hostile')") for @modes;
		$fail->('slow', "SET statement_timeout = '150ms'; SELECT * FROM lockfence.etcd_lock('hostile'); RESET statement_timeout");
	}
	is($fds->(), $before, "no descriptors leaked by 32 failed calls ($before open)");
	$s->quit;
}

# The server survived every reply.
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'server still running');

# A queueing answer naming a holder outside the lock name is refused, and
# our lease is revoked.
set_mode('lockwrongkey');
my ($out, $err, $state) = run_sql("SELECT * FROM lockfence.etcd_lock('hostile')");
is($state, '08P01', 'queueing answer naming a key of another name: 08P01');
ok((grep { $_ eq '/v3/lease/revoke' } requests()),
	'... and the lease was revoked');

# Waiting, our key is found gone: lost lock, no token (etcd 3.4's lock
# service answered "locked" then).
set_mode('locknokv');
($out, $err, $state) = run_sql("SELECT * FROM lockfence.etcd_lock('hostile')");
is($state, 'LF003', 'our key gone while waiting: LF003');
unlike($out, qr/\d/, '... no token');

# Failover: the hostile endpoint says "no leader", the real etcd answers.
set_mode('unavailable');
($out, $err, $state) = run_sql(
	"SET lockfence.etcd_endpoints = '$hostile," . $etcd->endpoints . "';
	 SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('failover')");
is($out, 't', 'HTTP 503 / code 14 fails over to the next endpoint')
  or diag($err);
ok((grep { $_ eq '/v3/lease/grant' } requests()),
	'... after trying the unavailable endpoint first');

$node->stop;
done_testing();
