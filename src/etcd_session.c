/*-------------------------------------------------------------------------
 *
 * etcd_session.c
 *	  Leases granted by this backend, revoked when it exits.
 *
 * Every lease lockfence grants is tracked until it is revoked.  When the
 * backend exits normally (including pg_terminate_backend), a
 * before_shmem_exit callback revokes the remaining ones within
 * ETCD_EXIT_REVOKE_MS in total, so the locks are released at once instead
 * of after their TTL.  After a crash nothing runs, and the TTL frees them.
 *
 * A lock that was acquired but not yet handed to the SQL caller (its
 * function has not returned) is "pending".  The function itself releases
 * it when it fails; as a safety net, a (sub)transaction abort releases
 * every lock still pending from that (sub)transaction, since no caller
 * can know its key.
 *
 * IDENTIFICATION
 *	  src/etcd_session.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "etcd.h"
#include "metrics.h"

/*
 * Total time allowed for revoking leases once the backend is terminating,
 * counted from the first revocation attempt for the termination (in the
 * lock wait, before the FATAL error is sent) to the end of the exit
 * callback.
 */
#define ETCD_EXIT_REVOKE_MS		1000

/*
 * A lease granted by this backend; acquired_at is 0 and key NULL until its
 * lock is held.
 */
typedef struct TrackedLease
{
	int64		lease;
	TimestampTz acquired_at;
	char	   *key;			/* lock key held under it, TopMemoryContext */
	bool		pending;		/* held, not yet handed to the SQL caller */
	SubTransactionId subid;		/* subtransaction that made it pending */
} TrackedLease;

static TrackedLease *leases = NULL;
static int	n_leases = 0;
static int	max_leases = 0;
static bool exit_hook_installed = false;

/* When revocation for a termination began; 0 if it did not. */
static TimestampTz exit_cleanup_started = 0;

static void etcd_session_exit(int code, Datum arg);
static void etcd_session_xact(XactEvent event, void *arg);
static void etcd_session_subxact(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);
static void release_pending(bool all, SubTransactionId subid);

/*
 * Remember a lease granted by this backend.
 */
void
etcd_session_track(int64 lease)
{
	if (!exit_hook_installed)
	{
		before_shmem_exit(etcd_session_exit, (Datum) 0);
		RegisterXactCallback(etcd_session_xact, NULL);
		RegisterSubXactCallback(etcd_session_subxact, NULL);
		exit_hook_installed = true;
	}
	if (n_leases == max_leases)
	{
		int			newmax = Max(16, max_leases * 2);

		if (leases == NULL)
			leases = MemoryContextAlloc(TopMemoryContext,
										sizeof(TrackedLease) * newmax);
		else
			leases = repalloc(leases, sizeof(TrackedLease) * newmax);
		max_leases = newmax;
	}
	leases[n_leases].lease = lease;
	leases[n_leases].acquired_at = 0;
	leases[n_leases].key = NULL;
	leases[n_leases].pending = false;
	leases[n_leases].subid = InvalidSubTransactionId;
	n_leases++;
}

/*
 * Record that the lock key of a tracked lease is now held (for the metrics,
 * and so that etcd_unlock knows the lease is that key's alone).
 */
void
etcd_session_mark_acquired(int64 lease, const char *key)
{
	int			i;

	for (i = 0; i < n_leases; i++)
	{
		if (leases[i].lease == lease)
		{
			leases[i].acquired_at = GetCurrentTimestamp();
			if (leases[i].key == NULL)
				leases[i].key = MemoryContextStrdup(TopMemoryContext, key);
		}
	}
}

/*
 * Mark the lock held under a tracked lease as pending (acquired, not yet
 * handed to the SQL caller) or not.
 */
void
etcd_session_set_pending(int64 lease, bool pending)
{
	int			i;

	for (i = 0; i < n_leases; i++)
	{
		if (leases[i].lease == lease)
		{
			leases[i].pending = pending;
			leases[i].subid = pending ? GetCurrentSubTransactionId() :
				InvalidSubTransactionId;
		}
	}
}

/*
 * Revoke the leases of pending locks, quietly and within
 * ETCD_PENDING_RELEASE_MS: all of them, or those made pending in
 * subtransaction subid or one of its children (subtransaction IDs
 * increase).  A lease that cannot be revoked in time stays tracked, for
 * the exit callback; its TTL frees it otherwise.
 */
static void
release_pending(bool all, SubTransactionId subid)
{
	int			i;

	HOLD_INTERRUPTS();
	for (i = n_leases - 1; i >= 0; i--)
	{
		int64		lease;

		if (i >= n_leases || !leases[i].pending ||
			(!all && leases[i].subid < subid))
			continue;
		lease = leases[i].lease;
		leases[i].pending = false;
		elog(DEBUG1, "etcd lease " INT64_FORMAT " of a lock never handed to its caller is revoked at abort",
			 lease);
		etcd_http_abort_all();
		(void) etcd_lease_revoke(lease, ETCD_PENDING_RELEASE_MS, true);
	}
	RESUME_INTERRUPTS();
}

/*
 * Transaction callback: a transaction that aborts while a lock is
 * pending means the call that acquired it failed without releasing it.
 */
static void
etcd_session_xact(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
		release_pending(true, InvalidSubTransactionId);
}

/*
 * Subtransaction callback: likewise for a subtransaction abort (e.g. a
 * PL/pgSQL exception block), which may be caught and never reach the
 * top level.
 */
static void
etcd_session_subxact(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		release_pending(false, mySubid);
}

/*
 * Note that the backend is terminating and revocation for it starts now:
 * the exit callback then only uses what is left of ETCD_EXIT_REVOKE_MS.
 */
void
etcd_session_exit_cleanup_begins(void)
{
	if (exit_cleanup_started == 0)
		exit_cleanup_started = GetCurrentTimestamp();
}

/*
 * Forget a lease (it was revoked, or found gone).  If its lock was held,
 * that lock has ended now.
 */
void
etcd_session_untrack(int64 lease)
{
	int			i;

	for (i = 0; i < n_leases; i++)
	{
		if (leases[i].lease == lease)
		{
			if (leases[i].acquired_at != 0)
			{
				long		secs;
				int			usecs;

				TimestampDifference(leases[i].acquired_at,
									GetCurrentTimestamp(), &secs, &usecs);
				lockfence_metrics_etcd_released(secs + usecs / 1000000.0);
			}
			if (leases[i].key)
				pfree(leases[i].key);
			leases[i] = leases[--n_leases];
			return;
		}
	}
}

/*
 * Did this backend grant the lease (and not revoke it yet)?
 */
bool
etcd_session_owns(int64 lease)
{
	int			i;

	for (i = 0; i < n_leases; i++)
		if (leases[i].lease == lease)
			return true;
	return false;
}

/*
 * Is key the lock key this backend acquired under lease, and the lease
 * not revoked yet?  Such a lease carries that key alone, so revoking it
 * releases the lock.
 */
bool
etcd_session_holds_key(int64 lease, const char *key)
{
	int			i;

	for (i = 0; i < n_leases; i++)
		if (leases[i].lease == lease)
			return leases[i].key != NULL && strcmp(leases[i].key, key) == 0;
	return false;
}

/*
 * Exit callback: abandon requests in flight, then revoke our leases,
 * newest first, within ETCD_EXIT_REVOKE_MS in total (counting what the
 * lock wait already spent on it, see etcd_session_exit_cleanup_begins).
 * Never raises errors.
 */
static void
etcd_session_exit(int code, Datum arg)
{
	TimestampTz deadline;

	etcd_http_abort_all();
	if (n_leases == 0)
		return;

	etcd_session_exit_cleanup_begins();
	deadline = TimestampTzPlusMilliseconds(exit_cleanup_started,
										   ETCD_EXIT_REVOKE_MS);
	HOLD_INTERRUPTS();
	while (n_leases > 0)
	{
		long		left;

		left = (long) ((deadline - GetCurrentTimestamp()) / 1000);
		if (left <= 0)
			break;
		/* etcd_lease_revoke untracks the lease when it succeeds */
		if (!etcd_lease_revoke(leases[n_leases - 1].lease, left, true))
			n_leases--;
	}
	RESUME_INTERRUPTS();
	etcd_http_abort_all();
}
