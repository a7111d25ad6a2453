/*-------------------------------------------------------------------------
 *
 * lease_fastpath.c
 *	  Uncontended lease grants, renewals and releases without SPI.
 *
 * Most lease operations meet nobody: the lease is free (or held by the
 * caller), nobody holds its fence row, and nobody changed the row since
 * our snapshot.  For those, lease.c's statements cost most of the call: a
 * read, a locking read and an UPDATE in an internal subtransaction, each
 * through the executor.  These functions judge the row as
 * fence_fastpath_update finds it with lease_decide, as the statements do,
 * and write the same new values; it locks exactly the version judged,
 * without waiting, before writing the new one.
 *
 * They only ever succeed.  When they return false nothing was changed or
 * locked, and lease.c runs its statements, which wait for the row's
 * lockers (transactions that fenced with the old token, competing grants),
 * re-check, and tell why a renewal or release failed.  No subtransaction is
 * needed here: a version that is locked or changed is refused before any
 * lock is taken, so no stray lock can outlive the call.
 *
 * The clock is the server's, as in the statements, read once per call after
 * the table lock is taken (lease_decide.c).
 *
 * IDENTIFICATION
 *	  src/lease_fastpath.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "fence_lock.h"
#include "lease.h"
#include "fence_fastpath.h"
#include "lockfence.h"

/* What lease_edit needs besides the row. */
typedef struct LeaseEdit
{
	const char *name;			/* the lease */
	LeaseOp		op;
	int64		token;			/* renew, release: the lease's token */
	const char *holder;			/* grant: the new holder */
	Interval   *ttl;			/* grant, renew: NULL for the lease's own */
} LeaseEdit;

/*
 * Judge the row as fence_fastpath_update found it, with the table lock
 * held: the clock is read here, after any wait for that lock (LOCK TABLE,
 * VACUUM FULL, ALTER EXTENSION UPDATE), and the row lock is then taken
 * without waiting.  A token at the top of the range is left to the
 * statements, which report it.
 */
static bool
lease_edit(const FenceRow *row, FenceRow *newrow, void *arg)
{
	LeaseEdit  *e = (LeaseEdit *) arg;

	return lease_decide(e->name, e->op, row, e->token, e->holder, e->ttl,
						GetCurrentTimestamp(), newrow) == LEASE_WRITE;
}

/*
 * Write name's fence row as e decides, if nobody holds its resource lock
 * (fence_lock.c): every transaction that fenced the old token has ended,
 * and no other grant, renewal or release is in flight.  The lock is taken
 * without waiting, in ExclusiveLock mode, before the row is read, and
 * kept until the transaction ends when the row was written.
 */
static bool
lease_fastpath_write(const char *name, LeaseEdit *e, FenceRow *row,
					 FenceRow *newrow)
{
	if (!fence_lock_acquire(name, ExclusiveLock, false))
		return false;
	if (fence_fastpath_update(name, lease_edit, e, row, newrow))
		return true;
	fence_lock_release(name, ExclusiveLock);
	return false;
}

/*
 * Grant name to holder for ttl if the lease is free and its row
 * uncontended.  Returns true with the row before (for the metrics) and
 * after the grant.
 */
bool
lease_fastpath_grant(const char *name, const char *holder, Interval *ttl,
					 FenceRow *prev, FenceRow *row)
{
	LeaseEdit	e = {name, LEASE_OP_GRANT, 0, holder, ttl};

	return lease_fastpath_write(name, &e, prev, row);
}

/*
 * Renew the unexpired lease of token for ttl (NULL: its own TTL) if its
 * row is uncontended.  Returns true with the row as renewed.
 */
bool
lease_fastpath_renew(const char *name, int64 token, Interval *ttl,
					 FenceRow *row)
{
	LeaseEdit	e = {name, LEASE_OP_RENEW, token, NULL, ttl};
	FenceRow	before;

	return lease_fastpath_write(name, &e, &before, row);
}

/*
 * Release the unexpired lease of token if its row is uncontended.  Returns
 * true with the row as released.
 */
bool
lease_fastpath_release(const char *name, int64 token, FenceRow *row)
{
	LeaseEdit	e = {name, LEASE_OP_RELEASE, token, NULL, NULL};
	FenceRow	before;

	return lease_fastpath_write(name, &e, &before, row);
}
