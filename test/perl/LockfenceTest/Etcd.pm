
=pod

=head1 NAME

LockfenceTest::Etcd - a real single-node etcd for lockfence TAP tests

=head1 SYNOPSIS

  use LockfenceTest::Etcd;

  my $etcd = LockfenceTest::Etcd->new();        # started and answering
  $node->append_conf('postgresql.conf',
      "lockfence.etcd_endpoints = '" . $etcd->endpoint . "'");
  my ($rc, $out, $err) = $etcd->etcdctl('get', '--prefix', 'job/');
  my @keys   = $etcd->keys('job/');
  my @leases = $etcd->leases;
  my $h = $etcd->start_etcdctl_lock('job', 'sleep 30');   # background holder
  $etcd->stop;                                   # also done at END/DESTROY

  # Concurrent psql sessions
  my $s = LockfenceTest::Etcd::session($node);  # BackgroundPsql, on_error_stop off

=head1 DESCRIPTION

Starts Debian's etcd (etcd-server) on 127.0.0.1 with free client and peer
ports and a data folder in a temporary directory, waits until it answers a
health check, and kills it when the object is destroyed or the test script
ends, even when the script dies.  Extra etcd command-line arguments (for
TLS or authentication) can be passed with C<extra_args>.

=cut

package LockfenceTest::Etcd;

use strict;
use warnings;

use Carp;
use File::Path ();
use File::Spec;
use File::Temp ();
use IPC::Run;
use Time::HiRes qw(usleep time);
use PostgreSQL::Test::Utils;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::BackgroundPsql;

our @all_etcds;
our @all_bg;

=pod

=item LockfenceTest::Etcd->new(%opts)

Start an etcd.  Its data folder is on /dev/shm when available (set
C<data_on_disk> to keep it in the test's temporary folder).  Options: C<name> (member name, default "lf"),
C<extra_args> (array ref of extra etcd arguments), C<scheme> ("http" or
"https", used in the endpoint URL), C<etcdctl_args> (array ref of
extra etcdctl arguments, e.g. TLS or user options), C<start_timeout>
(seconds, default 60).

=cut

sub new
{
	my ($class, %opts) = @_;
	my $self = bless {
		name => $opts{name} // 'lf',
		extra_args => $opts{extra_args} // [],
		scheme => $opts{scheme} // 'http',
		etcdctl_args => $opts{etcdctl_args} // [],
		start_timeout => $opts{start_timeout} // 60,
	}, $class;

	$self->{dir} = PostgreSQL::Test::Utils::tempdir('etcd');

	# etcd's data (WAL with fsync) goes to tmpfs when there is one, so the
	# tests do not depend on the disk latency of a shared machine.  They are
	# about lockfence, not etcd's durability.
	if (!$opts{data_on_disk} && -d '/dev/shm' && -w '/dev/shm')
	{
		$self->{data_dir} =
		  File::Temp::tempdir('lockfence_etcd_XXXX', DIR => '/dev/shm',
			CLEANUP => 1);
		$self->{remove_data_dir} = 1;
	}
	else
	{
		$self->{data_dir} = File::Spec->catdir($self->{dir}, 'data');
	}
	$self->{client_port} = PostgreSQL::Test::Cluster::get_free_port();
	$self->{peer_port} = PostgreSQL::Test::Cluster::get_free_port();
	$self->{log} = File::Spec->catfile($self->{dir}, 'etcd.log');
	push @all_etcds, $self;
	$self->start;
	return $self;
}

=pod

=item $etcd->endpoint

The client URL, e.g. http://127.0.0.1:PORT.

=cut

sub endpoint
{
	my ($self) = @_;
	return "$self->{scheme}://127.0.0.1:$self->{client_port}";
}

=pod

=item $etcd->start

Start (or restart) the server and wait until it answers.

=cut

sub start
{
	my ($self) = @_;
	my $peer = "http://127.0.0.1:$self->{peer_port}";
	my @cmd = (
		'etcd',
		'--name' => $self->{name},
		'--data-dir' => $self->{data_dir},
		'--listen-client-urls' => $self->endpoint,
		'--advertise-client-urls' => $self->endpoint,
		'--listen-peer-urls' => $peer,
		'--initial-advertise-peer-urls' => $peer,
		'--initial-cluster' => "$self->{name}=$peer",
		'--log-outputs' => 'stderr',
		@{ $self->{extra_args} });

	$self->{handle} =
	  IPC::Run::start(\@cmd, '<', \undef, '>>', $self->{log}, '2>>',
		$self->{log});

	my $deadline = time + $self->{start_timeout};
	while (time < $deadline)
	{
		my ($rc) = $self->etcdctl('endpoint', 'health',
			'--command-timeout=2s');
		return 1 if $rc == 0;
		croak "etcd exited during startup, see $self->{log}"
		  unless $self->{handle}->pumpable;
		usleep(100_000);
	}
	$self->stop;
	croak "etcd did not answer within $self->{start_timeout} s, see $self->{log}";
}

=pod

=item $etcd->etcdctl(@args)

Run etcdctl (API v3) against this server.  Returns ($rc, $stdout, $stderr)
in list context.

=cut

sub etcdctl
{
	my ($self, @args) = @_;
	my ($out, $err) = ('', '');
	local $ENV{ETCDCTL_API} = '3';
	my @cmd = ('etcdctl', '--endpoints=' . $self->endpoint,
		@{ $self->{etcdctl_args} }, @args);
	IPC::Run::run(\@cmd, '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout(60));
	return ($? >> 8, $out, $err);
}

=pod

=item $etcd->etcdctl_ok(@args)

Run etcdctl and die unless it succeeds; returns its stdout.

=cut

sub etcdctl_ok
{
	my ($self, @args) = @_;
	my ($rc, $out, $err) = $self->etcdctl(@args);
	croak "etcdctl @args failed ($rc): $err" if $rc != 0;
	return $out;
}

=pod

=item $etcd->keys($prefix)

Keys under a prefix, in key order.

=cut

sub keys
{
	my ($self, $prefix) = @_;
	my $out = $self->etcdctl_ok('get', '--prefix', '--keys-only', $prefix);
	return grep { $_ ne '' } split /\n/, $out;
}

=pod

=item $etcd->leases

Lease IDs currently alive, in lowercase hex without leading zeros (as in
lock keys).

=cut

sub leases
{
	my ($self) = @_;
	my $out = $self->etcdctl_ok('lease', 'list');
	my @ids;
	foreach my $line (split /\n/, $out)
	{
		# etcdctl pads to 16 digits; lock keys use no padding
		if ($line =~ /^0*([0-9a-f]+)$/)
		{
			push @ids, $1;
		}
	}
	return @ids;
}

=pod

=item $etcd->key_info($key)

Returns a hash ref {create_revision, lease} for a key, or undef when absent.

=cut

sub key_info
{
	my ($self, $key) = @_;
	my $out = $self->etcdctl_ok('get', $key, '-w', 'fields');
	return undef unless $out =~ /"CreateRevision"\s*:\s*(\d+)/;
	my %info = (create_revision => $1);
	$info{lease} = $1 if $out =~ /"Lease"\s*:\s*(\d+)/;
	return \%info;
}

=pod

=item $etcd->start_etcdctl_lock($name, $command)

Start `etcdctl lock NAME sh -c COMMAND` in the background.  Returns a hash
ref {handle, out, err}; the holder prints "LOCKED" when it holds the lock.
Killed at END if still running.

=cut

sub start_etcdctl_lock
{
	my ($self, $name, $command, @lockargs) = @_;
	my $bg = { out => '', err => '' };
	local $ENV{ETCDCTL_API} = '3';
	my @cmd = ('etcdctl', '--endpoints=' . $self->endpoint,
		@{ $self->{etcdctl_args} }, 'lock', @lockargs, $name, '--',
		'sh', '-c', "echo LOCKED; $command");
	$bg->{handle} =
	  IPC::Run::start(\@cmd, '<', \undef, '>', \$bg->{out}, '2>',
		\$bg->{err});
	push @all_bg, $bg;
	return $bg;
}

=pod

=item LockfenceTest::Etcd::wait_for_output($bg, $regex, $seconds)

Pump a background etcdctl until its stdout matches; returns true if it did
before the deadline.

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

=item LockfenceTest::Etcd::poll_until($seconds, $code)

Call $code every 50 ms until it returns true or the deadline passes;
returns its last result.

=cut

sub poll_until
{
	my ($seconds, $code) = @_;
	my $deadline = time + $seconds;
	my $r;
	while (1)
	{
		$r = $code->();
		return $r if $r || time >= $deadline;
		usleep(50_000);
	}
}

=pod

=item LockfenceTest::Etcd::session($node)

A PostgreSQL::Test::BackgroundPsql session on $node that keeps going after
errors; its backend pid is in $session->{pid}.

=cut

sub session
{
	my ($node) = @_;
	my $s = $node->background_psql('postgres', on_error_stop => 0);
	$s->{pid} = $s->query_safe('SELECT pg_backend_pid()');
	chomp $s->{pid};
	return $s;
}

=pod

=item LockfenceTest::Etcd::send_query($session, $sql)

Send a query to a background session without waiting for its result.

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

=item LockfenceTest::Etcd::wait_result($session, $seconds)

Wait for the result of the query sent last.  Returns ($stdout, $stderr)
of that query (both empty strings if it did not finish in time).

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

=item LockfenceTest::Etcd::peek_output($session)

Collect what a background session printed so far, without consuming it;
returns ($stdout, $stderr).

=cut

sub peek_output
{
	my ($s) = @_;
	$s->{run}->pump_nb;
	return ($s->{stdout}, $s->{stderr});
}

=pod

=item $etcd->stop

Stop the server (TERM, then KILL after 10 s).

=cut

sub stop
{
	my ($self) = @_;
	my $h = $self->{handle};
	return unless $h;
	$self->{handle} = undef;
	eval {
		$h->signal('TERM') if $h->pumpable;
		my $deadline = time + 10;
		while ($h->pumpable && time < $deadline)
		{
			$h->pump_nb;
			usleep(50_000);
		}
		$h->kill_kill if $h->pumpable;
		$h->finish;
	};
	return;
}

=pod

=item $etcd->kill9

Kill the server with SIGKILL (for crash tests).

=cut

sub kill9
{
	my ($self) = @_;
	my $h = $self->{handle};
	return unless $h;
	$self->{handle} = undef;
	eval { $h->signal('KILL'); $h->finish; };
	return;
}

sub DESTROY
{
	my ($self) = @_;
	$self->stop;
}

END
{
	my $rc = $?;
	foreach my $bg (@all_bg)
	{
		eval { $bg->{handle}->kill_kill if $bg->{handle}->pumpable; };
	}
	foreach my $etcd (@all_etcds)
	{
		next unless $etcd;
		$etcd->stop;
		# File::Temp does not always get to it (bail-outs); etcd is stopped
		File::Path::rmtree($etcd->{data_dir})
		  if $etcd->{remove_data_dir} && -d $etcd->{data_dir};
	}
	$? = $rc;
}

1;
