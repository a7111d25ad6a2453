/*-------------------------------------------------------------------------
 *
 * fence_owner.c
 *	  Act as the owner of lockfence.fences, connected to SPI.
 *
 * Every statement on the extension's tables (the fence table, and
 * lockfence.floor_state in failover_guard.c and floor_state.c) runs as
 * the fence table's owner: callers have no write privilege on the tables,
 * and SECURITY_RESTRICTED_OPERATION keeps their search_path and settings
 * from redirecting anything.  This file sits below both the fence store
 * and the failover guard, which both need it.
 *
 * IDENTIFICATION
 *	  src/fence_owner.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_class.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "fence_owner.h"
#include "lockfence_schema.h"

/* Does lockfence.fences have the lease columns?  Set by fence_store_enter. */
static bool fence_has_leases = false;

/*
 * The owner of lockfence.fences, as whom the statements run.  Looked up on
 * every use: DROP and CREATE EXTENSION may change it within a session.
 */
static Oid
fence_table_owner(void)
{
	Oid			relid = lockfence_relid("fences");
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

bool
fence_store_has_leases(void)
{
	return fence_has_leases;
}
