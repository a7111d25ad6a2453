# Every relative link of the documentation resolves (issue 20): README.md,
# CHANGELOG.md and docs/*.md.  A link to a file needs the file; a link
# with #anchor needs a heading of the target page whose GitHub anchor is
# that (lower case, punctuation dropped, spaces to hyphens, "-1", "-2"
# for repeats), or an explicit <a id="..."> / <a name="...">.  Links in
# code blocks and code spans are not links.  Also: every repository path
# (demo/run.sh, monitoring/...) that the user-facing pages name in a code
# span exists.  No server needed.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname basename);
use File::Spec;
use Test::More;

my $top = abs_path(dirname(__FILE__) . '/../..');

my @pages = ('README.md', 'CHANGELOG.md',
	map { 'docs/' . basename($_) } sort glob("$top/docs/*.md"));

sub read_text
{
	my ($path) = @_;
	open my $fh, '<:encoding(UTF-8)', $path or return undef;
	local $/;
	my $t = <$fh>;
	close $fh;
	return $t;
}

# The page's lines outside fenced code blocks.
sub prose_lines
{
	my ($text) = @_;
	my (@out, $fence);
	for my $l (split /\n/, $text)
	{
		if ($l =~ /^\s*(```|~~~)/)
		{
			$fence = !$fence;
			next;
		}
		push @out, $l unless $fence;
	}
	return @out;
}

my %anchor_cache;

sub anchors
{
	my ($path) = @_;
	return $anchor_cache{$path} if $anchor_cache{$path};
	my %a;
	my %seen;
	my $text = read_text($path) // '';
	for my $l (prose_lines($text))
	{
		if ($l =~ /^#{1,6}\s+(.*?)\s*#*\s*$/)
		{
			my $s = lc $1;
			$s =~ s/\[([^\]]*)\]\([^)]*\)/$1/g;    # a link's text only
			$s =~ s/[^\w\- ]//g;
			$s =~ s/ /-/g;
			my $n = $seen{$s}++;
			$a{ $n ? "$s-$n" : $s } = 1;
		}
		$a{$1} = 1 while $l =~ /<a\s+(?:id|name)="([^"]+)"/g;
	}
	return $anchor_cache{$path} = \%a;
}

my $links = 0;
for my $page (@pages)
{
	my $text = read_text("$top/$page");
	next unless defined $text;
	my @bad;
	my $lineno = 0;
	for my $l (prose_lines($text))
	{
		(my $plain = $l) =~ s/`[^`]*`//g;
		while ($plain =~ /\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)
		{
			my $target = $1;
			next if $target =~ /^[a-z][a-z0-9+.-]*:/i;    # http:, mailto:
			$links++;
			my ($file, $anchor) = split /#/, $target, 2;
			my $path = $file eq ''
			  ? "$top/$page"
			  : File::Spec->catfile(dirname("$top/$page"), $file);
			if (!-e $path)
			{
				push @bad, "$target: no file " . File::Spec->abs2rel($path, $top);
				next;
			}
			next unless defined $anchor && $anchor ne '';
			if ($path !~ /\.md$/)
			{
				push @bad, "$target: an anchor into a file that is not Markdown";
				next;
			}
			push @bad, "$target: no such anchor in " . File::Spec->abs2rel(abs_path($path), $top)
			  unless anchors(abs_path($path))->{$anchor};
		}
	}
	is_deeply(\@bad, [], "$page: every relative link and anchor resolves")
	  or diag join("\n", @bad);
}
cmp_ok($links, '>', 100, "links checked: $links");

# The files a user is told to run or load (`bash demo/run.sh`,
# `monitoring/lockfence-alerts.yml`) exist: every repository path in a code
# span of these pages (the other pages also name paths of PostgreSQL's
# source tree and placeholders).
my @path_pages = ('README.md', map { "docs/$_.md" }
	  qw(README installation fencing leases protect etcd etcd-reference reference
	  monitoring runbook ha operations security upgrading limitations contributing));
for my $page (@path_pages)
{
	my $text = read_text("$top/$page");
	next unless defined $text;
	my @missing;
	for my $span ($text =~ /`([^`\n]+)`/g)
	{
		for my $p ($span =~ m{(?<![\w/.-])((?:demo|test|scripts|monitoring|docs|bench|fuzz|src)/[A-Za-z0-9_./-]+)}g)
		{
			$p =~ s/\.$//;
			push @missing, $p unless -e "$top/$p";
		}
	}
	is_deeply(\@missing, [], "$page: every repository path it names exists")
	  or diag join("\n", @missing);
}

done_testing();
