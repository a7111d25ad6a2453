
# 26_etcd_wait_order.pl
#	  What any correct wait for an etcd lock must guarantee, whoever does
#	  the waiting (etcd's lock service, or a client-side wait on the
#	  predecessor key as etcd's concurrency.Mutex does):
#
#	  1. One FIFO queue shared with `etcdctl lock`, both ways: holder
#	     etcdctl, then lockfence A, etcdctl B, lockfence C, etcdctl D are
#	     served in exactly that order, one at a time; lockfence tokens are
#	     their keys' create_revision and grow.  A's and C's session leases
#	     are granted before the etcdctl ones, so their keys sort first by
#	     name although they queue later: the order must come from
#	     create_revision, not from the key names.
#	  2. No lost wake-up: 8 sessions, N cycles each of etcd_lock (20 s
#	     wait_timeout), a write, etcd_unlock, on one name: every cycle
#	     completes, tokens strictly increase in write order, no two holds
#	     overlap (timestamps, and a PostgreSQL advisory lock taken inside
#	     every hold).
#	  3. Predecessors leaving out of order: a waiter whose own key is
#	     deleted by hand while the holder holds gets LF003 (within 10 s,
#	     while the holder still holds), never a token, and the waiter
#	     behind it still waits for the holder; the holder's release and
#	     the creation of a new key in one etcd transaction hand the lock
#	     to the next waiter and keep the newcomer last; the holder's key
#	     and the next waiter's key deleted in one transaction hand the
#	     lock to the waiter after them, and the other gets LF003.
#	  4. etcd 3.4's lost-lock guard: a waiter whose lease is revoked while
#	     it waits never receives a token (LF003), and the waiter behind it
#	     gets the lock when the holder releases, not before.
#	  5. Three members: a waiter keeps its place in the queue and gets the
#	     lock within 15 s of the holder's release although the member it
#	     talked to was stopped (SIGSTOP) while it waited; the member waking
#	     up does not take the lock away.
#
#	  Every wait is a poll with a deadline; "still waits" is observed over
#	  a settle time after which a wrong grant would have shown.
#
#	  etcd's lock service, through which lockfence waited before its
#	  client-side wait, cannot do two of these things: notice a waiter's
#	  own key deleted before the holder releases (3), and keep the place
#	  of a waiter whose member hangs (5; see requeue_new_lease in
#	  src/etcd_lock.c).  The test finds out from etcd's gRPC metrics
#	  whether lockfence called the lock service; if it did, those three
#	  checks are TODO (reported, not failing); for any other wait they
#	  bind.

use strict;
use warnings;

use JSON::PP;
use MIME::Base64;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

# Cycles per session in part 2 (8 sessions).
my $cycles = $ENV{LOCKFENCE_WAIT_ORDER_CYCLES} // 40;

# How long a waiter is watched to show that it keeps waiting.
my $settle = 0.7;

# Whether lockfence waits through etcd's lock service (/v3/lock/lock), as
# it did up to the client-side wait: found out in part 1.  Two properties
# are out of the lock service's reach; their checks are TODO with it, and
# binding for any other wait.
my $via_lock_service;
our $TODO;

my $etcd = LockfenceTest::EtcdCluster->new(members => 1, name => 'waitorder');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('wait_order',
	"lockfence.etcd_endpoints = '" . $etcd->endpoints . "'\n");

my $tmp = PostgreSQL::Test::Utils::tempdir('wait_order');

sub session { return LockfenceTest::EtcdCluster::session($node); }
sub poll_until { return LockfenceTest::EtcdCluster::poll_until(@_); }

# --- helpers -------------------------------------------------------------------

# The keys under NAME/ in queue order (create_revision), from one read:
# a list of { key, rev }.
sub queue_of
{
	my ($e, $name) = @_;
	my $j = decode_json($e->etcdctl('get', '--prefix', "$name/", '-w', 'json'));
	return sort { $a->{rev} <=> $b->{rev} }
	  map { { key => decode_base64($_->{key}), rev => $_->{create_revision} } }
	  @{ $j->{kvs} // [] };
}

sub queue_keys { return map { $_->{key} } queue_of(@_); }

# The create_revision of a key now, or undef.
sub rev_of
{
	my ($e, $key) = @_;
	my $info = $e->key_info($key);
	return $info ? $info->{create_revision} : undef;
}

# Run "etcdctl txn" with the given request text (compares, blank line,
# success operations, blank line, failure operations).
sub etcdctl_txn
{
	my ($e, $text) = @_;
	my $out = '';
	local $ENV{ETCDCTL_API} = 3;
	IPC::Run::run(
		[ $LockfenceTest::EtcdCluster::ETCDCTL, '--endpoints=' . $e->endpoints, 'txn' ],
		'<', \$text, '>', \$out, '2>&1');
	die "etcdctl txn failed: $out" if $? != 0;
	return $out;
}

# Grant a lease; its ID in hex as in lock keys (etcdctl pads it to 16
# digits, lock keys do not).
sub grant_lease
{
	my ($e, $ttl) = @_;
	my $out = $e->etcdctl('lease', 'grant', $ttl);
	$out =~ /lease 0*([0-9a-f]+) granted/ or die "unexpected lease grant output: $out";
	return $1;
}

# A lockfence waiter: start etcd_lock in a background session.
sub lf_start
{
	my ($s, $name, $ttl, $wait) = @_;
	$s->{stdout} = '';
	$s->{stderr} = '';
	LockfenceTest::EtcdCluster::send_query($s,
		"SELECT 'got|' || key || '|' || token FROM lockfence.etcd_lock('$name', $ttl, '$wait');"
	);
	return;
}

# What the waiter's etcd_lock has come to, without consuming it:
# { state => 'got', key, token }, { state => 'error', sqlstate, err } or
# { state => 'waiting' }.
sub lf_state
{
	my ($s) = @_;
	my ($out, $err) = LockfenceTest::EtcdCluster::peek_output($s);
	return { state => 'got', key => $1, token => $2 }
	  if $out =~ /got\|([^|\n]+)\|(\d+)/;
	return { state => 'error', sqlstate => $1, err => $err }
	  if $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return { state => 'waiting', err => $err };
}

# Poll a waiter until its etcd_lock returned or failed; its final state.
sub lf_outcome
{
	my ($s, $secs) = @_;
	my $st;
	poll_until($secs, sub { $st = lf_state($s); $st->{state} ne 'waiting' });
	return $st;
}

# Consume the result of the waiter's etcd_lock (after lf_state saw it).
sub lf_finish
{
	my ($s) = @_;
	return LockfenceTest::EtcdCluster::wait_result($s, 30);
}

# True if every given waiter keeps waiting for the settle time.
sub still_waits
{
	my (@s) = @_;
	my $t0 = time;
	while (time < $t0 + $settle)
	{
		for (@s)
		{
			return 0 if lf_state($_)->{state} ne 'waiting';
		}
		usleep(50_000);
	}
	return 1;
}

sub touch
{
	my ($f) = @_;
	open(my $fh, '>', $f) or die "could not create $f: $!";
	close $fh;
	return;
}

# --- 1. mixed FIFO with etcdctl lock, both ways ----------------------------------

{
	my $name = 'fifo';
	my %p;

	# Participants: lockfence sessions (lf) and etcdctl lock holders (ctl),
	# each released by the test.
	my $new_ctl = sub {
		my ($tag) = @_;
		my $f = "$tmp/release-$name-$tag";
		my $bg = $etcd->start_etcdctl_lock($name,
			"while [ ! -e '$f' ]; do sleep 0.05; done");
		return { tag => $tag, type => 'ctl', bg => $bg, file => $f };
	};
	my $holds = sub {
		my ($q) = @_;
		if ($q->{type} eq 'ctl')
		{
			my $h = $q->{bg}{handle};
			$h->pump_nb if $h->pumpable;
			return $q->{bg}{out} =~ /LOCKED/;
		}
		my $st = lf_state($q->{s});
		$q->{got} = $st if $st->{state} eq 'got';
		return $st->{state} eq 'got';
	};
	my $failed = sub {
		my ($q) = @_;
		return !$q->{bg}{handle}->pumpable && $q->{bg}{out} !~ /LOCKED/
		  if $q->{type} eq 'ctl';
		return lf_state($q->{s})->{state} eq 'error';
	};
	my $release = sub {
		my ($q) = @_;
		if ($q->{type} eq 'ctl')
		{
			touch($q->{file});
			return;
		}
		lf_finish($q->{s});
		$q->{s}->query_safe("SELECT lockfence.etcd_unlock('$q->{got}{key}')");
		return;
	};

	# A's and C's session leases exist before any etcdctl lease: their
	# lock keys sort before the etcdctl keys by name.
	for my $tag (qw(A C))
	{
		my $s = session();
		my $row = $s->query_safe(
			"SELECT key || '|' || lease FROM lockfence.etcd_lock('$name-warm-$tag', 30)");
		my ($k, $lease) = split /\|/, $row;
		$s->query_safe("SELECT lockfence.etcd_unlock('$k')");
		$p{$tag} = { tag => $tag, type => 'lf', s => $s,
			key => "$name/" . sprintf('%x', $lease) };
	}

	my @order = qw(H A B C D);
	my $n = 0;
	for my $tag (@order)
	{
		if ($p{$tag})
		{
			lf_start($p{$tag}{s}, $name, 30, '120s');
		}
		else
		{
			$p{$tag} = $new_ctl->($tag);
		}
		$n++;
		ok($etcd->wait_for_keys("$name/", $n), "fifo: $tag queued its key");
		my @q = queue_of($etcd, $name);
		my $newest = $q[-1];
		is($newest->{key}, $p{$tag}{key}, "fifo: ${tag}'s key is its session lease's")
		  if $p{$tag}{type} eq 'lf';
		$p{$tag}{key} = $newest->{key};
		$p{$tag}{rev} = $newest->{rev};
		if ($tag eq 'H')
		{
			ok(LockfenceTest::EtcdCluster::wait_for_output($p{H}{bg}, qr/LOCKED/, 30),
				'fifo: etcdctl H holds the lock');
		}
	}
	note('fifo: queue by create_revision: '
		  . join(' ', map { "$_=$p{$_}{key}\@$p{$_}{rev}" } @order));
	note('fifo: the same keys by name: ' . join(' ', sort map { $p{$_}{key} } @order));
	is_deeply([ queue_keys($etcd, $name) ], [ map { $p{$_}{key} } @order ],
		'fifo: etcd queue is H A B C D by create_revision');

	for my $i (0 .. $#order)
	{
		my $cur = $p{ $order[$i] };
		my @later = map { $p{$_} } @order[ $i + 1 .. $#order ];
		if ($i > 0)
		{
			my $prev = $p{ $order[ $i - 1 ] };
			$release->($prev);
			my $early;
			my $t0 = time;
			poll_until(30, sub {
				for my $l (@later)
				{
					$early //= $l->{tag} if $holds->($l);
				}
				return $early || $holds->($cur) || $failed->($cur);
			});
			ok(!defined $early,
				"fifo: nobody behind $cur->{tag} got the lock when $prev->{tag} released")
			  or diag("$early got the lock before $cur->{tag}");
			ok($holds->($cur),
				sprintf('fifo: %s got the lock %.2f s after %s released',
					$cur->{tag}, time - $t0, $prev->{tag}))
			  or diag(explain($cur->{type} eq 'lf' ? lf_state($cur->{s}) : $cur->{bg}{err}));
		}

		# Exactly one holder: the others keep waiting while it holds.
		my $t0 = time;
		my $early;
		while (time < $t0 + $settle)
		{
			for my $l (@later)
			{
				$early //= $l->{tag} if $holds->($l);
			}
			usleep(50_000);
		}
		ok(!defined $early, "fifo: everybody behind $cur->{tag} waits while it holds")
		  or diag("$early holds too");
		is((queue_keys($etcd, $name))[0], $cur->{key},
			"fifo: $cur->{tag}'s key is the lowest create_revision in etcd");
		if ($cur->{type} eq 'lf')
		{
			is($cur->{got}{key}, $cur->{key}, "fifo: $cur->{tag} got its queued key");
			is($cur->{got}{token}, $cur->{rev},
				"fifo: $cur->{tag}'s token is its key's create_revision");
		}
	}
	$release->($p{D});
	cmp_ok($p{A}{got}{token}, '<', $p{C}{got}{token}, 'fifo: tokens grow: A < C');
	cmp_ok($p{H}{rev}, '<', $p{A}{got}{token}, 'fifo: A\'s token is above etcdctl H\'s key');
	for my $tag (qw(H B D))
	{
		my $hd = $p{$tag}{bg}{handle};
		ok(poll_until(30, sub { $hd->pump_nb if $hd->pumpable; !$hd->pumpable }),
			"fifo: etcdctl $tag exited after its release");
		$hd->finish;
	}
	ok(poll_until(10, sub { !queue_keys($etcd, $name) }), 'fifo: no key left');
	$p{$_}{s}->quit for qw(A C);

	# A and C waited: with the lock service, etcd counted their calls.
	# (etcdctl lock never calls it: it runs the Mutex protocol itself.)
	my $calls = $etcd->grpc_calls('Lock');
	$via_lock_service = $calls > 0;
	note "lockfence waits through etcd's lock service: "
	  . ($via_lock_service ? "yes ($calls calls)" : 'no');
}

# --- 2. no lost wake-up --------------------------------------------------------

{
	$node->safe_psql('postgres', <<'EOF');
CREATE TABLE wo_holds (
	wseq bigint NOT NULL,	-- order of the writes
	sess int NOT NULL,
	token bigint NOT NULL,
	got timestamptz NOT NULL,	-- etcd_lock returned
	rel timestamptz NOT NULL,	-- before etcd_unlock was called
	alone boolean NOT NULL		-- nobody else was inside a hold
);
CREATE SEQUENCE wo_seq;

-- One cycle: lock, write (token, session) while holding, unlock.  The
-- advisory lock is taken just after etcd_lock returned and dropped just
-- before etcd_unlock: two overlapping holds would see it taken.
CREATE FUNCTION wo_cycle(s int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	l record;
	t0 timestamptz;
	excl boolean;
BEGIN
	SELECT * INTO STRICT l FROM lockfence.etcd_lock('race', 30, '20s');
	t0 := clock_timestamp();
	excl := pg_try_advisory_lock(2626);
	INSERT INTO wo_holds VALUES (nextval('wo_seq'), s, l.token, t0, clock_timestamp(), excl);
	IF excl THEN
		PERFORM pg_advisory_unlock(2626);
	END IF;
	IF NOT lockfence.etcd_unlock(l.key) THEN
		RAISE EXCEPTION 'lock % was gone before etcd_unlock', l.key;
	END IF;
END $$;
EOF

	my $nsess = 8;
	my @s = map { session() } 1 .. $nsess;
	my $t0 = time;
	for my $i (0 .. $#s)
	{
		LockfenceTest::EtcdCluster::send_query($s[$i],
			join("\n", ("SELECT wo_cycle($i);") x $cycles));
	}
	my @errs;
	for my $i (0 .. $#s)
	{
		my $left = $t0 + 150 - time;
		my ($out, $err) = LockfenceTest::EtcdCluster::wait_result($s[$i], $left > 1 ? $left : 1);
		push @errs, "session $i: $err" if $err =~ /\S/;
		push @errs, "session $i: no end within 150 s" if $out eq '' && $err eq '';
	}
	my $elapsed = time - $t0;
	my $total = $nsess * $cycles;
	is_deeply(\@errs, [], "race: every one of the $total cycles completed without an error");
	note sprintf('race: %d cycles in %.1f s (%.0f cycles/s)', $total, $elapsed,
		$total / $elapsed);
	is( $node->safe_psql('postgres',
			'SELECT count(*) || \'|\' || count(DISTINCT token) FROM wo_holds'),
		"$total|$total",
		'race: one write per cycle, every token distinct');
	is( $node->safe_psql('postgres',
			"SELECT string_agg(sess || ':' || n, ' ' ORDER BY sess) FROM
			 (SELECT sess, count(*) n FROM wo_holds GROUP BY sess) x"),
		join(' ', map { "$_:$cycles" } 0 .. $nsess - 1),
		"race: each session completed its $cycles cycles");
	is( $node->safe_psql('postgres',
			'SELECT count(*) FROM (SELECT token, lag(token) OVER (ORDER BY wseq) prev
			 FROM wo_holds) x WHERE token <= prev'),
		'0',
		'race: tokens strictly increase in the order of the writes');
	is( $node->safe_psql('postgres',
			'SELECT count(*) FROM (SELECT got, lag(rel) OVER (ORDER BY token) prev
			 FROM wo_holds) x WHERE got < prev'),
		'0',
		'race: every hold began after the previous token\'s hold ended');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM wo_holds WHERE NOT alone'),
		'0', 'race: nobody else was inside any hold');
	is_deeply([ queue_keys($etcd, 'race') ], [], 'race: no key left');
	$_->quit for @s;
}

# --- 3. predecessors leaving out of order ----------------------------------------

# 3a. A waiter's own key deleted by hand while the holder holds.
{
	my $name = 'ooo';
	my $h = session();
	my $row = $h->query_safe(
		"SELECT key || '|' || token FROM lockfence.etcd_lock('$name', 30)");
	my ($hkey, $htok) = split /\|/, $row;
	my ($w1, $w2) = (session(), session());
	# TTL 15: a wait that looks at its own key only when it renews its
	# lease (every third of the TTL) also learns of the deletion within
	# the 10 s allowed below.
	lf_start($w1, $name, 15, '60s');
	ok($etcd->wait_for_keys("$name/", 2), 'ooo: W1 queued');
	lf_start($w2, $name, 30, '60s');
	ok($etcd->wait_for_keys("$name/", 3), 'ooo: W2 queued');
	my (undef, $k1, $k2) = queue_of($etcd, $name);

	$etcd->etcdctl('del', $k1->{key});
	my $t0 = time;
	my $st1 = lf_outcome($w1, 10);
	{
		local $TODO = $via_lock_service
		  ? 'etcd\'s lock service waits on the predecessor only and notices the deleted key when the holder releases'
		  : undef;
		is($st1->{state}, 'error',
			sprintf('ooo: W1 whose key was deleted failed within %.1f s, while the holder holds',
				time - $t0))
		  or diag explain $st1;
	}
	isnt($st1->{state}, 'got', 'ooo: W1 got no token while the holder holds');
	ok(still_waits($w2), 'ooo: W2 keeps waiting for the holder');
	is_deeply([ queue_keys($etcd, $name) ], [ $hkey, $k2->{key} ],
		'ooo: the queue is the holder, then W2');

	$h->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
	$t0 = time;
	my $st2 = lf_outcome($w2, 10);
	is($st2->{state}, 'got',
		sprintf('ooo: W2 got the lock %.2f s after the holder released', time - $t0))
	  or diag explain $st2;
	is($st2->{token}, $k2->{rev}, 'ooo: W2\'s token is its key\'s create_revision');
	cmp_ok($st2->{token}, '>', $htok, 'ooo: W2\'s token is above the holder\'s');
	$st1 = lf_outcome($w1, 10);
	is($st1->{state}, 'error',
		'ooo: W1 got no token but an error, at the latest within 10 s of the release')
	  or diag explain $st1;
	is($st1->{sqlstate}, 'LF003', 'ooo: ... LF003 (lock lost)');
	lf_finish($w1);
	lf_finish($w2);
	$w2->query_safe("SELECT lockfence.etcd_unlock('$st2->{key}')");
	is_deeply([ queue_keys($etcd, $name) ], [], 'ooo: no key left');
	$_->quit for ($h, $w1, $w2);
}

# 3b. The holder's key deleted and a newcomer's key created in one etcd
# transaction: the next waiter holds, the newcomer queues last.  The
# holder and the newcomer are hand-made Mutex clients (a key NAME/<lease
# hex> on their lease, as etcdctl lock creates it), with leases granted
# before the waiters', so their keys sort first by name.
{
	my $name = 'ooo2';
	my $lh = grant_lease($etcd, 60);
	my $ln = grant_lease($etcd, 60);
	$etcd->etcdctl('put', "$name/$lh", '', "--lease=$lh");
	my $htok = rev_of($etcd, "$name/$lh");
	my ($w1, $w2) = (session(), session());
	lf_start($w1, $name, 30, '60s');
	ok($etcd->wait_for_keys("$name/", 2), 'ooo2: W1 queued');
	lf_start($w2, $name, 30, '60s');
	ok($etcd->wait_for_keys("$name/", 3), 'ooo2: W2 queued');
	my (undef, $k1, $k2) = queue_of($etcd, $name);
	ok(still_waits($w1, $w2), 'ooo2: W1 and W2 wait for the hand-made holder');

	etcdctl_txn($etcd, "\ndel $name/$lh\nput $name/$ln new --lease=$ln\n\n\n");
	my $t0 = time;
	my $st1 = lf_outcome($w1, 10);
	is($st1->{state}, 'got',
		sprintf('ooo2: W1 got the lock %.2f s after the holder left as a newcomer queued', time - $t0))
	  or diag explain $st1;
	is($st1->{token}, $k1->{rev}, 'ooo2: W1\'s token is its key\'s create_revision');
	ok(still_waits($w2), 'ooo2: W2 keeps waiting while W1 holds');
	is_deeply([ queue_keys($etcd, $name) ], [ $k1->{key}, $k2->{key}, "$name/$ln" ],
		'ooo2: the queue is W1, W2, then the newcomer');

	lf_finish($w1);
	$w1->query_safe("SELECT lockfence.etcd_unlock('$st1->{key}')");
	$t0 = time;
	my $st2 = lf_outcome($w2, 10);
	is($st2->{state}, 'got',
		sprintf('ooo2: W2 got the lock %.2f s after W1 released, ahead of the newcomer', time - $t0))
	  or diag explain $st2;
	is($st2->{token}, $k2->{rev}, 'ooo2: W2\'s token is its key\'s create_revision');
	cmp_ok($st1->{token}, '>', $htok, 'ooo2: tokens grow: holder < W1');
	cmp_ok($st2->{token}, '>', $st1->{token}, 'ooo2: tokens grow: W1 < W2');
	lf_finish($w2);
	$w2->query_safe("SELECT lockfence.etcd_unlock('$st2->{key}')");
	is_deeply([ queue_keys($etcd, $name) ], ["$name/$ln"], 'ooo2: the newcomer is left, holding');
	$etcd->etcdctl('lease', 'revoke', $_) for ($lh, $ln);
	$_->quit for ($w1, $w2);
}

# 3c. The holder's key and the next waiter's key deleted in one etcd
# transaction: the waiter after them holds; the one whose key was deleted
# gets no token.
{
	my $name = 'ooo3';
	my $lh = grant_lease($etcd, 60);
	$etcd->etcdctl('put', "$name/$lh", '', "--lease=$lh");
	my $htok = rev_of($etcd, "$name/$lh");
	my ($w1, $w2) = (session(), session());
	lf_start($w1, $name, 30, '60s');
	ok($etcd->wait_for_keys("$name/", 2), 'ooo3: W1 queued');
	lf_start($w2, $name, 30, '60s');
	ok($etcd->wait_for_keys("$name/", 3), 'ooo3: W2 queued');
	my (undef, $k1, $k2) = queue_of($etcd, $name);

	etcdctl_txn($etcd, "\ndel $name/$lh\ndel $k1->{key}\n\n\n");
	my $t0 = time;
	my $st2 = lf_outcome($w2, 10);
	is($st2->{state}, 'got',
		sprintf('ooo3: W2 got the lock %.2f s after the holder and W1 left together', time - $t0))
	  or diag explain $st2;
	is($st2->{token}, $k2->{rev}, 'ooo3: W2\'s token is its key\'s create_revision');
	cmp_ok($st2->{token}, '>', $htok, 'ooo3: W2\'s token is above the holder\'s');
	my $st1 = lf_outcome($w1, 10);
	is($st1->{state}, 'error', 'ooo3: W1 whose key was deleted got no token') or diag explain $st1;
	is($st1->{sqlstate}, 'LF003', 'ooo3: ... but LF003 (lock lost)');
	lf_finish($w1);
	lf_finish($w2);
	$w2->query_safe("SELECT lockfence.etcd_unlock('$st2->{key}')");
	is_deeply([ queue_keys($etcd, $name) ], [], 'ooo3: no key left');
	$etcd->etcdctl('lease', 'revoke', $lh);
	$_->quit for ($w1, $w2);
}

# --- 4. the lost-lock guard: a waiter's lease revoked while it waits -------------

{
	my $name = 'guard';
	my $f = "$tmp/release-$name";
	my $hctl = $etcd->start_etcdctl_lock($name, "while [ ! -e '$f' ]; do sleep 0.05; done");
	ok(LockfenceTest::EtcdCluster::wait_for_output($hctl, qr/LOCKED/, 30),
		'guard: etcdctl holds the lock');
	my ($hk) = queue_of($etcd, $name);
	my ($w1, $w2) = (session(), session());
	# TTL 60: W1's keepalive is not due for 20 s, so nothing but the final
	# check of its key can tell that the lock is not W1's.
	lf_start($w1, $name, 60, '60s');
	ok($etcd->wait_for_keys("$name/", 2), 'guard: W1 queued');
	lf_start($w2, $name, 30, '60s');
	ok($etcd->wait_for_keys("$name/", 3), 'guard: W2 queued');
	my (undef, $k1, $k2) = queue_of($etcd, $name);
	my $l1 = (split m{/}, $k1->{key})[1];

	$etcd->etcdctl('lease', 'revoke', $l1);
	ok(poll_until(10, sub { !defined rev_of($etcd, $k1->{key}) }),
		'guard: W1\'s key went with its lease');
	ok(still_waits($w2), 'guard: W2 keeps waiting for the holder');
	isnt(lf_state($w1)->{state}, 'got', 'guard: W1 has no token');

	touch($f);
	my $t0 = time;
	my $st2 = lf_outcome($w2, 15);
	is($st2->{state}, 'got',
		sprintf('guard: W2 got the lock %.2f s after the holder released', time - $t0))
	  or diag explain $st2;
	is($st2->{token}, $k2->{rev}, 'guard: W2\'s token is its key\'s create_revision');
	cmp_ok($st2->{token}, '>', $hk->{rev}, 'guard: W2\'s token is above the holder\'s');
	my $st1 = lf_outcome($w1, 15);
	is($st1->{state}, 'error', 'guard: W1 whose lease was revoked never received a token')
	  or diag explain $st1;
	is($st1->{sqlstate}, 'LF003', 'guard: ... but LF003 (lock lost)');
	lf_finish($w1);
	lf_finish($w2);
	$w2->query_safe("SELECT lockfence.etcd_unlock('$st2->{key}')");
	$hctl->{handle}->finish;
	is_deeply([ queue_keys($etcd, $name) ], [], 'guard: no key left');
	$_->quit for ($w1, $w2);
}

$etcd->stop;

# --- 5. three members: a waiter on a stopped member keeps its place ----------------

{
	my $cl = LockfenceTest::EtcdCluster->new(members => 3, name => 'waitorder3');
	$cl->start;
	my $leader = $cl->leader_index;
	my ($f1, $f2) = grep { $_ != $leader } 0 .. 2;
	my $eps = sub { join(',', map { $cl->client_url($_) } @_) };
	my $name = 'mm';

	# Each session talks to the member listed first.
	my $setup = sub {
		my ($first, @rest) = @_;
		my $s = session();
		$s->query_safe("SET lockfence.etcd_endpoints = '" . $eps->($first, @rest) . "'");
		$s->query_safe("SET lockfence.etcd_request_timeout = '3s'");
		$s->query_safe("SET lockfence.etcd_connect_timeout = '1s'");
		# a first cycle, so that the session is talking to that member
		$s->query_safe("SELECT lockfence.etcd_unlock(key) FROM lockfence.etcd_lock('$name-warm', 10, '10s')");
		return $s;
	};
	my $h = $setup->($leader, $f2, $f1);
	my $w1 = $setup->($f1, $leader, $f2);
	my $w2 = $setup->($f2, $leader, $f1);

	my $row = $h->query_safe("SELECT key || '|' || token FROM lockfence.etcd_lock('$name', 10)");
	my ($hkey, $htok) = split /\|/, $row;
	lf_start($w1, $name, 10, '60s');
	ok($cl->wait_for_keys("$name/", 2), 'mm: W1 queued through member ' . $f1);
	lf_start($w2, $name, 10, '60s');
	ok($cl->wait_for_keys("$name/", 3), 'mm: W2 queued through member ' . $f2);
	my (undef, $k1, $k2) = queue_of($cl, $name);

	$cl->pause_member($f1);
	my $paused = 1;
	my $ok = eval {
		# Long enough for a keepalive through the stopped member to be
		# due and fail: TTL 10, renewed every third of it.
		sleep 4;
		ok(still_waits($w1, $w2), 'mm: W1 and W2 wait while the holder holds');
		$h->query_safe("SELECT lockfence.etcd_unlock('$hkey')");
		my $t0 = time;
		my ($st1, $st2);
		poll_until(15, sub {
			$st1 = lf_state($w1);
			$st2 = lf_state($w2);
			$st1->{state} ne 'waiting' || $st2->{state} ne 'waiting';
		});
		{
			# The lock service cannot keep W1's place: see requeue_new_lease
			# in src/etcd_lock.c (a hung member, once awake, deletes the key
			# of the request it held).
			local $TODO = $via_lock_service
			  ? 'a waiter through etcd\'s lock service queues again under a new lease when its member hangs'
			  : undef;
			is($st2->{state}, 'waiting',
				'mm: W2 still waits when the lock is handed on (W1 kept its place)')
			  or diag explain $st2;
		}
		if ($st2->{state} eq 'got')
		{
			# W2 went first: let it go, to see whether W1 gets the lock
			# at all.
			lf_finish($w2);
			$w2->query_safe("SELECT lockfence.etcd_unlock('$st2->{key}')");
		}
		my $left = $t0 + 15 - time;
		$st1 = lf_outcome($w1, $left > 0.1 ? $left : 0.1);
		my $took = time - $t0;
		is($st1->{state}, 'got',
			sprintf('mm: W1 got the lock through another member %.2f s after the holder released (15 s allowed)',
				$took))
		  or diag explain $st1;
		{
			# W1's member stopped 4.7 s before the release (sleep 4,
			# settle 0.7).  Its keepalive through that member was due
			# within a third of the TTL (3.3 s) of the stop and given up
			# after the request timeout (3 s): by 1.6 s after the release
			# W1 knows its member hangs, and watches through another one
			# at once.  A wait that slept on instead (blind, its
			# keepalives unsent) got the lock only 4 s or more after the
			# release, or lost it when its lease ran out meanwhile.
			local $TODO = $via_lock_service
			  ? 'a waiter through etcd\'s lock service queues again under a new lease when its member hangs'
			  : undef;
			cmp_ok($took, '<', 3,
				'mm: W1 moved its watch off the stopped member as soon as its keepalive there failed');
		}
		cmp_ok($st1->{token} // 0, '>', $htok, 'mm: W1\'s token is above the holder\'s');
		{
			local $TODO = $via_lock_service
			  ? 'a waiter through etcd\'s lock service queues again under a new lease when its member hangs'
			  : undef;
			is($st1->{token}, $k1->{rev},
				'mm: W1\'s token is the create_revision of the key it queued before the member stopped');
		}

		$cl->resume_member($f1);
		$paused = 0;
		$cl->wait_healthy();
		# etcd's lock service on the woken member would now delete the
		# key of the lock request it held, W1's old key.
		sleep 2;
		is((queue_keys($cl, $name))[0], $st1->{key},
			'mm: W1 still holds after the stopped member woke up');
		lf_finish($w1);
		$w1->query_safe("SELECT lockfence.etcd_unlock('$st1->{key}')") if $st1->{key};
		if ($st2->{state} eq 'waiting')
		{
			my $st = lf_outcome($w2, 15);
			is($st->{state}, 'got', 'mm: W2 got the lock after W1 released') or diag explain $st;
			lf_finish($w2);
			$w2->query_safe("SELECT lockfence.etcd_unlock('$st->{key}')") if $st->{key};
		}
		1;
	};
	my $err = $@;
	$cl->resume_member($f1) if $paused;
	die $err unless $ok;
	ok(poll_until(10, sub { !queue_keys($cl, $name) }), 'mm: no key left');
	$_->quit for ($h, $w1, $w2);
	$cl->stop;
}

$node->stop;
done_testing();
