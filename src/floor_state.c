/*-------------------------------------------------------------------------
 *
 * floor_state.c
 *	  Reading lockfence.floor_state: the recorded identity of the server
 *	  that wrote the fences, and the global fence floor.
 *
 * failover_guard.c explains what the table is for; this file reads it,
 * keeps this backend's verdict (keyed by the WAL insertion timeline, and
 * dropped by a relcache invalidation of the table), and answers the floor
 * test of the fence and lease rules (fence_decide.c, lease_decide.c).  It
 * sits below the failover guard and the rules, and calls only the file
 * that acts as the fence table's owner and the schema lookup.
 *
 * IDENTIFICATION
 *	  src/floor_state.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlogrecovery.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "fence_owner.h"
#include "floor_state.h"
#include "lockfence_schema.h"
#include "relcache_callbacks.h"

/* This backend's verdict, valid for guard_tli while guard_valid. */
static bool guard_valid = false;
static TimeLineID guard_tli;
static bool guard_refused;
static FloorState guard_state;
static Oid	guard_relid = InvalidOid;
static bool guard_callback_registered = false;

/*
 * Invalidations of lockfence.floor_state seen so far: a verdict read while
 * one arrived may be older than it, and is not kept.
 */
static uint64 guard_invalidations = 0;

/*
 * This server's identity: its system identifier and the timeline it
 * writes (during recovery: the timeline it replays).
 */
void
floor_state_identity(int64 *sysid, TimeLineID *tli, bool *in_recovery)
{
	*sysid = (int64) GetSystemIdentifier();
	*in_recovery = RecoveryInProgress();
	if (*in_recovery)
		(void) GetXLogReplayRecPtr(tli);
	else
		*tli = GetWALInsertionTimeLine();
}

/* The OID of lockfence.floor_state, InvalidOid when there is none. */
Oid
floor_state_relid(void)
{
	return lockfence_relid("floor_state");
}

/*
 * Does lockfence.floor_state (relid) record the database (SQL 1.10 and
 * later)?
 */
bool
floor_state_has_database(Oid relid)
{
	return get_attnum(relid, "database_oid") != InvalidAttrNumber;
}

int64
floor_state_int64(HeapTuple tuple, TupleDesc tupdesc, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, tupdesc, col, &isnull);

	return isnull ? 0 : DatumGetInt64(d);
}

/*
 * A latest-snapshot query of lockfence's tables, through SPI (connected):
 * the verdicts are kept beyond this transaction, and a row written after a
 * REPEATABLE READ transaction began must not be missed (nor kept missed).
 */
static void
floor_state_query(const char *sql, long limit)
{
	SPIPlanPtr	plan = SPI_prepare(sql, 0, NULL);
	int			rc;

	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql,
			 SPI_result_code_string(SPI_result));
	rc = SPI_execute_snapshot(plan, NULL, NULL, GetLatestSnapshot(),
							  InvalidSnapshot, true, false, limit);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute failed for \"%s\": %s", sql,
			 SPI_result_code_string(rc));
}

/*
 * Judge one row of lockfence.floor_state into *st: the highest floor of
 * all rows, and the first row that names another server, timeline or
 * database (column 5, if has_database).
 */
static void
floor_state_judge_row(HeapTuple tuple, TupleDesc tupdesc, bool has_database,
					  int64 sysid, TimeLineID tli, FloorState *st)
{
	int64		rsysid = floor_state_int64(tuple, tupdesc, 1);
	int64		rtli = floor_state_int64(tuple, tupdesc, 2);
	Oid			rdb = InvalidOid;
	bool		isnull;
	Datum		d;

	st->floor = Max(st->floor, floor_state_int64(tuple, tupdesc, 3));
	if (st->mismatch)
		return;
	if (has_database)
	{
		d = SPI_getbinval(tuple, tupdesc, 5, &isnull);
		if (!isnull)
			rdb = DatumGetObjectId(d);
	}
	st->mismatch = rsysid != sysid || rtli != (int64) tli ||
		(OidIsValid(rdb) && rdb != MyDatabaseId);
	st->rec_sysid = rsysid;
	st->rec_tli = rtli;
	st->rec_database = rdb;
	d = SPI_getbinval(tuple, tupdesc, 4, &isnull);
	st->recorded_at = isnull ? DT_NOBEGIN : DatumGetTimestampTz(d);
}

/*
 * Read lockfence.floor_state and judge it against (sysid, tli) and this
 * database.  A row recorded in another database (SQL 1.10 records it) came
 * with a copy of the database, CREATE DATABASE ... TEMPLATE: its fences
 * are as old as the copy.  A row without one (written by hand, or restored
 * from a dump of an older version) is judged by the server alone.
 */
void
floor_state_read(int64 sysid, TimeLineID tli, FloorState *st)
{
	FenceStoreState state;
	Oid			relid = floor_state_relid();
	bool		has_database;

	memset(st, 0, sizeof(*st));
	if (!OidIsValid(relid))
		return;
	st->have_table = true;
	has_database = floor_state_has_database(relid);
	/* The latest snapshot cannot be taken in parallel mode. */
	if (IsInParallelMode())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot read lockfence.floor_state during a parallel operation"),
				 errhint("Mark the function that calls it PARALLEL UNSAFE.")));

	fence_store_enter(&state);
	floor_state_query(has_database ?
					  "SELECT system_identifier, timeline, floor, recorded_at, database_oid"
					  " FROM lockfence.floor_state" :
					  "SELECT system_identifier, timeline, floor, recorded_at"
					  " FROM lockfence.floor_state", 0);
	st->nrows = (int) SPI_processed;
	for (uint64 i = 0; i < SPI_processed; i++)
		floor_state_judge_row(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
							  has_database, sysid, tli, st);

	/*
	 * One row naming this server and timeline, recorded in another
	 * database: a copy (CREATE DATABASE ... TEMPLATE, template1's included).
	 * A copy that brought no fence row brought nothing old: it is not
	 * refused, and its first fenced write records the row as this
	 * database's (floor_state_adopt), in the same transaction.
	 */
	if (st->nrows == 1 && st->mismatch && st->rec_sysid == sysid &&
		st->rec_tli == (int64) tli && OidIsValid(st->rec_database) &&
		st->rec_database != MyDatabaseId)
	{
		floor_state_query("SELECT FROM lockfence.fences LIMIT 1", 1);
		if (SPI_processed == 0)
		{
			st->mismatch = false;
			st->adopt = true;
		}
	}
	fence_store_leave(&state);
}

/*
 * Would these contents refuse fenced writes on a writable server?  One row
 * naming this server is the only state that does not: none leaves it
 * unknown who wrote the fences, a row naming another server, timeline or
 * database means a promotion or a copy, and more than one row a restore
 * (the row CREATE EXTENSION recorded beside the dumped one, even when both
 * name this server): floor_record() always leaves exactly one, and a
 * restored dump's fences are as old as the dump.
 */
bool
floor_state_refuses(const FloorState *st)
{
	return st->have_table && (st->nrows != 1 || st->mismatch);
}

/* A change of lockfence.floor_state (or a cache reset): read it again. */
static void
guard_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == guard_relid)
	{
		guard_valid = false;
		guard_invalidations++;
	}
}

/*
 * Read the recorded identity again and judge it for tli.  Without the
 * table (SQL older than 1.4) nothing is refused, and the table is looked
 * for again on the next call (it appears with ALTER EXTENSION UPDATE).
 */
static void
guard_refresh(TimeLineID tli)
{
	uint64		seen;

	if (!guard_callback_registered)
	{
		lockfence_relcache_register(guard_relcache_callback);
		guard_callback_registered = true;
	}
	seen = guard_invalidations;
	guard_valid = false;
	guard_relid = floor_state_relid();
	floor_state_read((int64) GetSystemIdentifier(), tli, &guard_state);
	guard_tli = tli;
	guard_refused = floor_state_refuses(&guard_state);
	/*
	 * Kept only if no change of the table arrived while it was read, and
	 * not while an empty copy's row waits for its first fenced write.
	 */
	guard_valid = guard_state.have_table && !guard_state.adopt &&
		seen == guard_invalidations;
}

/*
 * Record the row of an empty copy as this database's (floor_state_read
 * took it so): in the transaction of its first fenced write, so that no
 * fence row is ever committed beside a row naming another database.  Not
 * in a read-only transaction, whose write fails anyway.  A row another
 * transaction is recording (its own first fenced write, not yet ended) is
 * waited for, as any row lock: skipping it would let this transaction
 * commit a fence row beside a row naming another database, which refuses
 * the copy from then on (until the other commits, or for good if it rolls
 * back).  So until the copy's first fenced transaction ends, the others
 * wait for it (lease_try_acquire too).  Under REPEATABLE READ a recording
 * committed after the snapshot fails this one with 40001.
 */
static void
floor_state_adopt(void)
{
	FenceStoreState state;
	Oid			argtypes[2] = {OIDOID, OIDOID};
	Datum		values[2];
	int			rc;

	if (XactReadOnly)
		return;
	fence_store_enter(&state);
	values[0] = ObjectIdGetDatum(MyDatabaseId);
	values[1] = ObjectIdGetDatum(guard_state.rec_database);
	rc = SPI_execute_with_args("UPDATE lockfence.floor_state SET database_oid = $1"
							   " WHERE database_oid OPERATOR(pg_catalog.=) $2",
							   2, argtypes, values, NULL, false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "SPI_execute failed recording lockfence.floor_state: %s",
			 SPI_result_code_string(rc));
	fence_store_leave(&state);
	floor_state_forget();
}

/*
 * Does the recorded identity refuse fenced writes on this server, writing
 * timeline tli?  In the steady state (a verdict kept for tli, not refused)
 * two comparisons; otherwise the table is read again.
 */
bool
floor_state_refused(TimeLineID tli)
{
	if (likely(guard_valid && guard_tli == tli && !guard_refused))
		return false;
	guard_refresh(tli);
	if (guard_state.adopt && !guard_refused)
		floor_state_adopt();
	return guard_refused;
}

/* The contents the last verdict was made from (for its error report). */
const FloorState *
floor_state_cached(void)
{
	return &guard_state;
}

/* Forget the kept verdict: this backend changed lockfence.floor_state. */
void
floor_state_forget(void)
{
	guard_valid = false;
}

/*
 * The global floor, for a resource that has no fence row yet.  Its callers
 * are about to create that row: the lock taken here (held to the end of
 * the transaction) makes floor_record(), which takes SHARE ROW EXCLUSIVE,
 * wait for this transaction, and this one wait for a floor_record() in
 * progress, so raise_floor()'s UPDATE, a later statement, sees the row,
 * or this transaction sees the new floor (taking the lock accepts the
 * invalidation floor_record() sent).
 */
int64
lockfence_failover_floor(void)
{
	TimeLineID	tli;
	Oid			relid;

	if (RecoveryInProgress())
		return 0;
	tli = GetWALInsertionTimeLine();
	relid = floor_state_relid();
	if (OidIsValid(relid))
		LockRelationOid(relid, RowExclusiveLock);
	if (!(guard_valid && guard_tli == tli && guard_relid == relid))
		guard_refresh(tli);
	return guard_state.floor;
}

static bool
floor_rejects(int64 token, int64 floor, FenceOutcome *outcome)
{
	if (token >= floor)
		return false;
	outcome->verdict = FENCE_STALE;
	outcome->highest = floor;
	outcome->highest_holder = NULL;
	outcome->leased = false;
	outcome->lease_expires_at = 0;
	outcome->below_floor = true;
	return true;
}

bool
lockfence_failover_floor_rejects(int64 token, FenceOutcome *outcome)
{
	return floor_rejects(token, lockfence_failover_floor(), outcome);
}

/*
 * A resource that has a fence row is below the floor too.  On one server
 * raise_floor() lifts the rows with the floor, in one transaction, so a
 * row is never below it; on Citus each other node records the floor in a
 * transaction of its own, first, and its rows are raised by the
 * coordinator's UPDATE, which commits later, or not at all when another
 * node cannot be reached: in between, a promoted worker no longer refused
 * (LF004) and a row its promotion rolled back took tokens issued before
 * the failover (a review, 1.14).  A token at or above the floor the
 * failover guard read for this check (every check calls
 * lockfence_failover_guard() first) passes at no cost; one below it is
 * judged by the floor read again, as for a name without a row, since the
 * check may have waited for its resource lock while the floor changed
 * (lowered by hand: a review).
 */
bool
lockfence_kept_floor_rejects(int64 token, FenceOutcome *outcome)
{
	if (likely(token >= guard_state.floor))
		return false;
	return floor_rejects(token, lockfence_failover_floor(), outcome);
}

bool
lockfence_failover_floor_required(void)
{
	int64		sysid;
	TimeLineID	tli;
	bool		in_recovery;
	FloorState	st;

	floor_state_identity(&sysid, &tli, &in_recovery);
	if (in_recovery)
		return false;
	floor_state_read(sysid, tli, &st);
	return floor_state_refuses(&st);
}
