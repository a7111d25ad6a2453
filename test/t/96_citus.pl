# Copyright: lockfence contributors
#
# 96_citus.pl: lockfence on a Citus cluster (issue 22): fences live with
# the rows they protect.
#
# A coordinator and two workers on 127.0.0.1, each preloading citus and
# lockfence, metadata synced.  Shown here (docs/citus.md):
#   1. CREATE EXTENSION lockfence on the coordinator creates it on every
#      node, and lockfence.check() on the coordinator reports every node.
#   2. After lockfence.citus_distribute(), lockfence.fences is distributed
#      by resource, the fence and lease functions are delegated to the
#      node holding the resource's shard, and a protected table
#      distributed by its resource column, co-located with the fences, is
#      checked on that node in the same transaction: the issue's sequence
#      (fence 5 and write 5, fence 7 as a new holder, write 6 through the
#      coordinator) is refused with LF001, and so is every stale or
#      tokenless write, through the coordinator, through a worker and
#      straight into a shard ((1.13) TRUNCATE of a shard too).  What
#      lockfence cannot check where the rows
#      are is refused with 0A000: reference tables, Citus local tables,
#      tables not distributed by the resource column or not co-located
#      with the fences, a fence whose shard is on another node (a call
#      Citus did not delegate, an array spanning nodes).
#   One round trip (docs/citus.md): the page's recipe, fence() and the
#      UPDATE in one function delegated by its resource, run as it
#      stands; the coordinator sends the call as one command to the
#      node of the resource's shards; a stale token (also after a new
#      holder's fence, inside BEGIN ... COMMIT, through the other worker)
#      is refused with LF001, a delegated write without fence() with
#      LF002, a call Citus does not delegate with 0A000.
#   3. citus_move_shard_placement and rebalance_table_shards move the
#      fences with their rows: the stale token is refused on the new node,
#      the current one accepted, and the old node refuses to fence.
#   4. (1.12) raise_floor() without resources, on the coordinator or a
#      worker, records the floor on every node, so a resource without a
#      fence row stays below it when its shard moves; check() on the
#      coordinator reports a node whose floor is below another's; (1.13)
#      a disabled node records it too, and check() names it.
# Plain local tables on Citus nodes work as before (until the fences are
# distributed).
#
# Skipped, with the reason, when Citus is not installed in the PostgreSQL
# under test (scripts/citus.sh build && scripts/citus.sh install PG_CONFIG).

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use LockfenceTest::Citus;

my $why = LockfenceTest::Citus::unavailable();
plan skip_all => $why if $why;

my ($coord, $w1, $w2) = LockfenceTest::Citus::start_cluster('citus', 2);
my @all = ($coord, $w1, $w2);

sub sql { return LockfenceTest::Citus::sql(@_); }

# A statement must fail with SQLSTATE state and a message matching re.
sub refused
{
	my ($node, $sql, $state, $re, $name) = @_;
	my ($ok, $out, $err) = sql($node, $sql);
	my ($got) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	$got //= '';
	ok(!$ok && $got eq $state && $err =~ $re, $name)
	  or diag("expected $state matching $re; ok=$ok, state '$got', out '$out', stderr:\n$err");
	return;
}

sub succeeds
{
	my ($node, $sql, $name) = @_;
	my ($ok, $out, $err) = sql($node, $sql);
	ok($ok, $name) or diag("stderr:\n$err");
	return $out;
}

sub q1 { my ($node, $sql) = @_; return $node->safe_psql('postgres', $sql); }

# Drop what earlier moves left for Citus' deferred cleanup (the old
# placements), and wait until nothing is left.  A move first drops such a
# leftover on its target with a lock_timeout of 1 s, racing the
# maintenance daemon's own deferred drop of it; on a loaded machine it
# lost ("shard move failed as the orphaned shard ... leftover from the
# previous move could not be cleaned up", run b1s49).  Cleaned first, the
# move has nothing to drop.
sub cleanup_orphans
{
	for (1 .. 300)
	{
		$coord->psql('postgres', 'CALL citus_cleanup_orphaned_resources()');
		return 1 if q1($coord, 'SELECT count(*) FROM pg_dist_cleanup') eq '0';
		usleep(100_000);
	}
	return 0;
}

# The node (of @all) that holds shard id $shardid.
sub node_of_shard
{
	my ($shardid) = @_;
	my $port = q1($coord, "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $shardid");
	my ($n) = grep { $_->port == $port } @all;
	return $n;
}

sub shard_of
{
	my ($table, $value) = @_;
	return q1($coord, "SELECT get_shard_id_for_distribution_column('$table', '$value')");
}

# --- 1. CREATE EXTENSION on every node, check() reports every node ----------

succeeds($coord, 'CREATE EXTENSION lockfence', 'CREATE EXTENSION lockfence on the coordinator');
for my $w ($w1, $w2)
{
	is(q1($w, "SELECT count(*) FROM pg_extension WHERE extname = 'lockfence'"),
		'1', 'lockfence created on worker ' . $w->name);
}
my $nodes_checked = q1($coord, q{
SELECT string_agg(substring(detail from 'Citus node [^ ]+'), ',' ORDER BY detail)
  FROM lockfence.check() WHERE finding = 'citus_node'});
is($nodes_checked, join(',', map { 'Citus node 127.0.0.1:' . $_->port } sort { $a->port <=> $b->port } ($w1, $w2)),
	'lockfence.check() on the coordinator reports both workers');
is(q1($coord, "SELECT count(*) FROM lockfence.check() WHERE severity = 'error'"), '0',
	'and finds no error on any node');
# A worker's own finding reaches the coordinator's check(), named.
q1($w2, 'ALTER EVENT TRIGGER lockfence_check_new_triggers DISABLE');
is(q1($coord, q{SELECT severity || ' ' || finding || ' ' || substring(detail from '^Citus node [^ ]+ ')
  FROM lockfence.check() WHERE finding <> 'citus_node'}),
	'warning event_trigger_disabled Citus node 127.0.0.1:' . $w2->port . ': ',
	"a disabled event trigger on one worker is reported by check() on the coordinator, with that worker named");
q1($w2, 'ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE');

my $table = 'CREATE TABLE %s (tenant text NOT NULL, id int, qty int, token bigint, holder text)';
my $protect =
  "SELECT lockfence.protect('%s', resource_column => 'tenant', token_column => 'token', holder_column => 'holder')";

# --- plain local tables on Citus nodes, before the fences are distributed ---

for my $n ($coord, $w1)
{
	my $nm = $n->name;
	succeeds($n, ['SET citus.enable_ddl_propagation = off', sprintf($table, 'ledger')],
		"a local table ledger on $nm");
	succeeds($n, sprintf($protect, 'ledger'), "protect() on the local table on $nm");
	succeeds($n, q{
BEGIN;
SELECT lockfence.fence('ledger-1', 10, 'a');
INSERT INTO ledger VALUES ('ledger-1', 1, 1, 10, 'a');
COMMIT}, "a fenced write to the local table on $nm");
	succeeds($n, q{SELECT lockfence.fence('ledger-1', 11, 'b')}, "fence 11 on $nm");
	refused($n, q{INSERT INTO ledger VALUES ('ledger-1', 2, 1, 10, 'a')},
		'LF001', qr/stale/i, "the stale token 10 on the local table on $nm is refused with LF001");
	refused($n, q{INSERT INTO ledger (tenant, id) VALUES ('ledger-1', 3)},
		'LF002', qr/./, "a tokenless write on $nm is refused with LF002");
	succeeds($n, q{INSERT INTO ledger VALUES ('ledger-1', 4, 1, 12, 'b')},
		"a newer token on $nm is accepted");
	is(q1($n, 'SELECT string_agg(id::text, \',\' ORDER BY id) FROM ledger'),
		'1,4', "the local table on $nm holds exactly the accepted rows");
}

# --- refusals before the fences are distributed ---------------------------

succeeds($coord, sprintf($table, 'orders'), 'orders created');
succeeds($coord, "SELECT create_distributed_table('orders', 'tenant')",
	'orders distributed by tenant');
refused($coord, sprintf($protect, 'orders'),
	'0A000', qr/lockfence cannot protect Citus table "orders".*lockfence\.fences is not distributed.*HINT:.*lockfence\.citus_distribute\(\)/s,
	'protect() on a distributed table before lockfence.citus_distribute() is refused');

# A fence trigger put on the shards by hand (event triggers disabled):
# every write to it is refused while the fences are not distributed.
for my $n (@all)
{
	q1($n, 'ALTER EVENT TRIGGER lockfence_check_new_triggers DISABLE');
}
succeeds($coord, ['SET citus.enable_unsafe_triggers = on', q{
CREATE TRIGGER zz_lockfence_fence BEFORE INSERT OR UPDATE OR DELETE ON orders
  FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger(
    'resource_column=tenant', 'token_column=token', 'holder_column=holder')}],
	'a fence trigger created by hand on the distributed table (event triggers disabled)');
for my $n (@all)
{
	q1($n, 'ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE');
}
is(q1($coord, q{
SELECT sum(result::int) FROM run_command_on_shards('orders',
  $$SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass AND tgname LIKE 'zz_lockfence_fence%%'$$)}),
	'4', 'Citus copied the trigger to all 4 shards');
refused($coord, q{
BEGIN;
SELECT lockfence.fence('acme', 1, 'w');
INSERT INTO orders VALUES ('acme', 1, 1, 1, 'w');
COMMIT},
	'0A000', qr/lockfence cannot protect shard "orders_\d+" of Citus table "orders".*lockfence\.fences is not distributed/s,
	'before citus_distribute(), a write through a hand-made trigger is refused on the shard');
is(q1($coord, "SELECT lockfence.unprotect('orders')"), '1', 'unprotect() drops the hand-made trigger (and its copies on the shards)');

# --- 2. lockfence.citus_distribute() ------------------------------------------

# Citus' deadlock detector once cancelled create_distributed_table of the
# fences (40P01); a setup step, so it is retried on that SQLSTATE only.
my ($dok, $dout, $derr, $dstate);
for my $attempt (1 .. 3)
{
	($dok, $dout, $derr, $dstate) = sql($coord, 'SELECT lockfence.citus_distribute()');
	last unless !$dok && $dstate eq '40P01';
	note("lockfence.citus_distribute() attempt $attempt: $derr");
}
ok($dok, 'lockfence.citus_distribute() on the coordinator') or diag("stderr:\n$derr");
is(q1($coord, q{SELECT partmethod::text || ':' || (colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass))
  FROM pg_dist_partition WHERE logicalrelid = 'lockfence.fences'::regclass}),
	'h:true', 'lockfence.fences is hash-distributed, co-located with orders (same type and shard count)');
is(q1($coord, q{SELECT count(*) FROM pg_dist_object WHERE classid = 'pg_proc'::regclass AND force_delegation
  AND objid IN ('lockfence.fence(text,bigint,text)'::regprocedure, 'lockfence.try_fence(text,bigint,text)'::regprocedure,
                'lockfence.lease_acquire(text,interval,text,interval)'::regprocedure, 'lockfence.lease_release(text,bigint)'::regprocedure)}),
	'4', 'fence(), try_fence() and the lease functions are delegated (force_delegation)');

succeeds($coord, sprintf($protect, 'orders'), 'protect() on orders, distributed by its resource column');
is(q1($coord, q{SELECT sum(result::int) FROM run_command_on_shards('orders',
  $$SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass AND tgname LIKE 'zz_lockfence_fence%%' AND (tgtype::int & 1) = 1$$)}),
	'4', 'the row trigger is on all 4 shards');
is(q1($coord, "SELECT count(*) FROM lockfence.check() WHERE severity = 'error'"), '0',
	'lockfence.check() finds no error on any node after protect()');

# Refused: tables whose rows are not beside their fences.
succeeds($coord, sprintf($table, 'plans'), 'plans created');
succeeds($coord, "SELECT create_reference_table('plans')", 'plans made a reference table');
refused($coord, sprintf($protect, 'plans'),
	'0A000', qr/lockfence cannot protect Citus table "plans".*reference table or a Citus local table/s,
	'protect() on a reference table is refused');
succeeds($coord, sprintf($table, 'notes'), 'notes created');
succeeds($coord, "SELECT citus_add_local_table_to_metadata('notes')", 'notes added to the Citus metadata');
refused($coord, sprintf($protect, 'notes'),
	'0A000', qr/lockfence cannot protect Citus table "notes".*reference table or a Citus local table/s,
	'protect() on a Citus-managed local table is refused');
succeeds($coord, sprintf($table, 'byid'), 'byid created');
succeeds($coord, "SELECT create_distributed_table('byid', 'holder', colocate_with => 'lockfence.fences')",
	'byid distributed by another column than the resource');
refused($coord, sprintf($protect, 'byid'),
	'0A000', qr/lockfence cannot protect Citus table "byid".*resource must be its distribution column/s,
	'protect() on a table not distributed by the resource column is refused');
succeeds($coord, sprintf($table, 'pfx'), 'pfx created');
succeeds($coord, "SELECT create_distributed_table('pfx', 'tenant', colocate_with => 'lockfence.fences')", 'pfx distributed by tenant');
refused($coord, "SELECT lockfence.protect('pfx', resource_column => 'tenant', resource_prefix => 'p:', token_column => 'token')",
	'0A000', qr/lockfence cannot protect Citus table "pfx".*without resource_prefix/s,
	'protect() with resource_prefix on a distributed table is refused');
refused($coord, "SELECT lockfence.protect('pfx', resource => 'one', token_column => 'token')",
	'0A000', qr/lockfence cannot protect Citus table "pfx".*resource must be its distribution column/s,
	'protect() with a fixed resource on a distributed table is refused');
# (1.13) A partitioned distributed table: Citus attaches its partitions'
# shards anew when it moves them, which lockfence refuses (a review: moves
# failed; before, protect() failed inside Citus with XX000).
succeeds($coord, q{CREATE TABLE parted (tenant text, id int, token bigint) PARTITION BY RANGE (id)},
	'parted created');
succeeds($coord, q{CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)}, 'with a partition');
succeeds($coord, "SELECT create_distributed_table('parted', 'tenant', colocate_with => 'lockfence.fences')",
	'parted distributed by tenant, co-located');
refused($coord, "SELECT lockfence.protect('parted', resource_column => 'tenant', token_column => 'token')",
	'0A000', qr/lockfence cannot protect partitioned Citus table "public\.parted"/,
	'protect() on a partitioned distributed table is refused (0A000)');
refused($coord, "SELECT lockfence.protect('parted_1', resource_column => 'tenant', token_column => 'token')",
	'0A000', qr/lockfence cannot protect partitioned Citus table "public\.parted_1"/,
	'... and on one of its partitions');
# (without a replica identity it would stop the logical rebalance below)
succeeds($coord, 'DROP TABLE parted', 'parted dropped');
succeeds($coord, sprintf($table, 'apart'), 'apart created');
succeeds($coord, "SELECT create_distributed_table('apart', 'tenant', shard_count => 8)",
	'apart distributed by tenant in 8 shards (another co-location group)');
refused($coord, sprintf($protect, 'apart'),
	'0A000', qr/lockfence cannot protect Citus table "apart".*not co-located with lockfence\.fences/s,
	'protect() on a table not co-located with the fences is refused');

# --- the issue's sequence ------------------------------------------------

my $acme_fshard = shard_of('lockfence.fences', 'acme');
my $acme_oshard = shard_of('orders', 'acme');
my $acme_node = node_of_shard($acme_oshard);
my ($acme_other) = grep { $_ != $acme_node } ($w1, $w2);
is(node_of_shard($acme_fshard)->name, $acme_node->name,
	"acme's fence shard and its orders shard are on the same node (" . $acme_node->name . ')');

succeeds($coord, q{
BEGIN;
SELECT lockfence.fence('acme', 5, 'w');
INSERT INTO orders VALUES ('acme', 1, 1, 5, 'w');
COMMIT}, 'BEGIN; fence acme 5; INSERT token 5; COMMIT through the coordinator is accepted');
is(q1($acme_node, "SELECT token || ':' || holder FROM lockfence.fences_$acme_fshard WHERE resource = 'acme'"),
	'5:w', "the fence is in acme's fence shard on " . $acme_node->name);
is(q1($coord, "SELECT token FROM lockfence.fences WHERE resource = 'acme'"), '5',
	'and Citus finds it there by its hash (lockfence hashes as Citus does)');
is(q1($coord, "SELECT count(*) FROM lockfence.fences WHERE resource = 'acme'"), '1', 'one fence row for acme');
succeeds($coord, q{SELECT lockfence.fence('acme', 7, 'new-holder')},
	'fence 7 for a new holder on the coordinator');
my $stale_re = qr/stale fencing token for resource "acme".*Token 6 was presented, but token 7 has already been accepted/s;
refused($coord, q{INSERT INTO orders VALUES ('acme', 4, 1, 6, 'old-holder')},
	'LF001', $stale_re, 'the stale token 6 through the coordinator, after fence 7, is REFUSED');
refused($coord, q{
BEGIN;
SELECT lockfence.fence('acme', 6, 'old-holder');
INSERT INTO orders VALUES ('acme', 4, 1, 6, 'old-holder');
COMMIT}, 'LF001', $stale_re, 'fence(acme, 6) by the old holder is refused too');
refused($coord, q{INSERT INTO orders (tenant, id) VALUES ('acme', 5)},
	'LF002', qr/carries no fencing token/, 'a tokenless write through the coordinator is refused (LF002)');
refused($coord, q{INSERT INTO orders VALUES ('acme', 6, 1, 7, 'new-holder')},
	'LF002', qr/equals the current fence of resource "acme" and was not fenced in this transaction/,
	'the current token without fence() in the transaction is refused (LF002), as on one server');

# Through a worker with metadata (the row's shard on either node).
for my $n ($w1, $w2)
{
	my $nm = $n->name;
	refused($n, q{INSERT INTO orders VALUES ('acme', 4, 1, 6, 'old-holder')},
		'LF001', $stale_re, "the stale token 6 through $nm is refused");
	refused($n, q{INSERT INTO orders (tenant, id) VALUES ('acme', 5)},
		'LF002', qr/carries no fencing token/, "a tokenless write through $nm is refused");
}
# Straight into the shard, on the node that holds it.
refused($acme_node, "INSERT INTO orders_$acme_oshard VALUES ('acme', 4, 1, 6, 'old-holder')",
	'LF001', $stale_re, 'the stale token 6 straight into the shard is refused');
refused($acme_node, "INSERT INTO orders_$acme_oshard (tenant, id) VALUES ('acme', 5)",
	'LF002', qr/carries no fencing token/, 'a tokenless write straight into the shard is refused');
refused($acme_node, "UPDATE orders_$acme_oshard SET qty = 9, token = 6",
	'LF001', $stale_re, 'a stale UPDATE straight into the shard is refused');
# (1.13) Citus copies no TRUNCATE trigger to the shards, and lets a session
# that sets citus.enable_manual_changes_to_shards (any role may) truncate
# one: lockfence's utility hook refuses it, and the rows stay (a review).
refused($acme_node,
	[ 'SET citus.enable_manual_changes_to_shards = on', "TRUNCATE orders_$acme_oshard" ],
	'0A000', qr/cannot truncate shard "orders_\Q$acme_oshard\E" of protected table "orders"/,
	'TRUNCATE of the shard with citus.enable_manual_changes_to_shards on is refused (0A000)');
# Whatever the settings: Citus lets what it takes for its own backends (by
# application_name, which any role may set) truncate a shard; and the
# check runs before the TRUNCATE, since a TRUNCATE trigger of another table
# it names runs user code that can change the setting or the search path
# (a review: both emptied the shard).
refused($acme_node,
	[ q{SET application_name = 'citus_internal gpid=10000000001'}, "TRUNCATE orders_$acme_oshard" ],
	'0A000', qr/cannot truncate shard "orders_\Q$acme_oshard\E" of protected table "orders"/,
	'TRUNCATE of the shard under a Citus-internal application_name is refused (0A000)');
# (1.15) A role without TRUNCATE privilege on the shard gets PostgreSQL's
# own 42501, as on any table: the hook runs before TRUNCATE's privilege
# check, and told such a role 0A000 (the closing note of stop 52).
refused($acme_node,
	[
		'SET citus.enable_ddl_propagation = off',
		'CREATE ROLE lf_no_truncate',
		'SET ROLE lf_no_truncate',
		'SET citus.enable_manual_changes_to_shards = on',
		"TRUNCATE orders_$acme_oshard"
	],
	'42501', qr/permission denied for table orders_\Q$acme_oshard\E/,
	'TRUNCATE of the shard by a role without the privilege is refused by PostgreSQL (42501)');
refused($acme_node,
	[
		'SET citus.enable_ddl_propagation = off',
		"GRANT TRUNCATE ON orders_$acme_oshard TO lf_no_truncate",
		'SET ROLE lf_no_truncate',
		'SET citus.enable_manual_changes_to_shards = on',
		"TRUNCATE orders_$acme_oshard"
	],
	'0A000', qr/cannot truncate shard "orders_\Q$acme_oshard\E" of protected table "orders"/,
	'... and once granted the privilege, by lockfence (0A000)');
succeeds($acme_node,
	[
		'SET citus.enable_ddl_propagation = off',
		"REVOKE TRUNCATE ON orders_$acme_oshard FROM lf_no_truncate",
		'DROP ROLE lf_no_truncate'
	],
	'the role dropped');
refused($acme_node,
	[
		'SET citus.enable_ddl_propagation = off',
		'CREATE TEMP TABLE decoy (x int)',
		q{CREATE FUNCTION pg_temp.manual_off() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM set_config('citus.enable_manual_changes_to_shards', 'off', false); RETURN NULL; END$$},
		'CREATE TRIGGER decoy_off BEFORE TRUNCATE ON pg_temp.decoy EXECUTE FUNCTION pg_temp.manual_off()',
		'SET citus.enable_manual_changes_to_shards = on',
		"TRUNCATE pg_temp.decoy, orders_$acme_oshard"
	],
	'0A000', qr/cannot truncate shard "orders_\Q$acme_oshard\E" of protected table "orders"/,
	'TRUNCATE of the shard beside a table whose TRUNCATE trigger turns the setting off is refused (0A000)');
# And what TRUNCATE empties, not a name looked up beforehand: a TRUNCATE
# that resolves a decoy of the shard's name, waits for its lock, and finds
# the shard once the decoy is renamed (a review: a check by name passed it).
succeeds($acme_node, [ 'SET citus.enable_ddl_propagation = off', 'CREATE SCHEMA decoy',
		"CREATE TABLE decoy.orders_$acme_oshard (x int)" ], 'a decoy of the shard\'s name in another schema');
my $decoy_holder = $acme_node->background_psql('postgres', on_error_stop => 0);
$decoy_holder->query_safe("BEGIN; LOCK decoy.orders_$acme_oshard IN ACCESS EXCLUSIVE MODE");
my $truncater = $acme_node->background_psql('postgres', on_error_stop => 0);
$truncater->query_until(qr/truncating/,
	"SET search_path = decoy, public;\n\\echo truncating\nTRUNCATE orders_$acme_oshard;\n");
ok($acme_node->poll_query_until('postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'TRUNCATE orders_%'}),
	'the TRUNCATE waits for the decoy\'s lock');
$decoy_holder->query_safe("ALTER TABLE decoy.orders_$acme_oshard RENAME TO gone; COMMIT");
$truncater->{stderr} = '';
$truncater->query('SELECT 1');
like($truncater->{stderr}, qr/ERROR:  cannot truncate shard "orders_\Q$acme_oshard\E" of protected table "orders"/,
	'once the decoy is renamed, the TRUNCATE finds the shard and is refused');
$_->quit for ($decoy_holder, $truncater);
succeeds($acme_node, [ 'SET citus.enable_ddl_propagation = off', 'DROP SCHEMA decoy CASCADE' ], 'the decoy dropped');
refused($coord, q{DELETE FROM orders WHERE tenant = 'acme'},
	'LF002', qr/carries no fencing token/, 'an unfenced DELETE through the coordinator is refused');
refused($coord, q{UPDATE orders SET qty = 9},
	'LF002', qr/carries no fencing token/, 'an unfenced multi-shard UPDATE through the coordinator is refused');
is(q1($coord, "SELECT string_agg(id || ':' || token, ',' ORDER BY id) FROM orders"), '1:5',
	'orders holds exactly the accepted row');

# The current holder writes, through the coordinator and on the node.
succeeds($coord, q{
BEGIN;
SELECT lockfence.fence('acme', 7, 'new-holder');
INSERT INTO orders VALUES ('acme', 2, 1, 7, 'new-holder');
UPDATE orders SET qty = 2 WHERE tenant = 'acme' AND id = 1;
COMMIT}, 'the current holder (token 7) writes through the coordinator');
succeeds($acme_node, qq{
BEGIN;
SELECT lockfence.fence('acme', 7, 'new-holder');
INSERT INTO orders_$acme_oshard VALUES ('acme', 3, 1, 7, 'new-holder');
COMMIT}, 'and straight into the shard on ' . $acme_node->name);
succeeds($acme_other, q{SELECT lockfence.fence('acme', 8, 'third')},
	'fence() called on the other worker reaches acme\'s node (delegated)');
is(q1($acme_node, "SELECT token FROM lockfence.fences_$acme_fshard WHERE resource = 'acme'"), '8',
	'the fence advanced to 8 in the fence shard');
refused($acme_other, q{DO $$BEGIN PERFORM lockfence.fence('acme', 9, 'x'); END$$},
	'0A000', qr/the fence of resource "acme" is not on this node.*shard \Q$acme_fshard\E of lockfence\.fences/s,
	'a fence() Citus does not delegate (PL/pgSQL PERFORM) on a node without the shard is refused');
refused($coord, q{DO $$BEGIN PERFORM lockfence.fence('acme', 9, 'x'); END$$},
	'0A000', qr/the fence of resource "acme" is not on this node/,
	'and on the coordinator');

# The array forms: all their resources must be on the node that runs them.
my @names = map { "r$_" } 1 .. 40;
my ($same, $elsewhere);
for my $r (@names)
{
	my $nd = node_of_shard(shard_of('lockfence.fences', $r));
	$same //= $r if $nd == $acme_node && $r ne 'acme';
	$elsewhere //= $r if $nd != $acme_node;
}
refused($coord, "SELECT lockfence.fence(ARRAY['acme', '$elsewhere'], 20, 'arr')",
	'0A000', qr/is not on this node/, 'fence(text[]) on the coordinator is refused');
refused($acme_node, "SELECT lockfence.fence(ARRAY['acme', '$elsewhere'], 20, 'arr')",
	'0A000', qr/the fence of resource "\Q$elsewhere\E" is not on this node/,
	'fence(text[]) spanning two nodes is refused on either');
refused($acme_node, "SELECT lockfence.try_fence(ARRAY['acme', '$elsewhere'], 20, 'arr')",
	'0A000', qr/is not on this node/, 'try_fence(text[]) spanning two nodes is refused');
succeeds($acme_node, "SELECT lockfence.fence(ARRAY['acme', '$same'], 20, 'arr')",
	"fence(text[]) of resources whose shards are all on the node that runs it is accepted");
is(q1($coord, "SELECT string_agg(resource || ':' || token, ',' ORDER BY resource) FROM lockfence.fences WHERE resource IN ('acme', '$same')"),
	"acme:20,$same:20", 'both fences advanced, each in its own shard');

# Leases through the coordinator, delegated.
is(q1($coord, q{SELECT token FROM lockfence.lease_acquire('lease-1', '1 minute', 'h')}), '1',
	'lease_acquire() through the coordinator');
like(q1($coord, q{SELECT lockfence.lease_renew('lease-1', 1, '1 minute')}), qr/^\d{4}-/, 'lease_renew()');
is(q1($coord, q{SELECT lockfence.lease_release('lease-1', 1)}), 't', 'lease_release()');
is(q1($coord, q{SELECT token FROM lockfence.lease_try_acquire('lease-1', '1 minute', 'h2')}), '2',
	'lease_try_acquire() gives the next token');
is(q1($coord, q{SELECT lockfence.try_fence('lease-1', 1)}), 'f', 'try_fence() with an old token: false');
is(q1($coord, q{SELECT lockfence.current_token('acme')}), '20', 'current_token() through the coordinator');

# --- one round trip: fence and write in one delegated function -------------

# docs/citus.md's recipe, read from the page and run as it stands: the
# ```sql block after the "96_citus.pl runs this block" marker, one
# statement per command (Citus propagates a command's whole text).
sub doc_recipe
{
	my $page = abs_path(dirname(__FILE__) . '/../../docs/citus.md');
	open(my $fh, '<', $page) or die "cannot read $page: $!";
	my @lines = <$fh>;
	close $fh;
	my ($i) = grep { $lines[$_] =~ /96_citus\.pl runs this block/ } 0 .. $#lines;
	die "no recipe marker in $page" unless defined $i && $lines[ $i + 1 ] =~ /^```sql\s*$/;
	my (@stmts, $cur);
	my $dollar = 0;
	for my $l (@lines[ $i + 2 .. $#lines ])
	{
		last if $l =~ /^```\s*$/;
		$cur .= $l;
		my $n = () = $l =~ /\$\$/g;
		$dollar = ($dollar + $n) % 2;
		if (!$dollar && $l =~ /;\s*$/)
		{
			push @stmts, $cur;
			$cur = undef;
		}
	}
	die "a statement of the recipe does not end" if defined $cur && $cur =~ /\S/;
	return \@stmts;
}

my $recipe = doc_recipe();
is(scalar @$recipe, 2, 'the recipe of docs/citus.md has two statements');
succeeds($coord, $recipe, "docs/citus.md's recipe: orders_set_qty() created and made a distributed function");
is(q1($coord, q{SELECT distribution_argument_index, force_delegation,
       colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'lockfence.fences'::regclass)
  FROM pg_dist_object WHERE objid = 'orders_set_qty(text,int,int,bigint,text)'::regprocedure}),
	'0|t|t', 'orders_set_qty() is delegated by p_tenant with force_delegation, co-located with the fences');
# Its twin without the fence() call: what the trigger refuses inside a
# delegated call.
succeeds($coord, [q{
CREATE FUNCTION orders_set_qty_unfenced(p_tenant text, p_id int, p_qty int, p_token bigint, p_holder text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE orders SET qty = p_qty, token = p_token, holder = p_holder
     WHERE tenant = p_tenant AND id = p_id;
END $$},
	q{SELECT create_distributed_function('orders_set_qty_unfenced(text,int,int,bigint,text)', 'p_tenant',
                                   colocate_with => 'orders', force_delegation => true)}],
	'orders_set_qty_unfenced() (no fence() call) delegated the same way');

my $ini_node = node_of_shard(shard_of('orders', 'initech'));
my ($ini_other) = grep { $_ != $ini_node } ($w1, $w2);
succeeds($coord, q{
BEGIN;
SELECT lockfence.fence('initech', 3, 'a');
INSERT INTO orders VALUES ('initech', 1, 0, 3, 'a'), ('initech', 2, 0, 3, 'a');
COMMIT}, 'initech fenced at 3 by holder a, two rows (on ' . $ini_node->name . ')');

# One statement from the client, one from the coordinator to the worker.
my ($rok, $rout, $rerr) = sql($coord, ['SET citus.log_remote_commands = on',
	q{SELECT orders_set_qty('initech', 1, 5, 3, 'a')}]);
is($rout, '1', 'the current holder writes through the function: fenced and written in one call, '
	  . 'the token equal to the fence accepted because the same call fenced it') or diag("stderr:\n$rerr");
my @issued = $rerr =~ /issuing (.*)/g;
my @ports = $rerr =~ /on server \S*:(\d+)/g;
is(scalar @issued, 1, 'the coordinator sent that call as one command to the workers')
  or diag("stderr:\n$rerr");
like($issued[0] // '', qr/^SELECT .*orders_set_qty\('initech'/, 'the command is the call itself');
is($ports[0] // '', $ini_node->port, "sent to the node of initech's shards (" . $ini_node->name . ')')
  or diag("stderr:\n$rerr");

my $ini_stale = sub {
	my ($t, $cur) = @_;
	return qr/stale fencing token for resource "initech".*Token $t was presented, but token $cur has already been accepted/s;
};
refused($coord, q{SELECT orders_set_qty('initech', 1, 6, 2, 'a')},
	'LF001', $ini_stale->(2, 3), 'a stale token through the function is refused (LF001)');
succeeds($coord, q{SELECT lockfence.fence('initech', 4, 'b')}, 'fence 4 for a new holder b');
refused($coord, q{SELECT orders_set_qty('initech', 1, 7, 3, 'a')},
	'LF001', $ini_stale->(3, 4), "then the old holder's token 3 through the function is refused (LF001)");
refused($coord, q{
BEGIN;
SELECT orders_set_qty('initech', 2, 7, 3, 'a');
COMMIT}, 'LF001', $ini_stale->(3, 4), 'and inside BEGIN ... COMMIT too (force_delegation)');
succeeds($coord, q{
BEGIN;
SELECT orders_set_qty('initech', 2, 8, 4, 'b');
COMMIT}, 'the new holder writes through the function inside BEGIN ... COMMIT');
refused($ini_other, q{SELECT orders_set_qty('initech', 1, 7, 3, 'a')},
	'LF001', $ini_stale->(3, 4), 'the old holder through the function on the other worker is refused');
is(succeeds($ini_other, q{SELECT orders_set_qty('initech', 1, 9, 4, 'b')},
		'the new holder through the function on the other worker (delegated to ' . $ini_node->name . ')'),
	'1', 'and writes its row');
refused($coord, q{SELECT orders_set_qty('initech', 1, 10, NULL, 'b')},
	'22004', qr/fencing token must not be null/, 'a null token through the function is refused by fence() (22004)');
refused($coord, q{SELECT orders_set_qty_unfenced('initech', 1, 10, NULL, NULL)},
	'LF002', qr/carries no fencing token/, 'a tokenless write in a delegated function is refused (LF002)');
# Row 1 already holds token 4: the UPDATE gives it no token of its own.
refused($coord, q{SELECT orders_set_qty_unfenced('initech', 1, 10, 4, 'b')},
	'LF002', qr/carries no fencing token.*Resource "initech" was not fenced in this transaction, and the write does not give column "token" a token of its own/s,
	'the current token written by a delegated function that did not fence is refused (LF002)');
refused($coord, q{SELECT orders_set_qty_unfenced('initech', 1, 10, 3, 'a')},
	'LF001', $ini_stale->(3, 4), 'a stale token written by it is refused (LF001)');
refused($coord, q{DO $$BEGIN PERFORM orders_set_qty('initech', 1, 10, 4, 'b'); END$$},
	'0A000', qr/the fence of resource "initech" is not on this node/,
	'a call Citus does not delegate (PL/pgSQL PERFORM) runs on the coordinator, where its fence() is refused');
is(q1($coord, q{SELECT string_agg(id || ':' || qty || ':' || token || ':' || holder, ',' ORDER BY id)
  FROM orders WHERE tenant = 'initech'}),
	'1:9:4:b,2:8:4:b', 'initech\'s rows hold exactly the accepted writes');
is(q1($coord, q{SELECT lockfence.current_token('initech')}), '4', 'and its fence is at 4');

# --- 3. shard moves and rebalancing keep the fences with the rows --------

succeeds($coord, q{
BEGIN;
SELECT lockfence.fence('acme', 21, 'mover');
INSERT INTO orders VALUES ('acme', 10, 1, 21, 'mover');
COMMIT}, 'acme fenced at 21 with a row, before the move');
my $all_fences = q{SELECT string_agg(resource || ':' || token, ',' ORDER BY resource) FROM lockfence.fences};
my $fences_before = q1($coord, $all_fences);

# A backend keeps the map of the fence shards it read (src/citus_fences.c)
# until an invalidation: one session on each worker checks acme before the
# move and again after it, in the same backend.  PL/pgSQL's PERFORM is not
# delegated by Citus, so each check runs on the session's own node.
my %moved_session;
for my $n ($acme_node, $acme_other)
{
	my $s = $n->background_psql('postgres', on_error_stop => 0);
	$s->query_safe('\set VERBOSITY verbose');
	$moved_session{ $n->name } = $s;
}
my $session_fence = sub {
	my ($n, $token) = @_;
	my $s = $moved_session{ $n->name };
	$s->{stderr} = '';
	$s->query("DO \$\$BEGIN PERFORM lockfence.fence('acme', $token, 'mover'); END\$\$");
	my $err = $s->{stderr};
	$s->{stderr} = '';
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return $state // 'accepted';
};
is($session_fence->($acme_node, 21), 'accepted',
	'before the move, a session on ' . $acme_node->name . ' fences acme at 21 on its node');
is($session_fence->($acme_other, 21), '0A000',
	'and a session on ' . $acme_other->name . ' is refused: the fence is not on its node');
succeeds($coord, "SELECT citus_move_shard_placement($acme_oshard, '127.0.0.1', " . $acme_node->port
	  . ", '127.0.0.1', " . $acme_other->port . ", shard_transfer_mode => 'block_writes')",
	"acme's shard group moved from " . $acme_node->name . ' to ' . $acme_other->name);
is(node_of_shard($acme_fshard)->name, $acme_other->name, "acme's fence shard moved with its orders shard");
is(node_of_shard($acme_oshard)->name, $acme_other->name, "acme's orders shard is on " . $acme_other->name);
is(q1($coord, $all_fences),
	$fences_before, 'every fence is as before the move');
my $stale21 = qr/stale fencing token for resource "acme".*Token 20 was presented, but token 21 has already been accepted/s;
refused($coord, q{INSERT INTO orders VALUES ('acme', 11, 1, 20, 'old')},
	'LF001', $stale21, 'after the move, the stale token 20 through the coordinator is refused');
refused($acme_other, "INSERT INTO orders_$acme_oshard VALUES ('acme', 11, 1, 20, 'old')",
	'LF001', $stale21, 'and straight into the shard on its new node');
succeeds($coord, q{
BEGIN;
SELECT lockfence.fence('acme', 21, 'mover');
INSERT INTO orders VALUES ('acme', 12, 1, 21, 'mover');
COMMIT}, 'after the move, the current token 21 is accepted');
refused($acme_node, q{DO $$BEGIN PERFORM lockfence.fence('acme', 30, 'x'); END$$},
	'0A000', qr/the fence of resource "acme" is not on this node/,
	'the old node refuses to fence acme in its own transaction');
is($session_fence->($acme_node, 21), '0A000',
	'the session on the old node that fenced acme before the move now refuses it (its map was invalidated)');
is($session_fence->($acme_other, 20), 'LF001',
	'the session on the new node that was refused before the move now checks acme there: 20 is stale');
is($session_fence->($acme_other, 21), 'accepted', 'and 21 is accepted there');
$_->quit for values %moved_session;

# A transaction that fenced through the coordinator is still open when a
# move of its shard group starts: the move waits for it (lockfence holds
# Citus' metadata lock of the group to the end of the transaction, as
# Citus' own writes do), and the fence moves with the group.  Without the
# lock the move committed at once, the open transaction's fence went to
# the old node's copy, and a second holder was granted the same token.
ok(cleanup_orphans(), 'the first move\'s leftovers are cleaned up');
my $holder = $coord->background_psql('postgres', on_error_stop => 0);
$holder->query_safe(q{BEGIN});
$holder->query_safe(q{SELECT lockfence.fence('acme', 22, 'open')});
my $mover = $coord->background_psql('postgres', on_error_stop => 0);
$mover->query_until(qr/MOVE_SENT/,
	"\\echo MOVE_SENT\nSELECT citus_move_shard_placement($acme_oshard, '127.0.0.1', "
	  . $acme_other->port . ", '127.0.0.1', " . $acme_node->port
	  . ", shard_transfer_mode => 'block_writes');\n");
my $move_waits = 0;
for (1 .. 600)
{
	if (q1($acme_other, q{SELECT count(*) FROM pg_stat_activity
		  WHERE wait_event_type = 'Lock' AND query LIKE '%lock_shard\_metadata(7%'}) > 0)
	{
		$move_waits = 1;
		last;
	}
	last if node_of_shard($acme_fshard)->name eq $acme_node->name;
	usleep(100_000);
}
ok($move_waits, 'a move of the group waits for an open transaction that fenced acme in it');
is(node_of_shard($acme_fshard)->name, $acme_other->name, '... and has not moved it yet');
$holder->query_safe('COMMIT');
$mover->query('SELECT 1');    # waits for the move's result; its NOTICEs (Citus' cleanup of earlier moves) are no failure
is(node_of_shard($acme_fshard)->name, $acme_node->name, 'the move completes after the commit');
is(q1($coord, q{SELECT token || ' ' || holder FROM lockfence.fences WHERE resource = 'acme'}),
	'22 open', 'the open transaction\'s fence moved with the group');
refused($coord, q{SELECT lockfence.fence('acme', 22, 'second')},
	'LF001', qr/belongs to another holder/, 'a second holder is refused the same token');
$holder->quit;
$mover->quit;

# The same for a lease granted in a transaction still open: the move back
# waits for it, and the lease moves with the group, so no second holder
# is granted the same name.
ok(cleanup_orphans(), 'the second move\'s leftovers are cleaned up');
$holder = $coord->background_psql('postgres', on_error_stop => 0);
$holder->query_safe(q{BEGIN});
my $lease_token = $holder->query_safe(q{SELECT token FROM lockfence.lease_acquire('acme-lease', '10 min', 'open')});
chomp $lease_token;
my $lease_shard = shard_of('lockfence.fences', 'acme-lease');
my $lease_node = node_of_shard($lease_shard);
my ($lease_other) = grep { $_ != $lease_node } ($w1, $w2);
$mover = $coord->background_psql('postgres', on_error_stop => 0);
$mover->query_until(qr/MOVE_SENT/,
	"\\echo MOVE_SENT\nSELECT citus_move_shard_placement($lease_shard, '127.0.0.1', "
	  . $lease_node->port . ", '127.0.0.1', " . $lease_other->port
	  . ", shard_transfer_mode => 'block_writes');\n");
$move_waits = 0;
for (1 .. 600)
{
	if (q1($lease_node, q{SELECT count(*) FROM pg_stat_activity
		  WHERE wait_event_type = 'Lock' AND query LIKE '%lock_shard\_metadata(7%'}) > 0)
	{
		$move_waits = 1;
		last;
	}
	last if node_of_shard($lease_shard)->name eq $lease_other->name;
	usleep(100_000);
}
ok($move_waits, 'a move waits for an open transaction that was granted a lease in the group');
$holder->query_safe('COMMIT');
$mover->query('SELECT 1');    # waits for the move's result; its NOTICEs (Citus' cleanup of earlier moves) are no failure
is(node_of_shard($lease_shard)->name, $lease_other->name, 'the move completes after the commit');
is(q1($coord, q{SELECT token || ' ' || holder FROM lockfence.fences WHERE resource = 'acme-lease'}),
	"$lease_token open", 'the lease moved with the group');
is(q1($coord, q{SELECT token IS NULL FROM lockfence.lease_try_acquire('acme-lease', '10 min', 'second')}),
	't', 'a second holder is not granted the lease');
$holder->quit;
$mover->quit;

# Fence one resource per shard, then rebalance (the move left 3 groups on
# one worker and 1 on the other).
my %per_shard;
for my $r (@names)
{
	$per_shard{shard_of('lockfence.fences', $r)} //= $r;
}
my @res = sort values %per_shard;
is(scalar @res, 4, 'one resource in each of the 4 shards: ' . join(',', @res));
for my $r (@res)
{
	succeeds($coord, qq{
BEGIN;
SELECT lockfence.fence('$r', 40, 'h');
INSERT INTO orders VALUES ('$r', 40, 1, 40, 'h');
COMMIT}, "$r fenced at 40 with a row");
}
my $placements = sub { q1($coord, q{SELECT string_agg(shardid || '@' || nodeport, ',' ORDER BY shardid) FROM pg_dist_shard_placement}) };
my $before = $placements->();
# A replica identity on every table of the group lets Citus move it by
# logical replication (the default 'auto' mode), writes going on until
# the switch; lockfence.fences has its primary key.
succeeds($coord, 'ALTER TABLE orders ADD PRIMARY KEY (tenant, id)', 'orders gets a primary key');
succeeds($coord, 'DROP TABLE byid, pfx', 'the refusals\' other tables of the group are dropped (no replica identity)');
ok(cleanup_orphans(), 'the earlier moves\' leftovers are cleaned up');
succeeds($coord, "SELECT rebalance_table_shards('orders')",
	'rebalance_table_shards, by logical replication (shard_transfer_mode auto)');
isnt($placements->(), $before, 'the rebalance moved at least one shard group');
is(q1($coord, q{
SELECT count(*) FROM pg_dist_shard fs JOIN pg_dist_shard os
    ON os.logicalrelid = 'orders'::regclass AND fs.shardminvalue = os.shardminvalue
  JOIN pg_dist_placement fp ON fp.shardid = fs.shardid
  JOIN pg_dist_placement op ON op.shardid = os.shardid
 WHERE fs.logicalrelid = 'lockfence.fences'::regclass AND fp.groupid = op.groupid}),
	'4', 'every fence shard is on the node of its orders shard');
for my $r (@res)
{
	my $nd = node_of_shard(shard_of('orders', $r));
	refused($coord, "INSERT INTO orders VALUES ('$r', 41, 1, 39, 'old')",
		'LF001', qr/Token 39 was presented, but token 40 has already been accepted/,
		"after the rebalance, the stale token for $r is refused");
	succeeds($coord, qq{
BEGIN;
SELECT lockfence.fence('$r', 40, 'h');
INSERT INTO orders VALUES ('$r', 42, 1, 40, 'h');
COMMIT}, "and the current token for $r is accepted (on " . $nd->name . ')');
}
is(q1($coord, "SELECT count(*) FROM lockfence.check() WHERE severity = 'error'"), '0',
	'lockfence.check() finds no error on any node after the moves')
  or diag(q1($coord, q{SELECT string_agg(finding || ': ' || detail, E'\n') FROM lockfence.check() WHERE severity = 'error'}),
	"\nCitus cleanup records left: ", q1($coord, 'SELECT count(*) FROM pg_dist_cleanup'));

# --- 4. the fence floor on every node (1.12) -------------------------------
# A fence row moves with its shard; a node's floor does not.  raise_floor()
# without resources records the floor on every node, so a resource without
# a row stays below it after its shard group moves (a review: raised on one
# worker only, a move to the other let token 5 in under a floor of 3000).
my $floors = sub { join ',', map { q1($_, 'SELECT max(floor) FROM lockfence.floor_state') } @all };
succeeds($coord, 'SELECT lockfence.raise_floor(3000)', 'raise_floor(3000) on the coordinator');
is($floors->(), '3000,3000,3000', 'every node records the floor of 3000');
my ($floor_res) = grep {
	q1($coord, "SELECT count(*) FROM lockfence.fences WHERE resource = '$_'") eq '0'
} map { "floor-$_" } 1 .. 40;
ok(defined $floor_res, "a resource without a fence row: $floor_res");
my $floor_fshard = shard_of('lockfence.fences', $floor_res);
my $floor_from = node_of_shard($floor_fshard);
my ($floor_to) = grep { $_->name ne $floor_from->name } ($w1, $w2);
my $below_floor = qr/stale fencing token for resource "\Q$floor_res\E"/;
refused($coord, "SELECT lockfence.fence('$floor_res', 5)", 'LF001', $below_floor,
	"token 5 for $floor_res is below the floor on " . $floor_from->name);
ok(cleanup_orphans(), 'the earlier moves\' leftovers are cleaned up');
succeeds($coord, "SELECT citus_move_shard_placement($floor_fshard, '127.0.0.1', " . $floor_from->port
	  . ", '127.0.0.1', " . $floor_to->port . ", shard_transfer_mode => 'block_writes')",
	"$floor_res\'s shard group moved to " . $floor_to->name);
is(node_of_shard($floor_fshard)->name, $floor_to->name, "$floor_res\'s fence shard is on " . $floor_to->name);
refused($coord, "SELECT lockfence.fence('$floor_res', 5)", 'LF001', $below_floor,
	'after the move, token 5 is still below the floor');
succeeds($coord, "SELECT lockfence.fence('$floor_res', 3001)", 'and token 3001 is accepted');
# From a worker too: every other node first, then its own.
succeeds($w2, 'SELECT lockfence.raise_floor(4000)', 'raise_floor(4000) on a worker');
is($floors->(), '4000,4000,4000', 'every node records the floor of 4000');
# A node below another's floor (one added later starts at 0; here lowered
# by hand) is an error in check() on the coordinator.
q1($w1, 'UPDATE lockfence.floor_state SET floor = 100');
is(q1($coord, q{SELECT string_agg(finding || ': ' || detail || ' / ' || hint, E'\n') FROM lockfence.check() WHERE finding = 'citus_floor_uneven'}),
	'citus_floor_uneven: Citus node 127.0.0.1:' . $w1->port
	  . ' has fence floor 100, below the 4000 of another node: a resource without a fence row whose shard moves there loses the floor.'
	  . " / SELECT lockfence.raise_floor(4000); raises every node's floor (1.12).",
	'check() on the coordinator reports the node below the others\' floor');
succeeds($coord, 'SELECT lockfence.raise_floor(4000)', 'the hint raises it again');
is(q1($coord, q{SELECT count(*) FROM lockfence.check() WHERE finding = 'citus_floor_uneven'}),
	'0', 'and check() reports no uneven floor');
# A fence of a new name holds its node's lockfence.floor_state until its
# transaction ends; a raise_floor() later in that transaction has the node
# record the floor in a transaction of its own, which waits for it, unseen
# by any deadlock detector: it gives up at lock_timeout (10 s unset) with
# 55000, rather than waiting for good (a review).
my ($new_res) = grep {
	q1($coord, "SELECT count(*) FROM lockfence.fences WHERE resource = '$_'") eq '0'
} map { "floor-new-$_" } 1 .. 40;
refused($coord, "BEGIN;\nSET LOCAL lock_timeout = '1s';\nSELECT lockfence.fence('$new_res', 5000);\nSELECT lockfence.raise_floor(6000);",
	'55000', qr/could not raise the fence floor on Citus node .*lock timeout/s,
	"raise_floor() after a fence of a new name in the same transaction fails at lock_timeout (55000)");
my $new_node = node_of_shard(shard_of('lockfence.fences', $new_res));
is(q1($new_node, 'SELECT max(floor) FROM lockfence.floor_state'), '4000',
	'... leaving the floor of ' . $new_node->name . ', where the fence waited, as it was');
like(q1($coord, q{SELECT string_agg(detail, E'\n') FROM lockfence.check() WHERE finding = 'citus_floor_uneven'}),
	qr/^Citus node 127\.0\.0\.1:\Q${\ $new_node->port}\E has fence floor 4000, below the 6000 of another node/,
	'check() reports it below the nodes the failed call raised');
succeeds($coord, 'SELECT lockfence.raise_floor(6000)', 'raise_floor(6000) again, in a transaction of its own');
is($floors->(), '6000,6000,6000', 'every node records the floor of 6000');

# (1.13) A disabled node is raised too: citus_activate_node() brings it
# back as it was, and shards may then move there (a review: skipped, it
# kept a lower floor, and after activation and a move a token below the
# floor was accepted there).  While it does not answer, raise_floor()
# fails; check() names it, since it cannot check it.
my $w3 = LockfenceTest::Citus::start_node('citus_w3');
succeeds($coord, "SELECT citus_add_node('127.0.0.1', " . $w3->port . ')', 'a third worker added');
is(q1($w3, 'SELECT coalesce(max(floor), 0) FROM lockfence.floor_state'), '0', 'it starts at floor 0');
succeeds($coord, "SELECT citus_disable_node('127.0.0.1', " . $w3->port . ', synchronous => true)',
	'and is disabled');
succeeds($coord, 'SELECT lockfence.raise_floor(7000)', 'raise_floor(7000) with a node disabled');
is(q1($w3, 'SELECT max(floor) FROM lockfence.floor_state'), '7000', 'the disabled node records the floor too');
is(q1($coord, q{SELECT severity || ' ' || finding || ': ' || detail FROM lockfence.check() WHERE finding = 'citus_node_inactive'}),
	'warning citus_node_inactive: Citus node 127.0.0.1:' . $w3->port
	  . ' is disabled: lockfence.check() did not check it.',
	'check() on the coordinator names the disabled node');
$w3->stop('fast');
refused($coord, 'SELECT lockfence.raise_floor(8000)', '55000',
	qr/could not raise the fence floor on Citus node 127\.0\.0\.1:\Q${\ $w3->port}\E/,
	'raise_floor() fails while the disabled node does not answer (55000)');
is($floors->(), '7000,8000,8000', '... the nodes that answered first keep the new floor (it only rises), the coordinator does not record it');
succeeds($coord, "SELECT citus_remove_node('127.0.0.1', " . $w3->port . ')', 'the node removed');
succeeds($coord, 'SELECT lockfence.raise_floor(8000)', 'raise_floor(8000) once it is removed');
is($floors->(), '8000,8000,8000', 'every node records the floor of 8000');
# A node added inactive and never activated has no lockfence yet (Citus
# creates it at activation, at floor 0): raise_floor() passes over it
# rather than failing on a function that is not there (a review).
my $w4 = LockfenceTest::Citus::start_node('citus_w4');
succeeds($coord, "SELECT citus_add_inactive_node('127.0.0.1', " . $w4->port . ')', 'a fourth node added inactive');
is(q1($w4, q{SELECT to_regnamespace('lockfence') IS NULL}), 't', 'it has no lockfence');
succeeds($coord, 'SELECT lockfence.raise_floor(9000)', 'raise_floor(9000) with a node added inactive');
is($floors->(), '9000,9000,9000', 'every node with lockfence records the floor of 9000');
succeeds($coord, "SELECT citus_remove_node('127.0.0.1', " . $w4->port . ')', 'the inactive node removed');
$w4->stop('fast');

# (1.14) A worker's standby promoted after a lossy failover.  Its fences
# are refused (LF004) until the floor is raised; raise_floor() on the
# coordinator records the floor on each other node first, in a transaction
# of its own, and raises the rows through Citus after: in between, a row
# the promotion rolled back took tokens issued before the failover (a
# review: a stale token and a second holder of a lost one committed).  A
# row below the node's floor takes no token below it.
my ($pf) = grep { node_of_shard(shard_of('lockfence.fences', $_))->name eq $w1->name } map { "pf$_" } 0 .. 40;
ok(defined $pf, 'a resource whose fence shard is on worker 1');
$w1->backup('pf');
my $w1s = PostgreSQL::Test::Cluster->new('citus_w1s');
$w1s->init_from_backup($w1, 'pf', has_streaming => 1);
# Citus made the node a TLS key; the backup's copy is not 0600 any more.
chmod 0600, $w1s->data_dir . '/server.key' if -e $w1s->data_dir . '/server.key';
$w1s->start;
succeeds($coord, "SELECT lockfence.fence('$pf', 9005, 'A')", 'fenced at 9005 through the coordinator');
$w1->wait_for_catchup($w1s);
is(q1($w1s, "SELECT token FROM lockfence.fences WHERE resource = '$pf'"), '9005', 'the standby has 9005');
$w1s->stop('fast');
succeeds($coord, "SELECT lockfence.fence('$pf', 9010, 'B')", 'fenced at 9010 while the standby is away');
$w1->stop('immediate');
$w1s->start;
$w1s->promote;
succeeds($coord,
	q{SELECT citus_update_node(nodeid, '127.0.0.1', } . $w1s->port . q{) FROM pg_dist_node WHERE nodeport = } . $w1->port,
	'worker 1 crashed, its standby promoted and put in its place');
is(q1($w1s, "SELECT token FROM lockfence.fences WHERE resource = '$pf'"), '9005', 'the promoted worker lost 9010');
refused($coord, "SELECT lockfence.fence('$pf', 9006, 'A')", 'LF004', qr/promoted|floor/,
	'a fence there is refused until the floor is raised (LF004)');
# What raise_floor(9100) does on that node first, in a transaction of its own.
q1($w1s, 'SELECT lockfence.floor_record(9100)');
refused($coord, "SELECT lockfence.fence('$pf', 9006, 'A')", 'LF001', qr/token 9006 is below the failover floor, 9100/i,
	'floor recorded there, rows not raised yet: a token below the floor is stale (LF001)');
refused($coord, "SELECT lockfence.fence('$pf', 9010, 'C')", 'LF001', qr/token 9010 is below the failover floor, 9100/i,
	'... the lost token too, under another holder');
succeeds($coord, 'SELECT lockfence.raise_floor(9100)', 'raise_floor(9100) on the coordinator');
is(q1($w1s, "SELECT token FROM lockfence.fences WHERE resource = '$pf'"), '9100', 'the row is raised');
succeeds($coord, "SELECT lockfence.fence('$pf', 9101, 'D')", 'a token above the floor is accepted');
$w1 = $w1s;
@all = ($coord, $w1, $w2);

# (1.15) The same worker fails over again, losing nothing: its standby
# has replayed every commit when the worker is killed.  The promoted node
# refuses fences (LF004) like any promotion, and accept_promotion() run
# on that worker itself (docs/citus.md) lifts the refusal without a floor:
# its rows stand, so the current token and holder go on and the tokens
# below them stay stale (the closing note of stop 52: documented, not
# tested).
$w1->backup('lossless');
my $w1t = PostgreSQL::Test::Cluster->new('citus_w1t');
$w1t->init_from_backup($w1, 'lossless', has_streaming => 1);
chmod 0600, $w1t->data_dir . '/server.key' if -e $w1t->data_dir . '/server.key';
$w1t->start;
succeeds($coord, "SELECT lockfence.fence('$pf', 9102, 'E')", 'fenced at 9102 through the coordinator');
$w1->wait_for_catchup($w1t);
$w1->stop('immediate');
$w1t->promote;
succeeds($coord,
	q{SELECT citus_update_node(nodeid, '127.0.0.1', } . $w1t->port . q{) FROM pg_dist_node WHERE nodeport = } . $w1->port,
	'worker 1 crashed after its standby replayed everything; the standby promoted and put in its place');
is(q1($w1t, "SELECT token || ' ' || holder FROM lockfence.fences WHERE resource = '$pf'"), '9102 E',
	'the promoted worker has 9102');
refused($coord, "SELECT lockfence.fence('$pf', 9102, 'E')", 'LF004', qr/promoted|floor/,
	'a fence there is refused until the promotion is accepted (LF004)');
is(q1($w1t, 'SELECT lockfence.accept_promotion()'), '9100',
	'accept_promotion() on the promoted worker keeps its floor');
succeeds($coord, "SELECT lockfence.fence('$pf', 9102, 'E')", 'then the current token and holder are accepted');
refused($coord, "SELECT lockfence.fence('$pf', 9101, 'D')", 'LF001', qr/token 9101 was presented, but token 9102/i,
	'... and the token before it is stale (LF001)');
refused($coord, "SELECT lockfence.fence('$pf', 9102, 'F')", 'LF001', qr/belongs to another holder/,
	'... and the current token under another holder too');
succeeds($coord, "SELECT lockfence.fence('$pf', 9103, 'F')", 'a new token is accepted');
$w1 = $w1t;
@all = ($coord, $w1, $w2);

# A worker that cannot be checked is an error on the coordinator.
$w2->stop('fast');
like(q1($coord, q{SELECT severity || ' ' || finding || ' ' || detail FROM lockfence.check() WHERE finding LIKE 'citus_node%' ORDER BY detail}),
	qr/^info citus_node Citus node 127\.0\.0\.1:\Q${\ $w1->port}\E checked.*\nerror citus_node_unchecked lockfence\.check\(\) failed on Citus node 127\.0\.0\.1:\Q${\ $w2->port}\E/s,
	'with a worker down, check() on the coordinator reports it unchecked (error) and still checks the other');

# (1.14) The shard TRUNCATE guard is a hook the library installs when it
# loads: on a node that does not preload lockfence, a session that only
# truncates has none.  check() reports not_preloaded as an error there
# (a warning elsewhere: the metrics alone).
# A shard of orders on worker 1 without a TRUNCATE trigger (Citus copies
# none to a shard it creates; a split's are the exception).
my $w1_oshard = q1($w1, q{SET citus.override_table_visibility = off;
SELECT min(c.relname) FROM pg_class c
 WHERE c.relname ~ '^orders_[0-9]+$' AND c.relkind = 'r'
   AND NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = c.oid AND (t.tgtype & 32) <> 0)});
like($w1_oshard, qr/^orders_\d+$/, 'a shard of orders on worker 1 without a TRUNCATE trigger');
$w1->adjust_conf('postgresql.conf', 'shared_preload_libraries', "'citus'");
$w1->restart;
is(q1($w1, q{SELECT severity || ' ' || finding || ': ' || hint FROM lockfence.check() WHERE finding = 'not_preloaded'}),
	'error not_preloaded: Add lockfence to shared_preload_libraries, after citus, and restart the server.',
	'a Citus node without lockfence preloaded: not_preloaded is an error');
like(q1($coord, q{SELECT severity || ' ' || detail FROM lockfence.check() WHERE finding = 'not_preloaded'}),
	qr/^error Citus node 127\.0\.0\.1:\Q${\ $w1->port}\E: lockfence is not in shared_preload_libraries of this Citus node: a session that has not loaded lockfence may TRUNCATE/,
	'... which check() on the coordinator reports, naming the node');
is(q1($w1, "SET citus.enable_manual_changes_to_shards = on; TRUNCATE $w1_oshard; SELECT count(*) FROM $w1_oshard"),
	'0', '... and why: a session that has not loaded lockfence there empties the shard');
$w1->adjust_conf('postgresql.conf', 'shared_preload_libraries', "'citus,lockfence'");
$w1->restart;
is(q1($w1, q{SELECT count(*) FROM lockfence.check() WHERE finding = 'not_preloaded'}),
	'0', 'preloaded again: no finding');

done_testing();
