/*-------------------------------------------------------------------------
 *
 * fence_lock.c
 *	  The resource lock: what orders fenced transactions by token.
 *
 * Every transaction that fences a resource holds a heavyweight lock on it
 * until the transaction ends: ShareLock when its token equals the recorded
 * fence, ExclusiveLock when it writes the fence row (an advance, a first
 * token, a lease grant, renewal or release, lockfence.reset()).  Share
 * holders never block each other; a writer waits for every transaction
 * that fenced the old token and holds everyone else off until it ends.
 * Each check reads the fence row only once it holds the lock, with a
 * snapshot taken after it: a writer releases its lock only after its
 * commit is visible (CommitTransaction makes the transaction visible
 * before releasing its locks), so a check that waited for an advance sees
 * it and finds its own token stale.  This replaces the row lock (SELECT
 * ... FOR SHARE) that fences took up to 1.3, which wrote a WAL record and
 * dirtied the fence row's page in every fenced transaction, and made a
 * MultiXact for every concurrent locker of one token.
 *
 * The lock is transaction-level (sessionLock = false): savepoint rollback
 * releases what was taken in it, PREPARE TRANSACTION carries it into the
 * prepared transaction (lock.c, AtPrepare_Locks), and crash recovery or the
 * promotion of a standby gives it back to the recovered prepared
 * transaction (lock_twophase_recover) before connections are accepted.
 * It is owned by the current (sub)transaction's resource owner, not by
 * CurrentResourceOwner: a fence() evaluated by a cursor's FETCH runs under
 * the cursor's portal owner, and a later FETCH of that cursor that fails
 * inside a savepoint makes ROLLBACK TO release everything that owner
 * holds, the lock of the earlier, successful fence() included, while the
 * transaction's fence cache (which, like the lock, follows the
 * subtransaction that fenced) still counts the resource as fenced; an
 * advance would then commit beside this transaction's writes.
 *
 * The tag is an advisory tag of the current database whose fourth field is
 * LOCKFENCE_LOCKTAG_FIELD4, a value pg_advisory_lock() never uses (it uses
 * 1 and 2), with a 64-bit hash of the resource name in the other two
 * fields.  Two names with the same hash share a lock: that costs false
 * waiting, never correctness.  In pg_locks such a lock shows as locktype
 * advisory with objsubid LOCKFENCE_LOCKTAG_FIELD4.
 *
 * Each lock takes an entry in the shared lock table, sized by
 * max_locks_per_transaction: a transaction that fences very many resources
 * at once can run out of it, and then fails with PostgreSQL's own "out of
 * shared memory" (53200), whose hint names the setting.
 *
 * IDENTIFICATION
 *	  src/fence_lock.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/resowner.h"

#include "compat.h"
#include "fence_lock.h"
#include "lockfence.h"
#include "lease.h"

/* Seed of the resource hash: any fixed value (it is part of the tag). */
#define FENCE_LOCK_HASH_SEED	UINT64CONST(0x6c6f636b66656e63)

static void
fence_lock_tag(LOCKTAG *tag, const char *resource)
{
	uint64		h = hash_bytes_extended((const unsigned char *) resource,
										(int) strlen(resource),
										FENCE_LOCK_HASH_SEED);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 LOCKFENCE_LOCKTAG_FIELD4);
}

/*
 * Take the resource lock in mode (ShareLock or ExclusiveLock) until the
 * end of the transaction, or of the current subtransaction if it rolls
 * back.  With wait false, returns false at once (holding nothing new) when
 * another transaction holds a conflicting lock; with wait true it waits,
 * bounded by lock_timeout and broken by the deadlock detector, and
 * returns true.
 */
bool
fence_lock_acquire(const char *resource, LOCKMODE mode, bool wait)
{
	LOCKTAG		tag;

	ResourceOwner save_owner = CurrentResourceOwner;
	LockAcquireResult result;

	Assert(mode == ShareLock || mode == ExclusiveLock);
	fence_lock_tag(&tag, resource);
	/* an error leaves the owner to the (sub)transaction's abort to reset */
	CurrentResourceOwner = CurTransactionResourceOwner;
	result = LockAcquire(&tag, mode, false, !wait);
	CurrentResourceOwner = save_owner;
	return result != LOCKACQUIRE_NOT_AVAIL;
}

/*
 * Give back one acquisition of the resource lock made by this call's
 * caller in the current (sub)transaction, for a check or write that was
 * refused: a refusal keeps no lock.  Earlier acquisitions (an earlier
 * fence of the resource in this transaction) are kept.
 */
void
fence_lock_release(const char *resource, LOCKMODE mode)
{
	LOCKTAG		tag;

	ResourceOwner save_owner = CurrentResourceOwner;
	bool		released;

	fence_lock_tag(&tag, resource);
	/* the owner fence_lock_acquire() gave it */
	CurrentResourceOwner = CurTransactionResourceOwner;
	released = LockRelease(&tag, mode, false);
	CurrentResourceOwner = save_owner;
	if (!released)
		elog(ERROR, "lockfence resource lock for \"%s\" was not held",
			 resource);
}

/* Does this transaction hold the resource lock in mode? */
bool
fence_lock_held(const char *resource, LOCKMODE mode)
{
	LOCKTAG		tag;

	fence_lock_tag(&tag, resource);
	return lf_lock_held_by_me(&tag, mode);
}

PG_FUNCTION_INFO_V1(lockfence_lock_resource);

/*
 * lockfence.lock_resource(resource text) returns void
 *
 * Take the resource lock in ExclusiveLock mode until the transaction ends,
 * for SQL functions that write fence rows without fence() (raise_floor):
 * the write then comes after every transaction that fenced the old token,
 * and before any that fences the new one.  Such a write ends the row's
 * lease (raise_floor clears it), so the lease's waiters are woken when
 * the transaction commits, as after a release.
 */
Datum
lockfence_lock_resource(PG_FUNCTION_ARGS)
{
	char	   *resource = text_to_cstring(PG_GETARG_TEXT_PP(0));

	lockfence_refuse_parallel_mode("lockfence.lock_resource()");

	lockfence_validate_resource(resource);
	(void) fence_lock_acquire(resource, ExclusiveLock, true);
	/* a lease the write ends frees the name: its waiters look again */
	lease_wait_announce_at_commit(resource);
	PG_RETURN_VOID();
}
