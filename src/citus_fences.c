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
 * node's group (pg_dist_local_group).
 *
 * Those catalogs are read once into a map of the shards, kept until the
 * next relcache invalidation: Citus invalidates the relcache entry of
 * lockfence.fences whenever it changes a row of pg_dist_shard or
 * pg_dist_placement for one of its shards (a shard move, a split, a
 * rebalance), on every node whose metadata it changes, and the entry of
 * pg_dist_local_group when the node's group changes.  Each lookup first
 * takes in the invalidations that have arrived, so a move committed
 * before the check is seen by it, as Citus' own router sees it; the old
 * node then refuses, even while its dropped shard's table still exists
 * until Citus cleans it up.  The statements of fence_store.c and lease.c
 * on a shard are planned once per shard and kept with the map.
 *
 * A move must also not commit while a transaction that fenced (or took a
 * lease) on the old node is still open: the move copies the committed
 * fence, and the open transaction would then commit its fence, and the
 * writes its cached fence lets through, into the old node's copy, which
 * Citus drops: the new node's fence stays behind, and a second holder is
 * granted the same token there.  Citus' own writes hold the metadata lock
 * of their shard group (share) to the end of the transaction, and a move
 * takes it exclusively on every node before its cut-over; a delegated
 * lockfence call takes nothing, so lockfence takes it the same way, by
 * Citus' lock_shard_metadata() (which knows Citus' lock tags), as the
 * owner of lockfence.fences, which Citus requires.
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
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "parser/parse_func.h"
#include "storage/lmgr.h"
#include "lib/stringinfo.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/resowner.h"
#include "utils/syscache.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "citus_guard.h"
#include "lockfence_schema.h"
#include "relcache_callbacks.h"

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

/* One shard of lockfence.fences, as the map keeps it. */
typedef struct CitusFenceShard
{
	int32		min;			/* its hash range */
	int32		max;
	int64		shardid;
	int			placements;		/* lockfence writes a shard with one only */
	int32		group;			/* the node group of its (last) placement */
	Oid			relid;			/* its table, when it is on this node */
} CitusFenceShard;

/* The shards of a distributed lockfence.fences, as this backend last read them. */
typedef struct CitusFenceMap
{
	bool		valid;			/* no relcache invalidation since it was read */
	MemoryContext cxt;			/* shards and plans; reset on every read */
	int32		local_group;	/* this node's group */
	Oid			fences_owner;	/* the owner of lockfence.fences */
	int			nshards;
	CitusFenceShard *shards;
	HTAB	   *plans;			/* CitusShardPlan by (shard, slot) */
} CitusFenceMap;

/* A kept plan of one of lockfence's statements on one shard. */
typedef struct CitusShardPlanKey
{
	Oid			shard;
	int			slot;
} CitusShardPlanKey;

typedef struct CitusShardPlan
{
	CitusShardPlanKey key;
	SPIPlanPtr	plan;
} CitusShardPlan;

static CitusFenceMap fence_map = {false};
static bool fence_map_callback_registered = false;
static uint64 fence_map_invalidations = 0;

/*
 * pg_catalog.lock_shard_metadata(integer, bigint[]), or InvalidOid until
 * looked up: kept across checks, and looked up again after any change of
 * pg_proc (an update of Citus may replace it).
 */
static Oid lock_shard_metadata_fn = InvalidOid;

/*
 * Any relcache invalidation may be Citus' of lockfence.fences or of
 * pg_dist_local_group: the map is read again at the next lookup.  Nothing
 * is freed here (a plan of the map may be running).
 */
static void
citus_fences_invalidate(Datum arg, Oid relid)
{
	fence_map.valid = false;
	fence_map_invalidations++;
}

static void
citus_fences_forget_function(Datum arg, int cacheid, uint32 hashvalue)
{
	lock_shard_metadata_fn = InvalidOid;
}

/* The shards of lockfence.fences (fences) and their placements, into map. */
static void
citus_fences_read_shards(Oid fences, CitusFenceMap *map)
{
	Relation	rel = table_open(citus_fences_catalog("pg_dist_shard"),
								 AccessShareLock);
	Relation	placements = table_open(citus_fences_catalog("pg_dist_placement"),
										AccessShareLock);
	Oid			placement_index = citus_fences_catalog("pg_dist_placement_shardid_index");
	TupleDesc	desc = RelationGetDescr(rel);
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	int			allocated = 16;

	map->nshards = 0;
	map->shards = MemoryContextAlloc(map->cxt, allocated * sizeof(CitusFenceShard));

	/* logicalrelid is pg_dist_shard's first column */
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(fences));
	scan = systable_beginscan(rel,
							  citus_fences_catalog("pg_dist_shard_logical_relid_index"),
							  true, NULL, 1, &key);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		minnull,
					maxnull,
					isnull;
		Datum		min = heap_getattr(tuple, 5, desc, &minnull);
		Datum		max = heap_getattr(tuple, 6, desc, &maxnull);
		CitusFenceShard *shard;
		SysScanDesc pscan;
		ScanKeyData pkey;
		HeapTuple	ptuple;

		if (minnull || maxnull)
			continue;
		if (map->nshards == allocated)
		{
			allocated *= 2;
			map->shards = repalloc(map->shards, allocated * sizeof(CitusFenceShard));
		}
		shard = &map->shards[map->nshards++];
		memset(shard, 0, sizeof(CitusFenceShard));
		shard->min = pg_strtoint32(TextDatumGetCString(min));
		shard->max = pg_strtoint32(TextDatumGetCString(max));
		shard->shardid = DatumGetInt64(heap_getattr(tuple, 2, desc, &isnull));
		shard->group = -1;

		/* shardid is pg_dist_placement's second column, groupid its fifth */
		ScanKeyInit(&pkey, 2, BTEqualStrategyNumber, F_INT8EQ,
					Int64GetDatum(shard->shardid));
		pscan = systable_beginscan(placements, placement_index, true, NULL, 1, &pkey);
		while (HeapTupleIsValid(ptuple = systable_getnext(pscan)))
		{
			shard->group = DatumGetInt32(heap_getattr(ptuple, 5,
													  RelationGetDescr(placements),
													  &isnull));
			shard->placements++;
		}
		systable_endscan(pscan);
	}
	systable_endscan(scan);
	table_close(placements, AccessShareLock);
	table_close(rel, AccessShareLock);
}

/*
 * Read the map again: the shards, this node's group, and the table of
 * each shard placed here alone.  Valid at the end unless an invalidation
 * arrived during the reads (then the next lookup reads again, while this
 * one uses what was read after it), and not valid when a read fails.
 * The plans of the old map are freed (none is running: lookups come
 * before a statement).
 */
static void
citus_fences_read_map(Oid fences)
{
	CitusFenceMap *map = &fence_map;
	uint64		invalidations;
	HeapTuple	tuple;

	if (!fence_map_callback_registered)
	{
		lockfence_relcache_register(citus_fences_invalidate);
		CacheRegisterSyscacheCallback(PROCOID, citus_fences_forget_function,
									  (Datum) 0);
		fence_map_callback_registered = true;
	}
	if (map->plans != NULL)
	{
		HASH_SEQ_STATUS status;
		CitusShardPlan *entry;

		hash_seq_init(&status, map->plans);
		while ((entry = hash_seq_search(&status)) != NULL)
			SPI_freeplan(entry->plan);
		map->plans = NULL;
	}
	if (map->cxt == NULL)
		map->cxt = AllocSetContextCreate(CacheMemoryContext,
										 "lockfence Citus fence shards",
										 ALLOCSET_SMALL_SIZES);
	MemoryContextReset(map->cxt);
	map->nshards = 0;
	map->shards = NULL;

	map->valid = false;
	invalidations = fence_map_invalidations;
	map->local_group = citus_fences_local_group();
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(fences));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", fences);
	map->fences_owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	citus_fences_read_shards(fences, map);
	for (int i = 0; i < map->nshards; i++)
	{
		CitusFenceShard *shard = &map->shards[i];

		if (shard->placements == 1 && shard->group == map->local_group)
		{
			char	   *name = psprintf("fences_" INT64_FORMAT, shard->shardid);

			shard->relid = get_relname_relid(name, get_rel_namespace(fences));
			pfree(name);
		}
	}
	map->valid = (invalidations == fence_map_invalidations);
}

/* The shard of the map whose hash range holds hash, or NULL. */
static const CitusFenceShard *
citus_fences_find(int32 hash)
{
	for (int i = 0; i < fence_map.nshards; i++)
	{
		if (hash >= fence_map.shards[i].min && hash <= fence_map.shards[i].max)
			return &fence_map.shards[i];
	}
	return NULL;
}

/*
 * Hold Citus' metadata lock of shardid's shard group in share mode to the
 * end of the transaction, as Citus' writes do (see the header): through
 * pg_catalog.lock_shard_metadata(lock mode, shard ids), as the owner of
 * lockfence.fences (kept with the map, which a change of owner
 * invalidates).
 */
static void
citus_fences_lock_shard(int64 shardid)
{
	Oid			owner = fence_map.fences_owner;
	Oid			save_userid;
	int			save_sec_context;
	ResourceOwner save_owner;
	Datum		shard = Int64GetDatum(shardid);

	if (!OidIsValid(lock_shard_metadata_fn))
	{
		Oid			argtypes[2] = {INT4OID, INT8ARRAYOID};

		lock_shard_metadata_fn =
			LookupFuncName(list_make2(makeString("pg_catalog"),
									  makeString("lock_shard_metadata")),
						   2, argtypes, true);
		if (!OidIsValid(lock_shard_metadata_fn))
			lockfence_citus_catalog_missing("pg_catalog.lock_shard_metadata(integer, bigint[])");
	}

	/*
	 * The lock belongs to the (sub)transaction, not to a portal that ran
	 * the call (a cursor's FETCH), as the resource lock (fence_lock.c).  An
	 * error on the way is cleaned up by the abort.
	 */
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_owner = CurrentResourceOwner;
	CurrentResourceOwner = CurTransactionResourceOwner;
	(void) OidFunctionCall2(lock_shard_metadata_fn, Int32GetDatum(ShareLock),
							PointerGetDatum(construct_array(&shard, 1, INT8OID,
															sizeof(int64), FLOAT8PASSBYVAL,
															TYPALIGN_DOUBLE)));
	CurrentResourceOwner = save_owner;
	SetUserIdAndSecContext(save_userid, save_sec_context);
}

/*
 * The local shard of lockfence.fences that holds resource's fence, or
 * InvalidOid when lockfence.fences is not distributed (it is then read
 * and written as on one server).  Raises feature_not_supported when the
 * shard is not on this node.  Holds the shard group's metadata lock.
 */
Oid
lockfence_citus_fence_shard(const char *resource)
{
	int32		hash;
	const CitusFenceShard *found = NULL;
	int64		locked = 0;

	if (likely(!lockfence_citus_fences_distributed()))
		return InvalidOid;

	/* As Citus hashes a text distribution column (default collation). */
	hash = DatumGetInt32(DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID,
												 PointerGetDatum(cstring_to_text(resource))));

	/*
	 * A shard move committed before this check is seen by it; one that
	 * commits after it waits for this transaction (the lock).  A move or a
	 * split that committed while the lock was awaited is seen by looking
	 * again, and a split's new shard is locked in turn.
	 */
	for (;;)
	{
		AcceptInvalidationMessages();
		if (!fence_map.valid)
			citus_fences_read_map(lockfence_relid("fences"));
		found = citus_fences_find(hash);
		if (found == NULL || found->shardid == locked)
			break;
		locked = found->shardid;
		citus_fences_lock_shard(locked);
	}
	if (found == NULL || !OidIsValid(found->relid))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("the fence of resource \"%s\" is not on this node", resource),
				 errdetail("lockfence.fences is distributed by Citus: the fence is in shard " INT64_FORMAT " of lockfence.fences, placed on node group %d; this is node group %d. lockfence checks a fence only in the transaction of the node that holds it.",
						   found ? found->shardid : 0,
						   found ? found->group : -1,
						   fence_map.local_group),
				 errhint(CITUS_FENCES_HINT)));
	return found->relid;
}

/*
 * sql with every "lockfence.fences" replaced by the qualified name of
 * shard: a statement of fence_store.c or lease.c made for the shard.
 */
static char *
citus_fences_retarget(const char *sql, Oid shard)
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

/*
 * The plan kept for shard and slot, or NULL.
 */
SPIPlanPtr
lockfence_citus_kept_plan(Oid shard, int slot)
{
	CitusShardPlanKey key;
	CitusShardPlan *entry;

	if (fence_map.plans == NULL)
		return NULL;
	memset(&key, 0, sizeof(key));
	key.shard = shard;
	key.slot = slot;
	entry = hash_search(fence_map.plans, &key, HASH_FIND, NULL);
	return entry != NULL ? entry->plan : NULL;
}

/*
 * The plan of sql (a statement of lockfence's on lockfence.fences) on
 * shard, as returned by lockfence_citus_fence_shard just before: planned
 * on first use and kept with the map.  slot names the statement: each
 * caller numbers its own texts (citus_guard.h).  Call inside SPI.
 */
SPIPlanPtr
lockfence_citus_shard_plan(Oid shard, int slot, const char *sql,
						   int nargs, const Oid *argtypes)
{
	CitusShardPlanKey key;
	CitusShardPlan *entry;
	SPIPlanPtr	plan;
	bool		found;

	plan = lockfence_citus_kept_plan(shard, slot);
	if (plan != NULL)
		return plan;
	if (fence_map.plans == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(CitusShardPlanKey);
		ctl.entrysize = sizeof(CitusShardPlan);
		ctl.hcxt = fence_map.cxt;
		fence_map.plans = hash_create("lockfence Citus shard plans", 32, &ctl,
									  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	plan = SPI_prepare(citus_fences_retarget(sql, shard), nargs, (Oid *) argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for lockfence statement on shard %u: %s",
			 shard, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	memset(&key, 0, sizeof(key));
	key.shard = shard;
	key.slot = slot;
	entry = hash_search(fence_map.plans, &key, HASH_ENTER, &found);
	entry->plan = plan;
	return plan;
}
