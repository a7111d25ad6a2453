# Copyright: lockfence contributors
#
# 42_rejection_log_escaping.pl: the rejection log line is logfmt, whatever
# the names hold.
#
# Resource, holder, table and application_name are chosen by the caller.
# Names holding quotes, spaces, '=', backslashes, newlines and other control
# characters must give exactly one log line per rejection, and a logfmt
# parser must get back the exact names and the documented fields in their
# documented order: no field can be forged (highest_holder="admin") and no
# line can be split.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $node = PostgreSQL::Test::Cluster->new('logfmt');
init_node($node);
# No statement logging and no ERROR lines (log_min_messages = log keeps
# LOG but not ERROR): the statements and errors hold the same hostile
# names, and PostgreSQL writes them on several lines; this test must see
# only lockfence's lines.
$node->append_conf('postgresql.conf', qq{
log_statement = none
log_min_messages = log
log_min_error_statement = panic
lockfence.log_rejections = log
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION lockfence');

# Parse the logfmt fields of one line: a list of [key, value] pairs.
# Values are bare (no space, '=' or '"') or quoted with \" \\ \n \r \t and
# \uXXXX escapes.  Dies on anything else, so that a stray quote fails.
sub parse_logfmt
{
	my ($s) = @_;
	my @pairs;
	while ((pos($s) // 0) < length $s)
	{
		$s =~ /\G(?:^| )([^\s="\\]+)=/gc
		  or die "logfmt: no key at offset " . (pos($s) // 0) . " of: $s\n";
		my $key = $1;
		my $value;
		if ($s =~ /\G"((?:[^"\\\x00-\x1f]|\\["\\nrt]|\\u[0-9a-fA-F]{4})*)"/gc)
		{
			$value = $1;
			$value =~ s/\\(["\\nrt]|u([0-9a-fA-F]{4}))/
			  defined $2 ? chr(hex $2)
			  : $1 eq 'n' ? "\n"
			  : $1 eq 'r' ? "\r"
			  : $1 eq 't' ? "\t"
			  : $1/ge;
		}
		elsif ($s =~ /\G([^\s="\\\x00-\x1f]+)/gc)
		{
			$value = $1;
		}
		else
		{
			die "logfmt: bad value for $key at offset " . pos($s) . " of: $s\n";
		}
		push @pairs, [ $key, $value ];
		die "logfmt: junk after $key at offset " . pos($s) . " of: $s\n"
		  if pos($s) < length $s && substr($s, pos($s), 1) ne ' ';
	}
	return \@pairs;
}

# A self-check of the parser on a line written by hand.
is_deeply(
	parse_logfmt(q{a=1 b="x \"y\" \\\\ z\n\u0001" c=""}),
	[ [ 'a', '1' ], [ 'b', qq{x "y" \\ z\n\x01} ], [ 'c', '' ] ],
	'the test parser reads quoted, escaped and empty values');

# Hostile names: a forged field, a newline that would start a new log line
# with a forged field, '=', a backslash, a tab and another control byte.
my $forge = qq{" highest_holder="admin};
my $res = qq{res$forge\nreason=ok x=y\\z\t\x01};
my $h1 = qq{h1$forge\nq=1\\};
my $h2 = qq{h2 "two"\\\n};
my $tbl = qq{tab$forge\ntable=x};
my $app = qq{app" pid="1 x=\\};

# A SQL string literal (E'...') for a Perl string.
sub lit
{
	my ($v) = @_;
	$v =~ s/\\/\\\\/g;
	$v =~ s/'/\\'/g;
	$v =~ s/\n/\\n/g;
	$v =~ s/\t/\\t/g;
	$v =~ s/\x01/\\x01/g;
	return "E'$v'";
}

# A quoted identifier for a Perl string (no E'' needed: psql passes the
# newline through, PostgreSQL keeps it in the name).
my $tbl_ident = $tbl;
$tbl_ident =~ s/"/""/g;
$tbl_ident = qq{"$tbl_ident"};

$node->safe_psql('postgres', qq{
CREATE TABLE $tbl_ident (id int, res text, tok bigint);
SELECT lockfence.protect('$tbl_ident', resource_column => 'res', token_column => 'tok');
SELECT lockfence.fence(@{[ lit($res) ]}, 9, @{[ lit($h1) ]});
});

my $log_offset = -s $node->logfile;

# One session makes one rejection of each kind.
my ($out, $err);
$node->psql('postgres', qq{
SET application_name = @{[ lit($app) ]};
SELECT pg_backend_pid();
SELECT lockfence.try_fence(@{[ lit($res) ]}, 3);
SELECT lockfence.try_fence(@{[ lit($res) ]}, 9, @{[ lit($h2) ]});
INSERT INTO $tbl_ident (id, res) VALUES (1, @{[ lit($res) ]});
}, stdout => \$out, stderr => \$err);
my ($pid) = $out =~ /^(\d+)$/m;
ok($pid, 'the session has a pid') or diag "stdout: $out\nstderr: $err";
like($err, qr/carries no fencing token/, 'the tokenless insert was rejected');

my $app_seen = $node->safe_psql('postgres',
	"SELECT " . lit($app) . "::text");
is($app_seen, $app, 'application_name keeps the hostile characters this test uses');

my $log = substr(slurp_file($node->logfile), $log_offset);
my @lines = split /\n/, $log;

# Every line of the log since the offset is a whole log line, with the
# prefix PostgreSQL::Test::Cluster sets ('%m [%p] %q%a '): no message
# spilled over into a line of its own.
my @orphans = grep { !/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[\d+\] / } @lines;
is_deeply(\@orphans, [], 'no log line was split by a newline in a name')
  or diag $log;

my @rejections = grep { /\[$pid\] .*lockfence rejected a write: / } @lines;
is(scalar @rejections, 3, 'three rejections, three log lines') or diag $log;

my @want = (
	[
		[ reason => 'stale_token' ], [ resource => $res ],
		[ token => '3' ], [ highest => '9' ],
		[ application_name => $app ], [ pid => $pid ]
	],
	[
		[ reason => 'holder_conflict' ], [ resource => $res ],
		[ token => '9' ], [ highest => '9' ],
		[ holder => $h2 ], [ highest_holder => $h1 ],
		[ application_name => $app ], [ pid => $pid ]
	],
	[
		[ reason => 'missing_token' ], [ resource => $res ],
		[ token => 'none' ], [ highest => '9' ],
		[ table => $tbl ],
		[ application_name => $app ], [ pid => $pid ]
	]);

for my $i (0 .. 2)
{
	my $line = $rejections[$i] // '';
	my ($fields) = $line =~ /lockfence rejected a write: (.*)$/;
	my $parsed = eval { parse_logfmt($fields // '') };
	is_deeply($parsed, $want[$i],
		"rejection $want[$i][0][1]: logfmt gives back the exact names, in the documented order, and no other field")
	  or diag "line: $line\nerror: $@";
}

# Simple values keep the documented form: names quoted, numbers and
# keywords bare.
$node->safe_psql('postgres', q{SELECT lockfence.fence('plain', 5, 'w1')});
my $plain_offset = -s $node->logfile;
$node->psql('postgres', q{SET application_name = 'worker';
SELECT lockfence.try_fence('plain', 5, 'w2')});
my ($plain) = grep { /lockfence rejected a write: / }
  split /\n/, substr(slurp_file($node->logfile), $plain_offset);
like($plain // '',
	qr/lockfence rejected a write: reason=holder_conflict resource="plain" token=5 highest=5 holder="w2" highest_holder="w1" application_name="worker" pid=\d+$/,
	'simple names keep the documented line');

# An empty application_name is logged as "".
$plain_offset = -s $node->logfile;
$node->psql('postgres', q{SET application_name = '';
SELECT lockfence.try_fence('plain', 1)});
($plain) = grep { /lockfence rejected a write: / }
  split /\n/, substr(slurp_file($node->logfile), $plain_offset);
like($plain // '', qr/ application_name="" pid=\d+$/,
	'an empty application_name is logged as ""');

$node->stop;
done_testing();
