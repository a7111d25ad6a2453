# Every SQL example of the documentation runs, and gives what the page
# says it gives (issue 20, item 3).  The shell commands are
# test/t/95_doc_shell.pl's.
#
# The convention (also in docs/contributing.md, "Examples in the
# documentation"):
#
# - A fenced block ```sql-test in README.md or docs/*.md is run; so is a
#   hidden block "<!-- sql-test" ... "-->" (setup a reader need not see).
#   "sql-test etcd" marks a block that needs etcd: lockfence.etcd_endpoints
#   points at a real etcd started here.
# - The blocks of one page run in order, in one psql session, in a fresh
#   database of their own, as a superuser; the extension is created first
#   unless the page's first block creates it.  The roles app, app_role,
#   ops_admin and monitor exist.
# - A statement ends with ";" at the end of a line (outside $$ quotes and
#   comments) or with a psql meta-command such as \gset; psql variables
#   work (:'key', :lease).
# - After a statement (on its line or the lines below it) a comment says
#   what it gives:
#     -- returns: VALUE     one output row, columns joined by "|"; one
#                           such line per row; "(no rows)" for none
#     -- ERROR:  SQLSTATE: message   the statement fails with this
#                           SQLSTATE (and message, if given)
#     -- DETAIL:  / -- HINT:  / -- CONTEXT:  text   lines of that error
#   "..." in a value or message matches any text.  A statement without
#   "-- ERROR:" must succeed.
# - A ```sql block is not run; the line before it must be an HTML
#   comment "<!-- not run: why -->".

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::DocPages;
use LockfenceTest::EtcdCluster;
use LockfenceTest::Node qw(init_node);

my $top = abs_path(dirname(__FILE__) . '/../..');

# Pages whose ```sql blocks belong to other work and are not yet marked;
# their sql-test blocks still run.
my %unmarked_ok = map { $_ => 1 } qw();

my @pages = LockfenceTest::DocPages::pages($top);

# A page's blocks that run: { line, sql, etcd, hidden }.  Also returns the
# ```sql blocks that lack a "not run" reason.
sub read_page
{
	my ($page) = @_;
	my (@blocks, @unmarked);
	for my $b (LockfenceTest::DocPages::blocks($top, $page))
	{
		if ($b->{info} eq 'sql-test')
		{
			push @blocks, { line => $b->{line}, sql => $b->{body},
				etcd => ($b->{rest} =~ /\betcd\b/ ? 1 : 0),
				$b->{hidden} ? (hidden => 1) : () };
		}
		elsif ($b->{info} eq 'sql' && !$b->{not_run})
		{
			push @unmarked, $b->{line};
		}
	}
	return (\@blocks, \@unmarked);
}

# Split a block into statements: { line, text, expect => { returns =>
# [...], error => [state, message], lines => [[kind, text]...] } }.
sub statements
{
	my ($block) = @_;
	my (@stmts, $cur, $last);
	my $in_dollar = 0;
	my $n = $block->{line};
	for my $l (@{ $block->{sql} })
	{
		$n++;
		# An expectation comment belongs to the statement being read, or,
		# on a line of its own, to the one just ended.
		my $exp;
		if ($l =~ /--\s*(returns|ERROR|DETAIL|HINT|CONTEXT):\s*(.*?)\s*$/)
		{
			$exp = [ $1, $2 ];
		}
		my $code = $l;
		$code =~ s/--.*$// unless $in_dollar;
		# A "--" inside a string literal is not a comment: keep the line
		# whole when the quotes before it are unbalanced.
		if (!$in_dollar && $l =~ /^(.*?)--/ && (($1 =~ tr/'//) % 2))
		{
			$code = $l;
			$exp = undef;
		}
		if ($code =~ /\S/ || $in_dollar)
		{
			$cur //= { line => $n, text => '', expect => {} };
			$cur->{text} .= "$l\n";
			$in_dollar = !$in_dollar for ($code =~ /\$\$/g);
			if (!$in_dollar && ($code =~ /;\s*$/ || $code =~ /^\s*\\/ || $code =~ /\\g\w*\s*\S*\s*$/))
			{
				add_expect($cur, $exp) if $exp;
				push @stmts, $cur;
				$last = $cur;
				undef $cur;
				next;
			}
		}
		next unless $exp;
		add_expect($cur // $last, $exp)
		  or die "$block->{line}: expectation before any statement: $l";
	}
	die "block at line $block->{line}: statement without end: $cur->{text}" if $cur;
	return @stmts;
}

sub add_expect
{
	my ($s, $exp) = @_;
	return 0 unless $s;
	my ($kind, $text) = @$exp;
	$text =~ s/\s+--\s.*$// if $kind eq 'returns';
	if ($kind eq 'returns')
	{
		push @{ $s->{expect}{returns} }, $text eq '(no rows)' ? () : $text;
		$s->{expect}{has_returns} = 1;
	}
	elsif ($kind eq 'ERROR')
	{
		$text =~ /^([0-9A-Z]{5})(?::\s*(.*))?$/
		  or die "line $s->{line}: -- ERROR: needs a SQLSTATE: $text";
		$s->{expect}{error} = [ $1, $2 ];
	}
	else
	{
		push @{ $s->{expect}{lines} }, [ $kind, $text ];
	}
	return 1;
}

# "..." matches anything; the rest literally.
sub pattern
{
	my ($text) = @_;
	return join('.*', map { quotemeta } split /\.\.\./, $text, -1);
}

my (%pages_blocks, $need_etcd);
for my $page (@pages)
{
	my ($blocks, $unmarked) = read_page($page);
	$pages_blocks{$page} = $blocks;
	$need_etcd ||= grep { $_->{etcd} } @$blocks;
	if (!$unmarked_ok{$page})
	{
		is_deeply($unmarked, [],
			"$page: every ```sql block that is not run says why (<!-- not run: ... -->)");
	}
}

my $etcd;
my $conf = "shared_preload_libraries = 'lockfence'\n";
if ($need_etcd)
{
	$etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'docs');
	$etcd->start;
	$conf .= "lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n";
}
my $node = PostgreSQL::Test::Cluster->new('doc_examples');
init_node($node);
$node->append_conf('postgresql.conf', $conf);
$node->start;
$node->safe_psql('postgres',
	'CREATE ROLE app; CREATE ROLE app_role; CREATE ROLE ops_admin; CREATE ROLE monitor');

my $dbno = 0;
for my $page (@pages)
{
	my @blocks = @{ $pages_blocks{$page} };
	next unless @blocks;
	my $db = 'doc_' . ++$dbno;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	my $creates = join("\n", @{ $blocks[0]{sql} }) =~ /CREATE EXTENSION lockfence/i;
	$node->safe_psql($db, 'CREATE EXTENSION lockfence') unless $creates;

	my @stmts;
	for my $b (@blocks)
	{
		push @stmts, map { { %$_, etcd => $b->{etcd} } } statements($b);
	}
	my $script = "\\set VERBOSITY verbose\n\\set SHOW_CONTEXT errors\n";
	for my $i (0 .. $#stmts)
	{
		$script .= "\\echo \@\@LF_STMT $i\n\\warn \@\@LF_STMT $i\n$stmts[$i]{text}";
	}
	$script .= "\\echo \@\@LF_STMT end\n\\warn \@\@LF_STMT end\n";
	my ($out, $err) = ('', '');
	$node->psql($db, $script, stdout => \$out, stderr => \$err,
		on_error_stop => 0, timeout => 300);
	my %out = split_by_marker($out);
	my %err = split_by_marker($err);
	ok(exists $out{end} && exists $err{end}, "$page: every example ran to the end")
	  or diag "stdout:\n$out\nstderr:\n$err";

	for my $i (0 .. $#stmts)
	{
		my $s = $stmts[$i];
		my ($sql) = $s->{text} =~ /^\s*(.*?)\s*$/s;
		$sql =~ s/\s+/ /g;
		$sql = substr($sql, 0, 70) . '...' if length $sql > 73;
		my $name = "$page:$s->{line}: $sql";
		my $o = $out{$i} // '';
		my $e = $err{$i} // '';
		$o =~ s/\n+\z//;
		my $e_exp = $s->{expect}{error};
		my ($state, $msg) = $e =~ /ERROR:\s+([0-9A-Z]{5}):\s+([^\n]*)/;
		my @problems;
		if ($e_exp)
		{
			if (!defined $state)
			{
				push @problems, "expected ERROR $e_exp->[0], got none";
			}
			elsif ($state ne $e_exp->[0])
			{
				push @problems, "expected ERROR $e_exp->[0], got $state: $msg";
			}
			elsif (defined $e_exp->[1] && $e_exp->[1] ne ''
				&& $msg !~ /^${\ pattern($e_exp->[1]) }$/)
			{
				push @problems, "expected message \"$e_exp->[1]\", got \"$msg\"";
			}
			for my $line (@{ $s->{expect}{lines} // [] })
			{
				my ($kind, $text) = @$line;
				push @problems, "expected $kind:  $text\n  in:\n$e"
				  unless $e =~ /^$kind:\s+${\ pattern($text) }$/m;
			}
		}
		elsif ($e =~ /(ERROR|FATAL|PANIC):/)
		{
			push @problems, "failed:\n$e";
		}
		if ($s->{expect}{has_returns})
		{
			my @want = @{ $s->{expect}{returns} };
			my $want_re = join("\n", map { pattern($_) } @want);
			push @problems, "expected returns:\n" . join("\n", @want)
			  . "\ngot:\n$o"
			  unless $o =~ /^$want_re$/s;
		}
		ok(!@problems, $name) or diag join("\n", @problems);
	}
}

# psql output split at the markers: statement number => text.
sub split_by_marker
{
	my ($text) = @_;
	my %r;
	my $key;
	for my $l (split /(?<=\n)/, $text)
	{
		if ($l =~ /^\@\@LF_STMT (\S+)\s*$/)
		{
			$key = $1;
			$r{$key} = '';
			next;
		}
		$r{$key} .= $l if defined $key;
	}
	return %r;
}

$node->stop;
$etcd->stop if $etcd;
done_testing();
