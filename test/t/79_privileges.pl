# Copyright: lockfence contributors
#
# 79_privileges.pl: secure by default (issue 17, item 12).  A new
# installation grants PUBLIC nothing that advances a fence or a lease: a
# role without the grant gets 42501 from each of fence(), try_fence() (both
# forms) and the lease functions, and so cannot lock a holder out or renew
# or release another's lease.  lockfence.grant_usage(role) gives an
# application role exactly these, and the README's examples then work.
# Writing a protected table needs no grant (the trigger runs for any
# writer), but a row token advances a fence only through a table whose
# owner may fence (not through a role's own table with the trigger), and
# revoke_usage() takes the grant back.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

my $node = PostgreSQL::Test::Cluster->new('privileges');
init_node($node);
$node->append_conf('postgresql.conf', "log_min_messages = warning\n");
$node->start;

$node->safe_psql('postgres', q{
CREATE EXTENSION lockfence;
CREATE ROLE app LOGIN;
CREATE ROLE intruder LOGIN;
CREATE TABLE jobs (id int, token bigint);
SELECT lockfence.protect('jobs', resource => 'jobs', token_column => 'token');
GRANT INSERT, SELECT ON jobs TO app, intruder;
});

# Run SQL as a role; return (exit code, stdout, stderr), verbose errors.
sub run_as
{
	my ($role, $sql) = @_;
	my ($out, $err);
	my $rc = $node->psql('postgres', "\\set VERBOSITY verbose\n" . $sql,
		stdout => \$out, stderr => \$err,
		extra_params => [ '-U', $role ]);
	return ($rc, $out, $err);
}

# The holder takes a lease (as the superuser: nobody is granted yet).
my $token = $node->safe_psql('postgres',
	"SELECT token FROM lockfence.lease_acquire('jobs', '1 hour', holder => 'holder')");
like($token, qr/^\d+$/, 'the real holder holds the lease on jobs');

my @calls = (
	"SELECT lockfence.fence('jobs', 6000)",
	"SELECT lockfence.try_fence('jobs', 6000)",
	"SELECT lockfence.fence(ARRAY['jobs'], 6000)",
	"SELECT lockfence.try_fence(ARRAY['jobs'], 6000)",
	"SELECT * FROM lockfence.lease_acquire('other', '1 minute')",
	"SELECT * FROM lockfence.lease_try_acquire('other', '1 minute')",
	"SELECT lockfence.lease_renew('jobs', $token, '100 years')",
	"SELECT lockfence.lease_release('jobs', $token)",
	"SELECT lockfence.grant_usage('intruder')",
	"SELECT lockfence.revoke_usage('app')",);

for my $sql (@calls)
{
	my ($rc, $out, $err) = run_as('intruder', $sql);
	like($err, qr/ERROR:  42501: permission denied for function/,
		"without the grant: $sql is refused with 42501");
}
is( $node->safe_psql('postgres',
		"SELECT token = $token AND lease_expires_at < now() + interval '2 hours' FROM lockfence.fences WHERE resource = 'jobs'"),
	't', 'the holder\'s lease is untouched: same token, same expiry');
is($node->safe_psql('postgres', "SELECT count(*) FROM lockfence.fences WHERE resource = 'other'"),
	'0', 'no lease was taken');

# Reading stays open to PUBLIC.
my ($rc, $out, $err) = run_as('intruder',
	"SELECT lockfence.current_token('jobs') = $token, count(*) > 0 FROM lockfence.fences");
is($out, 't|t', 'without the grant, current_token() and the fence table are readable');

# Writing a protected table needs no grant: the trigger checks the row's
# token for any writer (a higher row token advances the fence).
($rc, $out, $err) = run_as('intruder', 'INSERT INTO jobs VALUES (1, NULL)');
like($err, qr/LF002/, 'a tokenless write by a role without the grant is refused (LF002)');
($rc, $out, $err) = run_as('intruder', "INSERT INTO jobs VALUES (1, @{[ $token - 1 ]})");
like($err, qr/LF001/, '... and a stale row token (LF001): the trigger runs without EXECUTE grants');

# But a row can advance a fence only through a table whose owner may
# fence: any role may put the trigger on a table of its own (a temporary
# one: PUBLIC may create those), and a higher row token there would lock
# any holder out, as fence() would.
for my $res ('jobs', 'fresh')
{
	($rc, $out, $err) = run_as('intruder', qq{
CREATE TEMP TABLE mine (r text, tok bigint);
CREATE TRIGGER zz BEFORE INSERT OR UPDATE OR DELETE ON mine FOR EACH ROW
  EXECUTE FUNCTION lockfence.fence_trigger('resource_column=r', 'token_column=tok');
INSERT INTO mine VALUES ('$res', 9223372036854775807);});
	like($err, qr/ERROR:  42501: permission denied to fence resource "$res" with a token from a row of table "mine"/,
		"a row token in the intruder's own table with the trigger: refused (42501), resource $res")
	  or diag $err;
}
is( $node->safe_psql('postgres',
		"SELECT token = $token AND lease_expires_at > now() FROM lockfence.fences WHERE resource = 'jobs'"),
	't', '... the holder\'s lease is untouched');
is($node->safe_psql('postgres', "SELECT count(*) FROM lockfence.fences WHERE resource = 'fresh'"),
	'0', '... and no fence was created');
# The owner's right is what counts, not the writer's: a table owned by a
# role without the grant refuses a row token; granted, its writers (who
# have no grant themselves) may advance its fence with one.
$node->safe_psql('postgres', q{
CREATE ROLE owner2;
CREATE TABLE jobs2 (id int, token bigint);
ALTER TABLE jobs2 OWNER TO owner2;
SELECT lockfence.protect('jobs2', resource => 'jobs2', token_column => 'token');
GRANT INSERT ON jobs2 TO intruder;});
($rc, $out, $err) = run_as('intruder', 'INSERT INTO jobs2 VALUES (1, 5)');
like($err, qr/ERROR:  42501: permission denied to fence resource "jobs2".*\n.*role "owner2", may not execute lockfence.fence/,
	'owner without the grant: a row token is refused (42501), naming the owner') or diag $err;
$node->safe_psql('postgres', "SELECT lockfence.grant_usage('owner2')");
($rc, $out, $err) = run_as('intruder', 'INSERT INTO jobs2 VALUES (1, 5)');
is($rc, 0, 'owner granted: a writer without a grant advances the fence with a row token') or diag $err;
is($node->safe_psql('postgres', "SELECT lockfence.current_token('jobs2')"), '5', '... to 5');
# the check needs nothing of the writer: not even USAGE on the schema
$node->safe_psql('postgres', 'REVOKE USAGE ON SCHEMA lockfence FROM PUBLIC');
($rc, $out, $err) = run_as('intruder', 'INSERT INTO jobs2 VALUES (2, 6)');
is($rc, 0, '... also without USAGE on schema lockfence') or diag $err;
$node->safe_psql('postgres', 'GRANT USAGE ON SCHEMA lockfence TO PUBLIC');

# The documented statement: one call.
$node->safe_psql('postgres', "SELECT lockfence.grant_usage('app')");
is( $node->safe_psql('postgres', q{
SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY p.oid::regprocedure::text)
  FROM pg_proc p
 WHERE p.pronamespace = 'lockfence'::regnamespace
   AND has_function_privilege('app', p.oid, 'EXECUTE')
   AND NOT has_function_privilege('intruder', p.oid, 'EXECUTE')}),
	'lockfence.fence(text,bigint,text), lockfence.fence(text[],bigint,text), '
	  . 'lockfence.lease_acquire(text,interval,text,interval), '
	  . 'lockfence.lease_release(text,bigint), lockfence.lease_renew(text,bigint,interval), '
	  . 'lockfence.lease_try_acquire(text,interval,text), '
	  . 'lockfence.try_fence(text,bigint,text), lockfence.try_fence(text[],bigint,text)',
	'grant_usage(app) grants exactly the fence and lease functions');

# The README's examples, as app: a lease, fenced work, renew, release.
($rc, $out, $err) = run_as('app', q{
\set ON_ERROR_STOP on
SELECT token AS epoch FROM lockfence.lease_acquire('leader/orders', '15 s', holder => 'me') \gset
BEGIN;
SELECT lockfence.fence('leader/orders', :epoch, 'me') = :epoch;
COMMIT;
SELECT lockfence.lease_renew('leader/orders', :epoch) IS NOT NULL;
SELECT lockfence.lease_release('leader/orders', :epoch);
SELECT (lockfence.lease_try_acquire('leader/orders', '15 s', holder => 'me')).token > :epoch;
BEGIN;
SELECT lockfence.fence('jobs', 7000, 'w') > 0;
INSERT INTO jobs VALUES (2, NULL);
COMMIT;
SELECT lockfence.try_fence('jobs', 7001, 'w');
SELECT lockfence.fence(ARRAY['a', 'b'], 5) = 5;
SELECT lockfence.try_fence(ARRAY['a', 'b'], 4);
});
is($rc, 0, 'with grant_usage(), the README\'s lease and fence examples work') or diag $err;
is($out, "t\nt\nt\nt\nt\nt\nt\nf", '... with the documented results');

# etcd => true adds the etcd lock functions.
$node->safe_psql('postgres', "SELECT lockfence.grant_usage('app', etcd => true)");
ok( $node->safe_psql('postgres',
		"SELECT has_function_privilege('app', 'lockfence.etcd_lock_and_fence(text, text, integer, interval, text)', 'EXECUTE')")
	  eq 't',
	'grant_usage(app, etcd => true) grants the etcd lock functions too');

# revoke_usage() takes it all back.
$node->safe_psql('postgres', "SELECT lockfence.revoke_usage('app')");
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM pg_proc p
 WHERE p.pronamespace = 'lockfence'::regnamespace
   AND has_function_privilege('app', p.oid, 'EXECUTE')
   AND NOT has_function_privilege('intruder', p.oid, 'EXECUTE')}),
	'0', 'revoke_usage(app) revokes what grant_usage() granted');
($rc, $out, $err) = run_as('app', "SELECT lockfence.fence('jobs', 8000)");
like($err, qr/42501/, '... and fence() is refused again');

$rc = $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT lockfence.grant_usage(NULL)",
	stderr => \$err);
like($err, qr/22004/, 'grant_usage(NULL) is refused with 22004');

$node->stop;
done_testing();
