# Copyright: the lockfence authors
#
# 03_row_token_load_time.pl
#	  What counts as a row token does not depend on when the library was
#	  loaded.
#
# The same writes run in a server with lockfence in shared_preload_libraries
# (loaded before any statement) and, after a restart without it, in fresh
# sessions where the write itself loads the library in the middle of a
# statement: a MERGE nested in a function called by an INSERT, whose
# action that would set the token does not run, and an ORM-style UPDATE
# that saves the row's token unchanged.  Both are refused with LF002 in
# every case, and accepted once the transaction fenced the token.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $node = PostgreSQL::Test::Cluster->new('loadtime');
init_node($node);
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'lockfence'\n");
$node->start;

$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION lockfence;
	CREATE TABLE mrow (id int PRIMARY KEY, tok bigint, v int);
	SELECT lockfence.protect('mrow', resource => 'mres', token_column => 'tok');
	INSERT INTO mrow VALUES (1, 50, 0);
	CREATE TABLE side (a int, b int);
	CREATE FUNCTION do_merge() RETURNS int LANGUAGE plpgsql AS $$
	BEGIN
		MERGE INTO mrow m USING (VALUES (1)) s(id) ON m.id = s.id
			WHEN MATCHED AND false THEN UPDATE SET tok = 51
			WHEN MATCHED THEN UPDATE SET v = 666;
		RETURN 1;
	END
	$$;
});

my @writes = (
	[ 'nested MERGE', 'INSERT INTO side SELECT do_merge(), do_merge()' ],
	[ 'UPDATE saving the token unchanged', 'UPDATE mrow SET v = 666, tok = tok' ],
	[ 'INSERT copying the token', 'INSERT INTO mrow SELECT 2, tok, 666 FROM mrow' ]);

# Each write in a session of its own: the first statement of the session.
sub check_writes
{
	my ($label) = @_;

	foreach my $w (@writes)
	{
		my ($what, $sql) = @$w;
		my ($ret, $stdout, $stderr) =
		  $node->psql('postgres', "\\set VERBOSITY verbose\n$sql");
		like($stderr, qr/ERROR:  LF002: write to protected table "mrow" carries no fencing token/,
			"$label: $what is refused");
	}
	is($node->safe_psql('postgres', 'SELECT v FROM mrow ORDER BY id'),
		'0', "$label: nothing was written");
	is( $node->safe_psql(
			'postgres', q{
		BEGIN;
		SELECT lockfence.fence('mres', 50);
		INSERT INTO side SELECT do_merge(), do_merge();
		UPDATE mrow SET v = v + 1, tok = tok;
		ROLLBACK;
	}),
		'50',
		"$label: the same writes pass after fence() in their transaction");
	return;
}

check_writes('preloaded');

$node->adjust_conf('postgresql.conf', 'shared_preload_libraries', "''");
$node->restart;
is( $node->safe_psql(
		'postgres', q{
	SELECT count(*) FROM pg_settings
	 WHERE name = 'shared_preload_libraries' AND setting LIKE '%lockfence%'}),
	'0',
	'restarted without preloading');
check_writes('loaded by the write');

$node->stop;
done_testing();
