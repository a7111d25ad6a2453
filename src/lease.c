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
 * Exactness comes from the resource lock (fence_lock.c):
 *
 *	- fence(name, token) with the lease token holds it in ShareLock mode,
 *	  and is accepted only while the lease is unexpired (fence_decide.c
 *	  looks at lease_expires_at, after the lock); an expired or released
 *	  lease token is lock lost (LF003).
 *	- A grant, renewal or release takes it in ExclusiveLock mode before it
 *	  reads the row, so it waits for every transaction that fenced with the
 *	  old token, and then re-checks that the lease is still free (or held).
 *
 * Hence in commit order the writes under successive leases never
 * interleave.  A transaction that fenced before the expiry keeps its
 * share lock, and may go on writing, past the expiry until it ends; the
 * successor's grant waits for it.
 *
 * The clock is the server's; it decides only when a lease is free, never
 * whether two holders' writes may interleave.  It is read after the
 * resource lock, the table lock and the row lock are taken (after any wait for them), and the lease
 * is judged by lease_decide (lease_decide.c), the same for the statements
 * here and the fast path.
 *
 * An uncontended grant, renewal or release (the lease free, or held with
 * the token; nobody holding the row; the row unchanged since our snapshot)
 * is written without any statement (lease_fastpath.c): that is the common
 * case, and the one whose cost matters.  Everything else runs the
 * statements below, which wait, re-check and tell why an operation failed.
 *
 * Every statement that locks the fence row runs in an internal
 * subtransaction rolled back when the operation is refused: a locking statement
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

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "citus_guard.h"
#include "error_cleanup.h"
#include "failover_guard.h"
#include "fence_lock.h"
#include "lease.h"
#include "fence_owner.h"
#include "floor_state.h"
#include "lockfence.h"
#include "metrics.h"
#include "wait_timeout.h"

PG_FUNCTION_INFO_V1(lockfence_lease_acquire);
PG_FUNCTION_INFO_V1(lockfence_lease_try_acquire);
PG_FUNCTION_INFO_V1(lockfence_lease_renew);
PG_FUNCTION_INFO_V1(lockfence_lease_release);


/*
 * Statements; parameters ($1 name, then the row to write: $2 token,
 * $3 holder, $4 lease_ttl, $5 accepted_at, $6 lease_expires_at).  They
 * only read, lock and write rows: whether a lease is free, held or lost is
 * decided in C by lease_decide, on the row locked, with the clock read
 * after the lock, as the fast path does.
 */
typedef enum LeaseStatement
{
	LEASE_READ,
	LEASE_LOCK,
	LEASE_LOCK_SKIP,
	LEASE_SET,
	LEASE_INSERT,
	LEASE_NUM_STATEMENTS
} LeaseStatement;

#define LEASE_COLUMNS " token, lease_expires_at, accepted_at, holder, lease_ttl"

static const char *const lease_statement_sql[LEASE_NUM_STATEMENTS] = {
	/* LEASE_READ: a look without any lock, to see whether a grant may start */
	"SELECT" LEASE_COLUMNS " FROM lockfence.fences"
	" WHERE resource OPERATOR(pg_catalog.=) $1",

	/*
	 * LEASE_LOCK: the row as the write will find it; waits for its lockers
	 * (transactions that fenced with the token, a competing grant, renewal
	 * or release).
	 */
	"SELECT" LEASE_COLUMNS " FROM lockfence.fences"
	" WHERE resource OPERATOR(pg_catalog.=) $1 FOR NO KEY UPDATE",

	/* LEASE_LOCK_SKIP: the same without waiting (lease_try_acquire) */
	"SELECT" LEASE_COLUMNS " FROM lockfence.fences"
	" WHERE resource OPERATOR(pg_catalog.=) $1 FOR NO KEY UPDATE SKIP LOCKED",

	/* LEASE_SET: the row lease_decide made, on the row locked above */
	"UPDATE lockfence.fences"
	" SET token = $2, accepted_at = $5, holder = $3,"
	" lease_expires_at = $6, lease_ttl = $4"
	" WHERE resource OPERATOR(pg_catalog.=) $1"
	" RETURNING" LEASE_COLUMNS,

	/* LEASE_INSERT: the first token of a name (lease_decide puts it above the failover floor) */
	"INSERT INTO lockfence.fences"
	" (resource, token, accepted_at, holder, lease_expires_at, lease_ttl)"
	" VALUES ($1, $2, $5, $3, $6, $4)"
	" ON CONFLICT (resource) DO NOTHING"
	" RETURNING" LEASE_COLUMNS,
};

static SPIPlanPtr lease_plans[LEASE_NUM_STATEMENTS];

typedef enum LeaseAttempt
{
	LEASE_ATTEMPT_GRANTED,
	LEASE_ATTEMPT_HELD,			/* an unexpired lease: wait for its end */
	LEASE_ATTEMPT_LOCKED,		/* its row is locked, or its first grant is
								 * not committed (try only) */
	LEASE_ATTEMPT_TIMED_OUT,	/* the same, until the deadline */
	LEASE_ATTEMPT_AGAIN			/* the row appeared or vanished: look again */
} LeaseAttempt;

/*
 * The plan of stmt, saved on first use; on Citus, with lockfence.fences
 * distributed, the plan on the local shard that holds name, saved per
 * shard (citus_fences.c).
 */
static SPIPlanPtr
lease_plan(LeaseStatement stmt, const char *name)
{
	static const Oid argtypes[6] = {TEXTOID, INT8OID, TEXTOID, INTERVALOID,
	TIMESTAMPTZOID, TIMESTAMPTZOID};
	Oid			shard = lockfence_citus_fence_shard(name);
	SPIPlanPtr	plan;

	if (OidIsValid(shard))
		return lockfence_citus_shard_plan(shard, LOCKFENCE_CITUS_SLOTS_LEASE + stmt,
										  lease_statement_sql[stmt], 6, argtypes);
	if (lease_plans[stmt] != NULL)
		return lease_plans[stmt];
	plan = SPI_prepare(lease_statement_sql[stmt], 6, (Oid *) argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for lockfence lease statement %d: %s",
			 (int) stmt, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	lease_plans[stmt] = plan;
	return plan;
}

/*
 * Run one statement with the values of *w (NULL: none) for its parameters;
 * returns the number of rows, the first one in *row.  The holder and TTL
 * read are copied into the current memory context (SPI's, while connected:
 * they outlive an internal subtransaction, not fence_store_leave).
 */
static uint64
lease_execute(LeaseStatement stmt, const char *name, const FenceRow *w,
			  FenceRow *row)
{
	Datum		values[6] = {0};
	char		nulls[6] = {' ', 'n', 'n', 'n', 'n', 'n'};
	int			rc;
	SPIPlanPtr	plan = lease_plan(stmt, name);

	values[0] = CStringGetTextDatum(name);
	if (w != NULL)
	{
		values[1] = Int64GetDatum(w->token);
		nulls[1] = ' ';
		if (w->holder != NULL)
		{
			values[2] = CStringGetTextDatum(w->holder);
			nulls[2] = ' ';
		}
		if (w->lease_ttl != NULL)
		{
			values[3] = PointerGetDatum(w->lease_ttl);
			nulls[3] = ' ';
		}
		values[4] = TimestampTzGetDatum(w->accepted_at);
		nulls[4] = ' ';
		if (w->leased)
		{
			values[5] = TimestampTzGetDatum(w->lease_expires_at);
			nulls[5] = ' ';
		}
	}

	rc = SPI_execute_plan(plan, values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for lockfence lease statement %d: %s",
			 (int) stmt, SPI_result_code_string(rc));

	if (SPI_processed > 0 && row != NULL)
	{
		HeapTuple	tuple = SPI_tuptable->vals[0];
		TupleDesc	tupdesc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d;

		row->token = DatumGetInt64(SPI_getbinval(tuple, tupdesc, 1, &isnull));
		d = SPI_getbinval(tuple, tupdesc, 2, &isnull);
		row->leased = !isnull;
		row->lease_expires_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(tuple, tupdesc, 3, &isnull);
		row->accepted_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(tuple, tupdesc, 4, &isnull);
		row->holder = isnull ? NULL : TextDatumGetCString(d);
		d = SPI_getbinval(tuple, tupdesc, 5, &isnull);
		if (isnull)
			row->lease_ttl = NULL;
		else
		{
			row->lease_ttl = palloc(sizeof(Interval));
			memcpy(row->lease_ttl, DatumGetIntervalP(d), sizeof(Interval));
		}
	}
	return SPI_processed;
}

/*
 * Take the table lock the writes need, as a statement would at its start,
 * before any clock is read: a wait for it (LOCK TABLE, VACUUM FULL, ALTER
 * EXTENSION UPDATE) must not age the judgment.  Kept to the end of the
 * transaction, like a statement's.
 */
static void
lease_lock_table(void)
{
	(void) RangeVarGetRelid(makeRangeVar("lockfence", "fences", -1),
							RowExclusiveLock, false);
}

/*
 * Is a first row of name being inserted by a transaction that has not
 * ended (perhaps a prepared one)?  A dirty snapshot sees such a row and
 * names its inserter.  lease_try_acquire asks before its INSERT, which
 * would wait for that transaction.
 */
static bool
lease_insert_in_progress(const char *name)
{
	Oid			relid;
	Oid			indexid;
	Relation	rel;
	Relation	index;
	SnapshotData dirty;
	ScanKeyData key;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		busy = false;

	relid = RangeVarGetRelid(makeRangeVar("lockfence", "fences", -1),
							 RowExclusiveLock, false);
	rel = table_open(relid, NoLock);
	indexid = lf_primary_key_index(rel);
	if (!OidIsValid(indexid))
	{
		table_close(rel, NoLock);
		return false;
	}
	index = index_open(indexid, AccessShareLock);
	InitDirtySnapshot(dirty);
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ,
				CStringGetTextDatum(name));
	key.sk_collation = index->rd_indcollation[0];
	slot = table_slot_create(rel, NULL);
	scan = lf_index_beginscan(rel, index, &dirty, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	while (!busy && index_getnext_slot(scan, ForwardScanDirection, slot))
		busy = TransactionIdIsValid(dirty.xmin);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, AccessShareLock);
	table_close(rel, NoLock);
	return busy;
}

/*
 * Bound the lock waits of the statements to come by lock_timeout, in the
 * current internal subtransaction, whose end restores it.
 */
static void
lease_bound_waits(long ms)
{
	char		buf[32];

	/* lock_timeout is an int of milliseconds: a longer wait is unbounded. */
	if (ms >= (long) INT_MAX)
		ms = 0;
	else if (ms < 1)
		ms = 1;
	snprintf(buf, sizeof(buf), "%ld", ms);
	(void) NewGUCNestLevel();
	(void) set_config_option("lock_timeout", buf, PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true,
							 0, false);
}

static void
lease_report_exhausted(const char *func, const char *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
			 errmsg("cannot grant lease \"%s\": its tokens are exhausted", name),
			 errdetail("%s found token " INT64_FORMAT " recorded for the name, the largest a bigint holds; no higher token can be granted.",
					   func, PG_INT64_MAX),
			 errhint("Use another name, or have an operator delete the name's fence row with lockfence.reset() once nobody writes under it.")));
}

/*
 * A grant, for lockfence_run_in_subxact: an internal subtransaction kept
 * only when the grant succeeded.  Every statement that locks the fence row
 * runs in it: a locking statement that finds the row updated since its
 * snapshot locks the newest version, and a lock kept after a refusal,
 * while we sleep, would block the new holder's fence, renewal and release.
 *
 * The row is locked first (waiting for its lockers: transactions that
 * fenced with the expired token, a competing grant; or, without wait,
 * skipping it), then judged with the clock read after the lock, then
 * written.  A name without a row gets its first token by an INSERT, which
 * waits for a competing first grant not yet committed (perhaps prepared):
 * ON CONFLICT has no SKIP LOCKED, so without wait the caller first looks
 * for one (lease_insert_in_progress), and a lock_timeout of 1 ms turns a
 * wait for one that began since into a refusal.  (Its clock, read before, then dates the
 * grant from before that wait: the lease is shorter by it, never longer,
 * and there is no earlier lease to misjudge.)  With a deadline, every wait
 * is bounded by it through lock_timeout.
 */
typedef struct LeaseGrantStep
{
	const char *func;
	const char *name;
	const char *holder;
	Interval   *ttl;
	bool		wait;
	TimestampTz deadline;		/* with wait; 0: none */
	bool		insert;			/* the name has no row */
	LeaseAttempt result;
	FenceRow   *prev;			/* the row locked, before the grant */
	FenceRow   *row;			/* the row granted, or found held */
} LeaseGrantStep;

static bool
lease_grant_step(void *arg)
{
	LeaseGrantStep *step = (LeaseGrantStep *) arg;
	FenceRow	newrow;

	/* Rounded up: a wait must not end before the deadline. */
	if (step->wait && step->deadline != 0)
		lease_bound_waits((step->deadline - GetCurrentTimestamp() + 999) / 1000);

	/*
	 * The resource lock first (fence_lock.c): after every transaction that
	 * fenced the old token.  Taken in this subtransaction, it is given back
	 * with it when the grant is refused.
	 */
	if (!fence_lock_acquire(step->name, ExclusiveLock, step->wait))
	{
		step->result = LEASE_ATTEMPT_LOCKED;
		return false;
	}

	if (step->insert)
	{
		if (!step->wait)
			lease_bound_waits(1);
		memset(step->prev, 0, sizeof(FenceRow));
		/* A new name: granted, unless the failover floor is the top token. */
		if (lease_decide(step->name, LEASE_OP_GRANT, NULL, 0, step->holder,
						 step->ttl, GetCurrentTimestamp(),
						 &newrow) == LEASE_TOKENS_EXHAUSTED)
			lease_report_exhausted(step->func, step->name);
		if (lease_execute(LEASE_INSERT, step->name, &newrow, step->row) == 1)
		{
			step->result = LEASE_ATTEMPT_GRANTED;
			return true;
		}
		/* A concurrent first grant committed: look again. */
		step->result = LEASE_ATTEMPT_AGAIN;
		return false;
	}

	if (lease_execute(step->wait ? LEASE_LOCK : LEASE_LOCK_SKIP, step->name,
					  NULL, step->prev) != 1)
	{
		/* Skipped (locked), or reset meanwhile. */
		step->result = step->wait ? LEASE_ATTEMPT_AGAIN : LEASE_ATTEMPT_LOCKED;
		return false;
	}

	switch (lease_decide(step->name, LEASE_OP_GRANT, step->prev, 0,
						 step->holder, step->ttl, GetCurrentTimestamp(),
						 &newrow))
	{
		case LEASE_WRITE:
			break;
		case LEASE_HELD:
			*step->row = *step->prev;
			step->result = LEASE_ATTEMPT_HELD;
			return false;
		case LEASE_TOKENS_EXHAUSTED:
			lease_report_exhausted(step->func, step->name);
			break;
		default:
			elog(ERROR, "unexpected lease verdict for a grant");
	}
	if (lease_execute(LEASE_SET, step->name, &newrow, step->row) != 1)
		elog(ERROR, "lease row for \"%s\" changed while locked", step->name);
	step->result = LEASE_ATTEMPT_GRANTED;
	return true;
}

/*
 * Run a grant step; a lock_timeout it set (the deadline, or 1 ms without
 * wait) ends it as TIMED_OUT or LOCKED instead of an error naming its
 * statement.  Any other error propagates.
 */
static LeaseAttempt
lease_grant(LeaseGrantStep *step)
{
	MemoryContext cxt = CurrentMemoryContext;

	/* own PG_TRY (not error_cleanup.c): a 55P03 is an answer, not raised */
	PG_TRY();
	{
		(void) lockfence_run_in_subxact(lease_grant_step, step);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/* The subtransaction is rolled back already. */
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE ||
			(step->wait && step->deadline == 0))
			PG_RE_THROW();
		FlushErrorState();
		FreeErrorData(edata);
		step->result = step->wait ? LEASE_ATTEMPT_TIMED_OUT :
			LEASE_ATTEMPT_LOCKED;
	}
	PG_END_TRY();
	return step->result;
}

/*
 * One attempt to take name through the statements, when the fast path
 * could not.  A lease held as our snapshot sees it is reported HELD with
 * its row in *row (for its expiry), without locking anything; otherwise
 * lease_grant locks, judges and writes.  *prev is the row before a grant.
 */
static LeaseAttempt
lease_attempt_spi(const char *func, const char *name, const char *holder,
				  Interval *ttl, bool wait, TimestampTz deadline,
				  FenceRow *prev, FenceRow *row)
{
	FenceStoreState state;
	LeaseAttempt result;

	fence_store_enter(&state);
	lease_lock_table();
	for (;;)
	{
		LeaseGrantStep step = {func, name, holder, ttl, wait, deadline,
		false, LEASE_ATTEMPT_AGAIN, prev, row};
		FenceRow	newrow;

		CHECK_FOR_INTERRUPTS();

		if (lease_execute(LEASE_READ, name, NULL, row) != 1)
		{
			/* Without wait, not behind another transaction's first row. */
			if (!wait && lease_insert_in_progress(name))
			{
				result = LEASE_ATTEMPT_LOCKED;
				break;
			}
			step.insert = true;
		}
		else if (lease_decide(name, LEASE_OP_GRANT, row, 0, holder, ttl,
							  GetCurrentTimestamp(), &newrow) == LEASE_HELD)
		{
			result = LEASE_ATTEMPT_HELD;
			break;
		}

		result = lease_grant(&step);
		if (result != LEASE_ATTEMPT_AGAIN)
			break;
	}
	fence_store_leave(&state);
	return result;
}

/*
 * One attempt to take name: without SPI when the lease is free and its row
 * uncontended (the common case), else through the statements.
 */
static LeaseAttempt
lease_attempt(const char *func, const char *name, const char *holder,
			  Interval *ttl, bool wait, TimestampTz deadline, FenceRow *row)
{
	LeaseAttempt result;
	FenceRow	prev = {0};

	if (lease_fastpath_grant(name, holder, ttl, &prev, row))
		result = LEASE_ATTEMPT_GRANTED;
	else
		result = lease_attempt_spi(func, name, holder, ttl, wait, deadline,
								   &prev, row);

	/*
	 * The server chose this token: it must not be chosen again.  Under
	 * synchronous_commit = off a crash can lose a commit already
	 * acknowledged, and the next grant would hand the same token to a
	 * second holder.  (A lost fence advance is lost with everything after
	 * it; a lost grant is given out again.)  So a grant's commit is
	 * flushed whatever the setting says.
	 */
	if (result == LEASE_ATTEMPT_GRANTED)
		ForceSyncCommit();

	/* The grant ended an expired lease (a released one was counted). */
	if (result == LEASE_ATTEMPT_GRANTED && prev.leased &&
		prev.lease_expires_at != DT_NOBEGIN)
		lockfence_metrics_lease_ended((prev.lease_expires_at - prev.accepted_at) / 1e6,
									  true);
	return result;
}

/* Read and check the arguments common to the acquire functions. */
static void
lease_acquire_args(FunctionCallInfo fcinfo, const char *func, char **name,
				   Interval **ttl, char **holder)
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
	*ttl = PG_GETARG_INTERVAL_P(1);
	lease_check_ttl(func, *name, *ttl);
	*holder = PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (*holder != NULL)
		lockfence_validate_holder(*holder);

	/* A grant is a write. */
	PreventCommandIfReadOnly(func);
	PreventCommandDuringRecovery(func);
	lockfence_failover_guard();
}

/* The (token, expires_at) record of a granted lease. */
static Datum
lease_result(FunctionCallInfo fcinfo, const FenceRow *row)
{
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	tupdesc = BlessTupleDesc(tupdesc);
	values[0] = Int64GetDatum(row->token);
	values[1] = TimestampTzGetDatum(row->lease_expires_at);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * Under REPEATABLE READ and SERIALIZABLE every attempt reads the row as
 * the transaction's snapshot sees it, so a release or renewal committed
 * while we wait is never seen: the wait would last until the old expiry,
 * and the grant then fail to lock the changed row.  Once the row has
 * changed since the snapshot, fail at once with the serialization failure
 * it would end in; the retried transaction sees the row as it is.
 */
static void
lease_wait_check_snapshot(const char *name, const FenceRow *row)
{
	FenceRow	latest;
	FenceRowRead found;

	if (!IsolationUsesXactSnapshot())
		return;
	found = fence_fastpath_read(name, true, &latest);
	/* (1.11) a table the fast path cannot read: a statement reads it */
	if (found == FENCE_ROW_UNREADABLE)
		found = fence_store_read_latest(name, &latest) ?
			FENCE_ROW_FOUND : FENCE_ROW_ABSENT;
	if (found == FENCE_ROW_FOUND && latest.token == row->token &&
		latest.lease_expires_at == row->lease_expires_at)
		return;
	lease_wait_done();
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to concurrent update"),
			 errdetail("Lease \"%s\" was released, renewed or granted after this transaction's snapshot was taken.",
					   name),
			 errhint("Retry the transaction.  A waiting lease_acquire() sees releases at once under READ COMMITTED.")));
}

/*
 * Wait for name until granted; deadline 0 is forever.  A wait that
 * outlasts the deadline fails with 55P03, whether for the lease's expiry,
 * for a transaction holding its row, or for an uncommitted first grant.
 */
static void
lease_acquire_waiting(const char *name, const char *holder, Interval *ttl,
					  TimestampTz deadline, FenceRow *rowp)
{
	static const char *const func = "lockfence.lease_acquire()";
	FenceRow	row;

	lease_wait_prepare(name);
	for (;;)
	{
		TimestampTz now;
		long		sleep_ms;
		LeaseAttempt result;

		result = lease_attempt(func, name, holder, ttl, true, deadline, &row);
		if (result == LEASE_ATTEMPT_GRANTED)
			break;
		if (result == LEASE_ATTEMPT_TIMED_OUT)
		{
			lease_wait_done();
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not acquire lease \"%s\" within wait_timeout", name),
					 errdetail("Another transaction still holds the lease's fence row: one that fenced with the previous token, or one that grants, renews or releases the lease and has not ended (it may be a prepared transaction)."),
					 errhint("Retry later or with a longer wait_timeout; a transaction that stays open holds every successor back.")));
		}

		now = GetCurrentTimestamp();
		if (deadline != 0 && now >= deadline)
		{
			lease_wait_done();
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not acquire lease \"%s\" within wait_timeout", name),
					 errdetail("The lease of token " INT64_FORMAT " is held until %s.",
							   row.token, timestamptz_to_str(row.lease_expires_at))));
		}

		lease_wait_check_snapshot(name, &row);

		/* Until the lease expires, a release is announced, or the deadline. */
		sleep_ms = (row.lease_expires_at - now) / 1000 + 1;
		if (deadline != 0)
			sleep_ms = Min(sleep_ms, (deadline - now) / 1000 + 1);
		lease_wait_sleep(sleep_ms);
	}
	lease_wait_done();
	lease_wait_check_granted();

	*rowp = row;
}

/* lockfence_lease_acquire's wait, run under lockfence_run_with_cleanup */
typedef struct LeaseAcquireCall
{
	const char *name;
	const char *holder;
	Interval   *ttl;
	TimestampTz deadline;
	FenceRow   *row;
} LeaseAcquireCall;

static void
acquire_waiting_step(void *arg)
{
	LeaseAcquireCall *c = (LeaseAcquireCall *) arg;

	lease_acquire_waiting(c->name, c->holder, c->ttl, c->deadline, c->row);
}

static void
count_failed_acquire(void *arg)
{
	lockfence_metrics_lease_acquire_failed();
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
	Interval   *ttl;
	char	   *holder;
	TimestampTz started = GetCurrentTimestamp();
	TimestampTz deadline = 0;
	FenceRow	row;
	LeaseAcquireCall call;

	lockfence_refuse_parallel_mode("lockfence.lease_acquire()");

	lease_acquire_args(fcinfo, "lockfence.lease_acquire()", &name, &ttl,
					   &holder);
	if (!PG_ARGISNULL(3))
	{
		int64		usecs;

		if (!wait_timeout_usecs(PG_GETARG_INTERVAL_P(3), &usecs))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lease wait_timeout must not be negative")));
		/* 0 is "now"; deadline 0 means "forever" */
		if (usecs != WAIT_TIMEOUT_FOREVER)
			deadline = started + usecs + 1;
	}

	/* Count every acquisition that ends in an error (timeout, cancel). */
	call.name = name;
	call.holder = holder;
	call.ttl = ttl;
	call.deadline = deadline;
	call.row = &row;
	lockfence_run_with_cleanup(acquire_waiting_step, count_failed_acquire,
							   &call);
	fence_cache_forget(name);	/* the grant wrote the fence row */

	lockfence_metrics_lease_acquired((GetCurrentTimestamp() - started) / 1e6);
	return lease_result(fcinfo, &row);
}

/*
 * lockfence.lease_try_acquire(name text, ttl interval, holder text DEFAULT NULL,
 *							   OUT token bigint, OUT expires_at timestamptz)
 *
 * Take the lease if it is free at once; NULL when it is held, or its row
 * is locked (by a transaction still writing under the expired token), or
 * its first grant by another transaction has not committed.  Never waits
 * for another transaction.
 */
Datum
lockfence_lease_try_acquire(PG_FUNCTION_ARGS)
{
	static const char *const func = "lockfence.lease_try_acquire()";
	char	   *name;
	Interval   *ttl;
	char	   *holder;
	FenceRow	row;
	TimestampTz started = GetCurrentTimestamp();

	lockfence_refuse_parallel_mode(func);

	lease_acquire_args(fcinfo, func, &name, &ttl, &holder);
	if (lease_attempt(func, name, holder, ttl, false, 0, &row) !=
		LEASE_ATTEMPT_GRANTED)
		PG_RETURN_NULL();		/* nothing written: what it fenced holds */
	fence_cache_forget(name);	/* the grant wrote the fence row */
	lockfence_metrics_lease_acquired((GetCurrentTimestamp() - started) / 1e6);
	return lease_result(fcinfo, &row);
}

/* Read name and token, the arguments of renew and release. */
static void
lease_token_args(FunctionCallInfo fcinfo, const char *func, char **name,
				 int64 *token)
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
	PreventCommandIfReadOnly(func);
	PreventCommandDuringRecovery(func);
	lockfence_failover_guard();
}

/*
 * A renewal or release through the statements, for lockfence_run_in_subxact:
 * lock the row (waiting for its lockers: the holder's own fencing
 * transactions, a competing grant), judge it with the clock read after the
 * lock, write it.  The subtransaction is kept only when it wrote: after a
 * refusal (the lease was taken over meanwhile) the lock on the newest
 * version must not outlive the call.
 */
typedef struct LeaseUpdateStep
{
	LeaseOp		op;
	const char *name;
	int64		token;
	Interval   *ttl;
	LeaseVerdict verdict;
	FenceRow   *row;			/* as written, or as found when refused */
} LeaseUpdateStep;

static bool
lease_update_step(void *arg)
{
	LeaseUpdateStep *step = (LeaseUpdateStep *) arg;
	bool		found;
	FenceRow	locked;
	FenceRow	newrow;

	/* After the holder's fencing transactions (fence_lock.c). */
	(void) fence_lock_acquire(step->name, ExclusiveLock, true);
	found = lease_execute(LEASE_LOCK, step->name, NULL, &locked) == 1;
	step->verdict = lease_decide(step->name, step->op,
								 found ? &locked : NULL, step->token, NULL,
								 step->ttl, GetCurrentTimestamp(), &newrow);
	if (step->verdict != LEASE_WRITE)
	{
		*step->row = newrow;
		return false;
	}
	if (lease_execute(LEASE_SET, step->name, &newrow, step->row) != 1)
		elog(ERROR, "lease row for \"%s\" changed while locked", step->name);
	return true;
}

static LeaseVerdict
lease_update(LeaseOp op, const char *name, int64 token, Interval *ttl,
			 FenceRow *row)
{
	FenceStoreState state;
	LeaseUpdateStep step = {op, name, token, ttl, LEASE_NOT_HELD, row};

	fence_store_enter(&state);
	lease_lock_table();
	(void) lockfence_run_in_subxact(lease_update_step, &step);
	fence_store_leave(&state);
	return step.verdict;
}

/*
 * Raise lock lost for a lease that could not be renewed, for the verdict
 * on row, the fence row as it is now.
 */
static void
lease_report_lost(const char *name, int64 token, LeaseVerdict verdict,
				  const FenceRow *row)
{
	switch (verdict)
	{
		case LEASE_TAKEN_OVER:
			ereport(ERROR,
					(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
					 errmsg("lease \"%s\" was taken over", name),
					 errdetail("Token " INT64_FORMAT " was presented, but token " INT64_FORMAT " has been granted or fenced since.",
							   token, row->token),
					 errhint("Stop writing under this lease; acquire it again to get a new token.")));
			break;
		case LEASE_RELEASED:
			ereport(ERROR,
					(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
					 errmsg("lease \"%s\" was released", name),
					 errdetail("The lease of token " INT64_FORMAT " was released.", token),
					 errhint("Acquire the lease again to get a new token.")));
			break;
		case LEASE_BELOW_FLOOR:
			ereport(ERROR,
					(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
					 errmsg("lease \"%s\" ended with the failover floor", name),
					 errdetail("Token " INT64_FORMAT " is below the failover floor, " INT64_FORMAT ": the lowest token accepted since raise_floor() set it.",
							   token, floor_state_cached()->floor),
					 errhint("Acquire the lease again to get a new token.")));
			break;
		case LEASE_EXPIRED:
			ereport(ERROR,
					(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
					 errmsg("lease \"%s\" has expired", name),
					 errdetail("The lease of token " INT64_FORMAT " expired at %s.",
							   token, timestamptz_to_str(row->lease_expires_at)),
					 errhint("Renew well before the TTL runs out; acquire the lease again to get a new token.")));
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
					 errmsg("lease \"%s\" with token " INT64_FORMAT " is not held", name, token),
					 errhint("Acquire the lease to get a token.")));
	}
}

/*
 * After a renewal of name's lease of token: what this transaction fenced
 * with that token still holds, since the renewal changed only the expiry
 * (token and holder as they were, the resource lock kept); anything else
 * it knew of the name is read again.
 */
static void
lease_renewed_keep_fence(const char *name, int64 token)
{
	int64		fenced;
	const char *holder;

	if (!fence_cache_lookup(name, &fenced, &holder) || fenced != token)
		fence_cache_forget(name);
}

/*
 * lockfence.lease_renew(name text, token bigint, ttl interval DEFAULT NULL)
 *		returns timestamptz
 *
 * Extend an unexpired lease by ttl from now (NULL: the TTL it was granted
 * or last renewed with); returns the new expiry, or raises LF003 when the
 * lease expired, was released, was taken over or (1.15) ended with the
 * failover floor.
 */
Datum
lockfence_lease_renew(PG_FUNCTION_ARGS)
{
	static const char *const func = "lockfence.lease_renew()";
	char	   *name;
	int64		token;
	Interval   *ttl = PG_ARGISNULL(2) ? NULL : PG_GETARG_INTERVAL_P(2);
	FenceRow	row;
	LeaseVerdict verdict;

	lockfence_refuse_parallel_mode(func);

	lease_token_args(fcinfo, func, &name, &token);
	if (ttl != NULL)
		lease_check_ttl(func, name, ttl);

	if (!lease_fastpath_renew(name, token, ttl, &row))
	{
		/* Contended, or not renewable: wait, re-check, tell why. */
		verdict = lease_update(LEASE_OP_RENEW, name, token, ttl, &row);
		if (verdict != LEASE_WRITE)
			lease_report_lost(name, token, verdict, &row);
	}
	lease_renewed_keep_fence(name, token);
	PG_RETURN_TIMESTAMPTZ(row.lease_expires_at);
}

/*
 * lockfence.lease_release(name text, token bigint) returns boolean
 *
 * End the lease at once; its token can no longer be fenced (LF003), and
 * waiters are woken when the transaction commits.  False when the lease
 * had already expired, been released or been taken over, or (1.15) ended
 * with the failover floor.
 */
Datum
lockfence_lease_release(PG_FUNCTION_ARGS)
{
	char	   *name;
	int64		token;
	bool		released;
	FenceRow	row;

	lockfence_refuse_parallel_mode("lockfence.lease_release()");

	lease_token_args(fcinfo, "lockfence.lease_release()", &name, &token);

	released = lease_fastpath_release(name, token, &row);
	if (!released)
	{
		/* Contended, or not held: wait for the row and re-check. */
		released = lease_update(LEASE_OP_RELEASE, name, token, NULL, &row) ==
			LEASE_WRITE;
	}

	if (released)
	{
		fence_cache_forget(name);	/* the release wrote the fence row */
		lease_wait_announce_at_commit(name);
		lockfence_metrics_lease_ended((GetCurrentTimestamp() - row.accepted_at) / 1e6,
									  false);
	}
	PG_RETURN_BOOL(released);
}
