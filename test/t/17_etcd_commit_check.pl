
# 17_etcd_commit_check.pl
#	  The commit-time lock check (issue 9, item 4,
#	  lockfence.etcd_check_at_commit): before a transaction that fenced
#	  with the token of an etcd lock of this backend commits, one etcd
#	  transaction per lock confirms it is still held.
#	  - a holder quiet past its TTL with no successor yet is refused at
#	    commit with LF003 naming the lock, and nothing is written;
#	  - with the check off the same commit goes through (the check is what
#	    refuses it);
#	  - the check sends exactly one request per lock, and none for a
#	    transaction that did not fence with an etcd token (counted at the
#	    fault proxy in front of etcd);
#	  - all_fenced also checks locks named as holder in lockfence.fence;
#	  - a cancel while the check waits for etcd aborts the commit cleanly;
#	  - issue 17, item 1: all_fenced checks every transaction that fenced
#	    with a lock of this backend, also when the fence row already
#	    recorded the token and was only share-locked (the usual "fence at
#	    the start of each transaction" under one lock), in every form
#	    (fence, try_fence, the array forms, the trigger); a
#	    fence rolled back to a savepoint is not checked;
#	  - issue 17, item 2: PREPARE TRANSACTION is refused (0A000) after a
#	    fence with an etcd lock of this session, whatever the scope and the
#	    setting, so COMMIT PREPARED cannot commit after the lock was lost.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'cchk');
$etcd->start;
my $fault = $etcd->start_fault_server($etcd->client_url(0));
my $f = $fault->url;

my $node = LockfenceTest::EtcdCluster::pg_node('etcd_cchk',
	"lockfence.etcd_endpoints = '$f'\nmax_prepared_transactions = 5\n");
$node->safe_psql('postgres',
	'CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0);');

sub txns { return $fault->hits->{'/v3/kv/txn'} // 0; }
sub fenced { return $node->safe_psql('postgres', "SELECT token FROM lockfence.fences WHERE resource = '$_[0]'"); }

my $s = LockfenceTest::EtcdCluster::session($node);

# --- one request per lock at commit ------------------------------------------
# (session scope here: a transaction-scoped lock's release after the
# commit would be one more etcd transaction, a delete)
$s->query_safe('BEGIN');
my $tok = $s->query_safe("SELECT lockfence.etcd_lock_and_fence('c1', 'res-c1', 30, scope => 'session')");
chomp $tok;
my $before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 1, 'the commit sent one etcd transaction for the lock it fenced with');
is(fenced('res-c1'), $tok, 'and committed');

# two locks, two requests
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.etcd_lock_and_fence('c2a', 'res-c2a', 30, scope => 'session')");
$s->query_safe("SELECT lockfence.etcd_lock_and_fence('c2b', 'res-c2b', 30, scope => 'session')");
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 2, 'two locks fenced with: two requests at commit');

# --- no request for transactions that did not fence with an etcd token ---------
my $k = $s->query_safe("SELECT key FROM lockfence.etcd_lock('c3', 30)");
chomp $k;
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('res-plain', 5)");
$s->query_safe('UPDATE t SET v = v + 1');
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 0, 'a transaction that fenced without an etcd lock sends nothing at commit');
$before = txns();
$s->query_safe('SELECT 1');
$s->query_safe('BEGIN; SELECT 1; COMMIT;');
is(txns() - $before, 0, 'nor does a read-only transaction of a backend holding a lock');

# fence(..., holder => key) is checked under all_fenced only
my $info = $etcd->key_info($k);
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('res-c3a', $info->{create_revision}, holder => '$k')");
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 0, 'lock_and_fence (default): a lock named in fence() is not checked');
$s->query_safe("SET lockfence.etcd_check_at_commit = all_fenced");
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('res-c3b', $info->{create_revision}, holder => '$k')");
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 1, 'all_fenced: a lock of this backend named as holder is checked');
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('res-other', 7, holder => 'someone/else')");
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 0, 'all_fenced: a fence naming another holder sends nothing');
$s->query_safe("RESET lockfence.etcd_check_at_commit");
$s->query_safe("SELECT lockfence.etcd_unlock('$k')");

# --- a holder quiet past its TTL, no successor yet, is refused at commit -------
$s->query_safe('BEGIN');
my $ltok = $s->query_safe("SELECT lockfence.etcd_lock_and_fence('c4', 'res-c4', 2)");
chomp $ltok;
$s->query_safe('UPDATE t SET v = 100');
my ($lkey) = $etcd->keys('c4/');
ok(LockfenceTest::EtcdCluster::poll_until(15, sub { !defined $etcd->key_info($lkey) }),
	'the quiet holder\'s lease expired (no successor fenced)');
$s->query('COMMIT');
like($s->{stderr}, qr/LF003/, 'its commit is refused with LF003');
like($s->{stderr}, qr/\Q$lkey\E/, '... naming the lock');
$s->{stderr} = '';
is(fenced('res-c4'), '', 'nothing of the transaction was written (no fence row)');
is($node->safe_psql('postgres', 'SELECT v FROM t'), '1', '... and no update');

# the same with the check off goes through: the check is what refuses it
$s->query_safe("SET lockfence.etcd_check_at_commit = off");
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.etcd_lock_and_fence('c5', 'res-c5', 2)");
my ($k5) = $etcd->keys('c5/');
ok(LockfenceTest::EtcdCluster::poll_until(15, sub { !defined $etcd->key_info($k5) }),
	'check off: the lease expired too');
$s->query('COMMIT');
unlike($s->{stderr}, qr/ERROR/, 'check off: the commit goes through');
$s->{stderr} = '';
$s->query_safe("RESET lockfence.etcd_check_at_commit");

# --- a cancel during the check aborts the commit cleanly -----------------------
my $c = LockfenceTest::EtcdCluster::session($node);
$s->query_safe("SET lockfence.etcd_request_timeout = '30s'");
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.etcd_lock_and_fence('c6', 'res-c6', 60)");
$fault->set(path => '/v3/kv/txn', mode => 'hang', times => 1);
LockfenceTest::EtcdCluster::send_query($s, 'COMMIT;');
usleep(1_000_000);
my $t0 = time;
$c->query_safe("SELECT pg_cancel_backend($s->{pid})");
my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($s, 30);
my $took = time - $t0;
like($err, qr/57014|canceling statement/, 'a cancel during the check ends the COMMIT with 57014');
ok($took < 5, sprintf('promptly (%.2f s)', $took));
$fault->clear;
is(fenced('res-c6'), '', 'the cancelled transaction wrote nothing');
ok(LockfenceTest::EtcdCluster::poll_until(10, sub { !$etcd->keys('c6/') }),
	'and its transaction-scoped lock was released');
$s->{stderr} = '';
is($s->query_safe('SELECT 1'), '1', 'the session goes on');

# --- issue 17, item 1: every transaction fencing under one lock is checked -----
$node->safe_psql('postgres', 'CREATE TABLE cc_t (id int)');
$s->query_safe('SET lockfence.etcd_check_at_commit = all_fenced');
my ($ck, $clease, $ctok) = split /\|/,
  $s->query_safe("SELECT key, lease, token FROM lockfence.etcd_lock('cc/lock', 41)");
sub cc_txn
{
	my ($fence_sql, $id) = @_;
	$s->query_safe('BEGIN');
	$s->query_safe($fence_sql);
	$s->query_safe("INSERT INTO cc_t VALUES ($id)");
	my $b = txns();
	my $r = LockfenceTest::EtcdCluster::sql_try($s, 'COMMIT');
	return ($r, txns() - $b);
}
my ($r, $sent) = cc_txn("SELECT lockfence.fence('cc-res', $ctok, '$ck')", 1);
ok($r->{ok}, 'all_fenced: the first transaction under the lock (writes the fence row) commits');
is($sent, 1, '... after one check');
($r, $sent) = cc_txn("SELECT lockfence.fence('cc-res', $ctok, '$ck')", 2);
ok($r->{ok}, 'all_fenced: the second (the fence row already records the token) commits');
is($sent, 1, '... and is checked too, though it only share-locked the fence row');
($r, $sent) = cc_txn("SELECT lockfence.try_fence('cc-res', $ctok, '$ck')", 3);
is($sent, 1, 'all_fenced: try_fence is checked as well');
($r, $sent) = cc_txn("SELECT lockfence.fence(ARRAY['cc-res', 'cc-res2'], $ctok, '$ck')", 4);
is($sent, 1, 'all_fenced: the array form is checked (one request per lock)');
($r, $sent) = cc_txn("SELECT lockfence.try_fence(ARRAY['cc-res', 'cc-res2'], $ctok, '$ck')", 5);
is($sent, 1, 'all_fenced: try_fence with an array is checked');

# a fence rolled back to a savepoint is not checked; one kept is
$s->query_safe('BEGIN');
$s->query_safe('SAVEPOINT a');
$s->query_safe("SELECT lockfence.fence('cc-res', $ctok, '$ck')");
$s->query_safe('ROLLBACK TO SAVEPOINT a');
$s->query_safe('INSERT INTO cc_t VALUES (7)');
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 0, 'all_fenced: a fence rolled back to its savepoint is not checked');
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('cc-res', $ctok, '$ck')");
$s->query_safe('SAVEPOINT a');
$s->query_safe("SELECT lockfence.fence('cc-res', $ctok, '$ck')");
$s->query_safe('ROLLBACK TO SAVEPOINT a');
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 1, 'all_fenced: a fence made before the savepoint stays checked after its rollback');
$s->query_safe('BEGIN');
$s->query_safe('SAVEPOINT a');
$s->query_safe("SELECT lockfence.fence('cc-res', $ctok, '$ck')");
$s->query_safe('RELEASE SAVEPOINT a');
$before = txns();
$s->query_safe('COMMIT');
is(txns() - $before, 1, 'all_fenced: a fence in a released savepoint is checked');

# the trigger: a row carrying the token of a new lock, named by a column
$node->safe_psql('postgres', q{
	CREATE TABLE cc_acc (id int, tok bigint, who text);
	SELECT lockfence.protect('cc_acc', resource => 'cc-acc',
	                         token_column => 'tok', holder_column => 'who');});
my ($tk, $tlease, $ttok) = split /\|/,
  $s->query_safe("SELECT key, lease, token FROM lockfence.etcd_lock('cc/trig', 42)");
($r, $sent) = cc_txn("INSERT INTO cc_acc VALUES (1, $ttok, '$tk')", 8);
is($sent, 1, 'all_fenced: a fence by the trigger (token and holder columns) is checked');

# the lock is lost; the next transaction fences as usual and must not commit
$etcd->etcdctl('lease', 'revoke', sprintf('%x', $clease));
ok(!defined $etcd->key_info($ck), 'the lock was lost (its lease revoked)');
($r, $sent) = cc_txn("SELECT lockfence.fence('cc-res', $ctok, '$ck')", 9);
ok(!$r->{ok}, 'all_fenced: a transaction fencing with the lost lock does not commit');
is($r->{sqlstate}, 'LF003', '... LF003') or diag explain $r;
like($r->{message}, qr/\Q$ck\E/, '... naming the lock');
is($node->safe_psql('postgres', 'SELECT count(*) FROM cc_t WHERE id = 9'), '0',
	'... and nothing of it was written');

# a lock found lost during the transaction (the error caught) is no longer
# in the session's list: the commit must not go through unchecked
my ($lk, $llease, $ltok2) = split /\|/,
  $s->query_safe("SELECT key, lease, token FROM lockfence.etcd_lock('cc/lost', 46)");
$s->query_safe('BEGIN');
$s->query_safe("SELECT lockfence.fence('cc-lost', $ltok2, '$lk')");
$s->query_safe('INSERT INTO cc_t VALUES (10)');
$etcd->etcdctl('lease', 'revoke', sprintf('%x', $llease));
$s->query_safe("DO \$\$ BEGIN PERFORM lockfence.etcd_keepalive($llease); EXCEPTION WHEN SQLSTATE 'LF003' THEN NULL; END \$\$");
$r = LockfenceTest::EtcdCluster::sql_try($s, 'COMMIT');
is($r->{sqlstate}, 'LF003', 'all_fenced: a lock found lost (error caught) during the transaction fails its commit')
  or diag explain $r;
like($r->{message} // '', qr/\Q$lk\E/, '... naming the lock');
is($node->safe_psql('postgres', 'SELECT count(*) FROM cc_t WHERE id = 10'), '0',
	'... and nothing of it was written');
$s->query_safe('BEGIN');
$s->query_safe('INSERT INTO cc_t VALUES (11)');
$r = LockfenceTest::EtcdCluster::sql_try($s, 'COMMIT');
ok($r->{ok}, '... the next transaction is not affected') or diag explain $r;

# the same when an etcd_unlock finds the lock gone: it forgot the lock
# (with a NOTICE) and the commit went through unchecked, where without the
# unlock it failed; PREPARE was accepted too
for my $end ('COMMIT', "PREPARE TRANSACTION 'cc_unl'")
{
	my ($uk, $ulease, $utok) = split /\|/,
	  $s->query_safe("SELECT key, lease, token FROM lockfence.etcd_lock('cc/unl', 47)");
	$s->query_safe('BEGIN');
	$s->query_safe("SELECT lockfence.fence('cc-unl', $utok, '$uk')");
	$s->query_safe('INSERT INTO cc_t VALUES (12)');
	$etcd->etcdctl('lease', 'revoke', sprintf('%x', $ulease));
	$r = LockfenceTest::EtcdCluster::sql_try($s, "SELECT lockfence.etcd_unlock('$uk')");
	like($r->{stderr} // '', qr/NOTICE:.*does not exist/, "$end: the unlock finds the lock gone")
	  or diag explain $r;
	$r = LockfenceTest::EtcdCluster::sql_try($s, $end);
	if ($end eq 'COMMIT')
	{
		is($r->{sqlstate}, 'LF003', 'all_fenced: a lock an unlock found gone fails the commit')
		  or diag explain $r;
		like($r->{message} // '', qr/\Q$uk\E/, '... naming the lock');
	}
	else
	{
		is($r->{sqlstate}, '0A000', 'a lock an unlock found gone: PREPARE refused') or diag explain $r;
		like($r->{message} // '', qr/\Q$uk\E/, '... naming the lock');
		LockfenceTest::EtcdCluster::sql_try($s, 'ROLLBACK');
	}
	is($node->safe_psql('postgres', 'SELECT count(*) FROM cc_t WHERE id = 12'), '0',
		"$end: nothing of it was written");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'), '0',
		"$end: nothing prepared");
}

# ... and when the unlock's request fails (an unreadable reply), its
# error caught: if the quiet retry of its error cleanup finds the key
# gone (the lease revoked first), or cannot read its answer either (the
# key's fate unknown), the lock counts as lost and the commit fails
for my $case (
	[ 'cc/unl2', 48, 'cc-unl2', 13, 1, 1, 'the unlock failed (08P01), the error caught',
		'all_fenced: the lock its cleanup found gone fails the commit' ],
	[ 'cc/unl3', 49, 'cc-unl3', 14, 0, 2, 'the unlock and its retry failed, the error caught',
		'all_fenced: a lock whose key could not be deleted fails the commit' ])
{
	my ($name, $ttl, $res, $id, $revoke, $faults, $failed, $refused) = @$case;
	my ($uk, $ulease, $utok) = split /\|/,
	  $s->query_safe("SELECT key, lease, token FROM lockfence.etcd_lock('$name', $ttl)");
	$s->query_safe('BEGIN');
	$s->query_safe("SELECT lockfence.fence('$res', $utok, '$uk')");
	$s->query_safe("INSERT INTO cc_t VALUES ($id)");
	$etcd->etcdctl('lease', 'revoke', sprintf('%x', $ulease)) if $revoke;
	$fault->set(path => '/v3/kv/txn', mode => 'invalid_json', times => $faults);
	$r = LockfenceTest::EtcdCluster::sql_try($s,
		"DO \$\$ BEGIN PERFORM lockfence.etcd_unlock('$uk'); "
		  . "EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'unlock failed: %', SQLSTATE; END \$\$");
	$fault->clear;
	like($r->{stderr} // '', qr/unlock failed: 08P01/, $failed) or diag explain $r;
	$r = LockfenceTest::EtcdCluster::sql_try($s, 'COMMIT');
	is($r->{sqlstate}, 'LF003', $refused) or diag explain $r;
	is($node->safe_psql('postgres', "SELECT count(*) FROM cc_t WHERE id = $id"), '0',
		'... and nothing of it was written');
}

# --- issue 17, item 2: no PREPARE after fencing with an etcd lock ----------------
sub prepare_refused
{
	my ($label, @sql) = @_;
	$s->query_safe('BEGIN');
	$s->query_safe($_) for @sql;
	my $p = LockfenceTest::EtcdCluster::sql_try($s, "PREPARE TRANSACTION 'cc_p'");
	is($p->{sqlstate}, '0A000', "PREPARE refused: $label") or diag explain $p;
	like($p->{message} // '', qr/cannot PREPARE a transaction that/, "... $label: message");
	like($p->{stderr}, qr/HINT:\s+Commit work done under an etcd lock with COMMIT/, "... $label: hint");
	LockfenceTest::EtcdCluster::sql_try($s, 'ROLLBACK');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'), '0',
		"... $label: nothing prepared");
	return;
}
my ($pk, $please, $ptok) = split /\|/,
  $s->query_safe("SELECT key, lease, token FROM lockfence.etcd_lock('cc/prep', 43)");
prepare_refused('all_fenced, a session lock fenced with fence()',
	"SELECT lockfence.fence('cc-prep', $ptok, '$pk')", 'INSERT INTO cc_t VALUES (20)');
prepare_refused('all_fenced, the same fence again (fence row only share-locked)',
	"SELECT lockfence.fence('cc-prep', $ptok, '$pk')");
$s->query_safe('RESET lockfence.etcd_check_at_commit');
prepare_refused('lock_and_fence, a session lock fenced with fence()',
	"SELECT lockfence.fence('cc-prep', $ptok, '$pk')");
prepare_refused('a session lock fenced with the array form',
	"SELECT lockfence.fence(ARRAY['cc-prep', 'cc-prep2'], $ptok, '$pk')");
$s->query_safe('SET lockfence.etcd_check_at_commit = off');
prepare_refused('check off, a session lock fenced with fence()',
	"SELECT lockfence.fence('cc-prep', $ptok, '$pk')");
$s->query_safe('RESET lockfence.etcd_check_at_commit');
prepare_refused('etcd_lock_and_fence, session scope',
	"SELECT lockfence.etcd_lock_and_fence('cc/prep2', 'cc-prep2', 44, scope => 'session')");
prepare_refused('a transaction-scoped lock',
	"SELECT lockfence.etcd_lock('cc/prep3', 45, scope => 'transaction')");

# what is not refused: no fence with an etcd lock, or one rolled back
$s->query_safe('BEGIN');
$s->query_safe('INSERT INTO cc_t VALUES (21)');
$s->query_safe("SELECT lockfence.fence('cc-plain', 3)");
$r = LockfenceTest::EtcdCluster::sql_try($s, "PREPARE TRANSACTION 'cc_ok'");
ok($r->{ok}, 'PREPARE allowed for a transaction that fenced with no etcd lock') or diag explain $r;
$s->query_safe("COMMIT PREPARED 'cc_ok'");
$s->query_safe('BEGIN');
$s->query_safe('SAVEPOINT a');
$s->query_safe("SELECT lockfence.fence('cc-prep', $ptok, '$pk')");
$s->query_safe('ROLLBACK TO SAVEPOINT a');
$r = LockfenceTest::EtcdCluster::sql_try($s, "PREPARE TRANSACTION 'cc_ok2'");
ok($r->{ok}, 'PREPARE allowed after the fence was rolled back to its savepoint') or diag explain $r;
$s->query_safe("COMMIT PREPARED 'cc_ok2'");

$s->quit;
$c->quit;
$node->stop;
$etcd->stop;
done_testing();
