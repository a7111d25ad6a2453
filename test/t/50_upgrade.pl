# Copyright: the lockfence authors
#
# 50_upgrade.pl
#	  ALTER EXTENSION lockfence UPDATE from every released version.
#
# For each released version (listed below, and each must be installable),
# a database created at that version, holding fences and a protected
# table, is updated to the default version.  Afterwards:
#   - its extension objects, their definitions, privileges, comments and
#     the triggers on its own tables and the event triggers match a
#     database where the default version was
#     installed fresh, except that PUBLIC keeps EXECUTE on the functions
#     that advance fences and leases (a fresh 1.4 grants them to no one),
#     exactly that, and said by a WARNING (extension scripts run with
#     client_min_messages at least warning); with the REVOKE it names,
#     all match;
#   - the fences and the protected table's triggers are intact and work.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use LockfenceTest::Node qw(init_node);

# Every version ever released, oldest first.  A new release adds its
# predecessor here, and an upgrade script from it.
my @released = ('1.0', '1.1', '1.2', '1.3', '1.4', '1.5', '1.6', '1.7', '1.8', '1.9', '1.10', '1.11', '1.12', '1.13', '1.14');

my $node = PostgreSQL::Test::Cluster->new('upgrade');
init_node($node);
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'lockfence'\n");
$node->start;

my $default = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'lockfence'");
ok($default ne '', "default version is $default");
for my $v (@released)
{
	isnt($v, $default, "released version $v is older than the default");
}

# Everything about the extension's objects that an upgrade must get right,
# one line per fact, in a stable order.
my $catalog_sql = q{
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'lockfence'),
members AS (
	SELECT d.classid, d.objid
	  FROM pg_depend d, ext
	 WHERE d.refclassid = 'pg_extension'::regclass
	   AND d.refobjid = ext.oid AND d.deptype = 'e')
SELECT 'member: ' || pg_describe_object(classid, objid, 0) FROM members
UNION ALL
SELECT 'function: ' || p.oid::regprocedure || ' ' || pg_get_functiondef(p.oid)
       || ' acl=' || coalesce(p.proacl::text, 'default')
       || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '')
  FROM pg_proc p WHERE p.pronamespace = 'lockfence'::regnamespace
UNION ALL
SELECT 'relation: ' || c.relname || ' kind=' || c.relkind::text
       || ' acl=' || coalesce(c.relacl::text, 'default')
       || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '')
       || CASE WHEN c.relkind = 'v' THEN ' def=' || pg_get_viewdef(c.oid) ELSE '' END
  FROM pg_class c WHERE c.relnamespace = 'lockfence'::regnamespace
UNION ALL
SELECT 'column: ' || a.attrelid::regclass || '.' || a.attname || ' '
       || format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
 WHERE c.relnamespace = 'lockfence'::regnamespace
   AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint: ' || conrelid::regclass || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'lockfence'::regnamespace
UNION ALL
SELECT 'trigger: ' || pg_get_triggerdef(t.oid) || ' enabled=' || t.tgenabled::text
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = 'lockfence'::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'event trigger: ' || evtname || ' ' || evtevent || ' ' || evtfoid::regproc
       || ' tags=' || coalesce(evttags::text, '') || ' enabled=' || evtenabled::text
  FROM pg_event_trigger
UNION ALL
SELECT 'schema acl: ' || coalesce(nspacl::text, 'default')
  FROM pg_namespace WHERE nspname = 'lockfence'
UNION ALL
SELECT 'config dump: ' || extconfig::regclass[]::text || ' ' || extcondition::text
  FROM pg_extension WHERE extname = 'lockfence'
ORDER BY 1
};

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION lockfence');
my $fresh = $node->safe_psql('fresh', $catalog_sql);
like($fresh, qr/member: function lockfence\.fence\(text,bigint,text\)/,
	'the catalog listing sees the extension');

# Function privileges, one line per function: "signature acl=ACL".
my $acl_sql = q{
SELECT p.oid::regprocedure || ' acl=' || coalesce(p.proacl, acldefault('f', p.proowner))::text
  FROM pg_proc p WHERE p.pronamespace = 'lockfence'::regnamespace
 ORDER BY 1
};

# The lines that differ between two listings: "signature: fresh -> updated".
sub acl_diff
{
	my ($before, $after) = @_;
	my %l = map { /^(.*) acl=(.*)$/ ? ($1 => $2) : () } split /\n/, $before;
	my %r = map { /^(.*) acl=(.*)$/ ? ($1 => $2) : () } split /\n/, $after;
	my %all = (%l, %r);
	return join "\n", map {
		my $x = $l{$_} // 'absent';
		my $y = $r{$_} // 'absent';
		$x eq $y ? () : "$_: $x -> $y"
	} sort keys %all;
}

# What PUBLIC keeps after an update: EXECUTE on these, and nothing else.
my $public_usage = $node->safe_psql('fresh', q{
SELECT string_agg(n.name, ', ' ORDER BY n.name)
  FROM lockfence.usage_functions(false) AS f
  JOIN pg_proc p ON p.oid = f,
       LATERAL (SELECT format('lockfence.%I(%s)', p.proname, oidvectortypes(p.proargtypes))) AS n(name)});
my $usage_signatures = $node->safe_psql('fresh',
	"SELECT string_agg(f::text, ', ' ORDER BY f::text) FROM lockfence.usage_functions(false) AS f");
my $owner = $node->safe_psql('fresh',
	"SELECT extowner::regrole FROM pg_extension WHERE extname = 'lockfence'");
my $expected_acl_diff = join "\n", map { "$_: {$owner=X/$owner} -> {=X/$owner,$owner=X/$owner}" }
  sort split /, /, $usage_signatures;
is(scalar(split /\n/, $expected_acl_diff), 8, 'eight functions advance a fence or a lease');

for my $v (@released)
{
	my $db = "from_" . ($v =~ s/\./_/gr);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION lockfence VERSION '$v'");
	is($node->safe_psql($db,
		"SELECT extversion FROM pg_extension WHERE extname = 'lockfence'"),
		$v, "installed version $v");

	# Data and protection made at the old version.
	$node->safe_psql($db, q{
		SELECT lockfence.fence('orders', 41, 'worker-a');
		CREATE TABLE orders (id int PRIMARY KEY, fence_token bigint);
		SELECT lockfence.protect('orders', resource => 'orders',
		                         token_column => 'fence_token');
		INSERT INTO orders VALUES (1, 42);
	});

	# One upgrade script per step: from each release to the next.
	my ($first) = grep { $released[$_] eq $v } 0 .. $#released;
	my @chain = (@released[$first .. $#released], $default);
	is($node->safe_psql($db,
		"SELECT path FROM pg_extension_update_paths('lockfence') WHERE source = '$v' AND target = '$default'"),
		join('--', @chain), "$v updates to $default step by step");

	my ($update_out, $update_err);
	$node->psql($db, 'ALTER EXTENSION lockfence UPDATE',
		stdout => \$update_out, stderr => \$update_err, on_error_die => 1);
	is($node->safe_psql($db,
		"SELECT extversion FROM pg_extension WHERE extname = 'lockfence'"),
		$default, "$v updated to $default");

	# The update from a version before 1.4 keeps PUBLIC's EXECUTE on the
	# functions that advance fences and leases (1.4 and later grant them to
	# no one), and says so; from 1.4 on there is nothing to keep or say.
	my $granted_public = $v =~ /^1\.[0-3]$/;
	if ($granted_public)
	{
		like($update_err,
			qr/WARNING:  PUBLIC may still execute lockfence functions that advance fences and leases: \Q$public_usage\E/,
			"the update from $v says PUBLIC keeps its grants, naming the functions");
	}
	else
	{
		unlike($update_err, qr/WARNING/, "the update from $v warns of nothing");
	}
	my $acl_diff = acl_diff($node->safe_psql('fresh', $acl_sql),
		$node->safe_psql($db, $acl_sql));
	is($acl_diff, $granted_public ? $expected_acl_diff : '',
		$granted_public
		? "after updating from $v, function privileges differ from a fresh install exactly by PUBLIC's EXECUTE on the fence and lease functions"
		: "after updating from $v, function privileges are those of a fresh install");

	# Tightened as the WARNING says, everything matches a fresh install.
	my $upgraded = $node->safe_psql($db,
		"BEGIN; REVOKE EXECUTE ON FUNCTION $public_usage FROM PUBLIC; $catalog_sql; ROLLBACK;");
	is($upgraded, $fresh, "objects after updating from $v (and the REVOKE the update names) match a fresh install");

	is($node->safe_psql($db,
		"SELECT resource || '=' || token || '/' || coalesce(holder, '') FROM lockfence.fences"),
		'orders=42/', "fences made at $v survive the update");
	is($node->safe_psql($db,
		"SELECT string_agg(tbl::text, ',') FROM lockfence.protected_tables"),
		'public.orders', "the update from $v remembers the table protected at $v");
	my ($ret, $out, $err) = $node->psql($db,
		"UPDATE orders SET fence_token = 41 WHERE id = 1");
	like($err, qr/stale fencing token/, "stale token still rejected after updating from $v");
	($ret, $out, $err) = $node->psql($db, "DELETE FROM orders");
	like($err, qr/carries no fencing token/, "protection still fails closed after updating from $v");
	is($node->safe_psql($db, 'SELECT lockfence.fence(\'orders\', 43)'), '43',
		"fence works after updating from $v");
	like($node->safe_psql($db,
		"SELECT value FROM lockfence.metrics WHERE name = 'fence_accepted_total'"),
		qr/^\d+$/, "objects added after $v work");
}

# The newest release's upgrade script refuses to run under a library that
# serves only an older SQL version (an older library still preloaded, the
# server not restarted): library_version() answering as that library would
# must stop the update before it changes anything.
{
	my $prev = $released[-1];
	$node->safe_psql('postgres', 'CREATE DATABASE old_library');
	$node->safe_psql('old_library', "CREATE EXTENSION lockfence VERSION '$prev'");
	$node->safe_psql('old_library',
		"CREATE OR REPLACE FUNCTION lockfence.library_version() RETURNS text "
		  . "LANGUAGE sql AS \$\$SELECT '$prev'\$\$");
	my ($ret, $out, $err) = $node->psql('old_library',
		'ALTER EXTENSION lockfence UPDATE', extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  55000: the loaded lockfence library serves SQL up to version \Q$prev\E only/,
		"the update to $default refuses a library serving $prev (55000)");
	is($node->safe_psql('old_library',
		"SELECT extversion FROM pg_extension WHERE extname = 'lockfence'"),
		$prev, 'the refused update changed nothing');
}

$node->stop;
done_testing();
