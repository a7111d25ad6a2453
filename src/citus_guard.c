/*-------------------------------------------------------------------------
 *
 * citus_guard.c
 *	  Fail closed where lockfence cannot guarantee the fence on Citus.
 *
 * On a Citus cluster the rows of a distributed (or reference, or
 * Citus-managed local) table live in shards, ordinary tables named
 * TABLE_SHARDID on the worker nodes, and a write through the coordinator
 * runs on the worker that holds the row's shard.  A lockfence trigger
 * there can check the fence only if the fence is on the same node, in the
 * same transaction: with lockfence.fences distributed by resource
 * (lockfence.citus_distribute()), in the fence shard co-located with the
 * row's shard (citus_fences.c finds it).  Before 1.5 the trigger checked
 * the worker's own lockfence.fences while lockfence.fence() on the
 * coordinator wrote the coordinator's, and a stale token was accepted
 * (issue 22).  So lockfence refuses:
 *
 *	- a lockfence trigger on a Citus table or on a shard of one, when it is
 *	  created (protect(), CREATE TRIGGER through the event trigger) and
 *	  whenever it fires (once per statement, as the trigger validates
 *	  itself), unless the table is hash-distributed by the trigger's
 *	  resource column (no prefix) and co-located with a distributed
 *	  lockfence.fences: a reference table, a Citus local table, another
 *	  distribution column or co-location group would put a row's fence on
 *	  another node, or nowhere;
 *	- every fence and lease function while lockfence.fences is a Citus
 *	  table of any other kind (not hash-distributed by resource, or with
 *	  more than one placement per shard, which a write to the local shard
 *	  past Citus would leave stale).
 *
 * Citus is detected without linking to it: its catalog tables
 * pg_catalog.pg_dist_partition and pg_dist_shard and their indexes are
 * looked up by name.  The answer is cached and dropped on any relcache
 * invalidation (CREATE and DROP EXTENSION citus create and drop those
 * tables, which invalidates), so a server without Citus pays one test of a
 * flag per check.  On a Citus node the verdicts that let writes through
 * are remembered until the next invalidation: a local table found not to
 * be a Citus table or shard, and a Citus table or shard found to be
 * protectable with a given resource column.  Citus invalidates a table's
 * relcache entry whenever it changes the table's rows of
 * pg_dist_partition or pg_dist_shard (undistributing it, changing its
 * co-location), so a verdict never outlives what it was drawn from.
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
#include "relcache_callbacks.h"

#define CITUS_GUARD_HINT "See docs/citus.md for what lockfence supports on Citus."

/* What lockfence.fences is on this node's Citus metadata. */
typedef enum CitusFences
{
	CITUS_FENCES_LOCAL,			/* not a Citus table: fenced here, as ever */
	CITUS_FENCES_DISTRIBUTED,	/* hash-distributed by resource, one placement */
	CITUS_FENCES_UNSUPPORTED	/* any other Citus table: refused */
} CitusFences;

/* Citus' catalog, as this backend last saw it. */
typedef struct CitusCatalog
{
	bool		valid;			/* the fields below are current */
	bool		present;		/* Citus' catalog tables exist */
	Oid			partition_relid;	/* pg_catalog.pg_dist_partition */
	Oid			partition_index;	/* its unique index on logicalrelid */
	Oid			shard_relid;	/* pg_catalog.pg_dist_shard */
	Oid			shard_index;	/* its unique index on shardid */
	bool		fences_valid;	/* the two below are current */
	CitusFences fences;			/* what lockfence.fences is */
	uint32		fences_colocation;	/* its co-location group, if distributed */
} CitusCatalog;

static CitusCatalog citus = {false};
static bool citus_callback_registered = false;

/*
 * Relcache invalidations seen: a verdict is kept as valid only if none
 * arrived while it was read (the reads accept invalidations), and only
 * once the reads succeeded (an error in them, a lock timeout or a cancel
 * on Citus' catalog, must not leave a half-made verdict such as "not a
 * Citus table" cached).
 */
static uint64 citus_invalidations = 0;

/* A table's row of Citus' pg_dist_partition, the part lockfence reads. */
typedef struct CitusPartition
{
	char		method;			/* 'h' hash, 'n' none (reference, local) ... */
	AttrNumber	key_attnum;		/* the distribution column, or 0 */
	uint32		colocation;		/* co-location group */
	char		repmodel;		/* 's' streaming (one placement), 'c', 't' */
} CitusPartition;

/*
 * Relations found to be neither Citus tables nor shards, so that a local
 * table on a Citus node pays one hash lookup per statement.  Emptied with
 * the rest on any relcache invalidation: Citus invalidates the table's
 * relcache entry when it changes pg_dist_partition or pg_dist_shard, which
 * may make a cached local table a shard.  Only the verdict that lets
 * writes through without a look at Citus' catalog is cached; Citus tables
 * and shards are judged again at every statement.
 */
static HTAB *citus_local_rels = NULL;

/*
 * Citus tables and shards found protectable by a trigger whose resource
 * is column (without a prefix): such a trigger's later statements pass
 * with one hash lookup.  Emptied with citus_local_rels.
 */
typedef struct CitusJudgedRel
{
	Oid			relid;
	NameData	column;
} CitusJudgedRel;

static HTAB *citus_judged_rels = NULL;

static void
citus_guard_invalidate(Datum arg, Oid relid)
{
	citus_invalidations++;
	citus.valid = false;
	citus.fences_valid = false;
}

/*
 * Is Citus installed in this database?  Valid for the next call only if
 * the lookups succeeded and no invalidation arrived meanwhile.
 */
bool
lockfence_citus_present(void)
{
	uint64		seen = citus_invalidations;

	if (likely(citus.valid))
		return citus.present;
	if (!citus_callback_registered)
	{
		lockfence_relcache_register(citus_guard_invalidate);
		citus_callback_registered = true;
	}
	citus.fences_valid = false;
	if (citus_local_rels != NULL)
	{
		hash_destroy(citus_local_rels);
		citus_local_rels = NULL;
	}
	if (citus_judged_rels != NULL)
	{
		hash_destroy(citus_judged_rels);
		citus_judged_rels = NULL;
	}
	citus.partition_relid = get_relname_relid("pg_dist_partition",
											  PG_CATALOG_NAMESPACE);
	citus.present = OidIsValid(citus.partition_relid);
	if (citus.present)
	{
		citus.partition_index =
			get_relname_relid("pg_dist_partition_logical_relid_index",
							  PG_CATALOG_NAMESPACE);
		citus.shard_relid = get_relname_relid("pg_dist_shard",
											  PG_CATALOG_NAMESPACE);
		citus.shard_index = get_relname_relid("pg_dist_shard_shardid_index",
											  PG_CATALOG_NAMESPACE);
	}
	citus.valid = citus_invalidations == seen;
	return citus.present;
}

/*
 * A Citus catalog lookup that cannot be made (a Citus whose catalog is not
 * the one this code knows) is refused rather than read as "not Citus".
 */
void
lockfence_citus_catalog_missing(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("lockfence cannot read the Citus catalog: %s does not exist", what),
			 errdetail("Without it lockfence cannot tell whether a table's rows are beside its fences."),
			 errhint(CITUS_GUARD_HINT)));
}

/*
 * Read relid's row of pg_dist_partition into *part; false when there is
 * none (not a Citus table).  The distribution column comes as Citus keeps
 * it, a Var in node-string form: only its attribute number is needed.
 */
static bool
lockfence_citus_partition(Oid relid, CitusPartition *part)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	bool		found;

	if (!OidIsValid(citus.partition_index))
		lockfence_citus_catalog_missing("pg_catalog.pg_dist_partition_logical_relid_index");
	memset(part, 0, sizeof(CitusPartition));
	rel = table_open(citus.partition_relid, AccessShareLock);
	/* logicalrelid, its first column (Anum_pg_dist_partition_logicalrelid) */
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, citus.partition_index, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	found = HeapTupleIsValid(tuple);
	if (found)
	{
		TupleDesc	desc = RelationGetDescr(rel);
		bool		isnull;
		Datum		d;

		/* partmethod 2, partkey 3, colocationid 4, repmodel 5 */
		part->method = DatumGetChar(heap_getattr(tuple, 2, desc, &isnull));
		d = heap_getattr(tuple, 3, desc, &isnull);
		if (!isnull)
		{
			char	   *key_text = TextDatumGetCString(d);
			char	   *att = strstr(key_text, ":varattno ");

			if (att != NULL)
				part->key_attnum = (AttrNumber) atoi(att + strlen(":varattno "));
		}
		part->colocation = DatumGetUInt32(heap_getattr(tuple, 4, desc, &isnull));
		part->repmodel = DatumGetChar(heap_getattr(tuple, 5, desc, &isnull));
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * The Citus table whose shard the table relname in schema nspid is, or
 * InvalidOid.  A shard is named after its table with "_SHARDID" appended
 * (a long name is shortened first), in the table's schema; the shard id
 * must be in pg_dist_shard.
 */
Oid
lockfence_citus_shard_owner(const char *relname, Oid nspid)
{
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
		lockfence_citus_catalog_missing("pg_catalog.pg_dist_shard or its index pg_dist_shard_shardid_index");
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
	if (OidIsValid(owner) && get_rel_namespace(owner) != nspid)
		owner = InvalidOid;
	return owner;
}

/*
 * What lockfence.fences is on this node (cached until the next relcache
 * invalidation).  Only a table hash-distributed by resource with one
 * placement per shard (Citus' streaming replication model) can be read
 * and written in its local shard: with statement replication a write to
 * one placement past Citus would leave the others stale.
 */
static CitusFences
citus_guard_fences_state(void)
{
	if (!citus.fences_valid)
	{
		uint64		seen = citus_invalidations;
		Oid			relid = lockfence_relid("fences");
		CitusPartition part;
		CitusFences fences = CITUS_FENCES_LOCAL;

		if (OidIsValid(relid) && lockfence_citus_partition(relid, &part))
		{
			fences = CITUS_FENCES_UNSUPPORTED;
			if (part.method == 'h' && part.key_attnum == 1 &&
				part.repmodel == 's')
			{
				fences = CITUS_FENCES_DISTRIBUTED;
				citus.fences_colocation = part.colocation;
			}
		}
		/* set only now: an error above leaves no verdict behind */
		citus.fences = fences;
		citus.fences_valid = citus_invalidations == seen;
		return fences;
	}
	return citus.fences;
}

bool
lockfence_citus_fences_distributed(void)
{
	return lockfence_citus_present() &&
		citus_guard_fences_state() == CITUS_FENCES_DISTRIBUTED;
}

/* Refuse a write to Citus table owner (rel itself, or the table of shard rel). */
static void
citus_guard_refuse(Relation rel, Oid owner, const char *detail,
				   const char *hint)
{
	char	   *ownername = get_rel_name(owner);

	if (owner == RelationGetRelid(rel))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("lockfence cannot protect Citus table \"%s\"",
						RelationGetRelationName(rel)),
				 errdetail("%s", detail),
				 errhint("%s", hint)));
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("lockfence cannot protect shard \"%s\" of Citus table \"%s\"",
					RelationGetRelationName(rel), ownername ? ownername : "?"),
			 errdetail("%s", detail),
			 errhint("%s", hint)));
}

/*
 * Let a lockfence trigger on Citus table owner (or on rel, its shard)
 * check its rows only where each row's fence is in the fence shard of the
 * same hash range, so on the same node, in the same transaction: the
 * table hash-distributed by the trigger's resource column itself, in the
 * co-location group of a distributed lockfence.fences.  Anything else is
 * refused.
 */
static void
citus_guard_citus_table(Relation rel, Oid owner, const CitusPartition *part,
						const char *resource_column, const char *resource_prefix)
{
	if (part->method != 'h')
		citus_guard_refuse(rel, owner,
						   "It is a reference table or a Citus local table: its rows are not in hash-distributed shards beside the fences, so a fence check could not commit with them on one node.",
						   CITUS_GUARD_HINT);
	if (citus_guard_fences_state() != CITUS_FENCES_DISTRIBUTED)
		citus_guard_refuse(rel, owner,
						   "lockfence.fences is not distributed co-located with it: its rows are written in shards on the nodes that hold them, where lockfence.fences is not the one lockfence.fence() writes, so a stale token could be accepted.",
						   "Run SELECT lockfence.citus_distribute() on the coordinator, and distribute the table by its resource column with colocate_with => 'lockfence.fences'. " CITUS_GUARD_HINT);
	if (resource_column == NULL ||
		(resource_prefix != NULL && resource_prefix[0] != '\0') ||
		get_attnum(owner, resource_column) != part->key_attnum)
		citus_guard_refuse(rel, owner,
						   "On Citus a protected table's resource must be its distribution column, without resource_prefix: only then is each row's fence in the co-located shard of lockfence.fences.",
						   "Distribute the table by the column named in resource_column. " CITUS_GUARD_HINT);
	if (part->colocation != citus.fences_colocation)
		citus_guard_refuse(rel, owner,
						   "It is not co-located with lockfence.fences: a row's fence may be on another node than the row.",
						   "Distribute it with colocate_with => 'lockfence.fences' (or update_distributed_table_colocation). " CITUS_GUARD_HINT);
}

/*
 * The entry of relid in *table (made on first use, entries of entrysize
 * keyed by OID) for a verdict just drawn, or NULL when an invalidation
 * came in during the lookups that drew it: the next statement asks again.
 */
static void *
citus_guard_remember(HTAB **table, const char *name, Size entrysize, Oid relid)
{
	if (!citus.valid)
		return NULL;
	if (*table == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = entrysize;
		*table = hash_create(name, 64, &ctl, HASH_ELEM | HASH_BLOBS);
	}
	return hash_search(*table, &relid, HASH_ENTER, NULL);
}

void
lockfence_citus_guard_relation(Relation rel, const char *resource_column,
							   const char *resource_prefix)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			owner;
	CitusPartition part;
	bool		judgeable;
	CitusJudgedRel *judged;

	if (likely(!lockfence_citus_present()))
		return;
	if (citus_local_rels != NULL &&
		hash_search(citus_local_rels, &relid, HASH_FIND, NULL) != NULL)
		return;
	/* only a verdict on a resource column alone is kept */
	judgeable = resource_column != NULL &&
		(resource_prefix == NULL || resource_prefix[0] == '\0') &&
		strlen(resource_column) < NAMEDATALEN;
	if (judgeable && citus_judged_rels != NULL &&
		(judged = hash_search(citus_judged_rels, &relid, HASH_FIND, NULL)) != NULL &&
		strcmp(NameStr(judged->column), resource_column) == 0)
		return;

	owner = relid;
	if (!lockfence_citus_partition(relid, &part))
	{
		owner = lockfence_citus_shard_owner(RelationGetRelationName(rel),
											RelationGetNamespace(rel));
		if (OidIsValid(owner) && !lockfence_citus_partition(owner, &part))
			citus_guard_refuse(rel, owner, "Its table is not in pg_dist_partition.",
							   CITUS_GUARD_HINT);
	}
	if (OidIsValid(owner))
	{
		/* raises unless the trigger can check rel's rows where they are */
		citus_guard_citus_table(rel, owner, &part, resource_column,
								resource_prefix);
		if (!judgeable)
			return;
		judged = citus_guard_remember(&citus_judged_rels, "lockfence Citus relations judged",
									  sizeof(CitusJudgedRel), relid);
		if (judged != NULL)
			namestrcpy(&judged->column, resource_column);
		return;
	}
	(void) citus_guard_remember(&citus_local_rels, "lockfence Citus-local relations",
								sizeof(Oid), relid);
}

void
lockfence_citus_guard_fences(void)
{
	if (likely(!lockfence_citus_present()))
		return;
	if (citus_guard_fences_state() == CITUS_FENCES_UNSUPPORTED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("lockfence.fences is a Citus table lockfence cannot use"),
				 errdetail("lockfence reads and writes the fences of a resource in the local shard that holds it: that needs lockfence.fences hash-distributed by resource, with one placement per shard."),
				 errhint("Distribute it with SELECT lockfence.citus_distribute(). " CITUS_GUARD_HINT)));
}
