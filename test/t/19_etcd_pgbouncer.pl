
# 19_etcd_pgbouncer.pl
#	  Lock scopes behind a real pgbouncer in transaction pooling mode
#	  (issue 9, item 2), pool of 2 server connections:
#	  - client disconnect mid-transaction: a transaction-scoped lock is
#	    released at once; a session-scoped lock taken through the pooler
#	    leaks until its TTL (the server backend stays in the pool);
#	  - server_lifetime: pgbouncer retires only idle servers, so it cannot
#	    take a transaction-scoped lock away while its transaction runs;
#	  - pool exhaustion: with waiters holding every pooled server, the
#	    holder of a transaction-scoped lock still releases it, by COMMIT on
#	    the server it holds (a session-scoped holder would need a free
#	    server to call etcd_unlock).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use File::Temp qw(tempdir);

use LockfenceTest::EtcdCluster;

plan skip_all => 'pgbouncer is not installed (scripts/install-deps.sh)'
  unless -x '/usr/sbin/pgbouncer';

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'bouncer');
$etcd->start;
my $node = LockfenceTest::EtcdCluster::pg_node('etcd_bouncer',
	"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n");

my $user = getpwuid($<);
my $dir = tempdir(CLEANUP => 1);
my $bport = LockfenceTest::EtcdCluster::free_port();
open my $fh, '>', "$dir/userlist.txt" or die $!;
print $fh "\"$user\" \"\"\n";
close $fh;
my $host = $node->host;
my $port = $node->port;
# pgbouncer.ini with server_lifetime = $lifetime (seconds).  It is 3 s only
# for the server_lifetime section: before it, a pooled server retired for
# its age would take the session-scoped lock of the disconnect section
# with it (its backend exits and revokes the lease), and that check waits
# 2 s after the server was connected, close to 3 s on a loaded machine.
sub write_ini
{
	my ($lifetime) = @_;
	open my $fh, '>', "$dir/pgbouncer.ini" or die $!;
	print $fh join("\n",
		'[databases]',
		"postgres = host=$host port=$port dbname=postgres user=$user",
		'',
		'[pgbouncer]',
		'listen_addr = 127.0.0.1',
		"listen_port = $bport",
		'unix_socket_dir =',
		'auth_type = any',
		"auth_file = $dir/userlist.txt",
		'pool_mode = transaction',
		'default_pool_size = 2',
		'max_client_conn = 20',
		"server_lifetime = $lifetime",
		'server_idle_timeout = 0',
		"admin_users = $user",
		"logfile = $dir/pgbouncer.log",
		"pidfile = $dir/pgbouncer.pid",
		'');
	close $fh;
	return;
}
write_ini(3600);
system('/usr/sbin/pgbouncer', '-d', "$dir/pgbouncer.ini") == 0
  or die "pgbouncer did not start";
END
{
	if ($dir && -f "$dir/pgbouncer.pid")
	{
		my $p = `cat $dir/pgbouncer.pid`;
		chomp $p;
		kill 'TERM', $p if $p;
	}
}
my $psql = $node->installed_command('psql');
LockfenceTest::EtcdCluster::poll_until(10, sub {
	system("$psql -XAtq -h 127.0.0.1 -p $bport -d postgres -c 'SELECT 1' >/dev/null 2>&1") == 0 })
  or die "pgbouncer does not answer";

# A psql client connected through pgbouncer.
sub client
{
	my $c = $node->bouncer_psql("host=127.0.0.1 port=$bport dbname=postgres");
	$c->query_safe('\set VERBOSITY verbose');
	return $c;
}

sub held { my $p = shift; return scalar($etcd->keys($p)); }
sub gone_within { my ($p, $s) = @_; return LockfenceTest::EtcdCluster::poll_until($s, sub { !held($p) }); }

# --- client disconnect -------------------------------------------------------
my $a = client();
$a->query_safe('BEGIN');
$a->query_safe("SELECT key FROM lockfence.etcd_lock('bx1', 30, scope => 'transaction')");
is(held('bx1/'), 1, 'transaction-scoped lock held through pgbouncer');
my $t0 = time;
$a->{run}->kill_kill;
ok(gone_within('bx1/', 5), sprintf('client disconnect mid-transaction: released at once (%.1f s, TTL 30 s)', time - $t0));

my $b = client();
$b->query_safe("SELECT key FROM lockfence.etcd_lock('bx2', 30)");
$b->{run}->kill_kill;
sleep 2;
is(held('bx2/'), 1, 'a session-scoped lock outlives its pooled client (the server backend stays in the pool)');
$etcd->etcdctl('del', '--prefix', 'bx2/');

# --- server_lifetime ---------------------------------------------------------
# now 3 s: RELOAD on the admin console rereads the file before it answers
write_ini(3);
is(system("$psql -XAtq -h 127.0.0.1 -p $bport -d pgbouncer -c RELOAD >/dev/null"), 0,
	'pgbouncer reloaded its configuration');
like(`$psql -XAtq -h 127.0.0.1 -p $bport -d pgbouncer -c 'SHOW CONFIG'`,
	qr/^server_lifetime\|3\|/m, '... with server_lifetime = 3');
my $c = client();
$c->query_safe('BEGIN');
$c->query_safe("SELECT key FROM lockfence.etcd_lock('bx3', 30, scope => 'transaction')");
sleep 5;    # longer than server_lifetime (3 s)
is(held('bx3/'), 1, 'server_lifetime does not retire the server of a running transaction: the lock is still held');
$c->query_safe('COMMIT');
ok(gone_within('bx3/', 5), '... and COMMIT releases it');
$c->quit;

# --- pool exhaustion ---------------------------------------------------------
my $h = client();
$h->query_safe('BEGIN');
$h->query_safe("SELECT key FROM lockfence.etcd_lock('bx4', 30, scope => 'transaction')");
my $w1 = client();
my $w2 = client();
LockfenceTest::EtcdCluster::send_query($w1,
	"BEGIN; SELECT 'w1:' || token FROM lockfence.etcd_lock('bx4', 30, '20 s', scope => 'transaction'); COMMIT;");
LockfenceTest::EtcdCluster::send_query($w2,
	"BEGIN; SELECT 'w2:' || token FROM lockfence.etcd_lock('bx4', 30, '20 s', scope => 'transaction'); COMMIT;");
ok($etcd->wait_for_keys('bx4/', 2), 'a waiter queued on the second pooled server');
usleep(500_000);
is(held('bx4/'), 2, 'the other waiter waits for a server (pool exhausted)');
$t0 = time;
$h->query_safe('COMMIT');
my $commit_s = time - $t0;
ok($commit_s < 3, sprintf('the holder releases by COMMIT on its own server while the pool is exhausted (%.2f s)', $commit_s));
my ($o1) = LockfenceTest::EtcdCluster::wait_result($w1, 30);
my ($o2) = LockfenceTest::EtcdCluster::wait_result($w2, 30);
like("$o1 $o2", qr/w1:\d+/, 'the first waiter got the lock');
like("$o1 $o2", qr/w2:\d+/, 'the second waiter got it in turn');
ok(gone_within('bx4/', 5), 'and every transaction-scoped lock is released');
$_->quit for ($h, $w1, $w2);

$node->stop;
$etcd->stop;
done_testing();

package PostgreSQL::Test::Cluster;

# A background psql connected with connstr (through pgbouncer).
sub bouncer_psql
{
	my ($self, $connstr) = @_;
	local %ENV = $self->_get_env();
	return PostgreSQL::Test::BackgroundPsql->new(0,
		[ $self->installed_command('psql'), '-XAtq', '-d', $connstr, '-f', '-' ]);
}
