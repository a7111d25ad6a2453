
# 23_etcd_tls.pl
#	  lockfence against a real etcd serving https with a test CA and
#	  client-certificate authentication (and, on a second cluster, TLS plus
#	  etcd user authentication): works with the CA/cert/key settings; fails
#	  clearly with SQLSTATE class 08 without the CA, with a wrong CA (08001),
#	  or without a client certificate (08001 or 08006), leaving no key
#	  behind; the TLS settings are superuser-only.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, tls => 1, name => 'tls');
$etcd->start;
like($etcd->endpoints, qr{^https://}, 'etcd serves https');

# A second, unrelated CA, to check that the server certificate is verified.
my $other = LockfenceTest::EtcdCluster->new(members => 1, tls => 1, name => 'tls-other');
$other->make_pki;

my $ca = $etcd->ca_file;
my $cert = $etcd->client_cert_file;
my $key = $etcd->client_key_file;

my $node = LockfenceTest::EtcdCluster::pg_node('tls', <<EOF);
lockfence.etcd_endpoints = '@{[ $etcd->endpoints ]}'
lockfence.etcd_request_timeout = '3s'
lockfence.etcd_cafile = '$ca'
lockfence.etcd_certfile = '$cert'
lockfence.etcd_keyfile = '$key'
EOF

my $s = LockfenceTest::EtcdCluster::session($node);

# 1. Everything configured: a full cycle.
my $r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT key || ' ' || lease || ' ' || token FROM lockfence.etcd_lock('t1', 5, '10s')");
ok($r->{ok}, 'TLS with CA and client certificate: etcd_lock succeeds') or diag explain $r;
like($r->{out}, qr{^t1/[0-9a-f]+ \d+ \d+$}, 'lock over TLS with a client certificate');
my ($k, $lease, $tok) = split / /, $r->{out};
is(LockfenceTest::EtcdCluster::sql_try($s, "SELECT lockfence.etcd_keepalive($lease) > 0")->{out},
	't', 'TLS: etcd_keepalive succeeds');
is(LockfenceTest::EtcdCluster::sql_try($s, "SELECT lockfence.etcd_unlock('$k')")->{out},
	't', 'TLS: etcd_unlock succeeds');
like($etcd->etcdctl('get', '--prefix', '--keys-only', 't1'), qr/^\s*$/,
	'TLS: the lock key is gone from etcd after unlock');

# Each failure case: SET the parameters, expect a class 08 error within
# the request timeout, then RESET and check the session still works.
# Optional checks: sqlstate (a pattern), text (a pattern for the whole
# error report).
sub fails_08
{
	my ($label, $sets, $detail_re, $fast, %more) = @_;
	# a new endpoint string: no TLS connection kept from before is reused
	LockfenceTest::EtcdCluster::sql_try($s,
		"SET lockfence.etcd_endpoints = '" . $etcd->endpoints . "/'");
	LockfenceTest::EtcdCluster::sql_try($s, "SET $_") for @$sets;
	my $rd0 = LockfenceTest::EtcdCluster::run_delay($s->{pid});
	my $r = LockfenceTest::EtcdCluster::sql_try($s,
		"SELECT * FROM lockfence.etcd_lock('t2', 5, '5s')");
	ok(!$r->{ok}, "$label: etcd_lock fails");
	like($r->{sqlstate} // '', qr/^08/, "$label: SQLSTATE class 08") or diag explain $r;
	like($r->{detail} // '', $detail_re, "$label: errdetail says why") or diag explain $r;
	cmp_ok($r->{secs}, '<', 4.5, "$label: error within the request timeout");
	like($r->{sqlstate} // '', $more{sqlstate}, "$label: SQLSTATE $r->{sqlstate}")
	  if $more{sqlstate};
	like($r->{stderr}, $more{text}, "$label: the TLS failure in the error report")
	  if $more{text};
	# a certificate problem cannot go away by retrying: no retry loop
	if ($fast)
	{
		is($r->{sqlstate}, '08001', "$label: SQLSTATE 08001");
		# on the server, from the statement's start to its error, less the
		# time the backend waited for a CPU (a loaded machine's, not the
		# code's): the client's clock also counts psql and the run queue,
		# and once read 1.547 s on a busy CI lane
		my ($ms, $cpu_ms) = LockfenceTest::EtcdCluster::late_ms(
			LockfenceTest::EtcdCluster::statement_duration($node, $s->{pid}),
			$s->{pid}, $rd0);
		cmp_ok($ms, '<', 1500,
			sprintf('%s: fails at once, without retrying until the timeout (%.1f ms, and %.1f ms waiting for a CPU)',
				$label, $ms, $cpu_ms));
	}
	LockfenceTest::EtcdCluster::sql_try($s, 'RESET ALL');
	is(LockfenceTest::EtcdCluster::sql_try($s, 'SELECT 1')->{out}, '1', "$label: session still usable");
	return;
}

fails_08('no CA (system store only)', ["lockfence.etcd_cafile = ''"],
	qr/certificate|SSL|issuer/i, 1);
fails_08('wrong CA', ["lockfence.etcd_cafile = '" . $other->ca_file . "'"],
	qr/certificate|SSL|issuer/i, 1, text => qr/certificate/i);
# With TLS 1.3 the server rejects the missing certificate after the client
# considers the handshake done, so libcurl's text varies with timing
# ("alert bad certificate", "getpeername() failed ..."): only ask that the
# endpoint is named.  The server refuses the missing certificate only after
# the handshake, so libcurl reports a failed connection (08001) or a read
# error (08006), with the alert itself or the connection it closed.
fails_08('no client certificate',
	[ "lockfence.etcd_certfile = ''", "lockfence.etcd_keyfile = ''" ],
	qr{https://127\.0\.0\.1:\d+}, 0,
	sqlstate => qr/^080(01|06)$/,
	text => qr/certificate|alert|not connected|reset|closed|SSL_ERROR_ZERO_RETURN/i);
fails_08('CA file missing', ["lockfence.etcd_cafile = '/nonexistent/ca.pem'"],
	qr/CA|certificate|SSL|cert|file/i, 1);
# libcurl 8.10 and later serve an http:// URL over a cached TLS connection
# to the same host and port: this case needs a session that has none.
$s->quit;
$s = LockfenceTest::EtcdCluster::session($node);
fails_08('plain http to an https endpoint', ["lockfence.etcd_endpoints = 'http://127.0.0.1:" . ($etcd->endpoints =~ /:(\d+)$/)[0] . "'"],
	qr/./);

is_deeply([ $etcd->keys('t') ], [], 'no key left behind');

# After all that, the configured TLS settings work again.
$r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('t3', 5, '10s')");
is($r->{out}, 't', 'TLS works again after the failures (RESET ALL)') or diag explain $r;

# 2. The TLS settings are superuser-only, and an ordinary role with
# EXECUTE on the lock functions uses the superuser's TLS configuration.
$node->safe_psql('postgres', <<'EOF');
CREATE ROLE plain LOGIN;
GRANT EXECUTE ON FUNCTION lockfence.etcd_lock(text, integer, interval, text) TO plain;
GRANT EXECUTE ON FUNCTION lockfence.etcd_unlock(text, boolean) TO plain;
EOF
LockfenceTest::EtcdCluster::check_superuser_only($node, 'plain',
	'lockfence.etcd_cafile', 'lockfence.etcd_certfile', 'lockfence.etcd_keyfile');
is( $node->safe_psql('postgres',
		"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('t4', 5, '10s')",
		extra_params => [ '-U', 'plain' ]),
	't', 'plain role with EXECUTE locks over TLS configured by the superuser');

# A TLS failure tells that role no file name it may not SHOW: libcurl's
# text ("error setting certificate file: /...") names the setting instead.
my $secret_ca = '/nonexistent/secret-ca-7d1e.pem';
$node->safe_psql('postgres',
	"ALTER SYSTEM SET lockfence.etcd_cafile = '$secret_ca'; SELECT pg_reload_conf()");
$node->poll_query_until('postgres',
	"SELECT current_setting('lockfence.etcd_cafile') = '$secret_ca'")
  or die 'the reload of lockfence.etcd_cafile was not seen';
my $plain = LockfenceTest::EtcdCluster::session($node, 'plain');
$r = LockfenceTest::EtcdCluster::sql_try($plain,
	"SELECT * FROM lockfence.etcd_lock('t7', 5, '5s')");
$plain->quit;
like($r->{sqlstate} // '', qr/^08/, 'plain role, CA file missing: SQLSTATE class 08') or diag explain $r;
unlike($r->{stderr}, qr/secret-ca/, '... and the error does not name the file') or diag explain $r;
like($r->{stderr}, qr/lockfence\.etcd_cafile/, '... but the setting') or diag explain $r;
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET lockfence.etcd_cafile; SELECT pg_reload_conf()');
$node->poll_query_until('postgres',
	"SELECT current_setting('lockfence.etcd_cafile') <> '$secret_ca'")
  or die 'the reset of lockfence.etcd_cafile was not seen';

# 3. TLS and etcd user authentication together.  (etcd 3.4.23's JSON
# gateway refuses client certificates that carry a CN when auth is on; the
# harness's client certificate has none.)
my $both = LockfenceTest::EtcdCluster->new(members => 1, tls => 1, auth => 1, name => 'tls-auth');
$both->start;
$s->query_safe("SET lockfence.etcd_endpoints = '" . $both->endpoints . "'");
$s->query_safe("SET lockfence.etcd_cafile = '" . $both->ca_file . "'");
$s->query_safe("SET lockfence.etcd_certfile = '" . $both->client_cert_file . "'");
$s->query_safe("SET lockfence.etcd_keyfile = '" . $both->client_key_file . "'");
$s->query_safe("SET lockfence.etcd_user = '$LockfenceTest::EtcdCluster::USER_NAME'");
$s->query_safe("SET lockfence.etcd_password = '$LockfenceTest::EtcdCluster::USER_PASSWORD'");
$r = LockfenceTest::EtcdCluster::sql_try($s,
	"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('t5', 5, '10s')");
is($r->{out}, 't', 'TLS with client certificate plus etcd user authentication') or diag explain $r;

# A waiter's watch over TLS with authentication: it gets the lock once the
# holder releases it.
my $h = LockfenceTest::EtcdCluster::session($node);
$h->query_safe("SET lockfence.$_->[0] = '$_->[1]'")
  for ([ 'etcd_endpoints', $both->endpoints ], [ 'etcd_cafile', $both->ca_file ],
	[ 'etcd_certfile', $both->client_cert_file ], [ 'etcd_keyfile', $both->client_key_file ],
	[ 'etcd_user', $LockfenceTest::EtcdCluster::USER_NAME ],
	[ 'etcd_password', $LockfenceTest::EtcdCluster::USER_PASSWORD ]);
my $hkey = $h->query_safe("SELECT key FROM lockfence.etcd_lock('t6', 30, '10s')");
LockfenceTest::EtcdCluster::send_query($s,
	"SELECT key || ' ' || token FROM lockfence.etcd_lock('t6', 30, '20s');");
ok($both->wait_for_keys('t6/', 2), 'TLS and auth: the waiter queued behind the holder');
$h->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($s, 20);
my ($wkey, $wtoken) = split / /, $out;
ok(defined $wtoken && $wtoken =~ /^\d+$/,
	'TLS and auth: the waiter is woken by its watch and gets the lock')
  or diag("stdout: $out\nstderr: $err");
$s->query_safe("SELECT lockfence.etcd_unlock('$wkey')") if $wkey;
$h->quit;

$s->quit;
$node->stop;
$both->stop;
$etcd->stop;
done_testing();
