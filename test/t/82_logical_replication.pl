# Copyright: lockfence contributors
#
# 82_logical_replication.pl: a real publisher and subscriber.
# - Publications that would publish lockfence.fences are refused (FOR ALL
#   TABLES, FOR TABLES IN SCHEMA lockfence, the table by name), unless
#   lockfence.allow_publish_fences is on; so is CREATE EXTENSION while a
#   FOR ALL TABLES publication exists.
# - The supported topology: application tables published by name; the
#   subscriber's fences stay its own (a local fence at 500 is not moved
#   back by the publisher's 14); protected tables on the subscriber are
#   written by apply without firing their (ENABLE ORIGIN) triggers.
# - ENABLE ALWAYS on a subscriber's lockfence trigger stalls apply with a
#   lockfence error, and check() warns about it.
# - (1.8) lockfence.floor_state written by apply reaches the subscriber's
#   connected sessions; (1.11) check() there reports the subscription
#   (fences_subscribed).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use LockfenceTest::Node qw(init_node);

my $pub = PostgreSQL::Test::Cluster->new('lr_pub');
init_node($pub, allows_streaming => 'logical');
$pub->append_conf('postgresql.conf', "log_min_messages = warning\n");
$pub->start;
my $sub = PostgreSQL::Test::Cluster->new('lr_sub');
init_node($sub);
$sub->append_conf('postgresql.conf', qq{
log_min_messages = warning
wal_retrieve_retry_interval = '200ms'
});
$sub->start;

my $schema = q{
CREATE EXTENSION lockfence;
CREATE TABLE jobs (id int PRIMARY KEY, token bigint);
SELECT lockfence.protect('jobs', resource => 'jobs', token_column => 'token');
};
# A FOR ALL TABLES publication made before CREATE EXTENSION would publish
# lockfence.fences from then on: CREATE EXTENSION is refused (issue 23,
# item 7), unless lockfence.allow_publish_fences is on.
$pub->safe_psql('postgres', 'CREATE DATABASE early');
$pub->safe_psql('early', 'CREATE PUBLICATION early_all FOR ALL TABLES');
my ($early_rc, $early_out, $early_err) = $pub->psql('early',
	"\\set VERBOSITY verbose\nCREATE EXTENSION lockfence");
like($early_err, qr/0A000: publication "early_all" would publish lockfence\.fences/,
	'CREATE EXTENSION with a FOR ALL TABLES publication already there is refused');
is($pub->safe_psql('early', "SELECT count(*) FROM pg_extension WHERE extname = 'lockfence'"),
	'0', '... and the extension is not created');
$pub->safe_psql('early', q{
SET lockfence.allow_publish_fences = on;
CREATE EXTENSION lockfence;
});
is($pub->safe_psql('early', 'SELECT finding FROM lockfence.check() WHERE severity = \'error\''),
	'fences_published', '... created with the override, check() reports the publication');
$pub->safe_psql('postgres', 'DROP DATABASE early');

$pub->safe_psql('postgres', $schema);
$sub->safe_psql('postgres', $schema);

sub try_sql
{
	my ($n, $sql) = @_;
	my ($out, $err);
	my $rc = $n->psql('postgres', "\\set VERBOSITY verbose\n" . $sql,
		stdout => \$out, stderr => \$err);
	return ($rc, $err);
}

# Refusals on the publisher.
my ($rc, $err) = try_sql($pub, 'CREATE PUBLICATION allpub FOR ALL TABLES');
like($err, qr/0A000: publication "allpub" would publish lockfence\.fences/,
	'CREATE PUBLICATION ... FOR ALL TABLES is refused');
like($err, qr/HINT:.*by name or by schema.*lockfence\.allow_publish_fences = on/,
	'... with a hint naming the alternatives and the override');
($rc, $err) = try_sql($pub, 'CREATE PUBLICATION f FOR TABLE lockfence.fences');
like($err, qr/would publish lockfence\.fences/, 'FOR TABLE lockfence.fences is refused');
($rc, $err) = try_sql($pub, 'CREATE PUBLICATION f FOR TABLES IN SCHEMA lockfence');
like($err, qr/would publish lockfence\.fences/, 'FOR TABLES IN SCHEMA lockfence is refused');
$pub->safe_psql('postgres', 'CREATE PUBLICATION app FOR TABLE jobs');
($rc, $err) = try_sql($pub, 'ALTER PUBLICATION app ADD TABLE lockfence.fences');
like($err, qr/would publish lockfence\.fences/, 'ALTER PUBLICATION ... ADD TABLE lockfence.fences is refused');
($rc, $err) = try_sql($pub, 'ALTER PUBLICATION app ADD TABLES IN SCHEMA lockfence');
like($err, qr/would publish lockfence\.fences/, 'ALTER PUBLICATION ... ADD TABLES IN SCHEMA lockfence is refused');
is($pub->safe_psql('postgres',
		"SELECT string_agg(tablename, ',') FROM pg_publication_tables WHERE pubname = 'app'"),
	'jobs', 'the application publication holds only the application table');
($rc, $err) = try_sql($pub, q{
SET lockfence.allow_publish_fences = on;
CREATE PUBLICATION allpub FOR ALL TABLES;
DROP PUBLICATION allpub;
});
is($rc, 0, 'the override lets FOR ALL TABLES through') or diag $err;

# The supported topology: the subscriber's fences are its own.
$sub->safe_psql('postgres', "SELECT lockfence.fence('jobs', 500)");
$pub->safe_psql('postgres', q{
BEGIN; SELECT lockfence.fence('jobs', 14); INSERT INTO jobs VALUES (1, 14); COMMIT;
});
my $connstr = $pub->connstr . ' dbname=postgres';
$sub->safe_psql('postgres',
	"CREATE SUBSCRIPTION s CONNECTION '$connstr' PUBLICATION app");
$sub->wait_for_subscription_sync($pub, 's');
$pub->safe_psql('postgres', q{
BEGIN; SELECT lockfence.fence('jobs', 15); INSERT INTO jobs VALUES (2, 15); COMMIT;
});
$pub->wait_for_catchup('s');
is($sub->safe_psql('postgres', 'SELECT string_agg(id::text, \',\' ORDER BY id) FROM jobs'),
	'1,2', 'protected rows arrive on the subscriber (copy and apply)');
is($sub->safe_psql('postgres', "SELECT lockfence.current_token('jobs')"),
	'500', "the subscriber's fence is not moved back by the publisher's");
($rc, $err) = try_sql($sub, "SELECT lockfence.fence('jobs', 100)");
like($err, qr/LF001/, 'a token below the subscriber\'s own fence is still rejected there');
($rc, $err) = try_sql($sub, 'INSERT INTO jobs VALUES (9, NULL)');
like($err, qr/LF002/, 'local writes on the subscriber are fenced as usual');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM lockfence.check() WHERE severity = \'error\''),
	'0', 'check() on the subscriber: no error');

# ENABLE ALWAYS on the subscriber: apply runs the fence and stalls.
$sub->safe_psql('postgres', 'ALTER TABLE jobs ENABLE ALWAYS TRIGGER zz_lockfence_fence');
like($sub->safe_psql('postgres', 'SELECT finding FROM lockfence.check()'),
	qr/trigger_enabled_always/, 'check() warns about ENABLE ALWAYS');
my $log_offset = -s $sub->logfile;
$pub->safe_psql('postgres', q{
BEGIN; SELECT lockfence.fence('jobs', 16); INSERT INTO jobs VALUES (3, 16); COMMIT;
});
my $deadline = time + 60;
my $stalled = 0;
while (time < $deadline)
{
	my $log = slurp_file($sub->logfile, $log_offset);
	if ($log =~ /(LF00\d|stale|fencing token)/i) { $stalled = 1; last; }
	usleep(200_000);
}
ok($stalled, 'with ENABLE ALWAYS, apply stops on a lockfence error');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM jobs WHERE id = 3'),
	'0', '... and the row is not applied');
$sub->safe_psql('postgres', 'ALTER TABLE jobs ENABLE TRIGGER zz_lockfence_fence');
$pub->wait_for_catchup('s');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM jobs WHERE id = 3'),
	'1', 'back to ENABLE: apply resumes');

$sub->safe_psql('postgres', 'DROP SUBSCRIPTION s');

# (1.8) lockfence.floor_state written by apply reaches the subscriber's
# connected sessions: apply fires row triggers, not statement triggers.
# Two databases of one cluster (so both record the same server), the
# table published with REPLICA IDENTITY FULL and its rows made equal (the
# database too, which 1.10 records: a row naming another database is a
# copy, refused; none is judged by the server alone).
$pub->safe_psql('postgres', 'CREATE DATABASE fpub');
$pub->safe_psql('postgres', 'CREATE DATABASE fsub');
for my $db ('fpub', 'fsub')
{
	$pub->safe_psql($db, q{
CREATE EXTENSION lockfence;
ALTER TABLE lockfence.floor_state REPLICA IDENTITY FULL;
UPDATE lockfence.floor_state SET recorded_at = '2026-01-01 00:00:00+00', database_oid = NULL;
});
}
$pub->safe_psql('fpub', q{
CREATE PUBLICATION floors FOR TABLE lockfence.floor_state;
SELECT pg_create_logical_replication_slot('floors', 'pgoutput');
});
(my $fpub_connstr = $pub->connstr('fpub')) =~ s/'/''/g;
$pub->safe_psql('fsub', "CREATE SUBSCRIPTION floors CONNECTION '$fpub_connstr' PUBLICATION floors"
	  . " WITH (create_slot = false, slot_name = 'floors', copy_data = false)");
my $writer = $pub->background_psql('fsub', on_error_stop => 0);
$writer->query_safe(q{SELECT lockfence.fence('lr-r', 5)});
$pub->safe_psql('fpub', 'UPDATE lockfence.floor_state SET floor = 1000');
$pub->wait_for_catchup('floors');
is($pub->safe_psql('fsub', 'SELECT floor FROM lockfence.floor_state'),
	'1000', 'floor_state: the floor raised on the publisher is applied');
my $verdict = $writer->query(q{
DO $$ BEGIN
	PERFORM lockfence.fence('lr-new', 3);
	RAISE NOTICE 'lr-new 3: accepted';
EXCEPTION WHEN OTHERS THEN
	RAISE NOTICE 'lr-new 3: refused, %', SQLSTATE;
END $$;
SELECT 'done';});
like($writer->{stderr}, qr/lr-new 3: refused, LF001/,
	'... and a session connected before judges by it: a new name under it is stale');
$writer->quit;
# (1.11) check() on the subscriber names the subscription that writes
# lockfence's tables (here the floor; lockfence.fences alike), and nothing
# once it is gone.
like($pub->safe_psql('fsub',
		"SELECT severity || ' ' || finding || ': ' || detail FROM lockfence.check() WHERE finding = 'fences_subscribed'"),
	qr/^error fences_subscribed: Subscription floors replicates into lockfence\.floor_state/,
	'check() on the subscriber reports the subscription of floor_state');
$pub->safe_psql('fsub', 'DROP SUBSCRIPTION floors');
is($pub->safe_psql('fsub',
		"SELECT count(*) FROM lockfence.check() WHERE finding = 'fences_subscribed'"),
	'0', '... and nothing once it is dropped');

$sub->stop;
$pub->stop;
done_testing();
