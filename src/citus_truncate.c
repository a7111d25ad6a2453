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
 * TRUNCATE fires no event trigger, and no trigger on the shard, so this
 * is a hook, unlike lockfence's other guards (event triggers, which work
 * without preloading): the object access hook, which TRUNCATE calls for
 * every table it is about to empty (the tables it names, as it resolved
 * them, their partitions, and with CASCADE the tables referencing them),
 * before any TRUNCATE trigger runs.  So the check sees what TRUNCATE
 * empties, by OID: no name looked up apart from TRUNCATE's own (a first
 * version resolved the names in a utility hook, and a concurrent rename
 * of another table made it check the wrong one: a review), and no user
 * code has run yet.  Citus needs lockfence in shared_preload_libraries on
 * every node anyway (docs/citus.md; check() reports a node without it as
 * an error since 1.14), so the hook is there.
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
#include "catalog/objectaccess.h"
#include "catalog/objectaddress.h"
#include "catalog/pg_class.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"

#include "citus_guard.h"
#include "fence_trigger.h"

static object_access_hook_type prev_object_access = NULL;

/*
 * Does table relid have a lockfence row trigger (as Citus copies it to a
 * protected table's shards), enabled or not?  Read from pg_trigger: a
 * table TRUNCATE names is not locked yet when the hook is called.
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
 * Refuse emptying table relid if it is a shard of a protected table.
 */
static void
refuse_shard_truncate(Oid relid)
{
	char	   *relname;
	Oid			table;
	AclResult	aclresult;

	if (!lockfence_citus_present())
		return;
	relname = get_rel_name(relid);
	if (relname == NULL || !has_fence_row_trigger(relid))
		return;
	table = lockfence_citus_shard_owner(relname, get_rel_namespace(relid));
	if (!OidIsValid(table))
		return;

	/*
	 * TRUNCATE checks the caller's privilege after this hook: a role that
	 * may not truncate the shard at all gets PostgreSQL's own error, as it
	 * would on any other table, not lockfence's.
	 */
	aclresult = pg_class_aclcheck(relid, GetUserId(), ACL_TRUNCATE);
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, get_relkind_objtype(get_rel_relkind(relid)),
					   relname);
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("cannot truncate shard \"%s\" of protected table \"%s\"",
					relname, get_rel_name(table)),
			 errdetail("TRUNCATE fires no lockfence trigger on a shard: it would empty the shard without a fencing token."),
			 errhint("Delete the rows with DELETE, which is fenced row by row.")));
}

static void
citus_truncate_object_access(ObjectAccessType access, Oid classId,
							 Oid objectId, int subId, void *arg)
{
	if (prev_object_access)
		prev_object_access(access, classId, objectId, subId, arg);
	if (access == OAT_TRUNCATE && classId == RelationRelationId)
		refuse_shard_truncate(objectId);
}

/* Install the hook (from _PG_init). */
void
citus_truncate_init(void)
{
	prev_object_access = object_access_hook;
	object_access_hook = citus_truncate_object_access;
}
