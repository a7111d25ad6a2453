# Copyright: lockfence contributors
#
# 96_citus.pl: lockfence on a Citus cluster (issue 22) fails closed.
#
# A coordinator and two workers on 127.0.0.1, each preloading citus and
# lockfence, metadata synced.  Until fences live with the rows
# (docs/citus.md), a Citus table's rows are written in shards on the
# workers, whose lockfence.fences is not the one lockfence.fence() on the
# coordinator writes: the issue's sequence (fence 5 and write 5, fence 7 as
# a new holder, write 6 through the coordinator) was accepted.  Here it
# must be refused, and so is everything lockfence cannot guarantee on
# Citus:
#   - protect() on a distributed, a reference and a Citus-managed local
#     table, and on a shard (on a worker);
#   - a fence trigger put on a distributed table by hand while the event
#     triggers were disabled: every write to it, through the coordinator
#     and straight into a shard on a worker;
#   - fence(), try_fence(), their array forms and the lease functions,
#     on the coordinator and on a worker, while lockfence.fences is itself
#     distributed (lockfence reads and writes it past Citus).
# Plain local tables on the coordinator and on a worker work as before.
#
# Skipped, with the reason, when Citus is not installed in the PostgreSQL
# under test (scripts/citus.sh build && scripts/citus.sh install PG_CONFIG).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

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

# CREATE EXTENSION on the coordinator is propagated to the workers.
succeeds($coord, 'CREATE EXTENSION lockfence', 'CREATE EXTENSION lockfence on the coordinator');
for my $w ($w1, $w2)
{
	is($w->safe_psql('postgres',
			"SELECT count(*) FROM pg_extension WHERE extname = 'lockfence'"),
		'1', 'lockfence created on worker ' . $w->name);
}

my $table = 'CREATE TABLE %s (tenant text NOT NULL, id int, qty int, token bigint, holder text)';
my $protect =
  "SELECT lockfence.protect('%s', resource_column => 'tenant', token_column => 'token', holder_column => 'holder')";

# --- protect() on Citus tables -------------------------------------------

succeeds($coord, sprintf($table, 'orders'), 'orders created');
succeeds($coord, "SELECT create_distributed_table('orders', 'tenant')",
	'orders distributed by tenant');
refused($coord,
	['SET citus.enable_unsafe_triggers = on', sprintf($protect, 'orders')],
	'0A000', qr/lockfence cannot protect Citus table "orders".*HINT:.*docs\/citus\.md/s,
	'protect() on a distributed table is refused (even with citus.enable_unsafe_triggers on)');

succeeds($coord, sprintf($table, 'plans'), 'plans created');
succeeds($coord, "SELECT create_reference_table('plans')", 'plans made a reference table');
refused($coord, sprintf($protect, 'plans'),
	'0A000', qr/lockfence cannot protect Citus table "plans"/,
	'protect() on a reference table is refused');

succeeds($coord, sprintf($table, 'notes'), 'notes created');
succeeds($coord, "SELECT citus_add_local_table_to_metadata('notes')",
	'notes added to the Citus metadata');
refused($coord, sprintf($protect, 'notes'),
	'0A000', qr/lockfence cannot protect Citus table "notes"/,
	'protect() on a Citus-managed local table is refused');

# A shard, seen on the worker that holds it.
succeeds($coord, sprintf($table, 'items'), 'items created');
succeeds($coord, "SELECT create_distributed_table('items', 'tenant')", 'items distributed');
my ($wport, $shard) = split /\|/, $coord->safe_psql('postgres', q{
SELECT p.nodeport, 'items_' || s.shardid
  FROM pg_dist_shard s JOIN pg_dist_shard_placement p USING (shardid)
 WHERE s.logicalrelid = 'items'::regclass
 ORDER BY s.shardid LIMIT 1});
my ($holder_node) = grep { $_->port == $wport } @all;
ok(defined $holder_node, "shard $shard is on a node of the cluster");
refused($holder_node, sprintf($protect, $shard),
	'0A000', qr/lockfence cannot protect shard "\Q$shard\E" of Citus table "items"/,
	'protect() on a shard, on the worker holding it, is refused');

# A table protected while local, then distributed: Citus copies its
# triggers to the shards (with citus.enable_unsafe_triggers on), where
# lockfence's event trigger on each worker validates them.
succeeds($coord, sprintf($table, 'pay'), 'pay created');
succeeds($coord, sprintf($protect, 'pay'), 'pay protected while local');
my ($pok, $pout, $perr, $pstate) = sql($coord,
	['SET citus.enable_unsafe_triggers = on', "SELECT create_distributed_table('pay', 'tenant')"]);
ok($pok, 'create_distributed_table of a protected table succeeds: Citus copies the triggers to the shards')
  or diag("state $pstate, stderr:\n$perr");
refused($coord, q{
BEGIN;
SELECT lockfence.fence('pay-1', 3, 'w');
INSERT INTO pay VALUES ('pay-1', 1, 1, 3, 'w');
COMMIT},
	'0A000', qr/lockfence cannot protect shard "pay_\d+" of Citus table "pay"/,
	'a protected table distributed afterwards: a fenced write to it is refused');

# --- the issue's sequence, with a trigger made by hand --------------------
#
# A fence trigger that reached the shards anyway (created with lockfence's
# event triggers disabled, or before this version): it fires on the
# workers, whose fences are not the coordinator's.  Every write is refused.

for my $n (@all)
{
	$n->safe_psql('postgres',
		'ALTER EVENT TRIGGER lockfence_check_new_triggers DISABLE');
}
succeeds($coord, ['SET citus.enable_unsafe_triggers = on', q{
CREATE TRIGGER zz_lockfence_fence BEFORE INSERT OR UPDATE OR DELETE ON orders
  FOR EACH ROW EXECUTE FUNCTION lockfence.fence_trigger(
    'resource_column=tenant', 'token_column=token', 'holder_column=holder')}],
	'a fence trigger created by hand on the distributed table (event triggers disabled)');
my $shard_triggers = $coord->safe_psql('postgres', q{
SELECT sum(result::int) FROM run_command_on_shards('orders',
  $$SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass AND tgname LIKE 'zz_lockfence_fence%%'$$)});
is($shard_triggers, '4', 'Citus copied the trigger to all 4 shards (named with the shard id appended)');
for my $n (@all)
{
	$n->safe_psql('postgres',
		'ALTER EVENT TRIGGER lockfence_check_new_triggers ENABLE');
}

refused($coord, q{
SET citus.enable_unsafe_triggers = on;
BEGIN;
SELECT lockfence.fence('acme', 5, 'w');
INSERT INTO orders VALUES ('acme', 1, 1, 5, 'w');
COMMIT},
	'0A000', qr/lockfence cannot protect shard "orders_\d+" of Citus table "orders".*HINT:.*docs\/citus\.md/s,
	'a write under a valid fence is refused: the shard cannot see the coordinator\'s fence');
succeeds($coord, q{SELECT lockfence.fence('acme', 7, 'new-holder')},
	'fence 7 for a new holder on the coordinator');
refused($coord, q{
SET citus.enable_unsafe_triggers = on;
INSERT INTO orders VALUES ('acme', 4, 1, 6, 'old-holder')},
	'0A000', qr/lockfence cannot protect shard "orders_\d+" of Citus table "orders"/,
	'the stale token 6 through the coordinator, after fence 7, is REFUSED');
is($coord->safe_psql('postgres', 'SELECT count(*) FROM orders'), '0',
	'no row of orders was written');

# Straight into the shard on the worker that holds acme's rows.
my ($acme_port, $acme_shard) = split /\|/, $coord->safe_psql('postgres', q{
SELECT p.nodeport, 'orders_' || s.shardid
  FROM pg_dist_shard s JOIN pg_dist_shard_placement p USING (shardid)
 WHERE s.shardid = get_shard_id_for_distribution_column('orders', 'acme')});
my ($acme_node) = grep { $_->port == $acme_port } @all;
succeeds($acme_node, q{SELECT lockfence.fence('acme', 9, 'on-worker')},
	'fence 9 in the worker\'s own lockfence.fences');
refused($acme_node, qq{
BEGIN;
SELECT lockfence.fence('acme', 9, 'on-worker');
INSERT INTO $acme_shard VALUES ('acme', 5, 1, 9, 'on-worker');
COMMIT},
	'0A000', qr/lockfence cannot protect shard "\Q$acme_shard\E" of Citus table "orders"/,
	'a write straight into the shard on the worker is refused too');
# A row that got in with triggers off, to have something to update.
succeeds($acme_node, ['SET session_replication_role = replica',
	"INSERT INTO $acme_shard VALUES ('acme', 6, 1, 9, 'on-worker')"],
	'a row put into the shard with triggers off');
refused($acme_node, "UPDATE $acme_shard SET qty = 2", '0A000',
	qr/lockfence cannot protect shard/, 'an UPDATE of the shard is refused');
refused($coord, "SET citus.enable_unsafe_triggers = on; DELETE FROM orders WHERE tenant = 'acme'",
	'0A000', qr/lockfence cannot protect shard/, 'a DELETE through the coordinator is refused');
refused($coord, "SET citus.enable_unsafe_triggers = on; UPDATE orders SET token = 10 WHERE tenant = 'acme'",
	'0A000', qr/lockfence cannot protect shard/, 'an UPDATE through the coordinator is refused');
is($coord->safe_psql('postgres', "SELECT id || ':' || qty || ':' || token FROM orders"), '6:1:9',
	'the row is as it was put');

# A shard move of a table carrying lockfence triggers is refused: the
# new placement's trigger is validated on the node it moves to.  The
# placement stays, and so does the refusal of writes.
my ($other) = grep { $_->port != $acme_port } ($w1, $w2);
my $acme_shardid = ($acme_shard =~ /_(\d+)$/)[0];
refused($coord, "SELECT citus_move_shard_placement($acme_shardid, '127.0.0.1', $acme_port, '127.0.0.1', "
	  . $other->port . ", shard_transfer_mode => 'block_writes')",
	'0A000', qr/lockfence cannot protect shard "\Q$acme_shard\E" of Citus table "orders"/,
	"moving acme's shard to " . $other->name . ' is refused');
is($coord->safe_psql('postgres',
		"SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $acme_shardid"),
	$acme_port, 'the placement stays where it was');
refused($coord, "SET citus.enable_unsafe_triggers = on; INSERT INTO orders VALUES ('acme', 7, 1, 6, 'old-holder')",
	'0A000', qr/lockfence cannot protect shard "\Q$acme_shard\E" of Citus table "orders"/,
	'after the refused move, the stale token 6 through the coordinator is still refused');

# lockfence.check() on the coordinator still runs.
succeeds($coord, 'SELECT count(*) FROM lockfence.check()', 'lockfence.check() runs on the coordinator');

# --- plain local tables on Citus nodes work as before ---------------------

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
	is($n->safe_psql('postgres', 'SELECT string_agg(id::text, \',\' ORDER BY id) FROM ledger'),
		'1,4', "the local table on $nm holds exactly the accepted rows");
	my ($ok, $out) = sql($n, q{SELECT lockfence.lease_acquire('lease-1', '1 minute', 'h')});
	ok($ok, "lease_acquire on $nm");
}

# --- lockfence.fences itself distributed ----------------------------------

# Citus' deadlock detector once cancelled this (40P01) in a run of the old
# library; a setup step, so it is retried on that SQLSTATE only.
my ($dok, $dout, $derr, $dstate);
for my $attempt (1 .. 3)
{
	($dok, $dout, $derr, $dstate) = sql($coord,
		"SELECT create_distributed_table('lockfence.fences', 'resource')");
	last unless !$dok && $dstate eq '40P01';
	note("create_distributed_table('lockfence.fences') attempt $attempt: $derr");
}
ok($dok, 'lockfence.fences distributed by resource (as a user might, to spread the fences)')
  or diag("stderr:\n$derr");
if ($dok)
{
	for my $n ($coord, $w1)
	{
		my $nm = $n->name;
		my $re = qr/lockfence\.fences is a Citus table.*HINT:.*local table on every node.*docs\/citus\.md/s;
		refused($n, q{SELECT lockfence.fence('r', 20)}, '0A000', $re,
			"fence() on $nm while lockfence.fences is distributed");
		refused($n, q{SELECT lockfence.try_fence('r', 20)}, '0A000', $re,
			"try_fence() on $nm");
		refused($n, q{SELECT lockfence.fence(ARRAY['r', 's'], 20)}, '0A000', $re,
			"fence(text[]) on $nm");
		refused($n, q{SELECT lockfence.try_fence(ARRAY['r', 's'], 20)}, '0A000', $re,
			"try_fence(text[]) on $nm");
		refused($n, q{SELECT lockfence.lease_acquire('lease-2', '1 minute', 'h')}, '0A000', $re,
			"lease_acquire() on $nm");
		refused($n, q{SELECT lockfence.lease_try_acquire('lease-2', '1 minute', 'h')}, '0A000', $re,
			"lease_try_acquire() on $nm");
		refused($n, q{SELECT lockfence.lease_renew('lease-1', 1, '1 minute')}, '0A000', $re,
			"lease_renew() on $nm");
		refused($n, q{SELECT lockfence.lease_release('lease-1', 1)}, '0A000', $re,
			"lease_release() on $nm");
	}
}

done_testing();
