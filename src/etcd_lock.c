/*-------------------------------------------------------------------------
 *
 * etcd_lock.c
 *	  etcd locks compatible with etcd's concurrency Mutex: acquisition,
 *	  read-back of the fencing token, and release.
 *
 * A lock is a key "<name>/<lease ID in lowercase hex>" created under the
 * session lease of its TTL (etcd_session.c); the holder is the key under
 * "<name>/" with the lowest create_revision, so `etcdctl lock NAME`, Go's
 * concurrency.Mutex and lockfence exclude each other in FIFO order.  One
 * transaction creates our key and reads the holder: an uncontended lock
 * costs that request alone.  Otherwise etcd_lock_wait.c waits for the keys
 * ahead of ours to go, keeping the lease alive meanwhile.
 *
 * The fencing token is the create_revision of our key, issued only once
 * a linearizable read found our key under our lease and none older: a
 * waiter whose key or lease went away while it waited (etcd 3.4's lock
 * service even answered "locked" then) is reported as a lost lock
 * (LF003), never given a token.
 *
 * Any error during an acquisition (cancel, statement timeout, wait
 * timeout, lost lease, transport failure) abandons the requests in flight
 * and, with interrupts held, deletes our waiter key (revoking the lease
 * if it was granted for this lock).  A lock stays "pending" from its acquisition until its SQL
 * function returns it to the caller (etcd_lock_and_fence: until the fence
 * accepted its token); any error before that releases it, so a caller that
 * never learned a key never owns one.  After a cancel or a termination
 * that release is bounded by ETCD_PENDING_RELEASE_MS, so the interrupt
 * takes effect at once even when etcd does not answer; a lease not revoked
 * in time is revoked at exit or expires with its TTL.  Termination is
 * covered by the exit callback in etcd_session.c.
 *
 * IDENTIFICATION
 *	  src/etcd_lock.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

#include "error_cleanup.h"
#include "etcd.h"
#include "lockfence.h"
#include "metrics.h"
#include "wait_timeout.h"

/*
 * Time allowed for releasing what a failed acquisition left in etcd: as
 * etcd_cleanup_budget_ms(), and after a wait_timeout (55P03) as short as
 * after a cancel, ETCD_PENDING_RELEASE_MS.  A wait_timeout ends the call
 * at once whatever etcd does, as a cancel does: a member that stopped
 * answering made it fire a full second late before (issue 17, item 15).
 */
long
etcd_acquire_cleanup_budget_ms(void)
{
	if (geterrcode() == ERRCODE_LOCK_NOT_AVAILABLE)
		return ETCD_PENDING_RELEASE_MS;
	return etcd_cleanup_budget_ms();
}

/*
 * Release a lock of ours (key on lease) that was not handed to the SQL
 * caller, after an error, quietly within budget_ms (one lock:
 * etcd_acquire_cleanup_budget_ms(); several: what is left of one such
 * budget for all of them): see etcd_session_release_quietly.  keep_lease:
 * the lease was not granted for this lock (a session lease used before),
 * so only the key is deleted.  Abandons the requests in flight first.
 * Never raises.
 */
void
etcd_lock_release_after_error(int64 lease, const char *key, bool keep_lease,
							  long budget_ms)
{
	/* for tests: leave the lock to the abort's safety net (etcd_session.c) */
	if (etcd_fault_injected("skip_own_release"))
		return;
	HOLD_INTERRUPTS();
	etcd_http_abort_all();
	if (lease > 0 && etcd_session_owns(lease))
		etcd_session_release_quietly(lease, key, budget_ms, keep_lease);
	RESUME_INTERRUPTS();
}


/*
 * The lock key for a name and lease, as etcd's Mutex builds it.
 */
static char *
lock_key(const char *name, int64 lease)
{
	return psprintf("%s/%llx", name, (unsigned long long) lease);
}

/*
 * The transaction operation that reads the holder of name: the key under
 * "<name>/" with the lowest create_revision.
 */
static char *
holder_range_op(const char *name)
{
	char	   *prefix = psprintf("%s/", name);

	return psprintf("{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
					"\"sort_target\":\"CREATE\",\"sort_order\":\"ASCEND\",\"limit\":\"1\"}}",
					etcd_b64_encode(prefix, strlen(prefix)),
					etcd_prefix_end_b64(prefix));
}

/*
 * Response i of a transaction reply, which must be a range response.
 */
static JsonbContainer *
txn_range(EtcdReply *reply, int i, const char *what)
{
	JsonbContainer *r;

	r = etcd_json_object(etcd_json_array_object(&reply->json->root,
												"responses", i),
						 "response_range");
	if (r == NULL)
		etcd_malformed_reply(what,
							 "The transaction reply lacks a range response.");
	return r;
}

/*
 * Our key's create_revision, from a range over the key.  Raises LF003
 * when the key is gone or attached to another lease.
 */
static int64
own_key_revision(JsonbContainer *r, const char *name, const char *key,
				 int64 lease, const char *what)
{
	JsonbContainer *kv;
	int64		create_rev;
	int64		kv_lease = 0;

	if (etcd_json_array_length(r, "kvs") == 0)
		etcd_report_lock_lost(name, key,
							  "The lock key no longer exists: its lease expired or was revoked while waiting.");
	kv = etcd_json_array_object(r, "kvs", 0);
	if (!etcd_json_int64(kv, "create_revision", &create_rev) || create_rev <= 0)
		etcd_malformed_reply(what, "The lock key has no create_revision.");
	(void) etcd_json_int64(kv, "lease", &kv_lease);
	if (kv_lease != lease)
		etcd_report_lock_lost(name, key,
							  psprintf("The lock key is attached to lease " INT64_FORMAT ", not " INT64_FORMAT ".",
									   kv_lease, lease));
	return create_rev;
}

/*
 * Is key the holder, per the range response of holder_range_op()?
 */
static bool
key_is_holder(JsonbContainer *r, const char *key, const char *what)
{
	char	   *holder;
	int			holder_len;

	if (etcd_json_array_length(r, "kvs") == 0)
		etcd_malformed_reply(what,
							 "The range over the lock name found no key.");
	holder = etcd_json_bytes(etcd_json_array_object(r, "kvs", 0), "key",
							 &holder_len);
	return holder != NULL && holder_len == (int) strlen(key) &&
		memcmp(holder, key, holder_len) == 0;
}

/* What queueing our key found (queue_lock_key) */
typedef enum QueueResult
{
	QUEUED_HOLDER,				/* our key is the holder */
	QUEUED_BEHIND,				/* an older key holds the lock */
	QUEUE_LEASE_GONE			/* etcd does not know our lease */
} QueueResult;

/*
 * Queue our key under name, as the Mutex does, in one transaction: create
 * it under our lease unless it exists, and read the holder.  Sets *my_rev
 * to our key's create_revision.  An uncontended lock costs this one
 * request.
 */
static QueueResult
queue_lock_key(const char *name, const char *key, int64 lease, int64 *my_rev)
{
	const char *what = "a lock request";
	char	   *key64 = etcd_b64_encode(key, strlen(key));
	char	   *holder_op = holder_range_op(name);
	char	   *body;
	EtcdReply	reply;
	JsonbContainer *header;

	body = psprintf("{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"create_revision\":\"0\"}],"
					"\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"\",\"lease\":\"" INT64_FORMAT "\"}},%s],"
					"\"failure\":[{\"request_range\":{\"key\":\"%s\"}},%s]}",
					key64, key64, lease, holder_op, key64, holder_op);
	if (!etcd_call_as("the transaction that queues the lock key",
					  "/v3/kv/txn", body, etcd_request_timeout_ms, false,
					  &reply))
	{
		if (reply.error_text && strstr(reply.error_text, "lease not found"))
			return QUEUE_LEASE_GONE;
		etcd_report_reply_error(what, &reply);
	}

	if (etcd_json_bool(&reply.json->root, "succeeded"))
	{
		/* the put's revision is the transaction's */
		header = etcd_json_object(&reply.json->root, "header");
		if (header == NULL || !etcd_json_int64(header, "revision", my_rev) ||
			*my_rev <= 0)
			etcd_malformed_reply(what, "The reply carries no revision.");
	}
	else
		*my_rev = own_key_revision(txn_range(&reply, 0, what), name, key,
								   lease, what);
	return key_is_holder(txn_range(&reply, 1, what), key, what) ?
		QUEUED_HOLDER : QUEUED_BEHIND;
}

/*
 * Validate the arguments shared by the lock functions.
 */
void
etcd_lock_check_args(const char *name, int ttl)
{
	size_t		len = strlen(name);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("etcd lock name must not be empty")));
	if (len > ETCD_MAX_NAME_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("etcd lock name is too long"),
				 errdetail("Lock names are limited to %d bytes.",
						   ETCD_MAX_NAME_BYTES)));
	if (ttl < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl_seconds must be at least 1")));
}

/*
 * A lock call renews a session lease used before once a third of its TTL
 * has passed since its last renewal (the renewal rule, etcd_session.c).
 * The keepalive is sent alongside the lock request, not before it, so
 * that renewing costs no round trip of its own; LockRenewal tracks it.
 */
typedef struct LockRenewal
{
	EtcdHttpReq *req;			/* keepalive in flight, or NULL */
	int64		lease;
	TimestampTz sent_at;
} LockRenewal;

static void
start_renewal(LockRenewal *r, int64 lease, bool fresh)
{
	r->req = NULL;
	r->lease = lease;
	if (fresh || !etcd_session_renewal_due(lease))
		return;
	r->sent_at = GetCurrentTimestamp();
	r->req = etcd_lease_keepalive_start(lease, etcd_request_timeout_ms);
	if (r->req == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("could not set up an etcd request")));
}

/*
 * Collect the renewal.  A lease etcd says is gone loses every lock on it
 * (key, queued on lease, among them: LF003).  A keepalive that got no
 * answer is sent again the usual way, with retries.  Like every request
 * of a waiting call, it is cut at the call's deadline (55P03).
 */
static void
finish_renewal(LockRenewal *r, const char *name, const char *key,
			   int64 lease)
{
	int64		left;

	if (r->req == NULL)
		return;
	while (etcd_http_status(r->req) == ETCD_HTTP_RUNNING)
	{
		TimestampTz deadline = etcd_call_deadline();
		long		wait_ms = -1;

		if (deadline != 0)
		{
			wait_ms = wait_ms_until(deadline);
			if (wait_ms <= 0)
			{
				etcd_http_finish(r->req);
				r->req = NULL;
				etcd_call_deadline_report("a lease renewal",
										  "etcd did not answer in time",
										  NULL);
			}
		}
		if (!etcd_http_wait(wait_ms))
			CHECK_FOR_INTERRUPTS();
	}
	left = etcd_lease_keepalive_finish(r->req);
	etcd_http_finish(r->req);
	r->req = NULL;
	if (left > 0)
		etcd_session_lease_renewed(r->lease, r->sent_at);
	else if (left == ETCD_KA_GONE ||
			 !etcd_session_keepalive(r->lease, &left))
	{
		etcd_session_lease_lost(r->lease, "expired or was revoked", false);
		if (r->lease == lease)
			etcd_report_lock_lost(name, key,
								  "The lease of the lock key expired or was revoked.");
	}
}

/*
 * A wait under a lease of its own (the session already held the name)
 * kept only that lease alive, not the session lease, which carries the
 * session's other locks of this TTL (in etcd_lock_many, some taken by
 * this very call).  Renew it now if due, so that no lock of the session
 * is handed over about to expire; if it is gone, its locks are lost
 * (LF003) and this acquisition fails with them.
 */
static void
renew_session_lease_after_wait(int64 session_lease)
{
	int64		left;

	if (etcd_session_renewal_due(session_lease) &&
		!etcd_session_keepalive(session_lease, &left))
		etcd_session_lease_lost(session_lease, "expired or was revoked",
								false);
}

/*
 * After a wait behind the keys of name, which our key won: a key of this
 * session still listed in the name's queue was older than ours, so it was
 * gone when the wait ended.  Its lock was lost meanwhile: the wait kept
 * only its own lease alive, and the older key's lease (of another TTL, or
 * the session lease when the call waited on a lease of its own) may have
 * expired.  Report the loss (LF003) instead of handing out this lock while
 * the session believes it holds the older one: the whole lease's locks
 * when the lease is gone, else that lock (its key deleted by someone).
 */
static void
check_own_keys_after_wait(const char *name, const char *key)
{
	const char *own = etcd_session_key_on_name(name, key);
	int64		lease;
	int64		left;
	char	   *lost;

	if (own == NULL)
		return;
	lease = etcd_lock_key_lease(own);
	if (lease > 0 && !etcd_session_keepalive(lease, &left))
		etcd_session_lease_lost(lease,
								"expired or was revoked while this session waited behind its lock",
								false);
	lost = pstrdup(own);
	etcd_session_lock_found_gone(lost);
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
			 errmsg("etcd lock \"%s\" of this session was lost", lost),
			 errdetail("Its key was deleted while this session waited behind it for lock \"%s\".",
					   name),
			 errhint("Acquire the locks again; writes fenced with their tokens are refused once a successor fences.")));
}

/*
 * Queue our key on *lease (see queue_lock_key).  A session lease used
 * before may be gone (it was not renewed within its TTL, or was revoked):
 * every lock on it is lost with it (etcd_session_lease raises LF003 for
 * them), and one that carried none is replaced by a new lease, once.
 * Updates *lease, *fresh and *granted_ttl then; returns our key.
 */
static char *
queue_on_lease(const char *name, int ttl, int64 *lease, bool *fresh,
			   int *granted_ttl, QueueResult *result, int64 *my_rev)
{
	char	   *key = lock_key(name, *lease);
	bool		new_fresh;

	*result = queue_lock_key(name, key, *lease, my_rev);
	if (*result != QUEUE_LEASE_GONE)
		return key;
	if (!*fresh)
	{
		etcd_session_lease_lost(*lease, "expired or was revoked", false);
		*lease = etcd_session_lease(ttl, granted_ttl, &new_fresh);
		*fresh = new_fresh;
		key = lock_key(name, *lease);
		*result = queue_lock_key(name, key, *lease, my_rev);
	}
	if (*result == QUEUE_LEASE_GONE)
		etcd_report_lock_lost(name, key,
							  "The lease expired before the lock key was created.");
	return key;
}

/*
 * A try-lock found the name taken: remove our key, by revoking the lease
 * if it was granted for this call, else by deleting the key alone.
 */
static void
remove_queued_key(int64 lease, const char *key, bool fresh)
{
	bool		deleted;

	if (!fresh)
		(void) etcd_lease_delete_key(lease, key, etcd_request_timeout_ms,
									 false, &deleted, NULL);
	else
		(void) etcd_session_revoke(lease, etcd_request_timeout_ms, false);
}

/*
 * One acquisition in progress: what its steps and the cleanup after an
 * error share (lockfence_run_with_cleanup).
 */
typedef struct AcquireCall
{
	const char *name;
	int			ttl;
	TimestampTz deadline;		/* of the whole call; 0: none */
	bool		try_only;
	EtcdLockResult *res;
	int64		session_lease;	/* the session lease of this TTL */
	bool		session_fresh;	/* granted by this call */
	int64		lease;			/* the lease our key is queued on */
	bool		fresh;			/* that lease was granted for this call */
	int			granted_ttl;
	LockRenewal renewal;
	bool		got;
} AcquireCall;

/*
 * Take the lease the call queues its key on: the session lease of the
 * TTL, or, when the session already holds the name on it (the same key
 * cannot carry a second lock), a lease of this lock's own, revoked when
 * the lock is released.  Sends the session lease's renewal if due.
 */
static void
acquire_lease(AcquireCall *c)
{
	c->lease = etcd_session_lease(c->ttl, &c->granted_ttl, &c->session_fresh);
	c->fresh = c->session_fresh;
	c->session_lease = c->lease;
	if (etcd_session_holds_key(c->lease, lock_key(c->name, c->lease)))
	{
		/* contend with our own key as any other session would */
		TimestampTz asked_at = GetCurrentTimestamp();

		c->lease = etcd_lease_grant(c->ttl, &c->granted_ttl);
		etcd_session_track(c->lease, 0, asked_at);
		c->fresh = true;
	}
	start_renewal(&c->renewal, c->session_lease, c->session_fresh);
}

/*
 * The protocol's steps after the lease, in order: queue our key (reading
 * the holder), collect the renewal, wait behind the keys ahead unless
 * try_only, and record the lock pending; a try-lock that found the name
 * taken removes its key.
 */
static void
acquire_steps(void *arg)
{
	AcquireCall *c = (AcquireCall *) arg;
	QueueResult queued;
	int64		my_rev;
	char	   *key;

	key = queue_on_lease(c->name, c->ttl, &c->lease, &c->fresh,
						 &c->granted_ttl, &queued, &my_rev);
	finish_renewal(&c->renewal, c->name, key, c->lease);
	if (queued == QUEUED_HOLDER)
	{
		c->got = true;
		c->res->token = my_rev;
	}
	else if (!c->try_only)
	{
		etcd_lock_wait(c->name, key, c->lease, my_rev, c->granted_ttl,
					   c->deadline);
		if (c->lease != c->session_lease)
			renew_session_lease_after_wait(c->session_lease);
		check_own_keys_after_wait(c->name, key);
		c->got = true;
		c->res->token = my_rev;
	}
	c->res->key = key;
	c->res->lease = c->lease;
	c->res->fresh_lease = c->fresh;
	if (c->got)
		etcd_session_lock_acquired(c->lease, key, c->res->token);
	else
		remove_queued_key(c->lease, key, c->fresh);
}

/*
 * After any error in acquire_steps: release what the call left in etcd
 * (our key, and its lease if granted for the call).
 */
static void
release_after_failed_steps(void *arg)
{
	AcquireCall *c = (AcquireCall *) arg;

	c->res->release_began = GetCurrentTimestamp();
	etcd_lock_release_after_error(c->lease, lock_key(c->name, c->lease),
								  !c->fresh, etcd_acquire_cleanup_budget_ms());
}

/*
 * The acquisition once its arguments are checked: the lease, then the
 * protocol's steps.
 */
static void
acquire_lease_and_steps(void *arg)
{
	AcquireCall *c = (AcquireCall *) arg;

	acquire_lease(c);
	lockfence_run_with_cleanup(acquire_steps, release_after_failed_steps, c);
}

/*
 * After any error of acquire_lease_and_steps: count an acquisition that
 * ended without the lock.  The lease's steps count too: with etcd
 * unreachable, or a wait_timeout that runs out while the session lease is
 * granted, that is where the call fails.
 */
static void
count_failed_acquisition(void *arg)
{
	lockfence_metrics_etcd_acquire_failed();
}

/*
 * etcd_lock_acquire, within the call's deadline (0: none), which every
 * request of the call is cut at (see etcd_lock_acquire).
 */
static bool
acquire(const char *name, int ttl, TimestampTz started, TimestampTz deadline,
		bool try_only, EtcdLockResult *res)
{
	AcquireCall c = {0};

	c.name = name;
	c.ttl = ttl;
	c.deadline = deadline;
	c.try_only = try_only;
	c.res = res;
	etcd_lock_check_args(name, ttl);
	lockfence_run_with_cleanup(acquire_lease_and_steps,
							   count_failed_acquisition, &c);

	if (c.got)
	{
		long		secs;
		int			usecs;

		TimestampDifference(started, GetCurrentTimestamp(), &secs, &usecs);
		lockfence_metrics_etcd_acquired(secs + usecs / 1000000.0);
	}
	return c.got;
}

/*
 * Acquire the named lock (waiting, or only if free at once when
 * try_only).  Returns false when try_only and the lock is taken.  The
 * lock is returned pending: the caller hands it over with etcd_lock_hand_over() once
 * the SQL caller has it, and releases it with
 * etcd_lock_release_after_error() if it
 * fails before.
 *
 * wait_ms (< 0: no limit) counts from now and bounds the whole call: the
 * wait, and every etcd request before it (the session lease's grant or
 * renewal, the authentication, the transaction that queues the key) or
 * during it, which are cut at the deadline and end the call with 55P03
 * then, whatever lockfence.etcd_request_timeout allows (issue 17, item
 * 15: with a member that stopped answering before the call, the requests
 * before the wait ran on to the request timeout and ended in 08006
 * seconds late).  The deadline is lifted when the call returns or fails,
 * and does not cut the quiet release after an error.
 *
 * On any error, requests in flight are abandoned and the lease is
 * revoked with interrupts held, so nothing of ours is left in etcd.
 */
bool
etcd_lock_acquire(const char *name, int ttl, long wait_ms, bool try_only,
				  EtcdLockResult *res)
{
	TimestampTz started = GetCurrentTimestamp();
	TimestampTz deadline;
	EtcdCallDeadline saved;
	volatile bool got = false;

	if (try_only || wait_ms < 0)
		return acquire(name, ttl, started, 0, try_only, res);

	deadline = TimestampTzPlusMilliseconds(started, wait_ms);
	etcd_call_deadline_push(deadline, name, &saved);
	PG_TRY();
	{
		got = acquire(name, ttl, started, deadline, false, res);
	}
	PG_FINALLY();
	{
		etcd_call_deadline_pop(&saved);
	}
	PG_END_TRY();
	return got;
}


/*
 * The SQL caller has the lock now: it is no longer released on errors,
 * but, if xact_scope, when the transaction that took it ends.
 */
void
etcd_lock_hand_over(EtcdLockResult *res, bool xact_scope)
{
	etcd_session_lock_handed_over(res->key, xact_scope);
}

/*
 * Refuse to unlock a key that is not an etcd lock key.
 */
static void
report_not_lock_key(const char *key, const char *detail)
{
	/* A key is up to 1.5 MB: name its start, as PostgreSQL names values. */
	int			shown = pg_mbcliplen(key, strlen(key), 64);

	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("etcd key \"%.*s%s\" is not a lock key", shown, key,
					key[shown] != '\0' ? "..." : ""),
			 errdetail("%s", detail),
			 errhint("To delete any other key and revoke the lease it is attached to, with every key on that lease, call etcd_unlock(key, force => true).")));
}

/*
 * The detail of a key gone when a retry of its deletion looked: the
 * first attempt may have deleted it.
 */
#define UNLOCK_GONE_RETRIED \
	"The key was gone when the request was sent again: an earlier attempt, whose answer did not arrive, may have deleted it, or the lock was lost before."

/*
 * The NOTICE and result for a lock key that no longer exists.
 */
static bool
unlock_gone(const char *key, const char *detail)
{
	ereport(NOTICE,
			(errmsg("etcd lock key \"%s\" does not exist", key),
			 errdetail("%s", detail)));
	return false;
}

/*
 * revoke_released_lease's request, and its cleanup after an error: the
 * revocation again, quietly.  arg: the lease.
 */
static void
revoke_lease(void *arg)
{
	(void) etcd_session_revoke(*(int64 *) arg, etcd_request_timeout_ms, false);
}

static void
revoke_lease_after_error(void *arg)
{
	etcd_session_revoke_after_error(*(int64 *) arg);
}

/*
 * Revoke the lease of a lock key that was just deleted.  A lease of this
 * session is left alone: it is the session lease of our other locks.  If
 * the revocation fails (cancel included), it is tried again quietly
 * before the error propagates: the caller asked for the release.
 */
static void
revoke_released_lease(const char *key, int64 lease)
{
	if (lease <= 0)
		return;
	if (etcd_session_owns(lease))
	{
		/* our session lease: keep it for our other locks */
		etcd_session_lock_released(key);
		return;
	}
	lockfence_run_with_cleanup(revoke_lease, revoke_lease_after_error, &lease);
}

/*
 * unlock_own_key's request: the key, its lease, whether it was there, and
 * whether an earlier attempt went unanswered
 */
typedef struct OwnKeyDelete
{
	const char *key;
	int64		lease;
	bool		deleted;
	bool		retried;
} OwnKeyDelete;

static void
delete_own_key(void *arg)
{
	OwnKeyDelete *d = (OwnKeyDelete *) arg;

	(void) etcd_lease_delete_key(d->lease, d->key, etcd_request_timeout_ms,
								 false, &d->deleted, &d->retried);
}

/* after an error: delete the key quietly, keeping the session lease */
static void
delete_own_key_after_error(void *arg)
{
	OwnKeyDelete *d = (OwnKeyDelete *) arg;

	etcd_lock_release_after_error(d->lease, d->key, true,
								  etcd_acquire_cleanup_budget_ms());
}

/*
 * Unlock a key this session holds: delete it, in one request that
 * compares its lease, and keep the session lease for the next lock.
 */
static bool
unlock_own_key(const char *key, int64 lease)
{
	OwnKeyDelete d = {key, lease, false, false};

	lockfence_run_with_cleanup(delete_own_key, delete_own_key_after_error, &d);
	if (!d.deleted)
	{
		/*
		 * A lock this transaction fenced with still fails its commit, also
		 * when an earlier attempt may have deleted the key: which one did
		 * cannot be known.
		 */
		etcd_session_lock_found_gone(key);
		return unlock_gone(key, d.retried ? UNLOCK_GONE_RETRIED :
						   "The lock was lost when its lease expired.");
	}
	etcd_session_lock_released(key);
	return true;
}

/*
 * Unlock another holder's lock key "<name>/<lease hex>": in one
 * transaction, delete the key if it is attached to the lease its name
 * ends in, else read it; then revoke that lease.  A key attached to
 * another lease (or to none) is not a lock key and is refused.
 */
static bool
unlock_lock_key(const char *key, int64 lease)
{
	char	   *key64 = etcd_b64_encode(key, strlen(key));
	char	   *body;
	EtcdReply	reply;
	JsonbContainer *root;
	JsonbContainer *resp0;
	JsonbContainer *r;
	bool		succeeded = false;
	int64		kv_lease = 0;

	body = psprintf("{\"compare\":[{\"target\":\"LEASE\",\"key\":\"%s\",\"lease\":\"" INT64_FORMAT "\"}],"
					"\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}],"
					"\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
					key64, lease, key64, key64);
	if (!etcd_call("/v3/kv/txn", body, etcd_request_timeout_ms, false,
				   &reply))
		etcd_report_reply_error("deleting the lock key", &reply);

	root = &reply.json->root;
	if (etcd_json_array_length(root, "responses") != 1 ||
		(resp0 = etcd_json_array_object(root, "responses", 0)) == NULL)
		etcd_malformed_reply("deleting the lock key",
							 "The transaction reply does not carry one response.");
	/* etcd omits false: no "succeeded" means the comparison failed */
	r = etcd_json_object(resp0, "response_delete_range");
	if (r != NULL)
		succeeded = true;
	else if ((r = etcd_json_object(resp0, "response_range")) == NULL)
		etcd_malformed_reply("deleting the lock key",
							 "The transaction reply carries neither a delete nor a range response.");

	if (!succeeded)
	{
		if (etcd_json_array_length(r, "kvs") == 0)
			return unlock_gone(key, reply.retried ? UNLOCK_GONE_RETRIED :
							   "The lock was already released, or lost when its lease expired.");
		(void) etcd_json_int64(etcd_json_array_object(r, "kvs", 0), "lease",
							   &kv_lease);
		if (kv_lease == 0)
			report_not_lock_key(key,
								"The key is not attached to a lease, while a lock key is attached to the lease its name ends in.");
		report_not_lock_key(key,
							psprintf("The key is attached to lease %llx, not to lease %llx that its name ends in.",
									 (unsigned long long) kv_lease,
									 (unsigned long long) lease));
	}

	revoke_released_lease(key, lease);
	return true;
}

/*
 * Unlock with force: delete any key, then revoke the lease it was
 * attached to, with every other key on that lease.
 */
static bool
unlock_forced(const char *key)
{
	char	   *body;
	EtcdReply	reply;
	int64		deleted = 0;
	int64		kv_lease = 0;

	body = psprintf("{\"key\":\"%s\",\"prev_kv\":true}",
					etcd_b64_encode(key, strlen(key)));
	if (!etcd_call("/v3/kv/deleterange", body, etcd_request_timeout_ms, false,
				   &reply))
		etcd_report_reply_error("deleting the lock key", &reply);

	(void) etcd_json_int64(&reply.json->root, "deleted", &deleted);
	if (deleted > 0 && etcd_json_array_length(&reply.json->root, "prev_kvs") > 0)
		(void) etcd_json_int64(etcd_json_array_object(&reply.json->root,
													  "prev_kvs", 0),
							   "lease", &kv_lease);
	revoke_released_lease(key, kv_lease);

	if (deleted == 0)
		return unlock_gone(key, reply.retried ? UNLOCK_GONE_RETRIED :
						   "The lock was already released, or lost when its lease expired.");
	return true;
}


/*
 * Release the lock with this key (lockfence.etcd_unlock): delete the key
 * and revoke its lease.  Returns false, with a NOTICE, when the key was
 * already gone.
 *
 * Only lock keys are released, "<name>/<lease hex>" attached to the lease
 * their name ends in (checked by etcd in the same transaction as the
 * deletion): revoking a lease deletes every key on it, so an arbitrary
 * key (application configuration, say) must not be handed to it by
 * mistake.  force deletes any key and revokes its lease.  Both requests
 * are idempotent, so etcd_call retries them on the other endpoints within
 * lockfence.etcd_request_timeout.
 */
bool
etcd_unlock_key(const char *key, bool force)
{
	int64		lease = etcd_lock_key_lease(key);

	if (key[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("etcd lock key must not be empty")));
	if (!force && lease == 0)
		report_not_lock_key(key,
							"Lock keys have the form <name>/<lease ID in lowercase hexadecimal>.");

	if (lease > 0 && etcd_session_holds_key(lease, key))
		return unlock_own_key(key, lease);
	if (!force)
		return unlock_lock_key(key, lease);
	return unlock_forced(key);
}
