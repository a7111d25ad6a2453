# Copyright: the lockfence authors
#
# 99_call_graph.pl
#	  No call cycle between the files of src/ (docs/internals.md, "Map of
#	  the source").
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

done_testing();
