
# 31_etcd_leader_kill.pl
#	  Mutual exclusion and liveness across an etcd leader crash.
#
#	  Several PostgreSQL sessions loop on one lock name: etcd_lock, fence,
#	  record (session, token, acquired, released) in a table, hold briefly,
#	  etcd_unlock.  The leader of a 3-member etcd cluster is killed with
#	  SIGKILL in the middle.  Afterwards: no two holds overlap in time,
#	  tokens increase in acquisition order, no stale-token rejection ever
#	  happened, every session completed cycles after the crash, and the
#	  longest gap in service is printed.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use LockfenceTest::EtcdCluster;

my $nsessions = 4;
my $after_kill = 3;    # cycles each session must complete after the crash

my $etcd = LockfenceTest::EtcdCluster->new(members => 3, name => 'leaderkill');
$etcd->start;

my $node = LockfenceTest::EtcdCluster::pg_node('leaderkill', <<EOF);
lockfence.etcd_endpoints = '@{[ $etcd->endpoints ]}'
lockfence.etcd_request_timeout = '3s'
lockfence.etcd_connect_timeout = '500ms'
EOF

$node->safe_psql('postgres', <<'EOF');
CREATE TABLE holds (
	session int NOT NULL,
	token bigint NOT NULL,
	acquired timestamptz NOT NULL,
	released timestamptz NOT NULL
);
CREATE TABLE errs (session int, at timestamptz, sqlstate text, msg text, detail text);
CREATE TABLE ctl (stop boolean NOT NULL);
INSERT INTO ctl VALUES (false);

-- One cycle: lock, fence, record the hold, hold briefly, unlock.  The hold
-- is recorded from the moment etcd_lock returned until just before the
-- unlock request is sent.
CREATE FUNCTION one_cycle(s int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	l record;
	t0 timestamptz;
BEGIN
	SELECT * INTO STRICT l FROM lockfence.etcd_lock('stream', 8, '40s');
	t0 := clock_timestamp();
	PERFORM lockfence.fence('stream-resource', l.token, 'session ' || s);
	PERFORM pg_sleep(0.02);
	INSERT INTO holds VALUES (s, l.token, t0, clock_timestamp());
	PERFORM lockfence.etcd_unlock(l.key);
END $$;

-- Loop until told to stop; each cycle commits on its own; errors are
-- recorded and the loop goes on.
CREATE PROCEDURE worker(s int) LANGUAGE plpgsql AS $$
DECLARE
	d text;
BEGIN
	WHILE NOT (SELECT stop FROM ctl) LOOP
		BEGIN
			PERFORM one_cycle(s);
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
			INSERT INTO errs VALUES (s, clock_timestamp(), SQLSTATE, SQLERRM, d);
			PERFORM pg_sleep(0.05);
		END;
		COMMIT;
	END LOOP;
END $$;
EOF

# Start the workers, each in its own session.
my @workers;
for my $i (1 .. $nsessions)
{
	my $w = $node->background_psql('postgres', on_error_stop => 0, timeout => 300);
	$w->{stdin} .= "CALL worker($i);\n\\echo worker $i done\n";
	$w->{run}->pump_nb;
	push @workers, $w;
}

# Poll until $cond (SQL returning t) holds, or the deadline passes.
sub poll_until
{
	my ($sql, $secs) = @_;
	my $deadline = time + $secs;
	while (time < $deadline)
	{
		$_->{run}->pump_nb for @workers;
		return 1 if $node->safe_psql('postgres', $sql) eq 't';
		usleep(200_000);
	}
	return 0;
}

ok( poll_until(
		"SELECT count(DISTINCT session) = $nsessions AND count(*) >= 3 * $nsessions FROM holds",
		60),
	'all sessions cycle before the crash');

my $leader = $etcd->leader_index;
my $kill_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
$etcd->kill_member($leader);
note "killed etcd leader m$leader at $kill_at";

my $recovered = poll_until(
	"SELECT count(*) = $nsessions FROM (SELECT session FROM holds
	   WHERE acquired > '$kill_at' GROUP BY session HAVING count(*) >= $after_kill) s",
	90);
ok($recovered, "every session completed $after_kill cycles after the leader was killed");

# Stop the workers and wait for them to finish their current cycle.
$node->safe_psql('postgres', 'UPDATE ctl SET stop = true');
for my $i (0 .. $#workers)
{
	my $w = $workers[$i];
	my $deadline = time + 60;
	$w->{run}->pump_nb until $w->{stdout} =~ /worker \d+ done/ || time > $deadline;
	like($w->{stdout}, qr/worker \d+ done/, 'worker ' . ($i + 1) . ' stopped');
	$w->quit;
}

# Mutual exclusion: in token order, each hold starts after the previous
# one ended, and tokens are unique.
my $overlaps = $node->safe_psql('postgres', <<'EOF');
SELECT count(*) FROM (
	SELECT token, acquired,
	       lag(released) OVER (ORDER BY token) AS prev_released,
	       lag(token) OVER (ORDER BY token) AS prev_token
	  FROM holds) h
 WHERE acquired < prev_released OR token = prev_token
EOF
is($overlaps, '0', 'no two holds overlap and no token was issued twice')
  or diag $node->safe_psql('postgres', <<'EOF');
SELECT session, token, acquired, released, prev_session, prev_token, prev_released FROM (
	SELECT *, lag(released) OVER w AS prev_released, lag(token) OVER w AS prev_token,
	       lag(session) OVER w AS prev_session
	  FROM holds WINDOW w AS (ORDER BY token)) h
 WHERE acquired < prev_released OR token = prev_token
EOF

my $order = $node->safe_psql('postgres', <<'EOF');
SELECT count(*) FROM (
	SELECT token, lag(token) OVER (ORDER BY acquired) AS prev FROM holds) h
 WHERE token <= prev
EOF
is($order, '0', 'tokens strictly increase in acquisition order');

is($node->safe_psql('postgres', "SELECT count(*) FROM errs WHERE sqlstate = 'LF001'"),
	'0', 'the fence never rejected a token (no stale holder)');

is( $node->safe_psql('postgres',
		"SELECT token FROM lockfence.fences WHERE resource = 'stream-resource'"),
	$node->safe_psql('postgres', 'SELECT max(token) FROM holds'),
	'fence records the highest token of all holds');

my $stats = $node->safe_psql('postgres', <<"EOF");
WITH g AS (
	SELECT acquired - lag(released) OVER (ORDER BY acquired) AS gap, acquired
	  FROM holds)
SELECT (SELECT count(*) FROM holds),
       (SELECT count(*) FROM holds WHERE acquired > '$kill_at'),
       round(extract(epoch FROM max(gap))::numeric, 3),
       round(extract(epoch FROM max(gap) FILTER (WHERE acquired > '$kill_at'))::numeric, 3),
       (SELECT round(extract(epoch FROM min(acquired) - '$kill_at')::numeric, 3)
          FROM holds WHERE acquired > '$kill_at')
  FROM g
EOF
my ($total, $after, $maxgap, $gapkill, $first_after) = split /\|/, $stats;
diag "leader kill: $total holds ($after after the kill); longest gap in service ${maxgap}s "
  . "(after the kill: ${gapkill}s; first grant ${first_after}s after the kill)";
my $errs = $node->safe_psql('postgres',
	"SELECT string_agg(sqlstate || ' x' || n || ': ' || msg || ' / ' || coalesce(detail, ''), E'\\n') FROM
	   (SELECT sqlstate, min(msg) AS msg, min(detail) AS detail, count(*) AS n
	      FROM errs GROUP BY sqlstate) e");
diag "errors seen by the workers (retried):\n$errs" if $errs ne '';
cmp_ok($first_after, '<', 30, 'service resumed within 30 s of the crash');

$node->stop;
$etcd->stop;
done_testing();
