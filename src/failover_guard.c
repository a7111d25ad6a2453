/*-------------------------------------------------------------------------
 *
 * failover_guard.c
 *	  Fail closed on a promoted server until its fence floor is raised.
 *
 * An asynchronous standby that is promoted may have lost fence advances
 * and lease grants the old primary acknowledged: the superseded holders'
 * tokens would be accepted again until an operator (or the failover
 * manager's callback) raises the floor.  Waiting for that callback is a
 * race the fence must not depend on.  So every database records which
 * server wrote its fences: lockfence.floor_state holds the system
 * identifier and WAL timeline of the server that last raised the floor
 * (or created the extension).  A promotion starts a new timeline; a
 * restored dump, a restored base backup (after its recovery ends) and
 * pg_upgrade change the timeline or the system identifier.  While this
 * server's (system identifier, insertion timeline) differs from a recorded
 * one, every fence, lease grant, renewal and release is refused with
 * SQLSTATE LF004, from the first transaction the promoted server accepts.
 *
 * lockfence.raise_floor(floor) (without resources), etcd_raise_floor() and
 * accept_promotion() record this server's identity, which lifts the
 * refusal.  raise_floor with a list of resources does not: the names a
 * lossy failover may have lost entirely cannot all be listed.
 *
 * The floor recorded there is also the fence of every resource that has
 * no row: a token below it is stale, and a lease granted on such a name
 * starts above it.  That closes the resources whose rows the failover lost
 * entirely.
 *
 * The verdict is cached per backend, keyed by the insertion timeline (the
 * system identifier of a running server never changes): in the steady
 * state the guard costs a comparison.  A change of lockfence.floor_state
 * (which only the functions here write) sends a relcache invalidation for
 * the table, which makes every backend read it again; a refused backend
 * reads it on every call, so that a raised floor lifts the refusal at once.
 *
 * During recovery the guard does nothing: nothing can be written there.
 * The current timeline is the WAL insertion timeline, which is the new one
 * from the first transaction after a promotion (the checkpoint's timeline
 * lags until the end-of-recovery checkpoint).
 *
 * IDENTIFICATION
 *	  src/failover_guard.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xlog.h"
#include "access/xlogrecovery.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "citus_guard.h"
#include "failover_guard.h"
#include "lockfence.h"
#include "lockfence_schema.h"

PG_FUNCTION_INFO_V1(lockfence_floor_identity);
PG_FUNCTION_INFO_V1(lockfence_floor_record);
PG_FUNCTION_INFO_V1(lockfence_accept_promotion);
PG_FUNCTION_INFO_V1(lockfence_floor_status);

/* lockfence.floor_state as read, judged against one identity. */
typedef struct FloorState
{
	bool		have_table;		/* false: SQL older than 1.4 */
	int			nrows;
	bool		mismatch;		/* a row names another identity */
	int64		rec_sysid;		/* the row reported: a mismatching one if */
	int64		rec_tli;		/* any, else the last one */
	TimestampTz recorded_at;
	int64		floor;			/* the highest floor of all rows */
} FloorState;

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
static void
current_identity(int64 *sysid, TimeLineID *tli, bool *in_recovery)
{
	*sysid = (int64) GetSystemIdentifier();
	*in_recovery = RecoveryInProgress();
	if (*in_recovery)
		(void) GetXLogReplayRecPtr(tli);
	else
		*tli = GetWALInsertionTimeLine();
}

/* The OID of lockfence.floor_state, InvalidOid when there is none. */
static Oid
floor_state_relid(void)
{
	return lockfence_relid("floor_state");
}

static int64
spi_int64(HeapTuple tuple, TupleDesc tupdesc, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, tupdesc, col, &isnull);

	return isnull ? 0 : DatumGetInt64(d);
}

/*
 * Read lockfence.floor_state and judge it against (sysid, tli).
 */
static void
floor_state_read(int64 sysid, TimeLineID tli, FloorState *st)
{
	FenceStoreState state;
	SPIPlanPtr	plan;
	int			rc;

	memset(st, 0, sizeof(*st));
	if (!OidIsValid(floor_state_relid()))
		return;
	st->have_table = true;

	fence_store_enter(&state);

	/*
	 * With the latest snapshot, not the transaction's: the verdict is kept
	 * beyond this transaction, and a floor recorded after a REPEATABLE READ
	 * transaction began must not be missed (nor cached as missed).
	 */
	plan = SPI_prepare("SELECT system_identifier, timeline, floor, recorded_at"
					   " FROM lockfence.floor_state", 0, NULL);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for lockfence.floor_state: %s",
			 SPI_result_code_string(SPI_result));
	rc = SPI_execute_snapshot(plan, NULL, NULL, GetLatestSnapshot(),
							  InvalidSnapshot, true, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute failed reading lockfence.floor_state: %s",
			 SPI_result_code_string(rc));
	st->nrows = (int) SPI_processed;
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	tupdesc = SPI_tuptable->tupdesc;
		int64		rsysid = spi_int64(tuple, tupdesc, 1);
		int64		rtli = spi_int64(tuple, tupdesc, 2);
		int64		rfloor = spi_int64(tuple, tupdesc, 3);
		bool		differs = rsysid != sysid || rtli != (int64) tli;
		bool		isnull;
		Datum		at;

		st->floor = Max(st->floor, rfloor);
		if (st->mismatch)
			continue;
		st->mismatch = differs;
		st->rec_sysid = rsysid;
		st->rec_tli = rtli;
		at = SPI_getbinval(tuple, tupdesc, 4, &isnull);
		st->recorded_at = isnull ? DT_NOBEGIN : DatumGetTimestampTz(at);
	}
	fence_store_leave(&state);
}

/* Would these contents refuse fenced writes on a writable server? */
static bool
floor_state_refuses(const FloorState *st)
{
	return st->have_table && (st->nrows == 0 || st->mismatch);
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
		CacheRegisterRelcacheCallback(guard_relcache_callback, (Datum) 0);
		guard_callback_registered = true;
	}
	seen = guard_invalidations;
	guard_valid = false;
	guard_relid = floor_state_relid();
	floor_state_read((int64) GetSystemIdentifier(), tli, &guard_state);
	guard_tli = tli;
	guard_refused = floor_state_refuses(&guard_state);
	/* Kept only if no change of the table arrived while it was read. */
	guard_valid = guard_state.have_table && seen == guard_invalidations;
}

pg_noreturn static void
guard_report(TimeLineID tli)
{
	const FloorState *st = &guard_state;
	uint64		sysid = GetSystemIdentifier();
	const char *hint = "Raise the floor with lockfence.etcd_raise_floor() or lockfence.raise_floor(floor), "
		"or, if the promotion lost no committed transaction (a synchronous switchover), "
		"call lockfence.accept_promotion().";

	if (st->nrows == 0)
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_FLOOR_REQUIRED),
				 errmsg("the fence floor of this database is not recorded"),
				 errdetail("Table lockfence.floor_state is empty, so lockfence cannot tell whether this server was promoted since its fences were written."),
				 errhint("%s", hint)));
	if ((uint64) st->rec_sysid != sysid)
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_FLOOR_REQUIRED),
				 errmsg("the fences of this database were written by another server and its fence floor has not been raised"),
				 errdetail("The fences were recorded on system " UINT64_FORMAT ", timeline " INT64_FORMAT "; this server is system " UINT64_FORMAT ", timeline %u (a restored dump, a pg_upgrade or a copy).",
						   (uint64) st->rec_sysid, st->rec_tli, sysid, tli),
				 errhint("%s", hint)));
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_FLOOR_REQUIRED),
			 errmsg("this server was promoted and its fence floor has not been raised"),
			 errdetail("The fences were recorded on timeline " INT64_FORMAT "; this server writes timeline %u.",
					   st->rec_tli, tli),
			 errhint("%s", hint)));
}

void
lockfence_failover_guard(void)
{
	TimeLineID	tli;

	lockfence_citus_guard_fences(); /* fences past Citus: docs/citus.md */
	if (RecoveryInProgress())
		return;
	tli = GetWALInsertionTimeLine();
	if (likely(guard_valid && guard_tli == tli && !guard_refused))
		return;
	guard_refresh(tli);
	if (guard_refused)
		guard_report(tli);
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

bool
lockfence_failover_floor_rejects(int64 token, FenceOutcome *outcome)
{
	int64		floor = lockfence_failover_floor();

	if (token >= floor)
		return false;
	outcome->verdict = FENCE_STALE;
	outcome->highest = floor;
	outcome->highest_holder = NULL;
	outcome->leased = false;
	outcome->lease_expires_at = 0;
	return true;
}

bool
lockfence_failover_floor_required(void)
{
	int64		sysid;
	TimeLineID	tli;
	bool		in_recovery;
	FloorState	st;

	current_identity(&sysid, &tli, &in_recovery);
	if (in_recovery)
		return false;
	floor_state_read(sysid, tli, &st);
	return floor_state_refuses(&st);
}

/*
 * Record this server's identity with floor max(recorded floors, floor) as
 * the only row of lockfence.floor_state; returns that floor.
 */
static int64
floor_record(int64 floor)
{
	int64		sysid;
	TimeLineID	tli;
	bool		in_recovery;
	Oid			relid = floor_state_relid();
	FenceStoreState state;
	int64		old = 0;
	int			rc;
	Oid			argtypes[3] = {INT8OID, INT8OID, INT8OID};
	Datum		values[3];

	current_identity(&sysid, &tli, &in_recovery);
	if (in_recovery)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot record the fence floor while the server is in recovery"),
				 errhint("Run it on the primary, after the promotion.")));
	if (floor < 0)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("fence floor must not be negative"),
				 errdetail("The floor given was " INT64_FORMAT ".", floor)));
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"lockfence.floor_state\" does not exist"),
				 errhint("Update the extension with ALTER EXTENSION lockfence UPDATE.")));

	fence_store_enter(&state);
	/* One recorder at a time: the new floor is the maximum of all. */
	rc = SPI_execute("LOCK TABLE lockfence.floor_state IN SHARE ROW EXCLUSIVE MODE",
					 false, 0);
	if (rc != SPI_OK_UTILITY)
		elog(ERROR, "SPI_execute failed locking lockfence.floor_state: %s",
			 SPI_result_code_string(rc));
	rc = SPI_execute("SELECT pg_catalog.max(floor) FROM lockfence.floor_state",
					 false, 0);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "SPI_execute failed reading lockfence.floor_state: %s",
			 SPI_result_code_string(rc));
	old = spi_int64(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	floor = Max(floor, old);
	rc = SPI_execute("DELETE FROM lockfence.floor_state", false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "SPI_execute failed clearing lockfence.floor_state: %s",
			 SPI_result_code_string(rc));
	values[0] = Int64GetDatum(sysid);
	values[1] = Int64GetDatum((int64) tli);
	values[2] = Int64GetDatum(floor);
	rc = SPI_execute_with_args("INSERT INTO lockfence.floor_state"
							   " (system_identifier, timeline, floor, recorded_at)"
							   " VALUES ($1, $2, $3, pg_catalog.statement_timestamp())",
							   3, argtypes, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "SPI_execute failed writing lockfence.floor_state: %s",
			 SPI_result_code_string(rc));
	fence_store_leave(&state);

	/* Every backend (this one at the next command) reads it again. */
	CacheInvalidateRelcacheByRelid(relid);
	guard_valid = false;
	return floor;
}

/*
 * lockfence.floor_record(floor bigint) returns bigint
 *
 * Called by raise_floor(floor) without resources (operators only): record
 * this server's identity and the global floor; returns the floor now in
 * force.
 */
Datum
lockfence_floor_record(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(floor_record(PG_GETARG_INT64(0)));
}

/*
 * lockfence.accept_promotion() returns bigint
 *
 * State that this server's promotion (or restore) lost no acknowledged
 * fence or lease: record its identity without raising any fence.  Returns
 * the global floor, unchanged.  Operators only.
 */
Datum
lockfence_accept_promotion(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(floor_record(0));
}

/*
 * lockfence.floor_identity(OUT system_identifier bigint, OUT timeline bigint)
 *
 * This server's identity as lockfence.floor_state records it: the timeline
 * is the one WAL is written on (during recovery, the one replayed).
 */
Datum
lockfence_floor_identity(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	int64		sysid;
	TimeLineID	tli;
	bool		in_recovery;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	current_identity(&sysid, &tli, &in_recovery);
	values[0] = Int64GetDatum(sysid);
	values[1] = Int64GetDatum((int64) tli);
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values,
											 nulls));
}

/*
 * lockfence.floor_status() returns one row: the recorded identity (a
 * mismatching row if there is one), the global floor, this server's
 * identity, whether it is in recovery, and whether fenced writes and
 * lease operations are refused (LF004) now.
 */
Datum
lockfence_floor_status(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[8];
	bool		nulls[8] = {false, false, false, false, false, false, false, false};
	int64		sysid;
	TimeLineID	tli;
	bool		in_recovery;
	FloorState	st;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	current_identity(&sysid, &tli, &in_recovery);
	floor_state_read(sysid, tli, &st);

	values[0] = Int64GetDatum(st.rec_sysid);
	values[1] = Int64GetDatum(st.rec_tli);
	values[2] = TimestampTzGetDatum(st.recorded_at);
	nulls[0] = nulls[1] = nulls[2] = st.nrows == 0;
	values[3] = Int64GetDatum(st.floor);
	values[4] = Int64GetDatum(sysid);
	values[5] = Int64GetDatum((int64) tli);
	values[6] = BoolGetDatum(in_recovery);
	values[7] = BoolGetDatum(!in_recovery && floor_state_refuses(&st));
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values,
											 nulls));
}
