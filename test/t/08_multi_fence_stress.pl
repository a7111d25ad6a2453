# Copyright: the lockfence authors
#
# 08_multi_fence_stress.pl
#	  Many sessions fencing random overlapping sets of resources with
#	  lockfence.fence(text[], ...) and try_fence(text[], ...).
#
# Eight psql sessions run for about ten seconds (longer, up to 90 s, until
# at least 20 calls were accepted and one rejected), each in a loop of its own
# transactions: take the next token from a shared sequence (as a lock
# service hands them out, in increasing order), fence a random set of two
# to four of eight resources, named in a random order, and commit; each
# session sleeps up to 10 ms between taking its token and fencing, so that
# later tokens overtake earlier ones (without it a run on a loaded machine
# once had 431 calls accepted and none rejected).  Every outcome is logged.  Checked:
#
# - no call ever fails with a deadlock (40P01), or with anything but LF001;
# - an accepted call's token is not below what the fence table held for
#   its resources just before, and, in its transaction, the fence table
#   holds exactly that token for every resource of the set (the rows are
#   locked by it);
# - a rejected try_fence() leaves nothing of its set fenced by its
#   transaction, which then commits anyway (a partial advance would show
#   in the final table);
# - a rejection names a resource of the set that ends above the token;
# - the final fence table holds, per resource, the highest accepted token.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $sessions = 8;
my $seconds = 10;
my $hard_seconds = 90;
my @resources = map { "r$_" } 0 .. 7;

my $node = PostgreSQL::Test::Cluster->new('multifence');
init_node($node);
# Report a deadlock quickly, should one ever form.
$node->append_conf('postgresql.conf', "deadlock_timeout = '50ms'\n");
$node->start;

$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION lockfence;
	CREATE SEQUENCE tok;
	CREATE TABLE outcome (session int, token bigint, resources text[],
						  func text, result text, message text,
						  before bigint);
	CREATE TABLE violation (session int, token bigint, what text);
});

# One iteration of a session's loop, as psql commands.
sub iteration
{
	my ($id, $set, $func) = @_;
	my $array = 'ARRAY[' . join(', ', map { "'$_'" } @$set) . ']';
	my $log = "INSERT INTO outcome VALUES ($id, :t, $array, '$func'";
	my $check = qq{
INSERT INTO violation SELECT $id, :t, 'accepted below the fence ' || :before
 WHERE :t < :before;
INSERT INTO violation SELECT $id, :t, 'fence table not at the token: ' || coalesce(string_agg(resource || '=' || token, ','), 'no rows')
  FROM lockfence.fences WHERE resource = ANY ($array)
HAVING count(*) FILTER (WHERE token = :t) <>
       (SELECT count(DISTINCT r) FROM unnest($array) AS r);
};
	my $sql = qq{
SELECT clock_timestamp() > :'hard_deadline'::timestamptz
    OR (clock_timestamp() > :'deadline'::timestamptz
        AND (SELECT count(*) FILTER (WHERE result = 'accepted') >= 20
                AND count(*) FILTER (WHERE result <> 'accepted') >= 1
               FROM outcome)) AS stop \\gset
\\if :stop
\\q
\\endif
SELECT nextval('tok') AS t \\gset
BEGIN;
SELECT coalesce(max(token), 0) AS before FROM lockfence.fences
 WHERE resource = ANY ($array) \\gset
SELECT pg_sleep(random() * 0.01);
};
	if ($func eq 'fence')
	{
		$sql .= qq{SELECT lockfence.fence($array, :t) AS ok \\gset
\\if :ERROR
ROLLBACK;
$log, :'LAST_ERROR_SQLSTATE', :'LAST_ERROR_MESSAGE', :before);
\\else
$check
$log, 'accepted', NULL, :before);
COMMIT;
\\endif
};
	}
	else
	{
		$sql .= qq{SELECT lockfence.try_fence($array, :t) AS ok \\gset
\\if :ERROR
ROLLBACK;
$log, :'LAST_ERROR_SQLSTATE', :'LAST_ERROR_MESSAGE', :before);
\\elif :ok
$check
$log, 'accepted', NULL, :before);
COMMIT;
\\else
INSERT INTO violation SELECT $id, :t, 'fenced after a rejected try_fence: ' || r
  FROM unnest($array) AS r WHERE lockfence.fenced_token(r) IS NOT NULL;
$log, 'rejected', NULL, :before);
COMMIT;
\\endif
};
	}
	return $sql;
}

my @harnesses;
foreach my $id (1 .. $sessions)
{
	# The deadlines count from the session's own start (writing the
	# scripts took longer than $seconds on a loaded machine, and the
	# sessions then ran no call at all); past the first, a session goes on
	# until the calls checked below happened (at least 20 accepted and one
	# rejected), up to the second.
	my $script = "SELECT clock_timestamp() + interval '$seconds seconds' AS deadline,"
	  . " clock_timestamp() + interval '$hard_seconds seconds' AS hard_deadline \\gset\n"
	  . "\\set VERBOSITY verbose\n";
	# Plenty of iterations: each session stops at the deadline.
	foreach my $k (1 .. 20000)
	{
		my $n = 2 + int(rand(3));
		my @pool = @resources;
		my @set;
		push @set, splice(@pool, int(rand(@pool)), 1) for 1 .. $n;
		# Sometimes a duplicate, named again at a random place.
		splice(@set, int(rand(@set + 1)), 0, $set[0]) if rand() < 0.2;
		$script .= iteration($id, \@set, rand() < 0.5 ? 'fence' : 'try_fence');
	}
	my $file = $node->basedir . "/session_$id.sql";
	open(my $fh, '>', $file) or die "cannot write $file: $!";
	print $fh $script;
	close($fh);

	my ($out, $err) = ('', '');
	push @harnesses,
	  [
		IPC::Run::start(
			[
				'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=0',
				'-d', $node->connstr('postgres'), '-f', $file
			],
			'>', \$out, '2>', \$err,
			IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default + $seconds)),
		\$out, \$err, $id
	  ];
}
foreach my $h (@harnesses)
{
	my ($harness, $out, $err, $id) = @$h;
	ok($harness->finish, "session $id ended normally")
	  or diag("session $id: exit " . ($? >> 8));
	# Expected errors are LF001 (rejections); log the rest for diagnosis.
	my @unexpected = grep { /ERROR/ && !/LF001/ } split /\n/, $$err;
	is(scalar(@unexpected), 0, "session $id: no error but LF001")
	  or diag(join("\n", @unexpected[ 0 .. ($#unexpected < 9 ? $#unexpected : 9) ]));
}

my $summary = $node->safe_psql('postgres',
	q{SELECT result, count(*) FROM outcome GROUP BY 1 ORDER BY 1});
note("outcomes:\n$summary");

is($node->safe_psql('postgres',
		q{SELECT count(*) FROM outcome WHERE result = '40P01'}),
	'0', 'no deadlock');
is($node->safe_psql('postgres',
		q{SELECT string_agg(DISTINCT result, ',') FROM outcome
		   WHERE result NOT IN ('accepted', 'rejected', 'LF001')}),
	'', 'no outcome but accepted and rejected');
cmp_ok($node->safe_psql('postgres',
		q{SELECT count(*) FROM outcome WHERE result = 'accepted'}),
	'>=', 20, 'calls were accepted');
cmp_ok($node->safe_psql('postgres',
		q{SELECT count(*) FROM outcome WHERE result IN ('rejected', 'LF001')}),
	'>', 0, 'calls were rejected');
is($node->safe_psql('postgres',
		q{SELECT string_agg(session || ':' || token || ' ' || what, E'\n')
		    FROM (SELECT * FROM violation ORDER BY session, token LIMIT 10) v}),
	'', 'accepted calls fenced exactly their token, rejected ones nothing');

# A rejection names a member of the set, which ends above the token.
is($node->safe_psql(
		'postgres', q{
	SELECT string_agg(o.session || ':' || o.token || ' ' || o.message, E'\n')
	  FROM outcome o
	 WHERE o.result = 'LF001'
	   AND NOT EXISTS (SELECT FROM lockfence.fences f
					    WHERE o.message LIKE '%resource "' || f.resource || '"%'
						  AND f.resource = ANY (o.resources)
						  AND f.token > o.token)}),
	'', 'every rejection names a member of the set that ended above the token');

# The fence table is the highest accepted token per resource.
is($node->safe_psql(
		'postgres', q{
	WITH accepted AS (
		SELECT r AS resource, max(o.token) AS token
		  FROM outcome o, unnest(o.resources) AS r
		 WHERE o.result = 'accepted' GROUP BY r)
	SELECT string_agg(coalesce(a.resource, f.resource) || ': table ' ||
					  coalesce(f.token::text, 'none') || ', accepted ' ||
					  coalesce(a.token::text, 'none'), E'\n')
	  FROM accepted a FULL JOIN lockfence.fences f USING (resource)
	 WHERE a.token IS DISTINCT FROM f.token}),
	'', 'the fence table holds the highest accepted token of every resource');

$node->stop;
done_testing();
