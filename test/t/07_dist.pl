# Copyright: the lockfence authors
#
# 07_dist.pl
#	  make dist builds a release archive with what a user needs, and only that.
#
# make dist archives git HEAD (see the Makefile and .gitattributes).  In a
# git checkout the test archives its HEAD; in a tree that is not one (the
# scratch copy test/run-all.sh runs the suites in) it commits the tree's
# files, minus what .gitignore and the build leave behind, to a temporary
# repository and archives that, so the Makefile target and the
# export-ignore rules are checked either way.  Without git it skips.
#
# The archive must hold the build files, every install and upgrade script,
# the sources and the user documentation under one lockfence-VERSION/
# folder, and nothing for development only: no benchmarks or their results,
# no CI glue, no build products, no test output.  Its sources must build.
# No server is needed.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use File::Temp qw(tempdir);
use IO::Uncompress::Unzip qw($UnzipError);
use JSON::PP;
use Test::More;

my $top = abs_path(dirname(__FILE__) . '/../..');

plan skip_all => 'git is not installed'
  unless system('git --version >/dev/null 2>&1') == 0;

my $tmp = tempdir('lockfence-dist-XXXXXX', TMPDIR => 1, CLEANUP => 1);

sub run_ok
{
	my ($cmd, $name) = @_;
	my $out = `$cmd 2>&1`;
	my $ok = ok($? == 0, $name);
	diag("$cmd:\n$out") unless $ok;
	return $ok;
}

sub slurp
{
	my ($path) = @_;
	open(my $fh, '<', $path) or die "cannot open $path: $!";
	local $/;
	my $text = <$fh>;
	close $fh;
	return $text;
}

# The repository make dist runs in: the tree itself when it is the top of a
# git checkout, otherwise a temporary one holding the tree's files.
my $src = $top;
my $toplevel = `git -C '$top' rev-parse --show-toplevel 2>/dev/null`;
chomp $toplevel;
if ($toplevel eq '' || abs_path($toplevel) ne $top)
{
	note('not a git checkout: committing the tree to a temporary repository');
	$src = "$tmp/repo";
	make_path($src);
	# Build products and test output are ignored by .gitignore; the test
	# folders below are also left out explicitly (tmp_isolation is not
	# listed there, and tmp_check holds this very test's files).
	my @exclude = map { "--exclude=./$_" }
	  qw(.git tmp_check tmp_regress tmp_isolation results output_iso log dist);
	run_ok("tar -C '$top' @exclude -cf - . | tar -C '$src' -xf -",
		'copy the tree')
	  or BAIL_OUT('cannot copy the tree');
	my $git = "git -C '$src' -c user.name=lockfence -c user.email=dev\@lockfence"
	  . " -c init.defaultBranch=main -c commit.gpgsign=false";
	run_ok("$git init -q && $git add -A && $git commit -q -m tree",
		'commit the tree to a temporary repository')
	  or BAIL_OUT('cannot make a git repository');
}
else
{
	note("archiving HEAD of the git checkout $top");
}

my $meta = decode_json(slurp("$src/META.json"));
my $version = $meta->{version};
my $prefix = "lockfence-$version/";
my $zip = "$tmp/out/lockfence-$version.zip";

my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
run_ok("make -C '$src' -s PG_CONFIG='$pg_config' dist DISTDIR='$tmp/out'",
	'make dist succeeds');
ok(-s $zip, "make dist wrote lockfence-$version.zip");

# The archive's members, and their contents (for the build below).
my %member;
my $unzip = IO::Uncompress::Unzip->new($zip)
  or BAIL_OUT("cannot read $zip: $UnzipError");
for (my $status = 1; $status > 0; $status = $unzip->nextStream())
{
	my $name = $unzip->getHeaderInfo()->{Name};
	my $data = '';
	my $buf;
	while ((my $n = $unzip->read($buf)) > 0)
	{
		$data .= $buf;
	}
	$member{$name} = $data;
}
$unzip->close();
my @names = sort keys %member;
ok(@names > 0, 'the archive has members');

is((grep { index($_, $prefix) != 0 } @names), 0,
	"every member is under $prefix");
my %file = map { substr($_, length $prefix) => 1 } grep { !m{/$} } @names;

# What a user needs.
for my $need (qw(Makefile lockfence.control META.json README.md CHANGELOG.md))
{
	ok($file{$need}, "the archive has $need");
}
my @scripts = map { s{.*/}{}r } glob("$src/lockfence--*.sql");
ok(@scripts >= 3, 'the tree has install and upgrade scripts');
for my $script (@scripts)
{
	ok($file{$script}, "the archive has $script");
}
my @sources = map { s{^\Q$src\E/}{}r } glob("$src/src/*.[ch]");
ok(@sources > 0, 'the tree has C sources');
is_deeply([ grep { !$file{$_} } @sources ], [], 'the archive has every file of src/');
ok((grep { m{^sql/.+\.sql$} } keys %file) && (grep { m{^expected/.+\.out$} } keys %file),
	'the archive has the pg_regress suite');

# What it must not hold.
my @unwanted = grep {
	m{^bench(/|$)}
	  || m{^\.ci(/|$)}
	  || m{^\.git}
	  || m{(^|/)(results|output_iso|tmp_check|tmp_regress|tmp_isolation|log|dist)/}
	  || m{\.(o|so|bc|log)$}
	  || m{(^|/)regression\.(diffs|out)$}
} keys %file;
is_deeply([ sort @unwanted ], [], 'no benchmarks, CI files, build products or test output');

# The archive's META.json is the one the version came from.
is(decode_json($member{"${prefix}META.json"})->{version}, $version,
	'the archive\'s META.json names its version');

# Its sources build on their own.
SKIP:
{
	skip 'pg_config not found', 1
	  unless system("'$pg_config' --version >/dev/null 2>&1") == 0;
	my $build = "$tmp/build";
	for my $name (keys %file)
	{
		my $path = "$build/$name";
		make_path(dirname($path));
		open(my $fh, '>:raw', $path) or die "cannot write $path: $!";
		print $fh $member{"$prefix$name"};
		close $fh;
	}
	# with_llvm=no: no JIT bitcode (clang again over every file, half of
	# this test's CPU).  The test command's own build of the same sources
	# makes it, and the archive was checked above to hold every file of
	# src/; what is proven here is that nothing the build needs is missing.
	run_ok("make -C '$build' -s PG_CONFIG='$pg_config' with_llvm=no",
		'the sources in the archive build');
}

done_testing();
