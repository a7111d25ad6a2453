/*-------------------------------------------------------------------------
 *
 * etcd_session.c
 *	  Leases granted by this backend, revoked when it exits.
 *
 * Every lease lockfence grants is tracked until it is revoked.  When the
 * backend exits normally (including pg_terminate_backend), a
 * before_shmem_exit callback revokes the remaining ones with a short
 * timeout, so the locks are released at once instead of after their TTL.
 * After a crash nothing runs, and the TTL frees them.
 *
 * IDENTIFICATION
 *	  src/etcd_session.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "etcd.h"
#include "metrics.h"

/* Total time allowed for revoking leases at exit. */
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
} TrackedLease;

static TrackedLease *leases = NULL;
static int	n_leases = 0;
static int	max_leases = 0;
static bool exit_hook_installed = false;

static void etcd_session_exit(int code, Datum arg);

/*
 * Module initialization (nothing to do until the first lease).
 */
void
etcd_session_init(void)
{
}

/*
 * Remember a lease granted by this backend.
 */
void
etcd_session_track(int64 lease)
{
	if (!exit_hook_installed)
	{
		before_shmem_exit(etcd_session_exit, (Datum) 0);
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
 * newest first, within ETCD_EXIT_REVOKE_MS in total.  Never raises errors.
 */
static void
etcd_session_exit(int code, Datum arg)
{
	TimestampTz deadline;

	etcd_http_abort_all();
	if (n_leases == 0)
		return;

	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
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
