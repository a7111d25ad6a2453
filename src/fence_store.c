/*-------------------------------------------------------------------------
 *
 * fence_store.c
 *	  Reading and advancing the fence table lockfence.fences.
 *
 * The table is the durable record of the highest token accepted per
 * resource.  All access goes through SPI plans prepared once per backend,
 * with every operator schema-qualified, run as the table's owner
 * (fence_owner.c): callers have no write privilege on the table, and their
 * search_path cannot redirect anything.
 *
 * A check takes the resource lock (fence_lock.c) that lasts until the
 * caller's transaction ends, and only then reads the row (in C through
 * fence_fastpath_read, or with FENCE_READ when the table is not as the
 * install scripts make it) and judges it (fence_decide.c).  That is what
 * makes the fence linearizable with the protected write:
 *
 *	- An equal token (the common case: one holder writing many times under
 *	  one lock) holds ShareLock and no row lock, so such writers never
 *	  block each other, and write no WAL for the check.
 *	- A higher token takes ExclusiveLock and advances the row, after every
 *	  sharer of the old token and any other advancer have ended.
 *	- A lower token, or an equal one where an advance is required (a token
 *	  the trigger found in a row, which may be a copy), is refused, and the
 *	  lock taken for it is given back.
 *
 * The advance itself locks the row FOR NO KEY UPDATE without waiting in C
 * (fence_fastpath_lock_lower) and updates it with FENCE_RAISE; a row held
 * by a writer that does not take the resource lock is waited for by
 * FENCE_RAISE_WAIT in an internal subtransaction, rolled back when the row
 * changed meanwhile (under READ COMMITTED such a statement keeps the lock
 * on the newest version even when its re-check fails).
 *
 * Under REPEATABLE READ and SERIALIZABLE, a check that would accept a row
 * that a concurrent transaction advanced, created or deleted after our
 * snapshot raises a serialization failure; a stale token is never
 * accepted.
 *
 * IDENTIFICATION
 *	  src/fence_store.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/resowner.h"

#include "citus_guard.h"
#include "fence_lock.h"
#include "fence_owner.h"
#include "fence_fastpath.h"
#include "lease.h"
#include "lockfence.h"

/* The statements, and their saved plans (prepared on first use). */
typedef enum FenceStatement
{
	FENCE_READ,
	FENCE_RAISE,
	FENCE_RAISE_WAIT,
	FENCE_INSERT,
	FENCE_DELETE,
	FENCE_NUM_STATEMENTS
} FenceStatement;

/*
 * Leases (lease.c) keep a lease's expiry in the fence row, from version 1.2
 * of the SQL on: an equal token whose lease expired or was released is
 * lock lost.  The statements come in two variants, with and without the
 * lease columns, because the library may run against an older schema
 * until ALTER EXTENSION UPDATE (no lease exists there).
 */
#define FENCE_LEASE_COLUMN(l)	((l) ? "lease_expires_at" : "NULL::pg_catalog.timestamptz")
#define FENCE_LEASE_CLEAR(l)	((l) ? ", lease_expires_at = NULL, lease_ttl = NULL" : "")

#define FENCE_RAISE_SQL \
	"UPDATE lockfence.fences" \
	" SET token = $2, accepted_at = pg_catalog.statement_timestamp()," \
	" holder = $3%s" \
	" WHERE resource OPERATOR(pg_catalog.=) $1" \
	" AND token OPERATOR(pg_catalog.<) $2" \
	" RETURNING token"

static const char *const fence_statement_sql[FENCE_NUM_STATEMENTS] = {
	/* FENCE_READ */
	"SELECT token, holder, %s FROM lockfence.fences"
	" WHERE resource OPERATOR(pg_catalog.=) $1",

	/* FENCE_RAISE: advance a row locked by fence_fastpath_lock_lower */
	FENCE_RAISE_SQL,
	/* FENCE_RAISE_WAIT: advance, waiting for the row's lockers */
	FENCE_RAISE_SQL,

	/* FENCE_INSERT: the first token of a resource */
	"INSERT INTO lockfence.fences (resource, token, accepted_at, holder)"
	" VALUES ($1, $2, pg_catalog.statement_timestamp(), $3)"
	" ON CONFLICT (resource) DO NOTHING"
	" RETURNING token",

	/* FENCE_DELETE: returns the row as FENCE_READ reads it */
	"DELETE FROM lockfence.fences"
	" WHERE resource OPERATOR(pg_catalog.=) $1"
	" RETURNING token, holder, %s",
};

/* Saved plans, without [0] and with [1] the lease columns. */
static SPIPlanPtr fence_plans[2][FENCE_NUM_STATEMENTS];

/*
 * The text of a statement, for the schema's lease columns (or their lack).
 */
static char *
fence_statement_text(FenceStatement stmt)
{
	bool		l = fence_store_has_leases();

	switch (stmt)
	{
		case FENCE_READ:
		case FENCE_DELETE:
			return psprintf(fence_statement_sql[stmt], FENCE_LEASE_COLUMN(l));
		case FENCE_RAISE:
		case FENCE_RAISE_WAIT:
			return psprintf(fence_statement_sql[stmt], FENCE_LEASE_CLEAR(l));
		default:
			return pstrdup(fence_statement_sql[stmt]);
	}
}

/*
 * Run one statement with (resource, token, holder) as parameters; token
 * and holder are ignored by statements that do not use them.  Returns the
 * number of rows processed; the rows are in SPI_tuptable.
 */
static uint64
fence_execute_snapshot(FenceStatement stmt, const char *resource, int64 token,
					   const char *holder, bool latest)
{
	static const Oid argtypes[3] = {TEXTOID, INT8OID, TEXTOID};
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	int			rc;

	int			variant = fence_store_has_leases() ? 1 : 0;
	SPIPlanPtr *planp = &fence_plans[variant][stmt];
	SPIPlanPtr	shard_plan;
	Oid			shard = lockfence_citus_fence_shard(resource);

	/*
	 * On Citus, the statement on the local shard holding resource, planned
	 * once per shard (citus_fences.c).
	 */
	if (OidIsValid(shard))
	{
		int			slot = LOCKFENCE_CITUS_SLOTS_FENCE +
			variant * FENCE_NUM_STATEMENTS + stmt;

		/* the statement's text is built for the first use only */
		shard_plan = lockfence_citus_kept_plan(shard, slot);
		if (shard_plan == NULL)
			shard_plan = lockfence_citus_shard_plan(shard, slot,
													fence_statement_text(stmt),
													3, argtypes);
		planp = &shard_plan;
	}
	else if (*planp == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(fence_statement_text(stmt), 3,
									   (Oid *) argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for lockfence statement %d: %s",
				 (int) stmt, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*planp = plan;
	}

	values[0] = CStringGetTextDatum(resource);
	values[1] = Int64GetDatum(token);
	if (holder != NULL)
		values[2] = CStringGetTextDatum(holder);
	else
	{
		values[2] = (Datum) 0;
		nulls[2] = 'n';
	}

	if (latest)
		rc = SPI_execute_snapshot(*planp, values, nulls, GetLatestSnapshot(),
								  InvalidSnapshot, true, false, 0);
	else
		rc = SPI_execute_plan(*planp, values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for lockfence statement %d: %s",
			 (int) stmt, SPI_result_code_string(rc));
	return SPI_processed;
}

static uint64
fence_execute(FenceStatement stmt, const char *resource, int64 token,
			  const char *holder)
{
	return fence_execute_snapshot(stmt, resource, token, holder, false);
}

/*
 * Read the first result row of FENCE_READ into *row, in the current memory
 * context (inside SPI: SPI's, gone at fence_store_leave).
 */
static void
fence_fetch_row(FenceRow *row)
{
	HeapTuple	tuple = SPI_tuptable->vals[0];
	TupleDesc	tupdesc = SPI_tuptable->tupdesc;
	bool		isnull;
	Datum		d;

	memset(row, 0, sizeof(FenceRow));
	row->token = DatumGetInt64(SPI_getbinval(tuple, tupdesc, 1, &isnull));
	d = SPI_getbinval(tuple, tupdesc, 2, &isnull);
	row->holder = isnull ? NULL : TextDatumGetCString(d);
	d = SPI_getbinval(tuple, tupdesc, 3, &isnull);
	row->leased = !isnull;
	row->lease_expires_at = isnull ? 0 : DatumGetTimestampTz(d);
}

/*
 * Run FENCE_RAISE_WAIT, which may wait for other transactions' row locks,
 * in an internal subtransaction.  Returns true, keeping the
 * subtransaction's lock and change, if the statement advanced the row;
 * otherwise rolls the subtransaction back, releasing whatever row lock the
 * wait left behind.  (With the resource lock held in ExclusiveLock mode no
 * fencer holds the row; what may still hold it is a statement that writes
 * fence rows without the resource lock, such as an operator's own.)
 */
typedef struct FenceRaiseStep
{
	const char *resource;
	int64		token;
	const char *holder;
} FenceRaiseStep;

static bool
fence_raise_waiting_step(void *arg)
{
	FenceRaiseStep *step = (FenceRaiseStep *) arg;

	return fence_execute(FENCE_RAISE_WAIT, step->resource, step->token,
						 step->holder) == 1;
}

/*
 * Read the fence row of resource into *row, after the resource lock: in
 * C when the table allows it, else with a statement (entering SPI, once,
 * for the rest of the check).  Returns false when the resource has none.
 */
static bool
fence_read(const char *resource, bool latest, FenceRow *row, bool *in_spi,
		   FenceStoreState *state)
{
	switch (fence_fastpath_read(resource, latest, row))
	{
		case FENCE_ROW_FOUND:
			return true;
		case FENCE_ROW_ABSENT:
			return false;
		case FENCE_ROW_UNREADABLE:
			break;
	}
	if (!*in_spi)
	{
		fence_store_enter(state);
		*in_spi = true;
	}
	if (fence_execute_snapshot(FENCE_READ, resource, 0, NULL, latest) != 1)
		return false;
	fence_fetch_row(row);
	return true;
}

/*
 * Under REPEATABLE READ and SERIALIZABLE the row was read as the
 * transaction's snapshot sees it, and the verdict (action) drawn from it
 * must still hold for the newest version, or the check fails as a
 * serialization failure, as locking such a row raises; a retry sees the
 * row as it is.  (Under READ COMMITTED the snapshot was taken after the
 * resource lock, and is current.)
 *
 * A check that would accept must not build on a token that a transaction
 * committed since then has replaced (or on a row it inserted or deleted),
 * nor on a row whose newest version the same check would refuse: the same
 * token with its lease released or expired since, or with another holder.
 * (A renewal that leaves the lease valid is not: a lease holder may renew
 * from another connection while it writes.)  A refusal must be the one
 * the newest version gives: not one it would not give at all (a lease
 * renewed since, whose old expiry has passed; a fence reset): "the lease
 * is no longer held" (LF003) tells its holder to stop; nor another one: a
 * refusal for want of a fence in this transaction (LF002, whose hint says
 * to fence) where the newest version refuses the token for good, or LF003
 * where the newest version shows the lease renewed and wants a fence.  The
 * retry that the serialization failure asks for gets the true verdict.
 */
static void
fence_check_serializable(const char *resource, int64 token,
						 const char *holder, bool must_advance,
						 FenceAction action, FenceVerdict outcome_verdict,
						 bool found, const FenceRow *row,
						 bool *in_spi, FenceStoreState *state)
{
	FenceRow	latest;
	bool		latest_found;
	bool		latest_refuses;
	FenceOutcome judged;

	if (!IsolationUsesXactSnapshot())
		return;
	latest_found = fence_read(resource, true, &latest, in_spi, state);
	latest_refuses = fence_decide(latest_found ? &latest : NULL, token,
								  holder, must_advance, &judged) ==
		FENCE_ACTION_REFUSE;
	if (action == FENCE_ACTION_REFUSE ?
		(!latest_refuses || judged.verdict != outcome_verdict) :
		(latest_found != found || latest_refuses ||
		 (found && latest.token != row->token)))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update"),
				 errdetail("The fence row of resource \"%s\" changed after this transaction's snapshot.",
						   resource)));
}

/*
 * Write what fence_decide asked for, holding the resource lock in
 * ExclusiveLock mode: advance the row to token, or insert the resource's
 * first row.  Returns false when the row was not as read (changed or
 * created by a writer that does not take the resource lock): read again.
 */
static bool
fence_write(FenceAction action, const char *resource, int64 token,
			const char *holder, bool *in_spi, FenceStoreState *state)
{
	FenceRaiseStep step = {resource, token, holder};

	if (!*in_spi)
	{
		fence_store_enter(state);
		*in_spi = true;
	}
	if (action == FENCE_ACTION_INSERT)
		return fence_execute(FENCE_INSERT, resource, token, holder) == 1;

	/* Lock the row if nobody holds it and it is as read, else wait. */
	if (fence_fastpath_lock_lower(resource, token))
	{
		if (fence_execute(FENCE_RAISE, resource, token, holder) != 1)
			elog(ERROR, "fence row for resource \"%s\" changed while locked",
				 resource);
		return true;
	}
	return lockfence_run_in_subxact(fence_raise_waiting_step, &step);
}

/*
 * Check token for resource against the fence table in the current
 * transaction, advancing the fence when the token is higher.  With
 * must_advance, only an advance (or a resource's first token) is accepted:
 * an equal token gets FENCE_NOT_ADVANCED and locks nothing.  The verdict
 * and the fence as it stands afterwards are returned in *outcome.
 * funcname, the SQL function called, names it in the error of a check in
 * a read-only transaction.  An advance over a lease ends the lease: its
 * waiters are woken at commit, as after a release.
 *
 * The resource lock (fence_lock.c) comes first, the row is read and judged
 * after it: ShareLock for the common equal token, which then holds no row
 * lock at all; ExclusiveLock to write the row.  A check that finds it must
 * write after taking ShareLock gives that back before asking for
 * ExclusiveLock (two such checks would deadlock otherwise), and reads the
 * row again.  A refused check gives back what it took: try_fence() may go
 * on with its transaction, blocking nobody.
 *
 * (Over 80 lines, kept whole: the lock mode, the read, the verdict and the
 * write are one loop whose steps decide each other's retries; split, the
 * order of lock and read that the guarantee rests on would be spread
 * over functions.)
 */
/* Reads and writes of one check that disagree before it gives up. */
#define FENCE_STORE_MAX_WRITES	10

void
fence_store_check(const char *resource, int64 token, const char *holder,
				  bool must_advance, const char *funcname,
				  FenceOutcome *outcome)
{
	MemoryContext callercxt = CurrentMemoryContext;
	FenceStoreState state;
	bool		in_spi = false;
	LOCKMODE	mode = ShareLock;
	bool		locked = false;
	int			failed_writes = 0;

	/*
	 * A check may advance or lock the fence: it is a write.  On a standby
	 * every transaction is read-only, so recovery is tested first to tell
	 * the caller where the fence can be written.
	 */
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot fence a resource while the server is in recovery"),
				 errdetail("This server is a standby: fences are written on the primary only."),
				 errhint("Connect to the primary server.")));
	PreventCommandIfReadOnly(funcname);

	for (;;)
	{
		FenceRow	row;
		bool		found;
		FenceAction action;

		CHECK_FOR_INTERRUPTS();

		if (!locked)
			(void) fence_lock_acquire(resource, mode, true);
		locked = true;

		found = fence_read(resource, false, &row, &in_spi, &state);
		action = fence_decide(found ? &row : NULL, token, holder,
							  must_advance, outcome);
		fence_check_serializable(resource, token, holder, must_advance,
								 action, outcome->verdict, found, &row,
								 &in_spi, &state);

		if (action == FENCE_ACTION_REFUSE)
		{
			fence_lock_release(resource, mode);
			break;
		}
		if (action == FENCE_ACTION_SHARE)
		{
			/* Another advanced to our token while we waited: share it. */
			if (mode == ExclusiveLock)
			{
				(void) fence_lock_acquire(resource, ShareLock, true);
				fence_lock_release(resource, ExclusiveLock);
			}
			break;
		}
		if (mode == ShareLock)
		{
			fence_lock_release(resource, ShareLock);
			mode = ExclusiveLock;
			locked = false;
			continue;
		}
		if (fence_write(action, resource, token, holder, &in_spi, &state))
		{
			/* an advance over a lease ends it: its waiters look again */
			if (found && row.leased)
				lease_wait_announce_at_commit(resource);
			outcome->verdict = FENCE_ACCEPTED;
			outcome->highest = token;
			outcome->highest_holder = (char *) holder;
			outcome->leased = false;
			break;
		}

		/*
		 * The row changed between the read and the write, though no other
		 * check can write it while we hold ExclusiveLock: read and try
		 * again, a few times.  A write that keeps failing means the read
		 * and the write do not see the same table (a broken shard lookup
		 * did that on Citus); refuse rather than spin.
		 */
		if (++failed_writes >= FENCE_STORE_MAX_WRITES)
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not record the fence of resource \"%s\"", resource),
					 errdetail("The fence row was read, then its write found it changed, %d times in a row while the resource was locked.",
							   failed_writes)));
	}

	/* The outcome's holder outlives the statements' memory. */
	if (outcome->highest_holder != NULL)
		outcome->highest_holder = MemoryContextStrdup(callercxt,
													  outcome->highest_holder);
	if (in_spi)
		fence_store_leave(&state);
}

/*
 * Read resource's fence row with a statement, as this transaction's
 * snapshot sees it or (latest) its newest committed version, outside any
 * check.  Returns false for an unknown resource.  Only the scalar fields
 * of *row are filled: the holder's copy was in the statement's memory.
 */
static bool
fence_store_read_row(const char *resource, bool latest, FenceRow *row)
{
	FenceStoreState state;
	bool		found;

	fence_store_enter(&state);
	found = fence_execute_snapshot(FENCE_READ, resource, 0, NULL, latest) == 1;
	if (found)
		fence_fetch_row(row);
	fence_store_leave(&state);
	if (found)
		row->holder = NULL;
	return found;
}

/*
 * The highest token accepted for resource, as this transaction's snapshot
 * sees it.  Returns false for an unknown resource.
 */
bool
fence_store_current(const char *resource, int64 *token)
{
	FenceRow	row;

	if (!fence_store_read_row(resource, false, &row))
		return false;
	*token = row.token;
	return true;
}

/*
 * The newest committed version of resource's fence row, for a caller whose
 * own snapshot is the transaction's and whose fast-path read could not
 * read the table (FENCE_ROW_UNREADABLE: a table not as installed, a Citus
 * shard).  Returns false for an unknown resource; holder is NULL.
 */
bool
fence_store_read_latest(const char *resource, FenceRow *row)
{
	return fence_store_read_row(resource, true, row);
}

/*
 * Delete the fence row of resource.  Returns false if there was none.
 *
 * Not while the row carries a lease that has not ended: the next grant
 * would start again from the floor and could hand its holder's token to
 * another, both then fencing with it (and the old holder's renewals
 * renewing the new lease).  The error rolls the deletion back.
 */
bool
fence_store_delete(const char *resource)
{
	FenceStoreState state;
	FenceRow	row;
	bool		found;

	/* After every transaction that fenced the resource: a write. */
	(void) fence_lock_acquire(resource, ExclusiveLock, true);
	fence_store_enter(&state);
	found = fence_execute(FENCE_DELETE, resource, 0, NULL) == 1;
	if (found)
		fence_fetch_row(&row);
	fence_store_leave(&state);
	if (found && row.leased && row.lease_expires_at > GetCurrentTimestamp())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("cannot reset resource \"%s\" while its lease is held", resource),
				 errdetail("The lease of token " INT64_FORMAT " is held until %s; a grant after the reset would start again from the floor and could give that token to another holder.",
						   row.token, timestamptz_to_str(row.lease_expires_at)),
				 errhint("Release the lease, wait until it expires, or end it with lockfence.raise_floor(), which keeps its tokens increasing.")));
	return found;
}
