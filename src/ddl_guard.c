/*-------------------------------------------------------------------------
 *
 * ddl_guard.c
 *	  The guards against DDL that would take lockfence's protection away:
 *	  the DROP guard (an event trigger in C) and the settings that
 *	  override it and the publication guard (an event trigger in SQL,
 *	  lockfence.guard_publication, which reads its setting by name).
 *
 * The guard is called from an SQL object of the extension (an event
 * trigger), never from a hook, so that it works whether or not the
 * library is in shared_preload_libraries: calling it loads it.
 *
 * IDENTIFICATION
 *	  src/ddl_guard.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_language.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/event_trigger.h"
#include "commands/extension.h"
#include "commands/proclang.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "parser/parse_func.h"
#include "parser/parse_type.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "ddl_guard.h"
#include "lockfence_schema.h"

/* lockfence.allow_drop_protected: drop protections with the extension. */
static bool allow_drop_protected = false;

/* lockfence.allow_publish_fences: read by the publication event trigger. */
static bool allow_publish_fences = false;

PG_FUNCTION_INFO_V1(lockfence_guard_drop);

/*
 * Define the overrides of the DDL guards.  Called from _PG_init.
 * Both are USERSET: only the owner of the extension (or of a publication)
 * can run the commands they unlock anyway.
 */
void
ddl_guard_init(void)
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
 * The objects a DROP statement names, appended to *classids and *objids.
 * Names that do not resolve are skipped: the statement itself reports
 * them.  No lock is taken here (the drop takes its own); kinds of objects
 * that nothing of lockfence can depend on are not collected.
 */
static void
drop_targets(DropStmt *stmt, List **classids, List **objids)
{
	ListCell   *lc;

	foreach(lc, stmt->objects)
	{
		Node	   *obj = lfirst(lc);
		Oid			classid = InvalidOid;
		Oid			objid = InvalidOid;

		switch (stmt->removeType)
		{
			case OBJECT_EXTENSION:
				classid = ExtensionRelationId;
				objid = get_extension_oid(strVal(obj), true);
				break;
			case OBJECT_SCHEMA:
				classid = NamespaceRelationId;
				objid = get_namespace_oid(strVal(obj), true);
				break;
			case OBJECT_LANGUAGE:
				classid = LanguageRelationId;
				objid = get_language_oid(strVal(obj), true);
				break;
			case OBJECT_FUNCTION:
			case OBJECT_PROCEDURE:
			case OBJECT_ROUTINE:
			case OBJECT_AGGREGATE:
				classid = ProcedureRelationId;
				objid = LookupFuncWithArgs(stmt->removeType,
										   castNode(ObjectWithArgs, obj), true);
				break;
			case OBJECT_TYPE:
			case OBJECT_DOMAIN:
				classid = TypeRelationId;
				objid = LookupTypeNameOid(NULL, castNode(TypeName, obj), true);
				break;
			case OBJECT_TABLE:
			case OBJECT_VIEW:
			case OBJECT_MATVIEW:
			case OBJECT_SEQUENCE:
			case OBJECT_FOREIGN_TABLE:
				classid = RelationRelationId;
				objid = RangeVarGetRelid(makeRangeVarFromNameList(castNode(List, obj)),
										 NoLock, true);
				break;
			default:
				break;
		}
		if (OidIsValid(objid))
		{
			*classids = lappend_oid(*classids, classid);
			*objids = lappend_oid(*objids, objid);
		}
	}
}

/* An oid[] of the OIDs of a list. */
static Datum
oid_list_array(List *oids)
{
	Datum	   *elems = palloc(sizeof(Datum) * Max(list_length(oids), 1));
	ListCell   *lc;
	int			i = 0;

	foreach(lc, oids)
		elems[i++] = ObjectIdGetDatum(lfirst_oid(lc));
	return PointerGetDatum(construct_array(elems, i, OIDOID, sizeof(Oid),
										   true, TYPALIGN_INT));
}

/*
 * Connect to SPI for the guard's catalog queries, with search_path pinned.
 * The guard fires in every session that drops something, with that
 * session's search_path: a role that can create in a schema the path
 * names ahead of pg_catalog, or an operator of an exact match where
 * pg_catalog's needs a cast (oid = regclass), would otherwise choose what
 * runs, with the rights of whoever drops (a superuser's DROP TABLE could
 * make that role a superuser).  pg_temp is named last so that it is
 * searched after pg_catalog (it is never searched for functions and
 * operators).  Returns the GUC nest level for guard_spi_finish.
 */
static int
guard_spi_connect(void)
{
	int			nestlevel = NewGUCNestLevel();

	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	SPI_connect();
	return nestlevel;
}

static void
guard_spi_finish(int nestlevel)
{
	SPI_finish();
	AtEOXact_GUC(true, nestlevel);
}

/*
 * What a drop would take with it, computed from pg_depend the way
 * dependency.c does: everything that depends on a doomed object, and the
 * owner of a doomed internal part or extension member (dropping a member
 * by CASCADE drops its whole extension: DROP EXTENSION plpgsql CASCADE
 * drops lockfence, whose trigger helpers are written in PL/pgSQL).
 */
#define DOOMED_CTE \
	"WITH RECURSIVE doomed(classid, objid, objsubid) AS (" \
	"    SELECT s.c, s.o, 0" \
	"      FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.oid[]), pg_catalog.unnest($2::pg_catalog.oid[])) AS s(c, o)" \
	"  UNION" \
	"    SELECT n.classid, n.objid, n.objsubid" \
	"      FROM doomed x, LATERAL (" \
	"        SELECT d.classid, d.objid, d.objsubid FROM pg_catalog.pg_depend d" \
	"         WHERE d.refclassid = x.classid AND d.refobjid = x.objid" \
	"           AND (x.objsubid = 0 OR d.refobjsubid = x.objsubid)" \
	"        UNION ALL" \
	"        SELECT d.refclassid, d.refobjid, d.refobjsubid FROM pg_catalog.pg_depend d" \
	"         WHERE d.classid = x.classid AND d.objid = x.objid" \
	"           AND d.deptype IN ('i', 'e')) AS n" \
	") "

/*
 * Would dropping these objects (with CASCADE) drop the lockfence extension,
 * or a lockfence trigger of a table that stays?  Returns the extension's
 * name or a trigger's description, or NULL.  *whole is set when it is the
 * extension.
 */
static char *
drop_takes_lockfence(List *classids, List *objids, bool *whole)
{
	Oid			argtypes[2] = {OIDARRAYOID, OIDARRAYOID};
	Datum		values[2];
	char	   *result = NULL;
	MemoryContext caller = CurrentMemoryContext;
	int			nestlevel;

	*whole = false;
	if (classids == NIL)
		return NULL;
	values[0] = oid_list_array(classids);
	values[1] = oid_list_array(objids);

	nestlevel = guard_spi_connect();
	if (SPI_execute_with_args(DOOMED_CTE
							  "SELECT true, NULL::pg_catalog.text FROM doomed x"
							  "  JOIN pg_catalog.pg_extension e ON e.oid = x.objid"
							  " WHERE x.classid = 'pg_catalog.pg_extension'::pg_catalog.regclass"
							  "   AND e.extname = 'lockfence'"
							  " UNION ALL "
							  "(SELECT false, pg_catalog.format('trigger %I on table %s', t.tgname, t.tgrelid::pg_catalog.regclass)"
							  "   FROM doomed x"
							  "   JOIN pg_catalog.pg_trigger t ON t.oid = x.objid"
							  "   JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid"
							  "  WHERE x.classid = 'pg_catalog.pg_trigger'::pg_catalog.regclass"
							  "    AND p.prosrc = 'lockfence_fence_trigger' AND p.probin IS NOT NULL"
							  "    AND NOT EXISTS (SELECT FROM doomed y"
							  "                     WHERE y.classid = 'pg_catalog.pg_class'::pg_catalog.regclass"
							  "                       AND y.objid = t.tgrelid AND y.objsubid = 0)"
							  "  ORDER BY 2 LIMIT 1)"
							  " ORDER BY 1 DESC LIMIT 1",
							  2, argtypes, values, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not compute what the drop would remove");
	if (SPI_processed > 0)
	{
		bool		isnull;

		*whole = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
		if (*whole)
			result = MemoryContextStrdup(caller, "lockfence");
		else
			result = MemoryContextStrdup(caller,
										 SPI_getvalue(SPI_tuptable->vals[0],
													  SPI_tuptable->tupdesc, 2));
	}
	guard_spi_finish(nestlevel);
	return result;
}

/*
 * The objects that DROP OWNED would drop: those the roles own in this
 * database.
 */
static void
drop_owned_targets(DropOwnedStmt *stmt, List **classids, List **objids)
{
	List	   *roles = NIL;
	ListCell   *lc;
	Oid			argtypes[2] = {OIDARRAYOID, OIDOID};
	Datum		values[2];
	uint64		i;
	MemoryContext caller = CurrentMemoryContext;
	int			nestlevel;

	foreach(lc, stmt->roles)
	{
		Oid			role = get_rolespec_oid(lfirst(lc), true);

		if (OidIsValid(role))
			roles = lappend_oid(roles, role);
	}
	if (roles == NIL)
		return;
	values[0] = oid_list_array(roles);
	values[1] = ObjectIdGetDatum(MyDatabaseId);

	nestlevel = guard_spi_connect();
	if (SPI_execute_with_args("SELECT classid, objid FROM pg_catalog.pg_shdepend"
							  " WHERE refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass"
							  "   AND refobjid = ANY ($1) AND dbid = $2 AND deptype = 'o'",
							  2, argtypes, values, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list the objects owned by the roles");
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		MemoryContext old;
		Oid			c = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
													   SPI_tuptable->tupdesc, 1, &isnull));
		Oid			o = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
													   SPI_tuptable->tupdesc, 2, &isnull));

		/* the lists outlive SPI */
		old = MemoryContextSwitchTo(caller);
		*classids = lappend_oid(*classids, c);
		*objids = lappend_oid(*objids, o);
		MemoryContextSwitchTo(old);
	}
	guard_spi_finish(nestlevel);
}

/*
 * Run a query of one row (a count, and the min() of the names counted,
 * which is one of them when the count is not 0) under the guard's pinned
 * search_path; return the count and, when it is not 0, the name.
 * read_only false: a snapshot of its own, taken now.
 */
static int64
count_and_name_one(const char *query, bool read_only, const char *what,
				   char **example)
{
	int64		n;
	bool		isnull;
	Datum		d;
	int			nestlevel;

	*example = NULL;
	nestlevel = guard_spi_connect();
	if (SPI_execute(query, read_only, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not count %s", what);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	n = isnull ? 0 : DatumGetInt64(d);
	if (n > 0)
		*example = MemoryContextStrdup(TopTransactionContext,
									   SPI_getvalue(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 2));
	guard_spi_finish(nestlevel);
	return n;
}

/*
 * Count the tables that carry a lockfence trigger of their own (partitions'
 * cloned row triggers are not counted twice), and name one of them.
 */
static int64
count_protected_tables(char **example)
{
	return count_and_name_one("SELECT count(DISTINCT t.tgrelid),"
							  "       min(t.tgrelid::pg_catalog.regclass::pg_catalog.text)"
							  "  FROM pg_catalog.pg_trigger t"
							  "  JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid"
							  " WHERE p.prosrc = 'lockfence_fence_trigger' AND p.probin IS NOT NULL"
							  "   AND t.tgparentid = 0",
							  true, "the tables protected by lockfence", example);
}

/*
 * Count the leases that are held (unexpired), and name one of them.  A
 * database at an SQL version without leases, or without the table (a
 * member removed from the extension), has none.
 */
static int64
count_held_leases(char **example)
{
	Oid			nsp = lockfence_schema_oid();
	Oid			fences;

	*example = NULL;
	fences = OidIsValid(nsp) ? get_relname_relid("fences", nsp) : InvalidOid;
	if (!OidIsValid(fences) ||
		get_attnum(fences, "lease_expires_at") == InvalidAttrNumber)
		return 0;

	/*
	 * No grant between the count and the drop: wait for those in flight,
	 * hold off new ones (the drop takes the table anyway), and count with
	 * a snapshot taken after that.
	 */
	LockRelationOid(fences, ExclusiveLock);
	return count_and_name_one("SELECT count(*), min(resource)"
							  "  FROM lockfence.fences"
							  " WHERE lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()",
							  false, "the leases held in lockfence.fences", example);
}

/*
 * Refuse to rename the extension's schema: its functions name it.
 */
static void
guard_schema_rename(RenameStmt *stmt)
{
	Oid			nsp;

	if (stmt->renameType != OBJECT_SCHEMA)
		return;
	nsp = lockfence_schema_oid();
	if (OidIsValid(nsp) && get_namespace_oid(stmt->subname, true) == nsp)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot rename schema \"%s\" of extension lockfence",
						stmt->subname),
				 errdetail("The functions of lockfence and the triggers that protect tables name it.")));
}

/*
 * Refuse ALTER EXTENSION lockfence DROP while tables are protected: its
 * members could be dropped one by one after it.
 */
static void
guard_member_removal(AlterExtensionContentsStmt *stmt)
{
	char	   *example;
	int64		n;

	if (stmt->action > 0 || strcmp(stmt->extname, "lockfence") != 0)
		return;
	n = count_protected_tables(&example);
	if (n > 0)
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg_plural("cannot remove an object from extension lockfence while %lld table is protected by it",
							   "cannot remove an object from extension lockfence while %lld tables are protected by it",
							   n, (long long) n),
				 errdetail("Table %s is protected.  An object removed from the extension can be dropped "
						   "without the extension, and the protections with it.",
						   example),
				 errhint("Run SELECT lockfence.unprotect(tbl) for each protected table first, "
						 "or SET lockfence.allow_drop_protected = on.")));
}

/*
 * Refuse a DROP or DROP OWNED that would drop a lockfence trigger of a
 * table it does not drop, or the extension while tables are protected or
 * leases held.  Other statements are let through.
 */
static void
guard_drop_statement(Node *parsetree)
{
	List	   *classids = NIL;
	List	   *objids = NIL;
	char	   *doomed;
	bool		whole;
	char	   *example;
	int64		n;

	if (IsA(parsetree, DropStmt))
		drop_targets((DropStmt *) parsetree, &classids, &objids);
	else if (IsA(parsetree, DropOwnedStmt))
		drop_owned_targets((DropOwnedStmt *) parsetree, &classids, &objids);
	else
		return;

	doomed = drop_takes_lockfence(classids, objids, &whole);
	if (doomed == NULL)
		return;
	if (!whole)
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg("cannot drop the lockfence %s", doomed),
				 errdetail("The table would stay, and be written without fencing tokens."),
				 errhint("Run SELECT lockfence.unprotect(tbl) for the table first, "
						 "or SET lockfence.allow_drop_protected = on.")));

	n = count_protected_tables(&example);
	if (n > 0)
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg_plural("cannot drop lockfence while %lld table is protected by it",
							   "cannot drop lockfence while %lld tables are protected by it",
							   n, (long long) n),
				 errdetail("Table %s is protected.  Dropping the extension would drop every "
						   "protection, and creating it again would not restore them.",
						   example),
				 errhint("Run SELECT lockfence.unprotect(tbl) for each protected table first, "
						 "or SET lockfence.allow_drop_protected = on and drop with CASCADE to drop the protections "
						 "with the extension.")));

	/*
	 * A held lease's token would be granted again after CREATE EXTENSION,
	 * to another holder, while the first still holds it: what reset()
	 * refuses for one name.
	 */
	n = count_held_leases(&example);
	if (n > 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg_plural("cannot drop lockfence while %lld lease is held",
							   "cannot drop lockfence while %lld leases are held",
							   n, (long long) n),
				 errdetail("The lease of \"%s\" is held.  Creating the extension again would grant "
						   "its token again, to another holder, before the lease ends.",
						   example),
				 errhint("End the leases with lockfence.lease_release(name, token) or let them expire, "
						 "or SET lockfence.allow_drop_protected = on.")));
}

/*
 * Event trigger (ddl_command_start of the DROP statements, DROP OWNED,
 * ALTER EXTENSION and ALTER SCHEMA): refuse what would take lockfence's
 * protection away from tables that stay.
 *
 * A drop is refused when, with CASCADE, it would drop the extension while
 * tables are protected (DROP EXTENSION lockfence, DROP SCHEMA of its schema
 * under any name, DROP EXTENSION plpgsql, DROP OWNED BY its owner, ...),
 * or a lockfence trigger of a table it does not drop; and a drop of the
 * extension while a lease is held.  Whether it would is
 * computed from pg_depend before anything is dropped; an event trigger on
 * sql_drop could not do it, since it is dropped with the extension before
 * it would fire.  Objects of other kinds (triggers, indexes, ...) are let
 * through: nothing of lockfence depends on them, and DROP TRIGGER is how
 * lockfence.unprotect() works.
 *
 * ALTER EXTENSION lockfence DROP (after which its members could be dropped
 * one by one) is refused while tables are protected, and renaming the
 * extension's schema always: its functions name it.
 * lockfence.allow_drop_protected lets all but the rename through.
 */
Datum
lockfence_guard_drop(PG_FUNCTION_ARGS)
{
	EventTriggerData *trigdata;
	Node	   *parsetree;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_EVENT_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("lockfence.guard_drop() must be called as an event trigger")));
	trigdata = (EventTriggerData *) fcinfo->context;
	parsetree = trigdata->parsetree;

	/* lockfence's own install and update scripts replace its members */
	if (creating_extension &&
		CurrentExtensionObject == get_extension_oid("lockfence", true))
		PG_RETURN_VOID();

	if (IsA(parsetree, RenameStmt))
		guard_schema_rename((RenameStmt *) parsetree);
	else if (!allow_drop_protected)
	{
		if (IsA(parsetree, AlterExtensionContentsStmt))
			guard_member_removal((AlterExtensionContentsStmt *) parsetree);
		else
			guard_drop_statement(parsetree);
	}
	PG_RETURN_VOID();
}
