/*-------------------------------------------------------------------------
 *
 * fence_store.c
 *	  Reading and advancing the fence table lockfence.fences.
 *
 * The table is the durable record of the highest token accepted per
 * resource.  All access goes through SPI plans prepared once per backend,
 * with every operator schema-qualified, run as the table's owner: callers
 * have no write privilege on the table, and their search_path cannot
 * redirect anything.
 *
 * A check takes a row lock that lasts until the caller's transaction ends,
 * which is what makes the fence linearizable with the protected write:
 *
 *	- An equal token (the common case: one holder writing many times under
 *	  one lock) takes FOR SHARE, so such writers never block each other.
 *	- A higher token takes FOR NO KEY UPDATE and advances the row, after
 *	  every sharer of the old token and any other advancer have ended.
 *	- A lower token is rejected from a plain read and locks nothing.
 *	- When the caller requires an advance (a token the trigger found in a
 *	  row, which may be a copy of the recorded one), an equal token is
 *	  refused like a lower one: from a plain read, locking nothing.  A
 *	  competitor that advanced to the same token first makes us wait for it
 *	  as any advancer does, and then see the token as equal.
 *
 * Under READ COMMITTED, a locking statement that finds the version its
 * snapshot saw updated since locks the newest version before re-checking
 * its WHERE clause (EvalPlanQual), and keeps that lock even when the
 * re-check fails: whether it waited for the updater, or the update merely
 * committed between its snapshot and its lock (even with SKIP LOCKED).
 * So no locking statement runs outside a subtransaction here: the
 * uncontended locks are taken in C (fence_fastpath.c) on exactly the
 * version judged, never waiting and never following an update chain; when
 * that fails, a check waits with a statement in an internal subtransaction
 * that is kept when the wait yields the lock the verdict needs and rolled
 * back otherwise, and then looks again.  Rejected checks therefore never
 * leave a lock behind (try_fence() may go on with its transaction),
 * accepted ones hold exactly the lock they need, and waiting advancers
 * keep their place in the row lock queue.  The uncontended path needs no
 * subtransaction (which matters for bulk writes that fence many resources
 * in one transaction).
 *
 * Under REPEATABLE READ and SERIALIZABLE, locking a row that a concurrent
 * transaction advanced after our snapshot raises a serialization failure;
 * a stale token is never accepted.
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
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/resowner.h"
#include "utils/syscache.h"

#include "failover_guard.h"
#include "lockfence.h"

/* The statements, and their saved plans (prepared on first use). */
typedef enum FenceStatement
{
	FENCE_SHARE_EQUAL_WAIT,
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
#define FENCE_LEASE_UNEXPIRED(l) \
	((l) ? " AND (lease_expires_at IS NULL" \
	 " OR lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())" : "")
#define FENCE_LEASE_CLEAR(l)	((l) ? ", lease_expires_at = NULL, lease_ttl = NULL" : "")

#define FENCE_SHARE_EQUAL_SQL \
	"SELECT token, holder, %s FROM lockfence.fences" \
	" WHERE resource OPERATOR(pg_catalog.=) $1" \
	" AND token OPERATOR(pg_catalog.=) $2" \
	" AND (holder IS NULL OR $3 IS NULL OR holder OPERATOR(pg_catalog.=) $3)" \
	"%s FOR SHARE"

#define FENCE_RAISE_SQL \
	"UPDATE lockfence.fences" \
	" SET token = $2, accepted_at = pg_catalog.statement_timestamp()," \
	" holder = $3%s" \
	" WHERE resource OPERATOR(pg_catalog.=) $1" \
	" AND token OPERATOR(pg_catalog.<) $2" \
	" RETURNING token"

static const char *const fence_statement_sql[FENCE_NUM_STATEMENTS] = {
	/*
	 * FENCE_SHARE_EQUAL_WAIT: share the row if it holds exactly this token,
	 * waiting for an advance in flight
	 */
	FENCE_SHARE_EQUAL_SQL,

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

	/* FENCE_DELETE */
	"DELETE FROM lockfence.fences"
	" WHERE resource OPERATOR(pg_catalog.=) $1"
	" RETURNING token",
};

/* Saved plans, without [0] and with [1] the lease columns. */
static SPIPlanPtr fence_plans[2][FENCE_NUM_STATEMENTS];

/* Does lockfence.fences have the lease columns?  Set by fence_store_enter. */
static bool fence_has_leases = false;

/*
 * The owner of lockfence.fences, as whom the statements run.  Looked up on
 * every use: DROP and CREATE EXTENSION may change it within a session.
 */
static Oid
fence_table_owner(void)
{
	Oid			nspid = get_namespace_oid("lockfence", false);
	Oid			relid = get_relname_relid("fences", nspid);
	HeapTuple	tuple;
	Oid			owner;

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"lockfence.fences\" does not exist"),
				 errhint("Reinstall the extension with DROP EXTENSION lockfence and CREATE EXTENSION lockfence.")));
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	fence_has_leases = get_attnum(relid, "lease_expires_at") != InvalidAttrNumber;
	return owner;
}

/*
 * The text of a statement, for the schema's lease columns (or their lack).
 */
static char *
fence_statement_text(FenceStatement stmt)
{
	bool		l = fence_has_leases;

	switch (stmt)
	{
		case FENCE_SHARE_EQUAL_WAIT:
			return psprintf(fence_statement_sql[stmt], FENCE_LEASE_COLUMN(l),
							FENCE_LEASE_UNEXPIRED(l));
		case FENCE_READ:
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
fence_execute(FenceStatement stmt, const char *resource, int64 token,
			  const char *holder)
{
	static const Oid argtypes[3] = {TEXTOID, INT8OID, TEXTOID};
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	int			rc;

	SPIPlanPtr *planp = &fence_plans[fence_has_leases ? 1 : 0][stmt];

	if (*planp == NULL)
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

	rc = SPI_execute_plan(*planp, values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for lockfence statement %d: %s",
			 (int) stmt, SPI_result_code_string(rc));
	return SPI_processed;
}

/*
 * Copy (token, holder) of the first result row into the outcome, in the
 * caller's memory context (SPI's goes away at SPI_finish).
 */
static void
fence_fetch_row(FenceOutcome *outcome, MemoryContext callercxt)
{
	HeapTuple	tuple = SPI_tuptable->vals[0];
	TupleDesc	tupdesc = SPI_tuptable->tupdesc;
	bool		isnull;
	Datum		d;

	outcome->highest = DatumGetInt64(SPI_getbinval(tuple, tupdesc, 1, &isnull));
	d = SPI_getbinval(tuple, tupdesc, 2, &isnull);
	outcome->highest_holder = isnull ? NULL :
		MemoryContextStrdup(callercxt, TextDatumGetCString(d));
	d = SPI_getbinval(tuple, tupdesc, 3, &isnull);
	outcome->leased = !isnull;
	outcome->lease_expires_at = isnull ? 0 : DatumGetTimestampTz(d);
}

static bool
holders_conflict(const char *recorded, const char *presented)
{
	return recorded != NULL && presented != NULL &&
		strcmp(recorded, presented) != 0;
}

/*
 * Judge a token against the row just read into outcome.  A holder conflict
 * is reported before a missing advance: it is the same verdict fence()
 * gives for that token.
 */
static void
fence_judge(FenceOutcome *outcome, int64 token, const char *holder,
			bool must_advance)
{
	if (token < outcome->highest)
		outcome->verdict = FENCE_STALE;
	else if (token == outcome->highest &&
			 holders_conflict(outcome->highest_holder, holder))
		outcome->verdict = FENCE_HOLDER_CONFLICT;
	else if (token == outcome->highest && must_advance)
		outcome->verdict = FENCE_NOT_ADVANCED;
	else if (token == outcome->highest && outcome->leased &&
			 outcome->lease_expires_at <= GetCurrentTimestamp())
		outcome->verdict = FENCE_LEASE_LOST;
	else
		outcome->verdict = FENCE_ACCEPTED;
}

/*
 * Enter the fence table's context: run as its owner, connected to SPI.
 * An error between enter and leave needs no cleanup here: transaction
 * abort restores the user id and closes SPI.
 */
void
fence_store_enter(FenceStoreState *state)
{
	GetUserIdAndSecContext(&state->save_userid, &state->save_sec_context);
	SetUserIdAndSecContext(fence_table_owner(),
						   state->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

void
fence_store_leave(FenceStoreState *state)
{
	SPI_finish();
	SetUserIdAndSecContext(state->save_userid, state->save_sec_context);
}

/*
 * Run a statement that may wait for other transactions' row locks in an
 * internal subtransaction.  Returns true, keeping the subtransaction's
 * locks and changes, if the statement returned a row; otherwise rolls the
 * subtransaction back, releasing whatever lock the wait left behind.
 */
/* fence_execute_waiting's arguments, for lockfence_run_in_subxact */
typedef struct FenceWaitingStep
{
	FenceStatement stmt;
	const char *resource;
	int64		token;
	const char *holder;
	FenceOutcome *outcome;
	MemoryContext callercxt;
} FenceWaitingStep;

static bool
fence_execute_waiting_step(void *arg)
{
	FenceWaitingStep *step = (FenceWaitingStep *) arg;
	bool		got_row;

	got_row = fence_execute(step->stmt, step->resource, step->token,
							step->holder) == 1;
	if (got_row && step->stmt == FENCE_SHARE_EQUAL_WAIT)
		fence_fetch_row(step->outcome, step->callercxt);
	return got_row;
}

static bool
fence_execute_waiting(FenceStatement stmt, const char *resource, int64 token,
					  const char *holder, FenceOutcome *outcome,
					  MemoryContext callercxt)
{
	FenceWaitingStep step = {stmt, resource, token, holder, outcome, callercxt};

	return lockfence_run_in_subxact(fence_execute_waiting_step, &step);
}

static void
fence_accept_advance(FenceOutcome *outcome, int64 token, const char *holder,
					 MemoryContext callercxt)
{
	outcome->verdict = FENCE_ACCEPTED;
	outcome->highest = token;
	outcome->highest_holder = holder ?
		MemoryContextStrdup(callercxt, holder) : NULL;
	outcome->leased = false;
}

/*
 * Check token for resource against the fence table in the current
 * transaction, advancing the fence when the token is higher.  With
 * must_advance, only an advance (or a resource's first token) is accepted:
 * an equal token gets FENCE_NOT_ADVANCED and locks nothing.  The verdict
 * and the fence as it stands afterwards are returned in *outcome.
 */
void
fence_store_check(const char *resource, int64 token, const char *holder,
				  bool must_advance, FenceOutcome *outcome)
{
	MemoryContext callercxt = CurrentMemoryContext;
	FenceStoreState state;

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
	PreventCommandIfReadOnly("lockfence.fence()");

	/* The common case, served without SPI when nothing stands in the way. */
	if (!must_advance &&
		fence_fastpath_share_equal(resource, token, holder, outcome,
								   callercxt))
		return;

	fence_store_enter(&state);

	for (bool retry = false;; retry = true)
	{
		CHECK_FOR_INTERRUPTS();

		/*
		 * After a wait: the token recorded, by a compatible holder?  (Inside
		 * SPI: the outcome must go to the caller's context, not SPI's.)
		 */
		if (retry && !must_advance &&
			fence_fastpath_share_equal(resource, token, holder, outcome,
									   callercxt))
			break;

		if (fence_execute(FENCE_READ, resource, token, holder) != 1)
		{
			/* A new resource; a concurrent first fence makes us look again. */
			if (lockfence_failover_floor_rejects(token, outcome))
				break;
			if (fence_execute(FENCE_INSERT, resource, token, holder) == 1)
			{
				fence_accept_advance(outcome, token, holder, callercxt);
				break;
			}
			continue;
		}

		/*
		 * Lower, equal from another holder, or equal where an advance is
		 * required: reject, lock nothing.
		 */
		fence_fetch_row(outcome, callercxt);
		fence_judge(outcome, token, holder, must_advance);
		if (outcome->verdict != FENCE_ACCEPTED)
			break;

		if (token == outcome->highest)
		{
			/* Equal, but the row is being advanced or reset: wait. */
			if (fence_execute_waiting(FENCE_SHARE_EQUAL_WAIT, resource, token,
									  holder, outcome, callercxt))
			{
				outcome->verdict = FENCE_ACCEPTED;
				break;
			}
			continue;
		}

		/*
		 * Higher: lock the row if nobody holds it and it has not changed
		 * since we read it, else wait in line (or read it again).
		 */
		if (fence_fastpath_lock_lower(resource, token))
		{
			if (fence_execute(FENCE_RAISE, resource, token, holder) != 1)
				elog(ERROR, "fence row for resource \"%s\" changed while locked",
					 resource);
			fence_accept_advance(outcome, token, holder, callercxt);
			break;
		}
		if (fence_execute_waiting(FENCE_RAISE_WAIT, resource, token, holder,
								  outcome, callercxt))
		{
			fence_accept_advance(outcome, token, holder, callercxt);
			break;
		}
	}

	fence_store_leave(&state);
}

/*
 * The highest token accepted for resource, as this transaction's snapshot
 * sees it.  Returns false for an unknown resource.
 */
bool
fence_store_current(const char *resource, int64 *token)
{
	MemoryContext callercxt = CurrentMemoryContext;
	FenceStoreState state;
	FenceOutcome outcome;
	bool		found;

	fence_store_enter(&state);
	found = fence_execute(FENCE_READ, resource, 0, NULL) == 1;
	if (found)
	{
		fence_fetch_row(&outcome, callercxt);
		*token = outcome.highest;
	}
	fence_store_leave(&state);
	return found;
}

/*
 * Delete the fence row of resource.  Returns false if there was none.
 */
bool
fence_store_delete(const char *resource)
{
	FenceStoreState state;
	bool		found;

	fence_store_enter(&state);
	found = fence_execute(FENCE_DELETE, resource, 0, NULL) == 1;
	fence_store_leave(&state);
	return found;
}
