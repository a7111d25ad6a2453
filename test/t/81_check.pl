# Copyright: lockfence contributors
#
# 81_check.pl: lockfence.check(), the installation check.  One row per
# finding; no row at all when nothing is wrong.  Each finding is provoked
# for real: the library not preloaded, disabled and replica/always
# triggers, a trigger with a WHEN condition or of the wrong kind created
# while the event triggers were disabled, a partition that missed its
# TRUNCATE trigger, a row trigger dropped while the TRUNCATE trigger
# stays, fence_trigger() replaced, an event trigger not enabled as created,
# lockfence.fences altered, roles that may lock it (pg_maintain, 17+),
# a publication of lockfence.fences, etcd down or without a leader, and a
# standby.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;
use LockfenceTest::Node qw(init_node);

my $node = PostgreSQL::Test::Cluster->new('check');
init_node($node, allows_streaming => 1);
$node->append_conf('postgresql.conf', "log_min_messages = warning\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION lockfence');

# The findings, as "severity finding" lines, in check()'s order.
sub findings
{
	my ($n, $where) = @_;
	$n //= $node;
	return $n->safe_psql('postgres',
		'SELECT severity, finding FROM lockfence.check()'
		  . ($where ? " WHERE $where" : '') . ' ',
		extra_params => [ '-F', ' ' ]);
}

sub detail_of
{
	my ($finding) = @_;
	return $node->safe_psql('postgres',
		"SELECT detail || ' | ' || hint FROM lockfence.check() WHERE finding = '$finding'");
}

is(findings(), 'warning not_preloaded',
	'not preloaded: the only finding, as a warning');

$node->append_conf('postgresql.conf', "shared_preload_libraries = 'lockfence'\n");
$node->restart;
is(findings(), '', 'preloaded, nothing protected: no rows');

$node->safe_psql('postgres', q{
CREATE TABLE jobs (id int, token bigint);
SELECT lockfence.protect('jobs', resource => 'jobs', token_column => 'token');
CREATE TABLE parts (id int, token bigint) PARTITION BY RANGE (id);
CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (10);
SELECT lockfence.protect('parts', resource => 'parts', token_column => 'token');
});
is(findings(), '', 'protected tables, all in order: no rows');

# (1.11) A lock held on a protected table (any role may protect and lock
# a table of its own) kept check() waiting as long as it was held.  It
# waits a second now, and reports the trigger it could not check; once
# the lock is gone, nothing.
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN');
$locker->query_safe('LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE');
my $started = time;
is(findings(), "warning trigger_not_checked\nwarning trigger_not_checked",
	'a protected table locked by another transaction: a warning for each of its triggers (row, TRUNCATE), not a wait');
cmp_ok(time - $started, '<', 30, '... returned while the lock is still held');
like(detail_of('trigger_not_checked'),
	qr/zz_lockfence_fence on public\.jobs was not checked.*pg_locks/,
	'... naming the trigger, the table and where to look');
$locker->query_safe('COMMIT');
$locker->quit;
is(findings(), '', 'the lock released: no rows');

# (1.11) A library older than the SQL (installed again, or still loaded
# without a restart): an error.  Made here by claiming a newer SQL
# version in a transaction rolled back.
is($node->safe_psql('postgres',
		"SELECT lockfence.library_version() = extversion FROM pg_extension WHERE extname = 'lockfence'"),
	't', 'the library serves the installed SQL version');
like($node->safe_psql('postgres', q{
BEGIN;
UPDATE pg_extension SET extversion = '1.999' WHERE extname = 'lockfence';
SELECT finding || ': ' || detail FROM lockfence.check() WHERE finding = 'library_older_than_sql';
ROLLBACK;}),
	qr/^library_older_than_sql: The loaded lockfence library serves SQL up to version [0-9.]+, older than this database's 1\.999\.$/,
	'a library older than the SQL version: library_older_than_sql');

# Disabled, replica-only and always triggers.
$node->safe_psql('postgres', 'ALTER TABLE jobs DISABLE TRIGGER zz_lockfence_fence');
is(findings(), 'error trigger_disabled', 'a disabled trigger is an error');
like(detail_of('trigger_disabled'),
	qr/zz_lockfence_fence on public\.jobs is disabled.*ALTER TABLE public\.jobs ENABLE TRIGGER zz_lockfence_fence;/,
	'... naming the table and the fix');
$node->safe_psql('postgres', 'ALTER TABLE jobs ENABLE REPLICA TRIGGER zz_lockfence_fence');
is(findings(), 'error trigger_enabled_replica', 'ENABLE REPLICA is an error');
$node->safe_psql('postgres', 'ALTER TABLE jobs ENABLE ALWAYS TRIGGER zz_lockfence_fence');
is(findings(), 'warning trigger_enabled_always', 'ENABLE ALWAYS is a warning');
$node->safe_psql('postgres', 'ALTER TABLE jobs ENABLE TRIGGER zz_lockfence_fence');
$node->safe_psql('postgres', 'ALTER TABLE parts_1 DISABLE TRIGGER zz_lockfence_fence');
like(detail_of('trigger_disabled'), qr/on public\.parts_1 is disabled/,
	'a disabled trigger on one partition is found');
$node->safe_psql('postgres', 'ALTER TABLE parts_1 ENABLE TRIGGER zz_lockfence_fence');
is(findings(), '', 'all enabled again: no rows');

# Roles that may write past the triggers: session_replication_role =
# replica set by a role a superuser let set it, or by a role or database
# setting.  First, that such a role does bypass them.
$node->safe_psql('postgres', q{
CREATE ROLE srr_app LOGIN;
CREATE ROLE "srr etl" LOGIN;
GRANT SET ON PARAMETER session_replication_role TO srr_app;
GRANT INSERT ON jobs TO srr_app;
});
$node->safe_psql('postgres', q{
SET ROLE srr_app;
SET session_replication_role = replica;
INSERT INTO jobs VALUES (99, NULL);
});
is($node->safe_psql('postgres', 'SELECT count(*) FROM jobs WHERE id = 99'),
	'1', 'a role granted SET on session_replication_role writes without a token');
# ... but in such a session it still may not replace the trigger for the
# sessions that follow (the owner rule's event trigger fires ALWAYS)
$node->safe_psql('postgres', 'GRANT TRIGGER ON jobs TO srr_app');
my ($srr_out, $srr_err);
$node->psql('postgres', q{
SET ROLE srr_app;
SET session_replication_role = replica;
CREATE FUNCTION pg_temp.srr_pass() RETURNS trigger LANGUAGE plpgsql
AS $$ BEGIN RETURN NEW; END $$;
CREATE OR REPLACE TRIGGER zz_lockfence_fence BEFORE INSERT OR UPDATE OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION pg_temp.srr_pass();
}, stdout => \$srr_out, stderr => \$srr_err, on_error_stop => 1);
like($srr_err, qr/only the owner of protected table public\.jobs may create or replace its triggers/,
	'... nor, in a replica session, replace the fence trigger');
is($node->safe_psql('postgres',
		q{SELECT tgfoid::regprocedure FROM pg_trigger WHERE tgrelid = 'jobs'::regclass AND tgname = 'zz_lockfence_fence'}),
	'lockfence.fence_trigger()', '... which stays');
$node->safe_psql('postgres', 'REVOKE TRIGGER ON jobs FROM srr_app');
$node->safe_psql('postgres',
	'SET session_replication_role = replica; DELETE FROM jobs WHERE id = 99; REVOKE INSERT ON jobs FROM srr_app');
is(findings(), 'warning replication_role_granted',
	'... which check() reports as a warning');
like(detail_of('replication_role_granted'),
	qr/^srr_app \(and members\) may SET session_replication_role, or ALTER SYSTEM it: .* \| REVOKE SET, ALTER SYSTEM ON PARAMETER session_replication_role FROM srr_app CASCADE;$/,
	'... naming the role and the fix');
$node->safe_psql('postgres', q{
GRANT SET ON PARAMETER session_replication_role TO PUBLIC;
ALTER ROLE "srr etl" SET session_replication_role = 'Replica';
CREATE ROLE srr_group NOLOGIN;
ALTER ROLE srr_group SET session_replication_role = replica;
ALTER ROLE "srr etl" IN DATABASE postgres SET session_replication_role = replica;
ALTER ROLE srr_app IN DATABASE template1 SET session_replication_role = replica;
});
is(findings(),
	"warning replication_role_granted\nerror replication_role_default\nerror replication_role_default",
	'a role setting, in every database and in this one, is an error each; another database\'s, or a role\'s that cannot log in, is not reported');
like(detail_of('replication_role_granted'),
	qr/^PUBLIC, srr_app \(and members\).*FROM PUBLIC, srr_app CASCADE;$/,
	'PUBLIC is named');
is($node->safe_psql('postgres',
		q{SELECT string_agg(detail || ' | ' || hint, E'\n' ORDER BY detail) FROM lockfence.check() WHERE finding = 'replication_role_default'}),
	qq{Sessions of role "srr etl" in database postgres start with session_replication_role = replica: their writes skip the triggers of protected tables. | ALTER ROLE "srr etl" IN DATABASE postgres RESET session_replication_role;\n}
	  . qq{Sessions of role "srr etl" in every database start with session_replication_role = replica: their writes skip the triggers of protected tables. | ALTER ROLE "srr etl" RESET session_replication_role;},
	'... each with the command that resets it');
$node->safe_psql('postgres', q{
ALTER ROLE "srr etl" IN DATABASE postgres RESET session_replication_role;
ALTER ROLE "srr etl" RESET session_replication_role;
ALTER ROLE ALL IN DATABASE postgres SET session_replication_role = replica;
});
like(detail_of('replication_role_default'),
	qr/^Sessions of every role in database postgres start .* \| ALTER DATABASE postgres RESET session_replication_role;$/,
	'a database setting: every role in it');
$node->safe_psql('postgres', q{
ALTER DATABASE postgres RESET session_replication_role;
ALTER ROLE ALL SET session_replication_role = replica;
});
like(detail_of('replication_role_default'),
	qr/^Sessions of every role in every database start .* \| ALTER ROLE ALL RESET session_replication_role;$/,
	'ALTER ROLE ALL: every role in every database');
$node->safe_psql('postgres', q{
ALTER ROLE ALL RESET session_replication_role;
ALTER ROLE srr_app IN DATABASE template1 RESET session_replication_role;
REVOKE SET ON PARAMETER session_replication_role FROM PUBLIC, srr_app;
DROP ROLE srr_app, "srr etl", srr_group;
ALTER SYSTEM SET session_replication_role = replica;
SELECT pg_reload_conf();
});
# (new sessions see the setting once the postmaster has reloaded)
$node->poll_query_until('postgres',
	"SELECT current_setting('session_replication_role') = 'replica'")
  or die 'the configuration was not reloaded';
like(findings(), qr/^error replication_role_default$/,
	'the server\'s configuration: an error');
like(detail_of('replication_role_default'),
	qr/^Sessions start with session_replication_role = replica \(as this session did, which no role or database setting explains: the server's configuration.* \| ALTER SYSTEM RESET session_replication_role;/,
	'... with how to reset it');
$node->safe_psql('postgres', q{
ALTER SYSTEM RESET session_replication_role;
SELECT pg_reload_conf();
});
$node->poll_query_until('postgres',
	"SELECT current_setting('session_replication_role') = 'origin'")
  or die 'the configuration was not reloaded';

# (1.9) A function whose SET clause makes session_replication_role replica
# (a superuser made it): whoever may execute it writes past the triggers.
$node->safe_psql('postgres', q{
CREATE ROLE srr_caller LOGIN;
CREATE FUNCTION "srr load"(id int) RETURNS void LANGUAGE sql
    SECURITY DEFINER SET session_replication_role = replica
    AS 'INSERT INTO jobs VALUES (id, NULL)';
GRANT EXECUTE ON FUNCTION "srr load"(int) TO srr_caller;
});
$node->safe_psql('postgres', q{SET ROLE srr_caller; SELECT "srr load"(98);});
is($node->safe_psql('postgres', 'SELECT count(*) FROM jobs WHERE id = 98'),
	'1', 'a function set to replica writes without a token for its caller');
is(findings(), 'error replication_role_function', '... which check() reports as an error');
is($node->safe_psql('postgres',
		q{SELECT detail || ' | ' || hint FROM lockfence.check() WHERE finding = 'replication_role_function'}),
	q{Function public."srr load"(integer) runs with session_replication_role = replica (its SET clause): the writes made during a call skip the triggers of protected tables, for every role that may execute it. | ALTER ROUTINE public."srr load"(integer) RESET session_replication_role;},
	'... naming the function and the fix');
# a procedure too, each named, in order, with ALTER ROUTINE as the fix
$node->safe_psql('postgres', q{
CREATE PROCEDURE zz_srr_proc() LANGUAGE sql SET session_replication_role = 'Replica' AS 'SELECT 1';
});
is($node->safe_psql('postgres',
		q{SELECT string_agg(split_part(detail, ' runs', 1) || ' | ' || hint, E'\n') FROM lockfence.check() WHERE finding = 'replication_role_function'}),
	qq{Function public."srr load"(integer) | ALTER ROUTINE public."srr load"(integer) RESET session_replication_role;\n}
	  . q{Procedure public.zz_srr_proc() | ALTER ROUTINE public.zz_srr_proc() RESET session_replication_role;},
	'a procedure is reported too, after the function');
$node->safe_psql('postgres', q{
DROP PROCEDURE zz_srr_proc();
ALTER FUNCTION "srr load"(int) RESET session_replication_role;
SET session_replication_role = replica;
DELETE FROM jobs WHERE id = 98;
});
is(findings(), '', 'reset: no rows');
$node->safe_psql('postgres', q{DROP FUNCTION "srr load"(int); DROP ROLE srr_caller;});
is(findings(), '', 'revoked and reset: no rows');

# pg_write_all_data may write lockfence.fences itself.
$node->safe_psql('postgres', q{
CREATE ROLE srr_writer LOGIN;
GRANT pg_write_all_data TO srr_writer;
SELECT lockfence.fence('wad', 10);
});
$node->safe_psql('postgres',
	q{SET ROLE srr_writer; UPDATE lockfence.fences SET token = 1 WHERE resource = 'wad'});
is($node->safe_psql('postgres', q{SELECT lockfence.current_token('wad')}),
	'1', 'a member of pg_write_all_data moves a fence back');
is(findings(), 'warning write_all_data_granted', '... which check() reports');
like(detail_of('write_all_data_granted'),
	qr/^srr_writer may act as pg_write_all_data: .* \| REVOKE pg_write_all_data FROM srr_writer;$/,
	'... naming the role and the fix');
$node->safe_psql('postgres', q{
DROP ROLE srr_writer;
SELECT lockfence.reset('wad');
});
is(findings(), '', 'the role gone: no rows');

# (1.14) pg_maintain (PostgreSQL 17 and later), and MAINTAIN granted on a
# table of lockfence, may lock lockfence.fences, holding every fence() off.
if ($node->safe_psql('postgres', 'SHOW server_version_num') < 170000)
{
	# Before 17 neither exists, and check() says nothing of it.
	$node->safe_psql('postgres', q{CREATE ROLE srr_maint LOGIN});
	is($node->safe_psql('postgres', q{SELECT to_regrole('pg_maintain') IS NULL}),
		't', 'no pg_maintain before PostgreSQL 17');
	is(findings(), '', '... and no maintain_granted');
	$node->safe_psql('postgres', q{DROP ROLE srr_maint});
}
else
{
	my $lock_as = sub {
		my ($role) = @_;
		my ($ret, $out, $err) = $node->psql('postgres', qq{
SET ROLE $role;
BEGIN;
LOCK TABLE lockfence.fences IN ACCESS EXCLUSIVE MODE;
COMMIT;
});
		return $ret == 0 ? 'locked' : $err =~ /permission denied/ ? 'denied' : $err;
	};
	$node->safe_psql('postgres', q{
CREATE ROLE srr_maint LOGIN;
CREATE ROLE "srr maint inner" LOGIN IN ROLE srr_maint;
CREATE ROLE srr_grantee LOGIN;
GRANT pg_maintain TO srr_maint;
});
	is($lock_as->('"srr maint inner"'), 'locked',
		'a member of a member of pg_maintain locks lockfence.fences');
	is(findings(), 'warning maintain_granted', '... which check() reports');
	like(detail_of('maintain_granted'),
		qr/^"srr maint inner", srr_maint may act as pg_maintain on lockfence's tables: LOCK TABLE lockfence\.fences .* \| REVOKE pg_maintain FROM srr_maint;$/,
		'... naming both roles, and the direct grant to revoke');

	$node->safe_psql('postgres', q{
REVOKE pg_maintain FROM srr_maint;
GRANT MAINTAIN ON lockfence.fences TO srr_grantee;
});
	is($lock_as->('"srr maint inner"'), 'denied', 'revoked: no lock');
	is($lock_as->('srr_grantee'), 'locked',
		'MAINTAIN granted on lockfence.fences: the grantee locks it');
	is(findings(), 'warning maintain_granted', '... which check() reports');
	like(detail_of('maintain_granted'),
		qr/^srr_grantee may act as pg_maintain .* \| REVOKE MAINTAIN ON lockfence\.fences FROM srr_grantee;$/,
		'... and the grant to revoke');

	$node->safe_psql('postgres', q{
REVOKE MAINTAIN ON lockfence.fences FROM srr_grantee;
});
	is($lock_as->('srr_grantee'), 'denied', 'revoked: no lock');
	$node->safe_psql('postgres', q{
DROP ROLE "srr maint inner", srr_maint, srr_grantee;
});
	is(findings(), '', 'revoked: no rows');
}

# A BEFORE ROW trigger ahead of the fence whose function another role owns.
# (The table is the superuser's, the function an application role's.)
$node->safe_psql('postgres', q{
CREATE ROLE srr_fn LOGIN;
CREATE FUNCTION public.srr_stamp() RETURNS trigger LANGUAGE plpgsql
AS $$ BEGIN RETURN NEW; END $$;
ALTER FUNCTION public.srr_stamp() OWNER TO srr_fn;
CREATE TABLE srr_t (id int, tok bigint);
SELECT lockfence.protect('srr_t', resource => 'srr', token_column => 'tok');
CREATE TRIGGER aa_stamp BEFORE INSERT OR UPDATE ON srr_t
    FOR EACH ROW EXECUTE FUNCTION public.srr_stamp();
CREATE TRIGGER aa_on_delete BEFORE DELETE ON srr_t
    FOR EACH ROW EXECUTE FUNCTION public.srr_stamp();
});
is(findings(), 'warning trigger_function_foreign',
	'a trigger ahead of the fence running another role\'s function: a warning (once: a DELETE trigger carries no token)');
like(detail_of('trigger_function_foreign'),
	qr/^Trigger aa_stamp on public\.srr_t runs before the fence and executes public\.srr_stamp\(\), owned by srr_fn, who has not the privileges of the table's owner (\S+): .* \| ALTER FUNCTION public\.srr_stamp\(\) OWNER TO \1; /,
	'... naming the trigger, the function, its owner and the fix');
$node->safe_psql('postgres', 'ALTER FUNCTION public.srr_stamp() OWNER TO CURRENT_USER');
is(findings(), '', 'the function the table owner\'s: no rows');

$node->safe_psql('postgres', q{
DROP TABLE srr_t;
DROP FUNCTION public.srr_stamp();
DROP ROLE srr_fn;
});

# The same trigger made on a partitioned table that is not protected
# itself: PostgreSQL clones it onto every partition, a protected one
# included, where it fires ahead of the fence.
$node->safe_psql('postgres', q{
CREATE ROLE srr_fn LOGIN;
CREATE FUNCTION public.srr_stamp() RETURNS trigger LANGUAGE plpgsql
AS $$ BEGIN RETURN NEW; END $$;
ALTER FUNCTION public.srr_stamp() OWNER TO srr_fn;
CREATE TABLE srr_pp (id int, tok bigint) PARTITION BY LIST (id);
CREATE TABLE srr_pp_a PARTITION OF srr_pp FOR VALUES IN (1);
SELECT lockfence.protect('srr_pp_a', resource => 'srr', token_column => 'tok');
CREATE TRIGGER aa_stamp BEFORE INSERT OR UPDATE ON srr_pp
    FOR EACH ROW EXECUTE FUNCTION public.srr_stamp();
});
is(findings(), 'warning trigger_function_foreign',
	'a partition\'s clone of its unprotected parent\'s trigger: reported');
like(detail_of('trigger_function_foreign'),
	qr/^Trigger aa_stamp on public\.srr_pp_a runs before the fence/,
	'... on the protected partition');
$node->safe_psql('postgres', 'DROP TRIGGER aa_stamp ON srr_pp');
# ... and a role that does not own the partition may not make it, even
# with the TRIGGER privilege on both (which GRANT ALL gives)
$node->safe_psql('postgres', 'GRANT TRIGGER ON srr_pp, srr_pp_a TO srr_fn');
my ($clone_out, $clone_err);
$node->psql('postgres', q{
SET ROLE srr_fn;
CREATE TRIGGER aa_stamp BEFORE INSERT OR UPDATE ON srr_pp
    FOR EACH ROW EXECUTE FUNCTION public.srr_stamp();
}, stdout => \$clone_out, stderr => \$clone_err, on_error_stop => 1);
like($clone_err, qr/only the owner of protected table public\.srr_pp_a may create or replace its triggers/,
	'a non-owner\'s trigger on the parent, cloned onto a protected partition: refused');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_trigger WHERE tgname = 'aa_stamp'}),
	'0', '... and not made');
$node->safe_psql('postgres', q{
DROP TABLE srr_pp;
DROP FUNCTION public.srr_stamp();
DROP ROLE srr_fn;
});

# What slips past with the extension's event triggers disabled.
my @evt = split /\n/, $node->safe_psql('postgres', q{
SELECT evtname FROM pg_event_trigger WHERE evtname LIKE 'lockfence%' ORDER BY 1});
$node->safe_psql('postgres', "ALTER EVENT TRIGGER $_ DISABLE") foreach @evt;
like(findings(), qr/^(warning event_trigger_disabled\n?)+$/,
	'disabled event triggers of the extension are reported');
$node->safe_psql('postgres', q{
CREATE TABLE parts_2 PARTITION OF parts FOR VALUES FROM (10) TO (20);
CREATE TABLE w (id int, token bigint);
CREATE TRIGGER zz_when BEFORE INSERT ON w FOR EACH ROW WHEN (NEW.id > 0)
    EXECUTE FUNCTION lockfence.fence_trigger('resource=w', 'token_column=token');
CREATE TABLE a (id int, token bigint);
CREATE TRIGGER zz_after AFTER INSERT ON a FOR EACH ROW
    EXECUTE FUNCTION lockfence.fence_trigger('resource=a', 'token_column=token');
});
$node->safe_psql('postgres', "ALTER EVENT TRIGGER $_ ENABLE ALWAYS") foreach @evt;
is( findings(),
	"error trigger_invalid\nerror trigger_invalid\nerror partition_unprotected",
	'a WHEN trigger, an AFTER trigger and a partition without its TRUNCATE trigger');
like(detail_of('partition_unprotected'),
	qr/Partition public\.parts_2 of protected table public\.parts has no lockfence TRUNCATE trigger.*cover_descendants\('public\.parts'\)/,
	'... the partition, with the fix');
my $invalid = $node->safe_psql('postgres',
	"SELECT string_agg(detail, E'\\n' ORDER BY detail) FROM lockfence.check() WHERE finding = 'trigger_invalid'");
like($invalid, qr/zz_after on public\.a: .*must fire BEFORE/, 'the AFTER trigger, with check_trigger()\'s reason');
like($invalid, qr/zz_when on public\.w has a WHEN condition/, 'the WHEN trigger');
$node->safe_psql('postgres', q{
SELECT lockfence.cover_descendants('parts');
DROP TABLE w, a;
});
is(findings(), '', 'fixed as the hints say: no rows');

# States in which a protected table accepts a tokenless write, each found
# (issue 17, item 11).
sub tokenless_insert_commits
{
	my ($table) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "INSERT INTO $table VALUES (99, NULL)");
	$node->safe_psql('postgres', "SET session_replication_role = replica; DELETE FROM $table WHERE id = 99");
	return $rc == 0;
}

# The row trigger dropped, the TRUNCATE trigger kept.
$node->safe_psql('postgres', 'DROP TRIGGER zz_lockfence_fence ON jobs');
ok(tokenless_insert_commits('jobs'), 'row trigger dropped: a tokenless INSERT commits');
is(findings(), 'error row_trigger_missing', 'a table with only its TRUNCATE trigger is an error');
like(detail_of('row_trigger_missing'),
	qr/Table public\.jobs has a lockfence TRUNCATE trigger but no lockfence row trigger.*lockfence\.unprotect\('public\.jobs'\)/,
	'... naming the table and the fix');
$node->safe_psql('postgres', q{
SELECT lockfence.unprotect('jobs');
SELECT lockfence.protect('jobs', resource => 'jobs', token_column => 'token');
DROP TRIGGER zz_lockfence_fence_truncate ON jobs;
});
is(findings(), 'error truncate_trigger_missing', 'a table without its TRUNCATE trigger is an error');
$node->safe_psql('postgres', q{
SELECT lockfence.unprotect('jobs');
SELECT lockfence.protect('jobs', resource => 'jobs', token_column => 'token');
});
is(findings(), '', 'protected again: no rows');

# lockfence.fences altered (issue 17, items 6 and 11): a trigger on it can
# keep a fence from advancing, so an old token would still pass.
$node->safe_psql('postgres', q{
CREATE FUNCTION keep_token() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN NEW.token := OLD.token; RETURN NEW; END$$;
CREATE TRIGGER keep_token BEFORE UPDATE ON lockfence.fences
  FOR EACH ROW EXECUTE FUNCTION keep_token();
});
is(findings(), 'error fences_table_altered', 'a trigger on lockfence.fences is an error');
like(detail_of('fences_table_altered'),
	qr/trigger "keep_token"/, '... naming the trigger');
$node->safe_psql('postgres', 'DROP TRIGGER keep_token ON lockfence.fences');
$node->safe_psql('postgres', 'ALTER TABLE lockfence.fences ALTER COLUMN holder SET NOT NULL');
is(findings(), 'error fences_table_altered', 'a NOT NULL added to lockfence.fences is an error');
$node->safe_psql('postgres', 'ALTER TABLE lockfence.fences ALTER COLUMN holder DROP NOT NULL');
is(findings(), '', 'lockfence.fences as installed again: no rows');

# fence_trigger() replaced by a pass-through.
my $fence_trigger_def = $node->safe_psql('postgres',
	"SELECT pg_get_functiondef('lockfence.fence_trigger()'::regprocedure)");
$node->safe_psql('postgres', q{
CREATE OR REPLACE FUNCTION lockfence.fence_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN coalesce(NEW, OLD); END $$;
});
ok(tokenless_insert_commits('jobs'), 'fence_trigger() replaced: a tokenless INSERT commits');
like(findings(), qr/^error function_replaced$/m, 'a replaced fence_trigger() is an error');
like(detail_of('function_replaced'),
	qr/Function lockfence\.fence_trigger\(\) of lockfence was replaced \(language plpgsql/,
	'... naming the function');
$node->safe_psql('postgres', $fence_trigger_def);
is(findings(), '', 'the original definition again: no rows');

# The guard enabled, but not ALWAYS: DROP EXTENSION lockfence CASCADE in a
# session with session_replication_role = replica would go through.
$node->safe_psql('postgres', 'ALTER EVENT TRIGGER lockfence_guard_drop ENABLE');
my ($rc, $out, $err) = $node->psql('postgres', q{
BEGIN;
SET session_replication_role = replica;
DROP EXTENSION lockfence CASCADE;
ROLLBACK;
});
unlike($err, qr/cannot drop lockfence/, 'guard enabled, not ALWAYS: a replica session may drop lockfence');
is(findings(), 'warning event_trigger_not_always', 'a guard that is not ENABLE ALWAYS is reported');
like(detail_of('event_trigger_not_always'),
	qr/lockfence_guard_drop .*ALTER EVENT TRIGGER lockfence_guard_drop ENABLE ALWAYS;/,
	'... with the fix');
$node->safe_psql('postgres', 'ALTER EVENT TRIGGER lockfence_guard_drop ENABLE REPLICA');
is(findings(), 'warning event_trigger_not_always', '... and ENABLE REPLICA too');
$node->safe_psql('postgres', 'ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE REPLICA');
is( findings(),
	"warning event_trigger_enabled_replica\nwarning event_trigger_not_always",
	'the DDL check enabled only for replica sessions is reported');
$node->safe_psql('postgres', q{
ALTER EVENT TRIGGER lockfence_guard_drop ENABLE ALWAYS;
ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE;
});
is(findings(), '', 'as created again: no rows');

# A publication of the fences (only with the override).
$node->safe_psql('postgres', q{
SET lockfence.allow_publish_fences = on;
CREATE PUBLICATION everything FOR ALL TABLES;
});
is(findings(), 'error fences_published', 'a FOR ALL TABLES publication is an error');
$node->safe_psql('postgres', 'DROP PUBLICATION everything');

# etcd: probed only when configured; down; without a leader.
my $etcd = LockfenceTest::EtcdCluster->new(members => 3, name => 'check');
$etcd->start;
$node->append_conf('postgresql.conf', qq{
lockfence.etcd_endpoints = '@{[ $etcd->endpoints ]}'
lockfence.etcd_connect_timeout = '200ms'
});
$node->reload;
my $deadline = time + 60;
my $f = findings();
while ($f ne '' && time < $deadline)
{
	usleep(200_000);
	$f = findings();
}
is($f, '', 'etcd configured and healthy: no rows')
  or diag detail_of('etcd_unreachable');

my $leader = $etcd->leader_index;
my @others = grep { $_ != $leader } 0 .. 2;
$etcd->kill_member($others[0]);
$etcd->kill_member($others[1]);
# The survivor loses its leadership after an election timeout; poll.
$deadline = time + 30;
while (time < $deadline)
{
	$f = findings();
	last if $f =~ /etcd_/;
	usleep(200_000);
}
like($f, qr/^error etcd_(no_leader|unreachable)$/m,
	'a member without a quorum: reported as an error');
note "with two of three members down: $f";
my $t0 = time;
$etcd->kill_member($leader);
is(findings(), 'error etcd_unreachable', 'etcd down: etcd_unreachable');
cmp_ok(time - $t0, '<', 10, '... within a few seconds (a short probe)');

# Lock functions granted but the role may not probe: said so.
$node->safe_psql('postgres', 'CREATE ROLE mon LOGIN');
is( $node->safe_psql('postgres',
		'SELECT severity, finding FROM lockfence.check()',
		extra_params => [ '-U', 'mon', '-F', ' ' ]),
	'info etcd_not_probed',
	'a role without EXECUTE on etcd_status() is told etcd was not probed');

$node->append_conf('postgresql.conf', "lockfence.etcd_endpoints = 'http://127.0.0.1:2379'\n");
$node->reload;

# A standby.
$node->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('check_standby');
$standby->init_from_backup($node, 'b', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby);
like(findings($standby), qr/^info in_recovery$/m, 'a standby: in_recovery');

$standby->stop;
$node->stop;
$etcd->stop;
done_testing();
