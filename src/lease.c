/*-------------------------------------------------------------------------
 *
 * lease.c
 *	  Lease locks kept in the fence table: lease_acquire, lease_try_acquire,
 *	  lease_renew and lease_release.
 *
 * A lease is the fence row of its name: granting a lease advances the row's
 * token by one and records the lease's expiry (lease_expires_at) and TTL in
 * the same row.  So a lease's token is the fence's token, greater than
 * every token ever granted or fenced for the name, and it survives crashes,
 * dump/restore and failover with the fences, for the same reasons.
 *
 * Exactness comes from the fence row lock:
 *
 *	- fence(name, token) with the lease token takes the row FOR SHARE, and
 *	  only while the lease is unexpired (fence_store.c, fence_fastpath.c
 *	  look at lease_expires_at); an expired or released lease token is lock
 *	  lost (LF003).
 *	- A grant is an UPDATE of the row, which waits for every transaction
 *	  holding it FOR SHARE, i.e. every transaction that fenced with the old
 *	  token, and then re-checks that the lease is still free.
 *
 * Hence in commit order the writes under successive leases never
 * interleave.  A transaction that fenced before the expiry keeps its
 * share lock, and may go on writing, past the expiry until it ends; the
 * successor's grant waits for it.
 *
 * The clock is the server's (clock_timestamp()); it decides only when a
 * lease is free, never whether two holders' writes may interleave.
 *
 * An uncontended grant, renewal or release (the lease free, or held with
 * the token; nobody holding the row; the row unchanged since our snapshot)
 * is written without any statement (lease_fastpath.c): that is the common
 * case, and the one whose cost matters.  Everything else runs the
 * statements below, which wait, re-check and tell why an operation failed.
 *
 * Every statement that locks the fence row runs in an internal
 * subtransaction rolled back when it comes back empty: a locking statement
 * that meets a version newer than its snapshot locks that version before
 * re-checking its WHERE clause and keeps the lock when the re-check fails
 * (even with SKIP LOCKED), and such a lock, kept while a waiter sleeps,
 * would block the holder's fence, renewal and release until the TTL.
 *
 * IDENTIFICATION
 *	  src/lease.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "failover_guard.h"
#include "lease.h"
#include "lockfence.h"
#include "metrics.h"

PG_FUNCTION_INFO_V1(lockfence_lease_acquire);
PG_FUNCTION_INFO_V1(lockfence_lease_try_acquire);
PG_FUNCTION_INFO_V1(lockfence_lease_renew);
PG_FUNCTION_INFO_V1(lockfence_lease_release);

/* Statements; parameters ($1 name, $2 token, $3 holder, $4 ttl). */
typedef enum LeaseStatement
{
	LEASE_READ,
	LEASE_LOCK_FREE,
	LEASE_GRANT,
	LEASE_INSERT,
	LEASE_RENEW,
	LEASE_RELEASE,
	LEASE_NUM_STATEMENTS
} LeaseStatement;

#define LEASE_IS_FREE \
	" (lease_expires_at IS NULL" \
	" OR lease_expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())"

static const char *const lease_statement_sql[LEASE_NUM_STATEMENTS] = {
	/* LEASE_READ */
	"SELECT token, lease_expires_at, accepted_at FROM lockfence.fences"
	" WHERE resource OPERATOR(pg_catalog.=) $1",

	/* LEASE_LOCK_FREE: lock a free row for a grant, if nobody holds it */
	"SELECT token, lease_expires_at, accepted_at FROM lockfence.fences"
	" WHERE resource OPERATOR(pg_catalog.=) $1 AND" LEASE_IS_FREE
	" FOR NO KEY UPDATE SKIP LOCKED",

	/*
	 * LEASE_GRANT: the next token; waits for the row's lockers (transactions
	 * that fenced with the old token) and re-checks that the row is free.
	 */
	"UPDATE lockfence.fences"
	" SET token = token OPERATOR(pg_catalog.+) 1,"
	" accepted_at = pg_catalog.clock_timestamp(), holder = $3,"
	" lease_expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $4,"
	" lease_ttl = $4"
	" WHERE resource OPERATOR(pg_catalog.=) $1 AND" LEASE_IS_FREE
	" RETURNING token, lease_expires_at, accepted_at",

	/* LEASE_INSERT: the first token of a name, above the floor ($2) */
	"INSERT INTO lockfence.fences"
	" (resource, token, accepted_at, holder, lease_expires_at, lease_ttl)"
	" VALUES ($1, $2 OPERATOR(pg_catalog.+) 1, pg_catalog.clock_timestamp(), $3,"
	" pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $4, $4)"
	" ON CONFLICT (resource) DO NOTHING"
	" RETURNING token, lease_expires_at, accepted_at",

	/* LEASE_RENEW: extend an unexpired lease ($4 NULL: its own TTL) */
	"UPDATE lockfence.fences"
	" SET lease_expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)"
	" COALESCE($4, lease_ttl),"
	" lease_ttl = COALESCE($4, lease_ttl)"
	" WHERE resource OPERATOR(pg_catalog.=) $1"
	" AND token OPERATOR(pg_catalog.=) $2"
	" AND lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()"
	" RETURNING token, lease_expires_at, accepted_at",

	/* LEASE_RELEASE: -infinity, so that no clock jump revives it */
	"UPDATE lockfence.fences"
	" SET lease_expires_at = '-infinity'"
	" WHERE resource OPERATOR(pg_catalog.=) $1"
	" AND token OPERATOR(pg_catalog.=) $2"
	" AND lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()"
	" RETURNING token, lease_expires_at, accepted_at",
};

static SPIPlanPtr lease_plans[LEASE_NUM_STATEMENTS];

/* A lease as read or granted. */
typedef struct LeaseRow
{
	int64		token;
	bool		leased;			/* lease_expires_at not NULL */
	TimestampTz expires_at;
	TimestampTz accepted_at;	/* when the token was granted or fenced */
} LeaseRow;

typedef enum LeaseAttempt
{
	LEASE_ATTEMPT_GRANTED,
	LEASE_ATTEMPT_HELD,			/* an unexpired lease: wait for its end */
	LEASE_ATTEMPT_LOCKED		/* free, but its row is locked (try only) */
} LeaseAttempt;

/*
 * Run one statement; returns the number of rows, the first one in *row.
 */
static uint64
lease_execute(LeaseStatement stmt, const char *name, int64 token,
			  const char *holder, Datum ttl, bool ttl_null, LeaseRow *row)
{
	static const Oid argtypes[4] = {TEXTOID, INT8OID, TEXTOID, INTERVALOID};
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	int			rc;

	if (lease_plans[stmt] == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(lease_statement_sql[stmt], 4,
									   (Oid *) argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for lockfence lease statement %d: %s",
				 (int) stmt, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		lease_plans[stmt] = plan;
	}

	values[0] = CStringGetTextDatum(name);
	values[1] = Int64GetDatum(token);
	values[2] = holder ? CStringGetTextDatum(holder) : (Datum) 0;
	nulls[2] = holder ? ' ' : 'n';
	values[3] = ttl;
	nulls[3] = ttl_null ? 'n' : ' ';

	rc = SPI_execute_plan(lease_plans[stmt], values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for lockfence lease statement %d: %s",
			 (int) stmt, SPI_result_code_string(rc));

	if (SPI_processed > 0 && row != NULL && SPI_tuptable->tupdesc->natts >= 2)
	{
		HeapTuple	tuple = SPI_tuptable->vals[0];
		TupleDesc	tupdesc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d;

		row->token = DatumGetInt64(SPI_getbinval(tuple, tupdesc, 1, &isnull));
		d = SPI_getbinval(tuple, tupdesc, 2, &isnull);
		row->leased = !isnull;
		row->expires_at = isnull ? 0 : DatumGetTimestampTz(d);
		if (tupdesc->natts >= 3)
		{
			d = SPI_getbinval(tuple, tupdesc, 3, &isnull);
			row->accepted_at = isnull ? 0 : DatumGetTimestampTz(d);
		}
	}
	return SPI_processed;
}

/* Microseconds of an interval, as a double (only its sign and size matter). */
static double
interval_usecs(const Interval *i)
{
	return (double) i->time + (double) i->day * USECS_PER_DAY +
		(double) i->month * DAYS_PER_MONTH * USECS_PER_DAY;
}

/*
 * Grant name, which was seen free, in an internal subtransaction kept only
 * when the grant succeeded.  Every statement that locks the fence row runs
 * in it: a locking statement that finds the row updated since its snapshot
 * locks the newest version before re-checking its WHERE clause, and keeps
 * that lock when the re-check fails (even with SKIP LOCKED).  Such a stray
 * lock, kept while we sleep, would block the new holder's fence, renewal
 * and release.
 *
 * With wait, the grant waits for the transactions that hold the row (those
 * that fenced with the expired token, or a competing grant), bounded by the
 * deadline through lock_timeout (SQLSTATE 55P03).  Without, it never waits.
 */
/* lease_grant's arguments, for lockfence_run_in_subxact */
typedef struct LeaseGrantStep
{
	const char *name;
	const char *holder;
	Datum		ttl;
	bool		wait;
	TimestampTz deadline;
	LeaseRow   *prev;
	LeaseRow   *row;
} LeaseGrantStep;

static bool
lease_grant_step(void *arg)
{
	LeaseGrantStep *step = (LeaseGrantStep *) arg;

	if (step->wait && step->deadline != 0)
	{
		long		ms = (step->deadline - GetCurrentTimestamp()) / 1000;
		char		buf[32];

		/* Ending the subtransaction restores lock_timeout. */
		snprintf(buf, sizeof(buf), "%ld", Max(ms, 1));
		(void) NewGUCNestLevel();
		(void) set_config_option("lock_timeout", buf, PGC_USERSET,
								 PGC_S_SESSION, GUC_ACTION_SAVE, true,
								 0, false);
	}
	if (step->wait)
		return lease_execute(LEASE_GRANT, step->name, 0, step->holder,
							 step->ttl, false, step->row) == 1;
	if (lease_execute(LEASE_LOCK_FREE, step->name, 0, step->holder,
					  step->ttl, false, step->prev) != 1)
		return false;
	if (lease_execute(LEASE_GRANT, step->name, 0, step->holder, step->ttl,
					  false, step->row) != 1)
		elog(ERROR, "lease row for \"%s\" changed while locked", step->name);
	return true;
}

static bool
lease_grant(const char *name, const char *holder, Datum ttl, bool wait,
			TimestampTz deadline, LeaseRow *prev, LeaseRow *row)
{
	LeaseGrantStep step = {name, holder, ttl, wait, deadline, prev, row};

	return lockfence_run_in_subxact(lease_grant_step, &step);
}

/*
 * Run a renewal or release, which may wait for the fence row, in an
 * internal subtransaction kept only when it updated the row: when its
 * re-check after the wait fails (the lease was taken over meanwhile) the
 * lock it got on the newest version must not outlive the call.
 */
/* lease_update_sub's arguments, for lockfence_run_in_subxact */
typedef struct LeaseUpdateStep
{
	LeaseStatement stmt;
	const char *name;
	int64		token;
	Datum		ttl;
	bool		ttl_null;
	LeaseRow   *row;
} LeaseUpdateStep;

static bool
lease_update_step(void *arg)
{
	LeaseUpdateStep *step = (LeaseUpdateStep *) arg;

	return lease_execute(step->stmt, step->name, step->token, NULL,
						 step->ttl, step->ttl_null, step->row) == 1;
}

static bool
lease_update_sub(LeaseStatement stmt, const char *name, int64 token,
				 Datum ttl, bool ttl_null, LeaseRow *row)
{
	LeaseUpdateStep step = {stmt, name, token, ttl, ttl_null, row};

	return lockfence_run_in_subxact(lease_update_step, &step);
}

/* The lease columns of a fence row written by lease_fastpath.c. */
static void
lease_row_from(const FenceRow *f, LeaseRow *row)
{
	row->token = f->token;
	row->leased = f->leased;
	row->expires_at = f->lease_expires_at;
	row->accepted_at = f->accepted_at;
}

/*
 * One attempt to take name through the statements, when the fast path
 * could not.  Without wait, a free lease whose row is locked is reported
 * LOCKED rather than waited for.  A held lease is reported HELD with its
 * row in *row (for its expiry).  Only lease_grant locks the row, so a
 * failed attempt leaves no lock behind.  *prev is the row before a grant.
 */
static LeaseAttempt
lease_attempt_spi(const char *name, const char *holder, Datum ttl, bool wait,
				  TimestampTz deadline, LeaseRow *prev, LeaseRow *row)
{
	FenceStoreState state;
	LeaseAttempt result;

	fence_store_enter(&state);
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();

		if (lease_execute(LEASE_READ, name, 0, holder, ttl, false, row) != 1)
		{
			/* A new name; a concurrent first grant makes us look again. */
			prev->leased = false;
			if (lease_execute(LEASE_INSERT, name, lockfence_failover_floor(),
							  holder, ttl, false, row) == 1)
			{
				result = LEASE_ATTEMPT_GRANTED;
				break;
			}
			continue;
		}
		*prev = *row;

		if (row->leased && row->expires_at > GetCurrentTimestamp())
		{
			result = LEASE_ATTEMPT_HELD;
			break;
		}

		/* Free as far as our snapshot sees. */
		if (lease_grant(name, holder, ttl, wait, deadline, prev, row))
		{
			result = LEASE_ATTEMPT_GRANTED;
			break;
		}
		if (!wait)
		{
			/* locked (by a fencer of the old token, a competing grant) */
			result = LEASE_ATTEMPT_LOCKED;
			break;
		}
	}
	fence_store_leave(&state);
	return result;
}

/*
 * One attempt to take name: without SPI when the lease is free and its row
 * uncontended (the common case), else through the statements.
 */
static LeaseAttempt
lease_attempt(const char *name, const char *holder, Datum ttl, bool wait,
			  TimestampTz deadline, LeaseRow *row)
{
	LeaseAttempt result;
	LeaseRow	prev = {0};
	FenceRow	fprev;
	FenceRow	frow;

	if (lease_fastpath_grant(name, holder, DatumGetIntervalP(ttl), &fprev,
							 &frow))
	{
		lease_row_from(&fprev, &prev);
		lease_row_from(&frow, row);
		result = LEASE_ATTEMPT_GRANTED;
	}
	else
		result = lease_attempt_spi(name, holder, ttl, wait, deadline, &prev,
								   row);

	/* The grant ended an expired lease (a released one was counted). */
	if (result == LEASE_ATTEMPT_GRANTED && prev.leased &&
		prev.expires_at != DT_NOBEGIN)
		lockfence_metrics_lease_ended((prev.expires_at - prev.accepted_at) / 1e6,
									  true);
	return result;
}

/* Read and check the arguments common to the acquire functions. */
static void
lease_acquire_args(FunctionCallInfo fcinfo, char **name, Datum *ttl,
				   char **holder)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease name must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease ttl must not be null")));
	*name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	lockfence_validate_resource(*name);
	*ttl = PG_GETARG_DATUM(1);
	if (interval_usecs(DatumGetIntervalP(*ttl)) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease ttl must be positive")));
	*holder = PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (*holder != NULL)
		lockfence_validate_holder(*holder);

	/* A grant is a write. */
	PreventCommandIfReadOnly("lockfence.lease_acquire()");
	PreventCommandDuringRecovery("lockfence.lease_acquire()");
	lockfence_failover_guard();
}

/* The (token, expires_at) record of a granted lease. */
static Datum
lease_result(FunctionCallInfo fcinfo, const LeaseRow *row)
{
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	tupdesc = BlessTupleDesc(tupdesc);
	values[0] = Int64GetDatum(row->token);
	values[1] = TimestampTzGetDatum(row->expires_at);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * Wait for name until granted; deadline 0 is forever.  A wait that
 * outlasts the deadline fails with 55P03.
 */
static void
lease_acquire_waiting(const char *name, const char *holder, Datum ttl,
					  TimestampTz deadline, LeaseRow *rowp)
{
	LeaseRow	row;

	lease_wait_prepare(name);
	for (;;)
	{
		TimestampTz now;
		long		sleep_ms;

		if (lease_attempt(name, holder, ttl, true, deadline, &row) ==
			LEASE_ATTEMPT_GRANTED)
			break;

		now = GetCurrentTimestamp();
		if (deadline != 0 && now >= deadline)
		{
			lease_wait_done();
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not acquire lease \"%s\" within wait_timeout", name),
					 errdetail("The lease of token " INT64_FORMAT " is held until %s.",
							   row.token, timestamptz_to_str(row.expires_at))));
		}

		/* Until the lease expires, a release is announced, or the deadline. */
		sleep_ms = (row.expires_at - now) / 1000 + 1;
		if (deadline != 0)
			sleep_ms = Min(sleep_ms, (deadline - now) / 1000 + 1);
		lease_wait_sleep(sleep_ms);
	}
	lease_wait_done();

	*rowp = row;
}

/*
 * lockfence.lease_acquire(name text, ttl interval, holder text DEFAULT NULL,
 *						   wait_timeout interval DEFAULT NULL,
 *						   OUT token bigint, OUT expires_at timestamptz)
 *
 * Take the lease, waiting while it is held (NULL wait_timeout: as long as
 * it takes).  A wait that outlasts wait_timeout fails with 55P03.
 */
Datum
lockfence_lease_acquire(PG_FUNCTION_ARGS)
{
	char	   *name;
	Datum		ttl;
	char	   *holder;
	TimestampTz started = GetCurrentTimestamp();
	TimestampTz deadline = 0;
	LeaseRow	row;

	lease_acquire_args(fcinfo, &name, &ttl, &holder);
	if (!PG_ARGISNULL(3))
	{
		double		usecs = interval_usecs(PG_GETARG_INTERVAL_P(3));

		if (usecs < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lease wait_timeout must not be negative")));
		/* 0 is "now"; deadline 0 would mean "forever" */
		deadline = started + (TimestampTz) Min(usecs, (double) PG_INT64_MAX / 4) + 1;
	}

	/* Count every acquisition that ends in an error (timeout, cancel). */
	PG_TRY();
	{
		lease_acquire_waiting(name, holder, ttl, deadline, &row);
	}
	PG_CATCH();
	{
		lockfence_metrics_lease_acquire_failed();
		PG_RE_THROW();
	}
	PG_END_TRY();

	lockfence_metrics_lease_acquired((GetCurrentTimestamp() - started) / 1e6);
	return lease_result(fcinfo, &row);
}

/*
 * lockfence.lease_try_acquire(name text, ttl interval, holder text DEFAULT NULL,
 *							   OUT token bigint, OUT expires_at timestamptz)
 *
 * Take the lease if it is free at once; NULL when it is held (or its row
 * is locked by a transaction still writing under the expired token).
 */
Datum
lockfence_lease_try_acquire(PG_FUNCTION_ARGS)
{
	char	   *name;
	Datum		ttl;
	char	   *holder;
	LeaseRow	row;
	TimestampTz started = GetCurrentTimestamp();

	lease_acquire_args(fcinfo, &name, &ttl, &holder);
	if (lease_attempt(name, holder, ttl, false, 0, &row) != LEASE_ATTEMPT_GRANTED)
		PG_RETURN_NULL();
	lockfence_metrics_lease_acquired((GetCurrentTimestamp() - started) / 1e6);
	return lease_result(fcinfo, &row);
}

/* Read name and token, the arguments of renew and release. */
static void
lease_token_args(FunctionCallInfo fcinfo, char **name, int64 *token)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease name must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease token must not be null")));
	*name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	lockfence_validate_resource(*name);
	*token = PG_GETARG_INT64(1);
	lockfence_validate_token(*token);
	PreventCommandIfReadOnly("lockfence.lease_renew()");
	PreventCommandDuringRecovery("lockfence.lease_renew()");
	lockfence_failover_guard();
}

/*
 * Raise lock lost for a lease that could not be renewed; row is the fence
 * row as it is now (found false: there is none).
 */
static void
lease_report_lost(const char *name, int64 token, bool found,
				  const LeaseRow *row)
{
	if (found && row->token > token)
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg("lease \"%s\" was taken over", name),
				 errdetail("Token " INT64_FORMAT " was presented, but token " INT64_FORMAT " has been granted or fenced since.",
						   token, row->token),
				 errhint("Stop writing under this lease; acquire it again to get a new token.")));
	if (found && row->token == token && row->leased &&
		row->expires_at == DT_NOBEGIN)
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg("lease \"%s\" was released", name),
				 errdetail("The lease of token " INT64_FORMAT " was released.", token),
				 errhint("Acquire the lease again to get a new token.")));
	if (found && row->token == token && row->leased)
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg("lease \"%s\" has expired", name),
				 errdetail("The lease of token " INT64_FORMAT " expired at %s.",
						   token, timestamptz_to_str(row->expires_at)),
				 errhint("Renew well before the TTL runs out; acquire the lease again to get a new token.")));
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
			 errmsg("lease \"%s\" with token " INT64_FORMAT " is not held", name, token),
			 errhint("Acquire the lease to get a token.")));
}

/*
 * lockfence.lease_renew(name text, token bigint, ttl interval DEFAULT NULL)
 *		returns timestamptz
 *
 * Extend an unexpired lease by ttl from now (NULL: the TTL it was granted
 * or last renewed with); returns the new expiry, or raises LF003 when the
 * lease expired, was released or was taken over.
 */
Datum
lockfence_lease_renew(PG_FUNCTION_ARGS)
{
	char	   *name;
	int64		token;
	Interval   *ttl = PG_ARGISNULL(2) ? NULL : PG_GETARG_INTERVAL_P(2);
	FenceStoreState state;
	LeaseRow	row;
	FenceRow	frow;
	bool		renewed;
	bool		found = false;

	lease_token_args(fcinfo, &name, &token);
	if (ttl != NULL && interval_usecs(ttl) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease ttl must be positive")));

	if (lease_fastpath_renew(name, token, ttl, &frow))
		PG_RETURN_TIMESTAMPTZ(frow.lease_expires_at);

	/* Contended, or not renewable: wait, re-check, tell why. */
	fence_store_enter(&state);
	renewed = lease_update_sub(LEASE_RENEW, name, token,
							   PointerGetDatum(ttl), ttl == NULL, &row);
	if (!renewed)
		found = lease_execute(LEASE_READ, name, 0, NULL, (Datum) 0, true,
							  &row) == 1;
	fence_store_leave(&state);

	if (!renewed)
		lease_report_lost(name, token, found, &row);
	PG_RETURN_TIMESTAMPTZ(row.expires_at);
}

/*
 * lockfence.lease_release(name text, token bigint) returns boolean
 *
 * End the lease at once; its token can no longer be fenced (LF003), and
 * waiters are woken when the transaction commits.  False when the lease
 * had already expired, been released or been taken over.
 */
Datum
lockfence_lease_release(PG_FUNCTION_ARGS)
{
	char	   *name;
	int64		token;
	FenceStoreState state;
	bool		released;
	LeaseRow	row;
	FenceRow	frow;

	lease_token_args(fcinfo, &name, &token);

	released = lease_fastpath_release(name, token, &frow);
	if (released)
		lease_row_from(&frow, &row);
	else
	{
		/* Contended, or not held: wait for the row and re-check. */
		fence_store_enter(&state);
		released = lease_update_sub(LEASE_RELEASE, name, token, (Datum) 0,
									true, &row);
		fence_store_leave(&state);
	}

	if (released)
	{
		lease_wait_announce_at_commit(name);
		lockfence_metrics_lease_ended((GetCurrentTimestamp() - row.accepted_at) / 1e6,
									  false);
	}
	PG_RETURN_BOOL(released);
}
