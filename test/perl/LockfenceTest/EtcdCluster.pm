
=pod

=head1 NAME

LockfenceTest::EtcdCluster - start real etcd members for lockfence tests

=head1 SYNOPSIS

  use LockfenceTest::EtcdCluster;

  my $etcd = LockfenceTest::EtcdCluster->new(members => 3, tls => 1, auth => 1);
  $etcd->start;
  my $urls = $etcd->endpoints;          # comma-separated client URLs
  my $i = $etcd->leader_index;          # which member leads now
  $etcd->kill_member($i);               # SIGKILL, as in a crash
  $etcd->restart_member($i);
  $etcd->etcdctl('put', 'k', 'v');      # as root when auth is on
  my @keys = $etcd->keys('job/');       # keys under a prefix
  my @leases = $etcd->leases;           # live lease IDs, hex as in lock keys
  my $h = $etcd->start_etcdctl_lock('job', 'sleep 30');  # background holder
  $etcd->stop;                          # also done by END, even on failure

  # Concurrent psql sessions
  my $s = LockfenceTest::EtcdCluster::session($node);   # $s->{pid}
  LockfenceTest::EtcdCluster::send_query($s, 'SELECT ...;');
  my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($s, 60);

=head1 DESCRIPTION

Starts one to five members of Debian's etcd-server (3.4) on 127.0.0.1 with
free client and peer ports and data in a temporary folder (on /dev/shm when
available, unless LOCKFENCE_ETCD_DATA_ON_DISK is set), optionally
serving clients over TLS with client-certificate checking (a CA, a server
and a client certificate are made with openssl when the cluster starts),
and optionally with authentication enabled (user root, plus a user with a
read-write role on the whole keyspace).  start() returns once every member
answers a health check.  Every member ever started is killed by an END
block, whatever the outcome of the test.

Peers always talk plain HTTP to each other on loopback; only the client
side is TLS.  Nothing here mocks etcd.

=cut

package LockfenceTest::EtcdCluster;

use strict;
use warnings;

use Carp;
use File::Path ();
use File::Spec;
use File::Temp ();
use HTTP::Tiny;
use Test::More ();
use IO::Socket::INET;
use IPC::Run ();
# Loaded at compile time (its INIT block sets up the port lock folder).
use PostgreSQL::Test::Cluster ();
use LockfenceTest::Node ();
use JSON::PP;
use MIME::Base64 ();
use POSIX ();
use Time::HiRes qw(usleep time);

# Every member started by any cluster object: pid => 1.  END kills them.
my %live_pids;

# Background etcdctl lock holders (IPC::Run handles); END kills them.
my @bg_locks;

# etcd data folders on /dev/shm: removed in END even when a failed test
# makes PostgreSQL::Test::Utils keep temporary folders (they hold about
# 60 MB of preallocated WAL per member, in memory; logs stay in /tmp).
my @shm_dirs;

# Ports handed out in this process, so two clusters never share one.
my %used_ports;

# The process that loaded this module; forked children must not clean up.
my $owner_pid = $$;

# A test interrupted by SIGINT/SIGTERM must still run END blocks, which
# stop the members (they run in their own process group and would not get
# the signal themselves).
for my $sig (qw(INT TERM HUP))
{
	$SIG{$sig} = sub { die "lockfence test interrupted by SIG$sig\n"; }
	  unless ref $SIG{$sig};
}

# test/fault_http_server.py, found next to test/perl/ (absolute, in case a
# test changes directory later).
my $fault_script = File::Spec->rel2abs(__FILE__);
$fault_script =~ s{perl/LockfenceTest/EtcdCluster\.pm$}{fault_http_server.py};

our $ETCD = $ENV{ETCD_BIN} // '/usr/bin/etcd';
our $ETCDCTL = $ENV{ETCDCTL_BIN} // '/usr/bin/etcdctl';

# How long a member or helper started here may take to answer before its
# start counts as failed: generous, as it bounds only a failure (see
# wait_healthy).
our $START_DEADLINE_S = 120;

# Test credentials.  Deliberately recognisable, so tests can grep logs for them.
our $ROOT_PASSWORD = 'root-Pw-5f2c9a';
our $USER_NAME = 'lockuser';
our $USER_PASSWORD = 'lockuser-Pw-8d41e7';

=pod

=head1 METHODS

=over

=item new(members => N, tls => 0|1, auth => 0|1, name => 'x')

Describe a cluster; nothing runs until start().

=cut

sub new
{
	my ($class, %args) = @_;
	my $self = {
		members => $args{members} // 1,
		tls => $args{tls} // 0,
		auth => $args{auth} // 0,
		name => $args{name} // 'lfetcd',
		heartbeat_ms => $args{heartbeat_ms} // 100,
		election_ms => $args{election_ms} // 1000,
		member => [],
		owner_pid => $$,
	};
	croak "members must be 1..5" if $self->{members} < 1 || $self->{members} > 5;
	# Removed by File::Temp's own END block, which runs after ours (END
	# blocks run in reverse order of compilation), i.e. after the members
	# are dead.
	$self->{dir} = File::Temp::tempdir("lf_etcd_XXXXXX", TMPDIR => 1, CLEANUP => 1);
	# etcd's data on tmpfs when there is one: disk stalls on a shared CI
	# machine can outlast the short lease TTLs the tests use.
	$self->{data_root} = $self->{dir};
	if (!$ENV{LOCKFENCE_ETCD_DATA_ON_DISK} && -d '/dev/shm' && -w '/dev/shm')
	{
		$self->{data_root} = File::Temp::tempdir("lf_etcd_data_XXXXXX",
			DIR => '/dev/shm', CLEANUP => 1);
		push @shm_dirs, $self->{data_root};
	}
	return bless $self, $class;
}

=pod

=item free_port()

A TCP port on 127.0.0.1 that nothing listens on right now, not handed out
before by this process, and reserved for it: PostgreSQL::Test::Cluster's
get_free_port(), which takes ports below the kernel's ephemeral range (so
no outgoing connection takes it meanwhile) and writes a reservation into
its port lock folder (PG_TEST_PORT_DIR; test/run-all.sh gives all its
parallel TAP files one folder), so TAP files running side by side never
pick the same port for etcd, a proxy, pgbouncer or a PostgreSQL node.

=cut

sub free_port
{
	for (1 .. 50)
	{
		my $port = PostgreSQL::Test::Cluster::get_free_port();
		next if $used_ports{$port}++;
		return $port;
	}
	croak "no free port found";
}

=pod

=item dir(), scheme(), endpoints(), endpoint_list()

The temporary folder; "http" or "https"; the client URLs of all members as
one comma-separated string, or as a list.

=cut

sub dir { return $_[0]->{dir}; }
sub scheme { return $_[0]->{tls} ? 'https' : 'http'; }

sub endpoint_list
{
	my ($self) = @_;
	return map { $_->{client_url} } @{ $self->{member} };
}

sub endpoints
{
	my ($self) = @_;
	return join(',', $self->endpoint_list);
}

=pod

=item client_url(i), pid(i), is_running(i)

=cut

sub client_url { return $_[0]->{member}[ $_[1] ]{client_url}; }
sub pid { return $_[0]->{member}[ $_[1] ]{pid}; }
sub is_running { return defined $_[0]->{member}[ $_[1] ]{pid}; }

=pod

=item ca_file(), client_cert_file(), client_key_file(), server_cert_file(), server_key_file()

Paths of the test PKI (only with tls => 1).

=cut

sub ca_file { return $_[0]->{dir} . '/pki/ca.crt'; }
sub server_cert_file { return $_[0]->{dir} . '/pki/server.crt'; }
sub server_key_file { return $_[0]->{dir} . '/pki/server.key'; }
sub client_cert_file { return $_[0]->{dir} . '/pki/client.crt'; }
sub client_key_file { return $_[0]->{dir} . '/pki/client.key'; }

# Run a command without a shell; return (exit code, stdout and stderr).
sub _capture
{
	my (@cmd) = @_;
	my $out = '';
	local $ENV{ETCDCTL_API} = 3;
	IPC::Run::run(\@cmd, '<', \undef, '>', \$out, '2>&1');
	return ($? >> 8, $out);
}

# Run a command, croak with its output on failure; return the output.
sub _run
{
	my (@cmd) = @_;
	my ($rc, $out) = _capture(@cmd);
	croak "command failed (exit $rc): @cmd\n$out" if $rc != 0;
	return $out;
}

=pod

=item make_pki()

Create a throw-away CA, a server certificate for 127.0.0.1/localhost
(usable for server and client auth: etcd's own JSON gateway presents it
when it calls the gRPC server) and a client certificate (no CN,
see below).  EC keys, valid for two days.

=cut

sub make_pki
{
	my ($self) = @_;
	my $p = "$self->{dir}/pki";
	mkdir $p or croak "mkdir $p: $!";
	my @ec = ('-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes');

	_run('openssl', 'req', '-x509', @ec, '-keyout', "$p/ca.key",
		'-out', "$p/ca.crt", '-days', '2', '-subj', '/CN=lockfence test CA',
		'-addext', 'basicConstraints=critical,CA:TRUE',
		'-addext', 'keyUsage=critical,keyCertSign,cRLSign');

	my %ext = (
		server => "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
		  . "extendedKeyUsage=serverAuth,clientAuth\n"
		  . "keyUsage=critical,digitalSignature,keyEncipherment\n",
		client => "extendedKeyUsage=clientAuth\n"
		  . "keyUsage=critical,digitalSignature,keyEncipherment\n");
	# The client certificate carries no CN: with auth enabled, etcd 3.4.23's
	# JSON gateway rejects any client certificate that has one (HTTP 400,
	# "CommonName of client sending a request against gateway will be
	# ignored and not used as expected").
	my %subj = (server => '/CN=lockfence-etcd-server', client => '/O=lockfence test client');
	for my $who (qw(server client))
	{
		open my $fh, '>', "$p/$who.ext" or croak $!;
		print $fh $ext{$who};
		close $fh;
		_run('openssl', 'req', @ec, '-keyout', "$p/$who.key",
			'-out', "$p/$who.csr", '-subj', $subj{$who});
		_run('openssl', 'x509', '-req', '-in', "$p/$who.csr",
			'-CA', "$p/ca.crt", '-CAkey', "$p/ca.key", '-CAcreateserial',
			'-out', "$p/$who.crt", '-days', '2', '-extfile', "$p/$who.ext");
	}
	chmod 0600, "$p/ca.key", "$p/server.key", "$p/client.key";
	return;
}

=pod

=item start()

Allocate ports, make the PKI if needed, start every member, wait until all
are healthy, then enable authentication if asked.  Dies (after killing
what it started) when the cluster does not come up within 30 seconds.

=cut

sub start
{
	my ($self) = @_;
	$self->make_pki if $self->{tls} && !-e $self->ca_file;

	my @m;
	for my $i (0 .. $self->{members} - 1)
	{
		my $cport = free_port();
		my $pport = free_port();
		push @m, {
			index => $i,
			name => "m$i",
			client_port => $cport,
			peer_port => $pport,
			client_url => $self->scheme . "://127.0.0.1:$cport",
			peer_url => "http://127.0.0.1:$pport",
			data_dir => "$self->{data_root}/m$i.data",
			log => "$self->{dir}/m$i.log",
		};
	}
	$self->{member} = \@m;
	$self->{initial_cluster} = join(',', map { "$_->{name}=$_->{peer_url}" } @m);

	$self->_spawn($_, 'new') for 0 .. $#m;
	$self->wait_healthy;
	$self->_enable_auth if $self->{auth};
	return $self;
}

# Fork and exec one member.  The child never returns into the test.
sub _spawn
{
	my ($self, $i, $state) = @_;
	my $m = $self->{member}[$i];
	my @cmd = ($ETCD,
		'--name', $m->{name},
		'--data-dir', $m->{data_dir},
		'--listen-client-urls', $m->{client_url},
		'--advertise-client-urls', $m->{client_url},
		'--listen-peer-urls', $m->{peer_url},
		'--initial-advertise-peer-urls', $m->{peer_url},
		'--initial-cluster', $self->{initial_cluster},
		'--initial-cluster-state', $state,
		'--initial-cluster-token', "$self->{name}-$$",
		'--heartbeat-interval', $self->{heartbeat_ms},
		'--election-timeout', $self->{election_ms},
		'--logger', 'zap', '--log-outputs', 'stderr',
		'--enable-pprof=false',
		# bcrypt's cheapest cost for the users the tests add: at etcd's
		# default (10) each authentication hashes 2^10 rounds, which took
		# over 3 s at a load of 20 and failed TAP 43's lock calls on every
		# major ("etcd did not answer /v3/auth/authenticate in time").
		# The tests are of lockfence's handling of the credentials, not of
		# etcd's hashing.
		'--bcrypt-cost', '4');
	if ($self->{tls})
	{
		push @cmd,
		  '--cert-file', $self->server_cert_file,
		  '--key-file', $self->server_key_file,
		  '--trusted-ca-file', $self->ca_file,
		  '--client-cert-auth';
	}

	my $pid = fork;
	croak "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		# Own process group, so a ^C aimed at the test does not race END.
		POSIX::setpgid(0, 0);
		open STDIN, '<', '/dev/null';
		open STDOUT, '>>', $m->{log};
		open STDERR, '>&', \*STDOUT;
		{ exec @cmd; }
		POSIX::_exit(127);
	}
	$m->{pid} = $pid;
	$live_pids{$pid} = 1;
	return $pid;
}

=pod

=item etcdctl(args...) / etcdctl_at(endpoints, args...)

Run etcdctl (v3 API) against all members (or the given endpoint list), with
the TLS files and the root credentials as configured.  Returns stdout;
croaks on failure.  etcdctl_try returns (exit code, output) instead.

=cut

sub _etcdctl_cmd
{
	my ($self, $endpoints, @args) = @_;
	# 10 s: with authentication on, each call first checks the root
	# password (bcrypt; before --bcrypt-cost 4 that took over 5 s at load
	# 20, "context deadline exceeded" in 43's setup); short enough that a call stuck on a paused
	# member still leaves a 20 s poll_until room to try again.
	my @cmd = ($ETCDCTL, "--endpoints=$endpoints", '--dial-timeout=2s',
		'--command-timeout=10s');
	if ($self->{tls})
	{
		push @cmd, '--cacert=' . $self->ca_file,
		  '--cert=' . $self->client_cert_file,
		  '--key=' . $self->client_key_file;
	}
	push @cmd, "--user=root:$ROOT_PASSWORD" if $self->{auth_on};
	return (@cmd, @args);
}

sub etcdctl_try
{
	my ($self, @args) = @_;
	return _capture($self->_etcdctl_cmd($self->_live_endpoints, @args));
}

sub etcdctl
{
	my ($self, @args) = @_;
	my ($rc, $out) = $self->etcdctl_try(@args);
	croak "etcdctl @args failed ($rc): $out" if $rc != 0;
	return $out;
}

sub etcdctl_at
{
	my ($self, $endpoints, @args) = @_;
	my ($rc, $out) = _capture($self->_etcdctl_cmd($endpoints, @args));
	croak "etcdctl @args failed: $out" if $rc != 0;
	return $out;
}

sub _live_endpoints
{
	my ($self) = @_;
	return join(',', map { $_->{client_url} } grep { defined $_->{pid} } @{ $self->{member} });
}

=pod

=item keys(prefix)

The keys under a prefix, in key order.

=cut

sub keys
{
	my ($self, $prefix) = @_;
	if (my $url = $self->_gateway_url)
	{
		my $r = _gateway_call($url, 'kv/range',
			{ key => MIME::Base64::encode_base64(length($prefix) ? $prefix : "\0", ''),
			  range_end => MIME::Base64::encode_base64(_prefix_end($prefix), ''),
			  keys_only => JSON::PP::true });
		return map { MIME::Base64::decode_base64($_->{key}) } @{ $r->{kvs} // [] };
	}
	my $out = $self->etcdctl('get', '--prefix', '--keys-only', $prefix);
	return grep { $_ ne '' } split /\n/, $out;
}

# The end of the range of keys that start with prefix, as etcdctl's
# --prefix computes it: the prefix with its last byte below 0xff
# incremented and what follows dropped; "\0" (every key) when there is
# none, and then from key "\0" too (an empty key is no key to etcd).
sub _prefix_end
{
	my ($prefix) = @_;
	my @b = unpack('C*', $prefix);
	while (@b)
	{
		if ($b[-1] < 0xff)
		{
			$b[-1]++;
			return pack('C*', @b);
		}
		pop @b;
	}
	return "\0";
}

# The one member's client URL, when keys(), leases() and key_info() can
# ask the JSON gateway in this process instead of starting etcdctl (about
# 40 ms of CPU each on a slow machine, and tests poll them): a single live
# member, plain http, no authentication.  Otherwise undef: etcdctl, which
# handles TLS, credentials and failing over between members.
sub _gateway_url
{
	my ($self) = @_;
	return undef if $self->{tls} || $self->{auth_on} || $self->{members} != 1;
	my $m = $self->{member}[0];
	return defined $m->{pid} ? $m->{client_url} : undef;
}

# POST body (a hash ref, as JSON) to /v3/path at url; the answer decoded.
# Only reads come here, so a failure that says nothing about the answer
# (no connection, or etcd "unavailable": 503, gRPC code 14) is tried again
# every 100 ms, as etcdctl's client retries a read; croaks once 10 s
# (etcdctl's --command-timeout) have passed, or at once on any other error.
sub _gateway_call
{
	my ($url, $path, $body) = @_;
	my $deadline = time + 10;
	while (1)
	{
		my $left = $deadline - time;
		my $r = HTTP::Tiny->new(timeout => $left > 0.5 ? $left : 0.5)->post("$url/v3/$path",
			{ content => JSON::PP::encode_json($body),
			  headers => { 'Content-Type' => 'application/json' } });
		return JSON::PP::decode_json($r->{content}) if $r->{success};
		my $transient = $r->{status} == 599 || $r->{status} == 503
		  || ($r->{content} // '') =~ /"code"\s*:\s*14\b/;
		croak "POST $url/v3/$path failed: $r->{status} $r->{content}"
		  unless $transient && time + 0.1 < $deadline;
		usleep(100_000);
	}
}

=pod

=item leases()

The lease IDs alive now, in lowercase hex without leading zeros (as in
lock keys).

=cut

sub leases
{
	my ($self) = @_;
	if (my $url = $self->_gateway_url)
	{
		my $r = _gateway_call($url, 'lease/leases', {});
		return map { sprintf('%x', $_->{ID}) } @{ $r->{leases} // [] };
	}
	my $out = $self->etcdctl('lease', 'list');
	my @ids;
	foreach my $line (split /\n/, $out)
	{
		# etcdctl pads to 16 digits; lock keys use no padding
		push @ids, $1 if $line =~ /^0*([0-9a-f]+)$/;
	}
	return @ids;
}

=pod

=item key_info(key)

A hash ref { create_revision, lease } for a key (lease in decimal), or
undef when the key does not exist.

=cut

sub key_info
{
	my ($self, $key) = @_;
	if (my $url = $self->_gateway_url)
	{
		my $r = _gateway_call($url, 'kv/range',
			{ key => MIME::Base64::encode_base64($key, '') });
		my $kv = ($r->{kvs} // [])->[0];
		return undef unless defined $kv;
		# the gateway leaves out fields that are zero
		return { create_revision => $kv->{create_revision} // 0,
				 lease => $kv->{lease} // 0 };
	}
	my $out = $self->etcdctl('get', $key, '-w', 'fields');
	return undef unless $out =~ /"CreateRevision"\s*:\s*(\d+)/;
	my %info = (create_revision => $1);
	$info{lease} = $1 if $out =~ /"Lease"\s*:\s*(\d+)/;
	return \%info;
}

=pod

=item grpc_calls(method)

How many gRPC calls of method (Range, Txn, LeaseKeepAlive, Lock...) the
members have started so far, from their metrics (etcd counts the JSON
gateway's requests too).  Plain-http clusters only.

=cut

sub grpc_calls
{
	my ($self, $method) = @_;
	my $n = 0;
	croak 'grpc_calls reads metrics over plain http only' if $self->{tls};
	for my $url ($self->endpoint_list)
	{
		my $r = HTTP::Tiny->new(timeout => 5)->get("$url/metrics");
		croak "GET $url/metrics: $r->{status} $r->{content}" unless $r->{success};
		$n += $1
		  while $r->{content} =~
		  /^grpc_server_started_total\{(?=[^}]*grpc_method="\Q$method\E")[^}]*\}\s+(\d+)/mg;
	}
	return $n;
}

=pod

=item wait_for_keys(prefix, n, seconds)

Poll until exactly n keys exist under prefix (default deadline 30 s), for
instance until waiters have queued their lock keys; true if they did.

=cut

sub wait_for_keys
{
	my ($self, $prefix, $n, $seconds) = @_;
	return poll_until($seconds // 30,
		sub { scalar($self->keys($prefix)) == $n });
}

=pod

=item start_etcdctl_lock(name, command, lock options...)

Start "etcdctl lock NAME -- sh -c 'echo LOCKED; COMMAND'" in the
background, against the running members.  Returns a hash ref { handle
(IPC::Run), out, err }; the holder prints "LOCKED" once it holds the lock
(see wait_for_output).  Killed by END if still running.

=cut

sub start_etcdctl_lock
{
	my ($self, $name, $command, @lockargs) = @_;
	my $bg = { out => '', err => '' };
	local $ENV{ETCDCTL_API} = 3;
	# etcdctl lock waits without a deadline (--command-timeout does not
	# apply to it).
	my @cmd = $self->_etcdctl_cmd($self->_live_endpoints, 'lock', @lockargs,
		$name, '--', 'sh', '-c', "echo LOCKED; $command");
	$bg->{handle} =
	  IPC::Run::start(\@cmd, '<', \undef, '>', \$bg->{out}, '2>', \$bg->{err});
	push @bg_locks, $bg;
	return $bg;
}

=pod

=item wait_healthy(seconds)

Poll until every running member reports healthy (a quorum read through
it succeeds).  Croaks at the deadline (default $START_DEADLINE_S, 120 s),
with the tail of each member log.  The deadline only bounds a failure:
on a machine whose CPUs a hog keeps busy, the niced lanes of the test
command get a few percent of one (under such load TAP 65 took 21 s from
its start, this wait included, to its first connection).

=cut

sub wait_healthy
{
	my ($self, $secs) = @_;
	$secs //= $START_DEADLINE_S;
	my $deadline = time + $secs;
	my $last = '';
	while (time < $deadline)
	{
		my $all = 1;
		for my $m (@{ $self->{member} })
		{
			next unless defined $m->{pid};
			$self->_reap;
			croak "etcd member $m->{name} exited during start:\n" . $self->log_tail($m->{index})
			  unless defined $m->{pid};
			if (!_member_healthy($self, $m, \$last))
			{
				$all = 0;
				last;
			}
		}
		return 1 if $all;
		usleep(200_000);
	}
	my $logs = join('', map { $self->log_tail($_) } 0 .. $#{ $self->{member} });
	croak "etcd cluster not healthy after ${secs}s: $last\n$logs";
}

# Whether member m answers a quorum read; what it said goes to $$last.
# Over plain http, its /health (etcd 3.4: a leader, no alarm, and a
# quorum read within 1 s), asked from this process; over TLS, etcdctl's
# "endpoint health" (a quorum read too), which holds the client
# certificate.  Each etcdctl costs a fork and an exec: about 44 ms of CPU
# here, and a start polls every 200 ms.
sub _member_healthy
{
	my ($self, $m, $last) = @_;
	if (!$self->{tls})
	{
		my $r = HTTP::Tiny->new(timeout => 5)->get("$m->{client_url}/health");
		$$last = "$m->{client_url}/health: $r->{status} " . ($r->{content} // '');
		return $r->{success} && $r->{content} =~ /"health"\s*:\s*"true"/;
	}
	my $rc;
	($rc, $$last) = _capture($self->_etcdctl_cmd($m->{client_url}, 'endpoint', 'health'));
	return $rc == 0 && $$last =~ /is healthy/;
}

=pod

=item log_tail(i, lines)

The last lines of member i's log, for diagnostics.

=cut

sub log_tail
{
	my ($self, $i, $n) = @_;
	$n //= 15;
	my $log = $self->{member}[$i]{log};
	return '' unless -e $log;
	open my $fh, '<', $log or return '';
	my @l = <$fh>;
	close $fh;
	@l = @l[ -$n .. -1 ] if @l > $n;
	return "--- $log\n" . join('', @l);
}

# Turn on authentication: root, a read-write role on every key, a user.
sub _enable_auth
{
	my ($self) = @_;
	$self->etcdctl('user', 'add', 'root', "--new-user-password=$ROOT_PASSWORD", '--interactive=false');
	$self->etcdctl('role', 'add', 'lockrole');
	# Every key: from the smallest non-empty key up.
	$self->etcdctl('role', 'grant-permission', 'lockrole', 'readwrite', "\x01", '--from-key');
	$self->etcdctl('user', 'add', $USER_NAME, "--new-user-password=$USER_PASSWORD", '--interactive=false');
	$self->etcdctl('user', 'grant-role', $USER_NAME, 'lockrole');
	$self->etcdctl('auth', 'enable');
	$self->{auth_on} = 1;
	return;
}

=pod

=item auth_disable() / auth_enable()

Switch authentication off and on again (as root).  Enabling bumps etcd's
auth revision, which invalidates every token handed out before.

=cut

sub auth_disable
{
	my ($self) = @_;
	$self->etcdctl('auth', 'disable');
	$self->{auth_on} = 0;
	return;
}

sub auth_enable
{
	my ($self) = @_;
	$self->{auth_on} = 0;
	$self->etcdctl('auth', 'enable');
	$self->{auth_on} = 1;
	return;
}

=pod

=item status()

Per running member: { index, member_id, leader, raft_term } from
"etcdctl endpoint status".  Members that do not answer are left out.

=cut

sub status
{
	my ($self) = @_;
	my @res;
	for my $m (@{ $self->{member} })
	{
		next unless defined $m->{pid};
		my ($rc, $out) = _capture($self->_etcdctl_cmd($m->{client_url},
			'--command-timeout=1s', 'endpoint', 'status', '-w', 'json'));
		next if $rc != 0;
		my $j = eval { decode_json($out) } or next;
		my $s = $j->[0]{Status} or next;
		push @res, {
			index => $m->{index},
			member_id => $s->{header}{member_id},
			leader => $s->{leader},
			raft_term => $s->{raft_term},
		};
	}
	return @res;
}

=pod

=item leader_index(seconds)

Index of the current leader, polling until the running members agree on
one (default 10 s).  Croaks if none is agreed.

=cut

sub leader_index
{
	my ($self, $secs) = @_;
	my $deadline = time + ($secs // 10);
	while (time < $deadline)
	{
		my @st = $self->status;
		my %lead = map { ($_->{leader} // 0) => 1 } @st;
		if (@st && CORE::keys(%lead) == 1)
		{
			my ($lid) = CORE::keys(%lead);
			for (@st)
			{
				return $_->{index} if $_->{member_id} == $lid && $lid != 0;
			}
		}
		usleep(100_000);
	}
	croak "no agreed etcd leader within deadline";
}

=pod

=item kill_member(i, signal)

Send signal (default KILL) to member i and wait for it to die.

=cut

sub kill_member
{
	my ($self, $i, $sig) = @_;
	my $m = $self->{member}[$i];
	return unless defined $m->{pid};
	kill($sig // 'KILL', $m->{pid});
	waitpid($m->{pid}, 0);
	delete $live_pids{ $m->{pid} };
	$m->{pid} = undef;
	return;
}

=pod

=item pause_member(i) / resume_member(i)

SIGSTOP / SIGCONT member i: it keeps its sockets (connections are
accepted by the kernel) but answers nothing, like a hung or partitioned
server.  pause_member returns only once every thread of the member is
stopped: kill() only queues the stop, and on a loaded machine a thread
of etcd answered a request sent right after it (TAP 68, warm 2, got its
lock from a "stopped" member).

=cut

sub pause_member
{
	my ($self, $i) = @_;
	my $m = $self->{member}[$i];
	return unless defined $m->{pid};
	kill('STOP', $m->{pid});
	my $until = time + 10;
	while (time < $until)
	{
		my $running = 0;
		for my $stat (glob("/proc/$m->{pid}/task/*/stat"))
		{
			open(my $fh, '<', $stat) or next;    # a thread that exited
			my $line = <$fh> // '';
			close $fh;
			# "tid (comm) S ...": the state follows the last ')'
			$running++ unless $line =~ /\)\s+[tT]\s/;
		}
		return if $running == 0;
		usleep(1_000);
	}
	croak "etcd member $i (pid $m->{pid}) did not stop within 10 s of SIGSTOP";
}

sub resume_member
{
	my ($self, $i) = @_;
	my $m = $self->{member}[$i];
	kill('CONT', $m->{pid}) if defined $m->{pid};
	return;
}

=pod

=item restart_member(i)

Start member i again on the same ports and data folder and wait until the
cluster is healthy.

=cut

sub restart_member
{
	my ($self, $i) = @_;
	croak "member $i still running" if defined $self->{member}[$i]{pid};
	$self->_spawn($i, 'existing');
	$self->wait_healthy;
	return;
}

# Notice members that exited on their own.
sub _reap
{
	my ($self) = @_;
	for my $m (@{ $self->{member} })
	{
		next unless defined $m->{pid};
		my $r = waitpid($m->{pid}, POSIX::WNOHANG());
		if ($r == $m->{pid})
		{
			delete $live_pids{ $m->{pid} };
			$m->{pid} = undef;
		}
	}
	return;
}

=pod

=item stop()

Kill every member (SIGTERM, then SIGKILL after 5 s).

=cut

sub stop
{
	my ($self) = @_;
	# (members END already stopped are no longer in %live_pids)
	my @pids = grep { defined && $live_pids{$_} } map { $_->{pid} } @{ $self->{member} };
	_kill_all(@pids);
	$_->{pid} = undef for @{ $self->{member} };
	return;
}

sub _kill_all
{
	my (@pids) = @_;
	return unless @pids;
	kill 'TERM', @pids;
	kill 'CONT', @pids;			# in case a test paused one
	my $deadline = time + 5;
	my %left = map { $_ => 1 } @pids;
	while (%left && time < $deadline)
	{
		for my $p (CORE::keys %left)
		{
			my $r = waitpid($p, POSIX::WNOHANG());
			delete $left{$p} if $r == $p || $r == -1;
		}
		usleep(50_000) if %left;
	}
	if (%left)
	{
		kill 'KILL', CORE::keys %left;
		waitpid($_, 0) for CORE::keys %left;
	}
	delete $live_pids{$_} for @pids;
	return;
}

sub DESTROY
{
	my ($self) = @_;
	# An object destroyed at global destruction, after END, must not change
	# the test's exit status (waitpid sets $?).
	local $?;
	# Only the process that started the members may stop them.
	$self->stop if $self->{owner_pid} && $self->{owner_pid} == $$;
}

END
{
	my $rc = $?;
	if ($$ == $owner_pid)
	{
		for my $bg (@bg_locks)
		{
			eval { $bg->{handle}->kill_kill if $bg->{handle}->pumpable; };
		}
		_kill_all(CORE::keys %live_pids) if %live_pids;
		File::Path::rmtree($_) for grep { -d } @shm_dirs;
	}
	$? = $rc;
}

=pod

=item pg_node(name, conf)

A PostgreSQL::Test::Cluster node (from LockfenceTest::Node's template)
with lockfence created in database postgres; conf is appended to
postgresql.conf before the start.

=cut

sub pg_node
{
	my ($name, $conf) = @_;
	require PostgreSQL::Test::Cluster;
	my $node = PostgreSQL::Test::Cluster->new($name);
	LockfenceTest::Node::init_node($node);
	$node->append_conf('postgresql.conf', $conf // '');
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION lockfence');
	return $node;
}

=pod

=item session(node, user)

A background psql session (errors do not stop it) with verbose error
reports, so sql_try can read SQLSTATEs.  Its backend's pid is in
$session->{pid}.

=cut

sub session
{
	my ($node, $user) = @_;
	my $s = $node->background_psql('postgres',
		on_error_stop => 0,
		extra_params => [ defined $user ? ('-U', $user) : () ]);
	# the timeout (PG_TEST_TIMEOUT_DEFAULT, 180 s) per statement, not for
	# the session's whole life: TAP 61's control session outlived it
	$s->set_query_timer_restart();
	$s->query_safe('\set VERBOSITY verbose');
	$s->{pid} = $s->query_safe('SELECT pg_backend_pid()');
	chomp $s->{pid};
	return $s;
}

=pod

=item send_query(session, sql)

Send SQL to a background session without waiting for its result (for a
call that blocks, such as a waiting etcd_lock).

=cut

sub send_query
{
	my ($s, $sql) = @_;
	my $n = ++$s->{lf_sent};
	$s->{lf_marker} = "LF_SENT_$n";
	$s->query_until(qr/$s->{lf_marker}/, "\\echo $s->{lf_marker}\n$sql\n");
	return;
}

=pod

=item statement_start(node, pid)

When the statement a backend runs, or ran last, started (query_start, in
seconds since the epoch, by the server's clock), read through another
connection.  A time bound on a statement runs from there, not from before
the test's psql was handed the statement: on a busy machine getting it
through IPC::Run and psql to the server alone took longer than a 100 ms
budget.  Time::HiRes::time() reads the same clock.

=cut

sub statement_start
{
	my ($node, $pid) = @_;
	return $node->safe_psql('postgres',
		"SELECT extract(epoch FROM query_start) FROM pg_stat_activity WHERE pid = $pid");
}

=pod

=item run_delay(pid)

How long process pid has waited, runnable, for a CPU since it started, in
seconds: the second field of /proc/PID/task/TID/schedstat (time spent on
a run queue), summed over the process's threads, so that it serves a
backend (one thread) and an etcd member (Go's many) alike; threads that
have exited are not counted.  0 when the kernel does not tell.  A bound
on how late the code acts (a wait_timeout, a cancel) is about the time
the code waits or works; the difference of run_delay across the measured
interval is time the kernel gave the CPU to others (a loaded machine:
another suite, a CPU hog), which late_ms subtracts and reports apart.

=cut

sub run_delay { return (_schedstat($_[0]))[1]; }

# The first two fields of /proc/PID/task/TID/schedstat (time on a CPU,
# time waiting for one), each summed over the threads, in seconds.
sub _schedstat
{
	my ($pid) = @_;
	my ($cpu, $wait) = (0, 0);
	for my $stat (glob("/proc/$pid/task/*/schedstat"))
	{
		open(my $fh, '<', $stat) or next;
		my $line = <$fh>;
		close($fh);
		next unless defined $line;
		my @f = split ' ', $line;
		$cpu += $f[0] // 0;
		$wait += $f[1] // 0;
	}
	return ($cpu / 1e9, $wait / 1e9);
}

# Where in the kernel process pid sleeps (/proc/PID/wchan: do_epoll_wait for a
# backend waiting in its WaitEventSet, for example; "0" while it runs or
# is runnable), or '' when the kernel does not tell.
sub _wchan
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/wchan") or return '';
	my $w = <$fh> // '';
	close($fh);
	return $w;
}

=pod

=item error_wait_diag(session, t0)

For a bound missed after wait_for_error: from its samples, how the time
from t0 (seconds since the epoch) to the error went in the backend: on a
CPU, waiting for one, and neither (asleep or blocked, in I/O for
example), with the longest stretch of the last, and where in the kernel
it slept (each sample's wchan: do_epoll_wait is the backend's own wait on its
sockets and latch; anything else, such as a page fault or a write held
back for dirty pages, is the machine's).

=cut

sub error_wait_diag
{
	my ($s, $t0) = @_;
	my @w = grep { $_->[0] >= $t0 } @{ $s->{run_delays} // [] };
	return 'no samples after it' if @w < 2;
	# A stretch: consecutive samples between which the backend mostly
	# neither ran nor waited to run.
	my ($idle, $longest, $at, $run, $from) = (0, 0, 0, 0, 0);
	my %slept_in;
	for my $i (1 .. $#w)
	{
		my $span = $w[$i][0] - $w[ $i - 1 ][0];
		my $gap = $span
		  - ($w[$i][1] - $w[ $i - 1 ][1]) - ($w[$i][2] - $w[ $i - 1 ][2]);
		if ($gap > 0)
		{
			$idle += $gap;
			# ("0": running or runnable when read; '': not readable)
			my $where = $w[$i][3] eq '0' ? 'running' : $w[$i][3] || '?';
			$slept_in{$where} += $gap;
		}
		if ($gap > $span / 2)
		{
			$from = $w[ $i - 1 ][0] - $t0 if $run == 0;
			$run += $span;
			($longest, $at) = ($run, $from) if $run > $longest;
		}
		else
		{
			$run = 0;
		}
	}
	return sprintf('from %.1f to %.1f ms after the signal or deadline (%d samples): '
		  . 'on a CPU %.1f ms, waiting for one %.1f ms, neither %.1f ms '
		  . '(longest %.1f ms, from %.1f ms; asleep in %s)',
		($w[0][0] - $t0) * 1000, ($w[-1][0] - $t0) * 1000, scalar(@w),
		($w[-1][2] - $w[0][2]) * 1000, ($w[-1][1] - $w[0][1]) * 1000,
		$idle * 1000, $longest * 1000, $at * 1000,
		join(', ', map { sprintf('%s %.1f ms', $_, $slept_in{$_} * 1000) }
			  sort { $slept_in{$b} <=> $slept_in{$a} } CORE::keys %slept_in));
}

=pod

=item error_wait_diag_over(ms, bound_ms, session, t0)

error_wait_diag(session, t0) for a try of ms at or over bound_ms, undef
for one under it: the tests that time many tries keep the diagnostic of
the slow ones only.

=cut

sub error_wait_diag_over
{
	my ($ms, $bound_ms, $s, $t0) = @_;
	return undef if $ms < $bound_ms;
	return error_wait_diag($s, $t0);
}

=pod

=item cpu_wait(pid)

run_delay(pid) plus run_delay of every live member of the cluster: how
long a backend and etcd have waited, runnable, for a CPU so far.

=cut

sub cpu_wait
{
	my ($self, $pid) = @_;
	my $s = run_delay($pid);
	$s += run_delay($_->{pid}) for grep { defined $_->{pid} } @{ $self->{member} };
	return $s;
}

=pod

=item released_promptly(node => N, session => S, since => T, gone => CODE, label => TEXT[, show => CODE])

After a cancel, a statement timeout or a wait_timeout (55P03), a failed
etcd call releases what it left within ETCD_PENDING_RELEASE_MS (50 ms),
so that the error is not delayed; what does not fit goes when the
session ends (its exit callback revokes the lease) or with the TTL.  One
check: gone->() true at once, unless the session's backend and etcd have
waited at least 50 ms for a CPU since T (a cpu_wait reading taken before
the interrupt or the deadline): a loaded machine, not the code.  Then
gone->() true within 10 s of the session's end.  show->() is printed
when the check fails.  Returns the session to go on with: a new one when
it was ended.

=cut

sub released_promptly
{
	my ($self, %a) = @_;
	my $waited_ms = ($self->cpu_wait($a{session}{pid}) - $a{since}) * 1000;
	my $ok;

	if ($waited_ms < 50 || $a{gone}->())
	{
		$ok = Test::More::ok($a{gone}->(),
			sprintf('%s (the backend and etcd waited %.1f ms for a CPU)',
				$a{label}, $waited_ms));
	}
	else
	{
		$a{session}->quit;
		$ok = Test::More::ok(poll_until(10, $a{gone}),
			sprintf('%s once the session ended (the backend and etcd waited %.1f ms for a CPU, more than the release has)',
				$a{label}, $waited_ms));
		$a{session} = session($a{node});
	}
	Test::More::diag(Test::More::explain($a{show}->())) if !$ok && $a{show};
	return $a{session};
}

=pod

=item run_delay_after(node, session, seconds)

run_delay of the session's backend once seconds had passed since the
start of its last statement (query_start), taken from the samples that
wait_for_error read while it waited for that statement's error: for a
bound on what happens after a deadline (a wait_timeout), the wait for a
CPU before the deadline must not be subtracted (it delays nothing that is
measured).  The first sample at or after the deadline is used, so a late
sample only subtracts less.  Call it right after wait_for_error, before
the session runs anything else.

The samples come from the test's loop, every 0.5 ms, reading /proc: a
poll of pg_stat_activity for the statement's start, as this did before,
takes a psql of its own, and on a loaded machine one returned after the
statement had ended, so that no wait at all was subtracted (TAP 68 on 17,
2026-12-05: "failed after 414.5 ms, and 0.0 ms waiting for a CPU").
If the statement ended before the deadline, run_delay now (nothing after
the deadline to subtract).

=cut

sub run_delay_after
{
	my ($node, $s, $seconds) = @_;
	my $at = statement_start($node, $s->{pid}) + $seconds;
	for my $sample (@{ $s->{run_delays} // [] })
	{
		return $sample->[1] if $sample->[0] >= $at;
	}
	return run_delay($s->{pid});
}

=pod

=item run_delay_at(session, t)

run_delay of the session's backend at time t (seconds since the epoch),
from the samples wait_for_error read: the first one taken at or after t
while the backend still existed, else the last one taken while it did.
For a backend that exits right after its error (a termination), whose
run_delay cannot be read afterwards: read then, it gave 0 whatever the
backend had waited (TAP 14 on 2026-12-05: "took 111.0 ms, and 0.0 ms
waiting for a CPU").  A sample a little after t only subtracts a little
more of what the backend waited after its error was logged.

=cut

sub run_delay_at
{
	my ($s, $t) = @_;
	my $last = 0;
	for my $sample (@{ $s->{run_delays} // [] })
	{
		next unless $sample->[1] > 0 || $sample->[2] > 0;    # gone
		return $sample->[1] if $sample->[0] >= $t;
		$last = $sample->[1];
	}
	return $last;
}

=pod

=item time_scale()

The factor by which a test multiplies the timeouts it gives lockfence
(never the bounds it checks): lockfence_test.time_scale from PGOPTIONS,
which the Valgrind run sets to 20 for its servers and clients
(scripts/pg-assert.sh); 1 elsewhere.

=cut

sub time_scale
{
	my $opts = $ENV{PGOPTIONS} // '';
	return $opts =~ /lockfence_test\.time_scale=([0-9]+(?:\.[0-9]+)?)/ ? $1 : 1;
}

=pod

=item late_ms(seconds, pid, run_delay_before)

How late something was, in ms, given seconds measured for it on the
server's clock, not counting what process pid waited for a CPU since
run_delay_before (run_delay(pid) taken at the start of the interval, or
by run_delay_after at a deadline):
returns (ms without the wait, ms of the wait).  Call it at once when the
interval ends.  If pid is gone (a terminated backend), nothing is
subtracted.

=cut

sub late_ms
{
	my ($seconds, $pid, $before) = @_;
	my $after = run_delay($pid);
	my $delay = ($after > 0 && $after >= $before) ? $after - $before : 0;
	return (($seconds - $delay) * 1000, $delay * 1000);
}

=pod

=item at_most_one_over(label, bound_ms, tries)

The second half of the rule for a latency bound checked over several
tries of one case (tries: a reference to [ms, diag] pairs, ms a try's
lateness less its wait for a CPU, diag what error_wait_diag said of it
or undef).  The first half is each try's own check: below twice the
bound (the code before issue 7 took 1 to 2 s).  This one: at most one
try of the case at or over the bound, the README's promise, and each
such try is printed with where its time went.

Why one: on this shared VM a try now and then comes out 50 to 80 ms over
its case's usual figure beyond its wait for a CPU (four tries of about
500 in the five full runs of 2026-12-05, each in a different case; not
explained yet: the wait channels printed with such a try tell whether
the backend slept in its own wait or elsewhere in the kernel).  A code
path that makes a case late does so try after try, and fails here.

=cut

sub at_most_one_over
{
	my ($label, $bound_ms, $tries) = @_;
	my @over = grep { $tries->[$_][0] >= $bound_ms } 0 .. $#$tries;

	Test::More::note(sprintf('%s: try %d took %.1f ms (%s)', $label, $_ + 1,
			$tries->[$_][0], $tries->[$_][1] // 'no samples'))
	  for @over;
	return Test::More::ok(@over <= 1,
		sprintf('%s: at most one try of %d at or over %d ms (%s ms)',
			$label, scalar(@$tries), $bound_ms,
			join(', ', map { sprintf '%.1f', $_->[0] } @$tries)));
}

=pod

=item statement_end(node, pid)

When the statement a backend ran last ended on the server (state_change,
once it is no longer active), in seconds since the epoch by the server's
clock.  Call it only once the statement ended (wait_for_error returned).
The backend sends an error before it reports itself idle, so the client
can see the error first: this waits (up to 10 s, then dies) for the idle
state.

=cut

sub statement_end
{
	my ($node, $pid) = @_;
	return idle_since($node, $pid, 'state_change');
}

# The value of expression EXPR over pid's pg_stat_activity row once the
# backend is no longer active, waiting up to 10 s for that; dies if it
# never is (a measure taken from nothing must not pass a bound).
sub idle_since
{
	my ($node, $pid, $expr) = @_;
	my $deadline = time + 10;
	while (1)
	{
		my $v = $node->safe_psql('postgres',
			"SELECT extract(epoch FROM $expr) FROM pg_stat_activity WHERE pid = $pid AND state <> 'active'");
		return $v if $v ne '';
		croak "backend $pid did not end its statement within 10 s"
		  if time >= $deadline;
		usleep(1_000);
	}
}

=pod

=item statement_duration(node, pid)

How long the statement a backend ran last took on the server, in seconds:
from its start (query_start) to the backend going idle after it
(state_change; after an ERROR, once the error was sent).  Both by the
server's clock, read through another connection; for a bound on when
the server raised an error, with no part for the test's psql and Perl
reading it (on a loaded machine they added tens of ms).  Call it only
once the statement ended (wait_for_error returned).

=cut

sub statement_duration
{
	my ($node, $pid) = @_;
	return idle_since($node, $pid, 'state_change - query_start');
}

=pod

=item error_logged_at(node, pid, level)

When backend pid last wrote a message of level (default ERROR) to the
server log, in seconds since the epoch by the server's clock (the log
line's %m time stamp; PostgreSQL::Test::Cluster's log_line_prefix).  The
server logs an error before it sends it to the client, so once the client
saw it the line is there; for a terminated backend, whose statement never
goes idle in pg_stat_activity.  undef if there is no such line.

=cut

sub error_logged_at
{
	my ($node, $pid, $level) = @_;
	$level //= 'ERROR';
	my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile);
	my @at = $log =~ /^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+) \[$pid\] [^\n]*$level:/mg;
	return undef unless @at;
	return $node->safe_psql('postgres',
		"SELECT extract(epoch FROM timestamptz '$at[-1]')");
}

=pod

=item wait_result(session, seconds)

Wait (default 60 s) for the result of the SQL sent last by send_query.
Returns its (stdout, stderr), both empty strings if it did not finish in
time.

=cut

sub wait_result
{
	my ($s, $seconds) = @_;
	my $n = ++$s->{lf_sent};
	my $marker = "LF_DONE_$n";
	my $deadline = time + ($seconds // 60);
	$s->{stdin} .= "\\echo $marker\n\\warn $marker\n";
	while (time < $deadline)
	{
		$s->{run}->pump_nb;
		last
		  if $s->{stdout} =~ /$marker\r?\n/ && $s->{stderr} =~ /$marker\r?\n/;
		usleep(2_000);
	}
	my ($out, $err) = ($s->{stdout}, $s->{stderr});
	return ('', '') unless $out =~ /$marker/;
	$out =~ s/\r?\n?$marker\r?\n//;
	$err =~ s/\r?\n?$marker\r?\n//;
	$s->{stdout} = '';
	$s->{stderr} = '';
	return ($out, $err);
}

=pod

=item peek_output(session)

What a background session printed so far, without consuming it:
(stdout, stderr).

=cut

sub peek_output
{
	my ($s) = @_;
	$s->{run}->pump_nb;
	return ($s->{stdout}, $s->{stderr});
}

=pod

=item poll_until(seconds, code, step)

Call code every step seconds (default 0.05) until it returns true or the
deadline passes; returns its last result.

=cut

sub poll_until
{
	my ($seconds, $code, $step) = @_;
	my $deadline = time + $seconds;
	my $r;
	while (1)
	{
		$r = $code->();
		return $r if $r || time >= $deadline;
		usleep(int(($step // 0.05) * 1_000_000));
	}
}

=pod

=item send_raw(session, sql)

Send SQL to a background session as it is, without a marker and without
waiting for anything: for tests that time the call from the moment it
was sent (wait_for_error).

=cut

sub send_raw
{
	my ($s, $sql) = @_;
	$s->{stdin} .= "$sql\n";
	$s->{run}->pump_nb;
	return;
}

=pod

=item wait_for_error(session, seconds)

Pump a background session every 0.5 ms until its stderr shows an ERROR
or FATAL; returns the time that was seen, or undef after seconds.  At
every turn it also reads run_delay of the session's backend (from
session(), which sets $session->{pid}), kept as [time, run_delay, time on a
CPU, wchan] in $session->{run_delays} for run_delay_after and
error_wait_diag.

=cut

sub wait_for_error
{
	my ($s, $seconds) = @_;
	my $deadline = time + $seconds;
	$s->{run_delays} = [];
	while (time < $deadline)
	{
		if (defined $s->{pid})
		{
			my ($cpu, $wait) = _schedstat($s->{pid});
			push @{ $s->{run_delays} },
			  [ time, $wait, $cpu, _wchan($s->{pid}) ];
		}
		eval { $s->{run}->pump_nb; };
		return time if $s->{stderr} =~ /(ERROR|FATAL):/;
		usleep(500);
	}
	return undef;
}

=pod

=item wait_for_output(bg, regex, seconds)

Pump a background etcdctl (from start_etcdctl_lock) until its stdout
matches; true if it did before the deadline (default 60 s).

=cut

sub wait_for_output
{
	my ($bg, $re, $seconds) = @_;
	my $deadline = time + ($seconds // 60);
	while (time < $deadline)
	{
		$bg->{handle}->pump_nb if $bg->{handle}->pumpable;
		return 1 if $bg->{out} =~ $re;
		last unless $bg->{handle}->pumpable;
		usleep(20_000);
	}
	return $bg->{out} =~ $re;
}

=pod

=item sql_try(session, sql)

Run one statement in a background session; returns a hash: ok (no error),
out (stdout), sqlstate, message, detail, hint, stderr, secs (wall time).

=cut

sub sql_try
{
	my ($s, $sql) = @_;
	my $t0 = time;
	$s->{stderr} = '';
	my $out = $s->query($sql);
	my $err = $s->{stderr};
	$s->{stderr} = '';
	my %r = (out => $out, stderr => $err, secs => time - $t0, ok => 1);
	Test::More::note(sprintf('sql_try: %.3f s: %s', $r{secs}, $sql));
	if ($err =~ /(?:ERROR|FATAL|PANIC):\s+([0-9A-Z]{5}):\s+([^\n]*)/)
	{
		@r{qw(ok sqlstate message)} = (0, $1, $2);
		$r{detail} = $1 if $err =~ /DETAIL:\s+([^\n]*)/;
		$r{hint} = $1 if $err =~ /HINT:\s+([^\n]*)/;
	}
	elsif ($err =~ /(?:ERROR|FATAL|PANIC|server closed|connection to server)/)
	{
		@r{qw(ok sqlstate message)} = (0, '?????', $err);
	}
	return \%r;
}

=pod

=item check_superuser_only(node, role, gucs...)

Test::More checks that an ordinary role can neither read nor set each of
the given settings, before or after the lockfence library is loaded in
its session (a value set as a placeholder before the load must be
discarded, with a warning), and does not see them in pg_settings.

=cut

sub check_superuser_only
{
	my ($node, $role, @gucs) = @_;
	for my $guc (@gucs)
	{
		my $s = session($node, $role);
		my $r = sql_try($s, "SET $guc = '/tmp/lockfence-not-allowed'");
		$r = sql_try($s, "SELECT lockfence.current_token('superuser-only-check') IS NULL");
		Test::More::is($r->{out}, 't', "$role: library loads");
		Test::More::like($r->{stderr}, qr/permission denied to set parameter "\Q$guc\E"/,
			"$role: $guc set before the library loaded is discarded with a warning");
		$r = sql_try($s, "SHOW $guc");
		Test::More::is($r->{sqlstate}, '42501', "$role cannot SHOW $guc");
		$r = sql_try($s, "SELECT current_setting('$guc')");
		Test::More::is($r->{sqlstate}, '42501', "$role cannot read $guc with current_setting()");
		$r = sql_try($s, "SET $guc = '/tmp/lockfence-not-allowed'");
		Test::More::is($r->{sqlstate}, '42501', "$role cannot SET $guc");
		$r = sql_try($s, "SELECT set_config('$guc', 'x', false)");
		Test::More::is($r->{sqlstate}, '42501', "$role cannot set_config() $guc");
		$r = sql_try($s, "SELECT count(*) FROM pg_settings WHERE name = '$guc'");
		Test::More::is($r->{out}, '0', "$guc is not listed in pg_settings for $role");
		$s->quit;
	}
	return;
}

=pod

=item start_fault_server(upstream_url)

Start test/fault_http_server.py (with /usr/bin/python3) in front of the
given plain-HTTP etcd URL.  Returns a LockfenceTest::FaultServer with url(),
set(\%rule), clear(), hits() and stop(); it is killed in END too.

=cut

sub start_fault_server
{
	my ($self, $upstream) = @_;
	my $script = $ENV{LOCKFENCE_FAULT_SERVER} // $fault_script;
	croak "fault server script not found: $script" unless -f $script;
	my $portfile = "$self->{dir}/fault." . free_port() . ".port";
	my $log = "$portfile.log";
	my $pid = fork;
	croak "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		POSIX::setpgid(0, 0);
		open STDIN, '<', '/dev/null';
		open STDOUT, '>>', $log;
		open STDERR, '>&', \*STDOUT;
		{ exec '/usr/bin/python3', $script, '--upstream', $upstream, '--port-file', $portfile; }
		POSIX::_exit(127);
	}
	$live_pids{$pid} = 1;
	# (as long as wait_healthy: a python3 start, at a few percent of a CPU)
	my $deadline = time + $START_DEADLINE_S;
	while (!-s $portfile)
	{
		if (waitpid($pid, POSIX::WNOHANG()) == $pid || time > $deadline)
		{
			delete $live_pids{$pid};
			kill 'KILL', $pid;
			my $l = -e $log ? `cat $log` : '';
			croak "fault server did not start: $l";
		}
		usleep(50_000);
	}
	open my $fh, '<', $portfile or croak $!;
	my $port = <$fh>;
	close $fh;
	chomp $port;
	return bless { pid => $pid, url => "http://127.0.0.1:$port", log => $log },
	  'LockfenceTest::FaultServer';
}

=pod

=back

=cut

package LockfenceTest::FaultServer;

use strict;
use warnings;
use Carp;
use HTTP::Tiny;
use JSON::PP;

sub url { return $_[0]->{url}; }

sub _post
{
	my ($self, $path, $doc) = @_;
	my $r = HTTP::Tiny->new(timeout => 60)->post("$self->{url}$path",
		{ content => encode_json($doc // {}), headers => { 'Content-Type' => 'application/json' } });
	croak "fault server $path: $r->{status} $r->{content}" unless $r->{success};
	return $r->{content};
}

# Add a fault rule (see fault_http_server.py).
sub set { my ($self, %rule) = @_; return $self->_post('/_fault/set', \%rule); }

# Remove all rules.
sub clear { my ($self) = @_; return $self->_post('/_fault/clear', {}); }

# Requests seen per path, plus "faults": faulty replies sent.
sub hits
{
	my ($self) = @_;
	my $r = HTTP::Tiny->new(timeout => 60)->get("$self->{url}/_fault/hits");
	croak "fault server hits: $r->{status}" unless $r->{success};
	return decode_json($r->{content});
}

sub stop
{
	my ($self) = @_;
	return unless $self->{pid};
	kill 'KILL', $self->{pid};
	waitpid($self->{pid}, 0);
	delete $live_pids{ $self->{pid} };
	$self->{pid} = undef;
	return;
}

1;
