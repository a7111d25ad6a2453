# Copyright: the lockfence authors
#
# 87_floor_ends_leases.pl
#	  etcd_raise_floor() ends the leases of the fences it raises (issue 17,
#	  item 8).
#
# The next etcd lock token after etcd_raise_floor() is often exactly the
# floor (the floor is etcd's revision + 1, and the lock key's creation is
# the next write).  A lease whose fence row was raised kept its expiry, so
# the floor looked like an expired lease token and etcd_lock_and_fence()
# with that token failed with LF003.  Here a lock is taken after each of
# several floors; every fence must be accepted, and no raised row keeps a
# lease.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'floorlease');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('floor_leases',
	"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n");

my $floor_was_token = 0;
for my $round (1 .. 3)
{
	# a lease that expires before the floor is raised
	$node->safe_psql('postgres', q{
		SELECT lockfence.reset('fl');
		SELECT token FROM lockfence.lease_acquire('fl', '10 ms', 'lease-holder');
		DO $$
		BEGIN
			WHILE (SELECT lease_expires_at >= clock_timestamp()
					 FROM lockfence.fences WHERE resource = 'fl') LOOP
				PERFORM pg_sleep(0.01);
			END LOOP;
		END
		$$;
	});
	my $floor = $node->safe_psql('postgres',
		"SELECT floor FROM lockfence.etcd_raise_floor(ARRAY['fl'])");
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM lockfence.fences WHERE resource = 'fl'"
			  . " AND (lease_expires_at IS NOT NULL OR lease_ttl IS NOT NULL)"),
		'0', "round $round: the raised row keeps no lease");

	my ($rc, $out, $err) = ('', '', '');
	$rc = $node->psql('postgres',
		"\\set VERBOSITY verbose\n"
		  . "SELECT lockfence.etcd_lock_and_fence('fl-lock', 'fl', 30)",
		stdout => \$out, stderr => \$err);
	is($rc, 0, "round $round: etcd_lock_and_fence after the floor $floor is accepted")
	  or diag($err);
	$floor_was_token++ if $rc == 0 && $out eq $floor;
}
note("the lock token was exactly the floor in $floor_was_token of 3 rounds");

$node->stop;
$etcd->stop;
done_testing();
