/*-------------------------------------------------------------------------
 *
 * citus_fences.c
 *	  Find the local shard of a distributed lockfence.fences for a resource.
 *
 * Once lockfence.citus_distribute() has made lockfence.fences a Citus
 * table hash-distributed by resource (docs/citus.md), the table named
 * lockfence.fences on each node is an empty shell: the rows are in shards
 * named fences_SHARDID, each on the one node that holds its hash range.
 * Every read and write of a fence (the fast path and the SPI statements
 * alike) goes to the shard that holds the resource, and only when that
 * shard is on this node: the fence check then commits with the protected
 * write, which is in a co-located shard on the same node, in the same
 * local transaction under Citus' distributed one, with no round trip to
 * another node.  When the shard is elsewhere (a call Citus did not
 * delegate, an array spanning nodes, a write routed to the wrong node),
 * the check is refused: lockfence never reads the shell, nor a fence on
 * another node.
 *
 * The shard is found as Citus finds it, without linking to Citus: the
 * resource's hash (the text type's hash function, as Citus hashes a text
 * distribution column) against the hash ranges in pg_dist_shard; the
 * placement in pg_dist_placement must be the only one and belong to this
 * node's group (pg_dist_local_group).  The lookups are index scans of
 * Citus' small catalog tables, made per check (not cached) so that a
 * shard move, which changes pg_dist_placement on every node, is seen by
 * the next check: the old node then refuses, even while its dropped
 * shard's table still exists until Citus cleans it up.
 *
 * IDENTIFICATION
 *	  src/citus_fences.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_namespace.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "citus_guard.h"
#include "lockfence_schema.h"

#define CITUS_FENCES_HINT \
	"Call lockfence.fence() (and try_fence(), the lease functions) as a statement of its own with constant arguments, which Citus delegates to the node holding the resource's shard, or on that node; see docs/citus.md."

/* The OID of pg_catalog.name, raising when Citus' catalog lacks it. */
static Oid
citus_fences_catalog(const char *name)
{
	Oid			relid = get_relname_relid(name, PG_CATALOG_NAMESPACE);

	if (!OidIsValid(relid))
		lockfence_citus_catalog_missing(psprintf("pg_catalog.%s", name));
	return relid;
}

/* This node's group (pg_dist_local_group has one row). */
static int32
citus_fences_local_group(void)
{
	Relation	rel = table_open(citus_fences_catalog("pg_dist_local_group"),
								 AccessShareLock);
	Snapshot	snapshot = RegisterSnapshot(GetCatalogSnapshot(RelationGetRelid(rel)));
	TableScanDesc scan = table_beginscan(rel, snapshot, 0, NULL);
	HeapTuple	tuple = heap_getnext(scan, ForwardScanDirection);
	int32		group = -1;
	bool		isnull;

	if (HeapTupleIsValid(tuple))
		group = DatumGetInt32(heap_getattr(tuple, 1, RelationGetDescr(rel),
										   &isnull));
	table_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
	return group;
}

/*
 * The shard of lockfence.fences (fences) whose hash range holds hash, or
 * 0.  pg_dist_shard keeps a range's bounds as text.
 */
static int64
citus_fences_shard_for(Oid fences, int32 hash)
{
	Relation	rel = table_open(citus_fences_catalog("pg_dist_shard"),
								 AccessShareLock);
	TupleDesc	desc = RelationGetDescr(rel);
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	int64		shardid = 0;

	/* logicalrelid is pg_dist_shard's first column */
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(fences));
	scan = systable_beginscan(rel,
							  citus_fences_catalog("pg_dist_shard_logical_relid_index"),
							  true, NULL, 1, &key);
	while (shardid == 0 && HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		minnull,
					maxnull,
					isnull;
		Datum		min = heap_getattr(tuple, 5, desc, &minnull);
		Datum		max = heap_getattr(tuple, 6, desc, &maxnull);

		if (minnull || maxnull)
			continue;
		if (hash >= pg_strtoint32(TextDatumGetCString(min)) &&
			hash <= pg_strtoint32(TextDatumGetCString(max)))
			shardid = DatumGetInt64(heap_getattr(tuple, 2, desc, &isnull));
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return shardid;
}

/*
 * The group of shardid's placement, in *group; returns the number of its
 * placements (lockfence writes a fence shard only when it has one).
 */
static int
citus_fences_placement(int64 shardid, int32 *group)
{
	Relation	rel = table_open(citus_fences_catalog("pg_dist_placement"),
								 AccessShareLock);
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	int			count = 0;

	/* shardid is pg_dist_placement's second column, groupid its fifth */
	ScanKeyInit(&key, 2, BTEqualStrategyNumber, F_INT8EQ,
				Int64GetDatum(shardid));
	scan = systable_beginscan(rel,
							  citus_fences_catalog("pg_dist_placement_shardid_index"),
							  true, NULL, 1, &key);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;

		*group = DatumGetInt32(heap_getattr(tuple, 5, RelationGetDescr(rel),
											&isnull));
		count++;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return count;
}

/*
 * The local shard of lockfence.fences that holds resource's fence, or
 * InvalidOid when lockfence.fences is not distributed (it is then read
 * and written as on one server).  Raises feature_not_supported when the
 * shard is not on this node.
 */
Oid
lockfence_citus_fence_shard(const char *resource)
{
	Oid			fences;
	int32		hash;
	int64		shardid;
	int32		group = -1;
	int32		local;
	Oid			shard = InvalidOid;

	if (likely(!lockfence_citus_fences_distributed()))
		return InvalidOid;
	fences = lockfence_relid("fences");
	/* As Citus hashes a text distribution column (default collation). */
	hash = DatumGetInt32(DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID,
												 PointerGetDatum(cstring_to_text(resource))));
	shardid = citus_fences_shard_for(fences, hash);
	local = citus_fences_local_group();
	if (shardid != 0 && citus_fences_placement(shardid, &group) == 1 &&
		group == local)
		shard = get_relname_relid(psprintf("fences_" INT64_FORMAT, shardid),
								  get_rel_namespace(fences));
	if (!OidIsValid(shard))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("the fence of resource \"%s\" is not on this node", resource),
				 errdetail("lockfence.fences is distributed by Citus: the fence is in shard " INT64_FORMAT " of lockfence.fences, placed on node group %d; this is node group %d. lockfence checks a fence only in the transaction of the node that holds it.",
						   shardid, group, local),
				 errhint(CITUS_FENCES_HINT)));
	return shard;
}

/*
 * sql with every "lockfence.fences" replaced by the qualified name of
 * shard, for the statements of fence_store.c and lease.c.
 */
char *
lockfence_citus_retarget(const char *sql, Oid shard)
{
	static const char table[] = "lockfence.fences";
	const char *name = quote_qualified_identifier(get_namespace_name(get_rel_namespace(shard)),
												  get_rel_name(shard));
	StringInfoData buf;
	const char *p = sql;
	const char *hit;

	initStringInfo(&buf);
	while ((hit = strstr(p, table)) != NULL)
	{
		appendBinaryStringInfo(&buf, p, hit - p);
		appendStringInfoString(&buf, name);
		p = hit + strlen(table);
	}
	appendStringInfoString(&buf, p);
	return buf.data;
}
