/*-------------------------------------------------------------------------
 *
 * lockfence_schema.c
 *	  The extension's schema and its tables, looked up by name.
 *
 * The extension is not relocatable and its control file names its schema,
 * lockfence, so the schema is found by that name (no query of
 * pg_extension), and renaming it is refused (ddl_guard.c).  Looked up on
 * every use, not cached: DROP and CREATE EXTENSION may change the OIDs
 * within a session.
 *
 * IDENTIFICATION
 *	  src/lockfence_schema.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "utils/lsyscache.h"

#include "lockfence_schema.h"

/* The OID of the schema lockfence, InvalidOid when there is none. */
Oid
lockfence_schema_oid(void)
{
	return get_namespace_oid("lockfence", true);
}

/* The OID of the table lockfence.relname, InvalidOid when there is none. */
Oid
lockfence_relid(const char *relname)
{
	Oid			nspid = lockfence_schema_oid();

	if (!OidIsValid(nspid))
		return InvalidOid;
	return get_relname_relid(relname, nspid);
}
