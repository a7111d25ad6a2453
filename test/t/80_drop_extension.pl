# Copyright: lockfence contributors
#
# 80_drop_extension.pl: DROP EXTENSION lockfence (and DROP SCHEMA lockfence,
# and every other drop that would take lockfence with it: its schema
# renamed, PL/pgSQL, a member) is refused while tables are protected, whether or not the library is
# preloaded or loaded in the session; lockfence.unprotect() and
# lockfence.allow_drop_protected are the ways out.  And a fence on a
# standby says that the server is in recovery (SQLSTATE 25006).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

# Not preloaded: the guard must work from the extension's SQL alone.
my $node = PostgreSQL::Test::Cluster->new('drop_guard');
init_node($node, allows_streaming => 1);
$node->append_conf('postgresql.conf', "log_min_messages = warning\n");
$node->start;

# Run SQL in a new session; return (exit code, stdout, stderr) with
# verbose errors, so that stderr shows SQLSTATEs.
sub run_sql
{
	my ($n, $sql) = @_;
	my ($out, $err);
	my $rc = $n->psql('postgres', "\\set VERBOSITY verbose\n" . $sql,
		stdout => \$out, stderr => \$err);
	return ($rc, $out, $err);
}

sub protected_table_refuses_tokenless_insert
{
	my ($what) = @_;
	my ($rc, $out, $err) = run_sql($node, 'INSERT INTO jobs VALUES (1, NULL)');
	like($err, qr/LF002/, "$what: a tokenless INSERT is still refused");
}

$node->safe_psql('postgres', q{
CREATE EXTENSION lockfence;
CREATE TABLE jobs (id int, token bigint);
SELECT lockfence.protect('jobs', resource => 'jobs', token_column => 'token');
});

# A fresh session, with lockfence.so not loaded in it yet.
my ($rc, $out, $err) = run_sql($node, 'DROP EXTENSION lockfence CASCADE');
isnt($rc, 0, 'DROP EXTENSION CASCADE with a protected table is refused');
like($err, qr/2BP01: cannot drop lockfence while 1 table is protected by it/,
	'... with SQLSTATE 2BP01 and a clear message');
like($err, qr/HINT:.*lockfence\.unprotect\(tbl\).*lockfence\.allow_drop_protected = on/,
	'... and a hint naming unprotect() and the override');
protected_table_refuses_tokenless_insert('after the refused DROP EXTENSION');

($rc, $out, $err) = run_sql($node, 'DROP SCHEMA lockfence CASCADE');
like($err, qr/2BP01: cannot drop lockfence/, 'DROP SCHEMA lockfence CASCADE is refused');

# Drops that reach lockfence by another path (issue 17, item 9): each one
# would drop the extension and every protection with a NOTICE.
sub extension_is_there
{
	my ($what) = @_;
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM pg_extension WHERE extname = 'lockfence'"),
		'1', "$what: the extension is still there");
	protected_table_refuses_tokenless_insert($what);
}

# The schema under another name.
($rc, $out, $err) = run_sql($node, q{
ALTER SCHEMA lockfence RENAME TO x;
DROP SCHEMA x CASCADE;
});
like($err, qr/0A000: cannot rename schema "lockfence" of extension lockfence/,
	'ALTER SCHEMA lockfence RENAME is refused');
extension_is_there('ALTER SCHEMA lockfence RENAME TO x; DROP SCHEMA x CASCADE');

# PL/pgSQL: lockfence's helpers are written in it, and dropping an
# extension member by CASCADE drops its whole extension.
($rc, $out, $err) = run_sql($node, 'DROP EXTENSION plpgsql CASCADE');
like($err, qr/2BP01: cannot drop lockfence while 1 table is protected by it/,
	'DROP EXTENSION plpgsql CASCADE is refused');
extension_is_there('DROP EXTENSION plpgsql CASCADE');
($rc, $out, $err) = run_sql($node, 'DROP LANGUAGE plpgsql CASCADE');
isnt($rc, 0, 'DROP LANGUAGE plpgsql CASCADE is refused');
extension_is_there('DROP LANGUAGE plpgsql CASCADE');

# A member taken out of the extension could then be dropped alone.
($rc, $out, $err) = run_sql($node, q{
ALTER EXTENSION lockfence DROP FUNCTION lockfence.fence_trigger();
DROP FUNCTION lockfence.fence_trigger() CASCADE;
});
like($err, qr/2BP01: cannot remove an object from extension lockfence while 1 table is protected by it/,
	'ALTER EXTENSION lockfence DROP is refused while a table is protected');
extension_is_there('ALTER EXTENSION lockfence DROP; DROP FUNCTION lockfence.fence_trigger() CASCADE');
($rc, $out, $err) = run_sql($node, 'DROP FUNCTION lockfence.fence_trigger() CASCADE');
like($err, qr/2BP01: cannot drop lockfence while 1 table is protected by it/,
	'DROP FUNCTION lockfence.fence_trigger() CASCADE is refused');
($rc, $out, $err) = run_sql($node, 'DROP FUNCTION lockfence.protect CASCADE');
like($err, qr/2BP01: cannot drop lockfence/,
	'DROP FUNCTION of another member with CASCADE is refused');

# A function of the extension made to depend on another extension.
SKIP:
{
	skip 'hstore not available', 2
	  unless $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_available_extensions WHERE name = 'hstore'") eq '1';
	$node->safe_psql('postgres', q{
CREATE EXTENSION hstore;
ALTER FUNCTION lockfence.check() DEPENDS ON EXTENSION hstore;
});
	($rc, $out, $err) = run_sql($node, 'DROP EXTENSION hstore');
	like($err, qr/2BP01: cannot drop lockfence/,
		'DROP EXTENSION of an extension a member was made to depend on is refused');
	extension_is_there('DROP EXTENSION hstore');
	$node->safe_psql('postgres', q{
ALTER FUNCTION lockfence.check() NO DEPENDS ON EXTENSION hstore;
DROP EXTENSION hstore;
});
}

# Dropping protected tables themselves is not refused: nothing stays
# unfenced.  Nor is dropping a schema that holds one.
($rc, $out, $err) = run_sql($node, q{
CREATE SCHEMA app;
CREATE TABLE app.t (id int, token bigint);
SELECT lockfence.protect('app.t', resource => 't', token_column => 'token');
CREATE TABLE gone (id int, token bigint);
SELECT lockfence.protect('gone', resource => 'gone', token_column => 'token');
DROP TABLE gone;
DROP SCHEMA app CASCADE;
});
is($rc, 0, 'DROP TABLE of a protected table and DROP SCHEMA CASCADE of its schema go through')
  or diag $err;

# session_replication_role = replica does not silence the guard.
($rc, $out, $err) = run_sql($node, q{
SET session_replication_role = replica;
DROP EXTENSION lockfence CASCADE;
});
like($err, qr/2BP01: cannot drop lockfence/,
	'refused with session_replication_role = replica too');

# DROP OWNED BY the extension's owner would drop the extension too.
$node->safe_psql('postgres', q{
CREATE ROLE extowner SUPERUSER LOGIN;
CREATE ROLE other;
CREATE DATABASE owned;
});
$node->safe_psql('owned', q{
SET ROLE extowner;
CREATE EXTENSION lockfence;
RESET ROLE;
CREATE TABLE jobs (id int, token bigint);
SELECT lockfence.protect('jobs', resource => 'jobs', token_column => 'token');
});
my ($out2, $err2);
$node->psql('owned', "\\set VERBOSITY verbose\nDROP OWNED BY extowner CASCADE",
	stdout => \$out2, stderr => \$err2);
like($err2, qr/2BP01: cannot drop lockfence/, 'DROP OWNED BY the extension\'s owner is refused');
is($node->safe_psql('owned', "SELECT count(*) FROM pg_extension WHERE extname = 'lockfence'"),
	'1', '... and the extension is still there');
$node->safe_psql('owned', 'DROP OWNED BY other CASCADE');
pass('DROP OWNED BY another role goes through');
protected_table_refuses_tokenless_insert('after the refused drops');

# A trigger function that is no longer a member (taken out before any
# table was protected): dropping it would drop the triggers of tables that
# stay.
$node->safe_psql('postgres', 'CREATE DATABASE loose');
$node->safe_psql('loose', q{
CREATE EXTENSION lockfence;
ALTER EXTENSION lockfence DROP FUNCTION lockfence.fence_trigger();
CREATE TABLE jobs (id int, token bigint);
SELECT lockfence.protect('jobs', resource => 'jobs', token_column => 'token');
});
my ($l_out, $l_err);
$node->psql('loose', "\\set VERBOSITY verbose\nDROP FUNCTION lockfence.fence_trigger() CASCADE",
	stdout => \$l_out, stderr => \$l_err);
like($l_err, qr/2BP01: cannot drop the lockfence trigger zz_lockfence_fence on table public.jobs/,
	'a drop that would remove a lockfence trigger but not its table is refused');
$node->psql('loose', "\\set VERBOSITY verbose\nINSERT INTO jobs VALUES (1, NULL)",
	stdout => \$l_out, stderr => \$l_err);
like($l_err, qr/LF002/, '... and the table still refuses a tokenless INSERT');

# Other extensions can still be dropped.
SKIP:
{
	skip 'hstore not available', 1
	  unless $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_available_extensions WHERE name = 'hstore'") eq '1';
	($rc, $out, $err) = run_sql($node, 'CREATE EXTENSION hstore; DROP EXTENSION hstore');
	is($rc, 0, 'another extension is dropped as usual') or diag $err;
}

# Unprotect, then drop: no CASCADE needed, nothing left behind.
$node->safe_psql('postgres', q{
CREATE TABLE parts (id int, token bigint) PARTITION BY RANGE (id);
CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (10);
SELECT lockfence.protect('parts', resource => 'parts', token_column => 'token');
});
is($node->safe_psql('postgres',
		"SELECT lockfence.unprotect('jobs'), lockfence.unprotect('parts')"),
	'2|3', 'unprotect() drops the triggers of a table and of its partitions');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_trigger WHERE tgfoid = 'lockfence.fence_trigger()'::regprocedure"),
	'0', 'no lockfence trigger is left');
($rc, $out, $err) = run_sql($node, 'DROP EXTENSION lockfence');
is($rc, 0, 'DROP EXTENSION succeeds once every table is unprotected') or diag $err;

# The explicit override, set before the library is loaded in the session.
$node->safe_psql('postgres', q{
CREATE EXTENSION lockfence;
SELECT lockfence.protect('jobs', resource => 'jobs', token_column => 'token');
});
($rc, $out, $err) = run_sql($node, q{
SET lockfence.allow_drop_protected = on;
DROP EXTENSION lockfence CASCADE;
});
is($rc, 0, 'SET lockfence.allow_drop_protected = on lets DROP EXTENSION CASCADE through')
  or diag $err;
like($err, qr/drop cascades to trigger zz_lockfence_fence on table jobs/,
	'... dropping the protection, as the NOTICE says');

# A fence on a standby: 25006, and the message says why.
$node->safe_psql('postgres', 'CREATE EXTENSION lockfence');
$node->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('drop_guard_standby');
$standby->init_from_backup($node, 'b', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby);
($rc, $out, $err) = run_sql($standby, "SELECT lockfence.fence('r', 1)");
like($err, qr/25006: cannot fence a resource while the server is in recovery/,
	'a fence on a standby says the server is in recovery, SQLSTATE 25006');
unlike($err, qr/read-only transaction/, '... not "read-only transaction"');

# On a primary, a read-only transaction keeps its own message.
($rc, $out, $err) = run_sql($node,
	"SET default_transaction_read_only = on; SELECT lockfence.fence('r', 1)");
like($err, qr/25006: cannot execute lockfence\.fence\(\) in a read-only transaction/,
	'a read-only transaction on the primary keeps its message');

$standby->stop;
$node->stop;
done_testing();
