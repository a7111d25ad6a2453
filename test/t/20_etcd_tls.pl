
# etcd over TLS with client certificates: locks work with the right CA and
# client certificate, and a missing certificate or an unknown CA fails
# cleanly with 08001.  TLS settings are superuser-only.

use strict;
use warnings;

use File::Spec;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::Etcd;

my $dir = PostgreSQL::Test::Utils::tempdir('tls');
sub f { return File::Spec->catfile($dir, $_[0]); }

sub openssl
{
	my @cmd = ('openssl', @_);
	my ($out, $err);
	IPC::Run::run(\@cmd, '<', \undef, '>', \$out, '2>', \$err)
	  or die "openssl @_ failed: $err";
}

# A CA, a server certificate for 127.0.0.1, a client certificate, and a
# second CA that signed nothing.
foreach my $ca (qw(ca otherca))
{
	openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout',
		f("$ca.key"), '-out', f("$ca.crt"), '-days', '2', '-subj',
		"/CN=lockfence test $ca");
}
foreach my $n (qw(server client))
{
	openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', f("$n.key"),
		'-out', f("$n.csr"), '-subj', "/CN=$n");
	open my $fh, '>', f("$n.ext") or die $!;
	print $fh "subjectAltName=IP:127.0.0.1\n"
	  . "extendedKeyUsage=serverAuth,clientAuth\n";
	close $fh;
	openssl('x509', '-req', '-in', f("$n.csr"), '-CA', f('ca.crt'),
		'-CAkey', f('ca.key'), '-CAcreateserial', '-out', f("$n.crt"),
		'-days', '2', '-extfile', f("$n.ext"));
}

my $etcd = LockfenceTest::Etcd->new(
	scheme => 'https',
	extra_args => [
		'--cert-file' => f('server.crt'),
		'--key-file' => f('server.key'),
		'--trusted-ca-file' => f('ca.crt'),
		'--client-cert-auth'
	],
	etcdctl_args => [
		'--cacert=' . f('ca.crt'),
		'--cert=' . f('client.crt'),
		'--key=' . f('client.key')
	]);

my $node = PostgreSQL::Test::Cluster->new('etcd_tls');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
lockfence.etcd_endpoints = '@{[ $etcd->endpoint ]}'
lockfence.etcd_cafile = '@{[ f('ca.crt') ]}'
lockfence.etcd_certfile = '@{[ f('client.crt') ]}'
lockfence.etcd_keyfile = '@{[ f('client.key') ]}'
lockfence.etcd_request_timeout = '1s'
});
$node->start;
$node->safe_psql('postgres',
	'CREATE EXTENSION lockfence; CREATE ROLE lf_tls_app LOGIN;');

sub run_sql
{
	my ($sql, @extra) = @_;
	my ($out, $err);
	$node->psql(
		'postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out,
		stderr => \$err,
		extra_params => \@extra);
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($out, $err, $state // '');
}

my ($out, $err, $state) = run_sql(
	"SELECT key || '|' || token FROM lockfence.etcd_lock('tlsjob')");
like($out, qr{^tlsjob/[0-9a-f]+\|\d+$}, 'lock over TLS with a client certificate');
my ($key, $token) = split /\|/, $out;

($out, $err, $state) = run_sql(
	"SET lockfence.etcd_certfile = ''; SET lockfence.etcd_keyfile = '';
	 SELECT * FROM lockfence.etcd_lock('tlsjob2')");
# With TLS 1.3 the server refuses a missing client certificate only after
# the handshake, so libcurl reports a read error (08006), not a failed
# connection (08001).
like($state, qr/^080(01|06)$/, "no client certificate: $state");
# What libcurl reports depends on when the server's alert arrives: the
# alert itself, or the connection it closed (libcurl 8: SSL_ERROR_ZERO_RETURN,
# the peer's close).  Both name the endpoint.
like($err, qr/certificate|alert|not connected|reset|closed|SSL_ERROR_ZERO_RETURN/i,
	'... with the TLS failure in the detail');

($out, $err, $state) = run_sql(
	"SET lockfence.etcd_cafile = '@{[ f('otherca.crt') ]}';
	 SELECT * FROM lockfence.etcd_lock('tlsjob2')");
is($state, '08001', 'server certificate from an unknown CA: 08001');
like($err, qr/certificate/i, '... with libcurl\'s reason in the detail');

($out, $err, $state) = run_sql(
	"SELECT lockfence.current_token('x');
	 SET lockfence.etcd_cafile = '/etc/passwd'", '-U', 'lf_tls_app');
is($state, '42501', 'ordinary users cannot change the TLS settings');
($out, $err, $state) = run_sql(
	"SELECT lockfence.current_token('x'); SHOW lockfence.etcd_keyfile",
	'-U', 'lf_tls_app');
is($state, '42501', 'ordinary users cannot read the TLS settings');

is_deeply([ $etcd->keys('tlsjob') ], [], 'no key left behind');

$node->stop;
done_testing();
