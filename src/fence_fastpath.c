/*-------------------------------------------------------------------------
 *
 * fence_fastpath.c
 *	  The common fence check without SPI: an equal token, uncontended.
 *
 * Most checks that miss the transaction's cache present the token already
 * recorded for the resource: a lock holder's lockfence.fence() at the start
 * of each of its transactions.  For those, planning and executing a SELECT
 * through SPI costs more than the check itself, so fence_fastpath_read
 * looks the row up through the primary key index, with a snapshot taken
 * after the caller's resource lock (fence_lock.c), and locks nothing: the
 * resource lock is what orders the check against advances.  The next
 * check of the same resource in the backend reads the version found at
 * its TID, without the index, as long as that version is still the one a
 * fresh snapshot sees (fence_fastpath_read_last).
 *
 * fence_store.c takes its uncontended advance lock (FOR NO KEY UPDATE of a
 * row recording a lower token) here too, on exactly the version judged:
 * SELECT ... FOR NO KEY UPDATE SKIP LOCKED locks the newest version when
 * the one its snapshot saw was updated since, and keeps that lock when the
 * newer token fails its WHERE clause.
 *
 * Leases (lease_fastpath.c) go one step further: an uncontended grant,
 * renewal or release locks the version it judged the same way and then
 * writes the new version itself (fence_fastpath_update).  Through SPI the
 * UPDATE statement cost more than the rest of the call: the executor
 * prepares the table's CHECK constraints anew for every statement, and the
 * statement re-checks under a lock what the caller had already read.  Here
 * the row is read once, locked without waiting, and updated; a lease's new
 * version satisfies the table's own constraints by construction.  Only a
 * table exactly as the install scripts make it is read or updated this way
 * (fence_shape.c); anything else is left to SPI.
 *
 * Every way in goes through fence_fastpath_find, which is also where the
 * test-only setting lockfence.debug_disable_fastpath sends every call to
 * SPI, as if the table could not be read here: it chooses the path and nothing else,
 * so that test/t/89_differential_paths.pl can compare the two.
 *
 * IDENTIFICATION
 *	  src/fence_fastpath.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "nodes/lockoptions.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "citus_guard.h"
#include "compat.h"
#include "fence_fastpath.h"
#include "lockfence.h"
#include "lockfence_schema.h"

/*
 * lockfence.debug_disable_fastpath: for tests only (docs/testing.md).  On,
 * every check and lease write takes the statements of fence_store.c and
 * lease.c.  SUSET: it costs speed, and a test is run by a superuser.  It
 * exists only in a build with LOCKFENCE_TEST_HOOKS (make
 * LOCKFENCE_TEST_HOOKS=1, as test/run-all.sh builds); without, the fast
 * path is always tried.
 */
#ifdef LOCKFENCE_TEST_HOOKS
static bool debug_disable_fastpath = false;
#else
#define debug_disable_fastpath false
#endif

/* Define lockfence.debug_disable_fastpath.  Called from _PG_init. */
void
fence_fastpath_init(void)
{
#ifdef LOCKFENCE_TEST_HOOKS
	DefineCustomBoolVariable("lockfence.debug_disable_fastpath",
							 gettext_noop("Sends every fence check and lease write through SPI statements (for tests only)."),
							 gettext_noop("Only the path is chosen; the rules are the same. "
										  "Used to compare the two paths."),
							 &debug_disable_fastpath,
							 false,
							 PGC_SUSET,
							 GUC_NOT_IN_SAMPLE | GUC_NO_SHOW_ALL,
							 NULL, NULL, NULL);
#endif
}

/*
 * Attribute numbers of lockfence.fences, as created by the install scripts
 * (fence_shape.c tells whether the table is still so).
 */
#define Anum_fences_resource	1
#define Anum_fences_token		2
#define Anum_fences_accepted_at 3
#define Anum_fences_holder		4
#define Anum_fences_lease_expires_at 5	/* 1.2 on */
#define Anum_fences_lease_ttl	6	/* 1.2 on */

/*
 * The OID of lockfence.fences, kept between calls: looking it up by name
 * (the schema, then the table) cost about 1,000 instructions per check
 * (bench/profile.sh).  Any change to the table (DROP, RENAME, DROP
 * EXTENSION, VACUUM's new statistics) sends a relcache invalidation for
 * it, which fence_shape.c counts (fences_table_invalidations): the OID,
 * and the row version below, are used only while that count is the one
 * they were kept at.  (No callback of our own: PostgreSQL has room for
 * only ten relcache callbacks in a backend, for every library.)
 */
static Oid	fastpath_relid = InvalidOid;
static uint64 fastpath_relid_invalidations = 0;

/*
 * The fence row version the last read through the index found, and its
 * columns as read (fence_fastpath_read_last).  holder and lease_ttl point
 * into fastpath_last_cxt.
 */
typedef struct FastpathLast
{
	bool		valid;
	Oid			relid;
	uint64		invalidations;	/* fences_table_invalidations() then */
	char		resource[LOCKFENCE_MAX_RESOURCE_BYTES + 1];
	ItemPointerData tid;
	TransactionId xmin;			/* raw: freezing does not change it */
	Buffer		buffer;			/* the shared buffer that held its page */
	FenceRow	row;
} FastpathLast;

static FastpathLast fastpath_last;
static MemoryContext fastpath_last_cxt = NULL;

/*
 * Open lockfence.fences in lockmode, or return NULL when there is none.
 * The kept OID is used only if no invalidation of the table arrived since
 * it was kept, once the lock is held (taking it accepts the invalidations
 * that a concurrent DROP or RENAME sent); otherwise the name is looked up,
 * as every call did before.  The caller asks fences_table_problem next,
 * which records the table the invalidations are counted for.
 *
 * On Citus, with lockfence.fences distributed, the table is the local
 * shard that holds resource (citus_fences.c), looked up anew each time and
 * never kept here: the next resource may be in another shard.
 */
static Relation
fence_fastpath_open(const char *resource, LOCKMODE lockmode)
{
	Oid			relid = lockfence_citus_fence_shard(resource);

	if (OidIsValid(relid))
		return table_open(relid, lockmode);
	relid = fastpath_relid;

	if (OidIsValid(relid))
	{
		Relation	rel = try_table_open(relid, lockmode);

		if (rel != NULL &&
			fastpath_relid_invalidations == fences_table_invalidations())
			return rel;
		/* dropped, or changed while we waited for the lock: look again */
		if (rel != NULL)
			table_close(rel, NoLock);
		fastpath_relid = InvalidOid;
	}

	relid = lockfence_relid("fences");
	if (!OidIsValid(relid))
		return NULL;
	return table_open(relid, lockmode);
}

/*
 * Keep rel's OID (lockfence.fences, opened by name and judged by
 * fences_table_problem just now) for the next fence_fastpath_open.
 */
static void
fence_fastpath_keep_relid(Relation rel)
{
	if (fastpath_relid == RelationGetRelid(rel) ||
		lockfence_citus_fences_distributed())
		return;
	fastpath_relid = RelationGetRelid(rel);
	fastpath_relid_invalidations = fences_table_invalidations();
}

/* The fence table, opened by fence_fastpath_find, and the row version found. */
typedef struct FastpathRow
{
	Relation	rel;			/* its lock is kept until the transaction ends */
	Oid			indexid;		/* its primary key */
	AttrNumber	lease_attnum;	/* lease_expires_at (1.2 on), or invalid */
	Snapshot	snapshot;
	TupleTableSlot *slot;		/* the version the snapshot sees */
} FastpathRow;

/*
 * Open lockfence.fences in lockmode and find, through its primary key, the
 * version of resource's row that a fresh snapshot sees.  Returns true with
 * *fr filled (close it with fence_fastpath_close), or false, having left
 * nothing open, when there is no such row or table, the table is not
 * exactly as the install scripts make it (its columns are read here by
 * attribute number), or lockfence.debug_disable_fastpath is on: the SPI
 * path then handles or reports it.
 */
static FenceRowRead
fence_fastpath_find(const char *resource, LOCKMODE lockmode, bool latest,
					FastpathRow *fr)
{
	Relation	index;
	IndexScanDesc scan;
	ScanKeyData key;
	bool		found;

	/* The test-only switch: as if the table were unreadable here. */
	if (debug_disable_fastpath)
		return FENCE_ROW_UNREADABLE;

	fr->rel = fence_fastpath_open(resource, lockmode);
	if (fr->rel == NULL)
		return FENCE_ROW_UNREADABLE;
	fr->indexid = lf_primary_key_index(fr->rel);
	if (!OidIsValid(fr->indexid) || fences_table_problem(fr->rel) != NULL)
	{
		table_close(fr->rel, lockmode);
		return FENCE_ROW_UNREADABLE;
	}
	fence_fastpath_keep_relid(fr->rel);
	index = index_open(fr->indexid, AccessShareLock);
	/* A lease's expiry (lease.c), when the schema has it (1.2 on). */
	fr->lease_attnum =
		RelationGetDescr(fr->rel)->natts >= Anum_fences_lease_expires_at ?
		Anum_fences_lease_expires_at : InvalidAttrNumber;

	/*
	 * A fresh snapshot under READ COMMITTED, as a new statement would get
	 * (taken after the caller's resource lock); the latest one on request.
	 */
	fr->snapshot = RegisterSnapshot(latest ? GetLatestSnapshot() :
									GetTransactionSnapshot());

	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ,
				CStringGetTextDatum(resource));
	key.sk_collation = index->rd_indcollation[0];

	/* The slot keeps its own pin on the version found. */
	fr->slot = table_slot_create(fr->rel, NULL);
	scan = lf_index_beginscan(fr->rel, index, fr->snapshot, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, fr->slot);
	index_endscan(scan);
	index_close(index, AccessShareLock);

	if (!found)
	{
		ExecDropSingleTupleTableSlot(fr->slot);
		UnregisterSnapshot(fr->snapshot);
		table_close(fr->rel, NoLock);
	}
	return found ? FENCE_ROW_FOUND : FENCE_ROW_ABSENT;
}

static void
fence_fastpath_close(FastpathRow *fr)
{
	ExecDropSingleTupleTableSlot(fr->slot);
	UnregisterSnapshot(fr->snapshot);
	table_close(fr->rel, NoLock);	/* keep the table lock, like a statement */
}

/*
 * Lock the version found, and only it: no waiting, and no following an
 * update chain to a version the caller has not judged.  Returns false,
 * having locked nothing, when another transaction holds a conflicting lock
 * or the version was updated since the snapshot.
 */
static bool
fence_fastpath_lock_found(FastpathRow *fr, LockTupleMode mode)
{
	ItemPointerData tid = fr->slot->tts_tid;
	TM_FailureData tmfd;

	return table_tuple_lock(fr->rel, &tid, fr->snapshot, fr->slot,
							GetCurrentCommandId(true), mode, LockWaitSkip, 0,
							&tmfd) == TM_Ok;
}

/*
 * Lock the fence row of resource FOR NO KEY UPDATE, to advance it to
 * token, if the version our snapshot sees records a lower token and nobody
 * holds it.  Returns false, having locked nothing, otherwise (also when
 * the row changed since our snapshot): the caller then reads the row again
 * or waits.  The caller holds the resource lock in ExclusiveLock mode.
 */
bool
fence_fastpath_lock_lower(const char *resource, int64 token)
{
	FastpathRow fr;
	bool		isnull;
	bool		locked = false;

	/* The lock SELECT ... FOR NO KEY UPDATE would take. */
	if (fence_fastpath_find(resource, RowShareLock, false, &fr) !=
		FENCE_ROW_FOUND)
		return false;
	if (DatumGetInt64(slot_getattr(fr.slot, Anum_fences_token, &isnull)) < token)
		locked = fence_fastpath_lock_found(&fr, LockTupleNoKeyExclusive);
	fence_fastpath_close(&fr);
	return locked;
}

/*
 * Read the version found into *row, in the current memory context; the
 * lease columns read as none when the table predates them (1.1).
 */
static void
fence_fastpath_read_row(FastpathRow *fr, FenceRow *row)
{
	TupleTableSlot *slot = fr->slot;
	bool		isnull;
	Datum		d;

	memset(row, 0, sizeof(FenceRow));
	row->token = DatumGetInt64(slot_getattr(slot, Anum_fences_token, &isnull));
	row->accepted_at =
		DatumGetTimestampTz(slot_getattr(slot, Anum_fences_accepted_at, &isnull));
	d = slot_getattr(slot, Anum_fences_holder, &isnull);
	row->holder = isnull ? NULL : TextDatumGetCString(d);
	if (fr->lease_attnum == InvalidAttrNumber)
		return;
	d = slot_getattr(slot, fr->lease_attnum, &isnull);
	row->leased = !isnull;
	row->lease_expires_at = isnull ? 0 : DatumGetTimestampTz(d);
	d = slot_getattr(slot, Anum_fences_lease_ttl, &isnull);
	row->lease_ttl = isnull ? NULL :
		DatumGetIntervalP(datumCopy(d, false, sizeof(Interval)));
}

/*
 * Keep the version found for resource, and its columns as read into *row,
 * for fence_fastpath_read_last.
 */
static void
fence_fastpath_remember(FastpathRow *fr, const char *resource,
						const FenceRow *row)
{
	HeapTuple	tuple = ExecFetchSlotHeapTuple(fr->slot, false, NULL);
	MemoryContext oldcxt;

	/* an index scan of a heap table returns the version in its buffer */
	Assert(TTS_IS_BUFFERTUPLE(fr->slot));

	if (fastpath_last_cxt == NULL)
		fastpath_last_cxt = AllocSetContextCreate(TopMemoryContext,
												  "lockfence last fence row",
												  ALLOCSET_SMALL_SIZES);
	fastpath_last.valid = false;
	MemoryContextReset(fastpath_last_cxt);
	oldcxt = MemoryContextSwitchTo(fastpath_last_cxt);
	fastpath_last.row = *row;
	fastpath_last.row.holder = row->holder ? pstrdup(row->holder) : NULL;
	fastpath_last.row.lease_ttl = row->lease_ttl ?
		DatumGetIntervalP(datumCopy(IntervalPGetDatum(row->lease_ttl), false,
									sizeof(Interval))) : NULL;
	MemoryContextSwitchTo(oldcxt);
	fastpath_last.relid = RelationGetRelid(fr->rel);
	fastpath_last.invalidations = fences_table_invalidations();
	strlcpy(fastpath_last.resource, resource, sizeof(fastpath_last.resource));
	fastpath_last.tid = fr->slot->tts_tid;
	fastpath_last.xmin = HeapTupleHeaderGetRawXmin(tuple->t_data);
	fastpath_last.buffer = ((BufferHeapTupleTableSlot *) fr->slot)->buffer;
	fastpath_last.valid = BufferIsValid(fastpath_last.buffer);
}

/* Is the text datum d, as stored in a row, the string str? */
static bool
fence_fastpath_text_is(Datum d, const char *str)
{
	struct varlena *v = (struct varlena *) DatumGetPointer(d);
	size_t		len = strlen(str);

	/* a resource is never compressed or stored out of line: do not look */
	if (VARATT_IS_EXTENDED(v) && !VARATT_IS_SHORT(v))
		return false;
	return VARSIZE_ANY_EXHDR(v) == len && memcmp(VARDATA_ANY(v), str, len) == 0;
}

/*
 * Is the version at fastpath_last's TID, in the page that buffer (pinned,
 * share-locked) holds, the one the last read found, and visible to
 * snapshot?  heap_fetch's test, on a page we already hold: an item that is
 * not a normal one (dead, redirected, unused, past the end of the page) is
 * not that version.
 */
static bool
fence_fastpath_last_visible(Relation rel, Buffer buffer, Snapshot snapshot,
							const char *resource)
{
	Page		page = BufferGetPage(buffer);
	OffsetNumber offnum = ItemPointerGetOffsetNumber(&fastpath_last.tid);
	ItemId		lp;
	HeapTupleData tuple;
	bool		isnull;
	Datum		d;

	if (offnum < FirstOffsetNumber || offnum > PageGetMaxOffsetNumber(page))
		return false;
	lp = PageGetItemId(page, offnum);
	if (!ItemIdIsNormal(lp))
		return false;
	tuple.t_data = (HeapTupleHeader) PageGetItem(page, lp);
	tuple.t_len = ItemIdGetLength(lp);
	tuple.t_tableOid = RelationGetRelid(rel);
	tuple.t_self = fastpath_last.tid;
	if (HeapTupleHeaderGetRawXmin(tuple.t_data) != fastpath_last.xmin ||
		!HeapTupleSatisfiesVisibility(&tuple, snapshot, buffer))
		return false;
	d = heap_getattr(&tuple, Anum_fences_resource, RelationGetDescr(rel),
					 &isnull);
	return !isnull && fence_fastpath_text_is(d, resource);
}

/*
 * Read the fence row of resource without its index, when it is the row the
 * last read found and that version is still the one a fresh snapshot sees:
 * the version at the same TID, inserted by the same transaction, still
 * visible.  A version is never changed in place, and the primary key lets
 * at most one version of a resource be visible to a snapshot, so that is
 * the row an index scan would find, with the columns read then.  Saves
 * opening the index, descending it and closing it (about 7,000
 * instructions per check, bench/profile.sh).  Under READ COMMITTED only:
 * the other levels read as the transaction's snapshot sees it, and
 * SERIALIZABLE needs the predicate locks of the index scan.  Returns
 * false, having read nothing, otherwise; the caller then reads through the
 * index.
 *
 * The page is taken from the shared buffer that held it at that read,
 * when that buffer still holds the block (ReadRecentBuffer): no look-up
 * in the buffer mapping table, and no asking the kernel for the table's
 * length (an lseek per fenced transaction) to rule out a block that
 * VACUUM truncated away.  A truncated, evicted or replaced page is not in
 * that buffer any more (truncation drops the relation's buffers past the
 * new end), and the caller then reads through the index.
 */
static bool
fence_fastpath_read_last(const char *resource, FenceRow *row)
{
	Relation	rel;
	Snapshot	snapshot;
	Buffer		buffer;
	bool		same = false;

	if (!fastpath_last.valid || IsolationUsesXactSnapshot() ||
		strcmp(fastpath_last.resource, resource) != 0)
		return false;

	/* The table lock SELECT ... FOR SHARE took up to 1.3. */
	rel = fence_fastpath_open(resource, RowShareLock);
	if (rel == NULL)
		return false;
	/*
	 * Opening it may have accepted an invalidation (the table dropped and
	 * created again, rewritten, or its shape changed): check after.  A
	 * page that VACUUM truncated away is ruled out by the buffer check.
	 */
	buffer = fastpath_last.buffer;
	if (RelationGetRelid(rel) != fastpath_last.relid ||
		fences_table_problem(rel) != NULL ||
		fastpath_last.invalidations != fences_table_invalidations() ||
		!lf_read_recent_buffer(rel,
							   ItemPointerGetBlockNumber(&fastpath_last.tid),
							   buffer))
	{
		table_close(rel, NoLock);
		return false;
	}

	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	LockBuffer(buffer, BUFFER_LOCK_SHARE);
	same = fence_fastpath_last_visible(rel, buffer, snapshot, resource);
	LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
	ReleaseBuffer(buffer);
	UnregisterSnapshot(snapshot);
	table_close(rel, NoLock);	/* keep the table lock, like a statement */
	if (!same)
		return false;

	*row = fastpath_last.row;
	row->holder = fastpath_last.row.holder ? pstrdup(fastpath_last.row.holder) : NULL;
	row->lease_ttl = fastpath_last.row.lease_ttl ?
		DatumGetIntervalP(datumCopy(IntervalPGetDatum(fastpath_last.row.lease_ttl),
									false, sizeof(Interval))) : NULL;
	return true;
}

/*
 * Read the fence row of resource without locking it: as the transaction's
 * snapshot sees it (under READ COMMITTED a fresh one, taken now), or with
 * latest, as the latest snapshot does.  The caller holds the resource
 * lock, which is what makes the read current: no transaction that could
 * change the row's token holds it too.  Returns FENCE_ROW_UNREADABLE when
 * the table is not exactly as the install scripts make it (or the test
 * switch is on): the caller then reads it with a statement.
 */
FenceRowRead
fence_fastpath_read(const char *resource, bool latest, FenceRow *row)
{
	FastpathRow fr;
	FenceRowRead result;

	if (!latest && !debug_disable_fastpath &&
		fence_fastpath_read_last(resource, row))
		return FENCE_ROW_FOUND;

	/* The table lock SELECT ... FOR SHARE took up to 1.3. */
	result = fence_fastpath_find(resource, RowShareLock, latest, &fr);
	if (result != FENCE_ROW_FOUND)
		return result;
	fence_fastpath_read_row(&fr, row);
	if (!latest)
		fence_fastpath_remember(&fr, resource, row);
	fence_fastpath_close(&fr);
	return FENCE_ROW_FOUND;
}

/*
 * May the fence row be updated here rather than by an UPDATE statement?
 * Only when the table has the lease columns (the verdict of fence_shape.c,
 * taken by fence_fastpath_find, covers the rest: no trigger, rule, row
 * security, index but the primary key or constraint but its own, which the
 * caller's new version satisfies by construction).  An UPDATE of a
 * published table also needs a replica identity: checked as the executor
 * does.
 */
static bool
fence_fastpath_plain_table(FastpathRow *fr)
{
	if (fr->lease_attnum == InvalidAttrNumber)
		return false;
	CheckCmdReplicaIdentity(fr->rel, CMD_UPDATE);
	return true;
}

/* Add the primary key entry of a new version that is not a HOT update. */
static void
fence_fastpath_index_insert(FastpathRow *fr, TupleTableSlot *newslot)
{
	Relation	index = index_open(fr->indexid, RowExclusiveLock);
	bool		isnull = false;

	/* indexUnchanged: the key is the old one, a hint for btree's cleanup */
	index_insert(index, &newslot->tts_values[Anum_fences_resource - 1],
				 &isnull, &newslot->tts_tid, fr->rel, UNIQUE_CHECK_YES, true,
				 BuildIndexInfo(index));
	index_close(index, NoLock);
}

/*
 * Replace the version found, locked by the caller, with newrow.  The
 * caller's lock means the update cannot wait nor find the row changed.
 */
static void
fence_fastpath_write_row(FastpathRow *fr, AttrNumber ttl_attnum,
						 const FenceRow *newrow)
{
	TupleDesc	desc = RelationGetDescr(fr->rel);
	TupleTableSlot *newslot = MakeSingleTupleTableSlot(desc, &TTSOpsVirtual);
	TM_FailureData tmfd;
	bool		update_index;

	/* Every column as it was (the resource included), then the new values. */
	slot_getallattrs(fr->slot);
	memcpy(newslot->tts_values, fr->slot->tts_values, desc->natts * sizeof(Datum));
	memcpy(newslot->tts_isnull, fr->slot->tts_isnull, desc->natts * sizeof(bool));
	newslot->tts_values[Anum_fences_token - 1] = Int64GetDatum(newrow->token);
	newslot->tts_values[Anum_fences_accepted_at - 1] =
		TimestampTzGetDatum(newrow->accepted_at);
	newslot->tts_isnull[Anum_fences_holder - 1] = newrow->holder == NULL;
	newslot->tts_values[Anum_fences_holder - 1] =
		newrow->holder ? CStringGetTextDatum(newrow->holder) : (Datum) 0;
	newslot->tts_isnull[fr->lease_attnum - 1] = !newrow->leased;
	newslot->tts_values[fr->lease_attnum - 1] =
		newrow->leased ? TimestampTzGetDatum(newrow->lease_expires_at) : (Datum) 0;
	newslot->tts_isnull[ttl_attnum - 1] = newrow->lease_ttl == NULL;
	newslot->tts_values[ttl_attnum - 1] = PointerGetDatum(newrow->lease_ttl);
	ExecStoreVirtualTuple(newslot);

	if (lf_table_tuple_update(fr->rel, &fr->slot->tts_tid, newslot,
							  GetCurrentCommandId(true), fr->snapshot, &tmfd,
							  &update_index) != TM_Ok)
		elog(ERROR, "locked fence row changed");
	if (update_index)
		fence_fastpath_index_insert(fr, newslot);
	ExecDropSingleTupleTableSlot(newslot);
}

/*
 * Update the fence row of resource as edit decides from the version our
 * snapshot sees, if nobody holds a conflicting lock on it and it has not
 * been updated since.  Returns true with the row as found in *row and as
 * written in *newrow (locked until the transaction, or the current
 * subtransaction, ends), or false having changed and locked nothing: no
 * row, edit declined, the row locked or changed, or a table the install
 * scripts did not make so.  The caller then takes the SPI path, which
 * waits, re-checks and reports.  The pointers in *row and *newrow are
 * allocated in the current memory context: call this outside SPI (between
 * fence_store_enter and fence_store_leave it is SPI's, deleted on leaving).
 */
bool
fence_fastpath_update(const char *resource, FenceRowEdit edit, void *arg,
					  FenceRow *row, FenceRow *newrow)
{
	FastpathRow fr;
	AttrNumber	ttl_attnum;
	bool		updated = false;

	/* The table lock an UPDATE statement takes. */
	if (fence_fastpath_find(resource, RowExclusiveLock, false, &fr) !=
		FENCE_ROW_FOUND)
		return false;

	ttl_attnum = Anum_fences_lease_ttl;
	if (fence_fastpath_plain_table(&fr))
	{
		fence_fastpath_read_row(&fr, row);
		*newrow = *row;
		if (edit(row, newrow, arg) &&
			fence_fastpath_lock_found(&fr, LockTupleNoKeyExclusive))
		{
			fence_fastpath_write_row(&fr, ttl_attnum, newrow);
			updated = true;
		}
	}
	fence_fastpath_close(&fr);

	/* Like SPI after a statement: the rest of ours sees the new version. */
	if (updated)
		CommandCounterIncrement();
	return updated;
}
