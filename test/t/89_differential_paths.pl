
# The two write paths give the same outcomes (issue 18, item 4).
#
# Fence checks and lease writes are served by a heap fast path
# (src/fence_fastpath.c, src/lease_fastpath.c) when uncontended, and by
# SPI statements (src/fence_store.c, src/lease.c) otherwise.  The rules are
# meant to be one.  This test drives 3 or 4 sessions through one random
# script of fence(), try_fence(), their array forms, the four lease
# functions, raise_floor() (named resources and global), reset(), writes
# to a protected table through its trigger, reads, BEGIN / COMMIT /
# ROLLBACK (some REPEATABLE READ), savepoints (SAVEPOINT, ROLLBACK TO,
# RELEASE) and statements in aborted transactions, against two databases
# of one cluster: one as deployed, one with the test-only setting
# lockfence.debug_disable_fastpath (ALTER DATABASE ... SET), which sends
# every check and lease write through the statements.  Every step's
# outcome (its rows, or its SQLSTATE with message, detail, hint and
# context, timestamps normalized; a lease's expiry as the number of ten
# minutes from the transaction's start) must be the same in both, and so must
# the final rows of lockfence.fences, lockfence.floor_state and the
# protected table (also compared every 1000 steps).
#
# The script.  One seeded generator (LOCKFENCE_DIFF_SEED, printed; its own
# xorshift, so a seed means the same script on any perl) picks each step,
# which is then run in both databases by the same session number, one
# after the other.  The generator looks at the outcome of the steps
# before (those of the database with the fast path; until a difference
# they are the same): whether a session's transaction is aborted (so that
# most steps do not just collect 25P02), which lease tokens were granted
# (renewed, released and fenced with, and with wrong tokens and holders),
# and the highest token seen per name (new tokens are drawn within 2 of
# it, so equal, lower, higher tokens and floors meet often).  So the
# script is a function of the seed and of the outcomes, the same for both
# databases; a rerun with the same seed on the same code replays it.  A
# fixed script drawn up front could not know when a transaction aborted
# or which token a grant gave.  LOCKFENCE_DIFF_OPS (default 10000) is the
# number of steps, over all sessions; the steps with their outcomes are
# written to tmp_check/89_differential_ops.txt.
#
# No waits between sessions.  The steps run one at a time, so a session
# that waited for another's row lock would stall the script.  Each name
# touched by a session's open transaction (by any step but a read) is
# reserved for that session until the transaction ends; other sessions
# then only read it, or call lease_try_acquire() on it outside a
# transaction (which never waits: SKIP LOCKED, and a 1 ms lock_timeout
# for a first grant in progress, in either path) - the contention the
# test can have without blocking.  A global raise_floor() runs only while
# no other session has reserved anything, and reserves everything (its
# LOCK TABLE lockfence.floor_state conflicts with a first fence).  Every
# session has lock_timeout = 100ms as a safety net: a lock timeout would be
# a flaw of this design, and the test asserts there was none.  lease_acquire
# is called with wait_timeout => '0', and TTLs are an hour, so no outcome
# depends on the clock.
#
# That the switch works: with the fast path, a release writes the row in
# the transaction itself; through the statements in an internal
# subtransaction, under another xid.  (An equal-token fence locks no row
# on either path since 1.4.)  So xmax (xmin) of the row equals pg_current_xact_id() in
# one database and not in the other.  The switch is checked in one place,
# fence_fastpath_find(), the way into every fast path.
#
# What a difference can show.  A fast path only ever accepts or writes;
# anything else falls back to the statements, so a rejection is worded by
# the same code in both databases.  What differs between them is who
# decides the uncontended cases: a fast path accepting or writing what the
# statements would refuse or write otherwise, or the statements refusing
# what the fast path accepts, changes a step's outcome or the rows.
#
# That the run tested something: counts of each kind of outcome (LF001,
# LF002, LF003, try_fence false, lease_try_acquire refused, rolled-back
# savepoints, floors that raised rows, ...) must be above zero.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use IPC::Run;

use LockfenceTest::EtcdCluster;    # pg_node only; no etcd here

my $seed = $ENV{LOCKFENCE_DIFF_SEED} // 20261202;
my $nops = $ENV{LOCKFENCE_DIFF_OPS} // 10000;
die "LOCKFENCE_DIFF_SEED must be a positive integer" unless $seed =~ /^[0-9]+$/ && $seed > 0;
die "LOCKFENCE_DIFF_OPS must be a positive integer" unless $nops =~ /^[0-9]+$/ && $nops > 0;

# xorshift32: the same sequence on every perl.
my $rng = ($seed % 4294967295) || 1;
sub rnd    # an integer in [0, n)
{
	my ($n) = @_;
	$rng ^= ($rng << 13) & 0xffffffff;
	$rng ^= $rng >> 17;
	$rng ^= ($rng << 5) & 0xffffffff;
	return $rng % $n;
}
sub pick { return $_[ rnd(scalar @_) ]; }

my $nsessions = $ENV{LOCKFENCE_DIFF_SESSIONS} // 3 + rnd(2);
note("seed $seed (LOCKFENCE_DIFF_SEED=$seed replays it), $nops steps, "
	  . "$nsessions sessions");

# No autovacuum: a VACUUM or ANALYZE of lockfence.fences,
# lockfence.floor_state or prot holds SHARE UPDATE EXCLUSIVE, which
# raise_floor()'s LOCK TABLE lockfence.floor_state (SHARE ROW EXCLUSIVE)
# waits for, and its truncation of empty pages at the end briefly holds
# ACCESS EXCLUSIVE, which every step on the table waits for: either can
# outlast the sessions' lock_timeout of 100 ms on a loaded machine (a
# blocked backend cancels an autovacuum worker only after deadlock_timeout,
# 1 s), a lock timeout that is no flaw of the steps' design.
my $node = LockfenceTest::EtcdCluster::pg_node('diffpaths',
	"shared_preload_libraries = 'lockfence'\nautovacuum = off\n");

my %path = (fast => 'diff_fast', stmt => 'diff_stmt');
for my $db (values %path)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, q{
		CREATE EXTENSION lockfence;
		CREATE TABLE prot (id int PRIMARY KEY, res text NOT NULL,
						   tok bigint, val int NOT NULL);
		SELECT lockfence.protect('prot', resource_column => 'res',
								 token_column => 'tok');
	});
	$node->safe_psql('postgres',
		"ALTER DATABASE $db SET lock_timeout = '100ms'");
}
$node->safe_psql('postgres',
	"ALTER DATABASE $path{stmt} SET lockfence.debug_disable_fastpath = on");

# --- sessions: psql over a pipe, one statement per round trip ----------------

my $psql = $node->installed_command('psql');
my $marker_n = 0;

sub session
{
	my ($db) = @_;
	my $s = { in => '', out => '', err => '', db => $db };
	$s->{run} = IPC::Run::start(
		[ $psql, '-XAtq', '-v', 'VERBOSITY=verbose', '-d', $node->connstr($db),
			'-f', '-' ],
		'<', \$s->{in}, '>', \$s->{out}, '2>', \$s->{err});
	my $r = run_sql($s, 'SHOW lockfence.debug_disable_fastpath;');
	die "session setup failed: $r->{err}" if $r->{err} ne '';
	$s->{switch} = $r->{out};
	return $s;
}

# Run sql in session s; returns { out, err } (err: the stderr lines).
sub run_sql
{
	my ($s, $sql) = @_;
	my $m = 'LF_DIFF_' . ++$marker_n;
	$s->{in} .= "$sql\n\\echo $m\n\\warn $m\n";
	my $deadline = time + 120;
	until ($s->{out} =~ /^$m\n/m && $s->{err} =~ /^$m\n/m)
	{
		die "no answer within 120 s to: $sql" if time > $deadline;
		$s->{run}->pump;
	}
	my ($out, $err) = ($s->{out}, $s->{err});
	$out =~ s/^$m\n.*//ms;
	$err =~ s/^$m\n.*//ms;
	$s->{out} = $s->{err} = '';
	chomp $out;
	return { out => $out, err => $err };
}

# The comparable form of an outcome: rows, or the error without LOCATION,
# wall-clock timestamps normalized.
my $ts_re = qr/\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d(?::\d\d)?)?/;
sub outcome
{
	my ($r) = @_;
	my @err = grep { !/^LOCATION:/ } map { s/^psql:<stdin>:\d+: //r }
	  split /\n/, $r->{err};
	my $text = join("\n", $r->{out}, @err);
	$text =~ s/$ts_re/<ts>/g;
	my ($state) = $text =~ /^(?:ERROR|FATAL|PANIC):\s+([0-9A-Z]{5}):/m;
	return ($text, $state);
}

# --- the switch works ---------------------------------------------------------

my %probe;
for my $p (sort keys %path)
{
	my $c = session($path{$p});
	is($c->{switch}, $p eq 'stmt' ? 'on' : 'off',
		"$p: lockfence.debug_disable_fastpath is " . ($p eq 'stmt' ? 'on' : 'off'));
	run_sql($c, "SELECT lockfence.fence('probe', 5);");
	my $r = run_sql($c, "BEGIN; SELECT lockfence.fence('probe', 5);"
		  . " SELECT xmax = pg_current_xact_id()::xid FROM lockfence.fences"
		  . " WHERE resource = 'probe'; COMMIT;");
	$probe{$p}{fence} = $r->{out} . $r->{err};
	run_sql($c, "SELECT lockfence.lease_try_acquire('probe_lease', '1 hour');");
	$r = run_sql($c, "BEGIN; SELECT lockfence.lease_release('probe_lease', 1);"
		  . " SELECT xmin = pg_current_xact_id()::xid FROM lockfence.fences"
		  . " WHERE resource = 'probe_lease'; COMMIT;");
	$probe{$p}{lease} = $r->{out} . $r->{err};
	run_sql($c, "SELECT lockfence.reset('probe'), lockfence.reset('probe_lease');");
	$c->{in} .= "\\q\n";
	$c->{run}->finish;
}
# Since 1.4 an equal-token fence locks no row on either path (the resource
# lock, src/fence_lock.c): only the release tells the paths apart.
is($probe{fast}{fence}, "5\nf", 'fast path: an equal token locks no row');
is($probe{stmt}{fence}, "5\nf", 'switch on: an equal token locks no row either');
is($probe{fast}{lease}, "t\nt", 'fast path: a release writes the row in the transaction itself');
is($probe{stmt}{lease}, "t\nf", 'switch on: it writes it in an internal subtransaction (the statements)');

# --- the script -----------------------------------------------------------------

my @names = map { "r$_" } 1 .. 5;
my @holders = (undef, 'h1', 'h2');
my %hint = map { $_ => 10 } @names;    # highest token seen per name
my %leases;                            # name => [ [token, holder], ... ]

my @sess;
for my $i (0 .. $nsessions - 1)
{
	push @sess, {
		id => $i + 1,
		fast => session($path{fast}),
		stmt => session($path{stmt}),
		in_txn => 0,
		aborted => 0,
		sp => [],
		spn => 0,
		reserved => {},
		global => 0,
		fenced => {},    # name => token fenced in this transaction
	};
}

sub reserved_by_others
{
	my ($s) = @_;
	my (%r, $global);
	for my $o (@sess)
	{
		next if $o == $s;
		$global ||= $o->{global};
		$r{$_} = 1 for keys %{ $o->{reserved} };
	}
	return ($global, \%r);
}

sub q_name { return "'$_[0]'"; }
sub q_holder { return defined $_[0] ? "'$_[0]'" : 'NULL'; }

sub token_near
{
	my ($n) = @_;
	my $t = $hint{$n} + rnd(5) - 2;
	return $t < 0 ? 0 : $t;
}

# (token, holder) to present for name n: a known lease's (right or wrong
# holder), one fenced in this transaction, or one near the highest seen.
sub token_for
{
	my ($s, $n) = @_;
	my $r = rnd(100);
	if ($r < 30 && @{ $leases{$n} // [] })
	{
		my ($t, $h) = @{ rnd(10) < 7 ? $leases{$n}[0] : pick(@{ $leases{$n} }) };
		return ($t, rnd(4) ? $h : pick(@holders));
	}
	if ($r < 45 && exists $s->{fenced}{$n})
	{
		return ($s->{fenced}{$n}, pick(@holders));
	}
	return (token_near($n), pick(@holders));
}

sub lease_token
{
	my ($n) = @_;
	my @l = @{ $leases{$n} // [] };
	return token_near($n) unless @l && rnd(8);
	my $t = rnd(10) < 7 ? $l[0][0] : (pick(@l))->[0];
	return rnd(6) ? $t : $t + pick(-1, 1);
}

sub lease_state_sql
{
	return "CASE WHEN lease_expires_at IS NULL THEN 'none'"
	  . " WHEN lease_expires_at = '-infinity' THEN 'released'"
	  . " WHEN lease_expires_at > now() + interval '50 min' THEN 'held'"
	  . " ELSE 'other' END";
}

# Choose the next step of session s: (kind, sql, names it touches).
sub choose_step
{
	my ($s) = @_;
	my ($others_global, $others) = reserved_by_others($s);
	my @free = $others_global ? () : grep { !$others->{$_} } @names;
	my @mine = grep { $s->{reserved}{$_} } @free;
	my $name = sub { return (@mine && rnd(2)) ? pick(@mine) : pick(@free); };

	if ($s->{in_txn} && $s->{aborted} && rnd(10))
	{
		my $r = rnd(100);
		return ('rollback_to', 'ROLLBACK TO SAVEPOINT ' . pick(@{ $s->{sp} }) . ';')
		  if @{ $s->{sp} } && $r < 55;
		return ('commit', 'COMMIT;') if $r > 90;
		return ('rollback', 'ROLLBACK;');
	}
	if (!$s->{in_txn} && rnd(100) < 25)
	{
		return ('begin', rnd(5) ? 'BEGIN;' : 'BEGIN ISOLATION LEVEL REPEATABLE READ;');
	}
	if ($s->{in_txn})
	{
		my $r = rnd(100);
		return ('commit', 'COMMIT;') if $r < 7;
		return ('rollback', 'ROLLBACK;') if $r < 10;
		if ($r < 16)
		{
			my $sp = 'sp' . ++$s->{spn};
			return ('savepoint', "SAVEPOINT $sp;", undef, $sp);
		}
		return ('rollback_to', 'ROLLBACK TO SAVEPOINT ' . pick(@{ $s->{sp} }) . ';')
		  if $r < 21 && @{ $s->{sp} };
		return ('release', 'RELEASE SAVEPOINT ' . pick(@{ $s->{sp} }) . ';')
		  if $r < 24 && @{ $s->{sp} };
	}

	my @kinds = (
		(('fence') x 14), (('try_fence') x 12), (('fence_array') x 6),
		(('try_fence_array') x 6), (('lease_acquire') x 5),
		(('lease_try_acquire') x 8), (('lease_renew') x 6),
		(('lease_release') x 5), (('raise_floor') x 3), (('prot_upsert') x 8),
		(('prot_update') x 3), (('prot_delete') x 2), (('read') x 4),
		(('current_token') x 2), 'reset');
	push @kinds, 'lease_try_contended', 'lease_try_contended', 'lease_try_contended'
	  unless $s->{in_txn};
	push @kinds, 'raise_floor_global' if rnd(4) == 0;
	my $kind = pick(@kinds);

	if ($kind eq 'lease_try_contended')
	{
		my @busy = grep { $others->{$_} } @names;
		$kind = 'lease_try_acquire' unless @busy && !$others_global;
		if (@busy && !$others_global)
		{
			my $n = pick(@busy);
			my $h = pick(@holders);
			return ('lease_try_contended',
				"SELECT token, round(extract(epoch FROM expires_at - now()) / 600)"
				  . " FROM lockfence.lease_try_acquire('$n', '1 hour', "
				  . q_holder($h) . ');', undef, $n, $h);
		}
	}
	if ($kind eq 'raise_floor_global')
	{
		$kind = 'raise_floor' if keys %$others || $others_global;
	}

	$kind = 'read'
	  if !@free && $kind ne 'read' && $kind ne 'current_token';
	my $n = @free ? $name->() : pick(@names);
	if ($kind eq 'fence' || $kind eq 'try_fence')
	{
		my ($t, $h) = token_for($s, $n);
		my $hs = defined $h || rnd(2) ? ', ' . q_holder($h) : '';
		return ($kind, "SELECT lockfence.$kind('$n', $t$hs);", [$n], $t);
	}
	if ($kind eq 'fence_array' || $kind eq 'try_fence_array')
	{
		my %set = map { $_ => 1 } map { $name->() } 1 .. 2 + rnd(2);
		my @set = sort keys %set;
		push @set, $set[0] if rnd(5) == 0;    # a duplicate
		@set = reverse @set if rnd(2);
		my ($t, $h) = token_for($s, pick(@set));
		my $f = $kind eq 'fence_array' ? 'fence' : 'try_fence';
		my $arr = 'ARRAY[' . join(', ', map { "'$_'" } @set) . ']';
		return ($kind, "SELECT lockfence.$f($arr, $t, " . q_holder($h) . ');',
			[ keys %set ], $t);
	}
	if ($kind eq 'lease_acquire' || $kind eq 'lease_try_acquire')
	{
		my $h = pick(@holders);
		my $wait = $kind eq 'lease_acquire' ? ", wait_timeout => '0'" : '';
		return ($kind,
			"SELECT token, round(extract(epoch FROM expires_at - now()) / 600)"
			  . " FROM lockfence.$kind('$n', '1 hour', " . q_holder($h)
			  . "$wait);", [$n], $n, $h);
	}
	if ($kind eq 'lease_renew')
	{
		my $t = lease_token($n);
		my $ttl = rnd(2) ? '' : ", '2 hours'";
		return ($kind,
			"SELECT round(extract(epoch FROM lockfence.lease_renew('$n', $t$ttl) - now()) / 600);",
			[$n]);
	}
	if ($kind eq 'lease_release')
	{
		return ($kind, "SELECT lockfence.lease_release('$n', " . lease_token($n) . ');',
			[$n]);
	}
	if ($kind eq 'raise_floor')
	{
		my %set = map { $_ => 1 } map { $name->() } 1 .. 1 + rnd(2);
		my $f = token_near($n) + rnd(2);
		my $arr = 'ARRAY[' . join(', ', map { "'$_'" } sort keys %set) . ']';
		return ($kind, "SELECT lockfence.raise_floor($f, $arr);", [ keys %set ], $f);
	}
	if ($kind eq 'raise_floor_global')
	{
		my $f = token_near($n) - 1;
		$f = 0 if $f < 0;
		return ($kind, "SELECT lockfence.raise_floor($f);", 'all', $f);
	}
	my ($idx) = $n =~ /(\d+)/;
	my $id = $idx * 10 + 1 + rnd(3);
	if ($kind eq 'prot_upsert')
	{
		my ($t) = token_for($s, $n);
		$t = 'NULL' if rnd(10) == 0;
		return ($kind,
			"INSERT INTO prot AS p (id, res, tok, val) VALUES ($id, '$n', $t, 1)"
			  . " ON CONFLICT (id) DO UPDATE SET tok = excluded.tok, val = p.val + 1"
			  . " RETURNING id, tok, val;", [$n], $t);
	}
	if ($kind eq 'prot_update')
	{
		return ($kind, "UPDATE prot SET val = val + 1 WHERE id = $id RETURNING id, tok, val;",
			[$n]);
	}
	if ($kind eq 'prot_delete')
	{
		return ($kind, "DELETE FROM prot WHERE id = $id RETURNING id;", [$n]);
	}
	if ($kind eq 'reset')
	{
		return ($kind, "SELECT lockfence.reset('$n');", [$n]);
	}
	$n = pick(@names);
	if ($kind eq 'current_token')
	{
		return ($kind, "SELECT lockfence.current_token('$n');");
	}
	return ('read',
		"SELECT token, holder, " . lease_state_sql()
		  . ", lease_ttl FROM lockfence.fences WHERE resource = '$n';");
}

sub end_txn
{
	my ($s) = @_;
	$s->{in_txn} = $s->{aborted} = $s->{global} = 0;
	$s->{sp} = [];
	$s->{spn} = 0;
	$s->{reserved} = {};
	$s->{fenced} = {};
}

# What the generator learns from a step's outcome (the fast database's).
sub learn
{
	my ($s, $kind, $touch, $arg1, $arg2, $r, $state) = @_;
	if ($s->{in_txn} && ref $touch)
	{
		$s->{reserved}{$_} = 1 for @$touch;
	}
	$s->{global} = 1 if $s->{in_txn} && defined $touch && $touch eq 'all';

	if ($kind eq 'begin')
	{
		$s->{in_txn} = 1 unless defined $state;
		return;
	}
	if ($kind eq 'commit' || $kind eq 'rollback')
	{
		end_txn($s);
		return;
	}
	if (defined $state)
	{
		$s->{aborted} = 1 if $s->{in_txn};
		return;
	}
	if ($kind eq 'savepoint')
	{
		push @{ $s->{sp} }, $arg1;
		return;
	}
	if ($kind eq 'rollback_to' || $kind eq 'release')
	{
		my ($sp) = $r->{sql} =~ /SAVEPOINT (sp\d+)/;
		my @keep;
		for (@{ $s->{sp} })
		{
			last if $_ eq $sp && $kind eq 'release';
			push @keep, $_;
			last if $_ eq $sp;
		}
		$s->{sp} = \@keep;
		$s->{aborted} = 0 if $kind eq 'rollback_to';
		return;
	}
	if (($kind eq 'fence' || $kind eq 'fence_array')
		|| (($kind eq 'try_fence' || $kind eq 'try_fence_array') && $r->{out} eq 't'))
	{
		for (@$touch)
		{
			$s->{fenced}{$_} = $arg1 if $s->{in_txn};
			$hint{$_} = $arg1 if $arg1 > $hint{$_};
		}
		return;
	}
	if ($kind =~ /^lease_(try_)?acquire$|^lease_try_contended$/ && $r->{out} =~ /^(\d+)\|/)
	{
		my ($t, $n) = ($1, ref $touch ? $touch->[0] : $arg1);
		unshift @{ $leases{$n} }, [ $t, $arg2 ];
		splice @{ $leases{$n} }, 3;
		$hint{$n} = $t if $t > $hint{$n};
		return;
	}
	if ($kind eq 'raise_floor' || $kind eq 'raise_floor_global')
	{
		for (ref $touch ? @$touch : @names)
		{
			$hint{$_} = $arg1 if $arg1 > $hint{$_};
		}
	}
}

my $dump_sql = "SELECT resource, token, holder, " . lease_state_sql()
  . ", lease_ttl, accepted_at IS NOT NULL FROM lockfence.fences ORDER BY resource;"
  . " SELECT 'floor', floor FROM lockfence.floor_state;"
  . " SELECT 'prot', id, res, tok, val FROM prot ORDER BY id;";

my %stat;         # kind/outcome => count
my %time = (fast => 0, stmt => 0);
my @diffs;
my %last;         # session id => the last steps, for a report
my $lock_timeouts = 0;
my $opslog = "${PostgreSQL::Test::Utils::tmp_check}/89_differential_ops.txt";
open(my $log, '>', $opslog) or die "cannot write $opslog: $!";
print $log "# seed $seed, $nops steps, $nsessions sessions\n";

my $control = { fast => session($path{fast}), stmt => session($path{stmt}) };
my $state_diffs = 0;
sub compare_state
{
	my ($when) = @_;
	my %st = map { $_ => (outcome(run_sql($control->{$_}, $dump_sql)))[0] } qw(fast stmt);
	return 1 if $st{fast} eq $st{stmt};
	$state_diffs++;
	diag("rows differ $when:\n--- fast path:\n$st{fast}\n--- statements:\n$st{stmt}");
	return 0;
}

for my $step (1 .. $nops)
{
	my $s = $sess[ rnd($nsessions) ];
	my ($kind, $sql, $touch, $arg1, $arg2) = choose_step($s);
	my %r;
	for my $p (qw(fast stmt))
	{
		my $t0 = time;
		$r{$p} = run_sql($s->{$p}, $sql);
		$time{$p} += time - $t0;
	}
	my ($of, $sf) = outcome($r{fast});
	my ($os, $ss) = outcome($r{stmt});
	my $line = sprintf("%d s%d %s\n  => %s", $step, $s->{id}, $sql, $of =~ s/\n/ | /gr);
	print $log "$line\n";
	push @{ $last{ $s->{id} } }, $line;
	shift @{ $last{ $s->{id} } } if @{ $last{ $s->{id} } } > 12;
	if ($of ne $os)
	{
		push @diffs, "step $step, session $s->{id}: $sql\n  fast path:  $of\n  statements: $os";
		print $log "  !! statements: " . ($os =~ s/\n/ | /gr) . "\n";
		diag("first difference, after these steps of session $s->{id}:\n"
			  . join("\n", @{ $last{ $s->{id} } }))
		  if @diffs == 1;
	}
	$lock_timeouts++
	  if "$of$os" =~ /lock timeout|55P03: canceling statement/;

	# What happened, by kind.
	my $what = defined $sf ? $sf
	  : $kind =~ /^(begin|commit|rollback|savepoint|rollback_to|release)$/ ? 'ok'
	  : $r{fast}{out} eq '' ? 'empty'
	  : $kind =~ /try_fence|lease_release|reset/ ? $r{fast}{out}
	  : $kind =~ /lease_.*acquire|contended/ ? ($r{fast}{out} eq '|' ? 'refused' : 'granted')
	  : 'ok';
	$stat{"$kind:$what"}++;
	$stat{'raise_floor:raised'}++
	  if $kind =~ /^raise_floor/ && !defined $sf && $r{fast}{out} > 0;

	learn($s, $kind, $touch, $arg1, $arg2, { %{ $r{fast} }, sql => $sql }, $sf);
	compare_state("at step $step") if $step % 1000 == 0;
}

# End every transaction: commit the open ones (rolled back if aborted).
for my $s (@sess)
{
	for my $p (qw(fast stmt))
	{
		run_sql($s->{$p}, 'COMMIT;') if $s->{in_txn};
		$s->{$p}{in} .= "\\q\n";
		$s->{$p}{run}->finish;
	}
}
close $log;

note(sprintf('time in each database: fast path %.1f s, statements %.1f s, for %d steps',
	$time{fast}, $time{stmt}, $nops));
note("outcomes by kind:\n"
	  . join("\n", map { sprintf('%6d %s', $stat{$_}, $_) } sort keys %stat));

is(scalar @diffs, 0, "$nops steps: the same outcome in both paths at every step")
  or diag("differences: " . scalar(@diffs) . "; the first ones:\n"
	  . join("\n", @diffs[ 0 .. ($#diffs < 4 ? $#diffs : 4) ])
	  . "\nall steps: $opslog (seed $seed)");
ok(compare_state('at the end'), 'the same rows at the end (fences, floor, protected table)');
is($state_diffs, 0, 'the same rows at every comparison');
is($lock_timeouts, 0, 'no step waited for another session (no lock timeout)');

# The run exercised the cases it is meant to compare.
my %need = (
	'fence:ok' => 'fence() accepted',
	'fence:LF001' => 'fence() rejected: stale token or another holder',
	'fence:LF003' => 'fence() rejected: lease released (lock lost)',
	'try_fence:t' => 'try_fence() accepted',
	'try_fence:f' => 'try_fence() rejected',
	'fence_array:ok' => 'fence(text[]) accepted',
	'fence_array:LF001' => 'fence(text[]) rejected',
	'try_fence_array:t' => 'try_fence(text[]) accepted',
	'try_fence_array:f' => 'try_fence(text[]) rejected',
	'lease_acquire:granted' => 'lease_acquire() granted',
	'lease_acquire:55P03' => 'lease_acquire() refused (held, wait_timeout 0)',
	'lease_try_acquire:granted' => 'lease_try_acquire() granted',
	'lease_try_acquire:refused' => 'lease_try_acquire() refused',
	'lease_try_contended:refused' => 'lease_try_acquire() refused for a row another session holds',
	'lease_renew:ok' => 'lease_renew() renewed',
	'lease_renew:LF003' => 'lease_renew() refused (lock lost)',
	'lease_release:t' => 'lease_release() released',
	'lease_release:f' => 'lease_release() refused',
	'raise_floor:raised' => 'raise_floor() raised a fence',
	'raise_floor_global:ok' => 'a global raise_floor()',
	'prot_upsert:ok' => 'a protected write accepted',
	'prot_upsert:LF001' => 'a protected write rejected (stale token)',
	'prot_update:LF002' => 'a protected write without a new token rejected',
	'rollback_to:ok' => 'ROLLBACK TO SAVEPOINT',
	'release:ok' => 'RELEASE SAVEPOINT',
	'commit:ok' => 'COMMIT',
	'rollback:ok' => 'ROLLBACK',
	'begin:ok' => 'BEGIN',
);
for my $k (sort keys %need)
{
	ok(($stat{$k} // 0) > 0, "exercised: $need{$k} ($k: " . ($stat{$k} // 0) . ')');
}
my $aborted = grep { /:25P02$/ } keys %stat;
ok($aborted, 'exercised: statements in an aborted transaction (25P02)');

done_testing();
