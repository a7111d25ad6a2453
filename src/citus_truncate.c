/*-------------------------------------------------------------------------
 *
 * citus_truncate.c
 *	  Refuse TRUNCATE of a protected table's shard on a Citus node.
 *
 * Citus copies a distributed table's row triggers to its shards, so every
 * row written straight into a shard is fenced; it does not copy the
 * TRUNCATE trigger (shards made by a split are the exception).  Citus
 * refuses a TRUNCATE of a shard itself only outside what it takes for its
 * own backends (by application_name, which any role may set) and unless
 * the session has set citus.enable_manual_changes_to_shards (which any
 * role may): a role granted TRUNCATE on a protected distributed table
 * could empty its shards on a worker without a token (reviews, 1.12 and
 * 1.13).  A protected distributed table is fenced by its resource column,
 * row by row, and TRUNCATE of such a table is refused outright (0A000): so
 * is TRUNCATE of its shards, whatever the settings.  Citus' own shard
 * operations (moves, splits, rebalancing, cleanup) do not truncate a
 * protected table's shards (a review ran them with the check active).
 *
 * This is a utility hook, unlike lockfence's other guards (event triggers,
 * which work without preloading): TRUNCATE fires no event trigger, and no
 * trigger on the shard.  Citus needs lockfence in shared_preload_libraries
 * on every node anyway (docs/citus.md), so the hook is there.  It judges
 * before the TRUNCATE runs, from the catalogs, with the names resolved as
 * TRUNCATE is about to resolve them: after it, the statement's own
 * TRUNCATE triggers (on another table it names) would have run user code
 * that can change the settings or the search path the check reads.
 *
 * IDENTIFICATION
 *	  src/citus_truncate.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/heap.h"
#include "catalog/namespace.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"

#include "citus_guard.h"
#include "fence_trigger.h"

static ProcessUtility_hook_type prev_process_utility = NULL;

/*
 * Does table relid have a lockfence row trigger (as Citus copies it to a
 * protected table's shards), enabled or not?  Read from pg_trigger: the
 * table is not locked yet.
 */
static bool
has_fence_row_trigger(Oid relid)
{
	Relation	tgrel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	bool		found = false;

	tgrel = table_open(TriggerRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_trigger_tgrelid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(tgrel, TriggerRelidNameIndexId, true, NULL,
							  1, &key);
	while (!found && HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		Form_pg_trigger trigger = (Form_pg_trigger) GETSTRUCT(tuple);

		found = TRIGGER_FOR_ROW(trigger->tgtype) &&
			lockfence_is_fence_trigger_function(trigger->tgfoid);
	}
	systable_endscan(scan);
	table_close(tgrel, AccessShareLock);
	return found;
}

/*
 * Refuse a TRUNCATE that would empty a shard of a protected table: one of
 * the tables it names, their partitions (unless ONLY), and with CASCADE
 * the tables referencing them, found as TRUNCATE finds them.
 */
static void
refuse_shard_truncate(TruncateStmt *stmt)
{
	List	   *relids = NIL;
	ListCell   *lc;

	if (!lockfence_citus_present())
		return;

	foreach(lc, stmt->relations)
	{
		RangeVar   *rv = lfirst_node(RangeVar, lc);
		Oid			relid = RangeVarGetRelid(rv, NoLock, true);

		if (!OidIsValid(relid))
			continue;			/* TRUNCATE reports it */
		if (rv->inh)
			relids = list_concat_unique_oid(relids,
											find_all_inheritors(relid, NoLock, NULL));
		else
			relids = list_append_unique_oid(relids, relid);
	}
	if (stmt->behavior == DROP_CASCADE)
	{
		for (;;)
		{
			int			before = list_length(relids);

			relids = list_concat_unique_oid(relids,
											heap_truncate_find_FKs(relids));
			if (list_length(relids) == before)
				break;
		}
	}

	foreach(lc, relids)
	{
		Oid			relid = lfirst_oid(lc);
		char	   *relname = get_rel_name(relid);
		Oid			table;

		if (relname == NULL || !has_fence_row_trigger(relid))
			continue;
		table = lockfence_citus_shard_owner(relname, get_rel_namespace(relid));
		if (OidIsValid(table))
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot truncate shard \"%s\" of protected table \"%s\"",
							relname, get_rel_name(table)),
					 errdetail("TRUNCATE fires no lockfence trigger on a shard: it would empty the shard without a fencing token."),
					 errhint("Delete the rows with DELETE, which is fenced row by row.")));
	}
}

static void
citus_truncate_process_utility(PlannedStmt *pstmt, const char *queryString,
							   bool readOnlyTree, ProcessUtilityContext context,
							   ParamListInfo params, QueryEnvironment *queryEnv,
							   DestReceiver *dest, QueryCompletion *qc)
{
	if (IsA(pstmt->utilityStmt, TruncateStmt))
		refuse_shard_truncate((TruncateStmt *) pstmt->utilityStmt);
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/* Install the hook (from _PG_init). */
void
citus_truncate_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = citus_truncate_process_utility;
}
