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
 * So it is while the table holds more than one row: a dump restored into
 * the server that made it (a new database, or pg_restore --clean) brings
 * its own row beside the one CREATE EXTENSION recorded, both naming this
 * server, and its fences are as old as the dump (since the library of
 * 1.9; before, such a restore was accepted at once).
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
 * sends a relcache invalidation for the table, which makes every backend
 * read it again: the functions here send it, and since 1.8 so do the
 * table's triggers for a write made any other way (by hand, a restore,
 * logical replication).  A refused backend reads the table on
 * every call, so that a raised floor lifts the refusal at once.
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
#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlogrecovery.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
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
#include "fence_owner.h"
#include "floor_state.h"
#include "lockfence.h"
#include "lockfence_schema.h"

PG_FUNCTION_INFO_V1(lockfence_floor_identity);
PG_FUNCTION_INFO_V1(lockfence_floor_record);
PG_FUNCTION_INFO_V1(lockfence_floor_adopt);
PG_FUNCTION_INFO_V1(lockfence_accept_promotion);
PG_FUNCTION_INFO_V1(lockfence_floor_status);
PG_FUNCTION_INFO_V1(lockfence_floor_state_changed);

pg_noreturn static void
guard_report(TimeLineID tli)
{
	const FloorState *st = floor_state_cached();
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
	if (st->mismatch && st->rec_tli != (int64) tli)
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_FLOOR_REQUIRED),
				 errmsg("this server was promoted and its fence floor has not been raised"),
				 errdetail("The fences were recorded on timeline " INT64_FORMAT "; this server writes timeline %u.",
						   st->rec_tli, tli),
				 errhint("%s", hint)));
	if (st->nrows > 1)			/* this server's rows: a restored dump */
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_FLOOR_REQUIRED),
				 errmsg("the fences of this database were restored from a dump and its fence floor has not been raised"),
				 errdetail("Table lockfence.floor_state holds %d rows, the one recorded when the extension was created here and the dumped ones: the restored fences are as old as the dump.",
						   st->nrows),
				 errhint("Raise the floor with lockfence.etcd_raise_floor() or lockfence.raise_floor(floor), "
						 "or, if nothing was fenced or granted since the dump was taken, "
						 "call lockfence.accept_promotion().")));
	/* One row naming this server, recorded in another database. */
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_FLOOR_REQUIRED),
			 errmsg("the fences of this database were copied from another database and its fence floor has not been raised"),
			 errdetail("Table lockfence.floor_state was recorded in the database of OID %u; this one is %u (a copy made with CREATE DATABASE ... TEMPLATE): the copied fences are as old as the copy.",
					   st->rec_database, MyDatabaseId),
			 errhint("Raise the floor with lockfence.etcd_raise_floor() or lockfence.raise_floor(floor), "
					 "or, if nothing was fenced or granted in the original database since the copy was made, "
					 "call lockfence.accept_promotion().")));
}

void
lockfence_failover_guard(void)
{
	TimeLineID	tli;

	/*
	 * The kept verdicts (this file's, the Citus guard's) are dropped by
	 * invalidations, which PostgreSQL reads at the start of a transaction
	 * and when a new lock is taken.  A fence in a transaction that holds
	 * every lock its check takes would read none: a write to
	 * lockfence.floor_state committed since (by hand, a restore) would be
	 * missed until the transaction ends.  Reading them here costs little
	 * when there are none.
	 */
	AcceptInvalidationMessages();
	lockfence_citus_guard_fences(); /* fences past Citus: docs/citus.md */
	if (RecoveryInProgress())
		return;
	tli = GetWALInsertionTimeLine();
	if (floor_state_refused(tli))
		guard_report(tli);
}

/*
 * Write the one row of lockfence.floor_state (relid), through SPI: this
 * server's identity, the floor, and (SQL 1.10) this database.
 */
static void
floor_record_insert(Oid relid, int64 sysid, TimeLineID tli, int64 floor)
{
	Oid			argtypes[4] = {INT8OID, INT8OID, INT8OID, OIDOID};
	Datum		values[4];
	int			rc;

	values[0] = Int64GetDatum(sysid);
	values[1] = Int64GetDatum((int64) tli);
	values[2] = Int64GetDatum(floor);
	values[3] = ObjectIdGetDatum(MyDatabaseId);
	if (floor_state_has_database(relid))
		rc = SPI_execute_with_args("INSERT INTO lockfence.floor_state"
								   " (system_identifier, timeline, floor, recorded_at, database_oid)"
								   " VALUES ($1, $2, $3, pg_catalog.statement_timestamp(), $4)",
								   4, argtypes, values, NULL, false, 0);
	else
		rc = SPI_execute_with_args("INSERT INTO lockfence.floor_state"
								   " (system_identifier, timeline, floor, recorded_at)"
								   " VALUES ($1, $2, $3, pg_catalog.statement_timestamp())",
								   3, argtypes, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "SPI_execute failed writing lockfence.floor_state: %s",
			 SPI_result_code_string(rc));
}

/*
 * Record this server's identity with floor max(recorded floors, floor) as
 * the only row of lockfence.floor_state; returns that floor.  Under READ
 * COMMITTED only: with a transaction snapshot, the DELETE would miss a row
 * another recorder committed after it (on an empty table: no update
 * conflict to stop it), and leave two rows, which refuse every fence.
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

	floor_state_identity(&sysid, &tli, &in_recovery);
	if (in_recovery)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot record the fence floor while the server is in recovery"),
				 errhint("Run it on the primary, after the promotion.")));
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot record the fence floor under %s",
						IsolationIsSerializable() ? "SERIALIZABLE" : "REPEATABLE READ"),
				 errdetail("The transaction's snapshot would miss a floor recorded after it, and leave two records."),
				 errhint("Run it in a READ COMMITTED transaction (SET default_transaction_isolation = 'read committed').")));
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
	old = floor_state_int64(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	floor = Max(floor, old);

	/*
	 * Every backend (this one at its next command) reads the table again.
	 * Queued before the writes: the statements' command counter increments
	 * then make it one of an earlier command's invalidations, which an
	 * abort replays in this backend.  Queued after the last one, it was
	 * dropped with the failed command, and a verdict read in the same
	 * command from the rows rolled back (a fence beside accept_promotion()
	 * in one failing statement) stayed kept.
	 */
	CacheInvalidateRelcacheByRelid(relid);
	rc = SPI_execute("DELETE FROM lockfence.floor_state", false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "SPI_execute failed clearing lockfence.floor_state: %s",
			 SPI_result_code_string(rc));
	floor_record_insert(relid, sysid, tli, floor);
	fence_store_leave(&state);
	floor_state_forget();
	return floor;
}

/*
 * lockfence.floor_adopt() returns void
 *
 * Called by raise_floor(floor, resources) before it writes fence rows
 * (1.10): in an empty copy of a database (floor_state.c), record the row
 * as this database's, as a fenced write does through the guard; else the
 * rows would make it a copy holding fences, refused.  Anything else is
 * left as it is, refused or not: raise_floor() works while refused.
 */
Datum
lockfence_floor_adopt(PG_FUNCTION_ARGS)
{
	if (!RecoveryInProgress())
		(void) floor_state_refused(GetWALInsertionTimeLine());
	PG_RETURN_VOID();
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
	floor_state_identity(&sysid, &tli, &in_recovery);
	values[0] = Int64GetDatum(sysid);
	values[1] = Int64GetDatum((int64) tli);
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values,
											 nulls));
}

/*
 * lockfence.floor_status() returns one row: the recorded identity (a
 * mismatching row if there is one), the global floor, this server's
 * identity, whether it is in recovery, and whether fenced writes and
 * lease operations are refused (LF004) now; from SQL 1.11 also the
 * database the row was recorded in and this one (the SQL of 1.4 to 1.10
 * declares the first eight columns only, and gets those).
 */
Datum
lockfence_floor_status(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[10];
	bool		nulls[10] = {0};
	int64		sysid;
	TimeLineID	tli;
	bool		in_recovery;
	FloorState	st;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	floor_state_identity(&sysid, &tli, &in_recovery);
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
	values[8] = ObjectIdGetDatum(st.rec_database);
	nulls[8] = st.nrows == 0 || !OidIsValid(st.rec_database);
	values[9] = ObjectIdGetDatum(MyDatabaseId);
	if (tupdesc->natts != 8 && tupdesc->natts != lengthof(values))
		elog(ERROR, "lockfence.floor_status() declares %d columns, not 8 or %d",
			 tupdesc->natts, (int) lengthof(values));
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values,
											 nulls));
}

/*
 * lockfence.floor_state_changed() returns trigger
 *
 * AFTER INSERT OR UPDATE OR DELETE FOR EACH ROW, and AFTER TRUNCATE, on
 * lockfence.floor_state (1.8), enabled ALWAYS.  A write that does not go
 * through floor_record() would otherwise be seen only by sessions that
 * start after it: the others keep the verdict and the global floor they
 * read before.  A row trigger, because logical replication's apply fires
 * no statement triggers for the rows it writes.  The invalidation is sent
 * at commit, as floor_record()'s.
 */
Datum
lockfence_floor_state_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("lockfence.floor_state_changed() must be fired AFTER the write")));
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	floor_state_forget();
	PG_RETURN_POINTER(NULL);
}
