/*-------------------------------------------------------------------------
 *
 * etcd_session.c
 *	  Session leases: the leases this backend granted and the locks held
 *	  on them, revoked when the backend exits.
 *
 * Like etcd's concurrency.Session, a backend grants one lease per distinct
 * TTL on first use and puts every lock it takes with that TTL on it, as
 * the key "<name>/<lease hex>".  Releasing a lock deletes its key and
 * keeps the lease for the next lock.
 *
 * Renewal rule: the session lease of a TTL is renewed (one keepalive)
 * every third of the TTL, as concurrency.Session renews its lease: when
 * the backend acquires a lock with that TTL (etcd_lock, etcd_try_lock,
 * etcd_lock_many, etcd_lock_and_fence) and the lease was last renewed or
 * granted a third of the TTL ago or earlier, every third of the TTL while
 * it waits in etcd_lock, and by every etcd_keepalive(lease).  Nothing
 * else renews it: every lock on a session lease lives at least two thirds
 * of the TTL after the last of those calls, and at most the TTL after it
 * if none follows, so a client that goes quiet (paused, disconnected
 * behind a pooler, or a backend busy in a long statement) loses its locks
 * after the TTL.  Renewing on every call instead would cost a client that
 * takes many short locks a keepalive per lock, to gain at most the last
 * third of a TTL after a call, which etcd_keepalive gives whoever needs
 * it.  A lease that holds no lock is simply not renewed, so it expires by
 * itself one TTL after its last use; it is forgotten here then.
 *
 * If a session lease is found gone (a keepalive says so, or it was not
 * renewed for a whole TTL) every lock on it is lost: the call that finds
 * out raises LF003 naming each of them, and forgets them.
 *
 * When the backend exits normally (including pg_terminate_backend), a
 * before_shmem_exit callback revokes the remaining leases within
 * ETCD_EXIT_REVOKE_MS in total, so the locks are released at once instead
 * of after their TTL.  After a crash nothing runs, and the TTL frees them.
 * DISCARD ALL, a session pooler's reset between two clients, does the same
 * (before it resets the settings), as it releases advisory locks: the next client of
 * the backend neither inherits the locks nor renews them with its own lock
 * calls (which renew the session lease of their TTL).
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
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "tcop/utility.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "etcd.h"
#include "lockfence.h"
#include "metrics.h"

/*
 * Total time allowed for revoking leases once the backend is terminating,
 * counted from the first revocation attempt for the termination (in the
 * lock wait, before the FATAL error is sent) to the end of the exit
 * callback.
 */
#define ETCD_EXIT_REVOKE_MS		1000

/*
 * Margin under the TTL within which a lease not renewed since is still
 * used: etcd counts the TTL from its own receipt of the renewal, which
 * came after renewed_at, so a lease is surely alive until renewed_at + TTL;
 * the margin leaves room for the request that will use it.
 */
#define ETCD_LEASE_MARGIN_MS	500

/* A lease granted by this backend. */
typedef struct SessionLease
{
	int64		lease;
	int			ttl;			/* TTL asked for (the session's key) */
	bool		current;		/* new locks with this TTL go on it */
	bool		given_up;		/* keys of ours may be left on it that we
								 * no longer track: renewed only once they
								 * are deleted (give_up_key) */
	char	  **left_keys;		/* those keys (TopMemoryContext) */
	int			n_left_keys;
	bool		left_unknown;	/* one could not be noted: never renewed */
	TimestampTz renewed_at;		/* sent its grant or last keepalive */
} SessionLease;

/* A lock held (or pending) on one of our leases. */
typedef struct HeldLock
{
	int64		lease;
	char	   *key;			/* TopMemoryContext */
	TimestampTz acquired_at;
	bool		pending;		/* held, not yet handed to the SQL caller */
	bool		xact;			/* transaction-scoped: released at its end */
	int64		token;			/* create_revision of key */
	bool		fenced;			/* etcd_lock_and_fence fenced with it in this
								 * transaction */
	SubTransactionId fenced_subid;	/* outermost subtransaction that did */
	bool		named;			/* a fence accepted in this transaction named
								 * it (see etcd_session_fence_accepted) */
	SubTransactionId named_subid;	/* outermost subtransaction that did */
	SubTransactionId subid;		/* subtransaction that took it (pending or
								 * transaction-scoped locks) */
} HeldLock;

static SessionLease *leases = NULL;
static int	n_leases = 0;
static int	max_leases = 0;
static HeldLock *locks = NULL;
static int	n_locks = 0;
static int	max_locks = 0;
static bool callbacks_installed = false;

/*
 * A lock marked in this transaction (fenced, or named by a fence) was lost
 * before the commit (its lease found gone, or revoked under it): the
 * commit check refuses the commit without asking etcd, even though the
 * lock is no longer in the list above.  lost_key names the first such
 * lock (truncated; a fixed buffer, so that noting it cannot fail).
 */
static bool lost_fenced = false;
static bool lost_named = false;
static char lost_key[256];

/* When revocation for a termination began; 0 if it did not. */
static TimestampTz exit_cleanup_started = 0;

static void etcd_session_exit(int code, Datum arg);
static bool delete_left_keys(int64 lease);
static void refuse_given_up_renewal(int64 lease);
static void mark_lost(HeldLock *l);
static void fault_point(const char *point);
static void etcd_session_xact(XactEvent event, void *arg);
static void etcd_session_subxact(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);

/*
 * Make room for one more element of a TopMemoryContext array.
 */
static void *
grow(void *array, int n, int *max, Size elem)
{
	if (n < *max)
		return array;
	*max = Max(16, *max * 2);
	if (array == NULL)
		return MemoryContextAlloc(TopMemoryContext, elem * *max);
	return repalloc(array, elem * *max);
}

static SessionLease *
find_lease(int64 lease)
{
	int			i;

	for (i = 0; i < n_leases; i++)
		if (leases[i].lease == lease)
			return &leases[i];
	return NULL;
}

static HeldLock *
find_lock(const char *key)
{
	int			i;

	for (i = 0; i < n_locks; i++)
		if (strcmp(locks[i].key, key) == 0)
			return &locks[i];
	return NULL;
}

/*
 * Number of locks (held or pending) on a lease.
 */
static int
locks_on(int64 lease)
{
	int			i;
	int			n = 0;

	for (i = 0; i < n_locks; i++)
		if (locks[i].lease == lease)
			n++;
	return n;
}

/*
 * Forget one lock (index i): it was released or lost.
 */
static void
forget_lock(int i)
{
	if (locks[i].acquired_at != 0)
	{
		long		secs;
		int			usecs;

		TimestampDifference(locks[i].acquired_at, GetCurrentTimestamp(),
							&secs, &usecs);
		lockfence_metrics_etcd_released(secs + usecs / 1000000.0);
	}
	pfree(locks[i].key);
	locks[i] = locks[--n_locks];
}

/*
 * Remember a lease granted by this backend, as the session lease of ttl
 * unless ttl is 0.
 */
void
etcd_session_track(int64 lease, int ttl, TimestampTz asked_at)
{
	int			i;

	if (!callbacks_installed)
	{
		before_shmem_exit(etcd_session_exit, (Datum) 0);
		RegisterXactCallback(etcd_session_xact, NULL);
		RegisterSubXactCallback(etcd_session_subxact, NULL);
		callbacks_installed = true;
	}
	leases = grow(leases, n_leases, &max_leases, sizeof(SessionLease));
	for (i = 0; i < n_leases; i++)
		if (ttl > 0 && leases[i].ttl == ttl)
			leases[i].current = false;
	leases[n_leases].lease = lease;
	leases[n_leases].ttl = ttl;
	leases[n_leases].current = ttl > 0;
	leases[n_leases].given_up = false;
	leases[n_leases].left_keys = NULL;
	leases[n_leases].n_left_keys = 0;
	leases[n_leases].left_unknown = false;
	/* etcd counts the TTL from before its reply: from the request, here */
	leases[n_leases].renewed_at = asked_at;
	n_leases++;
}

/*
 * The locks on a lease, for a message: "a/1, b/1".
 */
static char *
lock_list(int64 lease)
{
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	for (i = 0; i < n_locks; i++)
		if (locks[i].lease == lease)
			appendStringInfo(&buf, "%s\"%s\"", buf.len ? ", " : "",
							 locks[i].key);
	return buf.data;
}

/*
 * A lease of ours is gone: forget it and every lock on it, and if any was
 * held, raise LF003 naming each.  what says how we know.  When it is only
 * presumed gone (not renewed for its TTL), revoke it quietly as well, so
 * that keys etcd may still keep a little longer block nobody.
 */
void
etcd_session_lease_lost(int64 lease, const char *what, bool revoke)
{
	char	   *lost = lock_list(lease);

	etcd_session_untrack(lease);
	if (revoke)
		(void) etcd_session_revoke(lease, ETCD_CLEANUP_MS, true);
	if (lost[0] != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg("etcd locks of this session were lost: %s", lost),
				 errdetail("Their lease " INT64_FORMAT " %s.", lease, what),
				 errhint("Acquire the locks again; writes fenced with their tokens are refused once a successor fences.")));
}

/*
 * The session lease for locks of ttl seconds: the current one, or a new
 * one granted now (*fresh).  A current lease not renewed for its whole TTL
 * has expired: its locks are reported lost (LF003), and leases without
 * locks that expired so are forgotten.
 */
int64
etcd_session_lease(int ttl, int *granted_ttl, bool *fresh)
{
	TimestampTz now = GetCurrentTimestamp();
	int			i;
	int64		lease;
	TimestampTz asked_at;

	for (i = n_leases - 1; i >= 0; i--)
	{
		SessionLease *l = &leases[i];
		TimestampTz expires;

		expires = TimestampTzPlusMilliseconds(l->renewed_at,
											  (int64) l->ttl * 1000 -
											  ETCD_LEASE_MARGIN_MS);
		if (l->ttl <= 0 || now < expires)
			continue;	/* alive, or a lease of one lock (not a session's) */
		if (locks_on(l->lease) > 0)
			etcd_session_lease_lost(l->lease,
									"was not renewed for longer than its TTL",
									true);
		/* expired by itself: nothing to revoke */
		etcd_session_untrack(l->lease);
	}

	for (i = 0; i < n_leases; i++)
	{
		if (leases[i].current && leases[i].ttl == ttl)
		{
			*fresh = false;
			*granted_ttl = ttl;
			return leases[i].lease;
		}
	}
	asked_at = GetCurrentTimestamp();
	lease = etcd_lease_grant(ttl, granted_ttl);
	etcd_session_track(lease, ttl, asked_at);
	*fresh = true;
	return lease;
}

/*
 * Revoke a lease (etcd_lease_revoke) and, once etcd no longer has it,
 * forget it and every lock on it.  Returns etcd_lease_revoke's answer.
 */
bool
etcd_session_revoke(int64 lease, long timeout_ms, bool quiet)
{
	if (!etcd_lease_revoke(lease, timeout_ms, quiet))
		return false;
	etcd_session_untrack(lease);
	return true;
}

/*
 * Revoke a lease quietly during error cleanup, within
 * etcd_cleanup_budget_ms().  Abandons the requests in flight first.
 * Never raises.
 */
void
etcd_session_revoke_after_error(int64 lease)
{
	long		budget = etcd_cleanup_budget_ms();

	HOLD_INTERRUPTS();
	etcd_http_abort_all();
	if (lease > 0)
		(void) etcd_session_revoke(lease, budget, true);
	RESUME_INTERRUPTS();
}

/*
 * Renew a lease once (etcd_lease_keepalive) and, when it succeeded, note
 * the renewal if the lease is ours.  A lease of ours that was given up is
 * renewed only once the keys we left on it are deleted; else see
 * refuse_given_up_renewal.
 */
bool
etcd_session_keepalive(int64 lease, int64 *ttl)
{
	SessionLease *l = find_lease(lease);
	TimestampTz sent_at;

	if (l != NULL && l->given_up && !delete_left_keys(lease))
		refuse_given_up_renewal(lease);
	if (!etcd_lease_keepalive(lease, ttl, &sent_at))
		return false;
	etcd_session_lease_renewed(lease, sent_at);
	return true;
}

/*
 * A keepalive of one of our leases was sent at sent_at and succeeded.
 */
void
etcd_session_lease_renewed(int64 lease, TimestampTz sent_at)
{
	SessionLease *l = find_lease(lease);

	if (l != NULL && sent_at > l->renewed_at)
		l->renewed_at = sent_at;
}

/*
 * When a keepalive of one of our leases last succeeded (was sent), or 0
 * if the lease is not ours.
 */
TimestampTz
etcd_session_lease_renewed_at(int64 lease)
{
	SessionLease *l = find_lease(lease);

	return l != NULL ? l->renewed_at : 0;
}

/*
 * Whether a lock call should renew this session lease: its last renewal
 * was sent a third of its TTL ago or earlier.  (A lease that is not a
 * session's, or not ours, is always due.)
 */
bool
etcd_session_renewal_due(int64 lease)
{
	SessionLease *l = find_lease(lease);

	if (l == NULL || l->ttl <= 0)
		return true;
	return GetCurrentTimestamp() >=
		TimestampTzPlusMilliseconds(l->renewed_at,
									etcd_renewal_interval_ms(l->ttl));
}

/*
 * A key of ours on lease could not be deleted (the member stopped
 * answering, the cleanup's time ran out, or the release raised) and we
 * forget it: the next lock of its TTL gets a new lease, and the lease is
 * renewed only once the key is deleted (delete_left_keys), since the key
 * would live on with it, ahead of every later waiter for its name.  key
 * may be NULL (no key was queued).  Runs in error cleanup: allocates
 * without raising, and a key it cannot note keeps the lease from being
 * renewed at all.
 */
static void
give_up_key(int64 lease, const char *key)
{
	SessionLease *l = find_lease(lease);
	char	  **keys;
	char	   *copy;

	if (l == NULL)
		return;
	l->current = false;
	l->given_up = true;
	if (key == NULL)
		return;
	copy = MemoryContextAllocExtended(TopMemoryContext, strlen(key) + 1,
									  MCXT_ALLOC_NO_OOM);
	keys = MemoryContextAllocExtended(TopMemoryContext,
									  sizeof(char *) * (l->n_left_keys + 1),
									  MCXT_ALLOC_NO_OOM);
	if (copy == NULL || keys == NULL)
	{
		l->left_unknown = true;
		if (copy)
			pfree(copy);
		if (keys)
			pfree(keys);
		return;
	}
	strcpy(copy, key);
	if (l->n_left_keys > 0)
	{
		memcpy(keys, l->left_keys, sizeof(char *) * l->n_left_keys);
		pfree(l->left_keys);
	}
	keys[l->n_left_keys++] = copy;
	l->left_keys = keys;
}

/* Forget the keys noted on a lease. */
static void
free_left_keys(SessionLease *l)
{
	int			i;

	for (i = 0; i < l->n_left_keys; i++)
		pfree(l->left_keys[i]);
	if (l->left_keys)
		pfree(l->left_keys);
	l->left_keys = NULL;
	l->n_left_keys = 0;
}

/*
 * Before a given-up lease is renewed: delete (lease compared, quietly) the
 * keys we left on it.  True when etcd answered for each, deleted or
 * already gone: the lease may be renewed again (it still takes no new
 * lock).  False if a key stays, or one could not be noted.
 */
static bool
delete_left_keys(int64 lease)
{
	SessionLease *l = find_lease(lease);
	bool		deleted;

	if (l->left_unknown)
		return false;
	while (l->n_left_keys > 0)
	{
		char	   *key = l->left_keys[l->n_left_keys - 1];

		if (!etcd_lease_delete_key(lease, key, etcd_request_timeout_ms, true,
								   &deleted, NULL))
			return false;
		l = find_lease(lease);	/* (the array is ours alone; to be sure) */
		pfree(key);
		l->n_left_keys--;
	}
	free_left_keys(l);
	l->given_up = false;
	return true;
}

/*
 * A renewal of a lease we gave up whose left keys could not be deleted:
 * its locks are reported lost (LF003), and their keys join those left on
 * it, so that a later renewal deletes them too; it is revoked now if etcd
 * answers in time, else at exit or by its TTL.  It stays listed, given up,
 * until revoked.  Fail closed: the session's other locks on the lease go
 * with the forgotten key.
 */
static void
refuse_given_up_renewal(int64 lease)
{
	char	   *lost = lock_list(lease);
	int			i;

	for (i = n_locks - 1; i >= 0; i--)
	{
		if (locks[i].lease != lease)
			continue;
		give_up_key(lease, locks[i].key);
		mark_lost(&locks[i]);
		forget_lock(i);
	}
	(void) etcd_session_revoke(lease, ETCD_CLEANUP_MS, true);
	if (lost[0] != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg("etcd locks of this session were lost: %s", lost),
				 errdetail("Their lease " INT64_FORMAT " was given up: a key of this session left on it could not be deleted.",
						   lease),
				 errhint("Acquire the locks again; writes fenced with their tokens are refused once a successor fences.")));
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
			 errmsg("etcd lease " INT64_FORMAT " was given up by this session",
					lease),
			 errdetail("A key of this session left on it could not be deleted, so the lease is not renewed; it is revoked, or expires with its TTL."),
			 errhint("Acquire the locks again.")));
}

/*
 * Record a lock acquired on one of our leases, pending until handed over.
 */
void
etcd_session_lock_acquired(int64 lease, const char *key, int64 token)
{
	locks = grow(locks, n_locks, &max_locks, sizeof(HeldLock));
	locks[n_locks].lease = lease;
	locks[n_locks].key = MemoryContextStrdup(TopMemoryContext, key);
	locks[n_locks].acquired_at = GetCurrentTimestamp();
	locks[n_locks].pending = true;
	locks[n_locks].xact = false;
	locks[n_locks].token = token;
	locks[n_locks].fenced = false;
	locks[n_locks].fenced_subid = InvalidSubTransactionId;
	locks[n_locks].named = false;
	locks[n_locks].named_subid = InvalidSubTransactionId;
	locks[n_locks].subid = GetCurrentSubTransactionId();
	n_locks++;
}

/*
 * The SQL caller has the lock now: it is no longer released on errors,
 * but, if xact_scope, when the (sub)transaction that took it ends.
 */
void
etcd_session_lock_handed_over(const char *key, bool xact_scope)
{
	HeldLock   *l = find_lock(key);

	if (l != NULL)
	{
		l->pending = false;
		l->xact = xact_scope;
		if (!xact_scope)
			l->subid = InvalidSubTransactionId;
	}
}

/*
 * Note that the current subtransaction marked a lock (fenced or named):
 * the mark is forgotten when the outermost subtransaction that made it
 * rolls back.  Subtransactions that can still roll back form one chain,
 * and a mark's subtransaction is always on it (a committed one passes the
 * mark to its parent), so the outermost is the smallest ID.
 */
static void
mark_in_subxact(bool *mark, SubTransactionId *subid)
{
	SubTransactionId cur = GetCurrentSubTransactionId();

	if (!*mark || cur < *subid)
		*subid = cur;
	*mark = true;
}

/*
 * The current transaction fenced a resource with the token of this lock
 * of ours (etcd_lock_and_fence): confirm it is still held at commit.
 */
void
etcd_session_lock_fenced(const char *key)
{
	HeldLock   *l = find_lock(key);

	if (l != NULL)
		mark_in_subxact(&l->fenced, &l->fenced_subid);
}

/*
 * A fence check accepted a token with holder in the current (sub)transaction
 * (lockfence_check: fence, try_fence, their array forms and the trigger,
 * whether the check wrote the fence row or only share-locked it).  Mark
 * the lock of ours whose key is holder: lockfence.etcd_check_at_commit =
 * all_fenced confirms the marked locks at commit, and PREPARE TRANSACTION
 * is refused after such a fence.  A fence without a holder marks nothing:
 * a token alone does not say which lock service issued it (small etcd
 * revisions and other services' tokens coincide).
 *
 * The mark follows the subtransaction that made it: a rollback to a
 * savepoint set before the fence unmarks the lock, as it undoes the
 * fence's row lock and cache entry.
 *
 * Cheap when the backend holds no etcd lock: one comparison.  Never
 * raises.  (The token itself is not needed: the check at commit compares the
 * lock's own token with etcd.)
 */
void
etcd_session_fence_accepted(const char *holder)
{
	HeldLock   *l;

	if (holder == NULL || n_locks == 0)
		return;
	l = find_lock(holder);
	if (l != NULL)
		mark_in_subxact(&l->named, &l->named_subid);
}

/*
 * The locks to confirm at commit: those etcd_lock_and_fence fenced with in
 * this transaction, and, if all, those a fence accepted in this
 * transaction named (etcd_session_fence_accepted).  Returns how many, in a
 * palloc'd array.
 */
int
etcd_session_locks_to_check(bool all, EtcdCheckedLock **out)
{
	int			i;
	int			n = 0;

	*out = NULL;
	if (n_locks == 0)
		return 0;				/* the common case: no etcd lock at all */
	*out = palloc(sizeof(EtcdCheckedLock) * n_locks);
	for (i = 0; i < n_locks; i++)
	{
		if (locks[i].pending || !(locks[i].fenced || (all && locks[i].named)))
			continue;
		(*out)[n].key = pstrdup(locks[i].key);
		(*out)[n].lease = locks[i].lease;
		(*out)[n].token = locks[i].token;
		(*out)[n].fenced = locks[i].fenced;
		n++;
	}
	return n;
}

/*
 * Was a lock that this transaction fenced with (by etcd_lock_and_fence,
 * or, if all, named by a fence) lost before the commit?  Then *key names
 * one.  A loss stays noted until the transaction ends, also when the
 * fence is rolled back to a savepoint afterwards (fail closed).
 */
bool
etcd_session_lost_in_xact(bool all, const char **key)
{
	*key = lost_key;
	return lost_fenced || (all && lost_named);
}

/*
 * Forget which locks the transaction fenced with: all of them at its end,
 * or those fenced in an aborted subtransaction subid or its children.
 */
static void
forget_fenced(bool all, SubTransactionId subid)
{
	int			i;

	if (all)
		lost_fenced = lost_named = false;
	for (i = 0; i < n_locks; i++)
	{
		if (locks[i].fenced && (all || locks[i].fenced_subid >= subid))
			locks[i].fenced = false;
		if (locks[i].named && (all || locks[i].named_subid >= subid))
			locks[i].named = false;
	}
}

/*
 * A lock this transaction fenced with (or named) is lost: its commit check
 * fails (LF003, naming the first such key) and PREPARE is refused, whether
 * the loss was found by a renewal or by an unlock that found the key gone.
 */
static void
mark_lost(HeldLock *l)
{
	if ((l->fenced || l->named) && !lost_fenced && !lost_named)
		strlcpy(lost_key, l->key, sizeof(lost_key));
	lost_fenced |= l->fenced;
	lost_named |= l->named;
}

/*
 * Forget a lock whose key an unlock found gone (its lease expired or was
 * revoked): lost, as for the commit check (mark_lost), then released.
 */
void
etcd_session_lock_found_gone(const char *key)
{
	HeldLock   *l = find_lock(key);

	if (l != NULL)
		mark_lost(l);
	etcd_session_lock_released(key);
}

/*
 * Forget a lock whose key was deleted (or found gone).  A lease that no
 * longer takes new locks is revoked once its last lock is released.
 */
void
etcd_session_lock_released(const char *key)
{
	HeldLock   *l = find_lock(key);
	int64		lease;
	SessionLease *sl;

	if (l == NULL)
		return;
	lease = l->lease;
	forget_lock(l - locks);
	sl = find_lease(lease);
	if (sl != NULL && !sl->current && locks_on(lease) == 0)
		(void) etcd_session_revoke(lease, ETCD_CLEANUP_MS, true);
}

/*
 * Does a lease hold locks besides key?
 */
static bool
etcd_session_lease_shared(int64 lease, const char *key)
{
	int			i;

	for (i = 0; i < n_locks; i++)
		if (locks[i].lease == lease && strcmp(locks[i].key, key) != 0)
			return true;
	return false;
}

/*
 * Give up a lock of ours without a request to etcd: it is lost (for the
 * commit check too) and forgotten, and its lease is no longer used or
 * renewed, so the key goes when the lease is revoked at exit or expires
 * with its TTL (other locks on that lease go with it: fail closed, as a
 * key of ours left on a lease we keep renewing would block its name).
 */
void
etcd_session_give_up(int64 lease, const char *key)
{
	HeldLock   *l = key != NULL ? find_lock(key) : NULL;

	if (l != NULL)
	{
		mark_lost(l);
		forget_lock(l - locks);
	}
	give_up_key(lease, key);
}

/*
 * Release a lock that was not handed to its caller, or whose acquisition
 * failed, quietly within budget_ms; never raises.  A lease that carries no
 * other lock of ours is revoked (which deletes the key), unless keep_lease;
 * otherwise the key alone is deleted, and if that fails the lease is revoked after all (its
 * other locks are lost; fail closed: a key of ours left behind on a lease
 * we keep renewing would block its name forever).  A lease that cannot be
 * revoked in time is no longer used or renewed: it is revoked at exit, or
 * expires with its TTL.
 */
void
etcd_session_release_quietly(int64 lease, const char *key, long budget_ms,
							 bool keep_lease)
{
	TimestampTz deadline;
	long		left;
	bool		deleted;

	HOLD_INTERRUPTS();
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), budget_ms);
	if (key != NULL && (keep_lease || etcd_session_lease_shared(lease, key)))
	{
		if (etcd_lease_delete_key(lease, key, budget_ms, true, &deleted, NULL))
		{
			/* gone already: lost, if the transaction fenced with it */
			if (deleted)
				etcd_session_lock_released(key);
			else
				etcd_session_lock_found_gone(key);
			RESUME_INTERRUPTS();
			return;
		}
	}
	/* not deleted, its lease going */
	etcd_session_give_up(lease, key);
	left = Max((long) ((deadline - GetCurrentTimestamp()) / 1000), 1L);
	(void) etcd_session_revoke(lease, left, true);
	RESUME_INTERRUPTS();
}

/*
 * Release, quietly and within budget_ms in total, the locks to release
 * when a (sub)transaction ends: pending locks (never handed to a caller)
 * if pending, transaction-scoped locks if xact; all of them, or those
 * taken in subtransaction subid or one of its children (subtransaction
 * IDs increase).  A lock whose release fails or does not fit in the
 * budget is forgotten; its TTL frees it (its lease is no longer used).
 */
static void
release_at_end(bool pending, bool xact, bool all, SubTransactionId subid,
			   long budget_ms)
{
	TimestampTz deadline;
	int			i;

	if (n_locks == 0)
		return;
	HOLD_INTERRUPTS();
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), budget_ms);
	for (i = n_locks - 1; i >= 0; i--)
	{
		char	   *key;
		bool		was_pending;
		long		left;

		if (i >= n_locks || !((pending && locks[i].pending) ||
							  (xact && locks[i].xact)) ||
			(!all && locks[i].subid < subid))
			continue;
		/*
		 * The flags stay as they are until the release has run: should it
		 * raise, abandon_release() must still recognise the lock as one to
		 * give up (a pending lock left unflagged would pass for one handed
		 * to the caller, its lease used and renewed for the session's life).
		 */
		was_pending = locks[i].pending;
		key = pstrdup(locks[i].key);
		elog(DEBUG1, "etcd lock \"%s\" is released at the end of its transaction",
			 key);
		etcd_http_abort_all();
		left = (long) ((deadline - GetCurrentTimestamp()) / 1000);
		if (left <= 0)
		{
			give_up_key(locks[i].lease, key);
			forget_lock(i);
			continue;
		}
		fault_point("release_request");
		etcd_session_release_quietly(locks[i].lease, key, left, !was_pending);
		fault_point("release_step");
	}
	RESUME_INTERRUPTS();
}

/*
 * A prepared transaction outlives this backend's session, and COMMIT
 * PREPARED (in any session, at any later time) cannot confirm an etcd
 * lock: refuse PREPARE TRANSACTION while the transaction holds a
 * transaction-scoped lock (this session would release it, or lose it,
 * while the prepared work waits), or fenced with a lock of this session,
 * by etcd_lock_and_fence or by any fence check naming it (see
 * etcd_session_fence_accepted).  This does not depend on
 * lockfence.etcd_check_at_commit: the setting can differ in the session
 * that runs COMMIT PREPARED, and the work fenced with an etcd lock would
 * commit with nobody knowing whether the lock was still held.
 */
static void
refuse_prepare(void)
{
	int			i;

	if (lost_fenced || lost_named)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that fenced with etcd lock \"%s\"",
						lost_key),
				 errdetail("The lock was lost during the transaction."),
				 errhint("Commit work done under an etcd lock with COMMIT, not with two-phase commit.")));
	for (i = 0; i < n_locks; i++)
	{
		if (locks[i].xact)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot PREPARE a transaction that holds transaction-scoped etcd lock \"%s\"",
							locks[i].key),
					 errdetail("A prepared transaction outlives its session, which releases the lock when the transaction ends."),
					 errhint("Commit work done under an etcd lock with COMMIT, not with two-phase commit.")));
		if (locks[i].fenced || locks[i].named)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot PREPARE a transaction that fenced with etcd lock \"%s\"",
							locks[i].key),
					 errdetail("COMMIT PREPARED cannot confirm that the lock is still held, so the transaction could commit after the lock was lost."),
					 errhint("Commit work done under an etcd lock with COMMIT, not with two-phase commit.")));
	}
}

/*
 * Fault injection for tests: is the named point listed (comma-separated)
 * in LOCKFENCE_FAULT_INJECTION in the server's environment?  The variable
 * is read once per backend; without it this costs one comparison.  Only
 * in a build with LOCKFENCE_TEST_HOOKS: a plain build has no fault point.
 */
bool
etcd_fault_injected(const char *point)
{
#ifdef LOCKFENCE_TEST_HOOKS
	static const char *faults = NULL;
	static bool faults_read = false;

	if (!faults_read)
	{
		faults = getenv("LOCKFENCE_FAULT_INJECTION");
		faults_read = true;
	}
	return faults != NULL && strstr(faults, point) != NULL;
#else
	return false;
#endif
}

/*
 * Raise an ERROR at the named point if it is injected: lets a test prove
 * that an ERROR raised inside the end-of-transaction release never
 * escapes it.
 */
static void
fault_point(const char *point)
{
	if (etcd_fault_injected(point))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("lockfence fault injected at %s", point)));
}

/* release_at_end's arguments, for release_never_raising */
typedef struct ReleaseArgs
{
	bool		pending;
	bool		xact;
	bool		all;
	SubTransactionId subid;
	long		budget_ms;
	const char *fault;			/* fault_point name */
} ReleaseArgs;

/*
 * After an error escaped a release: forget the locks it was to release
 * (what release_at_end did not get to), and stop using their leases, which
 * are revoked at exit or expire with their TTL, and renewed only once the
 * keys are deleted (give_up_key).  No request, and no allocation that can
 * fail: cannot raise.
 */
static void
abandon_release(const ReleaseArgs *a)
{
	int			i;

	for (i = n_locks - 1; i >= 0; i--)
	{
		if (!((a->pending && locks[i].pending) || (a->xact && locks[i].xact)) ||
			(!a->all && locks[i].subid < a->subid))
			continue;
		give_up_key(locks[i].lease, locks[i].key);
		pfree(locks[i].key);
		locks[i] = locks[--n_locks];
	}
}

/*
 * The catch side of release_never_raising(), in a function of its own so
 * that its own PG_TRY does not nest inside the caller's (the macros'
 * locals would shadow each other).  Called with the error being handled
 * still set: it is copied, flushed and reported as a WARNING; if even that
 * fails (out of memory), nothing is reported.  Either way the locks not
 * released are abandoned.
 */
static void
report_release_failure(ReleaseArgs *a, MemoryContext cxt, int holdoff)
{
	/* own PG_TRY (not error_cleanup.c): the error is never re-raised */
	PG_TRY();
	{
		ErrorData  *edata = CopyErrorData();

		FlushErrorState();
		etcd_http_abort_all();
		abandon_release(a);
		ereport(WARNING,
				(errcode(edata->sqlerrcode),
				 errmsg("could not release etcd locks at the end of the transaction: %s",
						edata->message),
				 errdetail("The transaction's outcome stands; the locks are freed when their lease is revoked at the end of the session or expires.")));
		FreeErrorData(edata);
	}
	PG_CATCH();
	{
		/* even the report failed (out of memory): stay silent */
		InterruptHoldoffCount = holdoff;
		MemoryContextSwitchTo(cxt);
		FlushErrorState();
		abandon_release(a);
	}
	PG_END_TRY();
}

/*
 * release_at_end, from a transaction callback at commit or abort, where
 * an ERROR must not escape: after a commit it would become a PANIC
 * ("cannot abort transaction, it was already committed"), and during an
 * abort it would interrupt the abort.  The release is quiet already
 * (etcd_call with quiet never raises for what etcd or the network does),
 * but it allocates, creates wait event sets and parses replies, any of
 * which can raise; such an error is caught here, its state flushed, and
 * reported as a WARNING; the locks not released are forgotten, their
 * leases no longer used (revoked at backend exit, or expired by their
 * TTL).  The transaction's outcome stands.
 *
 * FlushErrorState() also forgets an error being recovered from when the
 * abort runs inside error recovery; that is harmless where PostgreSQL
 * aborts (the error was reported before, or copied and flushed by a
 * PL/pgSQL handler), and a PANIC or an interrupted abort is the only
 * alternative.  Test/t/64_etcd_commit_faults.pl injects such errors
 * (LOCKFENCE_FAULT_INJECTION) at commit, abort and savepoint rollback.
 */
static void
release_never_raising(bool pending, bool xact, bool all,
					  SubTransactionId subid, long budget_ms, const char *fault)
{
	ReleaseArgs a = {pending, xact, all, subid, budget_ms, fault};
	MemoryContext cxt = CurrentMemoryContext;
	int			holdoff = InterruptHoldoffCount;

	if (n_locks == 0)
		return;
	/* own PG_TRY (not error_cleanup.c): the error is never re-raised */
	PG_TRY();
	{
		fault_point(a.fault);
		release_at_end(a.pending, a.xact, a.all, a.subid, a.budget_ms);
	}
	PG_CATCH();
	{
		/* release_at_end's HOLD_INTERRUPTS were not undone */
		InterruptHoldoffCount = holdoff;
		MemoryContextSwitchTo(cxt);
		report_release_failure(&a, cxt, holdoff);
	}
	PG_END_TRY();
}

/*
 * Transaction callback.  (The commit-time check has its own callback, at
 * PRE_COMMIT, in etcd_commit_check.c.)  A transaction that
 * aborts while a lock is pending means the call that acquired it failed
 * without releasing it; transaction-scoped locks are released when the
 * transaction ends, after a commit only once it is durable
 * (XACT_EVENT_COMMIT).  Those releases never raise (release_never_raising):
 * a release that fails never turns the commit into an error, let alone a
 * PANIC; the TTL frees the lock.
 */
static void
etcd_session_xact(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			refuse_prepare();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			forget_fenced(true, InvalidSubTransactionId);
			release_never_raising(true, false, true, InvalidSubTransactionId,
								  ETCD_PENDING_RELEASE_MS, "abort_release");
			release_never_raising(false, true, true, InvalidSubTransactionId,
								  ProcDiePending ? ETCD_PENDING_RELEASE_MS :
								  ETCD_CLEANUP_MS, "abort_release");
			break;
		case XACT_EVENT_COMMIT:
			forget_fenced(true, InvalidSubTransactionId);
			release_never_raising(false, true, true, InvalidSubTransactionId,
								  ETCD_CLEANUP_MS, "commit_release");
			break;
		default:
			break;
	}
}

/*
 * Subtransaction callback: likewise for a subtransaction abort (e.g. a
 * PL/pgSQL exception block or ROLLBACK TO SAVEPOINT), which releases the
 * pending and transaction-scoped locks it took, as it releases
 * PostgreSQL's own locks; a subtransaction commit passes its
 * transaction-scoped locks on to its parent.
 */
static void
etcd_session_subxact(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	int			i;

	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		forget_fenced(false, mySubid);
		release_never_raising(true, false, false, mySubid,
							  ETCD_PENDING_RELEASE_MS, "abort_release");
		release_never_raising(false, true, false, mySubid,
							  ProcDiePending ? ETCD_PENDING_RELEASE_MS :
							  ETCD_CLEANUP_MS, "abort_release");
	}
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		for (i = 0; i < n_locks; i++)
		{
			if (locks[i].xact && locks[i].subid >= mySubid)
				locks[i].subid = parentSubid;
			if (locks[i].fenced && locks[i].fenced_subid >= mySubid)
				locks[i].fenced_subid = parentSubid;
			if (locks[i].named && locks[i].named_subid >= mySubid)
				locks[i].named_subid = parentSubid;
		}
	}
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
 * Forget a lease (it was revoked, or found gone), and every lock on it:
 * those locks have ended now.
 */
void
etcd_session_untrack(int64 lease)
{
	int			i;

	for (i = n_locks - 1; i >= 0; i--)
	{
		if (locks[i].lease != lease)
			continue;
		mark_lost(&locks[i]);
		forget_lock(i);
	}
	for (i = 0; i < n_leases; i++)
	{
		if (leases[i].lease == lease)
		{
			free_left_keys(&leases[i]);
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
	return find_lease(lease) != NULL;
}

/*
 * A key this backend holds (or has pending), on any of its leases, in the
 * queue of the lock name, other than except (the key a call waits with);
 * NULL if none.  The queue is every key under "<name>/", as for etcd's
 * own clients: the keys of name itself ("<name>/<lease hex>") and those of
 * longer names such as "<name>/x".  Such a key is older than the caller's,
 * so a wait on name waits for this session as long as it holds it.
 */
const char *
etcd_session_key_on_name(const char *name, const char *except)
{
	size_t		len = strlen(name);
	int			i;

	for (i = 0; i < n_locks; i++)
	{
		const char *key = locks[i].key;

		if (strncmp(key, name, len) == 0 && key[len] == '/' &&
			(except == NULL || strcmp(key, except) != 0))
			return key;
	}
	return NULL;
}

/*
 * Is key a lock this backend holds (or has pending) on lease?
 */
bool
etcd_session_holds_key(int64 lease, const char *key)
{
	HeldLock   *l = find_lock(key);

	return l != NULL && l->lease == lease;
}

/*
 * Revoke every lease of the session within ETCD_EXIT_REVOKE_MS from
 * started, newest first, and forget each one: revoked, or (a failed
 * revoke, or none once the time is up) left to expire unrenewed after its
 * TTL.  Never raises errors, and holds off interrupts for at most that
 * long.
 */
static void
revoke_all_leases(TimestampTz started)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(started,
													   ETCD_EXIT_REVOKE_MS);

	HOLD_INTERRUPTS();
	while (n_leases > 0)
	{
		int64		lease = leases[n_leases - 1].lease;
		long		left;

		left = (long) ((deadline - GetCurrentTimestamp()) / 1000);
		if (left > 0)
			(void) etcd_lease_revoke(lease, left, true);
		etcd_session_untrack(lease);
	}
	RESUME_INTERRUPTS();
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
	etcd_http_abort_all();
	if (n_leases == 0)
		return;

	etcd_session_exit_cleanup_begins();
	revoke_all_leases(exit_cleanup_started);
	etcd_http_abort_all();
}

static ProcessUtility_hook_type prev_process_utility = NULL;

/*
 * DISCARD ALL ends the session's locks (see the header comment), before it
 * runs: it resets the settings, and the revokes must go to the endpoints,
 * with the credentials, that granted the leases.  First the check DISCARD
 * ALL makes itself, so that a DISCARD ALL it refuses (in a transaction
 * block, where a transaction-scoped lock could be held, or in a function)
 * releases nothing.
 */
static void
etcd_session_process_utility(PlannedStmt *pstmt, const char *queryString,
							 bool readOnlyTree, ProcessUtilityContext context,
							 ParamListInfo params, QueryEnvironment *queryEnv,
							 DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;

	if (IsA(stmt, DiscardStmt) &&
		((DiscardStmt *) stmt)->target == DISCARD_ALL && n_leases > 0)
	{
		PreventInTransactionBlock(context == PROCESS_UTILITY_TOPLEVEL,
								  "DISCARD ALL");
		etcd_http_abort_all();
		revoke_all_leases(GetCurrentTimestamp());
	}
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/*
 * Install the DISCARD ALL hook.  Called from _PG_init (lockfence_etcd_init):
 * a backend that holds an etcd lock has loaded the library.
 */
void
etcd_session_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = etcd_session_process_utility;
}
