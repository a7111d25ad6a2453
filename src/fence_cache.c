/*-------------------------------------------------------------------------
 *
 * fence_cache.c
 *	  Per-transaction memory of the tokens this transaction has fenced.
 *
 * Once a transaction has fenced (resource, token), it holds the resource
 * lock (fence_lock.c) until it ends, so the same check can be answered
 * without touching the table again: that keeps bulk writes to protected
 * tables cheap.  The protected-table trigger also reads the cache to find
 * the token a transaction established with lockfence.fence() or with an
 * earlier row: it is the only way a row token equal to the recorded fence
 * is accepted, since such a token may have been copied from the table.
 *
 * The cache must be exactly as transactional as the resource locks it
 * stands for (a lock taken in a subtransaction is released when it rolls
 * back).  It is kept beside the lock table rather than replaced by
 * LockHeldByMe: the lock tag is a hash of the name, so holding it does not
 * prove this name was fenced, and the cache also keeps the token and
 * holder that were accepted.  Each resource therefore has a stack of versions, each tagged with
 * the subtransaction that made it: rolling back a savepoint pops the
 * versions made inside it (restoring what was true before), committing a
 * subtransaction hands its versions to the parent, and the end of the top
 * transaction forgets everything.
 *
 * The hash table itself outlives the transaction (its entries do not):
 * creating it cost more than the rest of a fenced transaction's cache work
 * (about 1,900 instructions, bench/profile.sh).  Every change to what the
 * cache says bumps a generation counter, which lets the trigger keep a
 * row's verdict for the next rows of its statement (fence_trigger.c).
 *
 * IDENTIFICATION
 *	  src/fence_cache.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/parallel.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "lockfence.h"

/* One version of what the transaction knows about a resource. */
typedef struct CachedFence
{
	int64		token;			/* fenced token, or -1: reset, not fenced */
	char	   *holder;			/* holder recorded with the token, or NULL */
	SubTransactionId subid;		/* subtransaction that made this version */
	struct CachedFence *older;	/* version it shadows, or NULL */
} CachedFence;

typedef struct FenceCacheEntry
{
	char		resource[LOCKFENCE_MAX_RESOURCE_BYTES + 1]; /* hash key */
	CachedFence *newest;
} FenceCacheEntry;

/*
 * The versions live in FenceCacheContext, reset at transaction end; the
 * hash table lives in its own context, emptied then but kept (unless it
 * grew beyond FENCE_CACHE_KEEP_ENTRIES: a transaction that fenced
 * thousands of resources should not leave that much memory behind).
 */
#define FENCE_CACHE_KEEP_ENTRIES	64
static MemoryContext FenceCacheContext = NULL;
static MemoryContext FenceCacheTableContext = NULL;
static HTAB *FenceCache = NULL;
static bool FenceCacheUsed = false;	/* has entries, or versions allocated */

/* Bumped by every change of what fence_cache_lookup would answer. */
static uint64 FenceCacheGeneration = 1;

/*
 * Upper bound of the subtransaction ids tagging cached versions, so that
 * subtransactions which cached nothing (every PL/pgSQL exception block)
 * do not pay for a walk over the cache.
 */
static SubTransactionId FenceCacheMaxSubid = InvalidSubTransactionId;

static void fence_cache_xact_callback(XactEvent event, void *arg);
static void fence_cache_subxact_callback(SubXactEvent event,
										 SubTransactionId mySubid,
										 SubTransactionId parentSubid,
										 void *arg);

/*
 * Register the transaction callbacks; called once from _PG_init.
 */
void
fence_cache_init(void)
{
	FenceCacheContext = AllocSetContextCreate(TopMemoryContext,
											  "lockfence fence cache",
											  ALLOCSET_SMALL_SIZES);
	FenceCacheTableContext = AllocSetContextCreate(TopMemoryContext,
												   "lockfence fence cache table",
												   ALLOCSET_SMALL_SIZES);
	RegisterXactCallback(fence_cache_xact_callback, NULL);
	RegisterSubXactCallback(fence_cache_subxact_callback, NULL);
}

static void
fence_cache_reset(void)
{
	if (!FenceCacheUsed)
		return;
	FenceCacheGeneration++;
	if (hash_get_num_entries(FenceCache) > FENCE_CACHE_KEEP_ENTRIES)
	{
		hash_destroy(FenceCache);
		FenceCache = NULL;
	}
	else
	{
		HASH_SEQ_STATUS status;
		FenceCacheEntry *entry;

		/* dynahash allows removing the entry a scan just returned */
		hash_seq_init(&status, FenceCache);
		while ((entry = hash_seq_search(&status)) != NULL)
			hash_search(FenceCache, entry->resource, HASH_REMOVE, NULL);
	}
	MemoryContextReset(FenceCacheContext);
	FenceCacheUsed = false;
	FenceCacheMaxSubid = InvalidSubTransactionId;
}

/*
 * A number that changes whenever what fence_cache_lookup answers may have
 * changed (a token fenced, forgotten, or dropped with a savepoint, or the
 * transaction's end).  Equal numbers mean equal answers.
 */
uint64
fence_cache_generation(void)
{
	return FenceCacheGeneration;
}

/*
 * Push a version for resource in the current subtransaction, or overwrite
 * the one this subtransaction already made.
 */
static void
fence_cache_push(const char *resource, int64 token, const char *holder)
{
	FenceCacheEntry *entry;
	CachedFence *version;
	SubTransactionId subid = GetCurrentSubTransactionId();
	bool		found;

	if (FenceCache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = LOCKFENCE_MAX_RESOURCE_BYTES + 1;
		ctl.entrysize = sizeof(FenceCacheEntry);
		ctl.hcxt = FenceCacheTableContext;
		FenceCache = hash_create("lockfence fence cache", 16, &ctl,
								 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	FenceCacheUsed = true;
	FenceCacheGeneration++;

	entry = hash_search(FenceCache, resource, HASH_ENTER, &found);
	if (!found)
		entry->newest = NULL;

	version = entry->newest;
	if (version == NULL || version->subid != subid)
	{
		version = MemoryContextAlloc(FenceCacheContext, sizeof(CachedFence));
		version->subid = subid;
		version->older = entry->newest;
		entry->newest = version;
	}
	else if (version->holder != NULL)
		pfree(version->holder);

	version->token = token;
	version->holder = holder ? MemoryContextStrdup(FenceCacheContext, holder) : NULL;

	if (subid > FenceCacheMaxSubid)
		FenceCacheMaxSubid = subid;
}

/*
 * The token (and its holder) this transaction has fenced for resource.
 * Returns false when the transaction has not fenced it.
 */
bool
fence_cache_lookup(const char *resource, int64 *token, const char **holder)
{
	FenceCacheEntry *entry;

	if (!FenceCacheUsed)
		return false;
	entry = hash_search(FenceCache, resource, HASH_FIND, NULL);
	/* newest is NULL only if allocating the entry's version failed */
	if (entry == NULL || entry->newest == NULL || entry->newest->token < 0)
		return false;
	*token = entry->newest->token;
	*holder = entry->newest->holder;
	return true;
}

/*
 * Remember that this transaction fenced resource with token: it holds the
 * resource lock until the transaction (or this subtransaction) ends.
 */
void
fence_cache_remember(const char *resource, int64 token, const char *holder)
{
	Assert(token >= 0);
	fence_cache_push(resource, token, holder);
}

/*
 * Forget resource: its fence row was written other than by a fence check
 * (lockfence.reset() deleted it, a lease was granted, renewed or released,
 * a floor raised it), so what this transaction fenced may no longer hold,
 * and the next check must read the row.  This is a version of its own, so
 * rolling back the write (to a savepoint) brings the old one back.
 */
void
fence_cache_forget(const char *resource)
{
	if (!FenceCacheUsed ||
		hash_search(FenceCache, resource, HASH_FIND, NULL) == NULL)
		return;
	fence_cache_push(resource, -1, NULL);
}

/*
 * Forget every resource, as fence_cache_forget does one: for writes to
 * fence rows that do not name them (lockfence.raise_floor() without a list
 * of resources).
 */
static void
fence_cache_forget_all(void)
{
	HASH_SEQ_STATUS status;
	FenceCacheEntry *entry;
	List	   *resources = NIL;
	ListCell   *lc;

	if (!FenceCacheUsed)
		return;
	/* Collect the names first: the scan must not meet entries changing. */
	hash_seq_init(&status, FenceCache);
	while ((entry = hash_seq_search(&status)) != NULL)
		if (entry->newest != NULL && entry->newest->token >= 0)
			resources = lappend(resources, entry->resource);
	foreach(lc, resources)
		fence_cache_push((const char *) lfirst(lc), -1, NULL);
	list_free(resources);
}

PG_FUNCTION_INFO_V1(lockfence_forget_fenced);

/*
 * lockfence.forget_fenced(resources text[] DEFAULT NULL) returns void
 *
 * Make this transaction forget the tokens it fenced for resources (NULL:
 * all), for SQL functions that write fence rows (raise_floor).
 */
Datum
lockfence_forget_fenced(PG_FUNCTION_ARGS)
{
	ArrayType  *resources;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;

	/* the cache is the leader's: a worker would forget nothing */
	if (IsParallelWorker())
		lockfence_refuse_parallel_mode("lockfence.forget_fenced()");
	if (PG_ARGISNULL(0))
	{
		fence_cache_forget_all();
		PG_RETURN_VOID();
	}
	resources = PG_GETARG_ARRAYTYPE_P(0);
	deconstruct_array(resources, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &nelems);
	for (int i = 0; i < nelems; i++)
	{
		char	   *resource;

		if (nulls[i])
			continue;
		resource = TextDatumGetCString(elems[i]);
		/* longer names were never fenced (and do not fit the hash key) */
		if (strlen(resource) <= LOCKFENCE_MAX_RESOURCE_BYTES)
			fence_cache_forget(resource);
	}
	PG_RETURN_VOID();
}

static void
fence_cache_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			fence_cache_reset();
			break;
		default:
			break;
	}
}

static void
fence_cache_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							 SubTransactionId parentSubid, void *arg)
{
	HASH_SEQ_STATUS status;
	FenceCacheEntry *entry;

	if (!FenceCacheUsed || FenceCacheMaxSubid < mySubid)
		return;
	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
		FenceCacheGeneration++;

	hash_seq_init(&status, FenceCache);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		CachedFence *version = entry->newest;

		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			/* Drop what the subtransaction (and its children) made. */
			while (version != NULL && version->subid >= mySubid)
			{
				CachedFence *older = version->older;

				if (version->holder != NULL)
					pfree(version->holder);
				pfree(version);
				version = older;
			}
			entry->newest = version;
			if (version == NULL)
				hash_search(FenceCache, entry->resource, HASH_REMOVE, NULL);
		}
		else if (version != NULL && version->subid >= mySubid)
		{
			/* Children have already merged into mySubid; merge into parent. */
			CachedFence *older = version->older;

			version->subid = parentSubid;
			if (older != NULL && older->subid == parentSubid)
			{
				version->older = older->older;
				if (older->holder != NULL)
					pfree(older->holder);
				pfree(older);
			}
		}
	}
	FenceCacheMaxSubid = parentSubid;
}
