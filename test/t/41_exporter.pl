# Copyright: lockfence contributors
#
# 41_exporter.pl: monitoring/postgres_exporter.yaml parses, every query in
# it runs against a real server and has the columns its metrics need, the
# histograms hold exactly what was observed, and a real postgres_exporter
# (Debian package prometheus-postgres-exporter) serves the metrics under
# the agreed names with the right values.  Leases (issue 12 item 6) share
# the lock_* names with kind="lease"; the etcd locks have kind="etcd".
#
# The etcd lock client is not part of this branch, so the etcd events are
# fed through the test hook lockfence_metrics_test_event (see metrics.c),
# which calls the very functions the etcd client will call.  The extension
# does not create a SQL function for the hook; this test does.

use strict;
use warnings;

use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use LockfenceTest::Node qw(init_node);

my $yaml_file = ($ENV{TESTDIR} // ".") . "/monitoring/postgres_exporter.yaml";  # no TESTDIR since 17
my $exporter_bin = '/usr/bin/prometheus-postgres-exporter';
my $exporter;

END
{
	$exporter->kill_kill if $exporter;
}

# The YAML, as Perl data, through Debian's python3-yaml.
my $json = `/usr/bin/python3 -c 'import sys, json, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)' '$yaml_file'`;
is($?, 0, 'the exporter YAML parses (/usr/bin/python3 with python3-yaml)');
my $queries = decode_json($json);
is_deeply(
	[ sort keys %$queries ],
	[
		sort qw(lock_acquire_duration lock_acquire_error lock_hold_duration
		  lock_fence_rejected proceeded_without_lock lock_fence_accepted
		  lock_fence_missing_token lock_acquire lock_expired_taken_over
		  lock_floor)
	],
	'the YAML defines the expected queries');

my $node = PostgreSQL::Test::Cluster->new('exporter');
init_node($node);
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'lockfence'");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION lockfence;
CREATE ROLE monitor LOGIN IN ROLE pg_monitor;
CREATE FUNCTION lockfence_test_event(text, float8) RETURNS void
    AS '$libdir/lockfence', 'lockfence_metrics_test_event' LANGUAGE C STRICT;
});

# Events: three acquisitions (one beyond the last finite bucket), two
# failures, two releases; rejections on two resources.
$node->safe_psql('postgres', q{
SELECT lockfence_test_event('acquired', 0.003),
       lockfence_test_event('acquired', 0.2),
       lockfence_test_event('acquired', 20),
       lockfence_test_event('acquire_failed', 0),
       lockfence_test_event('acquire_failed', 0),
       lockfence_test_event('released', 0.05),
       lockfence_test_event('released', 4000);
SET lockfence.log_rejections = off;
SELECT lockfence.fence('ra', 10), lockfence.try_fence('ra', 1),
       lockfence.try_fence('ra', 2), lockfence.fence('rb', 5),
       lockfence.try_fence('rb', 1);
});

is( $node->safe_psql('postgres',
		"SELECT name, le, buckets, sum, count FROM lockfence.histograms WHERE name LIKE 'lock%' ORDER BY name"),
	"lock_acquire_duration_seconds|{0.001,0.0025,0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10}|{0,0,1,1,1,1,1,2,2,2,2,2,2}|20.203|3\n"
	  . "lock_hold_duration_seconds|{0.01,0.1,0.5,1,5,10,30,60,300,600,1800,3600}|{0,1,1,1,1,1,1,1,1,1,1,1}|4000.05|2",
	'the histograms hold exactly the observations, cumulative');
is( $node->safe_psql('postgres',
		q{SELECT le, count FROM lockfence.histogram_buckets
           WHERE name = 'lock_acquire_duration_seconds' AND le >= 10}),
	"10|2\nInfinity|3",
	'histogram_buckets adds the +Inf bucket, equal to the count');
is( $node->safe_psql('postgres',
		q{SELECT string_agg(name || '=' || value, ',' ORDER BY name) FROM lockfence.metrics
           WHERE name IN ('lock_acquire_total', 'lock_acquire_error_total')}),
	'lock_acquire_error_total=2,lock_acquire_total=3',
	'acquisitions and their errors are counted');

# Leases: "la" granted to a with a 50 ms TTL, taken over by b once
# expired (b's lease_acquire waits for the expiry), b releases it; "lb"
# held by c, and d gives up waiting for it (wait_timeout).  Three grants, one error, one
# expiry taken over, two holds ended (a's by the takeover, b's release).
$node->safe_psql('postgres',
	"SELECT lockfence.lease_acquire('la', '50 ms', 'a')");
my $tb = $node->safe_psql('postgres',
	"SELECT token FROM lockfence.lease_acquire('la', '1 min', 'b')");
is($node->safe_psql('postgres', "SELECT lockfence.lease_release('la', $tb)"),
	't', 'b releases the lease it took over');
$node->safe_psql('postgres',
	"SELECT lockfence.lease_acquire('lb', '1 min', 'c')");
my ($rc, $out, $err) = $node->psql('postgres',
	"SELECT lockfence.lease_acquire('lb', '1 min', 'd', wait_timeout => '10 ms')");
like($err, qr/could not acquire lease "lb" within wait_timeout/,
	'd gives up waiting for the held lease');
is( $node->safe_psql('postgres',
		q{SELECT string_agg(name || '=' || value, ',' ORDER BY name) FROM lockfence.metrics
           WHERE name LIKE 'lease%'}),
	'lease_acquire_error_total=1,lease_acquire_total=3,lease_expired_taken_over_total=1',
	'the lease counters');
is( $node->safe_psql('postgres',
		q{SELECT string_agg(name || '=' || count, ',' ORDER BY name) FROM lockfence.histograms
           WHERE name LIKE 'lease%'}),
	'lease_acquire_duration_seconds=3,lease_hold_duration_seconds=2',
	'the lease histograms: three grants, two holds ended');
my %lease_sum = split /[|\n]/, $node->safe_psql('postgres',
	q{SELECT name, sum FROM lockfence.histograms WHERE name LIKE 'lease%'});
ok($lease_sum{lease_acquire_duration_seconds} > 0
	  && $lease_sum{lease_hold_duration_seconds} > 0,
	'the lease histograms have sums');

# Every query runs, as the exporter's role, and returns the columns its
# metrics need.
foreach my $name (sort keys %$queries)
{
	my $q = $queries->{$name};
	my %need;
	foreach my $m (@{ $q->{metrics} })
	{
		my ($col, $spec) = %$m;
		$need{$col} = 1;
		if ($spec->{usage} eq 'HISTOGRAM')
		{
			$need{"${col}_$_"} = 1 foreach qw(bucket sum count);
		}
	}
	(my $sql = $q->{query}) =~ s/\s+$//;
	my ($out, $err);
	my $rc = $node->psql('postgres', "$sql \\gdesc",
		stdout => \$out, stderr => \$err, extra_params => [ '-U', 'monitor' ]);
	is($rc, 0, "query $name runs") or diag($err);
	my %got = map { (split /\|/)[0] => 1 } split /\n/, $out;
	is_deeply(\%got, \%need, "query $name returns exactly the columns its metrics use");
	$rc = $node->psql('postgres', $sql,
		stdout => \$out, stderr => \$err, extra_params => [ '-U', 'monitor' ]);
	ok($rc == 0 && $out ne '', "query $name returns rows");
}

SKIP:
{
	skip "$exporter_bin is not installed (apt-get install prometheus-postgres-exporter)", 1
	  unless -x $exporter_bin;

	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $dsn = sprintf('host=%s port=%d user=monitor dbname=postgres sslmode=disable',
		$node->host, $node->port);
	my $exporter_log = "${PostgreSQL::Test::Utils::tmp_check}/exporter.log";
	$exporter = IPC::Run::start(
		[
			'env', "DATA_SOURCE_NAME=$dsn", $exporter_bin,
			"--extend.query-path=$yaml_file",
			"--web.listen-address=127.0.0.1:$port",
			'--disable-default-metrics', '--disable-settings-metrics'
		],
		'>', $exporter_log, '2>&1');

	# Poll until the exporter answers with our metrics, for at most 60 s.
	my $http = HTTP::Tiny->new(timeout => 5);
	my $body = '';
	my $deadline = time() + 60;
	while (time() < $deadline)
	{
		my $res = $http->get("http://127.0.0.1:$port/metrics");
		if ($res->{success} && $res->{content} =~ /^proceeded_without_lock_total/m)
		{
			$body = $res->{content};
			last;
		}
		usleep(200_000);
	}
	isnt($body, '', 'postgres_exporter serves the lockfence metrics')
	  or diag(slurp_file($exporter_log));

	# The samples, as "name{labels without server}" => value.
	my %s;
	foreach (split /\n/, $body)
	{
		next unless /^((?:lock_|proceeded_)\w+)(?:\{(.*)\})? (\S+)$/;
		my ($metric, $labels, $value) = ($1, $2 // '', $3);
		$labels = join ',', grep { !/^server=/ } split /,(?=\w+=)/, $labels;
		$s{"$metric\{$labels\}"} = $value;
	}
	my %want = (
		'lock_acquire_duration_seconds_bucket{kind="etcd",le="0.001"}' => 0,
		'lock_acquire_duration_seconds_bucket{kind="etcd",le="0.005"}' => 1,
		'lock_acquire_duration_seconds_bucket{kind="etcd",le="0.25"}' => 2,
		'lock_acquire_duration_seconds_bucket{kind="etcd",le="10"}' => 2,
		'lock_acquire_duration_seconds_bucket{kind="etcd",le="+Inf"}' => 3,
		'lock_acquire_duration_seconds_sum{kind="etcd"}' => 20.203,
		'lock_acquire_duration_seconds_count{kind="etcd"}' => 3,
		'lock_hold_duration_seconds_bucket{kind="etcd",le="0.01"}' => 0,
		'lock_hold_duration_seconds_bucket{kind="etcd",le="0.1"}' => 1,
		'lock_hold_duration_seconds_bucket{kind="etcd",le="3600"}' => 1,
		'lock_hold_duration_seconds_bucket{kind="etcd",le="+Inf"}' => 2,
		'lock_hold_duration_seconds_sum{kind="etcd"}' => 4000.05,
		'lock_hold_duration_seconds_count{kind="etcd"}' => 2,
		'lock_acquire_error_total{kind="etcd"}' => 2,
		'lock_acquire_total{kind="etcd"}' => 3,
		'lock_fence_rejected_total{resource=""}' => 3,
		'lock_fence_rejected_total{resource="ra"}' => 2,
		'lock_fence_rejected_total{resource="rb"}' => 1,
		'lock_fence_accepted_total{}' => 2,
		'lock_fence_missing_token_total{}' => 0,
		'proceeded_without_lock_total{}' => 0,
		'lock_acquire_total{kind="lease"}' => 3,
		'lock_acquire_error_total{kind="lease"}' => 1,
		'lock_expired_taken_over_total{kind="lease"}' => 1,
		'lock_acquire_duration_seconds_bucket{kind="lease",le="10"}' => 3,
		'lock_acquire_duration_seconds_bucket{kind="lease",le="+Inf"}' => 3,
		'lock_acquire_duration_seconds_count{kind="lease"}' => 3,
		'lock_hold_duration_seconds_bucket{kind="lease",le="3600"}' => 2,
		'lock_hold_duration_seconds_bucket{kind="lease",le="+Inf"}' => 2,
		'lock_hold_duration_seconds_count{kind="lease"}' => 2,
		'lock_floor_required{}' => 0);
	foreach my $k (sort keys %want)
	{
		is($s{$k}, $want{$k}, "exporter: $k");
	}
	like($body, qr/^# TYPE lock_acquire_duration_seconds histogram$/m,
		'lock_acquire_duration_seconds is a histogram');
	like($body, qr/^# TYPE lock_hold_duration_seconds histogram$/m,
		'lock_hold_duration_seconds is a histogram');
	# The sums of the lease histograms are timings: the exporter's text
	# (Go) and PostgreSQL's may spell the same float differently.
	foreach my $h (qw(acquire hold))
	{
		my $got = $s{"lock_${h}_duration_seconds_sum{kind=\"lease\"}"};
		my $sql = $lease_sum{"lease_${h}_duration_seconds"};
		ok(defined $got && abs($got - $sql) < 1e-9,
			"exporter: lock_${h}_duration_seconds_sum{kind=\"lease\"} = $sql")
		  or diag("got " . ($got // 'nothing'));
	}
	my @unlabelled = grep { /^lock_(?:acquire|hold|expired)_/ && !/kind=/ } keys %s;
	is_deeply(\@unlabelled, [], 'every acquisition series has a kind label');
	like($body, qr/^# TYPE lock_expired_taken_over_total counter$/m,
		'lock_expired_taken_over_total is a counter');
	like($body, qr/^# TYPE lock_fence_rejected_total counter$/m,
		'lock_fence_rejected_total is a counter');
	unlike(slurp_file($exporter_log), qr/level=error/,
		'the exporter logged no error');

	$exporter->kill_kill;
	$exporter = undef;
}

$node->stop;
done_testing();
