/*-------------------------------------------------------------------------
 *
 * protected_tables.c
 *	  lockfence.protected_tables, the list of the tables lockfence
 *	  protects, kept true to the database (sync_protected_tables).
 *
 * IDENTIFICATION
 *	  src/protected_tables.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "lockfence_schema.h"

PG_FUNCTION_INFO_V1(lockfence_sync_protected_tables);

/*
 * A lockfence row trigger of the table's own (not a partition's clone of
 * its parent's): what makes lockfence list a table as protected.
 */
#define OWN_ROW_TRIGGER(relid) \
	"SELECT FROM pg_catalog.pg_trigger t" \
	" WHERE t.tgrelid = " relid \
	"   AND t.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure" \
	"   AND t.tgparentid = 0 AND (t.tgtype::pg_catalog.int4 & 1) = 1"

/*
 * The names in sync_protected_tables' forget ($1), in the form the list
 * holds them: quoted as quote_all_identifiers off quotes them, whatever
 * the caller's setting quoted them as (object_identity, format('%I')).
 */
#define FORGET_NAMES \
	"(SELECT CASE WHEN pg_catalog.array_length(i.p, 1) = 2" \
	"   THEN pg_catalog.format('%I.%I', i.p[1], i.p[2]) ELSE u.x END" \
	"   FROM pg_catalog.unnest($1) AS u(x)," \
	"        pg_catalog.parse_ident(u.x, false) AS i(p))"

/*
 * May a listed name p.tbl that names no table be forgotten?  By a role
 * with the privileges of the list's owner (privileged: an SQL boolean),
 * or with CREATE on the schema the name is in (role: "" for the current
 * user, or "$n, " for a parameter), which could make the name resolve and
 * drop its table anyway.  Not by anyone else, e.g. any role renaming a
 * protected table of its own (a rename removes the names that no longer
 * resolve): the name stands for a protected table that check() reports
 * missing, one left out of a restored dump, say.
 */
#define MAY_FORGET_MISSING(privileged, role) \
	"(" privileged " OR EXISTS (SELECT FROM pg_catalog.pg_namespace n" \
	"   WHERE n.nspname = (pg_catalog.parse_ident(p.tbl, false))[1]" \
	"     AND pg_catalog.has_schema_privilege(" role "n.oid, 'CREATE')))"

/*
 * Refuse to forget a listed name that names no table, for a caller that
 * may not (MAY_FORGET_MISSING).
 */
static void
forget_missing_check(Oid registry_owner, Oid *argtypes, Datum *values)
{
	char	   *name;

	if (SPI_execute_with_args("SELECT p.tbl FROM lockfence.protected_tables p"
							  " WHERE p.tbl IN " FORGET_NAMES
							  "   AND lockfence.protected_table_oid(p.tbl) IS NULL"
							  "   AND NOT " MAY_FORGET_MISSING("false", "")
							  " ORDER BY p.tbl LIMIT 1",
							  1, argtypes, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read lockfence.protected_tables");
	if (SPI_processed == 0)
		return;
	name = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("must have the privileges of role \"%s\", or CREATE on the schema, to make lockfence forget table %s, which does not exist",
					GetUserNameFromId(registry_owner, false), name),
			 errdetail("lockfence.check() reports a listed table that is missing (protected_table_missing): a dump restored without it, or a table dropped while lockfence's event triggers were disabled.")));
}

/*
 * lockfence.sync_protected_tables(forget text[], renamed boolean)
 *
 * Keep lockfence.protected_tables, the tables lockfence lists as
 * protected, true to the database.  The list is an extension
 * configuration table: pg_dump dumps its rows with the data, so that a
 * restore that brings the data but not the triggers (a data-only restore,
 * or one without post-data) leaves names that check() reports.  The names
 * are text (schema-qualified, quoted), not regclass: a dump that leaves a
 * listed table out (pg_dump -T, -N) must restore like any other, and a
 * COPY of text never fails where one of regclass would.  Without OIDs,
 * the list follows the tables by their names:
 *
 * - every call adds the name of each table with a lockfence row trigger
 *   of its own (not temporary: dropped at the end of the session without
 *   event triggers, and never dumped);
 * - forget: these names are removed if they no longer name a relation
 *   (dropped), or name a table without a lockfence row trigger of its own
 *   that the caller owns (unprotect(), as DROP TRIGGER requires).  A
 *   table whose triggers went by other means (a partial restore) must be
 *   reported by check(): only its owner may make lockfence forget it.  A
 *   name that names nothing (a table left out of a restored dump, or
 *   dropped while the event triggers were disabled) is reported too, and
 *   only roles that MAY_FORGET_MISSING may make lockfence forget it: the
 *   sql_drop event trigger, which runs as the list's owner, for the tables
 *   a statement drops, and the operator check() hints at;
 * - renamed (after ALTER TABLE, ALTER SCHEMA): if that added a name, a
 *   table was renamed or moved, and the names that no longer resolve are
 *   removed, those the caller MAY_FORGET_MISSING.  Not after other commands: the names of tables left out of
 *   the dump a database was restored from must stay listed for check()
 *   (protected_table_missing) through the restore's post-data.
 *
 * The list is written as its owner, like the fences, so that the owner of
 * a table may protect it without owning the extension; what is written is
 * decided here, not by the caller.  So the caller's search_path must not
 * choose what the statements call (an operator "=" of the caller's ahead
 * of pg_catalog's would run as the list's owner): the SQL declaration
 * sets search_path = pg_catalog, pg_temp.  Nor may quote_all_identifiers
 * choose the form of the names: the statements run with it off, and the
 * names to forget are put in that form (FORGET_NAMES).
 *
 * (Over 80 lines, kept whole: four statements in a fixed order under one
 * SPI connection and one change of user, which a split would spread over
 * functions that only make sense in that order.)
 */
Datum
lockfence_sync_protected_tables(PG_FUNCTION_ARGS)
{
	bool		renamed = !PG_ARGISNULL(1) && PG_GETARG_BOOL(1);
	HeapTuple	tuple;
	Oid			registry;
	Oid			registry_owner;
	Oid			save_userid;
	int			save_sec_context;
	Oid			argtypes[1] = {TEXTARRAYOID};
	Datum		values[1];
	uint64		added;
	int			nestlevel;

	values[0] = PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0);

	registry = lockfence_relid("protected_tables");
	if (!OidIsValid(registry))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"lockfence.protected_tables\" does not exist"),
				 errhint("Update the extension with ALTER EXTENSION lockfence UPDATE.")));
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(registry));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", registry);
	registry_owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);

	nestlevel = NewGUCNestLevel();
	(void) set_config_option("quote_all_identifiers", "off", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	SPI_connect();

	/* As the caller: may it make lockfence forget these tables? */
	if (!PG_ARGISNULL(0))
	{
		if (SPI_execute_with_args("SELECT c.oid FROM lockfence.protected_tables p"
								  "  JOIN pg_catalog.pg_class c"
								  "    ON c.oid = lockfence.protected_table_oid(p.tbl)"
								  " WHERE p.tbl IN " FORGET_NAMES
								  "   AND NOT EXISTS (" OWN_ROW_TRIGGER("c.oid") ")"
								  "   AND NOT pg_catalog.pg_has_role(c.relowner, 'USAGE')"
								  " ORDER BY p.tbl LIMIT 1",
								  1, argtypes, values, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read lockfence.protected_tables");
		if (SPI_processed > 0)
		{
			bool		isnull;
			Oid			relid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
															   SPI_tuptable->tupdesc,
															   1, &isnull));

			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("must be owner of table %s to make lockfence forget that it was protected",
							get_rel_name(relid)),
					 errdetail("lockfence.check() reports a listed table that lost its lockfence triggers.")));
		}
		if (!has_privs_of_role(GetUserId(), registry_owner))
			forget_missing_check(registry_owner, argtypes, values);
	}

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(registry_owner,
						   save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);

	if (SPI_execute("INSERT INTO lockfence.protected_tables (tbl)"
					" SELECT DISTINCT pg_catalog.format('%I.%I', n.nspname, c.relname)"
					"   FROM pg_catalog.pg_trigger t"
					"   JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid"
					"   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
					"  WHERE t.tgfoid = 'lockfence.fence_trigger()'::pg_catalog.regprocedure"
					"    AND t.tgparentid = 0 AND (t.tgtype::pg_catalog.int4 & 1) = 1"
					"    AND c.relpersistence <> 't'"
					" ON CONFLICT (tbl) DO NOTHING",
					false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write lockfence.protected_tables");
	added = SPI_processed;

	if (!PG_ARGISNULL(0) &&
		SPI_execute_with_args("DELETE FROM lockfence.protected_tables p"
							  " WHERE p.tbl IN " FORGET_NAMES
							  "   AND NOT EXISTS (" OWN_ROW_TRIGGER("lockfence.protected_table_oid(p.tbl)") ")",
							  1, argtypes, values, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not write lockfence.protected_tables");

	if (renamed && added > 0)
	{
		Oid			renamed_argtypes[2] = {BOOLOID, OIDOID};
		Datum		renamed_values[2];

		renamed_values[0] = BoolGetDatum(has_privs_of_role(save_userid,
														   registry_owner));
		renamed_values[1] = ObjectIdGetDatum(save_userid);
		if (SPI_execute_with_args("DELETE FROM lockfence.protected_tables p"
								  " WHERE lockfence.protected_table_oid(p.tbl) IS NULL"
								  "   AND " MAY_FORGET_MISSING("$1", "$2, "),
								  2, renamed_argtypes, renamed_values, NULL,
								  false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not write lockfence.protected_tables");
	}

	SetUserIdAndSecContext(save_userid, save_sec_context);
	SPI_finish();
	AtEOXact_GUC(true, nestlevel);
	PG_RETURN_VOID();
}
