# Copyright: lockfence contributors
#
# 43_etcd_password_file.pl: where the etcd password may live.
#
# Against a real etcd with authentication enabled:
# - lockfence.etcd_password_file: the lock works with the password read
#   from the file; the file is read afresh each time a backend
#   authenticates, so rotating it works without a reload (new sessions and
#   a session whose token etcd invalidated); a trailing newline is
#   stripped; a file group or others can read, a missing file, an empty
#   file are refused with a clear SQLSTATE, and the client never sees the
#   path or the password.
# - An ordinary role cannot read the file setting (SHOW, current_setting,
#   pg_settings) nor the file's content.
# - lockfence.etcd_password cannot be stored where every role can read it:
#   ALTER ROLE / ALTER DATABASE / ALTER ROLE ALL / function SET are
#   refused; a value stored while the library was not loaded is ignored
#   with a warning when a session applies it.

use strict;
use warnings;

use File::Copy;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, auth => 1, name => 'pwfile');
$etcd->start;

my $user = $LockfenceTest::EtcdCluster::USER_NAME;
my $pw = $LockfenceTest::EtcdCluster::USER_PASSWORD;
my $pw2 = 'rotated-Pw-0b93d2';

my $dir = PostgreSQL::Test::Utils::tempdir('pwfile');
my $pwfile = "$dir/etcd-password";

# Write the password file atomically (a new file renamed over the old one,
# as a secret rotation tool would), with the given mode.
sub write_pwfile
{
	my ($content, $mode) = @_;
	my $tmp = "$pwfile.tmp";
	open my $fh, '>', $tmp or die "$tmp: $!";
	print $fh $content;
	close $fh or die "$tmp: $!";
	chmod($mode // 0600, $tmp) or die "chmod $tmp: $!";
	rename($tmp, $pwfile) or die "rename $tmp: $!";
	return;
}

write_pwfile("$pw\n");

my $node = LockfenceTest::EtcdCluster::pg_node('pwfile', <<EOF);
lockfence.etcd_endpoints = '@{[ $etcd->endpoints ]}'
lockfence.etcd_request_timeout = '3s'
lockfence.etcd_user = '$user'
lockfence.etcd_password_file = '$pwfile'
log_min_messages = debug1
log_error_verbosity = verbose
log_statement = none
EOF
$node->safe_psql('postgres', q{
CREATE ROLE plain LOGIN;
GRANT USAGE ON SCHEMA lockfence TO plain;
GRANT EXECUTE ON FUNCTION lockfence.etcd_lock(text, integer, interval, text),
	lockfence.etcd_unlock(text, boolean) TO plain;
});

my $all_errors = '';

# Run SQL in a session, remember the error text for the password check.
sub try_sql
{
	my ($s, $sql) = @_;
	my $r = LockfenceTest::EtcdCluster::sql_try($s, $sql);
	$all_errors .= $r->{stderr};
	return $r;
}

sub cycle
{
	my ($s, $name) = @_;
	return try_sql($s,
		"SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('$name', 5, '10s')");
}

# --- the password from the file --------------------------------------------

my $s = LockfenceTest::EtcdCluster::session($node);
my $r = cycle($s, 'f1');
is($r->{out}, 't', 'password from the file (trailing newline stripped): lock and unlock succeed')
  or diag explain $r;

my $p = LockfenceTest::EtcdCluster::session($node, 'plain');
$r = cycle($p, 'f2');
is($r->{out}, 't', 'an ordinary role with EXECUTE locks with the password from the file')
  or diag explain $r;

# --- an ordinary role cannot read the setting or the file -----------------

$r = try_sql($p, 'SHOW lockfence.etcd_password_file');
is($r->{sqlstate}, '42501', 'ordinary role cannot SHOW lockfence.etcd_password_file');
$r = try_sql($p, "SELECT current_setting('lockfence.etcd_password_file')");
is($r->{sqlstate}, '42501', 'ordinary role cannot read it with current_setting()');
$r = try_sql($p, "SELECT count(*) FROM pg_settings WHERE name = 'lockfence.etcd_password_file'");
is($r->{out}, '0', 'lockfence.etcd_password_file is not listed in pg_settings for an ordinary role');
$r = try_sql($p, "SELECT pg_read_file('$pwfile')");
is($r->{sqlstate}, '42501', 'ordinary role cannot read the password file with pg_read_file()');
$r = try_sql($p, "CREATE TEMP TABLE leak (t text); COPY leak FROM '$pwfile'");
is($r->{sqlstate}, '42501', 'ordinary role cannot read the password file with COPY');
$r = try_sql($p, "SET lockfence.etcd_password_file = '/tmp/x'");
ok(!$r->{ok}, 'ordinary role cannot SET lockfence.etcd_password_file');
$r = try_sql($s, "SET lockfence.etcd_password_file = '/tmp/x'");
ok(!$r->{ok}, 'not even a superuser can SET it in a session (PGC_SIGHUP)');
is(try_sql($s, 'SHOW lockfence.etcd_password_file')->{out}, $pwfile,
	'a superuser can SHOW it');

# --- rotation without reload ------------------------------------------------

# Change the password in etcd (delete and add the user again: etcdctl has no
# non-interactive passwd) and in the file; no pg_reload_conf().
$etcd->etcdctl('user', 'delete', $user);
$etcd->etcdctl('user', 'add', $user, "--new-user-password=$pw2", '--interactive=false');
$etcd->etcdctl('user', 'grant-role', $user, 'lockrole');

# Still the old password in the file: refused by etcd, so the file is read
# (the session's token was invalidated with the user).
my $s2 = LockfenceTest::EtcdCluster::session($node);
$r = cycle($s2, 'f3');
like($r->{sqlstate} // '', qr/^28/, 'old password in the file after etcd rotated it: 28xxx')
  or diag explain $r;

write_pwfile("$pw2\r\n");
$r = cycle($s2, 'f4');
is($r->{out}, 't', 'rotated file (CRLF stripped), same session, no reload: lock succeeds')
  or diag explain $r;
my $s3 = LockfenceTest::EtcdCluster::session($node);
$r = cycle($s3, 'f5');
is($r->{out}, 't', 'rotated file, new session, no reload: lock succeeds') or diag explain $r;
$r = cycle($s, 'f6');
is($r->{out}, 't', 'rotated file, session that authenticated before the rotation: lock succeeds')
  or diag explain $r;

# --- files that are refused -------------------------------------------------

# A new session for each case: it has no cached token, so it reads the file.
sub fresh_cycle
{
	my ($name) = @_;
	my $f = LockfenceTest::EtcdCluster::session($node);
	my $res = cycle($f, $name);
	$f->quit;
	return $res;
}

write_pwfile("$pw2\n", 0640);
$r = fresh_cycle('g1');
is($r->{sqlstate}, 'F0000', 'group-readable password file: F0000') or diag explain $r;
like($r->{message} // '', qr/etcd password file has group or world access/,
	'group-readable password file: the message says why');
like($r->{hint} // '', qr/0600/, 'group-readable password file: the hint gives the permissions');

write_pwfile("$pw2\n", 0604);
$r = fresh_cycle('g2');
is($r->{sqlstate}, 'F0000', 'world-readable password file: F0000') or diag explain $r;

write_pwfile("$pw2\n", 0600);
is(fresh_cycle('g3')->{out}, 't', 'mode 0600 again: lock succeeds');

move($pwfile, "$pwfile.away") or die "move: $!";
$r = fresh_cycle('g4');
is($r->{sqlstate}, '58P01', 'missing password file: 58P01') or diag explain $r;
like($r->{message} // '', qr/could not open etcd password file/, 'missing password file: clear message');
unlike($r->{stderr}, qr/\Q$dir\E/, 'the client is not told the path of the file');
move("$pwfile.away", $pwfile) or die "move: $!";

write_pwfile("\n", 0600);
$r = fresh_cycle('g5');
is($r->{sqlstate}, 'F0000', 'empty password file: F0000') or diag explain $r;
like($r->{detail} // '', qr/holds no password/, 'empty password file: the detail says so');

write_pwfile('x' x 5000, 0600);
$r = fresh_cycle('g8');
is($r->{sqlstate}, 'F0000', 'password file over 4096 bytes: F0000') or diag explain $r;
like($r->{detail} // '', qr/larger than 4096 bytes/, 'password file over 4096 bytes: the detail says so');

write_pwfile("$pw2\0x\n", 0600);
$r = fresh_cycle('g9');
is($r->{sqlstate}, 'F0000', 'password file with a zero byte: F0000') or diag explain $r;

unlink($pwfile) or die "unlink: $!";
POSIX::mkfifo($pwfile, 0600) or die "mkfifo: $!";
$r = fresh_cycle('g10');
is($r->{sqlstate}, 'F0000', 'a FIFO as password file is refused at once, not waited on')
  or diag explain $r;
like($r->{detail} // '', qr/not a regular file/, 'a FIFO: the detail says so');
unlink($pwfile) or die "unlink: $!";

write_pwfile("$pw2\n", 0600);
my $both = LockfenceTest::EtcdCluster::session($node);
try_sql($both, "SET lockfence.etcd_password = 'also-set'");
$r = cycle($both, 'g7');
is($r->{sqlstate}, '22023', 'password and password file both set: 22023') or diag explain $r;
$both->quit;

# --- the password file read in a quiet call never raises ------------------

# A session holds a lock; its token becomes invalid and the password file
# disappears; at exit the lease cleanup must fetch a token again, cannot
# read the file, and gives up silently (the lease then expires by its
# TTL): no ERROR or FATAL from that backend.
my $q = LockfenceTest::EtcdCluster::session($node);
my $qpid = try_sql($q, 'SELECT pg_backend_pid()')->{out};
$r = try_sql($q, "SELECT token > 0 FROM lockfence.etcd_lock('q1', 5, '10s')");
is($r->{out}, 't', 'quiet cleanup: the session holds a lock') or diag explain $r;
move($pwfile, "$pwfile.away") or die "move: $!";
$etcd->auth_disable;
$etcd->auth_enable;
$q->quit;
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $qpid"),
	'quiet cleanup: the backend exited');
move("$pwfile.away", $pwfile) or die "move: $!";
my @qlines = grep { /\[$qpid\] .*(?:ERROR|FATAL|PANIC)/ } split /\n/, slurp_file($node->logfile);
is_deeply(\@qlines, [], 'quiet cleanup: an unreadable password file at exit raises nothing');
# The sessions that cached a token before auth was re-enabled fetch it again.
is(cycle($s, 'q2')->{out}, 't', 'after the quiet cleanup: locking works again');

# --- lockfence.etcd_password is never stored in a catalog ------------------

my @stored = (
	[ 'ALTER ROLE plain SET lockfence.etcd_password = \'leak1\'', 'ALTER ROLE ... SET' ],
	[ 'ALTER ROLE plain IN DATABASE postgres SET lockfence.etcd_password = \'leak2\'',
		'ALTER ROLE ... IN DATABASE ... SET' ],
	[ 'ALTER DATABASE postgres SET lockfence.etcd_password = \'leak3\'', 'ALTER DATABASE ... SET' ],
	[ 'ALTER ROLE ALL SET lockfence.etcd_password = \'leak4\'', 'ALTER ROLE ALL ... SET' ],
	[ 'CREATE FUNCTION leaky() RETURNS int LANGUAGE sql SET lockfence.etcd_password = \'leak5\' AS \'SELECT 1\'',
		'a function SET clause' ]);
for my $case (@stored)
{
	my ($sql, $what) = @$case;
	$r = try_sql($s, $sql);
	ok(!$r->{ok}, "$what of lockfence.etcd_password is refused") or diag explain $r;
	like($r->{message} // '', qr/lockfence.etcd_password cannot be set with ALTER ROLE, ALTER DATABASE/,
		"$what: the message says why");
	like($r->{hint} // '', qr/lockfence.etcd_password_file/, "$what: the hint names the password file");
}
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_db_role_setting WHERE array_to_string(setconfig, ',') LIKE '%etcd_password%'}),
	'0', 'no password stored in pg_db_role_setting');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_proc WHERE array_to_string(proconfig, ',') LIKE '%etcd_password%'}),
	'0', 'no password stored in pg_proc');
$r = try_sql($p, q{SELECT count(*) FROM pg_roles WHERE array_to_string(rolconfig, ',') LIKE '%leak%'});
is($r->{out}, '0', 'an ordinary role finds no password in pg_roles.rolconfig');

# A value stored while lockfence was not loaded (PostgreSQL then stores any
# lockfence.* name as a placeholder, unchecked) is ignored, with a warning,
# when a session of that role applies it.
$node->safe_psql('postgres', q{ALTER ROLE plain SET lockfence.etcd_password = 'stored-before-load'});
my $p2 = LockfenceTest::EtcdCluster::session($node, 'plain');
$r = cycle($p2, 'h1');
is($r->{out}, 't', 'a stored password is not applied: the lock uses the password file')
  or diag explain $r;
like($r->{stderr}, qr/WARNING:.*lockfence.etcd_password cannot be set with ALTER ROLE/,
	'a stored password is refused with a warning when it would apply');
$p2->quit;
$r = try_sql($s, 'ALTER ROLE plain RESET lockfence.etcd_password');
ok($r->{ok}, 'ALTER ROLE ... RESET removes a stored password') or diag explain $r;

# --- no copy of the password stays in the backend's memory ----------------
# lockfence wipes its copies (the file's buffer once the request is built,
# the request body, the HTTP layer's copy) also when the request fails: a
# session whose endpoint does not answer (nothing listens), and one that
# authenticated.  Read through /proc/PID/mem (the test runs as the
# server's user); the session's application_name, found there, shows that
# the read sees the backend's memory.

# How many private mappings of process pid hold needle; undef when the
# kernel does not let the test read the process's memory (Yama's
# ptrace_scope, a locked-down container).
sub mappings_holding
{
	my ($pid, $needle) = @_;
	no warnings 'portable';    # 64-bit addresses
	open(my $maps, '<', "/proc/$pid/maps") or return undef;
	open(my $mem, '<:raw', "/proc/$pid/mem") or return undef;
	my $found = 0;
	while (my $line = <$maps>)
	{
		my ($from, $to, $perms, $path) =
		  $line =~ /^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$/
		  or next;
		# private and readable; not the kernel's pages, nor read-only
		# files (code and constants)
		next unless $perms =~ /^r..p/;
		next if $path =~ /^\[(vvar|vsyscall|vdso)\]/;
		next if $path =~ m{^/} && $perms !~ /w/;
		sysseek($mem, hex($from), 0) or next;
		my $buf;
		next unless sysread($mem, $buf, hex($to) - hex($from));
		$found++ if index($buf, $needle) >= 0;
	}
	return $found;
}

my $closed = 'http://127.0.0.1:' . LockfenceTest::EtcdCluster::free_port();
for my $case ([ 'failed authentication', $closed ], [ 'authentication', undef ])
{
	my ($what, $endpoint) = @$case;
	my $m = LockfenceTest::EtcdCluster::session($node);
	my $marker = 'lfmem-' . int(rand(1e9));
	$m->query_safe("SET application_name = '$marker'");
	$m->query_safe("SET lockfence.etcd_endpoints = '$endpoint'") if $endpoint;
	$r = cycle($m, 'mem1');
	if ($endpoint)
	{
		is($r->{sqlstate}, '08001', "$what: the call fails (nothing listens)")
		  or diag explain $r;
	}
	else
	{
		is($r->{out}, 't', "$what: the lock is taken and released") or diag explain $r;
	}
	SKIP:
	{
		my $seen = mappings_holding($m->{pid}, $marker);
		skip "$what: the backend's memory cannot be read here", 2
		  unless defined $seen;
		cmp_ok($seen, '>', 0,
			"$what: the backend's memory is read (its application_name is found)");
		is(mappings_holding($m->{pid}, $pw2), 0,
			"$what: no copy of the password is left in the backend's memory");
	}
	$m->quit;
}

# --- the password never reaches the client or the log ---------------------

$_->quit for ($s, $p, $s2, $s3);
$node->stop;
my $log = slurp_file($node->logfile);
unlike($all_errors, qr/\Q$pw\E|\Q$pw2\E/, 'no password in any error the client saw');
unlike($log, qr/\Q$pw\E|\Q$pw2\E/, 'no password in the server log');
like($log, qr/lockfence.etcd_password_file is "\Q$pwfile\E"/,
	'the server log names the file that could not be used');

$etcd->stop;
done_testing();
