/*-------------------------------------------------------------------------
 *
 * citus_truncate.c
 *	  Refuse TRUNCATE of a protected table's shard on a Citus node.
 *
 * Citus copies a distributed table's row triggers to its shards, so every
 * row written straight into a shard is fenced; it does not copy the
 * TRUNCATE trigger (shards made by a split are the exception).  Citus
 * refuses a TRUNCATE of a shard itself, unless the session has set
 * citus.enable_manual_changes_to_shards, which any role may: a role
 * granted TRUNCATE on a protected distributed table could then empty its
 * shards on a worker without a token (a review, 1.12).  A protected
 * distributed table is fenced by its resource column, row by row, and
 * TRUNCATE of such a table is refused outright (0A000): so is TRUNCATE of
 * its shards while that setting is on.
 *
 * This is a utility hook, unlike lockfence's other guards (event triggers,
 * which work without preloading): TRUNCATE fires no event trigger, and no
 * trigger on the shard.  Citus needs lockfence in shared_preload_libraries
 * on every node anyway (docs/citus.md), so the hook is there.  It checks
 * after the TRUNCATE ran, holding the locks the TRUNCATE took, and its
 * error undoes it with the transaction (or the subtransaction).  Citus'
 * own backends, which may truncate shards without the setting, are not
 * affected.
 *
 * IDENTIFICATION
 *	  src/citus_truncate.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/relation.h"
#include "catalog/heap.h"
#include "catalog/namespace.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "citus_guard.h"
#include "fence_trigger.h"

static ProcessUtility_hook_type prev_process_utility = NULL;

/* Does rel have a lockfence row trigger (copied by Citus to its shards)? */
static bool
has_fence_row_trigger(Relation rel)
{
	TriggerDesc *trigdesc = rel->trigdesc;

	if (trigdesc == NULL)
		return false;
	for (int i = 0; i < trigdesc->numtriggers; i++)
	{
		Trigger    *trigger = &trigdesc->triggers[i];

		if (TRIGGER_FOR_ROW(trigger->tgtype) &&
			lockfence_is_fence_trigger_function(trigger->tgfoid))
			return true;
	}
	return false;
}

/*
 * Refuse the TRUNCATE that just ran if it emptied a shard of a protected
 * table: one of the tables it named, their partitions, and (CASCADE) the
 * tables referencing them, as TRUNCATE itself finds them.  TRUNCATE holds
 * them in ACCESS EXCLUSIVE mode by now; the lock taken here to read them
 * only counts once more.
 */
static void
refuse_truncated_shards(TruncateStmt *stmt)
{
	const char *manual;
	List	   *relids = NIL;
	ListCell   *lc;

	if (!lockfence_citus_present())
		return;
	manual = GetConfigOption("citus.enable_manual_changes_to_shards", true, false);
	if (manual == NULL || strcmp(manual, "on") != 0)
		return;

	foreach(lc, stmt->relations)
	{
		RangeVar   *rv = lfirst_node(RangeVar, lc);
		Oid			relid = RangeVarGetRelid(rv, NoLock, true);

		if (!OidIsValid(relid))
			continue;
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
			List	   *referencing = heap_truncate_find_FKs(relids);
			int			before = list_length(relids);

			relids = list_concat_unique_oid(relids, referencing);
			if (list_length(relids) == before)
				break;
		}
	}

	foreach(lc, relids)
	{
		Relation	rel = relation_open(lfirst_oid(lc), AccessShareLock);
		Oid			table;

		if (has_fence_row_trigger(rel) &&
			OidIsValid(table = lockfence_citus_shard_owner(rel)))
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot truncate shard \"%s\" of protected table \"%s\"",
							RelationGetRelationName(rel), get_rel_name(table)),
					 errdetail("TRUNCATE fires no lockfence trigger on a shard: it would empty the shard without a fencing token."),
					 errhint("Delete the rows with DELETE, which is fenced row by row.")));
		relation_close(rel, AccessShareLock);
	}
}

static void
citus_truncate_process_utility(PlannedStmt *pstmt, const char *queryString,
							   bool readOnlyTree, ProcessUtilityContext context,
							   ParamListInfo params, QueryEnvironment *queryEnv,
							   DestReceiver *dest, QueryCompletion *qc)
{
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
	if (IsA(pstmt->utilityStmt, TruncateStmt))
		refuse_truncated_shards((TruncateStmt *) pstmt->utilityStmt);
}

/* Install the hook (from _PG_init). */
void
citus_truncate_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = citus_truncate_process_utility;
}
