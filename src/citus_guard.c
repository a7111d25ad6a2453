/*-------------------------------------------------------------------------
 *
 * citus_guard.c
 *	  Fail closed where lockfence cannot guarantee the fence on Citus.
 *
 * On a Citus cluster the rows of a distributed (or reference, or
 * Citus-managed local) table live in shards, ordinary tables named
 * TABLE_SHARDID on the worker nodes, and a write through the coordinator
 * runs on the worker that holds the row's shard.  A lockfence trigger
 * there checks that worker's own lockfence.fences, while lockfence.fence()
 * on the coordinator writes the coordinator's: the two never meet, and a
 * stale token is accepted (issue 22).  Until fences live with the rows
 * (docs/citus.md), lockfence refuses:
 *
 *	- a lockfence trigger on a Citus table or on a shard of one, when it is
 *	  created (protect(), CREATE TRIGGER through the event trigger) and
 *	  whenever it fires (once per statement, as the trigger validates
 *	  itself), so a trigger Citus copied to the shards refuses every write;
 *	- every fence and lease function while lockfence.fences is itself a
 *	  Citus table: lockfence reads and writes it on this node directly,
 *	  past Citus, where the distributed rows cannot see it.
 *
 * Citus is detected without linking to it: its catalog tables
 * pg_catalog.pg_dist_partition and pg_dist_shard and their indexes are
 * looked up by name.  The answer is cached and dropped on any relcache
 * invalidation (CREATE and DROP EXTENSION citus create and drop those
 * tables, which invalidates), so a server without Citus pays one test of a
 * flag per check; on a Citus node a local table found not to be a Citus
 * table or shard is remembered until the next invalidation.
 *
 * IDENTIFICATION
 *	  src/citus_guard.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "citus_guard.h"
#include "lockfence_schema.h"

#define CITUS_GUARD_HINT "See docs/citus.md for what lockfence supports on Citus."

/* Citus' catalog, as this backend last saw it. */
typedef struct CitusCatalog
{
	bool		valid;			/* the fields below are current */
	bool		present;		/* Citus' catalog tables exist */
	Oid			partition_relid;	/* pg_catalog.pg_dist_partition */
	Oid			partition_index;	/* its unique index on logicalrelid */
	Oid			shard_relid;	/* pg_catalog.pg_dist_shard */
	Oid			shard_index;	/* its unique index on shardid */
	bool		fences_valid;	/* fences_citus is current */
	bool		fences_citus;	/* lockfence.fences is a Citus table */
} CitusCatalog;

static CitusCatalog citus = {false};
static bool citus_callback_registered = false;

/*
 * Relations found to be neither Citus tables nor shards, so that a local
 * table on a Citus node pays one hash lookup per statement.  Emptied with
 * the rest on any relcache invalidation: Citus invalidates the table's
 * relcache entry when it changes pg_dist_partition or pg_dist_shard, which
 * may make a cached local table a shard.  Only the verdict that lets
 * writes through is cached; the others raise.
 */
static HTAB *citus_local_rels = NULL;

static void
citus_guard_invalidate(Datum arg, Oid relid)
{
	citus.valid = false;
	citus.fences_valid = false;
}

/*
 * Is Citus installed in this database?  Marked valid before the lookups:
 * an invalidation they accept marks it invalid again for the next call.
 */
static bool
citus_guard_present(void)
{
	if (likely(citus.valid))
		return citus.present;
	if (!citus_callback_registered)
	{
		CacheRegisterRelcacheCallback(citus_guard_invalidate, (Datum) 0);
		citus_callback_registered = true;
	}
	citus.valid = true;
	citus.fences_valid = false;
	if (citus_local_rels != NULL)
	{
		hash_destroy(citus_local_rels);
		citus_local_rels = NULL;
	}
	citus.partition_relid = get_relname_relid("pg_dist_partition",
											  PG_CATALOG_NAMESPACE);
	citus.present = OidIsValid(citus.partition_relid);
	if (!citus.present)
		return false;
	citus.partition_index =
		get_relname_relid("pg_dist_partition_logical_relid_index",
						  PG_CATALOG_NAMESPACE);
	citus.shard_relid = get_relname_relid("pg_dist_shard",
										  PG_CATALOG_NAMESPACE);
	citus.shard_index = get_relname_relid("pg_dist_shard_shardid_index",
										  PG_CATALOG_NAMESPACE);
	return true;
}

/*
 * A Citus catalog lookup that cannot be made (a Citus whose catalog is not
 * the one this code knows) is refused rather than read as "not Citus".
 */
static void
citus_guard_catalog_missing(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("lockfence cannot read the Citus catalog: %s does not exist", what),
			 errdetail("Without it lockfence cannot tell whether a table's rows are beside its fences."),
			 errhint(CITUS_GUARD_HINT)));
}

/* Is relid listed in pg_dist_partition (a Citus table)? */
static bool
citus_guard_is_citus_table(Oid relid)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	bool		found;

	if (!OidIsValid(citus.partition_index))
		citus_guard_catalog_missing("pg_catalog.pg_dist_partition_logical_relid_index");
	rel = table_open(citus.partition_relid, AccessShareLock);
	/* logicalrelid, its first column (Anum_pg_dist_partition_logicalrelid) */
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, citus.partition_index, true, NULL, 1, &key);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * The Citus table whose shard rel is, or InvalidOid.  A shard is named
 * after its table with "_SHARDID" appended (a long name is shortened
 * first), in the table's schema; the shard id must be in pg_dist_shard.
 */
static Oid
citus_guard_shard_owner(Relation rel)
{
	const char *relname = RelationGetRelationName(rel);
	const char *suffix = strrchr(relname, '_');
	const char *p;
	int64		shardid;
	Relation	shardrel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	Oid			owner = InvalidOid;

	if (suffix == NULL || suffix[1] == '\0' || strlen(suffix + 1) > 19)
		return InvalidOid;
	for (p = suffix + 1; *p != '\0'; p++)
		if (!isdigit((unsigned char) *p))
			return InvalidOid;
	shardid = strtoi64(suffix + 1, NULL, 10);

	if (!OidIsValid(citus.shard_relid) || !OidIsValid(citus.shard_index))
		citus_guard_catalog_missing("pg_catalog.pg_dist_shard or its index pg_dist_shard_shardid_index");
	shardrel = table_open(citus.shard_relid, AccessShareLock);
	/* shardid is pg_dist_shard's second column (Anum_pg_dist_shard_shardid) */
	ScanKeyInit(&key, 2, BTEqualStrategyNumber, F_INT8EQ,
				Int64GetDatum(shardid));
	scan = systable_beginscan(shardrel, citus.shard_index, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, 1, RelationGetDescr(shardrel),
									 &isnull);

		if (!isnull)
			owner = DatumGetObjectId(d);
	}
	systable_endscan(scan);
	table_close(shardrel, AccessShareLock);

	/* Same schema: a shard id alone may be a local table's suffix. */
	if (OidIsValid(owner) &&
		get_rel_namespace(owner) != RelationGetNamespace(rel))
		owner = InvalidOid;
	return owner;
}

void
lockfence_citus_guard_relation(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			owner;

	if (likely(!citus_guard_present()))
		return;
	if (citus_local_rels != NULL &&
		hash_search(citus_local_rels, &relid, HASH_FIND, NULL) != NULL)
		return;

	if (citus_guard_is_citus_table(relid))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("lockfence cannot protect Citus table \"%s\"",
						RelationGetRelationName(rel)),
				 errdetail("Its rows are written in shards on the nodes that hold them, where lockfence.fences is not the one lockfence.fence() writes: a stale token could be accepted."),
				 errhint(CITUS_GUARD_HINT)));

	owner = citus_guard_shard_owner(rel);
	if (OidIsValid(owner))
	{
		char	   *ownername = get_rel_name(owner);

		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("lockfence cannot protect shard \"%s\" of Citus table \"%s\"",
						RelationGetRelationName(rel),
						ownername ? ownername : "?"),
				 errdetail("This node's lockfence.fences is not the one lockfence.fence() writes for the table's rows: a stale token could be accepted."),
				 errhint(CITUS_GUARD_HINT)));
	}

	/* Not if an invalidation came in during the lookups: ask again. */
	if (!citus.valid)
		return;
	if (citus_local_rels == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(Oid);
		citus_local_rels = hash_create("lockfence Citus-local relations", 64,
									   &ctl, HASH_ELEM | HASH_BLOBS);
	}
	(void) hash_search(citus_local_rels, &relid, HASH_ENTER, NULL);
}

void
lockfence_citus_guard_fences(void)
{
	if (likely(!citus_guard_present()))
		return;
	if (!citus.fences_valid)
	{
		Oid			relid = lockfence_relid("fences");

		citus.fences_valid = true;
		citus.fences_citus = OidIsValid(relid) &&
			citus_guard_is_citus_table(relid);
	}
	if (citus.fences_citus)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("lockfence.fences is a Citus table"),
				 errdetail("lockfence reads and writes its fences on this node directly, where the rows Citus stores on other nodes cannot see them."),
				 errhint("lockfence.fences must be a local table on every node. " CITUS_GUARD_HINT)));
}
