# Copyright: lockfence contributors
#
# 94_citus_history.pl: the history test's counter workload on a Citus
# cluster under crashes (issue 22, item 4).
#
# A coordinator and two workers on 127.0.0.1 (LockfenceTest::Citus).
# test/history/citus_harness.py runs lease-holding worker processes that
# increment counters in a distributed table through the coordinator (about
# half of the increments commit with two-phase commit), while a nemesis
# stops worker processes past their lease, SIGKILLs a Citus worker node
# and restarts it, and SIGKILLs the coordinator inside Citus' two-phase
# commit, after its commit decision (recovery commits) and before it
# (recovery rolls back).  test/history/checker.py, the single-server
# test's checker, reads the history and the final state:
#   - fenced (protect() on the distributed table, fence() in every
#     increment): 0 violations, at least 2,000 acknowledged increments,
#     every fault kind injected with its window reached;
#   - the self-check, the same workload without the fence: the checker
#     MUST find violations (so this test can fail).
#
# CITUS_HISTORY_SEED=N replays a fault schedule; CITUS_HISTORY_MINUTES
# (1) and CITUS_HISTORY_SELFCHECK_MINUTES (0.75) set the lengths; the
# fenced run goes on (up to three times its length) until 2,000 increments
# were acknowledged and every fault kind was injected.  The histories are
# kept in tmp_check/citus_history.  Skipped, with the reason, when Citus
# is not installed (scripts/citus.sh build && scripts/citus.sh install).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use LockfenceTest::Citus;

my $why = LockfenceTest::Citus::unavailable();
plan skip_all => $why if $why;

my $PY = '/usr/bin/python3';
my $HIST = 'test/history';
my $MIN_OK = 2000;

my @nodes;

# The harness kills, freezes and restarts nodes behind the Cluster
# objects' backs.  Before their own END stops them (pg_ctl -m immediate,
# by data directory): resume anything left frozen, and forget nodes that
# are down, so that stopping does not fail on them.
END
{
	for my $n (@nodes)
	{
		my $pidfile = $n->data_dir . '/postmaster.pid';
		if (open my $fh, '<', $pidfile)
		{
			my $pm = <$fh>;
			close $fh;
			chomp $pm;
			if ($pm =~ /^\d+$/ && kill 0, $pm)
			{
				kill 'CONT', $pm;
				for my $k (split /\s+/, `pgrep -P $pm 2>/dev/null`)
				{
					kill 'CONT', $k if $k =~ /^\d+$/;
				}
				$n->{_pid} = $pm;
				next;
			}
		}
		$n->{_pid} = undef;
	}
}

@nodes = LockfenceTest::Citus::start_cluster('chist', 2);
my ($coord, @workers) = @nodes;

sub sql { return LockfenceTest::Citus::sql(@_); }

my ($ok, $out, $err) = sql($coord, 'CREATE EXTENSION lockfence');
ok($ok, 'CREATE EXTENSION lockfence on the coordinator') or diag($err);

# Every node includes a file the nemesis writes to hold commits or
# PREPAREs after their WAL record (synchronous_standby_names naming a
# standby that does not exist; synchronous replication needs
# max_wal_senders > 0, which LockfenceTest::Citus sets; a restart here
# otherwise).  Citus' maintenance daemon retries unfinished 2PC every 2 s
# instead of every minute, so that a transaction left prepared by a crash
# does not hold its rows for long.
for my $n (@nodes)
{
	$n->append_conf('postgresql.conf', <<'EOF');
citus.recover_2pc_interval = '2s'
include_if_exists = 'lockfence_history_nemesis.conf'
EOF
	if ($n->safe_psql('postgres', 'SHOW max_wal_senders') eq '0')
	{
		$n->append_conf('postgresql.conf', "max_wal_senders = 2\n");
		$n->restart;
	}
	else
	{
		$n->reload;
	}
}

my $seed = $ENV{CITUS_HISTORY_SEED} // int(rand(1 << 30));
note("seed $seed (replay: CITUS_HISTORY_SEED=$seed)");
my $outdir = "$PostgreSQL::Test::Utils::tmp_check/citus_history";
mkdir $outdir;

my $bindir = $coord->config_data('--bindir');
local $ENV{CITUS_HISTORY_PG_BIN} = $bindir;
local $ENV{CITUS_HISTORY_NODES} = join ' ',
  map { join ':', $_->name, $_->port, $_->data_dir, $_->logfile } @nodes;
local $ENV{PYTHONDONTWRITEBYTECODE} = 1;

# run(name, argv): run a step, its output into the test's log; (ok, output)
sub run_step
{
	my ($name, @argv) = @_;
	my ($o, $e) = ('', '');
	my $res = IPC::Run::run(\@argv, '>', \$o, '2>', \$e, IPC::Run::timeout(900));
	note("$name:\n$o$e");
	return ($res, "$o$e");
}

sub summary_line { my ($text) = @_; my ($l) = $text =~ /^(history .*violations: \d+)$/m; return $l // '(no summary)'; }

# --- the fenced run -------------------------------------------------------
my $minutes = $ENV{CITUS_HISTORY_MINUTES} // 1;
my ($hok, $hout) = run_step('fenced run', $PY, "$HIST/citus_harness.py",
	'--seed', $seed, '--minutes', $minutes, '--min-ok', $MIN_OK,
	'--out', "$outdir/fenced");
ok($hok, 'fenced run: the harness ran to its end') or diag($hout);
my ($cok, $cout) = run_step('fenced check', $PY, "$HIST/checker.py", "$outdir/fenced",
	'--require-ok', $MIN_OK, '--require-all-faults');
ok($cok, "fenced run: 0 violations, >= $MIN_OK acknowledged, every fault injected: "
	  . summary_line($cout))
  or diag($cout);

# --- the self-check: the same workload without the fence -------------------
my $sminutes = $ENV{CITUS_HISTORY_SELFCHECK_MINUTES} // 0.75;
($hok, $hout) = run_step('self-check run', $PY, "$HIST/citus_harness.py",
	'--seed', $seed, '--minutes', $sminutes, '--no-fence', '--out', "$outdir/selfcheck");
ok($hok, 'self-check: the harness ran to its end') or diag($hout);
($cok, $cout) = run_step('self-check check', $PY, "$HIST/checker.py", "$outdir/selfcheck",
	'--expect-violations');
ok($cok, 'self-check without the fence: the checker finds violations: ' . summary_line($cout))
  or diag($cout);

done_testing();
