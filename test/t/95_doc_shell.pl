# Every shell command the documentation tells a user to run, where it can
# run here, runs and does what the page says (issue 20, item 3).  The SQL
# examples are test/t/97_doc_examples.pl's.
#
# The convention (also in docs/contributing.md, "Examples in the
# documentation"):
#
# - A fenced block ```sh-test in README.md or docs/*.md is run, as one
#   bash script (-e -o pipefail: any failing command fails the block), in
#   a scratch copy of the repository, with the PostgreSQL under test first
#   on PATH and PGHOST, PGPORT, PGUSER and PGDATABASE naming a database of
#   a server of this test (lockfence preloaded and created, as a
#   superuser).  Every block of every page talks to that one database, in
#   page order.
# - "sh-test needs=CMD" runs the block only where CMD is installed (skipped
#   with the reason otherwise).
# - A comment line "# prints: TEXT" after a command: some line of the
#   block's standard output is TEXT ("..." matches any text).
# - A ```sh, ```bash, ```shell or ```console block is not run; the line
#   before it must be an HTML comment "<!-- not run: why -->" (installing
#   packages, root, production servers, the test command itself).

use strict;
use warnings;

use Cwd qw(abs_path);
use IPC::Run;
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::DocPages;
use LockfenceTest::Node qw(init_node);

my $top = abs_path(dirname(__FILE__) . '/../..');
my @pages = LockfenceTest::DocPages::pages($top);

# Pages other work owns and has not marked yet; their sh-test blocks run.
my %unmarked_ok = map { $_ => 1 } qw();

# A page's sh-test blocks { line, body, needs } and the lines of shell
# blocks without a "not run" reason.
sub read_page
{
	my ($page) = @_;
	my (@blocks, @unmarked);
	for my $b (LockfenceTest::DocPages::blocks($top, $page))
	{
		if ($b->{info} eq 'sh-test')
		{
			my ($needs) = $b->{rest} =~ /\bneeds=(\S+)/;
			push @blocks, { line => $b->{line}, body => $b->{body}, needs => $needs };
		}
		elsif ($b->{info} =~ /^(sh|bash|shell|console)$/ && !$b->{not_run})
		{
			push @unmarked, $b->{line};
		}
	}
	return (\@blocks, \@unmarked);
}

sub pattern
{
	my ($text) = @_;
	return join('.*', map { quotemeta } split /\.\.\./, $text, -1);
}

my %blocks;
for my $page (@pages)
{
	my ($b, $unmarked) = read_page($page);
	$blocks{$page} = $b;
	next if $unmarked_ok{$page};
	is_deeply($unmarked, [],
		"$page: every shell block that is not run says why (<!-- not run: ... -->)");
}

my $node = PostgreSQL::Test::Cluster->new('doc_shell');
init_node($node);
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'lockfence'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->safe_psql('app', 'CREATE EXTENSION lockfence');

# The scratch copy: what the commands may read or write, never the tree
# under test.
my $copy = PostgreSQL::Test::Utils::tempdir('doc_shell_tree');
system("cd '$top' && tar --exclude=./tmp_check --exclude=./results --exclude='*.o' --exclude='*.so' --exclude='*.bc' -cf - . | tar -xf - -C '$copy'") == 0
  or die "copying the tree failed";

my $bindir = $node->config_data('--bindir');
local $ENV{PATH} = "$bindir:$ENV{PATH}";
local $ENV{PGHOST} = $node->host;
local $ENV{PGPORT} = $node->port;
local $ENV{PGDATABASE} = 'app';
local $ENV{PGUSER} = getpwuid($>) // 'postgres';
delete local $ENV{PGSERVICE};

my $ran = 0;
for my $page (@pages)
{
	for my $b (@{ $blocks{$page} })
	{
		my $name = "$page:$b->{line}: sh-test block";
		SKIP:
		{
			if ($b->{needs} && system("command -v '$b->{needs}' >/dev/null 2>&1") != 0)
			{
				skip "$name: $b->{needs} is not installed", 1;
			}
			my @expect = map { /^\s*#\s*prints:\s*(.*?)\s*$/ ? $1 : () } @{ $b->{body} };
			my $script = "set -e -o pipefail\n" . join("\n", @{ $b->{body} }) . "\n";
			my ($stdout, $stderr);
			my $ok = IPC::Run::run([ 'bash', '-c', $script ],
				'<', \undef, '>', \$stdout, '2>', \$stderr,
				init => sub { chdir $copy or die "$copy: $!" },
				IPC::Run::timeout(120));
			my @problems;
			push @problems, "exit status " . ($? >> 8) unless $ok;
			for my $e (@expect)
			{
				push @problems, "no line of its output is: $e"
				  unless $stdout =~ /^${\ pattern($e) }$/m;
			}
			$ran++;
			ok(!@problems, $name)
			  or diag join("\n", @problems, "script:\n$script", "stdout:\n$stdout", "stderr:\n$stderr");
		}
	}
}
cmp_ok($ran, '>=', 1, "sh-test blocks run: $ran");

$node->stop;
done_testing();
