# Copyright: the lockfence authors
#
# 99_call_graph.pl
#	  No call cycle between the files of src/ (docs/internals.md, "Map of
#	  the source"), and no function of src/ over 80 lines without a comment
#	  that says why (issue 19, item 4).
#
# Runs scripts/call-graph.sh on the object files of the tree the TAP run
# uses (test/run-all.sh runs the TAP files inside its built copy, and make
# installcheck in the built tree, so src/*.o are there).  It builds
# nothing: without object files it fails, saying so, rather than passing
# on an unbuilt tree.  No server is needed.

use strict;
use warnings;

use File::Basename qw(dirname);
use Test::More;

my $top = dirname(__FILE__) . '/../..';
my @objs = glob("$top/src/*.o");

ok(@objs > 0, "the tree is built: object files in $top/src")
  or diag("no src/*.o under $top: run make first (this test reads the "
	  . "built objects and builds nothing itself)");

SKIP:
{
	skip 'no object files to read', 2 unless @objs;

	my $out = `bash "$top/scripts/call-graph.sh" "$top/src" 2>&1`;
	my $rc = $? >> 8;
	is($rc, 0, 'scripts/call-graph.sh finds no call cycle between files')
	  or diag($out);
	like($out, qr/^no cycle between \d+ files$/m,
		'scripts/call-graph.sh read the graph');
}

# Functions over 80 lines, from the name line to the closing brace, in
# PostgreSQL's layout (name at the start of a line, braces alone at the
# start of theirs).  Each must say why it is kept whole in the comment
# before it, with the marker "(Over 80 lines, kept whole: ...)".
my $max_lines = 80;
my @src = glob("$top/src/*.c");
ok(@src > 0, "the sources are here: $top/src/*.c");
my @unexplained;
my $n_long = 0;
for my $file (@src)
{
	open(my $fh, '<', $file) or die "$file: $!";
	my @lines = <$fh>;
	close($fh);
	my ($name, $start, $in_body, $before) = (undef, 0, 0, '');
	my $text = '';    # since the end of the previous function
	for my $i (0 .. $#lines)
	{
		my $l = $lines[$i];
		if (!$in_body && $l =~ /^(\w+)\(/)
		{
			($name, $start, $before) = ($1, $i, $text);
		}
		elsif (!$in_body && defined $name && $l =~ /^\{/)
		{
			$in_body = 1;
		}
		elsif (!$in_body && defined $name && $l =~ /;\s*$/)
		{
			undef $name;    # a prototype, not a definition
		}
		elsif ($in_body && $l =~ /^\}/)
		{
			my $n = $i - $start + 1;
			if ($n > $max_lines)
			{
				$n_long++;
				push @unexplained, "$file: $name ($n lines)"
				  unless $before =~ /\(Over 80 lines, kept whole:/;
			}
			($name, $in_body, $text) = (undef, 0, '');
			next;
		}
		$text .= $l unless $in_body;
	}
}
is(join("\n", @unexplained), '',
	"every function of src/ over $max_lines lines ($n_long) says why in its comment");

done_testing();
