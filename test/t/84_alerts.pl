# Copyright: lockfence contributors
#
# 84_alerts.pl: the Prometheus alerting rules (monitoring/lockfence-alerts.yml)
# are valid, pass their unit tests (monitoring/lockfence-alerts.test.yml) in
# promtool, use only metric names that monitoring/postgres_exporter.yaml
# produces, and each alert has a runbook section in docs/runbook.md.

use strict;
use warnings;

use File::Basename;
use File::Spec;
use PostgreSQL::Test::Utils;
use Test::More;

my $root = File::Spec->rel2abs(dirname(__FILE__) . '/../..');
my $rules = "$root/monitoring/lockfence-alerts.yml";
my $tests = "$root/monitoring/lockfence-alerts.test.yml";

my ($promtool) = grep { -x $_ } map { "$_/promtool" } split /:/, $ENV{PATH};
ok($promtool, 'promtool is installed (Debian package prometheus)')
  or BAIL_OUT('promtool missing: run scripts/install-deps.sh');

my ($stdout, $stderr);
my $ok = IPC::Run::run([ $promtool, 'check', 'rules', $rules ],
	'>', \$stdout, '2>', \$stderr);
ok($ok, 'promtool check rules: valid') or diag "$stdout$stderr";
like($stdout, qr/SUCCESS: 6 rules found/, '... six rules');

# promtool resolves rule_files relative to the test file.
$ok = IPC::Run::run([ $promtool, 'test', 'rules', $tests ],
	'>', \$stdout, '2>', \$stderr);
ok($ok, 'promtool test rules: every unit test passes') or diag "$stdout$stderr";

# The metric names the exporter produces: <query name>_<column name>, and
# _bucket/_sum/_count for histograms.
my %exported;
my $query;
foreach my $line (split /\n/, slurp_file("$root/monitoring/postgres_exporter.yaml"))
{
	$query = $1 if $line =~ /^(\w+):\s*$/;
	$exported{"${query}_$1"} = 1 if defined $query && $line =~ /^\s+- (\w+):\s*$/;
}
ok(%exported, 'metric names read from postgres_exporter.yaml');

my $alerts = slurp_file($rules);
my %used;
foreach my $expr ($alerts =~ /expr:\s*\|?\s*\n?((?:.|\n)*?)\n\s+(?:for|labels):/g)
{
	$used{$1} = 1 while $expr =~ /\b((?:lock|proceeded)_\w+)/g;
}
ok(%used, 'metric names read from the alert expressions');
foreach my $m (sort keys %used)
{
	(my $base = $m) =~ s/_(bucket|sum|count)$//;
	ok($exported{$m} || $exported{$base}, "$m is exported by postgres_exporter.yaml");
}

# A runbook section per alert, and the alert names the link.
my $runbook = slurp_file("$root/docs/runbook.md");
foreach my $alert ($alerts =~ /- alert: (\w+)/g)
{
	like($runbook, qr/^## $alert$/m, "docs/runbook.md has a section for $alert");
	like($alerts, qr/runbook: "docs\/runbook\.md#\L$alert\E"/, "$alert links to it");
}

done_testing();
