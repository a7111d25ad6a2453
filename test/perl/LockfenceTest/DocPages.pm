
=pod

=head1 NAME

LockfenceTest::DocPages - the documentation pages and their code blocks,
read once for the tests that run them (95_doc_shell.pl: shell blocks,
97_doc_examples.pl: SQL blocks).

=head1 SYNOPSIS

  use LockfenceTest::DocPages;

  for my $page (LockfenceTest::DocPages::pages($top))
  {
      for my $b (LockfenceTest::DocPages::blocks($top, $page))
      {
          # $b->{info}, $b->{rest}, $b->{line}, $b->{body}, $b->{not_run},
          # $b->{hidden}
      }
  }

=cut

package LockfenceTest::DocPages;

use strict;
use warnings;

use File::Basename qw(basename);

=pod

=head1 FUNCTIONS

=over

=item pages(top)

The pages a user reads: README.md, then docs/*.md by name, as paths
relative to the repository's top folder.

=cut

sub pages
{
	my ($top) = @_;
	return ('README.md', map { 'docs/' . basename($_) } sort glob("$top/docs/*.md"));
}

=pod

=item blocks(top, page)

The code blocks of a page, in page order, each a hash:

  info     the fence's info word (sh-test, sql, ...)
  rest     the rest of the fence line (sh-test's needs=, sql-test's etcd)
  line     the line number of the fence
  body     [ its lines, the fence's indent taken off ]
  not_run  true when the last non-blank line before it is an HTML comment
           "<!-- not run: why -->"
  hidden   true for an HTML comment block "<!-- sql-test ..." ... "-->"
           (SQL a page runs but does not show; info is "sql-test")

=cut

sub blocks
{
	my ($top, $page) = @_;
	open my $fh, '<', "$top/$page" or die "$page: $!";
	my @lines = <$fh>;
	close $fh;
	chomp @lines;
	my @blocks;
	my $prev = '';
	for (my $i = 0; $i < @lines; $i++)
	{
		my $l = $lines[$i];
		if ($l =~ /^(\s*)```(\S*)\s*(.*)$/)
		{
			my ($indent, $info, $rest) = ($1, $2, $3);
			my %b = (info => $info, rest => $rest, line => $i + 1,
				not_run => $prev =~ /^\s*<!--\s*not run:.+-->\s*$/ ? 1 : 0);
			my @body;
			for ($i++; $i < @lines && $lines[$i] !~ /^\s*```\s*$/; $i++)
			{
				(my $b = $lines[$i]) =~ s/^\Q$indent\E//;
				push @body, $b;
			}
			push @blocks, { %b, body => \@body };
			$prev = '```';
			next;
		}
		if ($l =~ /^\s*<!--\s*sql-test\b(.*)$/ && $l !~ /-->/)
		{
			my %b = (info => 'sql-test', rest => $1, line => $i + 1,
				not_run => 0, hidden => 1);
			my @body;
			for ($i++; $i < @lines && $lines[$i] !~ /^\s*-->\s*$/; $i++)
			{
				push @body, $lines[$i];
			}
			push @blocks, { %b, body => \@body };
			$prev = '-->';
			next;
		}
		$prev = $l if $l =~ /\S/;
	}
	return @blocks;
}

=pod

=back

=cut

1;
