# Copyright: the lockfence authors
#
# 00_release_files.pl
#	  The release files agree with each other, and released SQL is frozen.
#
# - Every install or upgrade script listed in test/release-checksums is
#   byte for byte what was released (a released script is never edited:
#   changes go into the next version's upgrade script).
# - lockfence.control's default_version has an install script, and every
#   older version has exactly one upgrade script to its successor.
# - META.json (PGXN) names the same version as lockfence.control, and the
#   install script it points at exists.
# - (1.11) The library's version (LOCKFENCE_LIBRARY_VERSION in
#   src/lockfence.c, what lockfence.library_version() returns) is
#   default_version: opening a version bumps both.
# No server is needed.

use strict;
use warnings;

use Digest::SHA;
use File::Basename qw(dirname);
use JSON::PP;
use Test::More;

my $top = dirname(__FILE__) . '/../..';

sub slurp
{
	my ($path) = @_;
	open(my $fh, '<', $path) or die "cannot open $path: $!";
	local $/;
	my $text = <$fh>;
	close $fh;
	return $text;
}

# Released scripts: frozen.
my %released;
for my $line (split /\n/, slurp("$top/test/release-checksums"))
{
	next if $line =~ /^\s*(#|$)/;
	my ($sum, $file) = $line =~ /^([0-9a-f]{64})\s+(\S+)$/
	  or die "bad line in test/release-checksums: $line";
	$released{$file} = 1;
	ok(-f "$top/$file", "released script $file is shipped");
	is(Digest::SHA->new(256)->addfile("$top/$file")->hexdigest, $sum,
		"released script $file is unchanged");
}
ok(keys %released >= 3, 'the checksum list names the released scripts');

# Versions: the control file's default, an install script per version and
# one upgrade script per step.
my ($default) = slurp("$top/lockfence.control") =~ /^default_version\s*=\s*'([^']+)'/m;
ok(defined $default, "lockfence.control has a default_version ($default)");
ok(-f "$top/lockfence--$default.sql", "install script of $default exists");
ok(!$released{"lockfence--$default.sql"},
	"the default version $default is not yet frozen (or the control file was not advanced)");

my @versions = sort { version_cmp($a, $b) } map { /^lockfence--([\d.]+)\.sql$/ ? $1 : () }
  map { s{.*/}{}r } glob("$top/lockfence--*.sql");
is($versions[-1], $default, 'the newest install script is the default version');
my @upgrades = map { s{.*/}{}r } glob("$top/lockfence--*--*.sql");
for my $i (0 .. $#versions - 1)
{
	my $step = "lockfence--$versions[$i]--$versions[$i + 1].sql";
	ok(-f "$top/$step", "upgrade script $step exists");
}
is(scalar @upgrades, scalar @versions - 1, 'one upgrade script per step, no others');

for my $file (map { s{.*/}{}r } glob("$top/lockfence--*.sql"))
{
	like(slurp("$top/$file"), qr/^\\echo Use "(CREATE|ALTER) EXTENSION/m,
		"$file refuses to run outside CREATE/ALTER EXTENSION");
}

# META.json agrees with the control file.
my $meta = decode_json(slurp("$top/META.json"));
my ($major_minor) = $meta->{version} =~ /^(\d+\.\d+)\.\d+$/;
is($major_minor, $default, "META.json version $meta->{version} is default_version $default");
my ($libversion) = slurp("$top/src/lockfence.c") =~ /^#define LOCKFENCE_LIBRARY_VERSION "([^"]+)"/m;
is($libversion, $default, "the library's version is default_version $default");
is($meta->{provides}{lockfence}{version}, $meta->{version},
	'META.json provides the same version');
ok(-f "$top/$meta->{provides}{lockfence}{file}",
	"META.json's file $meta->{provides}{lockfence}{file} exists");
like($meta->{provides}{lockfence}{file}, qr/^lockfence--\Q$default\E\.sql$/,
	'META.json points at the default version\'s install script');
like($meta->{release_status} // '', qr/^(stable|testing|unstable)$/,
	'META.json has a release_status');

sub version_cmp
{
	my @a = split /\./, $_[0];
	my @b = split /\./, $_[1];
	while (@a || @b)
	{
		my $c = (shift(@a) // 0) <=> (shift(@b) // 0);
		return $c if $c;
	}
	return 0;
}

done_testing();
