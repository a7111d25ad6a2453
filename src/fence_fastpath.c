/*-------------------------------------------------------------------------
 *
 * fence_fastpath.c
 *	  The common fence check without SPI: an equal token, uncontended.
 *
 * Most checks that miss the transaction's cache present the token already
 * recorded for the resource: a lock holder's lockfence.fence() at the start
 * of each of its transactions.  (A token the trigger finds in a row must
 * advance the fence, so it never comes here.)  For those, planning and
 * executing a SELECT ... FOR SHARE through SPI costs more than the check
 * itself, so this file looks the row up through the primary key index and
 * share-locks exactly the version it has judged, without waiting.
 *
 * It only ever answers "accepted".  Anything else (no row, another token
 * or holder, a row updated since our snapshot, or a row locked by an
 * advance or reset in flight) is left to the SPI path in fence_store.c,
 * which handles waiting, advancing, rejection and serialization failures.
 * Because the lock is taken on the very version that was checked and
 * never waited for, the fast path cannot leave a stray lock behind.
 *
 * For the same reason fence_store.c takes its uncontended advance lock
 * (FOR NO KEY UPDATE of a row recording a lower token) here too: SELECT
 * ... FOR NO KEY UPDATE SKIP LOCKED locks the newest version when the one
 * its snapshot saw was updated since, and keeps that lock when the newer
 * token fails its WHERE clause.
 *
 * IDENTIFICATION
 *	  src/fence_fastpath.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "nodes/lockoptions.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "lockfence.h"

/* Attribute numbers of lockfence.fences, as created by the install scripts. */
#define Anum_fences_resource	1
#define Anum_fences_token		2
#define Anum_fences_holder		4

/*
 * Is the row's token a lease token whose lease expired or was released?
 * Then it is not ours to accept: the SPI path judges it (lock lost).
 */
static bool
fence_fastpath_lease_over(TupleTableSlot *slot, AttrNumber lease_attnum)
{
	bool		isnull;
	Datum		d;

	if (lease_attnum == InvalidAttrNumber)
		return false;
	d = slot_getattr(slot, lease_attnum, &isnull);
	return !isnull && DatumGetTimestampTz(d) <= GetCurrentTimestamp();
}

/*
 * What a caller wants of the fence row, and the lock it takes for it.
 */
typedef enum FastpathWant
{
	FASTPATH_SHARE_EQUAL,		/* exactly token, compatible holder: share */
	FASTPATH_LOCK_LOWER			/* a token lower than token: lock to advance */
} FastpathWant;

/*
 * Does the version in slot give what the caller wants?  For an equal token
 * the recorded holder is returned in *recorded_holder.
 */
static bool
fence_fastpath_judge(FastpathWant want, TupleTableSlot *slot,
					 AttrNumber lease_attnum, int64 token, const char *holder,
					 int64 *recorded, char **recorded_holder)
{
	bool		isnull;
	Datum		d;

	*recorded = DatumGetInt64(slot_getattr(slot, Anum_fences_token, &isnull));
	if (want == FASTPATH_LOCK_LOWER)
		return *recorded < token;

	d = slot_getattr(slot, Anum_fences_holder, &isnull);
	*recorded_holder = isnull ? NULL : TextDatumGetCString(d);
	return *recorded == token &&
		(*recorded_holder == NULL || holder == NULL ||
		 strcmp(*recorded_holder, holder) == 0) &&
		!fence_fastpath_lease_over(slot, lease_attnum);
}

/*
 * Lock the fence row of resource in the mode want calls for, if the version
 * our snapshot sees gives what want asks and nobody holds a conflicting
 * lock.  Returns true with the row locked until the transaction (or the
 * current subtransaction) ends, or false having locked nothing.
 */
static bool
fence_fastpath_lock(FastpathWant want, const char *resource, int64 token,
					const char *holder, FenceOutcome *outcome)
{
	Oid			nspid;
	Oid			relid;
	Oid			indexid;
	Relation	rel;
	Relation	index;
	Snapshot	snapshot;
	IndexScanDesc scan;
	ScanKeyData key;
	TupleTableSlot *slot;
	bool		accepted = false;
	AttrNumber	lease_attnum;
	LockTupleMode mode = want == FASTPATH_SHARE_EQUAL ?
		LockTupleShare : LockTupleNoKeyExclusive;

	nspid = get_namespace_oid("lockfence", true);
	relid = OidIsValid(nspid) ? get_relname_relid("fences", nspid) : InvalidOid;
	if (!OidIsValid(relid))
		return false;			/* let the SPI path report it */

	/* The lock SELECT ... FOR SHARE (or FOR NO KEY UPDATE) would take. */
	rel = table_open(relid, RowShareLock);
	indexid = lf_primary_key_index(rel);
	if (!OidIsValid(indexid) ||
		TupleDescAttr(RelationGetDescr(rel), Anum_fences_token - 1)->atttypid != INT8OID)
	{
		table_close(rel, RowShareLock);
		return false;
	}
	index = index_open(indexid, AccessShareLock);
	/* A lease's expiry (lease.c), when the schema has it (1.2 on). */
	lease_attnum = get_attnum(relid, "lease_expires_at");

	/* A fresh snapshot under READ COMMITTED, as a new statement would get. */
	snapshot = RegisterSnapshot(GetTransactionSnapshot());

	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ,
				CStringGetTextDatum(resource));
	key.sk_collation = index->rd_indcollation[0];

	slot = table_slot_create(rel, NULL);
	scan = lf_index_beginscan(rel, index, snapshot, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);

	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		int64		recorded;
		char	   *recorded_holder = NULL;

		if (fence_fastpath_judge(want, slot, lease_attnum, token, holder,
								 &recorded, &recorded_holder))
		{
			ItemPointerData tid = slot->tts_tid;
			TM_FailureData tmfd;
			TM_Result	result;

			/*
			 * Lock the version just judged, and only it: no waiting, and no
			 * following an update chain to a version we have not judged.
			 */
			result = table_tuple_lock(rel, &tid, snapshot, slot,
									  GetCurrentCommandId(true),
									  mode, LockWaitSkip, 0, &tmfd);
			if (result == TM_Ok)
			{
				accepted = true;
				outcome->verdict = FENCE_ACCEPTED;
				outcome->highest = recorded;
				outcome->highest_holder = recorded_holder;
			}
		}
	}

	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	index_close(index, AccessShareLock);
	table_close(rel, NoLock);	/* keep the table lock, like a statement */
	return accepted;
}

/*
 * Share-lock the fence row of resource if it records exactly token, from
 * a holder compatible with holder, and nobody holds a conflicting lock.
 * Returns true, with the row locked until the transaction (or the current
 * subtransaction) ends and *outcome filled, or false to fall back to SPI.
 */
bool
fence_fastpath_share_equal(const char *resource, int64 token,
						   const char *holder, FenceOutcome *outcome)
{
	return fence_fastpath_lock(FASTPATH_SHARE_EQUAL, resource, token, holder,
							   outcome);
}

/*
 * Lock the fence row of resource FOR NO KEY UPDATE, to advance it to
 * token, if it records a lower token and nobody holds it.  Returns false,
 * having locked nothing, otherwise (also when the row changed since our
 * snapshot): the caller then reads the row again or waits.
 */
bool
fence_fastpath_lock_lower(const char *resource, int64 token)
{
	FenceOutcome outcome;

	return fence_fastpath_lock(FASTPATH_LOCK_LOWER, resource, token, NULL,
							   &outcome);
}
