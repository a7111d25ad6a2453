
# Leases where advisory locks break:
#
# - a synchronous standby promoted after the primary crashed has the lease
#   (same token, same expiry): once the promotion is accepted
#   (lockfence.accept_promotion(); refused with LF004 before), its holder
#   renews, fences and releases it there, and the next grant is higher;
# - through pgbouncer in transaction pooling, where clients share server
#   connections: a lease belongs to its token, not to a backend, so a
#   second client on the same server connection does not get it (an
#   advisory lock would be re-entered), and a client renews with its token
#   from any connection.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use LockfenceTest::Node qw(init_node poll_until_answers);

# --- promotion of a synchronous standby --------------------------------------

my $primary = PostgreSQL::Test::Cluster->new('lease_primary');
init_node($primary, allows_streaming => 1);
$primary->append_conf('postgresql.conf',
	"shared_preload_libraries = 'lockfence'\n");
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION lockfence');
$primary->backup('b');

my $standby = PostgreSQL::Test::Cluster->new('lease_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
# init_from_backup names the standby's connection after the node.
$primary->append_conf('postgresql.conf',
	"synchronous_standby_names = 'lease_standby'\n");
$primary->reload;
$primary->poll_query_until('postgres',
	"SELECT sync_state = 'sync' FROM pg_stat_replication")
  or die 'standby did not become synchronous';

my $tok = $primary->safe_psql('postgres',
	"SELECT token FROM lockfence.lease_acquire('leader', '5 min', 'node-a')");
is($tok, '1', 'lease granted on the primary (committed on the sync standby)');
my $expires = $primary->safe_psql('postgres',
	"SELECT lease_expires_at FROM lockfence.fences WHERE resource = 'leader'");

my ($ret, $out, $err) = $standby->psql('postgres',
	"SELECT * FROM lockfence.lease_try_acquire('leader', '1 min', 'node-b')");
like($err, qr/read-only|recovery/, 'a standby grants nothing');

$primary->stop('immediate');
$standby->promote;

# Every promotion is refused (LF004) until accepted or floored; this one
# was synchronous, so it lost nothing: the operator accepts it.
($ret, $out, $err) = $standby->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT lockfence.lease_renew('leader', 1)");
like($err, qr/LF004/, 'right after the promotion, lease_renew is refused (LF004)');
$standby->safe_psql('postgres', 'SELECT lockfence.accept_promotion()');

is($standby->safe_psql('postgres',
	"SELECT lease_expires_at FROM lockfence.fences WHERE resource = 'leader'"),
	$expires, 'the promoted standby has the lease, with its expiry');
is($standby->safe_psql('postgres',
	"SELECT count(token) FROM lockfence.lease_try_acquire('leader', '1 min', 'node-b')"),
	'0', 'it is still held there');
is($standby->safe_psql('postgres',
	"SELECT lockfence.lease_renew('leader', 1) > clock_timestamp()"),
	't', 'the holder renews it on the new primary with its token');
is($standby->safe_psql('postgres',
	"SELECT lockfence.fence('leader', 1, 'node-a')"), '1',
	'and fences with it');
is($standby->safe_psql('postgres',
	"SELECT lockfence.lease_release('leader', 1)"), 't', 'and releases it');
is($standby->safe_psql('postgres',
	"SELECT token FROM lockfence.lease_acquire('leader', '1 min', 'node-b')"),
	'2', 'the next grant is higher');
$standby->stop;

# --- pgbouncer, transaction pooling ------------------------------------------

SKIP:
{
	my $pgbouncer = '/usr/sbin/pgbouncer';
	skip 'pgbouncer is not installed', 7 unless -x $pgbouncer;

	my $node = PostgreSQL::Test::Cluster->new('lease_pgb');
	init_node($node);
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'lockfence'\n");
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION lockfence');

	my $dir = PostgreSQL::Test::Utils::tempdir;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $user = getpwuid($<);
	open my $fh, '>', "$dir/pgbouncer.ini" or die $!;
	print $fh <<"EOC";
[databases]
postgres = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=postgres user=$user

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 1
max_client_conn = 20
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOC
	close $fh;
	my $h = IPC::Run::start([ $pgbouncer, "$dir/pgbouncer.ini" ],
		'>', "$dir/out", '2>', "$dir/err");
	END { $h->kill_kill if $h; }

	# A node object standing for pgbouncer, for its psql helpers.
	my $front = PostgreSQL::Test::Cluster->new('lease_pgb_front', port => $port);
	$front->{_host} = '127.0.0.1';
	# (not poll_query_until: its psql dies writing to a pgbouncer not yet
	# listening; see poll_until_answers)
	ok(poll_until_answers($front, 'postgres', 'SELECT true'), 'pgbouncer answers');

	# Two clients, one server connection (default_pool_size = 1).
	my @clients = map { $front->background_psql('postgres') } (0, 1);
	my $pid_a = $clients[0]->query_safe('SELECT pg_backend_pid()');
	my $pid_b = $clients[1]->query_safe('SELECT pg_backend_pid()');
	is($pid_a, $pid_b, 'both clients run on the same server connection');

	# What advisory locks do here: the second client "gets" the lock too.
	$clients[0]->query_safe('SELECT pg_advisory_lock(42)');
	is($clients[1]->query_safe('SELECT pg_try_advisory_lock(42)'), 't',
		'advisory lock: the second client gets it as well (the backend holds it)');

	my $t = $clients[0]->query_safe(
		"SELECT token FROM lockfence.lease_acquire('pooled', '1 min', 'a')");
	is($clients[1]->query_safe(
		"SELECT count(token) FROM lockfence.lease_try_acquire('pooled', '1 min', 'b')"),
		'0', 'lease: the second client on the same connection does not get it');
	is($front->safe_psql('postgres',
		"SELECT lockfence.lease_renew('pooled', $t) > clock_timestamp()"),
		't', 'the holder renews from a new client connection');
	is($front->safe_psql('postgres',
		"BEGIN; SELECT lockfence.fence('pooled', $t, 'a'); COMMIT;"),
		$t, 'and fences with its token there');
	$_->quit for @clients;
	$h->kill_kill;
	$node->stop;
}

done_testing();
