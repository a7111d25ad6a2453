/*-------------------------------------------------------------------------
 *
 * check.c
 *	  Deployment safeguards: the DROP EXTENSION guard and the etcd probe
 *	  used by lockfence.check().
 *
 * Both are called from SQL objects of the extension (an event trigger and
 * a function), never from a hook, so that they work whether or not the
 * library is in shared_preload_libraries: calling them loads it.
 *
 * IDENTIFICATION
 *	  src/check.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/event_trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "nodes/parsenodes.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "etcd.h"
#include "lockfence.h"

/* lockfence.allow_drop_protected: drop protections with the extension. */
static bool allow_drop_protected = false;

/* lockfence.allow_publish_fences: read by the publication event trigger. */
static bool allow_publish_fences = false;

PG_FUNCTION_INFO_V1(lockfence_guard_drop);
PG_FUNCTION_INFO_V1(lockfence_etcd_status);

/*
 * Define the overrides of the deployment safeguards.  Called from _PG_init.
 * Both are USERSET: only the owner of the extension (or of a publication)
 * can run the commands they unlock anyway.
 */
void
lockfence_check_init(void)
{
	DefineCustomBoolVariable("lockfence.allow_drop_protected",
							 gettext_noop("Allows DROP EXTENSION lockfence while tables are protected."),
							 gettext_noop("The protections (the tables' lockfence triggers) are dropped "
										  "with the extension and are not restored by CREATE EXTENSION."),
							 &allow_drop_protected,
							 false,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);
	DefineCustomBoolVariable("lockfence.allow_publish_fences",
							 gettext_noop("Allows publications that would publish lockfence.fences."),
							 gettext_noop("A subscriber's fences would then follow the publisher's."),
							 &allow_publish_fences,
							 false,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);
}

/*
 * Does a DROP statement name lockfence's extension or schema?  The names
 * in a DropStmt of these kinds are String nodes.
 */
static bool
drop_names_lockfence(DropStmt *stmt)
{
	ListCell   *lc;

	if (stmt->removeType != OBJECT_EXTENSION &&
		stmt->removeType != OBJECT_SCHEMA)
		return false;
	foreach(lc, stmt->objects)
	{
		Node	   *name = lfirst(lc);

		if (IsA(name, String) && strcmp(strVal(name), "lockfence") == 0)
			return true;
	}
	return false;
}

/*
 * Does DROP OWNED name the owner of the lockfence extension?  DROP OWNED
 * drops the extension with the rest of the role's objects.
 */
static bool
drop_owned_lockfence(DropOwnedStmt *stmt)
{
	Oid			owner = InvalidOid;
	ListCell   *lc;

	SPI_connect();
	if (SPI_execute("SELECT extowner FROM pg_catalog.pg_extension"
					" WHERE extname = 'lockfence'", true, 1) == SPI_OK_SELECT &&
		SPI_processed == 1)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			owner = DatumGetObjectId(d);
	}
	SPI_finish();

	foreach(lc, stmt->roles)
	{
		RoleSpec   *role = lfirst(lc);

		if (OidIsValid(owner) && get_rolespec_oid(role, true) == owner)
			return true;
	}
	return false;
}

/*
 * Count the tables that carry a lockfence trigger of their own (partitions'
 * cloned row triggers are not counted twice), and name one of them.
 */
static int64
count_protected_tables(char **example)
{
	int64		n = 0;

	*example = NULL;
	SPI_connect();
	if (SPI_execute("SELECT count(DISTINCT t.tgrelid),"
					"       min(t.tgrelid::pg_catalog.regclass::pg_catalog.text)"
					"  FROM pg_catalog.pg_trigger t"
					" WHERE t.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure"
					"   AND t.tgparentid = 0",
					true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not count the tables protected by lockfence");
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull);

		n = isnull ? 0 : DatumGetInt64(d);
		if (n > 0)
		{
			char	   *s = SPI_getvalue(SPI_tuptable->vals[0],
										 SPI_tuptable->tupdesc, 2);

			*example = s ? MemoryContextStrdup(TopTransactionContext, s) : NULL;
		}
	}
	SPI_finish();
	return n;
}

/*
 * Event trigger (ddl_command_start, DROP EXTENSION, DROP SCHEMA and DROP
 * OWNED): refuse to drop lockfence while tables are protected by it.  DROP
 * EXTENSION ... CASCADE would drop every protection with a NOTICE, and a
 * new CREATE EXTENSION would leave every table silently unprotected.  The
 * statement's own names are read from its parse tree, so dropping other
 * extensions is never refused.
 */
Datum
lockfence_guard_drop(PG_FUNCTION_ARGS)
{
	EventTriggerData *trigdata;
	char	   *example;
	int64		n;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_EVENT_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("lockfence_guard_drop() must be called as an event trigger")));
	trigdata = (EventTriggerData *) fcinfo->context;

	if (allow_drop_protected)
		PG_RETURN_VOID();
	if (IsA(trigdata->parsetree, DropStmt))
	{
		if (!drop_names_lockfence((DropStmt *) trigdata->parsetree))
			PG_RETURN_VOID();
	}
	else if (IsA(trigdata->parsetree, DropOwnedStmt))
	{
		if (!drop_owned_lockfence((DropOwnedStmt *) trigdata->parsetree))
			PG_RETURN_VOID();
	}
	else
		PG_RETURN_VOID();

	n = count_protected_tables(&example);
	if (n > 0)
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg_plural("cannot drop lockfence while %lld table is protected by it",
							   "cannot drop lockfence while %lld tables are protected by it",
							   n, (long long) n),
				 errdetail("Table %s is protected.  Dropping the extension would drop every "
						   "protection, and creating it again would not restore them.",
						   example ? example : "?"),
				 errhint("Run SELECT lockfence.unprotect(tbl) for each protected table first, "
						 "or SET lockfence.allow_drop_protected = on and drop with CASCADE to drop the protections "
						 "with the extension.")));
	PG_RETURN_VOID();
}

/*
 * lockfence.etcd_status(timeout_ms): ask the configured etcd endpoints for
 * their status, failing over between them within timeout_ms.  Returns the
 * endpoint that answered, the leader's member ID (NULL: no leader) and the
 * cluster's revision.  Raises the usual connection errors; check() catches
 * them.
 */
Datum
lockfence_etcd_status(PG_FUNCTION_ARGS)
{
	int32		timeout_ms = PG_GETARG_INT32(0);
	EtcdReply	reply;
	char	   *leader;
	int64		revision = 0;
	JsonbContainer *header;
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	if (timeout_ms <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout_ms must be positive")));
	if (etcd_endpoint_count() == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("lockfence.etcd_endpoints is not set")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	if (!etcd_call("/v3/maintenance/status", "{}", timeout_ms, false, &reply))
		etcd_report_reply_error("a status request", &reply);
	/* Member IDs are unsigned 64-bit: kept as text.  Absent or 0: none. */
	leader = etcd_json_string(&reply.json->root, "leader");
	header = etcd_json_object(&reply.json->root, "header");
	if (header)
		(void) etcd_json_int64(header, "revision", &revision);

	values[0] = CStringGetTextDatum(reply.endpoint ? reply.endpoint : "");
	if (leader == NULL || strcmp(leader, "0") == 0)
		nulls[1] = true;
	else
		values[1] = CStringGetTextDatum(leader);
	values[2] = Int64GetDatum(revision);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
													  values, nulls)));
}
